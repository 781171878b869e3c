"""Protocol 1.1 over real sockets, driven by the `websockets` library (a
peer we did not write): subscribe and unsubscribe racing live REST sends,
200 subscribes in a burst under the rate limit, a token that expires on an
open socket with and without a refresh, a refresh with a narrower scope,
the per-connection rate limits, the per-user connection limit, the REST
append limit, and bad frames answered with the connection kept."""

import asyncio
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import NodeCase, WsClient, open_client, mint_token, uid  # noqa: E402


class Sender(threading.Thread):
    """Appends to `conv` over REST at about `rate` a second until stopped;
    `acked` is the highest seq the node acknowledged."""

    def __init__(self, node, conv, rate=200):
        super().__init__(daemon=True)
        self.node, self.conv, self.rate = node, conv, rate
        self.stop = threading.Event()
        self.acked = 0
        self.error = None

    def run(self):
        try:
            with self.node.session() as s:
                i = 0
                while not self.stop.is_set():
                    i += 1
                    st, _, js = s.request("POST", "/v1/conversations/%s/messages" % self.conv,
                                          {"sender": "bot", "body": {"i": i}},
                                          headers={"Idempotency-Key": "k-%d" % i})
                    if st not in (200, 201):
                        raise AssertionError("append -> %s %r" % (st, js))
                    self.acked = max(self.acked, js["seq"])
                    time.sleep(1.0 / self.rate)
        except Exception as e:  # reported by the test
            self.error = e


async def subscribe(c, conv, watermark, timeout=10.0):
    """subscribe, retrying after rate_limited / unavailable hints; returns
    (subscribed, [msg frames of the replay], synced)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        await c.send_json({"type": "subscribe", "conv": conv, "watermark": watermark})
        m = await c.recv_json(max(0.1, deadline - loop.time()))
        if m.get("type") == "error" and m.get("code") in ("rate_limited", "unavailable"):
            await asyncio.sleep(m["retryAfterMs"] / 1000.0)
            continue
        assert m.get("type") == "subscribed" and m.get("conv") == conv, m
        msgs, synced = await c.until_synced(conv, max(0.1, deadline - loop.time()))
        return m, msgs, synced


class WsV11(NodeCase):
    @classmethod
    def setUpClass(cls):
        cls.node = cls.class_node({"CONVERGER_MAX_SUBS": "300"})

    # ------------------------------------------------------------------
    def test_subscribe_unsubscribe_racing_live_sends(self):
        """A REST sender appends at ~200/s while a client subscribes from a
        watermark, unsubscribes, and subscribes again from where it was,
        four times: each subscription delivers a gapless run from its
        watermark, nothing twice, nothing after `unsubscribed`."""
        n = self.node
        home, conv = n.new_conv(), n.new_conv()
        sender = Sender(n, conv)
        sender.start()

        async def go():
            c, w = await open_client(n, mint_token("ann", [home, conv]),
                                     [{"conv": home, "watermark": None}])
            self.assertEqual(w.get("protocol"), "1.2")
            await c.until_synced(home)
            have = 0
            try:
                for cycle in range(4):
                    sub, msgs, synced = await subscribe(c, conv, have)
                    self.assertFalse(sub.get("reset"), sub)
                    self.assertIsInstance(sub.get("epoch"), str)
                    seqs = [m["seq"] for m in msgs]
                    self.assertEqual(seqs, list(range(have + 1, have + 1 + len(seqs))), cycle)
                    have = synced["head"]
                    # live for a while
                    t_end = asyncio.get_running_loop().time() + 0.3
                    while asyncio.get_running_loop().time() < t_end:
                        m = await c.recv_json(2.0)
                        self.assertEqual(m["type"], "msg", m)
                        self.assertEqual(m["seq"], have + 1, m)
                        have = m["seq"]
                    await c.send_json({"type": "unsubscribe", "conv": conv})
                    while True:  # msgs written before the answer may still come, in order
                        m = await c.recv_json(2.0)
                        if m["type"] == "unsubscribed":
                            self.assertEqual(m["conv"], conv)
                            break
                        self.assertEqual((m["type"], m["seq"]), ("msg", have + 1), m)
                        have = m["seq"]
                    await c.expect_silence(0.3)  # the sender goes on; nothing of conv arrives
                    self.assertGreater(sender.acked, have)
            finally:
                await c.close()
            return have

        try:
            have = self.arun(go(), timeout=60)
        finally:
            sender.stop.set()
            sender.join(10)
        self.assertIsNone(sender.error)
        self.assertGreater(have, 100)
        # every acknowledged message is in the store, gapless
        seqs = [m["seq"] for m in n.all_messages(conv)[0]]
        self.assertEqual(seqs, list(range(1, sender.acked + 1)))

    def test_burst_of_200_subscribes(self):
        """200 subscribes at once: the subscribe bucket (10/s, burst 20)
        refuses most with rate_limited and a hint; the client retries after
        it and every conversation ends subscribed; one message to each then
        arrives, none lost."""
        n = self.node
        home = n.new_conv()
        convs = [n.new_conv() for _ in range(200)]

        async def go():
            c, _ = await open_client(n, mint_token("bea", ["*"]), [{"conv": home, "watermark": None}])
            await c.until_synced(home)
            try:
                for conv in convs:
                    await c.send_json({"type": "subscribe", "conv": conv, "watermark": 0})
                pending, limited, synced = set(convs), 0, set()
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 40
                retry = []  # (when, conv)
                while len(synced) < len(convs):
                    now = loop.time()
                    self.assertLess(now, deadline, "synced %d of 200" % len(synced))
                    for when, conv in [r for r in retry if r[0] <= now]:
                        retry.remove((when, conv))
                        await c.send_json({"type": "subscribe", "conv": conv, "watermark": 0})
                    try:
                        m = await c.recv_json(0.05)
                    except asyncio.TimeoutError:
                        continue
                    if m["type"] == "error":
                        self.assertEqual(m["code"], "rate_limited", m)
                        self.assertEqual(m["details"]["frame"], "subscribe", m)
                        self.assertGreater(m["retryAfterMs"], 0, m)
                        limited += 1
                        retry.append((loop.time() + m["retryAfterMs"] / 1000.0, m["conv"]))
                    elif m["type"] == "subscribed":
                        self.assertIn(m["conv"], pending, m)
                        pending.discard(m["conv"])
                    elif m["type"] == "synced":
                        synced.add(m["conv"])
                    else:
                        self.fail("unexpected %r" % (m,))
                self.assertGreaterEqual(limited, 100)
                for i, conv in enumerate(convs):
                    n.send(conv, {"i": i})
                got = {}
                for m in await c.recv_msgs(200, timeout=20):
                    got[m["conv"]] = m["seq"]
                self.assertEqual(got, {conv: 1 for conv in convs})
                await c.expect_silence(0.2)
            finally:
                await c.close()
        self.arun(go(), timeout=90)

    def test_client_id(self):
        """hello's clientId comes back in the welcome; without one the
        connection is a client of its own ("s-..."); a bad one is a bad
        hello, which may be corrected."""
        n = self.node
        conv = n.new_conv()

        async def go():
            c, w = await open_client(n, mint_token("cid", [conv]), [])
            self.assertRegex(w["clientId"], r"^s-[0-9a-f]{16}$")
            await c.close()
            c = await WsClient.connect(n)
            try:
                await c.send_json({"type": "hello", "token": mint_token("cid", [conv]), "subs": [],
                                   "clientId": "bad id"})
                m = await c.recv_json()
                self.assertEqual((m["type"], m["code"]), ("error", "bad_request"), m)
                w = await c.hello(mint_token("cid", [conv]), [], client="test")
                self.assertNotEqual(w.get("clientId"), "bad id")
            finally:
                await c.close()
            c = await WsClient.connect(n)
            try:
                await c.send_json({"type": "hello", "token": mint_token("cid", [conv]), "subs": [],
                                   "clientId": "tab-1.a"})
                w = await c.recv_json()
                self.assertEqual((w["type"], w["clientId"]), ("welcome", "tab-1.a"), w)
            finally:
                await c.close()
        self.arun(go())

    def test_bad_frames_keep_the_connection(self):
        n = self.node
        conv = n.new_conv()

        async def go():
            c, _ = await open_client(n, mint_token("cy", [conv]), [{"conv": conv, "watermark": None}])
            await c.until_synced(conv)
            try:
                # conv in the error when the frame's conv was valid and a
                # later field was not (section 4.5), none when it was bad
                for bad, named in (({"type": "subscribe"}, None),
                                   ({"type": "subscribe", "conv": "a b"}, None),
                                   ({"type": "subscribe", "conv": conv, "watermark": "x"}, conv),
                                   ({"type": "subscribe", "conv": conv, "epoch": 5}, conv),
                                   ({"type": "unsubscribe", "conv": 7}, None),
                                   ({"type": "refresh"}, None),
                                   ({"type": "refresh", "token": 42}, None)):
                    await c.send_json(bad)
                    m = await c.recv_json()
                    self.assertEqual((m["type"], m["code"]), ("error", "bad_request"), (bad, m))
                    self.assertEqual(m.get("conv"), named, (bad, m))
                other = n.new_conv()
                await c.send_json({"type": "subscribe", "conv": other, "watermark": 0})
                m = await c.recv_json()
                self.assertEqual((m["type"], m["code"], m["conv"]), ("error", "forbidden", other))
                await c.send_json({"type": "subscribe", "conv": "no-such-conv"})
                m = await c.recv_json()
                self.assertEqual(m["code"], "forbidden", m)  # not covered comes first
                await c.send_json({"type": "ping"})
                self.assertEqual((await c.recv_json())["type"], "pong")
            finally:
                await c.close()
        self.arun(go())

    # ------------------------------------------------------------------
    def test_token_expiry_without_and_with_refresh(self):
        """A 2 s token: without a refresh the node sends token_expired and
        closes 1008 token_expired once exp + the leeway (500 ms here) passes;
        a connection that refreshed stays open past it."""
        n = self.node_start({"CONVERGER_TOKEN_LEEWAY_MS": "500"})
        conv = n.new_conv()

        async def go():
            a, wa = await open_client(n, mint_token("dee", [conv], ttl=2), [{"conv": conv, "watermark": None}])
            b, wb = await open_client(n, mint_token("dee", [conv], ttl=2), [{"conv": conv, "watermark": None}])
            try:
                self.assertLessEqual(wa["expiresInMs"], 2000)
                self.assertGreater(wa["expiresInMs"], 0)
                await b.until_synced(conv)
                await b.send_json({"type": "refresh", "token": mint_token("dee", [conv], ttl=3600)})
                r = await b.recv_json()
                self.assertEqual(r["type"], "refreshed", r)
                self.assertGreater(r["expiresInMs"], 3590000)
                t0 = time.monotonic()
                code, reason, frames = await a.wait_closed(timeout=6)
                waited = time.monotonic() - t0
                self.assertEqual((code, reason), (1008, "token_expired"), frames)
                self.assertIn({"type": "error", "code": "token_expired"},
                              [{k: f.get(k) for k in ("type", "code")} for f in frames if isinstance(f, dict)])
                self.assertLess(waited, wa["expiresInMs"] / 1000.0 + 0.5 + 1.5)
                await asyncio.sleep(1.0)
                await b.send_json({"type": "ping"})
                self.assertEqual((await b.recv_json())["type"], "pong")
            finally:
                await a.close()
                await b.close()
        self.arun(go())

    def test_refresh_with_a_narrower_scope(self):
        n = self.node
        c1, c2 = n.new_conv(), n.new_conv()

        async def go():
            c, _ = await open_client(n, mint_token("eve", [c1, c2]),
                                     [{"conv": c1, "watermark": None}, {"conv": c2, "watermark": None}])
            try:
                await c.until(lambda m: m.get("type") == "synced" and m["conv"] == c1)
                await c.until(lambda m: m.get("type") == "synced" and m["conv"] == c2)
                await c.send_json({"type": "refresh", "token": mint_token("eve", [c1])})
                self.assertEqual((await c.recv_json())["type"], "refreshed")
                e = await c.recv_json()
                self.assertEqual((e["type"], e["code"], e["conv"]), ("error", "forbidden", c2))
                u = await c.recv_json()
                self.assertEqual(u, {"type": "unsubscribed", "conv": c2})
                n.send(c2, {"x": 2})
                n.send(c1, {"x": 1})
                m = await c.recv_json()
                self.assertEqual((m["type"], m["conv"]), ("msg", c1), m)
                await c.expect_silence(0.3)
                await asyncio.sleep(1.1)  # the refresh bucket: 1 a second
                await c.send_json({"type": "refresh", "token": mint_token("mallory", [c1])})
                e = await c.recv_json()
                self.assertEqual((e["type"], e["code"]), ("error", "forbidden"), e)
                await asyncio.sleep(1.1)
                await c.send_json({"type": "refresh", "token": mint_token("eve", [c1], alg="none")})
                code, reason, frames = await c.wait_closed()
                self.assertEqual(code, 1008, frames)
                self.assertEqual(frames[0]["code"], "unauthorized", frames)
            finally:
                await c.close()
        self.arun(go())

    # ------------------------------------------------------------------
    def test_send_rate_limit(self):
        """60 sends at once: the send bucket (20/s, burst 40) refuses some
        with rate_limited, details.id and a hint; sent again after it, every
        id is committed exactly once."""
        n = self.node
        conv = n.new_conv()

        async def go():
            c, _ = await open_client(n, mint_token("fay", [conv]), [{"conv": conv, "watermark": None}])
            await c.until_synced(conv)
            try:
                ids = ["s-%d" % i for i in range(60)]
                for i in ids:
                    await c.send_json({"type": "send", "conv": conv, "id": i, "body": {"id": i}})
                sent, limited = set(), 0
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 30
                while len(sent) < len(ids):
                    self.assertLess(loop.time(), deadline)
                    m = await c.recv_json(10)
                    if m["type"] == "sent":
                        sent.add(m["id"])
                    elif m["type"] == "error":
                        self.assertEqual(m["code"], "rate_limited", m)
                        self.assertEqual(m["details"]["frame"], "send")
                        limited += 1
                        await asyncio.sleep(m["retryAfterMs"] / 1000.0)
                        i = m["details"]["id"]
                        await c.send_json({"type": "send", "conv": conv, "id": i, "body": {"id": i}})
                    else:
                        self.assertEqual(m["type"], "msg", m)
                self.assertGreater(limited, 0)
            finally:
                await c.close()
        self.arun(go(), timeout=60)
        bodies = [m["body"]["id"] for m in n.all_messages(conv)[0]]
        self.assertEqual(sorted(bodies), sorted("s-%d" % i for i in range(60)))

    def test_user_controls_on_one_node(self):
        """Without a shared store the controls act here and are not
        announced; the default close is 1008 with a reason."""
        n = self.node
        conv = n.new_conv()

        async def go():
            c, _ = await open_client(n, mint_token("ivy", [conv]), [{"conv": conv, "watermark": None}])
            await c.until_synced(conv)
            st, _, js = n.request("POST", "/admin/users/ivy/unsubscribe", {"conv": conv})
            self.assertEqual((st, js), (202, {"local": {"user": "ivy", "conv": conv, "removed": 1},
                                             "announced": False}))
            self.assertEqual(await c.recv_json(), {"type": "unsubscribed", "conv": conv})
            st, _, js = n.request("POST", "/admin/users/ivy/disconnect")
            self.assertEqual((st, js), (202, {"local": {"user": "ivy", "closed": 1}, "announced": False}))
            code, reason, _ = await c.wait_closed()
            self.assertEqual((code, reason), (1008, "disconnected by the server"))
        self.arun(go())

    def test_connections_per_user_and_rest_rate(self):
        n = self.node_start({"CONVERGER_MAX_CONNS_PER_USER": "2", "CONVERGER_REST_RATE": "5",
                             "CONVERGER_REST_RATE_BURST": "5"})
        conv = n.new_conv()

        async def go():
            tok = mint_token("gil", [conv])
            a, _ = await open_client(n, tok, [{"conv": conv, "watermark": None}])
            b, _ = await open_client(n, tok, [{"conv": conv, "watermark": None}])
            c = await WsClient.connect(n)
            try:
                await c.send_json({"type": "hello", "token": tok, "subs": [{"conv": conv}]})
                code, reason, frames = await c.wait_closed()
                self.assertEqual((code, reason), (1008, "too_many_connections"), frames)
                self.assertEqual(frames[0]["code"], "too_many_connections")
                d, _ = await open_client(n, mint_token("hal", [conv]), [{"conv": conv}])
                await d.close()
                await a.close()
                await asyncio.sleep(0.3)
                e, _ = await open_client(n, tok, [{"conv": conv}])  # a's place is free again
                await e.close()
            finally:
                for x in (a, b, c):
                    await x.close()
        self.arun(go())
        statuses = []
        with n.session() as s:
            for i in range(12):
                st, hdrs, js = s.request("POST", "/v1/conversations/%s/messages" % conv,
                                         {"sender": "bot", "body": {"i": i}},
                                         headers={"Idempotency-Key": "r-%d" % i})
                statuses.append(st)
                if st == 429:
                    self.assertErrorBody(js, "rate_limited")
                    self.assertGreater(js["error"]["retryAfterMs"], 0)
                    self.assertGreaterEqual(int(hdrs["retry-after"]), 1)
        self.assertEqual(statuses[:5], [201] * 5)
        self.assertIn(429, statuses)
        _, _, metrics = n.get_text("/metrics")
        self.assertRegex(metrics, r'converger_rate_limited_total\{kind="rest"\} [1-9]')


if __name__ == "__main__":
    harness.main()
