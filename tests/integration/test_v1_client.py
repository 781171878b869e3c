"""A version 1 client against a node with default settings (its 1.1 rate
limits on), driven by the `websockets` library (a peer we did not write):
a client shaped as docs/protocol.md version 1 describes it, which sends
only hello (with its subscriptions), send, sync and ping, gets its
welcome, replay and live messages with every version 1 field, has a burst
of 30 sends taken under the default limits, and gets no frame it does not
know (no subscribed, unsubscribed, refreshed, presence, join, leave or
signal), even on a conversation with presence that another client joins
and leaves while a 1.2 client that asked for presence events is told
both."""

import asyncio
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import NodeCase, WsClient, mint_token, uid  # noqa: E402

V1_TYPES = {"welcome", "msg", "synced", "sent", "error", "drain", "pong"}
MSG_FIELDS = {"conv", "seq", "id", "sender", "ts", "body"}


class V1Client:
    """Keeps every frame read, so that the test can check all of them."""

    def __init__(self, c):
        self.c, self.frames = c, []

    async def recv(self, timeout=5.0):
        m = await self.c.recv_json(timeout)
        self.frames.append(m)
        return m

    async def until(self, pred, timeout=5.0):
        """Frames up to and including the first for which pred holds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        got = []
        while True:
            got.append(await self.recv(max(0.1, deadline - loop.time())))
            if pred(got[-1]):
                return got

    async def round_trip(self):
        """A ping answered: every frame the node queued before it is read."""
        await self.c.send_json({"type": "ping"})
        return await self.until(lambda m: m["type"] == "pong")


class V1ClientTest(NodeCase):
    def assert_msg(self, m, conv, seq, body):
        self.assertEqual(m["type"], "msg", m)
        self.assertLessEqual(MSG_FIELDS, set(m), m)
        self.assertEqual((m["conv"], m["seq"], m["body"]), (conv, seq, body), m)
        self.assertRegex(m["ts"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")

    def test_v1_client_is_served_as_before(self):
        n = self.node_start()  # default settings: rate limits on
        ch = n.create_channel(id=uid("ch"), name="v1", presence=True)
        conv = n.create_conv(ch["id"], id=uid("cv"))["id"]
        for i in range(1, 4):
            n.send(conv, {"i": i}, sender="bot")

        async def go():
            a = V1Client(await WsClient.connect(n))
            b, clients = None, []
            try:
                self.assertEqual(a.c.ws.subprotocol, "converger.v1")
                await a.c.send_json({"type": "hello", "token": mint_token("vee", [conv]),
                                     "subs": [{"conv": conv, "watermark": 1}]})
                w = await a.recv()
                self.assertEqual(w["type"], "welcome", w)
                self.assertIsInstance(w["session"], str)
                self.assertIsInstance(w["node"], str)
                self.assertIsInstance(w["heartbeatMs"], int)
                self.assertEqual([(s["conv"], s["head"], s["presence"]) for s in w["subs"]],
                                 [(conv, 3, True)])
                # the replay from the watermark, then synced
                got = await a.until(lambda m: m["type"] == "synced")
                for m, seq in zip(got, (2, 3)):
                    self.assert_msg(m, conv, seq, {"i": seq})
                self.assertEqual(len(got), 3, got)
                self.assertEqual((got[-1]["conv"], got[-1]["head"]), (conv, 3))

                # a 1.2 client that asks for join and leave, to see them happen
                obs = await WsClient.connect(n)
                clients.append(obs)
                await obs.send_json({"type": "hello", "token": mint_token("obs", [conv]), "subs": [
                    {"conv": conv, "watermark": None, "presenceEvents": True}]})
                self.assertEqual((await obs.recv_json())["type"], "welcome")
                await obs.until_synced(conv)

                # another client of the conversation (presence on): a v1
                # client that did not ask for join and leave gets none
                b = V1Client(await WsClient.connect(n))
                await b.c.send_json({"type": "hello", "token": mint_token("wes", [conv]),
                                     "subs": [{"conv": conv, "watermark": None}]})
                self.assertEqual((await b.recv())["type"], "welcome")
                s = await b.recv()
                self.assertEqual((s["type"], s["head"]), ("synced", 3), s)

                # live, from REST and from a send of its own
                n.send(conv, {"i": 4}, sender="bot")
                self.assert_msg((await a.recv()), conv, 4, {"i": 4})
                self.assert_msg((await b.recv()), conv, 4, {"i": 4})
                await a.c.send_json({"type": "send", "conv": conv, "id": "v1-a", "body": {"i": 5}})
                got = await a.until(lambda m: m["type"] == "sent")
                self.assertEqual((got[-1]["conv"], got[-1]["id"], got[-1]["seq"]), (conv, "v1-a", 5))
                if len(got) == 1:  # its own message may come before or after `sent`
                    got.append(await a.recv())
                m = [m for m in got if m["type"] == "msg"]
                self.assertEqual(len(m), 1, got)
                self.assert_msg(m[0], conv, 5, {"i": 5})
                self.assertEqual((m[0]["id"], m[0]["sender"]), ("v1-a", "vee"))
                self.assert_msg((await b.recv()), conv, 5, {"i": 5})
                # the same id again: the same seq, no second message
                await a.c.send_json({"type": "send", "conv": conv, "id": "v1-a", "body": {"i": 5}})
                again = await a.until(lambda m: m["type"] == "sent")
                self.assertEqual([(x["type"], x["seq"]) for x in again], [("sent", 5)])

                # a burst of sends within the default send burst (40): all taken
                for k in range(30):
                    await a.c.send_json({"type": "send", "conv": conv, "id": "v1-b%d" % k,
                                         "body": {"k": k}})
                got = []
                while sum(x["type"] == "sent" for x in got) < 30:
                    got.append(await a.recv())
                while sum(x["type"] == "msg" for x in got) < 30:
                    got.append(await a.recv())
                self.assertEqual(sorted(x["seq"] for x in got if x["type"] == "sent"),
                                 list(range(6, 36)))
                self.assertEqual([x["seq"] for x in got if x["type"] == "msg"], list(range(6, 36)))
                self.assertEqual({x["type"] for x in got}, {"sent", "msg"})
                b_got = await b.until(lambda m: m.get("seq") == 35)
                self.assertEqual([x["seq"] for x in b_got], list(range(6, 36)))

                # sync from an older watermark: the replay again, then synced
                await a.c.send_json({"type": "sync", "conv": conv, "watermark": 3})
                got = await a.until(lambda m: m["type"] == "synced")
                self.assertEqual([(x["type"], x.get("seq")) for x in got],
                                 [("msg", s) for s in range(4, 36)] + [("synced", None)])
                self.assertEqual(got[-1]["head"], 35)

                j, _ = await obs.until(lambda m: m["type"] in ("join", "leave"))
                self.assertEqual((j["type"], j["user"]), ("join", "wes"), j)
                await b.c.close()  # a leave, after the grace (5 s by default)
                b_frames, b = b.frames, None
                j, _ = await obs.until(lambda m: m["type"] in ("join", "leave"), timeout=15)
                self.assertEqual((j["type"], j["user"]), ("leave", "wes"), j)
                n.send(conv, {"i": 36}, sender="bot")
                self.assert_msg((await a.recv()), conv, 36, {"i": 36})
                await a.round_trip()
                for frames in (a.frames, b_frames):
                    types = {f["type"] for f in frames}
                    self.assertLessEqual(types, V1_TYPES, frames)
                    self.assertNotIn("error", types, frames)
                    self.assertNotIn("drain", types, frames)
            finally:
                await a.c.close()
                if b:
                    await b.c.close()
                for c in clients:
                    await c.close()
        self.arun(go(), timeout=60)


if __name__ == "__main__":
    harness.main()
