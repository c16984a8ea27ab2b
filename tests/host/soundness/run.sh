#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# API soundness (host, no VM): a safe function of peermem's abstractions
# must not leave its caller an obligation that safe code can break. Each
# probe is a few lines of safe code appended to the crate in a scratch copy
# of the sources; the build must refuse it with the expected rustc error,
# while the same lines with the obligation acknowledged (an `unsafe` block)
# must build, so a probe cannot pass because it names something wrong.
# Prints TAP.
#
#   tests/host/soundness/run.sh
#
# Environment: KDIR (default: scripts/kernel.sh --print-kdir), PEERMEM_CACHE.
#
# Probes (each must be refused with E0133, "call to unsafe function"):
#   address-watch-start: starting an address watch hands the mmu notifier a
#     borrowed pointer to its owner, which must stay alive until the watch
#     is stopped: `AddressWatch::start` must be an `unsafe fn`.
#   ticket-invalidate: the core's invalidate needs its client registered,
#     which holds only while the ticket's registration is not released:
#     `Ticket::invalidate` must be an `unsafe fn`.
#   mapped-give-to-driver: `nvidia_p2p_free_dma_mapping` is only allowed
#     inside the page table's free callback: `MappedTable::give_to_driver`
#     must be an `unsafe fn`.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../../scripts/lib.sh"

kdir=${KDIR:-$("$PEERMEM_ROOT/scripts/kernel.sh" --print-kdir 2>/dev/null)}
probes=(address-watch-start ticket-invalidate mapped-give-to-driver)
echo "1..$((2 * ${#probes[@]}))"
n=0 fails=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() { n=$((n + 1)); fails=$((fails + 1)); echo "not ok $n - $1"; }
if [ -z "$kdir" ] || [ ! -f "$kdir/.config" ]; then
	for p in "${probes[@]}"; do
		notok "$p: no kernel tree to build against (scripts/kernel.sh)"
		notok "$p: no kernel tree to build against (scripts/kernel.sh)"
	done
	exit 1
fi
log=$PEERMEM_CACHE/logs/soundness
mkdir -p "$log" || { echo "Bail out! cannot create $log"; exit 1; }
scratch=$(mktemp -d); trap 'rm -rf "$scratch"' EXIT
extra=()
[ -f "$kdir/.peermem-make-args" ] && read -ra extra <"$kdir/.peermem-make-args"

# The call each probe makes, in safe code; $1 = the probe.
probe_body() {
	case "$1" in
	address-watch-start)
		cat <<'RS'
fn soundness_probe(
    w: &crate::kapi::mmu_notifier::AddressWatch<crate::client::Registration>,
    reg: &kernel::sync::Arc<crate::client::Registration>,
) -> kernel::error::Result {
    CALL(w.start(reg.as_arc_borrow(), 0x10000, 0x10000))
}
RS
		;;
	ticket-invalidate)
		cat <<'RS'
fn soundness_probe(t: &crate::kapi::peer_mem::Ticket) -> Option<i32> {
    CALL(t.invalidate())
}
RS
		;;
	mapped-give-to-driver)
		cat <<'RS'
fn soundness_probe(m: crate::kapi::nvidia_p2p::MappedTable<crate::client::Registration>) {
    CALL(m.give_to_driver())
}
RS
		;;
	esac
}

# Build the crate with probe $1 wrapped as $2 (safe|unsafe); log to $3.
build() {
	local p=$1 how=$2 out=$3 wrap
	rm -rf "$scratch/src"; mkdir "$scratch/src"
	(cd "$PEERMEM_ROOT" && cp -r Kbuild Makefile rust include scripts "$scratch/src"/)
	rm -f "$scratch"/src/rust/ffi_generated.rs "$scratch"/src/rust/*.o
	if [ "$how" = safe ]; then wrap='s/CALL(\(.*\))$/\1/'; else wrap='s/CALL(\(.*\))$/unsafe { \1 }/'; fi
	{
		echo
		echo '#[allow(dead_code, unused_unsafe)]'
		echo 'mod soundness_probe {'
		probe_body "$p" | sed "$wrap"
		echo '}'
	} >>"$scratch/src/rust/peermem.rs"
	make -C "$scratch/src" KDIR="$kdir" "${extra[@]}" PEERMEM_KUNIT=n PEERMEM_UNRESOLVED_OK=1 >"$out" 2>&1
}

for p in "${probes[@]}"; do
	if build "$p" unsafe "$log/$p-control.log"; then
		ok "$p: the probe builds with the obligation acknowledged (unsafe block)"
	else
		notok "$p: the probe with an unsafe block does not build (log: $log/$p-control.log)"
		grep -E -m 10 '^error' -A6 "$log/$p-control.log" | sed 's/^/#   /'
		notok "$p: not checked (the control build failed)"
		continue
	fi
	build "$p" safe "$log/$p.log"
	if grep -q 'error\[E0133\]' "$log/$p.log" && grep -A12 'error\[E0133\]' "$log/$p.log" | grep -q 'soundness_probe\|peermem.rs'; then
		ok "$p: safe code cannot make the call: rustc refuses it (E0133, unsafe function)"
	else
		notok "$p: safe code makes the call and the build accepts it: the obligation is not in the type (log: $log/$p.log)"
	fi
done
[ "$fails" = 0 ]
