#!/usr/bin/env python3
"""Bytes a node receives from the other nodes' fan-out: one PostgreSQL
(LISTEN/NOTIFY: every node hears every message) against a sharded cluster
(Redis pub/sub: a node hears the conversations it serves), on the same
workload, side by side.

Each round starts, for each mode in turn, three nodes on throwaway stores
(scripts/pg-tmp `--fast`, scripts/redis-tmp: the figure is bytes, not
durability), C conversations of one channel, and WebSocket subscribers:
conversation k on node k mod 3, and every tenth also on the next node.
Then M messages (compact JSON bodies of --body-bytes, ids and sender as a
server sends them) go over REST to the nodes in turn. Per node it reads
converger_bus_bytes_in_total (the whole RESP pushes, or the whole
NotificationResponses: instance="listen") before and after, and compares
it with the bytes of the messages of the conversations that node serves:
each message's store/notify.h payload, "m SEQ CONV EPOCH TS ID SENDER\\nBODY",
which is what either bus must carry at the least. Prints each round and
the medians.

Usage: tools/bench/bus_bytes.py [--binary build/converger] [--rounds 3]
       [--convs 300] [--messages 3000] [--body-bytes 220]
"""

import argparse
import asyncio
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import harness  # noqa: E402


def bytes_in(node):
    _, _, text = node.get_text("/metrics", port=node.admin_port)
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("converger_bus_bytes_in_total{"))


def payload_len(conv, m):
    """The length of the message's store/notify.h payload."""
    body = json.dumps(m["body"], separators=(",", ":"))
    return len("m %d %s %s %d %s %s\n" % (m["seq"], conv, "x" * 8, 1764000000000, m["id"],
                                          m["sender"])) + len(body.encode())


async def subscribe(node, convs):
    clients = []
    for k in range(0, len(convs), 50):
        part = convs[k:k + 50]
        c, _ = await harness.open_client(node, harness.mint_token(harness.uid("u"), part),
                                         [{"conv": x, "watermark": None} for x in part])
        clients.append(c)
    return clients


async def drain(clients, seconds):
    """Read what the subscribers get, so that no socket backs up."""
    end = time.time() + seconds
    while time.time() < end:
        for c in clients:
            try:
                while True:
                    await c.recv_json(0.01)
            except asyncio.TimeoutError:
                pass


def one(mode, args):
    store, sh = None, None
    nodes = []
    try:
        if mode == "notify":
            store = harness.PgCluster(durable=False)
            env = {"CONVERGER_DATABASE_URL": store.url}
        else:
            sh = harness.Sharded(instances=3, bus=2)
            env = sh.env()
        nodes = [harness.Node(env) for _ in range(3)]
        ch = nodes[0].create_channel()["id"]
        convs = ["bb-%04d-%s" % (k, harness.uid("c")[-6:]) for k in range(args.convs)]
        for c in convs:
            nodes[0].create_conv(ch, c)
        serves = [set() for _ in nodes]
        for k, c in enumerate(convs):
            serves[k % 3].add(c)
            if k % 10 == 0:
                serves[(k + 1) % 3].add(c)

        async def run():
            subs = []
            for i, n in enumerate(nodes):
                subs += await subscribe(n, sorted(serves[i]))
            await asyncio.sleep(1.0)  # the bus subscriptions confirmed
            before = [bytes_in(n) for n in nodes]
            loop = asyncio.get_running_loop()
            body = {"text": "x" * args.body_bytes}

            def send_all():
                sessions = [n.session() for n in nodes]
                for j in range(args.messages):
                    st, _, js = sessions[j % 3].request(
                        "POST", "/v1/conversations/%s/messages" % convs[j % len(convs)],
                        {"id": "m-%06d" % j, "sender": "server", "body": body})
                    assert st == 201, (st, js)
                for s in sessions:
                    s.close()
            sender = loop.run_in_executor(None, send_all)
            while not sender.done():
                await drain(subs, 0.2)
            await sender
            await drain(subs, 1.5)
            after = [bytes_in(n) for n in nodes]
            for c in subs:
                await c.close()
            return [a - b for a, b in zip(after, before)]
        got = asyncio.run(run())
        msg_bytes = {}
        for c in convs:
            rows, _ = nodes[0].all_messages(c)
            msg_bytes[c] = sum(payload_len(c, m) for m in rows)
        total = sum(msg_bytes.values())
        out = []
        for i in range(3):
            served = sum(msg_bytes[c] for c in serves[i])
            out.append({"node": i, "served_convs": len(serves[i]), "served_bytes": served,
                        "all_bytes": total, "bus_bytes": got[i], "ratio": got[i] / served})
        return out
    finally:
        for n in nodes:
            n.ensure_stopped()
            n.remove_dir()
        if store:
            store.stop()
        if sh:
            sh.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "converger"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--convs", type=int, default=300)
    ap.add_argument("--messages", type=int, default=3000)
    ap.add_argument("--body-bytes", type=int, default=220)
    args = ap.parse_args()
    harness.BINARY = os.path.abspath(args.binary)
    ratios = {"notify": [], "sharded": []}
    for r in range(args.rounds):
        for mode in ("notify", "sharded"):
            rows = one(mode, args)
            for row in rows:
                ratios[mode].append(row["ratio"])
                print("round %d %-7s node %d: serves %3d convs, %9d bytes of their messages "
                      "(%d of all), %9d bytes in from the bus: %.3f x" %
                      (r + 1, mode, row["node"], row["served_convs"], row["served_bytes"],
                       row["all_bytes"], row["bus_bytes"], row["ratio"]), flush=True)
    for mode in ("notify", "sharded"):
        print("median %-7s: bytes in / bytes of the served conversations' messages = %.3f x"
              % (mode, statistics.median(ratios[mode])))


if __name__ == "__main__":
    main()
