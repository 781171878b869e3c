"""Rotating the API key and the HS256 token secret without a restart.

The node reads its API key and token secret from its data directory when
they are not set in the environment (data/api-key, data/token-secret). Each
file, and each setting, may hold several keys, one per line or separated by
commas: every API key is accepted; tokens are signed with the first secret
and verified with any. SIGHUP reads the files again. So a rotation is: add
the new key first (SIGHUP), move the clients to it, remove the old one
(SIGHUP); a file that cannot be used leaves the keys in use. No key is
logged."""

import asyncio
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import NodeCase, mint_token, open_client  # noqa: E402

OLD_KEY, NEW_KEY = "old-api-key-0123456789", "new-api-key-9876543210"
S1, S2 = "s1" * 20, "s2" * 20  # 40 bytes each


class KeyRotation(NodeCase):
    def node_with_files(self, api_key=None, secret=None):
        """A node whose API key (when `api_key` is given) and token secret
        (`secret`) come from its data directory's files."""
        env = {}
        if api_key is not None:
            env["CONVERGER_API_KEY"] = None  # unset: from the file
        if secret is not None:
            env["CONVERGER_TOKEN_SECRET"] = None
        n = harness.Node(env, start=False)
        self._test_nodes.append(n)
        self.addCleanup(n.ensure_stopped)
        if api_key is not None:
            self.write(n, "api-key", api_key)
        if secret is not None:
            self.write(n, "token-secret", secret)
        n.start()
        return n

    def write(self, n, name, text):
        with open(os.path.join(n.tmpdir, name), "w") as f:
            f.write(text)

    def hup(self, n, files):
        """SIGHUP, and wait for its line about each of the `files` secret files."""
        before = n.log_text().count("SIGHUP: ")
        os.kill(n.proc.pid, signal.SIGHUP)
        end = time.monotonic() + 5
        while time.monotonic() < end:
            if n.log_text().count("SIGHUP: ") >= before + files:
                return
            time.sleep(0.05)
        self.fail("no reload logged:\n" + n.log_tail(20))

    def status(self, n, key):
        return n.request("GET", "/admin/status", key=key)[0]

    def hello(self, n, token, conv):
        async def go():
            c = await harness.WsClient.connect(n)
            await c.send_json({"type": "hello", "token": token, "subs": [{"conv": conv, "watermark": None}]})
            m = await c.recv_json(5.0)
            await c.close()
            return m
        return self.arun(go())

    def test_api_key_rotation_with_sighup(self):
        n = self.node_with_files(OLD_KEY + "\n", S1 + "\n")
        self.assertEqual(self.status(n, OLD_KEY), 200)
        self.assertEqual(self.status(n, NEW_KEY), 401)
        # both, the new one first
        self.write(n, "api-key", NEW_KEY + "\n" + OLD_KEY + "\n")
        self.hup(n, 2)
        self.assertEqual(self.status(n, OLD_KEY), 200)
        self.assertEqual(self.status(n, NEW_KEY), 200)
        self.assertIn("api-key reloaded: 2 key(s) in use", n.log_text())
        # the old one gone
        self.write(n, "api-key", NEW_KEY + "\n")
        self.hup(n, 2)
        self.assertEqual(self.status(n, OLD_KEY), 401)
        self.assertEqual(self.status(n, NEW_KEY), 200)
        # an empty file is refused: the key in use stays
        self.write(n, "api-key", "\n")
        self.hup(n, 2)
        self.assertEqual(self.status(n, NEW_KEY), 200)
        self.assertIn("api-key not reloaded", n.log_text())
        log = n.log_text()
        for secret in (OLD_KEY, NEW_KEY, S1):
            self.assertNotIn(secret, log)

    def test_token_secret_rotation_with_sighup(self):
        n = self.node_with_files(secret=S1)
        conv = n.new_conv()
        # a token made with S1 before the rotation
        t1 = mint_token("ann", [conv], secret=S1)
        self.assertEqual(self.hello(n, t1, conv)["type"], "welcome")
        # S2 first, S1 still verifies; the node now signs with S2
        self.write(n, "token-secret", S2 + "\n" + S1 + "\n")
        self.hup(n, 1)
        self.assertEqual(self.hello(n, t1, conv)["type"], "welcome")
        self.assertEqual(self.hello(n, mint_token("bob", [conv], secret=S2), conv)["type"], "welcome")
        st, _, js = n.request("POST", "/v1/tokens", {"sub": "cy", "convs": [conv]})
        self.assertEqual(st, 201, js)
        signed = js["token"]
        head, claims, sig = signed.split(".")
        import base64
        import hashlib
        import hmac
        want = base64.urlsafe_b64encode(hmac.new(S2.encode(), (head + "." + claims).encode(),
                                                 hashlib.sha256).digest()).rstrip(b"=").decode()
        self.assertEqual(sig, want, "the node signs with the first secret")
        # S1 gone: its tokens are refused, S2's are not
        self.write(n, "token-secret", S2)
        self.hup(n, 1)
        m = self.hello(n, t1, conv)
        self.assertEqual((m["type"], m.get("code")), ("error", "unauthorized"), m)
        self.assertEqual(self.hello(n, signed, conv)["type"], "welcome")
        # a secret too short is refused: the ones in use stay
        self.write(n, "token-secret", "short\n")
        self.hup(n, 1)
        self.assertEqual(self.hello(n, signed, conv)["type"], "welcome")
        self.assertIn("token-secret not reloaded", n.log_text())

    def test_several_keys_in_the_environment(self):
        n = self.node_start({"CONVERGER_API_KEY": NEW_KEY + ", " + OLD_KEY + "," + harness.API_KEY,
                             "CONVERGER_TOKEN_SECRET": S2 + "," + S1})
        self.assertEqual(self.status(n, OLD_KEY), 200)
        self.assertEqual(self.status(n, NEW_KEY), 200)
        self.assertEqual(self.status(n, "neither"), 401)
        conv = n.new_conv()
        for s in (S1, S2):
            self.assertEqual(self.hello(n, mint_token("ann", [conv], secret=s), conv)["type"], "welcome")
        # each secret as long as one alone must be
        p = harness.Node({"CONVERGER_TOKEN_SECRET": S1 + ",tooshort"}, start=False)
        self.addCleanup(p.remove_dir)
        with self.assertRaises(harness.NodeStartError):
            p.start()
        self.assertIn("every secret at least 32 bytes", p.log_text())
        # no key, or more than 8: refused with a reason, not a silent exit
        for env, want in (({"CONVERGER_API_KEY": ","}, "CONVERGER_API_KEY: want 1 to 8 keys"),
                          ({"CONVERGER_API_KEY": ",".join("k%d" % i for i in range(9))},
                           "CONVERGER_API_KEY: want 1 to 8 keys"),
                          ({"CONVERGER_TOKEN_SECRET": ",".join([S1] * 9)}, "want 1 to 8 secrets")):
            q = harness.Node(env, start=False)
            self.addCleanup(q.remove_dir)
            with self.assertRaises(harness.NodeStartError):
                q.start()
            self.assertIn(want, q.log_text())


if __name__ == "__main__":
    harness.main()
