"""The metrics the roll controller and the alerts read, on a real node, and
the alert rules and the dashboard against a real Prometheus.

- After a hello, REST appends delivered live and a client's close with
  1000, /metrics has the latency histograms (hello to welcome, append to
  commit, commit to the frames, path local), the close by code, the loop's
  utilisation, readiness, the bus, the capacity, the build (this commit)
  and the process figures in the Prometheus client conventions;
  /admin/status says the same.
- A Prometheus (Debian's binary, a throwaway config and data directory, a
  loopback port, stopped by its pid) scrapes the node every second with
  deploy/prometheus/converger-rules.yml loaded. Every rule is healthy,
  every metric a rule reads has a series, every rule expression evaluates,
  and every expression of deploy/grafana/converger.json returns a result.
  The metrics of a sharded cluster (metrics.c's "Sharded cluster:"
  families) are one series without labels at 0 on this single-database
  node: the alerts and panels that read only them must evaluate to
  nothing there (no shard "down", no empty line), and every such family
  is on the dashboard (tests/prometheus/rules_test.yml fires those alerts
  on sample series).
"""

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import NodeCase, open_client, mint_token, free_port  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RULES = os.path.join(REPO, "deploy", "prometheus", "converger-rules.yml")
DASHBOARD = os.path.join(REPO, "deploy", "grafana", "converger.json")
METRIC = re.compile(r"\b((?:converger|process)_[a-z_]+|converger:[a-z_:]+)\b")


def sharded_families():
    """The families only a sharded cluster's node has: metrics.c's help
    text begins with "Sharded cluster:"."""
    with open(os.path.join(REPO, "src", "core", "metrics.c")) as f:
        return set(re.findall(r'\{"(converger_[a-z_]+)", M_[A-Z]+,\s*"Sharded cluster:', f.read()))


def sharded_expr(expr, sharded):
    """Whether `expr` is about a sharded cluster only: it reads only the
    families of sharded_families(), or selects series by a PostgreSQL
    instance of the shard map or a bus instance."""
    read = {family_of(n) for n in METRIC.findall(expr)}
    by_instance = re.search(r'\b(db|bus)_instance!=""', expr) is not None
    return bool(read) and (read <= sharded or by_instance)


def family_of(name):
    """A series name's family (a histogram's _bucket, _count, _sum)."""
    return re.sub(r"_(bucket|count|sum)$", "", name)


def parse_metrics(text):
    """{(name, labels): value} of the exposition text."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$", line)
        if m:
            out[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return out


def value(ms, name, labels=""):
    return ms.get((name, labels))


class Prometheus:
    """A Prometheus server of its own on a loopback port."""

    def __init__(self, target_port):
        self.dir = tempfile.mkdtemp(prefix="converger-prom-")
        self.port = free_port()
        cfg = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [RULES],
            "scrape_configs": [{"job_name": "converger",
                                "static_configs": [{"targets": ["127.0.0.1:%d" % target_port]}]}],
        }
        path = os.path.join(self.dir, "prometheus.yml")
        with open(path, "w") as f:
            yaml.safe_dump(cfg, f)
        self.log = open(os.path.join(self.dir, "prometheus.log"), "w+")
        self.proc = subprocess.Popen(
            ["prometheus", "--config.file=" + path,
             "--storage.tsdb.path=" + os.path.join(self.dir, "data"),
             "--web.listen-address=127.0.0.1:%d" % self.port, "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        harness._register(self.proc)

    def api(self, path, **params):
        url = "http://127.0.0.1:%d/api/v1/%s?%s" % (self.port, path, urllib.parse.urlencode(params))
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.loads(r.read())

    def query(self, expr):
        return self.api("query", query=expr)

    def wait(self, pred, timeout, what):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("prometheus exited: " + self.log_text())
            try:
                last = pred()
                if last:
                    return last
            except OSError as e:
                last = e
            time.sleep(0.25)
        raise AssertionError("%s: not within %.0f s (last %r); log:\n%s"
                             % (what, timeout, last, self.log_text()))

    def log_text(self):
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()[-3000:]

    def stop(self):
        harness.stop_process(self.proc, 15)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class PrometheusMetrics(NodeCase):
    def traffic(self, n, msgs=5):
        """A subscriber welcomed, `msgs` REST appends delivered to it live,
        then its close with 1000."""
        conv = n.new_conv()

        async def go():
            c, w = await open_client(n, mint_token("pat", [conv]), [{"conv": conv, "watermark": None}])
            try:
                await c.until(lambda f: f.get("type") == "synced")
                for i in range(msgs):
                    await asyncio.to_thread(n.send, conv, {"i": i})
                got = 0
                while got < msgs:
                    f = await c.recv_json(5)
                    got += f.get("type") == "msg"
            finally:
                await c.ws.close(code=1000)
        asyncio.run(go())
        return conv

    def test_new_metrics_on_a_node(self):
        n = self.node_start({"CONVERGER_CAPACITY_CONNECTIONS": "5000"})
        self.traffic(n)
        time.sleep(1.2)  # a loop utilisation sample
        st, _, text = n.get_text("/metrics")
        self.assertEqual(st, 200)
        ms = parse_metrics(text)
        self.assertGreaterEqual(value(ms, "converger_hello_latency_ms_count"), 1)
        self.assertGreaterEqual(value(ms, "converger_append_latency_ms_count"), 5)
        self.assertGreaterEqual(value(ms, "converger_delivery_latency_ms_count", '{path="local"}'), 5)
        self.assertIsNone(value(ms, "converger_delivery_latency_ms_count", '{path="notify"}'))
        self.assertGreaterEqual(value(ms, "converger_ws_closes_total", '{code="1000"}'), 1)
        u = value(ms, "converger_loop_utilisation")
        self.assertTrue(0 <= u <= 1, u)
        self.assertEqual(value(ms, "converger_ready"), 1)
        self.assertEqual(value(ms, "converger_bus_listening"), 1)  # SQLite: the bus is in-process
        self.assertEqual(value(ms, "converger_capacity_connections"), 5000)
        self.assertEqual(value(ms, "converger_admission_queue_ms"), 10000)
        self.assertEqual(value(ms, "converger_drain_progress", '{kind="remaining"}'), 0)
        self.assertEqual(value(ms, "converger_drain_progress", '{kind="told"}'), 0)
        build = [k for k in ms if k[0] == "converger_build_info"]
        self.assertEqual(len(build), 1, build)
        # the commit the binary was built from: this history's (HEAD, or an
        # ancestor when the tests run against an older build)
        commit = re.search(r'commit="([0-9a-f]{12})"', build[0][1])
        self.assertTrue(commit, build)
        self.assertEqual(subprocess.run(["git", "-C", REPO, "merge-base", "--is-ancestor",
                                         commit.group(1), "HEAD"]).returncode, 0, build)
        self.assertGreater(value(ms, "process_cpu_seconds_total"), 0)
        self.assertGreater(value(ms, "process_resident_memory_bytes"), 1 << 20)
        self.assertGreater(value(ms, "process_open_fds"), 3)
        self.assertGreater(value(ms, "process_max_fds"), value(ms, "process_open_fds"))
        start = value(ms, "process_start_time_seconds")
        self.assertLess(abs(time.time() - start), 120, start)
        for t in ("process_cpu_seconds_total", "converger_ws_closes_total"):
            self.assertIn("# TYPE %s counter" % t, text)
        self.assertIn("# TYPE converger_loop_utilisation gauge", text)

        # a loop kept busy for two seconds reads as busy
        stop = threading.Event()

        def load():
            while not stop.is_set():
                n.get_text("/metrics")
        threads = [threading.Thread(target=load, daemon=True) for _ in range(2)]
        for t in threads:
            t.start()
        time.sleep(2.5)
        busy = parse_metrics(n.get_text("/metrics")[2])[("converger_loop_utilisation", "")]
        stop.set()
        for t in threads:
            t.join(10)
        self.assertGreater(busy, 0.02)

        st, _, js = n.request("GET", "/admin/status")
        self.assertEqual(st, 200, js)
        self.assertEqual(js["capacity"], 5000)
        self.assertTrue(js["ready"])
        self.assertTrue(0 <= js["loopUtilisation"] <= 1)
        self.assertEqual(js["drainProgress"], {"told": 0, "moved": 0, "closed": 0, "remaining": 0})
        # a single database: no shard map and no Redis bus to report
        self.assertNotIn("shards", js)
        self.assertNotIn("bus", js)
        st, _, js = n.request("GET", "/admin/cluster")
        self.assertEqual(st, 200, js)
        self.assertEqual(js["nodes"][0]["capacity"], 5000)

    def test_every_metric_is_documented(self):
        with open(os.path.join(REPO, "src", "core", "metrics.c")) as f:
            families = re.findall(r'\{"((?:converger|process)_[a-z_]+)", M_', f.read())
        with open(os.path.join(REPO, "docs", "operations.md")) as f:
            doc = f.read()
        section = doc[doc.index("## Metrics"):doc.index("### Alerts and the dashboard")]
        self.assertGreater(len(families), 30)
        for name in families:
            self.assertIn("| `%s` |" % name, section, "%s is not in operations.md's Metrics" % name)

    def test_rules_and_dashboard_against_a_real_prometheus(self):
        n = self.node_start()
        self.traffic(n)
        prom = Prometheus(n.admin_port)  # it scrapes the admin listener
        self.addCleanup(prom.stop)
        prom.wait(lambda: any(r["value"][1] == "1" for r in
                              prom.query('up{job="converger"}')["data"]["result"]),
                  30, "the node scraped")
        # rates need two samples in their window
        prom.wait(lambda: prom.query("rate(process_cpu_seconds_total[1m])")["data"]["result"],
                  30, "a rate over two scrapes")

        with open(RULES) as f:
            rules = [r for g in yaml.safe_load(f)["groups"] for r in g["rules"]]

        def healthy():
            got = [r for g in prom.api("rules")["data"]["groups"] for r in g["rules"]]
            return len(got) == len(rules) and all(r["health"] == "ok" for r in got) and got
        got = prom.wait(healthy, 30, "every rule evaluated and healthy")
        self.assertEqual(sorted(r["name"] for r in got),
                         sorted(r.get("alert") or r.get("record") for r in rules))
        # alerts must not fire on a quiet healthy node
        firing = [r["name"] for r in got if r.get("state") == "firing"]
        self.assertEqual(firing, [])

        sharded = sharded_families()
        self.assertTrue({"converger_shard_up", "converger_shard_errors_total",
                         "converger_shard_store_ms", "converger_bus_up",
                         "converger_bus_subscriptions", "converger_bus_head_polls_total"}
                        <= sharded, sharded)
        names = set()
        for r in rules:
            res = prom.query(r["expr"])
            self.assertEqual(res["status"], "success", (r["expr"], res))
            names.update(METRIC.findall(r["expr"]))
            if sharded_expr(r["expr"], sharded):  # a sharded cluster's alert: nothing to say here
                self.assertEqual(res["data"]["result"], [], (r["expr"], "on a single database"))
        self.assertIn("converger_loop_utilisation", names)
        self.assertTrue({"converger_shard_up", "converger_bus_up"} <= names, names)
        for name in sorted(names):
            res = prom.query(name)
            self.assertTrue(res["data"]["result"], "no series of %s, read by a rule" % name)

        with open(DASHBOARD) as f:
            dash = json.load(f)
        rows = [p["title"] for p in dash["panels"] if p["type"] == "row"]
        self.assertTrue(any(t.startswith("Shards") for t in rows), rows)
        self.assertTrue(any(t.startswith("Bus") for t in rows), rows)
        exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
        self.assertGreaterEqual(len(exprs), 10)
        read = set()
        for e in exprs:
            res = prom.query(e)
            self.assertEqual(res["status"], "success", (e, res))
            read |= {family_of(n) for n in METRIC.findall(e)}
            if sharded_expr(e, sharded):  # a sharded cluster's panel: empty here
                self.assertEqual(res["data"]["result"], [], (e, "on a single database"))
                continue
            self.assertTrue(res["data"]["result"], "the dashboard's %r has no result" % e)
        # every family of a sharded cluster is on the dashboard
        self.assertEqual(sharded - read, set())


if __name__ == "__main__":
    harness.main()
