#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# Install peermem as a DKMS module (built again by dkms for every new kernel),
# or remove it. `make dkms-install` / `make dkms-uninstall` call this.
#
#   scripts/dkms.sh install [--peermem|--dropin] [--no-boot-load] [--kernel REL]...
#   scripts/dkms.sh uninstall
#   scripts/dkms.sh stage ROOT [--peermem|--dropin] [--no-boot-load]
#
# install:
#   - copies the module's sources to /usr/src/peermem-<version>/ with a
#     dkms.conf (dkms/dkms.conf.in): by default the module is the drop-in
#     nvidia_peermem.ko (NVIDIA's name, the one NCCL, UCX, UCC, NVSHMEM and
#     Open MPI look for: /sys/module/nvidia_peermem/version), or with
#     --peermem peermem.ko (the project's own name, which those stacks do
#     not detect on a current OFED; README.md, "Default or drop-in");
#     dkms builds it only for kernels with CONFIG_RUST=y
#     (BUILD_EXCLUSIVE_CONFIG) and finds the NVIDIA and OFED Module.symvers
#     at each build itself (scripts/find-symvers.sh);
#   - BUILD_DEPENDS names the OFED and NVIDIA DKMS modules that are
#     registered with dkms now (mlnx-ofed-kernel, nvidia*), so that after a
#     kernel update dkms builds them first;
#   - installs /etc/modprobe.d/peermem-softdep.conf (dkms/modprobe.conf.in):
#     softdeps on the NVIDIA driver and OFED's core; with --peermem also a
#     rule that makes `modprobe nvidia-peermem` fail with a message (two
#     clients named nv_mem would both register and the first would take
#     every range);
#   - makes modprobe take this module whatever else of its name is
#     installed: /etc/depmod.d/peermem.conf (`override MODULE *
#     updates/peermem`) and dkms's POST_INSTALL hook (scripts/dkms-hook.sh)
#     linking the module from /lib/modules/<rel>/updates/peermem/, so that
#     NVIDIA's DKMS nvidia-peermem.ko in the same updates/dkms never wins,
#     in either order of install;
#   - loads the module at boot after openibd and the GPU driver, and again
#     after an openibd or nvidia-persistenced restart: the systemd unit
#     /etc/systemd/system/peermem.service (dkms/peermem.service.in),
#     enabled (WantedBy multi-user.target, openibd.service and
#     nvidia-persistenced.service; PartOf the last two).
#     --no-boot-load leaves the unit out (load it yourself, e.g. from the
#     unit that starts your jobs);
#   - `dkms add`, then `dkms install` for each kernel (default: every
#     /lib/modules/<rel>/build with CONFIG_RUST=y; --kernel REL, repeatable,
#     limits it). DKMS installs to /lib/modules/<rel>/updates/dkms (what
#     Debian, Ubuntu and Arch's dkms force), which depmod searches before the
#     kernel/ directory where NVIDIA's precompiled packages and .run installer
#     put nvidia-peermem.ko.
# uninstall: `dkms remove --all` of every peermem version, and the files above
#   (the unit disabled first).
# stage: writes the tree of the .deb (scripts/deb.sh, make deb) under ROOT
#   and runs nothing: ROOT/usr/src/peermem-<version>/ with dkms.conf (its
#   BUILD_DEPENDS are written by the package's postinst, on the host), and
#   the files in ROOT/usr/lib/modprobe.d/, ROOT/usr/lib/depmod.d/ and
#   ROOT/usr/lib/systemd/system/: a package's own files, which `apt remove`
#   deletes (in /etc they would be conffiles, which dpkg keeps until a
#   purge, still acting). Needs neither root nor dkms.
#
# Environment: DKMS (the dkms command), PEERMEM_DKMS_SRC (default /usr/src),
# PEERMEM_MODPROBE_D (default /etc/modprobe.d), PEERMEM_DEPMOD_D (default
# /etc/depmod.d), PEERMEM_UNIT_D (default /etc/systemd/system),
# PEERMEM_DKMS_JOBS (make -j for the build, default the number of CPUs).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
dkms=${DKMS:-dkms}
src_root=${PEERMEM_DKMS_SRC:-/usr/src}
modprobe_d=${PEERMEM_MODPROBE_D:-/etc/modprobe.d}
depmod_d=${PEERMEM_DEPMOD_D:-/etc/depmod.d}
unit_d=${PEERMEM_UNIT_D:-/etc/systemd/system}
# Where versions before 0.3.1 loaded the module at boot (removed on install).
modules_load_d=${PEERMEM_MODULES_LOAD_D:-/etc/modules-load.d}
name=peermem
version=$(sed -n 's/^#define PEERMEM_VERSION "\(.*\)"/\1/p' "$top/include/peermem_ffi.h")

die() { echo "peermem: dkms: $*" >&2; exit 1; }
usage='scripts/dkms.sh install [--peermem|--dropin] [--no-boot-load] [--kernel REL]... | uninstall | stage ROOT [--peermem|--dropin] [--no-boot-load] | --help'
usage_die() { printf 'peermem: dkms: %s\nusage: %s\n' "$1" "$usage" >&2; exit 2; }

# Options first: --help and usage errors touch nothing.
cmd=${1:-}; shift || true
case $cmd in
-h|--help) { printf 'usage: scripts/dkms.sh install|uninstall|stage ROOT [OPTION...]\n\n'; sed -n '3,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }; exit 0 ;;
install|uninstall) ;;
stage) stage_root=${1:-}; [ -n "$stage_root" ] && [[ $stage_root != --* ]] || usage_die "stage needs a directory"; shift ;;
'') usage_die "no command" ;;
*) usage_die "unknown command '$cmd'" ;;
esac
dropin=1 bootload=1 kernels=() nameopt=0
while [ $# -gt 0 ]; do
	case $1 in
	--dropin) dropin=1; nameopt=1; shift ;;
	--peermem) dropin=0; nameopt=1; shift ;;
	--no-boot-load) bootload=0; nameopt=1; shift ;;
	--kernel) [ $# -ge 2 ] && [ -n "$2" ] && [[ $2 != --* ]] || usage_die "option --kernel needs a kernel release"
		kernels+=("$2"); shift 2 ;;
	-h|--help) { printf 'usage: scripts/dkms.sh install|uninstall|stage ROOT [OPTION...]\n\n'; sed -n '3,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }; exit 0 ;;
	*) usage_die "unknown argument '$1'" ;;
	esac
done
if [ "$cmd" = uninstall ] && { [ "$nameopt" = 1 ] || [ ${#kernels[@]} -gt 0 ]; }; then usage_die "uninstall takes no options"; fi
if [ "$cmd" = stage ] && [ ${#kernels[@]} -gt 0 ]; then usage_die "stage takes no --kernel"; fi
[ -n "$version" ] || die "cannot read PEERMEM_VERSION from include/peermem_ffi.h"

modname=peermem makeopt=""
if [ "$dropin" = 1 ]; then modname=nvidia_peermem makeopt="DROPIN=1"; fi

# stage_files SRC_ROOT MODPROBE_D DEPMOD_D UNIT_D ORIGIN UNDO BUILD_DEPENDS...:
# the sources with dkms.conf, the modprobe.d and depmod.d files and (with
# boot loading) the systemd unit; ORIGIN says in them who installed them,
# UNDO what removes them.
stage_files() {
	local dst=$1/$name-$version mpd=$2 dpd=$3 ud=$4 origin=$5 undo=$6 bdeps="" i=0 d; shift 6
	local mpfile=${mpd#"${stage_root:-}"}/peermem-softdep.conf
	mkdir -p "$dst/scripts"
	# The sources only (no build outputs of a checkout that was built).
	(cd "$top" && cp Kbuild Makefile "$dst"/ &&
		find rust include -type f \( -name '*.rs' -o -name '*.c' -o -name '*.h' \) ! -name ffi_generated.rs |
		while read -r f; do mkdir -p "$dst/$(dirname "$f")" && cp "$f" "$dst/$f" || exit 1; done)
	cp "$top/scripts/bindgen.sh" "$top/scripts/find-symvers.sh" "$top/scripts/ko-exports.py" "$dst/scripts/"
	install -m 0755 "$top/scripts/dkms-hook.sh" "$dst/scripts/dkms-hook.sh"
	# The build's identity for a tree without .git (Kbuild reads it).
	git -C "$top" describe --always --tags --dirty >"$dst/BUILD_ID" 2>/dev/null || echo "$version" >"$dst/BUILD_ID"
	for d in "$@"; do bdeps+="BUILD_DEPENDS[$i]=\"$d\""$'\n'; i=$((i + 1)); done
	sed -e "s|@VERSION@|$version|g" -e "s|@MODNAME@|$modname|g" -e "s|@MAKEOPT@|$makeopt|g" \
		-e "s|@JOBS@|${PEERMEM_DKMS_JOBS:-\$(nproc)}|g" "$top/dkms/dkms.conf.in" >"$dst/dkms.conf"
	printf '%s' "$bdeps" >>"$dst/dkms.conf"
	mkdir -p "$mpd"
	{
		sed -n '/^# BEGIN common/,/^# END common/{/^# BEGIN\|^# END/d;p}' "$top/dkms/modprobe.conf.in"
		if [ "$dropin" = 1 ]; then
			sed -n '/^# BEGIN dropin/,/^# END dropin/{/^# BEGIN\|^# END/d;p}' "$top/dkms/modprobe.conf.in"
		else
			sed -n '/^# BEGIN peermem/,/^# END peermem/{/^# BEGIN\|^# END/d;p}' "$top/dkms/modprobe.conf.in"
		fi
	} | sed -e "s|@MODNAME@|$modname|g" -e "s|@ORIGIN@|Installed by $origin; removed by $undo.|" \
		-e "s|@FILE@|$mpfile|g" -e "s|@UNDO@|$undo|g" >"$mpd/peermem-softdep.conf"
	mkdir -p "$dpd"
	printf '# Installed by %s; removed by %s.\n# modprobe loads peermem'"'"'s %s: the link dkms'"'"'s POST_INSTALL hook makes in\n# /lib/modules/<release>/updates/peermem/, whatever else of that name is\n# installed (NVIDIA'"'"'s DKMS nvidia-peermem.ko in updates/dkms). With no link\n# there (peermem removed), depmod takes the others as usual.\noverride %s * updates/peermem\n' \
		"$origin" "$undo" "$modname" "$modname" >"$dpd/peermem.conf"
	if [ "$bootload" = 1 ]; then
		mkdir -p "$ud"
		sed -e '/^# SPDX/d' -e "s|@MODNAME@|$modname|g" -e "s|@ORIGIN@|Installed by $origin; removed by $undo.|" \
			"$top/dkms/peermem.service.in" >"$ud/peermem.service"
	fi
}
if [ "$cmd" = stage ]; then
	stage_files "$stage_root/usr/src" "$stage_root/usr/lib/modprobe.d" "$stage_root/usr/lib/depmod.d" \
		"$stage_root/usr/lib/systemd/system" "the peermem-dkms package" "apt remove peermem-dkms"
	exit 0
fi
command -v "$dkms" >/dev/null || die "dkms not found: install it (Debian/Ubuntu: apt install dkms; RHEL: dnf install dkms from EPEL)"
[ "$(id -u)" = 0 ] || die "run as root (sudo make dkms-install)"

# The versions of peermem dkms knows.
registered() {
	if [ -d /var/lib/dkms/$name ]; then
		find /var/lib/dkms/$name -mindepth 1 -maxdepth 1 -type d ! -name original_module -printf '%f\n'
	fi
}

uninstall() {
	local v
	for v in $(registered); do
		"$dkms" remove "$name/$v" --all || true
		rm -rf "${src_root:?}/$name-$v"
	done
	rm -rf "${src_root:?}/$name-$version"
	if [ -f "$unit_d/peermem.service" ] && command -v systemctl >/dev/null; then
		systemctl --no-reload disable peermem.service >/dev/null 2>&1 || true
	fi
	rm -f "$modprobe_d/peermem-softdep.conf" "$modules_load_d/peermem.conf" "$depmod_d/peermem.conf" "$unit_d/peermem.service"
	# Versions before 0.3.0 wrote peermem.conf (the operator's if not ours).
	if grep -qs "^# Installed by peermem's make dkms-install" "$modprobe_d/peermem.conf"; then rm -f "$modprobe_d/peermem.conf"; fi
}

case $cmd in
uninstall) uninstall; echo "peermem: dkms: removed"; exit 0 ;;
install) ;;
*) usage_die "unknown command '$cmd'" ;;
esac

if [ ${#kernels[@]} = 0 ]; then
	for b in /lib/modules/*/build; do
		[ -f "$b/.config" ] || continue
		if grep -qx 'CONFIG_RUST=y' "$b/.config"; then
			kernels+=("$(basename "$(dirname "$b")")")
		else
			echo "peermem: dkms: skipping $(basename "$(dirname "$b")"): built without Rust (CONFIG_RUST is not y)"
		fi
	done
	[ ${#kernels[@]} -gt 0 ] || die "no installed kernel with CONFIG_RUST=y and its headers (/lib/modules/<release>/build): see docs/install.md"
fi

# A previous install of any version goes first (one peermem at a time).
uninstall >/dev/null 2>&1 || true

deps=()
for d in /var/lib/dkms/mlnx-ofed-kernel /var/lib/dkms/nvidia*; do
	[ -d "$d" ] && deps+=("$(basename "$d")")
done
stage_files "$src_root" "$modprobe_d" "$depmod_d" "$unit_d" "peermem's make dkms-install (scripts/dkms.sh)" "make dkms-uninstall" "${deps[@]}"
if [ "$bootload" = 1 ]; then
	if [ "$unit_d" != /etc/systemd/system ]; then
		echo "peermem: dkms: the unit is in $unit_d: not enabled (systemctl enables units of /etc/systemd/system)"
	elif ! command -v systemctl >/dev/null; then
		echo "peermem: dkms: no systemctl: nothing loads $modname at boot (load it from your own boot scripts after openibd)" >&2
	elif ! systemctl --no-reload enable peermem.service >/dev/null 2>&1; then
		echo "peermem: dkms: systemctl enable peermem.service failed: nothing loads $modname at boot" >&2
	elif [ -d /run/systemd/system ]; then
		systemctl daemon-reload || true
	fi
fi

"$dkms" add "$name/$version"
rc=0
for k in "${kernels[@]}"; do
	if "$dkms" install "$name/$version" -k "$k"; then
		echo "peermem: dkms: installed $modname for $k"
	else
		rc=1
		echo "peermem: dkms: the build for $k failed; its log: /var/lib/dkms/$name/$version/build/make.log (scripts/doctor.sh says what is missing)" >&2
	fi
done
exit $rc
