"""Deployment files agree with the node and with each other: deploy/k8s/
parses and sets every setting of the README's configuration table and of
`converger serve --help` (secrets from a Secret, per-pod values from the
downward API); the Kubernetes grace period and the systemd TimeoutStopSec
cover the drain computed from the ConfigMap's and the env file's drain
settings; probes point at /readyz and /livez on the port the node listens
on; docs/operations.md lists every setting with its default; systemd and
HAProxy accept their files when they are installed; and a node starts with
the ConfigMap's values (empty ones included) as its environment."""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

try:
    import yaml  # python3-yaml, installed by scripts/setup
except ImportError:  # pragma: no cover
    yaml = None

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
K8S = os.path.join(ROOT, "deploy", "k8s")
UNIT = os.path.join(ROOT, "deploy", "systemd", "converger.service")
ENV_FILE = os.path.join(ROOT, "deploy", "systemd", "converger.env")
HAPROXY_CFG = os.path.join(ROOT, "deploy", "haproxy", "converger.cfg")
OPERATIONS = os.path.join(ROOT, "docs", "operations.md")
STATEFULSET = os.path.join(K8S, "statefulset", "converger.yaml")
CONTAINERFILE = os.path.join(ROOT, "Containerfile")

# The drain settings of issue 6 and their defaults. Until the drain is
# merged they are not in `serve --help` or the README yet; once they are,
# the values there are checked against these.
DRAIN_DEFAULTS = {
    "CONVERGER_DRAIN_WINDOW_MS": "30000",
    "CONVERGER_DRAIN_CLOSE_RATE": "500",
    "CONVERGER_DRAIN_SHUTDOWN_MS": "60000",
}
SECRETS = {"CONVERGER_API_KEY", "CONVERGER_TOKEN_SECRET"}
PER_POD = {"CONVERGER_PUBLIC_URL", "CONVERGER_NODE_ID"}
# ConfigMap values that differ from the defaults, on purpose (each has a
# comment in configmap.yaml saying why).
OVERRIDES = {"CONVERGER_LISTEN", "CONVERGER_DATABASE_URL", "CONVERGER_WEB_DIR",
             "CONVERGER_DRAIN_SHUTDOWN_MS", "CONVERGER_CAPACITY_CONNECTIONS",
             "CONVERGER_LOG_FORMAT", "CONVERGER_ACCESS_LOG", "CONVERGER_ADMIN_LISTEN"}
# How long the node waits for in-flight store jobs when it exits, if
# src/serve.c does not say (STOP_GRACE_MS).
STOP_GRACE_FALLBACK_MS = 10000


def read(path):
    with open(path) as f:
        return f.read()


def readme_settings():
    """{env: default} from the README's configuration table."""
    text = read(os.path.join(ROOT, "README.md"))
    section = text.split("## Configuration", 1)[1]
    out = {}
    for line in section.splitlines():
        m = re.match(r"^\| `([A-Z][A-Z0-9_]+)` \| `--[a-z-]+` \| (.*?) \| ", line)
        if m:
            d = re.match(r"^`([^`]*)`$", m.group(2))
            out[m.group(1)] = d.group(1) if d else None  # None: prose
        elif out and not line.startswith("|"):
            break
    return out


def stop_grace_s():
    m = re.search(r"#define\s+STOP_GRACE_MS\s+(\d+)", read(os.path.join(ROOT, "src", "serve.c")))
    if not m:
        sys.stderr.write("note: STOP_GRACE_MS not found in src/serve.c; assuming %d ms\n"
                         % STOP_GRACE_FALLBACK_MS)
        return STOP_GRACE_FALLBACK_MS / 1000.0
    return int(m.group(1)) / 1000.0


def drain_grace_s():
    """DRAIN_GRACE_MS of src/gate/drain.h: the paced closes begin that long
    after the window."""
    m = re.search(r"#define\s+DRAIN_GRACE_MS\s+(\d+)", read(os.path.join(ROOT, "src", "gate", "drain.h")))
    if not m:
        raise AssertionError("DRAIN_GRACE_MS not found in src/gate/drain.h")
    return int(m.group(1)) / 1000.0


def drain_seconds(values, connections):
    """(window + grace + connections / close rate, shutdown), both in seconds."""
    window = int(values["CONVERGER_DRAIN_WINDOW_MS"]) / 1000.0
    rate = int(values["CONVERGER_DRAIN_CLOSE_RATE"])
    shutdown = int(values["CONVERGER_DRAIN_SHUTDOWN_MS"]) / 1000.0
    return window + drain_grace_s() + connections / rate, shutdown


def env_file_values():
    """{env: value} of active lines and {env} of commented ones."""
    active, commented = {}, set()
    for line in read(ENV_FILE).splitlines():
        m = re.match(r"^(#?)([A-Z][A-Z0-9_]*)=(.*)$", line)
        if not m:
            continue
        if m.group(1):
            commented.add(m.group(2))
        else:
            active[m.group(2)] = m.group(3)
    return active, commented


def unit_values():
    out = {}
    for line in read(UNIT).splitlines():
        m = re.match(r"^([A-Za-z]+)=(.*)$", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


class DeployFiles(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if yaml is None:
            raise AssertionError("python3-yaml is missing: run scripts/setup")
        cls.docs = {}
        for name in sorted(os.listdir(K8S)):
            if not name.endswith(".yaml"):
                continue
            with open(os.path.join(K8S, name)) as f:
                for doc in yaml.safe_load_all(f):
                    if doc is None:
                        continue
                    cls.docs[doc["kind"]] = doc
        r = subprocess.run([harness.binary(), "serve", "--help"], capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 0, r.stderr
        cls.help = dict(re.findall(r"^\s+--\S+\s+([A-Z][A-Z0-9_]+)\s+\[(.*)\]$", r.stdout, re.M))
        assert cls.help, "serve --help lists no setting"
        cls.readme = readme_settings()
        assert len(cls.readme) >= 20, cls.readme

    # -- shapes --------------------------------------------------------------------

    def test_manifests_parse(self):
        self.assertEqual(set(self.docs),
                         {"ConfigMap", "Deployment", "Service", "PodDisruptionBudget"})
        for kind, doc in self.docs.items():
            self.assertIn("apiVersion", doc, kind)
            self.assertEqual(doc["metadata"]["name"], "converger", kind)
        for k, v in self.configmap().items():
            self.assertIsInstance(v, str, "ConfigMap %s: values must be strings" % k)

    def configmap(self):
        return self.docs["ConfigMap"]["data"]

    def pod(self):
        return self.docs["Deployment"]["spec"]["template"]["spec"]

    def container(self):
        cs = self.pod()["containers"]
        self.assertEqual(len(cs), 1)
        return cs[0]

    def env(self):
        return {e["name"]: e for e in self.container().get("env", [])}

    def known(self):
        return set(self.help) | set(self.readme) | set(DRAIN_DEFAULTS)

    def default_of(self, name):
        if name in self.help:  # "[unset]" in --help: set empty in a ConfigMap
            return "" if self.help[name] == "unset" else self.help[name]
        if name in DRAIN_DEFAULTS:
            return DRAIN_DEFAULTS[name]
        return self.readme[name]

    # -- every setting -------------------------------------------------------------

    def test_every_setting_is_set_in_the_pod(self):
        cm, env = self.configmap(), self.env()
        for name in sorted(self.known()):
            with self.subTest(setting=name):
                if name in SECRETS:
                    self.assertNotIn(name, cm, "a secret in the ConfigMap")
                    ref = env[name]["valueFrom"]["secretKeyRef"]
                    self.assertTrue(ref["name"] and ref["key"])
                elif name in PER_POD:
                    self.assertNotIn(name, cm, "one value for every pod")
                    self.assertIn(name, env)
                else:
                    self.assertIn(name, cm)
                    self.assertNotIn(name, env, "set twice")
        for name in cm:
            self.assertIn(name, self.known(), "ConfigMap key %s is no setting" % name)
        self.assertEqual(self.container()["envFrom"], [{"configMapRef": {"name": "converger"}}])

    def test_help_and_readme_agree(self):
        # Both tables name the same settings (the drain's may be missing from
        # both until it is merged).
        self.assertEqual(set(self.help) - set(DRAIN_DEFAULTS),
                         set(self.readme) - set(DRAIN_DEFAULTS))
        for name, d in DRAIN_DEFAULTS.items():
            if name in self.help:
                self.assertEqual(self.help[name], d, name)

    def test_configmap_values_are_defaults_unless_explained(self):
        cm = self.configmap()
        for name, value in cm.items():
            if name in OVERRIDES:
                continue
            with self.subTest(setting=name):
                self.assertEqual(value, self.default_of(name))
        self.assertEqual(cm["CONVERGER_TEST_STORE_DELAY_MS"], "0")
        self.assertRegex(cm["CONVERGER_DATABASE_URL"], r"^postgres(ql)?://")
        self.assertNotRegex(cm["CONVERGER_DATABASE_URL"], r"://[^/@]*:[^/@]*@",
                            "a password in the ConfigMap")
        self.assertIn("secretKeyRef", self.env()["PGPASSWORD"]["valueFrom"])

    def test_per_pod_values_come_from_the_downward_api(self):
        env = self.env()
        self.assertEqual(env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP")
        self.assertEqual(env["CONVERGER_NODE_ID"]["valueFrom"]["fieldRef"]["fieldPath"],
                         "metadata.name")
        names = [e["name"] for e in self.container()["env"]]
        # $(POD_IP) is expanded only from variables defined before it.
        self.assertLess(names.index("POD_IP"), names.index("CONVERGER_PUBLIC_URL"))
        port = self.configmap()["CONVERGER_LISTEN"].rsplit(":", 1)[1]
        self.assertEqual(env["CONVERGER_PUBLIC_URL"]["value"],
                         "ws://$(POD_IP):%s/v1/ws" % port)

    # -- probes, ports, selectors --------------------------------------------------

    def test_probes_and_ports(self):
        c = self.container()
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        listen_port = int(self.configmap()["CONVERGER_LISTEN"].rsplit(":", 1)[1])
        admin_port = int(self.configmap()["CONVERGER_ADMIN_LISTEN"].rsplit(":", 1)[1])
        self.assertTrue(self.configmap()["CONVERGER_LISTEN"].startswith("0.0.0.0:"))
        self.assertTrue(self.configmap()["CONVERGER_ADMIN_LISTEN"].startswith("0.0.0.0:"))
        # the probes on the admin listener, which serves /livez (and /readyz)
        for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/livez")):
            get = c[probe]["httpGet"]
            self.assertEqual(get["path"], path)
            self.assertEqual(ports.get(get["port"], get["port"]), admin_port)
        annotations = self.docs["Deployment"]["spec"]["template"]["metadata"]["annotations"]
        self.assertEqual(int(annotations["prometheus.io/port"]), admin_port)
        # the Service: the client port only
        svc = self.docs["Service"]["spec"]
        self.assertEqual([ports.get(p["targetPort"], p["targetPort"]) for p in svc["ports"]], [listen_port])
        labels = self.docs["Deployment"]["spec"]["template"]["metadata"]["labels"]
        for sel in (svc["selector"],
                    self.docs["Deployment"]["spec"]["selector"]["matchLabels"],
                    self.docs["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"]):
            self.assertTrue(sel.items() <= labels.items(), sel)
        self.assertEqual(self.docs["PodDisruptionBudget"]["spec"]["maxUnavailable"], 1)

    # -- the image and what the pod may do -------------------------------------------

    def test_the_pod_runs_the_image_unprivileged(self):
        c, pod = self.container(), self.pod()
        # the image scripts/image tags first: localhost/converger:VERSION
        version = re.search(r"project\(converger VERSION (\S+)", read(os.path.join(ROOT, "CMakeLists.txt"))).group(1)
        self.assertIn('tags=("localhost/converger:$version"', read(os.path.join(ROOT, "scripts", "image")))
        self.assertEqual(c["image"], "localhost/converger:%s" % version)
        # its entry point is `converger serve`: no args, or "serve" twice
        self.assertNotIn("args", c)
        self.assertIn('ENTRYPOINT ["/usr/local/bin/converger", "serve"]', read(CONTAINERFILE))
        uid = int(re.search(r"useradd .*--uid (\d+)", read(CONTAINERFILE)).group(1))
        sc = pod["securityContext"]
        self.assertEqual((sc["runAsNonRoot"], sc["runAsUser"], sc["fsGroup"]), (True, uid, uid))
        csc = c["securityContext"]
        self.assertEqual(csc["capabilities"]["drop"], ["ALL"])
        self.assertNotIn("add", csc["capabilities"])
        self.assertIs(csc["allowPrivilegeEscalation"], False)
        self.assertIs(csc["readOnlyRootFilesystem"], True)
        # the only place it writes is a volume
        self.assertEqual([m["mountPath"] for m in c["volumeMounts"]], [c["workingDir"]])
        res = c["resources"]
        self.assertIn("memory", res["requests"])
        self.assertIn("memory", res["limits"])
        self.assertNotIn("cpu", res["limits"], "a CPU limit throttles the loop thread")

    # -- the drain's arithmetic ----------------------------------------------------

    def test_capacity_is_the_planned_connections(self):
        # converger roll's headroom budget reads what a pod is sized for
        self.assertEqual(int(self.configmap()["CONVERGER_CAPACITY_CONNECTIONS"]),
                         self.planned_connections())

    def planned_connections(self):
        a = self.docs["Deployment"]["metadata"]["annotations"]
        return int(a["converger/planned-connections-per-node"])

    def prestop_s(self):
        cmd = self.container()["lifecycle"]["preStop"]["exec"]["command"]
        self.assertEqual(cmd[0], "sleep")
        return float(cmd[1])

    def test_kubernetes_grace_period_covers_the_drain(self):
        cm, n = self.configmap(), self.planned_connections()
        paced_end, shutdown = drain_seconds(cm, n)
        # the paced closes end before the node's own shutdown deadline
        self.assertGreaterEqual(shutdown, paced_end)
        prestop = self.prestop_s()
        self.assertGreater(prestop, 0)
        need = prestop + max(paced_end, shutdown) + stop_grace_s()
        grace = self.pod()["terminationGracePeriodSeconds"]
        self.assertGreaterEqual(grace, need, "grace %ss < %ss" % (grace, need))
        self.assertGreater(grace, 30, "Kubernetes' default would cut the drain short")
        # rollouts: the next pod is deleted once the previous drain is over
        self.assertGreaterEqual(self.docs["Deployment"]["spec"]["minReadySeconds"], paced_end)
        rolling = self.docs["Deployment"]["spec"]["strategy"]["rollingUpdate"]
        self.assertEqual((rolling["maxSurge"], rolling["maxUnavailable"]), (1, 0))

    def test_systemd_timeout_covers_the_drain(self):
        u = unit_values()
        self.assertEqual(u["KillSignal"], "SIGTERM")
        self.assertEqual(u["KillMode"], "mixed")
        self.assertEqual(u["Restart"], "on-failure")
        self.assertEqual(u["EnvironmentFile"], "/etc/converger/converger.env")
        self.assertEqual(u["ExecStart"].split()[1:], ["serve"])
        active, _ = env_file_values()
        for name in DRAIN_DEFAULTS:
            self.assertEqual(active[name], self.configmap()[name], name)
        paced_end, shutdown = drain_seconds(active, self.planned_connections())
        self.assertGreaterEqual(shutdown, paced_end)
        need = max(paced_end, shutdown) + stop_grace_s()
        timeout = int(u["TimeoutStopSec"])  # plain seconds
        self.assertGreaterEqual(timeout, need, "TimeoutStopSec %s < %ss" % (timeout, need))

    def test_env_file_names_every_setting(self):
        active, commented = env_file_values()
        for name in sorted(self.known()):
            with self.subTest(setting=name):
                self.assertTrue(name in active or name in commented)
        for name in active:
            self.assertIn(name, self.known() | {"PGPASSWORD"}, name)
        for name in SECRETS:
            self.assertNotIn(name, active, "no sample secret")

    def test_operations_md_lists_every_setting_with_its_default(self):
        text = read(OPERATIONS)
        for name in sorted(self.known()):
            with self.subTest(setting=name):
                row = re.search(r"^\| `%s` \|.*$" % name, text, re.M)
                self.assertIsNotNone(row, name)
                # as the README says it; a default in words (generated...) is
                # not compared
                d = self.readme[name] if name in self.readme else self.default_of(name)
                if d is not None:
                    self.assertIn("`%s`" % d, row.group(0))

    # -- the StatefulSet example ----------------------------------------------------

    def statefulset(self):
        with open(STATEFULSET) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        return {d["kind"]: d for d in docs}, docs

    def test_statefulset_example_gives_each_pod_its_url(self):
        kinds, docs = self.statefulset()
        self.assertEqual(sorted(d["kind"] for d in docs), ["Service", "StatefulSet"])
        svc, sts = kinds["Service"], kinds["StatefulSet"]
        self.assertEqual(svc["spec"]["clusterIP"], "None")  # headless: a DNS name per pod
        self.assertEqual(sts["spec"]["serviceName"], svc["metadata"]["name"])
        self.assertNotEqual(svc["metadata"]["name"], self.docs["Service"]["metadata"]["name"])
        tpl = sts["spec"]["template"]
        self.assertTrue(svc["spec"]["selector"].items() <= tpl["metadata"]["labels"].items())
        env = {e["name"]: e for e in tpl["spec"]["containers"][0]["env"]}
        names = [e["name"] for e in tpl["spec"]["containers"][0]["env"]]
        self.assertEqual(env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name")
        self.assertEqual(env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"], "metadata.namespace")
        self.assertLess(max(names.index("POD_NAME"), names.index("POD_NAMESPACE")),
                        names.index("CONVERGER_PUBLIC_URL"))
        port = self.configmap()["CONVERGER_LISTEN"].rsplit(":", 1)[1]
        self.assertEqual(env["CONVERGER_PUBLIC_URL"]["value"],
                         "ws://$(POD_NAME).%s.$(POD_NAMESPACE).svc.cluster.local:%s/v1/ws"
                         % (svc["metadata"]["name"], port))

    def test_statefulset_pod_is_the_deployments(self):
        """Everything but the per-pod URL is the Deployment's, so that the two
        examples do not drift apart (grace period, probes, image, limits)."""
        kinds, _ = self.statefulset()
        sts = kinds["StatefulSet"]
        a, b = dict(self.pod()), dict(sts["spec"]["template"]["spec"])
        ca, cb = dict(a.pop("containers")[0]), dict(b.pop("containers")[0])
        self.assertEqual(a, b)
        strip = {"POD_IP", "POD_NAME", "POD_NAMESPACE", "CONVERGER_PUBLIC_URL"}
        ea = [e for e in ca.pop("env") if e["name"] not in strip]
        eb = [e for e in cb.pop("env") if e["name"] not in strip]
        self.assertEqual(ea, eb)
        self.assertEqual(ca, cb)
        self.assertEqual(sts["spec"]["template"]["metadata"], self.docs["Deployment"]["spec"]["template"]["metadata"])
        self.assertEqual(sts["spec"]["minReadySeconds"], self.docs["Deployment"]["spec"]["minReadySeconds"])
        self.assertEqual(sts["metadata"]["annotations"], self.docs["Deployment"]["metadata"]["annotations"])

    # -- the tools' own checks (scripts/setup installs them) --------------------------------------

    def test_systemd_analyze_verify(self):
        tool = shutil.which("systemd-analyze")
        # scripts/setup installs systemd (systemd-analyze): missing is a failure
        self.assertTrue(tool, "systemd-analyze not installed: run scripts/setup")
        d = tempfile.mkdtemp(prefix="deploy-files-")
        self.addCleanup(shutil.rmtree, d, True)
        # verify wants ExecStart to exist: the binary under test stands in
        unit = read(UNIT).replace("/usr/local/bin/converger", harness.binary())
        path = os.path.join(d, "converger.service")
        with open(path, "w") as f:
            f.write(unit)
        r = subprocess.run([tool, "verify", path], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        # a bad line is only a warning, "converger.service:LINE: ... ignoring"
        self.assertNotIn("converger.service:", r.stderr)

    def test_haproxy_accepts_its_config(self):
        tool = shutil.which("haproxy") or ("/usr/sbin/haproxy"
                                           if os.access("/usr/sbin/haproxy", os.X_OK) else None)
        self.assertTrue(tool, "haproxy not installed: run scripts/setup")
        r = subprocess.run([tool, "-c", "-f", HAPROXY_CFG], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        cfg = read(HAPROXY_CFG)
        # what docs/operations.md says about it during a drain
        self.assertIn("uri /readyz", cfg)
        self.assertNotRegex(cfg, r"(?m)^\s*[^#\s].*shutdown-sessions")


class ConfigMapStartsANode(harness.NodeCase):
    def test_a_node_starts_with_the_configmaps_values(self):
        """Every value of configmap.yaml as the environment, as a pod gets
        it (an empty one is unset), but for what points outside this
        machine: the listeners (loopback ports of the test's), the store (a
        SQLite file of the test's) and the page's folder (the build's)."""
        with open(os.path.join(K8S, "configmap.yaml")) as f:
            cm = yaml.safe_load(f)["data"]
        local = {"CONVERGER_LISTEN", "CONVERGER_ADMIN_LISTEN", "CONVERGER_DATABASE_URL", "CONVERGER_WEB_DIR"}
        self.assertTrue(any(v == "" for v in cm.values()), "the ConfigMap has empty values to check")
        n = self.node_start({k: v for k, v in cm.items() if k not in local})
        st, _, js = n.request("GET", "/admin/status")
        self.assertEqual(st, 200, js)
        self.assertEqual(js["capacity"], int(cm["CONVERGER_CAPACITY_CONNECTIONS"]))
        self.assertTrue(js["ready"])
        self.assertIn('"level":"info"', n.log_text())  # CONVERGER_LOG_FORMAT=json


if __name__ == "__main__":
    harness.main()
