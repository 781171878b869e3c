"""Drain with real SDK clients (issue 6, test 2): two nodes on one PostgreSQL
database, 500 libconverger-client clients on node A (tests/tools/sdk_swarm,
one libuv loop, every client given A's URL only) and a sender posting REST
messages continuously to A and B. A is drained with SIGTERM: every client
moves to B make-before-break (the drain frame's reconnectTo), A exits 0 once
none is left, every acknowledged message reaches every client once and in
order, and the SDK counts no time without a welcomed connection for any of
them.

The swarm's path: CONVERGER_SDK_SWARM (set by CMake), else `sdk_swarm`
beside the converger binary."""

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import NodeCase, PgCluster, mint_token, uid  # noqa: E402

CLIENTS = 500
WINDOW_MS = 8000  # 500 make-before-break handshakes on B: ~60/s leaves room under sanitizers and load
SHUTDOWN_MS = 20000
SEND_EVERY_S = 0.02


def swarm_path():
    p = os.environ.get("CONVERGER_SDK_SWARM")
    if not p:
        p = os.path.join(os.path.dirname(harness.binary()), "sdk_swarm")
    if not os.access(p, os.X_OK):
        raise AssertionError("sdk_swarm not found at %s (build it: make)" % p)
    return p


class Swarm:
    """The sdk_swarm process: stdout lines in a queue, stderr in a file."""

    def __init__(self, args):
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([swarm_path()] + args, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.err)
        harness._register(self.proc)
        self.lines = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for raw in iter(self.proc.stdout.readline, b""):
            self.lines.put(raw.decode("utf-8", "replace").rstrip("\n"))
        self.lines.put(None)  # EOF

    def line(self, timeout):
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def write(self, text):
        self.proc.stdin.write(text.encode())
        self.proc.stdin.flush()

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stderr_text(self, lines=80):
        self.err.seek(0)
        text = self.err.read().decode("utf-8", "replace").splitlines()
        return "\n".join(text[-lines:])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        harness._unregister(self.proc)
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        self.err.close()


class Sender:
    """Posts one message every SEND_EVERY_S, alternating A and B (B only once
    A refuses or is gone), each retried with its Idempotency-Key until one
    node acknowledges it. acked: (seq, key) in the order acknowledged."""

    def __init__(self, a, b, conv):
        self.a, self.b, self.conv = a, b, conv
        self.acked, self.errors, self.to_a, self.retries = [], [], 0, 0
        self.a_gone = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _post(self, node, key, i):
        try:
            st, _, js = node.request("POST", "/v1/conversations/%s/messages" % self.conv,
                                     {"sender": "drain-sender", "body": {"i": i}},
                                     headers={"Idempotency-Key": key}, timeout=3)
        except OSError as e:  # refused, reset, timed out: A is going away
            return None, repr(e)
        if st in (200, 201) and isinstance(js, dict) and isinstance(js.get("seq"), int):
            return js["seq"], None
        return None, "%s %r" % (st, js)

    def _run(self):
        i = 0
        while not self.stop.is_set():
            key = "drain-%d" % i
            node = self.a if (i % 2 == 0 and not self.a_gone.is_set()) else self.b
            deadline = time.monotonic() + 10
            while True:
                seq, err = self._post(node, key, i)
                if seq is not None:
                    self.acked.append((seq, key))
                    self.to_a += node is self.a
                    break
                self.retries += 1
                if node is self.a:  # A refuses: from now on only B
                    self.a_gone.set()
                    node = self.b
                if time.monotonic() > deadline:
                    self.errors.append("message %s never acknowledged; last: %s" % (key, err))
                    return
                time.sleep(0.02)
            i += 1
            time.sleep(SEND_EVERY_S)


class DrainPg(NodeCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.pg = PgCluster()
        cls.addClassCleanup(cls.pg.stop)

    def wait_ready_peer(self, a, b, timeout=6.0):
        deadline = time.monotonic() + timeout
        while True:
            st, _, js = a.request("GET", "/admin/cluster")
            self.assertEqual(st, 200, js)
            if any(n["id"] == b.node_id and n["state"] == "ready" and n["publicUrl"] == b.ws_url
                   for n in js["nodes"]):
                return
            if time.monotonic() > deadline:
                self.fail("A's /admin/cluster never listed B as ready: %r" % (js,))
            time.sleep(0.1)

    def test_drain_moves_every_sdk_client_to_b_without_gap_or_offline_time(self):
        t_start = time.monotonic()
        env = {"CONVERGER_DATABASE_URL": self.pg.url,
               "CONVERGER_DRAIN_WINDOW_MS": str(WINDOW_MS),
               "CONVERGER_DRAIN_CLOSE_RATE": "500",
               "CONVERGER_DRAIN_SHUTDOWN_MS": str(SHUTDOWN_MS)}
        a = self.node_start(env)
        b = self.node_start(env)
        self.wait_ready_peer(a, b)
        conv = a.new_conv()

        swarm = Swarm(["--url", a.ws_url, "--clients", str(CLIENTS), "--conv", conv,
                       "--token", mint_token(uid("swarm"), [conv]), "--head-timeout", "20"])
        self.addCleanup(swarm.stop)
        sender = Sender(a, b, conv)

        def diag():
            return "\n--- sdk_swarm stderr ---\n%s\n--- end ---" % swarm.stderr_text()

        line = swarm.line(30)
        self.assertEqual(line, "ready %d" % CLIENTS, diag())

        sender.thread.start()
        try:
            time.sleep(1.0)  # messages flow to the clients on A
            self.assertTrue(sender.acked, "nothing acknowledged in the first second: %r" % sender.errors)
            t_drain = time.monotonic()
            rc = a.stop(timeout=SHUTDOWN_MS / 1000 + 5)  # SIGTERM: the drain, then the exit
            drain_s = time.monotonic() - t_drain
            self.assertEqual(rc, 0, "A after SIGTERM: exit %r after %.1f s%s" % (rc, drain_s, diag()))
            self.assertLess(drain_s, SHUTDOWN_MS / 1000, "A stopped only at the shutdown deadline")
            acked_at_exit = len(sender.acked)
            time.sleep(1.0)  # B alone
        finally:
            sender.stop.set()
            sender.thread.join(20)
        self.assertFalse(sender.thread.is_alive(), "the sender did not stop")
        self.assertEqual(sender.errors, [])
        self.assertGreater(len(sender.acked), acked_at_exit, "nothing acknowledged by B after A exited")
        self.assertGreater(sender.to_a, 0)

        seqs = sorted(s for s, _ in sender.acked)
        head = seqs[-1]
        self.assertEqual(seqs, list(range(1, head + 1)), "acknowledged seqs are not exactly 1..head")
        _, stored_head = b.all_messages(conv)
        self.assertEqual(stored_head, head)

        swarm.write("head %d\n" % head)
        line = swarm.line(30)
        self.assertIsNotNone(line, "no result from sdk_swarm" + diag())
        try:
            res = json.loads(line)
        except ValueError:
            self.fail("sdk_swarm printed %r%s" % (line[:300], diag()))
        rc = swarm.wait(20)

        per = res["per_client"]
        bad = [c for c in per if c["node"] != b.node_id or c["last"] != head or c["gaps"] or c["dups"]
               or c["migrations"] < 1 or c["offline_ms"] != 0 or c["losses"] or c["errors"]]
        summary = {k: v for k, v in res.items() if k not in ("per_client", "ids")}
        why = "\nsummary: %s\nfirst bad clients: %s%s" % (json.dumps(summary), json.dumps(bad[:10]), diag())
        self.assertTrue(res["ok"], why)
        self.assertEqual(rc, 0, "sdk_swarm exit status" + why)
        self.assertFalse(any(m in swarm.stderr_text(100000) for m in harness.Node.SANITIZER_MARKERS),
                         "sanitizer report from sdk_swarm" + diag())
        self.assertEqual(res["clients"], CLIENTS)
        self.assertEqual(len(per), CLIENTS)
        # every client ended on B, and began on A
        self.assertEqual(res["final_nodes"], {b.node_id: CLIENTS}, why)
        self.assertEqual({c["first_node"] for c in per}, {a.node_id}, why)
        # each acknowledged message delivered once, in order, to every client
        self.assertEqual((res["gap_clients"], res["dup_clients"], res["wrong_conv"], res["id_mismatches"]),
                         (0, 0, 0, 0), why)
        self.assertEqual((res["min_last"], res["max_last"], res["reached_head"]), (head, head, CLIENTS), why)
        by_seq = {s: k for s, k in sender.acked}
        self.assertEqual(res["ids"], [by_seq[s] for s in range(1, head + 1)],
                         "the messages delivered are not the ones acknowledged")
        # make-before-break: one migration each, no time without a welcomed connection
        self.assertGreaterEqual(res["migrations_min"], 1, why)
        self.assertEqual((res["offline_ms_max"], res["offline_nonzero_clients"], res["lost_clients"]),
                         (0, 0, 0), why)
        self.assertEqual((res["failed_clients"], res["error_frames"]), (0, 0), why)
        self.assertEqual(bad, [], why)

        # A's side: everyone moved, none closed by the server
        log = a.log_text()
        self.assertIn("drain complete", log)
        self.assertIn("%d moved, 0 closed with 1012, 0 left" % CLIENTS, log,
                      "\n".join(l for l in log.splitlines() if "drain" in l))
        sys.stderr.write("\ndrain_pg: %d clients, head %d (%d to A, %d retried), A drained in %.2f s, "
                         "migrations %d..%d, migration open-to-welcome max %d ms, total %.1f s\n"
                         % (CLIENTS, head, sender.to_a, sender.retries, drain_s, res["migrations_min"],
                            res["migrations_max"], res["migrate_ms_max"], time.monotonic() - t_start))
        sys.stderr.write("".join("drain_pg: A: %s\n" % l for l in log.splitlines()
                                 if "drain" in l and "SIGTERM" not in l))


if __name__ == "__main__":
    harness.main()
