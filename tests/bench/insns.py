#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Guest instructions per operation, by function, from the QEMU plugin
tests/bench/insncount (scripts/bench.sh --profile with BENCH_PROF_INSNS=1,
PROFILE_COUNTERS=1 and PEERMEM_QEMU_PLUGIN=.../insncount.so,out=DUMPS).

  insns.py DUMPS PROFILE_TXT SYSTEM_MAP [TOP] [A B]

DUMPS: the plugin's file ("dump N" blocks of "vaddr ninsns count");
PROFILE_TXT: the guest's output (its "insns-dump SIDE BYTES N" lines name
the dumps in order, its "ksym SIDE ..." lines the modules' functions);
SYSTEM_MAP: the guest kernel's System.map (the rig kernel has no KASLR).
Prints each side's instructions per operation (every vCPU: the loop's
thread, softirqs, kthreads, the idle loop's few), the median over the
passes, and the functions by their difference A - B (default peermem -
nvidia-peermem). Deterministic: the host's load does not move a count;
what moves it is the guest's own work (RCU batching, timer ticks).
"""
import bisect
import collections
import re
import statistics
import sys


SLOW = ("div", "rdtsc", "rep-string", "pause", "cpuid/msr", "far/syscall/iret")


def load_map(path):
    """The text symbols of a System.map: [(address, name)]."""
    syms = []
    for line in open(path):
        p = line.split()
        if len(p) >= 3 and p[1] in "tTwW":
            syms.append((int(p[0], 16), p[2]))
    return syms


KSYM = re.compile(r"ksym (\S+) ([0-9a-f]+) [tT] (\S+)\s+\[(\S+)\]")


def load_ksyms(prof_path):
    """Each side's modules' text symbols from its "ksym" lines: {side: [(address, "name [module]")]}."""
    mods = collections.defaultdict(list)
    for line in open(prof_path):
        m = KSYM.match(line)
        if m:
            mods[m.group(1)].append((int(m.group(2), 16), m.group(3) + " [" + m.group(4) + "]"))
    return mods


def main():
    dumps_path, prof_path, smap = sys.argv[1:4]
    top = int(sys.argv[4]) if len(sys.argv) > 4 else 40
    side_a, side_b = (sys.argv[5], sys.argv[6]) if len(sys.argv) > 6 else ("peermem", "nvidia-peermem")
    kern = load_map(smap)
    order = []          # (side, n) per dump
    mods = load_ksyms(prof_path)
    for line in open(prof_path):
        m = re.match(r"insns-dump (\S+) (\d+) (\d+)", line)
        if m:
            order.append((m.group(1), int(m.group(3))))
    dumps = []
    vcpus = []          # per dump: [(instructions, blocks) per vCPU], busiest first
    splits = []         # per dump: instructions in user space, the kernel's text, modules
    cur = None
    for line in open(dumps_path):
        if line.startswith("dump"):
            cur = []
            vcpus.append([])
            splits.append([0, 0, 0])
        elif line.startswith("end"):
            dumps.append(cur)
            vcpus[-1].sort(reverse=True)
            cur = None
        elif cur is not None:
            if line.startswith("split "):
                f = line.split()
                for k in range(3):
                    splits[-1][k] += int(f[2 + k])
                continue
            if line.startswith("vcpu "):
                f = line.split()
                vcpus[-1].append((int(f[2]), int(f[3])))
                continue
            if line.startswith(("io ", "mem ", "slow ", "tr ", "jc ")):  # jc: an older plugin's totals
                continue
            f = line.split()
            cur.append((int(f[0], 16), int(f[1]), int(f[2]), int(f[3]) if len(f) > 3 else 0,
                        int(f[4]) if len(f) > 4 else 0,
                        tuple(int(x) for x in f[5].split(",")) if len(f) > 5 else (0,) * 6,
                        int(f[6]) if len(f) > 6 else 0,
                        int(f[7]) if len(f) > 7 else 0, int(f[8]) if len(f) > 8 else 0))
    if len(dumps) != len(order):
        sys.exit(f"{len(dumps)} dumps, {len(order)} insns-dump lines: not the same run?")
    per_side = collections.defaultdict(list)   # side -> [Counter(sym -> insns/op)]
    extra = collections.defaultdict(list)      # side -> [(blocks run/op, atomic insns/op)]
    groups = collections.defaultdict(list)     # side -> [Counter((module, insns|blocks) -> per op)]
    slows = collections.defaultdict(list)      # side -> [[per class, per op]]
    slow_by = collections.defaultdict(list)
    for (side, nops), blocks in zip(order, dumps):
        syms = sorted(kern + mods[side])
        keys = [a for a, _ in syms]
        cnt = collections.Counter()
        for a, n, c, *_ in blocks:
            if a < 0xffff800000000000:
                cnt["(user space)"] += n * c / nops
                continue
            i = bisect.bisect_right(keys, a) - 1
            cnt[syms[i][1] if i >= 0 else "?"] += n * c / nops
        per_side[side].append(cnt)
        grp = collections.Counter()
        for b in blocks:
            a, n, c = b[0], b[1], b[2]
            if a < 0xffff800000000000:
                g = "user space"
            else:
                i = bisect.bisect_right(keys, a) - 1
                name = syms[i][1] if i >= 0 else "?"
                g = name[name.rindex("[") + 1:-1] if name.endswith("]") else (
                    "kernel: spinning (queued_spin_lock_slowpath)"
                    if name == "queued_spin_lock_slowpath" else "kernel: the rest")
            grp[(g, "insns")] += n * c / nops
            grp[(g, "blocks")] += c / nops
            grp[(g, "distinct")] += 1
            grp[(g, "jc_lookups")] += b[7] / nops
            grp[(g, "jc_misses")] += b[8] / nops
        groups[side].append(grp)
        blocks_run = sum(b[2] for b in blocks) / nops
        locked = sum(b[2] * b[3] for b in blocks) / nops
        flushes = sum(b[2] * b[4] for b in blocks) / nops
        exits = [0.0] * 4
        for b in blocks:
            exits[b[6]] += b[2] / nops
        extra[side].append((blocks_run, locked, flushes, exits))
        slow = [0.0] * 6
        for b in blocks:
            for k in range(6):
                slow[k] += b[2] * b[5][k] / nops
                if b[5][k] and k in (0, 1, 4, 5):
                    i = bisect.bisect_right(keys, b[0]) - 1
                    who = syms[i][1] if b[0] >= 0xffff800000000000 and i >= 0 else "(user space)"
                    slow_by[(side, SLOW[k], who)].append(b[2] * b[5][k] / nops)
        slows[side].append(slow)
    med = {}
    # fast=1 dumps have no per-block lines: only the per-vCPU sections.
    blocks_seen = any(dumps)
    for side, lst in (per_side.items() if blocks_seen else ()):
        names = set().union(*lst)
        med[side] = {s: statistics.median([c.get(s, 0) for c in lst]) for s in names}
        tots = [sum(c.values()) for c in lst]
        print(f"{side}: {statistics.median(tots):.0f} guest instructions per operation "
              f"(passes: {', '.join(f'{t:.0f}' for t in tots)}); blocks run per operation "
              f"{statistics.median([e[0] for e in extra[side]]):.0f}, atomic (lock-prefixed) "
              f"instructions {statistics.median([e[1] for e in extra[side]]):.0f}, TLB-flushing "
              f"(CR3 write, INVLPG, INVPCID) {statistics.median([e[2] for e in extra[side]]):.2f}; "
              f"blocks ending in a return {statistics.median([e[3][1] for e in extra[side]]):.0f}, "
              f"an indirect call or jump {statistics.median([e[3][2] for e in extra[side]]):.0f}, "
              f"popf/sti/stac/clac {statistics.median([e[3][3] for e in extra[side]]):.0f}")
    by_cpu = collections.defaultdict(list)
    for (side, nops), v in zip(order, vcpus):
        if v:
            by_cpu[side].append([(i / nops, b / nops) for i, b in v])
    if by_cpu:
        print("\nby vCPU, busiest first (the one that ran the loop), instructions / blocks per operation:")
        for side, lst in by_cpu.items():
            print(f"  {side}: " + "; ".join(
                " + ".join(f"{i:.0f} / {b:.0f}" for i, b in p) for p in lst))
    by_split = collections.defaultdict(list)
    for (side, nops), sp in zip(order, splits):
        if any(sp):
            by_split[side].append([x / nops for x in sp])
    if by_split:
        print("\ninstructions per operation by where they ran, all vCPUs (user space + the kernel's text "
              "+ modules), per pass:")
        for side, lst in by_split.items():
            print(f"  {side}: " + "; ".join(f"{sum(sp):.0f} ({sp[0]:.0f} + {sp[1]:.0f} + {sp[2]:.0f})"
                                            for sp in lst))
    by_jc = collections.defaultdict(list)
    for (side, nops), blocks in zip(order, dumps):
        lk, ms = sum(b[7] for b in blocks), sum(b[8] for b in blocks)
        if lk:
            by_jc[side].append((lk / nops, ms / nops))
    if by_jc:
        print("\nQEMU's jump cache, modelled (4096 entries per vCPU): lookups / misses per operation, per pass:")
        for side, lst in by_jc.items():
            print(f"  {side}: " + "; ".join(f"{lk:.0f} / {ms:.0f}" for lk, ms in lst))
    if not blocks_seen:
        return
    if any(any(x for x in v) for l in slows.values() for v in l):
        print("\ninstructions TCG runs through a helper or a loop, per operation (median over the passes):")
        for side, lst in slows.items():
            print(f"  {side}: " + ", ".join(
                f"{SLOW[k]} {statistics.median([v[k] for v in lst]):.1f}" for k in range(6)))
        for (side, cls, who), v in sorted(slow_by.items()):
            if sum(v) / len(per_side[side]) >= 0.5:
                print(f"    {side} {cls}: {sum(v) / len(per_side[side]):.1f} in {who}")
    print("\nby module (median over the passes): instructions / blocks run, per operation")
    for side, lst in groups.items():
        names = sorted({g for c in lst for g, _ in c})
        print(f"  {side}: " + "; ".join(
            f"{g} {statistics.median([c.get((g, 'insns'), 0) for c in lst]):.0f} / "
            f"{statistics.median([c.get((g, 'blocks'), 0) for c in lst]):.0f}" for g in names))
    if any(c.get((g, "jc_lookups"), 0) for lst in groups.values() for c in lst for g, _ in c):
        print("\nby module (median over the passes): distinct blocks per pass; jump-cache lookups / misses "
              "per operation (the model's)")
        for side, lst in groups.items():
            names = sorted({g for c in lst for g, _ in c})
            print(f"  {side}: " + "; ".join(
                f"{g} {statistics.median([c.get((g, 'distinct'), 0) for c in lst]):.0f}; "
                f"{statistics.median([c.get((g, 'jc_lookups'), 0) for c in lst]):.0f} / "
                f"{statistics.median([c.get((g, 'jc_misses'), 0) for c in lst]):.0f}" for g in names))
    if side_a in med and side_b in med:
        a, b = med[side_a], med[side_b]
        ta, tb = sum(a.values()), sum(b.values())
        print(f"\n{side_a} - {side_b}: {ta - tb:+.0f} instructions per operation "
              f"({ta / tb:.3f}x); by function (median over the passes), largest first:")
        names = set(a) | set(b)
        diff = sorted(names, key=lambda s: -abs(a.get(s, 0) - b.get(s, 0)))
        print(f"  {'diff':>8} {side_a:>10} {side_b:>10}  function")
        for s in diff[:top]:
            print(f"  {a.get(s, 0) - b.get(s, 0):+8.0f} {a.get(s, 0):10.0f} {b.get(s, 0):10.0f}  {s}")


if __name__ == "__main__":
    main()
