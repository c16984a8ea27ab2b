#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# dkms's POST_INSTALL and POST_REMOVE hook of peermem (dkms/dkms.conf.in),
# run by dkms from /usr/src/peermem-<version>/ for each kernel:
#
#   scripts/dkms-hook.sh post-install|post-remove MODULE RELEASE
#
# Debian's and Ubuntu's dkms install every DKMS module into
# /lib/modules/RELEASE/updates/dkms/, NVIDIA's DKMS driver too, whose
# nvidia-peermem.ko is the same module name as the drop-in nvidia_peermem.ko:
# two candidates in one directory, of which depmod takes either. So after
# dkms installs MODULE, post-install links it from
# /lib/modules/RELEASE/updates/peermem/, the directory that peermem's
# depmod.d file (`override MODULE * updates/peermem`) makes depmod prefer
# whatever else is installed, in whichever order; dkms runs depmod next.
# post-remove deletes a link whose module dkms has removed (a link to a
# module still there, another version's, stays), and the directory once
# empty; depmod then falls back to the other candidates. Always exits 0
# (dkms ignores a hook's status); says on stderr what went wrong.
# PEERMEM_MODULES_DIR (default /lib/modules) is for tests.
set -u
usage='usage: scripts/dkms-hook.sh post-install|post-remove MODULE RELEASE'
case ${1:-} in -h|--help) printf '%s\n\n' "$usage"; sed -n '3,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
[ $# = 3 ] && [ -n "$2" ] && [ -n "$3" ] || { printf 'peermem: dkms hook: wrong arguments\n%s\n' "$usage" >&2; exit 2; }
case $2$3 in */*|.*) printf 'peermem: dkms hook: bad module or release name\n' >&2; exit 2 ;; esac
mods=${PEERMEM_MODULES_DIR:-/lib/modules}/$3
pin=$mods/updates/peermem
case $1 in
post-install)
	f=
	for c in "$mods/updates/dkms/$2.ko" "$mods/updates/dkms/$2.ko".*; do
		[ -f "$c" ] && { f=$c; break; }
	done
	if [ -z "$f" ]; then
		printf 'peermem: dkms hook: no %s.ko in %s/updates/dkms: modprobe may load another %s\n' "$2" "$mods" "$2" >&2
		exit 0
	fi
	mkdir -p "$pin" && rm -f "$pin/$2.ko" "$pin/$2.ko".* && ln -s "../dkms/${f##*/}" "$pin/${f##*/}" ||
		printf 'peermem: dkms hook: cannot link %s from %s: modprobe may load another %s\n' "$f" "$pin" "$2" >&2
	;;
post-remove)
	for l in "$pin/$2.ko" "$pin/$2.ko".*; do
		if [ -L "$l" ] && [ ! -e "$l" ]; then rm -f "$l"; fi
	done
	rmdir "$pin" 2>/dev/null
	;;
*) printf 'peermem: dkms hook: unknown step %s\n%s\n' "$1" "$usage" >&2; exit 2 ;;
esac
exit 0
