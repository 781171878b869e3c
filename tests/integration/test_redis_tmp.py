"""scripts/redis-tmp and harness.RedisServer: throwaway redis-servers side by
side, without persistence, each found again by its directory, stopped by its
pid, removed; kill (SIGKILL) and up on the same port, empty; pause/resume
(SIGSTOP/SIGCONT); clear failures (port taken, a directory that is not ours);
a watchdog that stops a server whose owner died; run. The server is checked
over a raw socket (PING) and with redis-cli. Every server started here is
stopped in the test's cleanup."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import pid_alive  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REDIS_TMP = os.path.join(ROOT, "scripts", "redis-tmp")


def state_of(d):
    out = {}
    with open(os.path.join(d, "redis-tmp.state")) as f:
        for line in f:
            k, _, v = line.rstrip("\n").partition("=")
            out[k] = v.strip("'")
    return out


def port_of(url):
    return int(url.rsplit(":", 1)[1])


def ping(port, timeout=5.0):
    """PING over a fresh socket: the server's first line of answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(b"PING\r\n")
        return s.recv(64)


def refused(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        return False
    except ConnectionRefusedError:
        return True


class RedisTmp(unittest.TestCase):
    def redis_tmp(self, *args, env=None, timeout=60):
        e = dict(os.environ)
        e.update(env or {})
        return subprocess.run([REDIS_TMP] + list(args), env=e, capture_output=True, text=True,
                              timeout=timeout)

    def new_dir(self):
        d = tempfile.mkdtemp(prefix="redis-tmp-test-")
        self.addCleanup(shutil.rmtree, d, True)
        return d

    def start(self, d, *args, env=None):
        env = dict(env or {}, REDIS_TMP_DIR=d)
        r = self.redis_tmp("start", *args, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.addCleanup(self.redis_tmp, "stop", env={"REDIS_TMP_DIR": d})
        return r.stdout.strip()

    def cli(self, url, *args):
        r = subprocess.run(["redis-cli", "-u", url] + list(args), capture_output=True, text=True,
                           timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout.strip()

    def test_help_and_usage(self):
        r = self.redis_tmp("--help")
        self.assertEqual(r.returncode, 0)
        for word in ("start", "stop", "url", "kill", "up", "pause", "resume", "run", "REDIS_TMP_DIR",
                     "REDIS_TMP_PORT", "--owner", "--save ''", "--appendonly no", "pg-tmp"):
            self.assertIn(word, r.stdout)
        self.assertEqual(self.redis_tmp("frobnicate").returncode, 2)
        self.assertEqual(self.redis_tmp().returncode, 2)
        self.assertEqual(self.redis_tmp("start", "--frob").returncode, 2)
        self.assertEqual(self.redis_tmp("stop", "x").returncode, 2)

    def test_start_kill_up_pause_stop(self):
        a, b = self.new_dir(), self.new_dir()
        url_a, url_b = self.start(a), self.start(b)
        self.assertRegex(url_a, r"^redis://127\.0\.0\.1:\d+$")
        self.assertNotEqual(url_a, url_b)
        self.assertEqual(self.redis_tmp("url", env={"REDIS_TMP_DIR": a}).stdout.strip(), url_a)
        port = port_of(url_a)
        self.assertEqual(ping(port), b"+PONG\r\n")
        pid = int(state_of(a)["PID"])
        self.assertTrue(pid_alive(pid))
        with open("/proc/%d/comm" % pid) as f:
            self.assertEqual(f.read().strip(), "redis-server")
        # No persistence, loopback only.
        self.assertEqual(self.cli(url_a, "--no-raw", "CONFIG", "GET", "save").splitlines(),
                         ['1) "save"', '2) ""'])
        self.assertEqual(self.cli(url_a, "CONFIG", "GET", "appendonly").splitlines(), ["appendonly", "no"])
        self.assertEqual(self.cli(url_a, "CONFIG", "GET", "bind").splitlines(), ["bind", "127.0.0.1"])

        # A second start in the same directory is refused; the port taken: a
        # clear error, nothing left behind.
        r = self.redis_tmp("start", env={"REDIS_TMP_DIR": a})
        self.assertEqual(r.returncode, 1)
        self.assertIn("already running", r.stderr)
        c = self.new_dir()
        os.rmdir(c)
        r = self.redis_tmp("start", env={"REDIS_TMP_DIR": c, "REDIS_TMP_PORT": str(port)})
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("port %d" % port, r.stderr)
        self.assertIn("taken", r.stderr)
        self.assertFalse(os.path.exists(c))

        # kill: SIGKILL by pid, gone; the directory stays; up: same port, empty.
        self.assertEqual(self.cli(url_a, "SET", "k", "v"), "OK")
        r = self.redis_tmp("kill", env={"REDIS_TMP_DIR": a})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertFalse(pid_alive(pid))
        self.assertTrue(refused(port))
        r = self.redis_tmp("url", env={"REDIS_TMP_DIR": a})
        self.assertEqual(r.returncode, 1)
        self.assertIn("not running", r.stderr)
        r = self.redis_tmp("kill", env={"REDIS_TMP_DIR": a})
        self.assertEqual(r.returncode, 1)
        self.assertIn("not running", r.stderr)
        r = self.redis_tmp("up", env={"REDIS_TMP_DIR": a})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), url_a)
        pid2 = int(state_of(a)["PID"])
        self.assertNotEqual(pid2, pid)
        self.assertEqual(ping(port), b"+PONG\r\n")
        self.assertEqual(self.cli(url_a, "EXISTS", "k"), "0")
        r = self.redis_tmp("up", env={"REDIS_TMP_DIR": a})
        self.assertEqual(r.returncode, 1)
        self.assertIn("already running", r.stderr)

        # pause: a PING on an open connection gets no answer until resume.
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            r = self.redis_tmp("pause", env={"REDIS_TMP_DIR": a})
            self.assertEqual(r.returncode, 0, r.stderr)
            with open("/proc/%d/stat" % pid2) as f:
                self.assertEqual(f.read().rsplit(")", 1)[1].split()[0], "T")
            s.sendall(b"PING\r\n")
            s.settimeout(0.3)
            self.assertRaises(socket.timeout, s.recv, 64)
            r = self.redis_tmp("resume", env={"REDIS_TMP_DIR": a})
            self.assertEqual(r.returncode, 0, r.stderr)
            s.settimeout(5)
            self.assertEqual(s.recv(64), b"+PONG\r\n")

        # stop of a paused server: by its pid, the directory gone, b still
        # serving; twice is fine.
        self.redis_tmp("pause", env={"REDIS_TMP_DIR": a})
        r = self.redis_tmp("stop", env={"REDIS_TMP_DIR": a})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("SIGKILL", r.stderr)  # SIGTERM did it (after a SIGCONT)
        self.assertFalse(pid_alive(pid2))
        self.assertFalse(os.path.exists(a))
        self.assertTrue(refused(port))
        self.assertEqual(self.redis_tmp("stop", env={"REDIS_TMP_DIR": a}).returncode, 0)
        self.assertEqual(ping(port_of(url_b)), b"+PONG\r\n")

    def test_harness_redis_server(self):
        r = harness.RedisServer()
        self.addCleanup(r.stop)
        self.assertEqual(r.url, "redis://127.0.0.1:%d" % r.port)
        self.assertTrue(pid_alive(r.pid))
        self.assertIn(r.pid, harness._LIVE_PIDS)  # killed at exit if left
        self.assertEqual(ping(r.port), b"+PONG\r\n")
        pid = r.pid
        r.kill()
        self.assertFalse(pid_alive(pid))
        self.assertIsNone(r.pid)
        self.assertTrue(refused(r.port))
        r.up()
        self.assertTrue(pid_alive(r.pid))
        self.assertEqual(ping(r.port), b"+PONG\r\n")
        pid = r.pid
        r.stop()
        self.assertFalse(pid_alive(pid))
        self.assertNotIn(pid, harness._LIVE_PIDS)
        self.assertFalse(os.path.exists(r.dir))
        r.stop()  # again: nothing to do

    def test_foreign_directory_is_left_alone(self):
        d = self.new_dir()
        keep = os.path.join(d, "precious")
        with open(keep, "w") as f:
            f.write("x")
        r = self.redis_tmp("start", env={"REDIS_TMP_DIR": d})
        self.assertEqual(r.returncode, 1)
        self.assertIn("not empty", r.stderr)
        self.assertEqual(self.redis_tmp("stop", env={"REDIS_TMP_DIR": d}).returncode, 0)
        self.assertTrue(os.path.exists(keep))

    def test_missing_server(self):
        d = self.new_dir()
        r = self.redis_tmp("start", env={"REDIS_TMP_DIR": d, "REDIS_SERVER": os.path.join(d, "none")})
        self.assertEqual(r.returncode, 1)
        self.assertIn("redis-server", r.stderr)

    def test_owner_watchdog_stops_an_orphan(self):
        d = self.new_dir()
        owner = subprocess.Popen(["sleep", "60"])
        self.addCleanup(owner.wait)
        self.addCleanup(owner.kill)
        self.start(d, "--owner", str(owner.pid))
        pid = int(state_of(d)["PID"])
        self.assertTrue(pid_alive(pid))
        owner.kill()
        owner.wait()
        deadline = time.time() + 15
        while time.time() < deadline and (pid_alive(pid) or os.path.exists(d)):
            time.sleep(0.2)
        self.assertFalse(pid_alive(pid), "the server outlived its owner")
        self.assertFalse(os.path.exists(d))

    def test_run_stops_on_failure(self):
        d = self.new_dir()
        os.rmdir(d)
        r = self.redis_tmp("run", "--", "sh", "-c",
                           'echo "$REDIS_TMP_URL"; cat "$REDIS_TMP_DIR/redis-tmp.state";'
                           ' redis-cli -u "$REDIS_TMP_URL" PING; exit 7',
                           env={"REDIS_TMP_DIR": d})
        self.assertEqual(r.returncode, 7, r.stderr)
        self.assertRegex(r.stdout, r"redis://127\.0\.0\.1:\d+")
        self.assertIn("PONG", r.stdout)
        pid = int([l for l in r.stdout.splitlines() if l.startswith("PID=")][0][4:])
        self.assertFalse(pid_alive(pid))
        self.assertFalse(os.path.exists(d))


if __name__ == "__main__":
    harness.main()
