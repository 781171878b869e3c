"""Admission and pool pressure against real nodes with a tiny pool and a
slowed store (CONVERGER_TEST_STORE_DELAY_MS): a hello and a sync without a
slot get their retryable answers; a burst of 500 hellos waits and is
welcomed; a hello at the head reads no replay; REST sends succeed during a
handshake burst; a slow pool drops REST sends with 503 and stores none of
them; 1000 refusals carry spread-out retry hints; the accept limiter refuses
upgrades over its rate with 503."""

import asyncio
import collections
import http.client
import json
import os
import re
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import NodeCase, WsClient, open_client, mint_token  # noqa: E402


def metric(node, name, labels=""):
    """The value of one series in /metrics (0 when absent)."""
    text = node.get_text("/metrics")[2]
    want = name + ("{%s}" % labels if labels else "")
    for line in text.splitlines():
        if line.startswith(want + " "):
            return float(line.split()[-1])
    return 0.0


class Admission(NodeCase):
    def slow_node(self, delay_ms, pool=3, **env):
        """A node with a pool of 3 (one admission slot) by default: the
        revocation refresh and the membership beat may each hold a worker
        for the whole delay, and the hello under test needs the third.
        Conversations made first at full speed, then restarted with the
        slowed store."""
        n = self.node_start(dict({"CONVERGER_POOL_SIZE": str(pool)}, **env))
        convs = [n.new_conv() for _ in range(2)]
        for i in range(5):
            n.send(convs[0], {"i": i})
        n.overrides["CONVERGER_TEST_STORE_DELAY_MS"] = str(delay_ms)
        n.restart()
        return n, convs

    def test_hello_without_a_slot_gets_unavailable_then_1013(self):
        n, (conv, _) = self.slow_node(1500, WS_HANDSHAKE_QUEUE_MAX="0")

        async def run():
            holder = await WsClient.connect(n)
            await holder.send_json({"type": "hello", "token": mint_token("a", [conv]),
                                    "subs": [{"conv": conv, "watermark": 0}]})
            await asyncio.sleep(0.3)  # its store job holds the only slot
            refused = await WsClient.connect(n)
            await refused.send_json({"type": "hello", "token": mint_token("b", [conv]),
                                     "subs": [{"conv": conv, "watermark": None}]})
            code, reason, frames = await refused.wait_closed(5)
            w = await holder.recv_json(10)
            await holder.close()
            return code, reason, frames, w

        code, reason, frames, w = self.arun(run())
        self.assertEqual(w["type"], "welcome")
        self.assertEqual(len(frames), 1, frames)
        err = frames[0]
        self.assertEqual((err["type"], err["code"]), ("error", "unavailable"), err)
        self.assertIn("queue is full", err["message"])
        self.assertTrue(1000 <= err["retryAfterMs"] <= 6000, err)
        self.assertEqual(code, 1013)
        self.assertEqual(json.loads(reason), {"retryAfterMs": err["retryAfterMs"]})
        self.assertGreaterEqual(metric(n, "converger_protocol_admission_wait_ms_count",
                                       'result="overloaded"'), 1)

    def test_hello_that_waits_too_long_gets_unavailable(self):
        n, (conv, _) = self.slow_node(1500, WS_HANDSHAKE_QUEUE_MS="200")

        async def run():
            holder = await WsClient.connect(n)
            await holder.send_json({"type": "hello", "token": mint_token("a", [conv]),
                                    "subs": [{"conv": conv, "watermark": None}]})
            await asyncio.sleep(0.2)
            waiter = await WsClient.connect(n)
            t0 = time.monotonic()
            await waiter.send_json({"type": "hello", "token": mint_token("b", [conv]),
                                    "subs": [{"conv": conv, "watermark": None}]})
            code, reason, frames = await waiter.wait_closed(5)
            waited = time.monotonic() - t0
            await holder.close()
            return code, frames, waited

        code, frames, waited = self.arun(run())
        self.assertEqual(code, 1013)
        self.assertEqual(frames[0]["code"], "unavailable")
        self.assertIn("within 200 ms", frames[0]["message"])
        self.assertGreaterEqual(waited, 0.15)
        self.assertLess(waited, 1.4)  # refused by the queue, not after the holder's job

    def test_sync_without_a_slot_gets_replay_unavailable_and_stays(self):
        n, (conv, other) = self.slow_node(1500, WS_HANDSHAKE_QUEUE_MAX="0")

        async def run():
            # welcomed first (pays the delay once), at the head
            c, _ = await open_client(n, mint_token("a", [conv]), [{"conv": conv, "watermark": 5}], timeout=10)
            await c.until_synced(conv, 10)
            holder = await WsClient.connect(n)
            await holder.send_json({"type": "hello", "token": mint_token("b", [other]),
                                    "subs": [{"conv": other, "watermark": None}]})
            await asyncio.sleep(0.3)  # the only slot is taken
            await c.send_json({"type": "sync", "conv": conv, "watermark": 2})
            err = await c.recv_json(5)
            await c.send_json({"type": "ping"})  # the connection stays
            pong = await c.recv_json(5)
            await holder.close()
            await c.close()
            return err, pong

        err, pong = self.arun(run(), timeout=40)
        self.assertEqual((err["type"], err["code"], err["conv"]), ("error", "replay_unavailable", conv), err)
        self.assertEqual(err["details"], {"watermark": 2})
        self.assertTrue(1000 <= err["retryAfterMs"] <= 6000, err)
        self.assertEqual(pong["type"], "pong")

    def sync_behind_a_holder(self, queue_ms):
        """A subscriber at the head of `conv` syncs from 2 while another
        hello holds the only slot (1.5 s of store delay); 2 messages are
        committed while its sync waits. Returns everything it reads."""
        # one slot in a pool of 4, so the REST appends have workers of their
        # own; no revocation refresh and no pool drops to get in the way
        n, (conv, other) = self.slow_node(1500, pool=4, WS_HANDSHAKE_CONCURRENCY="1",
                                          WS_HANDSHAKE_QUEUE_MS=str(queue_ms),
                                          CONVERGER_REVOCATION_REFRESH_MS="3600000",
                                          CONVERGER_POOL_QUEUE_TARGET_MS="10000")

        async def run():
            c, _ = await open_client(n, mint_token("a", [conv]), [{"conv": conv, "watermark": 5}], timeout=10)
            await c.until_synced(conv, 10)
            holder = await WsClient.connect(n)
            await holder.send_json({"type": "hello", "token": mint_token("b", [other]),
                                    "subs": [{"conv": other, "watermark": None}]})
            await asyncio.sleep(0.3)
            await c.send_json({"type": "sync", "conv": conv, "watermark": 2})
            await asyncio.sleep(0.2)
            loop = asyncio.get_running_loop()
            for i in (6, 7):  # REST on a thread: each append pays the store delay
                await loop.run_in_executor(None, lambda i=i: n.send(conv, {"i": i}, key="live-%d" % i))
            seen = []
            try:
                while True:
                    seen.append(await c.recv_json(6))
            except asyncio.TimeoutError:
                pass
            await holder.close()
            await c.close()
            return seen

        return self.arun(run(), timeout=60)

    def test_sync_that_waits_is_replayed_then_live_follows(self):
        seen = self.sync_behind_a_holder(10000)
        kinds = [(m["type"], m.get("seq")) for m in seen]
        # replay 3..5 (and 6, 7 if committed before the replay read), synced,
        # then the rest live: every seq once, in order
        seqs = [s for t, s in kinds if t == "msg"]
        self.assertEqual(seqs, [3, 4, 5, 6, 7], kinds)
        self.assertIn(("synced", None), [(t, None) for t, _ in kinds if t == "synced"])
        self.assertEqual([t for t, _ in kinds].count("synced"), 1, kinds)

    def test_sync_refused_after_waiting_keeps_live_delivery(self):
        seen = self.sync_behind_a_holder(300)
        err = seen[0]
        self.assertEqual((err["type"], err["code"]), ("error", "replay_unavailable"), seen)
        self.assertEqual(err["details"], {"watermark": 2})
        # the messages committed while it waited still arrive, live, once
        self.assertEqual([m["seq"] for m in seen[1:] if m["type"] == "msg"], [6, 7], seen)

    def test_closed_handshakes_do_not_crowd_the_pool(self):
        # pool 4 (2 slots), 300 ms per store job: 40 clients send hello and
        # leave at once; REST sends right after still get the other half
        n = self.node_start({"CONVERGER_POOL_SIZE": "4"})
        conv = n.new_conv()
        n.overrides["CONVERGER_TEST_STORE_DELAY_MS"] = "300"
        n.restart()

        async def hello_and_leave():
            c = await WsClient.connect(n)
            await c.send_json({"type": "hello", "token": mint_token("x", [conv]),
                               "subs": [{"conv": conv, "watermark": 0}]})
            await asyncio.sleep(0.05)
            c.ws.transport.abort()  # gone without a close handshake

        async def run():
            await asyncio.gather(*(hello_and_leave() for _ in range(40)))

        self.arun(run(), timeout=30)
        t0 = time.monotonic()
        for i in range(6):
            n.send(conv, {"i": i}, key="after-%d" % i)  # raises unless 200/201
        self.assertLess(time.monotonic() - t0, 6 * 0.3 * 3)
        self.assertEqual(metric(n, "converger_pool_dropped_total", 'kind="hello"'), 0)
        self.assertEqual(metric(n, "converger_admission_in_use"), 0)
        self.assertEqual(metric(n, "converger_admission_waiting"), 0)

    def test_burst_of_500_hellos_waits_and_is_welcomed(self):
        n, (conv, _) = self.slow_node(2)
        tok = mint_token("burst", [conv])

        async def one(i):
            c = await WsClient.connect(n, timeout=20)
            try:
                await c.send_json({"type": "hello", "token": tok, "subs": [{"conv": conv, "watermark": 5}]})
                m = await c.recv_json(30)
                return m.get("type"), m.get("code")
            finally:
                await c.close()

        async def run():
            results = []
            for start in range(0, 500, 250):  # two waves of 250 at once
                results += await asyncio.gather(*(one(i) for i in range(start, start + 250)))
            return results

        results = self.arun(run(), timeout=120)
        counts = collections.Counter(r[0] for r in results)
        self.assertEqual(counts["welcome"], 500, collections.Counter(results))
        self.assertGreaterEqual(metric(n, "converger_protocol_admission_wait_ms_count", 'result="ok"'), 500)
        self.assertEqual(metric(n, "converger_protocol_admission_wait_ms_count", 'result="overloaded"'), 0)
        self.assertEqual(metric(n, "converger_admission_in_use"), 0)

    def test_hello_at_the_head_reads_no_replay(self):
        n = self.node_start()
        conv = n.new_conv()
        for i in range(5):
            n.send(conv, {"i": i})

        async def hello(wm):
            c, _ = await open_client(n, mint_token("a", [conv]), [{"conv": conv, "watermark": wm}])
            msgs, synced = await c.until_synced(conv)
            await c.close()
            return msgs, synced

        msgs, synced = self.arun(hello(5))
        self.assertEqual((msgs, synced["head"]), ([], 5))
        self.assertEqual(metric(n, "converger_replay_queries_total", 'kind="hello"'), 0)
        self.assertEqual(metric(n, "converger_replay_queries_total", 'kind="fill"'), 0)
        msgs, _ = self.arun(hello(3))
        self.assertEqual([m["seq"] for m in msgs], [4, 5])
        self.assertEqual(metric(n, "converger_replay_queries_total", 'kind="hello"'), 1)

    def test_rest_sends_succeed_during_a_handshake_burst(self):
        n = self.node_start({"CONVERGER_POOL_SIZE": "4"})
        conv = n.new_conv()
        n.overrides["CONVERGER_TEST_STORE_DELAY_MS"] = "20"
        n.restart()
        tok = mint_token("burst", [conv])
        statuses = []

        def rest_sender():
            for i in range(40):
                c = http.client.HTTPConnection("127.0.0.1", n.port, timeout=20)
                c.request("POST", "/v1/conversations/%s/messages" % conv,
                          json.dumps({"sender": "rest", "body": {"i": i}}),
                          {"Authorization": "Bearer " + harness.API_KEY, "Idempotency-Key": "r-%d" % i})
                r = c.getresponse()
                r.read()
                statuses.append(r.status)
                c.close()

        async def one():
            c = await WsClient.connect(n, timeout=20)
            try:
                await c.send_json({"type": "hello", "token": tok, "subs": [{"conv": conv, "watermark": None}]})
                return (await c.recv_json(60)).get("type")
            finally:
                await c.close()

        async def run():
            th = threading.Thread(target=rest_sender)
            burst = asyncio.gather(*(one() for _ in range(200)))
            await asyncio.sleep(0.05)
            th.start()
            out = await burst
            await asyncio.get_running_loop().run_in_executor(None, th.join, 60)
            return out

        types = self.arun(run(), timeout=120)
        self.assertEqual(collections.Counter(types)["welcome"], 200)
        self.assertEqual(statuses, [201] * 40)
        self.assertEqual(metric(n, "converger_pool_dropped_total", 'kind="rest"'), 0)

    def test_refusal_hints_spread_over_their_range(self):
        n, (conv, _) = self.slow_node(8000, WS_HANDSHAKE_QUEUE_MAX="0")

        async def refused(tok):
            c = await WsClient.connect(n, timeout=20)
            try:
                await c.send_json({"type": "hello", "token": tok, "subs": [{"conv": conv, "watermark": None}]})
                m = await c.recv_json(10)
                return m.get("retryAfterMs") if m.get("code") == "unavailable" else None
            finally:
                await c.close()

        async def run():
            holder = await WsClient.connect(n)
            await holder.send_json({"type": "hello", "token": mint_token("h", [conv]),
                                    "subs": [{"conv": conv, "watermark": None}]})
            await asyncio.sleep(0.3)
            tok = mint_token("r", [conv])
            hints = []
            for start in range(0, 1000, 250):
                hints += await asyncio.gather(*(refused(tok) for _ in range(250)))
            await holder.close()
            return hints

        hints = self.arun(run(), timeout=120)
        self.assertEqual(len(hints), 1000)
        self.assertNotIn(None, hints)
        self.assertTrue(all(1000 <= h <= 6000 for h in hints))
        most = collections.Counter(hints).most_common(1)[0][1]
        self.assertLessEqual(most, 10, "one hint value for more than 1% of the burst")
        self.assertGreater(max(hints) - min(hints), 4000)

    def test_slow_pool_drops_rest_sends_with_503(self):
        # one worker, 100 ms per job, target 5 ms over 50 ms intervals: a
        # burst of REST sends makes the pool slow and the late ones are dropped.
        # Only the burst runs under that rule. The single worker also runs the
        # revocation refresh and the membership beat (at start-up, then every
        # second; never dropped), so under the rule a request made before or
        # after the burst may wait behind them: once a job takes longer than
        # an interval (a slow disk, a loaded machine), the pool counts as slow
        # and that request, waiting over 2 x 5 ms, is dropped. The conversation
        # is made and the history read with the rule out of the way (a 600 s
        # target: nothing waits 20 minutes), so they never are.
        calm = {"CONVERGER_POOL_QUEUE_TARGET_MS": "600000", "CONVERGER_POOL_QUEUE_INTERVAL_MS": "1000"}
        n = self.node_start(dict({"CONVERGER_POOL_SIZE": "1"}, **calm))
        conv = n.new_conv()
        n.overrides.update({"CONVERGER_POOL_QUEUE_TARGET_MS": "5", "CONVERGER_POOL_QUEUE_INTERVAL_MS": "50",
                            "CONVERGER_TEST_STORE_DELAY_MS": "100"})
        n.restart()
        # The burst starts on an idle pool, once the start-up refresh and beat
        # (100 ms each) are done and a second before the next ones: its first
        # send is then taken at once and stored, the late ones are dropped.
        deadline = time.monotonic() + 5
        while n.get("/admin/status", key=harness.API_KEY)[2]["poolInFlight"] != 0:
            self.assertLess(time.monotonic(), deadline, "the pool never went idle")
            time.sleep(0.01)
        answers = []

        def post(i):
            c = http.client.HTTPConnection("127.0.0.1", n.port, timeout=30)
            t0 = time.monotonic()
            c.request("POST", "/v1/conversations/%s/messages" % conv,
                      json.dumps({"sender": "rest", "body": {"i": i}}),
                      {"Authorization": "Bearer " + harness.API_KEY, "Idempotency-Key": "d-%d" % i})
            r = c.getresponse()
            answers.append((r.status, {k.lower(): v for k, v in r.getheaders()}, json.loads(r.read()),
                            time.monotonic() - t0))
            c.close()

        threads = [threading.Thread(target=post, args=(i,)) for i in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        statuses = collections.Counter(a[0] for a in answers)
        self.assertEqual(len(answers), 20)
        self.assertGreater(statuses[201], 0, statuses)
        self.assertGreater(statuses[503], 0, statuses)
        self.assertEqual(statuses[201] + statuses[503], 20, statuses)
        # refusals come fast (the sweep drops queued jobs; they do not wait
        # for the busy worker): within the interval + 2 x target, plus slack
        for a in answers:
            if a[0] == 503:
                self.assertLess(a[3], 1.0, a)
        st, headers, body, _ = next(a for a in answers if a[0] == 503)
        self.assertEqual(body["error"]["code"], "unavailable")
        self.assertTrue(1000 <= body["error"]["retryAfterMs"] <= 6000, body)
        self.assertIn("retry-after", headers)
        self.assertEqual(metric(n, "converger_pool_dropped_total", 'kind="rest"'), statuses[503])
        # what was dropped was not stored; what was acknowledged was
        n.overrides.update(calm, CONVERGER_TEST_STORE_DELAY_MS="0")
        n.restart()
        stored, head = n.all_messages(conv)
        self.assertEqual(head, statuses[201])
        self.assertEqual(sorted(m["id"] for m in stored),
                         sorted(a[2]["id"] for a in answers if a[0] == 201))

    def test_accept_limiter_refuses_upgrades_over_the_rate(self):
        n = self.node_start({"CONVERGER_ACCEPT_RATE": "2"})

        def upgrade():
            s = harness.raw_connect(n.port)
            s.sendall(b"GET /v1/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                      b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
            st, headers, body = harness.HttpReader(s).read_response()
            s.close()
            return st, headers, body

        answers = [upgrade() for _ in range(12)]
        statuses = [a[0] for a in answers]
        self.assertEqual(statuses[:2], [101] * 2)  # the burst: a second's worth
        refused = [a for a in answers if a[0] == 503]
        self.assertGreaterEqual(len(refused), 8)  # at most 2 more tokens in the next second
        st, headers, body = refused[0]
        js = json.loads(body)
        self.assertEqual(js["error"]["code"], "unavailable")
        self.assertTrue(1000 <= js["error"]["retryAfterMs"] <= 6000, js)
        self.assertIn("retry-after", {k.lower() for k in headers})
        self.assertEqual(metric(n, "converger_accept_refused_total"), len(refused))


if __name__ == "__main__":
    harness.main()
