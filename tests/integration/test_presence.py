"""Presence and signals (protocol 1.2) over real sockets, with the
`websockets` library as the client: on one node (SQLite) and across three
nodes on one PostgreSQL database (scripts/pg-tmp).

- join for a newcomer, none for oneself; a reconnect with the same clientId
  within the grace, and a drain move, emit nothing; a leave once the grace
  has passed; a user with two clients joins once and leaves once
  ("clients" events show each);
- presence pages (limit, cursor, members=false), over the socket and REST,
  and CONVERGER_MAX_PRESENCE;
- signals to every subscriber, on every node, never in history or replay;
- bad inputs: presence where the channel has none, not subscribed, a signal
  too large, a channel without signals, REST errors;
- a SIGKILLed node's clients leave within the grace plus the membership
  timeout; a node started again under the same id reads its clients' rows
  back into their grace: one that reconnects in time emits nothing, one
  that does not leaves after the grace."""

import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import NodeCase, PgCluster, WsClient, mint_token, open_client, uid  # noqa: E402

GRACE_MS = 1500


def sub(conv, events=True, watermark=None):
    return {"conv": conv, "watermark": watermark, "presenceEvents": events}


async def join_client(node, user, conv, client_id, events=True):
    """A client subscribed to conv with presence events, synced."""
    c, w = await open_client(node, mint_token(user, [conv]), [sub(conv, events)],
                             client_id=client_id)
    assert w["clientId"] == client_id, w
    assert w["subs"][0]["presence"] is True, w
    await c.until_synced(conv)
    return c


async def events(c, seconds):
    """Every join / leave frame read within `seconds` (other frames fail)."""
    out = []
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while True:
        left = end - loop.time()
        if left <= 0:
            return out
        try:
            m = await c.recv_json(left)
        except asyncio.TimeoutError:
            return out
        assert m.get("type") in ("join", "leave"), m
        out.append((m["type"], m["user"], m["client"]))


async def presence(c, conv, **kw):
    await c.send_json(dict({"type": "presence", "conv": conv}, **kw))
    m = await c.recv_json(5.0)
    assert m.get("type") == "presence", m
    return m


class PresenceOneNode(NodeCase):
    @classmethod
    def setUpClass(cls):
        cls.node = cls.class_node({"CONVERGER_PRESENCE_GRACE_MS": str(GRACE_MS),
                                   "CONVERGER_MAX_PRESENCE": "5"})

    def test_join_leave_and_no_flap_on_reconnect(self):
        n = self.node
        conv = n.new_conv(presence=True)

        async def go():
            ann = await join_client(n, "ann", conv, "ann-1")
            bob = await join_client(n, "bob", conv, "bob-1")
            self.assertEqual(await events(ann, 0.5), [("join", "bob", "bob-1")])
            self.assertEqual(await events(bob, 0.3), [])  # never its own
            # bob reconnects within the grace: nothing
            await bob.close()
            bob = await join_client(n, "bob", conv, "bob-1")
            self.assertEqual(await events(ann, GRACE_MS / 1000.0 + 1.0), [])
            p = await presence(ann, conv)
            self.assertEqual([(x["user"], x["clients"]) for x in p["members"]],
                             [("ann", 1), ("bob", 1)])
            self.assertEqual(p["count"], 2)
            self.assertIsNone(p["cursor"])
            # bob goes: leave once the grace has passed, not before
            await bob.close()
            t0 = time.monotonic()
            self.assertEqual(await events(ann, GRACE_MS / 1000.0 - 0.5), [])
            self.assertEqual(await events(ann, 2.0), [("leave", "bob", "bob-1")])
            self.assertGreaterEqual(time.monotonic() - t0, GRACE_MS / 1000.0 - 0.05)
            p = await presence(ann, conv, members=False)
            self.assertEqual(p, {"type": "presence", "conv": conv, "count": 1})
            await ann.close()
        self.arun(go())

    def test_a_user_with_two_clients_joins_and_leaves_once(self):
        n = self.node
        conv = n.new_conv(presence=True)

        async def go():
            users = await join_client(n, "obs", conv, "obs-1", events=True)
            clients = await join_client(n, "obs2", conv, "obs-2", events="clients")
            await events(users, 0.3)  # obs2's own join
            phone = await join_client(n, "cy", conv, "cy-phone")
            laptop = await join_client(n, "cy", conv, "cy-laptop")
            self.assertEqual(await events(users, 0.5), [("join", "cy", "cy-phone")])
            self.assertEqual(await events(clients, 0.3),
                             [("join", "cy", "cy-phone"), ("join", "cy", "cy-laptop")])
            p = await presence(users, conv)
            self.assertEqual([(x["user"], x["clients"]) for x in p["members"] if x["user"] == "cy"],
                             [("cy", 2)])
            await phone.close()
            await laptop.close()
            wait = GRACE_MS / 1000.0 + 2.0
            self.assertEqual(await events(users, wait), [("leave", "cy", "cy-laptop")])
            self.assertEqual(sorted(await events(clients, 0.5)),
                             [("leave", "cy", "cy-laptop"), ("leave", "cy", "cy-phone")])
            for c in (users, clients):
                await c.close()
        self.arun(go())

    def test_pages_cursor_max_and_rest(self):
        n = self.node
        conv = n.new_conv(presence=True)

        async def go():
            cs = [await join_client(n, "u%d" % i, conv, "c%d" % i, events=False) for i in range(7)]
            p = await presence(cs[0], conv, limit=2)
            self.assertEqual([x["user"] for x in p["members"]], ["u0", "u1"])
            self.assertEqual(p["cursor"], "u1")
            p = await presence(cs[0], conv, limit=2, cursor=p["cursor"])
            self.assertEqual([x["user"] for x in p["members"]], ["u2", "u3"])
            # CONVERGER_MAX_PRESENCE=5: u5 and u6 are counted, not listed
            p = await presence(cs[0], conv, limit=2, cursor=p["cursor"])
            self.assertEqual([x["user"] for x in p["members"]], ["u4"])
            self.assertIsNone(p["cursor"])
            self.assertTrue(p["truncated"])
            self.assertEqual(p["count"], 7)
            st, _, js = n.request("GET", "/v1/conversations/%s/presence?limit=3" % conv)
            self.assertEqual(st, 200, js)
            self.assertEqual([x["user"] for x in js["members"]], ["u0", "u1", "u2"])
            self.assertEqual((js["count"], js["cursor"]), (7, "u2"))
            self.assertNotIn("type", js)
            # the cursor percent-encoded, as URLSearchParams writes it
            st, _, js = n.request("GET", "/v1/conversations/%s/presence?limit=1&cursor=u%%32" % conv)
            self.assertEqual((st, [x["user"] for x in js["members"]]), (200, ["u3"]), js)
            st, _, js = n.request("GET", "/v1/conversations/%s/presence?members=false" % conv)
            self.assertEqual((st, js), (200, {"conv": conv, "count": 7}))
            for c in cs:
                await c.close()
        self.arun(go())

    def test_signals_reach_subscribers_and_are_not_stored(self):
        n = self.node
        conv = n.new_conv(signals=True)

        async def go():
            tok = lambda u: mint_token(u, [conv])  # noqa: E731
            a, _ = await open_client(n, tok("ann"), [{"conv": conv, "watermark": 0}])
            b, _ = await open_client(n, tok("bob"), [{"conv": conv, "watermark": 0}])
            for c in (a, b):
                await c.until_synced(conv)
            await a.send_json({"type": "signal", "conv": conv, "body": {"typing": True}})
            for c in (a, b):
                m = await c.recv_json(3.0)
                self.assertEqual((m["type"], m["conv"], m["sender"], m["body"]),
                                 ("signal", conv, "ann", {"typing": True}), m)
                self.assertIsInstance(m["ts"], int)
                self.assertNotIn("seq", m)
            st, _, js = n.request("POST", "/v1/conversations/%s/signals" % conv,
                                  {"sender": "bot", "body": {"typing": False}})
            self.assertEqual(st, 202, js)
            self.assertEqual(js["delivered"], 2)
            for c in (a, b):
                m = await c.recv_json(3.0)
                self.assertEqual((m["type"], m["sender"]), ("signal", "bot"), m)
            # nothing in history, nothing replayed from 0
            self.assertEqual(n.messages(conv)["messages"], [])
            c, w = await open_client(n, tok("cy"), [{"conv": conv, "watermark": 0}])
            self.assertEqual(w["subs"][0]["head"], 0)
            msgs, _ = await c.until_synced(conv)
            self.assertEqual(msgs, [])
            for x in (a, b, c):
                await x.close()
        self.arun(go())

    def test_bad_inputs(self):
        n = self.node
        plain, typing = n.new_conv(), n.new_conv(signals=True)

        async def go():
            c, _ = await open_client(n, mint_token("ann", [plain, typing]),
                                     [{"conv": plain, "watermark": None},
                                      {"conv": typing, "watermark": None}])
            await c.until_synced(plain)
            await c.until_synced(typing)
            cases = [
                ({"type": "presence", "conv": plain}, "presence_disabled", plain),
                ({"type": "presence", "conv": "elsewhere"}, "not_subscribed", "elsewhere"),
                ({"type": "presence", "conv": plain, "limit": 0}, "bad_request", None),
                ({"type": "presence", "conv": plain, "cursor": 5}, "bad_request", None),
                ({"type": "signal", "conv": plain, "body": 1}, "signals_disabled", plain),
                ({"type": "signal", "conv": typing}, "bad_request", None),
                ({"type": "signal", "conv": typing, "body": "x" * 5000}, "too_large", typing),
                ({"type": "signal", "conv": "elsewhere", "body": 1}, "forbidden", "elsewhere"),
                ({"type": "subscribe", "conv": typing, "presenceEvents": "all"}, "bad_request", None),
            ]
            for frame, code, conv in cases:
                await c.send_json(frame)
                m = await c.recv_json(3.0)
                self.assertEqual((m.get("type"), m.get("code")), ("error", code), (frame, m))
                if conv:
                    self.assertEqual(m.get("conv"), conv, m)
                    # which request it answers (a client matches its own by it)
                    self.assertEqual((m.get("details") or {}).get("frame"), frame["type"], m)
            # the connection stays: a ping is answered
            await c.send_json({"type": "ping"})
            self.assertEqual((await c.recv_json(3.0))["type"], "pong")
            await c.close()
        self.arun(go())
        path = "/v1/conversations/%s/" % plain
        st, _, js = n.request("GET", path + "presence")
        self.assertEqual(st, 409)
        self.assertErrorBody(js, "presence_disabled")
        st, _, js = n.request("POST", path + "signals", {"sender": "bot", "body": 1})
        self.assertEqual(st, 409)
        self.assertErrorBody(js, "signals_disabled")
        st, _, js = n.request("POST", "/v1/conversations/%s/signals" % typing,
                              {"sender": "bot", "body": "x" * 5000})
        self.assertEqual(st, 413)
        self.assertErrorBody(js, "too_large")
        st, _, js = n.request("GET", "/v1/conversations/nope/presence")
        self.assertEqual(st, 404)
        st, _, js = n.request("GET", "/v1/conversations/%s/presence?limit=5000" % plain)
        self.assertEqual(st, 400)
        st, _, js = n.request("GET", "/v1/conversations/%s/presence" % plain, key="wrong")
        self.assertEqual(st, 401)
        st, _, js = n.request("POST", "/v1/channels", {"name": "x", "signals": "yes"})
        self.assertEqual(st, 400)
        self.assertErrorBody(js, "bad_request")


class PresenceCluster(NodeCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.pg = PgCluster()
        cls.addClassCleanup(cls.pg.stop)

    def cluster(self, n=3, env=None):
        e = {"CONVERGER_DATABASE_URL": self.pg.url,
             "CONVERGER_PRESENCE_GRACE_MS": str(GRACE_MS)}
        e.update(env or {})
        return [self.node_start(e) for _ in range(n)]

    def test_presence_and_signals_across_nodes(self):
        a, b, c = self.cluster()
        conv = a.new_conv(presence=True)
        ch = a.create_channel(id=uid("ch"), name="both", presence=True, signals=True)
        both = a.create_conv(ch["id"], id=uid("cv"))["id"]

        async def go():
            ann = await join_client(a, "ann", conv, "ann-1")
            bob = await join_client(b, "bob", conv, "bob-1")
            cy = await join_client(c, "cy", conv, "cy-1")
            self.assertEqual(await events(ann, 1.0), [("join", "bob", "bob-1"), ("join", "cy", "cy-1")])
            self.assertEqual(await events(bob, 0.5), [("join", "cy", "cy-1")])
            for node, cl in ((a, ann), (b, bob), (c, cy)):
                p = await presence(cl, conv)
                self.assertEqual([x["user"] for x in p["members"]], ["ann", "bob", "cy"], node.node_id)
            st, _, js = b.request("GET", "/v1/conversations/%s/presence" % conv)
            self.assertEqual((st, js["count"]), (200, 3), js)
            # cy reconnects to a within the grace: no one sees anything
            await cy.close()
            cy = await join_client(a, "cy", conv, "cy-1")
            self.assertEqual(await events(bob, GRACE_MS / 1000.0 + 1.5), [])
            self.assertEqual(await events(ann, 0.1), [])
            # cy goes for good: one leave, on every node
            await cy.close()
            for cl in (ann, bob):
                self.assertEqual(await events(cl, GRACE_MS / 1000.0 + 3.0), [("leave", "cy", "cy-1")])
            # signals: to subscribers on every node, not into history
            subs = []
            for node, user in ((a, "ann"), (b, "bob"), (c, "cy")):
                cl, _ = await open_client(node, mint_token(user, [both]), [{"conv": both, "watermark": 0}])
                await cl.until_synced(both)
                subs.append(cl)
            await subs[1].send_json({"type": "signal", "conv": both, "body": {"typing": "bob"}})
            st, _, js = c.request("POST", "/v1/conversations/%s/signals" % both,
                                  {"sender": "bot", "body": {"typing": "bot"}})
            self.assertEqual(st, 202, js)
            for cl in subs:
                got = []
                while len(got) < 2:
                    m = await cl.recv_json(5.0)
                    if m.get("type") == "signal":
                        got.append((m["sender"], m["body"]["typing"]))
                self.assertEqual(sorted(got), [("bob", "bob"), ("bot", "bot")])
            self.assertEqual(a.messages(both)["messages"], [])
            for cl in subs + [ann, bob]:
                await cl.close()
        self.arun(go(), timeout=60)

    def test_drain_move_emits_nothing_and_sigkill_leaves_in_time(self):
        """Clients on a are drained to b make-before-break (the drain frame's
        reconnectTo): an observer on c sees no leave and no join, and
        presence lists every client on b. Then b is SIGKILLed: its clients
        leave within the grace plus the membership timeout."""
        a, b, c = self.cluster(env={"CONVERGER_DRAIN_WINDOW_MS": "500",
                                    "CONVERGER_DRAIN_SHUTDOWN_MS": "10000"})
        conv = a.new_conv(presence=True)

        async def go():
            obs = await join_client(c, "obs", conv, "obs-1")
            movers = [await join_client(a, "m%d" % i, conv, "m%d-1" % i) for i in range(5)]
            self.assertEqual(len(await events(obs, 1.0)), 5)
            st, _, js = a.request("POST", "/admin/drain", {})
            self.assertIn(st, (200, 202), js)
            moved = []
            for i, old in enumerate(movers):
                d = await old.until(lambda m: m.get("type") == "drain", 5.0)
                to = d[0]["reconnectTo"]
                self.assertTrue(to and to != a.ws_url, d)
                node = b if to == b.ws_url else c
                new = await join_client(node, "m%d" % i, conv, "m%d-1" % i)  # welcomed first
                await old.close()  # then the old one goes
                moved.append((node, new))
            self.assertEqual(await events(obs, GRACE_MS / 1000.0 + 2.0), [])
            p = await presence(obs, conv)
            self.assertEqual(p["count"], 6)
            on_b = [i for i, (node, _) in enumerate(moved) if node is b]
            if not on_b:  # every mover went to c: move one to b by hand
                await moved[0][1].close()
                moved[0] = (b, await join_client(b, "m0", conv, "m0-1"))
                on_b = [0]
                self.assertEqual(await events(obs, GRACE_MS / 1000.0 + 1.0), [])
            b.kill9()
            t0 = time.monotonic()
            want = sorted(("leave", "m%d" % i, "m%d-1" % i) for i in on_b)
            got = []
            while len(got) < len(want) and time.monotonic() - t0 < 20:
                got += await events(obs, 1.0)
            took = time.monotonic() - t0
            self.assertEqual(sorted(got), want)
            # grace + the membership timeout (3.5 to 4.5 s) + a beat of each sweeper
            self.assertLess(took, GRACE_MS / 1000.0 + 4.5 + 2.5)
            self.assertGreater(took, GRACE_MS / 1000.0 + 2.5)
            p = await presence(obs, conv)
            self.assertEqual(p["count"], 6 - len(on_b))
            for node, cl in moved:
                if node is not b:
                    await cl.close()
            await obs.close()
        self.arun(go(), timeout=90)

    def test_restart_under_the_same_id_keeps_presence_through_the_grace(self):
        """a is SIGKILLed and started again under the same node id: its
        clients' rows are read back into their grace (the node's restore),
        so x, which reconnects to it within the grace, makes an observer on
        b see nothing, and y, which never comes back, leaves once, after
        the grace."""
        grace_ms = 5000  # room for a restart on a loaded machine
        a, b = self.cluster(n=2, env={"CONVERGER_PRESENCE_GRACE_MS": str(grace_ms)})
        conv = a.new_conv(presence=True)

        async def go():
            obs = await join_client(b, "obs", conv, "obs-1")
            x = await join_client(a, "x", conv, "x-1")
            y = await join_client(a, "y", conv, "y-1")
            self.assertEqual(await events(obs, 1.0), [("join", "x", "x-1"), ("join", "y", "y-1")])
            a.kill9()
            a.start()
            # the restored rows are in their grace from the restore on, which
            # ran before the node was ready: the grace has not passed yet
            t0 = time.monotonic()
            for cl in (x, y):  # their node is gone: close our ends
                await cl.close()
            x = await join_client(a, "x", conv, "x-1")
            got = []
            while time.monotonic() - t0 < grace_ms / 1000.0 + 8.0 and not got:
                got += await events(obs, 0.5)
            took = time.monotonic() - t0
            got += await events(obs, 1.0)  # and nothing after it (no leave and join of x)
            self.assertEqual(got, [("leave", "y", "y-1")])
            self.assertGreater(took, grace_ms / 2000.0)  # not at the restart: after (most of) its grace
            p = await presence(obs, conv)
            self.assertEqual(sorted(m["user"] for m in p["members"]), ["obs", "x"])
            await x.close()
            await obs.close()
        self.arun(go(), timeout=60)


if __name__ == "__main__":
    harness.main()
