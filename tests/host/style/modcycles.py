#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Which modules of rust/client/ use which, and whether that has a cycle.

    modcycles.py CLIENT_DIR

The modules are the files of CLIENT_DIR other than mod.rs (the module root,
which declares them and is their common parent) and its subdirectories: a
module is NAME.rs, or NAME/ (with its mod.rs), or both (Rust 2018 layout:
NAME.rs the parent, NAME/*.rs its child modules), and its child modules are
part of it: a parent and its children use each other freely (source/ and
registration/ count as one module each). A module uses a sibling when a line
of its code (comments left out) names it as `super::NAME` from a file of the
directory, with one more `super::` per directory below it (a child's
`super::super::NAME`), as `crate::client::NAME`, or in such a
`use super::{..., NAME, ...}` list. The same check then runs inside each
module's directory, among its children (registration/park.rs,
registration/revoke.rs), the parent (NAME.rs or NAME/mod.rs) being their
common parent there. Prints every edge as "A -> B" (nested ones as
"registration::A -> registration::B"); exit 0 if no graph has a cycle, 1
with "cycle: A -> B -> A" lines if one has, 2 on bad usage.
"""
import os
import re
import sys


def rs_files(d):
    """The .rs files under d, recursively, sorted."""
    out = []
    for root, dirs, files in os.walk(d):
        dirs.sort()
        out += [os.path.join(root, f) for f in sorted(files) if f.endswith('.rs')]
    return out


def modules(d):
    """The child modules of the module whose directory is d: name -> files
    (its own file and everything under its directory), and name -> its
    directory (if it has one)."""
    mods, dirs = {}, {}
    for e in sorted(os.listdir(d)):
        p = os.path.join(d, e)
        if e.endswith('.rs') and e != 'mod.rs':
            mods.setdefault(e[:-3], []).append(p)
        elif os.path.isdir(p):
            mods.setdefault(e, []).extend(rs_files(p))
            dirs[e] = p
    return mods, dirs


def depth(path, d):
    """How many `super::` lead from the module of file path to the module
    whose directory is d (NAME.rs and NAME/mod.rs: 1, NAME/X.rs: 2, ...)."""
    parts = os.path.relpath(path, d).split(os.sep)
    return len(parts) - (1 if parts[-1] == 'mod.rs' else 0)


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
        # A whole path from its start: `super::x` is not the tail of
        # `super::super::x`.
        pre = r'(?<![\w:])' + pre
        for m in re.finditer(pre + r'(\w+)', text):
            if m.group(1) in names:
                found.add(m.group(1))
        for m in re.finditer(pre + r'\{([^}]*)\}', text):
            for item in re.split(r'[,\s]+', m.group(1)):
                item = item.split('::', 1)[0]
                if item in names:
                    found.add(item)
    return found


def cycles_of(graph):
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
    return cycles


def check(d, modpath, label):
    """Prints the edges among the child modules of the module modpath
    (directory d) and returns its cycles and those of every level below."""
    mods, dirs = modules(d)
    names = set(mods)
    graph = {}
    for name, files in mods.items():
        deps = set()
        for f in files:
            t = code(f)
            pres = [re.escape(modpath + '::'), r'super::' * depth(f, d)]
            deps |= uses(t, names, pres)
        deps.discard(name)
        graph[name] = sorted(deps)
        for b in graph[name]:
            print(f'{label}{name} -> {label}{b}')
    cycles = [[label + n for n in c] for c in cycles_of(graph)]
    for name, sub in sorted(dirs.items()):
        cycles += check(sub, modpath + '::' + name, label + name + '::')
    return cycles


def main():
    if len(sys.argv) == 2 and sys.argv[1] in ('-h', '--help'):
        print(__doc__.strip())
        sys.exit(0)
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        print('usage: modcycles.py CLIENT_DIR', file=sys.stderr)
        sys.exit(2)
    cycles = check(sys.argv[1], 'crate::client', '')
    for c in cycles:
        print('cycle: ' + ' -> '.join(c))
    sys.exit(1 if cycles else 0)

if __name__ == '__main__':
    main()
