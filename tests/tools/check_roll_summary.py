#!/usr/bin/env python3
"""Check a `converger bench roll` run from its summary.json: the run
completed, something was acknowledged, nothing was lost or delivered twice,
every client verified; the figures and files of the --out directory are
there (restarts, one per node; live and all-deliveries latency;
disconnected_ms.csv; the three PNG plots; haproxy.cfg with --lb haproxy;
with --controller roll, converger roll's exit 0 and the fleet balanced;
with --presence on, no leave during the run and every conversation's
presence equal to its clients after the roll; the topology of --shards and
--bus, or one database).
Usage: check_roll_summary.py SUMMARY_JSON"""
import json
import os
import sys

path = sys.argv[1]
out = os.path.dirname(os.path.abspath(path))
s = json.load(open(path))
problems = []
if s.get("status") != "ok":
    problems.append("status %r (%s)" % (s.get("status"), s.get("error", "")))
if s.get("acked", 0) <= 0:
    problems.append("nothing acknowledged")
for key in ("lost", "dup_delivered", "out_of_order"):
    if s.get(key) != 0:
        problems.append("%s = %r" % (key, s.get(key)))
if s.get("clients_verified") != s.get("clients"):
    problems.append("%r of %r clients verified" % (s.get("clients_verified"), s.get("clients")))
for key in ("disconnected_ms", "arrivals_per_s", "admission_wait_ms", "live_latency_ms",
            "delivery_latency_ms", "roll_from_ms", "roll_to_ms", "reconnect", "ignore_hints",
            "lb"):
    if key not in s:
        problems.append("no %s" % key)
for key in ("live_latency_ms", "delivery_latency_ms"):
    lat = s.get(key, {})
    if not (isinstance(lat.get("p50"), (int, float)) and lat.get("p50") >= 0 and
            lat.get("p99", -1) >= lat.get("p50")):
        problems.append("%s %r" % (key, lat))
restarts = s.get("restarts", [])
if len(restarts) != s.get("nodes"):
    problems.append("%d restarts for %r nodes" % (len(restarts), s.get("nodes")))
for r in restarts:
    if not (r.get("sigterm_ms", -1) < r.get("exit_ms", -1) < r.get("ready_ms", -1) <= r.get("to_ms", -1)):
        problems.append("restart times out of order: %r" % r)
    if len(r.get("arrivals_per_s", {})) != s.get("nodes"):
        problems.append("restart of %r: arrivals of %d nodes" % (r.get("node"), len(r.get("arrivals_per_s", {}))))
try:
    lines = open(os.path.join(out, "disconnected_ms.csv")).read().split()
    samples = [int(v) for v in lines[1:]]
    if lines[0] != "disconnected_ms" or samples != sorted(samples) or \
            len(samples) != s["disconnected_ms"]["drops"]:
        problems.append("disconnected_ms.csv: bad header, order or count")
except (OSError, ValueError, IndexError, KeyError) as e:
    problems.append("disconnected_ms.csv: %s" % e)
for png in ("arrivals.png", "connected.png", "disconnected_cdf.png"):
    try:
        with open(os.path.join(out, png), "rb") as f:
            if f.read(8) != b"\x89PNG\r\n\x1a\n":
                problems.append("%s is not a PNG" % png)
    except OSError as e:
        problems.append("%s: %s" % (png, e))
p = s.get("presence")
if p is not None:
    if p.get("leaves") != 0:
        problems.append("presence: %r leave events during a migrate roll" % p.get("leaves"))
    if p.get("convs_checked") != s.get("convs") or p.get("convs_mismatched") != 0:
        problems.append("presence after the roll: %r" % p)
if s.get("lb") == "haproxy" and not os.path.exists(os.path.join(out, "haproxy.cfg")):
    problems.append("--lb haproxy without haproxy.cfg")
if s.get("controller") == "roll":
    # converger roll restarted the nodes: it exited 0, its own summary says
    # done and balanced, and the clients' own count at the end agrees (the
    # busiest node within the default 10 % tolerance, a bucket's slack)
    c = s.get("controller_summary") or {}
    if s.get("controller_exit") != 0 or c.get("result") != "done":
        problems.append("converger roll: exit %r, result %r (%s)" %
                        (s.get("controller_exit"), c.get("result"), c.get("why", "")))
    if c.get("balanced") is not True or not 0 < s.get("end_spread", 0) <= 1.15:
        problems.append("not balanced at the end: controller %r, end_spread %r, per node %r" %
                        (c.get("balanced"), s.get("end_spread"), s.get("end_connections_per_node")))
    if not os.path.exists(os.path.join(out, "controller.log")):
        problems.append("no controller.log")
# the topology the command asked for: with --shards N (--bus B, 2 by
# default) a sharded cluster, else one database
cmd = s.get("command", [])
topo = s.get("topology") or {}
def arg(name, default):
    return int(cmd[cmd.index(name) + 1]) if name in cmd else default
if "--shards" in cmd:
    want = {"store": "sharded", "instances": arg("--shards", 0), "bus_instances": arg("--bus", 2)}
else:
    want = {"store": "one database", "instances": 1, "bus_instances": 0}
for key, value in want.items():
    if topo.get(key) != value:
        problems.append("topology %s %r, want %r" % (key, topo.get(key), value))
if problems:
    print("bench roll summary: " + "; ".join(problems))
    sys.exit(1)
print("bench roll summary: %d acknowledged, 0 lost, 0 duplicated, %d clients verified, "
      "%d restarts%s, plots drawn" % (s["acked"], s["clients"], len(restarts),
                                      " by converger roll, balanced (spread %.2f)" % s["end_spread"]
                                      if s.get("controller") == "roll" else ""))
