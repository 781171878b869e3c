"""converger send against a real node: the answer on stdout, the message
really stored, idempotent retries with one key, usage errors (exit 2), HTTP
errors (exit 1), a closed port, a 503 with a retry hint (from a scripted
server in this process), and a node that starts only after the command did
(the "node restarting" case)."""

import http.server
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import NodeCase, free_port, uid  # noqa: E402

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVERGER_")}
    env.update(extra)
    return env


class SendCli(NodeCase):
    @classmethod
    def setUpClass(cls):
        cls.node = cls.class_node()
        cls.url = "http://127.0.0.1:%d" % cls.node.port

    def run_send(self, *args, env=None, timeout=30):
        return subprocess.run([harness.BINARY, "send", *args], env=env or clean_env(),
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout)

    def send_args(self, conv, *extra, url=None, key=harness.API_KEY, sender="alice"):
        args = ["--url", url or self.url, "--conv", conv, "--sender", sender]
        if key is not None:
            args += ["--api-key", key]
        return args + list(extra)

    def test_send_prints_seq_and_id_and_stores_the_message(self):
        conv = self.node.new_conv()
        r = self.run_send(*self.send_args(conv, '{"text": "hello", "n": [1, 2]}'))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr, "")
        self.assertTrue(r.stdout.endswith("\n") and r.stdout.count("\n") == 1, repr(r.stdout))
        out = json.loads(r.stdout)
        self.assertEqual(set(out), {"seq", "id"})
        self.assertEqual(out["seq"], 1)
        self.assertRegex(out["id"], UUID, "a generated idempotency key is a random UUID")
        self.assertEqual(r.stdout, '{"seq":1,"id":"%s"}\n' % out["id"])
        msgs, head = self.node.all_messages(conv)
        self.assertEqual(head, 1)
        self.assertEqual(len(msgs), 1)
        self.assertEqual(msgs[0]["seq"], 1)
        self.assertEqual(msgs[0]["id"], out["id"])
        self.assertEqual(msgs[0]["sender"], "alice")
        self.assertEqual(msgs[0]["body"], {"text": "hello", "n": [1, 2]})
        # any JSON value is a body, and --x=value works like --x value
        r = self.run_send("--url=" + self.url + "/", "--conv=" + conv, "--sender=bob",
                          "--api-key=" + harness.API_KEY, "--", "-12.5")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout)["seq"], 2)
        msgs, _ = self.node.all_messages(conv)
        self.assertEqual((msgs[1]["sender"], msgs[1]["body"]), ("bob", -12.5))

    def test_same_idempotency_key_same_seq(self):
        conv = self.node.new_conv()
        self.node.send(conv, {"text": "first"})
        key = uid("key")
        r1 = self.run_send(*self.send_args(conv, "--idempotency-key", key, '{"text":"once"}'))
        r2 = self.run_send(*self.send_args(conv, "--idempotency-key=" + key, '{"text":"once"}'))
        self.assertEqual(r1.returncode, 0, r1.stderr)
        self.assertEqual(r2.returncode, 0, r2.stderr)
        self.assertEqual(r1.stdout, '{"seq":2,"id":"%s"}\n' % key)
        self.assertEqual(r2.stdout, r1.stdout)
        msgs, head = self.node.all_messages(conv)
        self.assertEqual(head, 2)
        self.assertEqual([m["id"] for m in msgs][1:], [key])

    def test_api_key_from_the_environment(self):
        conv = self.node.new_conv()
        r = self.run_send(*self.send_args(conv, "{}", key=None),
                          env=clean_env(CONVERGER_API_KEY=harness.API_KEY))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout)["seq"], 1)

    def test_usage_errors_exit_2(self):
        conv = self.node.new_conv()
        cases = {
            "bad JSON body": self.send_args(conv, '{"text": '),
            "body not JSON": self.send_args(conv, "hello"),
            "missing --conv": ["--url", self.url, "--sender", "a", "--api-key", "k", "{}"],
            "missing --sender": ["--url", self.url, "--conv", conv, "--api-key", "k", "{}"],
            "missing --url": ["--conv", conv, "--sender", "a", "--api-key", "k", "{}"],
            "missing key": self.send_args(conv, "{}", key=None),
            "missing body": self.send_args(conv),
            "two bodies": self.send_args(conv, "{}", "{}"),
            "unknown option": self.send_args(conv, "--colour", "red", "{}"),
            "value missing": self.send_args(conv, "{}", "--retries"),
            "bad retries": self.send_args(conv, "--retries", "-1", "{}"),
            "retries not a number": self.send_args(conv, "--retries=lots", "{}"),
            "bad timeout": self.send_args(conv, "--timeout-ms", "0", "{}"),
            "bad conv id": self.send_args("a/b", "{}"),
            "bad key": self.send_args(conv, "--idempotency-key", "a b", "{}"),
            "--tls-ca for http": self.send_args(conv, "--tls-ca", "ca.pem", "{}"),
            "not a URL": self.send_args(conv, "{}", url="127.0.0.1:%d" % self.node.port),
        }
        for name, args in cases.items():
            with self.subTest(name):
                r = self.run_send(*args)
                self.assertEqual(r.returncode, 2, (r.stdout, r.stderr))
                self.assertEqual(r.stdout, "")
                lines = r.stderr.strip().splitlines()
                self.assertEqual(len(lines), 1, r.stderr)
                self.assertTrue(lines[0].startswith("converger send: "), r.stderr)
        r = self.run_send(*self.send_args(conv, "{nope"))
        self.assertIn("not valid JSON", r.stderr)
        r = self.run_send("--url", self.url, "--sender", "a", "--api-key", "k", "{}")
        self.assertIn("--conv is required", r.stderr)
        # https to a port that speaks plain HTTP: a failure that says so, not a hang
        r = self.run_send(*self.send_args(conv, "--retries", "0", "{}", url="https://127.0.0.1:%d" % self.node.port))
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("TLS", r.stderr)
        self.assertEqual(self.node.all_messages(conv)[1], 0, "nothing was sent")

    def test_help(self):
        r = self.run_send("--help")
        self.assertEqual(r.returncode, 0)
        self.assertIn("usage: converger send", r.stdout)
        self.assertEqual(r.stderr, "")
        r = subprocess.run([harness.BINARY, "--help"], capture_output=True, text=True, timeout=10)
        self.assertIn("send", r.stdout)

    def test_http_errors_exit_1_with_the_servers_error(self):
        conv = self.node.new_conv()
        r = self.run_send(*self.send_args(conv, "{}", key="wrong-key"))
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertEqual(r.stdout, "")
        self.assertIn("401", r.stderr)
        err = json.loads(r.stderr[r.stderr.index("{"):])
        self.assertErrorBody(err, "unauthorized")
        r = self.run_send(*self.send_args("no-such-conv", "{}"))
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("404", r.stderr)
        self.assertIn("not_found", r.stderr)
        self.assertNotIn("retrying", r.stderr, "a 4xx is not retried")

    def test_closed_port_gives_up_quickly(self):
        port = free_port()
        t0 = time.monotonic()
        r = self.run_send(*self.send_args("room", "--retries", "1", "{}",
                                          url="http://127.0.0.1:%d" % port))
        took = time.monotonic() - t0
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertEqual(r.stdout, "")
        self.assertLess(took, 5.0)
        lines = r.stderr.strip().splitlines()
        self.assertEqual(len(lines), 2, r.stderr)
        self.assertRegex(lines[0], r"refused, retrying in \d+ ms \(attempt 2 of 2\)$")
        self.assertIn("giving up after 2 attempts", lines[1])
        r = self.run_send(*self.send_args("room", "--retries=0", "{}",
                                          url="http://127.0.0.1:%d" % port))
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("giving up after 1 attempt:", r.stderr)

    def test_503_is_retried_after_the_hint_with_the_same_key(self):
        seen = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                seen.append((self.path, dict(self.headers), json.loads(body)))
                if len(seen) == 1:
                    out, st = {"error": {"code": "unavailable", "message": "busy",
                                         "retryAfterMs": 300}}, 503
                else:
                    out, st = {"seq": 7, "id": self.headers["Idempotency-Key"]}, 201
                data = json.dumps(out).encode()
                self.send_response(st)
                if st == 503:
                    self.send_header("Retry-After", "1")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        th = threading.Thread(target=srv.serve_forever, daemon=True)
        th.start()
        self.addCleanup(th.join, 5)
        self.addCleanup(srv.server_close)
        self.addCleanup(srv.shutdown)
        url = "http://127.0.0.1:%d/prefix/" % srv.server_address[1]
        t0 = time.monotonic()
        r = self.run_send(*self.send_args("room", '{"a":1}', url=url, key="K1"))
        took = time.monotonic() - t0
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, '{"seq":7,"id":"%s"}\n' % seen[1][1]["Idempotency-Key"])
        self.assertEqual(len(seen), 2)
        self.assertGreaterEqual(took, 0.3)
        self.assertRegex(r.stderr, r"^converger send: 503 from POST http://127\.0\.0\.1:\d+"
                                   r"/prefix/v1/conversations/room/messages.*, retrying in 300 ms "
                                   r"\(attempt 2 of 6\)\n$")
        for path, headers, body in seen:
            self.assertEqual(path, "/prefix/v1/conversations/room/messages")
            self.assertEqual(headers["Authorization"], "Bearer K1")
            self.assertEqual(headers["Content-Type"], "application/json")
            self.assertEqual(body, {"sender": "alice", "body": {"a": 1}})
        self.assertRegex(seen[0][1]["Idempotency-Key"], UUID)
        self.assertEqual(seen[0][1]["Idempotency-Key"], seen[1][1]["Idempotency-Key"])


class SendWhileNodeRestarts(NodeCase):
    def test_send_waits_for_a_node_that_is_restarting(self):
        n = self.node_start()
        n.create_channel(id="general", name="General")
        n.create_conv("general", id="room")
        self.assertEqual(n.stop(), 0)  # down: nothing listens on its port any more
        p = subprocess.Popen([harness.BINARY, "send", "--url", "http://127.0.0.1:%d" % n.port,
                              "--api-key", harness.API_KEY, "--conv", "room", "--sender", "alice",
                              "--idempotency-key", "restart-1", "--retries", "20",
                              '{"text":"sent while the node was down"}'],
                             env=clean_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)

        def stop():
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
            p.communicate(timeout=10)
        self.addCleanup(stop)
        time.sleep(1.0)
        self.assertIsNone(p.poll(), "converger send must still be retrying")
        n.start()  # same port, same data directory
        out, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 0, err)
        self.assertEqual(out, '{"seq":1,"id":"restart-1"}\n')
        self.assertRegex(err, r"Connection refused, retrying in \d+ ms \(attempt 2 of 21\)")
        msgs, head = n.all_messages("room")
        self.assertEqual(head, 1)
        self.assertEqual(msgs[0]["body"], {"text": "sent while the node was down"})


if __name__ == "__main__":
    harness.main()
