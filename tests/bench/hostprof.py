#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""QEMU's own profile, on the host, of a profile-mode run whose passes are
apart (scripts/bench.sh --profile with PROFILE_COUNTERS=1 PROFILE_GAP=S):

  perf record -p $(cat $PEERMEM_CACHE/vm-runs/<run>/qemu.pid) -F 499 -o host.data
  perf script -i host.data -F tid,time,ip,sym,dso > host.script
  hostprof.py host.script PROFILE_TXT [TOP]

The passes are the stretches of samples between idle gaps (under 20
samples per 0.5 s for at least 1.5 s), named in the order of the guest's
"profile SIDE" lines; the boot and setup before the first pass are the
first stretch's head, so each pass is taken as the last W seconds of its
stretch, W = its wall time from the guest (reg+dereg count x ms each).
For each pass, the busiest QEMU thread's samples (the vCPU that ran the
loop), by symbol: translated guest code (perf's JIT map), QEMU's block
lookup (helper_lookup_tb_ptr; qht_lookup_custom when the vCPU's jump
cache misses), its software TLB, its helpers.
"""
import collections
import re
import sys


def main():
    script, prof = sys.argv[1:3]
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 15
    rows = []
    for line in open(script):
        m = re.match(r"\s*(\d+)\s+([\d.]+):\s+([0-9a-f]+)\s+(.*?)\s+\((.*)\)\s*$", line)
        if m:
            sym = re.sub(r"\+0x[0-9a-f]+$", "", m.group(4))
            dso = m.group(5).split("/")[-1]
            if dso.startswith("perf-") and dso.endswith(".map"):
                sym, dso = "(translated guest code)", "JIT"
            rows.append((float(m.group(2)), int(m.group(1)), sym, dso))
    if not rows:
        sys.exit("no samples")
    passes = []
    for line in open(prof):
        m = re.match(r"profile (\S+) \d+ bytes, 1 thread\(s\): (\d+) reg\+dereg each, ([\d.]+) ms", line)
        if m:
            passes.append((m.group(1), int(m.group(2)) * float(m.group(3)) / 1e3))
    rows.sort()
    t0 = rows[0][0]
    buckets = collections.Counter(int((r[0] - t0) * 2) for r in rows)
    last = max(buckets)
    busy = [buckets.get(b, 0) >= 20 for b in range(last + 1)]
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
    for (side, wall), (a, b) in zip(passes, stretches):
        lo = max(a, b - wall)
        sel = [r for r in rows if lo <= r[0] - t0 < b]
        tid = collections.Counter(r[1] for r in sel).most_common(1)[0][0]
        sel = [r for r in sel if r[1] == tid]
        c = collections.Counter((r[2], r[3]) for r in sel)
        n = len(sel)
        print(f"{side}: {b - lo:.1f} s of its pass, thread {tid}: {n} samples")
        for (sym, dso), v in c.most_common(top):
            print(f"  {100 * v / n:5.1f}%  {sym} ({dso})")


if __name__ == "__main__":
    main()
