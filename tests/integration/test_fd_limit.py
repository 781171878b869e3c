"""A node at its open-file limit: started with RLIMIT_NOFILE 256 and flooded
past it from this process with raw sockets (upgrades held open, silent TCP
connections, more of both while it lasts).

- With the derived CONVERGER_MAX_CONNECTIONS (the limit minus the reserve),
  upgrades beyond it get 503 + Retry-After + too_many_connections, and
  /livez, /readyz, /metrics and GET /admin/status answer within 100 ms each
  while descriptors run out; a welcomed client keeps getting messages sent
  over REST; the node does not spin; the accept errors are counted and
  logged at most once a second; after the flood new upgrades are welcomed.
- With CONVERGER_MAX_CONNECTIONS above the descriptor budget, WebSocket
  connections fill the table and nothing can be reclaimed: new connections
  are closed unanswered, counted and logged, the loop does not spin, and the
  node recovers once connections go."""

import base64
import os
import re
import resource
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import NodeCase, RawWs, HttpReader, json_body, mint_token, API_KEY  # noqa: E402

NOFILE = 256
POOL = 4
RESERVE = 128 + 2 * POOL  # serve.c: FD_RESERVE_BASE + FD_RESERVE_PER_POOL * pool
PROBE_BUDGET_S = 0.100

NODE_ENV = {
    "CONVERGER_POOL_SIZE": str(POOL),
    # held sockets stay open until the node itself decides to close them
    "CONVERGER_HELLO_TIMEOUT_MS": "60000",
    "CONVERGER_HTTP_HEADER_TIMEOUT_MS": "60000",
    "CONVERGER_HEARTBEAT_MS": "60000",
}


def raise_own_nofile(want=4096):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))


def cpu_seconds(pid):
    """utime + stime of a process, in seconds (proc(5): fields 14 and 15)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def upgrade_request(port):
    key = base64.b64encode(os.urandom(16)).decode()
    return ("GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: %s\r\n\r\n"
            % (port, key, harness.SUBPROTOCOL)).encode()


def get_request(path, key=None):
    auth = "Authorization: Bearer %s\r\n" % key if key else ""
    return ("GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%sConnection: close\r\n\r\n" % (path, auth)).encode()


def read_answer(sock, timeout):
    """(status, headers, body) of the answer on sock, or None if the node
    closed or reset it unanswered, or 'timeout'."""
    try:
        return HttpReader(sock, timeout).read_response()
    except (EOFError, ConnectionError):
        return None
    except socket.timeout:
        return "timeout"


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


    def test_the_soft_limit_is_raised_to_the_hard_one(self):
        """A soft limit under the hard one (a container's 1024 under a million): the node
        raises its own soft limit, as nginx and Go do, and sizes itself by it."""
        n = self.node_start(NODE_ENV, nofile=(200, NOFILE))
        st, _, js = n.request("GET", "/admin/status")
        self.assertEqual((st, js.get("maxConnections")), (200, NOFILE - RESERVE), js)
        self.assertIn("raised the open-file limit from 200 to %d (the hard limit)" % NOFILE, n.log_text())
        with open("/proc/%d/limits" % n.proc.pid) as f:
            line = [l for l in f if l.startswith("Max open files")][0]
        self.assertEqual(line.split()[3:5], [str(NOFILE), str(NOFILE)])


class FdLimit(Base):
    def setUp(self):
        raise_own_nofile()
        self.socks = []
        self.addCleanup(self.close_all)

    def close_all(self):
        for s in self.socks:
            try:
                s.close()
            except OSError:
                pass
        self.socks = []

    def connect(self, port, data=b""):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.socks.append(s)
        if data:
            s.sendall(data)
        return s

    def probe(self, port, path, key=None):
        """One request on a fresh connection: (status, seconds from connect
        to the whole answer); status None when closed unanswered."""
        t0 = time.monotonic()
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
        try:
            s.sendall(get_request(path, key))
            got = read_answer(s, 2)
        finally:
            s.close()
        return (got[0] if isinstance(got, tuple) else got), time.monotonic() - t0

    def welcomed_client(self, node, conv):
        ws = RawWs(node.port)
        self.addCleanup(ws.close)
        ws.hello(mint_token("steady", [conv]), [{"conv": conv}])
        self.assertEqual(ws.recv_json().get("type"), "welcome")
        ws.recv_until(lambda m: m.get("type") == "synced")
        return ws

    # ------------------------------------------------------------------
    def test_flood_past_the_limit(self):
        n = self.node_start(NODE_ENV, nofile=NOFILE)
        max_conn = NOFILE - RESERVE
        st, _, js = n.request("GET", "/admin/status")
        self.assertEqual((st, js.get("maxConnections")), (200, max_conn), js)
        self.assertRegex(n.log_text(), r"at most %d WebSocket connection\(s\): the open-file limit %d "
                         r"minus %d descriptors kept for the pool, the store, LISTEN and health checks"
                         % (max_conn, NOFILE, RESERVE))
        conv = n.new_conv()
        steady = self.welcomed_client(n, conv)
        cpu0 = cpu_seconds(n.proc.pid)
        t_flood = time.monotonic()

        # The flood: 260 upgrades and 140 silent connections, interleaved.
        upgrades = []
        for i in range(400):
            if i % 20 < 13:
                upgrades.append(self.connect(n.port, upgrade_request(n.port)))
            else:
                self.connect(n.port)
        answers = [read_answer(s, 5) for s in upgrades]
        ok = [a for a in answers if isinstance(a, tuple) and a[0] == 101]
        refused = [a for a in answers if isinstance(a, tuple) and a[0] == 503]
        other = [a for a in answers if isinstance(a, tuple) and a[0] not in (101, 503)]
        self.assertNotIn("timeout", answers, "an upgrade got no answer and was not closed")
        self.assertEqual(other, [], other[:3])
        self.assertEqual(len(ok), max_conn - 1, "101s beside the steady client")
        self.assertGreater(len(refused), 50, "503s: %d; closed unanswered: %d"
                           % (len(refused), answers.count(None)))
        for st, h, body in refused:
            js = json_body(body)
            self.assertErrorBody(js, "too_many_connections")
            hint = js["error"].get("retryAfterMs")
            self.assertIsInstance(hint, int, js)
            self.assertTrue(1000 <= hint <= 6000, js)  # the node's jittered retry hint
            self.assertEqual(int(h.get("retry-after", "0")), (hint + 999) // 1000, h)
        self.assertGreater(len({json_body(b)["error"]["retryAfterMs"] for _, _, b in refused}), 1,
                           "every 503 has the same hint: not jittered")

        # While it lasts, and more silent connections keep coming: health,
        # metrics and admin answer in time, and live delivery goes on.
        slow = []
        for round in range(5):
            for _ in range(30):
                self.connect(n.port)
            for path, key in (("/livez", None), ("/readyz", None), ("/metrics", None),
                              ("/admin/status", API_KEY)):
                st, secs = self.probe(n.port_for(path), path, key)
                self.assertEqual(st, 200, "%s during the flood (round %d): %r after %.3f s"
                                 % (path, round, st, secs))
                if secs >= PROBE_BUDGET_S:
                    slow.append((path, round, secs))
            r = n.send(conv, {"round": round})
            m = steady.recv_json(5)
            self.assertEqual((m.get("type"), m.get("seq"), m.get("body")), ("msg", r["seq"], {"round": round}), m)
        self.assertEqual(slow, [], "answers slower than %d ms" % (PROBE_BUDGET_S * 1000))

        # Sustained exhaustion: a new connection every 100 ms for 2 s; the
        # node's CPU time grows by far less than the 2 s a spinning loop burns.
        c0 = cpu_seconds(n.proc.pid)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 2.0:
            self.connect(n.port)
            time.sleep(0.1)
        used = cpu_seconds(n.proc.pid) - c0
        self.assertLess(used, 0.3, "node used %.2f s of CPU in 2 s at the descriptor limit" % used)

        st, _, text = n.get_text("/metrics")
        self.assertEqual(st, 200)
        self.assertGreaterEqual(metric(text, "converger_accept_errors_total", 'reason="emfile"'), 1, text)
        self.assertGreaterEqual(metric(text, "converger_fd_limit_closed_total", 'kind="idle"'), 1)
        self.assertEqual(metric(text, "converger_upgrades_refused_total", 'reason="max_connections"'),
                         len(refused))
        elapsed = time.monotonic() - t_flood
        lines = re.findall(r"accept: Too many open files \(emfile\): \d+ failed accept", n.log_text())
        self.assertGreaterEqual(len(lines), 1, "exhaustion not logged")
        self.assertLessEqual(len(lines), int(elapsed) + 2, "logged more than once a second")
        self.assertLess(cpu_seconds(n.proc.pid) - cpu0, elapsed, "the node was busy all along")

        # After the flood: upgrades are welcomed again.
        self.close_all()
        self.wait_connections(n, 1)
        self.assert_new_upgrade_welcomed(n, conv)
        r = n.send(conv, "after")
        m = steady.recv_json(5)
        self.assertEqual((m.get("type"), m.get("seq")), ("msg", r["seq"]), m)

    def test_nothing_to_reclaim_no_spin(self):
        # CONVERGER_MAX_CONNECTIONS above what the limit allows: WebSocket
        # connections take every descriptor, none can be reclaimed.
        n = self.node_start(dict(NODE_ENV, CONVERGER_MAX_CONNECTIONS="1000"), nofile=NOFILE)
        self.assertIn("CONVERGER_MAX_CONNECTIONS 1000 is above the open-file limit %d minus the %d "
                      "descriptors" % (NOFILE, RESERVE), n.log_text())
        conv = n.new_conv()
        held, unanswered = [], 0
        for _ in range(NOFILE + 50):
            s = self.connect(n.port, upgrade_request(n.port))
            got = read_answer(s, 3)
            self.assertNotEqual(got, "timeout", "a new connection neither served nor closed")
            if got is None:
                unanswered += 1
                if unanswered >= 5:
                    break
                continue
            self.assertEqual(got[0], 101, got)
            held.append(s)
        self.assertGreater(len(held), NOFILE - RESERVE, "fewer WebSocket connections than the budget")
        self.assertEqual(unanswered, 5, "the descriptor table never filled")

        # At the limit, upgrades keep arriving (an answered request would
        # linger, reclaimable: these would hold on); each is closed
        # unanswered and the loop rests instead of spinning.
        c0 = cpu_seconds(n.proc.pid)
        t0 = time.monotonic()
        arrivals = []
        while time.monotonic() - t0 < 2.0:
            arrivals.append(self.connect(n.port, upgrade_request(n.port)))
            time.sleep(0.05)
        used = cpu_seconds(n.proc.pid) - c0
        self.assertLess(used, 0.3, "node used %.2f s of CPU in 2 s at the descriptor limit" % used)
        for s in arrivals:
            self.assertIsNone(read_answer(s, 2), "served with no descriptor left?")

        # Some connections go: the node answers again, and says what happened.
        for s in held[:20]:
            s.close()
        deadline = time.monotonic() + 5
        while True:
            st, secs = self.probe(n.port_for("/metrics"), "/metrics")
            if st == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self.assertEqual(st, 200)
        st, _, text = n.get_text("/metrics")
        self.assertGreaterEqual(metric(text, "converger_accept_errors_total", 'reason="emfile"'),
                                len(arrivals) // 3, text)  # a pause lets about two arrive
        self.assertGreaterEqual(metric(text, "converger_fd_limit_closed_total", 'kind="pending"'),
                                len(arrivals) + unanswered)
        self.assertRegex(n.log_text(), r"accept: Too many open files \(emfile\): \d+ failed accept\(s\)"
                         r"[^\n]*; closed 0 idle connection\(s\) to make room and [1-9]\d* new one\(s\) unanswered")
        self.close_all()
        self.wait_connections(n, 0)
        self.assert_new_upgrade_welcomed(n, conv)


if __name__ == "__main__":
    harness.main()
