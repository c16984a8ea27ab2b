#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# The user's whole install path on the ubuntu rig kernel (issue 23 item 4):
# a kernel shaped like Ubuntu 26.04's in what the path meets
# (tests/rig/variant-ubuntu.config: MODVERSIONS from gendwarfksyms, enforced
# module signatures, .ko.zst modules, RDMA and the peer-memory core as
# modules), run only with tests/run-all.sh --variant ubuntu --only ubuntu
# (or KDIR=<that tree> bash tests/host/ubuntu/run.sh); with any other KDIR
# it prints one SKIP.
#
# On the host, as root (everything added is removed at the end, whatever
# happened):
#   - the kernel's modules (signed, compressed, as `make modules_install`
#     ships them) go to /lib/modules/<release>, its build dir is a
#     headers-style view of the tree whose Module.symvers lacks the
#     peer-memory exports (as a distribution kernel's does: they are OFED's);
#   - the GPU driver: gpusim, signed with the kernel's key and compressed,
#     in updates/dkms, its Module.symvers where NVIDIA's DKMS package leaves
#     it (/var/lib/dkms/nvidia/<ver>/build); OFED's: the core's exports in
#     /usr/src/ofa_kernel-dkms/<arch>/<release>/Module.symvers, where
#     DOCA-OFED's DKMS package leaves it (both in a
#     PEERMEM_SYSROOT, so the host's own /var/lib/dkms and /usr/src stay
#     untouched);
#   - DKMS is told (/etc/dkms/framework.conf.d) to sign with the key the
#     kernel trusts (the build's test key, standing for an enrolled MOK);
#   - `dpkg -i peermem-dkms_<ver>_all.deb`: its postinst has dkms build,
#     sign, compress and install nvidia_peermem for that kernel; after the
#     guest's run, `dpkg -r` (apt remove) must leave nothing that acts.
# Checked on the host: the kernel's shape, the DKMS build (both layouts
# found, signed by the trusted key, .ko.zst, symbol CRCs equal to the
# exporters'), a stale OFED Module.symvers refused at build time.
# Then one boot of that kernel (scripts/vm.sh) runs tests/host/ubuntu/guest.sh:
# the package's unit at "boot" (its ExecStart), the NCCL-style probes, the end-to-end test, an
# unsigned module refused and named by the doctor, an explicitly given
# stale Module.symvers failing at load (what the build-time check
# prevents), and an openibd restart with peermem loaded.
# Prints TAP.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/lib.sh
. "$here/../../../scripts/lib.sh"

n=0 fails=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() { n=$((n + 1)); fails=$((fails + 1)); echo "not ok $n - $1"; shift; [ $# -eq 0 ] || printf '%s\n' "$@" | sed 's/^/#   /'; }
check() { local d=$1; shift; if "$@"; then ok "$d"; else notok "$d"; fi; }
finish() { echo "1..$n"; [ "$fails" = 0 ]; exit $?; }
skip_all() { ok "ubuntu variant: the user path # SKIP $1"; finish; }

KDIR=${KDIR:-}
cfg=$KDIR/.config
[ -n "$KDIR" ] && grep -qx 'CONFIG_LOCALVERSION="-rig-ubuntu"' "$cfg" 2>/dev/null ||
	skip_all "KDIR is not the ubuntu variant's tree (tests/run-all.sh --variant ubuntu --only ubuntu)"
[ "$(id -u)" = 0 ] || skip_all "needs root (it installs a package and a kernel's modules)"
for c in dkms dpkg zstd depmod modinfo qemu-system-x86_64 openssl; do
	command -v "$c" >/dev/null || skip_all "needs $c"
done
[ -d "$KDIR/modroot/lib/modules" ] || { notok "the variant's modules are installed in $KDIR/modroot (scripts/kernel.sh --variant ubuntu does it)"; finish; }

# One DKMS test at a time on this host (tests/host/install/dkms.sh takes the same lock).
exec 9>/tmp/peermem-dkms-test.lock
flock 9
if [ -e /var/lib/dkms/peermem ] || compgen -G '/usr/src/peermem-*' >/dev/null || [ -e /etc/modprobe.d/peermem-softdep.conf ] ||
	[ -e /etc/modules-load.d/peermem.conf ] || [ -e /usr/lib/modprobe.d/peermem-softdep.conf ] || [ -e /usr/lib/modules-load.d/peermem.conf ] ||
	[ -e /usr/lib/systemd/system/peermem.service ] || [ -e /etc/systemd/system/peermem.service ] || [ -e /usr/lib/depmod.d/peermem.conf ] || [ -e /etc/depmod.d/peermem.conf ] ||
	dpkg-query -W peermem-dkms >/dev/null 2>&1; then
	skip_all "a peermem install exists on this host; not touching it"
fi

krel=$(cat "$KDIR/include/config/kernel.release")
ver=$(sed -n 's/^#define PEERMEM_VERSION "\(.*\)"/\1/p' "$PEERMEM_ROOT/include/peermem_ffi.h")
mods=/lib/modules/$krel
fwconf=/etc/dkms/framework.conf.d/peermem-rig-ubuntu.conf
marker=.peermem-ubuntu-test
work=$PEERMEM_CACHE/ubuntu-test
read -ra margs < "$KDIR/.peermem-make-args" 2>/dev/null || margs=()
mok_before=$(ls /var/lib/dkms/mok.* 2>/dev/null)
made_lib=0; [ -d /lib/modules ] || made_lib=1
if [ -e "$mods" ] && [ ! -e "$mods/$marker" ]; then
	skip_all "$mods exists and is not this test's; not touching it"
fi

cleanup() {
	dpkg --purge peermem-dkms >/dev/null 2>&1
	dkms remove "peermem/$ver" --all >/dev/null 2>&1
	rm -rf /var/lib/dkms/peermem "/usr/src/peermem-$ver" "$fwconf"
	[ -n "$mok_before" ] || rm -f /var/lib/dkms/mok.key /var/lib/dkms/mok.pub
	[ -e "$mods/$marker" ] && rm -rf "${mods:?}"
	[ "$made_lib" = 1 ] && rmdir /lib/modules 2>/dev/null
}
trap cleanup EXIT
cleanup
rm -rf "$work"; mkdir -p "$work"
log=$work/log; mkdir -p "$log"
echo "# kernel $krel ($KDIR); peermem $ver; work dir $work"

# --- the kernel's shape ---------------------------------------------------------
for l in CONFIG_MODVERSIONS=y CONFIG_GENDWARFKSYMS=y CONFIG_EXTENDED_MODVERSIONS=y CONFIG_MODULE_SIG=y CONFIG_MODULE_SIG_FORCE=y \
	CONFIG_MODULE_COMPRESS_ZSTD=y CONFIG_INFINIBAND=m CONFIG_INFINIBAND_USER_ACCESS=m CONFIG_RDMA_RXE=m CONFIG_INFINIBAND_PEER_MEM=y CONFIG_RUST=y; do
	grep -qx "$l" "$cfg" || notok "kernel config has $l"
done
ok "kernel config: MODVERSIONS via gendwarfksyms (extended, for Rust), MODULE_SIG_FORCE, MODULE_COMPRESS_ZSTD, RDMA (ib_core with the peer-memory core, ib_uverbs, rdma_rxe) as modules"
core_line=$(grep -P '\tib_register_peer_memory_client\t' "$KDIR/Module.symvers")
core_crc=$(cut -f1 <<<"$core_line")
if [ "$(cut -f3 <<<"$core_line")" = drivers/infiniband/core/ib_core ] && [ $((core_crc)) != 0 ]; then
	ok "the module ib_core exports ib_register_peer_memory_client with a CRC ($core_crc, from gendwarfksyms)"
else notok "ib_register_peer_memory_client in Module.symvers: '$core_line'"; fi
ibko=$(find "$KDIR/modroot/lib/modules/$krel" -name ib_core.ko.zst | head -n 1)
signer=$(modinfo -F signer "$ibko" 2>/dev/null)
keycn=$(openssl x509 -inform DER -in "$KDIR/certs/signing_key.x509" -noout -subject -nameopt multiline 2>/dev/null | sed -n 's/^ *commonName *= *//p')
if [ -n "$ibko" ] && [ -n "$signer" ] && [ "$signer" = "$keycn" ]; then
	ok "modules_install ships ib_core as ${ibko##*/}, signed by the kernel's key ($signer)"
else notok "modules_install: ib_core '${ibko:-none}' signer '$signer' (kernel key '$keycn')"; fi

# --- the machine: kernel modules, headers view, GPU driver, OFED ---------------
mkdir -p /lib/modules
cp -a "$KDIR/modroot/lib/modules/$krel" "$mods" && touch "$mods/$marker"
rm -f "$mods/build" "$mods/source"
# The build dir a distribution's headers package gives: the kernel's tree,
# but its Module.symvers without the peer-memory exports (a distribution's
# ib_core has none; MLNX_OFED/DOCA-OFED's ib_core/ib_uverbs bring them).
hdr=$work/headers
mkdir -p "$hdr"
for e in "$KDIR"/* "$KDIR"/.[!.]*; do
	b=${e##*/}
	case $b in Module.symvers|modroot|Makefile) continue ;; esac
	ln -s "$e" "$hdr/$b"
done
grep -vP '\tib_(un)?register_peer_memory_client\t' "$KDIR/Module.symvers" >"$hdr/Module.symvers"
# Its own top Makefile: the tree's names KBUILD_OUTPUT=KDIR, which would
# make kbuild use (and write to) the tree itself.
sed "s|^export KBUILD_OUTPUT = .*|export KBUILD_OUTPUT = $hdr|" "$KDIR/Makefile" >"$hdr/Makefile"
touch "$work/t0"
ln -s "$hdr" "$mods/build"
# The GPU driver: gpusim, built for this kernel, installed as NVIDIA's DKMS
# package installs nvidia.ko (signed, compressed, updates/dkms).
if make -C "$PEERMEM_ROOT/tests/gpusim" KDIR="$KDIR" "${margs[@]}" >"$log/gpusim-build.log" 2>&1 &&
	[ "$(modinfo -F vermagic "$PEERMEM_ROOT/tests/gpusim/gpusim.ko" | cut -d' ' -f1)" = "$krel" ]; then
	ok "gpusim (the GPU driver) built for $krel"
else notok "gpusim build for $krel (log $log/gpusim-build.log)" "$(tail -n 5 "$log/gpusim-build.log")"; finish; fi
sign() { "$KDIR/scripts/sign-file" sha512 "$KDIR/certs/signing_key.pem" "$KDIR/certs/signing_key.x509" "$1"; }
mkdir -p "$mods/updates/dkms" "$work/stage"
cp "$PEERMEM_ROOT/tests/gpusim/gpusim.ko" "$work/stage/gpusim.ko" && sign "$work/stage/gpusim.ko" &&
	zstd -q -19 -f "$work/stage/gpusim.ko" -o "$mods/updates/dkms/gpusim.ko.zst"
tr=$work/sysroot
nvv=595.45.04
mkdir -p "$tr/var/lib/dkms/nvidia/$nvv/build" "$tr/var/lib/dkms/nvidia/$nvv/$krel/x86_64/module" \
	"$tr/usr/src/ofa_kernel-dkms/x86_64/$krel" "$tr/var/lib/dkms/mlnx-ofed-kernel/24.10/$krel/x86_64/module" "$tr/lib/modules"
cp "$PEERMEM_ROOT/tests/gpusim/Module.symvers" "$tr/var/lib/dkms/nvidia/$nvv/build/Module.symvers"
ofd=$tr/usr/src/ofa_kernel-dkms/x86_64/$krel
grep -P '\tib_(un)?register_peer_memory_client\t' "$KDIR/Module.symvers" >"$ofd/Module.symvers"
depmod "$krel"
# find-symvers.sh compares CRCs with the modules installed under the root:
# a copy (not a link: its find does not follow one, and then compares
# nothing, which the first run of this test showed).
mkdir -p "$tr/lib/modules/$krel" && cp -a "$mods/." "$tr/lib/modules/$krel/" && rm -f "$tr/lib/modules/$krel/$marker"
mkdir -p /etc/dkms/framework.conf.d
# shellcheck disable=SC2016  # $kernelver is dkms's
printf '# peermem tests/host/ubuntu (removed after the test): sign with the key the rig kernel trusts\nmok_signing_key=/lib/modules/$kernelver/build/certs/signing_key.pem\nmok_certificate=/lib/modules/$kernelver/build/certs/signing_key.x509\n' >"$fwconf"

# --- the package, as a user installs it -------------------------------------------
deb=$(bash "$PEERMEM_ROOT/scripts/deb.sh" --out "$work/deb" 2>"$log/deb.log" | tail -n 1)
[ -f "$deb" ] || { notok "make deb (log $log/deb.log)"; finish; }
t0=$(date +%s)
PEERMEM_SYSROOT=$tr PEERMEM_DKMS_JOBS=2 dpkg -i "$deb" >"$log/dpkg-i.log" 2>&1
rc=$?
t1=$(date +%s)
mlog=/var/lib/dkms/peermem/$ver/$krel/x86_64/log/make.log
cp "$mlog" "$log/dkms-make.log" 2>/dev/null
if [ "$rc" = 0 ] && dkms status "peermem/$ver" -k "$krel" 2>/dev/null | grep -q ': installed'; then
	ok "dpkg -i ${deb##*/}: dkms built and installed peermem/$ver for $krel ($((t1 - t0)) s)"
else
	notok "dpkg -i ${deb##*/} (rc $rc)" "$(tail -n 15 "$log/dpkg-i.log")" "$(grep -E 'peermem:|rror' "$mlog" 2>/dev/null | head -n 8)"
fi
grep -E '^(Sign command|Signing key|Public certificate)' "$log/dpkg-i.log" | sed 's/^/# dkms: /'
ko=$mods/updates/dkms/nvidia_peermem.ko.zst
if [ -f "$ko" ] && [ "$(modinfo -F name "$ko")" = nvidia_peermem ] && [ "$(modinfo -F version "$ko")" = "$ver" ]; then
	ok "the drop-in is installed compressed, as the kernel's own modules: ${ko#/lib/modules/}"
else notok "installed module: $(ls "$mods/updates/dkms/" 2>/dev/null | tr '\n' ' ')"; fi
ksig=$(modinfo -F sig_key "$ko" 2>/dev/null | tr -d ':\n' | tr a-f A-F | sed 's/^0*//')
kserial=$(openssl x509 -inform DER -in "$KDIR/certs/signing_key.x509" -noout -serial 2>/dev/null | sed 's/^serial=//' | tr a-f A-F | sed 's/^0*//')
if [ -n "$ksig" ] && [ "$ksig" = "$kserial" ] && [ "$(modinfo -F signer "$ko")" = "$keycn" ]; then
	ok "dkms signed it with the key the kernel trusts (signer '$keycn', key serial $kserial)"
else notok "signature of $ko: signer '$(modinfo -F signer "$ko" 2>/dev/null)', sig_key '$ksig', kernel key serial '$kserial'"; fi
if grep -q "ib_register_peer_memory_client from $ofd/Module.symvers (exported by ib_core)" "$mlog" 2>/dev/null &&
	grep -q "nvidia_p2p_\* from $tr/var/lib/dkms/nvidia/$nvv/build/Module.symvers" "$mlog"; then
	ok "the build took OFED's Module.symvers from /usr/src/ofa_kernel-dkms/x86_64/$krel and NVIDIA's from /var/lib/dkms/nvidia/$nvv/build"
else notok "symvers discovery in the DKMS build" "$(grep 'peermem:' "$mlog" 2>/dev/null | head -n 6)"; fi
# modversions: the CRCs the module carries are the exporters'.
zstd -dc "$ko" >"$work/nvidia_peermem.ko" 2>/dev/null
mv_crc() { modprobe --dump-modversions "$1" 2>/dev/null | awk -v s="$2" '$2 == s { print $1 }'; }
gp_crc=$(awk -F'\t' '$2 == "nvidia_p2p_get_pages" { print $1 }' "$PEERMEM_ROOT/tests/gpusim/Module.symvers")
got_core=$(mv_crc "$work/nvidia_peermem.ko" ib_register_peer_memory_client)
got_gp=$(mv_crc "$work/nvidia_peermem.ko" nvidia_p2p_get_pages)
if [ -n "$got_core" ] && [ $((got_core)) = $((core_crc)) ] && [ -n "$got_gp" ] && [ $((got_gp)) = $((gp_crc)) ]; then
	ok "its symbol versions match the exporters: ib_register_peer_memory_client $got_core (ib_core), nvidia_p2p_get_pages $got_gp (gpusim)"
else notok "modversions: ib_register_peer_memory_client '$got_core' (want $core_crc), nvidia_p2p_get_pages '$got_gp' (want $gp_crc)"; fi
for f in /usr/lib/modprobe.d/peermem-softdep.conf /usr/lib/depmod.d/peermem.conf /usr/lib/systemd/system/peermem.service; do
	[ -f "$f" ] && sed "s|^|# $f: |" "$f" | grep -v ': #'
done

# --- a stale OFED Module.symvers: refused at build time ------------------------------
# The same sources dkms built, built again by hand (as dkms does: make
# KDIR=...) against a root whose OFED Module.symvers has another CRC for
# the core's symbol than the installed ib_core (an OFED rebuilt since).
tr2=$work/sysroot-stale
cp -a "$tr" "$tr2"
awk -F'\t' -v OFS='\t' '$2 ~ /^ib_(un)?register_peer_memory_client$/ { $1 = "0x1badc0de" } { print }' \
	"$ofd/Module.symvers" >"$tr2/usr/src/ofa_kernel-dkms/x86_64/$krel/Module.symvers"
src=$work/src
cp -a "/usr/src/peermem-$ver" "$src" 2>/dev/null
PEERMEM_SYSROOT=$tr2 make -C "$src" KDIR="$mods/build" "${margs[@]}" PEERMEM_KUNIT=n -j2 >"$log/stale-build.log" 2>&1
rc=$?
got=$(mv_crc "$src/peermem.ko" ib_register_peer_memory_client)
if [ "$rc" = 0 ] && grep -q "not using $tr2/usr/src/ofa_kernel-dkms/x86_64/$krel/Module.symvers: CRC of ib_register_peer_memory_client is 0x1badc0de but the installed .*ib_core.ko.zst has" "$log/stale-build.log" &&
	[ -n "$got" ] && [ $((got)) = $((core_crc)) ]; then
	ok "a stale OFED Module.symvers (CRC 0x1badc0de) is refused at build time, named in the build's output; the build took the installed ib_core's own exports (CRC $got)"
else
	notok "stale OFED Module.symvers at build time (rc $rc, module CRC '$got')" "$(grep 'peermem:' "$log/stale-build.log" | head -n 6)"
fi
grep 'peermem: not using' "$log/stale-build.log" | sed 's/^/# build: /'
# The same file given explicitly (OFED_SYMVERS=, which bypasses the search):
# modpost takes it, and the module carries the stale CRC; the guest shows the
# load-time failure this becomes.
mkdir -p "$work/explicit"
cp -a "/usr/src/peermem-$ver/." "$work/explicit/"
make -C "$work/explicit" KDIR="$mods/build" "${margs[@]}" PEERMEM_KUNIT=n -j2 \
	OFED_SYMVERS="$tr2/usr/src/ofa_kernel-dkms/x86_64/$krel/Module.symvers" \
	NV_SYMVERS="$tr/var/lib/dkms/nvidia/$nvv/build/Module.symvers" >"$log/explicit-build.log" 2>&1
got=$(mv_crc "$work/explicit/peermem.ko" ib_register_peer_memory_client)
if [ "$((got))" = $((0x1badc0de)) ]; then
	ok "given explicitly (OFED_SYMVERS=<stale file>) the build succeeds with the stale CRC $got: only the search checks CRCs"
	mkdir -p "$work/stage/stale" && cp "$work/explicit/peermem.ko" "$work/stage/stale/peermem.ko" && sign "$work/stage/stale/peermem.ko"
else notok "explicit OFED_SYMVERS build: CRC '$got'" "$(tail -n 5 "$log/explicit-build.log")"; fi

# --- what the guest loads besides the installed module ------------------------------
# peermem.ko (the other build, for t_probes and the end-to-end test), signed;
# the drop-in as dkms installed it; unsigned copies for the refusal checks.
PEERMEM_SYSROOT=$tr make -C "$src" KDIR="$mods/build" "${margs[@]}" PEERMEM_KUNIT=n -j2 dropin >"$log/dropin-build.log" 2>&1
mkdir -p "$work/stage/dropin" "$work/stage/unsigned" "$work/stage/unsigned-dkms" "$work/stage/include"
cp "$src/peermem.ko" "$work/stage/unsigned/peermem.ko"
cp "$src/peermem.ko" "$work/stage/peermem.ko" && sign "$work/stage/peermem.ko"
cp "$work/nvidia_peermem.ko" "$work/stage/dropin/nvidia_peermem.ko"
cp "$PEERMEM_ROOT/include/peermem_ffi.h" "$work/stage/include/"
if [ -f "$src/dropin/nvidia_peermem.ko" ] && [ -z "$(modinfo -F signer "$src/dropin/nvidia_peermem.ko")" ]; then
	zstd -q -19 -f "$src/dropin/nvidia_peermem.ko" -o "$work/stage/unsigned-dkms/nvidia_peermem.ko.zst"
	ok "an unsigned drop-in (make dropin without signing) prepared for the refusal check"
else notok "unsigned drop-in build (log $log/dropin-build.log)"; fi
for f in peermem.ko dropin/nvidia_peermem.ko gpusim.ko; do
	[ -n "$(modinfo -F signer "$work/stage/$f" 2>/dev/null)" ] || notok "staged $f is signed"
done

# Every module build above went through the headers view: none may have
# written into the kernel tree (the view is made of links into it).
w=$(find "$KDIR" -newer "$work/t0" -not -path "$KDIR/modroot/*" 2>/dev/null | head -n 5)
if [ -z "$w" ]; then ok "the module builds wrote nothing into the kernel tree behind the headers view"
else notok "module builds wrote into $KDIR" "$w"; fi

# --- the guest ------------------------------------------------------------------------
make -C "$PEERMEM_ROOT/tests/guest/e2e" >"$log/e2e-build.log" 2>&1 || notok "build tests/guest/e2e (log $log/e2e-build.log)"
echo "# booting $krel (scripts/vm.sh) for tests/host/ubuntu/guest.sh"
vmout=$work/vm.tap
"$PEERMEM_ROOT/scripts/vm.sh" --kdir "$KDIR" --no-kmemleak --test-timeout 900 \
	--env UB_KREL="$krel" --env UB_STAGE="$work/stage" --env UB_VERSION="$ver" \
	"$here/guest.sh" >"$vmout" 2>"$log/vm.err"
vrc=$?
# The guest's results, renumbered into ours.
while IFS= read -r line; do
	if [[ $line =~ ^(not\ ok|ok)\ [0-9]+\ -\ (.*)$ ]]; then
		if [ "${BASH_REMATCH[1]}" = ok ]; then ok "guest: ${BASH_REMATCH[2]}"; else notok "guest: ${BASH_REMATCH[2]}"; fi
	elif [[ $line =~ ^# ]]; then
		echo "$line"
	fi
done <"$vmout"
[ "$vrc" = 0 ] || notok "scripts/vm.sh exited $vrc (its log: $log/vm.err)" "$(tail -n 5 "$log/vm.err")"

# --- removal, as `apt remove` does it (dpkg -r): nothing left that acts -----------
PEERMEM_SYSROOT=$tr dpkg -r peermem-dkms >"$log/dpkg-r.log" 2>&1
rc=$?
left=$(ls -d /var/lib/dkms/peermem/*/ "/usr/src/peermem-$ver" "$mods/updates/dkms/nvidia_peermem.ko"* /usr/lib/modprobe.d/peermem-softdep.conf \
	/usr/lib/depmod.d/peermem.conf /usr/lib/systemd/system/peermem.service "$mods/updates/peermem" /etc/systemd/system/*.wants/peermem.service \
	/etc/modprobe.d/peermem-softdep.conf /etc/modules-load.d/peermem.conf 2>/dev/null)
got=$(modinfo -k "$krel" -n nvidia_peermem 2>/dev/null)
if [ "$rc" = 0 ] && [ -z "$left" ] && [ -z "$got" ]; then
	ok "dpkg -r peermem-dkms (apt remove): no dkms entry, sources, module or config file left, and modprobe finds no nvidia_peermem for $krel"
else notok "dpkg -r peermem-dkms (rc $rc)" "left: $left" "modinfo -n nvidia_peermem: '$got'" "$(tail -n 5 "$log/dpkg-r.log")"; fi
finish
