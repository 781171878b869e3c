#!/usr/bin/env python3
"""The memory a TLS connection costs a node, against a plain one.

For each round, and each transport in turn (ws://, then wss:// with
CONVERGER_TLS_CERT), start a node on a free loopback port with a fresh
SQLite store, open N WebSocket connections one at a time (each one's hello
answered with welcome and synced before the next connects, so that no two
handshakes overlap), wait a second, and read the node's VmRSS growth over
the N connections. Prints each round and the medians per transport.

One at a time on purpose: `converger bench admission --transport wss`
measures a burst of simultaneous handshakes, whose RSS growth also holds
the memory the handshakes in flight used together and the allocator kept.

The certificate is made here with openssl (a CA and a server certificate
for localhost, EC P-256); python3-websockets is the client. Everything is
stopped by its pid and removed before the script exits.

With --replay N, the conversation first holds N messages of 20 000 bytes
and every connection subscribes from watermark 0, so each one replays them
all before the next connects: what a connection keeps after a large flush.

Usage: tools/bench/tls_memory.py [--binary build/converger] [--conns 3000] [--rounds 3] [--replay N]
"""

import argparse
import asyncio
import base64
import hashlib
import hmac
import json
import os
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

API_KEY = "bench-key"
SECRET = "bench-token-secret-0123456789abcdef"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def token(sub, convs):
    head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    now = int(time.time())
    body = b64(json.dumps({"sub": sub, "convs": convs, "iat": now, "exp": now + 3600,
                           "jti": b64(os.urandom(9))}).encode())
    sig = hmac.new(SECRET.encode(), ("%s.%s" % (head, body)).encode(), hashlib.sha256).digest()
    return "%s.%s.%s" % (head, body, b64(sig))


def make_certs(d):
    def openssl(*args):
        subprocess.run(["openssl"] + list(args), cwd=d, check=True, capture_output=True, timeout=60)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=bench CA")
    openssl("req", *ec, "-keyout", "srv.key", "-out", "srv.csr", "-subj", "/CN=localhost")
    with open(os.path.join(d, "ext.cnf"), "w") as f:
        f.write("subjectAltName=DNS:localhost\n")
    openssl("x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "srv.pem", "-days", "1", "-extfile", "ext.cnf")


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS for %d" % pid)


def one_round(binary, d, tls, n, replay):
    port = free_port()
    db = os.path.join(d, "round.db")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(db + suffix):
            os.remove(db + suffix)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVERGER_")}
    env.update(CONVERGER_LISTEN="127.0.0.1:%d" % port, CONVERGER_ADMIN_LISTEN="",
               CONVERGER_DATABASE_URL="sqlite:" + db, CONVERGER_API_KEY=API_KEY,
               CONVERGER_TOKEN_SECRET=SECRET, CONVERGER_DRAIN_SHUTDOWN_MS="0",
               CONVERGER_HEARTBEAT_MS="3600000", CONVERGER_SQLITE_SYNC="off")
    if tls:
        env.update(CONVERGER_TLS_CERT=os.path.join(d, "srv.pem"), CONVERGER_TLS_KEY=os.path.join(d, "srv.key"))
    ctx = ssl.create_default_context(cafile=os.path.join(d, "ca.pem")) if tls else None
    base = ("https://localhost:%d" if tls else "http://127.0.0.1:%d") % port
    log = open(os.path.join(d, "node.log"), "ab")
    node = subprocess.Popen([binary, "serve"], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        def post(path, body):
            req = urllib.request.Request(base + path, method="POST", data=json.dumps(body).encode(),
                                         headers={"Authorization": "Bearer " + API_KEY})
            return urllib.request.urlopen(req, context=ctx, timeout=5).read()
        for _ in range(100):
            try:
                urllib.request.urlopen(base + "/readyz", context=ctx, timeout=1).read()
                break
            except OSError:
                time.sleep(0.05)
        post("/v1/channels", {"id": "bench", "name": "bench"})
        post("/v1/conversations", {"id": "room", "channel": "bench"})
        for i in range(replay):
            post("/v1/conversations/room/messages", {"sender": "bench", "body": {"i": i, "pad": "x" * 20000}})

        async def connect_all():
            import websockets
            url = ("wss://localhost:%d/v1/ws" if tls else "ws://127.0.0.1:%d/v1/ws") % port
            hello = json.dumps({"type": "hello", "token": token("u", ["room"]),
                                "subs": [{"conv": "room", "watermark": 0 if replay else None}]})
            before, conns = rss_kb(node.pid), []
            try:
                for _ in range(n):
                    ws = await websockets.connect(url, ssl=ctx, subprotocols=["converger.v1"], ping_interval=None,
                                                  open_timeout=10, max_size=None)
                    conns.append(ws)
                    await ws.send(hello)
                    frame = await asyncio.wait_for(ws.recv(), 10)
                    if json.loads(frame)["type"] != "welcome":
                        raise RuntimeError("expected welcome, got %s" % frame)
                    msgs = 0
                    while True:
                        f = json.loads(await asyncio.wait_for(ws.recv(), 30))
                        if f["type"] == "synced":
                            break
                        if f["type"] != "msg":
                            raise RuntimeError("expected msg or synced, got %s" % f)
                        msgs += 1
                    if msgs != replay:
                        raise RuntimeError("replayed %d messages of %d" % (msgs, replay))
                await asyncio.sleep(1.0)
                return (rss_kb(node.pid) - before) * 1024.0 / n
            finally:
                for ws in conns:
                    ws.transport.abort()
        return asyncio.run(connect_all())
    finally:
        node.send_signal(signal.SIGTERM)
        try:
            node.wait(15)
        except subprocess.TimeoutExpired:
            node.kill()
            node.wait(5)
        log.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", default="build/converger")
    ap.add_argument("--conns", type=int, default=3000, help="connections per round [3000]")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each transport [3]")
    ap.add_argument("--replay", type=int, default=0, help="20 000-byte messages each connection replays [0]")
    a = ap.parse_args()
    if a.conns < 1 or a.rounds < 1 or a.replay < 0:
        ap.error("--conns and --rounds must be at least 1, --replay at least 0")
    # two descriptors per connection (the node's and ours) over loopback:
    # the soft limit as high as the hard one allows
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < a.conns + 256:
        ap.error("--conns %d needs %d open files; the hard limit is %d" % (a.conns, a.conns + 256, hard))
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    d = tempfile.mkdtemp(prefix="converger-tls-memory-")
    try:
        make_certs(d)
        got = {"ws": [], "wss": []}
        for r in range(a.rounds):
            for name in ("ws", "wss"):
                b = one_round(os.path.abspath(a.binary), d, name == "wss", a.conns, a.replay)
                got[name].append(b)
                print("round %d, %s: %d connections%s, node RSS growth %.0f bytes per connection"
                      % (r + 1, name, a.conns, ", each after a replay of %d messages" % a.replay if a.replay else "",
                         b), flush=True)
        ws, wss = statistics.median(got["ws"]), statistics.median(got["wss"])
        print("\n| transport | node RSS per connection (median of %d) |\n| --- | ---: |\n"
              "| ws:// | %.0f bytes |\n| wss:// | %.0f bytes |\n| wss - ws | %.0f bytes |"
              % (a.rounds, ws, wss, wss - ws))
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
