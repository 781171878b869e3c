"""The chaos run of a sharded cluster (issue 32's goal): 3 nodes on 3
PostgreSQL instances (instance 1 with a synchronous standby) and 2 Redis bus
instances, 32 REST senders (idempotency keys, retried until answered) on 32
conversations spread over every instance and both bus instances, and 500
subscribers (450 through the C library, tests/tools/sdk_swarm; 50 through
the JavaScript client, tests/tools/js_swarm.mjs), every one given the three
nodes' URLs. Over CONVERGER_CHAOS_SECONDS (default 60; `make chaos-sharded`
runs 300), one fault at a time, each healed before the next:

1. the primary of instance 1 is SIGKILLed and its standby promoted;
2. bus instance 0 is SIGKILLed and started again (empty);
3. a node is SIGKILLed and started again;
4. a node is drained (POST /admin/drain), and started again once it exited.

After each, every sender must be acknowledged again (no hang). At the end
the senders resend whatever is unanswered until it is answered; every
conversation is read back over REST (seqs 1..head, ids unique, every
acknowledged (id, seq) there, nothing stored that was not acknowledged),
and every subscriber must have delivered exactly 1..head of its
conversation, each once, with the ids stored. The test prints one line:
acknowledged N, lost, delivered twice, gaps, conversations gapless K/K and
the faults' timings; lost, delivered twice and gaps must be 0.

The swarms' paths: CONVERGER_SDK_SWARM (set by CMake) or `sdk_swarm`
beside the converger binary; js_swarm.mjs beside this file's tools, with
converger-client from js/dist (the build writes it)."""

import json
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import NodeCase, Sharded, mint_token, uid  # noqa: E402
from test_drain_pg import swarm_path  # noqa: E402

SECONDS = int(os.environ.get("CONVERGER_CHAOS_SECONDS", "60"))
CONVS = 32
C_CLIENTS = 450
JS_CLIENTS = 50
SEND_PAUSE_S = 0.2  # each sender's pause after an acknowledgement: ~150 messages/s in all
RETRY_PAUSE_S = 0.05
STANDBY = 1  # the instance with a synchronous standby (0 is also the control database)
WINDOW_MS = 5000
SHUTDOWN_MS = 30000
HEAD_TIMEOUT_S = 120  # a lost publish is found at worst by the bus check (30 s) after the end
PROGRESS = 3  # acknowledgements every sender must get after a fault
PROGRESS_TIMEOUT_S = 90
TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools")
ROOT = os.path.dirname(os.path.dirname(TOOLS))


class LineProc:
    """A swarm process: stdout lines in a queue, stderr in a file; stopped
    (SIGKILL by its pid if still running) by stop()."""

    def __init__(self, argv, name):
        self.name = name
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err)
        harness._register(self.proc)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for raw in iter(self.proc.stdout.readline, b""):
            self.lines.put(raw.decode("utf-8", "replace").rstrip("\n"))
        self.lines.put(None)

    def line(self, timeout):
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def write(self, text):
        self.proc.stdin.write(text.encode())
        self.proc.stdin.flush()

    def stderr_text(self, lines=60):
        self.err.seek(0)
        return "\n".join(self.err.read().decode("utf-8", "replace").splitlines()[-lines:])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        harness._unregister(self.proc)
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        self.err.close()


class Senders:
    """One REST sender thread per conversation: m0, m1, ... each with its
    Idempotency-Key (the message's id) and resent with the same id, to the next node, on
    a 503, another refusal or a connection error, until answered (201, or
    200: found by its id). Once stopped, an unanswered message is still
    resent until answered (at most 120 s): nothing is left stored but not
    acknowledged. acked[conv]: [(id, seq)] in order."""

    def __init__(self, nodes, convs):
        self.nodes, self.convs = nodes, convs
        self.acked = {c: [] for c in convs}
        self.refused = 0
        self.unanswered = {}  # conv -> the id still unanswered when a sender gave up
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(k, c), daemon=True)
                        for k, c in enumerate(convs)]

    def count(self, conv):
        return len(self.acked[conv])

    def run(self, k, conv):
        i, attempt, pending, give_up = 0, 0, False, None
        while not self.stop.is_set() or pending:
            if self.stop.is_set():
                give_up = give_up or time.monotonic() + 120
                if time.monotonic() > give_up:
                    self.unanswered[conv] = "m%d" % i
                    return
            node = self.nodes[(k + i + attempt) % len(self.nodes)]
            mid = "m%d" % i
            try:
                st, _, js = node.request("POST", "/v1/conversations/%s/messages" % conv,
                                         {"sender": "chaos", "body": {"i": i}},
                                         headers={"Idempotency-Key": mid}, timeout=10)
            except (OSError, harness.http.client.HTTPException):
                st, js = 0, None
            if st in (200, 201) and isinstance(js, dict) and isinstance(js.get("seq"), int):
                self.acked[conv].append((mid, js["seq"]))
                i, attempt, pending = i + 1, 0, False
                if not self.stop.is_set():
                    time.sleep(SEND_PAUSE_S)
            else:
                self.refused += 1
                attempt += 1
                pending = True
                time.sleep(RETRY_PAUSE_S)

    def start(self):
        for t in self.threads:
            t.start()

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(150)
        return [t for t in self.threads if t.is_alive()]


class ShardedChaos(NodeCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        # durable: acknowledged commits must survive the primary's SIGKILL
        cls.sh = Sharded(instances=3, bus=2, durable=True, standby=STANDBY)
        cls.addClassCleanup(cls.sh.stop)

    def wait_progress(self, senders, what):
        """Every sender acknowledged PROGRESS more messages: the seconds it
        took (the fault's recovery as the senders see it)."""
        t0 = time.monotonic()
        base = {c: senders.count(c) for c in senders.convs}
        deadline = t0 + PROGRESS_TIMEOUT_S
        while True:
            behind = [c for c in senders.convs if senders.count(c) < base[c] + PROGRESS]
            if not behind:
                return time.monotonic() - t0
            if time.monotonic() > deadline:
                self.fail("after %s: %d of %d senders not acknowledged %d more times within %d s "
                          "(e.g. %s on instance %d)" % (what, len(behind), len(senders.convs), PROGRESS,
                                                        PROGRESS_TIMEOUT_S, behind[0],
                                                        self.sh.instance_of(behind[0])))
            time.sleep(0.1)

    def swarm_result(self, sw, timeout):
        line = sw.line(timeout)
        diag = "\n--- %s stderr ---\n%s\n--- end ---" % (sw.name, sw.stderr_text())
        self.assertIsNotNone(line, "no result from %s%s" % (sw.name, diag))
        try:
            return json.loads(line), diag
        except ValueError:
            self.fail("%s printed %r%s" % (sw.name, line[:300], diag))

    def test_chaos(self):
        t_begin = time.monotonic()
        env = self.sh.env({"CONVERGER_DRAIN_WINDOW_MS": str(WINDOW_MS),
                           "CONVERGER_DRAIN_CLOSE_RATE": "500",
                           "CONVERGER_DRAIN_SHUTDOWN_MS": str(SHUTDOWN_MS)})
        nodes = [self.node_start(env, ready_timeout=30) for _ in range(3)]
        a = nodes[0]
        ch = a.create_channel()["id"]
        # 32 conversations: every (instance, bus) pair, round robin
        convs = [self.sh.conv_on(a, instance=k % 3, bus=k % 2, channel=ch) for k in range(CONVS)]
        self.assertEqual({(self.sh.instance_of(c), self.sh.bus_index(c)) for c in convs},
                         {(i, b) for i in range(3) for b in range(2)})
        token = mint_token(uid("chaos"), convs)
        urls = []
        for n in nodes:
            urls += ["--url", n.ws_url]
        conv_args = []
        for c in convs:
            conv_args += ["--conv", c]

        csw = LineProc([swarm_path()] + urls + conv_args +
                       ["--token", token, "--clients", str(C_CLIENTS), "--ready-timeout", "120",
                        "--head-timeout", str(HEAD_TIMEOUT_S)], "sdk_swarm")
        self.addCleanup(csw.stop)
        jsw = LineProc(["node", os.path.join(TOOLS, "js_swarm.mjs")] + urls + conv_args +
                       ["--token", token, "--clients", str(JS_CLIENTS), "--ready-timeout", "120",
                        "--head-timeout", str(HEAD_TIMEOUT_S)], "js_swarm")
        self.addCleanup(jsw.stop)
        for sw, n in ((csw, C_CLIENTS), (jsw, JS_CLIENTS)):
            line = sw.line(150)
            self.assertEqual(line, "ready %d" % n, "%s: %s" % (sw.name, sw.stderr_text()))

        senders = Senders(nodes, convs)
        drained = {}  # the drain's "moved", "closed" (1012), "left" from the node's log
        faults = []  # (name, seconds into the run, its duration, recovery as the senders saw it)

        def primary():
            self.sh.pgs[STANDBY].kill()  # the standby still up
            self.sh.standby.promote()

        def bus():
            self.sh.redis[0].kill()
            time.sleep(3)  # the outage: its conversations poll their heads meanwhile
            self.sh.redis[0].up()

        def node_kill():
            nodes[1].kill9()
            time.sleep(2)  # down: its clients are on the others
            nodes[1].start()

        def drain():
            n = nodes[0]
            st, _, js = n.request("POST", "/admin/drain")
            self.assertEqual(st, 202, js)
            try:
                rc = n.proc.wait(SHUTDOWN_MS / 1000 + 30)
            except subprocess.TimeoutExpired:
                self.fail("the drained node did not exit")
            harness._unregister(n.proc)
            n.exit_codes.append(rc)
            self.assertEqual(rc, 0, "the drained node's exit status")
            done = re.search(r"drain complete after \d+ ms: (\d+) moved, (\d+) closed with 1012, (\d+) left",
                             n.log_text())
            self.assertIsNotNone(done, "no 'drain complete' in the drained node's log")
            drained.update(moved=int(done.group(1)), closed=int(done.group(2)), left=int(done.group(3)))
            n.start()

        schedule = [("primary SIGKILL + standby promoted", primary),
                    ("bus instance SIGKILL + restart", bus),
                    ("node SIGKILL + restart", node_kill),
                    ("node drained + restarted", drain)]
        senders.start()
        try:
            t0 = time.monotonic()
            self.wait_progress(senders, "the start")
            for k, (name, fault) in enumerate(schedule):
                at = t0 + SECONDS * (k + 1) / (len(schedule) + 1)
                if time.monotonic() < at:
                    time.sleep(at - time.monotonic())  # pacing over the run, not a check
                start = time.monotonic()
                fault()
                took = time.monotonic() - start
                faults.append((name, start - t0, took, self.wait_progress(senders, name)))
            if time.monotonic() < t0 + SECONDS:
                time.sleep(t0 + SECONDS - time.monotonic())
        finally:
            alive = senders.finish()
        run_s = time.monotonic() - t0
        self.assertEqual(alive, [], "senders still running")
        self.assertEqual(senders.unanswered, {}, "messages never answered after the end")

        # the store: every conversation gapless, every acknowledged message there, once
        lost = store_gaps = gapless = 0
        heads, stored_ids = {}, {}
        for c in convs:
            rows, head = nodes[2].all_messages(c)
            seqs = [m["seq"] for m in rows]
            ok = seqs == list(range(1, len(rows) + 1)) and head == len(rows)
            gapless += ok
            store_gaps += 0 if ok else 1
            by_seq = {m["seq"]: m["id"] for m in rows}
            lost += sum(1 for mid, seq in senders.acked[c] if by_seq.get(seq) != mid)
            self.assertEqual(len({m["id"] for m in rows}), len(rows), "an id stored twice in %s" % c)
            self.assertEqual(len(rows), len(senders.acked[c]), "stored but not acknowledged in %s" % c)
            heads[c] = head
            stored_ids[c] = [m["id"] for m in rows]
        acked = sum(len(v) for v in senders.acked.values())

        # the subscribers: 1..head of their conversation, each once, the ids stored
        for sw in (csw, jsw):
            for c in convs:
                sw.write("head %s %d\n" % (c, heads[c]))
        cres, cdiag = self.swarm_result(csw, HEAD_TIMEOUT_S + 60)
        jres, jdiag = self.swarm_result(jsw, HEAD_TIMEOUT_S + 60)
        twice = gaps = undelivered = mismatched = 0
        for res in (cres, jres):
            twice += sum(p["dups"] for p in res["per_client"])
            gaps += sum(p["gaps"] for p in res["per_client"])
            undelivered += sum(1 for p in res["per_client"] if p["last"] != heads[p["conv"]])
            mismatched += res["id_mismatches"] + res["wrong_conv"]
            mismatched += sum(1 for cv in res["convs"] if cv["ids"] != stored_ids[cv["conv"]][:cv["max_last"]])
        line = ("chaos: %d s, acknowledged %d, lost %d, delivered twice %d, gaps %d, "
                "conversations gapless %d/%d; subscribers %d (C %d, JS %d) at head %d/%d, "
                "ids mismatched %d; sends refused or failed then retried %d; "
                "reconnected subscribers C %d JS %d, wire duplicates dropped C %d JS %d; "
                "drain: %d connections moved, %d closed; faults: %s; "
                "total %.0f s"
                % (round(run_s), acked, lost, twice, gaps + store_gaps, gapless, len(convs),
                   C_CLIENTS + JS_CLIENTS, C_CLIENTS, JS_CLIENTS,
                   C_CLIENTS + JS_CLIENTS - undelivered, C_CLIENTS + JS_CLIENTS, mismatched,
                   senders.refused, cres["lost_clients"], jres["lost_clients"],
                   cres["sdk_duplicates"], jres["sdk_duplicates"], drained["moved"], drained["closed"],
                   "; ".join("%s at %.0f s (%.1f s, senders all acknowledged again %.1f s later)"
                             % f for f in faults),
                   time.monotonic() - t_begin))
        print(line)
        sys.stdout.flush()
        why = "\n%s%s%s" % (line, cdiag, jdiag)
        self.assertEqual((lost, twice, gaps + store_gaps, gapless), (0, 0, 0, len(convs)), why)
        self.assertEqual((undelivered, mismatched), (0, 0), why)
        self.assertTrue(cres["ok"] and jres["ok"], why)
        self.assertEqual((cres["failed_clients"], cres["clients"], jres["clients"]), (0, C_CLIENTS, JS_CLIENTS), why)
        self.assertEqual([f[0] for f in faults], [s[0] for s in schedule])
        self.assertGreater(senders.refused, 0)  # the faults were seen
        for sw in (csw, jsw):
            self.assertEqual(sw.proc.wait(30), 0, "%s exit status%s" % (sw.name, why))


if __name__ == "__main__":
    harness.main()
