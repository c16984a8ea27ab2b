# shellcheck shell=bash
# SPDX-License-Identifier: GPL-2.0
# Debian's nvidia-open-kernel-dkms package, the source of NVIDIA's reference
# files (peer_mem.h, nv-p2p.h, nvidia-peermem.c): found in, or downloaded
# with apt-get into, $PEERMEM_CACHE/debs. Used by tests/host/abi (reference
# headers) and tests/nvpeermem (NVIDIA's own client, built unmodified).
# Source scripts/lib.sh first, then this file.
#
#   pm_nvidia_deb [UPSTREAM_VERSION]     default 550.163.01
#
# On success sets NV_DEB (the .deb's path) and NV_DEBVER (its Debian version,
# e.g. 550.163.01-4~bpo13+1) and returns 0. On failure sets NV_DEB_ERR (what
# went wrong) and NV_DEB_FIX (what to do about it) and returns 1; the caller
# reports them its own way. Progress goes to stderr. Nothing of NVIDIA's is
# ever put into the repository.

NV_DEB_PKG=nvidia-open-kernel-dkms
NV_DEB_DEFAULT_VERSION=550.163.01

pm_nvidia_deb() {
	local want=${1:-$NV_DEB_DEFAULT_VERSION} debs=$PEERMEM_CACHE/debs ver log
	NV_DEB= NV_DEBVER= NV_DEB_ERR= NV_DEB_FIX=
	_nv_deb_fail() { NV_DEB_ERR=$1 NV_DEB_FIX=$2; return 1; }
	_nv_deb_find() { ls "$debs/${NV_DEB_PKG}_${want}"-*_amd64.deb 2>/dev/null | sort -V | tail -n1; }
	mkdir -p "$debs" || { _nv_deb_fail "cannot create $debs" "check the permissions of $PEERMEM_CACHE"; return 1; }
	command -v dpkg-deb >/dev/null 2>&1 || { _nv_deb_fail "'dpkg-deb' not found" "run scripts/setup-host.sh"; return 1; }
	NV_DEB=$(_nv_deb_find)
	if [ -z "$NV_DEB" ]; then
		command -v apt-get >/dev/null 2>&1 ||
			{ _nv_deb_fail "apt-get not found and no $NV_DEB_PKG $want in $debs" \
				"put ${NV_DEB_PKG}_${want}-*_amd64.deb into $debs by hand"; return 1; }
		ver=$(apt-cache madison "$NV_DEB_PKG" 2>/dev/null | awk -v v="$want-" '{ if (index($3, v) == 1) { print $3; exit } }')
		[ -n "$ver" ] ||
			{ _nv_deb_fail "apt offers no $NV_DEB_PKG $want" \
				"enable Debian trixie (or trixie-backports) 'contrib' in the apt sources (scripts/setup-host.sh does) and run apt-get update"; return 1; }
		echo "# fetching $NV_DEB_PKG=$ver into $debs" >&2
		log=$debs/.${NV_DEB_PKG}-download.log
		(cd "$debs" && apt-get download -q "$NV_DEB_PKG=$ver") >"$log" 2>&1 ||
			{ _nv_deb_fail "apt-get download $NV_DEB_PKG=$ver failed ($(grep -m1 -E '^(E|Err):' "$log"))" \
				"check the network and the apt sources, then rerun (log: $log)"; return 1; }
		NV_DEB=$(_nv_deb_find)
		[ -n "$NV_DEB" ] ||
			{ _nv_deb_fail "apt-get download did not leave a $NV_DEB_PKG .deb in $debs" "download it by hand into $debs"; return 1; }
	fi
	NV_DEBVER=$(dpkg-deb -f "$NV_DEB" Version 2>/dev/null) && [ -n "$NV_DEBVER" ] ||
		{ _nv_deb_fail "$NV_DEB is not a readable .deb" "delete it and rerun"; NV_DEB=; return 1; }
	return 0
}
