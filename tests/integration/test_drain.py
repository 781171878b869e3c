"""Drain and shed on one node (gate/drain.h). With a ready peer (a heartbeat
row the test writes, as a cluster's other node would): SIGTERM makes
/readyz 503 at once and refuses new upgrades; every connection gets exactly one `drain`
frame whose afterMs values fill the window evenly; clients that ignore it are
closed with 1012 after the window at no more than the configured rate (+10 %),
each with a parsable retryAfterMs; the node exits 0 before its shutdown
deadline. POST /admin/shed moves a random share of a node that stays ready
and leaves the rest untouched; POST /admin/drain, a second SIGTERM (ignored)
and SIGINT during a drain. With no ready peer (a single node, or every
peer draining): no drain frame, every connection closed with 1012 and a
retry hint at the paced rate, and the exit as soon as none is left (at
once with none), long before the window ends."""

import asyncio
import http.client
import json
import os
import re
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import NodeCase, WsClient, mint_token  # noqa: E402

try:
    import websockets.exceptions
    CLOSED = websockets.exceptions.ConnectionClosed
except ImportError:  # reported by WsClient.connect
    CLOSED = ConnectionError


class Client:
    """One subscriber. `obey`: on a drain frame, wait afterMs, then close with
    1000 (a client that moves; where to is not this node's business). Else it
    ignores the frame and waits to be closed."""

    def __init__(self, node, conv, obey):
        self.node, self.conv, self.obey = node, conv, obey
        self.drains, self.closed_at, self.code, self.reason, self.moved = [], None, None, None, False

    async def run(self, connected):
        c = await WsClient.connect(self.node, timeout=20)
        await c.hello(mint_token("u", [self.conv]), [{"conv": self.conv, "watermark": None}], timeout=20)
        connected.release()
        try:
            while True:
                m = await c.recv_json(120)
                if m.get("type") == "drain":
                    self.drains.append((time.monotonic(), m))
                    if self.obey:
                        await asyncio.sleep(m["afterMs"] / 1000.0)
                        self.moved = True
                        await c.ws.close(1000, "moved")
                        return
        except CLOSED:
            self.closed_at = time.monotonic()
            self.code, self.reason = c.ws.close_code, c.ws.close_reason


async def connect_all(clients):
    connected = asyncio.Semaphore(0)
    tasks = [asyncio.create_task(cl.run(connected)) for cl in clients]
    for _ in clients:
        await asyncio.wait_for(connected.acquire(), 60)
    return tasks


def upgrade_status(node):
    """Status and headers of a plain WebSocket upgrade request."""
    conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=5)
    try:
        conn.request("GET", "/v1/ws", headers={
            "Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Protocol": "converger.v1"})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def max_in_window(times, width):
    """The most events inside any window of `width` seconds."""
    times = sorted(times)
    best, j = 0, 0
    for i in range(len(times)):
        while times[i] - times[j] > width:
            j += 1
        best = max(best, i - j + 1)
    return best


def metric(node, name):
    st, _, text = node.get_text("/metrics")
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _drain_grace_ms():
    """DRAIN_GRACE_MS of src/gate/drain.h: deadlineMs = window + grace, and
    the 1012s start then."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "src", "gate", "drain.h")) as f:
        return int(re.search(r"#define\s+DRAIN_GRACE_MS\s+(\d+)", f.read()).group(1))


GRACE_MS = _drain_grace_ms()


class Drain(NodeCase):
    WINDOW_MS, RATE, SHUTDOWN_MS = 2000, 50, 9000

    def sigterm_and_wait(self, n, clients, peer=True):
        """Connect `clients`, SIGTERM the node, wait for every client to end
        and the node to exit: (exit code, time of the SIGTERM, seconds to the exit).
        `peer`: with a ready peer for the drain frames' reconnectTo."""
        async def go():
            tasks = await connect_all(clients)
            t0 = time.monotonic()
            if peer:
                n.fake_peer()  # a ready peer: the drain tells the clients to move
            os.kill(n.proc.pid, signal.SIGTERM)
            await asyncio.wait_for(asyncio.gather(*tasks), 20)
            rc = await asyncio.to_thread(n.proc.wait, 20)
            return rc, t0, time.monotonic() - t0
        return self.arun(go(), timeout=40)

    def drain_node(self):
        return self.node_start({"CONVERGER_DRAIN_WINDOW_MS": str(self.WINDOW_MS),
                                "CONVERGER_DRAIN_CLOSE_RATE": str(self.RATE),
                                "CONVERGER_DRAIN_SHUTDOWN_MS": str(self.SHUTDOWN_MS)})

    def test_sigterm_drains_300_clients_100_of_them_ignoring(self):
        n = self.drain_node()
        conv = n.new_conv()
        clients = [Client(n, conv, obey=(i % 3 != 0)) for i in range(300)]
        ignoring = [c for c in clients if not c.obey]
        self.assertEqual(len(ignoring), 100)

        async def go():
            tasks = await connect_all(clients)
            t0 = time.monotonic()
            n.fake_peer()  # a ready peer: the drain tells the clients to move
            os.kill(n.proc.pid, signal.SIGTERM)
            # /readyz answers 503 at once
            first_503 = None  # when the request that saw it was sent
            while first_503 is None and time.monotonic() - t0 < 2:
                sent = time.monotonic() - t0
                st, _, js = await asyncio.to_thread(n.get, "/readyz", None, 1.0)
                if st == 503:
                    first_503 = sent
                    self.assertEqual(js, {"status": "draining"})
            self.assertIsNotNone(first_503)
            self.assertLess(first_503, 0.1, "readyz still 200 %.3fs after SIGTERM" % first_503)
            # a new upgrade is refused with 503 and a Retry-After
            st, h, body = await asyncio.to_thread(upgrade_status, n)
            self.assertEqual(st, 503, body)
            self.assertGreaterEqual(int(h["retry-after"]), 1)
            # REST still works while draining
            st, _, js = await asyncio.to_thread(n.request, "POST", "/v1/conversations/%s/messages" % conv,
                                                {"sender": "s", "body": "during the drain"})
            self.assertEqual(st, 201, js)
            await asyncio.wait_for(asyncio.gather(*tasks), 30)
            rc = await asyncio.to_thread(n.proc.wait, 30)
            return t0, time.monotonic() - t0, rc

        t0, exited_after, rc = self.arun(go(), timeout=90)
        self.assertEqual(rc, 0)
        self.assertLess(exited_after, self.SHUTDOWN_MS / 1000.0, "exited %.2fs after SIGTERM" % exited_after)

        # exactly one drain frame each, fields as the protocol says
        for c in clients:
            self.assertEqual(len(c.drains), 1, c.drains)
            d = c.drains[0][1]
            self.assertEqual(set(d), {"type", "afterMs", "reconnectTo", "deadlineMs"})
            self.assertEqual(d["reconnectTo"], n.ws_url)  # the ready peer's URL (here: its own)
            self.assertEqual(d["deadlineMs"], self.WINDOW_MS + GRACE_MS)
            self.assertTrue(0 <= d["afterMs"] < self.WINDOW_MS, d)
        # the afterMs values fill the window: no tenth of it holds over 20 %
        slices = [0] * 10
        for c in clients:
            slices[c.drains[0][1]["afterMs"] * 10 // self.WINDOW_MS] += 1
        self.assertLessEqual(max(slices), 60, slices)

        # the ignoring clients: 1012 with a retry hint, after the deadline, paced
        frames_at = min(c.drains[0][0] for c in clients)
        closes = []
        for c in ignoring:
            self.assertEqual(c.code, 1012, (c.code, c.reason))
            hint = json.loads(c.reason)["retryAfterMs"]
            self.assertTrue(1000 <= hint <= 6000, c.reason)
            closes.append(c.closed_at)
        # (client clocks: the first frame may have reached us late, hence the slack)
        self.assertGreaterEqual(min(closes) - frames_at, (self.WINDOW_MS + GRACE_MS) / 1000.0 - 0.25)
        self.assertLessEqual(max_in_window(closes, 1.0), self.RATE * 1.1,
                             "closes in the busiest second, rate %d/s" % self.RATE)
        # 100 closes at 50/s take about two seconds, not one burst
        self.assertGreater(max(closes) - min(closes), 100 / self.RATE * 0.8)
        for c in clients:
            if c.obey:  # closed by itself (1000) at its afterMs, never by the node
                self.assertTrue(c.moved)
                self.assertIsNone(c.code)
        log = n.log_text()
        self.assertIn("SIGTERM: draining", log)
        self.assertIn("drain complete", log)

    def test_no_ready_peer_closes_with_1012_and_exits_when_none_is_left(self):
        n = self.node_start({"CONVERGER_DRAIN_WINDOW_MS": "30000", "CONVERGER_DRAIN_CLOSE_RATE": "100",
                             "CONVERGER_DRAIN_SHUTDOWN_MS": "60000"})
        conv = n.new_conv()
        n.fake_peer(state="draining")  # the only peer drains too
        clients = [Client(n, conv, obey=True) for _ in range(40)]
        rc, _, took = self.sigterm_and_wait(n, clients, peer=False)
        self.assertEqual(rc, 0)
        self.assertLess(took, 5.0, "exited %.2fs after SIGTERM: it waited for the window" % took)
        for c in clients:
            self.assertEqual(c.drains, [], "a drain frame with no ready peer to move to")
            self.assertEqual(c.code, 1012)
            self.assertGreater(json.loads(c.reason)["retryAfterMs"], 0)
        log = n.log_text()
        self.assertIn("no ready peer to move to: closing 40 connection(s) with 1012", log)
        self.assertNotIn("0 ready peer(s)", log)
        # with no connection at all: at once
        n2 = self.node_start({"CONVERGER_DRAIN_WINDOW_MS": "30000", "CONVERGER_DRAIN_SHUTDOWN_MS": "60000"})
        t0 = time.monotonic()
        os.kill(n2.proc.pid, signal.SIGTERM)
        self.assertEqual(n2.proc.wait(10), 0)
        self.assertLess(time.monotonic() - t0, 1.0)

    def test_shed_a_quarter_of_400_node_stays_ready(self):
        n = self.drain_node()
        conv = n.new_conv()
        clients = [Client(n, conv, obey=True) for _ in range(400)]

        async def go():
            tasks = await connect_all(clients)
            st, _, js = await asyncio.to_thread(n.request, "POST", "/admin/shed",
                                                {"fraction": 0.25, "windowMs": 1500})
            self.assertEqual(st, 200, js)
            self.assertEqual(js, {"chosen": 100, "connections": 400, "windowMs": 1500})
            st, _, js = await asyncio.to_thread(n.request, "POST", "/admin/shed", {"fraction": 0.5})
            self.assertEqual(st, 409, js)  # one shed at a time
            deadline = time.monotonic() + 1.5 + GRACE_MS / 1000.0
            while time.monotonic() < deadline:  # ready all along
                st, _, _ = await asyncio.to_thread(n.get, "/readyz")
                self.assertEqual(st, 200)
                await asyncio.sleep(0.1)
            # the rest are untouched: open, and still served live
            st, _, js = await asyncio.to_thread(n.request, "POST", "/v1/conversations/%s/messages" % conv,
                                                {"sender": "s", "body": "after the shed"})
            self.assertEqual(st, 201, js)
            await asyncio.sleep(0.5)
            st, _, js = await asyncio.to_thread(n.request, "GET", "/admin/status")
            self.assertEqual((js["state"], js["drain"], js["connections"]), ("ready", "ready", 300))
            for t in tasks:
                if not t.done():
                    t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.arun(go(), timeout=90)
        moved = [c for c in clients if c.moved]
        told = [c for c in clients if c.drains]
        self.assertTrue(80 <= len(moved) <= 120, len(moved))  # 20 % .. 30 %
        self.assertEqual(len(moved), 100)  # exactly the share asked for, round(0.25 x 400)
        self.assertEqual(len(told), len(moved))
        for c in clients:
            self.assertLessEqual(len(c.drains), 1)
            if not c.drains:
                self.assertIsNone(c.code, "an untouched client was closed")
        self.assertEqual(metric(n, "converger_drain_migrated_total"), len(moved))
        self.assertEqual(metric(n, "converger_drain_state"), 0)

    def test_shed_stragglers_are_closed_1012_after_the_window_even_after_a_stall(self):
        """A node frozen for 0.6 s in the middle of its paced closes does not
        make up for the lost time in a burst."""
        n = self.drain_node()
        conv = n.new_conv()
        clients = [Client(n, conv, obey=False) for _ in range(30)]

        async def go():
            tasks = await connect_all(clients)
            t0 = time.monotonic()
            st, _, js = await asyncio.to_thread(n.request, "POST", "/admin/shed",
                                                {"fraction": 1, "windowMs": 500})
            self.assertEqual((st, js["chosen"]), (200, 30), js)
            while not any(c.closed_at for c in clients):
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)
            os.kill(n.proc.pid, signal.SIGSTOP)
            await asyncio.sleep(0.6)
            os.kill(n.proc.pid, signal.SIGCONT)
            await asyncio.wait_for(asyncio.gather(*tasks), 15)
            return t0
        t0 = self.arun(go(), timeout=30)
        for c in clients:
            self.assertEqual(c.code, 1012)
            self.assertGreaterEqual(c.closed_at - t0, (500 + GRACE_MS) / 1000.0 - 0.05)
        closes = [c.closed_at for c in clients]
        # 50/s is 10 per 200 ms; after the stall at most one timer period's worth
        self.assertLessEqual(max_in_window(closes, 0.2), self.RATE * 0.2 + 2, sorted(closes))
        self.assertEqual(metric(n, "converger_drain_closed_total"), 30)
        self.assertEqual(metric(n, "converger_drain_migrated_total"), 0)  # the node closed them all
        self.assertEqual(n.get("/readyz")[0], 200)

    def test_shutdown_deadline_closes_the_rest_1001(self):
        """Paced closes too slow for the shutdown deadline: what is left then
        is closed with 1001 and the node exits 0 at the deadline."""
        n = self.node_start({"CONVERGER_DRAIN_WINDOW_MS": "500", "CONVERGER_DRAIN_CLOSE_RATE": "2",
                             "CONVERGER_DRAIN_SHUTDOWN_MS": "3500"})
        conv = n.new_conv()
        clients = [Client(n, conv, obey=False) for _ in range(10)]

        rc, t0, took = self.sigterm_and_wait(n, clients)
        self.assertEqual(rc, 0)
        self.assertTrue(3.4 <= took <= 3.5 + 10, took)  # the deadline, plus the stop's grace at most
        codes = sorted(c.code for c in clients)
        # 2.5 s (window + grace) to 3.5 s at 2/s: about 3 paced, the rest at the deadline
        self.assertTrue(1 <= codes.count(1012) <= 4, codes)
        self.assertEqual(codes.count(1001), 10 - codes.count(1012), codes)
        self.assertIn("drain deadline", n.log_text())

    def test_drain_migrate_0_no_frames_paced_1012_at_once(self):
        """CONVERGER_DRAIN_MIGRATE=0 (bench roll --drain close): no drain
        frame, and the paced 1012 closes begin at once, not after the window."""
        n = self.node_start({"CONVERGER_DRAIN_WINDOW_MS": "30000", "CONVERGER_DRAIN_CLOSE_RATE": "20",
                             "CONVERGER_DRAIN_SHUTDOWN_MS": "20000", "CONVERGER_DRAIN_MIGRATE": "0"})
        conv = n.new_conv()
        clients = [Client(n, conv, obey=True) for _ in range(20)]

        rc, t0, _ = self.sigterm_and_wait(n, clients)
        self.assertEqual(rc, 0)
        self.assertEqual([c.drains for c in clients], [[]] * 20)  # no drain frame
        self.assertEqual(sorted(c.code for c in clients), [1012] * 20)
        closes = sorted(c.closed_at - t0 for c in clients)
        # 20 at 20/s: about 1 s in all, long before the 30 s window
        self.assertLess(closes[-1], 5.0, closes)
        self.assertLessEqual(max_in_window([c.closed_at for c in clients], 0.2), 20 * 0.2 + 2, closes)
        for c in clients:
            self.assertIn("retryAfterMs", json.loads(c.reason))
        self.assertIn("CONVERGER_DRAIN_MIGRATE=0", n.log_text())

    def test_admin_drain_second_sigterm_ignored_sigint_stops(self):
        n = self.drain_node()
        conv = n.new_conv()
        ws = harness.RawWs(n.port)
        ws.hello(mint_token("u", [conv]), [{"conv": conv, "watermark": None}])
        self.assertEqual(ws.recv_json()["type"], "welcome")
        for key in (None, "wrong"):
            st, _, js = n.request("POST", "/admin/drain", key=key)
            self.assertEqual(st, 401, js)
        n.fake_peer()  # a ready peer: the drain tells the clients to move
        st, _, js = n.request("POST", "/admin/drain")
        self.assertEqual(st, 202, js)
        self.assertEqual(js["state"], "draining")
        m, _ = ws.recv_until(lambda f: f.get("type") == "drain")
        self.assertEqual(m["deadlineMs"], self.WINDOW_MS + GRACE_MS)
        st, _, js = n.request("POST", "/admin/drain")
        self.assertEqual(st, 409, js)
        self.assertEqual(n.request("POST", "/admin/shed", {"fraction": 0.5})[0], 409)
        st, _, js = n.request("GET", "/admin/status")
        self.assertEqual((js["state"], js["drain"]), ("draining", "draining"))
        deadline = time.monotonic() + 2  # the drain beats at once; the write takes a moment
        while next(x for x in n.request("GET", "/admin/cluster")[2]["nodes"]
                   if x["id"] == n.node_id)["state"] != "draining":
            self.assertLess(time.monotonic(), deadline, "membership still says ready")
            time.sleep(0.05)
        os.kill(n.proc.pid, signal.SIGTERM)
        time.sleep(0.3)
        self.assertTrue(n.running())
        self.assertIn("SIGTERM again: already draining; ignored", n.log_text())
        os.kill(n.proc.pid, signal.SIGINT)  # stops now: 1001, exit 0
        code, _, _ = ws.expect_close(5)
        self.assertEqual(code, 1001)
        self.assertEqual(n.proc.wait(10), 0)

    def test_second_sigint_exits_at_once(self):
        """SIGINT stops the node, which then waits for a store job in flight
        (held 3 s here); a second SIGINT exits at once with 130."""
        n = self.node_start({"CONVERGER_TEST_STORE_DELAY_MS": "3000",
                             "CONVERGER_DRAIN_SHUTDOWN_MS": str(self.SHUTDOWN_MS)})
        slow = threading.Thread(target=lambda: n.request("POST", "/v1/channels", {"name": "slow"},
                                                         timeout=10), daemon=True)
        slow.start()
        time.sleep(0.3)  # the job is in the pool
        os.kill(n.proc.pid, signal.SIGINT)
        time.sleep(0.3)
        self.assertTrue(n.running(), "the first SIGINT should wait for the job")
        t0 = time.monotonic()
        os.kill(n.proc.pid, signal.SIGINT)
        self.assertEqual(n.proc.wait(5), 130)
        self.assertLess(time.monotonic() - t0, 1.0)
        self.assertIn("second SIGINT: exiting at once", n.log_text())
        slow.join(10)

    def test_connection_welcomed_during_the_drain_is_told_after_welcome(self):
        """Upgraded before the drain, hello after it: the drain frame comes
        after the welcome (a client acts on it only once it is welcomed),
        with what is left of the window."""
        n = self.drain_node()
        conv = n.new_conv()
        ws = harness.RawWs(n.port)  # upgraded, no hello yet
        n.fake_peer()  # a ready peer: the drain tells the clients to move
        st, _, js = n.request("POST", "/admin/drain")
        self.assertEqual(st, 202, js)
        time.sleep(0.3)
        ws.hello(mint_token("u", [conv]), [{"conv": conv, "watermark": None}])
        m, seen = ws.recv_until(lambda f: f.get("type") == "drain")
        self.assertEqual([f["type"] for f in seen][0], "welcome")
        self.assertNotIn("drain", [f["type"] for f in seen[:-1]])
        self.assertLess(m["afterMs"], self.WINDOW_MS - 200)
        self.assertLessEqual(m["deadlineMs"], self.WINDOW_MS + GRACE_MS - 200)
        self.assertGreaterEqual(m["deadlineMs"], GRACE_MS)
        ws.close()

    def test_drain_takes_over_a_running_shed(self):
        """A shed with a long window, then a drain: the shed's connections are
        told again with the drain's window (the SDK keeps the earlier move)."""
        n = self.drain_node()
        conv = n.new_conv()
        clients = []
        for _ in range(2):
            ws = harness.RawWs(n.port)
            ws.hello(mint_token("u", [conv]), [{"conv": conv, "watermark": None}])
            ws.recv_until(lambda f: f.get("type") == "synced")
            clients.append(ws)
        st, _, js = n.request("POST", "/admin/shed", {"fraction": 1, "windowMs": 600000})
        self.assertEqual((st, js["chosen"]), (200, 2), js)
        for ws in clients:
            m, _ = ws.recv_until(lambda f: f.get("type") == "drain")
            self.assertEqual(m["deadlineMs"], 600000 + GRACE_MS)
        n.fake_peer()  # a ready peer: the drain tells the clients to move
        st, _, js = n.request("POST", "/admin/drain")
        self.assertEqual(st, 202, js)
        for ws in clients:
            m, _ = ws.recv_until(lambda f: f.get("type") == "drain")
            self.assertEqual(m["deadlineMs"], self.WINDOW_MS + GRACE_MS)
            self.assertLess(m["afterMs"], self.WINDOW_MS)
        self.assertIn("folded into the drain", n.log_text())
        os.kill(n.proc.pid, signal.SIGINT)
        for ws in clients:
            self.assertEqual(ws.expect_close(5)[0], 1001)
        self.assertEqual(n.proc.wait(10), 0)

    def test_bad_shed_requests(self):
        n = self.drain_node()
        for body in ({}, {"fraction": 0}, {"fraction": 1.5}, {"fraction": "x"},
                     {"fraction": 0.5, "windowMs": -1}, {"fraction": 0.5, "windowMs": 1.5}):
            st, _, js = n.request("POST", "/admin/shed", body)
            self.assertEqual(st, 400, (body, js))
            self.assertErrorBody(js, "bad_request")
        self.assertEqual(n.request("GET", "/admin/shed")[0], 405)
        self.assertEqual(n.request("POST", "/admin/shed", {"fraction": 0.5}, key=None)[0], 401)


if __name__ == "__main__":
    harness.main()
