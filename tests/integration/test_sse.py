"""Server-Sent Events (GET /v1/sse, docs/protocol.md section 12) over real
sockets: a Python reader that speaks the event-stream format, and headless
Chromium (Debian `chromium`) running web/sse.html, a page served by the
node that uses the browser's own EventSource and nothing else.

- replay from Last-Event-ID, live messages, signals and presence events as
  their own event types, heartbeats as comments;
- join and leave events with presenceEvents=true (a user's first client,
  its last after the grace) and presenceEvents=clients (every client);
- a restart: the stream ends at its moment in the drain window with a
  drain event whose retry: is short, and the reconnect with Last-Event-ID
  gets every message once and in order, from Python and from Chromium;
  also for a stream that got no msg before it (the welcome's, synced's
  and drain's id);
- across a drain between two PostgreSQL nodes, with a sender running;
- streams waiting for their moments in a long drain window: readers that
  leave let the node exit at once, and SIGINT during the drain stops it
  at once with no stop deadline passed;
- refusals as HTTP statuses with JSON bodies: 401, 403, 400 (conv,
  clientId, presenceEvents, Last-Event-ID), 404, 503 with Retry-After while
  draining."""

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import NodeCase, PgCluster, Sender, mint_token, open_client, uid  # noqa: E402

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


def events_within(s, seconds, types=None):
    """Every event `s` gets within `seconds` (of `types` only, if given)."""
    out = []
    end = time.monotonic() + seconds
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return out
        try:
            ev = s.event(left)
        except (socket.timeout, TimeoutError):
            return out
        if types is None or ev["event"] in types:
            ev["at"] = time.monotonic()  # when it was read
            out.append(ev)


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
        loop = asyncio.new_event_loop()  # bob's connection lives with its loop
        self.addCleanup(loop.close)
        c = loop.run_until_complete(someone_joins())
        st, _, js = n.request("GET", "/v1/conversations/%s/presence" % a)
        self.assertEqual([m["user"] for m in js["members"]], ["ann", "bob"])
        time.sleep(2.2)  # two heartbeats
        n.send(a, {"i": 4})
        s.until(lambda e: e["event"] == "msg")
        self.assertGreaterEqual(s.comments, 1)
        s.close()
        loop.run_until_complete(c.close())

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
        # SIGTERM with a ready peer: at its moment in the window, the drain event with a short retry:
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

    def test_resume_after_a_restart_with_no_msg_seen(self):
        """A stream opened with no Last-Event-ID that got no msg before the
        node restarted: the welcome, the synced and the drain event all
        carry its id (the head it began at), and the reconnect with that id
        gets every message committed while it was away, once and in order."""
        n = self.node_start({"CONVERGER_DRAIN_SHUTDOWN_MS": "5000",
                             "CONVERGER_DRAIN_WINDOW_MS": "800"})
        conv = n.new_conv()
        for i in range(3):
            n.send(conv, {"before": i})
        tok = mint_token("ann", [conv])
        s = Sse(n.port, q(conv=conv, token=tok))
        w = s.event()
        self.assertEqual(w["event"], "welcome")
        epoch = w["data"]["subs"][0]["epoch"]
        head_id = "%s 3 %s" % (conv, epoch)
        self.assertEqual(w.get("id"), head_id)
        ev, seen = s.until(lambda e: e["event"] == "synced")
        self.assertEqual((ev.get("id"), seqs(seen, conv)), (head_id, []))
        n.fake_peer()
        t = threading.Thread(target=n.stop)
        t.start()
        ev, seen = s.until(lambda e: e["event"] == "drain")
        self.assertEqual(ev.get("id"), head_id)
        self.assertEqual(seqs(seen, conv), [])
        self.assertTrue(s.at_eof())
        last = s.last_id  # what EventSource sends as Last-Event-ID
        s.close()
        t.join()
        self.assertEqual(last, head_id)
        n.start()
        for i in range(5):  # committed while the stream is away
            n.send(conv, {"gap": i})
        s = Sse(n.port, q(conv=conv, token=tok), {"Last-Event-ID": last})
        self.assertEqual(s.status, 200)
        w = s.event()
        self.assertEqual((w["event"], w.get("id")), ("welcome", head_id))
        self.assertNotIn("reset", w["data"]["subs"][0])
        _, seen = s.until(lambda e: e["event"] == "synced")
        got = seqs(seen, conv)
        self.assertEqual(seen[-1].get("id"), "%s 8 %s" % (conv, epoch))
        n.send(conv, {"live": 1})
        ev, seen = s.until(lambda e: e["event"] == "msg")
        got += seqs(seen, conv)
        self.assertEqual(got, list(range(4, 10)))  # each once, in order, nothing before 4
        self.assertEqual(events_within(s, 0.3), [])
        s.close()

    def test_presence_join_and_leave_events(self):
        """presenceEvents=true: a user's first client joins and its last one
        leaves (after the grace, not before); presenceEvents=clients: every
        client instance's; the events carry no id (the stream's stays)."""
        grace = 1500
        n = self.node_start({"CONVERGER_PRESENCE_GRACE_MS": str(grace)})
        conv = n.new_conv(presence=True)
        users = Sse(n.port, q(conv=conv, token=mint_token("ann", [conv]), clientId="ann-sse",
                              presenceEvents="true"))
        clients = Sse(n.port, q(conv=conv, token=mint_token("obs", [conv]), clientId="obs-sse",
                                presenceEvents="clients"))
        for s in (users, clients):
            self.assertEqual(s.status, 200, s.body)
            w, _ = s.until(lambda e: e["event"] == "welcome")
            self.assertIs(w["data"]["subs"][0]["presence"], True)
            s.until(lambda e: e["event"] == "synced")
        # the users stream sees the clients stream join
        self.assertEqual([(e["data"]["user"], e["data"]["client"]) for e in
                          events_within(users, 0.5, ("join", "leave"))], [("obs", "obs-sse")])
        ids = (users.last_id, clients.last_id)

        async def two_clients():
            tok = mint_token("bob", [conv])
            out = []
            for cid in ("bob-phone", "bob-laptop"):
                c, _ = await open_client(n, tok, [{"conv": conv, "watermark": None}], client_id=cid)
                await c.until_synced(conv)
                out.append(c)
            return out

        async def close_all(cs):
            for c in cs:
                await c.close()

        # one event loop for bob's clients from open to close: asyncio.run
        # would close its loop at once, and the connections with it
        loop = asyncio.new_event_loop()
        self.addCleanup(loop.close)
        bobs = loop.run_until_complete(two_clients())
        joins = events_within(users, 0.8, ("join", "leave"))
        self.assertEqual([(e["event"], e["data"]["conv"], e["data"]["user"], e["data"]["client"])
                          for e in joins], [("join", conv, "bob", "bob-phone")])
        self.assertNotIn("id", joins[0])
        joins = events_within(clients, 0.5, ("join", "leave"))
        self.assertEqual([(e["event"], e["data"]["client"]) for e in joins],
                         [("join", "bob-phone"), ("join", "bob-laptop")])
        t0 = time.monotonic()  # before the node hears the last close: its grace starts after
        loop.run_until_complete(close_all(bobs))
        leaves = events_within(users, grace / 1000.0 + 2.5 - (time.monotonic() - t0),
                               ("join", "leave"))
        self.assertTrue(leaves, "no leave within the grace + 2.5 s")
        self.assertGreaterEqual(leaves[0]["at"] - t0, grace / 1000.0 - 0.05)  # not before the grace
        self.assertEqual([(e["event"], e["data"]["user"], e["data"]["client"]) for e in leaves],
                         [("leave", "bob", "bob-laptop")])
        self.assertNotIn("id", leaves[0])
        leaves = events_within(clients, 0.8, ("join", "leave"))
        self.assertEqual(sorted((e["event"], e["data"]["client"]) for e in leaves),
                         [("leave", "bob-laptop"), ("leave", "bob-phone")])
        self.assertEqual((users.last_id, clients.last_id), ids)  # the events moved no id
        users.close()
        clients.close()

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
            (q(conv=conv, token=tok, presenceEvents="all"), {}, 400, "bad_request"),
            (q(conv=conv, token=tok, presenceEvents="1"), {}, 400, "bad_request"),
            (q(conv=conv, token=tok, clientId="no spaces"), {}, 400, "bad_request"),
            (q(conv=conv, token=tok), {"Last-Event-ID": "%s 5abc" % conv}, 400, "bad_request"),
            (q(conv=conv, token=tok, lastEventId="%s -1" % conv), {}, 400, "bad_request"),
            (q(conv=conv, token=tok), {"Last-Event-ID": "%s 1,%s 2" % (conv, conv)}, 400, "bad_request"),
        ]
        for query, headers, status, code in cases:
            s = Sse(n.port, query, headers)
            self.assertEqual(s.status, status, (query, s.body))
            self.assertEqual(s.headers["content-type"], "application/json", query)
            self.assertEqual(s.body["error"]["code"], code, s.body)
            self.assertTrue(s.body["error"]["message"], s.body)
            if "presenceEvents" in query:
                self.assertIn("presenceEvents", s.body["error"]["message"])
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


class SseDrainLeave(NodeCase):
    """Streams waiting for their moments in a long drain window hold
    nothing of the node once they have gone: readers that leave let the
    drain end at once, and SIGINT during the drain stops the node without
    waiting for the streams' moments (nor logging a stop deadline)."""

    WINDOW_MS = 60000
    READERS = 4

    def draining_with_readers(self):
        n = self.node_start({"CONVERGER_DRAIN_SHUTDOWN_MS": str(2 * self.WINDOW_MS),
                             "CONVERGER_DRAIN_WINDOW_MS": str(self.WINDOW_MS)})
        conv = n.new_conv()
        tok = mint_token("ann", [conv])
        readers = [Sse(n.port, q(conv=conv, token=tok)) for _ in range(self.READERS)]
        for s in readers:
            s.until(lambda e: e["event"] == "synced")
        n.fake_peer()  # a ready peer: the streams wait for their moments
        os.kill(n.proc.pid, signal.SIGTERM)
        want = "drain: told %d connection(s)" % self.READERS
        deadline = time.monotonic() + 5
        while want not in n.log_text():
            self.assertLess(time.monotonic(), deadline, "the drain told no stream")
            time.sleep(0.02)
        return n, readers

    def test_readers_that_leave_end_the_drain_at_once(self):
        n, readers = self.draining_with_readers()
        t0 = time.monotonic()
        for s in readers:
            s.close()
        self.assertEqual(n.proc.wait(10), 0)
        took = time.monotonic() - t0
        # their moments are spread over 60 s: the exit comes with the last
        # reader's close, not with the last moment
        self.assertLess(took, 3.0, "exit %.2f s after the readers left" % took)
        self.assertIn("drain complete", n.log_text())

    def test_sigint_during_the_drain_with_streams_waiting(self):
        n, readers = self.draining_with_readers()
        t0 = time.monotonic()
        os.kill(n.proc.pid, signal.SIGINT)
        for s in readers:
            ev, _ = s.until(lambda e: e["event"] == "close", 5)
            self.assertEqual(ev["data"]["code"], 1001)
            self.assertTrue(s.at_eof())
            s.close()
        self.assertEqual(n.proc.wait(15), 0)
        took = time.monotonic() - t0
        self.assertLess(took, 3.0, "exit %.2f s after SIGINT" % took)
        self.assertNotIn("stop deadline passed", n.log_text())


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
        sender = Sender(b, conv)
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
            sender.halt()
        self.assertEqual(sender.errors, [])
        top = max(sender.acked)
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
        """web/sse.html in headless Chromium. First, before any message, a
        drain that the page cannot follow at once (a WebSocket client holds
        the node in it, so the page's new EventSource is refused with 503)
        while 20 messages are committed, then a restart: the page resumes
        with the id of the welcome (no msg had come) and gets 1..20. Then a
        restart after messages (SIGTERM with a drain: the stream's retry: is
        the jittered delay), 20 more: 1..40 once and in order without any
        code of ours in the browser."""
        # the window plus its grace (2 s) is how long the RawWs client below
        # keeps the node draining: room for 20 commits on a loaded machine
        n = self.node_start({"CONVERGER_DRAIN_SHUTDOWN_MS": "20000",
                             "CONVERGER_DRAIN_WINDOW_MS": "6000"})
        conv = n.new_conv()
        tok = mint_token("ann", [conv])
        st, _, js = n.request("GET", "/v1/conversations/%s" % conv)
        self.assertEqual(st, 200, js)
        first_id = "%s 0 %s" % (conv, js["epoch"])
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
                    # no msg yet: the id is the welcome's, the head (0)
                    self.assertEqual(await cdp.eval("window.converger.lastId()"), first_id)
                    ws = harness.RawWs(n.port)  # keeps the node draining until the deadline
                    ws.hello(tok, [{"conv": conv, "watermark": None}])
                    ws.recv_until(lambda m: m.get("type") == "synced")
                    n.fake_peer()
                    st, _, js = n.request("POST", "/admin/drain", {})
                    self.assertIn(st, (200, 202), js)
                    await wait("window.converger.events.includes('drain')")
                    # the page is refused (503) while the node drains: these
                    # are committed while it has no stream
                    for i in range(20):
                        n.send(conv, {"i": i})
                    ws.close()
                    n.stop()  # the drain ends itself (nobody left), or SIGTERM ends it
                    n.start()
                    await wait("window.converger.got.length >= 20", 40)
                    self.assertEqual(await cdp.eval("window.converger.got.length"), 20)
                    n.fake_peer()  # a ready peer: a drain event, not a 1012 close
                    n.restart()  # SIGTERM: drain event, retry: within the window; then a new process
                    for i in range(20, 40):
                        n.send(conv, {"i": i})
                    await wait("window.converger.got.length >= 40", 40)
                    await asyncio.sleep(0.5)  # nothing more (no duplicates) comes
                    got = json.loads(await cdp.eval("JSON.stringify(window.converger.got)"))
                    events = json.loads(await cdp.eval("JSON.stringify(window.converger.events)"))
                    return got, events
            got, events = asyncio.run(go())
            self.assertEqual([s for c, s in got], list(range(1, 41)))
            self.assertEqual(events.count("drain"), 2)
            self.assertGreaterEqual(events.count("welcome"), 3)
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
