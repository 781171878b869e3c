"""The client library against real nodes, through `converger tail`: a
subscriber gets 1..1000 exactly once and in order while its node is killed
with SIGKILL twice and restarted and a sender keeps sending with
idempotency keys; tail fails over between URLs, stops on a refused token,
and rejects bad arguments with exit 2."""

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import NodeCase, mint_token, free_port  # noqa: E402


class Tail:
    """One `converger tail` process; stdout lines are collected by a thread."""

    def __init__(self, args, env=None):
        e = dict(os.environ)
        e.pop("CONVERGER_TOKEN", None)
        e.update(env or {})
        self.proc = subprocess.Popen([harness.binary(), "tail"] + args, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=e)
        harness._register(self.proc)
        self.lines = []
        self.err = []
        self.cond = threading.Condition()
        self.t_out = threading.Thread(target=self._read, args=(self.proc.stdout, self.lines), daemon=True)
        self.t_err = threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True)
        self.t_out.start()
        self.t_err.start()

    def _read(self, f, into):
        for line in iter(f.readline, b""):
            with self.cond:
                into.append(line.decode("utf-8", "replace").rstrip("\n"))
                self.cond.notify_all()

    def wait_for(self, pred, timeout):
        deadline = time.monotonic() + timeout
        with self.cond:
            while not pred():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
        return True

    def wait_exit(self, timeout):
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self.t_out.join(5)
        self.t_err.join(5)
        self.proc.stdout.close()
        self.proc.stderr.close()
        harness._unregister(self.proc)
        return rc

    def stop(self):
        """SIGTERM by pid; the exit code (SIGKILL after 10 s: None)."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        rc = self.wait_exit(10)
        if rc is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
            harness._unregister(self.proc)
        return rc

    def stderr_text(self):
        with self.cond:
            return "\n".join(self.err)


def post_until_committed(port, conv, i, stop):
    """POST message i with Idempotency-Key k-i until the node answers 200/201
    (connection errors and 503 while it restarts are retried)."""
    body = json.dumps({"sender": "sender", "body": {"i": i}})
    while not stop.is_set():
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("POST", "/v1/conversations/%s/messages" % conv, body,
                      {"Authorization": "Bearer " + harness.API_KEY, "Content-Type": "application/json",
                       "Idempotency-Key": "k-%d" % i})
            r = c.getresponse()
            js = json.loads(r.read() or b"null")
            c.close()
            if r.status in (200, 201):
                return js
            if r.status != 503:
                raise AssertionError("POST %d -> %d %r" % (i, r.status, js))
        except (OSError, http.client.HTTPException):
            pass
        time.sleep(0.05)
    return None


class ClientSdk(NodeCase):
    def start_tail(self, args, env=None):
        t = Tail(args, env)
        self.addCleanup(t.stop)
        return t

    def test_exactly_once_in_order_across_two_kill9(self):
        n = self.node_start()
        conv = n.new_conv()
        tok = mint_token("tailer", [conv])
        tail = self.start_tail(["--url", n.ws_url, "--token", tok, "--conv", conv,
                                "--watermark", "0", "--max-messages", "1000"])
        self.assertTrue(tail.wait_for(lambda: any("connected" in l for l in tail.err), 10),
                        tail.stderr_text())
        total, kills_at = 1000, (300, 700)
        acks = {}
        stop = threading.Event()
        progress = threading.Condition()
        # The sender runs on through each kill (its POSTs meet the dead node
        # and are retried) but holds at kill point + 50 until the node is back:
        # without that it could finish all 1000 while the subscriber is still
        # in backoff, and the subscriber could end before the second kill.
        restarted = [threading.Event() for _ in kills_at]
        holds = {k + 50: ev for k, ev in zip(kills_at, restarted)}

        def sender():
            for i in range(1, total + 1):
                if i in holds and not holds[i].wait(60):
                    return
                js = post_until_committed(n.port, conv, i, stop)
                if js is None:
                    return
                with progress:
                    acks[i] = js
                    progress.notify_all()

        th = threading.Thread(target=sender, daemon=True)
        th.start()
        def welcomes():
            with tail.cond:
                return sum(1 for l in tail.err if ": connected: " in l)

        try:
            for round_, k in enumerate(kills_at):
                with progress:
                    self.assertTrue(progress.wait_for(lambda: len(acks) >= k, 60), len(acks))
                # the subscriber is back on the node before each kill, so that
                # both restarts happen under a connected subscriber
                self.assertTrue(tail.wait_for(lambda: welcomes() >= round_ + 1, 30), tail.stderr_text())
                n.kill9()
                self.assertEqual(n.exit_codes[-1], -9)
                time.sleep(0.3)  # the subscriber and the sender see the node gone
                n.start()
                restarted[round_].set()
            th.join(120)
            self.assertFalse(th.is_alive(), "the sender did not finish")
        finally:
            stop.set()
            for ev in restarted:
                ev.set()
        self.assertEqual(len(acks), total)
        # one message per key: the retries of the sender did not duplicate
        self.assertEqual(sorted(a["seq"] for a in acks.values()), list(range(1, total + 1)))

        rc = tail.wait_exit(60)
        self.assertEqual(rc, 0, "tail did not end after 1000 messages; stderr:\n" + tail.stderr_text())
        msgs = [json.loads(l) for l in tail.lines]
        self.assertEqual([m["seq"] for m in msgs], list(range(1, total + 1)))
        for m in msgs:
            self.assertEqual(m["type"], "msg")
            self.assertEqual(m["conv"], conv)
            self.assertEqual(acks[m["body"]["i"]]["seq"], m["seq"])
        welcomes = [l for l in tail.err if ": connected: " in l]
        self.assertGreaterEqual(len(welcomes), 3, tail.stderr_text())
        summary = [l for l in tail.err if "message(s); attempts" in l]
        self.assertEqual(len(summary), 1, tail.stderr_text())
        self.assertIn("1000 message(s)", summary[0])
        stored, head = n.all_messages(conv)
        self.assertEqual(head, total)
        self.assertEqual(len(stored), total)

    def test_fails_over_to_another_url_and_resumes(self):
        n = self.node_start()
        conv = n.new_conv()
        for i in range(3):
            n.send(conv, {"i": i})
        dead = "ws://127.0.0.1:%d/v1/ws" % free_port()
        tail = self.start_tail(["--url", dead, "--url", n.ws_url, "--token", mint_token("u", [conv]),
                                "--conv", conv, "--watermark", "1"])
        self.assertTrue(tail.wait_for(lambda: len(tail.lines) >= 2, 30), tail.stderr_text())
        n.send(conv, {"i": 3})
        self.assertTrue(tail.wait_for(lambda: len(tail.lines) >= 3, 30), tail.stderr_text())
        self.assertEqual([json.loads(l)["seq"] for l in tail.lines], [2, 3, 4])
        self.assertEqual(tail.stop(), 0)
        err = tail.stderr_text()
        self.assertIn("SIGTERM, closing", err)
        self.assertIn("3 message(s)", err)

    def test_starts_at_the_head_without_watermark(self):
        n = self.node_start()
        conv = n.new_conv()
        n.send(conv, {"old": True})
        tail = self.start_tail(["--url", n.ws_url, "--token", mint_token("u", [conv]), "--conv", conv])
        self.assertTrue(tail.wait_for(lambda: any("connected" in l for l in tail.err), 10))
        time.sleep(0.2)
        n.send(conv, {"new": True})
        self.assertTrue(tail.wait_for(lambda: len(tail.lines) >= 1, 10), tail.stderr_text())
        m = json.loads(tail.lines[0])
        self.assertEqual((m["seq"], m["body"]), (2, {"new": True}))
        self.assertEqual(tail.stop(), 0)

    def test_refused_token_ends_with_exit_1(self):
        n = self.node_start()
        conv = n.new_conv()
        bad = mint_token("u", [conv], secret="not-the-secret-of-this-node-0123456789")
        tail = self.start_tail(["--url", n.ws_url, "--conv", conv], env={"CONVERGER_TOKEN": bad})
        rc = tail.wait_exit(20)
        err = tail.stderr_text()
        self.assertEqual(rc, 1, err)
        self.assertIn("server error unauthorized", err)
        self.assertIn("failed: the server refused the token", err)

    def test_no_such_conversation_ends_with_exit_1(self):
        n = self.node_start()
        tail = self.start_tail(["--url", n.ws_url, "--token", mint_token("u", ["*"]), "--conv", "no-such-conv"])
        rc = tail.wait_exit(20)
        err = tail.stderr_text()
        self.assertEqual(rc, 1, err)
        self.assertIn("server error not_found on no-such-conv", err)
        self.assertIn("every subscription has ended", err)

    def test_bad_arguments_exit_2(self):
        url = "ws://127.0.0.1:1/v1/ws"
        cases = [
            (["--url", "http://127.0.0.1:1/v1/ws", "--token", "t", "--conv", "c"], "must start with ws:// or wss://"),
            (["--url", "wss://h/v1/ws", "--token", "t", "--conv", "c", "--tls-ca", "/no/such/ca.pem"],
             "TLS: cannot read the CA certificates /no/such/ca.pem"),
            (["--token", "t", "--conv", "c"], "--url is required"),
            (["--url", url, "--conv", "c"], "--token"),
            (["--url", url, "--token", "t"], "--conv is required"),
            (["--url", url, "--token", "t", "--conv", "bad conv"], "conversation id"),
            (["--url", url, "--token", "t", "--conv", "c", "--watermark", "-3"], "--watermark"),
            (["--url", url, "--token", "t", "--conv", "c", "--backoff", "linear"], "--backoff"),
            (["--url", url, "--token", "t", "--conv", "c", "--bogus"], "unknown argument"),
            (["--url"], "needs a value"),
        ]
        for args, want in cases:
            with self.subTest(args=args):
                p = subprocess.run([harness.binary(), "tail"] + args, capture_output=True, timeout=10,
                                   env={k: v for k, v in os.environ.items() if k != "CONVERGER_TOKEN"})
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertIn(want, p.stderr.decode())
                self.assertEqual(p.stdout, b"")
        p = subprocess.run([harness.binary(), "tail", "--help"], capture_output=True, timeout=10)
        self.assertEqual(p.returncode, 0)
        self.assertIn(b"usage: converger tail", p.stdout)


if __name__ == "__main__":
    harness.main()
