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
import contextlib
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


EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def sign_server_cert(d, name):
    """NAME.pem and NAME.key: a certificate for DNS:localhost signed by d's CA."""
    openssl("req", *EC, "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=localhost", cwd=d)
    with open(os.path.join(d, "ext.cnf"), "w") as f:
        f.write("subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", name + ".pem", "-days", "2", "-extfile", "ext.cnf", cwd=d)


def make_certs(d):
    """ca.pem; srv.pem and srv.key for DNS:localhost, signed by it; and
    server.pem (both in one file, as HAProxy takes them)."""
    openssl("req", "-x509", *EC, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=converger test CA", cwd=d)
    sign_server_cert(d, "srv")
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
        harness.stop_process(self.haproxy)

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
        # not through the edge: refused with the node's own JSON error shape
        refused = (404, {"error": {"code": "not_found", "message": "no such route"}})
        self.assertEqual(self.https("/admin/status"), refused)
        self.assertEqual(self.https("/metrics"), refused)

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


class NodeTls(NodeCase):
    """TLS in the node itself: CONVERGER_TLS_CERT and CONVERGER_TLS_KEY."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="converger-nodetls-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        make_certs(self.dir)
        self.ca = os.path.join(self.dir, "ca.pem")
        self.cert = os.path.join(self.dir, "srv.pem")
        self.key = os.path.join(self.dir, "srv.key")
        self.node = self.node_start(env={"CONVERGER_TLS_CERT": self.cert, "CONVERGER_TLS_KEY": self.key,
                                         "CONVERGER_DRAIN_SHUTDOWN_MS": "20000"})
        self.url = "wss://localhost:%d/v1/ws" % self.node.port

    def https(self, path, method="GET", body=None):
        ctx = ssl.create_default_context(cafile=self.ca)
        req = urllib.request.Request("https://localhost:%d%s" % (self.node.port, path), method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": "Bearer " + harness.API_KEY})
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=5) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    @contextlib.asynccontextmanager
    async def hello_over_tls(self, conv, **connect_options):
        """A python3-websockets client of the node over TLS, trusting the
        test's CA, its hello for `conv` (bob, from watermark 0) sent."""
        import websockets
        ctx = ssl.create_default_context(cafile=self.ca)
        async with websockets.connect(self.url, ssl=ctx, subprotocols=["converger.v1"], **connect_options) as ws:
            await ws.send(json.dumps({"type": "hello", "token": mint_token("bob", [conv]),
                                      "subs": [{"conv": conv, "watermark": 0}]}))
            yield ws

    def send(self, conv, n):
        st, js = self.https("/v1/conversations/%s/messages" % conv, "POST", {"sender": "bot", "body": {"n": n}})
        self.assertEqual(st, 201, js)

    def new_conv(self):
        st, js = self.https("/v1/channels", "POST", {"id": harness.uid("ch"), "name": "tls"})
        self.assertEqual(st, 201, js)
        st, js = self.https("/v1/conversations", "POST", {"channel": js["id"]})
        self.assertEqual(st, 201, js)
        return js["id"]

    def tls_counts(self):
        text = self.node.get_text("/metrics")[2]
        counts = {}
        for line in text.splitlines():
            if line.startswith("converger_tls_handshakes_total{"):
                counts[line.split('"')[1]] = int(float(line.split()[-1]))
        return counts

    def peer_serial(self):
        ctx = ssl.create_default_context(cafile=self.ca)
        import socket
        with socket.create_connection(("127.0.0.1", self.node.port), timeout=5) as raw:
            with ctx.wrap_socket(raw, server_hostname="localhost") as s:
                return s.getpeercert()["serialNumber"], s.version()

    def test_https_and_wss_served_by_the_node(self):
        conv = self.new_conv()
        self.send(conv, 1)  # REST over HTTPS
        self.assertEqual(self.https("/readyz"), (200, {"status": "ready"}))

        async def python_client():
            async with self.hello_over_tls(conv) as ws:
                frames = [json.loads(await asyncio.wait_for(ws.recv(), 5)) for _ in range(3)]
                return [f["type"] for f in frames]
        self.assertEqual(self.arun(python_client()), ["welcome", "msg", "synced"])

        import threading
        threading.Timer(1.0, lambda: self.send(conv, 2)).start()
        rc, out, err = Tls.tail(self, self.url, conv, "--tls-ca", self.ca, "--max-messages", "2")
        self.assertEqual(rc, 0, err)
        self.assertEqual([json.loads(l)["body"] for l in out.splitlines()], [{"n": 1}, {"n": 2}])
        # the node says where clients reach it: wss://
        self.assertIn("public URL wss://127.0.0.1:%d/v1/ws" % self.node.port, self.node.log_text())
        self.assertIn("listening on https://", self.node.log_text())
        # every handshake counted: curl-free REST (3), python, tail (at least one each)
        self.assertGreaterEqual(self.tls_counts().get("ok", 0), 5)
        text = self.node.get_text("/metrics")[2]
        self.assertRegex(text, r"converger_tls_handshake_ms_count [1-9]")
        self.assertEqual(self.peer_serial()[1] in ("TLSv1.2", "TLSv1.3"), True)

    def converger_send(self, url, *extra):
        return subprocess.run([harness.binary(), "send", "--url", url, "--api-key", harness.API_KEY, "--conv",
                               self.conv, "--sender", "cli", "--retries", "0"] + list(extra) + ['{"via":"https"}'],
                              capture_output=True, text=True, timeout=30)

    def test_converger_send_over_https_verifies_the_node(self):
        self.conv = self.new_conv()
        https = "https://localhost:%d" % self.node.port
        r = self.converger_send(https, "--tls-ca", self.ca)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout)["seq"], 1)
        r = self.converger_send(https)  # the system's CAs do not know the test's
        self.assertEqual(r.returncode, 1)
        self.assertIn("TLS: certificate verify failed: unable to get local issuer certificate for localhost",
                      r.stderr)
        r = self.converger_send("https://127.0.0.1:%d" % self.node.port, "--tls-ca", self.ca)
        self.assertEqual(r.returncode, 1)
        self.assertIn("IP address mismatch for 127.0.0.1", r.stderr)
        r = self.converger_send("https://127.0.0.1:%d" % self.node.admin_port)  # plain HTTP there
        self.assertEqual(r.returncode, 1)
        self.assertIn("the server does not speak TLS", r.stderr)
        # OpenSSL's SSL_CERT_FILE reaches converger roll and fleet's calls too
        r = subprocess.run([harness.binary(), "send", "--url", https, "--api-key", harness.API_KEY, "--conv",
                            self.conv, "--sender", "cli", '{"n":2}'], capture_output=True, text=True, timeout=30,
                           env=dict(os.environ, SSL_CERT_FILE=self.ca))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout)["seq"], 2)

    def test_plain_http_and_old_tls_are_refused_clearly(self):
        import http.client
        conn = http.client.HTTPConnection("127.0.0.1", self.node.port, timeout=5)
        conn.request("GET", "/readyz")
        r = conn.getresponse()
        self.assertEqual(r.status, 400)
        self.assertIn("this port speaks TLS only", json.loads(r.read())["error"]["message"])
        conn.close()
        # TLS 1.1: the client offers it (security level 0), the node refuses
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_verify_locations(self.ca)
        ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
        ctx.minimum_version = ssl.TLSVersion.TLSv1_1
        ctx.maximum_version = ssl.TLSVersion.TLSv1_1
        import socket
        with socket.create_connection(("127.0.0.1", self.node.port), timeout=5) as raw:
            with self.assertRaises(ssl.SSLError):
                ctx.wrap_socket(raw, server_hostname="localhost")
        # garbage after a TLS record header: a failed handshake, no crash
        with socket.create_connection(("127.0.0.1", self.node.port), timeout=5) as raw:
            raw.sendall(b"\x16\x03\x01\x00\x05hello" + os.urandom(64))
            raw.settimeout(5)
            try:
                while raw.recv(4096):
                    pass  # an alert, then the close
            except ConnectionResetError:
                pass
        # a ClientHello begun and never finished: abandoned when it closes
        with socket.create_connection(("127.0.0.1", self.node.port), timeout=5) as raw:
            raw.sendall(b"\x16\x03\x01")
        end = time.monotonic() + 5
        while time.monotonic() < end and "abandoned" not in self.tls_counts():
            time.sleep(0.05)
        counts = self.tls_counts()
        self.assertEqual(counts.get("plain_http"), 1, counts)
        self.assertEqual(counts.get("failed"), 2, counts)
        self.assertEqual(counts.get("abandoned"), 1, counts)
        self.assertTrue(self.node.running())
        self.assertEqual(self.https("/readyz")[0], 200)

    def test_sighup_reloads_the_certificate_and_open_connections_stay(self):
        conv = self.new_conv()
        old_serial = self.peer_serial()[0]
        frames = []

        async def scenario():
            async with self.hello_over_tls(conv) as ws:
                for _ in range(2):
                    frames.append(json.loads(await asyncio.wait_for(ws.recv(), 5)))
                # a broken key first: refused, the certificate in use stays
                with open(self.key, "w") as f:
                    f.write("not a key\n")
                os.kill(self.node.proc.pid, signal.SIGHUP)
                await asyncio.sleep(0.5)
                self.assertEqual(self.peer_serial()[0], old_serial)
                # then a new certificate and key
                sign_server_cert(self.dir, "new")
                shutil.copy(os.path.join(self.dir, "new.pem"), self.cert)
                shutil.copy(os.path.join(self.dir, "new.key"), self.key)
                os.kill(self.node.proc.pid, signal.SIGHUP)
                await asyncio.sleep(0.5)
                # the connection made before both reloads still delivers
                await asyncio.get_running_loop().run_in_executor(None, self.send, conv, 1)
                frames.append(json.loads(await asyncio.wait_for(ws.recv(), 5)))
        self.arun(scenario())
        self.assertEqual([f["type"] for f in frames], ["welcome", "synced", "msg"])
        self.assertEqual(frames[2]["seq"], 1)
        new_serial = self.peer_serial()[0]
        self.assertNotEqual(new_serial, old_serial)
        log = self.node.log_text()
        self.assertIn("SIGHUP: TLS certificate not loaded", log)
        self.assertIn("the one in use stays", log)
        self.assertIn("SIGHUP: TLS on", log)

    def test_a_large_replay_arrives_whole(self):
        """A replay far larger than one record or one flush: sealed piece by
        piece, every message arrives in order."""
        conv = self.new_conv()
        body = {"text": "x" * 20000}
        for i in range(60):
            self.send(conv, i)
            st, js = self.https("/v1/conversations/%s/messages" % conv, "POST", {"sender": "bot", "body": body})
            self.assertEqual(st, 201, js)

        async def replay():
            async with self.hello_over_tls(conv, max_size=None) as ws:
                seqs = []
                while True:
                    f = json.loads(await asyncio.wait_for(ws.recv(), 10))
                    if f["type"] == "synced":
                        return seqs
                    if f["type"] == "msg":
                        seqs.append(f["seq"])
        self.assertEqual(self.arun(replay()), list(range(1, 121)))

    def test_replaced_files_are_loaded_without_a_signal(self):
        """As a Kubernetes Secret volume or cert-manager replaces them: the
        new pair is served within a few ticks, no SIGHUP."""
        old_serial = self.peer_serial()[0]
        sign_server_cert(self.dir, "next")
        os.replace(os.path.join(self.dir, "next.key"), self.key)  # key first: a mismatch for a moment
        os.replace(os.path.join(self.dir, "next.pem"), self.cert)
        end = time.monotonic() + 10
        while time.monotonic() < end and self.peer_serial()[0] == old_serial:
            time.sleep(0.1)
        self.assertNotEqual(self.peer_serial()[0], old_serial)
        self.assertIn("a TLS file changed: TLS on", self.node.log_text())
        self.assertGreaterEqual(self.tls_counts().get("ok", 0), 2)

    def test_bad_tls_settings_stop_the_start_with_a_reason(self):
        def serve(env):
            e = {k: v for k, v in os.environ.items() if not k.startswith("CONVERGER_")}
            e.update(CONVERGER_LISTEN="127.0.0.1:%d" % harness.free_port(), CONVERGER_ADMIN_LISTEN="",
                     CONVERGER_DATABASE_URL="sqlite:%s/x.db" % self.dir, **env)
            r = subprocess.run([harness.binary(), "serve"], env=e, capture_output=True, text=True, timeout=20)
            return r.returncode, r.stderr
        rc, err = serve({"CONVERGER_TLS_CERT": self.cert})
        self.assertEqual(rc, 2)
        self.assertIn("CONVERGER_TLS_CERT is set without CONVERGER_TLS_KEY", err)
        rc, err = serve({"CONVERGER_TLS_CERT": self.cert, "CONVERGER_TLS_KEY": self.cert})
        self.assertNotEqual(rc, 0)
        self.assertIn("TLS certificate not loaded: %s" % self.cert, err)
        sign_server_cert(self.dir, "other")
        rc, err = serve({"CONVERGER_TLS_CERT": self.cert, "CONVERGER_TLS_KEY": os.path.join(self.dir, "other.key")})
        self.assertNotEqual(rc, 0)
        self.assertIn("is not the private key of the certificate in %s" % self.cert, err)

    def test_a_stopping_node_closes_tls_clients_with_a_hint(self):
        """The drain is unchanged under TLS: a single node with no ready peer
        closes its clients with 1012 and a retry hint, then exits."""
        conv = self.new_conv()

        async def scenario():
            import websockets
            async with self.hello_over_tls(conv) as ws:
                for _ in range(2):
                    await asyncio.wait_for(ws.recv(), 5)
                os.kill(self.node.proc.pid, signal.SIGTERM)
                try:
                    while True:
                        await asyncio.wait_for(ws.recv(), 10)
                except websockets.ConnectionClosed as e:
                    return e.rcvd.code if e.rcvd else None, json.loads(e.rcvd.reason) if e.rcvd else None
        code, reason = self.arun(scenario())
        self.assertEqual(code, 1012)
        self.assertGreater(reason["retryAfterMs"], 0)
        self.assertEqual(self.node.proc.wait(10), 0)


if __name__ == "__main__":
    harness.main()
