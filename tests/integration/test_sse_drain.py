"""Server-Sent Events readers across a drain, through HAProxy (issue 31,
item 6): two nodes on one PostgreSQL database (scripts/pg-tmp) behind
deploy/haproxy/converger.cfg as it ships, READERS readers that behave as a
browser's EventSource (below), and a sender posting a message every
SEND_EVERY_S to the node that stays. The node that holds most readers is
drained (POST /admin/drain) with a WINDOW_MS window.

Each of its readers keeps getting messages until its own jittered moment
in the window, then its stream ends with a short retry: and the reader is
back, through HAProxy, on the other node with its Last-Event-ID. Asserted
for every reader:
- no refusal (an EventSource gives up for good on a non-200 answer);
- every acknowledged message exactly once and in order;
- the largest gap between two consecutive messages it received at most
  MAX_GAP_S (the messages are sent every 20 ms, so that gap is the time the
  reader was away plus a send);
- and for the drained node's readers, a moment spread over the window (the
  stream was not ended at once).
The measured gaps and offline times are printed (docs/operations.md, "SSE
readers across a drain").

Also: HAProxy's refusal of the operator's routes is the node's JSON error.

HAProxy, the nodes and PostgreSQL are started here and stopped by their
pids."""

import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import NodeCase, PgCluster, Sender, mint_token  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "deploy", "haproxy", "converger.cfg")

READERS = 6
WINDOW_MS = 6000
SEND_EVERY_S = 0.02
MAX_GAP_S = 1.0


class EventSource(threading.Thread):
    """A reader as the browser's EventSource reads (the HTML standard's
    "server-sent events" processing model): GET with Accept:
    text/event-stream and, after the first, Last-Event-ID (the last id:
    seen, kept across events without one); retry: sets the reconnection
    time; when a 200 stream ends it waits that long and reconnects to the
    same URL; a non-200 answer fails it for good (`failed`). HTTP/1.1
    keep-alive, chunked or close-delimited bodies, as HAProxy sends them.

    Records `msgs` [(monotonic time, seq)], `streams` [(node, opened at,
    ended at)] and `drains` (the drain events' data and retry:)."""

    def __init__(self, port, query):
        super().__init__(daemon=True)
        self.port, self.query = port, query
        self.last_id = None
        self.retry_ms = 3000  # the browser's own default until the stream says
        self.msgs, self.streams, self.drains = [], [], []
        self.failed = None
        self.welcomed = threading.Event()
        self.stop = threading.Event()

    def run(self):
        try:
            while not self.stop.is_set():
                self._stream()
                if self.failed or self.stop.is_set():
                    return
                self.stop.wait(self.retry_ms / 1000.0)
        except Exception as e:  # noqa: BLE001: reported by the test
            self.failed = "reader: %r" % (e,)

    def _stream(self):
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        sock.settimeout(0.2)
        opened = time.monotonic()
        try:
            h = "Last-Event-ID: %s\r\n" % self.last_id if self.last_id is not None else ""
            sock.sendall(("GET /v1/sse?%s HTTP/1.1\r\nHost: lb\r\nAccept: text/event-stream\r\n"
                          "Cache-Control: no-cache\r\n%s\r\n" % (self.query, h)).encode())
            self.buf, self.eof = b"", False
            head = self._until(sock, b"\r\n\r\n")
            if head is None:
                return  # ended before an answer: a network error, reconnect
            lines = head.decode().split("\r\n")
            status = int(lines[0].split()[1])
            headers = {k.lower(): v for k, v in (ln.split(": ", 1) for ln in lines[1:] if ln)}
            if status != 200:
                self.failed = "%d %s" % (status, self.buf[:300])
                return
            chunked = headers.get("transfer-encoding", "").lower() == "chunked"
            self.streams.append([None, opened, None])
            body = b""
            for data in self._body(sock, chunked):
                body += data
                while b"\n\n" in body:
                    block, body = body.split(b"\n\n", 1)
                    self._event(block.decode())
            self.streams[-1][2] = time.monotonic()
        finally:
            sock.close()

    def _recv(self, sock):
        while not self.stop.is_set():
            try:
                data = sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                data = b""
            if not data:
                self.eof = True
            return data
        self.eof = True
        return b""

    def _until(self, sock, sep):
        while sep not in self.buf:
            data = self._recv(sock)
            if not data:
                return None
            self.buf += data
        out, self.buf = self.buf.split(sep, 1)
        return out

    def _body(self, sock, chunked):
        """The body's bytes as they come, until it ends."""
        if not chunked:
            if self.buf:
                yield self.buf
            while True:
                data = self._recv(sock)
                if not data:
                    return
                yield data
        while True:
            size = self._until(sock, b"\r\n")
            if size is None:
                return
            n = int(size.split(b";")[0], 16)
            if n == 0:
                return  # the last chunk: the response (the stream) ended
            while len(self.buf) < n + 2:
                data = self._recv(sock)
                if not data:
                    return
                self.buf += data
            chunk, self.buf = self.buf[:n], self.buf[n + 2:]
            yield chunk

    def _event(self, block):
        ev, data = None, []
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            k, _, v = line.partition(":")
            v = v[1:] if v.startswith(" ") else v
            if k == "event":
                ev = v
            elif k == "data":
                data.append(v)
            elif k == "id":
                self.last_id = v
            elif k == "retry" and v.isdigit():
                self.retry_ms = int(v)
        if not data:
            return
        js = json.loads("\n".join(data))
        if ev == "welcome":
            self.streams[-1][0] = js["node"]
            self.welcomed.set()
        elif ev == "msg":
            self.msgs.append((time.monotonic(), js["seq"]))
        elif ev == "drain":
            self.drains.append((js, self.retry_ms))


class Haproxy:
    """deploy/haproxy/converger.cfg with node-1 = `a`, node-2 = `b` and
    node-3 a free port where nothing listens (down), on free ports. (Not
    `b` twice: HAProxy's redispatch avoids the server it tried, not the
    node behind it.)"""

    def __init__(self, a, b):
        self.dir = tempfile.mkdtemp(prefix="converger-haproxy-")
        self.port, self.stats = harness.free_port(), harness.free_port()
        env = dict(os.environ, CONVERGER_HAPROXY_BIND="127.0.0.1:%d" % self.port,
                   CONVERGER_HAPROXY_STATS_BIND="127.0.0.1:%d" % self.stats,
                   CONVERGER_HAPROXY_NODE1="127.0.0.1:%d" % a.port,
                   CONVERGER_HAPROXY_NODE2="127.0.0.1:%d" % b.port,
                   CONVERGER_HAPROXY_NODE3="127.0.0.1:%d" % harness.free_port())
        self.log = os.path.join(self.dir, "haproxy.log")
        self.proc = subprocess.Popen(["haproxy", "-f", CONFIG, "-db"], env=env, stdout=subprocess.DEVNULL,
                                     stderr=open(self.log, "w"))
        harness._register(self.proc)

    def servers_up(self):
        """{server name: status} from the stats page's CSV."""
        conn = http.client.HTTPConnection("127.0.0.1", self.stats, timeout=2)
        try:
            conn.request("GET", "/;csv")
            rows = conn.getresponse().read().decode().splitlines()
        finally:
            conn.close()
        cols = rows[0].lstrip("# ").split(",")
        out = {}
        for r in rows[1:]:
            f = dict(zip(cols, r.split(",")))
            if f.get("pxname") == "converger_nodes" and f.get("svname", "").startswith("node-"):
                out[f["svname"]] = f["status"]
        return out

    def wait_up(self, timeout=20):
        end = time.monotonic() + timeout
        seen = None
        while time.monotonic() < end:
            try:
                seen = self.servers_up()
                if seen == {"node-1": "UP", "node-2": "UP", "node-3": "DOWN"}:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError("HAProxy's servers not as wanted: %r\n%s" % (seen, self.log_text()))

    def log_text(self):
        with open(self.log) as f:
            return f.read()

    def stop(self):
        harness.stop_process(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)


def gaps(msgs):
    return [b[0] - a[0] for a, b in zip(msgs, msgs[1:])]


class SseDrainThroughHaproxy(NodeCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        if shutil.which("haproxy") is None:
            raise AssertionError("haproxy not found: scripts/setup installs it")
        cls.pg = PgCluster()
        cls.addClassCleanup(cls.pg.stop)

    def test_readers_keep_reading_until_their_moment_then_move_within_a_second(self):
        env = {"CONVERGER_DATABASE_URL": self.pg.url, "CONVERGER_DRAIN_WINDOW_MS": str(WINDOW_MS),
               "CONVERGER_DRAIN_SHUTDOWN_MS": "30000"}
        a, b = self.node_start(env), self.node_start(env)
        lb = Haproxy(a, b)
        self.addCleanup(lb.stop)
        lb.wait_up()

        # the operator's routes are refused at the edge with the node's JSON error
        for path in ("/admin/drain", "/admin/status", "/metrics", "/livez"):
            conn = http.client.HTTPConnection("127.0.0.1", lb.port, timeout=5)
            try:
                conn.request("GET", path)
                r = conn.getresponse()
                self.assertEqual((r.status, r.getheader("Content-Type")), (404, "application/json"), path)
                self.assertEqual(json.loads(r.read()),
                                 {"error": {"code": "not_found", "message": "no such route"}}, path)
            finally:
                conn.close()

        conv = a.new_conv()
        query = urllib.parse.urlencode({"conv": conv, "token": mint_token("ann", [conv])})
        readers = []
        for _ in range(READERS):  # one at a time: leastconn spreads them over the two nodes
            r = EventSource(lb.port, query)
            r.start()
            readers.append(r)
            self.addCleanup(r.stop.set)
            self.assertTrue(r.welcomed.wait(10), r.failed)
        by_node = {}
        for r in readers:
            by_node.setdefault(r.streams[0][0], []).append(r)
        drained = a if len(by_node.get(a.node_id, [])) >= len(by_node.get(b.node_id, [])) else b
        stays = b if drained is a else a
        moving = by_node[drained.node_id]
        self.assertGreaterEqual(len(moving), READERS // 2)

        sender = Sender(stays, conv, SEND_EVERY_S)
        try:
            end = time.monotonic() + 10
            while time.monotonic() < end and not all(len(r.msgs) >= 20 for r in readers):
                time.sleep(0.05)
            self.assertTrue(all(len(r.msgs) >= 20 for r in readers), [len(r.msgs) for r in readers])
            st, _, js = drained.request("POST", "/admin/drain", {})
            self.assertIn(st, (200, 202), js)
            drain_at = time.monotonic()
            # the drained node exits once its last stream has moved: about one window
            drained.proc.wait(WINDOW_MS / 1000.0 + 15)
            self.assertEqual(drained.proc.returncode, 0, drained.log_tail())
            time.sleep(1.0)  # messages on the new streams
        finally:
            sender.halt()
        self.assertEqual(sender.errors, [])
        acked = sender.acked
        top = acked[-1]
        self.assertEqual(acked, list(range(acked[0], top + 1)))
        end = time.monotonic() + 15
        while time.monotonic() < end and not all(r.msgs and r.msgs[-1][1] >= top for r in readers):
            time.sleep(0.05)
        for r in readers:
            r.stop.set()
        for r in readers:
            r.join(5)

        report, worst = [], []
        for i, r in enumerate(readers):
            self.assertIsNone(r.failed, "reader %d: %s; HAProxy's log:\n%s"
                              % (i, r.failed, "\n".join(lb.log_text().splitlines()[-40:])))
            seqs = [s for _, s in r.msgs]
            self.assertEqual(seqs, list(range(1, top + 1)), "reader %d: every message once, in order" % i)
            worst.append(max(gaps(r.msgs)))
            if r in moving:
                self.assertEqual(len(r.streams), 2, "reader %d: %r" % (i, r.streams))
                old, new = r.streams
                self.assertEqual((old[0], new[0]), (drained.node_id, stays.node_id))
                report.append("reader %d (moved): stream ended %.2f s into the drain, retry %d ms, offline "
                              "%.3f s, largest gap %.3f s"
                              % (i, old[2] - drain_at, r.drains[0][1] if r.drains else -1, new[1] - old[2],
                                 worst[-1]))
            else:
                self.assertEqual(len(r.streams), 1)
                report.append("reader %d (stayed): largest gap %.3f s" % (i, worst[-1]))
        sys.stderr.write("\nSSE readers across a drain through HAProxy (window %d ms, a message every "
                         "%d ms):\n  %s\n" % (WINDOW_MS, SEND_EVERY_S * 1000, "\n  ".join(report)))
        for i, r in enumerate(readers):
            self.assertLessEqual(worst[i], MAX_GAP_S, report[i])
        for r in moving:
            # one drain event, at the stream's moment within the window (its
            # grace is for WebSocket make-before-break), its afterMs the
            # retry:, and no reconnectTo: an EventSource reconnects to its URL
            self.assertEqual(len(r.drains), 1)
            js, retry = r.drains[0]
            self.assertLess(r.streams[0][2] - drain_at, WINDOW_MS / 1000.0 + 1.0)
            self.assertEqual((js["afterMs"], js["reconnectTo"], js["deadlineMs"]), (retry, None, 0))
            self.assertTrue(100 <= retry <= 500, retry)

if __name__ == "__main__":
    harness.main()
