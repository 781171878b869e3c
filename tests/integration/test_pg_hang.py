"""PostgreSQL frozen, not down: the postmaster and every one of its child
processes stopped with SIGSTOP (found by pid: postmaster.pid and /proc,
never by name) for six seconds under a node with
CONVERGER_STORE_TIMEOUT_MS=1500, while a WebSocket subscriber follows one
conversation and three REST senders keep sending, each message under its
own Idempotency-Key and sent again with the same key after a 503.

While it is frozen, every request a client waits on is answered within the
store timeout + 1 s: each send 201/200 or 503 with Retry-After, a history
read 503, a hello `unavailable` then close 1013, a sync
`replay_unavailable` (the connection stays), a socket send `unavailable`
then close 1013, all with retry hints.
(Before the store timeout existed, a send on a hung database waited for the
statement timeout plus its margin: 32 s.) After SIGCONT the node recovers by
itself within a bounded time (/readyz 200, sends succeed); the subscriber,
resuming by watermark, has every acknowledged seq once and in order; the
history holds each acknowledged message once, under its key, with seq
gapless from 1."""

import asyncio
import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import Follower, NodeCase, PgCluster, WsClient, mint_token, open_client  # noqa: E402

STORE_TIMEOUT_MS = 1500
BOUND_S = STORE_TIMEOUT_MS / 1000.0 + 1.0  # every answer while frozen: deadline + 1 s
FREEZE_S = 6.0
RECOVER_S = 20.0  # sends succeed and /readyz is 200 again within this after SIGCONT
SENDERS = 3


class PgHang(NodeCase):
    def setUp(self):
        super().setUp()
        self.pg = PgCluster()
        self.addCleanup(self.pg.stop)

    def freeze(self):
        self.pg.freeze()

    def thaw(self):
        self.pg.thaw()

    def readyz(self, node):
        try:
            return node.get("/readyz", timeout=2)[0]
        except OSError:
            return 0

    def test_frozen_database_answers_within_the_store_timeout_and_loses_nothing(self):
        node = self.node_start({"CONVERGER_DATABASE_URL": self.pg.url,
                                "CONVERGER_STORE_TIMEOUT_MS": str(STORE_TIMEOUT_MS),
                                "CONVERGER_POOL_SIZE": "4"})
        conv = node.new_conv()
        self.addCleanup(self.thaw)  # runs before the node and the cluster are stopped
        answers, acked, stop = [], [], threading.Event()
        lock = threading.Lock()
        times = {}

        def send_loop(t):
            i = 0
            while not stop.is_set():
                key = "t%d-%d" % (t, i)
                tries = 0
                # after `stop`, the message in hand is still retried, a bounded number of times
                while not (stop.is_set() and tries >= 50):
                    tries += 1
                    t0 = time.monotonic()
                    try:
                        st, h, js = node.request("POST", "/v1/conversations/%s/messages" % conv,
                                                 {"sender": "s", "body": {"k": key}},
                                                 headers={"Idempotency-Key": key}, timeout=10)
                    except OSError as e:
                        st, h, js = 0, {}, repr(e)
                    with lock:
                        answers.append((t0, time.monotonic() - t0, st, h, js, key))
                        if st in (200, 201):
                            acked.append((key, js["seq"]))
                    if st in (200, 201):
                        break
                    time.sleep(0.1)  # a client would wait the hint; the test wants many probes
                i += 1
                time.sleep(0.05)

        async def hello_while_frozen():
            t0 = time.monotonic()
            c = await WsClient.connect(node)
            await c.send_json({"type": "hello", "token": mint_token("late", [conv]),
                               "subs": [{"conv": conv, "watermark": 0}]})
            try:
                code, reason, frames = await c.wait_closed(10.0)
            except asyncio.TimeoutError:
                code, reason, frames = None, None, []
            finally:
                await c.close()
            return time.monotonic() - t0, code, reason, frames

        async def sync_and_send_while_frozen(c):
            """On a welcomed connection: a sync from 0 gets replay_unavailable
            and the connection stays (a ping is answered); then a send gets
            unavailable and close 1013. (Seconds, frame) of each."""
            t0 = time.monotonic()
            await c.send_json({"type": "sync", "conv": conv, "watermark": 0})
            try:
                err, _ = await c.until(lambda m: m.get("type") != "msg", 10.0)
            except asyncio.TimeoutError:
                err = None
            sync = (time.monotonic() - t0, err)
            await c.send_json({"type": "ping"})
            pong, _ = await c.until(lambda m: m.get("type") == "pong", 5.0)
            t0 = time.monotonic()
            await c.send_json({"type": "send", "conv": conv, "id": "ws-1", "body": {"k": "ws-1"}})
            try:
                code, reason, frames = await c.wait_closed(10.0)
            except asyncio.TimeoutError:
                code, reason, frames = None, None, []
            return sync, (time.monotonic() - t0, code, reason, [f for f in frames if f.get("type") != "msg"])

        def read_while_frozen():
            t0 = time.monotonic()
            try:
                st, h, js = node.get("/v1/conversations/%s/messages" % conv, key=harness.API_KEY,
                                     timeout=10)
            except OSError as e:
                st, h, js = 0, {}, repr(e)
            return time.monotonic() - t0, st, h, js

        async def go():
            follower = Follower([node], conv)
            target = {}
            until = lambda wm: "head" in target and wm >= target["head"]  # noqa: E731
            task = asyncio.create_task(follower.run(until))
            threads = [threading.Thread(target=send_loop, args=(t,), daemon=True)
                       for t in range(SENDERS)]
            for t in threads:
                t.start()
            try:
                ws, _ = await open_client(node, mint_token("ws", [conv]), [{"conv": conv, "watermark": None}])
                await ws.until(lambda m: m.get("type") == "synced", 5.0)
                await asyncio.sleep(1.5)
                self.assertTrue(acked, "no send succeeded before the freeze")
                await asyncio.to_thread(self.freeze)
                times["freeze"] = time.monotonic()
                times["hello"] = await hello_while_frozen()
                times["read"] = await asyncio.to_thread(read_while_frozen)
                times["sync"], times["send"] = await sync_and_send_while_frozen(ws)
                await ws.close()
                await asyncio.sleep(FREEZE_S - (time.monotonic() - times["freeze"]))
                times["thaw"] = time.monotonic()
                self.thaw()
                # back by itself: a send acknowledged after the thaw, and ready
                deadline = times["thaw"] + RECOVER_S
                while not (any(a[0] > times["thaw"] and a[2] in (200, 201) for a in list(answers))
                           and self.readyz(node) == 200):
                    self.assertLess(time.monotonic(), deadline, "no recovery within %.0f s" % RECOVER_S)
                    await asyncio.sleep(0.1)
                times["recovered"] = time.monotonic()
                # the socket send refused while frozen, sent again over REST with its id
                st, _, js = await asyncio.to_thread(
                    node.request, "POST", "/v1/conversations/%s/messages" % conv,
                    {"sender": "s", "body": {"k": "ws-1"}}, {"Idempotency-Key": "ws-1"})
                self.assertIn(st, (200, 201), js)
                with lock:
                    acked.append(("ws-1", js["seq"]))
                await asyncio.sleep(1.0)  # sends after the recovery
            finally:
                stop.set()
                for t in threads:
                    await asyncio.to_thread(t.join, 60)
            stored, head = node.all_messages(conv)
            target["head"] = head
            await asyncio.wait_for(task, 30)
            return follower, stored, head

        follower, stored, head = self.arun(go(), timeout=150)

        # every answer within the store timeout + 1 s, the refusals retryable
        frozen = [a for a in answers if a[0] < times["thaw"] and a[0] + a[1] > times["freeze"]]
        refused = [a for a in frozen if a[2] == 503]
        print("hang: %d answers while frozen (%d refused, slowest %.3f s), slowest overall %.3f s, "
              "refused: hello %.3f s, read %.3f s, sync %.3f s, socket send %.3f s; "
              "recovered %.1f s after SIGCONT, head %d, welcomes %d"
              % (len(frozen), len(refused), max([a[1] for a in frozen] or [0]),
                 max(a[1] for a in answers), times["hello"][0], times["read"][0],
                 times["sync"][0], times["send"][0], times["recovered"] - times["thaw"], head,
                 follower.welcomes), file=sys.stderr)
        for t0, took, st, h, js, key in answers:
            self.assertLessEqual(took, BOUND_S, "%s answered %d after %.2f s: %r" % (key, st, took, js))
            self.assertIn(st, (200, 201, 503), (key, js))
            if st == 503:
                self.assertGreaterEqual(int(h["retry-after"]), 1, h)
                self.assertEqual(js["error"]["code"], "unavailable", js)
                self.assertGreater(js["error"]["retryAfterMs"], 0, js)
        self.assertGreater(len(refused), 5, "the senders saw no freeze: %r" % frozen[:5])
        took, code, reason, frames = times["hello"]
        self.assertEqual(code, 1013, (reason, frames))
        self.assertEqual([f.get("code") for f in frames], ["unavailable"], frames)
        self.assertGreater(frames[0]["retryAfterMs"], 0, frames)
        self.assertLessEqual(took, BOUND_S, "the hello's refusal took %.2f s" % took)
        took, st, h, js = times["read"]
        self.assertEqual(st, 503, js)
        self.assertGreaterEqual(int(h["retry-after"]), 1, h)
        self.assertLessEqual(took, BOUND_S, "the history read's refusal took %.2f s" % took)
        took, err = times["sync"]
        self.assertLessEqual(took, BOUND_S, "the sync's refusal took %.2f s: %r" % (took, err))
        self.assertEqual((err["type"], err["code"], err["details"]),
                         ("error", "replay_unavailable", {"watermark": 0}), err)
        self.assertGreater(err["retryAfterMs"], 0, err)
        took, code, reason, frames = times["send"]
        self.assertLessEqual(took, BOUND_S, "the socket send's refusal took %.2f s" % took)
        self.assertEqual(code, 1013, (reason, frames))
        self.assertEqual([(f.get("code"), f.get("details")) for f in frames],
                         [("unavailable", {"id": "ws-1"})], frames)
        self.assertGreater(frames[0]["retryAfterMs"], 0, frames)

        # nothing lost, nothing stored twice
        keys = [k for k, _ in acked]
        self.assertEqual(len(set(keys)), len(keys), "a key acknowledged twice")
        self.assertEqual([m["seq"] for m in stored], list(range(1, head + 1)))
        self.assertEqual(len({m["id"] for m in stored}), len(stored), "a key stored twice")
        by_id = {m["id"]: m["seq"] for m in stored}
        for key, seq in acked:
            self.assertEqual(by_id.get(key), seq, "acknowledged %s as %d" % (key, seq))
        self.assertEqual(sorted(seq for _, seq in acked), list(range(1, head + 1)),
                         "stored but never acknowledged")
        self.assertEqual(follower.delivered, list(range(1, head + 1)))



if __name__ == "__main__":
    harness.main()
