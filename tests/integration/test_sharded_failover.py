"""A sharded cluster's failures that need a topology of their own:

- a shard's primary is SIGKILLed under REST senders and its synchronous
  standby promoted (scripts/pg-tmp standby, promote; the shard map names
  the pair's libpq multi-host URL): every acknowledged message is readable
  afterwards, each conversation is gapless, and each subscriber gets every
  message once, in order;
- the control database is down: sends, delivery and hellos go on, what
  needs the control database (a new channel, a revocation) is 503, and
  /readyz stays 200 (docs/operations.md, "Scaling out")."""

import asyncio
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import Senders, Follower, NodeCase, Sharded, mint_token, open_client, recv_seqs  # noqa: E402


class PrimaryFailover(NodeCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        # durable: the test is about acknowledged commits surviving a crash
        cls.sh = Sharded(instances=2, bus=1, durable=True, standby=1)
        cls.addClassCleanup(cls.sh.stop)

    def test_primary_killed_standby_promoted_nothing_acknowledged_lost(self):
        a, b = [self.node_start(self.sh.env()) for _ in range(2)]
        ch = a.create_channel()["id"]
        convs = [self.sh.conv_on(a, instance=k % 2, channel=ch) for k in range(6)]
        followers = [Follower([b, a], c) for c in convs]

        async def follow(until_done):
            await asyncio.gather(*(f.run(lambda w, f=f: until_done(f, w)) for f in followers))

        with Senders([a, b], convs) as senders:
            time.sleep(1.0)
            before = {c: len(v) for c, v in senders.acked.items()}
            self.sh.pgs[1].kill()  # the primary of instance 1, its standby still up
            time.sleep(0.5)
            self.sh.standby.promote()
            deadline = time.time() + 20  # every sender acknowledged again after the promotion
            while time.time() < deadline and not all(
                    len(senders.acked[c]) >= before[c] + 5 for c in convs):
                time.sleep(0.2)
        for c in convs:
            self.assertGreaterEqual(len(senders.acked[c]), before[c] + 5,
                                    "%s (instance %d)" % (c, self.sh.instance_of(c)))
        self.assertGreater(sum(senders.refused.values()), 0)  # the failover was seen
        # every acknowledged message is there, gapless, once
        for c in convs:
            rows, head = a.all_messages(c)
            self.assertEqual(head, len(rows), c)
            seqs = [m["seq"] for m in rows]
            self.assertEqual(seqs, list(range(1, len(seqs) + 1)), c)
            self.assertEqual(len({m["id"] for m in rows}), len(rows), c)
            self.assertTrue(set(senders.acked[c]) <= set(seqs), c)
            self.assertEqual(len(rows), len(senders.acked[c]), c)  # nothing stored unanswered
        heads = {c: len(senders.acked[c]) for c in convs}
        self.arun(follow(lambda f, w: w >= heads[f.conv]), timeout=60)
        for f in followers:
            self.assertEqual(f.delivered, list(range(1, heads[f.conv] + 1)), f.conv)
        print("failover: %d acknowledged, 0 lost, %d refused during it, %d duplicates on the wire"
              % (sum(heads.values()), sum(senders.refused.values()), sum(f.dups for f in followers)))


class ControlDown(NodeCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.sh = Sharded(instances=2, bus=1, control=True)
        cls.addClassCleanup(cls.sh.stop)

    def test_control_database_down(self):
        a, b = [self.node_start(self.sh.env()) for _ in range(2)]
        ch = a.create_channel()["id"]
        conv = self.sh.conv_on(a, instance=0, channel=ch)
        other = self.sh.conv_on(a, instance=1, channel=ch)
        self.sh.control.down()
        try:
            async def go():
                # hellos, sends and delivery need only the shards
                c, welcome = await open_client(b, mint_token("ann", [conv, other]),
                                               [{"conv": conv, "watermark": 0},
                                                {"conv": other, "watermark": 0}])
                self.assertEqual(sorted(s["conv"] for s in welcome["subs"]), sorted([conv, other]))
                self.assertEqual(a.send(conv, {"n": 1})["seq"], 1)
                self.assertEqual(a.send(other, {"n": 1})["seq"], 1)
                got = await recv_seqs(c, conv, 1)
                self.assertEqual([s for s, _ in got], [1])
                got = await recv_seqs(c, other, 1)
                self.assertEqual([s for s, _ in got], [1])
                # a conversation of a channel its instance has a copy of
                st, _, js = a.request("POST", "/v1/conversations", {"channel": ch})
                self.assertEqual(st, 201, js)
                await c.close()
            self.arun(go())
            # what the control database holds waits for it
            st, _, js = a.request("POST", "/v1/channels", {"name": "later"})
            self.assertEqual(st, 503, js)
            self.assertErrorBody(js, "unavailable")
            st, _, js = a.request("POST", "/v1/tokens/revoke", {"jti": "j1", "exp": int(time.time()) + 60})
            self.assertEqual(st, 503, js)
            time.sleep(1.5)  # a heartbeat or two fail meanwhile
            for n in (a, b):
                st, _, js = n.request("GET", "/readyz", key=None)
                self.assertEqual(st, 200, js)
        finally:
            self.sh.control.up()
        deadline = time.time() + 10
        while True:
            st, _, js = a.request("POST", "/v1/channels", {"name": "later"})
            if st == 201 or time.time() > deadline:
                break
            time.sleep(0.2)
        self.assertEqual(st, 201, js)


if __name__ == "__main__":
    harness.main()
