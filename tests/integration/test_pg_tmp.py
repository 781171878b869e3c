"""scripts/pg-tmp: throwaway PostgreSQL clusters side by side, each found again
by its directory, stopped by its pid, removed; clear failures (port taken, a
directory that is not ours) and a watchdog that stops a cluster whose owner
died; a synchronous standby (streaming, sync, reads what the primary
committed), promoted after the primary's SIGKILL and reached through the
pair's multi-host URL; a standby that is down holds the primary's commits,
and stop of either still works. The server is checked with a real
connection (psql from the same PostgreSQL). Every cluster started here is
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
from harness import psql  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PG_TMP = os.path.join(ROOT, "scripts", "pg-tmp")


def state_of(d):
    out = {}
    with open(os.path.join(d, "pg-tmp.state")) as f:
        for line in f:
            k, _, v = line.rstrip("\n").partition("=")
            out[k] = v.strip("'")
    return out


class PgTmp(unittest.TestCase):
    def pg_tmp(self, *args, env=None, timeout=60):
        e = dict(os.environ)
        e.update(env or {})
        return subprocess.run([PG_TMP] + list(args), env=e, capture_output=True, text=True,
                              timeout=timeout)

    def new_dir(self):
        d = tempfile.mkdtemp(prefix="pg-tmp-test-")
        self.addCleanup(shutil.rmtree, d, True)
        return d

    def start(self, d, *args, env=None):
        env = dict(env or {}, PG_TMP_DIR=d)
        r = self.pg_tmp("start", *args, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.addCleanup(self.pg_tmp, "stop", env={"PG_TMP_DIR": d})
        return r.stdout.strip()

    def standby(self, d, primary):
        r = self.pg_tmp("standby", "--primary", primary, env={"PG_TMP_DIR": d})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.addCleanup(self.pg_tmp, "stop", env={"PG_TMP_DIR": d})
        return r.stdout.strip()

    def query(self, url, sql):
        r = subprocess.run([psql(), "-X", "-At", "-d", url, "-c", sql], capture_output=True,
                           text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout.strip()

    @staticmethod
    def port_of(url):
        return url.rsplit(":", 1)[1].split("/")[0]

    def wait_sql(self, url, sql, want, timeout=15):
        """Polls sql on url until it answers want (a condition the server
        reaches by itself, e.g. a session's wait event); fails after timeout."""
        deadline = time.time() + timeout
        got = None
        while time.time() < deadline:
            got = self.query(url, sql)
            if got == want:
                return
            time.sleep(0.1)
        self.fail("%r answered %r, not %r, for %d s" % (sql, got, want, timeout))

    def background_psql(self, url, sql):
        p = subprocess.Popen([psql(), "-X", "-At", "-d", url, "-c", sql], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        self.addCleanup(p.wait)
        self.addCleanup(p.kill)
        return p

    def test_help_and_usage(self):
        r = self.pg_tmp("--help")
        self.assertEqual(r.returncode, 0)
        for word in ("start", "stop", "url", "run", "kill", "PG_TMP_DIR", "--owner", "--fast",
                     "synchronous_commit = on", "NOT durable"):
            self.assertIn(word, r.stdout)
        for word in ("standby --primary DIR", "promote", "--with-standby", "synchronous_standby_names",
                     "target_session_attrs=read-write", "redis-tmp"):
            self.assertIn(word, r.stdout)
        self.assertEqual(self.pg_tmp("frobnicate").returncode, 2)
        self.assertEqual(self.pg_tmp().returncode, 2)
        self.assertEqual(self.pg_tmp("standby").returncode, 2)  # no --primary
        self.assertEqual(self.pg_tmp("url", "--frob").returncode, 2)

    def test_two_clusters_side_by_side(self):
        self.assertIsNotNone(psql(), "psql not found (package postgresql)")
        a, b = self.new_dir(), self.new_dir()
        # Started in parallel: neither waits for the other, no shared state.
        # a durable (the default), b fast
        procs = [subprocess.Popen([PG_TMP, "start"] + extra, env=dict(os.environ, PG_TMP_DIR=d),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for d, extra in ((a, []), (b, ["--fast"]))]
        outs = [p.communicate(timeout=60) for p in procs]
        for d in (a, b):
            self.addCleanup(self.pg_tmp, "stop", env={"PG_TMP_DIR": d})
        for p, (out, err) in zip(procs, outs):
            self.assertEqual(p.returncode, 0, err)
        url_a, url_b = outs[0][0].strip(), outs[1][0].strip()
        self.assertRegex(url_a, r"^postgres://postgres@127\.0\.0\.1:\d+/converger$")
        self.assertNotEqual(url_a, url_b)
        self.assertEqual(self.pg_tmp("url", env={"PG_TMP_DIR": a}).stdout.strip(), url_a)
        self.assertEqual(self.pg_tmp("url", env={"PG_TMP_DIR": b}).stdout.strip(), url_b)
        self.assertEqual(self.query(url_a, "SELECT current_user || ' ' || current_database()"),
                         "postgres converger")
        settings = "SELECT string_agg(name || '=' || setting, ' ' ORDER BY name) FROM pg_settings" \
                   " WHERE name IN ('fsync', 'synchronous_commit', 'full_page_writes')"
        self.assertEqual(self.query(url_a, settings), "fsync=on full_page_writes=on synchronous_commit=on")
        self.assertEqual(self.query(url_b, settings), "fsync=off full_page_writes=off synchronous_commit=off")
        pid = int(state_of(a)["PID"])
        self.assertTrue(pid_alive(pid))
        if os.getuid() == 0:  # the server never runs as root
            self.assertNotEqual(os.stat("/proc/%d" % pid).st_uid, 0)
        # The unix socket in the directory works too.
        port = url_a.rsplit(":", 1)[1].split("/")[0]
        self.assertTrue(os.path.exists(os.path.join(a, ".s.PGSQL.%s" % port)))

        # A second start in the same directory is refused; the first is untouched.
        r = self.pg_tmp("start", env={"PG_TMP_DIR": a})
        self.assertEqual(r.returncode, 1)
        self.assertIn("already running", r.stderr)
        # The port taken by a: a clear error, nothing left behind.
        c = self.new_dir()
        os.rmdir(c)
        r = self.pg_tmp("start", env={"PG_TMP_DIR": c, "PG_TMP_PORT": port})
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("port %s" % port, r.stderr)
        self.assertIn("taken", r.stderr)
        self.assertFalse(os.path.exists(c))

        # stop: by pid, the directory gone, b still serving; twice is fine.
        pid_a = int(state_of(a)["PID"])
        r = self.pg_tmp("stop", env={"PG_TMP_DIR": a})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertFalse(pid_alive(pid_a))
        self.assertFalse(os.path.exists(a))
        self.assertEqual(self.pg_tmp("stop", env={"PG_TMP_DIR": a}).returncode, 0)
        r = self.pg_tmp("url", env={"PG_TMP_DIR": a})
        self.assertEqual(r.returncode, 1)
        self.assertEqual(self.query(url_b, "SELECT 1"), "1")

    def test_kill_then_up_recovers_every_commit(self):
        """kill: the postmaster SIGKILLed and its children gone (a crash);
        up: crash recovery on the same data, every committed row there."""
        d = self.new_dir()
        os.rmdir(d)
        url = self.start(d)
        self.query(url, "CREATE TABLE t (n int); INSERT INTO t SELECT generate_series(1, 1000)")
        pm = int(state_of(d)["PID"])
        kids = [int(p) for p in os.listdir("/proc") if p.isdigit() and self._ppid(int(p)) == pm]
        self.assertTrue(kids)  # checkpointer, WAL writer, ...
        r = self.pg_tmp("kill", env={"PG_TMP_DIR": d})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertFalse(pid_alive(pm))
        self.assertEqual([k for k in kids if pid_alive(k)], [])
        r = self.pg_tmp("up", env={"PG_TMP_DIR": d})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), url)
        self.assertEqual(self.query(url, "SELECT count(*) FROM t"), "1000")
        with open(os.path.join(d, "server.log")) as f:
            self.assertIn("not properly shut down", f.read())  # recovery ran: it was a crash
        # nothing running: a clear error
        self.assertEqual(self.pg_tmp("kill", env={"PG_TMP_DIR": d}).returncode, 0)
        r = self.pg_tmp("kill", env={"PG_TMP_DIR": d})
        self.assertEqual(r.returncode, 1)
        self.assertIn("not running", r.stderr)

    @staticmethod
    def _ppid(pid):
        try:
            with open("/proc/%d/stat" % pid) as f:
                return int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return None

    def test_standby_streams_sync_and_follows_promotion(self):
        """standby: synchronous (pg_stat_replication), a hot standby that
        reads what the primary committed; after the primary's SIGKILL,
        promote, and the pair's multi-host URL reaches the new primary."""
        self.assertIsNotNone(psql(), "psql not found (package postgresql)")
        p, s = self.new_dir(), self.new_dir()
        url_p = self.start(p)
        # Errors first: no such primary, a primary that is not running.
        r = self.pg_tmp("standby", "--primary", os.path.join(p, "nowhere"), env={"PG_TMP_DIR": s})
        self.assertEqual(r.returncode, 1)
        self.assertIn("no cluster", r.stderr)
        r = self.pg_tmp("promote", env={"PG_TMP_DIR": p})
        self.assertEqual(r.returncode, 1)
        self.assertIn("not a standby", r.stderr)
        r = self.pg_tmp("url", "--with-standby", env={"PG_TMP_DIR": p})
        self.assertEqual(r.returncode, 1)
        self.assertIn("no standby", r.stderr)

        url_s = self.standby(s, p)
        self.assertRegex(url_s, r"^postgres://postgres@127\.0\.0\.1:\d+/converger$")
        self.assertNotEqual(url_s, url_p)
        self.assertEqual(self.pg_tmp("url", env={"PG_TMP_DIR": s}).stdout.strip(), url_s)
        rep = self.query(url_p, "SELECT application_name || ' ' || state || ' ' || sync_state"
                                " FROM pg_stat_replication")
        self.assertRegex(rep, r"^pgtmp_[0-9a-f]{16} streaming sync$")
        name = rep.split()[0]
        self.assertEqual(self.query(url_p, "SHOW synchronous_standby_names"), '"%s"' % name)
        self.assertEqual(self.query(url_p, "SELECT slot_type || ' ' || active FROM pg_replication_slots"
                                           " WHERE slot_name = '%s'" % name), "physical true")
        self.assertEqual(self.query(url_s, "SELECT pg_is_in_recovery()"), "t")
        # Durable as its primary.
        self.assertEqual(self.query(url_s, "SHOW fsync"), "on")

        # A commit on the primary with remote_apply returns once the standby
        # has applied it: readable there at once. The standby refuses writes.
        self.query(url_p, "SET synchronous_commit = remote_apply; CREATE TABLE t (n int);"
                          " INSERT INTO t SELECT generate_series(1, 1000)")
        self.assertEqual(self.query(url_s, "SELECT count(*) FROM t"), "1000")
        r = subprocess.run([psql(), "-X", "-At", "-d", url_s, "-c", "INSERT INTO t VALUES (0)"],
                           capture_output=True, text=True, timeout=30)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("read-only", r.stderr)
        # A second standby of the same primary is refused.
        r = self.pg_tmp("standby", "--primary", p, env={"PG_TMP_DIR": self.new_dir()})
        self.assertEqual(r.returncode, 1)
        self.assertIn("has a standby already", r.stderr)

        # The pair's multi-host URL, the same from either directory.
        multi = self.pg_tmp("url", "--with-standby", env={"PG_TMP_DIR": p}).stdout.strip()
        self.assertEqual(multi, "postgres://postgres@127.0.0.1:%s,127.0.0.1:%s/converger"
                                "?target_session_attrs=read-write" % (self.port_of(url_p), self.port_of(url_s)))
        self.assertEqual(self.pg_tmp("url", "--with-standby", env={"PG_TMP_DIR": s}).stdout.strip(), multi)
        self.assertEqual(self.query(multi, "SELECT inet_server_port()"), self.port_of(url_p))

        # The primary crashes; the standby is promoted and takes writes; the
        # multi-host URL (still printed with the primary dead) reaches it.
        pid_p = int(state_of(p)["PID"])
        r = self.pg_tmp("kill", env={"PG_TMP_DIR": p})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertFalse(pid_alive(pid_p))
        self.assertEqual(self.pg_tmp("url", "--with-standby", env={"PG_TMP_DIR": p}).stdout.strip(), multi)
        r = self.pg_tmp("promote", env={"PG_TMP_DIR": s})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), url_s)
        self.assertEqual(self.query(url_s, "SELECT pg_is_in_recovery()"), "f")
        self.query(multi, "INSERT INTO t VALUES (1001)")
        self.assertEqual(self.query(multi, "SELECT count(*) || ' ' || inet_server_port() FROM t"),
                         "1001 %s" % self.port_of(url_s))
        r = self.pg_tmp("promote", env={"PG_TMP_DIR": s})
        self.assertEqual(r.returncode, 1)
        self.assertIn("not a standby", r.stderr)

        # stop cleans both: no process, no directory.
        pid_s = int(state_of(s)["PID"])
        for d in (p, s):
            r = self.pg_tmp("stop", env={"PG_TMP_DIR": d})
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertFalse(os.path.exists(d))
        self.assertFalse(pid_alive(pid_s))

    def test_standby_down_holds_commits_and_stop_still_works(self):
        """Synchronous replication: with the standby down, a commit on the
        primary waits until it is up again. stop of the standby releases the
        primary (synchronous_standby_names, slot); stop of a primary whose
        commits wait for a dead standby works, and so does the standby's."""
        self.assertIsNotNone(psql(), "psql not found (package postgresql)")
        p, s = self.new_dir(), self.new_dir()
        url_p = self.start(p)
        self.standby(s, p)
        self.query(url_p, "CREATE TABLE t (n int)")
        waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"

        r = self.pg_tmp("kill", env={"PG_TMP_DIR": s})
        self.assertEqual(r.returncode, 0, r.stderr)
        ins = self.background_psql(url_p, "INSERT INTO t VALUES (1)")
        self.wait_sql(url_p, waiting, "1")
        self.assertIsNone(ins.poll())
        r = self.pg_tmp("up", env={"PG_TMP_DIR": s})
        self.assertEqual(r.returncode, 0, r.stderr)
        out, err = ins.communicate(timeout=30)  # released by the standby's return
        self.assertEqual(ins.returncode, 0, err)

        # stop of the standby: the primary no longer waits for it.
        pid_s = int(state_of(s)["PID"])
        r = self.pg_tmp("stop", env={"PG_TMP_DIR": s})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertFalse(pid_alive(pid_s))
        self.assertFalse(os.path.exists(s))
        self.assertEqual(self.query(url_p, "SHOW synchronous_standby_names"), "")
        self.assertEqual(self.query(url_p, "SELECT count(*) FROM pg_replication_slots"), "0")
        self.assertEqual(state_of(p)["STANDBY"], "")
        self.query(url_p, "INSERT INTO t VALUES (2)")  # psql's timeout: a hang fails here

        # A new standby, killed: the primary's commits wait; stop of the
        # primary cuts them and ends it; stop of the dead standby cleans up.
        s2 = self.new_dir()
        self.standby(s2, p)
        r = self.pg_tmp("kill", env={"PG_TMP_DIR": s2})
        self.assertEqual(r.returncode, 0, r.stderr)
        ins = self.background_psql(url_p, "INSERT INTO t VALUES (3)")
        self.wait_sql(url_p, waiting, "1")
        pid_p = int(state_of(p)["PID"])
        t0 = time.time()
        r = self.pg_tmp("stop", env={"PG_TMP_DIR": p})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertLess(time.time() - t0, 9, "stop needed its SIGKILL fallback")
        self.assertFalse(pid_alive(pid_p))
        self.assertFalse(os.path.exists(p))
        ins.communicate(timeout=30)
        r = self.pg_tmp("stop", env={"PG_TMP_DIR": s2})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertFalse(os.path.exists(s2))

    def test_harness_pg_cluster_standby(self):
        """harness.PgCluster: make_standby(), multi_url(), promote() after
        kill() of the primary, stop() of both."""
        self.assertIsNotNone(psql(), "psql not found (package postgresql)")
        primary = harness.PgCluster(durable=True)
        self.addCleanup(primary.stop)
        sb = primary.make_standby()
        self.addCleanup(sb.stop)
        self.assertIs(primary.standby, sb)
        self.assertIs(sb.primary, primary)
        self.assertEqual(primary.sql("SELECT sync_state FROM pg_stat_replication"), ["sync"])
        multi = primary.multi_url()
        self.assertEqual(sb.multi_url(), multi)
        self.assertIn("target_session_attrs=read-write", multi)
        primary.sql("CREATE TABLE t (n int); INSERT INTO t VALUES (1)")  # waits for the standby's flush
        pid_p, pid_s = primary.pid, sb.pid
        primary.kill()
        self.assertFalse(pid_alive(pid_p))
        self.assertIsNone(primary.pid)
        sb.promote()
        self.assertEqual(sb.sql("SELECT pg_is_in_recovery()"), ["f"])
        self.query(multi, "INSERT INTO t VALUES (2)")
        self.assertEqual(sb.sql("SELECT count(*) FROM t"), ["2"])
        primary.stop()
        sb.stop()
        self.assertFalse(pid_alive(pid_s))
        self.assertFalse(os.path.exists(primary.dir) or os.path.exists(sb.dir))

    def test_foreign_directory_is_left_alone(self):
        d = self.new_dir()
        keep = os.path.join(d, "precious")
        with open(keep, "w") as f:
            f.write("x")
        r = self.pg_tmp("start", env={"PG_TMP_DIR": d})
        self.assertEqual(r.returncode, 1)
        self.assertIn("not empty", r.stderr)
        self.assertEqual(self.pg_tmp("stop", env={"PG_TMP_DIR": d}).returncode, 0)
        self.assertTrue(os.path.exists(keep))

    def test_missing_initdb(self):
        d = self.new_dir()
        r = self.pg_tmp("start", env={"PG_TMP_DIR": d, "PG_TMP_BINDIR": d})
        self.assertEqual(r.returncode, 1)
        self.assertIn("initdb", r.stderr)

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
        r = self.pg_tmp("run", "--", "sh", "-c",
                        'echo "$PG_TMP_URL"; cat "$PG_TMP_DIR/pg-tmp.state"; exit 7',
                        env={"PG_TMP_DIR": d})
        self.assertEqual(r.returncode, 7, r.stderr)
        self.assertRegex(r.stdout, r"postgres://postgres@127\.0\.0\.1:\d+/converger")
        pid = int([l for l in r.stdout.splitlines() if l.startswith("PID=")][0][4:])
        self.assertFalse(pid_alive(pid))
        self.assertFalse(os.path.exists(d))


if __name__ == "__main__":
    harness.main()
