"""Moving a logical shard to another instance (`converger shards move`,
src/cli/shards_move.c) and adding an instance (`converger shards
add-instance`), on a sharded cluster of 2 PostgreSQL instances and 2
nodes:

- under REST senders with idempotency keys (a 503 is sent again with the
  same id) to conversations of the shard being moved and of other shards,
  and a subscriber per conversation following them: every acknowledged
  message is afterwards readable, gapless, stored once and delivered once;
  the moved conversations' rows are on the target (read with psql) and no
  longer on the source, which marks the shard moved; the other shards'
  senders never saw a 503; the freeze of a shard of a few hundred
  messages is under a second (printed);
- the guard alone: a shard whose lock a session holds refuses its writes
  at once with 503 and Retry-After while the other shards' go on, and an
  instance that marks a shard moved while the map still names it refuses
  them too;
- an instance added with add-instance gets a shard moved onto it, and the
  nodes write there."""

import asyncio
import os
import re
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import Senders, Follower, NodeCase, PgCluster, Sharded, binary, shard_of, uid  # noqa: E402


def shards(control_url, *args):
    """`converger shards ARGS --database-url CONTROL`: (status, stdout, stderr)."""
    r = subprocess.run([binary(), "shards", *args, "--database-url", control_url],
                       capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout, r.stderr


class Following:
    """A Follower per conversation, run in a thread of its own while the
    test sends; finish(heads) waits until each has delivered its head."""

    def __init__(self, nodes, convs):
        self.followers = [Follower(nodes, c) for c in convs]
        self.heads = None
        self.error = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        def until(f, w):
            return self.heads is not None and w >= self.heads[f.conv]

        async def go():
            await asyncio.gather(*(f.run(lambda w, f=f: until(f, w)) for f in self.followers))
        try:
            asyncio.run(go())
        except BaseException as e:  # reported by finish
            self.error = e

    def finish(self, heads, timeout=60):
        self.heads = heads
        self.thread.join(timeout)
        if self.error:
            raise self.error
        if self.thread.is_alive():
            raise AssertionError("followers did not reach the heads %r: %r" % (
                heads, {f.conv: (f.watermark, f.welcomes, f.nodes_used[-3:], f.errors[-2:])
                        for f in self.followers}))
        return self.followers


def one(pg, sql):
    """The one value of `sql`'s one row on PgCluster `pg`, as an int."""
    rows = pg.sql(sql)
    assert len(rows) == 1, rows
    return int(rows[0])


def convs_of_shard(node, ch, shard, n):
    """`n` new conversations of logical shard `shard`, created through `node`."""
    out = []
    while len(out) < n:
        c = uid("mv")
        if shard_of(c) == shard:
            node.create_conv(ch, c)
            out.append(c)
    return out


class ShardMove(NodeCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.sh = Sharded(instances=2, bus=1)
        cls.addClassCleanup(cls.sh.stop)

    def rows_on(self, pg, conv):
        return one(pg, "SELECT count(*) FROM messages WHERE conv = '%s'" % conv)

    def test_move_under_senders(self):
        sh = self.sh
        a, b = [self.node_start(sh.env()) for _ in range(2)]
        ch = a.create_channel()["id"]
        shard = 10  # on instance 0 (k mod 2)
        self.assertEqual(shard % 2, 0)
        moving = convs_of_shard(a, ch, shard, 3)
        others = [sh.conv_on(a, instance=k % 2, channel=ch) for k in range(4)]
        others = [c for c in others if shard_of(c) != shard]
        # a few hundred messages in the shard before the move
        for k in range(300):
            st, _, js = a.request("POST", "/v1/conversations/%s/messages" % moving[k % 3],
                                  {"id": "pre%d" % k, "sender": "bot", "body": {"k": k}})
            self.assertEqual(st, 201, js)
        pre = {c: 100 for c in moving}
        following = Following([b, a], moving + others)
        with Senders([a, b], moving + others) as senders:
            time.sleep(1.0)
            st, out, err = shards(sh.control_url, "move", str(shard), "--to", "1")
            sys.stdout.write(out)
            self.assertEqual(st, 0, out + err)
            time.sleep(1.5)  # sends go on after the move, on the target
        m = re.search(r"frozen for (\d+) ms", out)
        self.assertIsNotNone(m, out)
        frozen = int(m.group(1))
        self.assertLess(frozen, 1000, out)
        self.assertEqual(senders.other, [])
        self.assertEqual(senders.no_hint, 0)
        for c in others:
            self.assertEqual(senders.refused[c], 0, "%s (shard %d)" % (c, shard_of(c)))
        heads = {}
        for c in moving + others:
            rows, head = a.all_messages(c)
            seqs = [r["seq"] for r in rows]
            self.assertEqual(seqs, list(range(1, head + 1)), c)
            self.assertEqual(len({r["id"] for r in rows}), len(rows), c)
            extra = pre.get(c, 0)
            self.assertEqual(len(rows), extra + len(senders.acked[c]), c)  # nothing unanswered
            self.assertTrue(set(senders.acked[c]) <= set(seqs), c)
            self.assertGreater(len(senders.acked[c]), 5, c)
            heads[c] = head
        for c in moving:  # served from the target, gone from the source
            self.assertEqual(self.rows_on(sh.pgs[1], c), heads[c], c)
            self.assertEqual(self.rows_on(sh.pgs[0], c), 0, c)
            self.assertEqual(one(sh.pgs[1], "SELECT head FROM conversations WHERE id = '%s'" % c),
                             heads[c])
        self.assertEqual(one(sh.pgs[0], "SELECT instance FROM shard_moved WHERE shard = %d" % shard),
                         1)
        self.assertEqual(one(sh.pgs[0], "SELECT instance FROM shard_map WHERE shard = %d" % shard),
                         1)
        for f in following.finish(heads):
            self.assertEqual(f.delivered, list(range(1, heads[f.conv] + 1)), f.conv)
        print("move: frozen %d ms; %d acknowledged in the moved shard (%d refused during the "
              "freeze, sent again), %d in the others (0 refused)"
              % (frozen, sum(len(senders.acked[c]) for c in moving),
                 sum(senders.refused[c] for c in moving),
                 sum(len(senders.acked[c]) for c in others)))

    def test_guard_frozen_and_moved(self):
        """The guard alone: while a session holds the shard's lock (what the
        mover holds), its sends get 503 with Retry-After at once and the
        other shards' go on; an instance that marks the shard moved while
        the map still names it (a move stopped between its steps 4 and 5)
        refuses its writes the same way, never takes them."""
        sh = self.sh
        a = self.node_start(sh.env())
        ch = a.create_channel()["id"]
        shard = 12  # on instance 0
        conv = convs_of_shard(a, ch, shard, 1)[0]
        other = convs_of_shard(a, ch, 14, 1)[0]  # instance 0 too
        self.assertEqual(a.send(conv, {"n": 1})["seq"], 1)
        holder = subprocess.Popen([harness.psql(), "-X", "-At", "-d", sh.pgs[0].url],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            holder.stdin.write("SELECT pg_advisory_lock(1129207379, %d);\n" % shard)
            holder.stdin.flush()
            self.assertEqual(holder.stdout.readline().strip(), "")  # granted
            t0 = time.time()
            st, hdr, js = a.request("POST", "/v1/conversations/%s/messages" % conv,
                                    {"id": "f1", "sender": "bot", "body": {}})
            self.assertEqual(st, 503, js)
            self.assertIn("retry-after", hdr)
            self.assertLess(time.time() - t0, 1.0)  # at once, not after a lock wait
            self.assertEqual(a.send(other, {"n": 1})["seq"], 1)
        finally:
            holder.stdin.close()
            holder.wait(10)
        st, _, js = a.request("POST", "/v1/conversations/%s/messages" % conv,
                              {"id": "f1", "sender": "bot", "body": {}})
        self.assertEqual(st, 201, js)
        self.assertEqual(js["seq"], 2)
        sh.pgs[0].sql("INSERT INTO shard_moved (shard, instance) VALUES (%d, 1)" % shard)
        try:
            st, hdr, js = a.request("POST", "/v1/conversations/%s/messages" % conv,
                                    {"id": "f2", "sender": "bot", "body": {}})
            self.assertEqual(st, 503, js)
            self.assertIn("retry-after", hdr)

            async def stale_read():
                # a hello's read of a moved shard on its old instance is not
                # served from the frozen copy either: unavailable, retry later
                c = await harness.WsClient.connect(a)
                await c.send_json({"type": "hello", "token": harness.mint_token("r", [conv, other]),
                                   "subs": [{"conv": conv, "watermark": 5}, {"conv": other, "watermark": 0}]})
                welcome, seen = await c.until(lambda m: m.get("type") == "welcome")
                await c.close()
                return welcome, seen
            welcome, seen = asyncio.run(stale_read())
            self.assertEqual([x["conv"] for x in welcome["subs"]], [other])
            errs = [m for m in seen if m.get("type") == "error"]
            self.assertEqual([(m["code"], m["conv"]) for m in errs], [("unavailable", conv)])
        finally:
            sh.pgs[0].sql("DELETE FROM shard_moved WHERE shard = %d" % shard)
        self.assertEqual(self.rows_on(sh.pgs[0], conv), 2)
        self.assertEqual(a.send(conv, {"n": 3})["seq"], 3)

    def test_usage_errors(self):
        sh = self.sh
        st, _, err = shards(sh.control_url, "move", "300", "--to", "1")
        self.assertEqual(st, 2, err)
        st, _, err = shards(sh.control_url, "move", "7", "--to", "9")
        self.assertEqual(st, 2, err)
        self.assertIn("no instance 9", err)
        st, _, err = shards(sh.control_url, "move", "7", "--to", "1")  # 7 is on instance 1
        self.assertEqual(st, 2, err)
        self.assertIn("already", err)
        st, _, err = shards(sh.control_url, "add-instance", "sqlite:x.db")
        self.assertEqual(st, 2, err)
        st, _, err = shards(sh.control_url, "add-instance", sh.urls[1])
        self.assertEqual(st, 2, err)
        self.assertIn("already", err)


class AddInstance(NodeCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.sh = Sharded(instances=2, bus=1)
        cls.addClassCleanup(cls.sh.stop)

    def test_add_instance_and_move_onto_it(self):
        sh = self.sh
        extra = PgCluster()
        self.addCleanup(extra.stop)
        a, b = [self.node_start(sh.env()) for _ in range(2)]
        ch = a.create_channel()["id"]
        shard = 5  # on instance 1
        conv = convs_of_shard(a, ch, shard, 1)[0]
        for k in range(20):
            self.assertEqual(b.send(conv, {"k": k})["seq"], k + 1)
        st, out, err = shards(sh.control_url, "add-instance", extra.url)
        self.assertEqual(st, 0, out + err)
        self.assertIn("instance 2", out)
        st, out, err = shards(sh.control_url, "move", str(shard), "--to", "2")
        self.assertEqual(st, 0, out + err)
        sys.stdout.write(out)
        self.assertIn("every live node (2)", out)
        for k in range(20, 30):
            self.assertEqual([a, b][k % 2].send(conv, {"k": k})["seq"], k + 1)
        self.assertEqual(one(extra, "SELECT count(*) FROM messages WHERE conv = '%s'" % conv), 30)
        self.assertEqual(one(sh.pgs[1], "SELECT count(*) FROM messages WHERE conv = '%s'" % conv), 0)
        rows, head = b.all_messages(conv)
        self.assertEqual([r["seq"] for r in rows], list(range(1, 31)))
        st, out, err = shards(sh.control_url, "show")
        self.assertEqual(st, 0, err)
        line = [x for x in out.splitlines() if x.startswith("2 ")]
        self.assertEqual(len(line), 1, out)
        self.assertEqual(line[0].split()[1], "1", out)  # one logical shard on it


if __name__ == "__main__":
    harness.main()
