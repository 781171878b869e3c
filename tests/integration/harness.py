"""Shared helpers for converger's integration tests.

Every test file runs as
    /usr/bin/python3 tests/integration/test_X.py --binary /path/to/converger
and talks to real `converger serve` processes over real loopback sockets.

What is here:
  Node          one `converger serve` process on a free loopback port with its
                own temp data dir; start/stop(SIGTERM)/kill9/restart; REST
                helpers; its log is printed when a test using it fails.
  RestSession   one persistent keep-alive http.client connection (bulk sends).
  mint_token    a local HS256 JWT minter that can also forge bad tokens.
  RawWs         a WebSocket client over a plain socket, for frames the
                `websockets` library refuses to produce (binary, bad UTF-8,
                oversized, fragmented, no pong, ...).
  HttpReader    reads raw HTTP/1.1 responses off a socket (pipelining tests).
  WsClient      async helpers over the `websockets` library for normal flows;
                every await has a timeout.
  PgCluster     a throwaway PostgreSQL server (scripts/pg-tmp) with down()/up(),
                kill(); make_standby() gives it a synchronous standby (a
                PgCluster too, with promote()), multi_url() the pair's
                libpq multi-host URL.
  RedisServer   a throwaway redis-server (scripts/redis-tmp) with
                kill()/up(), pause()/resume(); stop() by its pid.
  Follower      a client of one conversation that resumes with its watermark
                on the next node whenever its socket ends (like the SDK).
  NodeCase      unittest.TestCase base: node lifecycle, log dump on failure,
                `arun(coro)` to run a coroutine with an overall timeout.
  main()        strips `--binary` from argv and calls unittest.main().

Processes: every process started here is registered and stopped by pid in the
test's cleanup (and, as a last resort, at interpreter exit). Nothing is ever
killed by name.
"""

import asyncio
import atexit
import base64
import glob
import hashlib
import hmac
import http.client
import json
import os
import random
import re
import select
import shutil
import signal
import socket
import string
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

try:
    import websockets  # python3-websockets 10.4 (Debian); /usr/bin/python3 only
    import websockets.exceptions
except ImportError:  # pragma: no cover - reported by the tests that need it
    websockets = None

API_KEY = "test-api-key"
TOKEN_SECRET = "test-token-secret-of-at-least-32-bytes"
SUBPROTOCOL = "converger.v1"
BINARY = None  # set by main() from --binary

_LIVE_PROCS = {}  # pid -> Popen, every converger process still running
_LIVE_PIDS = {}  # pid -> its working directory: servers started by a script
_LIVE_LOCK = threading.Lock()


def _register(proc):
    with _LIVE_LOCK:
        _LIVE_PROCS[proc.pid] = proc


def _unregister(proc):
    with _LIVE_LOCK:
        _LIVE_PROCS.pop(proc.pid, None)


def _register_pid(pid, cwd):
    """A server a script started (not our child): killed at exit, by pid,
    if it is still there and still works in cwd (not a pid reused since)."""
    with _LIVE_LOCK:
        _LIVE_PIDS[pid] = os.path.realpath(cwd)


def _unregister_pid(pid):
    with _LIVE_LOCK:
        _LIVE_PIDS.pop(pid, None)


def stop_process(proc, timeout=10.0):
    """Stops a process a test started (subprocess.Popen, registered): SIGTERM
    by its pid, then SIGKILL after `timeout` seconds; unregisters it.
    Returns its exit status (negative: the signal that ended it)."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)
    _unregister(proc)
    return proc.returncode


@atexit.register
def _kill_leftovers():
    with _LIVE_LOCK:
        procs = list(_LIVE_PROCS.values())
    for p in procs:
        if p.poll() is None:
            try:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                pass
    with _LIVE_LOCK:
        pids = list(_LIVE_PIDS.items())
    for pid, cwd in pids:
        try:
            if os.readlink("/proc/%d/cwd" % pid) == cwd:
                os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def free_port():
    """A loopback port that was free a moment ago (bind to 0, then close)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
    finally:
        s.close()


def uid(prefix="x"):
    """A fresh id inside [A-Za-z0-9._:-]."""
    return "%s-%s" % (prefix, "".join(random.choice(string.ascii_lowercase + string.digits) for _ in range(10)))


def binary():
    if BINARY:
        return BINARY
    env = os.environ.get("CONVERGER_BINARY")
    if env:
        return os.path.abspath(env)
    raise RuntimeError("no --binary given")


# --------------------------------------------------------------------------
# Node: one converger serve process
# --------------------------------------------------------------------------

PG_TMP = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      "scripts", "pg-tmp")


def pid_alive(pid):
    """The process exists and is not a zombie."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def psql():
    """psql next to the initdb pg-tmp uses: the newest Debian version."""
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                  key=lambda d: int(os.path.basename(os.path.dirname(d))))
    for d in reversed(dirs):
        if os.access(os.path.join(d, "psql"), os.X_OK):
            return os.path.join(d, "psql")
    return shutil.which("psql")


class PgCluster:
    """A throwaway PostgreSQL server from scripts/pg-tmp in its own directory,
    watched by a pg-tmp watchdog that stops it if this process dies. `url`
    is its postgres:// URL; down()/up() stop and restart the server on the
    same port and data (outage tests), kill() crashes it (SIGKILL of the
    postmaster; up() then runs crash recovery); stop() removes it.

    durable=True: pg-tmp's default, fsync, synchronous_commit and
    full_page_writes on, for every test whose database crashes (kill()) or
    that is about durability. durable=False (`--fast`): all three off, for
    tests about semantics whose database never crashes: a fast shutdown
    (down()) writes everything first, so nothing acknowledged is lost
    there either."""

    def __init__(self, durable=False, start=True, port=None):
        self.dir = tempfile.mkdtemp(prefix="pg-it-")
        self.durable = durable
        self.port = port  # PG_TMP_PORT: a URL known before the server runs
        self.url = None
        self.primary = None  # a standby's PgCluster (make_standby)
        self.standby = None  # a primary's standby
        if start:
            self.start()

    def start(self):
        """Start the server (once): its URL."""
        self.url = self._run("start", "--owner", str(os.getpid()), *(() if self.durable else ("--fast",)))
        return self.url

    def _run(self, *args):
        env = dict(os.environ, PG_TMP_DIR=self.dir)
        if self.port:
            env["PG_TMP_PORT"] = str(self.port)
        r = subprocess.run([PG_TMP] + list(args), env=env, capture_output=True, text=True, timeout=90)
        if r.returncode != 0:
            raise AssertionError("scripts/pg-tmp %s failed (%d): %s" % (" ".join(args), r.returncode, r.stderr))
        return r.stdout.strip()

    def sql(self, sql):
        """Run one statement with psql; its rows as lines of text."""
        r = subprocess.run([psql(), "-X", "-At", "-d", self.url, "-c", sql], capture_output=True,
                           text=True, timeout=30)
        if r.returncode != 0:
            raise AssertionError("psql %r failed: %s" % (sql, r.stderr))
        return r.stdout.splitlines()

    def down(self):
        self._run("down")

    def up(self):
        self._run("up")

    def kill(self):
        """SIGKILL the postmaster and wait until its children are gone too
        (scripts/pg-tmp kill): a crash, for up() to recover from."""
        self._run("kill")

    def stop(self):
        """Stop the server by its pid and remove its directory. For a
        standby whose primary runs, pg-tmp first takes it out of the
        primary's synchronous_standby_names (else the primary's commits
        would wait for it forever) and then drops its slot. Again: no-op.
        A frozen server is thawed first: a stopped one ignores its
        shutdown signal."""
        self.thaw()
        self._run("stop")
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def pid(self):
        """The postmaster's pid (None while down or killed)."""
        return _state_pid(os.path.join(self.dir, "pg-tmp.state"))

    def freeze(self):
        """A server that hangs: SIGSTOP the postmaster first (it forks no
        backend after that), then every process below it, until a pass
        finds none left running. thaw() (also called by stop()) resumes it."""
        pm = self.pid
        if pm is None:
            raise AssertionError("no postmaster to freeze")
        self._frozen = getattr(self, "_frozen", [])
        os.kill(pm, signal.SIGSTOP)
        self._frozen.append(pm)
        for _ in range(50):
            if (proc_stat(pm) or ("T",))[0] == "T":
                break
            time.sleep(0.01)
        for _ in range(3):
            for pid in descendants(pm):
                if pid not in self._frozen:
                    os.kill(pid, signal.SIGSTOP)
                    self._frozen.append(pid)
            time.sleep(0.05)
        running = [p for p in [pm] + descendants(pm) if (proc_stat(p) or ("T",))[0] not in ("T", "Z")]
        if running:
            raise AssertionError("PostgreSQL processes still running: %r" % running)

    def thaw(self):
        """SIGCONT every process freeze() stopped."""
        for pid in reversed(getattr(self, "_frozen", [])):
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self._frozen = []

    def make_standby(self):
        """A synchronous standby of this running server (scripts/pg-tmp
        standby --primary): a PgCluster on its own port whose url reads
        what this one committed; every commit here waits until it has
        flushed it (durable clusters; a `--fast` primary does not wait).
        While it is killed or down, commits here wait; its stop() releases
        them. Stop it as any PgCluster (the test's cleanup)."""
        sb = PgCluster(durable=self.durable, start=False)
        sb.primary = self
        sb.url = sb._run("standby", "--primary", self.dir, "--owner", str(os.getpid()))
        self.standby = sb
        return sb

    def promote(self):
        """(A standby) pg_ctl promote; returns once it accepts writes."""
        self._run("promote")

    def multi_url(self):
        """The pair's libpq multi-host URL (this one and its standby, or its
        primary): postgres://postgres@127.0.0.1:P1,127.0.0.1:P2/converger
        ?target_session_attrs=read-write, the primary first. libpq keeps
        the first host that accepts writes: it follows a promotion."""
        return self._run("url", "--with-standby")


def proc_stat(pid):
    """(state, ppid) of `pid`, or None when it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return fields[0], int(fields[1])


def descendants(root):
    """Every process below `root`, by walking /proc's parent pids."""
    parent = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = proc_stat(int(name))
            if st is not None:
                parent[int(name)] = st[1]
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def _state_pid(path):
    """PID=N from a pg-tmp / redis-tmp state file; None when absent or empty."""
    try:
        with open(path) as f:
            for line in f:
                k, _, v = line.rstrip("\n").partition("=")
                if k == "PID" and v.strip("'").isdigit():
                    return int(v.strip("'"))
    except FileNotFoundError:
        pass
    return None


REDIS_TMP = os.path.join(os.path.dirname(PG_TMP), "redis-tmp")


class RedisServer:
    """A throwaway redis-server (scripts/redis-tmp: no persistence, loopback)
    in its own directory, watched by a redis-tmp watchdog that stops it if
    this process dies, and registered here: killed by its pid at interpreter
    exit if a test left it. `url` is redis://127.0.0.1:PORT, `port` its
    port, `pid` its pid (None while killed). kill() crashes it (SIGKILL),
    up() starts it again on the same port, empty; pause()/resume() freeze
    and thaw it (SIGSTOP/SIGCONT); stop() stops it by its pid and removes
    the directory (again: no-op)."""

    def __init__(self, start=True, port=None):
        self.dir = tempfile.mkdtemp(prefix="redis-it-")
        self.port = port  # REDIS_TMP_PORT: a URL known before the server runs
        self.url = None
        self.pid = None
        if start:
            self.start()

    def _run(self, *args):
        env = dict(os.environ, REDIS_TMP_DIR=self.dir)
        if self.port:
            env["REDIS_TMP_PORT"] = str(self.port)
        r = subprocess.run([REDIS_TMP] + list(args), env=env, capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise AssertionError("scripts/redis-tmp %s failed (%d): %s" % (" ".join(args), r.returncode, r.stderr))
        return r.stdout.strip()

    def _record(self):
        self.pid = _state_pid(os.path.join(self.dir, "redis-tmp.state"))
        if self.pid:
            _register_pid(self.pid, self.dir)

    def start(self):
        """Start the server (once); returns once it answers PING: its URL."""
        self.url = self._run("start", "--owner", str(os.getpid()))
        self.port = int(self.url.rsplit(":", 1)[1])
        self._record()
        return self.url

    def kill(self):
        """SIGKILL by pid; returns once it is gone. Its data is lost."""
        self._run("kill")
        _unregister_pid(self.pid)
        self.pid = None

    def up(self):
        """Start it again on the same port (after kill()), empty."""
        self._run("up")
        self._record()

    def pause(self):
        self._run("pause")

    def resume(self):
        self._run("resume")

    def stop(self):
        pid = self.pid
        self._run("stop")
        if pid:
            _unregister_pid(pid)
        self.pid = None
        shutil.rmtree(self.dir, ignore_errors=True)


class NodeStartError(Exception):
    pass


class Node:
    """One `converger serve` process on 127.0.0.1:<free port>.

    env overrides (dict of CONVERGER_* -> str) are added to the defaults.
    nofile: the process's open-file limit (RLIMIT_NOFILE, soft and hard),
    set in the child before exec; None keeps this process's.
    """

    def __init__(self, env=None, start=True, ready_timeout=10.0, nofile=None):
        self.tmpdir = tempfile.mkdtemp(prefix="converger-it-")
        self.log_path = os.path.join(self.tmpdir, "node.log")
        self.overrides = dict(env or {})
        self.port = free_port()
        self._admin_port = free_port()  # CONVERGER_ADMIN_LISTEN's, unless env sets it
        self.proc = None
        self.exit_codes = []
        self.ready_timeout = ready_timeout
        self.nofile = nofile
        if start:
            self._start_with_retries()

    # -- configuration ----------------------------------------------------
    @property
    def node_id(self):
        return "test:%d" % self.port

    @property
    def ws_url(self):
        return "ws://127.0.0.1:%d/v1/ws" % self.port

    def environment(self):
        env = dict(os.environ)
        for k in list(env):
            if k.startswith("CONVERGER_"):
                del env[k]
        env.update({
            "CONVERGER_LISTEN": "127.0.0.1:%d" % self.port,
            "CONVERGER_DATABASE_URL": "sqlite:%s/converger.db" % self.tmpdir,
            "CONVERGER_API_KEY": API_KEY,
            "CONVERGER_TOKEN_SECRET": TOKEN_SECRET,
            "CONVERGER_NODE_ID": self.node_id,
            "CONVERGER_ADMIN_LISTEN": "127.0.0.1:%d" % self._admin_port,
            # Tests stop their nodes with SIGTERM and want them gone at once:
            # no drain (1001 to every socket) unless a test asks for one.
            "CONVERGER_DRAIN_SHUTDOWN_MS": "0",
        })
        env.update({k: str(v) for k, v in self.overrides.items() if v is not None})
        for k in [k for k, v in self.overrides.items() if v is None]:
            env.pop(k, None)  # None: unset, the node's default
        return env

    def fake_peer(self, url=None, state="ready", connections=0):
        """A heartbeat row of a peer that does not exist, in this (SQLite)
        node's membership table, fresh for MEMBERSHIP_MAX_AGE_MS: a drain
        then has a ready peer to send its clients to, as in a cluster (with
        none, it closes them with 1012 instead: gate/drain.c). `url` (the
        drain frames' reconnectTo) is this node's own by default, so that
        clients that follow it come back here."""
        import sqlite3
        db = sqlite3.connect(os.path.join(self.tmpdir, "converger.db"), timeout=10)
        try:
            db.execute("INSERT OR REPLACE INTO nodes (id, public_url, state, connections, waiters,"
                       " updated_ms, capacity) VALUES (?, ?, ?, ?, 0, ?, 0)",
                       ("peer-of-" + self.node_id, url or self.ws_url, state, connections,
                        int(time.time() * 1000)))
            db.commit()
        finally:
            db.close()

    # -- lifecycle --------------------------------------------------------
    def _start_with_retries(self):
        last = None
        for attempt in range(3):
            try:
                self.start()
                return
            except NodeStartError as e:
                last = e
                log = self.log_text()
                if "in use" in log.lower() and attempt < 2:
                    # lost the free-port race with a parallel test: new ports
                    self.port = free_port()
                    self._admin_port = free_port()
                    continue
                raise
        raise last

    def start(self, wait=True):
        """Start the process; wait=True: until /readyz answers 200."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("node already running")
        logf = open(self.log_path, "ab")
        logf.write(("\n===== start %s serve (port %d) at %.3f =====\n"
                    % (binary(), self.port, time.time())).encode())
        logf.flush()
        preexec = None
        if self.nofile is not None:
            import resource
            # N: soft and hard limit N; (soft, hard) to set them apart
            limits = tuple(self.nofile) if isinstance(self.nofile, tuple) else (int(self.nofile),) * 2

            def preexec():
                resource.setrlimit(resource.RLIMIT_NOFILE, limits)
        self.proc = subprocess.Popen([binary(), "serve"], env=self.environment(),
                                     stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                     cwd=self.tmpdir, preexec_fn=preexec)
        logf.close()
        _register(self.proc)
        if wait:
            self.wait_ready(self.ready_timeout)

    def wait_ready(self, timeout=10.0):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                rc = self.proc.returncode
                _unregister(self.proc)
                self.exit_codes.append(rc)
                raise NodeStartError("converger serve exited with %s before ready; log:\n%s"
                                     % (rc, self.log_tail()))
            try:
                # a client port that speaks TLS: probed on the admin listener
                tls = self.overrides.get("CONVERGER_TLS_CERT") and self.admin_port
                st, _, _ = self.request("GET", "/readyz", key=None, timeout=1.0,
                                        port=self.admin_port if tls else None)
                if st == 200:
                    return
                last = "status %d" % st
            except (OSError, http.client.HTTPException) as e:
                last = repr(e)
            time.sleep(0.05)
        self._hard_kill()
        raise NodeStartError("node not ready within %.1fs (last: %s); log:\n%s"
                             % (timeout, last, self.log_tail()))

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout=10.0):
        """SIGTERM, wait up to `timeout` s; returns the exit code (None if it
        had to be SIGKILLed after the timeout)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._hard_kill()
                return None
        _unregister(self.proc)
        rc = self.proc.returncode
        self.exit_codes.append(rc)
        return rc

    def kill9(self):
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        if self.proc is not None:
            _unregister(self.proc)
            self.exit_codes.append(self.proc.returncode)

    def _hard_kill(self):
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self.proc is not None:
            _unregister(self.proc)

    def restart(self):
        """Same data dir, same port. Stops first (SIGTERM) if running."""
        if self.running():
            self.stop()
        self.start()

    def ensure_stopped(self):
        if self.running():
            rc = self.stop()
            if rc is None:
                self._hard_kill()

    SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                         "WARNING: ThreadSanitizer", "AddressSanitizer:DEADLYSIGNAL",
                         "BUG:")  # the node's own invariant checks at exit

    def finish(self):
        """Stops the node (SIGTERM) if it runs and raises AssertionError if
        it did not exit 0 or its log shows a sanitizer report: a node that
        crashes or leaks fails the test that owned it."""
        was_running = self.running()
        rc = self.stop() if was_running else None
        problems = []
        if was_running and rc != 0:
            problems.append("exit code %r after SIGTERM (want 0)" % rc)
        log = self.log_text()
        if any(m in log for m in self.SANITIZER_MARKERS):
            problems.append("sanitizer report or BUG line in the node log")
        if problems:
            raise AssertionError("node %s: %s; log:\n%s" % (self.node_id, "; ".join(problems), self.log_tail(200)))

    def remove_dir(self):
        shutil.rmtree(self.tmpdir, ignore_errors=True)

    def log_text(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def log_tail(self, lines=150):
        return "\n".join(self.log_text().splitlines()[-lines:])

    # -- HTTP -------------------------------------------------------------
    @property
    def admin_port(self):
        """The admin listener's port (CONVERGER_ADMIN_LISTEN: a free port of
        its own unless env sets it), or None when env turns it off ("")."""
        v = self.overrides.get("CONVERGER_ADMIN_LISTEN", "127.0.0.1:%d" % self._admin_port)
        return int(v.rsplit(":", 1)[1]) if v and not v.endswith(":0") else None

    @property
    def admin_url(self):
        """http://127.0.0.1:PORT of the admin listener (the client port without one)."""
        return "http://127.0.0.1:%d" % (self.admin_port or self.port)

    def port_for(self, path):
        """The port that serves `path`: the admin listener's for /metrics,
        /admin/* and /livez when the node has one, else the client port."""
        admin = path.startswith("/admin/") or path.split("?")[0] in ("/metrics", "/livez")
        return self.admin_port if admin and self.admin_port else self.port

    def request(self, method, path, body=None, headers=None, key=API_KEY, raw_body=None, timeout=5.0,
                port=None):
        """One request on a fresh connection (to `port`, or the one that
        serves `path`). body: JSON-encoded if not None; raw_body: bytes sent
        as is. Returns (status, headers(lowercase dict), json_or_None)."""
        conn = http.client.HTTPConnection("127.0.0.1", port or self.port_for(path), timeout=timeout)
        try:
            return _do_request(conn, method, path, body, headers, key, raw_body)
        finally:
            conn.close()

    def get(self, path, key=None, timeout=5.0, headers=None):
        return self.request("GET", path, key=key, timeout=timeout, headers=headers)

    def get_text(self, path, timeout=5.0, port=None):
        conn = http.client.HTTPConnection("127.0.0.1", port or self.port_for(path), timeout=timeout)
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read().decode("utf-8", "replace")
        finally:
            conn.close()

    def session(self):
        return RestSession(self.port)

    # -- REST shortcuts (assert success) ---------------------------------
    def create_channel(self, id=None, name=None, presence=False, signals=False):
        body = {"name": name or "channel"}
        if id is not None:
            body["id"] = id
        body["presence"] = presence
        if signals:
            body["signals"] = True
        st, _, js = self.request("POST", "/v1/channels", body)
        if st != 201:
            raise AssertionError("POST /v1/channels %r -> %s %r" % (body, st, js))
        return js

    def create_conv(self, channel, id=None):
        body = {"channel": channel}
        if id is not None:
            body["id"] = id
        st, _, js = self.request("POST", "/v1/conversations", body)
        if st != 201:
            raise AssertionError("POST /v1/conversations %r -> %s %r" % (body, st, js))
        return js

    def new_conv(self, presence=False, signals=False):
        """A fresh channel + conversation; returns the conversation id."""
        ch = self.create_channel(id=uid("ch"), name="test channel", presence=presence,
                                 signals=signals)
        return self.create_conv(ch["id"], id=uid("cv"))["id"]

    def send(self, conv, body, sender="alice", key=None):
        headers = {"Idempotency-Key": key} if key is not None else None
        st, _, js = self.request("POST", "/v1/conversations/%s/messages" % conv,
                                 {"sender": sender, "body": body}, headers=headers)
        if st not in (200, 201):
            raise AssertionError("send to %s -> %s %r" % (conv, st, js))
        return js

    def messages(self, conv, after=0, limit=1000):
        st, _, js = self.request("GET", "/v1/conversations/%s/messages?after=%d&limit=%d" % (conv, after, limit))
        if st != 200:
            raise AssertionError("GET messages %s -> %s %r" % (conv, st, js))
        return js

    def all_messages(self, conv):
        out, after = [], 0
        while True:
            js = self.messages(conv, after=after, limit=1000)
            if not js["messages"]:
                return out, js["head"]
            out.extend(js["messages"])
            after = js["messages"][-1]["seq"]

    def token(self, sub, convs, ttl=None):
        body = {"sub": sub, "convs": convs}
        if ttl is not None:
            body["ttlSeconds"] = ttl
        st, _, js = self.request("POST", "/v1/tokens", body)
        if st != 201:
            raise AssertionError("POST /v1/tokens -> %s %r" % (st, js))
        return js


def _do_request(conn, method, path, body, headers, key, raw_body):
    h = {}
    if key is not None:
        h["Authorization"] = "Bearer %s" % key
    data = None
    if raw_body is not None:
        data = raw_body
    elif body is not None:
        data = json.dumps(body).encode()
    if data is not None:
        h["Content-Type"] = "application/json"
    if headers:
        h.update(headers)
    conn.request(method, path, body=data, headers=h)
    r = conn.getresponse()
    raw = r.read()
    hdrs = {k.lower(): v for k, v in r.getheaders()}
    js = None
    if raw:
        try:
            js = json.loads(raw)
        except ValueError:
            js = None
    return r.status, hdrs, js


class Sender(threading.Thread):
    """A steady REST sender, started at once: {"i": n} to `conv` through
    `node` (a keep-alive session), Idempotency-Key "k<n>", one every
    `every_s` seconds, until halt(). `acked` holds the seqs acknowledged,
    in order; a refusal ends it with its (status, body) in `errors`, and
    an exception with ("exception", repr), for the test to assert empty
    after halt()."""

    def __init__(self, node, conv, every_s=0.01, sender="bot"):
        super().__init__(daemon=True)
        self.node, self.conv, self.every_s, self.sender = node, conv, every_s, sender
        self.acked, self.errors = [], []
        self.halted = threading.Event()
        self.start()

    def run(self):
        try:
            with self.node.session() as s:
                i = 0
                while not self.halted.is_set():
                    st, _, js = s.request("POST", "/v1/conversations/%s/messages" % self.conv,
                                          {"sender": self.sender, "body": {"i": i}},
                                          headers={"Idempotency-Key": "k%d" % i})
                    if st not in (200, 201):
                        self.errors.append((st, js))
                        return
                    self.acked.append(js["seq"])
                    i += 1
                    self.halted.wait(self.every_s)
        except Exception as e:  # a reset or a timeout: the test sees it in errors
            self.errors.append(("exception", repr(e)))

    def halt(self, timeout=10.0):
        self.halted.set()
        self.join(timeout)


class RestSession:
    """A persistent keep-alive connection; same return shape as Node.request."""

    def __init__(self, port, timeout=10.0):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, key=API_KEY, raw_body=None):
        return _do_request(self.conn, method, path, body, headers, key, raw_body)

    def send(self, conv, body, sender="alice", key=None):
        headers = {"Idempotency-Key": key} if key is not None else None
        st, _, js = self.request("POST", "/v1/conversations/%s/messages" % conv,
                                 {"sender": sender, "body": body}, headers=headers)
        if st not in (200, 201):
            raise AssertionError("send to %s -> %s %r" % (conv, st, js))
        return js

    def close(self):
        self.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()


# --------------------------------------------------------------------------
# Tokens
# --------------------------------------------------------------------------

def b64url(data):
    if isinstance(data, str):
        data = data.encode()
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def b64url_decode(s):
    s += "=" * (-len(s) % 4)
    return base64.urlsafe_b64decode(s.encode())


_OMIT = object()


def mint_token(sub, convs, ttl=3600, alg="HS256", secret=TOKEN_SECRET, exp=None, jti=None,
               extra_header=None, omit_exp=False, extra_claims=None, bad_signature=False):
    """A JWT made here, so tests can forge bad ones.

    alg: HS256 (good), HS384 (correctly signed, but not allowed), none (no
    signature). exp: absolute epoch seconds (default now+ttl); omit_exp drops
    the claim. bad_signature flips the signature bytes.
    """
    header = {"alg": alg, "typ": "JWT"}
    if extra_header:
        header.update(extra_header)
    now = int(time.time())
    claims = {"sub": sub, "convs": list(convs), "iat": now,
              "jti": jti or uid("jti")}
    if not omit_exp:
        claims["exp"] = exp if exp is not None else now + ttl
    if extra_claims:
        claims.update(extra_claims)
    signing_input = b64url(json.dumps(header, separators=(",", ":"))) + "." + \
        b64url(json.dumps(claims, separators=(",", ":")))
    key = secret.encode() if isinstance(secret, str) else secret
    if alg == "HS256":
        sig = hmac.new(key, signing_input.encode(), hashlib.sha256).digest()
    elif alg == "HS384":
        sig = hmac.new(key, signing_input.encode(), hashlib.sha384).digest()
    elif alg == "HS512":
        sig = hmac.new(key, signing_input.encode(), hashlib.sha512).digest()
    elif alg.lower() == "none":
        sig = b""
    else:
        raise ValueError(alg)
    if bad_signature and sig:
        sig = bytes(b ^ 0x5A for b in sig)
    return signing_input + "." + b64url(sig)


def decode_token(tok):
    h, p, s = tok.split(".")
    return json.loads(b64url_decode(h)), json.loads(b64url_decode(p)), b64url_decode(s)


# --------------------------------------------------------------------------
# Raw HTTP
# --------------------------------------------------------------------------

class HttpReader:
    """Reads HTTP/1.1 responses from a socket, one after another."""

    def __init__(self, sock, timeout=5.0):
        self.sock = sock
        self.buf = b""
        self.timeout = timeout
        self.eof = False

    def _fill(self, deadline):
        if self.eof:
            return False
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise socket.timeout("timed out reading HTTP response")
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    def read_response(self, timeout=None, head_request=False):
        """Returns (status, headers(lowercase dict), body bytes) or raises
        EOFError if the peer closed before a status line arrived."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while b"\r\n\r\n" not in self.buf:
            if not self._fill(deadline):
                if self.buf:
                    raise EOFError("connection closed inside a response head: %r" % self.buf[:200])
                raise EOFError("connection closed")
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        m = re.match(r"HTTP/1\.[01] (\d{3})", lines[0])
        if not m:
            raise ValueError("bad status line %r" % lines[0])
        status = int(m.group(1))
        headers = {}
        for ln in lines[1:]:
            k, _, v = ln.partition(":")
            headers[k.strip().lower()] = v.strip()
        if head_request or status in (101, 204, 304) or 100 <= status < 200:
            return status, headers, b""
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = b""
            while True:
                while b"\r\n" not in self.buf:
                    if not self._fill(deadline):
                        raise EOFError("closed inside chunked body")
                size_line, self.buf = self.buf.split(b"\r\n", 1)
                size = int(size_line.split(b";")[0], 16)
                while len(self.buf) < size + 2:
                    if not self._fill(deadline):
                        raise EOFError("closed inside chunk")
                body += self.buf[:size]
                self.buf = self.buf[size + 2:]
                if size == 0:
                    return status, headers, body
        if "content-length" in headers:
            n = int(headers["content-length"])
            while len(self.buf) < n:
                if not self._fill(deadline):
                    raise EOFError("closed inside body (%d of %d)" % (len(self.buf), n))
            body, self.buf = self.buf[:n], self.buf[n:]
            return status, headers, body
        # no length: body runs to EOF
        while self._fill(deadline):
            pass
        body, self.buf = self.buf, b""
        return status, headers, body

    def at_eof(self, timeout=2.0):
        """True if the peer closes (or resets) the connection within timeout
        with no further bytes."""
        deadline = time.monotonic() + timeout
        try:
            while not self.eof:
                if not self._fill(deadline):
                    break
        except socket.timeout:
            return False
        except OSError:
            return True
        return self.eof


def raw_connect(port, timeout=5.0):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def send_until_answer(sock, data, chunk=4096):
    """Send data in chunks; stop early if the peer has answered (readable) or
    closed. Returns the number of bytes sent."""
    sent = 0
    while sent < len(data):
        r, _, _ = select.select([sock], [], [], 0)
        if r:
            break
        try:
            sent += sock.send(data[sent:sent + chunk])
        except (BrokenPipeError, ConnectionResetError):
            break
    return sent


def json_body(body):
    try:
        return json.loads(body)
    except ValueError:
        return None


# --------------------------------------------------------------------------
# Raw WebSocket client
# --------------------------------------------------------------------------

OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA


class WsClosed(Exception):
    def __init__(self, code, reason):
        super().__init__("closed %r %r" % (code, reason))
        self.code = code
        self.reason = reason


def _mask(data, key):
    if not data:
        return data
    n = len(data)
    k = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "big") ^ int.from_bytes(k, "big")).to_bytes(n, "big")


class RawWs:
    """A WebSocket client over a plain socket.

    RawWs(port) opens the TCP connection and sends the upgrade; `status`,
    `headers` and `body` hold the HTTP answer (101 on success). Frames from
    the server are read with recv_frame/recv_json/expect_close. With
    auto_pong (default) a server ping is answered while reading and counted
    in `pings`.
    """

    def __init__(self, port, path="/v1/ws", protocols=(SUBPROTOCOL,), key=None, version="13",
                 extra_headers=None, omit=(), timeout=5.0, auto_pong=True, expect_101=True, initial=b""):
        self.sock = raw_connect(port, timeout)
        self.auto_pong = auto_pong
        self.pings = 0
        self.closed = None  # (code, reason) once a close frame was read
        self.key = key if key is not None else base64.b64encode(os.urandom(16)).decode()
        hdrs = [("Host", "127.0.0.1:%d" % port), ("Upgrade", "websocket"), ("Connection", "Upgrade"),
                ("Sec-WebSocket-Key", self.key), ("Sec-WebSocket-Version", version)]
        if protocols:
            hdrs.append(("Sec-WebSocket-Protocol", ", ".join(protocols)))
        hdrs = [(k, v) for k, v in hdrs if k not in omit]
        for k, v in (extra_headers or []):
            hdrs.append((k, v))
        req = "GET %s HTTP/1.1\r\n" % path + "".join("%s: %s\r\n" % kv for kv in hdrs) + "\r\n"
        self.sock.sendall(req.encode() + initial)  # initial: frames in the same packet
        self.reader = HttpReader(self.sock, timeout)
        # a 101 has no body; read_response handles that; other answers carry one
        self.status, self.headers, self.body = self.reader.read_response()
        if expect_101 and self.status != 101:
            raise AssertionError("upgrade refused: %d %r %r" % (self.status, self.headers, self.body))
        self.buf = self.reader.buf  # bytes after the 101 head belong to frames
        self.reader.buf = b""

    def expected_accept(self):
        return base64.b64encode(hashlib.sha1((self.key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()

    # -- sending ----------------------------------------------------------
    @staticmethod
    def encode_frame(opcode, payload=b"", fin=True, mask=True, rsv=0, declared_len=None):
        """Bytes of one client frame. declared_len lies about the length."""
        if isinstance(payload, str):
            payload = payload.encode()
        b0 = (0x80 if fin else 0) | (rsv << 4) | opcode
        n = len(payload) if declared_len is None else declared_len
        mbit = 0x80 if mask else 0
        if n < 126:
            hdr = bytes([b0, mbit | n])
        elif n < 65536:
            hdr = bytes([b0, mbit | 126]) + struct.pack("!H", n)
        else:
            hdr = bytes([b0, mbit | 127]) + struct.pack("!Q", n)
        if mask:
            k = os.urandom(4)
            hdr += k
            payload = _mask(payload, k)
        return hdr + payload

    def send_bytes(self, data):
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may already have closed; reading tells

    def send_frame(self, opcode, payload=b"", fin=True, mask=True, rsv=0):
        self.send_bytes(self.encode_frame(opcode, payload, fin, mask, rsv))

    def send_text(self, text):
        self.send_frame(OP_TEXT, text.encode() if isinstance(text, str) else text)

    def send_json(self, obj):
        self.send_text(json.dumps(obj))

    def send_binary(self, data):
        self.send_frame(OP_BINARY, data)

    def send_close(self, code=1000, reason=b""):
        self.send_frame(OP_CLOSE, struct.pack("!H", code) + reason)

    def hello(self, token, subs, client=None):
        msg = {"type": "hello", "token": token, "subs": subs}
        if client is not None:
            msg["client"] = client
        self.send_json(msg)

    # -- receiving --------------------------------------------------------
    def _need(self, n, deadline):
        while len(self.buf) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise socket.timeout("timed out waiting for a frame")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                raise EOFError("connection closed without (complete) close frame")
            self.buf += data

    def recv_frame(self, timeout=5.0):
        """Next frame as (opcode, fin, payload). Raises socket.timeout,
        EOFError."""
        deadline = time.monotonic() + timeout
        self._need(2, deadline)
        b0, b1 = self.buf[0], self.buf[1]
        fin, op = bool(b0 & 0x80), b0 & 0x0F
        masked, n = bool(b1 & 0x80), b1 & 0x7F
        pos = 2
        if n == 126:
            self._need(4, deadline)
            n = struct.unpack("!H", self.buf[2:4])[0]
            pos = 4
        elif n == 127:
            self._need(10, deadline)
            n = struct.unpack("!Q", self.buf[2:10])[0]
            pos = 10
        if masked:
            self._need(pos + 4, deadline)
            k = self.buf[pos:pos + 4]
            pos += 4
        self._need(pos + n, deadline)
        payload = self.buf[pos:pos + n]
        self.buf = self.buf[pos + n:]
        if masked:
            payload = _mask(payload, k)
            self.server_masked = True
        return op, fin, payload

    def recv_message(self, timeout=5.0):
        """Next data message (opcode, payload), answering pings; raises
        WsClosed on a close frame."""
        deadline = time.monotonic() + timeout
        parts, first_op = [], None
        while True:
            op, fin, payload = self.recv_frame(max(0.01, deadline - time.monotonic()))
            if op == OP_PING:
                self.pings += 1
                if self.auto_pong:
                    self.send_frame(OP_PONG, payload)
                continue
            if op == OP_PONG:
                continue
            if op == OP_CLOSE:
                code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None
                reason = payload[2:].decode("utf-8", "replace")
                self.closed = (code, reason)
                try:
                    self.send_frame(OP_CLOSE, payload[:2])
                except OSError:
                    pass
                raise WsClosed(code, reason)
            if op == OP_CONT:
                parts.append(payload)
            else:
                first_op = op
                parts = [payload]
            if fin:
                return first_op, b"".join(parts)

    def recv_json(self, timeout=5.0):
        op, payload = self.recv_message(timeout)
        if op != OP_TEXT:
            raise AssertionError("expected a text frame, got opcode %d" % op)
        return json.loads(payload.decode("utf-8"))

    def recv_until(self, pred, timeout=5.0):
        """Read JSON messages until pred(msg); returns (matching, all read)."""
        deadline = time.monotonic() + timeout
        seen = []
        while True:
            m = self.recv_json(max(0.01, deadline - time.monotonic()))
            seen.append(m)
            if pred(m):
                return m, seen

    def expect_close(self, timeout=5.0):
        """Read (and collect) until a close frame; returns (code, reason,
        messages before it). EOF without a close frame gives code None."""
        deadline = time.monotonic() + timeout
        seen = []
        while True:
            try:
                op, payload = self.recv_message(max(0.01, deadline - time.monotonic()))
            except WsClosed as c:
                return c.code, c.reason, seen
            except EOFError:
                return None, None, seen
            if op == OP_TEXT:
                try:
                    seen.append(json.loads(payload))
                except ValueError:
                    seen.append(payload)
            else:
                seen.append((op, payload))

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


# --------------------------------------------------------------------------
# async helpers over the `websockets` library
# --------------------------------------------------------------------------

class WsClient:
    """A converger client on the `websockets` library (peer we did not write).
    Every await has a timeout."""

    def __init__(self, ws):
        self.ws = ws

    @classmethod
    async def connect(cls, node, timeout=5.0, **kw):
        if websockets is None:
            # scripts/setup installs python3-websockets: missing is a failure, not a skip
            raise AssertionError("the websockets library is not importable: run scripts/setup "
                                 "and use /usr/bin/python3")
        kw.setdefault("subprotocols", [SUBPROTOCOL])
        kw.setdefault("open_timeout", timeout)
        kw.setdefault("close_timeout", 2)
        kw.setdefault("max_size", 4 * 1024 * 1024)
        ws = await asyncio.wait_for(websockets.connect(node.ws_url, **kw), timeout + 1)
        return cls(ws)

    async def send_json(self, obj, timeout=5.0):
        await asyncio.wait_for(self.ws.send(json.dumps(obj)), timeout)

    async def recv_json(self, timeout=5.0):
        raw = await asyncio.wait_for(self.ws.recv(), timeout)
        if not isinstance(raw, str):
            raise AssertionError("expected a text frame, got %r" % (raw[:100],))
        return json.loads(raw)

    async def hello(self, token, subs, client=None, timeout=5.0, client_id=None):
        """Sends hello, returns the welcome (fails on anything else first)."""
        msg = {"type": "hello", "token": token, "subs": subs}
        if client is not None:
            msg["client"] = client
        if client_id is not None:
            msg["clientId"] = client_id
        await self.send_json(msg)
        m = await self.recv_json(timeout)
        if m.get("type") != "welcome":
            raise AssertionError("expected welcome, got %r" % (m,))
        return m

    async def until(self, pred, timeout=5.0):
        """Reads until pred(msg); returns (msg, all read incl. msg)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        seen = []
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise asyncio.TimeoutError("waited %.1fs; read %r" % (timeout, seen[-5:]))
            m = await self.recv_json(remaining)
            seen.append(m)
            if pred(m):
                return m, seen

    async def until_synced(self, conv, timeout=5.0):
        """Returns (msgs before synced for conv, the synced frame). Fails on
        anything other than msg frames of conv before it."""
        synced, seen = await self.until(lambda m: m.get("type") == "synced" and m.get("conv") == conv, timeout)
        msgs = seen[:-1]
        for m in msgs:
            if m.get("type") != "msg" or m.get("conv") != conv:
                raise AssertionError("unexpected frame before synced: %r" % (m,))
        return msgs, synced

    async def recv_msgs(self, n, timeout=10.0):
        """Exactly n `msg` frames (anything else fails)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        out = []
        while len(out) < n:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise asyncio.TimeoutError("got %d of %d msgs; last %r" % (len(out), n, out[-3:]))
            m = await self.recv_json(remaining)
            if m.get("type") != "msg":
                raise AssertionError("expected msg, got %r" % (m,))
            out.append(m)
        return out

    async def expect_silence(self, seconds=0.3):
        """Fails if any frame arrives within `seconds`."""
        try:
            m = await asyncio.wait_for(self.ws.recv(), seconds)
        except asyncio.TimeoutError:
            return
        raise AssertionError("expected no frame, got %r" % (m,))

    async def wait_closed(self, timeout=5.0):
        """Reads until the connection closes; returns (code, reason, frames)."""
        seen = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise asyncio.TimeoutError("connection not closed within %.1fs; read %r" % (timeout, seen[-5:]))
            try:
                raw = await asyncio.wait_for(self.ws.recv(), remaining)
            except websockets.exceptions.ConnectionClosed:
                return self.ws.close_code, self.ws.close_reason, seen
            try:
                seen.append(json.loads(raw))
            except (ValueError, TypeError):
                seen.append(raw)

    async def close(self):
        try:
            await asyncio.wait_for(self.ws.close(), 3)
        except Exception:
            pass


async def open_client(node, token, subs, timeout=5.0, client_id=None):
    """connect + hello; returns (client, welcome)."""
    c = await WsClient.connect(node, timeout)
    try:
        w = await c.hello(token, subs, timeout=timeout, client_id=client_id)
    except BaseException:
        await c.close()
        raise
    return c, w


_CLOSED = ((websockets.exceptions.ConnectionClosed,) if websockets else ()) + (ConnectionError, OSError)


async def recv_seqs(c, conv, n, timeout=10.0):
    """The next n msg frames of conv, as (seq, body) pairs, skipping other
    frame types (synced)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    out = []
    while len(out) < n:
        m = await c.recv_json(max(0.05, deadline - loop.time()))
        if m.get("type") == "msg":
            assert m["conv"] == conv, m
            out.append((m["seq"], m["body"]))
        elif m.get("type") != "synced":
            raise AssertionError("unexpected frame %r" % (m,))
    return out


class Follower:
    """A client of one conversation that resumes with its watermark on the
    next node of `nodes` whenever its socket ends, like the SDK: a seq at
    or below the watermark is a duplicate on the wire and not delivered."""

    def __init__(self, nodes, conv, start=0):
        self.nodes, self.conv, self.i = nodes, conv, start
        self.delivered, self.dups, self.welcomes, self.nodes_used = [], 0, 0, []
        self.errors = []  # error frames received (e.g. replay_unavailable)
        self.token = mint_token(uid("f"), [conv])

    @property
    def watermark(self):
        return self.delivered[-1] if self.delivered else 0

    async def run(self, until):
        """Follows until until(watermark) is true."""
        while not until(self.watermark):
            node = self.nodes[self.i % len(self.nodes)]
            if not node.running():
                self.i += 1
                continue
            try:
                c, _ = await open_client(node, self.token, [{"conv": self.conv, "watermark": self.watermark}])
            except (_CLOSED + (asyncio.TimeoutError, AssertionError)):
                self.i += 1
                await asyncio.sleep(0.05)
                continue
            self.welcomes += 1
            self.nodes_used.append(node.node_id)
            try:
                while not until(self.watermark):
                    try:
                        m = await c.recv_json(0.3)
                    except asyncio.TimeoutError:
                        continue
                    if m.get("type") == "error":
                        self.errors.append(m)
                    if m.get("type") != "msg":
                        continue
                    if m["seq"] <= self.watermark:
                        self.dups += 1
                    elif m["seq"] != self.watermark + 1:
                        raise AssertionError("gap: seq %d after %d" % (m["seq"], self.watermark))
                    else:
                        self.delivered.append(m["seq"])
            except _CLOSED:
                self.i += 1
            finally:
                await c.close()



# --------------------------------------------------------------------------
# A sharded cluster: PostgreSQL instances, Redis bus instances, a shard map
# --------------------------------------------------------------------------

SHARD_COUNT = 256


def shard_key(conv):
    """FNV-1a 64 of the id (src/core/shard.h)."""
    h = 14695981039346656037
    for b in conv.encode():
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def shard_of(conv):
    """The logical shard of a conversation (src/core/shard.h)."""
    return shard_key(conv) % SHARD_COUNT


def bus_of(conv, buckets):
    """Jump consistent hash of the conversation's key into `buckets`
    (Lamping and Veach; src/core/shard.c): its bus instance."""
    key, b, j = shard_key(conv), -1, 0
    while j < buckets:
        b = j
        key = (key * 2862933555777941757 + 1) & 0xFFFFFFFFFFFFFFFF
        j = int((b + 1) * (float(1 << 31) / float((key >> 33) + 1)))
    return b


class Senders:
    """One REST sender thread per conversation over `nodes` in turn, each
    sending m0, m1, ... under their Idempotency-Key and resending one until
    it is acknowledged (201, or 200: found by its key); once stopped, an
    unanswered one is still resent (for at most 20 s), so that no message
    is left stored but unacknowledged. `acked[conv]`: the seqs answered;
    `refused[conv]`: the 503s, `no_hint` those without Retry-After;
    `other`: any other answer. A context manager: started on entry,
    stopped and joined on exit."""

    def __init__(self, nodes, convs):
        self.nodes, self.convs = nodes, convs
        self.acked = {c: [] for c in convs}
        self.refused = {c: 0 for c in convs}
        self.other = []
        self.no_hint = 0
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(k, c), daemon=True)
                        for k, c in enumerate(convs)]

    def run(self, k, conv):
        i, pending, give_up = 0, False, None
        while not self.stop.is_set() or pending:
            if self.stop.is_set():
                give_up = give_up or time.time() + 20
                if time.time() > give_up:
                    return
            node = self.nodes[(k + i) % len(self.nodes)]
            try:
                st, hdr, js = node.request("POST", "/v1/conversations/%s/messages" % conv,
                                           {"sender": "bot", "body": {"i": i}},
                                           headers={"Idempotency-Key": "m%d" % i}, timeout=10)
            except OSError:
                st, hdr, js = 0, {}, None
            if st in (200, 201):
                self.acked[conv].append(js["seq"])
                i += 1
                pending = False
                continue
            pending = True
            if st == 503:
                self.refused[conv] += 1
                if "retry-after" not in {k.lower() for k in hdr}:
                    self.no_hint += 1
            elif st != 0:
                self.other.append((conv, st, js))
            time.sleep(0.05)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *a):
        self.stop.set()
        for t in self.threads:
            t.join(30)


class Sharded:
    """The databases and bus of a sharded cluster, started here and stopped
    by stop(): `instances` PgClusters (the first also the control database
    unless control=True gives it one of its own), `bus` RedisServers, the
    shard map written with `converger shards init` (logical shard k on
    instance k mod n, src/cli/shards.c). standby=i: instance i gets a
    synchronous standby, and the map names the pair's multi-host URL.
    env() is what a node needs (CONVERGER_DATABASE_URL, CONVERGER_BUS)."""

    def __init__(self, instances=3, bus=2, durable=False, control=False, standby=None):
        self.pgs, self.redis, self.standby = [], [], None
        try:
            self.control = PgCluster(durable=durable) if control else None
            for _ in range(instances):
                self.pgs.append(PgCluster(durable=durable))
            if standby is not None:
                self.standby = self.pgs[standby].make_standby()
            for _ in range(bus):
                self.redis.append(RedisServer())
            self.urls = [pg.multi_url() if i == standby else pg.url for i, pg in enumerate(self.pgs)]
            self.control_url = self.control.url if control else self.urls[0]
            args = [binary(), "shards", "init", "--database-url", self.control_url]
            for u in self.urls:
                args += ["--instance", u]
            r = subprocess.run(args, capture_output=True, text=True, timeout=60)
            if r.returncode != 0:
                raise AssertionError("converger shards init failed: %s" % r.stderr)
        except BaseException:
            self.stop()
            raise

    @property
    def bus_urls(self):
        return ",".join(r.url for r in self.redis)

    def env(self, extra=None):
        e = {"CONVERGER_DATABASE_URL": self.control_url, "CONVERGER_BUS": self.bus_urls}
        e.update(extra or {})
        return e

    def instance_of(self, conv):
        return shard_of(conv) % len(self.pgs)

    def bus_index(self, conv):
        return bus_of(conv, len(self.redis))

    def conv_on(self, node, instance=None, bus=None, channel=None):
        """A new conversation (through `node`) whose rows are on `instance`
        and whose channel is on bus instance `bus` (None: any)."""
        ch = channel or node.create_channel()["id"]
        while True:
            conv = uid("sc")
            if (instance is None or self.instance_of(conv) == instance) and \
                    (bus is None or self.bus_index(conv) == bus):
                node.create_conv(ch, conv)
                return conv

    def stop(self):
        for x in list(self.redis) + ([self.standby] if self.standby else []) + list(self.pgs) + \
                ([self.control] if getattr(self, "control", None) else []):
            try:
                x.stop()
            except Exception as e:  # the others still stop
                sys.stderr.write("stopping %r: %s\n" % (x, e))


# --------------------------------------------------------------------------
# unittest glue
# --------------------------------------------------------------------------

RFC3339_MS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")


class NodeCase(unittest.TestCase):
    """Base class. self.node_start(env) starts a node owned by the test;
    cls.class_node(env) (in setUpClass) one shared by the class. Logs of the
    nodes involved are printed when a test fails."""

    _class_nodes = ()

    @classmethod
    def class_node(cls, env=None):
        n = Node(env)
        if not cls._class_nodes:
            cls._class_nodes = []
        cls._class_nodes.append(n)

        def cleanup(n=n):
            try:
                n.finish()
            finally:
                n.ensure_stopped()
                n.remove_dir()
        cls.addClassCleanup(cleanup)
        return n

    def node_start(self, env=None, **kw):
        """A node owned by this test; kw go to Node (nofile=...)."""
        n = Node(env, **kw)
        self._test_nodes.append(n)
        self.addCleanup(n.ensure_stopped)
        self.addCleanup(n.finish)  # runs first: clean exit, no sanitizer report
        return n

    def run(self, result=None):
        self._test_nodes = []
        before = (len(result.failures) + len(result.errors)) if result is not None else 0
        try:
            return super().run(result)
        finally:
            after = (len(result.failures) + len(result.errors)) if result is not None else 0
            if after > before:
                for n in list(self._test_nodes) + list(self._class_nodes or ()):
                    sys.stderr.write("\n----- log of node %s (%s) for %s -----\n%s\n----- end of log -----\n"
                                     % (n.node_id, n.tmpdir, self.id(), n.log_tail(200)))
            for n in self._test_nodes:
                n.ensure_stopped()
                n.remove_dir()

    def arun(self, coro, timeout=30.0):
        """Runs a coroutine to completion with an overall timeout."""
        return asyncio.run(asyncio.wait_for(coro, timeout))

    def assertErrorBody(self, js, code, status=None):
        self.assertIsInstance(js, dict, "error body must be JSON, got %r" % (js,))
        self.assertIn("error", js, js)
        self.assertIsInstance(js["error"], dict, js)
        self.assertEqual(js["error"].get("code"), code, js)
        self.assertIsInstance(js["error"].get("message"), str, js)

    def assertMsg(self, m, conv, seq=None, sender=None, body=None, id=None):
        self.assertEqual(m.get("type"), "msg", m)
        self.assertEqual(m.get("conv"), conv, m)
        for f in ("conv", "seq", "id", "sender", "ts", "body"):
            self.assertIn(f, m, "msg lacks %r: %r" % (f, m))
        self.assertIsInstance(m["seq"], int, m)
        self.assertRegex(m["ts"], RFC3339_MS, "ts is not RFC 3339 UTC with ms: %r" % (m,))
        if seq is not None:
            self.assertEqual(m["seq"], seq, m)
        if sender is not None:
            self.assertEqual(m["sender"], sender, m)
        if body is not None:
            self.assertEqual(m["body"], body, m)
        if id is not None:
            self.assertEqual(m["id"], id, m)


def main():
    """Strip --binary PATH (or --binary=PATH) from argv and run unittest."""
    global BINARY
    argv = [sys.argv[0]]
    args = sys.argv[1:]
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--binary" and i + 1 < len(args):
            BINARY = os.path.abspath(args[i + 1])
            i += 2
            continue
        if a.startswith("--binary="):
            BINARY = os.path.abspath(a.split("=", 1)[1])
            i += 1
            continue
        argv.append(a)
        i += 1
    if BINARY is None and os.environ.get("CONVERGER_BINARY"):
        BINARY = os.path.abspath(os.environ["CONVERGER_BINARY"])
    if BINARY is None:
        sys.stderr.write("usage: %s --binary /path/to/converger [unittest args]\n" % sys.argv[0])
        sys.exit(2)
    if not os.access(BINARY, os.X_OK):
        sys.stderr.write("binary %s is not executable\n" % BINARY)
        sys.exit(2)
    unittest.main(argv=argv, verbosity=1)
