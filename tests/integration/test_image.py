"""The container image (Containerfile), as scripts/image builds it and a
user runs it with podman. The build comes first, once for the class: on a
fresh machine it makes the Debian 12 base from the Debian archive with
debootstrap, then both stages (minutes); with its layers cached, an
unchanged tree takes seconds. Then:

- the image's configuration: `converger serve` as the entry point, the
  user converger, the two ports exposed, the health check on the admin
  port's /readyz, the settings for a container (every interface, the page's
  folder, the SQLite file in /var/lib/converger), the OCI labels with the
  version of CMakeLists.txt, and the tag converger:dev beside the version's;
- its contents: the binary finds every library it links, the demo page and
  the JavaScript client are in /usr/share/converger/web, and nothing of the
  build stage (compiler, npm) came along; sleep is there for the
  Deployment's preStop hook;
- a node in a container, its ports published on loopback, with a read-only
  root file system and a tmpfs data directory, as deploy/k8s runs it:
  ready on the client port, /metrics on the admin port and not on the client
  port, the demo page, a conversation made over REST, a message sent over
  REST delivered to a WebSocket client as a `msg` frame, the process not
  root, the health check passing (run by `podman healthcheck run`: podman
  schedules the periodic ones with systemd timers, which not every machine
  has); `podman stop` (SIGTERM) drains it (alone,
  it closes its client with 1012) and it exits 0 within seconds;
- without secrets in its environment, the node makes them in its data
  directory, mode 0600, readable by `converger token` in the container.

Every container is removed by its id when its test ends (and at exit, as a
last resort), and is killed by podman after 10 minutes whatever happens.
A machine that cannot run containers fails here with podman's own words."""

import asyncio
import atexit
import http.client
import json
import os
import random
import re
import resource
import shutil
import string
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import NodeCase, mint_token, open_client  # noqa: E402

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IMAGE_SCRIPT = os.path.join(SOURCE_DIR, "scripts", "image")
DATA_DIR = "/var/lib/converger"
WEB_DIR = "/usr/share/converger/web"

_LIVE = set()  # ids of the containers started here and not removed yet
_LIVE_LOCK = threading.Lock()


def project_version():
    with open(os.path.join(SOURCE_DIR, "CMakeLists.txt")) as f:
        return re.search(r"^project\(converger VERSION ([0-9.]+) ", f.read(), re.M).group(1)


def source_commit():
    """The commit scripts/image passes to the build (unknown out of git)."""
    p = subprocess.run(["git", "-C", SOURCE_DIR, "rev-parse", "--short=12", "HEAD"],
                       capture_output=True, text=True, timeout=30)
    return p.stdout.strip() if p.returncode == 0 and p.stdout.strip() else "unknown"


def run(cmd, timeout=60, check=True, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise AssertionError("%s failed (exit status %d):\n%s%s"
                             % (" ".join(cmd), p.returncode, p.stdout, p.stderr))
    return p


def ulimits():
    """Resource limits for `podman run`: podman's defaults (an open-file
    limit of 1048576) are above the hard limits of some machines, where the
    runtime then fails with "error setting rlimit"; these, within this
    process's hard limits, work everywhere."""
    out = []
    for name, which, want in (("nofile", resource.RLIMIT_NOFILE, 16384),
                              ("nproc", resource.RLIMIT_NPROC, 4096)):
        hard = resource.getrlimit(which)[1]
        n = want if hard == resource.RLIM_INFINITY else min(want, hard)
        out += ["--ulimit", "%s=%d:%d" % (name, n, n)]
    return out


class Container(harness.Node):
    """A harness.Node whose process is a container: Node's REST, HTTP and
    WebSocket helpers reach the node through the ports it publishes on
    127.0.0.1 (client port `port`, admin port `admin_port`). Its log is
    `podman logs`, kept when the container is removed."""

    def __init__(self, podman, cid, port, admin_port):
        self.podman, self.cid = podman, cid
        self.port, self._admin_port = port, admin_port
        self.overrides, self.proc, self.tmpdir = {}, None, "(container %s)" % cid[:12]
        self.exit_codes = []
        self.saved_log = None

    @property
    def node_id(self):
        return "container %s" % self.cid[:12]

    def podman_cmd(self, *args, timeout=60, check=True):
        return run(self.podman + list(args), timeout=timeout, check=check)

    def exec(self, *cmd):
        return self.podman_cmd("exec", self.cid, *cmd).stdout

    def inspect(self):
        return json.loads(self.podman_cmd("container", "inspect", self.cid).stdout)[0]

    def logs(self):
        p = self.podman_cmd("logs", self.cid, check=False)
        return p.stdout + p.stderr

    def log_text(self):
        return self.saved_log if self.saved_log is not None else self.logs()

    def remove(self):
        """Removes the container at once (SIGKILL if it still runs), by id."""
        with _LIVE_LOCK:
            if self.cid not in _LIVE:
                return
        self.saved_log = self.logs()
        p = self.podman_cmd("rm", "--force", "--time", "0", self.cid, check=False)
        if p.returncode == 0:
            with _LIVE_LOCK:
                _LIVE.discard(self.cid)
        else:
            raise AssertionError("podman rm %s failed: %s" % (self.cid, p.stderr))

    # NodeCase.run calls these when the test ends
    def ensure_stopped(self):
        self.remove()

    def remove_dir(self):
        pass


_PODMAN = None


@atexit.register
def _remove_leftovers():
    with _LIVE_LOCK:
        ids = list(_LIVE)
    for cid in ids:
        subprocess.run(_PODMAN + ["rm", "--force", "--time", "0", cid], capture_output=True, timeout=60)


class Image(NodeCase):
    @classmethod
    def setUpClass(cls):
        global _PODMAN
        if not shutil.which("podman"):
            raise AssertionError("podman not found: scripts/setup installs it")
        cls.podman = _PODMAN = ["podman"] + run([IMAGE_SCRIPT, "--podman-options"]).stdout.split()
        # The build's progress goes to this test's stderr as it happens.
        started = time.monotonic()
        p = subprocess.run([IMAGE_SCRIPT], stdout=subprocess.PIPE, text=True, timeout=1400)
        if p.returncode != 0:
            raise AssertionError("scripts/image failed (exit status %d): its output is above" % p.returncode)
        cls.image = p.stdout.strip().splitlines()[-1]
        sys.stderr.write("test_image: scripts/image built %s in %.0f s\n" % (cls.image, time.monotonic() - started))
        cls.version = project_version()

    def image_inspect(self, name):
        return json.loads(run(self.podman + ["image", "inspect", name]).stdout)[0]

    def start(self, env=None, extra=()):
        """`podman run -d` of the image with ports published on loopback;
        the test removes the container when it ends."""
        port, admin = harness.free_port(), harness.free_port()
        name = "converger-test-image-%d-%s" % (os.getpid(), "".join(random.choice(string.ascii_lowercase)
                                                                    for _ in range(6)))
        # the id from --cidfile: podman writes it when it creates the
        # container, which then exists even if it fails to start
        cidfile = os.path.join(tempfile.mkdtemp(prefix="converger-image-"), "cid")
        self.addCleanup(shutil.rmtree, os.path.dirname(cidfile), True)
        cmd = self.podman + ["run", "-d", "--name", name, "--cidfile", cidfile, "--timeout", "600",
                             "-p", "127.0.0.1:%d:8080" % port, "-p", "127.0.0.1:%d:9090" % admin] + ulimits()
        for k, v in (env or {}).items():
            cmd += ["-e", "%s=%s" % (k, v)]
        p = subprocess.run(cmd + list(extra) + [self.image], capture_output=True, text=True, timeout=120)
        cid = None
        if os.path.exists(cidfile):
            with open(cidfile) as f:
                cid = f.read().strip()
        if cid:
            with _LIVE_LOCK:
                _LIVE.add(cid)
        c = Container(self.podman, cid, port, admin) if cid else None
        if c is not None:
            self._test_nodes.append(c)  # its log is printed if the test fails
            self.addCleanup(c.remove)
        if p.returncode != 0:
            raise AssertionError("this machine cannot run the container: `%s` failed (exit status %d):\n%s%s"
                                 % (" ".join(cmd + list(extra) + [self.image]), p.returncode, p.stdout, p.stderr))
        self.wait_ready(c)
        return c

    def wait_ready(self, c, timeout=30.0):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            state = c.inspect()["State"]
            if state["Status"] not in ("created", "running"):
                raise AssertionError("the container ended before ready (%s, exit status %s); its log:\n%s"
                                     % (state["Status"], state.get("ExitCode"), c.logs()))
            try:
                st, _, _ = c.request("GET", "/readyz", key=None, timeout=1.0, port=c.port)
                if st == 200:
                    return
                last = "status %d" % st
            except (OSError, http.client.HTTPException) as e:
                last = repr(e)
            time.sleep(0.1)
        raise AssertionError("the node in the container was not ready within %.0f s on 127.0.0.1:%d (last: %s); "
                             "its log:\n%s" % (timeout, c.port, last, c.logs()))

    # ------------------------------------------------------------------
    def test_image_configuration(self):
        info = self.image_inspect(self.image)
        cfg = info["Config"]
        self.assertEqual(cfg["Entrypoint"], ["/usr/local/bin/converger", "serve"])
        self.assertFalse(cfg.get("Cmd"), cfg.get("Cmd"))
        self.assertEqual(cfg["User"], "converger")
        self.assertEqual(cfg["WorkingDir"], DATA_DIR)
        self.assertEqual(sorted(cfg["ExposedPorts"]), ["8080/tcp", "9090/tcp"])
        self.assertEqual(cfg.get("StopSignal"), "SIGTERM")
        env = dict(e.split("=", 1) for e in cfg["Env"])
        self.assertEqual(env["CONVERGER_LISTEN"], "0.0.0.0:8080")
        self.assertEqual(env["CONVERGER_ADMIN_LISTEN"], "0.0.0.0:9090")
        self.assertEqual(env["CONVERGER_WEB_DIR"], WEB_DIR)
        self.assertEqual(env["CONVERGER_DATABASE_URL"], "sqlite:%s/converger.db" % DATA_DIR)
        self.assertNotIn("CONVERGER_API_KEY", env)
        self.assertNotIn("CONVERGER_TOKEN_SECRET", env)
        hc = info.get("Healthcheck") or cfg.get("Healthcheck")
        self.assertTrue(hc, info)
        self.assertEqual(hc["Test"][:3], ["CMD", "bash", "-c"], hc)
        self.assertIn("/readyz", hc["Test"][3])
        self.assertIn("CONVERGER_ADMIN_LISTEN", hc["Test"][3])
        labels = cfg.get("Labels") or {}
        self.assertEqual(labels.get("org.opencontainers.image.title"), "converger", labels)
        self.assertEqual(labels.get("org.opencontainers.image.version"), self.version, labels)
        self.assertEqual(labels.get("org.opencontainers.image.revision"), source_commit(), labels)
        # the two tags, one image
        self.assertEqual(self.image, "localhost/converger:%s" % self.version)
        self.assertEqual(self.image_inspect("localhost/converger:dev")["Id"], info["Id"])
        self.assertEqual(info["Os"], "linux")

    def test_image_contents(self):
        script = "; ".join([
            "echo uid=$(id -u)",
            "echo user=$(id -un)",
            "echo missing=$(ldd /usr/local/bin/converger | grep -c 'not found')",
            "echo version=$(converger version)",
            "echo debian=$(cat /etc/debian_version)",
            "echo page=$(ls %s | tr '\\n' ,)" % WEB_DIR,
            "echo client=$(ls %s/converger-client | tr '\\n' ,)" % WEB_DIR,
            "echo tools=$(for t in cc gcc make cmake npm node tsc curl; do command -v $t; done | tr '\\n' ,)",
            "echo data=$(stat -c '%U %a' " + DATA_DIR + ")",
            "echo sleep=$(command -v sleep)",
        ])
        p = run(self.podman + ["run", "--rm", "--entrypoint", "bash"] + ulimits() + [self.image, "-c", script],
                timeout=120)
        got = dict(l.split("=", 1) for l in p.stdout.splitlines() if "=" in l)
        self.assertEqual(got["uid"], "10001", p.stdout)
        self.assertEqual(got["user"], "converger", p.stdout)
        self.assertEqual(got["missing"], "0", run(self.podman + ["run", "--rm", "--entrypoint", "ldd"] + ulimits()
                                                  + [self.image, "/usr/local/bin/converger"], check=False).stdout)
        self.assertIn(self.version, got["version"])
        self.assertTrue(got["debian"].startswith("12."), got["debian"])
        page = got["page"].split(",")
        for f in ("index.html", "app.js", "style.css", "converger-client"):
            self.assertIn(f, page)
        self.assertIn("index.js", got["client"].split(","))
        self.assertEqual(got["tools"], "", "the build stage's tools are in the image")
        self.assertEqual(got["data"], "converger 700")
        self.assertEqual(got["sleep"], "/usr/bin/sleep")  # deploy/k8s: preStop sleep 5

    def test_node_in_a_container(self):
        # as deploy/k8s/deployment.yaml runs it: no writable root file
        # system, no privilege escalation, an empty data directory
        c = self.start({"CONVERGER_API_KEY": harness.API_KEY, "CONVERGER_TOKEN_SECRET": harness.TOKEN_SECRET},
                       extra=["--read-only", "--security-opt", "no-new-privileges", "--cap-drop", "all",
                              "--tmpfs", "%s:rw,mode=0700,U" % DATA_DIR])
        # the admin port: /readyz, /livez, /metrics with the build's version and commit
        self.assertEqual(c.request("GET", "/readyz", key=None, port=c.admin_port)[0], 200)
        self.assertEqual(c.request("GET", "/livez", key=None, port=c.admin_port)[0], 200)
        st, _, metrics = c.get_text("/metrics", port=c.admin_port)
        self.assertEqual(st, 200)
        self.assertIn('converger_build_info{version="%s",commit="%s"} 1' % (self.version, source_commit()), metrics)
        # the client port: not the operator's routes; the demo page and its client
        st, _, js = c.request("GET", "/metrics", key=None, port=c.port)
        self.assertEqual(st, 404, js)
        st, h, body = c.get_text("/", port=c.port)
        self.assertEqual(st, 200)
        self.assertTrue(h.get("content-type", "").startswith("text/html"), h)
        self.assertIn("<title>converger</title>", body)
        st, h, body = c.get_text("/converger-client/index.js", port=c.port)
        self.assertEqual(st, 200, body[:200])
        self.assertIn("javascript", h.get("content-type", ""), h)

        ch = c.create_channel(id=harness.uid("ch"), name="image test")
        conv = c.create_conv(ch["id"], id=harness.uid("cv"))["id"]

        async def flow():
            ws, welcome = await open_client(c, mint_token("ann", [conv]), [{"conv": conv, "watermark": 0}])
            try:
                await ws.until_synced(conv)
                body = {"text": "hello from the host"}
                r = c.send(conv, body, sender="server")
                m, _ = await ws.until(lambda m: m.get("type") == "msg")
                self.assertMsg(m, conv, seq=1, sender="server", body=body, id=r["id"])
                # not root: the node (pid 1) and what runs beside it
                self.assertEqual(c.exec("id", "-u").strip(), "10001")
                status = c.exec("cat", "/proc/1/status")
                self.assertRegex(status, r"(?m)^Uid:\s+10001\s+10001\s+10001\s+10001$")
                self.assertTrue(c.exec("cat", "/proc/1/cmdline").startswith("/usr/local/bin/converger\0serve"))
                self.assertEqual(c.exec("stat", "-c", "%U", DATA_DIR + "/converger.db").strip(), "converger")
                # the image's health check, run now
                p = c.podman_cmd("healthcheck", "run", c.cid, check=False)
                self.assertEqual(p.returncode, 0, "health check: %s%s" % (p.stdout, p.stderr))
                # SIGTERM: the node drains; with no peer to send its client
                # to, it closes it with 1012 and exits 0
                loop = asyncio.get_running_loop()
                started = time.monotonic()
                stop = loop.run_in_executor(None, lambda: c.podman_cmd("stop", "--time", "30", c.cid, timeout=60))
                code, _, _ = await ws.wait_closed(20)
                self.assertEqual(code, 1012)
                await stop
                return time.monotonic() - started
            finally:
                await ws.close()
        took = self.arun(flow(), timeout=90)
        self.assertLess(took, 10, "podman stop took %.1f s" % took)
        state = c.inspect()["State"]
        self.assertEqual((state["Status"], state["ExitCode"]), ("exited", 0), c.logs())
        log = c.logs()
        self.assertIn("no ready peer to move to", log)
        for marker in harness.Node.SANITIZER_MARKERS:
            self.assertNotIn(marker, log)

    def test_generates_its_secrets_in_its_data_directory(self):
        c = self.start()
        files = c.exec("stat", "-c", "%n %U %a", DATA_DIR + "/api-key", DATA_DIR + "/token-secret").splitlines()
        self.assertEqual(files, ["%s/api-key converger 600" % DATA_DIR, "%s/token-secret converger 600" % DATA_DIR])
        key = c.exec("cat", DATA_DIR + "/api-key").strip()
        # not the harness's key, which this node was not given
        self.assertEqual(c.request("POST", "/v1/channels", {"name": "x"}, key=harness.API_KEY, port=c.port)[0], 401)
        st, _, js = c.request("POST", "/v1/channels", {"id": "general", "name": "General"}, key=key, port=c.port)
        self.assertEqual(st, 201, js)
        # converger token in the container signs with the generated secret
        token = c.exec("converger", "token", "--sub", "bob", "--convs", "room1").strip()
        st, _, js = c.request("POST", "/v1/conversations", {"id": "room1", "channel": "general"}, key=key,
                              port=c.port)
        self.assertEqual(st, 201, js)

        async def hello():
            ws, welcome = await open_client(c, token, [{"conv": "room1", "watermark": 0}])
            await ws.close()
            return welcome
        self.assertEqual(self.arun(hello())["type"], "welcome")


if __name__ == "__main__":
    harness.main()
