"""A sharded cluster (docs/operations.md, "Scaling out"): conversations over
several PostgreSQL instances (scripts/pg-tmp) and fan-out over Redis pub/sub
(scripts/redis-tmp). Messages reach subscribers on other nodes in order and
once, and only the nodes that serve a conversation hear it; no node holds a
LISTEN session; a shard that is down fails only its own conversations (503
with Retry-After, a per-subscription unavailable) while /readyz stays 200; a
bus instance that is down is replaced by head polls and nothing is lost; a
message committed without a publish is found by the periodic head check."""

import asyncio
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import NodeCase, Sharded, mint_token, open_client, recv_seqs  # noqa: E402


def metric(node, name, labels=None):
    """The sum of `name`'s series (those with every label of `labels`)."""
    _, _, text = node.get_text("/metrics", port=node.admin_port)
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line[len(name)] not in "{ ":
            continue
        if labels and not all('%s="%s"' % kv in line for kv in labels.items()):
            continue
        total += float(line.split()[-1])
    return total


class ShardedCluster(NodeCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.sh = Sharded(instances=3, bus=2)
        cls.addClassCleanup(cls.sh.stop)

    def nodes(self, n, env=None):
        return [self.node_start(self.sh.env(env)) for _ in range(n)]

    def test_messages_reach_the_nodes_that_serve_them_once_in_order(self):
        a, b, c = self.nodes(3)
        conv = self.sh.conv_on(a)
        other = self.sh.conv_on(a, instance=(self.sh.instance_of(conv) + 1) % 3)

        async def go():
            on_c, _ = await open_client(c, mint_token("carol", [conv]), [{"conv": conv, "watermark": None}])
            on_a, _ = await open_client(a, mint_token("anna", [conv]), [{"conv": conv, "watermark": None}])
            with a.session() as s:
                for i in range(50):
                    s.send(conv, {"n": i})
                    s.send(other, {"n": i})  # nobody subscribes to it
            for sub in (on_c, on_a):  # another node, and the sending node itself
                got = await recv_seqs(sub, conv, 50)
                self.assertEqual([seq for seq, _ in got], list(range(1, 51)))
                self.assertEqual([body["n"] for _, body in got], list(range(50)))
                await sub.expect_silence(0.3)  # each message once
            await on_c.close()
            await on_a.close()
        self.arun(go())
        # c heard them on the bus; b, with no subscriber, heard none of the
        # 100 messages: only what its own control channel carries
        self.assertGreaterEqual(metric(c, "converger_delivery_latency_ms_count", {"path": "bus"}), 50)
        self.assertLess(metric(b, "converger_bus_messages_in_total"), 10)
        self.assertGreaterEqual(metric(c, "converger_bus_messages_in_total"), 50)
        # the rows are on the conversations' own instances, and nowhere else
        for i, pg in enumerate(self.sh.pgs):
            rows = int(pg.sql("SELECT count(*) FROM messages WHERE conv IN ('%s', '%s')"
                              % (conv, other))[0])
            want = (50 if self.sh.instance_of(conv) == i else 0) + \
                (50 if self.sh.instance_of(other) == i else 0)
            self.assertEqual(rows, want, "instance %d" % i)
            # no node listens: the append sends no NOTIFY
            listening = pg.sql("SELECT count(*) FROM pg_stat_activity WHERE application_name"
                               " LIKE 'converger listen%' OR query ILIKE 'LISTEN%'")
            self.assertEqual(listening, ["0"], "instance %d" % i)
            # connections per primary: at most nodes x pool
            conns = int(pg.sql("SELECT count(*) FROM pg_stat_activity WHERE datname = 'converger'"
                               " AND pid <> pg_backend_pid()")[0])
            self.assertLessEqual(conns, 3 * 20, "instance %d" % i)
        # once the last subscriber is gone, the nodes hold no bus subscription
        deadline = time.time() + 5
        while time.time() < deadline and metric(c, "converger_bus_subscriptions") > 0:
            time.sleep(0.1)
        self.assertEqual(metric(c, "converger_bus_subscriptions"), 0)

    def test_concurrent_senders_on_three_nodes_one_gapless_seq(self):
        nodes = self.nodes(3)
        conv = self.sh.conv_on(nodes[0])
        acked = []

        async def go():
            follower, _ = await open_client(nodes[2], mint_token("f", [conv]), [{"conv": conv, "watermark": 0}])
            loop = asyncio.get_running_loop()

            def sender(k):
                with nodes[k % 3].session() as s:
                    for i in range(30):
                        st, _, js = s.request("POST", "/v1/conversations/%s/messages" % conv,
                                              {"sender": "bot", "body": {"k": k}},
                                              headers={"Idempotency-Key": "s%d-%d" % (k, i)})
                        assert st == 201, (st, js)
                        acked.append(js["seq"])
            await asyncio.gather(*(loop.run_in_executor(None, sender, k) for k in range(4)))
            got = await recv_seqs(follower, conv, 120, timeout=20)
            self.assertEqual([seq for seq, _ in got], list(range(1, 121)))
            await follower.expect_silence(0.3)
            await follower.close()
        self.arun(go(), timeout=60)
        self.assertEqual(sorted(acked), list(range(1, 121)))

    def test_a_shard_down_fails_only_its_conversations(self):
        a, b = self.nodes(2)
        down = 2
        dead = self.sh.conv_on(a, instance=down)
        alive = self.sh.conv_on(a, instance=0)
        a.send(dead, {"before": True})
        self.sh.pgs[down].down()
        try:
            # REST: 503 with Retry-After for its conversation, 201 for the others
            st, hdrs, js = a.request("POST", "/v1/conversations/%s/messages" % dead,
                                     {"sender": "bot", "body": {}}, headers={"Idempotency-Key": "x1"})
            self.assertEqual(st, 503, js)
            self.assertErrorBody(js, "unavailable")
            self.assertIn("shard", js["error"]["message"])
            self.assertIn("retry-after", {k.lower() for k in hdrs})
            self.assertEqual(b.send(alive, {"during": True})["seq"], 1)
            for n in (a, b):  # no node leaves its load balancer
                st, _, js = n.request("GET", "/readyz", key=None)
                self.assertEqual(st, 200, js)

            async def go():
                tok = mint_token("uma", [dead, alive])
                c = await harness.WsClient.connect(b)
                await c.send_json({"type": "hello", "token": tok, "subs": [
                    {"conv": dead, "watermark": 0}, {"conv": alive, "watermark": 0}]})
                welcome, seen = await c.until(lambda m: m.get("type") == "welcome")
                self.assertEqual([s["conv"] for s in welcome["subs"]], [alive])
                errs = [m for m in seen if m.get("type") == "error"]
                self.assertEqual(len(errs), 1, seen)
                self.assertEqual((errs[0]["code"], errs[0]["conv"]), ("unavailable", dead))
                self.assertGreater(errs[0]["retryAfterMs"], 0)
                got = await recv_seqs(c, alive, 1)  # the other subscription works
                self.assertEqual([seq for seq, _ in got], [1])
                # a subscribe of it: refused, the connection stays
                await c.send_json({"type": "subscribe", "conv": dead, "watermark": 0})
                m, _ = await c.until(lambda m: m.get("type") == "error")
                self.assertEqual((m["code"], m["conv"]), ("unavailable", dead))
                # a send to it: refused with its id, the connection stays
                await c.send_json({"type": "send", "conv": dead, "id": "w1", "body": {}})
                m, _ = await c.until(lambda m: m.get("type") == "error")
                self.assertEqual((m["code"], m["conv"], m["details"]["id"]), ("unavailable", dead, "w1"))
                self.assertGreater(m["retryAfterMs"], 0)
                a.send(alive, {"after": True})
                got = await recv_seqs(c, alive, 1)
                self.assertEqual([seq for seq, _ in got], [2])
                await c.close()
            self.arun(go())
        finally:
            self.sh.pgs[down].up()

        async def back():
            # b sees it back by its own probe, with no call of a client's
            # reaching that instance (converger_shard_up)
            deadline = time.time() + 10
            while metric(b, "converger_shard_up", {"db_instance": str(down)}) != 1:
                self.assertLess(time.time(), deadline, "b never saw instance %d back" % down)
                await asyncio.sleep(0.2)
            # the instance answers again: within its down period plus a probe
            deadline = time.time() + 10
            while True:
                st, _, js = a.request("POST", "/v1/conversations/%s/messages" % dead,
                                      {"sender": "bot", "body": {}}, headers={"Idempotency-Key": "x1"})
                if st == 201 or time.time() > deadline:
                    break
                await asyncio.sleep(0.2)
            self.assertEqual((st, js.get("seq")), (201, 2), js)
            c, welcome = await open_client(b, mint_token("uma", [dead]), [{"conv": dead, "watermark": 0}])
            got = await recv_seqs(c, dead, 2)
            self.assertEqual([seq for seq, _ in got], [1, 2])
            await c.close()
        self.arun(back())
        self.assertGreater(metric(a, "converger_shard_store_ms_count", {"instance": str(down)}), 0)
        self.assertIn("instance %d" % down, a.log_text())

    def test_a_hung_shard_holds_only_its_own_conversations(self):
        """A shard frozen (SIGSTOP: it answers nothing, not even a refusal)
        under senders to it and to the other shards: the others' sends
        keep being answered well inside the store timeout (their group
        commits run in lanes of their own), the hung one's get 503 by the
        timeout, and no node leaves its load balancer."""
        timeout_ms = 6000
        a, b = self.nodes(2, {"CONVERGER_STORE_TIMEOUT_MS": str(timeout_ms)})
        hung = self.sh.conv_on(a, instance=2)
        fine = [self.sh.conv_on(a, instance=k) for k in (0, 1)]
        slow, answers, stop, refusals = [], {"fine": [], "hung": []}, [False], []

        def send(node, conv, what):
            with node.session() as s:
                i = 0
                while not stop[0]:
                    t0 = time.time()
                    st, _, js = s.request("POST", "/v1/conversations/%s/messages" % conv,
                                          {"sender": "bot", "body": {}},
                                          headers={"Idempotency-Key": "%s-%d-%d" % (what, node.port, i)})
                    answers[what].append((st, time.time() - t0))
                    if st != 201 and what == "fine":
                        refusals.append(js)
                    if st == 201:
                        i += 1
        import threading
        threads = [threading.Thread(target=send, args=(a, hung, "hung")),
                   threading.Thread(target=send, args=(b, hung, "hung"))] + \
            [threading.Thread(target=send, args=(n, c, "fine")) for n in (a, b) for c in fine]
        for n in (a, b):  # connections to it are open when it hangs: its calls wait, not fail
            for i in range(5):
                n.send(hung, {"warm": i})
                n.send(fine[0], {"warm": i})
        self.sh.pgs[2].freeze()
        try:
            for t in threads:
                t.start()
            end = time.time() + 6
            while time.time() < end:
                for n in (a, b):
                    st, _, _ = n.request("GET", "/readyz", key=None)
                    if st != 200:
                        slow.append(("readyz", n.node_id, st))
                time.sleep(0.2)
        finally:
            stop[0] = True
            for t in threads:
                t.join(timeout_ms / 1000 + 10)
            self.sh.pgs[2].thaw()
        self.assertEqual(slow, [])
        fine_st = [st for st, _ in answers["fine"]]
        self.assertGreater(len(fine_st), 20)
        self.assertEqual(set(fine_st), {201}, refusals[:5])
        worst = max(t for _, t in answers["fine"])
        # waiting for the hung one would take its whole store timeout; the
        # margin is for a loaded 2-core machine
        self.assertLess(worst, timeout_ms / 1000 * 2 / 3, "a healthy shard's send waited for the hung one")
        hung_st = [st for st, _ in answers["hung"]]
        self.assertIn(503, hung_st)
        self.assertLess(max(t for _, t in answers["hung"]), timeout_ms / 1000 + 2)
        print("hung shard: %d sends to the others, slowest %.0f ms; %d to it, %d refused"
              % (len(fine_st), worst * 1000, len(hung_st), hung_st.count(503)))

    def test_a_bus_instance_down_is_replaced_by_head_polls(self):
        a, b = self.nodes(2)
        conv = self.sh.conv_on(a, bus=1)

        async def go():
            c, _ = await open_client(b, mint_token("ivy", [conv]), [{"conv": conv, "watermark": 0}])
            a.send(conv, {"n": 0})
            self.assertEqual([s for s, _ in await recv_seqs(c, conv, 1)], [1])
            self.sh.redis[1].kill()
            try:
                # nobody hears the bus: b reads the head from the store
                for i in range(1, 6):
                    a.send(conv, {"n": i})
                got = await recv_seqs(c, conv, 5, timeout=10)
                self.assertEqual([s for s, _ in got], [2, 3, 4, 5, 6])
                self.assertGreater(metric(b, "converger_bus_head_polls_total", {"reason": "down"}), 0)
                self.assertEqual(metric(b, "converger_bus_up", {"instance": "1"}), 0)
                st, _, _ = b.request("GET", "/readyz", key=None)
                self.assertEqual(st, 200)
            finally:
                self.sh.redis[1].up()
            # back: subscribed again, live again
            deadline = time.time() + 10
            while metric(b, "converger_bus_up", {"instance": "1"}) != 1 and time.time() < deadline:
                await asyncio.sleep(0.1)
            self.assertEqual(metric(b, "converger_bus_up", {"instance": "1"}), 1)
            await asyncio.sleep(0.3)  # its SUBSCRIBE confirmed
            before = metric(b, "converger_delivery_latency_ms_count", {"path": "bus"})
            a.send(conv, {"n": 6})
            got = await recv_seqs(c, conv, 1)
            self.assertEqual([s for s, _ in got], [7])
            self.assertEqual(metric(b, "converger_delivery_latency_ms_count", {"path": "bus"}), before + 1)
            await c.expect_silence(0.3)
            await c.close()
        self.arun(go(), timeout=40)
        self.assertIn("lost", b.log_text())

    def test_a_commit_without_its_publish_is_found_by_the_head_check(self):
        """A message committed by a node that died before its PUBLISH:
        written here straight into its shard, as that commit would have."""
        a, b = self.nodes(2, {"CONVERGER_BUS_CHECK_MS": "1000"})
        conv = self.sh.conv_on(a)
        pg = self.sh.pgs[self.sh.instance_of(conv)]

        async def go():
            c, _ = await open_client(b, mint_token("kay", [conv]), [{"conv": conv, "watermark": 0}])
            a.send(conv, {"n": 1})
            self.assertEqual([s for s, _ in await recv_seqs(c, conv, 1)], [1])
            pg.sql("WITH m AS (INSERT INTO messages (conv, seq, id, sender, body, ts_ms)"
                   " VALUES ('%s', 2, 'lost-publish', 'bot', '{\"n\": 2}', 0) RETURNING 1)"
                   " UPDATE conversations SET head = 2 WHERE id = '%s'" % (conv, conv))
            t0 = time.time()
            got = await recv_seqs(c, conv, 1, timeout=10)
            self.assertEqual([s for s, _ in got], [2])
            self.assertEqual(got[0][1], {"n": 2})
            self.assertLess(time.time() - t0, 5)  # the check period, one job, a fill
            await c.close()
        self.arun(go())
        self.assertGreater(metric(b, "converger_bus_head_polls_total", {"reason": "idle"}), 0)

    def test_presence_and_user_controls_across_nodes(self):
        a, b = self.nodes(2)
        ch = a.create_channel(presence=True)["id"]
        conv = self.sh.conv_on(a, channel=ch)

        async def go():
            tok_x, tok_y = mint_token("xena", [conv]), mint_token("yuri", [conv])
            x, _ = await open_client(a, tok_x, [{"conv": conv, "watermark": None, "presenceEvents": True}])
            y, _ = await open_client(b, tok_y, [{"conv": conv, "watermark": None}])
            m, _ = await x.until(lambda m: m.get("type") == "join" and m.get("user") == "yuri")
            self.assertEqual(m["conv"], conv)
            st, _, js = a.request("POST", "/admin/users/yuri/disconnect", {"code": 4002})
            self.assertEqual(st, 202, js)
            code, _, _ = await y.wait_closed(timeout=5)
            self.assertEqual(code, 4002)
            await x.close()
        self.arun(go())


if __name__ == "__main__":
    harness.main()
