"""A store that cannot take writes: REST answers 503 with Retry-After and a
jittered retryAfterMs, a socket send gets `error unavailable` then close
1013 with the hint in the reason, and everything works again once the store
is free. The write lock is held by another SQLite connection on the node's
database file (the node waits its 5 s busy timeout first)."""

import json
import os
import sqlite3
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import NodeCase, RawWs, mint_token  # noqa: E402


class StoreBusy(NodeCase):
    def test_writes_refused_with_retry_hints_while_locked(self):
        n = self.node_start({"CONVERGER_SQLITE_SYNC": "normal"})
        conv = n.new_conv()
        ws = RawWs(n.port, timeout=15)
        self.addCleanup(ws.close)
        ws.hello(mint_token("w", [conv]), [{"conv": conv}])
        self.assertEqual(ws.recv_json()["type"], "welcome")
        self.assertEqual(ws.recv_json()["type"], "synced")

        lock = sqlite3.connect(os.path.join(n.tmpdir, "converger.db"), isolation_level=None, timeout=5)
        self.addCleanup(lock.close)
        lock.execute("BEGIN EXCLUSIVE")
        try:
            rest = {}

            def rest_send():
                rest["answer"] = n.request("POST", "/v1/conversations/%s/messages" % conv,
                                           {"sender": "a", "body": "locked"}, timeout=15)
            t = threading.Thread(target=rest_send)
            t.start()
            ws.send_json({"type": "send", "conv": conv, "id": "while-locked", "body": 1})
            code, reason, seen = ws.expect_close(timeout=12)
            t.join(15)
        finally:
            lock.execute("ROLLBACK")

        st, headers, js = rest["answer"]
        self.assertEqual(st, 503, js)
        self.assertEqual(js["error"]["code"], "unavailable")
        hint = js["error"]["retryAfterMs"]
        self.assertTrue(1000 <= hint <= 6000, hint)
        self.assertEqual(int(headers["retry-after"]), (hint + 999) // 1000)

        errors = [m for m in seen if isinstance(m, dict) and m.get("type") == "error"]
        self.assertEqual(len(errors), 1, seen)
        self.assertEqual(errors[0]["code"], "unavailable")
        self.assertEqual(errors[0]["details"]["id"], "while-locked")
        self.assertEqual(code, 1013)
        self.assertEqual(json.loads(reason)["retryAfterMs"], errors[0]["retryAfterMs"])

        # Free again: the same id is accepted once, nothing was half-written.
        ws2 = RawWs(n.port)
        self.addCleanup(ws2.close)
        ws2.hello(mint_token("w", [conv]), [{"conv": conv, "watermark": 0}])
        self.assertEqual(ws2.recv_json()["type"], "welcome")
        self.assertEqual(ws2.recv_json()["type"], "synced")
        ws2.send_json({"type": "send", "conv": conv, "id": "while-locked", "body": 1})
        m, _ = ws2.recv_until(lambda m: m.get("type") == "sent")
        self.assertEqual(m["seq"], 1)
        self.assertEqual(n.request("GET", "/v1/conversations/" + conv)[2]["head"], 1)


if __name__ == "__main__":
    harness.main()
