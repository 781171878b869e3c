#!/usr/bin/env python3
"""Check a `converger bench compare` output directory: compare.md has the
side-by-side table with a column per scenario, every scenario's summary.json
says ok with nothing lost or delivered twice, and the overlay plots are PNGs.
Usage: check_compare.py OUT_DIR SCENARIO..."""
import json
import os
import sys

out, scenarios = sys.argv[1], sys.argv[2:]
problems = []
md = open(os.path.join(out, "compare.md")).read()
header = "| figure | " + " | ".join(scenarios) + " |"
if header not in md:
    problems.append("compare.md has no table header %r" % header)
for name in scenarios:
    path = os.path.join(out, name, "summary.json")
    if not os.path.exists(path):
        problems.append("%s: no summary.json" % name)
        continue
    s = json.load(open(path))
    if s.get("clients_verified") != s.get("clients"):
        problems.append("%s: %r of %r clients verified"
                        % (name, s.get("clients_verified"), s.get("clients")))
    if not os.path.exists(os.path.join(out, name + ".1s.csv")):
        problems.append("%s: no %s.1s.csv" % (name, name))
    if s.get("status") != "ok":
        problems.append("%s: status %r" % (name, s.get("status")))
    for key in ("lost", "dup_delivered", "out_of_order"):
        if s.get(key) != 0:
            problems.append("%s: %s = %r" % (name, key, s.get(key)))
    if s.get("acked", 0) <= 0:
        problems.append("%s: nothing acknowledged" % name)
for png in ("compare_arrivals.png", "compare_busiest.png", "compare_connected.png",
            "compare_disconnected_cdf.png"):
    path = os.path.join(out, png)
    if not os.path.exists(path) or open(path, "rb").read(8) != b"\x89PNG\r\n\x1a\n":
        problems.append("%s is not a PNG" % png)
    elif "](%s)" % png not in md:
        problems.append("compare.md does not show %s" % png)
if problems:
    print("bench compare: " + "; ".join(problems))
    sys.exit(1)
print("bench compare: %s verified, compare.md and 4 plots" % ", ".join(scenarios))
