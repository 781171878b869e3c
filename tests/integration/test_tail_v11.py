"""Protocol 1.1 through the C library, driven by `converger tail` over real
sockets: subscribe and unsubscribe (--commands on stdin) racing a REST
sender; 99 subscribes at once, rate-limited and sent again after the
hint until every conversation is subscribed; every message of the conversation printed once and in order across
the unsubscribed spans (each subscribe resumes from the last printed seq);
a token refreshed from --token-cmd before it expires, so the connection
lives on past several lifetimes; without a way to get a new token, tail
fails when the node closes with token_expired; several --conv printed
each once and in order; the `refresh` command answered by the node (and
a refresh with another user's token refused, the connection kept); (1.2)
presence events and signals said on stderr."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import NodeCase, mint_token  # noqa: E402


class Lines(threading.Thread):
    """Reads a stream's lines into a list."""

    def __init__(self, f):
        super().__init__(daemon=True)
        self.f, self.lines, self.cv = f, [], threading.Condition()

    def run(self):
        for raw in self.f:
            with self.cv:
                self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))
                self.cv.notify_all()

    def wait_for(self, pred, timeout=10.0):
        deadline = time.time() + timeout
        with self.cv:
            while True:
                for line in self.lines:
                    if pred(line):
                        return line
                left = deadline - time.time()
                if left <= 0:
                    raise AssertionError("not seen within %.0f s; last lines %r" % (timeout, self.lines[-8:]))
                self.cv.wait(left)


class TailV11(NodeCase):
    def start_tail(self, node, args, token=None):
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONVERGER_")}
        cmd = [harness.binary(), "tail", "--url", node.ws_url] + (["--token", token] if token else []) + args
        p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env)
        harness._register(p)
        self.addCleanup(self.stop, p)
        out, err = Lines(p.stdout), Lines(p.stderr)
        out.start()
        err.start()
        return p, out, err

    def stop(self, p):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        harness._unregister(p)

    def command(self, p, line):
        p.stdin.write((line + "\n").encode())
        p.stdin.flush()

    def test_subscribe_unsubscribe_racing_sends(self):
        n = self.node_start()
        home, conv = n.new_conv(), n.new_conv()
        stop, acked = threading.Event(), [0]

        def sender():
            with n.session() as s:
                i = 0
                while not stop.is_set():
                    i += 1
                    st, _, js = s.request("POST", "/v1/conversations/%s/messages" % conv,
                                          {"sender": "bot", "body": {"i": i}},
                                          headers={"Idempotency-Key": "t-%d" % i})
                    assert st in (200, 201), (st, js)
                    acked[0] = js["seq"]
                    time.sleep(0.01)

        p, out, err = self.start_tail(n, ["--conv", home, "--commands"], mint_token("tia", ["*"]))
        err.wait_for(lambda l: "synced at 0" in l)
        th = threading.Thread(target=sender, daemon=True)
        th.start()
        try:
            last = 0
            for cycle in range(4):
                self.command(p, "subscribe %s %d" % (conv, last))
                time.sleep(0.6)
                self.command(p, "unsubscribe %s" % conv)
                deadline = time.time() + 5
                while sum("unsubscribed from" in x for x in list(err.lines)) <= cycle:
                    self.assertLess(time.time(), deadline, err.lines[-5:])
                    time.sleep(0.02)
                time.sleep(0.2)  # frames in flight before the node took it
                seqs = [json.loads(l)["seq"] for l in list(out.lines) if json.loads(l)["conv"] == conv]
                last = seqs[-1] if seqs else last
                time.sleep(0.3)  # the sender goes on, unheard
            self.command(p, "subscribe %s %d" % (conv, last))
            stop.set()
            th.join(10)
            final = acked[0]
            out.wait_for(lambda l: json.loads(l)["conv"] == conv and json.loads(l)["seq"] == final)
        finally:
            stop.set()
        frames = [json.loads(l) for l in list(out.lines)]
        seqs = [f["seq"] for f in frames if f["conv"] == conv]
        self.assertEqual(seqs, list(range(1, final + 1)))  # once each, in order, none missed
        self.assertGreater(final, 100)
        self.assertEqual(sum("subscribing to" in l for l in err.lines), 5)

    def test_burst_of_subscribes(self):
        """99 `subscribe` lines at once (with --conv, the C library's 100
        subscriptions per client; test_ws_v11 sends 200 from a client of
        its own): the node's subscribe bucket (20/s here, burst 20) refuses
        most with rate_limited and a hint, the C library sends each again
        after its hint, and every conversation ends subscribed, its message
        printed once."""
        n = self.node_start({"CONVERGER_RATE_SUBSCRIBE": "20"})
        home = n.new_conv()
        convs = [n.new_conv() for _ in range(99)]
        for i, conv in enumerate(convs):
            n.send(conv, {"i": i})
        p, out, err = self.start_tail(n, ["--conv", home, "--commands"], mint_token("bea", ["*"]))
        err.wait_for(lambda l: "%s: synced at 0" % home in l)
        self.command(p, "\n".join("subscribe %s 0" % conv for conv in convs))
        deadline = time.time() + 40
        while sum(": synced at 1" in l for l in list(err.lines)) < len(convs):
            self.assertLess(time.time(), deadline,
                            "synced %d of 99" % sum(": synced at 1" in l for l in list(err.lines)))
            time.sleep(0.1)
        frames = [json.loads(l) for l in list(out.lines)]
        self.assertEqual(sorted(f["conv"] for f in frames), sorted(convs))  # each once
        self.assertTrue(all(f["seq"] == 1 for f in frames), frames[:3])
        limited = self.metric(n, 'converger_rate_limited_total{kind="subscribe"}')
        self.assertGreaterEqual(limited or 0, 50)
        self.assertIsNone(p.poll())
        self.assertEqual(sum("welcomed by" in l for l in list(err.lines)), 1, err.lines[-5:])

    def test_token_refreshed_from_token_cmd(self):
        """3 s tokens from `converger token` as --token-cmd: tail refreshes at
        about 80 % of each lifetime and stays connected for 8 s, printing
        every message; the node never closes it with token_expired."""
        n = self.node_start({"CONVERGER_TOKEN_LEEWAY_MS": "0"})
        conv = n.new_conv()
        token_cmd = "CONVERGER_TOKEN_SECRET=%s %s token --sub tom --convs %s --ttl 3" % (
            harness.TOKEN_SECRET, harness.binary(), conv)
        p, out, err = self.start_tail(n, ["--conv", conv, "--watermark", "0", "--token-cmd", token_cmd])
        for i in range(16):
            n.send(conv, {"i": i})
            time.sleep(0.5)
        out.wait_for(lambda l: json.loads(l)["seq"] == 16)
        self.assertIsNone(p.poll())
        text = "\n".join(err.lines)
        self.assertGreaterEqual(text.count("token (refresh): new one"), 2, text)
        self.assertNotIn("token_expired", text)
        self.assertEqual([json.loads(l)["seq"] for l in out.lines], list(range(1, 17)))
        _, _, metrics = n.get_text("/metrics")
        self.assertRegex(metrics, r'converger_token_refreshes_total\{result="ok"\} [2-9]')

    def metric(self, node, series):
        """The value of one series on the node's /metrics, None when absent."""
        _, _, text = node.get_text("/metrics")
        for line in text.splitlines():
            if line.startswith(series + " "):
                return float(line.split()[-1])
        return None

    def test_several_convs(self):
        """tail --conv A --conv B: one connection, both conversations'
        replays from --watermark 0 and their live messages, each printed
        once and in order."""
        n = self.node_start()
        a, b = n.new_conv(), n.new_conv()
        for i in range(3):
            n.send(a, {"a": i})
        n.send(b, {"b": 0})
        p, out, err = self.start_tail(n, ["--conv", a, "--conv", b, "--watermark", "0"],
                                      mint_token("tia", [a, b]))
        out.wait_for(lambda l: json.loads(l)["conv"] == b and json.loads(l)["seq"] == 1)
        out.wait_for(lambda l: json.loads(l)["conv"] == a and json.loads(l)["seq"] == 3)
        n.send(b, {"b": 1})
        n.send(a, {"a": 3})
        out.wait_for(lambda l: json.loads(l)["conv"] == b and json.loads(l)["seq"] == 2)
        out.wait_for(lambda l: json.loads(l)["conv"] == a and json.loads(l)["seq"] == 4)
        frames = [json.loads(l) for l in list(out.lines)]
        self.assertEqual([f["seq"] for f in frames if f["conv"] == a], [1, 2, 3, 4])
        self.assertEqual([f["seq"] for f in frames if f["conv"] == b], [1, 2])
        self.assertEqual([f["body"] for f in frames if f["conv"] == b], [{"b": 0}, {"b": 1}])
        self.assertEqual(len(frames), 6, frames)
        self.assertIsNone(p.poll())
        self.assertEqual(sum("welcomed by" in l for l in list(err.lines)), 1, err.lines)

    def test_refresh_command(self):
        """--commands: `refresh` runs --token-cmd and sends the new token at
        once (long before 80 % of an hour-long token); the node answers
        `refreshed` (converger_token_refreshes_total{result="ok"}). `refresh
        JWT` with another user's token is refused with forbidden and the
        connection stays, still printing messages."""
        n = self.node_start()
        conv = n.new_conv()
        token_cmd = "CONVERGER_TOKEN_SECRET=%s %s token --sub rae --convs %s --ttl 3600" % (
            harness.TOKEN_SECRET, harness.binary(), conv)
        p, out, err = self.start_tail(n, ["--conv", conv, "--commands", "--token-cmd", token_cmd],
                                      mint_token("rae", [conv]))
        err.wait_for(lambda l: "synced at 0" in l)
        ok = 'converger_token_refreshes_total{result="ok"}'
        forbidden = 'converger_token_refreshes_total{result="forbidden"}'
        self.assertIsNone(self.metric(n, ok))
        self.command(p, "refresh")
        err.wait_for(lambda l: "new token sent (refresh)" in l)
        deadline = time.time() + 10
        while self.metric(n, ok) != 1:
            self.assertLess(time.time(), deadline, err.lines[-5:])
            time.sleep(0.05)
        time.sleep(1.1)  # the refresh bucket: 1 a second (CONVERGER_RATE_REFRESH)
        self.command(p, "refresh " + mint_token("someone-else", [conv]))
        err.wait_for(lambda l: "server error forbidden" in l)
        self.assertEqual(self.metric(n, forbidden), 1)
        self.assertEqual(self.metric(n, ok), 1)
        n.send(conv, {"after": "refresh"})
        line = out.wait_for(lambda l: l.startswith("{"))
        self.assertEqual(json.loads(line)["body"], {"after": "refresh"})
        self.assertIsNone(p.poll())
        self.assertEqual(sum("welcomed by" in l for l in list(err.lines)), 1, err.lines)

    def test_token_expiry_without_token_cmd_ends_tail(self):
        n = self.node_start({"CONVERGER_TOKEN_LEEWAY_MS": "0"})
        conv = n.new_conv()
        p, out, err = self.start_tail(n, ["--conv", conv], mint_token("tod", [conv], ttl=2))
        try:
            code = p.wait(10)
        except subprocess.TimeoutExpired:
            code = None
        self.assertEqual(code, 1)
        time.sleep(0.2)
        self.assertIn("the token expired", "\n".join(err.lines))

    def test_presence_and_signals_on_stderr(self):
        """tail --presence-events users says on stderr who joins and
        leaves (after the grace) and every signal, and prints nothing of
        them on stdout, which stays the messages' alone."""
        n = self.node_start({"CONVERGER_PRESENCE_GRACE_MS": "800"})
        ch = n.create_channel(id=harness.uid("ch"), name="team", presence=True, signals=True)
        conv = n.create_conv(ch["id"], id=harness.uid("cv"))["id"]
        p, out, err = self.start_tail(n, ["--conv", conv, "--presence-events", "users",
                                          "--client-id", "ann-tail"],
                                      token=mint_token("ann", [conv]))
        err.wait_for(lambda line: "connected" in line)
        bob, _, bob_err = self.start_tail(n, ["--conv", conv, "--client-id", "bob-1"],
                                          token=mint_token("bob", [conv]))
        err.wait_for(lambda line: line.endswith(": bob joined (client bob-1)"))
        st, _, js = n.request("POST", "/v1/conversations/%s/signals" % conv,
                              {"sender": "bot", "body": {"typing": True}})
        self.assertEqual(st, 202, js)
        err.wait_for(lambda line: line.endswith(': signal from bot: {"typing":true}'))
        bob_err.wait_for(lambda line: line.endswith(': signal from bot: {"typing":true}'))
        n.send(conv, {"text": "a message"})
        line = out.wait_for(lambda line: line.startswith("{"))
        self.assertEqual(json.loads(line)["body"], {"text": "a message"})
        self.stop(bob)
        err.wait_for(lambda line: line.endswith(": bob left (client bob-1)"), timeout=5)
        self.assertEqual(len(out.lines), 1, out.lines)  # stdout: the message alone
        self.stop(p)
        r = subprocess.run([harness.binary(), "tail", "--url", n.ws_url, "--token", "x",
                            "--conv", conv, "--presence-events", "all"], capture_output=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn(b"--presence-events is users or clients", r.stderr)


if __name__ == "__main__":
    harness.main()
