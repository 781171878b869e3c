"""A node started while its PostgreSQL is down does not exit: it listens,
answers /livez 200 and /readyz 503 with a JSON body saying why, refuses
everything that needs the store with a retryable 503, retries the store
with jittered backoff (each attempt logged once), and once PostgreSQL is
started (scripts/pg-tmp on the port the URL names) becomes ready within the
backoff's cap, and a client can hello, subscribe and receive what is sent.
Only a configuration error exits: a URL whose port or syntax libpq cannot
take, an SQLite path that cannot be opened."""

import asyncio
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import NodeCase, PgCluster, Node, free_port, mint_token, open_client, recv_seqs  # noqa: E402

RETRY_CAP_S = 5.0  # STORE_RETRY_CAP_MS (lifecycle.h)
SLACK_S = 3.0      # an attempt's own time, PostgreSQL's first connections, a shared machine


class PgStartOutage(NodeCase):
    def poll(self, what, cond, timeout):
        """Poll `cond` until it returns a true value (returned) or fail."""
        deadline = time.monotonic() + timeout
        while True:
            v = cond()
            if v:
                return v
            if time.monotonic() > deadline:
                self.fail("%s: not within %.1f s" % (what, timeout))
            time.sleep(0.05)

    def status(self, node, path):
        try:
            st, _, js = node.get(path, timeout=2)
            return st, js
        except OSError as e:
            return 0, repr(e)

    def test_node_waits_for_its_database_then_becomes_ready(self):
        port = free_port()
        url = "postgres://postgres@127.0.0.1:%d/converger" % port
        node = self.node_start({"CONVERGER_DATABASE_URL": url}, start=False)
        node.start(wait=False)
        t_start = time.monotonic()
        self.poll("/livez 200", lambda: self.status(node, "/livez")[0] == 200, 10)
        self.assertTrue(node.running())
        st, js = self.status(node, "/readyz")
        self.assertEqual(st, 503, js)
        self.assertEqual(js["status"], "starting", js)
        self.assertEqual(js["reason"], "store_unavailable", js)
        self.assertIn("cannot open the store", js["message"])
        self.assertGreaterEqual(js["attempts"], 1)
        # what needs the store: a retryable 503, a WebSocket upgrade too
        st, h, js = node.request("POST", "/v1/channels", {"name": "x"})
        self.assertEqual(st, 503, js)
        self.assertErrorBody(js, "unavailable")
        self.assertIn("not open yet", js["error"]["message"])
        self.assertGreater(js["error"]["retryAfterMs"], 0)
        self.assertIn("retry-after", h)
        ws_st, _, _ = node.request("GET", "/v1/ws", headers={
            "Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Protocol": harness.SUBPROTOCOL})
        self.assertEqual(ws_st, 503)
        # /admin/status says starting, and the node keeps retrying
        st, _, js = node.request("GET", "/admin/status")
        self.assertEqual((st, js["state"], js["ready"]), (200, "starting", False), js)
        self.poll("a third attempt", lambda: self.status(node, "/readyz")[1].get("attempts", 0) >= 3, 10)

        pg = PgCluster(port=port, start=False)
        self.addCleanup(pg.stop)
        pg.start()
        t_up = time.monotonic()
        self.poll("/readyz 200 after PostgreSQL started",
                  lambda: self.status(node, "/readyz")[0] == 200, RETRY_CAP_S + SLACK_S)
        waited = time.monotonic() - t_up

        conv = node.new_conv()

        async def go():
            cl, _ = await open_client(node, mint_token("u", [conv]), [{"conv": conv, "watermark": None}])
            node.send(conv, {"n": 1})
            self.assertEqual(await recv_seqs(cl, conv, 1), [(1, {"n": 1})])
            await cl.close()
        self.arun(go())

        # each failed attempt logged once, numbered, spaced by the backoff
        log = node.log_text()
        attempts = [int(n) for n in re.findall(r"store: attempt (\d+) to open \S+ failed", log)]
        self.assertGreaterEqual(len(attempts), 3)
        self.assertEqual(attempts, list(range(1, len(attempts) + 1)))
        delays = [int(d) for d in re.findall(r"not ready, next attempt in (\d+) ms", log)]
        self.assertEqual(len(delays), len(attempts))
        self.assertTrue(all(100 <= d <= RETRY_CAP_S * 1000 for d in delays), delays)
        # libpq's reason is logged once for the outage, not per attempt
        self.assertEqual(log.count("store: cannot connect to"), 1, log)
        self.assertIn("store: open after %d attempt(s)" % (len(attempts) + 1), log)
        sys.stderr.write("node ready %.2f s after PostgreSQL started (%d failed attempts over %.1f s)\n"
                         % (waited, len(attempts), t_up - t_start))
        # and it exits cleanly: every handle of the wait closed
        self.assertEqual(node.stop(), 0)
        self.assertNotIn("loop closed with open handles", node.log_text())

    def test_sigterm_while_waiting_for_the_store_stops_at_once(self):
        url = "postgres://postgres@127.0.0.1:%d/converger" % free_port()
        node = self.node_start({"CONVERGER_DATABASE_URL": url, "CONVERGER_DRAIN_SHUTDOWN_MS": "30000"},
                               start=False)
        node.start(wait=False)
        self.poll("a second attempt", lambda: self.status(node, "/readyz")[1].get("attempts", 0) >= 2
                  if isinstance(self.status(node, "/readyz")[1], dict) else False, 10)
        t0 = time.monotonic()
        self.assertEqual(node.stop(), 0)
        self.assertLess(time.monotonic() - t0, 5)  # no 30 s drain: nobody to drain
        log = node.log_text()
        self.assertIn("the store not open yet: nothing to drain", log)
        self.assertNotIn("loop closed with open handles", log)

    def test_a_store_configuration_error_exits(self):
        d = tempfile.mkdtemp(prefix="cvg-sqlite-dir-")
        self.addCleanup(os.rmdir, d)
        for url, says in (("postgres://postgres@127.0.0.1:notaport/converger", "port: want a number"),
                          ("postgres://postgres@127.0.0.1:70000/converger", "port: want a number"),
                          ("postgres://[::1/converger", "IPv6 host address"),
                          ("postgres://postgres@127.0.0.1/converger?sslmode=bogus", "sslmode: want"),
                          ("sqlite:%s" % d, "cannot start the store")):
            with self.subTest(url=url):
                n = Node({"CONVERGER_DATABASE_URL": url}, start=False)
                self.addCleanup(n.remove_dir)
                self.addCleanup(n.ensure_stopped)
                n.start(wait=False)
                rc = n.proc.wait(10)
                self.assertEqual(rc, 1, n.log_tail())
                self.assertIn(says, n.log_text())
                self.assertIn("cannot start the store", n.log_text())


if __name__ == "__main__":
    harness.main()
