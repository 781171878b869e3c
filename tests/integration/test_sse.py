"""Server-Sent Events (GET /v1/sse, docs/protocol.md section 12) over real
sockets: a Python reader that speaks the event-stream format, and headless
Chromium (Debian `chromium`) running web/sse.html, a page served by the
node that uses the browser's own EventSource and nothing else.

- replay from Last-Event-ID, live messages, signals and presence events as
  their own event types, heartbeats as comments;
- a restart: the stream ends with a drain event whose retry: is the
  jittered delay, and the reconnect with Last-Event-ID gets every message
  once and in order, from Python and from Chromium;
- across a drain between two PostgreSQL nodes, with a sender running;
- refusals as HTTP statuses with JSON bodies: 401, 403, 400, 404, 503 with
  Retry-After while draining."""

import asyncio
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
from harness import NodeCase, PgCluster, mint_token, open_client, uid  # noqa: E402

try:
    import websockets  # the DevTools protocol to Chromium
except ImportError:  # pragma: no cover
    websockets = None


class Sse:
    """A Server-Sent Events reader on a raw socket: the status, the headers,
    then events as dicts {event, id, retry, data (parsed JSON)}. `comments`
    counts comment lines (heartbeats)."""

    def __init__(self, port, query, headers=None, timeout=10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        h = "".join("%s: %s\r\n" % kv for kv in (headers or {}).items())
        self.sock.sendall(("GET /v1/sse?%s HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n%s\r\n"
                           % (query, h)).encode())
        self.buf = b""
        self.comments = 0
        self.last_id = None
        head = self._until(b"\r\n\r\n", timeout)
        lines = head.decode().split("\r\n")
        self.status = int(lines[0].split()[1])
        self.headers = {k.lower(): v for k, v in (ln.split(": ", 1) for ln in lines[1:] if ln)}
        self.body = None
        if self.status != 200:
            n = int(self.headers.get("content-length", "0"))
            while len(self.buf) < n:
                self._read(timeout)
            self.body = json.loads(self.buf[:n])

    def _read(self, timeout):
        self.sock.settimeout(timeout)
        data = self.sock.recv(65536)
        if not data:
            raise EOFError("stream ended")
        self.buf += data

    def _until(self, sep, timeout):
        end = time.monotonic() + timeout
        while sep not in self.buf:
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError("no %r in %.1fs: %r" % (sep, timeout, self.buf[-200:]))
            self._read(left)
        out, self.buf = self.buf.split(sep, 1)
        return out

    def event(self, timeout=10.0):
        """The next event (retry-only and comment blocks are skipped)."""
        while True:
            block = self._until(b"\n\n", timeout).decode()
            ev = {"data": []}
            for line in block.split("\n"):
                if line.startswith(":"):
                    self.comments += 1
                    continue
                k, _, v = line.partition(": ")
                if k == "data":
                    ev["data"].append(v)
                elif k in ("event", "id", "retry"):
                    ev[k] = v
            if "id" in ev:
                self.last_id = ev["id"]
            if not ev["data"]:
                if "retry" in ev:
                    self.first_retry = int(ev["retry"])
                continue
            ev["data"] = json.loads("\n".join(ev["data"]))
            return ev

    def until(self, pred, timeout=10.0):
        seen = []
        end = time.monotonic() + timeout
        while True:
            ev = self.event(max(0.05, end - time.monotonic()))
            seen.append(ev)
            if pred(ev):
                return ev, seen

    def at_eof(self, timeout=5.0):
        try:
            while True:
                self._read(timeout)
        except EOFError:
            return True
        except (socket.timeout, TimeoutError):
            return False

    def close(self):
        self.sock.close()


def q(**kw):
    items = []
    for k, v in kw.items():
        for x in (v if isinstance(v, list) else [v]):
            items.append((k, x))
    return urllib.parse.urlencode(items)


def seqs(events, conv):
    return [e["data"]["seq"] for e in events if e.get("event") == "msg" and e["data"]["conv"] == conv]


class SseOneNode(NodeCase):
    def test_stream_replay_live_signals_presence_and_heartbeat(self):
        n = self.node_start({"CONVERGER_HEARTBEAT_MS": "1000"})
        a = n.new_conv(presence=True, signals=True)
        b = n.new_conv()
        for i in range(3):
            n.send(a, {"i": i})
        n.send(b, {"only": "b"})
        tok = mint_token("ann", [a, b])
        # from a at seq 1 and b at 0 (an id this node could have given)
        s = Sse(n.port, q(conv=[a, b], token=tok, clientId="ann-sse"),
                {"Last-Event-ID": "%s 1,%s 0" % (a, b)})
        self.assertEqual(s.status, 200)
        self.assertEqual(s.headers["content-type"], "text/event-stream")
        w = s.event()
        self.assertEqual((w["event"], w["data"]["clientId"]), ("welcome", "ann-sse"))
        self.assertGreater(s.first_retry, 0)
        _, seen = s.until(lambda e: e["event"] == "synced" and e["data"]["conv"] == b)
        if not any(e["event"] == "synced" and e["data"]["conv"] == a for e in seen):
            s.until(lambda e: e["event"] == "synced" and e["data"]["conv"] == a)
        self.assertEqual(seqs(seen, a), [2, 3])
        self.assertEqual(seqs(seen, b), [1])
        # the last msg's id is every watermark: a 3, b 1 (in whatever order)
        msg_ids = [e["id"] for e in seen if e["event"] == "msg"]
        ep = w["data"]["subs"][0]["epoch"] if w["data"]["subs"][0]["conv"] == a else w["data"]["subs"][1]["epoch"]
        self.assertIn("%s 3 %s" % (a, ep), msg_ids[-1].split(",") + msg_ids[-2].split(","))
        n.send(a, {"i": 3})
        ev, _ = s.until(lambda e: e["event"] == "msg")
        self.assertEqual(ev["data"]["seq"], 4)
        self.assertEqual(sorted(x.split(" ")[0] for x in ev["id"].split(",")), sorted([a, b]))
        st, _, js = n.request("POST", "/v1/conversations/%s/signals" % a, {"sender": "bot", "body": {"typing": 1}})
        self.assertEqual(st, 202, js)
        ev, _ = s.until(lambda e: e["event"] == "signal")
        self.assertEqual((ev["data"]["sender"], "id" in ev), ("bot", False))

        async def someone_joins():
            c, _ = await open_client(n, mint_token("bob", [a]), [{"conv": a, "watermark": None}],
                                     client_id="bob-1")
            await c.until_synced(a)
            return c
        # the stream asked for no presence events: a subscribe-less join is
        # told only with presenceEvents; presence itself counts the stream
        c = asyncio.run(someone_joins())
        st, _, js = n.request("GET", "/v1/conversations/%s/presence" % a)
        self.assertEqual([m["user"] for m in js["members"]], ["ann", "bob"])
        time.sleep(2.2)  # two heartbeats
        n.send(a, {"i": 4})
        s.until(lambda e: e["event"] == "msg")
        self.assertGreaterEqual(s.comments, 1)
        s.close()
        asyncio.run(c.close())

    def test_resume_with_last_event_id_after_a_restart(self):
        n = self.node_start({"CONVERGER_DRAIN_SHUTDOWN_MS": "5000",
                             "CONVERGER_DRAIN_WINDOW_MS": "800"})
        conv = n.new_conv()
        tok = mint_token("ann", [conv])
        s = Sse(n.port, q(conv=conv, token=tok))
        s.until(lambda e: e["event"] == "synced")
        for i in range(10):
            n.send(conv, {"i": i})
        _, seen = s.until(lambda e: e["event"] == "msg" and e["data"]["seq"] == 10)
        got = seqs(seen, conv)
        # SIGTERM with a ready peer: the drain event carries the jittered delay as retry:
        n.fake_peer()
        t = threading.Thread(target=n.stop)
        t.start()
        ev, _ = s.until(lambda e: e["event"] == "drain")
        self.assertEqual(int(ev["retry"]), ev["data"]["afterMs"])
        self.assertLess(int(ev["retry"]), 800)
        self.assertTrue(s.at_eof())
        last = s.last_id
        s.close()
        t.join()
        n.start()
        for i in range(10, 20):
            n.send(conv, {"i": i})
        s = Sse(n.port, q(conv=conv, token=tok), {"Last-Event-ID": last})
        _, seen = s.until(lambda e: e["event"] == "synced")
        n.send(conv, {"i": 20})
        ev, _ = s.until(lambda e: e["event"] == "msg")
        got += seqs(seen, conv) + [ev["data"]["seq"]]
        self.assertEqual(got, list(range(1, 22)))
        s.close()

    def test_refusals(self):
        n = self.node_start({"CONVERGER_DRAIN_SHUTDOWN_MS": "3000",
                             "CONVERGER_DRAIN_WINDOW_MS": "2000"})
        conv = n.new_conv()
        tok = mint_token("ann", [conv])
        cases = [
            (q(conv=conv), {}, 401, "unauthorized"),
            (q(conv=conv, token="nope"), {}, 401, "unauthorized"),
            (q(conv=conv, token=mint_token("ann", ["other"])), {}, 403, "forbidden"),
            (q(token=tok), {}, 400, "bad_request"),
            (q(conv=[conv, conv], token=tok), {}, 400, "bad_request"),
            (q(conv="bad id", token=tok), {}, 400, "bad_request"),
            (q(conv=conv, token=tok), {"Last-Event-ID": "garbage"}, 400, "bad_request"),
            (q(conv="missing", token=mint_token("ann", ["missing"])), {}, 404, "not_found"),
        ]
        for query, headers, status, code in cases:
            s = Sse(n.port, query, headers)
            self.assertEqual(s.status, status, (query, s.body))
            self.assertEqual(s.body["error"]["code"], code, s.body)
            s.close()
        # the token in Authorization instead of the query
        s = Sse(n.port, q(conv=conv), {"Authorization": "Bearer " + tok})
        self.assertEqual(s.status, 200)
        s.until(lambda e: e["event"] == "synced")
        metrics = n.get_text("/metrics")[2]
        self.assertRegex(metrics, r'converger_http_requests_total\{route="/v1/sse",code="401"\} [1-9]')
        self.assertRegex(metrics, r'converger_http_requests_total\{route="/v1/sse",code="403"\} [1-9]')
        # draining (a WebSocket client keeps the node in its drain): a new
        # stream is refused with 503 and Retry-After
        ws = harness.RawWs(n.port)
        ws.hello(tok, [{"conv": conv, "watermark": None}])
        ws.recv_until(lambda m: m.get("type") == "synced")
        n.fake_peer()  # a ready peer: the drain tells the streams to move
        st, _, js = n.request("POST", "/admin/drain", {})
        self.assertIn(st, (200, 202), js)
        r = Sse(n.port, q(conv=conv, token=tok))
        self.assertEqual(r.status, 503)
        self.assertGreaterEqual(int(r.headers["retry-after"]), 1)
        self.assertEqual(r.body["error"]["code"], "unavailable")
        r.close()
        ev, _ = s.until(lambda e: e["event"] == "drain")
        self.assertLess(int(ev["retry"]), 2000)
        s.close()
        ws.close()


class SseCluster(NodeCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.pg = PgCluster()
        cls.addClassCleanup(cls.pg.stop)

    def test_resume_across_a_drain_with_a_sender_running(self):
        env = {"CONVERGER_DATABASE_URL": self.pg.url, "CONVERGER_DRAIN_WINDOW_MS": "1000",
               "CONVERGER_DRAIN_SHUTDOWN_MS": "8000"}
        a, b = self.node_start(env), self.node_start(env)
        conv = a.new_conv()
        tok = mint_token("ann", [conv])
        stop = threading.Event()
        acked = []

        def sender():
            with b.session() as s:
                i = 0
                while not stop.is_set():
                    st, _, js = s.request("POST", "/v1/conversations/%s/messages" % conv,
                                          {"sender": "bot", "body": {"i": i}},
                                          headers={"Idempotency-Key": "k%d" % i})
                    assert st in (200, 201), (st, js)
                    acked.append(js["seq"])
                    i += 1
                    time.sleep(0.01)
        th = threading.Thread(target=sender, daemon=True)
        th.start()
        try:
            s = Sse(a.port, q(conv=conv, token=tok), {"Last-Event-ID": "%s 0" % conv})
            _, seen = s.until(lambda e: e["event"] == "drain" or
                              (e["event"] == "msg" and e["data"]["seq"] >= 30), 15)
            got = seqs(seen, conv)
            st, _, js = a.request("POST", "/admin/drain", {})
            self.assertIn(st, (200, 202), js)
            ev, seen = s.until(lambda e: e["event"] == "drain", 10)
            got += seqs(seen, conv)
            self.assertTrue(s.at_eof())
            last = s.last_id
            s.close()
            time.sleep(int(ev["retry"]) / 1000.0)
            s = Sse(b.port, q(conv=conv, token=tok), {"Last-Event-ID": last})
            self.assertEqual(s.status, 200)
            time.sleep(0.5)
        finally:
            stop.set()
            th.join(10)
        top = max(acked)
        _, seen = s.until(lambda e: e["event"] == "msg" and e["data"]["seq"] >= top, 15)
        got += seqs(seen, conv)
        self.assertEqual(got, list(range(1, top + 1)))  # every acknowledged message once, in order
        s.close()


def chromium():
    for name in ("chromium", "chromium-browser"):
        p = shutil.which(name)
        if p:
            return p
    raise AssertionError("chromium not found: scripts/setup installs the Debian package")


class Cdp:
    """The DevTools protocol over a WebSocket: evaluate JavaScript in a page."""

    def __init__(self, url):
        self.url, self.ws, self.next = url, None, 0

    async def __aenter__(self):
        self.ws = await websockets.connect(self.url, max_size=16 * 1024 * 1024)
        return self

    async def __aexit__(self, *a):
        await self.ws.close()

    async def eval(self, expr):
        self.next += 1
        await self.ws.send(json.dumps({"id": self.next, "method": "Runtime.evaluate",
                                       "params": {"expression": expr, "returnByValue": True}}))
        while True:
            m = json.loads(await asyncio.wait_for(self.ws.recv(), 10))
            if m.get("id") == self.next:
                return m["result"]["result"].get("value")


class SseChromium(NodeCase):
    def test_event_source_across_a_restart(self):
        """web/sse.html in headless Chromium: 20 messages, a restart of the
        node (SIGTERM with a drain: the stream's retry: is the jittered
        delay), 20 more: the page's EventSource got 1..40 once and in order
        without any code of ours in the browser."""
        n = self.node_start({"CONVERGER_DRAIN_SHUTDOWN_MS": "5000",
                             "CONVERGER_DRAIN_WINDOW_MS": "1000"})
        conv = n.new_conv()
        tok = mint_token("ann", [conv])
        profile = tempfile.mkdtemp(prefix="converger-chromium-")
        dport = harness.free_port()
        page = "http://127.0.0.1:%d/sse.html?%s" % (n.port, q(conv=conv, token=tok))
        proc = subprocess.Popen(
            [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-extensions", "--user-data-dir=" + profile,
             "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=%d" % dport, page],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        harness._register(proc)
        try:
            target = None
            end = time.monotonic() + 30
            while target is None and time.monotonic() < end:
                try:
                    with harness.raw_connect(dport, 2) as _:
                        pass
                    import urllib.request
                    pages = json.load(urllib.request.urlopen("http://127.0.0.1:%d/json" % dport, timeout=2))
                    target = next((p for p in pages if p.get("type") == "page" and "sse.html" in p.get("url", "")), None)
                except OSError:
                    pass
                if target is None:
                    time.sleep(0.3)
            self.assertIsNotNone(target, "Chromium did not open the page")

            async def go():
                async with Cdp(target["webSocketDebuggerUrl"]) as cdp:
                    async def wait(expr, timeout=30):
                        end = time.monotonic() + timeout
                        while time.monotonic() < end:
                            v = await cdp.eval(expr)
                            if v:
                                return v
                            await asyncio.sleep(0.2)
                        raise AssertionError("page never had %s; events %r" %
                                             (expr, await cdp.eval("JSON.stringify(window.converger.events)")))
                    await wait("window.converger && window.converger.events.includes('synced')")
                    for i in range(20):
                        n.send(conv, {"i": i})
                    await wait("window.converger.got.length >= 20")
                    n.fake_peer()  # a ready peer: a drain event, not a 1012 close
                    n.restart()  # SIGTERM: drain event, retry: under 1000 ms; then a new process
                    for i in range(20, 40):
                        n.send(conv, {"i": i})
                    await wait("window.converger.got.length >= 40", 40)
                    await asyncio.sleep(0.5)  # nothing more (no duplicates) comes
                    got = json.loads(await cdp.eval("JSON.stringify(window.converger.got)"))
                    events = json.loads(await cdp.eval("JSON.stringify(window.converger.events)"))
                    return got, events
            got, events = asyncio.run(go())
            self.assertEqual([s for c, s in got], list(range(1, 41)))
            self.assertIn("drain", events)
            self.assertGreaterEqual(events.count("welcome"), 2)
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            harness._unregister(proc)
            shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    harness.main()
