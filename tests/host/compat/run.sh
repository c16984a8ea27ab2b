#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# Build compatibility (host, no VM): peermem must also build against the
# 6.12 LTS kernel (Debian's linux-source-6.12, bookworm-security), whose Rust
# `kernel` crate is older than 7.3's. This builds a plain (no debug options)
# Rust-enabled 6.12 kernel with scripts/kernel.sh (cached like the rig
# kernel), then builds peermem against it in a scratch copy of the sources,
# so the 7.3 objects in the checkout are not touched. Prints TAP.
#
#   tests/host/compat/run.sh
#
# Environment: PEERMEM_SKIP_COMPAT=1 skips it (one `ok # SKIP` line), e.g.
# for a quick local run; PEERMEM_CACHE.
#
# 6.12 has no peer-memory core (neither does any upstream kernel), so the
# build cannot resolve ib_register_peer_memory_client there; the Makefile's
# PEERMEM_UNRESOLVED_OK=1 lets modpost leave it unresolved (the module would
# not load on this kernel, which is expected: we check it compiles and links).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../../scripts/lib.sh"

if [ "${PEERMEM_SKIP_COMPAT:-0}" = 1 ]; then
	echo "1..1"
	echo "ok 1 - peermem builds against linux 6.12 # SKIP PEERMEM_SKIP_COMPAT=1"
	exit 0
fi

echo "1..3"
n=0 fails=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() { n=$((n + 1)); fails=$((fails + 1)); echo "not ok $n - $1"; }

log=$PEERMEM_CACHE/logs/compat-6.12
mkdir -p "$log" || { echo "Bail out! cannot create $log"; exit 1; }

if kdir=$("$PEERMEM_ROOT/scripts/kernel.sh" --variant plain --kver 6.12 2>"$log/kernel.log" | tail -n 1) && [ -f "$kdir/.peermem-built" ]; then
	ok "linux 6.12 (plain, Rust) built: $kdir"
else
	notok "linux 6.12 kernel build (log: $log/kernel.log)"
	tail -n 15 "$log/kernel.log" | sed 's/^/#   /'
	echo "# skipping the module build: no 6.12 tree"
	n=$((n + 2)); fails=$((fails + 2))
	echo "not ok 2 - peermem builds against linux 6.12 (no kernel)"
	echo "not ok 3 - the 6.12 module names its kernel (no kernel)"
	exit 1
fi

scratch=$(mktemp -d); trap 'rm -rf "$scratch"' EXIT
# The module's sources only: what `make` in a fresh clone would see.
(cd "$PEERMEM_ROOT" && cp -r Kbuild Makefile rust include scripts "$scratch"/)
rm -f "$scratch"/rust/ffi_generated.rs
extra=()
[ -f "$kdir/.peermem-make-args" ] && read -ra extra <"$kdir/.peermem-make-args"
if make -C "$scratch" -j3 KDIR="$kdir" "${extra[@]}" PEERMEM_UNRESOLVED_OK=1 >"$log/module.log" 2>&1 && [ -f "$scratch/peermem.ko" ]; then
	ok "peermem builds against linux 6.12"
else
	notok "peermem builds against linux 6.12 (log: $log/module.log)"
	grep -E -m 20 'error|Error' "$log/module.log" | sed 's/^/#   /'
fi

if [ -f "$scratch/peermem.ko" ]; then
	vm=$(modinfo -F vermagic "$scratch/peermem.ko" 2>/dev/null)
	case "$vm" in
	6.12*) ok "the 6.12 module names its kernel (vermagic $vm)" ;;
	*) notok "the 6.12 module names its kernel (vermagic '$vm')" ;;
	esac
else
	notok "the 6.12 module names its kernel (no peermem.ko)"
fi
[ "$fails" = 0 ]
