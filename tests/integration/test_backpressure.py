"""Big histories and slow readers: replay is paced by what the client reads,
answers are bounded in bytes, and a client that stops reading is cut off
after its heartbeat and close deadlines instead of holding memory forever."""

import json
import os
import random
import socket
import threading
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import NodeCase, RawWs, RestSession, mint_token, raw_connect  # noqa: E402


def connections(node):
    for line in node.get_text("/metrics")[2].splitlines():
        if line.startswith("converger_connections "):
            return float(line.split()[1])
    return None


class Backpressure(NodeCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.node = cls.class_node({"CONVERGER_SQLITE_SYNC": "off"})
        cls.conv = cls.node.new_conv()
        cls.body = "x" * 4000
        # 3 000 messages of 4 KB: a 12 MB history, over the 8 MiB output limit.
        with RestSession(cls.node.port) as rs:
            for i in range(3000):
                rs.send(cls.conv, {"i": i, "pad": cls.body})

    def test_long_history_to_a_slow_reader_arrives_whole(self):
        ws = RawWs(self.node.port, timeout=30)
        self.addCleanup(ws.close)
        ws.hello(mint_token("slow", [self.conv]), [{"conv": self.conv, "watermark": 0}])
        time.sleep(1.5)  # read nothing for a while: the node must not queue 12 MB
        m = ws.recv_json(10)
        self.assertEqual(m.get("type"), "welcome", m)
        want = 1
        while True:
            m = ws.recv_json(10)
            if m["type"] == "synced":
                self.assertEqual(m["head"], 3000)
                break
            self.assertEqual((m["type"], m["seq"]), ("msg", want))
            self.assertEqual(m["body"]["i"], want - 1)
            want += 1
        self.assertEqual(want, 3001)
        # live after the replay
        r = self.node.send(self.conv, "live after 12 MB")
        m = ws.recv_json(5)
        self.assertEqual((m["type"], m["seq"]), ("msg", r["seq"]))
        # not left at head for the other tests: nothing else depends on the head

    def test_rest_list_is_bounded_in_bytes_and_pages_on(self):
        st, _, js = self.node.request("GET", "/v1/conversations/%s/messages?after=0&limit=1000" % self.conv,
                                      timeout=15)
        self.assertEqual(st, 200)
        n = len(js["messages"])
        self.assertGreater(n, 10)
        self.assertLess(n, 1000, "a 1000 x 4 KB page should be cut by bytes")
        self.assertEqual([m["seq"] for m in js["messages"]], list(range(1, n + 1)))
        st, _, js2 = self.node.request("GET", "/v1/conversations/%s/messages?after=%d&limit=1000" % (self.conv, n))
        self.assertEqual(st, 200)
        self.assertEqual(js2["messages"][0]["seq"], n + 1)

    def test_many_subs_with_history_in_one_hello(self):
        convs = [self.node.new_conv() for _ in range(20)]
        with RestSession(self.node.port) as rs:
            for c in convs:
                for i in range(150):
                    rs.send(c, {"i": i, "pad": "y" * 2000})
        ws = RawWs(self.node.port, timeout=30)
        self.addCleanup(ws.close)
        ws.hello(mint_token("many", convs), [{"conv": c, "watermark": 0} for c in convs])
        self.assertEqual(ws.recv_json(10)["type"], "welcome")
        last = {c: 0 for c in convs}
        synced = set()
        while len(synced) < len(convs):
            m = ws.recv_json(10)
            if m["type"] == "synced":
                self.assertEqual(last[m["conv"]], 150, m)
                synced.add(m["conv"])
                continue
            self.assertEqual(m["type"], "msg", m)
            self.assertEqual(m["seq"], last[m["conv"]] + 1, "gap or repeat in %s" % m["conv"])
            last[m["conv"]] = m["seq"]

    def test_reader_that_stops_is_cut_off(self):
        node = self.node_start({"CONVERGER_SQLITE_SYNC": "off", "CONVERGER_HEARTBEAT_MS": "400"})
        conv = node.new_conv()
        with RestSession(node.port) as rs:
            for i in range(300):
                rs.send(conv, {"i": i, "pad": self.body})
        s = raw_connect(node.port)
        self.addCleanup(s.close)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        # handshake by hand: this client never reads, not even the 101
        s.sendall(("GET /v1/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                   "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        s.sendall(RawWs.encode_frame(harness.OP_TEXT, json.dumps({
            "type": "hello", "token": mint_token("stuck", [conv]),
            "subs": [{"conv": conv, "watermark": 0}]}).encode()))
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and connections(node) < 1:
            time.sleep(0.05)
        self.assertEqual(connections(node), 1, "the stuck client never connected")
        # heartbeat 400 ms: silent for 800 ms -> close frame queued behind
        # unread output -> cut off CONN_CLOSE_TIMEOUT_MS (5 s) later
        deadline = time.monotonic() + 12
        while time.monotonic() < deadline and connections(node) > 0:
            time.sleep(0.1)
        self.assertEqual(connections(node), 0, "a client that reads nothing is never dropped")


class SlowReaders(NodeCase):
    """Clients that read slowly or pause while history and live traffic pile
    up: each must see every seq exactly once, in order, and never be dropped
    (the store is their buffer, not the node's memory)."""

    def test_live_burst_while_a_reader_pauses(self):
        n = self.node_start({"CONVERGER_SQLITE_SYNC": "off"})
        conv = n.new_conv()
        pad = "x" * 4000
        with RestSession(n.port) as rs:
            for i in range(1000):
                rs.send(conv, {"i": i, "pad": pad})
        ws = RawWs(n.port, timeout=30)
        self.addCleanup(ws.close)
        ws.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        ws.hello(mint_token("pause", [conv]), [{"conv": conv, "watermark": 0}])
        time.sleep(0.3)
        with RestSession(n.port) as rs:  # 10 MB of live messages while it reads nothing
            for i in range(2500):
                rs.send(conv, {"live": i, "pad": pad})
        self.assertEqual(ws.recv_json(20)["type"], "welcome")
        want = 1
        while want <= 3500:
            m = ws.recv_json(20)
            if m["type"] == "synced":
                continue
            self.assertEqual((m["type"], m["seq"]), ("msg", want))
            want += 1
        self.assertNotIn("slow consumer", n.log_text())

    def test_many_subscriptions_of_small_messages(self):
        n = self.node_start({"CONVERGER_SQLITE_SYNC": "off"})
        convs = [n.new_conv() for _ in range(40)]
        def fill(c):
            with RestSession(n.port) as rs:
                for i in range(1000):
                    rs.send(c, {"t": "hi"}, key="%s-%d-%s" % ("k" * 100, i, c[-8:]))
        ts = [threading.Thread(target=fill, args=(c,)) for c in convs]
        [t.start() for t in ts]
        [t.join() for t in ts]
        ws = RawWs(n.port, timeout=30)
        self.addCleanup(ws.close)
        ws.hello(mint_token("many", convs), [{"conv": c, "watermark": 0} for c in convs])
        self.assertEqual(ws.recv_json(20)["type"], "welcome")
        last = {c: 0 for c in convs}
        synced = 0
        while synced < len(convs):
            m = ws.recv_json(20)
            if m["type"] == "synced":
                self.assertEqual(last[m["conv"]], 1000)
                synced += 1
                continue
            self.assertEqual(m["seq"], last[m["conv"]] + 1)
            last[m["conv"]] = m["seq"]
        self.assertNotIn("slow consumer", n.log_text())

    def test_mixed_readers_with_concurrent_writers(self):
        n = self.node_start({"CONVERGER_SQLITE_SYNC": "off"})
        convs = [n.new_conv() for _ in range(3)]
        pad = "p" * 600
        def fill(c):
            with RestSession(n.port) as rs:
                for i in range(1500):
                    rs.send(c, {"h": i, "pad": pad})
        ts = [threading.Thread(target=fill, args=(c,)) for c in convs]
        [t.start() for t in ts]
        [t.join() for t in ts]
        writers_done = threading.Event()
        problems = []

        def writer(k):
            rnd = random.Random(k)
            with RestSession(n.port) as rs:
                for i in range(600):
                    rs.send(rnd.choice(convs), {"w": k, "i": i, "pad": "q" * 200})

        def reader(k, mode):
            ws = RawWs(n.port, timeout=30)
            try:
                if mode != "fast":
                    ws.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
                ws.hello(mint_token("r%d" % k, convs), [{"conv": c, "watermark": 0} for c in convs])
                if ws.recv_json(20)["type"] != "welcome":
                    problems.append("r%d: no welcome" % k)
                    return
                W = {c: 0 for c in convs}
                heads = None
                count = 0
                while True:
                    if heads is None and writers_done.is_set():
                        heads = {c: n.request("GET", "/v1/conversations/" + c)[2]["head"] for c in convs}
                    if heads and all(W[c] >= heads[c] for c in convs):
                        return
                    try:
                        m = ws.recv_json(1)
                    except socket.timeout:
                        continue
                    if m["type"] != "msg":
                        continue
                    if m["seq"] != W[m["conv"]] + 1:
                        problems.append("r%d %s: seq %d after %d" % (k, mode, m["seq"], W[m["conv"]]))
                        return
                    W[m["conv"]] = m["seq"]
                    count += 1
                    if mode == "slow" and count % 20 == 0:
                        time.sleep(0.005)
                    if mode == "pausing" and count % 1500 == 0:
                        time.sleep(0.7)
            except Exception as e:  # noqa: BLE001 - reported below
                problems.append("r%d %s: %r" % (k, mode, e))
            finally:
                ws.close()

        rs_ = [threading.Thread(target=reader, args=(k, mode))
               for k, mode in enumerate(["fast", "slow", "pausing", "fast", "slow", "pausing"])]
        ws_ = [threading.Thread(target=writer, args=(k,)) for k in range(2)]
        [t.start() for t in rs_ + ws_]
        [t.join(120) for t in ws_]
        writers_done.set()
        [t.join(120) for t in rs_]
        self.assertEqual(problems, [])
        self.assertNotIn("slow consumer", n.log_text())


class SlowRequests(NodeCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.node = cls.class_node({"CONVERGER_HTTP_HEADER_TIMEOUT_MS": "300",
                                   "CONVERGER_REVOCATION_REFRESH_MS": "600000"})

    def test_stalled_body_is_cut_off(self):
        s = raw_connect(self.node.port)
        self.addCleanup(s.close)
        s.sendall(b"POST /v1/channels HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                  b"Content-Length: 100\r\n\r\n{" % harness.API_KEY.encode())
        s.settimeout(5)
        t0 = time.monotonic()
        data = b""
        try:
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        except ConnectionResetError:
            pass
        self.assertLess(time.monotonic() - t0, 3, "a stalled body kept the connection open")
        self.assertEqual(data, b"", "no answer to an incomplete request")

    def test_pipelined_upgrade_after_an_async_request(self):
        conv = self.node.new_conv()
        s = raw_connect(self.node.port)
        self.addCleanup(s.close)
        get = ("GET /v1/conversations/%s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n"
               % (conv, harness.API_KEY))
        up = ("GET /v1/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
        s.sendall((get + up).encode())
        r = harness.HttpReader(s)
        self.assertEqual(r.read_response()[0], 200)
        self.assertEqual(r.read_response()[0], 101)
        s.sendall(RawWs.encode_frame(harness.OP_TEXT, json.dumps({
            "type": "hello", "token": mint_token("p", [conv]), "subs": [{"conv": conv}]}).encode()))
        s.settimeout(3)
        got = r.buf
        while b"welcome" not in got:
            chunk = s.recv(4096)
            self.assertTrue(chunk, "closed before welcome")
            got += chunk
        self.assertIn(b'"type":"welcome"', got)

    def test_watermark_above_head_counts_as_head(self):
        conv = self.node.new_conv()
        for i in range(3):
            self.node.send(conv, i)
        ws = RawWs(self.node.port)
        self.addCleanup(ws.close)
        ws.hello(mint_token("ahead", [conv]), [{"conv": conv, "watermark": 100}])
        self.assertEqual(ws.recv_json()["type"], "welcome")
        m = ws.recv_json()
        self.assertEqual((m["type"], m["head"]), ("synced", 3))
        r = self.node.send(conv, "next")
        m = ws.recv_json()
        self.assertEqual((m["type"], m["seq"]), ("msg", r["seq"]))

    def test_stop_is_prompt_with_a_long_refresh_period(self):
        n = self.node_start({"CONVERGER_REVOCATION_REFRESH_MS": "600000"})
        t0 = time.monotonic()
        self.assertEqual(n.stop(), 0)
        self.assertLess(time.monotonic() - t0, 3)


if __name__ == "__main__":
    harness.main()
