"""Tokens minted by an application's backend: RS256 and ES256 verified with
public keys from CONVERGER_TOKEN_PUBLIC_KEYS (a JWKS file and a PEM file),
chosen by kid, with the algorithm pinned per key; a wrong kid, a wrong
alg, alg none, HS256 signed with a public key (alg confusion) and an
expired token refused; a rotation by rewriting the JWKS (noticed without a
signal) and by SIGHUP; iss and aud checks; a bad key file refusing the
start. Tokens are made here with python3-cryptography (Debian's), and the
clients are python3-websockets."""

import asyncio
import base64
import hashlib
import hmac
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import NodeCase, WsClient, uid  # noqa: E402

from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa  # noqa: E402
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature  # noqa: E402


def b64u(b):
    if isinstance(b, str):
        b = b.encode()
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def int_b64u(n, length=None):
    length = length or (n.bit_length() + 7) // 8
    return b64u(n.to_bytes(length, "big"))


def mint(key, alg, kid, sub="ann", convs=("*",), ttl=600, exp=None, claims=None, header=None):
    """A JWT signed by `key` (an RSA or EC private key, or bytes for HS256)."""
    h = {"alg": alg, "typ": "JWT"}
    if kid is not None:
        h["kid"] = kid
    h.update(header or {})
    now = int(time.time())
    c = {"sub": sub, "convs": list(convs), "jti": uid("jti"), "iat": now,
         "exp": exp if exp is not None else now + ttl}
    c.update(claims or {})
    signing = (b64u(json.dumps(h, separators=(",", ":"))) + "." +
               b64u(json.dumps(c, separators=(",", ":")))).encode()
    if alg == "RS256":
        sig = key.sign(signing, padding.PKCS1v15(), hashes.SHA256())
    elif alg == "ES256":
        r, s = decode_dss_signature(key.sign(signing, ec.ECDSA(hashes.SHA256())))
        sig = r.to_bytes(32, "big") + s.to_bytes(32, "big")  # JOSE: r || s (RFC 7518, 3.4)
    elif alg == "HS256":
        sig = hmac.new(key, signing, hashlib.sha256).digest()
    else:  # none
        sig = b""
    return signing.decode() + "." + b64u(sig)


def jwk_rsa(kid, key):
    n = key.public_key().public_numbers()
    return {"kty": "RSA", "kid": kid, "use": "sig", "alg": "RS256", "n": int_b64u(n.n), "e": int_b64u(n.e)}


def jwk_ec(kid, key):
    n = key.public_key().public_numbers()
    return {"kty": "EC", "kid": kid, "crv": "P-256", "x": int_b64u(n.x, 32), "y": int_b64u(n.y, 32)}


def pem_public(key):
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo)


def write_atomic(path, data):
    tmp = path + ".new"
    with open(tmp, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())
    os.replace(tmp, path)


class TokenKeys(NodeCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="converger-keys-")
        cls.rsa1 = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        cls.rsa2 = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        cls.ec1 = ec.generate_private_key(ec.SECP256R1())
        cls.ec_pem = ec.generate_private_key(ec.SECP256R1())
        cls.jwks = os.path.join(cls.dir, "jwks.json")
        cls.pem = os.path.join(cls.dir, "backend-2026.pem")
        write_atomic(cls.jwks, json.dumps({"keys": [
            jwk_rsa("r1", cls.rsa1), jwk_ec("e1", cls.ec1),
            {"kty": "oct", "kid": "sym", "k": "c2VjcmV0"},          # skipped: not a public key
            dict(jwk_rsa("enc", cls.rsa2), use="enc")]}))           # skipped: not for signatures
        write_atomic(cls.pem, pem_public(cls.ec_pem))
        cls.node = cls.class_node({"CONVERGER_TOKEN_PUBLIC_KEYS": cls.jwks + "," + cls.pem})

    @classmethod
    def tearDownClass(cls):
        subprocess.run(["rm", "-rf", cls.dir])

    convs = {}

    def hello(self, token, node=None):
        """(welcome or error frame, close code or None)."""
        node = node or self.node
        if node.port not in self.convs:
            self.convs[node.port] = node.new_conv()
        conv = self.convs[node.port]

        async def go():
            c = await WsClient.connect(node)
            try:
                await c.send_json({"type": "hello", "token": token,
                                   "subs": [{"conv": conv, "watermark": None}]})
                m = await c.recv_json()
                if m["type"] == "welcome":
                    return m, None
                code, _, _ = await c.wait_closed()
                return m, code
            finally:
                await c.close()
        return self.arun(go())

    def assertAccepted(self, token, node=None):
        m, code = self.hello(token, node)
        self.assertEqual(m["type"], "welcome", m)

    def assertRefused(self, token, message, node=None):
        m, code = self.hello(token, node)
        self.assertEqual((m["type"], m.get("code"), code), ("error", "unauthorized", 1008), m)
        self.assertEqual(m["message"], message, m)

    def test_rs256_and_es256_by_kid(self):
        self.assertAccepted(mint(self.rsa1, "RS256", "r1"))
        self.assertAccepted(mint(self.ec1, "ES256", "e1"))
        self.assertAccepted(mint(self.ec_pem, "ES256", "backend-2026"))  # the PEM file's name
        # the node's own HS256 tokens keep working beside them
        self.assertAccepted(harness.mint_token("ann", ["*"]))
        log = self.node.log_text()
        self.assertIn("token keys: 3 public key(s)", log)
        self.assertIn("key sym", log)
        self.assertIn("key enc is for \"enc\"", log)

    def test_the_c_library_with_rs256_and_es256(self):
        """converger tail (the C library) with a backend's RS256 and ES256
        tokens: each prints the conversation's messages; a token with an
        unknown kid ends tail (exit 1) with the node's reason."""
        conv = self.node.new_conv()
        for i in range(3):
            self.node.send(conv, {"i": i})
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONVERGER_")}
        for name, token in (("RS256", mint(self.rsa1, "RS256", "r1", convs=(conv,))),
                            ("ES256", mint(self.ec_pem, "ES256", "backend-2026", convs=(conv,)))):
            with self.subTest(alg=name):
                r = subprocess.run([harness.binary(), "tail", "--url", self.node.ws_url, "--token", token,
                                    "--conv", conv, "--watermark", "0", "--max-messages", "3"],
                                   capture_output=True, text=True, timeout=30, env=env)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertEqual([json.loads(x)["seq"] for x in r.stdout.splitlines()], [1, 2, 3])
        r = subprocess.run([harness.binary(), "tail", "--url", self.node.ws_url,
                            "--token", mint(self.rsa1, "RS256", "nope", convs=(conv,)),
                            "--conv", conv, "--watermark", "0"],
                           capture_output=True, text=True, timeout=30, env=env)
        self.assertEqual(r.returncode, 1, r.stderr)  # a refused token ends tail
        self.assertIn("unknown token kid", r.stderr)
        self.assertEqual(r.stdout, "")

    def test_refusals(self):
        self.assertRefused(mint(self.rsa1, "RS256", "nope"), "unknown token kid")
        self.assertRefused(mint(self.rsa1, "RS256", None), "token has no kid")  # 3 keys: kid needed
        self.assertRefused(mint(self.rsa1, "RS256", "e1"), "token alg does not match its key")
        self.assertRefused(mint(self.ec1, "ES256", "r1"), "token alg does not match its key")
        self.assertRefused(mint(self.rsa2, "RS256", "r1"), "bad token signature")  # another key
        self.assertRefused(mint(None, "none", "r1"), "token alg must be HS256, RS256 or ES256")
        self.assertRefused(mint(self.rsa1, "RS256", "r1", exp=int(time.time()) - 60), "token expired")
        self.assertRefused(mint(None, "none", "r1", header={"alg": "RS384"}),
                           "token alg must be HS256, RS256 or ES256")
        # alg confusion: HS256 "signed" with the public key's PEM as the secret
        confused = mint(pem_public(self.rsa1), "HS256", "r1")
        self.assertRefused(confused, "bad token signature")

    def test_rotation_by_file_change_and_by_sighup(self):
        path = os.path.join(self.dir, "rot-%s.json" % uid("k"))
        write_atomic(path, json.dumps({"keys": [jwk_rsa("old", self.rsa1)]}))
        n = self.node_start({"CONVERGER_TOKEN_PUBLIC_KEYS": path})
        self.assertAccepted(mint(self.rsa1, "RS256", "old"), n)
        self.assertAccepted(mint(self.rsa1, "RS256", None), n)  # one key: kid may be left out
        # a new key beside the old, then the old one gone: noticed within the tick
        write_atomic(path, json.dumps({"keys": [jwk_rsa("old", self.rsa1), jwk_rsa("new", self.rsa2)]}))
        deadline = time.time() + 5
        while True:
            m, _ = self.hello(mint(self.rsa2, "RS256", "new"), n)
            if m["type"] == "welcome" or time.time() > deadline:
                break
            time.sleep(0.2)
        self.assertEqual(m["type"], "welcome", m)
        # a broken file: the keys in use stay, and the log says why
        write_atomic(path, "{not json")
        time.sleep(2.5)
        self.assertAccepted(mint(self.rsa2, "RS256", "new"), n)
        self.assertIn("token keys not reloaded", n.log_text())
        # SIGHUP: only the new key now
        write_atomic(path, json.dumps({"keys": [jwk_rsa("new", self.rsa2)]}))
        os.kill(n.proc.pid, signal.SIGHUP)
        time.sleep(0.5)
        self.assertRefused(mint(self.rsa1, "RS256", "old"), "unknown token kid", n)
        self.assertAccepted(mint(self.rsa2, "RS256", "new"), n)
        _, _, metrics = n.get_text("/metrics")
        self.assertRegex(metrics, r'converger_token_key_reloads_total\{result="ok"\} [2-9]')
        self.assertRegex(metrics, r'converger_token_key_reloads_total\{result="error"\} [1-9]')

    def test_issuer_and_audience(self):
        n = self.node_start({"CONVERGER_TOKEN_PUBLIC_KEYS": self.jwks,
                             "CONVERGER_TOKEN_ISSUER": "https://auth.example",
                             "CONVERGER_TOKEN_AUDIENCE": "converger"})
        good = {"iss": "https://auth.example", "aud": ["billing", "converger"]}
        self.assertAccepted(mint(self.rsa1, "RS256", "r1", claims=good), n)
        self.assertAccepted(mint(self.rsa1, "RS256", "r1", claims={"iss": good["iss"], "aud": "converger"}), n)
        self.assertRefused(mint(self.rsa1, "RS256", "r1", claims={"aud": "converger"}),
                           "token iss is not CONVERGER_TOKEN_ISSUER", n)
        self.assertRefused(mint(self.rsa1, "RS256", "r1", claims={"iss": good["iss"], "aud": "other"}),
                           "token aud does not name CONVERGER_TOKEN_AUDIENCE", n)
        self.assertRefused(harness.mint_token("ann", ["*"]),
                           "token iss is not CONVERGER_TOKEN_ISSUER", n)
        # the node's own tokens carry both
        tok = n.token("ann", ["*"])["token"]
        self.assertEqual(harness.decode_token(tok)[1]["iss"], "https://auth.example")
        self.assertAccepted(tok, n)

    def test_the_protocol_docs_openssl_recipe(self):
        """docs/protocol.md's shell + OpenSSL recipe, run as written (the key
        directory moved into a temporary one): its token opens a session."""
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        doc = open(os.path.join(root, "docs", "protocol.md")).read()
        start = doc.index("**Minting a token in any language.**")
        block = doc[doc.index("```sh\n", start) + 6:doc.index("```", doc.index("```sh\n", start) + 6)]
        work = tempfile.mkdtemp(dir=self.dir)
        script = block.replace("/etc/converger/keys", work)
        p = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=work,
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        token = p.stdout.strip().splitlines()[-1]
        n = self.node_start({"CONVERGER_TOKEN_PUBLIC_KEYS": os.path.join(work, "2026-12.pem")})
        self.convs[n.port] = n.create_conv(n.create_channel()["id"], id="support-42")["id"]
        m, _ = self.hello(token, n)
        self.assertEqual(m["type"], "welcome", m)
        self.assertEqual([s["conv"] for s in m["subs"]], ["support-42"])

    def test_bad_key_files_refuse_the_start(self):
        missing = os.path.join(self.dir, "missing.pem")
        bad = os.path.join(self.dir, "bad.pem")
        with open(bad, "w") as f:
            f.write("-----BEGIN PUBLIC KEY-----\nnot base64\n-----END PUBLIC KEY-----\n")
        for spec, want in ((missing, "cannot open %s" % missing),
                           (bad, "%s: not a PEM public key" % bad),
                           (self.jwks + "," + self.jwks, "%s: a second key with kid r1" % self.jwks)):
            n = harness.Node({"CONVERGER_TOKEN_PUBLIC_KEYS": spec}, start=False)
            try:
                p = subprocess.run([harness.binary(), "serve"], env=n.environment(),
                                   capture_output=True, text=True, timeout=20)
            finally:
                n.remove_dir()
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("CONVERGER_TOKEN_PUBLIC_KEYS: " + want, p.stdout + p.stderr)


if __name__ == "__main__":
    harness.main()
