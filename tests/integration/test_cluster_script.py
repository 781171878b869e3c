"""scripts/cluster (`make cluster`): three nodes on a throwaway PostgreSQL
behind HAProxy. `make cluster` at a terminal (a pty whose foreground process
group is make's), stopped with Ctrl-C (^C written to the pty: the terminal
signals its foreground process group), exits 0 without make's "Interrupt",
after the script's cleanup. Run on ports of its own (CONVERGER_CLUSTER_PORT_BASE,
CONVERGER_CLUSTER_STATS_PORT) and a directory of its own
(CONVERGER_CLUSTER_DIR), so it runs beside the other tests: HAProxy answers
/readyz; a channel, a conversation and a message made through HAProxy are
read back from every node (one shared store) and replayed over a WebSocket
through HAProxy (the upgrade crosses it); /admin/cluster lists node-1..node-3 with
their public URLs; SIGTERM to the script stops HAProxy, the nodes and
PostgreSQL, and it exits. A message sent to each node directly then reaches
that WebSocket live, whichever node holds it."""

import asyncio
import fcntl
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import termios
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import pid_alive  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "cluster")
CONFIG = os.path.join(ROOT, "deploy", "haproxy", "converger.cfg")


def port_free(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def free_ports():
    """A base with base..base+3 and the admin ports base+11..base+13 free,
    and a free port for the stats page; outside the ephemeral range, where
    outgoing connections and harness.free_port() take theirs."""
    for _ in range(200):
        base = random.randrange(20000, 31000)
        stats = random.randrange(20000, 31000)
        if base <= stats <= base + 20:
            continue
        ports = (base, base + 1, base + 2, base + 3, base + 11, base + 12, base + 13, base + 20, stats)
        if all(port_free(p) for p in ports):
            return base, stats
    raise RuntimeError("no free ports found")


def read_state(path):
    out = {}
    with open(path) as f:
        for line in f:
            k, _, v = line.rstrip("\n").partition("=")
            out[k] = v.strip("'")
    return out



def make_at_a_terminal(master, slave, args, env):
    """`make ARGS...` in the repository as the session leader of the pty
    (`slave` becomes its controlling terminal, so make's process group is
    the terminal's foreground group, as an interactive shell makes it).
    Returns (process, reader thread, text()): text() is everything written
    to the terminal so far."""
    env = dict(env)
    env.pop("MAKEFLAGS", None)
    env.pop("MFLAGS", None)
    proc = subprocess.Popen(["make", "--no-print-directory", "-C", ROOT] + args,
                            env=env, stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
                            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
    os.close(slave)
    out = bytearray()
    lock = threading.Lock()

    def reader():
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: every process holding the pty is gone
                return
            if not chunk:
                return
            with lock:
                out.extend(chunk)
    t = threading.Thread(target=reader, daemon=True)
    t.start()

    def text():
        with lock:
            return out.decode("utf-8", "replace").replace("\r\n", "\n")
    return proc, t, text

class ClusterScript(unittest.TestCase):
    def setUp(self):
        if shutil.which("haproxy") is None:
            self.fail("haproxy not found: scripts/setup installs it")
        # 0755: run as root, PostgreSQL (as nobody) lives in dir/pg
        self.dir = tempfile.mkdtemp(prefix="cvg-cluster-")
        os.chmod(self.dir, 0o755)
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.proc = None
        self.pids = {}
        self.addCleanup(self.kill_everything)

    def request(self, port, method, path, body=None, key=None, headers=None):
        """One request on a fresh connection: (status, JSON body or None)."""
        h = dict(headers or {})
        if key is not None:
            h["Authorization"] = "Bearer %s" % key
        data = json.dumps(body).encode() if body is not None else None
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            conn.request(method, path, body=data, headers=h)
            r = conn.getresponse()
            raw = r.read()
            try:
                return r.status, json.loads(raw) if raw else None
            except ValueError:
                return r.status, None
        finally:
            conn.close()

    def start(self, *args):
        """Runs the script (with `args`); returns (lb_port, state) once
        HAProxy answers /readyz 200. Retried on new ports when one was taken
        meanwhile. With --tls, the TLS frontend is on self.tls_port."""
        for attempt in range(3):
            base, stats = free_ports()
            env = {k: v for k, v in os.environ.items() if not k.startswith("CONVERGER_")}
            env.update(CONVERGER_CLUSTER_DIR=self.dir, CONVERGER_CLUSTER_PORT_BASE=str(base),
                       CONVERGER_CLUSTER_STATS_PORT=str(stats))
            if "--tls" in args:
                self.tls_port = base + 20  # checked free with the others (free_ports)
                env["CONVERGER_CLUSTER_TLS_PORT"] = str(self.tls_port)
            self.out = open(os.path.join(self.dir, "script.out"), "w+")
            self.err = open(os.path.join(self.dir, "script.err"), "w+")
            self.proc = subprocess.Popen([SCRIPT, "--binary", harness.binary()] + list(args), env=env,
                                         stdin=subprocess.DEVNULL, stdout=self.out, stderr=self.err)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break
                try:
                    st, _ = self.request(base, "GET", "/readyz")
                    # up, and the summary printed (its last line: how to stop)
                    if st == 200 and "\nStop: " in self.stdout():
                        return base, stats, read_state(os.path.join(self.dir, "cluster.state"))
                except OSError:
                    pass
                time.sleep(0.1)
            err = self.stderr()
            if self.proc.poll() is not None and attempt < 2 and ("taken" in err or "in use" in err.lower()):
                continue  # lost a port to a parallel test
            self.fail("the cluster was not up within 30 s (exit %r); stderr:\n%s" % (self.proc.poll(), err))
        self.fail("no attempt started")

    def stdout(self):
        self.out.seek(0)
        return self.out.read()

    def stderr(self):
        self.err.seek(0)
        return self.err.read()

    def kill_everything(self):
        """Last resort when a test fails: the script, then what its state
        file names, by pid, if still the program we started."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for name, pid in self.pids.items():
            exe = ""
            try:
                exe = os.path.basename(os.readlink("/proc/%d/exe" % pid))
            except OSError:
                pass
            if pid_alive(pid) and exe in ("converger", "haproxy"):
                os.kill(pid, signal.SIGKILL)
        if self.pids.get("pg") and pid_alive(self.pids["pg"]):
            subprocess.run([os.path.join(ROOT, "scripts", "pg-tmp"), "stop"],
                           env=dict(os.environ, PG_TMP_DIR=self.pg_dir), timeout=30)

    def test_help(self):
        r = subprocess.run([SCRIPT, "--help"], capture_output=True, text=True, timeout=10)
        self.assertEqual(r.returncode, 0, r.stderr)
        for word in ("CONVERGER_CLUSTER_PORT_BASE", "CONVERGER_CLUSTER_STATS_PORT",
                     "CONVERGER_CLUSTER_DIR", "--binary", "haproxy", "8081"):
            self.assertIn(word, r.stdout)
        r = subprocess.run([SCRIPT, "--no-such-flag"], capture_output=True, text=True, timeout=10)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--no-such-flag", r.stderr)
        r = subprocess.run([SCRIPT], capture_output=True, text=True, timeout=10,
                           env=dict(os.environ, CONVERGER_CLUSTER_PORT_BASE="80x"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("CONVERGER_CLUSTER_PORT_BASE", r.stderr)

    def test_haproxy_config_is_valid(self):
        r = subprocess.run(["haproxy", "-c", "-f", CONFIG], capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_tls_through_haproxy(self):
        """--tls: HTTPS and WSS on the TLS port with a CA made for the run;
        the C library (converger tail) and curl trust it, and verify."""
        lb, stats, state = self.start("--tls")
        self.pids = {"haproxy": int(state["HAPROXY_PID"]), "pg": int(state["PG_PID"])}
        for n in (1, 2, 3):
            self.pids["node-%d" % n] = int(state["NODE%d_PID" % n])
        self.pg_dir = state["PG_TMP_DIR"]
        ca = os.path.join(self.dir, "tls", "ca.pem")
        self.assertEqual(state["TLS_URL"], "https://localhost:%d" % self.tls_port)
        self.assertEqual(state["TLS_CA"], ca)
        self.assertIn("wss://localhost:%d/v1/ws" % self.tls_port, self.stdout())
        self.assertEqual(os.stat(os.path.join(self.dir, "tls", "ca.key")).st_mode & 0o777, 0o600)
        with open(os.path.join(self.dir, "api-key")) as f:
            key = f.read().strip()
        base = "https://localhost:%d" % self.tls_port
        r = subprocess.run(["curl", "-sS", "--cacert", ca, "-X", "POST", base + "/v1/channels",
                            "-H", "Authorization: Bearer " + key, "-d", '{"id":"tls","name":"TLS"}'],
                           capture_output=True, text=True, timeout=20)
        self.assertEqual(r.returncode, 0, r.stderr)
        subprocess.run(["curl", "-sS", "--cacert", ca, "-X", "POST", base + "/v1/conversations",
                        "-H", "Authorization: Bearer " + key, "-d", '{"id":"secure","channel":"tls"}'],
                       capture_output=True, text=True, timeout=20, check=True)
        subprocess.run(["curl", "-sS", "--cacert", ca, "-X", "POST", base + "/v1/conversations/secure/messages",
                        "-H", "Authorization: Bearer " + key, "-d", '{"sender":"s","body":{"over":"tls"}}'],
                       capture_output=True, text=True, timeout=20, check=True)
        tok = harness.mint_token("alice", ["secure"], secret=open(os.path.join(self.dir, "token-secret")).read().strip())
        for url in ("wss://localhost:%d/v1/ws" % self.tls_port, "wss://127.0.0.1:%d/v1/ws" % self.tls_port):
            p = subprocess.run([harness.binary(), "tail", "--url", url, "--tls-ca", ca, "--token", tok,
                                "--conv", "secure", "--watermark", "0", "--max-messages", "1"],
                               capture_output=True, text=True, timeout=20)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(json.loads(p.stdout)["body"], {"over": "tls"})

        # the nodes serve TLS themselves: their public URLs are wss, and the
        # node URLs in the state file https
        want = {"node-%d" % n: "wss://localhost:%d/v1/ws" % (lb + n) for n in (1, 2, 3)}
        for n in (1, 2, 3):
            self.assertEqual(state["NODE%d_URL" % n], "https://localhost:%d" % (lb + n))
        deadline = time.monotonic() + 5
        while True:
            st, js = self.request(lb + 11, "GET", "/admin/cluster", key=key)
            self.assertEqual(st, 200, js)
            seen = {n["id"]: n["publicUrl"] for n in js["nodes"] if n["state"] == "ready"}
            if seen == want:
                break
            if time.monotonic() > deadline:
                self.fail("/admin/cluster: %r, want %r" % (seen, want))
            time.sleep(0.2)

        # A drain moves wss clients to wss peers only: one through HAProxy's
        # TLS frontend (X-Forwarded-Proto https) and one straight to the
        # node's own TLS port get a wss reconnectTo; one through the plain
        # frontend (X-Forwarded-Proto http) is offered no wss peer: null.
        import ssl
        import websockets
        ctx = ssl.create_default_context(cafile=ca)

        async def client(url):
            ws = await websockets.connect(url, ssl=ctx if url.startswith("wss") else None,
                                          subprotocols=["converger.v1"], open_timeout=10)
            await ws.send(json.dumps({"type": "hello", "token": tok, "subs": [{"conv": "secure", "watermark": 1}]}))
            while True:
                f = json.loads(await asyncio.wait_for(ws.recv(), 10))
                if f["type"] == "welcome":
                    return ws, f["node"]

        async def until_drain(ws):
            while True:
                f = json.loads(await asyncio.wait_for(ws.recv(), 20))
                if f["type"] == "drain":
                    return f

        async def drain_one():
            edge, node = await client("wss://localhost:%d/v1/ws" % self.tls_port)
            n = int(node.rsplit("-", 1)[1])
            direct, node2 = await client("wss://localhost:%d/v1/ws" % (lb + n))
            self.assertEqual(node2, node)
            # the plain frontend, until one lands on the same node (leastconn:
            # the others are kept open, so that it does)
            plain, others = None, []
            for _ in range(12):
                ws, on = await client("ws://127.0.0.1:%d/v1/ws" % lb)
                if on == node:
                    plain = ws
                    break
                others.append(ws)
            st, js = await asyncio.get_running_loop().run_in_executor(
                None, lambda: self.request(lb + 10 + n, "POST", "/admin/drain", key=key))
            self.assertIn(st, (200, 202), js)
            frames = [await until_drain(edge), await until_drain(direct)]
            if plain is not None:
                frames.append(await until_drain(plain))
            for ws in [edge, direct, plain] + others:
                if ws is not None:
                    await ws.close()
            return n, frames, plain is not None

        n, frames, plain = asyncio.run(drain_one())
        peers = ["wss://localhost:%d/v1/ws" % (lb + m) for m in (1, 2, 3) if m != n]
        self.assertIn(frames[0]["reconnectTo"], peers, frames[0])
        self.assertIn(frames[1]["reconnectTo"], peers, frames[1])
        self.assertTrue(plain, "no plain client landed on node-%d" % n)
        self.assertIsNone(frames[2]["reconnectTo"], frames[2])
        self.proc.send_signal(signal.SIGTERM)
        self.assertEqual(self.proc.wait(30), 143, self.stderr())

    def test_sharded_through_haproxy_then_sigterm(self):
        """--sharded: three PostgreSQL instances (one with a synchronous
        standby, named by its multi-host URL), two Redis bus instances, the
        shard map; a message sent to one node reaches a WebSocket held
        through HAProxy live, whichever node holds it; SIGTERM stops every
        process it started."""
        lb, stats, state = self.start("--sharded")
        self.pids = {"haproxy": int(state["HAPROXY_PID"]), "pg": int(state["PG_PID"])}
        for n in (1, 2, 3):
            self.pids["node-%d" % n] = int(state["NODE%d_PID" % n])
        self.pg_dir = state["PG_TMP_DIR"]
        others = [int(state[k]) for k in ("PG2_PID", "PG3_PID", "PG2_STANDBY_PID", "REDIS1_PID", "REDIS2_PID")]
        self.assertEqual(len(state["BUS_URLS"].split(",")), 2)
        self.assertIn("target_session_attrs=read-write", state["INSTANCE2_URL"])
        r = subprocess.run([harness.binary(), "shards", "show", "--database-url", state["DATABASE_URL"]],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.count(" yes "), 3, r.stdout)
        with open(os.path.join(self.dir, "api-key")) as f:
            key = f.read().strip()
        st, js = self.request(lb, "POST", "/v1/channels", {"id": "g", "name": "G"}, key=key)
        self.assertEqual(st, 201, js)
        convs = ["room%d" % i for i in range(6)]  # over the instances
        for c in convs:
            st, js = self.request(lb, "POST", "/v1/conversations", {"id": c, "channel": "g"}, key=key)
            self.assertEqual(st, 201, js)
        tok = harness.mint_token("alice", convs, secret=open(os.path.join(self.dir, "token-secret")).read().strip())

        async def go():
            import websockets
            ws = await websockets.connect("ws://127.0.0.1:%d/v1/ws" % lb, subprotocols=["converger.v1"])
            await ws.send(json.dumps({"type": "hello", "token": tok,
                                      "subs": [{"conv": c, "watermark": 0} for c in convs]}))
            got = {}
            loop = asyncio.get_running_loop()
            for i, c in enumerate(convs):  # each to another node, directly
                st, js = await loop.run_in_executor(None, lambda c=c, i=i: self.request(
                    lb + 1 + i % 3, "POST", "/v1/conversations/%s/messages" % c,
                    {"sender": "s", "body": {"to": c}}, key=key))
                self.assertEqual(st, 201, js)
            while sum(len(v) for v in got.values()) < len(convs):
                f = json.loads(await asyncio.wait_for(ws.recv(), 10))
                if f["type"] == "msg":
                    got.setdefault(f["conv"], []).append(f["seq"])
            await ws.close()
            return got
        got = asyncio.run(go())
        self.assertEqual(got, {c: [1] for c in convs})
        self.proc.send_signal(signal.SIGTERM)
        self.assertEqual(self.proc.wait(60), 143, self.stderr())
        for pid in list(self.pids.values()) + others:
            self.assertFalse(pid_alive(pid), pid)

    def test_cluster_through_haproxy_then_sigterm(self):
        lb, stats, state = self.start()
        nodes = [lb + 1, lb + 2, lb + 3]
        self.pids = {"haproxy": int(state["HAPROXY_PID"]), "pg": int(state["PG_PID"])}
        for n in (1, 2, 3):
            self.pids["node-%d" % n] = int(state["NODE%d_PID" % n])
        self.pg_dir = state["PG_TMP_DIR"]
        for name, pid in self.pids.items():
            self.assertTrue(pid_alive(pid), "%s (pid %d) not running" % (name, pid))
        self.assertEqual(state["LB_URL"], "http://127.0.0.1:%d" % lb)

        # the summary names what a user needs
        summary = self.stdout()
        for want in ("http://127.0.0.1:%d" % lb, "ws://127.0.0.1:%d/v1/ws" % lb,
                     os.path.join(self.dir, "api-key"), "/v1/tokens", "Ctrl-C"):
            self.assertIn(want, summary)

        # one key for the three nodes, read where the summary says
        with open(os.path.join(self.dir, "api-key")) as f:
            key = f.read().strip()
        self.assertEqual(os.stat(os.path.join(self.dir, "api-key")).st_mode & 0o777, 0o600)
        with open(os.path.join(self.dir, "token-secret")) as f:
            self.assertGreaterEqual(len(f.read().strip()), 32, "the shared token secret is too short")
        st, js = self.request(lb, "POST", "/v1/channels", {"id": "general", "name": "General"}, key)
        self.assertEqual(st, 201, js)
        st, js = self.request(lb, "POST", "/v1/conversations", {"id": "room1", "channel": "general"}, key)
        self.assertEqual(st, 201, js)
        st, js = self.request(lb, "POST", "/v1/conversations/room1/messages",
                                 {"sender": "server", "body": {"text": "through haproxy"}}, key,
                                 {"Idempotency-Key": "m-1"})
        self.assertEqual(st, 201, js)
        self.assertEqual(js, {"seq": 1, "id": "m-1"})

        # every node reads it from the shared store, with the shared key
        for port in nodes:
            st, js = self.request(port, "GET", "/v1/conversations/room1/messages?after=0", key=key)
            self.assertEqual(st, 200, js)
            self.assertEqual(js["head"], 1, js)
            self.assertEqual([(m["seq"], m["id"], m["body"]) for m in js["messages"]],
                             [(1, "m-1", {"text": "through haproxy"})])

        # the operator's routes: not through HAProxy, on each node's admin listener
        self.assertEqual(self.request(lb, "GET", "/admin/cluster", key=key)[0], 404)
        self.assertEqual(self.request(lb, "GET", "/metrics")[0], 404)
        for n in (1, 2, 3):
            self.assertEqual(state["NODE%d_ADMIN_URL" % n], "http://127.0.0.1:%d" % (lb + 10 + n))
        self.assertIn("http://127.0.0.1:%d" % (lb + 11), summary)
        # membership: node-1..node-3 with the public and admin URLs the script gave them
        want = {"node-%d" % n: ("ws://127.0.0.1:%d/v1/ws" % (lb + n), "http://127.0.0.1:%d" % (lb + 10 + n))
                for n in (1, 2, 3)}
        deadline = time.monotonic() + 5
        while True:
            st, js = self.request(lb + 11, "GET", "/admin/cluster", key=key)
            self.assertEqual(st, 200, js)
            seen = {n["id"]: (n["publicUrl"], n.get("adminUrl")) for n in js["nodes"]}
            if seen == want:
                break
            if time.monotonic() > deadline:
                self.fail("/admin/cluster: %r, want %r" % (seen, want))
            time.sleep(0.2)

        # a WebSocket through HAProxy: hello with a token minted through it,
        # replay of seq 1, synced
        st, js = self.request(lb, "POST", "/v1/tokens", {"sub": "alice", "convs": ["room1"]}, key)
        self.assertEqual(st, 201, js)
        token = js["token"]

        class Lb:
            ws_url = "ws://127.0.0.1:%d/v1/ws" % lb

        async def replay_then_live():
            c, welcome = await harness.open_client(Lb, token, [{"conv": "room1", "watermark": 0}])
            try:
                msgs, synced = await c.until_synced("room1")
                # then one message sent to each node directly arrives live,
                # whichever node holds the socket (LISTEN/NOTIFY)
                for n in (1, 2, 3):
                    st, js = await asyncio.to_thread(
                        self.request, lb + n, "POST", "/v1/conversations/room1/messages",
                        {"sender": "s", "body": {"node": n}}, key)
                    self.assertEqual(st, 201, js)
                live = await c.recv_msgs(3)
                return welcome, msgs, synced, live
            finally:
                await c.close()
        welcome, msgs, synced, live = asyncio.run(asyncio.wait_for(replay_then_live(), 20))
        self.assertIn(welcome["node"], want)
        self.assertEqual([(m["seq"], m["body"]) for m in msgs], [(1, {"text": "through haproxy"})])
        self.assertEqual(synced["head"], 1)
        self.assertEqual([(m["seq"], m["body"]) for m in live], [(n + 1, {"node": n}) for n in (1, 2, 3)])

        # HAProxy's stats page sees three servers up
        st, _ = self.request(stats, "GET", "/")
        self.assertEqual(st, 200)

        # a drained node (SIGTERM, no clients: it exits at once) is started again
        first = self.pids["node-2"]
        os.kill(first, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while True:
            state = read_state(os.path.join(self.dir, "cluster.state"))
            again = int(state["NODE2_PID"])
            try:
                if again != first and self.request(lb + 2, "GET", "/readyz")[0] == 200:
                    break
            except OSError:
                pass  # between the exit and the restart
            self.assertLess(time.monotonic(), deadline, "node-2 not back; stderr:\n%s" % self.stderr())
            time.sleep(0.1)
        self.assertFalse(pid_alive(first))
        self.pids["node-2"] = again
        self.assertIn("node-2 (pid %d) drained and exited 0; starting it again" % first, self.stderr())

        # SIGTERM: everything stops, the script exits
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.fail("the script did not exit within 20 s of SIGTERM; stderr:\n%s" % self.stderr())
        self.assertEqual(rc, 143, self.stderr())
        for name, pid in self.pids.items():
            self.assertFalse(pid_alive(pid), "%s (pid %d) still running after the script exited" % (name, pid))
        self.assertFalse(os.path.exists(self.pg_dir), "PostgreSQL's directory left behind")
        self.assertFalse(os.path.exists(os.path.join(self.dir, "cluster.state")))
        err = self.stderr()
        self.assertIn("stopped", err)
        self.assertLess(time.monotonic() - t0, 20)
        # the nodes stopped cleanly on SIGTERM
        for n in (1, 2, 3):
            with open(os.path.join(self.dir, "node%d.log" % n)) as f:
                log = f.read()
            self.assertIn("stopped", log.splitlines()[-1], log[-2000:])

    def test_make_cluster_ctrl_c_at_a_terminal_exits_0_quietly(self):
        """make -o build cluster (the build is the test's, BUILD_DIR is the
        binary's directory) as the session leader of a new pty, so its
        process group is the terminal's foreground group, as an interactive
        shell makes it; ^C on the pty once the summary is printed."""
        base, stats = free_ports()
        master, slave = os.openpty()
        self.addCleanup(os.close, master)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONVERGER_")}
        env.update(CONVERGER_CLUSTER_DIR=self.dir, CONVERGER_CLUSTER_PORT_BASE=str(base),
                   CONVERGER_CLUSTER_STATS_PORT=str(stats), TERM="dumb")
        build_dir = os.path.dirname(os.path.abspath(harness.binary()))
        self.proc, t, text = make_at_a_terminal(
            master, slave, ["-o", "build", "cluster", "BUILD_DIR=" + build_dir], env)
        self.addCleanup(self.stop_script_by_state)
        deadline = time.monotonic() + 40
        while "\nStop: " not in text():
            self.assertIsNone(self.proc.poll(), "make cluster exited early:\n" + text())
            self.assertLess(time.monotonic(), deadline, "no summary within 40 s:\n" + text())
            time.sleep(0.1)
        state = read_state(os.path.join(self.dir, "cluster.state"))
        self.pg_dir = state["PG_TMP_DIR"]
        self.pids = {"haproxy": int(state["HAPROXY_PID"]), "pg": int(state["PG_PID"])}
        for n in (1, 2, 3):
            self.pids["node-%d" % n] = int(state["NODE%d_PID" % n])
        self.assertEqual(self.request(base, "GET", "/readyz")[0], 200)
        self.assertEqual(os.tcgetpgrp(master), os.getpgid(int(state["SCRIPT_PID"])),
                         "the script is not in the terminal's foreground process group")

        os.write(master, b"\x03")  # Ctrl-C, as typed
        try:
            rc = self.proc.wait(40)
        except subprocess.TimeoutExpired:
            self.fail("make cluster still running 40 s after ^C:\n" + text())
        t.join(5)
        shown = text()
        self.assertEqual(rc, 0, "make cluster after ^C: status %r; output:\n%s" % (rc, shown))
        self.assertNotIn("Interrupt", shown)
        self.assertNotIn("make: ***", shown)
        self.assertIn("scripts/cluster: stopped", shown)
        for name, pid in self.pids.items():
            self.assertFalse(pid_alive(pid), "%s (pid %d) still running after make exited" % (name, pid))
        self.assertFalse(pid_alive(int(state["SCRIPT_PID"])), "the script outlived make")
        self.assertFalse(os.path.exists(self.pg_dir), "PostgreSQL's directory left behind")

    def test_make_run_ctrl_c_at_a_terminal_exits_0_quietly(self):
        """The walk-through's restart: `make run` at a terminal (a new pty,
        make in its foreground process group), ^C once the node listens:
        the node stops (1001 to its sockets) and make exits 0 without its
        "Interrupt"."""
        port = harness.free_port()
        master, slave = os.openpty()
        self.addCleanup(os.close, master)
        data = tempfile.mkdtemp(prefix="converger-run-")
        self.addCleanup(shutil.rmtree, data, True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONVERGER_")}
        env.update(CONVERGER_DATABASE_URL="sqlite:%s/converger.db" % data, TERM="dumb",
                   CONVERGER_API_KEY=harness.API_KEY, CONVERGER_TOKEN_SECRET=harness.TOKEN_SECRET)
        build_dir = os.path.dirname(os.path.abspath(harness.binary()))
        proc, t, text = make_at_a_terminal(
            master, slave, ["run", "BUILD_DIR=" + build_dir, "ARGS=--listen 127.0.0.1:%d" % port], env)

        def kill_group():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        self.addCleanup(kill_group)
        deadline = time.monotonic() + 60
        while "listening on" not in text():
            self.assertIsNone(proc.poll(), "make run exited early:\n" + text())
            self.assertLess(time.monotonic(), deadline, "not listening within 60 s:\n" + text())
            time.sleep(0.1)
        self.assertEqual(self.request(port, "GET", "/readyz")[0], 200)
        os.write(master, b"\x03")  # Ctrl-C, as typed
        try:
            rc = proc.wait(30)
        except subprocess.TimeoutExpired:
            self.fail("make run still running 30 s after ^C:\n" + text())
        t.join(5)
        shown = text()
        self.assertEqual(rc, 0, "make run after ^C: status %r; output:\n%s" % (rc, shown))
        self.assertNotIn("Interrupt", shown)
        self.assertNotIn("make: ***", shown)
        self.assertIn("stopped", shown)
        with self.assertRaises(OSError):  # the node is gone: nothing listens
            socket.create_connection(("127.0.0.1", port), timeout=1).close()

    def stop_script_by_state(self):
        """Cleanup of the make test: SIGTERM to the script the state file
        names (the one make started, if still that script), waited for."""
        path = os.path.join(self.dir, "cluster.state")
        if not os.path.exists(path):
            return
        pid = int(read_state(path).get("SCRIPT_PID", "0"))
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                ours = b"scripts/cluster" in f.read()
        except OSError:
            ours = False
        if pid and ours and pid_alive(pid):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 40
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)


if __name__ == "__main__":
    harness.main()
