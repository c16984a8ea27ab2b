#!/usr/bin/env bash
# Install everything peermem's build, rig and tests need on a Debian 12 host.
# Idempotent: every step checks first and skips what is already there.
#
#   scripts/setup-host.sh [--any-os] [--help]
#
# What it changes on the host: adds /etc/apt/sources.list.d/peermem.sources
# (bookworm-backports, trixie-backports, trixie contrib) and
# /etc/apt/preferences.d/peermem (pinning trixie down so that it replaces
# nothing else), runs apt-get update and installs about 25 packages (build
# tools, clang/lld/llvm 19, rdma-core, perftest, QEMU, dkms), the rustup
# components rust-src, rustfmt and clippy, and bindgen-cli with cargo.
# This is for a Debian 12 machine that runs the rig (a CI runner, a
# developer's box), never for a GPU server: the module itself needs none
# of it (docs/install.md). On anything that is not Debian 12 it refuses,
# unless --any-os (or PEERMEM_SETUP_ANY_OS=1) says you mean it.
set -euo pipefail
# Read whole before running (the braces below): a script edited while it
# runs, or waits for a lock, must not change under the running shell.
{
. "$(dirname "$0")/lib.sh"

APT_PKGS=(
	# kernel and module build
	build-essential flex bison bc cpio kmod xz-utils binutils rsync
	libelf-dev libssl-dev python3 libclang-19-dev clang-19 lld-19 llvm-19
	# gendwarfksyms (the ubuntu kernel variant's MODVERSIONS with Rust)
	libdw-dev
	# guest userspace (seen by the guest through the 9p root)
	rdma-core ibverbs-utils ibverbs-providers libibverbs-dev librdmacm-dev
	iproute2 perftest
	# scripts/bench.sh's plot
	python3-matplotlib
	# make dkms-install and its test (tests/host/install); zstd for the
	# compressed modules that test fakes
	dkms zstd
)
BINDGEN_VERSION=${BINDGEN_VERSION:-0.73.2}

usage='scripts/setup-host.sh [--any-os] [--help]'
any_os=${PEERMEM_SETUP_ANY_OS:-0}
while [ $# -gt 0 ]; do
	case $1 in
	--any-os) any_os=1; shift ;;
	-h|--help) pm_help "$0" '^set -euo'; exit 0 ;;
	*) pm_usage_die "unknown argument '$1'" "$usage" ;;
	esac
done
os_id= os_ver=
if [ -r "${PEERMEM_OS_RELEASE:-/etc/os-release}" ]; then
	os_id=$(. "${PEERMEM_OS_RELEASE:-/etc/os-release}" && echo "${ID:-}")
	os_ver=$(. "${PEERMEM_OS_RELEASE:-/etc/os-release}" && echo "${VERSION_ID:-}")
fi
if [ "$os_id $os_ver" != "debian 12" ] && [ "$any_os" != 1 ]; then
	pm_die "this host is ${os_id:-unknown} ${os_ver:-?}, not Debian 12: scripts/setup-host.sh would add Debian's apt sources and install the rig's packages here. On a GPU server you need none of it (docs/install.md). To set up the rig on this host anyway: scripts/setup-host.sh --any-os (tests/run-all.sh and scripts/demo.sh run it: pass --skip-setup after setting up by hand, or PEERMEM_SETUP_ANY_OS=1)"
fi

pm_stage "host: apt sources"
src=/etc/apt/sources.list.d/peermem.sources
want=$(cat <<'S'
# Added by peermem scripts/setup-host.sh: linux-source-7.3 (trixie-backports),
# the reference headers of nvidia-open-kernel-dkms (trixie contrib), and
# qemu-system-x86 matching the image's qemu-utils (bookworm-backports).
# /etc/apt/preferences.d/peermem keeps trixie from replacing anything else.
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian
Suites: trixie-backports
Components: main contrib
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian
Suites: trixie
Components: contrib
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
S
)
stamp=$PEERMEM_CACHE/apt-updated
mkdir -p "$PEERMEM_CACHE"
pref=/etc/apt/preferences.d/peermem
want_pref=$(cat <<'S'
Package: *
Pin: release n=trixie-backports
Pin-Priority: 1

Package: *
Pin: release n=trixie
Pin-Priority: 1

Package: linux-source-7.3 nvidia-open-kernel-dkms
Pin: release n=trixie-backports
Pin-Priority: 500
S
)
if [ ! -f "$pref" ] || [ "$(cat "$pref")" != "$want_pref" ]; then
	printf '%s\n' "$want_pref" | pm_sudo tee "$pref" >/dev/null
fi
if [ ! -f "$src" ] || [ "$(cat "$src")" != "$want" ]; then
	[ -f /usr/share/keyrings/debian-archive-keyring.gpg ] ||
		pm_die "/usr/share/keyrings/debian-archive-keyring.gpg missing; install debian-archive-keyring"
	printf '%s\n' "$want" | pm_sudo tee "$src" >/dev/null
	rm -f "$stamp"
fi
# Refresh the package lists once a day at most.
if [ -z "$(find "$stamp" -mmin -1440 2>/dev/null)" ]; then
	pm_sudo apt-get update -q >/dev/null || pm_die "apt-get update failed; check the network and $src"
	touch "$stamp"
fi

pm_stage "host: apt packages"
missing=()
for p in "${APT_PKGS[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	pm_log "installing: ${missing[*]}"
	DEBIAN_FRONTEND=noninteractive pm_sudo apt-get install -y -q --no-install-recommends \
		"${missing[@]}" >/dev/null ||
		pm_die "apt-get install ${missing[*]} failed; run it by hand to see why"
fi
# QEMU comes from bookworm-backports, to match the qemu-utils the Debian 12
# images ship (bookworm's 7.2 qemu-system-common conflicts with it).
if ! dpkg-query -W -f='${Status}' qemu-system-x86 2>/dev/null | grep -q 'install ok installed'; then
	pm_log "installing: qemu-system-x86 (bookworm-backports)"
	DEBIAN_FRONTEND=noninteractive pm_sudo apt-get install -y -q --no-install-recommends \
		-t bookworm-backports qemu-system-x86 >/dev/null ||
		pm_die "apt-get install -t bookworm-backports qemu-system-x86 failed; run it by hand to see why"
fi

pm_stage "host: rust toolchain"
pm_need_cmd rustup "install Rust with rustup (https://rustup.rs), then re-run"
# rust-src for the kernel's Rust; rustfmt and clippy for tests/host/style.
for c in rust-src rustfmt clippy; do
	rustup component list --installed 2>/dev/null | grep -q "^$c" ||
		rustup component add "$c" >/dev/null || pm_die "rustup component add $c failed"
done
if ! bindgen --version 2>/dev/null | grep -q "bindgen $BINDGEN_VERSION"; then
	pm_log "cargo install bindgen-cli $BINDGEN_VERSION"
	cargo install --locked --quiet bindgen-cli --version "$BINDGEN_VERSION" ||
		pm_die "cargo install bindgen-cli failed; check crates.io access"
fi
pm_log "host ready: $(rustc --version), $(bindgen --version), libclang-19"
exit
}
