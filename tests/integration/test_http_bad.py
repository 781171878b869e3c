"""HTTP-level bad input and REST error shapes: malformed requests, limits,
auth, ids, routes, conflicts, WebSocket upgrade refusals, header timeout,
keep-alive and pipelining, SQL metacharacters as data, health/metrics, and
bad configuration values."""

import json
import os
import re
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import (NodeCase, Node, HttpReader, RawWs, raw_connect, send_until_answer,  # noqa: E402
                     json_body, uid, API_KEY, TOKEN_SECRET, decode_token, free_port)
import hashlib  # noqa: E402
import hmac  # noqa: E402


def req(method, path, headers=(), body=b"", key=API_KEY, host="127.0.0.1"):
    """Bytes of one HTTP/1.1 request."""
    h = [("Host", host)]
    if key is not None:
        h.append(("Authorization", "Bearer " + key))
    if body or method in ("POST", "PATCH", "PUT"):
        h.append(("Content-Type", "application/json"))
        h.append(("Content-Length", str(len(body))))
    h.extend(headers)
    return ("%s %s HTTP/1.1\r\n" % (method, path) + "".join("%s: %s\r\n" % kv for kv in h) + "\r\n").encode() + body


class HttpBad(NodeCase):
    @classmethod
    def setUpClass(cls):
        cls.node = cls.class_node()

    def raw(self, data, timeout=5.0):
        """Sends data on a fresh connection; returns (status, headers, body
        bytes, reader)."""
        s = raw_connect(self.node.port, timeout)
        self.addCleanup(s.close)
        send_until_answer(s, data)
        r = HttpReader(s, timeout)
        st, h, b = r.read_response()
        return st, h, b, r

    # ---- malformed HTTP -------------------------------------------------
    def test_malformed_request_line_400_and_close(self):
        for junk in (b"THIS IS NOT HTTP\r\n\r\n",
                     b"GET /livez HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
                     b"GET /livez HTTP/1.1\r\nHost: x\r\nBad Header Without Colon\r\n\r\n",
                     b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40 + b"\r\n\r\n"):
            with self.subTest(junk=junk[:30]):
                st, h, b, r = self.raw(junk)
                self.assertEqual(st, 400, (junk, st, b))
                self.assertTrue(r.at_eof(3), "connection stays open after a malformed request %r" % junk)
        self.assertEqual(self.node.get("/livez")[0], 200)

    def assert_refused_400(self, data, words):
        """data on a fresh connection is answered 400 with a bad_request JSON
        body whose message contains `words`, and the connection is closed."""
        st, h, b, r = self.raw(data)
        self.assertEqual(st, 400, (data[:80], st, b))
        js = json_body(b)
        self.assertErrorBody(js, "bad_request")
        self.assertIn(words, js["error"]["message"].lower(), js)
        self.assertIn("application/json", h.get("content-type", ""))
        self.assertTrue(r.at_eof(3), "connection stays open after %r" % data[:80])
        return js

    def test_whitespace_before_colon_400(self):
        # RFC 9112 section 5.1: no whitespace between a field name and the
        # colon; a server MUST reject such a request with 400. llhttp's
        # non-strict build takes "Host " as a field name of its own.
        key = API_KEY.encode()
        for data in (b"GET /livez HTTP/1.1\r\nHost : x\r\n\r\n",
                     b"GET /livez HTTP/1.1\r\nHost: x\r\nX-Trace  : 1\r\n\r\n",
                     b"GET /admin/status HTTP/1.1\r\nHost: x\r\nAuthorization : Bearer " + key + b"\r\n\r\n",
                     b"GET /livez HTTP/1.1\r\nHost: x\r\nX Trace: 1\r\n\r\n"):
            with self.subTest(data=data):
                self.assert_refused_400(data, "header field name")
        self.assertEqual(self.node.get("/livez")[0], 200)

    def test_http10_upgrade_400(self):
        # RFC 6455 section 4.1: the opening handshake is HTTP/1.1 or later.
        data = (b"GET /v1/ws HTTP/1.0\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                b"Sec-WebSocket-Protocol: converger.v1\r\n\r\n")
        self.assert_refused_400(data, "http/1.1")
        # the same upgrade as HTTP/1.1 is accepted
        st, h, b, r = self.raw(data.replace(b"HTTP/1.0", b"HTTP/1.1"))
        self.assertEqual(st, 101, b)

    def test_duplicate_singleton_headers_400(self):
        # One value each, or the request is ambiguous: which key, which host,
        # which handshake nonce? RFC 9112 section 3.2 (Host), RFC 6455
        # section 11.3.1 (Sec-WebSocket-Key), RFC 9110 section 5.3.
        key = API_KEY.encode()
        upgrade = (b"GET /v1/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                   b"Sec-WebSocket-Protocol: converger.v1\r\n")
        nonce = b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        cases = {
            "authorization": b"GET /admin/status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nope\r\n"
                             b"Authorization: Bearer " + key + b"\r\n\r\n",
            "authorization, same value": b"GET /admin/status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                                         + key + b"\r\nauthorization: Bearer " + key + b"\r\n\r\n",
            "host": b"GET /livez HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
            "sec-websocket-key": upgrade + nonce + b"Sec-WebSocket-Key: AAAAAAAAAAAAAAAAAAAAAA==\r\n"
                                 b"Sec-WebSocket-Version: 13\r\n\r\n",
            "sec-websocket-version": upgrade + nonce + b"Sec-WebSocket-Version: 13\r\n"
                                     b"Sec-WebSocket-Version: 13\r\n\r\n",
            "idempotency-key": b"POST /v1/conversations/c/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                               + key + b"\r\nIdempotency-Key: a\r\nIdempotency-Key: b\r\n"
                               b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
        }
        for name, data in cases.items():
            with self.subTest(header=name):
                self.assert_refused_400(data, "duplicate " + name.split(",")[0])
        self.assertEqual(self.node.get("/livez")[0], 200)

    def test_bad_content_length_400(self):
        st, h, b, r = self.raw(b"POST /v1/channels HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                               + API_KEY.encode() + b"\r\nContent-Length: abc\r\n\r\n{}")
        self.assertEqual(st, 400)
        self.assertTrue(r.at_eof(3))

    # ---- limits ---------------------------------------------------------
    def test_body_over_1mib_413(self):
        body = b'{"name":"' + b"a" * (1024 * 1024) + b'"}'
        st, h, b, r = self.raw(req("POST", "/v1/channels", body=body), timeout=10)
        self.assertEqual(st, 413, b[:200])
        self.assertErrorBody(json_body(b), "too_large")
        self.assertEqual(self.node.get("/livez")[0], 200)

    def test_body_exactly_at_limit_is_not_too_large(self):
        # 1 MiB exactly is allowed by size (it is then judged as a channel)
        pad = 1024 * 1024 - len(b'{"name":"x","pad":""}')
        body = b'{"name":"x","pad":"' + b"a" * pad + b'"}'
        self.assertEqual(len(body), 1024 * 1024)
        st, h, b, r = self.raw(req("POST", "/v1/channels", body=body), timeout=10)
        self.assertNotEqual(st, 413, b[:200])

    def test_header_block_over_16kib_431(self):
        data = req("GET", "/readyz", headers=[("X-Big", "a" * (17 * 1024))])
        st, h, b, r = self.raw(data)
        self.assertEqual(st, 431, b[:200])
        # many small headers too
        data = req("GET", "/readyz", headers=[("X-H%d" % i, "v" * 60) for i in range(300)])
        st, h, b, r = self.raw(data)
        self.assertEqual(st, 431, b[:200])
        self.assertEqual(self.node.get("/livez")[0], 200)

    def test_header_block_under_16kib_ok(self):
        st, h, b, r = self.raw(req("GET", "/readyz", headers=[("X-Big", "a" * (12 * 1024))]))
        self.assertEqual(st, 200)

    # ---- routes and methods ---------------------------------------------
    def test_unknown_route_404_json(self):
        for path in ("/nope", "/v1/nope", "/v1/conversations/x/y/z", "/v2/channels"):
            with self.subTest(path=path):
                st, h, js = self.node.request("GET", path)
                self.assertEqual(st, 404)
                self.assertErrorBody(js, "not_found")
                self.assertIn("application/json", h.get("content-type", ""))

    def test_demo_page_files(self):
        """The demo page's files from the web dir (the build's web/: web/
        and the JavaScript client's modules), with their types; anything
        that is not one plain name (a path, a dot file, another extension)
        is no file of it."""
        for path, kind, text in (("/", "text/html", "converger-client"),
                                 ("/index.html", "text/html", "importmap"),
                                 ("/app.js", "text/javascript", "from \"converger-client\""),
                                 ("/style.css", "text/css", ":root"),
                                 ("/example.html", "text/html", "browserStorage"),
                                 ("/converger-client/index.js", "text/javascript", "export"),
                                 ("/converger-client/core.js", "text/javascript", "class Core")):
            with self.subTest(path=path):
                st, h, body = self.node.get_text(path)
                self.assertEqual(st, 200, body)
                self.assertIn(kind, h.get("content-type", ""))
                self.assertIn(text, body)
        for path in ("/converger-client/../app.js", "/%2e%2e/CMakeLists.txt", "/.stamp", "/converger-client/",
                     "/nothing.js", "/converger-client/a/b.js", "/index.htm", "/converger-client/index.d.ts"):
            with self.subTest(path=path):
                st, h, js = self.node.request("GET", path)
                self.assertEqual(st, 404, path)
                self.assertErrorBody(js, "not_found")
        st, _, js = self.node.request("POST", "/app.js", {})
        self.assertEqual(st, 405)

    def test_unknown_conversation_404(self):
        st, _, js = self.node.request("GET", "/v1/conversations/%s" % uid("missing"))
        self.assertEqual(st, 404)
        self.assertErrorBody(js, "not_found")
        st, _, js = self.node.request("GET", "/v1/conversations/%s/messages?after=0" % uid("missing"))
        self.assertEqual(st, 404)
        self.assertErrorBody(js, "not_found")
        st, _, js = self.node.request("POST", "/v1/conversations/%s/messages" % uid("missing"),
                                      {"sender": "a", "body": 1})
        self.assertEqual(st, 404)
        self.assertErrorBody(js, "not_found")
        st, _, js = self.node.request("POST", "/v1/conversations", {"channel": uid("nochan")})
        self.assertEqual(st, 404)
        self.assertErrorBody(js, "not_found")
        st, _, js = self.node.request("PATCH", "/v1/channels/%s" % uid("nochan"), {"active": False})
        self.assertEqual(st, 404)
        self.assertErrorBody(js, "not_found")

    def test_method_not_allowed_405(self):
        conv = self.node.new_conv()
        for method, path in (("GET", "/v1/channels"), ("DELETE", "/v1/conversations/%s" % conv),
                             ("PUT", "/v1/conversations/%s/messages" % conv), ("GET", "/v1/tokens"),
                             ("DELETE", "/v1/tokens/revoke")):
            with self.subTest(method=method, path=path):
                st, _, js = self.node.request(method, path)
                self.assertEqual(st, 405, js)
                self.assertErrorBody(js, "method_not_allowed")

    # ---- auth -----------------------------------------------------------
    def test_missing_or_wrong_api_key_401(self):
        conv = self.node.new_conv()
        cases = [("POST", "/v1/channels", {"name": "x"}), ("GET", "/v1/conversations/%s" % conv, None),
                 ("POST", "/v1/conversations/%s/messages" % conv, {"sender": "a", "body": 1}),
                 ("POST", "/v1/tokens", {"sub": "a", "convs": ["*"]}),
                 ("GET", "/admin/status", None)]
        for method, path, body in cases:
            for key in (None, "wrong-key", "", API_KEY + "x", API_KEY[:-1]):
                with self.subTest(method=method, path=path, key=key):
                    st, _, js = self.node.request(method, path, body, key=key)
                    self.assertEqual(st, 401, js)
                    self.assertErrorBody(js, "unauthorized")
        # other schemes are not accepted
        st, _, js = self.node.request("GET", "/v1/conversations/%s" % conv, key=None,
                                      headers={"Authorization": "Basic " + API_KEY})
        self.assertEqual(st, 401)
        # nothing was written by the refused requests
        self.assertEqual(self.node.request("GET", "/v1/conversations/%s" % conv)[2]["head"], 0)

    def test_health_needs_no_key(self):
        self.assertEqual(self.node.get("/livez")[0], 200)
        self.assertEqual(self.node.get("/readyz")[0], 200)
        st, h, text = self.node.get_text("/metrics")
        self.assertEqual(st, 200)

    # ---- bad bodies and ids ---------------------------------------------
    def test_invalid_json_400(self):
        for raw in (b"{", b"not json", b'{"name": "x",}', b"\xff\xfe", b"", b"[1,2]", b'"str"', b"null"):
            with self.subTest(raw=raw):
                st, _, js = self.node.request("POST", "/v1/channels", raw_body=raw)
                self.assertEqual(st, 400, js)
                self.assertErrorBody(js, "bad_request")

    def test_missing_or_mistyped_fields_400(self):
        conv = self.node.new_conv()
        cases = [("/v1/channels", {}), ("/v1/channels", {"name": 5}), ("/v1/channels", {"name": "x", "presence": "yes"}),
                 ("/v1/conversations", {}), ("/v1/conversations", {"channel": 7}),
                 ("/v1/conversations/%s/messages" % conv, {"body": 1}),
                 ("/v1/conversations/%s/messages" % conv, {"sender": "a"}),
                 ("/v1/conversations/%s/messages" % conv, {"sender": 3, "body": 1}),
                 ("/v1/tokens", {"convs": ["*"]}), ("/v1/tokens", {"sub": "a"}),
                 ("/v1/tokens", {"sub": "a", "convs": "notalist"}),
                 ("/v1/tokens", {"sub": "a", "convs": ["*"], "ttlSeconds": "long"}),
                 ("/v1/tokens/revoke", {})]
        for path, body in cases:
            with self.subTest(path=path, body=body):
                st, _, js = self.node.request("POST", path, body)
                self.assertEqual(st, 400, js)
                self.assertErrorBody(js, "bad_request")
        st, _, js = self.node.request("PATCH", "/v1/channels/%s" % self.node.create_channel(id=uid("c"))["id"],
                                      {"active": "no"})
        self.assertEqual(st, 400, js)
        self.assertEqual(self.node.request("GET", "/v1/conversations/%s" % conv)[2]["head"], 0)

    def test_invalid_ids_400(self):
        bad_ids = ["has space", "semi;colon", "quote'd", "slash/x", "", "a" * 129, "ünïcode", "x$y", "a\"b"]
        for bid in bad_ids:
            with self.subTest(id=bid):
                st, _, js = self.node.request("POST", "/v1/channels", {"id": bid, "name": "n"})
                self.assertEqual(st, 400, js)
                self.assertErrorBody(js, "bad_request")
                ch = self.node.create_channel(id=uid("ok"))
                st, _, js = self.node.request("POST", "/v1/conversations", {"channel": ch["id"], "id": bid})
                self.assertEqual(st, 400, js)
                self.assertErrorBody(js, "bad_request")
        # ids in the path
        for path_id in ("x$y", "a" * 129, "quote'd", "a%20b", "%C3%BC"):
            with self.subTest(path_id=path_id):
                st, _, js = self.node.request("GET", "/v1/conversations/%s" % path_id)
                self.assertEqual(st, 400, js)
                self.assertErrorBody(js, "bad_request")
        # the longest and the odd-but-valid ids work
        for good in ("a" * 128, "A.b_c-d:9"):
            with self.subTest(good=good):
                ch = self.node.create_channel(id=good + uid("")[-4:] if len(good) < 120 else None)
                st, _, js = self.node.request("POST", "/v1/conversations", {"channel": ch["id"], "id": good})
                self.assertEqual(st, 201, js)
                self.assertEqual(js["id"], good)
                st, _, js = self.node.request("GET", "/v1/conversations/%s" % good)
                self.assertEqual(st, 200, js)

    def test_bad_query_parameters_400(self):
        conv = self.node.new_conv()
        for q in ("after=abc", "after=-1", "limit=0", "limit=abc", "after=1e3"):
            with self.subTest(q=q):
                st, _, js = self.node.request("GET", "/v1/conversations/%s/messages?%s" % (conv, q))
                self.assertEqual(st, 400, js)
                self.assertErrorBody(js, "bad_request")

    # ---- REST semantics: conflicts, idempotency, paging, inactive ------
    def test_channel_and_conversation_conflict_409(self):
        cid = uid("dup")
        ch = self.node.create_channel(id=cid, name="first", presence=True)
        self.assertEqual(ch, {"id": cid, "name": "first", "presence": True, "signals": False, "active": True})
        st, _, js = self.node.request("POST", "/v1/channels", {"id": cid, "name": "second"})
        self.assertEqual(st, 409, js)
        self.assertErrorBody(js, "conflict")
        vid = uid("dupc")
        c = self.node.create_conv(cid, id=vid)
        self.assertRegex(c.get("epoch", ""), r"^[0-9a-f]{8}$")  # docs/protocol.md 3.1
        self.assertEqual(c, {"id": vid, "channel": cid, "head": 0, "epoch": c["epoch"]})
        st, _, js = self.node.request("POST", "/v1/conversations", {"channel": cid, "id": vid})
        self.assertEqual(st, 409, js)
        self.assertErrorBody(js, "conflict")
        # generated ids are valid ids
        ch2 = self.node.create_channel(name="auto")
        self.assertRegex(ch2["id"], r"^[A-Za-z0-9._:-]{1,128}$")
        self.assertIs(ch2["presence"], False)
        c2 = self.node.create_conv(ch2["id"])
        self.assertRegex(c2["id"], r"^[A-Za-z0-9._:-]{1,128}$")

    def test_idempotency_key(self):
        conv = self.node.new_conv()
        path = "/v1/conversations/%s/messages" % conv
        st1, _, js1 = self.node.request("POST", path, {"sender": "a", "body": 1}, headers={"Idempotency-Key": "k1"})
        self.assertEqual(st1, 201, js1)
        self.assertEqual(js1["seq"], 1)
        st2, _, js2 = self.node.request("POST", path, {"sender": "a", "body": 1}, headers={"Idempotency-Key": "k1"})
        self.assertEqual(st2, 200, js2)
        self.assertEqual(js2["seq"], 1)
        self.assertEqual(js2["id"], js1["id"])
        st3, _, js3 = self.node.request("POST", path, {"sender": "a", "body": 2}, headers={"Idempotency-Key": "k2"})
        self.assertEqual((st3, js3["seq"]), (201, 2))
        st4, _, js4 = self.node.request("POST", path, {"sender": "a", "body": 3})
        self.assertEqual((st4, js4["seq"]), (201, 3))
        msgs, head = self.node.all_messages(conv)
        self.assertEqual(head, 3)
        self.assertEqual([m["body"] for m in msgs], [1, 2, 3])
        # a bad idempotency key is a bad id
        st, _, js = self.node.request("POST", path, {"sender": "a", "body": 1}, headers={"Idempotency-Key": "bad key!"})
        self.assertEqual(st, 400, js)

    def test_idempotency_key_concurrent(self):
        import threading
        conv = self.node.new_conv()
        results, errors = [], []
        barrier = threading.Barrier(8)

        def worker():
            try:
                barrier.wait(5)
                results.append(self.node.request("POST", "/v1/conversations/%s/messages" % conv,
                                                 {"sender": "a", "body": "once"},
                                                 headers={"Idempotency-Key": "same-key"}))
            except Exception as e:
                errors.append(repr(e))
        ths = [threading.Thread(target=worker) for _ in range(8)]
        for t in ths:
            t.start()
        for t in ths:
            t.join(20)
        self.assertEqual(errors, [])
        statuses = sorted(r[0] for r in results)
        self.assertEqual(statuses, [200] * 7 + [201], [(r[0], r[2]) for r in results])
        self.assertEqual({r[2]["seq"] for r in results}, {1})
        self.assertEqual(self.node.request("GET", "/v1/conversations/%s" % conv)[2]["head"], 1)

    def test_paging(self):
        conv = self.node.new_conv()
        with self.node.session() as s:
            for i in range(10):
                s.send(conv, i)
        js = self.node.messages(conv, after=2, limit=3)
        self.assertEqual([m["seq"] for m in js["messages"]], [3, 4, 5])
        self.assertEqual([m["body"] for m in js["messages"]], [2, 3, 4])
        self.assertEqual(js["head"], 10)
        for m in js["messages"]:
            self.assertEqual(set(m), {"conv", "seq", "id", "sender", "ts", "body"})
            self.assertEqual(m["conv"], conv)
            self.assertRegex(m["ts"], harness.RFC3339_MS)
        js = self.node.messages(conv, after=10, limit=5)
        self.assertEqual(js["messages"], [])
        st, _, js = self.node.request("GET", "/v1/conversations/%s/messages" % conv)
        self.assertEqual(st, 200)
        self.assertEqual([m["seq"] for m in js["messages"]], list(range(1, 11)))

    def test_send_to_inactive_channel_409(self):
        ch = self.node.create_channel(id=uid("inact"))
        conv = self.node.create_conv(ch["id"])["id"]
        self.node.send(conv, "before")
        st, _, js = self.node.request("PATCH", "/v1/channels/%s" % ch["id"], {"active": False})
        self.assertEqual(st, 200, js)
        self.assertEqual(js["id"], ch["id"])
        self.assertIs(js["active"], False)
        st, _, js = self.node.request("POST", "/v1/conversations/%s/messages" % conv, {"sender": "a", "body": "after"})
        self.assertEqual(st, 409, js)
        self.assertErrorBody(js, "channel_inactive")
        msgs, head = self.node.all_messages(conv)
        self.assertEqual(head, 1)

    def test_tokens_endpoint_and_revoke(self):
        st, _, js = self.node.request("POST", "/v1/tokens", {"sub": "u1", "convs": ["c1", "c2"], "ttlSeconds": 120})
        self.assertEqual(st, 201, js)
        self.assertEqual(set(js), {"token", "jti", "expiresAt"})
        h, claims, sig = decode_token(js["token"])
        self.assertEqual(h["alg"], "HS256")
        self.assertEqual(claims["sub"], "u1")
        self.assertEqual(claims["convs"], ["c1", "c2"])
        self.assertEqual(claims["jti"], js["jti"])
        self.assertAlmostEqual(claims["exp"], time.time() + 120, delta=30)
        signing_input = js["token"].rsplit(".", 1)[0].encode()
        self.assertEqual(sig, hmac.new(TOKEN_SECRET.encode(), signing_input, hashlib.sha256).digest(),
                         "server tokens are not HS256 over CONVERGER_TOKEN_SECRET")
        st, h2, body = self.node.request("POST", "/v1/tokens/revoke", {"jti": js["jti"]})
        self.assertEqual(st, 204)
        self.assertIsNone(body)

    # ---- SQL metacharacters are data ------------------------------------
    def test_sql_metacharacters_in_channel_name_are_data(self):
        name = "Robert'); DROP TABLE channels;-- \" \\ % _ ; ?"
        ch = self.node.create_channel(id=uid("sql"), name=name)
        self.assertEqual(ch["name"], name)
        # the row really holds it: the deactivation answer reads it back
        st, _, js = self.node.request("PATCH", "/v1/channels/%s" % ch["id"], {"active": False})
        self.assertEqual(st, 200, js)
        self.assertEqual(js["name"], name)
        self.assertEqual(self.node.create_channel(id=uid("after"))["active"], True)

    def test_sql_metacharacters_in_body_are_data(self):
        conv = self.node.new_conv()
        body = {"q": "' OR '1'='1", "b": "\"; DELETE FROM conversations; --", "like": "%_%", "n": "\\'",
                "x'); DROP TABLE messages; --": 1}
        r = self.node.send(conv, body)
        r2 = self.node.send(conv, "' OR 1=1 --")
        msgs, head = self.node.all_messages(conv)
        self.assertEqual(head, 2)
        self.assertEqual(msgs[0]["body"], body)
        self.assertEqual(msgs[1]["body"], "' OR 1=1 --")
        self.assertEqual([r["seq"], r2["seq"]], [1, 2])
        other = self.node.new_conv()
        self.assertEqual(self.node.send(other, "fine")["seq"], 1)

    def test_sql_metacharacters_in_sender_are_refused_as_ids(self):
        # sender is a user id ([A-Za-z0-9._:-]{1,128}, docs/protocol.md section 9):
        # metacharacters are refused with 400 and nothing is stored; the same
        # strings in a body or a channel name are data (tests above).
        conv = self.node.new_conv()
        for sender in ("x'); DROP TABLE messages; --", "1 OR 1=1", "o'brien \"q\" %"):
            with self.subTest(sender=sender):
                st, _, js = self.node.request("POST", "/v1/conversations/%s/messages" % conv,
                                              {"sender": sender, "body": "hi"})
                self.assertEqual(st, 400, js)
                self.assertEqual(js["error"]["code"], "bad_request")
        self.assertEqual(self.node.messages(conv, after=0, limit=10)["head"], 0)

    def test_expect_100_continue(self):
        # RFC 9110 section 10.1.1: a client that waits for 100 Continue gets it
        # before it sends the body (curl does this for large bodies).
        conv = self.node.new_conv()
        body = json.dumps({"sender": "big", "body": "x" * 5000}).encode()
        s = raw_connect(self.node.port)
        self.addCleanup(s.close)
        head = ("POST /v1/conversations/%s/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                "Authorization: Bearer %s\r\nContent-Type: application/json\r\n"
                "Content-Length: %d\r\nExpect: 100-continue\r\n\r\n" % (conv, API_KEY, len(body)))
        s.sendall(head.encode())
        s.settimeout(3)
        interim = b""
        while b"\r\n\r\n" not in interim:
            chunk = s.recv(4096)
            self.assertTrue(chunk, "connection closed before 100 Continue")
            interim += chunk
        self.assertTrue(interim.startswith(b"HTTP/1.1 100 Continue\r\n"), interim)
        s.sendall(body)
        r = HttpReader(s)
        r.buf = interim.split(b"\r\n\r\n", 1)[1]  # anything after the 100
        st, _, b = r.read_response()
        self.assertEqual(st, 201, b)
        self.assertEqual(json.loads(b)["seq"], 1)

    def test_unknown_expectation_417(self):
        s = raw_connect(self.node.port)
        self.addCleanup(s.close)
        s.sendall(("POST /v1/channels HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                   "Content-Length: 2\r\nExpect: teapot\r\n\r\n{}" % API_KEY).encode())
        st, h, b = HttpReader(s).read_response()
        self.assertEqual(st, 417)
        self.assertEqual(json.loads(b)["error"]["code"], "bad_request")

    # ---- keep-alive and pipelining --------------------------------------
    def test_keep_alive(self):
        s = raw_connect(self.node.port)
        self.addCleanup(s.close)
        r = HttpReader(s)
        conv = self.node.new_conv()
        for i in range(5):
            s.sendall(req("POST", "/v1/conversations/%s/messages" % conv,
                          body=json.dumps({"sender": "ka", "body": i}).encode()))
            st, h, b = r.read_response()
            self.assertEqual(st, 201, b)
            self.assertEqual(json.loads(b)["seq"], i + 1)
            self.assertNotEqual(h.get("connection", "").lower(), "close")
        s.sendall(req("GET", "/readyz"))
        self.assertEqual(r.read_response()[0], 200)
        # an error answer keeps the connection too (it is not a protocol error)
        s.sendall(req("GET", "/nope"))
        self.assertEqual(r.read_response()[0], 404)
        s.sendall(req("GET", "/v1/conversations/%s" % conv))
        st, h, b = r.read_response()
        self.assertEqual(st, 200)
        self.assertEqual(json.loads(b)["head"], 5)
        # Connection: close is honoured
        s.sendall(req("GET", "/readyz", headers=[("Connection", "close")]))
        self.assertEqual(r.read_response()[0], 200)
        self.assertTrue(r.at_eof(3))

    def test_pipelining_in_order(self):
        n = self.node
        c1, c2 = n.new_conv(), n.new_conv()
        batch = b"".join([
            req("GET", "/v1/conversations/%s" % c1),
            req("POST", "/v1/conversations/%s/messages" % c2, body=b'{"sender":"p","body":"first"}'),
            req("GET", "/nope"),
            req("GET", "/readyz"),
            req("POST", "/v1/conversations/%s/messages" % c2, body=b'{"sender":"p","body":"second"}'),
            req("GET", "/v1/conversations/%s" % c2),
            req("POST", "/v1/channels", body=b"{bad json"),
            req("GET", "/v1/conversations/%s/messages?after=0" % c2),
        ])
        s = raw_connect(n.port)
        self.addCleanup(s.close)
        s.sendall(batch)
        r = HttpReader(s)
        out = [r.read_response() for _ in range(8)]
        self.assertEqual([o[0] for o in out], [200, 201, 404, 200, 201, 200, 400, 200])
        self.assertEqual(json.loads(out[0][2])["id"], c1)
        self.assertEqual(json.loads(out[1][2])["seq"], 1)
        self.assertEqual(json.loads(out[4][2])["seq"], 2)
        got = json.loads(out[5][2])
        self.assertEqual(got, {"id": c2, "channel": got["channel"], "head": 2, "epoch": got["epoch"]})
        self.assertEqual([m["body"] for m in json.loads(out[7][2])["messages"]], ["first", "second"])

    def test_pipelining_byte_by_byte(self):
        n = self.node
        c1 = n.new_conv()
        batch = req("GET", "/readyz") + req("GET", "/v1/conversations/%s" % c1) + req("GET", "/readyz")
        s = raw_connect(n.port)
        self.addCleanup(s.close)
        for i in range(len(batch)):
            s.send(batch[i:i + 1])
        r = HttpReader(s)
        out = [r.read_response() for _ in range(3)]
        self.assertEqual([o[0] for o in out], [200, 200, 200])
        self.assertEqual(json.loads(out[1][2])["id"], c1)

    # ---- WebSocket upgrade refusals --------------------------------------
    def test_ws_upgrade_refusals_400(self):
        port = self.node.port
        cases = {
            "no key": dict(omit=("Sec-WebSocket-Key",)),
            "short key": dict(key="c2hvcnQ="),
            "not base64 key": dict(key="!!!!not-base64!!!!!!!!=="),
            "version 8": dict(version="8"),
            "version 14": dict(version="14"),
            "no version": dict(omit=("Sec-WebSocket-Version",)),
            "other subprotocol": dict(protocols=("chat", "superchat")),
            "v2 only": dict(protocols=("converger.v2",)),
        }
        for name, kw in cases.items():
            with self.subTest(case=name):
                ws = RawWs(port, expect_101=False, **kw)
                self.addCleanup(ws.close)
                self.assertEqual(ws.status, 400, "%s: %d %r" % (name, ws.status, ws.body))

    def test_ws_upgrade_accept(self):
        ws = RawWs(self.node.port)
        self.addCleanup(ws.close)
        self.assertEqual(ws.status, 101)
        self.assertEqual(ws.headers.get("sec-websocket-accept"), ws.expected_accept())
        self.assertEqual(ws.headers.get("sec-websocket-protocol"), "converger.v1")
        self.assertEqual(ws.headers.get("upgrade", "").lower(), "websocket")
        # converger.v1 among others is accepted and chosen
        ws2 = RawWs(self.node.port, protocols=("chat", "converger.v1"))
        self.addCleanup(ws2.close)
        self.assertEqual(ws2.headers.get("sec-websocket-protocol"), "converger.v1")
        # no subprotocol offered at all is fine
        ws3 = RawWs(self.node.port, protocols=())
        self.addCleanup(ws3.close)
        self.assertEqual(ws3.status, 101)
        self.assertNotIn("sec-websocket-protocol", ws3.headers)

    # ---- health and metrics --------------------------------------------
    def test_metrics(self):
        # some traffic first so counters exist
        conv = self.node.new_conv()
        self.node.send(conv, "m")
        st, h, text = self.node.get_text("/metrics")
        self.assertEqual(st, 200)
        self.assertIn("text/plain", h.get("content-type", ""))
        names = set()
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})? '
                         r'(-?[0-9.eE+-]+|NaN|\+Inf|-Inf)( -?\d+)?$', line)
            self.assertIsNotNone(m, "bad exposition line %r" % line)
            names.add(m.group(1))
        for want in ("converger_connections", "converger_handshakes_total", "converger_messages_appended_total",
                     "converger_messages_delivered_total", "converger_http_requests_total",
                     "converger_pool_wait_ms_bucket", "converger_pool_wait_ms_sum", "converger_pool_wait_ms_count"):
            self.assertIn(want, names, "metric %s missing" % want)
        self.assertRegex(text, r'converger_pool_wait_ms_bucket\{[^}]*le="\+Inf"[^}]*\}')
        self.assertRegex(text, r"# TYPE converger_pool_wait_ms histogram")
        appended = [float(l.split()[-1]) for l in text.splitlines()
                    if l.startswith("converger_messages_appended_total")]
        self.assertTrue(appended and sum(appended) >= 1, appended)


    def metric_sums(self):
        st, _, text = self.node.get_text("/metrics")
        self.assertEqual(st, 200)
        sums = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name = re.split(r"[{ ]", line, 1)[0]
                try:
                    sums[name] = sums.get(name, 0.0) + float(line.rsplit(" ", 1)[-1])
                except ValueError:
                    pass
        return sums

    def test_metrics_move(self):
        from harness import mint_token
        n = self.node
        conv = n.new_conv()
        before = self.metric_sums()
        ws = RawWs(n.port)
        self.addCleanup(ws.close)
        ws.hello(mint_token("metrics", [conv]), [{"conv": conv}])
        ws.recv_until(lambda m: m.get("type") == "synced")
        n.send(conv, "counted")
        self.assertEqual(ws.recv_json()["type"], "msg")
        want = {"converger_handshakes_total": 1, "converger_messages_appended_total": 1,
                "converger_messages_delivered_total": 1, "converger_http_requests_total": 2,
                "converger_pool_wait_ms_count": 1}
        deadline = time.monotonic() + 3
        while True:
            after = self.metric_sums()
            short = {k: (after.get(k, 0) - before.get(k, 0)) for k in want
                     if after.get(k, 0) - before.get(k, 0) < want[k]}
            if not short or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        self.assertEqual(short, {}, "metrics that did not move enough (delta shown)")
        self.assertGreaterEqual(after.get("converger_connections", 0), 1)


class HeaderTimeout(NodeCase):
    @classmethod
    def setUpClass(cls):
        cls.node = cls.class_node({"CONVERGER_HTTP_HEADER_TIMEOUT_MS": "500"})

    def _closed_within(self, s, r, limit):
        """Waits until the server closes (a 408 first is allowed)."""
        t0 = time.monotonic()
        try:
            st, _, _ = r.read_response(timeout=limit)
            self.assertIn(st, (400, 408))
            self.assertTrue(r.at_eof(limit))
        except EOFError:
            pass
        except socket.timeout:
            self.fail("connection still open after %.1fs" % limit)
        return time.monotonic() - t0

    def test_incomplete_header_closed(self):
        s = raw_connect(self.node.port)
        self.addCleanup(s.close)
        t0 = time.monotonic()
        s.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n")
        r = HttpReader(s)
        self._closed_within(s, r, 4.0)
        elapsed = time.monotonic() - t0
        self.assertGreater(elapsed, 0.3, "closed before the timeout")
        self.assertLess(elapsed, 3.0)

    def test_silent_connection_closed(self):
        s = raw_connect(self.node.port)
        self.addCleanup(s.close)
        t0 = time.monotonic()
        self._closed_within(s, HttpReader(s), 4.0)
        self.assertLess(time.monotonic() - t0, 3.0)

    def test_slowloris_trickle_closed(self):
        s = raw_connect(self.node.port)
        self.addCleanup(s.close)
        t0 = time.monotonic()
        data = b"GET /livez HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(200))
        closed = False
        for i in range(len(data)):
            try:
                s.send(data[i:i + 1])
            except OSError:
                closed = True
                break
            # is it closed?
            s.settimeout(0.1)
            try:
                got = s.recv(4096)
                if not got or got.startswith(b"HTTP/1.1 4"):
                    closed = True
                    break
            except socket.timeout:
                pass
            except OSError:
                closed = True
                break
            if time.monotonic() - t0 > 4:
                break
        elapsed = time.monotonic() - t0
        self.assertTrue(closed, "a trickling header block was not cut off after %.1fs" % elapsed)
        self.assertLess(elapsed, 3.0)

    def test_second_request_on_keep_alive_also_timed(self):
        s = raw_connect(self.node.port)
        self.addCleanup(s.close)
        r = HttpReader(s)
        s.sendall(req("GET", "/readyz"))
        self.assertEqual(r.read_response()[0], 200)
        t0 = time.monotonic()
        s.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n")
        self._closed_within(s, r, 4.0)
        self.assertLess(time.monotonic() - t0, 3.0)

    def test_complete_requests_unaffected(self):
        s = raw_connect(self.node.port)
        self.addCleanup(s.close)
        r = HttpReader(s)
        s.sendall(req("GET", "/readyz"))
        self.assertEqual(r.read_response()[0], 200)
        self.assertEqual(self.node.get("/readyz")[0], 200)


class BadConfig(NodeCase):
    def run_bad(self, name, value):
        port = free_port()
        tmp = self.enterContext_tmp()
        env = dict(os.environ)
        for k in list(env):
            if k.startswith("CONVERGER_"):
                del env[k]
        env.update({"CONVERGER_LISTEN": "127.0.0.1:%d" % port,
                    "CONVERGER_DATABASE_URL": "sqlite:%s/c.db" % tmp,
                    "CONVERGER_API_KEY": API_KEY, "CONVERGER_TOKEN_SECRET": TOKEN_SECRET,
                    "CONVERGER_NODE_ID": "test:%d" % port,
                    "CONVERGER_ADMIN_LISTEN": "127.0.0.1:%d" % free_port(), name: value})
        p = subprocess.Popen([harness.binary(), "serve"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             stdin=subprocess.DEVNULL, cwd=tmp)
        harness._register(p)

        def cleanup():
            if p.poll() is None:
                os.kill(p.pid, 9)
                p.wait(5)
            harness._unregister(p)
        self.addCleanup(cleanup)
        try:
            out, err = p.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            cleanup()
            self.fail("converger serve with %s=%r did not exit (it should refuse to start)" % (name, value))
        return p.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")

    def enterContext_tmp(self):
        import tempfile
        import shutil
        d = tempfile.mkdtemp(prefix="converger-badcfg-")
        self.addCleanup(shutil.rmtree, d, True)
        return d

    def test_bad_values_exit_2_naming_setting(self):
        cases = [("CONVERGER_POOL_SIZE", "abc"), ("CONVERGER_POOL_SIZE", "-3"), ("CONVERGER_POOL_SIZE", "0"),
                 ("CONVERGER_MAX_MESSAGE_BYTES", "12x"), ("CONVERGER_HEARTBEAT_MS", "soon"),
                 ("CONVERGER_HELLO_TIMEOUT_MS", "-1"), ("CONVERGER_SQLITE_SYNC", "sometimes"),
                 ("CONVERGER_HTTP_HEADER_TIMEOUT_MS", "fast"), ("CONVERGER_MAX_SUBS", "1e9"),
                 ("CONVERGER_LISTEN", "not-an-address"), ("CONVERGER_LISTEN", "127.0.0.1:99999"),
                 ("CONVERGER_POOL_SIZE", "99999999999999999999999"),
                 ("CONVERGER_TOKEN_SECRET", "x" * 31)]
        for name, value in cases:
            with self.subTest(setting=name, value=value):
                rc, out, err = self.run_bad(name, value)
                self.assertEqual(rc, 2, "exit code for %s=%r (stderr %r)" % (name, value, err))
                short = name[len("CONVERGER_"):].lower()
                lines = [l for l in err.splitlines() if l.strip()]
                self.assertEqual(len(lines), 1, "expected a one-line error, got %r" % err)
                self.assertTrue(name in err or short in err.lower() or short.replace("_", "-") in err.lower(),
                                "error does not name the setting: %r" % err)

    def test_bad_database_url_fails(self):
        rc, out, err = self.run_bad("CONVERGER_DATABASE_URL", "mysql://nope")
        self.assertNotEqual(rc, 0)
        self.assertTrue(err.strip())


if __name__ == "__main__":
    harness.main()
