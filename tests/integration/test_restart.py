"""Durability and shutdown: acknowledged messages survive kill -9; SIGTERM
closes sockets with 1001 and exits 0; a client resumes across a restart with
its watermark and loses nothing."""

import asyncio
import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import NodeCase, WsClient, RawWs, open_client, mint_token  # noqa: E402


class Restart(NodeCase):
    def test_kill9_keeps_acknowledged_rest_and_ws_messages(self):
        n = self.node_start()
        conv = n.new_conv()
        acked = []
        with n.session() as s:
            for i in range(20):
                acked.append(s.send(conv, {"i": i}, sender="rest"))

        async def ws_send():
            c, _ = await open_client(n, mint_token("wsuser", [conv]), [{"conv": conv}])
            try:
                await c.until_synced(conv)
                await c.send_json({"type": "send", "conv": conv, "id": "ws-last", "body": {"ws": True}})
                sent, _ = await c.until(lambda m: m.get("type") == "sent")
                return sent
            finally:
                # kill before closing politely: the ack is all we rely on
                n.kill9()
                await c.close()
        sent = self.arun(ws_send())
        self.assertEqual(sent["seq"], 21)
        self.assertEqual(n.exit_codes[-1], -9)

        # one more REST ack, then kill -9 immediately
        n.start()
        last = n.send(conv, {"final": True}, sender="rest")
        self.assertEqual(last["seq"], 22)
        n.kill9()
        n.start()

        msgs, head = n.all_messages(conv)
        self.assertEqual(head, 22)
        self.assertEqual([m["seq"] for m in msgs], list(range(1, 23)))
        self.assertEqual([m["id"] for m in msgs[:20]], [a["id"] for a in acked])
        self.assertEqual(msgs[20]["id"], "ws-last")
        self.assertEqual(msgs[20]["sender"], "wsuser")
        self.assertEqual(msgs[20]["body"], {"ws": True})
        self.assertEqual(msgs[21]["body"], {"final": True})
        st, _, js = n.request("GET", "/v1/conversations/%s" % conv)
        self.assertEqual(st, 200)
        self.assertEqual(js["head"], 22)

        async def replay():
            c, w = await open_client(n, mint_token("r", [conv]), [{"conv": conv, "watermark": 0}])
            try:
                self.assertEqual(w["subs"][0]["head"], 22)
                got, synced = await c.until_synced(conv)
                self.assertEqual([m["seq"] for m in got], list(range(1, 23)))
                self.assertEqual(got[20]["id"], "ws-last")
                self.assertEqual(synced["head"], 22)
                # seq continues gaplessly after the crash, idempotency survives
                again = n.send(conv, {"final": True}, sender="rest", key="after-crash")
                self.assertEqual(again["seq"], 23)
                m = await c.recv_json()
                self.assertEqual(m["seq"], 23)
                await c.send_json({"type": "send", "conv": conv, "id": "ws-last", "body": {"ws": True}})
                s2, _ = await c.until(lambda m: m.get("type") == "sent")
                self.assertEqual(s2["seq"], 21, "idempotency key lost across kill -9")
            finally:
                await c.close()
        self.arun(replay())
        self.assertEqual(n.stop(), 0)

    def test_sigterm_closes_sockets_1001_and_exits_0(self):
        n = self.node_start()
        conv = n.new_conv()

        async def go():
            a, _ = await open_client(n, mint_token("a", [conv]), [{"conv": conv}])
            b, _ = await open_client(n, mint_token("b", [conv]), [{"conv": conv}])
            await a.until_synced(conv)
            await b.until_synced(conv)
            raw = RawWs(n.port)
            raw.hello(mint_token("raw", [conv]), [{"conv": conv}])
            raw.recv_until(lambda m: m.get("type") == "synced")
            loop = asyncio.get_running_loop()
            t0 = time.monotonic()
            stop = loop.run_in_executor(None, n.stop)
            ca = await a.wait_closed(timeout=10)
            cb = await b.wait_closed(timeout=10)
            cr = await loop.run_in_executor(None, lambda: raw.expect_close(timeout=10))
            rc = await stop
            raw.close()
            return ca, cb, cr, rc, time.monotonic() - t0
        ca, cb, cr, rc, elapsed = self.arun(go(), timeout=40)
        self.assertEqual(ca[0], 1001, "websockets client close: %r" % (ca,))
        self.assertEqual(cb[0], 1001, "websockets client close: %r" % (cb,))
        self.assertEqual(cr[0], 1001, "raw client close: %r" % (cr,))
        self.assertEqual(rc, 0, "exit code after SIGTERM")
        self.assertLess(elapsed, 10)

    def test_sigterm_many_connections_all_1001(self):
        n = self.node_start()
        conv = n.new_conv()
        clients = []
        for i in range(40):
            ws = RawWs(n.port)
            self.addCleanup(ws.close)
            ws.hello(mint_token("m%d" % i, [conv]), [{"conv": conv}])
            clients.append(ws)
        for ws in clients:
            ws.recv_until(lambda m: m.get("type") == "synced")
        # one more that never said hello
        idle = RawWs(n.port)
        self.addCleanup(idle.close)
        os.kill(n.proc.pid, signal.SIGTERM)
        codes = [ws.expect_close(10)[0] for ws in clients]
        self.assertEqual(codes, [1001] * len(clients))
        self.assertIn(idle.expect_close(10)[0], (1001, 1008))
        self.assertEqual(n.stop(), 0)

    def test_kill9_during_concurrent_burst(self):
        n = self.node_start()
        conv = n.new_conv()
        acked, errors = {}, []
        stop = threading.Event()

        def writer(t):
            try:
                with n.session() as s:
                    i = 0
                    while not stop.is_set():
                        st, _, js = s.request("POST", "/v1/conversations/%s/messages" % conv,
                                              {"sender": "w", "body": {"t": t, "i": i}},
                                              headers={"Idempotency-Key": "w%d-%d" % (t, i)})
                        if st in (200, 201):
                            acked[js["id"]] = js["seq"]
                        i += 1
            except Exception as e:  # the kill cuts connections: expected
                errors.append(e)
        ths = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
        for th in ths:
            th.start()
        deadline = time.monotonic() + 10
        while len(acked) < 200 and time.monotonic() < deadline:
            time.sleep(0.01)
        n.kill9()
        stop.set()
        for th in ths:
            th.join(10)
        self.assertGreaterEqual(len(acked), 200)
        n.start()
        msgs, head = n.all_messages(conv)
        self.assertEqual([m["seq"] for m in msgs], list(range(1, head + 1)), "gap after crash")
        stored = {m["id"]: m["seq"] for m in msgs}
        lost = {k: v for k, v in acked.items() if stored.get(k) != v}
        self.assertEqual(lost, {}, "acknowledged messages lost or moved by kill -9")
        self.assertEqual(n.stop(), 0)

    def test_sigterm_idle_node_exits_0(self):
        n = self.node_start()
        self.assertEqual(n.stop(), 0)

    def test_resume_across_restart_loses_nothing(self):
        n = self.node_start()
        conv = n.new_conv()
        for i in range(5):
            n.send(conv, {"phase": "before", "i": i})
        tok = mint_token("res", [conv])

        async def first():
            c, _ = await open_client(n, tok, [{"conv": conv, "watermark": 0}])
            msgs, synced = await c.until_synced(conv)
            n.send(conv, {"phase": "live", "i": 0})
            live = await c.recv_msgs(1)
            loop = asyncio.get_running_loop()
            stop = loop.run_in_executor(None, n.stop)
            code, _, _ = await c.wait_closed(timeout=10)
            rc = await stop
            return msgs + live, code, rc
        got, code, rc = self.arun(first())
        self.assertEqual([m["seq"] for m in got], [1, 2, 3, 4, 5, 6])
        self.assertEqual(code, 1001)
        self.assertEqual(rc, 0)
        watermark = got[-1]["seq"]

        n.start()
        # messages that arrive while the client is away
        missed = [n.send(conv, {"phase": "away", "i": i}) for i in range(4)]

        async def second():
            c, w = await open_client(n, tok, [{"conv": conv, "watermark": watermark}])
            try:
                self.assertEqual(w["subs"][0]["head"], 10)
                msgs, synced = await c.until_synced(conv)
                self.assertEqual([m["seq"] for m in msgs], [7, 8, 9, 10])
                self.assertEqual([m["id"] for m in msgs], [x["id"] for x in missed])
                self.assertEqual(synced["head"], 10)
                n.send(conv, {"phase": "after"})
                m = await c.recv_json()
                self.assertEqual((m["type"], m["seq"], m["body"]), ("msg", 11, {"phase": "after"}))
            finally:
                await c.close()
        self.arun(second())
        self.assertEqual(n.stop(), 0)


if __name__ == "__main__":
    harness.main()
