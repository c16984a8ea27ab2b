#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# Build peermem's DKMS package, peermem-dkms_<version>_all.deb (make deb).
#
#   scripts/deb.sh [--out DIR] [--peermem] [--no-boot-load] [--help]
#
# The package holds what `make dkms-install` puts on a host (scripts/dkms.sh
# stage): the sources and dkms.conf in /usr/src/peermem-<version>/,
# /usr/lib/modprobe.d/peermem-softdep.conf (softdeps on the NVIDIA driver and OFED's
# core), /usr/lib/depmod.d/peermem.conf (modprobe takes this module over
# NVIDIA's DKMS nvidia-peermem.ko) and /usr/lib/systemd/system/peermem.service
# (load at boot after openibd and the driver, and after their restarts;
# enabled by the postinst); a file of the same name in /etc overrides each
# (kmod and systemd read both, on the merged /usr of every current Debian
# and Ubuntu). By default the
# module is the drop-in nvidia_peermem (what NCCL, UCX, UCC, NVSHMEM and
# Open MPI detect); --peermem packages peermem.ko instead, --no-boot-load
# leaves the boot loading out. The version is PEERMEM_VERSION in
# include/peermem_ffi.h, the one place it is written (modinfo's `version`
# and /sys/module/<name>/version say the same).
#
# Installing it (`sudo apt install ./peermem-dkms_<version>_all.deb`) adds it
# to dkms and builds and installs it for every installed kernel that has
# CONFIG_RUST=y and its headers (others are skipped with a line saying so);
# dkms builds it again for each new kernel and signs it where dkms signs
# (Ubuntu: the MOK of shim-signed; Debian: /var/lib/dkms/mok.key). Removing
# it (`apt remove`) disables the unit and removes it from dkms for every
# kernel, and the files with the package: none is a conffile, so nothing is
# kept that would go on acting (loading a module at boot, refusing or
# overriding NVIDIA's). The package's
# maintainer is PEERMEM_MAINTAINER ('Name <mail>': whoever builds it for a
# fleet and takes its reports), by default a placeholder of the project;
# it ships troubleshooting.md, whose "Reporting a problem" says what a
# report needs. Needs dpkg-deb; builds as any user.
set -euo pipefail
{
. "$(dirname "$0")/lib.sh"
cd "$PEERMEM_ROOT"

usage='scripts/deb.sh [--out DIR] [--peermem] [--no-boot-load] [--help]'
out=$PEERMEM_ROOT/dist stage_args=()
while [ $# -gt 0 ]; do
	case $1 in
	--out) pm_need_value "$usage" "$@"; out=$2; shift 2 ;;
	--peermem|--no-boot-load|--dropin) stage_args+=("$1"); shift ;;
	-h|--help) pm_help "$0" '^set -euo'; exit 0 ;;
	*) pm_usage_die "unknown argument '$1'" "$usage" ;;
	esac
done
pm_need_cmd dpkg-deb "install dpkg (Debian/Ubuntu: it is there; elsewhere use make dkms-install)"
version=$(sed -n 's/^#define PEERMEM_VERSION "\(.*\)"/\1/p' include/peermem_ffi.h)
[ -n "$version" ] || pm_die "cannot read PEERMEM_VERSION from include/peermem_ffi.h"
# The package's version: PEERMEM_VERSION at its release tag (v<version>);
# any other commit gets +git<commits>.g<hash> (and .dirty), so that every
# rebuilt package is newer to dpkg and names its source. dkms keeps the
# plain version (/usr/src/peermem-<version>).
debver=$version
if git rev-parse --git-dir >/dev/null 2>&1 && [ "$(git describe --tags --exact-match 2>/dev/null)" != "v$version" ]; then
	debver=$version+git$(git rev-list --count HEAD).g$(git rev-parse --short=7 HEAD)
	[ -z "$(git status --porcelain --untracked-files=no)" ] || debver+=.dirty
fi
modname=nvidia_peermem
for a in "${stage_args[@]}"; do [ "$a" = --peermem ] && modname=peermem; done

work=$(mktemp -d "${TMPDIR:-/tmp}/peermem-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/root
PEERMEM_DKMS_JOBS='$(nproc)' bash scripts/dkms.sh stage "$root" "${stage_args[@]}"
mkdir -p "$root/DEBIAN" "$root/usr/share/doc/peermem-dkms"
# The doctor, for the operator and for bug reports (--bundle); the changelog.
install -D -m 0755 scripts/doctor.sh "$root/usr/sbin/peermem-doctor"
cp CHANGELOG.md "$root/usr/share/doc/peermem-dkms/changelog"
cp docs/troubleshooting.md "$root/usr/share/doc/peermem-dkms/troubleshooting.md"
cp LICENSE "$root/usr/share/doc/peermem-dkms/copyright"
size=$(du -sk "$root" | cut -f1)
# Who answers for this package: whoever builds it for a fleet sets
# PEERMEM_MAINTAINER to themselves; the default is a placeholder of the
# project (reports: troubleshooting.md, "Reporting a problem").
maint=${PEERMEM_MAINTAINER:-peermem project <peermem-maintainers@example.invalid>}
# No Recommends of a compiler: a module is built with the kernel's own
# (gcc for Ubuntu's kernels; for a clang-built one its versioned clang,
# which the Makefile names), and an unversioned clang/lld would only pull
# in the distribution's default version.
cat >"$root/DEBIAN/control" <<C
Package: peermem-dkms
Version: $debver
Architecture: all
Section: kernel
Priority: optional
Depends: dkms (>= 2.8), make, python3
Installed-Size: $size
Maintainer: $maint
Description: GPU-memory peer-memory client for RDMA (DKMS, Rust)
 peermem lets RDMA adapters register NVIDIA GPU memory with plain
 ibv_reg_mr(): a peer-memory client for the MLNX_OFED / DOCA-OFED core,
 written in Rust, installed as the module $modname. It builds only for
 kernels with CONFIG_RUST=y whose headers carry the Rust metadata, with the
 rustc and bindgen that kernel was built with (see docs/install.md).
 Problems: peermem-doctor; to report one, see
 /usr/share/doc/peermem-dkms/troubleshooting.md, "Reporting a problem".
C
cat >"$root/DEBIAN/postinst" <<P
#!/bin/sh
# peermem-dkms: add to dkms, build and install for every kernel that can
# build it. A kernel that cannot (no Rust, no Rust metadata in its headers,
# a failed build) is skipped with a line saying why and what to do: the
# package stays configured, so apt never stops half-done on peermem.
set -e
[ "\$1" = configure ] || exit 0
# BUILD_DEPENDS as make dkms-install writes them: the OFED and NVIDIA DKMS
# modules registered now, so that dkms autoinstall builds those first for
# a new kernel (written again at each configure; dpkg --verify shows
# dkms.conf as changed).
conf=/usr/src/peermem-$version/dkms.conf
sed -i '/^BUILD_DEPENDS\[/d' "\$conf"
i=0
for d in /var/lib/dkms/mlnx-ofed-kernel /var/lib/dkms/nvidia*; do
	[ -d "\$d" ] || continue
	echo "BUILD_DEPENDS[\$i]=\"\$(basename "\$d")\"" >>"\$conf"
	i=\$((i + 1))
done
dkms add -m peermem -v $version >/dev/null 2>&1 || dkms status -m peermem -v $version | grep -q . || exit 1
failed=""
for b in /lib/modules/*/build; do
	[ -f "\$b/.config" ] || continue
	rel=\$(basename "\$(dirname "\$b")")
	if ! grep -qx 'CONFIG_RUST=y' "\$b/.config"; then
		echo "peermem-dkms: skipping \$rel: built without Rust (CONFIG_RUST is not y)"
		continue
	fi
	if [ ! -f "\$b/rust/libkernel.rmeta" ] && [ ! -f "\$b/rust/kernel.o" ]; then
		echo "peermem-dkms: skipping \$rel: its headers have no Rust metadata (Ubuntu: apt install linux-lib-rust-\$rel)"
		continue
	fi
	if dkms install -m peermem -v $version -k "\$rel"; then
		echo "peermem-dkms: installed $modname for \$rel"
	else
		echo "peermem-dkms: the build for \$rel failed: /var/lib/dkms/peermem/$version/build/make.log; peermem-doctor says what is missing" >&2
		failed="\$failed \$rel"
	fi
done
# The unit that loads the module at boot and after an openibd restart
# (deb-systemd-helper keeps an administrator's disable across upgrades).
if [ -f /usr/lib/systemd/system/peermem.service ]; then
	if command -v deb-systemd-helper >/dev/null 2>&1; then
		if deb-systemd-helper debian-installed peermem.service && ! deb-systemd-helper --quiet was-enabled peermem.service; then
			deb-systemd-helper update-state peermem.service >/dev/null 2>&1 || true
		else
			deb-systemd-helper enable peermem.service >/dev/null 2>&1 || true
		fi
	elif command -v systemctl >/dev/null 2>&1; then
		systemctl --no-reload enable peermem.service >/dev/null 2>&1 || true
	fi
	[ ! -d /run/systemd/system ] || systemctl daemon-reload >/dev/null 2>&1 || true
fi
[ -z "\$failed" ] || echo "peermem-dkms: not installed for:\$failed (the package stays configured; dkms autoinstall tries again at the next kernel install, or: sudo dkms install -m peermem -v $version -k <release>)" >&2
exit 0
P
cat >"$root/DEBIAN/prerm" <<P
#!/bin/sh
# peermem-dkms: remove from dkms, every kernel.
set -e
case "\$1" in remove|upgrade|deconfigure)
	dkms remove -m peermem -v $version --all >/dev/null 2>&1 || true ;;
esac
if [ "\$1" = remove ] && [ -f /usr/lib/systemd/system/peermem.service ]; then
	if command -v deb-systemd-helper >/dev/null 2>&1; then
		deb-systemd-helper disable peermem.service >/dev/null 2>&1 || true
		deb-systemd-helper purge peermem.service >/dev/null 2>&1 || true
	elif command -v systemctl >/dev/null 2>&1; then
		systemctl --no-reload disable peermem.service >/dev/null 2>&1 || true
	fi
fi
exit 0
P
chmod 0755 "$root/DEBIAN/postinst" "$root/DEBIAN/prerm"
mkdir -p "$out"
deb=$out/peermem-dkms_${debver}_all.deb
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
exit
}
