"""The node's log as an operator reads it: CONVERGER_LOG_FORMAT=json writes
one JSON object per line (time, level, node, event, and a message or the
fields of an access line); CONVERGER_ACCESS_LOG=1 adds a line per REST
request and WebSocket upgrade (method, path without the query string,
status, duration, bytes); and no secret ever appears in a line: not the
API key, not a token (in a header, a hello or a query string), not the
token secret, not the password of a database URL."""

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import API_KEY, TOKEN_SECRET, NodeCase, Node, mint_token, open_client  # noqa: E402


def lines_of(n):
    with open(n.log_path) as f:
        return [l for l in f.read().splitlines() if l and not l.startswith("=====")]


class Logs(NodeCase):
    def exercise(self, n):
        """REST, a stream with a token in its query, a WebSocket hello: the
        secrets each of them carries."""
        conv = n.new_conv()
        tok = mint_token("ann", [conv])
        st, _, js = n.request("POST", "/v1/conversations/%s/messages" % conv,
                              {"sender": "bot", "body": {"text": "hi"}})
        self.assertEqual(st, 201, js)
        n.request("GET", "/v1/conversations/%s" % conv, key="wrong-key")  # a 401 is logged too
        s = harness.raw_connect(n.port)
        s.sendall(("GET /v1/sse?conv=%s&token=%s HTTP/1.1\r\nHost: x\r\n\r\n" % (conv, tok)).encode())
        s.recv(4096)
        s.close()

        async def ws():
            c, _ = await open_client(n, tok, [{"conv": conv, "watermark": 0}])
            await c.until_synced(conv)
            await c.close()
        self.arun(ws())
        return conv, [API_KEY, TOKEN_SECRET, tok, tok.split(".")[2]]

    def test_json_lines_with_access_lines_and_no_secret(self):
        n = self.node_start({"CONVERGER_LOG_FORMAT": "json", "CONVERGER_ACCESS_LOG": "1"})
        conv, secrets = self.exercise(n)
        time.sleep(0.3)
        n.stop()
        lines = lines_of(n)
        objs = []
        for l in lines:
            try:
                objs.append(json.loads(l))
            except ValueError:
                self.fail("not a JSON line: %r" % l)
        for o in objs:
            for k in ("time", "level", "node", "event"):
                self.assertIn(k, o, o)
            self.assertEqual(o["node"], n.node_id)
            self.assertRegex(o["time"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
        access = [o for o in objs if o["event"] == "access"]
        got = {(o["method"], o["path"], o["status"]) for o in access}
        for want in (("POST", "/v1/conversations/%s/messages" % conv, 201),
                     ("GET", "/v1/conversations/%s" % conv, 401),
                     ("GET", "/v1/sse", 200),
                     ("GET", "/v1/ws", 101),
                     ("GET", "/readyz", 200)):
            self.assertIn(want, got, access)
        for o in access:
            self.assertNotIn("?", o["path"])
            self.assertGreaterEqual(o["durationMs"], 0)
            self.assertIsInstance(o["bytes"], int)
        post = next(o for o in access if o["method"] == "POST")
        self.assertGreater(post["bytes"], 0)
        # free text lines carry their "word: " prefix as the event, and the text
        store = [o for o in objs if o["event"] == "store"]
        self.assertTrue(store and store[0]["message"].startswith("store: schema migrated"), objs[:3])
        self.assertTrue(any(o["event"] == "log" and "listening on" in o["message"] for o in objs))
        text = "\n".join(lines)
        for secret in secrets:
            self.assertNotIn(secret, text)

    def test_text_access_lines_and_off_by_default(self):
        n = self.node_start({"CONVERGER_ACCESS_LOG": "1"})
        conv, secrets = self.exercise(n)
        n.stop()
        lines = lines_of(n)
        self.assertTrue(any(" access: POST /v1/conversations/%s/messages 201 " % conv in l for l in lines), lines)
        self.assertTrue(any(" access: GET /v1/sse 200 " in l for l in lines), lines)
        text = "\n".join(lines)
        for secret in secrets:
            self.assertNotIn(secret, text)
        quiet = self.node_start()
        self.exercise(quiet)
        quiet.stop()
        self.assertFalse([l for l in lines_of(quiet) if " access: " in l])

    def test_a_database_password_is_never_logged(self):
        """A PostgreSQL URL with a password, to a port where nothing
        listens: the node says it cannot reach the store, without the
        password, in either format."""
        for fmt in ("text", "json"):
            port = harness.free_port()
            url = "postgres://converger:hunter2-secret@127.0.0.1:%d/converger" % port
            n = Node({"CONVERGER_DATABASE_URL": url, "CONVERGER_LOG_FORMAT": fmt}, start=False, ready_timeout=3.0)
            self.addCleanup(n.remove_dir)
            self.addCleanup(n.ensure_stopped)
            try:
                n.start()
            except harness.NodeStartError:
                pass  # it may refuse to start without its store: the log is what matters
            time.sleep(1.0)
            n.ensure_stopped()
            text = n.log_text()
            self.assertIn("127.0.0.1", text)  # it did say where it tried
            self.assertNotIn("hunter2-secret", text)
            self.assertNotIn(urllib.parse.quote("hunter2-secret"), text)


if __name__ == "__main__":
    harness.main()
