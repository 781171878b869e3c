#!/usr/bin/env python3
"""The blast radius of one shard: the other conversations' delivery latency
with one PostgreSQL instance down or hung, against their baseline, side by
side in one run, and whether any node leaves its load balancer.

A sharded cluster of three instances (scripts/pg-tmp `--fast`), two bus
instances (scripts/redis-tmp) and three nodes. Conversations on every
instance; each has a WebSocket subscriber on a node other than the one the
sender uses. A sender thread per conversation appends over REST at a fixed
pace (--rate per second each, with an Idempotency-Key); a message's
latency is from just before its POST to its arrival at the subscriber
(one clock: both ends are this process). Phases of --phase-s seconds, in
each round: baseline, instance 2 stopped (pg-tmp down), baseline, instance
2 frozen (SIGSTOP of every process: it answers nothing), each fault healed
before the next phase. /readyz of every node is read every 200 ms.

Prints each round's p50 and p99 for the healthy instances' conversations
per phase, the ratio to the baseline before it, the sends to the faulty
instance refused, and the non-200 /readyz answers; then the medians.

Usage: tools/bench/blast_radius.py [--binary build/converger] [--rounds 3]
       [--phase-s 15] [--convs-per-instance 4] [--rate 20]
"""

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import harness  # noqa: E402


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(len(v) * p))] if v else float("nan")


class Run:
    def __init__(self, args):
        self.args = args
        self.sent = {}  # (conv, key) -> time before the POST
        self.lat = []  # (phase, conv, ms)
        self.refused = {}
        self.readyz_bad = {}
        self.phase = "warmup"
        self.stop = threading.Event()

    def sender(self, node, conv):
        i = 0
        gap = 1.0 / self.args.rate
        with node.session() as s:
            while not self.stop.is_set():
                key = "%s-%d" % (conv, i)
                t0 = time.time()
                self.sent[(conv, key)] = t0
                try:
                    st, _, _ = s.request("POST", "/v1/conversations/%s/messages" % conv,
                                         {"sender": "bench", "body": {"k": key}},
                                         headers={"Idempotency-Key": key})
                except OSError:
                    st = 0
                if st in (200, 201):
                    i += 1
                else:
                    self.refused[self.phase] = self.refused.get(self.phase, 0) + 1
                time.sleep(max(0.0, gap - (time.time() - t0)))

    def readyz(self, nodes):
        while not self.stop.is_set():
            for n in nodes:
                try:
                    st = n.get("/readyz", timeout=2)[0]
                except OSError:
                    st = 0
                if st != 200:
                    self.readyz_bad[self.phase] = self.readyz_bad.get(self.phase, 0) + 1
            time.sleep(0.2)


def one_round(args, r):
    sh = harness.Sharded(instances=3, bus=2)
    nodes = []
    try:
        nodes = [harness.Node(sh.env({"CONVERGER_STORE_TIMEOUT_MS": "3000"})) for _ in range(3)]
        ch = nodes[0].create_channel()["id"]
        convs = {i: [sh.conv_on(nodes[0], instance=i, channel=ch)
                     for _ in range(args.convs_per_instance)] for i in range(3)}
        run = Run(args)

        async def go():
            subs = []
            k = 0
            for i in range(3):
                for c in convs[i]:
                    cl, _ = await harness.open_client(nodes[(k + 1) % 3], harness.mint_token("b%d" % k, [c]),
                                                      [{"conv": c, "watermark": None}])
                    subs.append((cl, c, i))
                    k += 1
            loop = asyncio.get_running_loop()
            threads = [threading.Thread(target=run.sender, args=(nodes[j % 3], c), daemon=True)
                       for j, c in enumerate(c for i in range(3) for c in convs[i])]
            threads.append(threading.Thread(target=run.readyz, args=(nodes,), daemon=True))
            for t in threads:
                t.start()

            async def reader(cl, c, inst):
                while not run.stop.is_set():
                    try:
                        m = await cl.recv_json(0.5)
                    except asyncio.TimeoutError:
                        continue
                    if m.get("type") == "msg":
                        t0 = run.sent.get((c, m["body"]["k"]))
                        if t0 is not None and inst != 2:
                            run.lat.append((run.phase, c, (time.time() - t0) * 1000))
            readers = [asyncio.create_task(reader(*x)) for x in subs]
            schedule = [("warmup", None, 3), ("baseline", None, args.phase_s),
                        ("down", "down", args.phase_s), ("heal-1", "up", 5),
                        ("baseline2", None, args.phase_s), ("hung", "freeze", args.phase_s),
                        ("heal-2", "thaw", 5)]
            for name, action, secs in schedule:
                if action == "down":
                    await loop.run_in_executor(None, sh.pgs[2].down)
                elif action == "up":
                    await loop.run_in_executor(None, sh.pgs[2].up)
                elif action == "freeze":
                    await loop.run_in_executor(None, sh.pgs[2].freeze)
                elif action == "thaw":
                    sh.pgs[2].thaw()
                run.phase = name
                await asyncio.sleep(secs)
            run.stop.set()
            for t in readers:
                t.cancel()
            for cl, _, _ in subs:
                await cl.close()
            for t in threads:
                t.join(10)
        asyncio.run(go())
        res = {}
        for ph in ("baseline", "down", "baseline2", "hung"):
            v = [ms for p, _, ms in run.lat if p == ph]
            res[ph] = (pct(v, 0.5), pct(v, 0.99), len(v))
        return res, run.refused, run.readyz_bad
    finally:
        for n in nodes:
            n.ensure_stopped()
            n.remove_dir()
        sh.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "converger"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--phase-s", type=float, default=15)
    ap.add_argument("--convs-per-instance", type=int, default=4)
    ap.add_argument("--rate", type=float, default=20)
    args = ap.parse_args()
    harness.BINARY = os.path.abspath(args.binary)
    ratios = {"down": [], "hung": []}
    bad = 0
    for r in range(args.rounds):
        res, refused, readyz_bad = one_round(args, r)
        bad += sum(v for k, v in readyz_bad.items() if k != "warmup")
        for ph, base in (("down", "baseline"), ("hung", "baseline2")):
            ratio = res[ph][1] / res[base][1]
            ratios[ph].append(ratio)
            print("round %d %-4s: healthy p50 %.1f ms, p99 %.1f ms (%d msgs); baseline p50 %.1f, "
                  "p99 %.1f ms (%d): p99 ratio %.2f; sends to instance 2 refused %d" %
                  (r + 1, ph, res[ph][0], res[ph][1], res[ph][2], res[base][0], res[base][1],
                   res[base][2], ratio, refused.get(ph, 0)), flush=True)
        print("round %d: /readyz answers other than 200: %s" % (r + 1, readyz_bad or "none"), flush=True)
    for ph in ("down", "hung"):
        print("median p99 ratio, instance 2 %s / baseline: %.2f" % (ph, statistics.median(ratios[ph])))
    print("/readyz answers other than 200 outside the warm-up: %d" % bad)


if __name__ == "__main__":
    main()
