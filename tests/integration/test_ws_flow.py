"""Normal WebSocket flows, driven by the `websockets` library (a peer we did
not write): hello/welcome, live delivery, WS send + idempotency, watermarks
(null, 0, resume), long paged replay, ping/pong, sync, fan-out, concurrent
REST writers."""

import asyncio
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import NodeCase, WsClient, open_client, mint_token, uid  # noqa: E402


class WsFlow(NodeCase):
    @classmethod
    def setUpClass(cls):
        cls.node = cls.class_node()

    def tok(self, convs, sub="bob"):
        return mint_token(sub, convs)

    # ------------------------------------------------------------------
    def test_hello_welcome(self):
        n = self.node
        conv_p = n.new_conv(presence=True)
        conv_q = n.new_conv(presence=False)
        for i in range(3):
            n.send(conv_p, {"i": i})

        async def go():
            c, w = await open_client(n, self.tok([conv_p, conv_q]),
                                     [{"conv": conv_p, "watermark": None}, {"conv": conv_q, "watermark": None}],
                                     )
            try:
                self.assertEqual(c.ws.subprotocol, "converger.v1")
                self.assertEqual(w["type"], "welcome")
                self.assertIsInstance(w.get("session"), str)
                self.assertTrue(w["session"])
                self.assertEqual(w.get("node"), n.node_id)
                self.assertEqual(w.get("heartbeatMs"), 25000)
                subs = {s["conv"]: s for s in w["subs"]}
                self.assertEqual(set(subs), {conv_p, conv_q}, w)
                self.assertEqual(subs[conv_p]["head"], 3)
                self.assertIs(subs[conv_p]["presence"], True)
                self.assertEqual(subs[conv_q]["head"], 0)
                self.assertIs(subs[conv_q]["presence"], False)
                # one synced per sub, no replay for null watermarks
                got = {}
                for _ in range(2):
                    m = await c.recv_json()
                    self.assertEqual(m["type"], "synced", m)
                    got[m["conv"]] = m["head"]
                self.assertEqual(got, {conv_p: 3, conv_q: 0})
                await c.expect_silence(0.2)
            finally:
                await c.close()
        self.arun(go())

    def test_hello_with_client_field_and_wildcard_token(self):
        n = self.node
        conv = n.new_conv()

        async def go():
            c, w = await open_client(n, mint_token("carol", ["*"]), [{"conv": conv}])
            try:
                self.assertEqual([s["conv"] for s in w["subs"]], [conv])
                msgs, synced = await c.until_synced(conv)
                self.assertEqual(msgs, [])
                self.assertEqual(synced["head"], 0)
            finally:
                await c.close()
        self.arun(go())

    def test_rest_send_live_msg_all_fields(self):
        n = self.node
        conv = n.new_conv()
        body = {"text": "héllo wörld ✓", "n": [1, 2.5, None, True], "nested": {"a": {"b": "c"}}}

        async def go():
            c, w = await open_client(n, self.tok([conv]), [{"conv": conv, "watermark": None}])
            try:
                await c.until_synced(conv)
                r = n.send(conv, body, sender="alice")
                self.assertEqual(r["seq"], 1)
                self.assertIsInstance(r["id"], str)
                m = await c.recv_json()
                self.assertMsg(m, conv, seq=1, sender="alice", body=body, id=r["id"])
                # a second one with an Idempotency-Key carries that id
                r2 = n.send(conv, "plain string body", sender="dave", key="k-2")
                m2 = await c.recv_json()
                self.assertMsg(m2, conv, seq=2, sender="dave", body="plain string body", id=r2["id"])
                await c.expect_silence(0.2)
            finally:
                await c.close()
        self.arun(go())

    def test_ws_send_sent_and_idempotent(self):
        n = self.node
        conv = n.new_conv()

        async def go():
            sender, _ = await open_client(n, mint_token("erin", [conv]), [{"conv": conv, "watermark": None}])
            watcher, _ = await open_client(n, mint_token("watch", [conv]), [{"conv": conv, "watermark": None}])
            try:
                await sender.until_synced(conv)
                await watcher.until_synced(conv)
                body = {"text": "from ws"}
                await sender.send_json({"type": "send", "conv": conv, "id": "cm-1", "body": body})
                sent, seen = await sender.until(lambda m: m.get("type") == "sent")
                self.assertEqual(sent, {"type": "sent", "conv": conv, "id": "cm-1", "seq": 1})
                # same id again: same seq
                await sender.send_json({"type": "send", "conv": conv, "id": "cm-1", "body": body})
                sent2, _ = await sender.until(lambda m: m.get("type") == "sent")
                self.assertEqual(sent2["seq"], 1, sent2)
                self.assertEqual(sent2["id"], "cm-1")
                # the watcher sees it once: next after it is the fence message
                m = await watcher.recv_json()
                self.assertMsg(m, conv, seq=1, sender="erin", body=body, id="cm-1")
                fence = n.send(conv, {"fence": 1})
                self.assertEqual(fence["seq"], 2)
                m = await watcher.recv_json()
                self.assertMsg(m, conv, seq=2, body={"fence": 1})
                await watcher.expect_silence(0.2)
                # REST view agrees: exactly two messages
                msgs, head = n.all_messages(conv)
                self.assertEqual(head, 2)
                self.assertEqual([x["id"] for x in msgs], ["cm-1", fence["id"]])
                self.assertEqual(msgs[0]["sender"], "erin")
            finally:
                await sender.close()
                await watcher.close()
        self.arun(go())

    def test_body_shapes_and_sizes_live_and_replay(self):
        # frame length encodings (7-bit, 16-bit, 64-bit), any JSON as body,
        # non-ASCII and escapes survive both live delivery and replay.
        # (65500: under max_message_bytes, which the server also applies to
        # REST bodies, while the msg frame carrying it needs a 64-bit length)
        n = self.node
        conv = n.new_conv()
        bodies = [None, 0, -1.5, True, "", [], {}, "x" * 90, "y" * 200, "z" * 65500,
                  {"emoji": "\U0001F600", "ls": "\u2028\u2029", "ctl": "\u0001\t\n", "q": "\"\\/"},
                  [[[[[[[[[[1]]]]]]]]]]]

        async def go():
            c, _ = await open_client(n, self.tok([conv]), [{"conv": conv, "watermark": None}])
            try:
                await c.until_synced(conv)
                for i, b in enumerate(bodies):
                    r = n.send(conv, b)
                    self.assertEqual(r["seq"], i + 1)
                live = await c.recv_msgs(len(bodies))
                self.assertEqual([m["body"] for m in live], bodies)
                await c.send_json({"type": "send", "conv": conv, "id": "null-body", "body": None})
                sent, _ = await c.until(lambda m: m.get("type") == "sent")
                self.assertEqual(sent["seq"], len(bodies) + 1)
            finally:
                await c.close()
            c, _ = await open_client(n, self.tok([conv]), [{"conv": conv, "watermark": 0}])
            try:
                msgs, _ = await c.until_synced(conv)
                self.assertEqual([m["body"] for m in msgs], bodies + [None])
            finally:
                await c.close()
        self.arun(go())

    def test_watermark_null_starts_live_at_head(self):
        n = self.node
        conv = n.new_conv()
        for i in range(5):
            n.send(conv, {"old": i})

        async def go():
            c, w = await open_client(n, self.tok([conv]), [{"conv": conv, "watermark": None}])
            try:
                self.assertEqual(w["subs"][0]["head"], 5)
                msgs, synced = await c.until_synced(conv)
                self.assertEqual(msgs, [], "null watermark must not replay")
                self.assertEqual(synced["head"], 5)
                n.send(conv, {"new": 1})
                m = await c.recv_json()
                self.assertMsg(m, conv, seq=6, body={"new": 1})
            finally:
                await c.close()
        self.arun(go())

    def test_absent_watermark_is_null(self):
        n = self.node
        conv = n.new_conv()
        n.send(conv, {"old": 1})

        async def go():
            c, w = await open_client(n, self.tok([conv]), [{"conv": conv}])
            try:
                msgs, synced = await c.until_synced(conv)
                self.assertEqual(msgs, [])
                self.assertEqual(synced["head"], 1)
            finally:
                await c.close()
        self.arun(go())

    def test_watermark_zero_replays_everything(self):
        n = self.node
        conv = n.new_conv()
        sent = [n.send(conv, {"i": i}, sender="s%d" % i) for i in range(7)]

        async def go():
            c, w = await open_client(n, self.tok([conv]), [{"conv": conv, "watermark": 0}])
            try:
                self.assertEqual(w["subs"][0]["head"], 7)
                msgs, synced = await c.until_synced(conv)
                self.assertEqual([m["seq"] for m in msgs], list(range(1, 8)))
                for i, m in enumerate(msgs):
                    self.assertMsg(m, conv, seq=i + 1, sender="s%d" % i, body={"i": i}, id=sent[i]["id"])
                self.assertEqual(synced["head"], 7)
                n.send(conv, {"i": 7})
                m = await c.recv_json()
                self.assertMsg(m, conv, seq=8)
            finally:
                await c.close()
        self.arun(go())

    def test_resume_with_watermark(self):
        n = self.node
        conv = n.new_conv()
        for i in range(4):
            n.send(conv, {"i": i})

        async def go():
            c, _ = await open_client(n, self.tok([conv]), [{"conv": conv, "watermark": 0}])
            msgs, synced = await c.until_synced(conv)
            watermark = msgs[-1]["seq"]
            self.assertEqual(watermark, 4)
            await c.close()
            later = [n.send(conv, {"later": i}) for i in range(3)]
            c, w = await open_client(n, self.tok([conv]), [{"conv": conv, "watermark": watermark}])
            try:
                self.assertEqual(w["subs"][0]["head"], 7)
                msgs, synced = await c.until_synced(conv)
                self.assertEqual([m["seq"] for m in msgs], [5, 6, 7])
                self.assertEqual([m["id"] for m in msgs], [x["id"] for x in later])
                self.assertEqual([m["body"] for m in msgs], [{"later": i} for i in range(3)])
                self.assertEqual(synced["head"], 7)
                n.send(conv, {"live": 1})
                m = await c.recv_json()
                self.assertMsg(m, conv, seq=8, body={"live": 1})
                await c.expect_silence(0.2)
            finally:
                await c.close()
        self.arun(go())

    def test_watermark_at_head_no_replay(self):
        n = self.node
        conv = n.new_conv()
        for i in range(3):
            n.send(conv, {"i": i})

        async def go():
            c, _ = await open_client(n, self.tok([conv]), [{"conv": conv, "watermark": 3}])
            try:
                msgs, synced = await c.until_synced(conv)
                self.assertEqual(msgs, [])
                self.assertEqual(synced["head"], 3)
            finally:
                await c.close()
        self.arun(go())

    def test_long_replay_across_pages(self):
        n = self.node
        conv = n.new_conv()
        total = 2300
        with n.session() as s:
            for i in range(total):
                r = s.send(conv, {"i": i}, sender="bulk")
                if r["seq"] != i + 1:
                    self.fail("seq %r for message %d" % (r, i))

        async def go():
            c, w = await open_client(n, self.tok([conv]), [{"conv": conv, "watermark": 0}])
            try:
                self.assertEqual(w["subs"][0]["head"], total)
                msgs, synced = await c.until_synced(conv, timeout=30)
                seqs = [m["seq"] for m in msgs]
                self.assertEqual(len(seqs), total, "replay incomplete: %d of %d" % (len(seqs), total))
                self.assertEqual(seqs, list(range(1, total + 1)))
                self.assertEqual([m["body"]["i"] for m in msgs], list(range(total)))
                self.assertEqual(synced["head"], total)
            finally:
                await c.close()
            # from the middle of a page boundary
            c, w = await open_client(n, self.tok([conv]), [{"conv": conv, "watermark": 999}])
            try:
                msgs, synced = await c.until_synced(conv, timeout=30)
                self.assertEqual([m["seq"] for m in msgs], list(range(1000, total + 1)))
                self.assertEqual(synced["head"], total)
            finally:
                await c.close()
        self.arun(go(), timeout=50)

        # REST paging agrees
        js = n.messages(conv, after=990, limit=20)
        self.assertEqual([m["seq"] for m in js["messages"]], list(range(991, 1011)))
        self.assertEqual(js["head"], total)

    def test_ping_pong(self):
        n = self.node
        conv = n.new_conv()

        async def go():
            c, _ = await open_client(n, self.tok([conv]), [{"conv": conv}])
            try:
                await c.until_synced(conv)
                await c.send_json({"type": "ping"})
                m = await c.recv_json()
                self.assertEqual(m, {"type": "pong"})
                # and a WebSocket-level ping is answered with a pong frame
                waiter = await c.ws.ping(b"abc")
                await asyncio.wait_for(waiter, 5)
            finally:
                await c.close()
        self.arun(go())

    def test_sync_frame(self):
        n = self.node
        conv = n.new_conv()
        for i in range(6):
            n.send(conv, {"i": i})

        async def go():
            c, _ = await open_client(n, self.tok([conv]), [{"conv": conv, "watermark": None}])
            try:
                msgs, synced = await c.until_synced(conv)
                self.assertEqual(msgs, [])
                await c.send_json({"type": "sync", "conv": conv, "watermark": 3})
                msgs, synced = await c.until_synced(conv)
                self.assertEqual([m["seq"] for m in msgs], [4, 5, 6])
                self.assertEqual([m["body"] for m in msgs], [{"i": 3}, {"i": 4}, {"i": 5}])
                self.assertEqual(synced["head"], 6)
                await c.send_json({"type": "sync", "conv": conv, "watermark": 0})
                msgs, synced = await c.until_synced(conv)
                self.assertEqual([m["seq"] for m in msgs], [1, 2, 3, 4, 5, 6])
                # live continues after a sync
                n.send(conv, {"i": 6})
                m = await c.recv_json()
                self.assertMsg(m, conv, seq=7)
                await c.expect_silence(0.2)
            finally:
                await c.close()
        self.arun(go())

    def test_two_subscribers_each_once(self):
        n = self.node
        conv = n.new_conv()

        async def go():
            a, _ = await open_client(n, self.tok([conv], "a"), [{"conv": conv, "watermark": None}])
            b, _ = await open_client(n, self.tok([conv], "b"), [{"conv": conv, "watermark": None}])
            try:
                await a.until_synced(conv)
                await b.until_synced(conv)
                ids = [n.send(conv, {"i": i})["id"] for i in range(10)]
                for c in (a, b):
                    msgs = await c.recv_msgs(10)
                    self.assertEqual([m["seq"] for m in msgs], list(range(1, 11)))
                    self.assertEqual([m["id"] for m in msgs], ids)
                    await c.expect_silence(0.3)
            finally:
                await a.close()
                await b.close()
        self.arun(go())

    def test_one_connection_two_conversations(self):
        n = self.node
        c1, c2 = n.new_conv(), n.new_conv()

        async def go():
            c, w = await open_client(n, self.tok([c1, c2]), [{"conv": c1}, {"conv": c2}])
            try:
                for _ in range(2):
                    m = await c.recv_json()
                    self.assertEqual(m["type"], "synced")
                n.send(c1, "one")
                n.send(c2, "two")
                n.send(c1, "three")
                msgs = await c.recv_msgs(3)
                by = {}
                for m in msgs:
                    by.setdefault(m["conv"], []).append((m["seq"], m["body"]))
                self.assertEqual(by, {c1: [(1, "one"), (2, "three")], c2: [(1, "two")]})
            finally:
                await c.close()
        self.arun(go())

    def test_concurrent_rest_writers_gapless(self):
        n = self.node
        conv = n.new_conv()
        threads_n, per = 6, 40
        errors = []

        def writer(t):
            try:
                with n.session() as s:
                    for i in range(per):
                        s.send(conv, {"t": t, "i": i}, sender="w%d" % t)
            except Exception as e:  # reported below
                errors.append(repr(e))

        async def go():
            c, _ = await open_client(n, self.tok([conv]), [{"conv": conv, "watermark": None}])
            try:
                await c.until_synced(conv)
                ths = [threading.Thread(target=writer, args=(t,)) for t in range(threads_n)]
                loop = asyncio.get_running_loop()
                recv = asyncio.ensure_future(c.recv_msgs(threads_n * per, timeout=40))
                for th in ths:
                    th.start()
                await loop.run_in_executor(None, lambda: [th.join(40) for th in ths])
                self.assertEqual(errors, [])
                msgs = await recv
                self.assertEqual([m["seq"] for m in msgs], list(range(1, threads_n * per + 1)))
                # per writer, its own messages arrive in its send order
                for t in range(threads_n):
                    mine = [m["body"]["i"] for m in msgs if m["body"]["t"] == t]
                    self.assertEqual(mine, list(range(per)))
                    self.assertTrue(all(m["sender"] == "w%d" % m["body"]["t"] for m in msgs))
                self.assertEqual(len({m["id"] for m in msgs}), threads_n * per)
                await c.expect_silence(0.3)
            finally:
                await c.close()
        self.arun(go(), timeout=50)
        msgs, head = n.all_messages(conv)
        self.assertEqual(head, threads_n * per)
        self.assertEqual([m["seq"] for m in msgs], list(range(1, threads_n * per + 1)))

    def test_live_writes_during_replay_gapless(self):
        # live messages that arrive while the handshake replay is running
        # must be neither lost nor duplicated (DESIGN: buffered, then sent)
        n = self.node
        conv = n.new_conv()
        with n.session() as s:
            for i in range(1200):
                s.send(conv, {"i": i})
        extra = 300
        started = threading.Event()
        errors = []

        def writer():
            try:
                with n.session() as s:
                    for i in range(extra):
                        s.send(conv, {"live": i})
                        if i == 10:
                            started.set()
            except Exception as e:
                errors.append(repr(e))
            finally:
                started.set()
        th = threading.Thread(target=writer)
        th.start()
        try:
            started.wait(10)

            async def go():
                c, w = await open_client(n, self.tok([conv]), [{"conv": conv, "watermark": 0}])
                try:
                    total = 1200 + extra
                    msgs, synced = await c.until_synced(conv, timeout=20)
                    self.assertGreaterEqual(synced["head"], w["subs"][0]["head"])
                    rest = await c.recv_msgs(total - len(msgs), timeout=20)
                    seqs = [m["seq"] for m in msgs + rest]
                    self.assertEqual(seqs, list(range(1, total + 1)))
                    await c.expect_silence(0.3)
                finally:
                    await c.close()
            self.arun(go(), timeout=45)
        finally:
            th.join(30)
        self.assertEqual(errors, [])

    def test_many_clients_handshake_at_once(self):
        n = self.node
        conv = n.new_conv()
        with n.session() as s:
            for i in range(50):
                s.send(conv, i)
        clients_n = 120

        async def one():
            c, w = await open_client(n, self.tok([conv]), [{"conv": conv, "watermark": 0}], timeout=15)
            msgs, synced = await c.until_synced(conv, timeout=15)
            return c, [m["seq"] for m in msgs], synced["head"]

        async def go():
            res = await asyncio.gather(*[one() for _ in range(clients_n)], return_exceptions=True)
            clients = [r[0] for r in res if not isinstance(r, BaseException)]
            try:
                failures = [r for r in res if isinstance(r, BaseException)]
                self.assertEqual(failures, [], "%d of %d handshakes failed" % (len(failures), clients_n))
                for _, seqs, head in res:
                    self.assertEqual(seqs, list(range(1, 51)))
                    self.assertEqual(head, 50)
                r = n.send(conv, "to everyone")
                got = await asyncio.gather(*[c.recv_json(10) for c in clients])
                self.assertTrue(all(m["type"] == "msg" and m["seq"] == r["seq"] for m in got))
                st, _, text = n.get_text("/metrics")
                conns = [float(l.split()[-1]) for l in text.splitlines() if l.startswith("converger_connections")]
                self.assertTrue(conns and sum(conns) >= clients_n, conns)
            finally:
                await asyncio.gather(*[c.close() for c in clients])
        self.arun(go(), timeout=50)


if __name__ == "__main__":
    harness.main()
