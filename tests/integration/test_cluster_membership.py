"""Cluster membership: two nodes on one SQLite database file beat every
second into the shared `nodes` table; GET /admin/cluster on either lists
both with their public URLs and state; a node killed with SIGKILL drops out
after three missed beats (MEMBERSHIP_MAX_AGE_MS, 3.5 s after its last beat);
the route needs the API key."""

import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import NodeCase  # noqa: E402

RFC3339_MS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")


class ClusterMembership(NodeCase):
    def cluster(self, node):
        st, hdrs, js = node.request("GET", "/admin/cluster")
        self.assertEqual(st, 200, js)
        return js["nodes"]

    def wait_for(self, node, pred, timeout):
        deadline = time.monotonic() + timeout
        while True:
            nodes = self.cluster(node)
            if pred(nodes):
                return nodes
            if time.monotonic() > deadline:
                self.fail("/admin/cluster never matched within %.1fs: %r" % (timeout, nodes))
            time.sleep(0.1)

    def test_two_nodes_listed_then_killed_one_drops_out(self):
        a = self.node_start()  # default public URL: ws://LISTEN/v1/ws
        db = "sqlite:%s/converger.db" % a.tmpdir
        b = self.node_start({"CONVERGER_DATABASE_URL": db,
                             "CONVERGER_PUBLIC_URL": "wss://b.example.test/v1/ws"})
        want = {a.node_id: a.ws_url, b.node_id: "wss://b.example.test/v1/ws"}

        both = lambda ns: sorted(n["id"] for n in ns) == sorted(want)  # noqa: E731
        for node in (a, b):
            nodes = self.wait_for(node, both, 5.0)
            self.assertEqual([n["id"] for n in nodes], sorted(want))  # ordered by id
            for n in nodes:
                self.assertEqual(n["publicUrl"], want[n["id"]])
                self.assertEqual(n["state"], "ready")
                self.assertIsInstance(n["connections"], int)
                self.assertGreaterEqual(n["connections"], 0)
                self.assertEqual(n["waiters"], 0)
                self.assertRegex(n["updatedAt"], RFC3339_MS)
                self.assertEqual(n["capacity"], 0)  # CONVERGER_CAPACITY_CONNECTIONS unset
                if n["id"] == a.node_id:  # its admin listener, on loopback like its clients' URL
                    self.assertEqual(set(n), {"id", "publicUrl", "adminUrl", "state", "connections",
                                              "waiters", "capacity", "updatedAt"})
                    self.assertEqual(n["adminUrl"], "http://127.0.0.1:%d" % a.admin_port)
                else:  # a loopback admin listener, clients elsewhere: not published
                    self.assertEqual(set(n), {"id", "publicUrl", "state", "connections", "waiters",
                                              "capacity", "updatedAt"})

        # the route needs the API key
        for key in (None, "wrong-key"):
            st, _, js = a.request("GET", "/admin/cluster", key=key)
            self.assertEqual(st, 401, js)
            self.assertErrorBody(js, "unauthorized")
        st, _, _ = a.request("POST", "/admin/cluster", body={})
        self.assertEqual(st, 405)

        # SIGKILL: no goodbye; the row ages out after three missed beats
        b.kill9()
        killed = time.monotonic()
        self.assertIn(b.node_id, [n["id"] for n in self.cluster(a)])
        nodes = self.wait_for(a, lambda ns: b.node_id not in [n["id"] for n in ns], 6.0)
        gone_after = time.monotonic() - killed
        self.assertEqual([n["id"] for n in nodes], [a.node_id])
        self.assertEqual(nodes[0]["state"], "ready")
        # last beat <= 1 s before the kill, dropped 3.5 s after it
        self.assertGreaterEqual(gone_after, 2.0)
        self.assertLessEqual(gone_after, 4.5)


if __name__ == "__main__":
    harness.main()
