"""PostgreSQL stopped for five seconds and started again under two nodes,
while clients are subscribed and a sender keeps sending with retries: during
the outage REST answers 503 with Retry-After and a handshake gets
`unavailable` then 1013, each within CONVERGER_POOL_QUEUE_INTERVAL_MS +
2 x CONVERGER_POOL_QUEUE_TARGET_MS (1.1 s by default), and /readyz says 503;
afterwards the nodes recover by themselves and every subscriber has every
acknowledged message once, in order."""

import asyncio
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import Follower, NodeCase, PgCluster, WsClient, mint_token  # noqa: E402

FAIL_FAST_S = 1.1  # interval 1000 ms + 2 x target 50 ms
SLACK_S = 0.5      # scheduling on a shared two-core machine (and sanitizers)


class PgOutage(NodeCase):
    def setUp(self):
        super().setUp()
        self.pg = PgCluster()
        self.addCleanup(self.pg.stop)

    def readyz(self, node):
        try:
            st, _, js = node.get("/readyz", timeout=2)
            return st, js
        except OSError as e:
            return 0, repr(e)

    def test_five_second_outage_fails_fast_and_loses_nothing(self):
        a, b = [self.node_start({"CONVERGER_DATABASE_URL": self.pg.url}) for _ in range(2)]
        conv = a.new_conv()
        acked, answers, stop = [], [], threading.Event()
        outage = {}

        def send_loop():
            i = 0
            while not stop.is_set():
                key = "k-%d" % i
                node = (a, b)[i % 2]
                tries = 0
                # after `stop`, the message in hand is still retried, a bounded number of times
                while not (stop.is_set() and tries >= 50):
                    tries += 1
                    t0 = time.monotonic()
                    try:
                        st, h, js = node.request("POST", "/v1/conversations/%s/messages" % conv,
                                                 {"sender": "s", "body": {"i": i}},
                                                 headers={"Idempotency-Key": key}, timeout=10)
                    except OSError as e:
                        st, h, js = 0, {}, repr(e)
                    answers.append((t0, time.monotonic() - t0, st, h, js))
                    if st in (200, 201):
                        acked.append((key, js["seq"]))
                        break
                    time.sleep(0.1)  # a client would wait the hint; the test wants many probes
                i += 1
                time.sleep(0.02)

        async def handshake_during_outage(node):
            t0 = time.monotonic()
            c = await WsClient.connect(node)
            await c.send_json({"type": "hello", "token": mint_token("late", [conv]),
                               "subs": [{"conv": conv, "watermark": 0}]})
            code, reason, frames = await c.wait_closed(5.0)
            return time.monotonic() - t0, code, reason, frames

        async def go():
            followers = [Follower([a, b], conv, start=k) for k in range(4)]  # two on each node
            target = {}
            until = lambda wm: "head" in target and wm >= target["head"]  # noqa: E731
            tasks = [asyncio.create_task(f.run(until)) for f in followers]
            t = threading.Thread(target=send_loop, daemon=True)
            t.start()
            try:
                await asyncio.sleep(1.0)
                await asyncio.to_thread(self.pg.down)
                outage["start"] = time.monotonic()
                # /readyz turns 503 on both nodes
                for n in (a, b):
                    deadline = time.monotonic() + 2.0
                    while self.readyz(n)[0] != 503:
                        self.assertLess(time.monotonic(), deadline, "%s still ready" % n.node_id)
                        await asyncio.sleep(0.05)
                    self.assertEqual(self.readyz(n)[1], {"status": "store_unavailable"})
                outage["handshakes"] = [await handshake_during_outage(n) for n in (a, b)]
                await asyncio.sleep(5.0 - (time.monotonic() - outage["start"]))
                outage["end"] = time.monotonic()  # the server may answer from here on
                await asyncio.to_thread(self.pg.up)
                for n in (a, b):  # back by itself
                    deadline = time.monotonic() + 10.0
                    while self.readyz(n)[0] != 200:
                        self.assertLess(time.monotonic(), deadline, "%s not ready again" % n.node_id)
                        await asyncio.sleep(0.1)
                await asyncio.sleep(1.0)  # sends after the recovery
            finally:
                stop.set()
                await asyncio.to_thread(t.join, 30)
            target["head"] = max(seq for _, seq in acked)
            await asyncio.wait_for(asyncio.gather(*tasks), 20)
            return followers

        followers = self.arun(go(), timeout=90)

        # fail-fast during the outage
        during = [x for x in answers if outage["start"] <= x[0] and x[0] + x[1] <= outage["end"]]
        refused = [x for x in during if x[2] == 503]
        self.assertGreater(len(refused), 5, "the sender saw no outage: %r" % during[:5])
        for t0, took, st, h, js in during:
            self.assertEqual(st, 503, js)
            self.assertLessEqual(took, FAIL_FAST_S + SLACK_S, "a 503 took %.2fs" % took)
            self.assertGreaterEqual(int(h["retry-after"]), 1)
            self.assertEqual(js["error"]["code"], "unavailable")
        for took, code, reason, frames in outage["handshakes"]:
            self.assertEqual(code, 1013, (reason, frames))
            self.assertEqual([f.get("code") for f in frames], ["unavailable"], frames)
            self.assertGreater(frames[0]["retryAfterMs"], 0)
            self.assertLessEqual(took, FAIL_FAST_S + SLACK_S, "the refusal took %.2fs" % took)

        # nothing lost: every acknowledged message, once, in order, everywhere
        head = max(seq for _, seq in acked)
        self.assertEqual(sorted(seq for _, seq in acked), list(range(1, head + 1)))
        self.assertEqual(len({k for k, _ in acked}), len(acked))
        self.assertTrue(any(t0 > outage["end"] and st in (200, 201) for t0, _, st, _, _ in answers))
        stored, stored_head = a.all_messages(conv)
        self.assertEqual((stored_head, [m["seq"] for m in stored]), (head, list(range(1, head + 1))))
        for f in followers:
            self.assertEqual(f.delivered, list(range(1, head + 1)))
            # a gap fill that failed during the outage tells the client once
            # per retry hint (1-6 s), never in a loop
            self.assertLessEqual(len(f.errors), 5, f.errors)
        for n in (a, b):  # an outage is logged once per streak, not per retry
            self.assertLessEqual(n.log_text().count("cannot check"), 2)
            self.assertLessEqual(n.log_text().count("cannot connect to"), 3)
        print("outage: %d answers during it (%d refused, slowest %.3f s), head %d, welcomes %r"
              % (len(during), len(refused), max(x[1] for x in during), head,
                 [f.welcomes for f in followers]), file=sys.stderr)


if __name__ == "__main__":
    harness.main()
