#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# Calibration modules for the benchmark (issue 26, docs/benchmarks.md "What
# the rest is"): NVIDIA's nvidia-peermem, built under the name peermem so
# that scripts/bench.sh can run it in peermem's turn (BENCH_PM_KO=...):
#
#   OUT/aa/peermem.ko      nvidia-peermem.c unchanged: an A/A run, what
#                          ratio two identical clients get
#   OUT/onepin/peermem.ko  nvidia-peermem.c with nv_mem_acquire's probe pin
#                          (its nvidia_p2p_get_pages + nvidia_p2p_put_pages)
#                          compiled out: one pin per registration, as thin
#                          as nvidia-peermem otherwise (an experiment, not a
#                          client: it claims every address, GPU or not)
#
#   tests/bench/calibration-modules.sh --kdir KDIR --llvm SUFFIX --gpusim-symvers FILE --out DIR
#
# Reads the source tests/nvpeermem/build.sh extracted into
# $PEERMEM_CACHE/nvpeermem/src-*/ (run it first) and the build flags it
# wrote; the change to NVIDIA's file is made at build time in DIR, never
# committed. OUT must be where the guest sees it (not under /tmp).
set -euo pipefail
kdir= llvm= gsyms= out=
while [ $# -gt 0 ]; do
	case $1 in
	--kdir) kdir=$2; shift 2 ;;
	--llvm) llvm=$2; shift 2 ;;
	--gpusim-symvers) gsyms=$2; shift 2 ;;
	--out) out=$2; shift 2 ;;
	*) echo "calibration-modules: unknown argument $1" >&2; exit 2 ;;
	esac
done
fail() { echo "calibration-modules: $1" >&2; exit 1; }
[ -n "$kdir" ] && [ -n "$gsyms" ] && [ -n "$out" ] ||
	fail "usage: $0 --kdir KDIR --llvm SUFFIX --gpusim-symvers FILE --out DIR"
case $out in /tmp/*) fail "--out $out: the guest has a /tmp of its own; use a directory it sees (e.g. under \$PEERMEM_CACHE)" ;; esac
cache=${PEERMEM_CACHE:-$HOME/.cache/peermem}
src=$(ls -d "$cache"/nvpeermem/src-*/ 2>/dev/null | head -n1)
[ -n "$src" ] && [ -f "$src/nvidia-peermem.c" ] ||
	fail "no nvidia-peermem source in $cache/nvpeermem/src-*/: run tests/nvpeermem/build.sh first"
# The flags build.sh gives it, from one of its build directories.
kb=$(ls "$cache"/nvpeermem/build-*/Kbuild 2>/dev/null | head -n1)
[ -n "$kb" ] || fail "no build directory of tests/nvpeermem/build.sh in $cache/nvpeermem"
flags=$(grep '^ccflags-y' "$kb")

build() { # build NAME OBJ: DIR/NAME/peermem.ko from DIR/NAME/OBJ.c
	local d=$out/$1
	cp "$src"/*.h "$d/"
	cat >"$d/conftest.h" <<'EOF'
/* tests/bench/calibration-modules.sh: as tests/nvpeermem/build.sh writes it. */
#define NV_MLNX_IB_PEER_MEM_SYMBOLS_PRESENT 1
EOF
	printf 'obj-m := peermem.o\npeermem-y := %s.o\n%s\n' "$2" "$flags" >"$d/Kbuild"
	make -C "$kdir" M="$d" ${llvm:+LLVM=$llvm} KBUILD_EXTRA_SYMBOLS="$gsyms" modules >"$d/make.log" 2>&1 ||
		fail "building $d failed (log: $d/make.log)"
	! grep -q 'undefined!' "$d/make.log" || fail "unresolved symbols in $d (log: $d/make.log)"
	echo "calibration-modules: $d/peermem.ko"
}

mkdir -p "$out/aa" "$out/onepin"
cp "$src/nvidia-peermem.c" "$out/aa/nv_aa.c"
build aa nv_aa
# onepin: from acquire's first nvidia_p2p_get_pages( to its "1 means mine".
python3 - "$src/nvidia-peermem.c" "$out/onepin/nv_onepin.c" <<'PY'
import re, sys
s = open(sys.argv[1]).read()
f = s.index("static int nv_mem_acquire(")
a = s.index("    ret = nvidia_p2p_get_pages(", f)
b = s.index("    /* 1 means mine */", a)
if s.find("static int", f + 1, b) != -1:
    sys.exit("calibration-modules: nv_mem_acquire's probe pin is not where expected")
open(sys.argv[2], "w").write(s[:a] + "#if 0 /* peermem's calibration: no probe pin */\n"
                             + s[a:b] + "#endif\n" + s[b:])
PY
build onepin nv_onepin
