#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# shellcheck disable=SC2154,SC2012  # ok, notok, scratch: from run.sh; ls of known names
# DKMS for real: Debian's dkms (scripts/setup-host.sh installs it) builds and
# installs the drop-in against the rig kernel tree (KDIR), finding a stand-in
# NVIDIA DKMS layout (/var/lib/dkms/nvidia/<ver>/build/Module.symvers, a copy
# of gpusim's) in a temporary root given by PEERMEM_SYSROOT (the rig kernel
# exports the peer-memory core itself); then, when tests/host/compat built
# the 6.12 tree (no core), the default module for 6.12 with the core found in
# a stand-in OFED DKMS tree and a stale ofa_kernel/default rejected; then
# removes it all.
# As root on the host: it adds /usr/src/peermem-<ver>, /var/lib/dkms/peermem,
# /lib/modules/<rel>/updates/dkms/nvidia_peermem.ko and, when they do not
# exist, /lib/modules/<rel>/build (a link to KDIR) and /lib/modules/<rel>;
# the EXIT trap removes all of it, whatever happened. It refuses to run when
# a peermem DKMS install is already on the host (not ours to remove).
# Sourced by run.sh.

dk_skip() { ok "dkms: $1 # SKIP $2"; }
if [ "$(id -u)" != 0 ] || ! command -v dkms >/dev/null || [ -z "${KDIR:-}" ] ||
	[ ! -f "$PEERMEM_ROOT/tests/gpusim/Module.symvers" ] || [ "${PEERMEM_SKIP_DKMS:-0}" = 1 ]; then
	dk_skip "build, install, uninstall" "needs root, dkms, KDIR and a built tests/gpusim (or PEERMEM_SKIP_DKMS=1)"
	return 0
fi
exec 9>/tmp/peermem-dkms-test.lock
flock 9
if [ -e /var/lib/dkms/peermem ] || compgen -G '/usr/src/peermem-*' >/dev/null || [ -e /etc/modprobe.d/peermem-softdep.conf ] ||
	[ -e /etc/modules-load.d/peermem.conf ] || [ -e /usr/lib/modprobe.d/peermem-softdep.conf ] || [ -e /usr/lib/modules-load.d/peermem.conf ] ||
	[ -e /etc/depmod.d/peermem.conf ] || [ -e /usr/lib/depmod.d/peermem.conf ] ||
	[ -e /etc/systemd/system/peermem.service ] || [ -e /usr/lib/systemd/system/peermem.service ] ||
	dpkg-query -W peermem-dkms >/dev/null 2>&1 || ! command -v dpkg >/dev/null; then
	dk_skip "build, install, uninstall" "a peermem install exists on this host (/var/lib/dkms/peermem, /usr/src/peermem-*, peermem files in /etc or /usr/lib modprobe.d, modules-load.d, depmod.d or systemd/system, or the peermem-dkms package), or no dpkg; not touching it"
	exec 9>&-
	return 0
fi

krel=$(cat "$KDIR/include/config/kernel.release")
ver=$(sed -n 's/^#define PEERMEM_VERSION "\(.*\)"/\1/p' "$PEERMEM_ROOT/include/peermem_ffi.h")
made_moddir=0 made_build=0 made_etc=1 k6rel='' made_moddir6=0 made_build6=0 made_lib=0
# A kernel whose build fails (Rust and its metadata, a Makefile that
# errors): the package must skip it and stay configured.
kfail=0.0.0-peermem-failing made_fail=0
# A kernel with Rust but without its Rust metadata (Ubuntu's headers
# without linux-lib-rust-<release>): skipped with a message naming it.
knometa=0.0.0-peermem-nometa made_nometa=0
# A stand-in NVIDIA DKMS module registered on the host (empty: dkms only
# reads BUILD_DEPENDS at autoinstall), which the package's dkms.conf must
# name in BUILD_DEPENDS as make dkms-install does.
nvdep=/var/lib/dkms/nvidia-peermemtest made_nvdep=0
[ -d /lib/modules ] || made_lib=1
[ -d "/lib/modules/$krel" ] || made_moddir=1
mok_before=$(ls /var/lib/dkms/mok.* 2>/dev/null)
# dkms keeps make.log in build/ while building, in <rel>/<arch>/log/ after.
dk_makelog() { ls "/var/lib/dkms/peermem/$ver/$krel/x86_64/log/make.log" "/var/lib/dkms/peermem/$ver/build/make.log" 2>/dev/null | head -n 1; }
dk_cleanup() {
	local l
	l=$(dk_makelog)
	[ -n "$l" ] && mkdir -p "$PEERMEM_CACHE/logs" && cp "$l" "$PEERMEM_CACHE/logs/dkms-make.log"
	dpkg --purge peermem-dkms >/dev/null 2>&1
	dkms remove "peermem/$ver" --all >/dev/null 2>&1
	rm -rf /var/lib/dkms/peermem "/usr/src/peermem-$ver"
	if [ "$made_etc" = 1 ]; then
		rm -f /etc/modprobe.d/peermem-softdep.conf /etc/modules-load.d/peermem.conf /usr/lib/modprobe.d/peermem-softdep.conf /usr/lib/modules-load.d/peermem.conf \
			/etc/depmod.d/peermem.conf /usr/lib/depmod.d/peermem.conf /etc/systemd/system/peermem.service /usr/lib/systemd/system/peermem.service \
			/etc/systemd/system/*.wants/peermem.service /var/lib/systemd/deb-systemd-helper-enabled/peermem.service \
			/var/lib/systemd/deb-systemd-helper-enabled/*.wants/peermem.service
		rm -rf /var/lib/systemd/deb-systemd-helper-enabled/peermem.service.dsh-also
	fi
	rm -f "/lib/modules/$krel/updates/dkms/nvidia_peermem.ko"* "/lib/modules/$krel/updates/dkms/nvidia-peermem.ko"
	rm -rf "/lib/modules/$krel/updates/peermem"
	[ -n "$mok_before" ] || rm -f /var/lib/dkms/mok.key /var/lib/dkms/mok.pub
	[ "$made_build" = 1 ] && rm -f "/lib/modules/$krel/build"
	if [ -n "$k6rel" ]; then
		rm -f "/lib/modules/$k6rel/updates/dkms/peermem.ko"*
		[ "$made_build6" = 1 ] && rm -f "/lib/modules/$k6rel/build"
		[ "$made_moddir6" = 1 ] && rm -rf "/lib/modules/${k6rel:?}"
	fi
	if [ "$made_moddir" = 1 ]; then rm -rf "/lib/modules/${krel:?}"; fi
	[ "$made_fail" = 1 ] && rm -rf "/lib/modules/${kfail:?}"
	[ "$made_nometa" = 1 ] && rm -rf "/lib/modules/${knometa:?}"
	[ "$made_nvdep" = 1 ] && rmdir "$nvdep"
	rm -rf "/usr/src/peermem-$ver.1"
	[ "$made_lib" = 1 ] && rmdir /lib/modules 2>/dev/null
	rm -rf "$scratch"
}
trap 'dk_cleanup' EXIT
mkdir -p "/lib/modules/$krel"
if [ ! -e "/lib/modules/$krel/build" ]; then ln -s "$KDIR" "/lib/modules/$krel/build"; made_build=1; fi

tr=$scratch/dkroot
nvb=$tr/var/lib/dkms/nvidia/580.95/build
mkdir -p "$nvb" "$tr/var/lib/dkms/nvidia/580.95/$krel/x86_64"
cp "$PEERMEM_ROOT/tests/gpusim/Module.symvers" "$nvb/Module.symvers"
ofd=$tr/usr/src/ofa_kernel-dkms/x86_64/$krel
mkdir -p "$ofd" "$tr/usr/src/ofa_kernel/x86_64/6.8.0-old"
grep -P '\tib_(un)?register_peer_memory_client\t' "$KDIR/Module.symvers" | sed 's/\tvmlinux\t/\tib_uverbs\t/' >"$ofd/Module.symvers"
cp "$ofd/Module.symvers" "$tr/usr/src/ofa_kernel/x86_64/6.8.0-old/"
ln -s x86_64/6.8.0-old "$tr/usr/src/ofa_kernel/default"

# The package (make deb), installed as a user would (dpkg -i, what `apt
# install ./peermem-dkms_*.deb` runs once it has the dependencies): its
# postinst adds it to dkms and builds it for every kernel with Rust.
# Removal (dpkg -r, what `apt remove` runs) must leave nothing that acts:
# its modprobe.d and depmod.d files and unit are the package's own files in
# /usr/lib, not conffiles in /etc (which dpkg keeps after a remove: a
# unit would then load NVIDIA's nvidia_peermem at boot, and
# the --peermem build's install rule would keep refusing it).
deb=$(bash "$PEERMEM_ROOT/scripts/deb.sh" --out "$scratch/deb" 2>"$scratch/deb.log" | tail -n 1)
cont=$(dpkg-deb -c "$deb" 2>/dev/null | awk '{print $6}')
debv=$(dpkg-deb -f "$deb" Version 2>/dev/null)
if [ -f "$deb" ] && { [ "$debv" = "$ver" ] || [[ $debv == "$ver+git"[0-9]*.g* ]]; } && [ "$(dpkg-deb -f "$deb" Package)" = peermem-dkms ] &&
	grep -qx './usr/sbin/peermem-doctor' <<<"$cont" && grep -qx './usr/share/doc/peermem-dkms/troubleshooting.md' <<<"$cont" &&
	[ "$(dpkg-deb -f "$deb" Maintainer)" = 'peermem project <peermem-maintainers@example.invalid>' ] &&
	grep -qx "./usr/src/peermem-$ver/dkms.conf" <<<"$cont" && grep -qx './usr/lib/modprobe.d/peermem-softdep.conf' <<<"$cont" &&
	grep -qx './usr/lib/depmod.d/peermem.conf' <<<"$cont" && grep -qx './usr/lib/systemd/system/peermem.service' <<<"$cont" &&
	grep -qx "./usr/src/peermem-$ver/scripts/dkms-hook.sh" <<<"$cont" && ! grep -q 'modules-load' <<<"$cont" && ! grep -q '^\./etc/.' <<<"$cont" &&
	! dpkg-deb -I "$deb" conffiles >/dev/null 2>&1 && ! grep -qE '\.(o|ko|cmd)$|ffi_generated' <<<"$cont"; then
	ok "dkms: make deb builds ${deb##*/} (version $debv: $ver from include/peermem_ffi.h, +git<commits>.g<hash> off a release tag; the doctor as /usr/sbin/peermem-doctor, troubleshooting.md (where to report), the project's placeholder maintainer; sources, dkms.conf and its hook, the /usr/lib/modprobe.d, /usr/lib/depmod.d files and the systemd unit, no modules-load.d file, nothing in /etc, no conffiles; no build outputs)"
else
	notok "dkms: make deb: ${deb:-no package} ($(tail -n 3 "$scratch/deb.log" | tr '\n' '|'))"
fi
if [ ! -e "/lib/modules/$kfail" ]; then
	mkdir -p "/lib/modules/$kfail/build/rust" && made_fail=1
	printf 'CONFIG_RUST=y\n' >"/lib/modules/$kfail/build/.config"
	: >"/lib/modules/$kfail/build/rust/libkernel.rmeta"
	printf 'all modules:\n\t@echo "a kernel tree that cannot build" >&2; exit 1\n' >"/lib/modules/$kfail/build/Makefile"
fi
if [ ! -e "/lib/modules/$knometa" ]; then
	mkdir -p "/lib/modules/$knometa/build" && made_nometa=1
	printf 'CONFIG_RUST=y\n' >"/lib/modules/$knometa/build/.config"
fi
if [ ! -e "$nvdep" ]; then mkdir -p "$nvdep" && made_nvdep=1; fi
t0=$(date +%s)
PEERMEM_SYSROOT=$tr PEERMEM_DKMS_JOBS=2 dpkg -i "$deb" >"$scratch/dkms-install.log" 2>&1
rc=$?
t1=$(date +%s)
if [ "$made_fail" = 1 ]; then
	if [ "$rc" = 0 ] && grep -q "not installed for: $kfail" "$scratch/dkms-install.log" &&
		dpkg-query -W -f '${Status}' peermem-dkms 2>/dev/null | grep -q 'install ok installed'; then
		ok "dkms: a second kernel whose build fails ($kfail) is skipped with a message; dpkg -i succeeds and the package is configured"
	else
		notok "dkms: a failing kernel's build broke the install (rc $rc, status $(dpkg-query -W -f '${Status}' peermem-dkms 2>/dev/null))"
		grep -E 'peermem-dkms' "$scratch/dkms-install.log" | tail -n 5 | sed 's/^/#   /'
	fi
	rm -rf "/lib/modules/${kfail:?}" && made_fail=0
else
	dk_skip "a failing kernel's build" "/lib/modules/$kfail existed before the test"
fi
if [ "$made_nometa" = 1 ]; then
	if [ "$rc" = 0 ] && grep -q "skipping $knometa: its headers have no Rust metadata (Ubuntu: apt install linux-lib-rust-$knometa)" "$scratch/dkms-install.log"; then
		ok "dkms: a kernel with Rust but no Rust metadata in its headers ($knometa) is skipped with a message naming linux-lib-rust-<release>"
	else
		notok "dkms: the kernel without Rust metadata (rc $rc): $(grep "$knometa" "$scratch/dkms-install.log" | head -n 2 | tr '\n' '|')"
	fi
	rm -rf "/lib/modules/${knometa:?}" && made_nometa=0
else
	dk_skip "a kernel without Rust metadata" "/lib/modules/$knometa existed before the test"
fi
if [ "$made_nvdep" = 1 ]; then
	if grep -qx "BUILD_DEPENDS\[[0-9]*\]=\"${nvdep##*/}\"" "/usr/src/peermem-$ver/dkms.conf" 2>/dev/null; then
		ok "dkms: the package's dkms.conf names the NVIDIA DKMS module registered at install (${nvdep##*/}) in BUILD_DEPENDS, as make dkms-install does"
	else
		notok "dkms: BUILD_DEPENDS in the package's dkms.conf: $(grep BUILD_DEPENDS "/usr/src/peermem-$ver/dkms.conf" 2>/dev/null | tr '\n' '|')"
	fi
	rmdir "$nvdep" && made_nvdep=0
else
	dk_skip "BUILD_DEPENDS in the package" "$nvdep existed before the test"
fi
log=$(dk_makelog)
mp=/usr/lib/modprobe.d/peermem-softdep.conf ml=/usr/lib/systemd/system/peermem.service dpd=/usr/lib/depmod.d/peermem.conf
pin=/lib/modules/$krel/updates/peermem
# What the unit loads: its ExecStart's module (empty without the unit).
dk_unit_mod() { sed -n 's|^ExecStart=/sbin/modprobe \([a-z_]*\)$|\1|p' "$ml" 2>/dev/null; }
# The file modprobe would load for nvidia_peermem, links followed.
dk_resolve() { local f; f=$(modinfo -k "$krel" -n nvidia_peermem 2>/dev/null) && readlink -f "$f"; }
if [ "$rc" = 0 ] && dkms status "peermem/$ver" -k "$krel" 2>/dev/null | grep -q ': installed'; then
	ok "dkms: dpkg -i ${deb##*/} adds peermem/$ver to dkms, builds and installs the drop-in for $krel ($((t1 - t0)) s)"
else
	notok "dkms: install for $krel (rc $rc)"
	tail -n 25 "$scratch/dkms-install.log" | sed 's/^/#   /'
	[ -f "$log" ] && grep -E 'peermem:|error' "$log" | head -n 10 | sed 's/^/#   /'
	echo "#   (make.log kept as $PEERMEM_CACHE/logs/dkms-make.log)"
fi
ko=$(ls "/lib/modules/$krel/updates/dkms/nvidia_peermem.ko"* 2>/dev/null | head -n 1)
if [ -n "$ko" ] && [ "$(modinfo -F name "$ko")" = nvidia_peermem ] && [ "$(modinfo -F version "$ko")" = "$ver" ] &&
	[ "$(modinfo -F vermagic "$ko" | cut -d' ' -f1)" = "$krel" ] && [ "$(modinfo -F depends "$ko")" = gpusim ]; then
	ok "dkms: the drop-in is in /lib/modules/$krel/updates/dkms (name nvidia_peermem, version $ver as the package's, vermagic $krel, depends on the stand-in driver)"
else
	notok "dkms: installed module (${ko:-none}: name $(modinfo -F name "$ko" 2>/dev/null), depends $(modinfo -F depends "$ko" 2>/dev/null))"
fi
if grep -q "nvidia_p2p_\* from $nvb/Module.symvers" "$log" 2>/dev/null; then
	ok "dkms: the build found the NVIDIA DKMS layout's Module.symvers (/var/lib/dkms/nvidia/<ver>/build of a version built for $krel)"
else
	notok "dkms: the build's NVIDIA symvers ($(grep -m1 'nvidia_p2p_\* from' "$log" 2>/dev/null))"
fi
junk=$(find "/usr/src/peermem-$ver" -name '*.o' -o -name '*.ko' -o -name '*.cmd' -o -name ffi_generated.rs 2>/dev/null)
if [ -f "/usr/src/peermem-$ver/dkms.conf" ] && [ -f "/usr/src/peermem-$ver/rust/peermem.rs" ] && [ -z "$junk" ]; then
	ok "dkms: /usr/src/peermem-$ver holds the sources and dkms.conf, no build outputs of the checkout"
else notok "dkms: /usr/src/peermem-$ver: $(echo "$junk" | head -n 3)"; fi
if grep -qx 'softdep nvidia_peermem pre: nvidia ib_uverbs ib_core' "$mp" 2>/dev/null && ! grep -qE '^(blacklist|install) ' "$mp"; then
	ok "dkms: modprobe.d/peermem-softdep.conf has the softdep on the driver and OFED's core (and for the drop-in no blacklist or install rule: modprobe nvidia_peermem is ours)"
else
	notok "dkms: modprobe.d/peermem-softdep.conf: $(tr '\n' '|' <"$mp" 2>/dev/null)"
fi
# Boot loading: the unit, ordered after openibd and the driver and part of
# their restarts, enabled by the postinst (offline: its wants links).
verify=skip
if command -v systemd-analyze >/dev/null; then
	if systemd-analyze verify "$ml" >"$scratch/verify.log" 2>&1; then verify=ok; else verify=$(head -c 300 "$scratch/verify.log" | tr '\n' '|'); fi
fi
if [ "$(dk_unit_mod)" = nvidia_peermem ] && grep -qx 'After=openibd.service nvidia-persistenced.service systemd-modules-load.service' "$ml" &&
	grep -qx 'PartOf=openibd.service nvidia-persistenced.service' "$ml" && [ -L /etc/systemd/system/multi-user.target.wants/peermem.service ] &&
	[ -L /etc/systemd/system/openibd.service.wants/peermem.service ] &&
	[ -L /etc/systemd/system/nvidia-persistenced.service.wants/peermem.service ] && [ "$verify" != "${verify#[os]}" ]; then
	ok "dkms: the package's systemd unit loads nvidia_peermem after openibd and nvidia-persistenced and again after their restarts (PartOf), enabled for multi-user.target, openibd.service and nvidia-persistenced.service (systemd-analyze verify: $verify)"
else
	notok "dkms: the systemd unit (loads '$(dk_unit_mod)'; verify: $verify; wants links: $(ls /etc/systemd/system/*.wants/peermem.service 2>/dev/null | tr '\n' ' '))"
fi
if [ -L "$pin/${ko##*/}" ] && [ "$(readlink -f "$pin/${ko##*/}")" = "$(readlink -f "$ko")" ] && grep -qx 'override nvidia_peermem \* updates/peermem' "$dpd" 2>/dev/null &&
	[ "$(dk_resolve)" = "$(readlink -f "$ko")" ]; then
	ok "dkms: dkms's POST_INSTALL hook links the drop-in from updates/peermem/, which depmod.d/peermem.conf makes modprobe prefer; modinfo -n nvidia_peermem resolves to it"
else
	notok "dkms: the override (link: $(ls -l "$pin" 2>/dev/null | tail -n +2 | tr '\n' '|'); depmod.d: $(grep -v '^#' "$dpd" 2>/dev/null); resolves to '$(dk_resolve)')"
fi
# depmod: the DKMS copy wins over a precompiled/.run nvidia-peermem.ko in kernel/.
if [ "$made_moddir" = 1 ] && [ -n "$ko" ]; then
	mkdir -p "/lib/modules/$krel/kernel/nvidia-580"
	printf 'static const char v[] __attribute__((section(".modinfo"),used)) = "description=stand-in for NVIDIA nvidia-peermem";\n' >"$scratch/np.c"
	cc -c -o "/lib/modules/$krel/kernel/nvidia-580/nvidia-peermem.ko" "$scratch/np.c"
	depmod "$krel" 2>/dev/null
	got=$(dk_resolve)
	if [ "$got" = "$(readlink -f "$ko")" ]; then
		ok "dkms: modprobe resolves nvidia_peermem to the DKMS drop-in, not to kernel/nvidia-580/nvidia-peermem.ko"
	else notok "dkms: modprobe resolves nvidia_peermem to '$got', not $ko"; fi
	# NVIDIA's DKMS driver installed after peermem: its nvidia-peermem.ko
	# in the same updates/dkms (dkms then runs depmod).
	printf 'static const char v[] __attribute__((section(".modinfo"),used)) = "description=stand-in for NVIDIA DKMS nvidia-peermem";\n' >"$scratch/npd.c"
	cc -c -o "/lib/modules/$krel/updates/dkms/nvidia-peermem.ko" "$scratch/npd.c"
	depmod "$krel" 2>/dev/null
	got=$(dk_resolve)
	# Without the link and peermem's depmod.d file (versions before 0.3.1)
	# depmod takes either of the two in updates/dkms: which one, for the record.
	mkdir -p "$scratch/no-depmod.d" && mv "$pin" "$scratch/pin.away" &&
		{ depmod -C "$scratch/no-depmod.d" -n "$krel" 2>/dev/null >"$scratch/dep-without.txt"; mv "$scratch/pin.away" "$pin"; }
	without=$(grep -oE '^[^:]*peermem[^:]*\.ko[^:]*' "$scratch/dep-without.txt" | head -n 1)
	depmod "$krel" 2>/dev/null
	if [ "$got" = "$(readlink -f "$ko")" ]; then
		ok "dkms: NVIDIA's DKMS nvidia-peermem.ko installed into updates/dkms after peermem: modprobe still resolves nvidia_peermem to peermem's (without the link and override depmod takes ${without:-?})"
	else notok "dkms: after NVIDIA's DKMS nvidia-peermem.ko, modprobe resolves nvidia_peermem to '$got', not $ko"; fi
else
	dk_skip "depmod priority over kernel/nvidia-*/nvidia-peermem.ko and NVIDIA's DKMS nvidia-peermem.ko" "/lib/modules/$krel existed before the test"
fi
# Switching builds with the package (troubleshooting.md, "Switching"): the
# DROPIN=0 package installed over the drop-in one (same version: a
# reinstall, whose prerm removes the old build from dkms), then back.
deb0=$(PEERMEM_MAINTAINER='Fleet Ops <ops@example.com>' bash "$PEERMEM_ROOT/scripts/deb.sh" --out "$scratch/deb-peermem" --peermem 2>>"$scratch/deb.log" | tail -n 1)
PEERMEM_SYSROOT=$tr PEERMEM_DKMS_JOBS=2 dpkg -i "$deb0" >"$scratch/dpkg-switch.log" 2>&1; rc=$?
ko0=$(ls "/lib/modules/$krel/updates/dkms/peermem.ko"* 2>/dev/null | head -n 1)
koold=$(ls "/lib/modules/$krel/updates/dkms/nvidia_peermem.ko"* 2>/dev/null)
rule=$(sed -n 's/^install nvidia_peermem //p' "$mp" 2>/dev/null)
if [ "$(dpkg-deb -f "$deb0" Maintainer 2>/dev/null)" = 'Fleet Ops <ops@example.com>' ]; then
	ok "dkms: make deb with PEERMEM_MAINTAINER names that maintainer in the package"
else notok "dkms: PEERMEM_MAINTAINER: the package's maintainer is '$(dpkg-deb -f "$deb0" Maintainer 2>/dev/null)'"; fi
if [ "$rc" = 0 ] && [ -n "$ko0" ] && [ "$(modinfo -F name "$ko0")" = peermem ] && [ -z "$koold" ] &&
	grep -qx 'softdep peermem pre: nvidia ib_uverbs ib_core' "$mp" && [ -n "$rule" ] && [ "$(dk_unit_mod)" = peermem ] &&
	[ ! -e "$pin/nvidia_peermem.ko" ] && [ ! -L "$pin/nvidia_peermem.ko" ]; then
	ok "dkms: switching to the DROPIN=0 package (dpkg -i over the drop-in one): peermem.ko installed, nvidia_peermem.ko and its link gone (POST_REMOVE), its softdep, install rule and boot load"
else
	notok "dkms: switch to the DROPIN=0 package (rc $rc; peermem.ko '${ko0:-none}', left '$koold'; modprobe.d: $(grep -v '^#' "$mp" 2>/dev/null | tr '\n' '|'))"
	tail -n 8 "$scratch/dpkg-switch.log" | sed 's/^/#   /'
fi
PEERMEM_SYSROOT=$tr PEERMEM_DKMS_JOBS=2 dpkg -i "$deb" >>"$scratch/dpkg-switch.log" 2>&1; rc=$?
ko0=$(ls "/lib/modules/$krel/updates/dkms/peermem.ko"* 2>/dev/null)
if [ "$rc" = 0 ] && [ -n "$ko" ] && [ -f "$ko" ] && [ -z "$ko0" ] && ! grep -q '^install ' "$mp" && [ "$(dk_unit_mod)" = nvidia_peermem ] &&
	[ "$(dk_resolve)" = "$(readlink -f "$ko")" ]; then
	ok "dkms: and back to the drop-in package: nvidia_peermem.ko installed, peermem.ko and the install rule gone; installed after NVIDIA's DKMS nvidia-peermem.ko$([ -e "/lib/modules/$krel/updates/dkms/nvidia-peermem.ko" ] || echo ' (not there: skipped above)'), modprobe resolves to peermem's"
else
	notok "dkms: switch back to the drop-in package (rc $rc; drop-in '${ko:-none}' $([ -f "$ko" ] && echo present || echo missing), peermem.ko left '$ko0')"
	tail -n 8 "$scratch/dpkg-switch.log" | sed 's/^/#   /'
fi
# An upgrade to a newer version (the same sources as version $ver.1, a
# tree without git, so the package's version is the plain one), then a
# rollback to the package before it (apt install --allow-downgrades, which
# is dpkg's --force-downgrade): each time the installed version's build is
# the only one in dkms and the module's version is the package's.
up=$scratch/up
mkdir -p "$up"
(cd "$PEERMEM_ROOT" && tar --exclude='*.o' --exclude='*.ko' --exclude='*.cmd' --exclude=ffi_generated.rs \
	-cf - Kbuild Makefile CHANGELOG.md LICENSE dkms include rust scripts docs/troubleshooting.md) | tar -xf - -C "$up"
sed -i "s/^#define PEERMEM_VERSION \"$ver\"/#define PEERMEM_VERSION \"$ver.1\"/" "$up/include/peermem_ffi.h"
debup=$(bash "$up/scripts/deb.sh" --out "$scratch/deb-up" 2>>"$scratch/deb.log" | tail -n 1)
PEERMEM_SYSROOT=$tr PEERMEM_DKMS_JOBS=2 dpkg -i "$debup" >"$scratch/dpkg-upgrade.log" 2>&1; rc=$?
vers=$(find /var/lib/dkms/peermem -mindepth 1 -maxdepth 1 -type d ! -name original_module -printf '%f ' 2>/dev/null)
if [ "$rc" = 0 ] && [ "$(dpkg-query -W -f '${Version}' peermem-dkms 2>/dev/null)" = "$ver.1" ] && [ "$vers" = "$ver.1 " ] &&
	[ "$(modinfo -F version "$ko" 2>/dev/null)" = "$ver.1" ]; then
	ok "dkms: upgrade to ${debup##*/}: the package configured, $ver.1 built and installed for $krel, $ver gone from dkms"
else
	notok "dkms: upgrade to ${debup:-no package} (rc $rc; dkms has: $vers; module version $(modinfo -F version "$ko" 2>/dev/null))"
	tail -n 8 "$scratch/dpkg-upgrade.log" | sed 's/^/#   /'
fi
PEERMEM_SYSROOT=$tr PEERMEM_DKMS_JOBS=2 dpkg -i --force-downgrade "$deb" >"$scratch/dpkg-rollback.log" 2>&1; rc=$?
vers=$(find /var/lib/dkms/peermem -mindepth 1 -maxdepth 1 -type d ! -name original_module -printf '%f ' 2>/dev/null)
if [ "$rc" = 0 ] && [ "$(dpkg-query -W -f '${Version}' peermem-dkms 2>/dev/null)" = "$debv" ] && [ "$vers" = "$ver " ] &&
	[ "$(modinfo -F version "$ko" 2>/dev/null)" = "$ver" ] && [ ! -e "/usr/src/peermem-$ver.1" ]; then
	ok "dkms: rollback to ${deb##*/} (--force-downgrade, apt's --allow-downgrades): $ver built and installed again, $ver.1 gone"
else
	notok "dkms: rollback to $debv (rc $rc; dkms has: $vers; module version $(modinfo -F version "$ko" 2>/dev/null))"
	tail -n 8 "$scratch/dpkg-rollback.log" | sed 's/^/#   /'
fi
dpkg -r peermem-dkms >"$scratch/dpkg-remove.log" 2>&1; rc=$?
left=$(ls -d /var/lib/dkms/peermem/*/ "/usr/src/peermem-$ver" "/lib/modules/$krel/updates/dkms/nvidia_peermem.ko"* "$mp" "$ml" "$dpd" "$pin" \
	/etc/modprobe.d/peermem-softdep.conf /etc/modules-load.d/peermem.conf /etc/systemd/system/*.wants/peermem.service 2>/dev/null)
got=$(dk_resolve)
if [ "$rc" = 0 ] && [ -z "$left" ] && [ "$got" != "$(readlink -f "$ko")" ]; then
	ok "dkms: dpkg -r peermem-dkms (apt remove) removes it from dkms for every kernel, its sources, the module and its link (modprobe resolves nvidia_peermem to ${got:-nothing}), the modprobe.d and depmod.d files and the unit with its wants links: nothing left that acts"
else
	notok "dkms: dpkg -r (rc $rc; left: $left; modinfo -n nvidia_peermem: '$got')"; tail -n 10 "$scratch/dpkg-remove.log" | sed 's/^/#   /'
fi
dpkg --purge peermem-dkms >"$scratch/dpkg-purge.log" 2>&1; rc=$?
st=$(dpkg-query -W -f '${db:Status-Abbrev}' peermem-dkms 2>/dev/null)
if [ "$rc" = 0 ] && { [ -z "$st" ] || [[ $st == un* ]] || [[ $st == pn* ]]; }; then
	ok "dkms: dpkg --purge after it: dpkg keeps no trace of the package (status '${st:-none}')"
else
	notok "dkms: dpkg --purge (rc $rc; status '$st')"; tail -n 10 "$scratch/dpkg-purge.log" | sed 's/^/#   /'
fi
made_etc=0
# From here on scripts/dkms.sh writes its /etc files into the scratch directory.
mp=$scratch/modprobe.d/peermem-softdep.conf ml=$scratch/systemd/peermem.service dpd=$scratch/depmod.d/peermem.conf
# A kernel without the peer-memory core (the 6.12 compile-check tree, when
# tests/host/compat built it): the default build, with the core found in an
# old-style OFED DKMS tree for that kernel, a stale `default` rejected.
# Without a built tree, the prepared one (make modules_prepare, what
# tests/host/compat makes): no vmlinux symbol list there, so the build may
# leave the kernel's own symbols unresolved (PEERMEM_UNRESOLVED_OK=1, passed
# to make through dkms); OFED's and the driver's are resolved as on a host.
k6=$("$PEERMEM_ROOT/scripts/kernel.sh" --variant plain --kver 6.12 --print-kdir 2>/dev/null | tail -n 1) k6ok=''
if [ -z "$k6" ] || [ ! -f "$k6/.peermem-built" ]; then
	k6=$("$PEERMEM_ROOT/scripts/kernel.sh" --variant plain --kver 6.12 --prepare-only --print-kdir 2>/dev/null | tail -n 1)
	[ -n "$k6" ] && [ -f "$k6/.peermem-prepared" ] && k6ok=1
else
	k6ok=0
fi
if [ -n "$k6ok" ] && [ -f "$k6/include/config/kernel.release" ]; then
	k6rel=$(cat "$k6/include/config/kernel.release")
	[ -d "/lib/modules/$k6rel" ] || made_moddir6=1
	mkdir -p "/lib/modules/$k6rel"
	if [ ! -e "/lib/modules/$k6rel/build" ]; then ln -s "$k6" "/lib/modules/$k6rel/build"; made_build6=1; fi
	mkdir -p "$tr/var/lib/dkms/nvidia/580.95/$k6rel/x86_64" "$tr/var/lib/dkms/mlnx-ofed-kernel/24.10/build" \
		"$tr/var/lib/dkms/mlnx-ofed-kernel/24.10/$k6rel/x86_64"
	cp "$ofd/Module.symvers" "$tr/var/lib/dkms/mlnx-ofed-kernel/24.10/build/Module.symvers"
	rm -rf "$tr/usr/src/ofa_kernel-dkms"
	t0=$(date +%s)
	PEERMEM_UNRESOLVED_OK=$k6ok PEERMEM_SYSROOT=$tr PEERMEM_DKMS_JOBS=2 PEERMEM_MODPROBE_D=$scratch/modprobe.d PEERMEM_MODULES_LOAD_D=$scratch/modules-load.d PEERMEM_DEPMOD_D=$scratch/depmod.d PEERMEM_UNIT_D=$scratch/systemd \
		bash "$PEERMEM_ROOT/scripts/dkms.sh" install --peermem --kernel "$k6rel" >"$scratch/dkms-install6.log" 2>&1
	rc=$?
	t1=$(date +%s)
	ko6=$(ls "/lib/modules/$k6rel/updates/dkms/peermem.ko"* 2>/dev/null | head -n 1)
	log6=$(ls "/var/lib/dkms/peermem/$ver/$k6rel/x86_64/log/make.log" 2>/dev/null)
	if [ "$rc" = 0 ] && [ -n "$ko6" ] && [ "$(modinfo -F vermagic "$ko6" | cut -d' ' -f1)" = "$k6rel" ] &&
		[ "$(modinfo -F depends "$ko6" | tr ',' '\n' | sort | tr '\n' ' ')" = "gpusim ib_uverbs " ]; then
		ok "dkms: $k6rel (no core in the kernel): --peermem: peermem.ko built and installed against the stand-in OFED's ib_uverbs and NVIDIA layouts ($((t1 - t0)) s)"
	else
		notok "dkms: $k6rel build (rc $rc; ko ${ko6:-none}, depends $(modinfo -F depends "$ko6" 2>/dev/null))"
		tail -n 15 "$scratch/dkms-install6.log" | sed 's/^/#   /'
	fi
	if grep -q "ib_register_peer_memory_client from $tr/var/lib/dkms/mlnx-ofed-kernel/24.10/build/Module.symvers (exported by ib_uverbs)" "$log6" 2>/dev/null &&
		grep -q "not using $tr/usr/src/ofa_kernel/default: it points at .*6.8.0-old" "$log6"; then
		ok "dkms: $k6rel: the build took the OFED DKMS tree dkms built for $k6rel and rejected the stale ofa_kernel/default"
	else
		notok "dkms: $k6rel OFED discovery: $(grep -m3 'peermem:' "$log6" 2>/dev/null | tr '\n' '|')"
	fi
else
	dk_skip "a build for a kernel without the core (6.12)" "no 6.12 tree, built or prepared (tests/host/compat prepares it)"
	dk_skip "OFED discovery in a DKMS build" "no 6.12 tree, built or prepared"
fi
PEERMEM_MODPROBE_D=$scratch/modprobe.d PEERMEM_MODULES_LOAD_D=$scratch/modules-load.d PEERMEM_DEPMOD_D=$scratch/depmod.d PEERMEM_UNIT_D=$scratch/systemd bash "$PEERMEM_ROOT/scripts/dkms.sh" uninstall >"$scratch/dkms-uninstall.log" 2>&1; rc1=$?
PEERMEM_MODPROBE_D=$scratch/modprobe.d PEERMEM_MODULES_LOAD_D=$scratch/modules-load.d PEERMEM_DEPMOD_D=$scratch/depmod.d PEERMEM_UNIT_D=$scratch/systemd bash "$PEERMEM_ROOT/scripts/dkms.sh" uninstall >>"$scratch/dkms-uninstall.log" 2>&1; rc2=$?
left=$(ls -d /var/lib/dkms/peermem/*/ "/usr/src/peermem-$ver" ${k6rel:+"/lib/modules/$k6rel/updates/dkms/peermem.ko"*} "$mp" "$ml" 2>/dev/null)
if [ "$rc1" = 0 ] && [ "$rc2" = 0 ] && [ -z "$left" ]; then
	ok "dkms: make dkms-uninstall removes what make dkms-install added$([ -n "$k6rel" ] || echo ' (nothing: the package was purged)'), and a second uninstall is a no-op"
else
	notok "dkms: uninstall (rc $rc1/$rc2; left: $left)"
	tail -n 10 "$scratch/dkms-uninstall.log" | sed 's/^/#   /'
fi
# --peermem, with a stand-in dkms (nothing built): the files it writes.
# Before it, the modprobe.d file of an earlier version (peermem.conf, with
# its header) and an operator's options file: the install removes the
# first and leaves the second alone.
mkdir -p "$scratch/fakedkms" "$scratch/modprobe.d"
printf "# Installed by peermem's make dkms-install (scripts/dkms.sh); removed by make dkms-uninstall.\nsoftdep nvidia_peermem pre: nvidia\n" >"$scratch/modprobe.d/peermem.conf"
echo 'options nvidia_peermem watch_cache_mib=128' >"$scratch/modprobe.d/peermem-options.conf"
mkdir -p "$scratch/modules-load.d"
printf "# Installed by peermem's make dkms-install (scripts/dkms.sh); removed by make dkms-uninstall.\nnvidia_peermem\n" >"$scratch/modules-load.d/peermem.conf"
printf '#!/bin/sh\nexit 0\n' >"$scratch/fakedkms/dkms"; chmod +x "$scratch/fakedkms/dkms"
DKMS=$scratch/fakedkms/dkms PEERMEM_DKMS_SRC=$scratch/src PEERMEM_MODPROBE_D=$scratch/modprobe.d PEERMEM_MODULES_LOAD_D=$scratch/modules-load.d PEERMEM_DEPMOD_D=$scratch/depmod.d PEERMEM_UNIT_D=$scratch/systemd \
	bash "$PEERMEM_ROOT/scripts/dkms.sh" install --peermem --kernel "$krel" >"$scratch/dkms-peermem.log" 2>&1; rc=$?
rule=$(sed -n 's/^install nvidia_peermem //p' "$mp" 2>/dev/null)
out=$(sh -c "$rule" 2>&1); rrc=$?
if [ "$rc" = 0 ] && grep -qx 'softdep peermem pre: nvidia ib_uverbs ib_core' "$mp" && [ -n "$rule" ] && [ "$rrc" != 0 ] &&
	grep -q 'peermem serves GPU memory' <<<"$out" && [ "$(dk_unit_mod)" = peermem ] && [ ! -e "$scratch/modules-load.d/peermem.conf" ] &&
	grep -qx 'override peermem \* updates/peermem' "$dpd" && grep -q 'not enabled' "$scratch/dkms-peermem.log" &&
	[ ! -e "$scratch/modprobe.d/peermem.conf" ] && [ "$(cat "$scratch/modprobe.d/peermem-options.conf")" = 'options nvidia_peermem watch_cache_mib=128' ]; then
	ok "dkms: --peermem: softdep for peermem, modprobe nvidia-peermem fails with a message (exit $rrc), the unit loads peermem (written, and not enabled outside /etc/systemd/system), depmod.d override for peermem; an earlier version's modprobe.d peermem.conf and modules-load.d file removed, the operator's peermem-options.conf kept"
else
	notok "dkms: --peermem (rc $rc): rule '$rule' (exit $rrc: $out); modprobe.d: $(tr '\n' '|' <"$mp" 2>/dev/null); unit loads '$(dk_unit_mod)'; in modprobe.d: $(ls "$scratch/modprobe.d" | tr '\n' ' ')"
fi
# An operator's own peermem.conf (no header of ours) is not peermem's to remove.
echo 'options peermem watch_cache=64' >"$scratch/modprobe.d/peermem.conf"
DKMS=$scratch/fakedkms/dkms PEERMEM_DKMS_SRC=$scratch/src PEERMEM_MODPROBE_D=$scratch/modprobe.d PEERMEM_MODULES_LOAD_D=$scratch/modules-load.d PEERMEM_DEPMOD_D=$scratch/depmod.d PEERMEM_UNIT_D=$scratch/systemd \
	bash "$PEERMEM_ROOT/scripts/dkms.sh" install --peermem --no-boot-load --kernel "$krel" >>"$scratch/dkms-peermem.log" 2>&1
if [ ! -e "$ml" ] && [ -f "$mp" ] && [ "$(cat "$scratch/modprobe.d/peermem.conf" 2>/dev/null)" = 'options peermem watch_cache=64' ]; then
	ok "dkms: --no-boot-load writes no systemd unit (and the one of the install before is gone); an operator's own peermem.conf is kept"
else notok "dkms: --no-boot-load: $ml: $(tr '\n' '|' <"$ml" 2>/dev/null); $mp $([ -f "$mp" ] && echo present || echo missing)"; fi
DKMS=$scratch/fakedkms/dkms PEERMEM_DKMS_SRC=$scratch/src PEERMEM_MODPROBE_D=$scratch/modprobe.d PEERMEM_MODULES_LOAD_D=$scratch/modules-load.d PEERMEM_DEPMOD_D=$scratch/depmod.d PEERMEM_UNIT_D=$scratch/systemd \
	bash "$PEERMEM_ROOT/scripts/dkms.sh" uninstall >>"$scratch/dkms-peermem.log" 2>&1
dk_cleanup
trap 'rm -rf "$scratch"' EXIT
left=$(ls -d /var/lib/dkms/peermem "/usr/src/peermem-$ver" 2>/dev/null; [ "$made_moddir" = 1 ] && ls -d "/lib/modules/$krel" 2>/dev/null; [ "$made_moddir6" = 1 ] && ls -d "/lib/modules/$k6rel" 2>/dev/null)
if [ -z "$left" ]; then ok "dkms: nothing left on the host (/var/lib/dkms/peermem, /usr/src/peermem-$ver$([ "$made_moddir" = 1 ] && echo ", /lib/modules/$krel")$([ "$made_moddir6" = 1 ] && echo ", /lib/modules/$k6rel"))"
else notok "dkms: left behind: $left"; fi
scratch=$(mktemp -d /tmp/peermem-install-test.XXXXXX)
exec 9>&-
