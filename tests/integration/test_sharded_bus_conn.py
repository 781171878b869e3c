"""A bus instance that closes a node's publishing connection while the
node publishes (found by the chaos run, test_sharded_chaos): hiredis calls
the disconnect callback, which forgets the context, and until the next
tick (src/bus/redis.c, 50 ms) the instance still counted as up; a publish
in that window went to a NULL context and the node died of SIGSEGV. Redis
closes a connection with CLIENT KILL, a server-side timeout, an output
buffer limit or a restart under a live socket; here CLIENT KILL TYPE normal
(the publishing connection; the subscribing one is TYPE pubsub) is sent
every 0.2 s under four REST senders. The node must live through it and its
subscriber get every message once, in order (what a publish lost on the
way is read from the store)."""

import asyncio
import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import Follower, NodeCase, Sharded  # noqa: E402

KILLS = 30
SENDERS = 4


def redis_command(port, *args):
    """One command in RESP on a fresh connection; the raw first reply line."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(("*%d\r\n" % len(args) + "".join("$%d\r\n%s\r\n" % (len(a), a) for a in args)).encode())
        return s.recv(4096).split(b"\r\n")[0].decode()


class BusConnectionClosed(NodeCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.sh = Sharded(instances=1, bus=1)
        cls.addClassCleanup(cls.sh.stop)

    def test_publishing_connection_closed_by_redis_under_load(self):
        a, b = [self.node_start(self.sh.env()) for _ in range(2)]
        conv = self.sh.conv_on(a)
        follower = Follower([b], conv)  # on the other node: it hears a's publishes
        acked, stop = [], threading.Event()
        lock = threading.Lock()

        def send(k):
            i = 0
            with a.session() as s:
                while not stop.is_set():
                    try:
                        js = s.send(conv, {"k": k, "i": i}, key="s%d-%d" % (k, i))
                    except (OSError, AssertionError, harness.http.client.HTTPException):
                        return  # the node died: seen below
                    with lock:
                        acked.append(js["seq"])
                    i += 1

        threads = [threading.Thread(target=send, args=(k,), daemon=True) for k in range(SENDERS)]
        for t in threads:
            t.start()
        killed = 0
        try:
            for _ in range(KILLS):
                reply = redis_command(self.sh.redis[0].port, "CLIENT", "KILL", "TYPE", "normal")
                self.assertTrue(reply.startswith(":"), reply)
                killed += int(reply[1:])
                time.sleep(0.2)
                if not a.running():
                    break
        finally:
            stop.set()
            for t in threads:
                t.join(20)
        self.assertTrue(a.running(), "the node died while Redis closed its publishing connection "
                                     "(exit %r); log:\n%s" % (a.proc.poll(), a.log_tail(40)))
        self.assertGreater(killed, 0)  # connections were closed
        head = len(acked)
        self.assertEqual(sorted(acked), list(range(1, head + 1)))
        self.arun(follower.run(lambda w: w >= head), timeout=60)
        self.assertEqual(follower.delivered, list(range(1, head + 1)))


if __name__ == "__main__":
    harness.main()
