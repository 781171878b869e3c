"""Three nodes on one PostgreSQL database (scripts/pg-tmp): messages sent to
any node reach subscribers on every node in seq order through LISTEN/NOTIFY;
concurrent senders on three nodes get one gapless seq; a frame larger than a
notification's payload limit still arrives; a node killed with SIGKILL loses
no acknowledged message (its clients resume on another node with their
watermarks); a revocation or a channel deactivation made on one node acts on
sockets of another."""

import asyncio
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import Follower, NodeCase, PgCluster, mint_token, open_client, recv_seqs, uid  # noqa: E402

class ClusterPg(NodeCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.pg = PgCluster()
        cls.addClassCleanup(cls.pg.stop)

    def cluster(self, n=3, env=None):
        e = {"CONVERGER_DATABASE_URL": self.pg.url}
        e.update(env or {})
        return [self.node_start(e) for _ in range(n)]

    def test_subscriber_on_c_gets_what_a_receives_in_order(self):
        a, b, c = self.cluster()
        conv = a.new_conv()

        async def go():
            on_c, _ = await open_client(c, mint_token("carol", [conv]), [{"conv": conv, "watermark": None}])
            on_a, _ = await open_client(a, mint_token("anna", [conv]), [{"conv": conv, "watermark": None}])
            with a.session() as s:
                for i in range(50):
                    s.send(conv, {"n": i})
            for sub in (on_c, on_a):  # another node, and the sending node itself
                got = await recv_seqs(sub, conv, 50)
                self.assertEqual([seq for seq, _ in got], list(range(1, 51)))
                self.assertEqual([body["n"] for _, body in got], list(range(50)))
                await sub.expect_silence(0.3)  # each message once
            await on_c.close()
            await on_a.close()
        self.arun(go())
        # c heard them through PostgreSQL: its delivery latency is the
        # notify path's, one observation per message fanned out
        _, _, metrics = c.get_text("/metrics")
        counts = {line.split("{")[1].split("}")[0]: float(line.split()[-1])
                  for line in metrics.splitlines()
                  if line.startswith("converger_delivery_latency_ms_count{")}
        self.assertGreaterEqual(counts.get('path="notify"', 0), 50, counts)
        self.assertEqual(counts.get('path="local"', 0), 0, counts)

    def test_user_disconnect_and_unsubscribe_across_nodes(self):
        """POST /admin/users/kim/disconnect on a closes kim's connections on a
        and on b (announced through the store), with the code and the hint
        asked for, and no one else's; /admin/users/kim/unsubscribe on a ends
        kim's subscription on b, and nothing of it arrives after."""
        a, b = self.cluster(2)
        x, y = a.new_conv(), a.new_conv()

        async def go():
            kim_tok, lee_tok = mint_token("kim", [x, y]), mint_token("lee", [x])
            subs = [{"conv": x, "watermark": None}, {"conv": y, "watermark": None}]
            kim_a, _ = await open_client(a, kim_tok, subs)
            kim_b, _ = await open_client(b, kim_tok, subs)
            lee_b, _ = await open_client(b, lee_tok, subs[:1])
            for cl in (kim_a, kim_b):
                await cl.until(lambda m: m.get("type") == "synced" and m["conv"] == y)
            await lee_b.until_synced(x)
            # unsubscribe first: kim's x ends on b, y goes on
            st, _, js = a.request("POST", "/admin/users/kim/unsubscribe", {"conv": x})
            self.assertEqual(st, 202, js)
            self.assertEqual(js, {"local": {"user": "kim", "conv": x, "removed": 1}, "announced": True})
            for cl in (kim_a, kim_b):
                m = await cl.recv_json(3.0)
                self.assertEqual(m, {"type": "unsubscribed", "conv": x})
            a.send(x, {"after": "unsubscribe"})
            a.send(y, {"still": "here"})
            for cl in (kim_a, kim_b):
                m = await cl.recv_json(3.0)
                self.assertEqual((m["type"], m["conv"]), ("msg", y), m)
            m = await lee_b.recv_json(3.0)
            self.assertEqual((m["type"], m["conv"]), ("msg", x), m)
            # then the disconnect
            st, _, js = a.request("POST", "/admin/users/kim/disconnect",
                                  {"code": 4001, "reason": "moderated", "retryAfterMs": 2000})
            self.assertEqual(st, 202, js)
            self.assertEqual(js, {"local": {"user": "kim", "closed": 1}, "announced": True})
            for cl in (kim_a, kim_b):
                code, reason, _ = await cl.wait_closed(timeout=3.0)
                self.assertEqual(code, 4001)
                self.assertEqual(json.loads(reason), {"retryAfterMs": 2000, "reason": "moderated"})
            await lee_b.send_json({"type": "ping"})
            self.assertEqual((await lee_b.recv_json())["type"], "pong")
            await lee_b.close()
        self.arun(go())
        self.assertIn("asked: 1 connection(s) of kim closed here with 4001", b.log_text())
        for bad in ({"code": 1005}, {"code": 2000}, {"reason": "x" * 81}, {"reason": "a\nb"},
                    {"retryAfterMs": -1}):
            st, _, js = a.request("POST", "/admin/users/kim/disconnect", bad)
            self.assertEqual(st, 400, (bad, js))
            self.assertErrorBody(js, "bad_request")
        st, _, js = a.request("POST", "/admin/users/kim/unsubscribe", {})
        self.assertEqual(st, 400, js)
        st, _, js = a.request("POST", "/admin/users/kim/disconnect", key="wrong")
        self.assertEqual(st, 401, js)
        st, _, js = a.request("GET", "/admin/users/kim/disconnect")
        self.assertEqual(st, 405, js)

    def test_four_senders_on_three_nodes_one_gapless_seq(self):
        nodes = self.cluster()
        conv = nodes[0].new_conv()
        per_sender = 40
        acked, errors = [], []

        def sender(node, name):
            try:
                with node.session() as s:
                    for i in range(per_sender):
                        js = s.send(conv, {"from": name, "i": i}, sender=name)
                        acked.append((js["seq"], name, i))
            except Exception as e:  # reported below
                errors.append(repr(e))

        async def go():
            watch, _ = await open_client(nodes[1], mint_token("w", [conv]), [{"conv": conv, "watermark": None}])
            threads = [threading.Thread(target=sender, args=(nodes[k % 3], "s%d" % k)) for k in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                await asyncio.to_thread(t.join, 30)
            self.assertEqual(errors, [])
            got = await recv_seqs(watch, conv, 4 * per_sender, timeout=15)
            await watch.close()
            return got

        got = self.arun(go())
        total = 4 * per_sender
        self.assertEqual(sorted(seq for seq, _, _ in acked), list(range(1, total + 1)))
        self.assertEqual([seq for seq, _ in got], list(range(1, total + 1)))
        by_seq = {seq: (name, i) for seq, name, i in acked}
        for seq, body in got:
            self.assertEqual((body["from"], body["i"]), by_seq[seq])
        # each sender's own messages keep their order
        for k in range(4):
            mine = [i for seq, name, i in sorted(acked) if name == "s%d" % k]
            self.assertEqual(mine, list(range(per_sender)))
        stored, head = nodes[2].all_messages(conv)
        self.assertEqual(head, total)
        self.assertEqual([m["seq"] for m in stored], list(range(1, total + 1)))

    def test_frame_larger_than_notify_payload_reaches_every_subscriber(self):
        a, b, c = self.cluster()
        conv = a.new_conv()
        big = "x" * 20000  # a notification payload holds < 8000 bytes

        async def go():
            subs = []
            for n in (a, b, c):
                cl, _ = await open_client(n, mint_token(uid("u"), [conv]), [{"conv": conv, "watermark": None}])
                subs.append(cl)
            bodies = [{"t": "small"}, {"t": big}, {"t": "after"}, {"t": big + "2"}]
            # across the limit: the frame around 7999 bytes, with and without
            bodies += [{"t": "y" * n} for n in range(7780, 7990, 15)] + [{"t": "end"}]
            for body in bodies:
                b.send(conv, body)
            for cl in subs:
                got = await recv_seqs(cl, conv, len(bodies))
                self.assertEqual([seq for seq, _ in got], list(range(1, len(bodies) + 1)))
                self.assertEqual([body for _, body in got], bodies)
                await cl.expect_silence(0.3)
                await cl.close()
        self.arun(go())

    def test_revocation_on_a_closes_socket_on_b_within_refresh(self):
        a, b = self.cluster(2, {"CONVERGER_REVOCATION_REFRESH_MS": "1000"})
        conv = a.new_conv()
        jti = uid("jti")
        tok = mint_token("mallory", [conv], jti=jti)

        async def go():
            cl, _ = await open_client(b, tok, [{"conv": conv, "watermark": None}])
            st, _, js = a.request("POST", "/v1/tokens/revoke", {"jti": jti})
            self.assertEqual(st, 204, js)
            t0 = time.monotonic()
            code, reason, frames = await cl.wait_closed(5.0)
            took = time.monotonic() - t0
            self.assertEqual(code, 1008, (reason, frames))
            self.assertIn("unauthorized", [f.get("code") for f in frames if isinstance(f, dict)])
            # the refresh interval, plus one store read and scheduling slack
            self.assertLess(took, 1.0 + 0.6, "closed %.2fs after the revocation" % took)
            # and a new handshake with it is refused on every node
            for n in (a, b):
                c2, = [await harness.WsClient.connect(n)]
                await c2.send_json({"type": "hello", "token": tok, "subs": [{"conv": conv}]})
                m = await c2.recv_json()
                self.assertEqual((m["type"], m["code"]), ("error", "unauthorized"), m)
                await c2.close()
        self.arun(go())

    def test_deactivation_on_a_ends_subscriptions_on_b_and_c(self):
        a, b, c = self.cluster()
        ch = a.create_channel(id=uid("ch"), name="deact")["id"]
        conv = a.create_conv(ch, id=uid("cv"))["id"]

        async def go():
            subs = []
            for n in (a, b, c):
                cl, _ = await open_client(n, mint_token(uid("u"), [conv]), [{"conv": conv, "watermark": None}])
                subs.append(cl)
            st, _, js = a.request("PATCH", "/v1/channels/%s" % ch, {"active": False})
            self.assertEqual(st, 200, js)
            for cl in subs:
                m, _ = await cl.until(lambda f: f.get("type") == "error", timeout=3.0)
                self.assertEqual((m["code"], m["conv"]), ("channel_inactive", conv), m)
                # protocol 1.1: the end of a subscription is said with unsubscribed too
                self.assertEqual(await cl.recv_json(), {"type": "unsubscribed", "conv": conv})
            # the subscription ended: nothing more arrives, and sends are refused
            st, _, js = b.request("POST", "/v1/conversations/%s/messages" % conv, {"sender": "x", "body": 1})
            self.assertEqual(st, 409, js)
            for cl in subs:
                await cl.expect_silence(0.2)
                await cl.close()
        self.arun(go())

    def test_listen_connection_lost_subscribers_miss_nothing(self):
        """Only node b's LISTEN connection is cut (as by a network fault) and
        messages are committed before it is back: b reads every local
        subscription's head once it listens again and fills the gap, with no
        later message to reveal it."""
        a, b = self.cluster(2)
        conv = a.new_conv()
        cut = ("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
               " WHERE application_name = 'converger listen %s'" % b.node_id)

        async def go():
            on_b, _ = await open_client(b, mint_token("bob", [conv]), [{"conv": conv, "watermark": None}])
            sent, missed_live = 0, 0
            for rnd in range(3):
                a.send(conv, {"round": rnd, "live": True})
                sent += 1
                self.assertEqual(await recv_seqs(on_b, conv, 1), [(sent, {"round": rnd, "live": True})])
                self.assertEqual(self.pg.sql(cut), ["t"])  # b's listener, and only it
                deadline = time.monotonic() + 2
                while b.get("/readyz")[0] != 503:  # b noticed: not ready without LISTEN
                    self.assertLess(time.monotonic(), deadline, "b never noticed the cut")
                    await asyncio.sleep(0.01)
                for k in range(5):  # committed while b does not listen
                    a.send(conv, {"round": rnd, "k": k})
                sent += 5
                # b retries LISTEN after 500 ms: normally still cut here, so
                # these five reach it only through the check of its subscriptions
                missed_live += b.get("/readyz")[0] == 503
                got = await recv_seqs(on_b, conv, 5, timeout=5)
                self.assertEqual([s for s, _ in got], list(range(sent - 4, sent + 1)))
            await on_b.expect_silence(0.3)
            await on_b.close()
            return missed_live
        self.assertGreaterEqual(self.arun(go()), 1, "the sends never landed while b was cut")
        self.assertIn("listening on", b.log_text())
        self.assertIn("again; checking every local subscription", b.log_text())

    def test_deactivation_while_listen_is_cut_still_ends_subscriptions(self):
        """b's LISTEN connection is cut and the channel deactivated on a before
        b listens again: b's check of its subscriptions finds the channel
        inactive and ends them as the notification would have."""
        a, b = self.cluster(2)
        ch = a.create_channel(id=uid("ch"), name="deact")["id"]
        conv = a.create_conv(ch, id=uid("cv"))["id"]
        cut = ("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
               " WHERE application_name = 'converger listen %s'" % b.node_id)

        async def go():
            cl, _ = await open_client(b, mint_token("u", [conv]), [{"conv": conv, "watermark": None}])
            self.assertEqual(self.pg.sql(cut), ["t"])
            deadline = time.monotonic() + 2
            while b.get("/readyz")[0] != 503:
                self.assertLess(time.monotonic(), deadline, "b never noticed the cut")
                await asyncio.sleep(0.01)
            st, _, js = a.request("PATCH", "/v1/channels/%s" % ch, {"active": False})
            self.assertEqual(st, 200, js)
            unheard = b.get("/readyz")[0] == 503
            m, _ = await cl.until(lambda f: f.get("type") == "error", timeout=5.0)
            self.assertEqual((m["code"], m["conv"]), ("channel_inactive", conv), m)
            await cl.close()
            return unheard
        if self.arun(go()):  # the PATCH landed while b was not listening
            self.assertIn("(1 of an inactive channel)", b.log_text())

    def test_foreign_notifications_are_ignored(self):
        """NOTIFY on converger's channel from something else (bad payloads, a
        seq above the head, an unknown channel): the node logs and goes on, a
        subscriber sees no error and keeps its order."""
        a, b = self.cluster(2)
        conv = a.new_conv()

        async def go():
            cl, _ = await open_client(b, mint_token("u", [conv]), [{"conv": conv, "watermark": None}])
            a.send(conv, {"n": 1})
            self.assertEqual(await recv_seqs(cl, conv, 1), [(1, {"n": 1})])
            for payload in ("c", "m", "m 5", "m 5 %s" % conv, "m 99999999999999999999 %s" % conv,
                            "m -1 %s" % conv, "m 7 bad/id", "c 0 no-such-channel", "c 2 x", "hello"):
                self.pg.sql("SELECT pg_notify('converger', '%s')" % payload.replace("'", "''"))
            a.send(conv, {"n": 2})
            self.assertEqual(await recv_seqs(cl, conv, 1), [(2, {"n": 2})])
            await cl.expect_silence(0.5)
            await cl.close()
        self.arun(go())
        self.assertIn("not converger's", b.log_text())
        self.assertIn("has no message after 1", b.log_text())  # the hint above the head, dropped

    def test_sigkill_of_a_node_loses_no_acknowledged_message(self):
        a, b, c = self.cluster()
        conv = a.new_conv()
        acked, stop = [], threading.Event()

        def send_loop():
            # REST to b, each message retried with its idempotency key until acknowledged
            i = 0
            while not stop.is_set():
                key = "k-%d" % i
                for _ in range(50):
                    try:
                        st, _, js = b.request("POST", "/v1/conversations/%s/messages" % conv,
                                              {"sender": "s", "body": {"i": i}},
                                              headers={"Idempotency-Key": key}, timeout=3)
                    except OSError:
                        st = 0
                    if st in (200, 201):
                        acked.append(js["seq"])
                        break
                    time.sleep(0.05)
                i += 1
                time.sleep(0.01)

        async def go():
            # every follower starts on a; after the kill it moves on to b or c
            followers = [Follower([a, b, c], conv) for _ in range(4)]
            target = {}
            until = lambda wm: "head" in target and wm >= target["head"]  # noqa: E731
            tasks = [asyncio.create_task(f.run(until)) for f in followers]
            t = threading.Thread(target=send_loop)
            t.start()
            try:
                await asyncio.sleep(1.0)
                a.kill9()
                await asyncio.sleep(1.5)
            finally:
                stop.set()
                await asyncio.to_thread(t.join, 30)
            target["head"] = max(acked)
            await asyncio.wait_for(asyncio.gather(*tasks), 20)
            return followers

        followers = self.arun(go(), timeout=60)
        self.assertGreater(len(acked), 20)
        head = max(acked)
        stored, stored_head = b.all_messages(conv)
        self.assertEqual(stored_head, head)
        self.assertEqual(sorted(acked), list(range(1, head + 1)))
        for f in followers:
            # every acknowledged message once, in order, across the move
            self.assertEqual(f.delivered, list(range(1, head + 1)))
            self.assertEqual(f.errors, [])
            self.assertGreaterEqual(f.welcomes, 2)
            self.assertEqual(f.nodes_used[0], a.node_id)
            self.assertNotEqual(f.nodes_used[-1], a.node_id)


if __name__ == "__main__":
    harness.main()
