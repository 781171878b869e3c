"""CONVERGER_ADMIN_LISTEN (127.0.0.1:9090 by default): a second, private
listener for the operator's routes. /metrics, /admin/* and /livez are served there and not
on the client port (404 with a JSON body that says where); /readyz is on
both (load balancers probe the port they send to); the client port keeps
the protocol, REST and the demo page, which the admin port does not serve.
Set empty, everything is on the client port. The node's membership row
says where its admin listener is (adminUrl in /admin/cluster)."""

import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import NodeCase, mint_token, open_client  # noqa: E402


class AdminListen(NodeCase):
    def test_routes_split_between_the_two_ports(self):
        admin = harness.free_port()
        n = self.node_start({"CONVERGER_ADMIN_LISTEN": "127.0.0.1:%d" % admin})
        # the client port: no operator's routes, but /readyz
        for path in ("/metrics", "/admin/status", "/admin/cluster", "/livez"):
            with self.subTest(port="client", path=path):
                st, h, js = n.request("GET", path, port=n.port)
                self.assertEqual(st, 404, js)
                self.assertErrorBody(js, "not_found")
                self.assertIn("CONVERGER_ADMIN_LISTEN", js["error"]["message"])
        self.assertEqual(n.request("POST", "/admin/drain", port=n.port)[0], 404)
        # not through the client port by another spelling either
        for path in ("//admin/status", "///metrics", "//livez", "/admin", "//admin/users/u/disconnect"):
            with self.subTest(port="client", path=path):
                self.assertEqual(n.request("POST" if "users" in path else "GET", path, port=n.port)[0], 404)
        self.assertEqual(n.request("GET", "/readyz", port=n.port)[0], 200)
        conv = n.new_conv()  # REST on the client port
        st, _, body = n.get_text("/", port=n.port)
        self.assertEqual(st, 200)
        self.assertIn("converger", body)

        async def ws():
            c, w = await open_client(n, mint_token("ann", [conv]), [{"conv": conv, "watermark": 0}])
            await c.close()
            return w
        self.assertEqual(self.arun(ws())["type"], "welcome")
        # the admin port: the operator's routes and /readyz, nothing else
        st, _, text = n.get_text("/metrics", port=admin)
        self.assertEqual(st, 200)
        self.assertIn("converger_http_requests_total", text)
        self.assertEqual(n.request("GET", "/livez", port=admin)[0], 200)
        self.assertEqual(n.request("GET", "/readyz", port=admin)[0], 200)
        st, _, js = n.request("GET", "/admin/status", port=admin)
        self.assertEqual(st, 200, js)
        self.assertEqual(js["state"], "ready")
        self.assertEqual(n.request("GET", "/admin/status", port=admin, key=None)[0], 401)  # still the key
        for path in ("/v1/channels", "/", "/v1/ws", "/app.js"):
            with self.subTest(port="admin", path=path):
                st, _, js = n.request("GET", path, port=admin)
                self.assertEqual(st, 404, js)
                self.assertIn("client port", js["error"]["message"])
        # the harness's own routing sends each path to its port
        self.assertEqual(n.request("GET", "/admin/status")[0], 200)
        self.assertIn("/metrics, /admin/*, /livez and /readyz on http://127.0.0.1:%d" % admin, n.log_text())

    def test_empty_puts_everything_on_the_client_port(self):
        n = self.node_start({"CONVERGER_ADMIN_LISTEN": ""})
        for path in ("/metrics", "/livez", "/readyz", "/admin/status"):
            self.assertEqual(n.request("GET", path, port=n.port)[0], 200, path)
        self.assertNotIn("adminUrl", self._own_row(n))  # the harness asks the client port

    def _own_row(self, node, timeout=5.0):
        """The node's own row in its /admin/cluster. /readyz does not wait
        for the first heartbeat's commit, so on a loaded machine the row may
        come a moment after the node is ready."""
        deadline = time.monotonic() + timeout
        while True:
            st, _, js = node.request("GET", "/admin/cluster")
            self.assertEqual(st, 200, js)
            rows = [x for x in js["nodes"] if x["id"] == node.node_id]
            if rows:
                return rows[0]
            if time.monotonic() > deadline:
                self.fail("no row of %s in /admin/cluster within %.0f s: %r" % (node.node_id, timeout, js))
            time.sleep(0.05)

    def test_the_default_and_the_membership_row(self):
        p = subprocess.run([harness.binary(), "serve", "--help"], capture_output=True, text=True, timeout=10)
        self.assertRegex(p.stdout, r"CONVERGER_ADMIN_LISTEN[^\n]*\n?[^\n]*127\.0\.0\.1:9090")
        n = self.node_start()  # the harness gives it a free admin port
        me = self._own_row(n)
        self.assertEqual(me["adminUrl"], "http://127.0.0.1:%d" % n.admin_port)
        # listening on every address: the host of the public URL
        m = self.node_start({"CONVERGER_ADMIN_LISTEN": "0.0.0.0:%d" % harness.free_port(),
                             "CONVERGER_PUBLIC_URL": "ws://gw-7.example:8080/v1/ws"})
        me = self._own_row(m)
        self.assertEqual(me["adminUrl"], "http://gw-7.example:%d" % m.admin_port)
        # a loopback listener of a node whose clients reach it elsewhere:
        # no other host could use it, so it is not published
        o = self.node_start({"CONVERGER_PUBLIC_URL": "ws://gw-8.example:8080/v1/ws?x=1"})
        me = self._own_row(o)
        self.assertNotIn("adminUrl", me)
        # and converger roll refuses a fleet it cannot reach, saying why (here
        # the row's publicUrl leads to the client port, where /admin/* is not)
        r = harness.Node(start=False)
        self._test_nodes.append(r)
        self.addCleanup(r.ensure_stopped)
        r.overrides["CONVERGER_PUBLIC_URL"] = "ws://0.0.0.0:%d/v1/ws" % r.port
        r.start()
        p = subprocess.run([harness.binary(), "roll", "--url", r.admin_url, "--api-key", harness.API_KEY,
                            "--dry-run"], capture_output=True, text=True, timeout=30)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("its admin listener must be reachable from here", p.stderr)

    def test_port_0_and_bad_values(self):
        n = self.node_start({"CONVERGER_ADMIN_LISTEN": "127.0.0.1:0"})
        m = re.search(r"/livez and /readyz on http://127\.0\.0\.1:(\d+)", n.log_text())
        self.assertIsNotNone(m, n.log_text())
        self.assertEqual(n.request("GET", "/livez", port=int(m.group(1)))[0], 200)
        for bad in ("nope", "127.0.0.1:99999", ":80"):
            with self.subTest(value=bad):
                p = subprocess.run([harness.binary(), "serve", "--admin-listen", bad],
                                   capture_output=True, text=True, timeout=10)
                self.assertEqual(p.returncode, 2)
                self.assertIn("--admin-listen", p.stderr)
        taken = harness.free_port()
        other = self.node_start({"CONVERGER_ADMIN_LISTEN": "127.0.0.1:%d" % taken})
        p = subprocess.run([harness.binary(), "serve"], capture_output=True, text=True, timeout=15,
                           env=dict(other.environment(), CONVERGER_LISTEN="127.0.0.1:%d" % harness.free_port(),
                                    CONVERGER_DATABASE_URL="sqlite:%s/other.db" % other.tmpdir))
        self.assertNotEqual(p.returncode, 0)  # the admin port is taken: the node does not start
        self.assertIn("admin listen on 127.0.0.1:%d" % taken, p.stderr)


if __name__ == "__main__":
    harness.main()
