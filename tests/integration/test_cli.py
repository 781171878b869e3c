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
        self.assertGreaterEqual(len(read(secret_path)), 32, "a generated token secret the node accepts")
        self.assertNotIn(key, n.log_text(), "the generated API key is in the log")
        self.assertIn("API key in %s" % key_path, n.log_text(), "the log says where the key is")
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
        # Neither secret is in the log: not when generated, not when read again.
        log = n.log_text()
        self.assertEqual(log.count("API key in %s" % key_path), 2, log)
        self.assertNotIn(key, log, "the API key is in the log")
        self.assertNotIn(read(secret_path), log, "the token secret is in the log")
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
                r = self.run_cli(*args, env=clean_env(CONVERGER_TOKEN_SECRET="s" * 32))
                self.assertEqual(r.returncode, 2, (r.stdout, r.stderr))
                self.assertEqual(r.stdout, "")
                self.assertTrue(r.stderr.strip())

    def serve_until_exit(self, env, args=(), cwd=None, timeout=10):
        """converger serve on a free port: (exit status, stderr) once it
        exits; a node still running after `timeout` s is stopped by pid and
        the test fails."""
        d = cwd or tempfile.mkdtemp(prefix="converger-cli-")
        if cwd is None:
            self.addCleanup(shutil.rmtree, d, True)
        e = clean_env(CONVERGER_LISTEN="127.0.0.1:%d" % harness.free_port(),
                      CONVERGER_ADMIN_LISTEN="127.0.0.1:%d" % harness.free_port(),
                      CONVERGER_DATABASE_URL="sqlite:%s/converger.db" % d, **env)
        p = subprocess.Popen([harness.BINARY, "serve", *args], env=e, cwd=d, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        harness._register(p)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate(timeout=5)
            self.fail("converger serve still running after %d s; it should have refused to start; "
                      "output:\n%s%s" % (timeout, out, err))
        finally:
            harness._unregister(p)
        return p.returncode, out + err

    def test_short_token_secret_refused_at_start(self):
        short = "s" * 31
        for how, env, args, named in (
                ("environment", {"CONVERGER_TOKEN_SECRET": short}, (), "CONVERGER_TOKEN_SECRET"),
                ("flag", {}, ("--token-secret", short), "--token-secret"),
                ("flag=", {}, ("--token-secret=" + short,), "--token-secret"),
                # a rotation list: every secret in it must be long enough
                ("list", {"CONVERGER_TOKEN_SECRET": "t" * 32 + "," + short}, (),
                 "CONVERGER_TOKEN_SECRET")):
            with self.subTest(how=how):
                rc, out = self.serve_until_exit(dict(env, CONVERGER_API_KEY="k" * 32), args)
                self.assertEqual(rc, 2, out)
                lines = out.strip().splitlines()
                self.assertEqual(len(lines), 1, out)
                self.assertIn(named, lines[0])
                self.assertIn("at least 32 bytes", lines[0])
                self.assertNotIn(short, lines[0], "the secret itself is not printed")
        # converger token reads the same settings: it refuses to sign with it
        r = self.run_cli("token", "--sub", "alice", "--convs", "c",
                         env=clean_env(CONVERGER_TOKEN_SECRET=short))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertEqual(r.stdout, "")
        self.assertIn("CONVERGER_TOKEN_SECRET", r.stderr)
        self.assertIn("at least 32 bytes", r.stderr)
        # 32 bytes is enough
        r = self.run_cli("token", "--sub", "alice", "--convs", "c",
                         env=clean_env(CONVERGER_TOKEN_SECRET="s" * 32))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.count("."), 2, r.stdout)

    def test_public_url_the_client_library_would_refuse_is_refused_at_start(self):
        # the node's public URL is what clients and drain frames are given:
        # one the client library refuses (common/urlauth.h) reaches no one
        for url, why in (("ws://user:pw@gw.example:8080/v1/ws", "user info"),
                         ("ws://gw.example:0/v1/ws", "want 1..65535"),
                         ("ws://fe80::1/v1/ws", "brackets"),
                         ("wss://gw_1!.example/v1/ws", "bad character"),
                         # the scheme in any case, as the clients read it:
                         # its authority is checked as a lowercase one's
                         ("WSS://user:pw@gw.example/v1/ws", "user info"),
                         ("Ws://gw.example:0/v1/ws", "want 1..65535")):
            with self.subTest(url=url):
                rc, out = self.serve_until_exit({"CONVERGER_PUBLIC_URL": url,
                                                 "CONVERGER_API_KEY": "k" * 32})
                self.assertEqual(rc, 2, out)
                self.assertIn("CONVERGER_PUBLIC_URL", out)
                self.assertIn(why, out)

    def test_short_token_secret_file_refused_at_start(self):
        d = tempfile.mkdtemp(prefix="converger-cli-")
        self.addCleanup(shutil.rmtree, d, True)
        path = os.path.join(d, "token-secret")
        with open(path, "w") as f:
            f.write("short-secret\n")
        os.chmod(path, 0o600)
        rc, out = self.serve_until_exit({"CONVERGER_API_KEY": "k" * 32}, cwd=d)
        self.assertEqual(rc, 1, out)
        self.assertIn(path, out)
        self.assertIn("at least 32 bytes", out)
        self.assertNotIn("short-secret", out)
        r = self.run_cli("token", "--sub", "alice", "--convs", "c",
                         env=clean_env(CONVERGER_DATABASE_URL="sqlite:%s/converger.db" % d))
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertEqual(r.stdout, "")

    def test_unknown_command_exit_2(self):
        r = self.run_cli("launch")
        self.assertEqual(r.returncode, 2)
        self.assertIn("unknown command", r.stderr)


if __name__ == "__main__":
    harness.main()
