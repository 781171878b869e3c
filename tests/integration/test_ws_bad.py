"""Bad WebSocket input, driven mostly by the raw client: wrong frame types,
bad UTF-8, oversized messages, bad JSON, frames before hello, hello timeout,
bad/expired/revoked tokens, forbidden/unknown/inactive subscriptions, second
hello, channel deactivation, heartbeat; and the node is still fine after."""

import asyncio
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import (NodeCase, RawWs, WsClient, open_client, mint_token, uid,  # noqa: E402
                     OP_BINARY, OP_TEXT, OP_CONT, OP_PING)

MAX_BYTES = 1024
MAX_SUBS = 4


def none_header_with_good_signature(conv):
    """Header says alg none, but the HMAC-SHA256 over it is right: a server
    that trusts the header's alg must still refuse it (alg is pinned)."""
    import hashlib
    import hmac
    import json
    good = mint_token("m", [conv])
    payload = good.split(".")[1]
    head = harness.b64url(json.dumps({"alg": "none", "typ": "JWT"}, separators=(",", ":")))
    sig = hmac.new(harness.TOKEN_SECRET.encode(), (head + "." + payload).encode(), hashlib.sha256).digest()
    return head + "." + payload + "." + harness.b64url(sig)


def is_error(code, conv=None):
    def pred(m):
        return (isinstance(m, dict) and m.get("type") == "error" and m.get("code") == code
                and (conv is None or m.get("conv") == conv))
    return pred


class WsBad(NodeCase):
    @classmethod
    def setUpClass(cls):
        cls.node = cls.class_node({"CONVERGER_MAX_MESSAGE_BYTES": str(MAX_BYTES),
                                   "CONVERGER_HELLO_TIMEOUT_MS": "300",
                                   "CONVERGER_MAX_SUBS": str(MAX_SUBS)})
        cls.conv = cls.node.new_conv()

    # ---- helpers --------------------------------------------------------
    def raw(self, **kw):
        ws = RawWs(self.node.port, **kw)
        self.addCleanup(ws.close)
        return ws

    def welcomed(self, convs=None, subs=None, sub="bob"):
        """A raw client after hello; returns (ws, welcome, frames read after
        the welcome until every welcomed sub is synced)."""
        convs = convs or [self.conv]
        subs = subs or [{"conv": c, "watermark": None} for c in convs]
        ws = self.raw()
        ws.hello(mint_token(sub, convs), subs)
        w = ws.recv_json()
        self.assertEqual(w.get("type"), "welcome", w)
        pending = {s["conv"] for s in w["subs"]}
        seen = []
        while pending:
            m = ws.recv_json()
            seen.append(m)
            if m.get("type") == "synced":
                pending.discard(m["conv"])
        return ws, w, seen

    def assert_usable(self, ws):
        ws.send_json({"type": "ping"})
        m, seen = ws.recv_until(lambda m: m.get("type") == "pong", timeout=5)
        self.assertEqual(m, {"type": "pong"})

    def assert_closed_with(self, ws, code, error=None, timeout=5.0):
        got, reason, seen = ws.expect_close(timeout)
        self.assertEqual(got, code, "close code %r (reason %r); frames before: %r" % (got, reason, seen))
        if error is not None:
            errs = [m for m in seen if isinstance(m, dict) and m.get("type") == "error"]
            self.assertTrue(errs and errs[-1].get("code") == error,
                            "expected error %s before the close, got %r" % (error, seen))
            self.assertIsInstance(errs[-1].get("message"), str)
        return seen

    # ---- frame-level violations ----------------------------------------
    def test_binary_frame_1003(self):
        ws, _, _ = self.welcomed()
        ws.send_binary(b'{"type":"ping"}')
        self.assert_closed_with(ws, 1003)

    def test_invalid_utf8_1007(self):
        ws, _, _ = self.welcomed()
        ws.send_text(b'{"type":"ping","x":"\xff\xfe\xc3"}')
        self.assert_closed_with(ws, 1007)

    def test_invalid_utf8_across_fragments_1007(self):
        ws, _, _ = self.welcomed()
        ws.send_frame(OP_TEXT, b'{"type":"ping","x":"ok\xe2', fin=False)
        ws.send_frame(OP_CONT, b'\x28\xa1"}', fin=True)  # broken 3-byte sequence
        self.assert_closed_with(ws, 1007)

    def test_valid_utf8_split_across_fragments_ok(self):
        ws, _, _ = self.welcomed()
        payload = '{"type":"ping","x":"\u20ac"}'.encode()
        cut = payload.index(b"\xe2") + 1
        ws.send_frame(OP_TEXT, payload[:cut], fin=False)
        ws.send_frame(OP_CONT, payload[cut:], fin=True)
        m = ws.recv_json()
        self.assertIn(m.get("type"), ("pong", "error"), m)
        self.assert_usable(ws)

    def test_oversized_frame_1009(self):
        ws, _, _ = self.welcomed()
        ws.send_text('{"type":"ping","pad":"%s"}' % ("a" * 2000))
        self.assert_closed_with(ws, 1009)

    def test_oversized_fragmented_message_1009(self):
        ws, _, _ = self.welcomed()
        body = ('{"type":"ping","pad":"%s"}' % ("a" * 1200)).encode()
        ws.send_frame(OP_TEXT, body[:600], fin=False)
        ws.send_frame(OP_CONT, body[600:], fin=True)
        self.assert_closed_with(ws, 1009)

    def test_message_at_limit_is_accepted(self):
        ws, _, _ = self.welcomed()
        head, tail = '{"type":"ping","pad":"', '"}'
        text = head + "a" * (MAX_BYTES - len(head) - len(tail)) + tail
        self.assertEqual(len(text), MAX_BYTES)
        ws.send_text(text)
        m = ws.recv_json()
        self.assertIn(m.get("type"), ("pong", "error"), m)  # not a close
        self.assert_usable(ws)

    def test_unmasked_client_frame_closes(self):
        ws, _, _ = self.welcomed()
        ws.send_frame(OP_TEXT, b'{"type":"ping"}', mask=False)
        # RFC 6455 5.1: the server MUST close; 7.4.1: 1002 is a protocol error
        self.assert_closed_with(ws, 1002)

    def test_malformed_frame_headers_1002(self):
        # RFC 6455 5.5: control frames carry at most 125 bytes and are never
        # fragmented; 5.2: the 64-bit length has its top bit clear, and a
        # length is encoded in the fewest bytes. Each is a protocol error:
        # a close frame with 1002, then the TCP connection ends.
        mask = b"\x01\x02\x03\x04"
        cases = {
            "ping of 126 bytes": RawWs.encode_frame(OP_PING, b"a" * 126),
            "fragmented ping": RawWs.encode_frame(OP_PING, b"a", fin=False),
            "64-bit length, top bit set": bytes([0x81, 0xFF]) + harness.struct.pack("!Q", 1 << 63) + mask,
            "16-bit length of 5": bytes([0x81, 0xFE]) + harness.struct.pack("!H", 5) + mask + b"hello",
            "64-bit length of 5": bytes([0x81, 0xFF]) + harness.struct.pack("!Q", 5) + mask + b"hello",
            "64-bit length of 200": bytes([0x81, 0xFF]) + harness.struct.pack("!Q", 200) + mask + b"a" * 200,
            # 5.2: RSV1-3 set without an extension that defines them
            "RSV1 set": RawWs.encode_frame(OP_TEXT, b'{"type":"ping"}', rsv=0x4),
            "RSV3 set": RawWs.encode_frame(OP_TEXT, b'{"type":"ping"}', rsv=0x1),
            # 5.2: opcodes 0x3-0x7 and 0xB-0xF are reserved
            "reserved data opcode 0x3": RawWs.encode_frame(0x3, b"x"),
            "reserved control opcode 0xB": RawWs.encode_frame(0xB, b"x"),
            # 5.4: a continuation frame with no fragmented message open
            "continuation out of place": RawWs.encode_frame(OP_CONT, b"x"),
            # 5.4: a new data frame while a fragmented message is open
            "text inside a fragmented text": RawWs.encode_frame(OP_TEXT, b'{"ty', fin=False)
            + RawWs.encode_frame(OP_TEXT, b"x"),
        }
        for name, frame in cases.items():
            with self.subTest(case=name):
                ws, _, _ = self.welcomed()
                ws.send_bytes(frame)
                self.assert_closed_with(ws, 1002)
                reader = harness.HttpReader(ws.sock)
                reader.buf = ws.buf
                self.assertTrue(reader.at_eof(3), "TCP connection kept after the 1002")

    def test_huge_declared_length_1009(self):
        # a 64-bit length of 1 TiB with no payload behind it: refused at once,
        # not after waiting for (or allocating) the payload
        ws, _, _ = self.welcomed()
        ws.send_bytes(RawWs.encode_frame(OP_TEXT, b"a" * 64, declared_len=1 << 40))
        t0 = time.monotonic()
        self.assert_closed_with(ws, 1009, timeout=5)
        self.assertLess(time.monotonic() - t0, 2.0)

    # ---- framing robustness --------------------------------------------
    def assert_hello_answers(self, types, pongs):
        """hello followed at once by pings: welcome before synced, every ping
        answered. (The order of pongs relative to the welcome is not fixed by
        the spec: the hello is answered after a store job.)"""
        self.assertEqual(sorted(types), sorted(["welcome", "synced"] + ["pong"] * pongs), types)
        self.assertLess(types.index("welcome"), types.index("synced"), types)

    def test_upgrade_and_hello_in_one_packet(self):
        hello = {"type": "hello", "token": mint_token("one", [self.conv]), "subs": [{"conv": self.conv}]}
        frames = RawWs.encode_frame(OP_TEXT, harness.json.dumps(hello)) + \
            RawWs.encode_frame(OP_TEXT, '{"type":"ping"}')
        ws = self.raw(initial=frames)
        types = [ws.recv_json().get("type") for _ in range(3)]
        self.assert_hello_answers(types, pongs=1)

    def test_many_frames_in_one_packet(self):
        ws = self.raw()
        hello = {"type": "hello", "token": mint_token("many", [self.conv]), "subs": [{"conv": self.conv}]}
        data = RawWs.encode_frame(OP_TEXT, harness.json.dumps(hello))
        data += b"".join(RawWs.encode_frame(OP_TEXT, '{"type":"ping"}') for _ in range(50))
        ws.send_bytes(data)
        types = [ws.recv_json().get("type") for _ in range(52)]
        self.assert_hello_answers(types, pongs=50)

    def test_frames_byte_by_byte(self):
        ws = self.raw()
        hello = {"type": "hello", "token": mint_token("slow", [self.conv]), "subs": [{"conv": self.conv}]}
        data = RawWs.encode_frame(OP_TEXT, harness.json.dumps(hello)) + RawWs.encode_frame(OP_TEXT, '{"type":"ping"}')
        for i in range(len(data)):
            ws.send_bytes(data[i:i + 1])
            if i % 64 == 0:
                time.sleep(0.001)  # stays well inside the 300 ms hello timeout
        types = [ws.recv_json().get("type") for _ in range(3)]
        self.assert_hello_answers(types, pongs=1)

    def test_client_close_is_answered(self):
        ws, _, _ = self.welcomed()
        ws.send_close(1000, b"bye")
        op, fin, payload = ws.recv_frame(5)
        self.assertEqual(op, 0x8, "expected a close frame in answer, got opcode %d" % op)
        if len(payload) >= 2:
            self.assertEqual(harness.struct.unpack("!H", payload[:2])[0], 1000)
        reader = harness.HttpReader(ws.sock)
        reader.buf = ws.buf
        self.assertTrue(reader.at_eof(3), "server kept the TCP connection after the close handshake")

    # ---- bad JSON / types: error, connection stays ---------------------
    def test_malformed_json_and_unknown_type_keep_connection(self):
        ws, _, _ = self.welcomed()
        for text in ('{not json', '', '[1,2,3]', '"ping"', 'null', '{"type":"nope"}', '{"no":"type"}',
                     '{"type":5}', '{"type":"send","conv":"%s"}' % self.conv,
                     '{"type":"sync","conv":"%s","watermark":"x"}' % self.conv,
                     '{"type":"sync","conv":"%s","watermark":-5}' % self.conv):
            with self.subTest(text=text):
                ws.send_text(text)
                m = ws.recv_json()
                self.assertEqual(m.get("type"), "error", m)
                self.assertEqual(m.get("code"), "bad_request", m)
                self.assertIsInstance(m.get("message"), str)
        self.assert_usable(ws)
        # and still subscribed
        r = self.node.send(self.conv, {"still": "live"})
        m = ws.recv_json()
        self.assertEqual((m.get("type"), m.get("seq")), ("msg", r["seq"]), m)

    def test_bad_send_frames(self):
        ws, _, _ = self.welcomed()
        for frame in ({"type": "send", "conv": self.conv, "id": "bad id!", "body": 1},
                      {"type": "send", "conv": self.conv, "id": "", "body": 1},
                      {"type": "send", "conv": self.conv, "id": "a" * 129, "body": 1},
                      {"type": "send", "conv": self.conv, "id": 7, "body": 1},
                      {"type": "send", "conv": self.conv, "id": "no-body"},
                      {"type": "send", "conv": "bad conv!", "id": "x", "body": 1}):
            with self.subTest(frame=frame):
                ws.send_json(frame)
                m, _ = ws.recv_until(lambda m: m.get("type") in ("error", "sent"))
                self.assertEqual((m.get("type"), m.get("code")), ("error", "bad_request"), m)
        self.assert_usable(ws)
        head = self.node.request("GET", "/v1/conversations/%s" % self.conv)[2]["head"]
        ws.send_json({"type": "send", "conv": self.conv, "id": "good-one", "body": 1})
        m, _ = ws.recv_until(lambda m: m.get("type") in ("error", "sent"))
        self.assertEqual((m.get("type"), m.get("seq")), ("sent", head + 1), m)

    def test_read_only_token_cannot_send(self):
        conv = self.node.new_conv()
        ws = self.raw()
        ws.hello(mint_token("ro", [conv], extra_claims={"scope": ["read"]}), [{"conv": conv}])
        self.assertEqual(ws.recv_json().get("type"), "welcome")
        ws.recv_until(lambda m: m.get("type") == "synced")
        ws.send_json({"type": "send", "conv": conv, "id": "ro-1", "body": 1})
        m, _ = ws.recv_until(lambda m: m.get("type") in ("error", "sent"))
        self.assertEqual(m.get("type"), "error", "a read-only token could send: %r" % m)
        self.assertEqual(m.get("code"), "forbidden", m)
        self.assertEqual(self.node.request("GET", "/v1/conversations/%s" % conv)[2]["head"], 0)

    def test_ws_ping_frame_answered(self):
        ws, _, _ = self.welcomed()
        ws.send_frame(OP_PING, b"hi")
        op, fin, payload = ws.recv_frame(5)
        self.assertEqual((op, payload), (0xA, b"hi"))

    # ---- hello rules -----------------------------------------------------
    def test_frame_before_hello_1008(self):
        for first in ({"type": "ping"}, {"type": "send", "conv": self.conv, "id": "x", "body": 1},
                      {"type": "sync", "conv": self.conv, "watermark": 0}):
            with self.subTest(first=first["type"]):
                ws = self.raw()
                ws.send_json(first)
                seen = self.assert_closed_with(ws, 1008)
                self.assertFalse([m for m in seen if isinstance(m, dict) and m.get("type") in ("pong", "sent")], seen)

    def test_invalid_hello_may_be_corrected(self):
        # An invalid hello is answered with bad_request and the connection
        # stays open for a corrected hello within the hello timeout.
        ws = self.raw()
        ws.send_json({"type": "hello", "token": mint_token("alice", [self.conv]),
                      "subs": [{"conv": "bad id"}]})
        m = ws.recv_json()
        self.assertEqual((m.get("type"), m.get("code")), ("error", "bad_request"), m)
        ws.hello(mint_token("alice", [self.conv]), [{"conv": self.conv}])
        self.assertEqual(ws.recv_json().get("type"), "welcome")

    def test_malformed_first_frame_1008(self):
        ws = self.raw()
        ws.send_text(b"{not json")
        seen = self.assert_closed_with(ws, 1008)
        self.assertTrue([m for m in seen if isinstance(m, dict) and m.get("code") == "bad_request"], seen)

    def test_hello_timeout_1008(self):
        ws = self.raw()
        t0 = time.monotonic()
        self.assert_closed_with(ws, 1008, timeout=5)
        elapsed = time.monotonic() - t0
        self.assertGreater(elapsed, 0.2, "closed before hello_timeout_ms")
        self.assertLess(elapsed, 2.5, "hello timeout of 300 ms took %.2fs" % elapsed)

    def test_hello_timeout_counts_from_upgrade_not_last_byte(self):
        # a client dribbling WebSocket pings instead of hello is still cut off
        ws = self.raw()
        t0 = time.monotonic()
        closed = None
        while time.monotonic() - t0 < 3 and closed is None:
            ws.send_frame(OP_PING, b"")
            try:
                ws.recv_message(0.1)
            except harness.WsClosed as c:
                closed = c.code
            except socket.timeout:
                pass
            except EOFError:
                closed = "eof"
        self.assertEqual(closed, 1008, "dribbling client not closed by the hello timeout")
        self.assertLess(time.monotonic() - t0, 2.5)

    def test_second_hello_bad_request(self):
        ws, _, _ = self.welcomed()
        ws.hello(mint_token("bob", [self.conv]), [{"conv": self.conv}])
        m = ws.recv_json()
        self.assertEqual((m.get("type"), m.get("code")), ("error", "bad_request"), m)
        self.assert_usable(ws)
        r = self.node.send(self.conv, "after second hello")
        m = ws.recv_json()
        self.assertEqual((m.get("type"), m.get("seq")), ("msg", r["seq"]), m)
        # exactly once (the second hello did not subscribe twice)
        self.assert_usable(ws)

    # ---- tokens ---------------------------------------------------------
    def test_bad_tokens_unauthorized_1008(self):
        c = self.conv
        now = int(time.time())
        good = mint_token("m", [c])
        not_jwt, alg = "token is not a valid JWT", "token alg must be HS256"
        cases = {  # name: (token, the error frame's message)
            "wrong secret": (mint_token("m", [c], secret="not-the-secret-of-this-node-0123456789"),
                             "bad token signature"),
            "flipped signature": (mint_token("m", [c], bad_signature=True), "bad token signature"),
            "alg none": (mint_token("m", [c], alg="none"), alg),
            "alg none, HS256-signed": (none_header_with_good_signature(c), alg),
            "alg HS384": (mint_token("m", [c], alg="HS384"), alg),
            "alg HS512": (mint_token("m", [c], alg="HS512"), alg),
            "missing exp": (mint_token("m", [c], omit_exp=True), "token has no exp"),
            "expired": (mint_token("m", [c], exp=now - 120), "token expired"),
            "garbage": ("not.a.jwt", not_jwt),
            "one word": ("abc", not_jwt),
            "empty": ("", not_jwt),
            "two parts": (".".join(good.split(".")[:2]), not_jwt),
            "four parts": (good + ".e30", not_jwt),
            "three parts, not base64 JSON": ("abc.def.ghi", not_jwt),
            "claims not JSON": (good.split(".")[0] + "." + harness.b64url("not json") + "."
                                + good.split(".")[2], not_jwt),
        }
        for name, (tok, message) in cases.items():
            with self.subTest(case=name):
                ws = self.raw()
                ws.hello(tok, [{"conv": c}])
                seen = self.assert_closed_with(ws, 1008, error="unauthorized")
                self.assertFalse([m for m in seen if isinstance(m, dict) and m.get("type") == "welcome"], seen)
                errs = [m for m in seen if isinstance(m, dict) and m.get("type") == "error"]
                self.assertEqual(errs[-1].get("message"), message, errs)

    def test_revoke_while_connected(self):
        n = self.node
        t = n.token("rev", [self.conv])
        same = []
        for _ in range(2):  # two sockets on the same token: both go
            ws = self.raw()
            ws.hello(t["token"], [{"conv": self.conv}])
            self.assertEqual(ws.recv_json()["type"], "welcome")
            ws.recv_until(lambda m: m.get("type") == "synced")
            same.append(ws)
        other, _, _ = self.welcomed(sub="other")
        st, _, _ = n.request("POST", "/v1/tokens/revoke", {"jti": t["jti"]})
        self.assertEqual(st, 204)
        t0 = time.monotonic()
        for ws in same:
            self.assert_closed_with(ws, 1008, error="unauthorized", timeout=5)
        elapsed = time.monotonic() - t0
        self.assertLess(elapsed, 2.5, "revocation took %.2fs (spec: about 1 s)" % elapsed)
        # other tokens are not affected
        self.assert_usable(other)
        # connecting with the revoked token afterwards fails too
        ws2 = self.raw()
        ws2.hello(t["token"], [{"conv": self.conv}])
        self.assert_closed_with(ws2, 1008, error="unauthorized")

    def test_revoke_before_connect(self):
        n = self.node
        t = n.token("rev2", [self.conv])
        st, _, _ = n.request("POST", "/v1/tokens/revoke", {"jti": t["jti"]})
        self.assertEqual(st, 204)
        ws = self.raw()
        ws.hello(t["token"], [{"conv": self.conv}])
        self.assert_closed_with(ws, 1008, error="unauthorized")

    # ---- subscriptions ---------------------------------------------------
    def _hello_collect(self, token, subs, want_errors, want_synced):
        """hello, then read until the welcome, every wanted error and every
        wanted synced arrived (any order)."""
        ws = self.raw()
        ws.hello(token, subs)
        welcome, errors, synced = None, {}, set()
        deadline = time.monotonic() + 5
        while welcome is None or set(want_errors) - set(errors) or set(want_synced) - synced:
            m = ws.recv_json(max(0.01, deadline - time.monotonic()))
            t = m.get("type")
            if t == "welcome":
                welcome = m
            elif t == "error":
                errors[m.get("conv")] = m.get("code")
            elif t == "synced":
                synced.add(m["conv"])
            else:
                self.fail("unexpected frame %r" % m)
        return ws, welcome, errors

    def test_forbidden_sub(self):
        n = self.node
        mine, notmine = n.new_conv(), n.new_conv()
        ws, w, errors = self._hello_collect(mint_token("f", [mine]),
                                            [{"conv": mine}, {"conv": notmine}], [notmine], [mine])
        self.assertEqual([s["conv"] for s in w["subs"]], [mine])
        self.assertEqual(errors, {notmine: "forbidden"})
        self.assert_usable(ws)
        # sending to it is forbidden too, and writes nothing
        ws.send_json({"type": "send", "conv": notmine, "id": "f1", "body": 1})
        m, _ = ws.recv_until(lambda m: m.get("type") in ("error", "sent"))
        self.assertEqual((m.get("type"), m.get("code"), m.get("conv")), ("error", "forbidden", notmine), m)
        self.assertEqual(n.request("GET", "/v1/conversations/%s" % notmine)[2]["head"], 0)
        # live messages of the forbidden conversation are not delivered
        n.send(notmine, "secret")
        r = n.send(mine, "public")
        m = ws.recv_json()
        self.assertEqual((m.get("conv"), m.get("seq")), (mine, r["seq"]), m)

    def test_only_forbidden_sub_keeps_connection(self):
        n = self.node
        mine, notmine = n.new_conv(), n.new_conv()
        ws, w, errors = self._hello_collect(mint_token("f", [mine]), [{"conv": notmine}], [notmine], [])
        self.assertEqual(w["subs"], [])
        self.assertEqual(errors, {notmine: "forbidden"})
        self.assert_usable(ws)

    def test_not_found_sub(self):
        n = self.node
        known, unknown = n.new_conv(), uid("ghost")
        ws, w, errors = self._hello_collect(mint_token("nf", ["*"]),
                                            [{"conv": known}, {"conv": unknown}], [unknown], [known])
        self.assertEqual([s["conv"] for s in w["subs"]], [known])
        self.assertEqual(errors, {unknown: "not_found"})
        self.assert_usable(ws)

    def test_inactive_channel_sub_at_hello(self):
        n = self.node
        ch = n.create_channel(id=uid("off"))
        off = n.create_conv(ch["id"])["id"]
        on = n.new_conv()
        self.assertEqual(n.request("PATCH", "/v1/channels/%s" % ch["id"], {"active": False})[0], 200)
        ws, w, errors = self._hello_collect(mint_token("ia", [off, on]),
                                            [{"conv": off}, {"conv": on}], [off], [on])
        self.assertEqual([s["conv"] for s in w["subs"]], [on])
        self.assertEqual(errors, {off: "channel_inactive"})
        self.assert_usable(ws)

    def test_channel_deactivation_while_connected(self):
        n = self.node
        ch = n.create_channel(id=uid("deact"))
        doomed = n.create_conv(ch["id"])["id"]
        fine = n.new_conv()
        ws, w, _ = self.welcomed(convs=[doomed, fine])
        n.send(doomed, "before")
        m = ws.recv_json()
        self.assertEqual((m["type"], m["conv"], m["seq"]), ("msg", doomed, 1))
        st, _, js = n.request("PATCH", "/v1/channels/%s" % ch["id"], {"active": False})
        self.assertEqual(st, 200, js)
        self.assertIs(js["active"], False)
        m = ws.recv_json()
        self.assertEqual((m.get("type"), m.get("code"), m.get("conv")), ("error", "channel_inactive", doomed), m)
        # the connection and the other subscription live on
        self.assert_usable(ws)
        r = n.send(fine, "still here")
        m = ws.recv_json()
        self.assertEqual((m["type"], m["conv"], m["seq"]), ("msg", fine, r["seq"]))
        # sending over WS to the inactive channel is refused
        ws.send_json({"type": "send", "conv": doomed, "id": "late", "body": 1})
        m, _ = ws.recv_until(lambda m: m.get("type") in ("error", "sent"))
        self.assertEqual((m.get("type"), m.get("code")), ("error", "channel_inactive"), m)

    def test_too_many_subs_bad_request(self):
        # 0..max_subs subs (max_subs set to 4 here): 5 subs, or no array, is refused
        for subs in ([{"conv": self.node.new_conv()} for i in range(MAX_SUBS + 1)], None):
            with self.subTest(n=-1 if subs is None else len(subs)):
                ws = self.raw()
                ws.hello(mint_token("many", ["*"]), subs)
                m = ws.recv_json()
                self.assertEqual(m.get("type"), "error", m)
                self.assertIn(m.get("code"), ("bad_request", "too_large"), m)
        # exactly max_subs is fine, and (protocol 1.1) none
        ws, w, _ = self.welcomed(convs=[self.node.new_conv() for i in range(MAX_SUBS)])
        self.assertEqual(len(w["subs"]), MAX_SUBS)
        ws = self.raw()
        ws.hello(mint_token("none", ["*"]), [])
        m = ws.recv_json()
        self.assertEqual((m.get("type"), m.get("subs")), ("welcome", []), m)

    # ---- last: the node survived all of the above ------------------------
    def test_zz_node_still_alive(self):
        n = self.node
        self.assertTrue(n.running())
        self.assertEqual(n.get("/livez")[0], 200)
        self.assertEqual(n.get("/readyz")[0], 200)
        conv = n.new_conv()

        async def go():
            c, w = await open_client(n, mint_token("alive", [conv]), [{"conv": conv, "watermark": 0}])
            try:
                await c.until_synced(conv)
                r = n.send(conv, "alive")
                m = await c.recv_json()
                self.assertEqual((m["type"], m["seq"], m["body"]), ("msg", r["seq"], "alive"))
            finally:
                await c.close()
        self.arun(go())


class Heartbeat(NodeCase):
    @classmethod
    def setUpClass(cls):
        cls.node = cls.class_node({"CONVERGER_HEARTBEAT_MS": "200"})
        cls.conv = cls.node.new_conv()

    def hello(self, auto_pong):
        ws = RawWs(self.node.port, auto_pong=auto_pong)
        self.addCleanup(ws.close)
        ws.hello(mint_token("hb", [self.conv]), [{"conv": self.conv}])
        w = ws.recv_json()
        self.assertEqual(w.get("type"), "welcome", w)
        self.assertEqual(w.get("heartbeatMs"), 200)
        ws.recv_until(lambda m: m.get("type") == "synced")
        return ws

    def test_pings_arrive_and_ponging_client_stays(self):
        ws = self.hello(auto_pong=True)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 1.5:
            try:
                m = ws.recv_message(0.1)
                self.fail("unexpected message %r" % (m,))
            except socket.timeout:
                pass
        self.assertGreaterEqual(ws.pings, 3, "only %d pings in 1.5 s at heartbeat 200 ms" % ws.pings)
        self.assertIsNone(ws.closed)
        ws.send_json({"type": "ping"})
        self.assertEqual(ws.recv_json(), {"type": "pong"})

    def test_silent_client_closed_1001(self):
        ws = self.hello(auto_pong=False)
        t0 = time.monotonic()
        code, reason, seen = ws.expect_close(timeout=5)
        elapsed = time.monotonic() - t0
        self.assertEqual(code, 1001, "close code %r %r; frames: %r" % (code, reason, seen))
        self.assertGreaterEqual(ws.pings, 1, "the server closed without pinging")
        self.assertGreater(elapsed, 0.15)
        self.assertLess(elapsed, 1.5, "silent client closed after %.2fs (two intervals = 0.4 s)" % elapsed)

    def test_talking_client_without_pongs_stays(self):
        # "closes a connection that has sent nothing (not even a pong)": a
        # client that keeps sending frames is not silent
        ws = self.hello(auto_pong=False)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 1.5:
            ws.send_json({"type": "ping"})
            m = ws.recv_json(2)
            self.assertEqual(m, {"type": "pong"})
            time.sleep(0.1)
        self.assertGreaterEqual(ws.pings, 3)

    def test_websockets_library_client_survives(self):
        n = self.node

        async def go():
            c, w = await open_client(n, mint_token("lib", [self.conv]), [{"conv": self.conv}])
            try:
                self.assertEqual(w["heartbeatMs"], 200)
                await c.until_synced(self.conv)
                await asyncio.sleep(1.5)
                r = n.send(self.conv, "after heartbeats")
                m = await c.recv_json()
                self.assertEqual((m["type"], m["seq"]), ("msg", r["seq"]))
            finally:
                await c.close()
        self.arun(go())


if __name__ == "__main__":
    harness.main()
