#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# The instruction-count tools of the benchmark's profile mode (issue 26):
# the QEMU TCG plugin tests/bench/insncount builds without a warning, and
# tests/bench/insns.py turns a made-up dump (two sides, two blocks each,
# a module function named from "ksym" lines, the kernel's from a
# System.map) into the exact per-operation counts, and refuses dumps that
# do not match the guest's output. Not part of tests/run-all.sh (a
# measurement tool, no CI time); run it after changing either. No VM;
# prints TAP.
#
#   tests/host/bench/insns.sh
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0 fail=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
bad() { n=$((n + 1)); fail=1; echo "not ok $n - $1"; }

if make -s -C "$root/tests/bench/insncount" CC="${CC:-gcc}" >"$tmp/make.log" 2>&1 &&
	[ -f "$root/tests/bench/insncount/insncount.so" ]; then
	ok "the plugin builds with -Werror"
else
	bad "the plugin builds with -Werror ($(tail -n 3 "$tmp/make.log" | tr '\n' ' '))"
fi

cat >"$tmp/System.map" <<'M'
ffffffff81000000 T kfunc_a
ffffffff81000100 T kfunc_b
ffffffff81000200 D some_data
M
cat >"$tmp/profile.txt" <<'P'
insns-dump peermem 65536 10
ksym peermem ffffffffa0000000 t pm_fn	[peermem]
insns-dump nvidia-peermem 65536 10
ksym nvidia-peermem ffffffffa0000000 t nv_fn	[nvidia_peermem]
P
# Side 1: kfunc_a 5 insns x 20, pm_fn 3 x 10 (+ a user block 2 x 10);
# side 2: kfunc_a 5 x 20, kfunc_b 4 x 10 (one of them atomic, one a TLB
# flush; the block ends in a return, 30 lookups in the jump-cache model of
# which 10 missed), nv_fn 1 x 10, and the per-vCPU lines of the newer
# plugin (vCPU 0: 150 instructions, 40 blocks; where they ran). Side 1's
# lines have the older four columns.
cat >"$tmp/dumps.txt" <<'D'
dump 0 translated 3 10
ffffffff81000010 5 20 0
ffffffffa0000004 3 10 0
0000000000401000 2 10 0
end
dump 1 translated 0 0
ffffffff81000010 5 20 0
ffffffff81000104 4 10 1 1 0,0,0,0,0,0 1 30 10
ffffffffa0000000 1 10 0
io ffffffff81000104 fed90000 3
tr ffffffff81000104 4
vcpu 0 150 40
split 0 0 140 10
end
D
out=$(python3 "$root/tests/bench/insns.py" "$tmp/dumps.txt" "$tmp/profile.txt" "$tmp/System.map" 10 2>&1)
# check ERE WHAT GOT: ok WHAT if a line of insns.py's output matches ERE,
# else say what it printed instead (GOT: a grep ERE picking those lines).
check() {
	if grep -Eq -- "$1" <<<"$out"; then ok "$2"; else bad "$2 (got: $(grep -E -- "$3" <<<"$out" | tr '\n' ' '))"; fi
}
tail_re='atomic \(lock-prefixed\) instructions'
check "^peermem: 15 guest instructions per operation .*blocks run per operation 4, $tail_re 0, TLB-flushing \(CR3 write, INVLPG, INVPCID\) 0.00; blocks ending in a return 0, an indirect call or jump 0, popf/sti/stac/clac 0\$" \
	"side 1: (5x20 + 3x10 + 2x10) / 10 = 15 instructions, 4 blocks per operation" '^peermem: '
check "^nvidia-peermem: 15 guest instructions per operation .*blocks run per operation 4, $tail_re 1, TLB-flushing \(CR3 write, INVLPG, INVPCID\) 1.00; blocks ending in a return 1, an indirect call or jump 0, popf/sti/stac/clac 0\$" \
	"side 2: (5x20 + 4x10 + 1x10) / 10 = 15 instructions, 4 blocks, 1 atomic and 1 TLB flush per operation" '^nvidia-peermem: '
check '^  nvidia-peermem: 15 / 4$' "the per-vCPU lines: instructions and blocks per operation" 'vCPU|^  nvidia-peermem: [0-9]+ /'
check '^  nvidia-peermem: 3 / 1$' "the jump-cache model's lookups and misses per operation, summed over the blocks" 'jump cache|^  nvidia-peermem: [0-9]+ /'
check '^  nvidia-peermem: 15 \(0 \+ 14 \+ 1\)$' "the split lines: instructions per operation by where they ran" 'where they ran|^  nvidia-peermem: 15'
check 'nvidia-peermem: .*kernel: the rest 2; 3 / 1' "by module: distinct blocks, the model's lookups and misses per operation" 'distinct|kernel: the rest'
check '^ +\+3 +3 +0  pm_fn \[peermem\]$' "a module's function is named from the side's ksym lines" 'pm_fn'
check '^ +-4 +0 +4  kfunc_b$' "a kernel function is named from System.map" 'kfunc_b'
check 'peermem: .*peermem 3 / 1; user space 2 / 1' "by module: the module's and user space's instructions and blocks" 'gpusim|user space'
# fast=1: no block lines, the inline counters only (10 + 60 + 30
# instructions over 10 operations on vCPU 0; vCPU 1 ran nothing).
cat >"$tmp/fast.txt" <<'D'
dump 0 translated 0 0
vcpu 0 100 20
split 0 10 60 30
end
dump 1 translated 0 0
vcpu 0 50 10
split 0 5 40 5
end
D
out=$(python3 "$root/tests/bench/insns.py" "$tmp/fast.txt" "$tmp/profile.txt" "$tmp/System.map" 2>&1)
check '^  peermem: 10 \(1 \+ 6 \+ 3\)$' "fast=1: instructions per operation split into user space, kernel text and modules" 'fast=1|^  peermem:|Traceback'
head -n 2 "$tmp/profile.txt" >"$tmp/short.txt"
if python3 "$root/tests/bench/insns.py" "$tmp/dumps.txt" "$tmp/short.txt" "$tmp/System.map" >/dev/null 2>&1; then
	bad "two dumps against one insns-dump line are refused"
else
	ok "two dumps against one insns-dump line are refused"
fi
echo "1..$n"
exit $fail
