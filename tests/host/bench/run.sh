#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# tests/bench/report.py on the host, where scripts/bench.sh runs it: the
# PFN benchmark's output (pfnmap-smoke.raw, bench_pfnmap --rounds 2 --mib 1
# in the debug rig, as tests/guest/bench/t_bench_pfnmap_smoke keeps it in
# $PEERMEM_RESULTS/bench_pfnmap.raw) turned into JSON (`report.py results`:
# the "pfnmap" block, the summary of its four figures, the per-round ratio)
# and a table (`report.py table`: the PFN table and its ratio line). Until
# 2026-11-26 the guest smoke ran this in the rig, where a Python start and
# report.py's compilation cost 30 s of CI's time (issue 27). The guest
# smoke checks that bench_pfnmap still prints the lines read here. No VM;
# prints TAP.
#
#   tests/host/bench/run.sh
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
report=$root/tests/bench/report.py
raw=$here/pfnmap-smoke.raw
rounds=2 mib=1
py=python3
[ -x /usr/bin/python3 ] && py=/usr/bin/python3
n=0 nfail=0
ok() { # ok STATUS DESCRIPTION: a result, ok if STATUS is 0
	n=$((n + 1))
	if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; nfail=$((nfail + 1)); fi
}
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT

# The check can fail: the same output with one round's staged samples
# missing is not a summary of two rounds (checked last, below).
grep -v '^sample pfn_send_s [0-9]*M staged 1 ' "$raw" > "$tmp/short.raw"
# One interpreter for all of it: `report.py results` through report.main(),
# the JSON's shape, then `report.py table`; first the short output's summary.
"$py" - "$report" "$raw" "$tmp/r.json" $rounds $mib "$tmp/short.raw" "$tmp/s.json" >"$tmp/shape" 2>&1 <<'PY'
import contextlib, io, json, math, os, sys
report_py, raw, path, rounds, mib = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
short_raw, short_path = sys.argv[6], sys.argv[7]
sys.path.insert(0, os.path.dirname(report_py))
sys.dont_write_bytecode = True
import report

def call(args, out):
    """report.py ARGS, in this interpreter: its exit status (or the exception)."""
    sys.argv = [report_py] + args
    try:
        with contextlib.redirect_stdout(out):
            report.main()
        return 0
    except SystemExit as e:
        return e.code or 0
    except Exception as e:
        return "%s: %s" % (type(e).__name__, e)

rc = call(["results", "--raw", short_raw, "--json", short_path], io.StringIO())
if rc != 0:
    print("short: results: exit %s" % rc)
else:
    e = (json.load(open(short_path))["summary"].get("pfn_send_s/%dM" % mib) or {}).get("staged") or {}
    print("short: staged samples: %s" % e.get("n"))
rc = call(["results", "--raw", raw, "--json", path, "--meta", "kernel_variant=smoke"], io.StringIO())
print("results: exit %s" % rc)
if rc != 0:
    sys.exit(2)
doc = json.load(open(path))
p = "%dM" % mib
pfn = doc.get("pfnmap") or {}
bad = []
if pfn.get("param") != p or pfn.get("bytes") != mib << 20 or pfn.get("rounds") != rounds:
    bad.append("pfnmap block %r" % {k: pfn.get(k) for k in ("param", "bytes", "rounds")})
for k in ("staged_over_direct", "stage_write_over_direct"):
    v = pfn.get(k)
    if not isinstance(v, float) or not math.isfinite(v) or v <= 0:
        bad.append("pfnmap.%s = %r" % (k, v))
rr = pfn.get("staged_over_direct_per_round") or {}
if rr.get("n") != rounds:
    bad.append("per-round ratio over %r rounds" % rr.get("n"))
for fig, side in (("pfn_send_s", "direct"), ("pfn_send_s", "staged"),
                  ("pfn_memcpy_s", "staged"), ("pfn_stage_write_s", "staged")):
    e = (doc["summary"].get("%s/%s" % (fig, p)) or {}).get(side) or {}
    if e.get("n") != rounds or not e.get("median", 0) > 0:
        bad.append("summary %s/%s %s: %r" % (fig, p, side, e))
print("JSON: " + ("; ".join(bad) if bad else "pfnmap staged/direct %.2f, summary of 4 figures over %d rounds"
                  % (pfn["staged_over_direct"], rounds)))
out = io.StringIO()
rc = call(["table", path], out)
with open(path + ".table", "w") as f:
    f.write(out.getvalue())
print("table: exit %s" % rc)
sys.exit(1 if bad else 0)
PY
st=$?
if [ ! -f "$raw" ]; then
	ok 1 "the recorded output $raw exists"
elif ! grep -q '^results: exit 0$' "$tmp/shape"; then
	ok 1 "report.py results turns the output into JSON: $(grep -m1 '^results: ' "$tmp/shape" || tail -n 1 "$tmp/shape")"
else
	ok $st "report.py results: the JSON has the PFN figures ($(sed -n 's/^JSON: //p' "$tmp/shape"; tail -n 1 "$tmp/shape" | grep -v '^table: '))"
	miss=
	for l in "PFN-mapped memory, $mib MiB by RDMA WRITE" "straight from the PFN-mapped ring" \
		"memcpy into a registered staging buffer" "of which the memcpy" \
		"of which the RDMA WRITE from the staging buffer"; do
		grep -qF -- "$l" "$tmp/r.json.table" 2>/dev/null || miss+=" '$l'"
	done
	grep -qE '^staged / direct: [0-9]+\.[0-9]{2} ' "$tmp/r.json.table" 2>/dev/null || miss+=" 'staged / direct: N.NN'"
	grep -q '^table: exit 0$' "$tmp/shape"
	st=$?
	ok $((st != 0 || ${#miss} != 0)) "report.py table prints the PFN table and the ratio ($(sed -n 's/^table: //p' "$tmp/shape")${miss:+; missing:$miss})"
	sed 's/^/#   /' "$tmp/r.json.table" 2>/dev/null
fi
got=$(sed -n 's/^short: //p' "$tmp/shape")
[ "$got" = "staged samples: 1" ] || [[ $got == "results: exit "* ]]
ok $? "a round's missing samples show in the summary ($got)"
echo "1..$n"
[ "$nfail" = 0 ]
