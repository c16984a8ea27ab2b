#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Turn the output of bench_peermem and bench_pfnmap (one guest output,
the two programs one after the other) into bench-results.json, tables and
plots.

    report.py results --raw GUEST_OUTPUT [--raw ...] --json OUT.json [--meta KEY=VALUE]...
                                         (several --raw: runs of the same benchmark, pooled)
    report.py table JSON                 the tables of one run (stdout)
    report.py plot JSON PNG              latency vs size, log-log (matplotlib)
    report.py plot-pfn JSON PNG          bench_pfnmap's times, per part (matplotlib)
    report.py distortion PLAIN DEBUG     the debug kernel's ratios beside the plain one's
    report.py compare BEFORE AFTER [FIGS] peermem before and after a change (two runs):
                                         medians, after/before, nvidia-peermem's
                                         after/before, pm/nv and pm/floor of each
                                         (FIGS: figure names, comma-separated)
    report.py bar1 TXT                   bench_bar1's capacity and pin counts
                                         (tests/bench/bar1-capacity.sh), as tables
    report.py plot-bar1 TXT PNG          the capacity, plotted (matplotlib)
    report.py memdetail GUEST_OUTPUT     bench_peermem --memory-detail's breakdown
                                         of the memory figures by counter (Markdown)
    report.py pincost JSON               the pin-cost figures: reg+dereg under each model, first
                                         registration (miss) and again (hit), pins, goals
    report.py plot-pincost JSON PNG      the same, plotted (matplotlib)
    report.py scaling JSON               the scaling figures' table (--only scaling)
    report.py plot-scaling JSON PNG      the same, plotted (matplotlib)
    report.py ratios JSON...             reg+dereg pm/nv per size, of the medians and
                                         per round (median, p25-p75), run by run
    report.py profops PROFILE [PM_US NV_US]  the clients' operations and the calls
                                         that differ: inclusive shares of ib_uverbs_ioctl
                                         per side (median of the passes); in us with the
                                         bench's reg+dereg medians
    report.py profdiff PROFILE [N] [--self]  a --profile --callgraph run of
                                         registrations: each symbol's CPU time per
                                         reg+dereg (us, both vCPUs, inclusive; --self:
                                         its own samples), peermem's minus
                                         nvidia-peermem's, the N (default 40) largest
                                         differences; median of the passes (PROFILE_CHUNKS)

scripts/bench.sh runs all of them. Only the standard library is needed but
for the plot, which needs matplotlib (Debian's python3-matplotlib).
"""
import json
import math
import re
import sys

SIDES = ["peermem", "nvidia-peermem", "floor"]
SIZES = ["64K", "2M", "64M"]  # and the large size, from the run's info

# (figure, param or None for every param, label, unit, better)
#   unit: "s" (shown in us/ms), "count", "bytes", "x" (a ratio)
#   better: "low" or "high" (for the reader; ratios are side / other side)
FIGURES = [
    ("regdereg_s", "SIZES", "ibv_reg_mr + ibv_dereg_mr {p}", "s", "low"),
    ("reg_s", "2M", "ibv_reg_mr alone 2 MiB", "s", "low"),
    ("dereg_s", "2M", "ibv_dereg_mr alone 2 MiB", "s", "low"),
    ("core_reg_s", "2M", "  core + client only (umem_test), reg 2 MiB", "s", "low"),
    ("core_dereg_s", "2M", "  core + client only (umem_test), dereg 2 MiB", "s", "low"),
    ("gpu_pins_per_reg", "2M", "GPU pins (get_pages calls) per registration", "count", "low"),
    ("gpu_persistent_pins_per_reg", "2M", "  GPU persistent pins (get_pages_persistent calls) per registration", "count", "low"),
    ("gpu_all_pins_per_reg", "2M", "  GPU pins of both kinds per registration", "count", "low"),
    ("gpu_pages_pinned_per_reg", "2M", "GPU pages pinned per 2 MiB registration", "count", "low"),
    ("gpu_pages_dma_mapped_per_reg", "2M", "GPU pages DMA-mapped per 2 MiB registration", "count", "low"),
    ("free_revoke_s", "1", "GPU free -> MR revoked, 1 live MR", "s", "low"),
    ("free_revoke_s", "64", "GPU free -> MR revoked, 64 live MRs", "s", "low"),
    ("free_ioctl_s", "1", "  of which GPUSIM_IOC_FREE itself, 1 MR", "s", "low"),
    ("free_ioctl_s", "64", "  of which GPUSIM_IOC_FREE itself, 64 MRs", "s", "low"),
    ("free_unpinned_s", "1", "GPU free -> every pin put, 1 live MR", "s", "low"),
    ("free_unpinned_s", "64", "GPU free -> every pin put, 64 live MRs", "s", "low"),
    ("munmap_revoke_s", "1", "munmap -> MR revoked", "s", "low"),
    ("free_events_closed_s", "64", "GPUSIM_IOC_FREE, 64 MRs, /dev/peermem closed", "s", "low"),
    ("free_events_open_s", "64", "GPUSIM_IOC_FREE, 64 MRs, /dev/peermem open", "s", "low"),
    ("thr1_ops_per_s", "2M", "registrations/s, 1 thread (2 MiB reg+dereg)", "count", "high"),
    ("thr2_over_thr1", "2M", "2 threads / 1 thread throughput", "x", "high"),
    ("kmem_per_reg_bytes", "2M", "kernel memory per live registration 2 MiB", "bytes", "low"),
    ("kmem_per_reg_bytes", "LARGE", "kernel memory per live registration {p}", "bytes", "low"),
    ("slab_per_reg_bytes", "2M", "  of which slab, 2 MiB", "bytes", "low"),
    ("slab_per_reg_bytes", "LARGE", "  of which slab, {p}", "bytes", "low"),
    ("core_kmem_per_reg_bytes", "2M", "  core + client only (umem_test), 2 MiB", "bytes", "low"),
    ("core_kmem_per_reg_bytes", "LARGE", "  core + client only (umem_test), {p}", "bytes", "low"),
    ("sg_entries_per_gib", "contig", "scatter entries per GiB, 4 MiB-contiguous", "count", "low"),
    ("sg_entries_per_gib", "64K", "scatter entries per GiB, 64 KiB-fragmented", "count", "low"),
    ("source_dma_runs_per_gib", "contig", "  bus-contiguous runs handed out per GiB, 4 MiB-contiguous", "count", "low"),
    ("source_dma_runs_per_gib", "64K", "  bus-contiguous runs handed out per GiB, 64 KiB-fragmented", "count", "low"),
    ("source_phys_runs_per_gib", "contig", "  physically contiguous runs per GiB, 4 MiB-contiguous", "count", "low"),
    ("source_phys_runs_per_gib", "64K", "  physically contiguous runs per GiB, 64 KiB-fragmented", "count", "low"),
]

# bench_pfnmap (docs/benchmarks.md, "PFN-mapped memory"): 16 MiB out of a
# PFN-mapped ring, straight (peermem's PFN-map source) or through a staging
# copy. (figure, side, label); the size is the run's (info pfn_bytes).
# (figure, side, label, short label for the plot)
PFN_ROWS = [
    ("pfn_send_s", "direct", "RDMA WRITE straight from the PFN-mapped ring (peermem pfnmap=1)",
     "direct: WRITE from the ring"),
    ("pfn_send_s", "staged", "memcpy into a registered staging buffer + RDMA WRITE",
     "staged: memcpy + WRITE"),
    ("pfn_memcpy_s", "staged", "  of which the memcpy", "staged: the memcpy"),
    ("pfn_stage_write_s", "staged", "  of which the RDMA WRITE from the staging buffer",
     "staged: the WRITE"),
]


RUN_ROUNDS = 100000  # round numbers of run k start at k * RUN_ROUNDS
SAMPLE_COLUMNS = ["figure", "param", "side", "round", "run", "value"]


def load_doc(f):
    """A bench-results.json; its samples as dicts whether stored as a list
    of dicts (older files) or as columns and rows (dump_doc)."""
    doc = json.load(f)
    smp = doc.get("samples")
    if isinstance(smp, dict) and "columns" in smp:
        cols, names = smp["columns"], smp.get("names", {})
        doc["samples"] = [{c: (names[c][v] if c in names else v) for c, v in zip(cols, r)}
                          for r in smp["rows"]]
    return doc


def dump_doc(doc, f):
    """Writes doc with its samples as rows of columns (figure, param and
    side by index into their names), values to 4 significant digits: a
    quarter of the size of one dict per sample."""
    out = dict(doc)
    # figure, param and side as indexes into their lists of names.
    names = {c: sorted({s[c] for s in doc["samples"]}) for c in ("figure", "param", "side")}
    index = {c: {n: i for i, n in enumerate(v)} for c, v in names.items()}

    def cell(s, c):
        if c in index:
            return index[c][s[c]]
        return float("%.4g" % s["value"]) if c == "value" else s.get(c)
    out["samples"] = {"columns": SAMPLE_COLUMNS, "names": names,
                      "rows": [[cell(s, c) for c in SAMPLE_COLUMNS] for s in doc["samples"]]}
    json.dump(out, f, separators=(",", ":"))
    f.write("\n")


def pct(v, q):
    v = sorted(v)
    if not v:
        return float("nan")
    k = (len(v) - 1) * q
    f = math.floor(k)
    c = math.ceil(k)
    return v[f] + (v[c] - v[f]) * (k - f)


def stats(v):
    v = [x for x in v if x is not None and not math.isnan(x)]
    if not v:
        return None
    return {"n": len(v), "median": pct(v, 0.5), "p25": pct(v, 0.25), "p75": pct(v, 0.75),
            "min": min(v), "max": max(v)}


def size_label(p):
    if p.endswith("M") and int(p[:-1]) >= 1024 and int(p[:-1]) % 1024 == 0:
        return "%d GiB" % (int(p[:-1]) // 1024)
    return p.replace("K", " KiB").replace("M", " MiB")


def size_bytes(p):
    return int(p[:-1]) * (1024 if p.endswith("K") else 1024 * 1024)


def large_param(doc):
    # A run without bench_peermem's output (bench_pfnmap's alone) has no
    # large size: its rows stay empty.
    return "%dM" % (int(doc["guest"].get("large_bytes", 512 << 20)) // (1024 * 1024))


def sizes(doc):
    """The latency sizes of a run: SIZES and the large size, once each."""
    large = large_param(doc)
    return SIZES + ([large] if large not in SIZES else [])


def rows(doc):
    """Every (figure, param, label, unit, better) of the table, in order."""
    large = large_param(doc)
    out = []
    for fig, param, label, unit, better in FIGURES:
        params = sizes(doc) if param == "SIZES" else [large if param == "LARGE" else param]
        for p in params:
            out.append((fig, p, label.format(p=size_label(p)), unit, better))
    return out


def summarize(doc):
    by = {}
    for s in doc["samples"]:
        by.setdefault((s["figure"], s["param"]), {}).setdefault(s["side"], []).append(s["value"])
    summ = {}
    for (fig, p), sides in by.items():
        e = {side: stats(v) for side, v in sides.items()}
        summ["%s/%s" % (fig, p)] = e
    # Kernel memory attributable to the client, core and RDMA driver: the
    # side's per-registration memory minus the floor's (the source's own).
    for key in list(summ):
        for pre in ("kmem_per_reg_bytes/", "core_kmem_per_reg_bytes/"):
            fkey = "kmem_per_reg_bytes/" + key.split("/", 1)[1]
            if not key.startswith(pre) or "floor" not in summ.get(fkey, {}):
                continue
            fl = summ[fkey]["floor"]["median"]
            att = {}
            for side in ("peermem", "nvidia-peermem"):
                if side in summ[key]:
                    att[side] = {"median": summ[key][side]["median"] - fl}
            summ[key.replace("kmem_per_reg_bytes", "kmem_above_floor_bytes")] = att
    return summ


def ratio(summ, key, a, b):
    e = summ.get(key, {})
    if not e.get(a) or not e.get(b):
        return None
    x, y = e[a]["median"], e[b]["median"]
    if y == 0:
        return None
    return x / y


def events_ratio(summ):
    """peermem's GPU free under 64 MRs with the event channel open over closed."""
    o = (summ.get("free_events_open_s/64", {}).get("peermem") or {}).get("median")
    c = (summ.get("free_events_closed_s/64", {}).get("peermem") or {}).get("median")
    return o / c if o and c else None


def goals(doc):
    summ = doc["summary"]
    large = large_param(doc)
    g = []

    def add(name, values, target, cmp, note=""):
        vals = {k: v for k, v in values.items() if v is not None}
        met = bool(vals) and all((v <= target) if cmp == "<=" else (v >= target) if cmp == ">=" else (v == target)
                                 for v in vals.values())
        g.append({"goal": name, "target": "%s %s" % (cmp, target), "values": vals,
                  "met": met, "note": note})

    regs = {p: ratio(summ, "regdereg_s/" + p, "peermem", "nvidia-peermem") for p in ("2M", "64M", large)}
    add("registration (reg+dereg) <= 0.55x nvidia-peermem at 2 MiB and above", regs, 0.55, "<=")
    fl = {p: ratio(summ, "regdereg_s/" + p, "peermem", "floor") for p in ("2M", "64M", large)}
    add("registration (reg+dereg) <= 1.10x the floor at 2 MiB and above", fl, 1.10, "<=")
    fr = {n: ratio(summ, "free_revoke_s/" + n, "peermem", "nvidia-peermem") for n in ("1", "64")}
    add("GPU free -> revoked <= 1.0x nvidia-peermem", fr, 1.0, "<=")
    ev = {"64": events_ratio(summ)}
    add("revocation events: GPU free under 64 MRs with /dev/peermem open <= 1.05x closed (same run)",
        ev, 1.05, "<=")
    th = {"peermem": (summ.get("thr2_over_thr1/2M", {}).get("peermem") or {}).get("median")}
    add("2-thread throughput >= 1.8x one thread", th, 1.8, ">=")
    # Attributable to the client: what the core and the client hold for a
    # umem (the umem_test hook, no rxe MR), less what the source itself
    # holds for the same pin and mapping (the floor). The whole MR's
    # figures (rxe's own per-page arrays included) are a note.
    mem, note = {}, []
    for p in ("2M", large):
        for pre, into in (("core_kmem_above_floor_bytes/", mem), ("kmem_above_floor_bytes/", None)):
            a = summ.get(pre + p, {})
            if "peermem" in a and "nvidia-peermem" in a and a["nvidia-peermem"]["median"] > 0:
                r = a["peermem"]["median"] / a["nvidia-peermem"]["median"]
                if into is None:
                    note.append("whole MR with rxe %s: %.2f" % (p, r))
                else:
                    into[p] = r
    add("kernel memory per registration attributable to the client (core + client above the floor) "
        "<= 1/4 of nvidia-peermem's", mem, 0.25, "<=", "; ".join(note))
    sg = {}
    for w in ("contig", "64K"):
        e = summ.get("sg_entries_per_gib/" + w, {}).get("peermem")
        runs = summ.get("source_dma_runs_per_gib/" + w, {}).get("peermem")
        if e and runs and runs["median"]:
            # Per round: the entries of a registration over the runs of the
            # mapping that very registration was given (the worst round).
            per = {}
            for smp in doc["samples"]:
                if smp["side"] == "peermem" and smp["param"] == w and smp["figure"] in (
                        "sg_entries_per_gib", "source_dma_runs_per_gib"):
                    per.setdefault(smp["round"], {})[smp["figure"]] = smp["value"]
            rs = [v["sg_entries_per_gib"] / v["source_dma_runs_per_gib"] for v in per.values()
                  if v.get("source_dma_runs_per_gib")]
            sg[w] = max(rs, key=lambda x: abs(x - 1.0)) if rs else e["median"] / runs["median"]
    add("scatter entries = the bus-contiguous runs the source hands out (peermem entries / runs, worst round)",
        sg, 1.0, "==")
    g += pin_goals(doc)
    return g


def pin_goals(doc):
    """The pin-cost figures' goals (fig_pincost): against the run's
    nvidia-peermem (its version and mode in nv_client), a first
    registration of a range (miss) and the same range again (hit) apart."""
    summ = doc["summary"]
    if not any(k.startswith("pincost_") for k in summ):
        return []
    nv = doc.get("nv_client") or "nvidia-peermem"
    pages, calls, time = {}, {}, {}
    for kind in ("miss", "hit"):
        for p in sizes(doc):
            c = ratio(summ, "pins_%s_calls/%s" % (kind, p), "peermem", "nvidia-peermem")
            if c is not None:
                calls["%s %s" % (kind, p)] = c
            if size_bytes(p) >= 2 << 20:
                pages["%s %s" % (kind, p)] = ratio(summ, "pins_%s_pages/%s" % (kind, p),
                                                   "peermem", "nvidia-peermem")
    for size, call, page, prm in pincost_params(doc):
        for kind, fig in (("miss", "pincost_miss_s"), ("hit", "pincost_s")):
            time["%s %s@%dus" % (kind, size, call)] = ratio(summ, "%s/%s" % (fig, prm),
                                                            "peermem", "nvidia-peermem")
    out = []
    for name, vals, target in (
            ("GPU pages pinned per registration (all pins) <= 0.55x %s's at 2 MiB and up, "
             "first registration of a range (miss) and the same range again (hit)" % nv, pages, 0.55),
            ("pin calls per registration <= %s's (miss and hit)" % nv, calls, 1.0),
            ("reg+dereg <= 1.0x %s at every size under each pin-cost model (miss and hit)" % nv,
             time, 1.0)):
        v = {k: x for k, x in vals.items() if x is not None}
        out.append({"goal": name, "target": "<= %s" % target, "values": v,
                    "met": bool(v) and all(x <= target for x in v.values()), "note": ""})
    return out


def pfn_param(doc):
    b = doc["guest"].get("pfn_bytes")
    return "%dM" % (int(b) // (1024 * 1024)) if b else None


def pfn_summary(doc):
    """bench_pfnmap's figures: the ratio of the medians staged / direct (as
    the other ratios), and the spread of the same ratio taken round by round
    (the two paths of a round ran back to back)."""
    p = pfn_param(doc)
    if p is None:
        return None
    summ = doc["summary"]
    key = "pfn_send_s/" + p
    per = {}
    for smp in doc["samples"]:
        if smp["figure"] == "pfn_send_s" and smp["param"] == p:
            per.setdefault(smp["round"], {})[smp["side"]] = smp["value"]
    rr = [v["staged"] / v["direct"] for v in per.values() if v.get("direct") and "staged" in v]
    w = (summ.get("pfn_stage_write_s/" + p, {}).get("staged") or {}).get("median")
    d = (summ.get(key, {}).get("direct") or {}).get("median")
    return {"bytes": int(doc["guest"]["pfn_bytes"]), "param": p,
            "rounds": int(doc["guest"].get("pfn_rounds", 0)),
            "sg_entries": doc["guest"].get("pfn_sg_entries"),
            "staged_over_direct": ratio(summ, key, "staged", "direct"),
            "staged_over_direct_per_round": stats(rr),
            "stage_write_over_direct": w / d if w and d else None}


def pfn_text(doc, markdown=False):
    pfn = doc.get("pfnmap")
    if not pfn:
        return ""
    summ, p, n = doc["summary"], pfn["param"], pfn["bytes"]
    head = ["PFN-mapped memory, %s by RDMA WRITE (bench_pfnmap)" % size_label(p), "median", "MB/s"]
    lines = []
    for fig, side, label, _ in PFN_ROWS:
        e = summ.get("%s/%s" % (fig, p), {}).get(side)
        mbs = "%.1f" % (n / e["median"] / 1e6) if e and e["median"] else "-"
        lines.append([label, cell(e, "s"), mbs])
    rr = pfn["staged_over_direct_per_round"]
    notes = ["staged / direct: %s (ratio of the medians; round by round p25-p75 %s-%s, %d rounds)"
             % (rfmt(pfn["staged_over_direct"]), rfmt(rr and rr["p25"]), rfmt(rr and rr["p75"]),
                rr["n"] if rr else 0),
             "RDMA WRITE from the staging buffer / from the PFN-mapped ring: %s"
             % rfmt(pfn["stage_write_over_direct"]),
             "scatter entries of the ring's MR (peermem): %s" % (pfn.get("sg_entries") or "-")]
    out = grid(head, lines, markdown)
    if markdown:
        return "\n".join(out + [""] + ["- " + x for x in notes])
    return "\n".join(out + notes)


def grid(head, lines, markdown):
    """A table's lines: markdown (first column stripped of its indent), or
    text with the first column left-aligned, the others right-aligned, and a
    rule under the head."""
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        return out + ["| " + " | ".join(c.strip() if i == 0 else c for i, c in enumerate(l)) + " |"
                      for l in lines]
    w = [max(len(r[i]) for r in [head] + lines) for i in range(len(head))]
    out = ["  ".join(h.ljust(w[i]) if i == 0 else h.rjust(w[i]) for i, h in enumerate(head))]
    out.append("  ".join("-" * x for x in w))
    for l in lines:
        out.append("  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(l)))
    return out


def has_peer_figures(doc):
    names = {f[0] for f in FIGURES}
    return any(s["figure"] in names for s in doc["samples"])


def fmt_val(v, unit):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if unit == "s":
        if v < 1e-3:
            return "%.0f us" % (v * 1e6)
        if v < 1:
            return "%.2f ms" % (v * 1e3)
        return "%.2f s" % v
    if unit == "bytes":
        if abs(v) >= 1 << 20:
            return "%.2f MiB" % (v / (1 << 20))
        if abs(v) >= 1024:
            return "%.1f KiB" % (v / 1024)
        return "%.0f B" % v
    if unit == "x":
        return "%.2fx" % v
    if abs(v - round(v)) < 1e-9:
        return "%d" % round(v)
    return "%.2f" % v


def cell(e, unit):
    if not e:
        return "-"
    m = e["median"]
    if "p25" not in e:
        return fmt_val(m, unit)
    spread = ""
    if m and e["n"] > 1 and e["p75"] != e["p25"]:
        spread = " ±%.0f%%" % (50 * (e["p75"] - e["p25"]) / abs(m))
    return fmt_val(m, unit) + spread


def rfmt(r):
    return "-" if r is None else "%.2f" % r


def table(doc, markdown=False):
    summ = doc["summary"]
    head = ["figure", "peermem", "nvidia-peermem", "floor", "pm/nv", "pm/floor", "nv/floor"]
    lines = []
    for fig, p, label, unit, better in rows(doc):
        key = "%s/%s" % (fig, p)
        e = summ.get(key, {})
        if not e:
            continue
        lines.append([label] + [cell(e.get(s), unit) for s in SIDES] +
                     [rfmt(ratio(summ, key, "peermem", "nvidia-peermem")),
                      rfmt(ratio(summ, key, "peermem", "floor")),
                      rfmt(ratio(summ, key, "nvidia-peermem", "floor"))])
        if fig in ("kmem_per_reg_bytes", "core_kmem_per_reg_bytes"):
            a = summ.get(key.replace("kmem_per_reg_bytes", "kmem_above_floor_bytes"), {})
            pm = a.get("peermem", {}).get("median")
            nv = a.get("nvidia-peermem", {}).get("median")
            lines.append(["  above the floor (client + core" + (" + rxe)" if fig[0] == "k" else ")"),
                          fmt_val(pm, "bytes"),
                          fmt_val(nv, "bytes"), "-",
                          rfmt(pm / nv if pm is not None and nv else None), "-", "-"])
    return "\n".join(grid(head, lines, markdown))


def reference_text(doc, markdown=False):
    summ = doc["summary"]
    out = []
    h = {f: (summ.get(f + "/2M", {}).get("host")) for f in ("regdereg_s", "reg_s", "dereg_s")}
    if h["regdereg_s"]:
        out.append("reference: ibv_reg_mr + ibv_dereg_mr of 2 MiB host memory (rxe and uverbs, no peer client): "
                   "%s (reg %s, dereg %s)" % (cell(h["regdereg_s"], "s"), cell(h["reg_s"], "s"),
                                             cell(h["dereg_s"], "s")))
    t = summ.get("thr2_over_thr1/2M", {}).get("host")
    if t:
        out.append("reference: 2 threads / 1 thread throughput of 2 MiB host-memory registrations: %s"
                   % cell(t, "x"))
    if doc["guest"].get("dma_peer"):
        out.append("DMA device: %s" % doc["guest"]["dma_peer"])
    return "\n".join(("- " + l) if markdown else l for l in out)


def goals_text(doc, markdown=False):
    out = []
    for g in doc["goals"]:
        vals = ", ".join("%s %.2f" % (k, v) for k, v in g["values"].items()) or "not measured"
        verdict = "met" if g["met"] else "MISSED"
        if g.get("note"):
            vals += "; " + g["note"]
        out.append(("- **%s**: %s (%s)" if markdown else "goal %s: %s (%s)") % (verdict, g["goal"], vals))
    for f in doc.get("facts", []):
        out.append(("- %s" if markdown else "fact: %s") % f)
    return "\n".join(out)


def cmd_results(argv):
    raws, out = [], None
    meta = {}
    i = 0
    while i < len(argv):
        if argv[i] == "--raw":
            raws.append(argv[i + 1])
            i += 2
        elif argv[i] == "--json":
            out = argv[i + 1]
            i += 2
        elif argv[i] == "--meta":
            k, _, v = argv[i + 1].partition("=")
            meta[k] = v
            i += 2
        else:
            sys.exit("report.py results: unknown argument %s" % argv[i])
    samples, guest, facts = [], {}, []
    # Several --raw: runs of the same benchmark (separate boots); a sample
    # keeps its run, and its round is numbered apart from the other runs'
    # (RUN_ROUNDS apart), so per-round ratios never mix two runs.
    for run, raw in enumerate(raws):
        with open(raw) as f:
            for line in f:
                w = line.split()
                if len(w) == 6 and w[0] == "sample":
                    samples.append({"figure": w[1], "param": w[2], "side": w[3],
                                    "round": run * RUN_ROUNDS + int(w[4]), "run": run,
                                    "value": float(w[5])})
                elif len(w) >= 2 and w[0] == "info":
                    if w[1] == "munmap_revoke":
                        facts.append("munmap -> revoked, %s: %s" % (w[2], " ".join(w[3:])))
                    else:
                        guest[w[1]] = " ".join(w[2:])
    if not samples:
        sys.exit("report.py: no samples in %s" % " ".join(raws))
    meta["runs"] = str(len(raws))
    doc = {"schema": 1, "what": "scripts/bench.sh: peermem vs nvidia-peermem vs the floor; "
           "PFN-mapped memory direct vs staged (docs/benchmarks.md)"}
    doc.update(meta)
    doc["guest"] = guest
    doc["sides"] = SIDES
    doc["facts"] = facts
    doc["samples"] = samples
    doc["summary"] = summarize(doc)
    doc["goals"] = goals(doc)
    pfn = pfn_summary(doc)
    if pfn:
        doc["pfnmap"] = pfn
    with open(out, "w") as f:
        dump_doc(doc, f)


def cmd_plot(path, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(path) as f:
        doc = load_doc(f)
    summ = doc["summary"]
    params = sizes(doc)
    fig, ax = plt.subplots(figsize=(7, 4.8))
    style = {"peermem": ("o-", "C0"), "nvidia-peermem": ("s-", "C1"), "floor": ("^--", "C2")}
    for side in SIDES:
        xs, ys, lo, hi = [], [], [], []
        for p in params:
            e = summ.get("regdereg_s/" + p, {}).get(side)
            if not e:
                continue
            xs.append(size_bytes(p))
            ys.append(e["median"])
            lo.append(e["median"] - e["p25"])
            hi.append(e["p75"] - e["median"])
        if xs:
            label = side + (" (get_pages + dma_map_pages, undone)" if side == "floor" else "")
            ax.errorbar(xs, ys, yerr=[lo, hi], fmt=style[side][0], color=style[side][1],
                        capsize=3, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks([size_bytes(p) for p in params])
    ax.set_xticklabels([size_label(p) for p in params])
    ax.set_xlabel("registered GPU memory")
    ax.set_ylabel("ibv_reg_mr + ibv_dereg_mr (s, median, bars: p25-p75)")
    k = doc.get("kernel_variant", "?")
    ax.set_title("Registration latency in the rig (%s kernel, QEMU %s, %s rounds)"
                 % (k, doc.get("accel", "?"), doc.get("rounds", "?")), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.text(0.01, 0.01, "%s  commit %s" % (doc.get("date", ""), doc.get("commit", "")[:12]),
             fontsize=7, alpha=0.6)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def cmd_plot_pfn(path, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(path) as f:
        doc = load_doc(f)
    pfn = doc.get("pfnmap")
    if not pfn:
        sys.exit("report.py plot-pfn: %s has no bench_pfnmap figures" % path)
    p = pfn["param"]
    fig, ax = plt.subplots(figsize=(7, 3.4))
    labels = []
    for i, (name, side, _, label) in enumerate(PFN_ROWS):
        vals = [s["value"] for s in doc["samples"]
                if s["figure"] == name and s["param"] == p and s["side"] == side]
        e = doc["summary"].get("%s/%s" % (name, p), {}).get(side)
        y = len(PFN_ROWS) - 1 - i
        labels.append((y, label.strip()))
        if not e:
            continue
        color = "C0" if side == "direct" else "C1" if name == "pfn_send_s" else "C7"
        ax.barh(y, e["median"], color=color, alpha=0.6)
        ax.errorbar([e["median"]], [y], xerr=[[e["median"] - e["p25"]], [e["p75"] - e["median"]]],
                    fmt="none", ecolor="k", capsize=4)
        ax.plot(vals, [y] * len(vals), "k.", ms=3, alpha=0.5)
    ax.set_xscale("log")
    ax.set_yticks([y for y, _ in labels])
    ax.set_yticklabels([l for _, l in labels], fontsize=8)
    ax.set_xlabel("seconds per %s (bars: median, whiskers: p25-p75, dots: rounds)" % size_label(p),
                  fontsize=8)
    ax.set_title("%s out of a PFN-mapped ring in the rig (%s kernel, QEMU %s, %s rounds)\n"
                 "staged / direct %s" % (size_label(p), doc.get("kernel_variant", "?"), doc.get("accel", "?"),
                                         pfn["rounds"], rfmt(pfn["staged_over_direct"])), fontsize=9)
    ax.grid(True, which="both", axis="x", alpha=0.3)
    fig.text(0.01, 0.01, "%s  commit %s" % (doc.get("date", ""), doc.get("commit", "")[:12]),
             fontsize=7, alpha=0.6)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def cmd_distortion(plain, debug, markdown=False):
    with open(plain) as f:
        a = load_doc(f)
    with open(debug) as f:
        b = load_doc(f)
    head = ["figure", "pm/nv plain", "pm/nv debug", "pm/floor plain", "pm/floor debug"]
    lines = []
    for fig, p, label, unit, better in rows(a):
        key = "%s/%s" % (fig, p)
        kb = key
        if p == large_param(a) and large_param(b) != p:
            # The largest size of each run, whatever it was.
            kb = "%s/%s" % (fig, large_param(b))
            label += " (debug run: %s)" % size_label(large_param(b))
        r = [ratio(a["summary"], key, "peermem", "nvidia-peermem"),
             ratio(b["summary"], kb, "peermem", "nvidia-peermem"),
             ratio(a["summary"], key, "peermem", "floor"),
             ratio(b["summary"], kb, "peermem", "floor")]
        if all(x is None for x in r):
            continue
        lines.append([label] + [rfmt(x) for x in r])
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        out += ["| " + " | ".join(l) + " |" for l in lines]
        return "\n".join(out)
    w = [max(len(r[i]) for r in [head] + lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(l))
                     for l in [head] + lines)


def cmd_compare(before, after, markdown=False, only=None):
    """Two runs of the same benchmark (peermem before and after a change):
    peermem's medians, after / before, nvidia-peermem's after / before (the
    same module in both runs: how far the run itself moved), and the
    within-run ratios pm/nv and pm/floor of each run. only: figure names
    (comma-separated) to keep, in the table's order."""
    with open(before) as f:
        a = load_doc(f)
    with open(after) as f:
        b = load_doc(f)
    keep = set(only.split(",")) if only else None
    head = ["figure", "peermem before", "peermem after", "after/before",
            "nv after/before", "pm/nv before", "pm/nv after", "pm/floor before", "pm/floor after",
            "pm/nv per round before", "after"]

    def per_round(doc, fig, p):
        # The median over the rounds of (peermem's median / nvidia-peermem's
        # median in that round): the sides take turns within a round, so
        # this follows the host's load where the run's medians may not.
        by = {}
        for smp in doc["samples"]:
            if smp["figure"] == fig and smp["param"] == p:
                by.setdefault(smp["round"], {}).setdefault(smp["side"], []).append(smp["value"])
        r = [pct(v["peermem"], 0.5) / pct(v["nvidia-peermem"], 0.5) for v in by.values()
             if v.get("peermem") and v.get("nvidia-peermem") and pct(v["nvidia-peermem"], 0.5)]
        return pct(r, 0.5) if r else None
    lines = []
    for fig, p, label, unit, better in rows(b):
        if keep is not None and fig not in keep:
            continue
        key = "%s/%s" % (fig, p)
        ea, eb = a["summary"].get(key, {}), b["summary"].get(key, {})
        if not ea.get("peermem") and not eb.get("peermem"):
            continue

        def med(e, side):
            return (e.get(side) or {}).get("median")

        def over(x, y):
            return None if x is None or y is None or y == 0 else x / y
        lines.append([label, cell(ea.get("peermem"), unit), cell(eb.get("peermem"), unit),
                      rfmt(over(med(eb, "peermem"), med(ea, "peermem"))),
                      rfmt(over(med(eb, "nvidia-peermem"), med(ea, "nvidia-peermem"))),
                      rfmt(ratio(a["summary"], key, "peermem", "nvidia-peermem")),
                      rfmt(ratio(b["summary"], key, "peermem", "nvidia-peermem")),
                      rfmt(ratio(a["summary"], key, "peermem", "floor")),
                      rfmt(ratio(b["summary"], key, "peermem", "floor")),
                      rfmt(per_round(a, fig, p)), rfmt(per_round(b, fig, p))])
    return grid(head, lines, markdown)


# Counters of /proc/meminfo that are kernel memory the free-page count sees
# (what is left of it after them: page allocations no counter names).
MEM_NAMED = ["Slab", "SecPageTables", "PageTables", "KernelStack", "Percpu", "VmallocUsed"]


def cmd_memdetail(raw):
    """Medians over the rounds of each counter's change per registration,
    per side, for each memory figure; a round that printed no line for a
    counter counts as 0 (only counters that moved are printed)."""
    tot, det, rounds = {}, {}, {}
    with open(raw) as f:
        for line in f:
            w = line.split()
            if len(w) == 6 and w[0] == "sample" and "kmem_per_reg_bytes" in w[1]:
                fig = (w[1], w[2])
                tot.setdefault(fig, {}).setdefault(w[3], {})[int(w[4])] = float(w[5])
                rounds.setdefault(fig, {}).setdefault(w[3], set()).add(int(w[4]))
            elif len(w) == 7 and w[0] == "memdetail":
                det.setdefault((w[1], w[2]), {}).setdefault(w[5], {}).setdefault(w[3], {})[int(w[4])] = float(w[6])
    if not tot:
        sys.exit("report.py memdetail: no memory samples in %s (run bench_peermem --memory-detail)" % raw)

    def med(series, side, fig):
        rs = sorted(rounds[fig].get(side, ()))
        if not rs:
            return None
        return pct([series.get(side, {}).get(r, 0.0) for r in rs], 0.5)

    def b(v):
        if v is None:
            return "-"
        a = abs(v)
        if a >= 1024 * 1024:
            return "%.2f MiB" % (v / 1048576)
        if a >= 1024:
            return "%.1f KiB" % (v / 1024)
        return "%.0f B" % v

    out = []
    for fig in sorted(tot):
        sides = [s for s in SIDES if s in rounds[fig]]
        what = "core + client only (umem_test)" if fig[0].startswith("core_") else "ibv_reg_mr (the whole MR)"
        n = max(len(v) for v in rounds[fig].values())
        out.append("### %s, %s: per live registration, median of %d rounds" % (what, size_label(fig[1]), n))
        out.append("")
        head = ["counter"] + sides
        floor = "floor" in sides
        peers = [s for s in sides if s != "floor"]
        if floor:
            head += ["%s - floor" % s for s in peers]
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + " --- |" * len(head))
        keys = det.get(fig, {})
        total = {s: med(tot[fig], s, fig) for s in sides}
        named = {s: sum(med(keys.get("meminfo:" + k, {}), s, fig) or 0 for k in MEM_NAMED) for s in sides}
        rows = [("free pages (all kernel memory)", total),
                ("  not in " + " + ".join(MEM_NAMED), {s: total[s] - named[s] for s in sides})]
        # Slab bytes in no cache's slabs: kmalloc()s above the largest
        # kmalloc cache (8 KiB), which the page allocator serves and counts
        # in Slab (per round, then the median).
        caches = [k for k in keys if k.startswith("slab_pages:")]
        big = {}
        for s_ in sides:
            v = [keys.get("meminfo:Slab", {}).get(s_, {}).get(r, 0.0) -
                 sum(keys[k].get(s_, {}).get(r, 0.0) for k in caches) for r in sorted(rounds[fig][s_])]
            big[s_] = pct(v, 0.5)
        rows.append(("  Slab in no cache's slabs (kmalloc above 8 KiB: whole pages)", big))
        thr = max(256.0, 0.005 * max(abs(v) for v in total.values()))

        def order(k):
            kind = k.split(":")[0]
            return ({"meminfo": 0, "vmstat": 1, "slab_pages": 2, "slab_objs": 3}.get(kind, 4),
                    -max(abs(med(keys[k], s, fig) or 0) for s in sides))
        for k in sorted(keys, key=order):
            if k.startswith("count:"):
                continue
            m = {s: med(keys[k], s, fig) for s in sides}
            if max(abs(v or 0) for v in m.values()) < thr:
                continue
            # Free memory itself (the first row) and limits derived from it.
            if k in ("meminfo:MemFree", "meminfo:MemAvailable", "vmstat:nr_free_pages",
                     "vmstat:nr_free_pages_blocks", "vmstat:nr_dirty_threshold",
                     "vmstat:nr_dirty_background_threshold"):
                continue
            rows.append((k, m))
        cnt = "count:gpusim_dma_runs_mapped"
        if cnt in keys:
            rows.append(("gpusim's bus-contiguous runs handed out (a count)",
                         {s: med(keys[cnt], s, fig) for s in sides}))
        for label, m in rows:
            f = b if not label.endswith("(a count)") else (lambda v: "-" if v is None else "%.0f" % v)
            cells = [label] + [f(m[s]) for s in sides]
            if floor:
                cells += [f(None if m[s] is None or m["floor"] is None else m[s] - m["floor"]) for s in peers]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
        out.append("(rows: counters that moved by at least %s per registration on some side)" % b(thr))
        out.append("")
    return "\n".join(out)


def round_ratio(doc, fig, p, a="peermem", b="nvidia-peermem"):
    """The median over the rounds of (a's median / b's median in that
    round), and its p25-p75: the sides take turns within a round, so a
    drift of the host's speed weighs on both."""
    by = {}
    for smp in doc["samples"]:
        if smp["figure"] == fig and smp["param"] == p:
            by.setdefault(smp["round"], {}).setdefault(smp["side"], []).append(smp["value"])
    r = [pct(v[a], 0.5) / pct(v[b], 0.5) for v in by.values()
         if v.get(a) and v.get(b) and pct(v[b], 0.5)]
    return (pct(r, 0.5), pct(r, 0.25), pct(r, 0.75)) if r else (None, None, None)


def pincost_params(doc):
    """(size label, call us, page ns, param) of the pincost samples, by
    model then size."""
    seen = {}
    for smp in doc["samples"]:
        if smp["figure"] == "pincost_s":
            size, _, model = smp["param"].partition("@")
            call, _, page = model.partition("+")
            seen[smp["param"]] = (size, int(call), int(page), smp["param"])
    return sorted(seen.values(), key=lambda t: (t[1], t[2], size_bytes(t[0])))


def run_ratios(doc, fig, p, a="peermem", b="nvidia-peermem"):
    """a/b of the medians in each run (several --raw), in run order."""
    by = {}
    for smp in doc["samples"]:
        if smp["figure"] == fig and smp["param"] == p:
            by.setdefault(smp.get("run", 0), {}).setdefault(smp["side"], []).append(smp["value"])
    return [pct(v[a], 0.5) / pct(v[b], 0.5) for _, v in sorted(by.items())
            if v.get(a) and v.get(b) and pct(v[b], 0.5)]


def pin_share(summ, kind, size, call, page):
    """The modelled cost of peermem's pins over its measured reg+dereg."""
    calls = (summ.get("pins_%s_calls/%s" % (kind, size), {}).get("peermem") or {}).get("median")
    pages = (summ.get("pins_%s_pages/%s" % (kind, size), {}).get("peermem") or {}).get("median")
    fig = "pincost_miss_s" if kind == "miss" else "pincost_s"
    t = (summ.get("%s/%s@%d+%d" % (fig, size, call, page), {}).get("peermem") or {}).get("median")
    if calls is None or pages is None or not t:
        return None
    return (calls * call * 1e-6 + pages * page * 1e-9) / t


def cmd_pincost(path, markdown=False):
    with open(path) as f:
        doc = load_doc(f)
    summ = doc["summary"]
    nv = doc.get("nv_client") or "nvidia-peermem"
    head = ["pin cost (per call + per 64 KiB page)", "size", "registration", "peermem", nv, "floor",
            "pm/nv", "pm/nv per round (p25-p75)", "pm/nv per run", "pins' share of pm"]
    lines = []
    for size, call, page, p in pincost_params(doc):
        for kind, fig in (("miss", "pincost_miss_s"), ("hit", "pincost_s")):
            e = summ.get("%s/%s" % (fig, p), {})
            if not e:
                continue
            rr = round_ratio(doc, fig, p)
            runs = run_ratios(doc, fig, p)
            share = pin_share(summ, kind, size, call, page)
            lines.append(["%d us + %d ns" % (call, page), size_label(size),
                          "first (miss)" if kind == "miss" else "again (hit)",
                          cell(e.get("peermem"), "s"), cell(e.get("nvidia-peermem"), "s"),
                          cell(e.get("floor"), "s"),
                          rfmt(ratio(summ, "%s/%s" % (fig, p), "peermem", "nvidia-peermem")),
                          "-" if rr[0] is None else "%.2f (%.2f-%.2f)" % rr,
                          " ".join("%.2f" % r for r in runs) or "-",
                          "-" if share is None else "%.0f%%" % (100 * share)])
    out = grid(head, lines, markdown)
    head = ["size", "registration", "pin calls pm", "pin calls nv", "pm/nv",
            "GPU pages pinned pm", "GPU pages pinned nv", "pm/nv"]
    lines = []
    for p in sizes(doc):
        for kind in ("miss", "hit"):
            c = summ.get("pins_%s_calls/%s" % (kind, p), {})
            g = summ.get("pins_%s_pages/%s" % (kind, p), {})
            if not c:
                continue
            lines.append([size_label(p), "first (miss)" if kind == "miss" else "again (hit)",
                          cell(c.get("peermem"), ""), cell(c.get("nvidia-peermem"), ""),
                          rfmt(ratio(summ, "pins_%s_calls/%s" % (kind, p), "peermem", "nvidia-peermem")),
                          cell(g.get("peermem"), ""), cell(g.get("nvidia-peermem"), ""),
                          rfmt(ratio(summ, "pins_%s_pages/%s" % (kind, p), "peermem", "nvidia-peermem"))])
    if lines:
        out += [""] + grid(head, lines, markdown)
    goals_ = pin_goals(doc)
    if goals_:
        out += ["", goals_text({"goals": goals_}, markdown)]
    return out


def cmd_plot_pincost(path, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    with open(path) as f:
        doc = load_doc(f)
    summ = doc["summary"]
    params = pincost_params(doc)
    nv = doc.get("nv_client") or "nvidia-peermem"
    sizes_ = sorted({t[0] for t in params}, key=size_bytes)
    models = sorted({(t[1], t[2]) for t in params})
    fig, axes = plt.subplots(1, len(sizes_), figsize=(4.2 * len(sizes_), 4.2))
    if len(sizes_) == 1:
        axes = [axes]
    for ax, size in zip(axes, sizes_):
        for side, mk, col in zip(SIDES, ("o", "s", "^"), ("C0", "C1", "C2")):
            for fig_, ls, what in (("pincost_miss_s", "--", "first"), ("pincost_s", "-", "again")):
                xs, ys, lo, hi = [], [], [], []
                for call, page in models:
                    e = (summ.get("%s/%s@%d+%d" % (fig_, size, call, page)) or {}).get(side)
                    if not e:
                        continue
                    xs.append(call)
                    ys.append(e["median"] * 1e3)
                    lo.append((e["median"] - e["p25"]) * 1e3)
                    hi.append((e["p75"] - e["median"]) * 1e3)
                if xs:
                    ax.errorbar(xs, ys, yerr=[lo, hi], fmt=mk + ls, color=col, capsize=3,
                                label="%s, %s" % (side if side != "nvidia-peermem" else nv, what))
        ax.set_title("reg+dereg %s" % size_label(size))
        ax.set_xlabel("pin cost per call, us (+ ns/page as in the table)")
        ax.set_ylabel("ms (median, p25-p75)")
        ax.set_xscale("symlog", linthresh=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("The pin-cost model (gpusim pin_call_us / pin_page_ns): a model, not a measurement of NVIDIA's driver",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


SCALE_ROWS = [
    # (figure, label)
    ("scale_regdereg_s", "reg + dereg of one more 64 KiB MR"),
    ("scale_reg_s", "  of which ibv_reg_mr"),
    ("scale_dereg_s", "  of which ibv_dereg_mr"),
    ("scale_free_revoke_s", "GPU free -> MR revoked, one more MR on its own allocation"),
    ("scale_free_ioctl_s", "  of which GPUSIM_IOC_FREE itself"),
    ("scale_dereg_all_s", "deregistering all N (per MR below)"),
]


def scale_ns(doc, fig):
    return sorted({int(s["param"]) for s in doc["samples"] if s["figure"] == fig})


def cmd_scaling(path, markdown=False):
    with open(path) as f:
        doc = load_doc(f)
    summ = doc["summary"]
    head = ["figure", "live MRs N", "peermem", "nvidia-peermem", "pm/nv",
            "pm/nv per round (p25-p75)", "peermem / its N=1", "nvidia-peermem / its N=1"]
    lines = []
    for fig, label in SCALE_ROWS:
        ns = scale_ns(doc, fig)
        base = summ.get("%s/%d" % (fig, ns[0]), {}) if ns else {}
        for n in ns:
            key = "%s/%d" % (fig, n)
            e = summ.get(key, {})

            def per(side):
                v = (e.get(side) or {}).get("median")
                if v is None:
                    return None
                return v / n if fig == "scale_dereg_all_s" else v

            def rel(side):
                b = (base.get(side) or {}).get("median")
                v = per(side)
                bb = None if b is None else (b / ns[0] if fig == "scale_dereg_all_s" else b)
                return None if v is None or not bb else v / bb
            rr = round_ratio(doc, fig, str(n))
            pm, nv = per("peermem"), per("nvidia-peermem")
            lines.append([label if n == ns[0] else "", str(n),
                          "-" if pm is None else fmt_val(pm, "s"), "-" if nv is None else fmt_val(nv, "s"),
                          rfmt(None if pm is None or not nv else pm / nv),
                          "-" if rr[0] is None else "%.2f (%.2f-%.2f)" % rr,
                          rfmt(rel("peermem")), rfmt(rel("nvidia-peermem"))])
    for fig, label in (("events_files_regdereg_s", "peermem: reg + dereg of 64 KiB with N other /dev/peermem files open"),
                       ("events_files_unmap_s", "peermem: munmap -> revoked (reported) with N other files open")):
        ns = scale_ns(doc, fig)
        base = (summ.get("%s/%d" % (fig, ns[0]), {}).get("peermem") or {}).get("median") if ns else None
        for n in ns:
            e = (summ.get("%s/%d" % (fig, n), {}).get("peermem") or {})
            lines.append([label if n == ns[0] else "", "%d files" % n, cell(e, "s") if e else "-", "-", "-", "-",
                          rfmt(None if not e or not base else e["median"] / base), "-"])
    return grid(head, lines, markdown)


def cmd_plot_scaling(path, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    with open(path) as f:
        doc = load_doc(f)
    summ = doc["summary"]
    figs = [("scale_regdereg_s", "reg + dereg of one more 64 KiB MR"),
            ("scale_free_revoke_s", "GPU free -> revoked, one more MR"),
            ("events_files_regdereg_s", "peermem: reg + dereg, N files open")]
    fig, axes = plt.subplots(1, len(figs), figsize=(4.4 * len(figs), 4.2))
    for ax, (name, title) in zip(axes, figs):
        ns = scale_ns(doc, name)
        for side, mk in zip(SIDES[:2], ("o-", "s--")):
            xs, ys, lo, hi = [], [], [], []
            for n in ns:
                e = (summ.get("%s/%d" % (name, n)) or {}).get(side)
                if not e:
                    continue
                xs.append(max(n, 0.5))
                ys.append(e["median"] * 1e3)
                lo.append((e["median"] - e["p25"]) * 1e3)
                hi.append((e["p75"] - e["median"]) * 1e3)
            if xs:
                ax.errorbar(xs, ys, yerr=[lo, hi], fmt=mk, capsize=3, label=side)
        ax.set_xscale("symlog", linthresh=1)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("open /dev/peermem files" if name.startswith("events") else "live registrations N in the process")
        ax.set_ylabel("ms (median, p25-p75)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


# The peer clients' callbacks and the calls that differ between them, as
# perf names them: (label, peermem's symbols, nvidia-peermem's symbols);
# a symbol matches by prefix of its demangled-enough name (Rust names are
# matched by their path words).
PROF_OPS = [
    ("acquire", [("OperationsVTable", "acquire")], ["=nv_mem_acquire"]),
    ("get_pages", [("OperationsVTable", "get_pages")], ["=nv_mem_get_pages"]),
    ("dma_map", [("OperationsVTable", "dma_map")], ["=nv_dma_map"]),
    ("dma_unmap", [("OperationsVTable", "dma_unmap")], ["=nv_dma_unmap"]),
    # (the vtable's put_pages and release are tail calls perf does not see)
    ("put_pages", [("OperationsVTable", "put_pages"), ("12registration", "put_pages")], ["=nv_mem_put_pages"]),
    ("release", [("OperationsVTable", "release"), ("12registration", "release")], ["=nv_mem_release"]),
    ("  peermem's Registration::unpin (the keeper's and the watch's puts, from put_pages)",
     [("Registration", "unpin")], []),
    ("  nvidia_p2p_get_pages (peermem: the watch; nvidia-peermem: the probe and the pin)",
     ["=nvidia_p2p_get_pages"], ["=nvidia_p2p_get_pages"]),
    ("  nvidia_p2p_get_pages_persistent (peermem: the keeper)", ["=nvidia_p2p_get_pages_persistent"],
     ["=nvidia_p2p_get_pages_persistent"]),
    ("  nvidia_p2p_put_pages (peermem: the watch; nvidia-peermem: the probe's and the pin's)",
     ["=nvidia_p2p_put_pages"], ["=nvidia_p2p_put_pages"]),
    ("  nvidia_p2p_put_pages_persistent (peermem: the keeper)", ["=nvidia_p2p_put_pages_persistent"],
     ["=nvidia_p2p_put_pages_persistent"]),
    ("  nvidia_p2p_dma_map_pages", ["=nvidia_p2p_dma_map_pages"], ["=nvidia_p2p_dma_map_pages"]),
    ("  nvidia_p2p_dma_unmap_pages", ["=nvidia_p2p_dma_unmap_pages"], ["=nvidia_p2p_dma_unmap_pages"]),
    ("  mmu_interval_notifier_insert (peermem's address watch)", ["=mmu_interval_notifier_insert"],
     ["=mmu_interval_notifier_insert"]),
    ("  mmu_interval_notifier_remove", ["=mmu_interval_notifier_remove"], ["=mmu_interval_notifier_remove"]),
    ("  the free callbacks' registry (peermem_cbref_insert, _take)",
     [("5cbref", "insert"), ("5cbref", "take")], []),
    ("  peermem's allocations (watch, work item)", ["=peermem_watch_alloc", "=peermem_work_alloc"], []),
    ("the core's ib_peer_umem_get (client search, get_pages, dma_map under it)", ["=ib_peer_umem_get"],
     ["=ib_peer_umem_get"]),
    ("the core's ib_peer_umem_release (dma_unmap, put_pages, release under it)", ["=ib_peer_umem_release"],
     ["=ib_peer_umem_release"]),
    ("  RCU softirq work (rcu_core) while registering", ["=rcu_core"], ["=rcu_core"]),
    ("  call_rcu", ["=call_rcu"], ["=call_rcu"]),
    ("  xarray node allocation (xas_alloc)", ["=xas_alloc"], ["=xas_alloc"]),
    ("rxe_reg_user_mr + rxe_dereg_mr (rxe's MR with the core and the client under it)",
     ["=rxe_reg_user_mr", "=rxe_dereg_mr"], ["=rxe_reg_user_mr", "=rxe_dereg_mr"]),
]


def prof_match(sym, pats):
    """Whether perf's symbol sym (maybe "name [module]") is one of pats:
    "=name" exactly, or a tuple of words all in a Rust name, the last one
    the function's own (its length-prefixed path segment)."""
    name = sym.split(" [")[0].strip()
    for p in pats:
        if isinstance(p, str):
            if name == p[1:]:
                return True
        elif all(w in name for w in p) and re.search(r"\d%s(B|E|$)" % re.escape(p[-1]), name) \
                and re.search(r"%d%s(B|E|$)" % (len(p[-1]), re.escape(p[-1])), name):
            return True
    return False


def cmd_ratios(paths, markdown=False):
    """For runs of --only latency: per size, pm/nv of the medians and the
    median over the rounds of each round's pm/nv (p25-p75), run by run."""
    head = ["run", "rounds", "nv rm_lock"] + ["%s pm/nv: medians; per round (p25-p75)" % size_label(p)
                                             for p in ("64K", "2M", "64M", "512M")]
    lines = []
    for path in paths:
        with open(path) as f:
            doc = load_doc(f)
        row = [path.replace("docs/bench/", ""), str(doc.get("rounds", "?")), str(doc.get("nv_rm_lock", "0"))]
        for p in ("64K", "2M", "64M", "512M"):
            r = ratio(doc["summary"], "regdereg_s/" + p, "peermem", "nvidia-peermem")
            rr = round_ratio(doc, "regdereg_s", p)
            row.append("-" if r is None else "%.2f; %.2f (%.2f-%.2f)" % ((r,) + rr))
        lines.append(row)
    return grid(head, lines, markdown)


def cmd_profops(path, lat_pm=None, lat_nv=None, markdown=False):
    """Per peer-memory operation and per differing call: its inclusive
    share of the side's ib_uverbs_ioctl (all registration and
    deregistration work in the syscall), median over the passes; with
    the bench's interleaved reg+dereg medians (us), the same in us."""
    per = {}    # side -> label -> [share per pass]
    side = None
    passes = {}
    cur = {}
    def flush():
        if side and cur:
            base = cur.get("__ioctl__", 0)
            for lab, v in cur.items():
                if lab != "__ioctl__" and base:
                    per.setdefault(side, {}).setdefault(lab, []).append(v / base)
            for lab, _, _ in PROF_OPS:
                if base and lab not in cur:
                    per.setdefault(side, {}).setdefault(lab, []).append(0.0)
    with open(path) as f:
        for line in f:
            m = re.match(r"profile (\S+) (\d+) bytes, 1 thread\(s\)", line)
            if m:
                flush()
                side, cur = m.group(1), {}
                passes[side] = passes.get(side, 0) + 1
                continue
            if not line.startswith("raw-incl ") or side is None:
                continue
            _, sd, rest = line.split(None, 2)
            mm = re.match(r"([0-9.]+)%\s+([0-9.]+)%\s+\[.\]\s+(.*)", rest)
            if not mm or sd != side:
                continue
            pctv, sym = float(mm.group(1)), mm.group(3).strip()
            if sym.split(" [")[0] == "ib_uverbs_ioctl":
                cur["__ioctl__"] = cur.get("__ioctl__", 0) + pctv
            for lab, pp, pn in PROF_OPS:
                pats = pp if side == "peermem" else pn
                if side in ("peermem", "nvidia-peermem") and prof_match(sym, pats):
                    cur[lab] = cur.get(lab, 0) + pctv
        flush()
    head = ["operation or call (inclusive)", "peermem share", "nvidia-peermem share", "pm - nv, points"]
    if lat_pm:
        head += ["peermem us", "nvidia-peermem us", "pm - nv us"]
    lines = []
    for lab, _, _ in PROF_OPS:
        a = pct(per.get("peermem", {}).get(lab, []), 0.5)
        b = pct(per.get("nvidia-peermem", {}).get(lab, []), 0.5)
        row = [lab, "%.1f %%" % (100 * a) if a == a else "-", "%.1f %%" % (100 * b) if b == b else "-",
               "%+.1f" % (100 * (a - b)) if a == a and b == b else "-"]
        if lat_pm:
            ua = a * lat_pm if a == a else 0
            ub = b * lat_nv if b == b else 0
            row += ["%.1f" % ua, "%.1f" % ub, "%+.1f" % (ua - ub)]
        lines.append(row)
    out = ["# %s: %d peermem and %d nvidia-peermem passes; shares of the side's ib_uverbs_ioctl "
           "(inclusive CPU samples), median over the passes%s" % (
               path, passes.get("peermem", 0), passes.get("nvidia-peermem", 0),
               "; us: share x the side's reg+dereg median (%.0f and %.0f us)" % (lat_pm, lat_nv) if lat_pm else "")]
    return out + grid(head, lines, markdown)


def cmd_profdiff(path, n=40, kind="incl", markdown=False):
    """A registration profile (scripts/bench.sh --profile SIZE,N
    --callgraph, maybe in passes): per side and pass, each symbol's share
    of all samples (idle included) times the pass's CPU time per reg+dereg
    (vCPUs x wall per reg+dereg) is its CPU time per reg+dereg; the median
    over the passes is taken. Returns the lines of a table: peermem minus nvidia-peermem,
    largest first, with both and the floor."""
    import re
    cpus = 2
    acc = {}    # side -> sym -> [us per pass]
    walls = {}  # side -> [wall us per pass]
    side = None
    with open(path) as f:
        for line in f:
            m = re.match(r"profile (\S+) (\d+) bytes, 1 thread\(s\): (\d+) reg\+dereg each, ([0-9.]+) ms", line)
            if m:
                side = m.group(1)
                walls.setdefault(side, []).append(float(m.group(4)) * 1000)
                continue
            if not line.startswith("raw-%s " % kind):
                continue
            _, sd, rest = line.split(None, 2)
            if kind == "incl":
                m = re.match(r"([0-9.]+)%\s+([0-9.]+)%\s+\[.\]\s+(.*)", rest)
            else:
                m = re.match(r"([0-9.]+)%\s+(\d+)\s+\[.\]\s+(.*)", rest)
            if not m or sd != side:
                continue
            sym = m.group(3).strip()
            k = len(walls[sd]) - 1
            per = acc.setdefault(sd, {}).setdefault(sym, {})
            per[k] = per.get(k, 0) + float(m.group(1)) / 100 * cpus * walls[sd][k]
    if "peermem" not in acc or "nvidia-peermem" not in acc:
        sys.exit("report.py profdiff: %s has no peermem and nvidia-peermem registration profile" % path)
    # The median over the passes (a pass without the symbol counts 0): a
    # pass the host slowed down moves it less than a mean.
    us = {sd: {sym: pct([v.get(k, 0) for k in range(len(walls[sd]))], 0.5) for sym, v in d.items()}
          for sd, d in acc.items()}
    wall = {sd: pct(w, 0.5) for sd, w in walls.items()}
    pm, nv, fl = us["peermem"], us["nvidia-peermem"], us.get("floor", {})
    out = ["# %s: %d pass(es); wall per reg+dereg (median of the passes): peermem %.1f us, "
           "nvidia-peermem %.1f us, floor %.1f us; difference %.1f us (%s CPU time, both vCPUs)"
           % (path, len(walls["peermem"]), wall["peermem"], wall["nvidia-peermem"], wall.get("floor", 0),
              wall["peermem"] - wall["nvidia-peermem"], "inclusive" if kind == "incl" else "self")]
    keys = sorted(set(pm) | set(nv), key=lambda k: -(pm.get(k, 0) - nv.get(k, 0)))
    lines = [["%.1f" % (pm.get(k, 0) - nv.get(k, 0)), "%.1f" % pm.get(k, 0), "%.1f" % nv.get(k, 0),
              "%.1f" % fl.get(k, 0), k[:100]] for k in keys[:n]]
    out += grid(["pm - nv (us)", "peermem (us)", "nvidia-peermem (us)", "floor (us)", "symbol"], lines, markdown)
    return out


def read_bar1(path):
    """bench_bar1's lines: ({label: {mib: (one_mr_mib, small_mrs)}},
    {label: {kib: (miss_calls, miss_pages, hit_calls, hit_pages)}}), labels in
    the order they first appear."""
    cap, pins = {}, {}
    with open(path) as f:
        for line in f:
            w = line.split()
            if len(w) >= 7 and w[0] == "bar1":
                cap.setdefault(w[1], {})[int(w[2])] = (int(w[4]), int(w[6]))
            elif len(w) >= 12 and w[0] == "pins":
                pins.setdefault(w[1], {})[int(w[2])] = tuple(float(w[i]) for i in (5, 7, 10, 12))
    return cap, pins


def cmd_bar1(path, md):
    cap, pins = read_bar1(path)
    ref = next((l for l in cap if l.startswith("nvidia-peermem")), None)
    out = []
    sizes = sorted({m for v in cap.values() for m in v})
    head = ["client"] + [f"{m} MiB: one MR / 2 MiB MRs" for m in sizes]
    rows = []
    for label, v in cap.items():
        cells = [label]
        for m in sizes:
            if m not in v:
                cells.append("")
                continue
            one, n = v[m]
            rel = ""
            if ref and m in cap[ref] and label != ref:
                r1, rn = cap[ref][m]
                rel = f" ({one / r1:.2f}x / {n / rn:.2f}x)" if r1 and rn else ""
            cells.append(f"{one} MiB / {n}{rel}")
        rows.append(cells)
    out += render(head, rows, md)
    # peermem (defaults) against every nvidia-peermem measured.
    nvs = [l for l in cap if l.startswith("nvidia-peermem")]
    if "peermem" in cap and nvs:
        out.append("")
        head = ["peermem / client"] + [f"{m} MiB: one MR / 2 MiB MRs" for m in sizes]
        rows = []
        for nv in nvs:
            cells = [nv]
            for m in sizes:
                if m in cap["peermem"] and m in cap[nv] and all(cap[nv][m]):
                    (p1, pn), (r1, rn) = cap["peermem"][m], cap[nv][m]
                    cells.append(f"{p1 / r1:.2f}x / {pn / rn:.2f}x")
                else:
                    cells.append("")
            rows.append(cells)
        out += render(head, rows, md)
    if pins:
        out.append("")
        kibs = sorted({k for v in pins.values() for k in v})
        head = ["client"] + [f"{k // 1024} MiB" if k >= 1024 else f"{k} KiB" for k in kibs]
        rows = []
        for label, v in pins.items():
            cells = [label]
            for k in kibs:
                if k not in v:
                    cells.append("")
                    continue
                mc, mp, hc, hp = v[k]
                cells.append(f"miss {mc:g} calls, {mp:g} pages; hit {hc:g}, {hp:g}")
            rows.append(cells)
        out += render(head, rows, md)
    return out


def render(head, rows, md):
    if md:
        return ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)] + [
            "| " + " | ".join(r) + " |" for r in rows]
    w = [max(len(str(r[i])) for r in [head] + rows) for i in range(len(head))]
    return ["  ".join(str(c).ljust(w[i]) for i, c in enumerate(r)) for r in [head] + rows]


def cmd_plot_bar1(path, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cap, _ = read_bar1(path)
    sizes = sorted({m for v in cap.values() for m in v})
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.8 / max(len(cap), 1)
    for ax, idx, what in ((axes[0], 0, "largest single MR (MiB)"),
                          (axes[1], 1, "2 MiB MRs registered at once")):
        for j, (label, v) in enumerate(cap.items()):
            xs = [i + j * width for i in range(len(sizes))]
            ax.bar(xs, [v.get(m, (0, 0))[idx] for m in sizes], width, label=label)
        ax.set_xticks([i + width * (len(cap) - 1) / 2 for i in range(len(sizes))])
        ax.set_xticklabels([f"BAR1 {m} MiB" for m in sizes])
        ax.set_ylabel(what)
    axes[0].legend(fontsize=8)
    fig.suptitle("What registers before BAR1 is full (gpusim, dynamic BAR1, RM's 36 MiB reserve)")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    cmd, argv = sys.argv[1], sys.argv[2:]
    md = "--markdown" in argv
    argv = [a for a in argv if a != "--markdown"]
    if cmd == "results":
        cmd_results(argv)
    elif cmd == "table" and len(argv) == 1:
        with open(argv[0]) as f:
            doc = load_doc(f)
        if has_peer_figures(doc):
            print(table(doc, md))
            print()
            print(reference_text(doc, md))
            print()
            print(goals_text(doc, md))
        if doc.get("pfnmap"):
            if has_peer_figures(doc):
                print()
            print(pfn_text(doc, md))
    elif cmd == "plot" and len(argv) == 2:
        cmd_plot(argv[0], argv[1])
    elif cmd == "plot-pfn" and len(argv) == 2:
        cmd_plot_pfn(argv[0], argv[1])
    elif cmd == "distortion" and len(argv) == 2:
        print(cmd_distortion(argv[0], argv[1], md))
    elif cmd == "compare" and len(argv) in (2, 3):
        print("\n".join(cmd_compare(argv[0], argv[1], md, argv[2] if len(argv) == 3 else None)))
    elif cmd == "pincost" and len(argv) == 1:
        print("\n".join(cmd_pincost(argv[0], md)))
    elif cmd == "plot-pincost" and len(argv) == 2:
        cmd_plot_pincost(argv[0], argv[1])
    elif cmd == "scaling" and len(argv) == 1:
        print("\n".join(cmd_scaling(argv[0], md)))
    elif cmd == "plot-scaling" and len(argv) == 2:
        cmd_plot_scaling(argv[0], argv[1])
    elif cmd == "ratios" and argv:
        print("\n".join(cmd_ratios(argv, md)))
    elif cmd == "profops" and len(argv) in (1, 3):
        print("\n".join(cmd_profops(argv[0], *(float(x) for x in argv[1:]), markdown=md)))
    elif cmd == "profdiff" and len(argv) >= 1:
        kind = "self" if "--self" in argv else "incl"
        argv = [a for a in argv if a != "--self"]
        print("\n".join(cmd_profdiff(argv[0], int(argv[1]) if len(argv) > 1 else 40, kind, md)))
    elif cmd == "bar1" and len(argv) == 1:
        print("\n".join(cmd_bar1(argv[0], md)))
    elif cmd == "plot-bar1" and len(argv) == 2:
        cmd_plot_bar1(argv[0], argv[1])
    elif cmd == "memdetail" and len(argv) == 1:
        print(cmd_memdetail(argv[0]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
