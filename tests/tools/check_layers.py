#!/usr/bin/env python3
"""The include graph of converger's sources against docs/architecture.md.

Reads every #include "..." in src/, client/, common/ and tools/ and checks:
  - no cycle between the folders of src/ (a folder's files may include each
    other; net/ is one folder);
  - each folder of src/ includes only folders of a lower or the same layer;
  - nothing in src/ includes from tools/ or client/, and nothing in client/
    or common/ includes from src/.
Prints every violation and exits 1, or prints a summary and exits 0.
Usage: check_layers.py [REPO]   (default: the repository this file is in)
"""
import os
import re
import sys

# Layers, bottom first (docs/architecture.md). A folder may include its own
# layer and those below it.
LAYERS = [
    {"core"},
    {"store"},
    {"bus"},
    {"net"},
    {"proto", "gate", "cluster"},
    {"api"},
    {"node"},          # src/node.h, src/serve.c, src/lifecycle.*
    {"cli"},
]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def folder_of(path):
    """The module folder of a source path relative to src/."""
    parts = path.split("/")
    return parts[0] if len(parts) > 1 else "node"


def layer(f):
    for i, names in enumerate(LAYERS):
        if f in names:
            return i
    return None


def main():
    repo = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    problems = []
    edges = {}
    for top in ("src", "client", "common", "tools"):
        base = os.path.join(repo, top)
        for dirpath, _, files in os.walk(base):
            for name in files:
                if not name.endswith((".c", ".h")):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, base)
                with open(path, encoding="utf-8", errors="replace") as f:
                    incs = INCLUDE.findall(f.read())
                for inc in incs:
                    target = inc.split("/")[0] if "/" in inc else None
                    if top == "src":
                        if rel == "main.c":
                            continue
                        if inc.startswith(("bench/", "sim/")):
                            problems.append("%s/%s includes %s (tools/ or client/)" % (top, rel, inc))
                            continue
                        if target is None:
                            if inc in ("node.h", "serve.h", "lifecycle.h"):
                                target = "node"
                            else:
                                continue  # a header beside it
                        if target in ("common", "converger"):
                            continue  # common/ and the client library's public header
                        src, dst = folder_of(rel), target
                        if src != dst:
                            edges.setdefault(src, set()).add(dst)
                            ls, ld = layer(src), layer(dst)
                            if ls is None or ld is None:
                                problems.append("%s/%s: folder without a layer (%s -> %s)" % (top, rel, src, dst))
                            elif ld > ls:
                                problems.append("%s/%s includes %s: %s calls up into %s" % (top, rel, inc, src, dst))
                    elif top in ("client", "common"):
                        if target in ("core", "net", "store", "bus", "proto", "gate", "api", "cli",
                                      "cluster") or inc in ("node.h", "serve.h"):
                            problems.append("%s/%s includes %s from src/" % (top, rel, inc))
    # cycles between folders
    def dfs(n, stack, seen):
        for m in sorted(edges.get(n, ())):
            if m in stack:
                cyc = stack[stack.index(m):] + [m]
                problems.append("include cycle: " + " -> ".join(cyc))
            elif m not in seen:
                seen.add(m)
                dfs(m, stack + [m], seen)
    seen = set()
    for n in sorted(edges):
        if n not in seen:
            seen.add(n)
            dfs(n, [n], seen)
    for p in sorted(set(problems)):
        print(p)
    if problems:
        print("%d layering problem(s)" % len(set(problems)))
        return 1
    print("layers: %d folder edges, all downward, no cycle" % sum(len(v) for v in edges.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
