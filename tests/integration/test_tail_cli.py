"""`converger tail` and its stdout: a reader that goes away (a pipe closed
after three lines, as `tail | head -3` does) ends tail with status 0 and
nothing alarming on stderr, whether or not messages keep coming; a write
that fails (stdout on /dev/full) ends it with status 1, a message naming
the error, and the failed message not counted as printed."""

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import NodeCase, mint_token  # noqa: E402

# What a reader going away must not print on tail's stderr.
ALARMING = ("error", "cannot", "broken pipe", "epipe", "sigpipe", "failed", "handles left open",
            "sanitizer", "runtime error")


class TailOutput(NodeCase):
    @classmethod
    def setUpClass(cls):
        cls.node = cls.class_node()

    def tail_env(self):
        return {k: v for k, v in os.environ.items() if k != "CONVERGER_TOKEN"}

    def start_tail(self, conv, stdout, extra=()):
        """tail --watermark 0 on conv, stdout as given, stderr into a file;
        stopped by pid in the cleanup."""
        err = tempfile.TemporaryFile(dir=self.node.tmpdir)
        self.addCleanup(err.close)
        args = [harness.binary(), "tail", "--url", self.node.ws_url, "--token",
                mint_token("tailer", [conv]), "--conv", conv, "--watermark", "0", *extra]
        p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=stdout, stderr=err,
                             env=self.tail_env())
        harness._register(p)
        self.addCleanup(self.stop, p)
        return p, err

    def stop(self, p):
        if p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
            p.wait(5)
        harness._unregister(p)

    def wait(self, p, seconds):
        try:
            return p.wait(seconds)
        except subprocess.TimeoutExpired:
            return None

    @staticmethod
    def text(f):
        f.seek(0)
        return f.read().decode("utf-8", "replace")

    def assertNotAlarming(self, err):
        for line in err.splitlines():
            for word in ALARMING:
                self.assertNotIn(word, line.lower(), "alarming stderr line %r in:\n%s" % (line, err))

    def read_lines(self, f, n, seconds):
        """n lines from the pipe f (a raw fd-backed file), within seconds."""
        deadline = time.monotonic() + seconds
        buf = b""
        while buf.count(b"\n") < n:
            left = deadline - time.monotonic()
            self.assertGreater(left, 0, "only %r within %.0f s" % (buf, seconds))
            r, _, _ = select.select([f], [], [], left)
            if r:
                chunk = os.read(f.fileno(), 65536)
                self.assertTrue(chunk, "EOF after %r" % buf)
                buf += chunk
        return buf.split(b"\n")[:n]

    def test_reader_closing_after_three_lines_ends_tail_with_0_on_a_quiet_conversation(self):
        # Six messages of history, none after: the reader goes away while
        # tail has nothing to write, as `tail --watermark 0 | head -3` on a
        # quiet conversation. tail must notice anyway.
        conv = self.node.new_conv()
        for i in range(6):
            self.node.send(conv, {"i": i})
        p, err = self.start_tail(conv, subprocess.PIPE)
        lines = self.read_lines(p.stdout, 3, 10)
        self.assertEqual([json.loads(l)["seq"] for l in lines], [1, 2, 3])
        p.stdout.close()
        t0 = time.monotonic()
        rc = self.wait(p, 5)
        self.assertEqual(rc, 0, "tail did not end with 0 within 5 s of its reader going away "
                         "(rc %r); stderr:\n%s" % (rc, self.text(err)))
        self.assertLess(time.monotonic() - t0, 5)
        self.assertNotAlarming(self.text(err))

    def test_pipe_into_head_3_while_messages_keep_coming(self):
        # tail | head -3, with both pids known: head exits after three lines
        # and every later write of tail meets a pipe without a reader.
        conv = self.node.new_conv()
        r, w = os.pipe()
        head = subprocess.Popen(["head", "-3"], stdin=r, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        self.addCleanup(self.stop, head)
        os.close(r)
        with os.fdopen(w, "wb") as wf:
            p, err = self.start_tail(conv, wf)
        stop = threading.Event()

        def sender():
            with self.node.session() as s:
                i = 0
                while not stop.is_set() and i < 400:
                    s.send(conv, {"i": i})
                    i += 1
                    time.sleep(0.02)
        th = threading.Thread(target=sender, daemon=True)
        th.start()
        self.addCleanup(th.join, 20)
        self.addCleanup(stop.set)
        out, herr = head.communicate(timeout=20)
        self.assertEqual(head.returncode, 0, herr)
        self.assertEqual([json.loads(l)["seq"] for l in out.splitlines()], [1, 2, 3])
        rc = self.wait(p, 5)
        stop.set()
        self.assertEqual(rc, 0, "tail did not end with 0 within 5 s of head's exit (rc %r); "
                         "stderr:\n%s" % (rc, self.text(err)))
        self.assertNotAlarming(self.text(err))

    def test_full_device_ends_tail_with_1_and_counts_nothing(self):
        conv = self.node.new_conv()
        for i in range(3):
            self.node.send(conv, {"i": i})
        for extra in ((), ("--max-messages", "2")):
            with self.subTest(extra=extra), open("/dev/full", "wb") as full:
                p, err = self.start_tail(conv, full, extra)
                rc = self.wait(p, 10)
                e = self.text(err)
                self.assertEqual(rc, 1, "want exit 1 within 10 s on /dev/full (rc %r); stderr:\n%s"
                                 % (rc, e))
                self.assertIn("converger tail: cannot write to stdout: No space left on device", e)
                summary = [l for l in e.splitlines() if "message(s); attempts" in l]
                self.assertEqual(len(summary), 1, e)
                self.assertIn("converger tail: 0 message(s);", summary[0])


if __name__ == "__main__":
    harness.main()
