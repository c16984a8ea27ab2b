#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Compare our ABI headers with the reference headers, item by item; print TAP.

For each pair (reference header, our header):

1. Enumerate what the reference declares: records with their (nested)
   fields, enums and their constants, typedefs, functions, macros. This uses
   clang's JSON AST and `-E -dD` on a tiny translation unit whose kernel
   includes are stand-ins (tests/host/abi/stubs), so it takes milliseconds.
   The same is done for our header, for the structural comparisons (field
   order, enum membership, macro kind, no extra or missing names).
2. Compile a probe against the reference in kernel context (the kernel's
   own clang command line): every size, alignment, offset, type class,
   constant value and macro result is emitted into the assembly output with
   the asm-offsets trick, and every declared type (field types, typedefs,
   function signatures as spelled by the reference) is checked with
   __builtin_types_compatible_p, to prove the probe itself is sound.
3. Compile one line of _Static_asserts per item against our header, in the
   same kernel context, expecting exactly the reference's values and types.
   Clang reports every failed line; each line is one TAP test.
"""

import argparse
import shutil
import json
import os
import re
import shlex
import subprocess
import sys

# Inputs the function-like macros are evaluated on (version words).
GRID = [0x0, 0x1, 0xffff, 0x10000, 0x10001, 0x10002, 0x1ffff, 0x20003,
        0x20001, 0xffff0000, 0x12345678, 0xffffffff]

# Names each reference must declare: proves the enumeration itself works.
REQUIRED = {
    "peer_mem": [
        "peer_memory_client", "peer_memory_client_ex", "invalidate_peer_memory",
        "ib_register_peer_memory_client", "ib_unregister_peer_memory_client",
        "PEER_MEM_INVALIDATE_UNMAPS", "IB_PEER_MEMORY_NAME_MAX",
        "IB_PEER_MEMORY_VER_MAX",
    ],
    "nv_p2p": [
        "nvidia_p2p_page", "nvidia_p2p_page_table", "nvidia_p2p_dma_mapping",
        "nvidia_p2p_page_size_type", "NVIDIA_P2P_PAGE_SIZE_64KB",
        "NVIDIA_P2P_PAGE_TABLE_VERSION", "NVIDIA_P2P_DMA_MAPPING_VERSION",
        "NVIDIA_P2P_VERSION_COMPATIBLE", "nvidia_p2p_get_pages",
        "nvidia_p2p_put_pages", "nvidia_p2p_free_page_table",
        "nvidia_p2p_dma_map_pages", "nvidia_p2p_dma_unmap_pages",
        "nvidia_p2p_free_dma_mapping", "nvidia_p2p_get_pages_persistent",
        "nvidia_p2p_put_pages_persistent",
    ],
}


class SetupError(Exception):
    pass


def run(cmd, cwd=None, check_rc=True):
    p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    if check_rc and p.returncode != 0:
        raise SetupError("command failed (%d): %s\n%s" %
                         (p.returncode, " ".join(cmd[:3]) + " ...", p.stderr))
    return p


# ---------------------------------------------------------------- enumeration

class Header:
    """What one header declares, in declaration order."""

    def __init__(self):
        self.records = []      # dicts: tag, name, fields, nested
        self.enums = []        # dicts: name (or None), constants [names]
        self.typedefs = {}     # name -> declared type spelling
        self.functions = {}    # name -> (type spelling, storage class)
        self.macros = {}       # name -> (params or None, body)
        self.guard = None
        self.tu_typedefs = {}  # every typedef of the TU (kernel stand-ins too)

    def names(self):
        out = set()
        for r in self.records:
            out.add("%s %s" % (r["tag"], r["name"]))
        for e in self.enums:
            if e["name"]:
                out.add("enum " + e["name"])
            out.update("enumerator " + c for c in e["constants"])
        out.update("typedef " + t for t in self.typedefs)
        out.update("function " + f for f in self.functions)
        out.update("macro " + m for m in self.macros)
        return out

    def plain_names(self):
        return {n.split(" ", 1)[1] for n in self.names()}


def expressible(qt):
    return "(unnamed" not in qt and "(anonymous" not in qt


def canon(qt, tds, depth=0):
    """A type spelling with every typedef name replaced by what it names, so
    that u32 and uint32_t read the same while an enum, a differently sized
    integer or another struct do not (compatibility in C is looser: an enum
    is compatible with its underlying integer type)."""
    if depth > 20:
        raise SetupError("typedef loop while resolving %r" % qt)
    qt = re.sub(r"\((?:unnamed|anonymous) (struct|union|enum) at [^)]*\)", r"(anonymous \1)", qt)
    toks = re.findall(r"\w+|\S", qt)
    out = []
    for i, t in enumerate(toks):
        if t in tds and (i == 0 or toks[i - 1] not in ("struct", "union", "enum")):
            e = canon(tds[t], tds, depth + 1)
            out.append("<%s>" % e if re.search(r"[(*\[]", e) else e)
        else:
            out.append(t)
    return " ".join(out)


def field_types(fields, prefix, out):
    for f in fields:
        out[prefix + f["name"]] = f["type"]
        if f["nested"]:
            sub = prefix + f["name"] + ("[0]" if f["array"] is not None else "") + "."
            field_types(f["nested"]["fields"], sub, out)
    return out


def parse_record(node, path, fn):
    """Fields of a RecordDecl, nested records resolved; fn: header for errors."""
    fields = []
    pending = None
    for ch in node.get("inner", []):
        kind = ch.get("kind")
        if kind == "RecordDecl":
            pending = ch
        elif kind == "FieldDecl":
            if ch.get("isBitfield"):
                raise SetupError("%s: bitfield %s.%s: the checker does not handle bitfields"
                                 % (fn, path, ch.get("name")))
            if not ch.get("name"):
                raise SetupError("%s: anonymous member in %s: not handled" % (fn, path))
            qt = ch["type"]["qualType"]
            m = re.search(r"\[(\d+)\]$", qt)
            f = {"name": ch["name"], "type": qt,
                 "array": int(m.group(1)) if m else None, "nested": None}
            if pending is not None:
                ptag = pending.get("tagUsed")
                pname = pending.get("name")
                base = re.sub(r"(\[\d+\])+$", "", qt).strip()
                if (pname and base == "%s %s" % (ptag, pname)) or \
                        (not pname and not expressible(qt)):
                    f["nested"] = {"tag": ptag, "name": pname,
                                   "fields": parse_record(pending, path + "." + ch["name"], fn)}
                pending = None
            fields.append(f)
        elif kind == "IndirectFieldDecl":
            raise SetupError("%s: anonymous struct/union member in %s: not handled" % (fn, path))
    return fields


def nested_named(fields, out):
    for f in fields:
        if f["nested"]:
            if f["nested"]["name"]:
                out.append({"tag": f["nested"]["tag"], "name": f["nested"]["name"],
                            "fields": f["nested"]["fields"], "nested": True})
            nested_named(f["nested"]["fields"], out)


def enumerate_header(clang, stubs, header, work, tag):
    header = os.path.realpath(header)
    tu = os.path.join(work, "enum-%s.c" % tag)
    with open(tu, "w") as f:
        f.write('#include <linux/types.h>\n#include "%s"\n' % header)
    base = [clang, "-nostdinc", "-isystem", stubs, "--target=x86_64-linux-gnu",
            "-std=gnu11", "-ffreestanding", "-fno-color-diagnostics"]
    p = run(base + ["-fsyntax-only", "-Xclang", "-ast-dump=json", tu], check_rc=False)
    if p.returncode != 0:
        raise SetupError("cannot parse %s for enumeration (if it uses kernel types or macros that the "
                         "stand-ins in tests/host/abi/stubs lack, add them there):\n%s" % (header, p.stderr))
    ast = json.loads(p.stdout)
    h = Header()

    # The JSON dumper prints a location's file only when it differs from the
    # previously printed one, so walk every node in output order and track it.
    state = {"file": None}

    def walk(o):
        if isinstance(o, dict):
            for k, v in o.items():
                if k == "includedFrom":
                    continue
                if k == "file":
                    state["file"] = v
                else:
                    walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)

    for node in ast.get("inner", []):
        if node.get("kind") == "TypedefDecl":
            h.tu_typedefs[node["name"]] = node["type"]["qualType"]
        walk(node.get("loc", {}))
        in_header = state["file"] and os.path.realpath(state["file"]) == header
        walk({k: v for k, v in node.items() if k != "loc"})
        if not in_header or node.get("isImplicit"):
            continue
        kind = node.get("kind")
        name = node.get("name")
        if kind == "RecordDecl":
            if not node.get("completeDefinition"):
                continue  # forward declaration
            if not name:
                raise SetupError("%s: anonymous top-level %s: not handled" % (header, node.get("tagUsed")))
            fields = parse_record(node, name, header)
            h.records.append({"tag": node["tagUsed"], "name": name, "fields": fields, "nested": False})
            nested_named(fields, h.records)
        elif kind == "EnumDecl":
            consts = [c["name"] for c in node.get("inner", []) if c.get("kind") == "EnumConstantDecl"]
            h.enums.append({"name": name, "constants": consts})
        elif kind == "TypedefDecl":
            h.typedefs[name] = node["type"]["qualType"]
        elif kind == "FunctionDecl":
            h.functions[name] = (node["type"]["qualType"], node.get("storageClass", "extern"))
        else:
            raise SetupError("%s: top-level %s '%s': not handled by the checker" % (header, kind, name))

    p = run(base + ["-E", "-dD", tu], check_rc=False)
    if p.returncode != 0:
        raise SetupError("cannot preprocess %s:\n%s" % (header, p.stderr))
    cur = None
    order = []
    for line in p.stdout.splitlines():
        m = re.match(r'^# \d+ "(.*)"', line)
        if m:
            cur = m.group(1)
            continue
        if cur is None or os.path.realpath(cur) != header:
            continue
        m = re.match(r"^#define (\w+)(\(([^)]*)\))?(?:\s(.*))?$", line)
        if m:
            params = None
            if m.group(2) is not None:
                params = [x.strip() for x in m.group(3).split(",") if x.strip()]
            h.macros[m.group(1)] = (params, (m.group(4) or "").strip())
            order.append(m.group(1))
        m = re.match(r"^#undef (\w+)", line)
        if m:
            h.macros.pop(m.group(1), None)
    # The include guard: the first macro, object-like and empty.
    if order and h.macros.get(order[0]) == (None, ""):
        h.guard = order[0]
        del h.macros[order[0]]
    return h


# ------------------------------------------------------------------ the checks

class Check:
    def __init__(self, desc):
        self.desc = desc
        self.values = []     # (expr) whose reference value is asserted in ours
        self.types = []      # (expr, type) to be compatible in both
        self.problems = []   # structural differences found in Python
        self.raw = None      # preprocessor lines instead of asserts
        self.ids = []


def same_spelling(c, what, ref_qt, ref, ours_qt, ours):
    if ours_qt is None:
        return
    a, b = canon(ref_qt, ref.tu_typedefs), canon(ours_qt, ours.tu_typedefs)
    if a != b:
        c.problems.append("%s type differs: reference '%s' = %s; ours '%s' = %s" % (what, ref_qt, a, ours_qt, b))


def field_checks(rec_type, fields, prefix, desc_prefix, checks, ref, ours, ours_types):
    for f in fields:
        path = prefix + f["name"]
        member = "((%s *)0)->%s" % (rec_type, path)
        c = Check("%s.%s" % (desc_prefix, path.replace("[0]", "[]")))
        c.values = ["__builtin_offsetof(%s, %s)" % (rec_type, path),
                    "sizeof(%s)" % member,
                    "_Alignof(__typeof__(%s))" % member,
                    "__builtin_classify_type(%s)" % member]
        if expressible(f["type"]):
            c.types.append(("__typeof__(%s)" % member, f["type"]))
        same_spelling(c, "field", f["type"], ref, ours_types.get(path), ours)
        checks.append(c)
        if f["nested"]:
            sub = path + ("[0]" if f["array"] is not None else "") + "."
            field_checks(rec_type, f["nested"]["fields"], sub, desc_prefix, checks, ref, ours, ours_types)


def shape(fields):
    return [(f["name"], shape(f["nested"]["fields"]) if f["nested"] else None) for f in fields]


def pointer_params(clang, stubs, header, ref, work):
    """For each function-like macro, which parameters take a pointer to a
    versioned structure rather than a number: try every combination in one
    compile and keep the first one that is accepted."""
    lines = ["#include <linux/types.h>\n", '#include "%s"\n' % os.path.realpath(header),
             "struct peermem_abi_vs { unsigned int version; };\n"]
    owner = {}
    for n, (params, body) in ref.macros.items():
        if params is None:
            continue
        for mask in range(1 << len(params)):
            ptrs = {p for i, p in enumerate(params) if mask & (1 << i)}
            args = macro_args(params, ptrs)[0]
            owner[len(lines) + 1] = (n, mask, ptrs)
            lines.append("extern char peermem_abi_try_%d[sizeof(%s(%s))];\n" % (len(lines), n, ", ".join(args)))
    src = os.path.join(work, "kinds.c")
    with open(src, "w") as f:
        f.writelines(lines)
    p = run([clang, "-nostdinc", "-isystem", stubs, "--target=x86_64-linux-gnu", "-std=gnu11",
             "-ffreestanding", "-fno-color-diagnostics", "-fsyntax-only", "-ferror-limit=0", src],
            check_rc=False)
    bad = set()
    for m in re.finditer(r"^(.*?):(\d+):\d+: (?:fatal )?error:", p.stderr, re.M):
        if os.path.realpath(m.group(1)) == os.path.realpath(src):
            bad.add(int(m.group(2)))
    kinds = {}
    for line in sorted(owner):
        n, mask, ptrs = owner[line]
        if line not in bad and n not in kinds:
            kinds[n] = ptrs
    for n, (params, body) in ref.macros.items():
        if params is not None and n not in kinds:
            raise SetupError("%s: no argument kinds make macro %s usable (numbers or pointers to "
                             "a struct with a version field)" % (header, n))
    return kinds


def macro_args(params, ptrs):
    """All grid points: list of argument lists (C text)."""
    points = [[]]
    for p in params:
        nxt = []
        for pt in points:
            for v in GRID:
                if p in ptrs:
                    a = "(&(struct peermem_abi_vs){ .version = 0x%xU })" % v
                else:
                    a = "0x%xU" % v
                nxt.append(pt + [a])
        points = nxt
    return points


def build_checks(label, ref, ours, kinds, allowed=None):
    checks = []
    missing = [n for n in REQUIRED.get(label, []) if n not in ref.plain_names()]
    c = Check("%s: reference declares the core ABI names (%d found in it)" % (label, len(ref.names())))
    if missing:
        c.problems.append("reference enumeration lacks: " + ", ".join(missing))
    checks.append(c)

    ours_rec = {(r["tag"], r["name"]): r for r in ours.records}
    for r in ref.records:
        t = "%s %s" % (r["tag"], r["name"])
        c = Check("%s: %s: size, alignment, field names and order" % (label, t))
        c.values = ["sizeof(%s)" % t, "_Alignof(%s)" % t]
        o = ours_rec.get((r["tag"], r["name"]))
        if o is None:
            c.problems.append("ours does not define %s" % t)
        elif shape(o["fields"]) != shape(r["fields"]):
            c.problems.append("fields differ: reference %s, ours %s" % (shape(r["fields"]), shape(o["fields"])))
        checks.append(c)
        if not r["nested"]:
            ot = field_types(o["fields"], "", {}) if o else {}
            field_checks(t, r["fields"], "", "%s: %s" % (label, t), checks, ref, ours, ot)

    ours_enums = {e["name"]: e for e in ours.enums if e["name"]}
    ours_anon = [tuple(e["constants"]) for e in ours.enums if not e["name"]]
    for e in ref.enums:
        if e["name"]:
            c = Check("%s: enum %s: size and enumerators" % (label, e["name"]))
            c.values = ["sizeof(enum %s)" % e["name"], "_Alignof(enum %s)" % e["name"]]
            o = ours_enums.get(e["name"])
            if o is None:
                c.problems.append("ours does not define enum %s" % e["name"])
            elif o["constants"] != e["constants"]:
                c.problems.append("enumerators differ: reference %s, ours %s" % (e["constants"], o["constants"]))
        else:
            c = Check("%s: anonymous enum {%s}" % (label, ", ".join(e["constants"])))
            if tuple(e["constants"]) not in ours_anon:
                c.problems.append("ours has no anonymous enum with exactly these enumerators (in this order)")
        checks.append(c)
        for k in e["constants"]:
            c = Check("%s: enumerator %s" % (label, k))
            c.values = [k, "sizeof(%s)" % k]
            checks.append(c)

    for n, qt in ref.typedefs.items():
        c = Check("%s: typedef %s" % (label, n))
        c.values = ["sizeof(%s)" % n]
        if expressible(qt):
            c.types.append((n, qt))
        if n not in ours.typedefs:
            c.problems.append("ours does not declare typedef %s" % n)
        same_spelling(c, "typedef", qt, ref, ours.typedefs.get(n), ours)
        checks.append(c)

    for n, (qt, sc) in ref.functions.items():
        c = Check("%s: function %s" % (label, n))
        c.types.append(("__typeof__(%s)" % n, qt))
        o = ours.functions.get(n)
        if o is None:
            c.problems.append("ours does not declare function %s" % n)
        else:
            if o[1] != sc:
                c.problems.append("storage class: reference %s, ours %s" % (sc, o[1]))
            same_spelling(c, "function", qt, ref, o[0], ours)
        checks.append(c)

    for n, (params, body) in ref.macros.items():
        o = ours.macros.get(n)
        if params is None and body == "":
            c = Check("%s: macro %s is defined (empty)" % (label, n))
            c.raw = ["#ifndef %s" % n, "#error %s is not defined" % n, "#endif"]
            if o is not None and o != (None, ""):
                c.problems.append("ours defines it as %r" % (o,))
        elif params is None:
            c = Check("%s: macro %s: value and type" % (label, n))
            c.values = ["(%s)" % n, "sizeof(%s)" % n,
                        "((__typeof__(%s))-1 < (__typeof__(%s))0)" % (n, n)]
            if o is not None and o[0] is not None:
                c.problems.append("ours is function-like")
        else:
            c = Check("%s: macro %s(%s): results on %d inputs" %
                      (label, n, ", ".join(params), len(GRID) ** len(params)))
            ptrs = kinds[n]
            c.values = ["%s(%s)" % (n, ", ".join(a)) for a in macro_args(params, ptrs)]
            if o is not None and (o[0] is None or len(o[0]) != len(params)):
                c.problems.append("ours takes %s parameters" % ("no" if o[0] is None else len(o[0])))
        if o is None:
            c.problems.append("ours does not define macro %s" % n)
        checks.append(c)

    if allowed:
        c = Check("%s: every name our header declares beyond the reference is pinned by %s"
                  % (label, allowed[0]))
    else:
        c = Check("%s: our header declares no names the reference lacks" % label)
    extra = sorted(n for n in ours.names() - ref.names()
                   if not (allowed and n.split(" ", 1)[1] in allowed[1]))
    if extra:
        c.problems.append("extra in ours: " + ", ".join(extra))
    checks.append(c)
    return checks


# ----------------------------------------------------- facts of newer drivers

# The macro our header reads to declare the page-table layout of a major
# (include/nv_p2p_abi.h); set per tag from that tag's version fact.
LAYOUT_SELECTOR = "PEERMEM_NV_P2P_PAGE_TABLE_MAJOR"
IDENT = re.compile(r"[A-Za-z_]\w*")
C_WORDS = {"sizeof", "offsetof", "_Alignof", "struct", "union", "enum"}


def read_newer(path):
    """Rows (line, tag, item, value, ours) of the facts file, and the layout
    (page-table major) of each tag."""
    rows = []
    try:
        lines = open(path).read().splitlines()
    except OSError as e:
        raise SetupError("cannot read %s: %s" % (path, e))
    for n, l in enumerate(lines, 1):
        if not l.strip() or l.startswith("#"):
            continue
        f = l.split("\t")
        if len(f) not in (3, 4) or not all(x.strip() for x in f):
            raise SetupError("%s:%d: expected tag, item, value[, ours] separated by tabs" % (path, n))
        try:
            val = int(f[2], 0)
        except ValueError:
            raise SetupError("%s:%d: value %r is not an integer" % (path, n, f[2]))
        if not re.match(r"^\d+\.\d+(\.\d+)?$", f[0]):
            raise SetupError("%s:%d: tag %r is not a driver version" % (path, n, f[0]))
        rows.append((n, f[0], f[1].strip(), val, f[3].strip() if len(f) == 4 else None))
    if len(rows) < 10:
        raise SetupError("%s holds %d facts; expected the 550..595 page-table facts" % (path, len(rows)))
    layout = {}
    for n, tag, item, val, ours in rows:
        if item == "NVIDIA_P2P_PAGE_TABLE_VERSION" and ours is None:
            layout[tag] = val >> 16
    for n, tag, item, val, ours in rows:
        if tag not in layout:
            raise SetupError("%s: tag %s has no NVIDIA_P2P_PAGE_TABLE_VERSION row (it fixes the layout "
                             "our header is compiled with)" % (path, tag))
    return rows, layout


def newer_names(rows):
    """Every identifier the facts mention: the names our header may declare
    beyond the 550 reference (plus the layout selector)."""
    names = {LAYOUT_SELECTOR}
    for n, tag, item, val, ours in rows:
        for e in (item, ours or ""):
            names.update(w for w in IDENT.findall(e) if w not in C_WORDS)
    return names


def newer_checks(kcmd, kdir, header, path, rows, layout, work):
    """Each fact evaluated on our header compiled for its tag's layout."""
    results = []
    for major in sorted(set(layout.values())):
        checks, vals = [], {}
        for n, tag, item, val, ours in rows:
            if layout[tag] != major:
                continue
            expr = (ours or item).replace("offsetof(", "__builtin_offsetof(")
            c = Check("nv_p2p %s (%s:%d, page-table major %d): %s == %#x%s"
                      % (tag, os.path.basename(path), n, major, item, val,
                         " as our %s" % ours if ours else ""))
            c.values = ["(%s)" % expr]
            c.ids = [len(vals)]
            vals[len(vals)] = val & 0xffffffffffffffff
            checks.append(c)
        errs, unattributed = ours_probe(kcmd + ["-D%s=%d" % (LAYOUT_SELECTOR, major)], kdir,
                                        header, checks, vals, work, "newer-%d" % major)
        for i, c in enumerate(checks):
            results.append((i not in errs, c.desc, errs.get(i, [])))
        results.append((not unattributed, "nv_p2p: our header compiled with %s=%d has no stray diagnostics"
                        % (LAYOUT_SELECTOR, major), unattributed[:20]))
    return results


# --------------------------------------------------------------------- probes

PROBE_HEAD = """\
/* generated by tests/host/abi/abicheck.py */
#include <linux/types.h>
#include "%s"
struct peermem_abi_vs { unsigned int version; };
"""


def ref_probe(kcmd, kdir, header, checks, work, tag):
    """Values of every check's expressions, computed against the reference."""
    src = os.path.join(work, "ref-%s.c" % tag)
    exprs = []
    lines = [PROBE_HEAD % os.path.realpath(header)]
    for c in checks:
        for e, t in c.types:
            lines.append('_Static_assert(__builtin_types_compatible_p(%s, %s), "reference type");\n' % (e, t))
        if c.raw:
            lines.extend(l + "\n" for l in c.raw)
    lines.append("void peermem_abi_probe(void);\nvoid peermem_abi_probe(void)\n{\n")
    for c in checks:
        for e in c.values:
            c.ids.append(len(exprs))
            lines.append('\tasm volatile(".ascii \\"@@abi %d %%c0\\"" : : "i" ((unsigned long long)(%s)));\n'
                         % (len(exprs), e))
            exprs.append(e)
    lines.append("}\n")
    with open(src, "w") as f:
        f.writelines(lines)
    p = run(kcmd + ["-fno-color-diagnostics", "-S", "-o", "-", src], cwd=kdir, check_rc=False)
    if p.returncode != 0:
        raise SetupError("the probe does not compile against the reference %s (a checker bug or an "
                         "unexpected reference):\n%s" % (header, p.stderr[:4000]))
    vals = {}
    for m in re.finditer(r"@@abi (\d+) (-?\d+)", p.stdout):
        vals[int(m.group(1))] = int(m.group(2)) & 0xffffffffffffffff
    if len(vals) != len(exprs):
        raise SetupError("probe output has %d of %d values" % (len(vals), len(exprs)))
    return vals


def ours_probe(kcmd, kdir, header, checks, vals, work, tag):
    """Compile one line of assertions per check against our header."""
    src = os.path.join(work, "ours-%s.c" % tag)
    text = PROBE_HEAD % os.path.realpath(header)
    line = text.count("\n") + 1
    owner = {}
    body = []
    for i, c in enumerate(checks):
        parts = []
        for e, t in c.types:
            parts.append('_Static_assert(__builtin_types_compatible_p(%s, %s), "type as in the reference");'
                         % (e, t))
        for e, k in zip(c.values, c.ids):
            parts.append('_Static_assert((unsigned long long)(%s) == 0x%xULL, "value as in the reference");'
                         % (e, vals[k]))
        if c.raw:
            for l in c.raw:
                body.append(l + "\n")
                owner[line] = i
                line += 1
        if parts:
            body.append(" ".join(parts) + "\n")
            owner[line] = i
            line += 1
    with open(src, "w") as f:
        f.write(text + "".join(body))
    p = run(kcmd + ["-fno-color-diagnostics", "-fsyntax-only", "-ferror-limit=0", src],
            cwd=kdir, check_rc=False)
    errs = {}
    unattributed = []
    cur = None
    for l in p.stderr.splitlines():
        m = re.match(r"^(.*?):(\d+):\d+: (fatal error|error|warning): (.*)$", l)
        if m:
            cur = None
            if os.path.realpath(m.group(1)) == os.path.realpath(src) and int(m.group(2)) in owner:
                cur = owner[int(m.group(2))]
                errs.setdefault(cur, []).append(m.group(4))
            elif m.group(3) != "warning" or os.path.realpath(m.group(1)) == os.path.realpath(header):
                unattributed.append(l)
        elif cur is not None and ("evaluates to" in l or "note:" in l) and len(errs[cur]) < 6:
            errs[cur].append(l.strip())
    if p.returncode != 0 and not errs and not unattributed:
        unattributed.append(p.stderr.strip()[:2000] or "compiler failed without diagnostics")
    return errs, unattributed


def standalone(kcmd, kdir, header, work, tag):
    """Our header alone must compile under the kernel's flags, silently."""
    src = os.path.join(work, "alone-%s.c" % tag)
    with open(src, "w") as f:
        f.write('#include "%s"\n' % os.path.realpath(header))
    p = run(kcmd + ["-fno-color-diagnostics", "-fsyntax-only", src], cwd=kdir, check_rc=False)
    out = p.stderr.strip()
    return p.returncode == 0 and not out, out


# ----------------------------------------------------------------------- main

def kernel_command(cmdfile, kdir):
    """The kernel's own compiler command line for a module object, from the
    .cmd file kbuild saved, minus dependency output, -c, -o and the source;
    and the directory it must run in (kbuild runs external-module compiles
    from KDIR before 6.13 and from the module directory since, which shows
    in whether the -o path is absolute)."""
    try:
        text = open(cmdfile).read()
    except OSError as e:
        raise SetupError("cannot read %s: %s" % (cmdfile, e))
    m = re.search(r"^savedcmd_\S+ := (.*)$", text, re.M) or re.search(r"^cmd_\S+ := (.*)$", text, re.M)
    if not m:
        raise SetupError("%s holds no saved command" % cmdfile)
    words = []
    for w in shlex.split(m.group(1)):  # kbuild may chain more commands with ';'
        if w.endswith(";") or w in ("&&", "||"):
            if w.rstrip(";"):
                words.append(w.rstrip(";"))
            break
        words.append(w)
    out, skip, obj = [], False, None
    for i, w in enumerate(words):
        if skip:
            skip = False
            obj = w
            continue
        if w == "-o":
            skip = True
        elif w == "-c" or w.startswith("-Wp,-MMD") or w.startswith("-Wp,-MD"):
            continue
        elif i == len(words) - 1 and w.endswith(".c"):
            continue
        else:
            out.append(w)
    if obj is None or not out:
        raise SetupError("unexpected compile command in %s" % cmdfile)
    return out, (kdir if os.path.isabs(obj) else os.path.dirname(os.path.abspath(cmdfile)))


def uapi_checks(kcmd, kdir, label, header, layout, work):
    """A user-space header (include/uapi/...): compiles alone under the
    kernel's flags, and the layout file's static asserts hold for the host
    compiler's 64-bit ABI, its 32-bit ABI (when it has one) and C++.
    Returns TAP results (ok, desc, diag); a skip says why in its desc."""
    results = []
    for h in (header, layout):
        if not os.path.isfile(h):
            raise SetupError("header not found: %s" % h)
    ok, out = standalone(kcmd, kdir, header, work, label)
    results.append((ok, "%s: %s compiles alone under the kernel's flags without diagnostics"
                    % (label, os.path.basename(header)), out.splitlines()[:20]))
    # -I the directory above uapi/, as user space includes <uapi/peermem.h>'s tree.
    inc = os.path.dirname(os.path.dirname(os.path.abspath(header)))
    variants = [("C, the host's 64-bit ABI", ["cc", "-std=c11"]),
                ("C, the host's 32-bit ABI", ["cc", "-m32", "-std=c11"]),
                ("C++", ["c++", "-x", "c++", "-std=c++11"])]
    for what, cc in variants:
        if shutil.which(cc[0]) is None:
            results.append((True, "%s: layout (%s) # SKIP no %s on the host" % (label, what, cc[0]), []))
            continue
        if "-m32" in cc:
            probe = subprocess.run(cc + ["-fsyntax-only", "-x", "c", "-"], input="#include <linux/types.h>\n",
                                   capture_output=True, text=True)
            if probe.returncode != 0:
                results.append((True, "%s: layout (%s) # SKIP the host compiler has no 32-bit headers (gcc-multilib)"
                                % (label, what), []))
                continue
        r = subprocess.run(cc + ["-Wall", "-Werror", "-fsyntax-only", "-I", inc, layout],
                           capture_output=True, text=True)
        results.append((r.returncode == 0,
                        "%s: every size, offset and number %s fixes holds (%s)"
                        % (label, os.path.basename(layout), what),
                        (r.stdout + r.stderr).splitlines()[:20]))
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kdir", required=True, help="the kernel build dir (KDIR)")
    ap.add_argument("--kbuild-cmd", required=True,
                    help="a .<obj>.o.cmd file kbuild wrote for an out-of-tree object built against KDIR")
    ap.add_argument("--clang", help="compiler for the enumeration step (default: the kernel's)")
    ap.add_argument("--stubs", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--pair", nargs=3, action="append", metavar=("LABEL", "REF", "OURS"), required=True)
    ap.add_argument("--newer", help="facts of newer nv-p2p.h versions (nv_p2p_newer.tsv), checked "
                    "against the nv_p2p pair's header; names they mention may be extra in it")
    ap.add_argument("--uapi", nargs=3, action="append", default=[], metavar=("LABEL", "HEADER", "LAYOUT"),
                    help="a user-space header and a C file of static asserts fixing its layout")
    a = ap.parse_args()

    try:
        kcmd, kcwd = kernel_command(a.kbuild_cmd, a.kdir)
    except SetupError as e:
        print("1..1\nnot ok 1 - ABI checker setup\n#   %s" % e)
        return 1
    a.clang = a.clang or kcmd[0]
    a.kdir = kcwd
    results = []   # (ok, desc, diag lines)
    newer = None
    try:
        if a.newer:
            newer = read_newer(a.newer)
        for label, refh, oursh in a.pair:
            for h in (refh, oursh):
                if not os.path.isfile(h):
                    raise SetupError("header not found: %s" % h)
            ref = enumerate_header(a.clang, a.stubs, refh, a.work, "ref-" + label)
            ours = enumerate_header(a.clang, a.stubs, oursh, a.work, "ours-" + label)
            ok, out = standalone(kcmd, a.kdir, oursh, a.work, label)
            results.append((ok, "%s: %s compiles alone under the kernel's flags without diagnostics"
                            % (label, os.path.basename(oursh)), out.splitlines()[:20]))
            kinds = pointer_params(a.clang, a.stubs, refh, ref, a.work)
            allowed = None
            if label == "nv_p2p" and newer is not None:
                allowed = (os.path.basename(a.newer), newer_names(newer[0]))
            checks = build_checks(label, ref, ours, kinds, allowed)
            vals = ref_probe(kcmd, a.kdir, refh, checks, a.work, label)
            errs, unattributed = ours_probe(kcmd, a.kdir, oursh, checks, vals, a.work, label)
            for i, c in enumerate(checks):
                diag = c.problems + errs.get(i, [])
                results.append((not diag, c.desc, diag))
            results.append((not unattributed, "%s: probe of our header has no stray diagnostics" % label,
                            unattributed[:20]))
            if label == "nv_p2p" and newer is not None:
                results.extend(newer_checks(kcmd, a.kdir, oursh, a.newer, newer[0], newer[1], a.work))
        for label, header, layout in a.uapi:
            results.extend(uapi_checks(kcmd, a.kdir, label, header, layout, a.work))
    except SetupError as e:
        results.append((False, "ABI checker setup", str(e).splitlines()[:40]))

    print("1..%d" % len(results))
    failed = 0
    for n, (ok, desc, diag) in enumerate(results, 1):
        print("%s %d - %s" % ("ok" if ok else "not ok", n, desc))
        if not ok:
            failed += 1
            for d in diag:
                print("#   " + d)
    if failed:
        print("# %d of %d ABI checks failed" % (failed, len(results)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
