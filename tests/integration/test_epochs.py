"""Epochs and resets (docs/protocol.md, "Epochs and resets") against a real
node: a resume whose watermark is above the head, or in another epoch, is
answered with `reset` and never silently clamped; the client library and
`converger tail` report it and deliver every message sent after it; a
restored SQLite backup (with and without `converger epoch rotate`) is
noticed by a client that resumes into it."""

import json
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import NodeCase, PgCluster, WsClient, mint_token  # noqa: E402
from test_client_sdk import Tail  # noqa: E402

EPOCH = re.compile(r"^[0-9a-f]{8}$")


def texts(tail):
    """(seq, body's "n", epoch) of each msg line tail printed."""
    out = []
    with tail.cond:
        for line in tail.lines:
            m = json.loads(line)
            out.append((m["seq"], m["body"]["n"], m.get("epoch")))
    return out


class Epochs(NodeCase):
    def start_tail(self, args):
        t = Tail(args)
        self.addCleanup(t.stop)
        return t

    def reset_lines(self, tail):
        with tail.cond:
            return [l for l in tail.err if "reset on" in l]

    def metric(self, node, name, labels):
        st, _, text = node.get_text("/metrics")
        self.assertEqual(st, 200)
        for line in text.splitlines():
            if line.startswith(name + "{" + labels + "}"):
                return float(line.split()[-1])
        return 0.0

    # -- the protocol, with a client we did not write -------------------------

    def test_hello_and_sync_above_the_head_or_in_another_epoch_get_reset(self):
        n = self.node_start()
        conv = n.new_conv()
        for i in range(3):
            n.send(conv, {"n": i + 1})
        head = n.get("/v1/conversations/" + conv, key=harness.API_KEY)[2]
        self.assertEqual(head["head"], 3)
        epoch = head["epoch"]
        self.assertRegex(epoch, EPOCH)
        tok = mint_token("u", [conv])

        async def run():
            # watermark above the head: reset, from the head, nothing replayed
            ws = await WsClient.connect(n)
            w = await ws.hello(tok, [{"conv": conv, "watermark": 10}])
            self.assertEqual(w["subs"][0]["head"], 3)
            self.assertEqual(w["subs"][0]["epoch"], epoch)
            self.assertIs(w["subs"][0].get("reset"), True)
            msgs, synced = await ws.until_synced(conv)
            self.assertEqual(msgs, [])
            self.assertEqual(synced["head"], 3)
            self.assertEqual(synced["epoch"], epoch)
            n.send(conv, {"n": 4})
            m = (await ws.recv_msgs(1))[0]
            self.assertEqual((m["seq"], m["epoch"], m["body"]), (4, epoch, {"n": 4}))
            # a sync in another epoch: synced with reset, at the head
            await ws.send_json({"type": "sync", "conv": conv, "watermark": 2, "epoch": "00000000"})
            msgs, synced = await ws.until_synced(conv)
            self.assertEqual(msgs, [])
            self.assertEqual((synced["head"], synced["epoch"], synced.get("reset")), (4, epoch, True))
            # a sync above the head: the same
            await ws.send_json({"type": "sync", "conv": conv, "watermark": 9})
            msgs, synced = await ws.until_synced(conv)
            self.assertEqual((synced["head"], synced.get("reset")), (4, True))
            # a sync in the right epoch replays, without reset
            await ws.send_json({"type": "sync", "conv": conv, "watermark": 2, "epoch": epoch})
            msgs, synced = await ws.until_synced(conv)
            self.assertEqual([m["seq"] for m in msgs], [3, 4])
            self.assertNotIn("reset", synced)
            await ws.ws.close()

            # a hello in another epoch, below the head: reset too
            ws = await WsClient.connect(n)
            w = await ws.hello(tok, [{"conv": conv, "watermark": 1, "epoch": "ffffffff"}])
            self.assertIs(w["subs"][0].get("reset"), True)
            msgs, synced = await ws.until_synced(conv)
            self.assertEqual(msgs, [])
            await ws.ws.close()

            # version 1 clients: a watermark at or below the head, no epoch,
            # is replayed as before, and the welcome has no reset
            ws = await WsClient.connect(n)
            w = await ws.hello(tok, [{"conv": conv, "watermark": 1}])
            self.assertNotIn("reset", w["subs"][0])
            msgs, _ = await ws.until_synced(conv)
            self.assertEqual([m["seq"] for m in msgs], [2, 3, 4])
            # a bad epoch is a bad request; the connection stays
            await ws.send_json({"type": "sync", "conv": conv, "watermark": 1, "epoch": 12})
            err = await ws.recv_json()
            self.assertEqual((err["type"], err["code"]), ("error", "bad_request"))
            await ws.send_json({"type": "ping"})
            self.assertEqual((await ws.recv_json())["type"], "pong")
            await ws.ws.close()

        self.arun(run(), 30)
        self.assertEqual(self.metric(n, "converger_resets_total", 'reason="ahead"'), 2)
        self.assertEqual(self.metric(n, "converger_resets_total", 'reason="epoch"'), 2)

    def test_a_rotation_under_a_live_subscriber_loses_nothing(self):
        # The epoch is rotated while a subscriber is live (nothing was
        # restored): the next message comes in the new epoch, with the next
        # seq, and a sync in the new epoch replays without a reset.
        n = self.node_start()
        conv = n.new_conv()
        for i in range(3):
            n.send(conv, {"n": i + 1})
        tok = mint_token("u", [conv])
        db = os.path.join(n.tmpdir, "converger.db")

        async def run():
            ws = await WsClient.connect(n)
            w = await ws.hello(tok, [{"conv": conv, "watermark": 0}])
            old = w["subs"][0]["epoch"]
            await ws.until_synced(conv)
            r = subprocess.run([harness.binary(), "epoch", "rotate", "--database-url", "sqlite:" + db],
                               capture_output=True, text=True, timeout=20, cwd=n.tmpdir,
                               env={k: v for k, v in os.environ.items() if not k.startswith("CONVERGER_")})
            self.assertEqual(r.returncode, 0, r.stderr)
            n.send(conv, {"n": 4})
            m = (await ws.recv_msgs(1))[0]
            self.assertEqual(m["seq"], 4)
            self.assertNotEqual(m["epoch"], old)
            await ws.send_json({"type": "sync", "conv": conv, "watermark": 2, "epoch": m["epoch"]})
            msgs, synced = await ws.until_synced(conv)
            self.assertEqual([x["seq"] for x in msgs], [3, 4])
            self.assertNotIn("reset", synced)
            await ws.ws.close()

        self.arun(run(), 30)

    # -- the client library, through converger tail -----------------------------

    def test_tail_with_a_watermark_above_the_head_prints_every_new_message(self):
        # The defects issue's repro: 3 messages, tail --watermark 10, 9 more.
        n = self.node_start()
        conv = n.new_conv()
        for i in range(3):
            n.send(conv, {"n": i + 1})
        tail = self.start_tail(["--url", n.ws_url, "--token", mint_token("u", [conv]),
                                "--conv", conv, "--watermark", "10"])
        self.assertTrue(tail.wait_for(lambda: self.reset_lines(tail), 10), tail.stderr_text())
        line = self.reset_lines(tail)[0]
        self.assertIn("watermark 10", line)
        self.assertIn("head 3", line)
        for i in range(4, 13):
            n.send(conv, {"n": i})
        self.assertTrue(tail.wait_for(lambda: len(tail.lines) >= 9, 10), tail.stderr_text())
        self.assertEqual(tail.stop(), 0)
        got = texts(tail)
        self.assertEqual([(s, b) for s, b, _ in got], [(i, i) for i in range(4, 13)])
        summary = [l for l in tail.err if "message(s); attempts" in l][0]
        self.assertIn("duplicates dropped 0", summary)
        self.assertIn("resets 1", summary)

    def _restored_backup(self):
        """A node on SQLite; the file copied at head 3 with the node
        stopped; sent to 10; the copy put back and `converger epoch rotate`
        run on it (docs/operations.md), the node started again. Returns
        (node, conv, the epoch before the rotation)."""
        n = self.node_start()
        conv = n.new_conv()
        for i in range(1, 4):
            n.send(conv, {"n": i})
        old_epoch = n.get("/v1/conversations/" + conv, key=harness.API_KEY)[2]["epoch"]
        db = os.path.join(n.tmpdir, "converger.db")
        backup = os.path.join(n.tmpdir, "backup")
        os.mkdir(backup)
        self.assertEqual(n.stop(), 0)
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(db + suffix):
                shutil.copy2(db + suffix, os.path.join(backup, "converger.db" + suffix))
        n.start()
        for i in range(4, 11):
            n.send(conv, {"n": i})
        self.assertEqual(n.stop(), 0)
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(db + suffix):
                os.remove(db + suffix)
            if os.path.exists(os.path.join(backup, "converger.db" + suffix)):
                shutil.copy2(os.path.join(backup, "converger.db" + suffix), db + suffix)
        r = subprocess.run([harness.binary(), "epoch", "rotate", "--database-url", "sqlite:" + db],
                           capture_output=True, text=True, timeout=20, cwd=n.tmpdir,
                           env={k: v for k, v in os.environ.items() if not k.startswith("CONVERGER_")})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("new epoch for 1 conversation(s)", r.stdout)
        n.start()
        return n, conv, old_epoch

    def test_restored_backup_is_a_reset_for_a_client_that_resumes_into_it(self):
        # tail follows 1..10, the node is stopped, its SQLite file replaced
        # by the copy taken at head 3, and started again: tail resumes with
        # watermark 10, is told to reset at 3, and prints everything after.
        n = self.node_start()
        conv = n.new_conv()
        for i in range(1, 4):
            n.send(conv, {"n": i})
        db = os.path.join(n.tmpdir, "converger.db")
        self.assertEqual(n.stop(), 0)
        backup = {}
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(db + suffix):
                with open(db + suffix, "rb") as f:
                    backup[suffix] = f.read()
        n.start()
        tail = self.start_tail(["--url", n.ws_url, "--token", mint_token("u", [conv]),
                                "--conv", conv, "--watermark", "0"])
        for i in range(4, 11):
            n.send(conv, {"n": i})
        self.assertTrue(tail.wait_for(lambda: len(tail.lines) >= 10, 10), tail.stderr_text())
        old_epoch = texts(tail)[-1][2]
        self.assertRegex(old_epoch, EPOCH)
        self.assertEqual(n.stop(), 0)
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(db + suffix):
                os.remove(db + suffix)
        for suffix, data in backup.items():
            with open(db + suffix, "wb") as f:
                f.write(data)
        n.start()
        self.assertTrue(tail.wait_for(lambda: self.reset_lines(tail), 20), tail.stderr_text())
        self.assertIn("watermark 10 (epoch %s)" % old_epoch, self.reset_lines(tail)[0])
        self.assertIn("head 3", self.reset_lines(tail)[0])
        for i in range(101, 106):
            n.send(conv, {"n": i})
        self.assertTrue(tail.wait_for(lambda: len(tail.lines) >= 15, 10), tail.stderr_text())
        self.assertEqual(tail.stop(), 0)
        got = texts(tail)
        self.assertEqual([b for _, b, _ in got], list(range(1, 11)) + list(range(101, 106)))
        self.assertEqual([s for s, _, _ in got[10:]], [4, 5, 6, 7, 8])

    def test_rotated_epoch_resets_a_resume_even_when_the_head_passed_the_watermark(self):
        # The copy is put back and `converger epoch rotate` run, as
        # docs/operations.md says; then more is sent than was lost, so the
        # head (11) passes the client's watermark (10): only the epoch tells.
        n, conv, old_epoch = self._restored_backup()
        st, _, js = n.get("/v1/conversations/" + conv, key=harness.API_KEY)
        new_epoch = js["epoch"]
        self.assertRegex(new_epoch, EPOCH)
        self.assertNotEqual(new_epoch, old_epoch)
        self.assertEqual(js["head"], 3)
        for i in range(101, 109):
            n.send(conv, {"n": i})
        # watermark 10 and the epoch a client kept with it, from before
        tail = self.start_tail(["--url", n.ws_url, "--token", mint_token("u", [conv]),
                                "--conv", conv, "--watermark", "10", "--epoch", old_epoch])
        self.assertTrue(tail.wait_for(lambda: self.reset_lines(tail), 10), tail.stderr_text())
        line = self.reset_lines(tail)[0]
        self.assertIn("head 11, epoch %s" % new_epoch, line)
        n.send(conv, {"n": 200})
        self.assertTrue(tail.wait_for(lambda: len(tail.lines) >= 1, 10), tail.stderr_text())
        self.assertEqual(tail.stop(), 0)
        self.assertEqual(texts(tail), [(12, 200, new_epoch)])


class EpochsPg(NodeCase):
    """Two nodes on one PostgreSQL: frames fanned out by NOTIFY (and, when
    too large for it, read back from the store) carry the epoch, and a
    rotation while the nodes run is what every node serves next."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.pg = PgCluster()
        cls.addClassCleanup(cls.pg.stop)

    def test_epoch_crosses_nodes_and_a_rotation_resets_resumes(self):
        env = {"CONVERGER_DATABASE_URL": self.pg.url}
        a, b = self.node_start(env), self.node_start(env)
        conv = a.new_conv()
        epoch = a.get("/v1/conversations/" + conv, key=harness.API_KEY)[2]["epoch"]
        self.assertRegex(epoch, EPOCH)
        tok = mint_token("u", [conv])

        async def run():
            ws = await WsClient.connect(b)
            w = await ws.hello(tok, [{"conv": conv, "watermark": 0}])
            self.assertEqual(w["subs"][0]["epoch"], epoch)
            await ws.until_synced(conv)
            a.send(conv, {"n": 1})                  # in the NOTIFY payload
            a.send(conv, {"n": 2, "pad": "x" * 9000})  # too large for it: read from the store
            got = await ws.recv_msgs(2)
            self.assertEqual([(m["seq"], m["epoch"]) for m in got], [(1, epoch), (2, epoch)])
            r = subprocess.run([harness.binary(), "epoch", "rotate", "--conv", conv,
                                "--database-url", self.pg.url],
                               capture_output=True, text=True, timeout=20,
                               env={k: v for k, v in os.environ.items() if not k.startswith("CONVERGER_")})
            self.assertEqual(r.returncode, 0, r.stderr)
            new = a.get("/v1/conversations/" + conv, key=harness.API_KEY)[2]["epoch"]
            self.assertNotEqual(new, epoch)
            a.send(conv, {"n": 3})
            m = (await ws.recv_msgs(1))[0]
            self.assertEqual((m["seq"], m["epoch"]), (3, new))
            await ws.ws.close()
            ws = await WsClient.connect(a)
            w = await ws.hello(tok, [{"conv": conv, "watermark": 2, "epoch": epoch}])
            self.assertEqual((w["subs"][0]["head"], w["subs"][0]["epoch"], w["subs"][0].get("reset")),
                             (3, new, True))
            await ws.ws.close()

        self.arun(run(), 30)
        r = subprocess.run([harness.binary(), "epoch", "rotate", "--conv", "no-such-conv",
                            "--database-url", self.pg.url], capture_output=True, text=True, timeout=20,
                           env={k: v for k, v in os.environ.items() if not k.startswith("CONVERGER_")})
        self.assertEqual(r.returncode, 1)
        self.assertIn('no conversation "no-such-conv"', r.stderr)


    def test_a_store_restored_under_live_subscribers_restarts_them_at_the_new_history(self):
        # The nodes keep running while the history is cut back to seq 3 (as
        # a point-in-time restore would) and the epoch rotated: subscribers
        # that had 1..6 get the new seq 4, 5 (in the new epoch), not nothing
        # until the head passes 6 again.
        env = {"CONVERGER_DATABASE_URL": self.pg.url}
        a, b = self.node_start(env), self.node_start(env)
        conv = a.new_conv()
        for i in range(1, 7):
            a.send(conv, {"n": i})
        old = a.get("/v1/conversations/" + conv, key=harness.API_KEY)[2]["epoch"]
        tok = mint_token("u", [conv])

        async def run():
            ws = await WsClient.connect(b)
            await ws.hello(tok, [{"conv": conv, "watermark": 0}])
            msgs, _ = await ws.until_synced(conv)
            self.assertEqual([m["seq"] for m in msgs], [1, 2, 3, 4, 5, 6])
            self.pg.sql("BEGIN; DELETE FROM messages WHERE conv = '%s' AND seq > 3;"
                        " UPDATE conversations SET head = 3 WHERE id = '%s'; COMMIT" % (conv, conv))
            r = subprocess.run([harness.binary(), "epoch", "rotate", "--conv", conv,
                                "--database-url", self.pg.url],
                               capture_output=True, text=True, timeout=20,
                               env={k: v for k, v in os.environ.items() if not k.startswith("CONVERGER_")})
            self.assertEqual(r.returncode, 0, r.stderr)
            a.send(conv, {"n": 104})
            a.send(conv, {"n": 105})
            got = await ws.recv_msgs(2)
            new = got[0]["epoch"]
            self.assertNotEqual(new, old)
            self.assertEqual([(m["seq"], m["body"]["n"], m["epoch"]) for m in got],
                             [(4, 104, new), (5, 105, new)])
            await ws.ws.close()

        self.arun(run(), 30)


if __name__ == "__main__":
    harness.main()
