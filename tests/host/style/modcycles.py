#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Which modules of rust/client/ use which, and whether that has a cycle.

    modcycles.py CLIENT_DIR

The modules are the files of CLIENT_DIR other than mod.rs (the module root,
which declares them and is their common parent) and each subdirectory as one
module (source/). A module uses a sibling when a line of its code (comments
left out) names it as `super::NAME`, `super::super::NAME` (from a
subdirectory), `crate::client::NAME`, or in a `use super::{..., NAME, ...}`
list. Prints every edge as "A -> B"; exit 0 if the graph has no cycle, 1
with "cycle: A -> B -> A" lines if it has, 2 on bad usage.
"""
import os
import re
import sys


def modules(d):
    mods = {}
    for e in sorted(os.listdir(d)):
        p = os.path.join(d, e)
        if e.endswith('.rs') and e != 'mod.rs':
            mods[e[:-3]] = [p]
        elif os.path.isdir(p):
            mods[e] = [os.path.join(p, f) for f in sorted(os.listdir(p)) if f.endswith('.rs')]
    return mods


def code(path):
    out = []
    with open(path, encoding='utf-8') as f:
        for line in f:
            line = line.split('//', 1)[0]
            out.append(line)
    return ''.join(out)


def uses(text, names, depth_prefixes):
    found = set()
    for pre in depth_prefixes:
        for m in re.finditer(pre + r'(\w+)', text):
            if m.group(1) in names:
                found.add(m.group(1))
        for m in re.finditer(pre + r'\{([^}]*)\}', text):
            for item in re.split(r'[,\s]+', m.group(1)):
                item = item.split('::', 1)[0]
                if item in names:
                    found.add(item)
    return found


def main():
    if len(sys.argv) == 2 and sys.argv[1] in ('-h', '--help'):
        print(__doc__.strip())
        sys.exit(0)
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        print('usage: modcycles.py CLIENT_DIR', file=sys.stderr)
        sys.exit(2)
    d = sys.argv[1]
    mods = modules(d)
    names = set(mods)
    graph = {}
    for name, files in mods.items():
        deps = set()
        for f in files:
            t = code(f)
            sub = os.path.dirname(f) != d
            pres = [r'crate::client::']
            pres += [r'super::super::'] if sub else [r'super::']
            deps |= uses(t, names, pres)
        deps.discard(name)
        graph[name] = sorted(deps)
        for b in graph[name]:
            print(f'{name} -> {b}')
    cycles = []
    state = {}

    def visit(n, path):
        state[n] = 1
        for m in graph[n]:
            if state.get(m) == 1:
                cycles.append(path[path.index(m):] + [m])
            elif m not in state:
                visit(m, path + [m])
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n, [n])
    for c in cycles:
        print('cycle: ' + ' -> '.join(c))
    sys.exit(1 if cycles else 0)


if __name__ == '__main__':
    main()
