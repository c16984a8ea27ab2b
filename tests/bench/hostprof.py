#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""QEMU's own profile, on the host, of a profile-mode run whose passes are
apart (scripts/bench.sh --profile with PROFILE_COUNTERS=1 PROFILE_GAP=S):

  perf record -p $(cat $PEERMEM_CACHE/vm-runs/<run>/qemu.pid) -F 499 -o host.data
  perf script -i host.data -F tid,time,ip,sym,dso > host.script
  hostprof.py host.script PROFILE_TXT [TOP [SYSTEM_MAP]]

With PEERMEM_QEMU_PERFMAP=1 (scripts/vm.sh: QEMU's -perfmap) perf names
each piece of translated code by the guest address it came from
("guest-0x..."); given the guest kernel's System.map (and the modules'
"ksym" lines that BENCH_PROF_INSNS=1 puts in PROFILE_TXT), the samples in
translated code are then split by guest function, and the first two
sides' time per reg+dereg is compared by symbol (guest functions and
QEMU's own), in microseconds per operation.

The passes are the stretches of samples between idle gaps (under a
fifth of a busy half second's samples, at least 20, per 0.5 s
for at least 1.5 s), named in the order of the guest's
"profile SIDE" lines; the boot and setup before the first pass are the
first stretch's head, so each pass is taken as the last W seconds of its
stretch, W = its wall time from the guest (reg+dereg count x ms each).
For each pass, the busiest QEMU thread's samples (the vCPU that ran the
loop), by symbol: translated guest code (perf's JIT map), QEMU's block
lookup (helper_lookup_tb_ptr; qht_lookup_custom when the vCPU's jump
cache misses), its software TLB, its helpers.
"""
import bisect
import collections
import os
import re
import sys

from insns import load_ksyms, load_map


def name_sample(sym, dso, syms, keys):
    """(symbol, group) of a sample: a guest function for translated code."""
    if sym.startswith("guest-0x") and keys is not None:
        a = int(sym[8:], 16)
        if a < 0xffff800000000000:
            return "(guest user space)", "translated: user space"
        i = bisect.bisect_right(keys, a) - 1
        name = syms[i][1] if i >= 0 else "?"
        grp = name[name.rindex("[") + 1:-1] if name.endswith("]") else "kernel"
        return "guest " + name, "translated: " + grp
    if sym == "(translated guest code)" or sym.startswith("guest-0x"):
        return "(translated guest code)", "translated"
    if sym in ("helper_lookup_tb_ptr", "qht_lookup_custom"):
        return f"{sym} ({dso})", "QEMU: finding the next block"
    if sym == "[unknown]":
        return f"{sym} ({dso})", "QEMU: unnamed (stripped)"
    return f"{sym} ({dso})", "QEMU: other"


def main():
    script, prof = sys.argv[1:3]
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 15
    rows = []
    for line in open(script):
        m = re.match(r"\s*(\d+)\s+([\d.]+):\s+([0-9a-f]+)\s+(.*?)\s+\((.*)\)\s*$", line)
        if m:
            sym = re.sub(r"\+0x[0-9a-f]+$", "", m.group(4))
            dso = m.group(5).split("/")[-1]
            if dso.startswith("perf-") and dso.endswith(".map") and not sym.startswith("guest-0x"):
                sym, dso = "(translated guest code)", "JIT"
            rows.append((float(m.group(2)), int(m.group(1)), sym, dso))
    if not rows:
        sys.exit("no samples")
    passes = []
    for line in open(prof):
        m = re.match(r"profile (\S+) \d+ bytes, 1 thread\(s\): (\d+) reg\+dereg each, ([\d.]+) ms", line)
        if m:
            passes.append((m.group(1), int(m.group(2)) * float(m.group(3)) / 1e3, int(m.group(2))))
    rows.sort()
    t0 = rows[0][0]
    buckets = collections.Counter(int((r[0] - t0) * 2) for r in rows)
    last = max(buckets)
    # Idle: under a fifth of a busy half second's samples (20 at perf's
    # -F 499), whatever the sampling rate.
    counts = sorted(buckets.values())
    floor = max(20, counts[int(len(counts) * 0.9)] // 5)
    busy = [buckets.get(b, 0) >= floor for b in range(last + 1)]
    stretches, start, idle = [], None, 0
    for b, on in enumerate(busy + [False] * 3):
        if on:
            if start is None:
                start = b
            idle, end = 0, b
        elif start is not None:
            idle += 1
            if idle >= 3:
                stretches.append((start / 2, (end + 1) / 2))
                start, idle = None, 0
    if len(stretches) < len(passes):
        sys.exit(f"{len(stretches)} busy stretches for {len(passes)} passes: no gaps (PROFILE_GAP)?")
    kern, mods = (load_map(sys.argv[4]), load_ksyms(prof)) if len(sys.argv) > 4 else (None, {})
    per_op = {}
    for (side, wall, nops), (a, b) in zip(passes, stretches):
        lo = max(a, b - wall)
        sel = [r for r in rows if lo <= r[0] - t0 < b]
        tid = collections.Counter(r[1] for r in sel).most_common(1)[0][0]
        sel = [r for r in sel if r[1] == tid]
        syms = sorted(kern + mods.get(side, [])) if kern is not None else None
        keys = [x for x, _ in syms] if syms is not None else None
        named = [name_sample(r[2], r[3], syms, keys) for r in sel]
        c = collections.Counter(nm for nm, _ in named)
        g = collections.Counter(gr for _, gr in named)
        n = len(sel)
        print(f"{side}: {b - lo:.1f} s of its pass, thread {tid}: {n} samples")
        for grp, v in g.most_common():
            print(f"  {100 * v / n:5.1f}%  [{grp}]")
        for sym, v in c.most_common(top):
            print(f"  {100 * v / n:5.1f}%  {sym}")
        if n:
            us = (b - lo) * 1e6 / nops
            per_op[side] = ({s: v / n * us for s, v in c.items()}, {s: v / n * us for s, v in g.items()}, us)
    if len(passes) >= 2 and passes[0][0] in per_op and passes[1][0] in per_op:
        sa, sb = passes[0][0], passes[1][0]
        (ca, ga, ua), (cb, gb, ub) = per_op[sa], per_op[sb]
        print(f"\n{sa} - {sb}: {ua:.1f} - {ub:.1f} us per reg+dereg of this thread's pass; by group, then by symbol:")
        for name in sorted(set(ga) | set(gb), key=lambda x: -abs(ga.get(x, 0) - gb.get(x, 0))):
            print(f"  {ga.get(name, 0) - gb.get(name, 0):+7.2f} {ga.get(name, 0):7.2f} {gb.get(name, 0):7.2f}  [{name}]")
        for name in sorted(set(ca) | set(cb), key=lambda x: -abs(ca.get(x, 0) - cb.get(x, 0)))[:top]:
            print(f"  {ca.get(name, 0) - cb.get(name, 0):+7.2f} {ca.get(name, 0):7.2f} {cb.get(name, 0):7.2f}  {name}")
        if os.environ.get("HOSTPROF_PNG"):
            plot(os.environ["HOSTPROF_PNG"], [(s, per_op[s][1]) for s, *_ in passes if s in per_op])


def plot(path, sides):
    """Stacked bars: each side's time per reg+dereg by group (HOSTPROF_PNG)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    groups = sorted({g for _, gs in sides for g in gs}, key=lambda g: -max(gs.get(g, 0) for _, gs in sides))
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.6 * len(sides)))
    for i, (side, gs) in enumerate(sides):
        left = 0.0
        for k, g in enumerate(groups):
            v = gs.get(g, 0)
            ax.barh(i, v, left=left, color=plt.cm.tab20(k % 20), label=g if i == 0 else None)
            left += v
        ax.text(left + 1, i, f"{left:.0f} us", va="center")
    ax.set_yticks(range(len(sides)), [s for s, _ in sides])
    ax.invert_yaxis()
    ax.set_xlabel("host time of the guest's loop vCPU per 64 KiB reg+dereg (us), by what QEMU ran")
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.35 - 0.05 * len(sides)))
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")


if __name__ == "__main__":
    main()
