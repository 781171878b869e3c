#!/usr/bin/env python3
"""Check a `converger bench roll` summary.json: the run completed, something
was acknowledged, nothing was lost or delivered twice, every client verified.
Usage: check_roll_summary.py SUMMARY_JSON"""
import json
import sys

s = json.load(open(sys.argv[1]))
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
for key in ("disconnected_ms", "arrivals_per_s", "admission_wait_ms", "live_latency_ms"):
    if key not in s:
        problems.append("no %s" % key)
if problems:
    print("bench roll summary: " + "; ".join(problems))
    sys.exit(1)
print("bench roll summary: %d acknowledged, 0 lost, 0 duplicated, %d clients verified"
      % (s["acked"], s["clients"]))
