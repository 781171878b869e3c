#!/usr/bin/env python3
"""`converger sim fanout` from the command line (issue 32, item 6).
Usage: check_fanout.py CONVERGER

With the defaults (the post-mortem's fleet, full scale) it exits 0 and
prints the per-node table, the bus instances and the cross-check with the
issue's arithmetic (2.88 GB/s from one PostgreSQL, 6.00 MB/s into each
node); its --json summary has NOTIFY to all at R x 320 B on every node and
the interest-routed bytes near R x 3 x 354 B / 480 plus control. The same
flags give byte-identical JSON; a bad flag exits 2 and names it."""
import json
import subprocess
import sys

exe = sys.argv[1]
problems = []


def want(ok, text):
    if not ok:
        problems.append(text)


def run(*args):
    return subprocess.run([exe, "sim", "fanout", *args], capture_output=True, text=True,
                          timeout=60)


r = run()
want(r.returncode == 0, "defaults: exit %d, stderr %r" % (r.returncode, r.stderr))
for text in ("480 nodes, 13000000 clients, R = 20000 appends/s of 300 B",
             "| bytes in, NOTIFY to all | 6.40 MB/s | 6.40 MB/s | 6.40 MB/s |",
             "| bytes in, interest-routed |", "| NOTIFY / interest-routed |",
             "| share of NOTIFY's messages the node keeps |", "| each bus instance (16) |",
             "| one PostgreSQL's NOTIFY egress (issue: 2.9 GB/s) | 2.88 GB/s |",
             "| NOTIFY bytes into each node (issue: 6 MB/s) | 6.00 MB/s |"):
    want(text in r.stdout, "defaults: no %r in the output" % text)

r = run("--json")
want(r.returncode == 0, "--json: exit %d" % r.returncode)
s = json.loads(r.stdout)
pn = s["per_node"]
want(pn["notify_in_bytes_per_s"]["min"] == pn["notify_in_bytes_per_s"]["max"] == 20000 * 320,
     "NOTIFY to all is not 20 000 x 320 B/s on every node: %r" % pn["notify_in_bytes_per_s"])
want(s["paper"]["postgres_egress_bytes_per_s"] == 480 * 20000 * 300, "paper: PostgreSQL egress")
want(s["paper"]["node_in_bytes_per_s"] == 20000 * 300, "paper: bytes into a node")
msgs = pn["interest_msg_bytes_per_s"]["median"]
want(abs(msgs - 20000 * 3 * 354 / 480) < 0.02 * msgs, "interest messages median %.0f" % msgs)
want(0 < pn["interest_control_bytes_per_s"]["median"] < 0.2 * msgs, "control share")
want(pn["kept_share"]["max"] < 0.01, "a node keeps %.4f" % pn["kept_share"]["max"])
want(pn["notify_over_interest"]["min"] > 100, "ratio %.1f" % pn["notify_over_interest"]["min"])
bus = s["bus"]
want(len(bus["per_instance"]) == 16, "per_instance")
want(sum(b["subscriptions"] for b in bus["per_instance"]) == s["conv_node_pairs"] + 480,
     "the instances' subscriptions are not every pair plus the control channel's")

small = ("--nodes", "48", "--clients", "100000", "--conv-size-dist", "zipf",
         "--conv-size-max", "10000", "--json")
a, b = run(*small), run(*small)
want(a.returncode == 0 and a.stdout == b.stdout, "the same flags gave different output")
c = run(*small, "--seed", "2")
want(c.stdout != a.stdout, "another seed gave the same output")

r = run("--conv-size-dist", "pareto")
want(r.returncode == 2 and "--conv-size-dist" in r.stderr, "bad flag: exit %d, %r"
     % (r.returncode, r.stderr))
r = run("--help")
want(r.returncode == 0 and "docs/background.md" in r.stdout and "--bus-instances B" in r.stdout,
     "--help")

if problems:
    print("sim fanout: " + "; ".join(problems))
    sys.exit(1)
print("sim fanout: ok")
