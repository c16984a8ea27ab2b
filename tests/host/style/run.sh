#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# Style (host, no VM): the Rust code of peermem (rust/) and of gpusim
# (tests/gpusim/) is formatted with the kernel's rustfmt settings, and both
# build against the rig kernel with the kernel's clippy lints (CLIPPY=1)
# without a single warning. The builds run in scratch copies, so the
# checkout's objects are not touched. And peermem's layers keep their rule
# (docs/architecture.md): the abstractions in rust/kapi/ never name the
# driver (crate::client); the driver (rust/client/ and its subfolders,
# rust/peermem.rs) has no
# raw code (no bindings, extern functions, unsafe impls or unsafe fns), and
# each of its unsafe blocks (calls of the abstractions' unsafe fns) says
# under `// SAFETY:` how the obligation is met; rust/client/'s modules use
# each other without a cycle (modcycles.py). Prints TAP.
#
#   KDIR=<rig kernel tree> tests/host/style/run.sh
#
# KDIR defaults to what scripts/kernel.sh --print-kdir says (the rig kernel).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../../scripts/lib.sh"

echo "1..6"
n=0 fails=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() { n=$((n + 1)); fails=$((fails + 1)); echo "not ok $n - $1"; }

kdir=${KDIR:-}
[ -n "$kdir" ] || kdir=$("$PEERMEM_ROOT/scripts/kernel.sh" --print-kdir 2>/dev/null | tail -n 1)
if [ -z "$kdir" ] || [ ! -f "$kdir/.config" ]; then
	for t in "rustfmt" "peermem clippy" "gpusim clippy" "layers: kapi" "layers: client" "layers: cycles"; do notok "$t: no rig kernel tree (KDIR='$kdir'); build it with scripts/kernel.sh"; done
	exit 1
fi
src=$kdir; [ -e "$kdir/source" ] && src=$(readlink -f "$kdir/source")
log=$PEERMEM_CACHE/logs/style
mkdir -p "$log" || { echo "Bail out! cannot create $log"; exit 1; }

# --- rustfmt, with the kernel's .rustfmt.toml (what `make rustfmt` uses)
cd "$PEERMEM_ROOT" || exit 1
files=()
for f in rust/*.rs rust/*/*.rs rust/*/*/*.rs tests/gpusim/*.rs; do
	[ "$f" = rust/ffi_generated.rs ] || files+=("$f")	# bindgen's output
done
if ! command -v rustfmt >/dev/null; then
	notok "rustfmt: not installed (rustup component add rustfmt, or scripts/setup-host.sh)"
elif rustfmt --edition 2021 --config-path "$src/.rustfmt.toml" --check "${files[@]}" >"$log/rustfmt.log" 2>&1; then
	ok "rustfmt: ${#files[@]} Rust files formatted with the kernel's settings"
else
	notok "rustfmt: files differ from the kernel's formatting (fix: rustfmt --edition 2021 --config-path $src/.rustfmt.toml <file>)"
	grep '^Diff in' "$log/rustfmt.log" | sed 's/^/#   /' | head -n 20
fi

# --- clippy: the kernel's lint set, every warning is a failure
extra=()
[ -f "$kdir/.peermem-make-args" ] && read -ra extra <"$kdir/.peermem-make-args"
scratch=$(mktemp -d); trap 'rm -rf "$scratch"' EXIT
clippy() { # clippy NAME LOG DIR MAKE-ARGS...: build with CLIPPY=1, no warning allowed
	local name=$1 lg=$2 dir=$3; shift 3
	if make -C "$dir" -j3 KDIR="$kdir" "${extra[@]}" CLIPPY=1 "$@" >"$lg" 2>&1; then
		local w; w=$(grep -c '^warning' "$lg")
		if [ "$w" = 0 ]; then ok "$name: builds with CLIPPY=1, no warning"
		else notok "$name: $w clippy warning(s) (log: $lg)"; grep -A6 -m 5 '^warning' "$lg" | sed 's/^/#   /'; fi
	else
		notok "$name: the CLIPPY=1 build failed (log: $lg)"
		grep -E -m 10 '^(error|warning)' "$lg" | sed 's/^/#   /'
	fi
}
mkdir "$scratch/peermem"
cp -r Kbuild Makefile rust include scripts "$scratch/peermem"/
rm -f "$scratch"/peermem/rust/ffi_generated.rs "$scratch"/peermem/rust/*.o
clippy "peermem clippy" "$log/peermem.log" "$scratch/peermem" PEERMEM_UNRESOLVED_OK=1
# gpusim includes ../../include/: keep the layout.
mkdir -p "$scratch/gs/tests"
cp -r include "$scratch/gs/"
cp -r tests/gpusim "$scratch/gs/tests/"
(cd "$scratch/gs/tests/gpusim" && rm -f ./*.o ./*.ko ./*.mod* Module.symvers modules.order testclient/*.o testclient/*.ko)
clippy "gpusim clippy" "$log/gpusim.log" "$scratch/gs/tests/gpusim" gpusim
# --- layers
bad=$(grep -nE 'crate::client|super::super::client|\bclient::' rust/kapi/*.rs | grep -vE '^[^:]+:[0-9]+:\s*//')
if [ -z "$bad" ]; then
	ok "layers: rust/kapi/ never names the driver (crate::client)"
else
	notok "layers: rust/kapi/ names the driver:"
	printf '%s\n' "$bad" | sed 's/^/#   /' | head -n 10
fi
drv=(rust/peermem.rs rust/client/*.rs rust/client/*/*.rs)
bad=$(grep -nE '\bkapi::raw\b|bindings::|extern "C"|unsafe impl|unsafe fn|include!' "${drv[@]}" | grep -vE '^[^:]+:[0-9]+:\s*//')
# Each `unsafe {` of the driver: a `// SAFETY:` comment in the 8 lines before.
miss=$(awk 'FNR == 1 { n = 0 } /\/\/ SAFETY:/ { last = FNR } /unsafe \{/ && !(last && FNR - last <= 8) { print FILENAME ":" FNR ": unsafe block without // SAFETY:" }' "${drv[@]}")
if [ -z "$bad$miss" ]; then
	ok "layers: the driver has no raw code and justifies each unsafe call ($(cat "${drv[@]}" | grep -c 'unsafe {') unsafe block(s))"
else
	notok "layers: raw code or unjustified unsafe in the driver:"
	printf '%s\n%s\n' "$bad" "$miss" | sed '/^$/d; s/^/#   /' | head -n 10
fi
# No circle among the driver's modules (docs/architecture.md): the files of
# rust/client/ (source/ as one, registration.rs with registration/ as one)
# use each other one way only, and so do the children inside each.
if cyc=$(python3 "$here/modcycles.py" "$PEERMEM_ROOT/rust/client" 2>&1); then
	ok "layers: no dependency cycle among rust/client/'s modules ($(grep -c ' -> ' <<<"$cyc") uses)"
else
	notok "layers: a dependency cycle among rust/client/'s modules:"
	grep -E '^cycle|^usage|Error' <<<"$cyc" | sed 's/^/#   /' | head -n 10
fi
[ "$fails" = 0 ]
