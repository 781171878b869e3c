"""`converger roll` and `converger balance` on a local cluster: PostgreSQL
(scripts/pg-tmp) and three nodes started here, 30 subscribers on the C
library (`converger tail`, 10 per node) and a REST sender. A supervisor
thread plays systemd's Restart=: a node that exits 0 after its drain is
started again on its port (a node killed with SIGKILL is left down).

- it completes: every node restarted, the fleet balanced at the end, no
  acknowledged message lost or doubled at any subscriber, no subscriber
  ever offline (make-before-break);
- it pauses: a survivor's loop is made busy (a flood of requests) above a
  --pause-cpu set low for the test; the roll waits, says why, then goes on;
- it aborts: a survivor is SIGKILLed mid-roll, its 10 clients (a third)
  drop: exit 4 naming the connections-drop alarm; a survivor kept busy
  above --abort-cpu for --abort-s: exit 4 naming the CPU alarm with its
  figures; SIGINT mid-batch: exit 4, the batch under way finishes (its
  node drained, nobody offline, back ready) and no other starts; a drained
  node that does not leave within --leave-timeout-s, or does not come back
  within --ready-timeout-s: exit 4 naming it;
- it refuses: with a capacity below the load, exit 3 before any drain;
  --dry-run prints the plan and drains nothing;
- --restart-cmd runs for each node (no shell, {id} replaced), and one that
  exits non-zero aborts the roll;
- balance: a fourth node joins a loaded cluster empty; `converger
  balance` moves clients to it until no node is more than the default 10 %
  above the mean, nobody offline.
"""

import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import NodeCase, PgCluster, mint_token  # noqa: E402
from test_client_sdk import Tail, post_until_committed  # noqa: E402

PER_NODE = 10


class Supervisor(threading.Thread):
    """Starts again every node whose process exited 0 (its drain ended).
    restarts counts a start as it begins: a roll that saw the new process
    ready has ended after the count (wait_ready may return later)."""

    def __init__(self, nodes):
        super().__init__(daemon=True)
        self.nodes = nodes
        self.stop_ev = threading.Event()
        self.restarts = {n.port: 0 for n in nodes}
        self.errors = []

    def run(self):
        while not self.stop_ev.wait(0.1):
            for n in list(self.nodes):
                p = n.proc
                if p is None or p.poll() is None or p.returncode != 0:
                    continue
                harness._unregister(p)
                n.exit_codes.append(0)
                self.restarts[n.port] = self.restarts.get(n.port, 0) + 1
                try:
                    n.start()
                except Exception as e:  # reported by the test
                    self.errors.append(repr(e))
                    return

    def stop(self):
        self.stop_ev.set()
        self.join(30)


class Watched:
    """A running roll whose stderr is read as it comes (its progress)."""

    def __init__(self, proc):
        self.p = proc
        self.lines = []
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        for line in self.p.stderr:
            self.lines.append(line)

    def wait_for(self, text, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not any(text in l for l in self.lines):
            time.sleep(0.1)
        return any(text in l for l in self.lines)

    def end(self, timeout):
        """(exit status, stdout, stderr) once it ended."""
        self.p.wait(timeout)  # stdout is small: the plan and the summary
        out = self.p.stdout.read()
        harness._unregister(self.p)
        self.t.join(10)
        self.p.stdout.close()
        self.p.stderr.close()
        return self.p.returncode, out, "".join(self.lines)


class Roll(NodeCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.pg = PgCluster()
        cls.addClassCleanup(cls.pg.stop)

    def database(self):
        """A database of this test's own on the shared server: no membership
        rows of the nodes of an earlier test (they stay listed for 3.5 s)."""
        name = "roll_" + harness.uid("d").replace("-", "_").lower()
        self.pg.sql("CREATE DATABASE %s" % name)
        base, _, _ = self.pg.url.rpartition("/")
        return "%s/%s" % (base, name)

    def cluster(self, n=3, env=None):
        self.db_url = self.database()
        e = {"CONVERGER_DATABASE_URL": self.db_url,
             "CONVERGER_DRAIN_WINDOW_MS": "4000",
             "CONVERGER_DRAIN_SHUTDOWN_MS": "20000"}
        e.update(env or {})
        nodes = [self.node_start(e) for _ in range(n)]
        sup = Supervisor(nodes)
        sup.start()
        self.addCleanup(sup.stop)
        return nodes, sup

    @staticmethod
    def in_roll_order(nodes):
        """The nodes in the roll's batch order: /admin/cluster's, by id."""
        return sorted(nodes, key=lambda n: n.node_id)

    def tails(self, nodes, conv, per_node=PER_NODE):
        tok = mint_token("roller", [conv])
        out = []
        for n in nodes:
            for _ in range(per_node):
                t = Tail(["--url", n.ws_url, "--token", tok, "--conv", conv, "--watermark", "0"])
                self.addCleanup(t.stop)
                out.append(t)
        for t in out:
            self.assertTrue(t.wait_for(lambda t=t: any(": connected: " in l for l in t.err), 20),
                            t.stderr_text())
        return out

    def wait_connections(self, nodes, want, timeout=20):
        deadline = time.monotonic() + timeout
        got = None
        while time.monotonic() < deadline:
            got = [n.request("GET", "/admin/status")[2].get("connections", 0) for n in nodes]
            if sum(got) >= want:
                return got
            time.sleep(0.1)
        self.fail("connections %r, want %d in total" % (got, want))

    def sender(self, nodes, conv, stop, acks):
        i = 0
        while not stop.is_set():
            i += 1
            n = nodes[i % len(nodes)]
            js = post_until_committed(n.port, conv, i, stop)
            if js is None:
                return
            acks[i] = js["seq"]
            time.sleep(0.05)

    def roll(self, node, *args, out=None, timeout=180):
        cmd = [harness.binary(), "roll", "--url", node.admin_url,
               "--api-key", harness.API_KEY, "--settle-s", "1"] + list(args)
        if out:
            cmd += ["--out", out]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             stdin=subprocess.DEVNULL)
        harness._register(p)
        return p

    def finish(self, p, timeout=180):
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            self.fail("roll did not end within %d s:\n%s\n%s" % (timeout, out, err))
        finally:
            harness._unregister(p)
        return p.returncode, out, err

    def check_subscribers(self, tails, acks):
        total = max(acks) if acks else 0
        seqs = sorted(acks.values())
        self.assertEqual(seqs, list(range(1, len(seqs) + 1)))  # one message per key
        for t in tails:
            self.assertTrue(t.wait_for(lambda t=t: len(t.lines) >= len(seqs), 20), t.stderr_text())
            self.assertEqual(t.stop(), 0, t.stderr_text())
            got = [json.loads(l)["seq"] for l in t.lines]
            # every acknowledged message, once, in order (more may follow)
            self.assertEqual(got[:len(seqs)], list(range(1, len(seqs) + 1)), t.stderr_text())
            self.never_offline(t)
        return total

    def busy(self, node):
        """Keep `node`'s loop busy with a flood of requests (three
        connections asking its admin listener for /metrics back to back)
        until the returned event is set (a cleanup sets it too)."""
        stop = threading.Event()

        def flood():
            c = http.client.HTTPConnection("127.0.0.1", node.admin_port, timeout=5)
            while not stop.is_set():
                try:
                    c.request("GET", "/metrics")
                    c.getresponse().read()
                except (OSError, http.client.HTTPException):
                    c.close()
                    c = http.client.HTTPConnection("127.0.0.1", node.admin_port, timeout=5)
            c.close()
        floods = [threading.Thread(target=flood, daemon=True) for _ in range(3)]
        for f in floods:
            f.start()
        self.addCleanup(lambda: [f.join(10) for f in floods])
        self.addCleanup(stop.set)
        time.sleep(2)  # a loop utilisation sample of the flood
        return stop

    def never_offline(self, t):
        """The subscriber never waited without a connection: every move was
        make-before-break (a `waiting:` line is a lost connection)."""
        self.assertEqual([l for l in t.err if ": waiting: " in l], [], t.stderr_text())
        summary = [l for l in t.err if "message(s); attempts" in l]
        self.assertEqual(len(summary), 1, t.stderr_text())

    def test_roll_completes_balanced_nobody_offline(self):
        nodes, sup = self.cluster()
        conv = nodes[0].new_conv()
        tails = self.tails(nodes, conv)
        self.wait_connections(nodes, 3 * PER_NODE)
        stop, acks = threading.Event(), {}
        th = threading.Thread(target=self.sender, args=(nodes, conv, stop, acks), daemon=True)
        th.start()
        rc, out, err = self.finish(self.roll(nodes[0], "--dry-run"), 60)
        self.assertEqual(rc, 0, out + err)
        self.assertIn("batch 3/3:", out)
        self.assertEqual(sum(sup.restarts.values()), 0)  # the plan only
        out_dir = tempfile.mkdtemp(prefix="converger-roll-")
        self.addCleanup(shutil.rmtree, out_dir, True)
        p = self.roll(nodes[0], "--balance-tolerance", "20", "--balance-window-ms", "3000",
                      out=out_dir)
        rc, out, err = self.finish(p)
        stop.set()
        th.join(30)
        self.assertEqual(rc, 0, out + err)
        self.assertEqual(sup.errors, [])
        self.assertIn("batch 1/3:", out)
        self.assertIn("expected duration", out)
        self.assertIn("headroom: ok", out)
        self.assertIn("result: done", out)
        for n in nodes:
            self.assertEqual(sup.restarts[n.port], 1, "every node restarted once")
        with open(os.path.join(out_dir, "summary.json")) as f:
            s = json.load(f)
        self.assertEqual(s["result"], "done")
        self.assertEqual(len(s["batch_s"]), 3)
        self.assertTrue(s["balanced"])
        self.assertLessEqual(s["spread_after"], 1.2)
        per_node = self.wait_connections(nodes, 3 * PER_NODE)
        self.assertLessEqual(max(per_node), 12, per_node)
        self.assertGreaterEqual(s["fewest_connections"], 3 * PER_NODE - 1, s)
        self.check_subscribers(tails, acks)

    def test_roll_pauses_for_a_hot_survivor_then_goes_on(self):
        nodes, sup = self.cluster()
        conv = nodes[0].new_conv()
        tails = self.tails(nodes, conv)
        self.wait_connections(nodes, 3 * PER_NODE)
        first, hot, _ = self.in_roll_order(nodes)  # hot: a survivor of batch 1
        flood_stop = self.busy(hot)
        w = Watched(self.roll(nodes[0], "--pause-cpu", "10", "--abort-cpu", "100", "--no-balance"))
        w.wait_for("paused: survivor")
        self.assertTrue(any("paused: survivor %s" % hot.node_id in l for l in w.lines),
                        "".join(w.lines))
        time.sleep(2)
        self.assertEqual(sup.restarts[first.port], 0, "no batch while paused")
        flood_stop.set()
        rc, out, err = w.end(180)
        self.assertEqual(rc, 0, out + err)
        m = re.search(r"pauses: (\d+) \((\d+) s\)", out)
        self.assertTrue(m and int(m.group(1)) >= 1 and int(m.group(2)) >= 2, out)
        for n in nodes:
            self.assertEqual(sup.restarts[n.port], 1)
        for tl in tails:
            tl.stop()

    def test_roll_aborts_when_a_survivor_dies(self):
        nodes, sup = self.cluster()
        conv = nodes[0].new_conv()
        self.tails(nodes, conv)
        self.wait_connections(nodes, 3 * PER_NODE)
        w = Watched(self.roll(nodes[0], "--no-balance"))
        w.wait_for("draining")
        first, second, victim = self.in_roll_order(nodes)  # victim: a survivor of batch 1
        sup.nodes.remove(victim)  # stays down
        victim.kill9()
        rc, out, err = w.end(120)
        self.assertEqual(rc, 4, out + err)
        self.assertIn("aborted: connections-drop alarm", err)
        self.assertIn("result: aborted", out)
        self.assertEqual(sup.restarts[second.port], 0, "nothing more started")
        # the batch under way finished: its node is back and ready
        self.assertEqual(sup.restarts[first.port], 1)
        self.assertEqual(first.get("/readyz")[0], 200)

    def test_roll_aborts_when_a_survivor_stays_hot(self):
        # --pause-cpu 0 turns the pause off, so batch 1 starts with the
        # survivor already hot; --abort-cpu 10 for --abort-s 3 trips at the
        # roll's third sample (the first already sees the flood), while
        # batch 1 is still draining.
        nodes, sup = self.cluster()
        first, second, hot = self.in_roll_order(nodes)  # hot: a survivor of batches 1 and 2
        conv = nodes[0].new_conv()
        tails = self.tails([first], conv)  # its drain lasts the 4 s window: the abort lands in it
        self.wait_connections(nodes, PER_NODE)
        self.busy(hot)
        rc, out, err = self.finish(self.roll(nodes[0], "--pause-cpu", "0", "--abort-cpu", "10",
                                             "--abort-s", "3", "--no-balance"), 120)
        self.assertEqual(rc, 4, out + err)
        m = re.search(r"converger roll: aborted: CPU alarm: survivor (\S+) has been above 10 % "
                      r"for (\d+) s \(now (\d+) %; --abort-cpu, --abort-s\)", err)
        self.assertTrue(m, err)
        self.assertEqual(m.group(1), hot.node_id, err)
        self.assertGreaterEqual(int(m.group(2)), 3, err)
        self.assertGreater(int(m.group(3)), 10, err)
        self.assertIn("result: aborted: CPU alarm", out)
        self.assertIn("roll: batch 1/3 ready again", err)
        for n in (second, hot):  # nothing more started
            self.assertNotIn("roll: %s: draining" % n.node_id, err)
            self.assertEqual(sup.restarts[n.port], 0)
        # the batch under way finished: its node is back and ready, its
        # clients moved make-before-break
        self.assertEqual(sup.restarts[first.port], 1, err)
        self.assertEqual(first.get("/readyz")[0], 200)
        for t in tails:
            self.assertEqual(t.stop(), 0, t.stderr_text())
            self.never_offline(t)

    def test_sigint_lets_the_batch_under_way_finish_then_aborts(self):
        nodes, sup = self.cluster()
        first, second, third = self.in_roll_order(nodes)
        conv = nodes[0].new_conv()
        tails = self.tails([first], conv)
        self.wait_connections(nodes, PER_NODE)
        w = Watched(self.roll(nodes[0], "--no-balance"))
        self.assertTrue(w.wait_for("roll: %s: draining" % first.node_id), "".join(w.lines))
        # mid-batch: its 10 clients take up to the 4 s drain window to move
        self.assertFalse(any("ready again" in l for l in w.lines), "".join(w.lines))
        w.p.send_signal(signal.SIGINT)
        rc, out, err = w.end(120)
        self.assertEqual(rc, 4, out + err)
        # SIGINT alone (no alarm added to it), on stderr and in the summary
        self.assertIn("converger roll: aborted: interrupted (SIGINT)\n", err)
        self.assertIn("result: aborted: interrupted (SIGINT)\n", out)
        self.assertIn("roll: batch 1/3 ready again", err)
        self.assertIn("batch 1: ", out)
        self.assertNotIn("batch 2: ", out)
        for n in (second, third):  # nothing more started
            self.assertNotIn("roll: %s: draining" % n.node_id, err)
            self.assertEqual(sup.restarts[n.port], 0)
        # the batch's node finished its drain (exit 0), came back, is ready
        self.assertEqual(sup.restarts[first.port], 1)
        self.assertEqual(first.get("/readyz")[0], 200)
        self.wait_connections(nodes, PER_NODE)
        for t in tails:  # its clients moved make-before-break
            self.assertEqual(t.stop(), 0, t.stderr_text())
            self.never_offline(t)

    def test_roll_aborts_when_a_node_does_not_leave_or_come_back(self):
        # A drain window of 6 s: the 10 clients of the first node take up
        # to 6 s to move, and the node leaves once they have; a leave
        # timeout of 1 s is over before (all 10 within 2 s: 3^-10).
        nodes, sup = self.cluster(env={"CONVERGER_DRAIN_WINDOW_MS": "6000"})
        first, second, third = self.in_roll_order(nodes)
        conv = nodes[0].new_conv()
        tails = self.tails([first], conv)
        self.wait_connections(nodes, PER_NODE)
        rc, out, err = self.finish(self.roll(nodes[0], "--leave-timeout-s", "1", "--no-balance"),
                                   60)
        self.assertEqual(rc, 4, out + err)
        self.assertIn("converger roll: aborted: node %s did not leave within 1 s" % first.node_id,
                      err)
        self.assertEqual(sup.restarts[second.port] + sup.restarts[third.port], 0, err)
        # it was still draining, not lost: its clients move, it exits 0 and
        # the supervisor starts it again
        deadline, ready = time.monotonic() + 30, False
        while not ready and time.monotonic() < deadline:
            time.sleep(0.1)
            try:
                ready = sup.restarts[first.port] == 1 and first.get("/readyz")[0] == 200
            except OSError:  # between its exit and the new process's listener
                pass
        self.assertTrue(ready, first.log_tail())
        for t in tails:  # make-before-break all the same
            self.assertEqual([l for l in t.err if ": waiting: " in l], [], t.stderr_text())

        # Now nothing brings the first node back: no supervisor, no
        # --restart-cmd. It leaves at once (no client left on it).
        sup.nodes.remove(first)
        rc, out, err = self.finish(self.roll(nodes[0], "--ready-timeout-s", "2", "--no-balance"),
                                   60)
        self.assertEqual(rc, 4, out + err)
        self.assertIn("converger roll: aborted: node %s did not come back: no /readyz 200 within "
                      "2 s (--ready-timeout-s)" % first.node_id, err)
        self.assertIn("roll: batch 1/3 done, with a failure", err)
        self.assertEqual(sup.restarts[second.port] + sup.restarts[third.port], 0, err)
        first.proc.wait(10)  # its drain ended: exit 0, not started again
        self.assertEqual(first.stop(), 0)
        for t in tails:
            self.assertEqual(t.stop(), 0, t.stderr_text())
            self.never_offline(t)

    def test_restart_command_is_run_and_its_status_checked(self):
        nodes, sup = self.cluster()
        first = self.in_roll_order(nodes)[0]
        marks = tempfile.mkdtemp(prefix="converger-roll-cmd-")
        self.addCleanup(shutil.rmtree, marks, True)
        # `touch DIR/{id}` (no shell: each word is an argument) succeeds
        rc, out, err = self.finish(self.roll(nodes[0], "--no-balance", "--restart-cmd",
                                             "touch %s/{id}" % marks))
        self.assertEqual(rc, 0, out + err)
        self.assertEqual(sorted(os.listdir(marks)), sorted(n.node_id for n in nodes))
        # the progress names each command as run: the id in place of {id}
        for n in nodes:
            self.assertIn("roll: %s: running touch %s/%s\n" % (n.node_id, marks, n.node_id), err)
        self.assertNotIn("{id}", err)
        # a command that fails stops the roll after its batch
        rc, out, err = self.finish(self.roll(nodes[0], "--no-balance", "--restart-cmd", "false"))
        self.assertEqual(rc, 4, out + err)
        self.assertIn("aborted: node %s did not come back: false exited with status 1"
                      % first.node_id, err)
        self.assertEqual(sup.restarts[first.port], 2)

    def test_refused_without_headroom_and_dry_run(self):
        nodes, sup = self.cluster(env={"CONVERGER_CAPACITY_CONNECTIONS": "12"})
        conv = nodes[0].new_conv()
        self.tails(nodes, conv)
        self.wait_connections(nodes, 3 * PER_NODE)  # 30 of 36: 83 %
        rc, out, err = self.finish(self.roll(nodes[0]), 60)
        self.assertEqual(rc, 3, out + err)
        self.assertIn("refusing to start: fleet utilisation 83 % is above the 65 % budget", err)
        rc, out, err = self.finish(self.roll(nodes[0], "--max-utilisation", "90"), 60)
        self.assertEqual(rc, 3, out + err)  # 30 on the 24 of two survivors
        self.assertIn("30 connection(s) on a capacity of 24", err)
        rc, out, err = self.finish(self.roll(nodes[0], "--max-utilisation", "90", "--batch", "3",
                                             "--dry-run"), 60)
        self.assertEqual(rc, 3, out + err)
        self.assertIn("no survivor", err)
        for n in nodes:
            self.assertEqual(n.get("/readyz")[0], 200)  # nothing drained
        self.assertEqual(sum(sup.restarts.values()), 0)

    def test_balance_moves_clients_to_a_new_node(self):
        nodes, sup = self.cluster()
        conv = nodes[0].new_conv()
        tails = self.tails(nodes, conv)
        self.wait_connections(nodes, 3 * PER_NODE)
        fourth = self.node_start({"CONVERGER_DATABASE_URL": self.db_url})
        # the default tolerance, 10 %: 30 clients on 4 nodes is a mean of
        # 7.5, so no node may hold more than 8 (8.25)
        cmd = [harness.binary(), "balance", "--url", fourth.admin_url,
               "--api-key", harness.API_KEY, "--balance-window-ms", "3000"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("fleet: 4 node(s)", r.stdout)
        m = re.search(r"balance: spread \(max/mean\) ([\d.]+) before, ([\d.]+) after, balanced ",
                      r.stdout)
        self.assertTrue(m, r.stdout + r.stderr)
        self.assertLessEqual(float(m.group(2)), 1.1, r.stdout)
        per_node = self.wait_connections(nodes + [fourth], 3 * PER_NODE)
        self.assertLessEqual(max(per_node), int(1.1 * 3 * PER_NODE / 4), per_node)
        self.assertGreaterEqual(per_node[3], 6, per_node)
        moved = 0
        for t in tails:
            self.assertEqual(t.stop(), 0)
            self.never_offline(t)
            moved += sum(1 for l in t.err if ": connected: " in l) - 1
        self.assertGreaterEqual(moved, 5)


if __name__ == "__main__":
    harness.main()
