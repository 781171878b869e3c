"""WebSocket connections are capped below the open-file limit, so that a
node full of clients still has descriptors for health checks, metrics,
admin requests and its store: CONVERGER_MAX_CONNECTIONS, by default
RLIMIT_NOFILE minus 128 + 2 per pool connection; upgrades beyond it get 503 +
Retry-After + too_many_connections."""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import NodeCase, RawWs, json_body, mint_token  # noqa: E402

NOFILE = 256
POOL = 4
RESERVE = 128 + 2 * POOL  # serve.c: FD_RESERVE_BASE + FD_RESERVE_PER_POOL * pool

NODE_ENV = {
    "CONVERGER_POOL_SIZE": str(POOL),
    # held sockets stay open until the node itself decides to close them
    "CONVERGER_HELLO_TIMEOUT_MS": "60000",
    "CONVERGER_HTTP_HEADER_TIMEOUT_MS": "60000",
    "CONVERGER_HEARTBEAT_MS": "60000",
}


def metric(text, name, labels=""):
    want = name + ("{%s}" % labels if labels else "")
    for line in text.splitlines():
        if line.startswith(want + " "):
            return float(line.split()[-1])
    return 0.0


class Base(NodeCase):
    def wait_connections(self, node, want, timeout=5.0):
        deadline = time.monotonic() + timeout
        while True:
            st, _, js = node.request("GET", "/admin/status")
            if st == 200 and js["connections"] == want:
                return
            if time.monotonic() > deadline:
                self.fail("connections %r, want %d" % (js, want))
            time.sleep(0.1)

    def assert_new_upgrade_welcomed(self, node, conv):
        """A new upgrade and hello are welcomed (retrying for up to 5 s while
        the node lets the flood's connections go)."""
        deadline = time.monotonic() + 5
        while True:
            try:
                ws = RawWs(node.port, timeout=2)
                break
            except (AssertionError, OSError, EOFError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        self.addCleanup(ws.close)
        ws.hello(mint_token("after", [conv]), [{"conv": conv}])
        self.assertEqual(ws.recv_json().get("type"), "welcome")


class MaxConnections(Base):
    def test_upgrades_beyond_max_connections_503(self):
        n = self.node_start(dict(NODE_ENV, CONVERGER_MAX_CONNECTIONS="3"))
        st, _, js = n.request("GET", "/admin/status")
        self.assertEqual((st, js.get("maxConnections")), (200, 3), js)
        self.assertIn("at most 3 WebSocket connection(s) (CONVERGER_MAX_CONNECTIONS)", n.log_text())
        conv = n.new_conv()
        held = []
        for i in range(3):
            ws = RawWs(n.port)
            self.addCleanup(ws.close)
            ws.hello(mint_token("u%d" % i, [conv]), [{"conv": conv}])
            self.assertEqual(ws.recv_json().get("type"), "welcome")
            held.append(ws)
        hints = set()
        for i in range(5):
            ws = RawWs(n.port, expect_101=False)
            self.addCleanup(ws.close)
            self.assertEqual(ws.status, 503, (ws.status, ws.body))
            js = json_body(ws.body)
            self.assertErrorBody(js, "too_many_connections")
            hint = js["error"].get("retryAfterMs")
            self.assertIsInstance(hint, int, js)
            self.assertTrue(1000 <= hint <= 6000, js)  # the node's jittered retry hint
            self.assertEqual(int(ws.headers.get("retry-after", "0")), (hint + 999) // 1000, ws.headers)
            self.assertIn("application/json", ws.headers.get("content-type", ""))
            self.assertTrue(ws.reader.at_eof(3), "connection kept after the 503")
            hints.add(hint)
        self.assertGreater(len(hints), 1, "five 503s with one hint: not jittered")
        # plain HTTP is still served, and the refusals are counted
        self.assertEqual(n.get("/livez")[0], 200)
        self.assertEqual(n.request("GET", "/admin/status")[0], 200)
        st, _, text = n.get_text("/metrics")
        self.assertEqual(metric(text, "converger_upgrades_refused_total", 'reason="max_connections"'), 5)
        # a connection goes: the next upgrade is welcomed
        held[0].close()
        self.wait_connections(n, 2)
        self.assert_new_upgrade_welcomed(n, conv)

    def test_default_is_the_open_file_limit_minus_the_reserve(self):
        n = self.node_start(NODE_ENV, nofile=NOFILE)
        st, _, js = n.request("GET", "/admin/status")
        self.assertEqual((st, js.get("maxConnections")), (200, NOFILE - RESERVE), js)
        self.assertIn("at most %d WebSocket connection(s): the open-file limit %d minus %d descriptors "
                      "kept for the pool, the store, LISTEN and health checks (128 + 2 per pool connection"
                      % (NOFILE - RESERVE, NOFILE, RESERVE), n.log_text())


if __name__ == "__main__":
    harness.main()
