"""converger serve --help, generated secrets, and converger token against a
real node: a token the CLI prints is accepted by the node it was made for,
and the CLI never invents a secret of its own."""

import os
import shutil
import stat
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import NodeCase, Node, RawWs  # noqa: E402

SETTINGS = ["CONVERGER_LISTEN", "CONVERGER_DATABASE_URL", "CONVERGER_API_KEY",
            "CONVERGER_TOKEN_SECRET", "CONVERGER_NODE_ID", "CONVERGER_POOL_SIZE",
            "CONVERGER_MAX_MESSAGE_BYTES", "CONVERGER_HEARTBEAT_MS",
            "CONVERGER_HELLO_TIMEOUT_MS", "CONVERGER_SQLITE_SYNC"]


class SecretlessNode(Node):
    """A node started without CONVERGER_API_KEY/CONVERGER_TOKEN_SECRET."""

    def environment(self):
        env = super().environment()
        env.pop("CONVERGER_API_KEY")
        env.pop("CONVERGER_TOKEN_SECRET")
        return env


def read(path):
    with open(path) as f:
        return f.read().strip()


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVERGER_")}
    env.update(extra)
    return env


class Cli(NodeCase):
    def run_cli(self, *args, env=None, cwd=None):
        return subprocess.run([harness.BINARY, *args], env=env or clean_env(), cwd=cwd,
                              capture_output=True, text=True, timeout=20)

    def test_serve_help_lists_every_setting_with_defaults(self):
        r = self.run_cli("serve", "--help")
        self.assertEqual(r.returncode, 0, r.stderr)
        for name in SETTINGS:
            self.assertIn(name, r.stdout)
        for default in ("127.0.0.1:8080", "sqlite:data/converger.db", "65536", "25000", "10000"):
            self.assertIn(default, r.stdout)

    def test_generated_secrets_and_cli_token_accepted_by_the_node(self):
        n = SecretlessNode()
        self._test_nodes.append(n)
        self.addCleanup(n.ensure_stopped)
        self.addCleanup(n.finish)
        key_path = os.path.join(n.tmpdir, "api-key")
        secret_path = os.path.join(n.tmpdir, "token-secret")
        for p in (key_path, secret_path):
            self.assertTrue(os.path.exists(p), p)
            self.assertEqual(stat.S_IMODE(os.stat(p).st_mode), 0o600, p)
        key = read(key_path)
        self.assertGreaterEqual(len(key), 32)
        self.assertIn(key, n.log_text(), "the generated API key is printed at start")
        # REST works with the generated key, not with the test default.
        conv = "cli-room"
        st, _, _ = n.request("POST", "/v1/channels", {"id": "cli", "name": "CLI"}, key=key)
        self.assertEqual(st, 201)
        st, _, _ = n.request("POST", "/v1/conversations", {"id": conv, "channel": "cli"}, key=key)
        self.assertEqual(st, 201)
        self.assertEqual(n.request("GET", "/v1/conversations/" + conv)[0], 401)
        # The CLI signs with the node's stored secret, found through the URL.
        db_url = "sqlite:%s/converger.db" % n.tmpdir
        r = self.run_cli("token", "--sub=alice", "--convs", conv, "--ttl", "120",
                         env=clean_env(CONVERGER_DATABASE_URL=db_url))
        self.assertEqual(r.returncode, 0, r.stderr)
        token = r.stdout.strip()
        ws = RawWs(n.port)
        self.addCleanup(ws.close)
        ws.hello(token, [{"conv": conv, "watermark": None}])
        m = ws.recv_json()
        self.assertEqual(m.get("type"), "welcome", m)
        self.assertEqual([s["conv"] for s in m["subs"]], [conv])
        # A restart keeps the same secrets: the token still works.
        n.restart()
        self.assertEqual(read(key_path), key)
        ws2 = RawWs(n.port)
        self.addCleanup(ws2.close)
        ws2.hello(token, [{"conv": conv}])
        self.assertEqual(ws2.recv_json().get("type"), "welcome")

    def test_token_without_a_secret_fails_and_creates_nothing(self):
        d = tempfile.mkdtemp(prefix="converger-cli-")
        self.addCleanup(shutil.rmtree, d, True)
        r = self.run_cli("token", "--sub", "alice", "--convs", "room1", cwd=d)
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("CONVERGER_TOKEN_SECRET", r.stderr)
        self.assertEqual(r.stdout, "")
        self.assertEqual(os.listdir(d), [], "token must not create a data directory")

    def test_token_usage_errors_exit_2(self):
        for args in (("token",), ("token", "--sub", "alice"), ("token", "--sub", "a b", "--convs", "c"),
                     ("token", "--sub", "alice", "--convs", "c", "--ttl", "0"),
                     ("token", "--sub", "alice", "--convs", "bad id"),
                     ("token", "--sub", "alice", "--convs", "c", "--pool-size", "x")):
            with self.subTest(args=args):
                r = self.run_cli(*args, env=clean_env(CONVERGER_TOKEN_SECRET="s"))
                self.assertEqual(r.returncode, 2, (r.stdout, r.stderr))
                self.assertEqual(r.stdout, "")
                self.assertTrue(r.stderr.strip())

    def test_unknown_command_exit_2(self):
        r = self.run_cli("launch")
        self.assertEqual(r.returncode, 2)
        self.assertIn("unknown command", r.stderr)


if __name__ == "__main__":
    harness.main()
