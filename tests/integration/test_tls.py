"""TLS at the edge and in the C library: deploy/haproxy/converger.cfg with
its TLS frontend (CONVERGER_HAPROXY_TLS_BIND, a certificate made here by
a CA made here) in front of a real node, and through it:

- the C library (`converger tail --url wss://localhost:PORT/v1/ws
  --tls-ca ca.pem`) with verification on: the history, then a live message;
- python3-websockets with an ssl context that trusts the same CA;
- refusals that say why: without the CA (the system's do not know it), and
  to an address the certificate does not name (127.0.0.1: it names
  localhost only); the client keeps trying, and no message is printed;
- HTTPS: REST through the same frontend, and the operator's routes refused
  at the edge.

HAProxy and the node are started here and stopped by their pids."""

import asyncio
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import NodeCase, mint_token  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "deploy", "haproxy", "converger.cfg")


def openssl(*args, cwd):
    r = subprocess.run(["openssl"] + list(args), cwd=cwd, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise AssertionError("openssl %s: %s" % (" ".join(args), r.stderr))


def make_certs(d):
    """ca.pem, and server.pem (certificate and key) for DNS:localhost, signed by it."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=converger test CA", cwd=d)
    openssl("req", *ec, "-keyout", "srv.key", "-out", "srv.csr", "-subj", "/CN=localhost", cwd=d)
    with open(os.path.join(d, "ext.cnf"), "w") as f:
        f.write("subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "srv.pem", "-days", "2", "-extfile", "ext.cnf", cwd=d)
    with open(os.path.join(d, "server.pem"), "w") as out:
        for name in ("srv.pem", "srv.key"):
            with open(os.path.join(d, name)) as f:
                out.write(f.read())


class Tls(NodeCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="converger-tls-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        make_certs(self.dir)
        self.ca = os.path.join(self.dir, "ca.pem")
        self.node = self.node_start()
        self.tls_port = harness.free_port()
        env = dict(os.environ,
                   CONVERGER_HAPROXY_BIND="127.0.0.1:%d" % harness.free_port(),
                   CONVERGER_HAPROXY_STATS_BIND="127.0.0.1:%d" % harness.free_port(),
                   CONVERGER_HAPROXY_TLS_BIND="127.0.0.1:%d" % self.tls_port,
                   CONVERGER_HAPROXY_TLS_CRT=os.path.join(self.dir, "server.pem"))
        for i in (1, 2, 3):  # the one node, three times
            env["CONVERGER_HAPROXY_NODE%d" % i] = "127.0.0.1:%d" % self.node.port
        self.haproxy = subprocess.Popen(["haproxy", "-f", CONFIG, "-db"], env=env, stdout=subprocess.DEVNULL,
                                        stderr=open(os.path.join(self.dir, "haproxy.log"), "w"))
        harness._register(self.haproxy)
        self.addCleanup(self.stop_haproxy)
        end = time.monotonic() + 15
        while time.monotonic() < end:
            try:
                if self.https("/readyz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        with open(os.path.join(self.dir, "haproxy.log")) as f:
            self.fail("HAProxy's TLS frontend never answered /readyz:\n" + f.read())

    def stop_haproxy(self):
        if self.haproxy.poll() is None:
            os.kill(self.haproxy.pid, signal.SIGTERM)
            try:
                self.haproxy.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.haproxy.pid, signal.SIGKILL)
                self.haproxy.wait(5)
        harness._unregister(self.haproxy)

    def https(self, path, method="GET", body=None, key=harness.API_KEY):
        ctx = ssl.create_default_context(cafile=self.ca)
        req = urllib.request.Request("https://localhost:%d%s" % (self.tls_port, path), method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": "Bearer " + key})
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=5) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            body = e.read()
            try:
                return e.code, json.loads(body or b"null")
            except ValueError:
                return e.code, body.decode("utf-8", "replace")  # HAProxy's own page

    def tail(self, url, conv, *extra, seconds=None):
        args = [harness.binary(), "tail", "--url", url, "--token", mint_token("ann", [conv]), "--conv", conv,
                "--watermark", "0"] + list(extra)
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        harness._register(p)
        try:
            out, err = p.communicate(timeout=seconds or 20)
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGTERM)  # it retries for ever: stopped by its pid
            out, err = p.communicate(timeout=5)
        harness._unregister(p)
        return p.returncode, out, err

    def test_the_c_library_and_python_through_tls_with_verification(self):
        conv = self.node.new_conv()
        st, js = self.https("/v1/conversations/%s/messages" % conv, "POST", {"sender": "bot", "body": {"n": 1}})
        self.assertEqual(st, 201, js)  # REST over HTTPS
        self.assertEqual(self.https("/admin/status")[0], 404)  # not through the edge
        self.assertEqual(self.https("/metrics")[0], 404)

        async def python_client():
            import websockets
            ctx = ssl.create_default_context(cafile=self.ca)
            async with websockets.connect("wss://localhost:%d/v1/ws" % self.tls_port, ssl=ctx,
                                          subprotocols=["converger.v1"]) as ws:
                await ws.send(json.dumps({"type": "hello", "token": mint_token("bob", [conv]),
                                          "subs": [{"conv": conv, "watermark": 0}]}))
                frames = [json.loads(await asyncio.wait_for(ws.recv(), 5)) for _ in range(3)]
                return [f["type"] for f in frames]
        self.assertEqual(self.arun(python_client()), ["welcome", "msg", "synced"])

        url = "wss://localhost:%d/v1/ws" % self.tls_port
        import threading
        threading.Timer(1.0, lambda: self.node.send(conv, {"n": 2})).start()
        rc, out, err = self.tail(url, conv, "--tls-ca", self.ca, "--max-messages", "2")
        self.assertEqual(rc, 0, err)
        self.assertEqual([json.loads(l)["body"] for l in out.splitlines()], [{"n": 1}, {"n": 2}])
        self.assertIn("connected", err)

    def test_refusals_say_why(self):
        conv = self.node.new_conv()
        self.node.send(conv, {"n": 1})
        # the CA is not the system's: verification fails, nothing is printed
        rc, out, err = self.tail("wss://localhost:%d/v1/ws" % self.tls_port, conv, seconds=3)
        self.assertEqual(out, "")
        self.assertIn("TLS: certificate verify failed for localhost: unable to get local issuer certificate", err)
        # an address the certificate does not name
        rc, out, err = self.tail("wss://127.0.0.1:%d/v1/ws" % self.tls_port, conv, "--tls-ca", self.ca, seconds=3)
        self.assertEqual(out, "")
        self.assertIn("TLS: certificate verify failed for 127.0.0.1: IP address mismatch", err)
        # plain WebSocket to the TLS port: a clear failure, not a hang
        rc, out, err = self.tail("ws://localhost:%d/v1/ws" % self.tls_port, conv, seconds=3)
        self.assertEqual(out, "")
        self.assertTrue("upgrade" in err or "closed" in err, err)


if __name__ == "__main__":
    harness.main()
