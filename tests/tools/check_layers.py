#!/usr/bin/env python3
"""The include graph of converger's sources against docs/architecture.md.

Every #include "..." in src/, common/, client/, include/, tools/ and cmd/ is
resolved to the file the compiler would use (the including file's folder
first, then the build's include roots), and checked:
  - each folder of src/ includes only its own folder, folders of a lower
    layer, and common/; there is no cycle between the folders of src/;
  - nothing in src/ includes from client/, tools/ or cmd/; only src/cli/
    includes the client library's public header (include/converger/);
  - common/ includes only common/; client/ only client/, common/ and
    include/; include/ only include/; tools/ anything but cmd/;
  - every quoted include resolves to a file of the repository.
Prints every violation and exits 1, or a summary and exits 0.
Usage: check_layers.py [REPO]   (default: the repository this file is in)
"""
import os
import re
import sys

# Layers of src/, bottom first (docs/architecture.md). A folder may include
# its own layer and the ones below it; "node" is src/*.{c,h} (serve.c,
# lifecycle.c, node.h).
LAYERS = [
    {"core"},
    {"store"},
    {"bus"},
    {"net"},
    {"proto", "gate", "cluster"},
    {"api", "cli"},
    {"node"},
]
TOPS = ("src", "common", "client", "include", "tools", "cmd")
# Where the build looks for quoted includes after the including file's
# folder (CMakeLists.txt's target_include_directories).
ROOTS = ("src", ".", "client", "include", "tools")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer(folder):
    for i, names in enumerate(LAYERS):
        if folder in names:
            return i
    return None


def where(rel):
    """(top, folder) of a repository-relative path: folder is the module
    folder for src/ (or "node" for its top-level files), else None."""
    parts = rel.split(os.sep)
    top = parts[0]
    if top == "src":
        return top, parts[1] if len(parts) > 2 else "node"
    return top, None


def resolve(repo, src_rel, inc):
    candidates = [os.path.join(os.path.dirname(src_rel), inc)] + [os.path.join(r, inc) for r in ROOTS]
    for c in candidates:
        c = os.path.normpath(c)
        if not c.startswith("..") and os.path.isfile(os.path.join(repo, c)):
            return c
    return None


def main():
    repo = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    problems = set()
    edges = {}
    nfiles = 0
    for top in TOPS:
        for dirpath, _, files in os.walk(os.path.join(repo, top)):
            for name in sorted(files):
                if not name.endswith((".c", ".h")):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), repo)
                nfiles += 1
                with open(os.path.join(repo, rel), encoding="utf-8", errors="replace") as f:
                    incs = INCLUDE.findall(f.read())
                stop, sfolder = where(rel)
                for inc in incs:
                    target = resolve(repo, rel, inc)
                    if target is None:
                        problems.add('%s: #include "%s" resolves to no file of the repository' % (rel, inc))
                        continue
                    ttop, tfolder = where(target)
                    what = '%s includes %s (%s)' % (rel, inc, target)
                    if stop == "src":
                        if ttop == "common":
                            continue
                        if ttop == "include":
                            if sfolder != "cli":
                                problems.add(what + ": only src/cli uses the client library")
                            continue
                        if ttop != "src":
                            problems.add(what + ": src/ must not include from %s/" % ttop)
                            continue
                        if tfolder == sfolder:
                            continue
                        edges.setdefault(sfolder, set()).add(tfolder)
                        ls, lt = layer(sfolder), layer(tfolder)
                        if ls is None or lt is None:
                            problems.add(what + ": a folder of src/ without a layer")
                        elif lt > ls:
                            problems.add(what + ": %s calls up into %s" % (sfolder, tfolder))
                    elif stop == "common" and ttop != "common":
                        problems.add(what + ": common/ includes only common/")
                    elif stop == "client" and ttop not in ("client", "common", "include"):
                        problems.add(what + ": client/ includes only client/, common/, include/")
                    elif stop == "include" and ttop != "include":
                        problems.add(what + ": the public header includes only include/")
                    elif stop == "tools" and ttop == "cmd":
                        problems.add(what + ": tools/ must not include cmd/")

    def dfs(n, stack, seen):
        for m in sorted(edges.get(n, ())):
            if m in stack:
                problems.add("include cycle: " + " -> ".join(stack[stack.index(m):] + [m]))
            elif m not in seen:
                seen.add(m)
                dfs(m, stack + [m], seen)

    seen = set()
    for n in sorted(edges):
        if n not in seen:
            seen.add(n)
            dfs(n, [n], seen)
    for p in sorted(problems):
        print(p)
    if problems:
        print("%d layering problem(s)" % len(problems))
        return 1
    print("layers: %d files, %d edges between the folders of src/, all downward, no cycle"
          % (nfiles, sum(len(v) for v in edges.values())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
