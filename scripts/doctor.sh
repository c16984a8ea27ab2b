#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# peermem doctor: read-only checks of this machine, one line per check:
#   PASS|WARN|FAIL|INFO  <check>: <what was found; for WARN/FAIL what to do>
# then a summary line. Exit status 1 when any check FAILs, else 0.
# docs/troubleshooting.md explains each line. It changes nothing (reads
# /proc, /sys, /lib/modules, /boot and runs --version / modinfo / ofed_info /
# mokutil --sb-state where present); as non-root some facts are unreadable
# and said so.
#
#   scripts/doctor.sh [--root DIR] [--release REL]     (make doctor)
#   scripts/doctor.sh --bundle FILE                    (a bug report's facts)
#
# The package installs it as /usr/sbin/peermem-doctor. Run it as root: as
# another user the counters, the kernel log and some module facts are
# unreadable (it says which).
#
#   --bundle FILE  write FILE (a .tar.gz) with what a bug report needs: this
#                  doctor's output, uname, the kernel command line, modinfo
#                  of the module `modprobe nvidia_peermem` / `peermem` would
#                  load, dkms status and the last DKMS build logs, the kernel
#                  log lines of peermem, the NVIDIA driver, mlx5 and the
#                  peer-memory core, peermem's debugfs counters, the OFED and
#                  NVIDIA driver versions (docs/troubleshooting.md,
#                  "Reporting a problem"). Reads only; writes only FILE.
#
#   --root DIR     read DIR/proc, DIR/sys, DIR/lib/modules, DIR/boot instead
#                  of the real ones (the tests feed fake set-ups); env
#                  PEERMEM_DOCTOR_ROOT
#   --release REL  the kernel to check (default: the running one)
#
# Checks: kernel has Rust; its headers have the Rust metadata; the kernel's
# rustc and bindgen are installed; OFED's peer-memory core is loaded, and
# which OFED version; the NVIDIA driver is loaded and exports
# nvidia_p2p_get_pages; its branch and page-table layout (v1.2 or v2.0), and
# whether this peermem reads it; no nvidia-peermem / nv_peer_mem (conflict); peermem
# loaded and registered; which file `modprobe` would load (module-file); what NCCL, UCX and NVSHMEM will detect; DMA-BUF as
# the alternative; Secure Boot and whether the module is signed.
set -uo pipefail

root=${PEERMEM_DOCTOR_ROOT:-}
rel='' bundle=''
while [ $# -gt 0 ]; do
	case $1 in
	--bundle) [ $# -ge 2 ] && [ -n "$2" ] && [[ $2 != --* ]] ||
		{ printf 'doctor: option --bundle needs a file name\nusage: scripts/doctor.sh --bundle FILE\n' >&2; exit 2; }
		bundle=$2; shift 2 ;;
	--root|--release) [ $# -ge 2 ] && [ -n "$2" ] && [[ $2 != --* ]] ||
		{ printf 'doctor: option %s needs a value\nusage: scripts/doctor.sh [--root DIR] [--release RELEASE] [--bundle FILE] [--help]\n' "$1" >&2; exit 2; }
		if [ "$1" = --root ]; then root=$2; else rel=$2; fi; shift 2 ;;
	-h|--help) printf 'usage: scripts/doctor.sh [--root DIR] [--release REL] | --bundle FILE   (installed: peermem-doctor)\n\n'
		sed -n '3,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//p}' "$0"; exit 0 ;;
	*) printf "doctor: unknown argument '%s'\nusage: scripts/doctor.sh [--root DIR] [--release RELEASE] [--bundle FILE] [--help]\n" "$1" >&2; exit 2 ;;
	esac
done
root=${root%/}

# ---- --bundle: this doctor's output and the facts around it, in one file
if [ -n "$bundle" ]; then
	case $bundle in *.tar.gz|*.tgz) ;; *) bundle=$bundle.tar.gz ;; esac
	d=$(mktemp -d "${TMPDIR:-/tmp}/peermem-bundle.XXXXXX") || { echo "doctor: cannot make a temporary directory" >&2; exit 1; }
	b=$d/peermem-report
	mkdir -p "$b"
	"$0" ${root:+--root "$root"} ${rel:+--release "$rel"} >"$b/doctor.txt" 2>&1
	{ uname -a; echo; cat /proc/cmdline; echo; id; } >"$b/system.txt" 2>&1
	for m in nvidia_peermem peermem nvidia ib_core ib_uverbs mlx5_ib; do
		echo "== $m: modprobe would load $(modinfo -n "$m" 2>/dev/null || echo '(none)')"
		modinfo "$m" 2>/dev/null
		[ -r "/sys/module/$m/version" ] && echo "loaded, version $(cat "/sys/module/$m/version")"
		[ -d "/sys/module/$m" ] && [ ! -r "/sys/module/$m/version" ] && echo "loaded"
		echo
	done >"$b/modules.txt" 2>&1
	{ command -v dkms >/dev/null && dkms status; ls -l /var/lib/dkms/peermem 2>/dev/null; } >"$b/dkms-status.txt" 2>&1
	for l in /var/lib/dkms/peermem/*/build/make.log /var/lib/dkms/peermem/*/*/*/log/make.log; do
		[ -r "$l" ] && { echo "== $l"; tail -n 200 "$l"; }
	done >"$b/dkms-make.log" 2>&1
	{ dmesg 2>&1 || journalctl -k -b --no-pager 2>&1; } |
		grep -E 'peermem|nvidia|NVRM|mlx5|ib_core|peer_mem|ib_uverbs|Oops|BUG|WARNING' | tail -n 2000 >"$b/kernel-log.txt"
	for dir in /sys/kernel/debug/peermem /sys/kernel/debug/nvidia_peermem; do
		[ -d "$dir" ] || continue
		find "$dir" -maxdepth 2 -type f ! -name 'watch_cache_flush' 2>/dev/null | sort | while read -r f; do
			printf '%s %s\n' "${f#/sys/kernel/debug/}" "$(head -c 100 "$f" 2>/dev/null | head -n 1)"
		done
	done >"$b/counters.txt" 2>&1
	# Without root (no debugfs): the counters anyone may read.
	[ -r /proc/driver/peermem ] && sed 's|^|proc/driver/peermem: |' /proc/driver/peermem >>"$b/counters.txt" 2>&1
	{ command -v ofed_info >/dev/null && ofed_info -s; cat /proc/driver/nvidia/version 2>/dev/null;
	  command -v nvidia-smi >/dev/null && nvidia-smi -q 2>/dev/null | grep -iE 'driver version|product name|bar1|total|used' | head -n 40; } >"$b/versions.txt" 2>&1
	tar -C "$d" -czf "$bundle" peermem-report || { rm -rf "$d"; echo "doctor: cannot write $bundle" >&2; exit 1; }
	rm -rf "$d"
	echo "doctor: wrote $bundle (doctor.txt, system.txt, modules.txt, dkms-status.txt, dkms-make.log, kernel-log.txt, counters.txt, versions.txt); attach it to the report"
	[ "$(id -u)" = 0 ] || echo "doctor: not run as root: the kernel log and the debugfs files may be missing from it (sudo peermem-doctor --bundle FILE)"
	exit 0
fi

if [ -z "$rel" ]; then
	if [ -n "$root" ]; then read -r rel <"$root/proc/sys/kernel/osrelease" 2>/dev/null; fi
	[ -n "$rel" ] || rel=$(uname -r)
fi
P=$root/proc S=$root/sys M=$root/lib/modules/$rel

npass=0 nwarn=0 nfail=0
say() {
	printf '%-5s %s: %s\n' "$1" "$2" "$3"
	case $1 in PASS) npass=$((npass + 1)) ;; WARN) nwarn=$((nwarn + 1)) ;; FAIL) nfail=$((nfail + 1)) ;; esac
}
rd() { local v=''; { read -r v <"$1"; } 2>/dev/null; printf '%s' "$v"; }
# rdv VAR FILE: VAR is FILE's first line ('' if unreadable), without the
# fork of $(rd FILE) (a program start is slow on a debug kernel).
rdv() { local rdv_line=''; { read -r rdv_line <"$2"; } 2>/dev/null; printf -v "$1" '%s' "$rdv_line"; }

# ---- kernel config: /proc/config.gz, /boot/config-REL, the headers' .config
cfg=''
# /proc/config.gz only describes the running kernel.
if [ -r "$P/config.gz" ] && [ "$rel" = "$(rd "$P/sys/kernel/osrelease")" ]; then
	cfg=$(zcat "$P/config.gz" 2>/dev/null)
	cfgfrom=/proc/config.gz
fi
if [ -z "$cfg" ] && [ -r "$root/boot/config-$rel" ]; then cfg=$(cat "$root/boot/config-$rel"); cfgfrom=/boot/config-$rel; fi
if [ -z "$cfg" ] && [ -r "$M/build/.config" ]; then cfg=$(cat "$M/build/.config"); cfgfrom=/lib/modules/$rel/build/.config; fi
kconf() { sed -n "s/^$1=//p" <<<"$cfg" | tr -d '"'; }

# 1. Rust in the kernel
if [ -z "$cfg" ]; then
	say FAIL kernel-rust "no configuration found for kernel $rel (/proc/config.gz, /boot/config-$rel, /lib/modules/$rel/build/.config): install its headers (Ubuntu: apt install linux-headers-$rel)"
elif [ "$(kconf CONFIG_RUST)" = y ]; then
	say PASS kernel-rust "kernel $rel has CONFIG_RUST=y ($cfgfrom)"
else
	say FAIL kernel-rust "kernel $rel is built without Rust (CONFIG_RUST is not y in $cfgfrom); peermem is a Rust module: boot a Rust-enabled kernel (Ubuntu 26.04's generic kernel, or build one: docs/install.md)"
fi

# 2. headers with the Rust metadata
if [ ! -d "$M/build" ]; then
	say FAIL kernel-headers "no /lib/modules/$rel/build: install the kernel's headers (Ubuntu: apt install linux-headers-$rel linux-lib-rust-$rel)"
elif [ ! -f "$M/build/rust/libkernel.rmeta" ]; then
	say FAIL kernel-headers "/lib/modules/$rel/build has no Rust metadata (rust/libkernel.rmeta): Ubuntu: apt install linux-lib-rust-$rel; a self-built kernel: install its build tree with rust/"
else
	say PASS kernel-headers "/lib/modules/$rel/build with the Rust metadata"
fi

# 3./4. the kernel's own rustc and bindgen (plain or Ubuntu's versioned name)
# tool NAME WANT-TEXT: the first of NAME, NAME-<major.minor> whose
# --version prints WANT (rustc: exactly, as the Makefile demands; bindgen:
# the same version number); prints it.
tool() {
	local name=$1 want=$2 v mm c out
	v=$(awk '{ print $2 }' <<<"$want"); mm=$(cut -d. -f1-2 <<<"$v")
	for c in "$name" "$name-$mm"; do
		command -v "$c" >/dev/null 2>&1 || continue
		out=$("$c" --version 2>/dev/null | head -n 1)
		if [ "$out" = "$want" ]; then echo "$c"; return 0; fi
		if [ "$name" != rustc ] && [ "$(awk '{ print $2 }' <<<"$out")" = "$v" ]; then echo "$c"; return 0; fi
	done
	return 1
}
hcfg=$cfg
[ -r "$M/build/.config" ] && hcfg=$(cat "$M/build/.config")
for t in rustc bindgen; do
	key=CONFIG_${t^^}_VERSION_TEXT
	want=''; [ -z "$hcfg" ] || want=$(sed -n "s/^$key=//p" <<<"$hcfg" | tr -d '"')
	if [ -z "$want" ]; then
		if command -v "$t" >/dev/null 2>&1; then say WARN "$t" "the kernel's configuration names no $t version; found $($t --version 2>/dev/null | head -n 1)"
		else say FAIL "$t" "the kernel names no $t version and none is installed"; fi
		continue
	fi
	mm=$(awk '{ print $2 }' <<<"$want" | cut -d. -f1-2)
	if c=$(tool "$t" "$want"); then
		say PASS "$t" "$c is the kernel's $want"
	else
		have=$(command -v "$t" >/dev/null 2>&1 && "$t" --version 2>/dev/null | head -n 1)
		say FAIL "$t" "the kernel was built with $want, ${have:+this machine has $have, }no $t or $t-$mm of that version: Ubuntu: apt install $t-$mm; elsewhere $([ "$t" = rustc ] && echo "rustup toolchain install $(awk '{ print $2 }' <<<"$want")" || echo "cargo install --locked --version $(awk '{ print $2 }' <<<"$want") bindgen-cli")"
	fi
done

# ---- symbols: /proc/kallsyms (names are readable without root)
ksyms=''
[ -r "$P/kallsyms" ] && ksyms=$(grep -E ' (ib_register_peer_memory_client|nvidia_p2p_get_pages)(\s|$)' "$P/kallsyms")
owner() { # SYM: OWNER is the module that has it, or "the kernel"; fails if none
	local l x=''
	while IFS= read -r l; do [[ $l =~ \ $1([[:space:]]|$) ]] && { x=$l; break; }; done <<<"$ksyms"
	[ -n "$x" ] || return 1
	if [[ $x == *"["*"]"* ]]; then x=${x##*[}; OWNER=${x%]*}; else OWNER="the kernel (built in)"; fi
}

# 5. OFED's peer-memory core, and its version
if owner ib_register_peer_memory_client; then o=$OWNER
	say PASS peer-memory-core "ib_register_peer_memory_client is exported by $o"
else
	say FAIL peer-memory-core "no ib_register_peer_memory_client in /proc/kallsyms: MLNX_OFED/DOCA-OFED's ib_core/ib_uverbs are not loaded (the distribution's have no peer-memory core): install DOCA-OFED for kernel $rel and load it (/etc/init.d/openibd restart, or modprobe ib_uverbs)"
fi
ofed=''
if [ -z "$root" ] && command -v ofed_info >/dev/null 2>&1; then ofed=$(ofed_info -s 2>/dev/null | tr -d ':'); fi
if [ -z "$ofed" ]; then
	for m in mlx_compat ib_uverbs ib_core; do
		rdv v "$S/module/$m/version"; [ -n "$v" ] && { ofed="$v ($m)"; break; }
	done
fi
case $ofed in
'') say INFO ofed-version "no OFED version found (ofed_info, /sys/module/mlx_compat/version)" ;;
*24.10*|*25.01*) say WARN ofed-version "OFED $ofed: its peer-memory invalidation error path can hang (24.10 and 25.01); use 25.04 or later, or load peermem with enable_invalidate=0 (docs/troubleshooting.md)" ;;
*) say PASS ofed-version "OFED $ofed" ;;
esac

# 6. the GPU driver
if owner nvidia_p2p_get_pages; then o=$OWNER
	if [ "$o" = gpusim ]; then say PASS gpu-driver "nvidia_p2p_get_pages from gpusim (the rig's emulated GPU)"
	else say PASS gpu-driver "nvidia_p2p_get_pages from $o$([ -r "$S/module/nvidia/version" ] && echo " $(rd "$S/module/nvidia/version")")"; fi
elif [ -d "$S/module/nvidia" ]; then
	say FAIL gpu-driver "nvidia is loaded but /proc/kallsyms has no nvidia_p2p_get_pages: a driver without GPUDirect RDMA (GeForce/consumer builds?); use a data-center driver"
else
	say FAIL gpu-driver "the NVIDIA driver is not loaded: modprobe nvidia (install the driver's kernel modules for $rel first)"
fi

# 6b. the page-table layout of the GPU driver's branch (issue 28): 550-575
# hand out v1.2 tables (0x00010002), 580 and later v2.0 (0x00020000, with
# flags). This peermem reads both; a loaded peermem without the debugfs
# file last_pin_version is an older build that refuses v2.0 tables.
rdv nvver "$S/module/nvidia/version"; nvfrom=nvidia
if [ -z "$nvver" ] && [ -z "$root" ] && [ -d "$S/module/nvidia" ]; then
	nvver=$(modinfo -F version nvidia 2>/dev/null | head -n1)
fi
if [ -z "$nvver" ] && [ -d "$S/module/gpusim" ]; then
	rdv nvver "$S/module/gpusim/parameters/branch"; nvfrom="gpusim emulating"
fi
branch=${nvver%%.*}
oldpm=''
for m in peermem nvidia_peermem; do
	# ours: it has the parameter enable_nc (see 7./8.).
	if [ -e "$S/module/$m/parameters/enable_nc" ] && [ -d "$S/kernel/debug/$m" ] &&
		[ ! -e "$S/kernel/debug/$m/last_pin_version" ]; then oldpm=$m; fi
done
if [[ ! $branch =~ ^[0-9]+$ ]]; then
	if [ -d "$S/module/gpusim" ]; then
		say INFO page-tables "gpusim does not say which driver branch it emulates (no /sys/module/gpusim/parameters/branch); peermem reads v1.2 (550-575) and v2.0 (580+) page tables"
	else
		say INFO page-tables "no NVIDIA driver version readable (/sys/module/nvidia/version, modinfo nvidia); peermem reads v1.2 (550-575) and v2.0 (580+) page tables"
	fi
elif [ "$branch" -ge 580 ]; then
	if [ -n "$oldpm" ]; then
		say FAIL page-tables "$nvfrom $nvver (branch $branch) hands out v2.0 page tables (0x00020000); the loaded $oldpm is an older peermem that refuses them: install this peermem (make dkms-install)"
	else
		say PASS page-tables "$nvfrom $nvver (branch $branch) hands out v2.0 page tables (0x00020000, with flags); this peermem reads them"
	fi
elif [ "$branch" -ge 550 ]; then
	say PASS page-tables "$nvfrom $nvver (branch $branch) hands out v1.2 page tables (0x00010002); this peermem reads them"
else
	say WARN page-tables "$nvfrom $nvver (branch $branch) is older than 550, which peermem is not tested with; use a 550 or later data-center driver"
fi

# 7./8. who holds the peer-memory client name: nv_peer_mem, NVIDIA's
# nvidia_peermem, peermem (ours has the parameter enable_nc)
ours() { [ -e "$S/module/$1/parameters/enable_nc" ]; }
conf=''
[ -d "$S/module/nv_peer_mem" ] && conf="nv_peer_mem (Mellanox's nv_peer_memory)"
if [ -d "$S/module/nvidia_peermem" ] && ! ours nvidia_peermem; then conf+="${conf:+ and }nvidia_peermem (NVIDIA's nvidia-peermem $(rd "$S/module/nvidia_peermem/version"))"; fi
if [ -n "$conf" ]; then
	say FAIL conflict "$conf is loaded: it registers as the same peer-memory client; unload it (modprobe -r nvidia_peermem nv_peer_mem) and load peermem; 'sudo make dkms-install' installs peermem as nvidia_peermem, which modprobe then loads instead of NVIDIA's"
else
	say PASS conflict "neither nvidia-peermem nor nv_peer_mem is loaded"
fi
pm=''
for m in peermem nvidia_peermem; do ours "$m" && pm+="${pm:+ }$m"; done
if [ -z "$pm" ]; then
	say FAIL peermem "peermem is not loaded: modprobe peermem (or nvidia_peermem, the drop-in); dmesg | grep peermem says why a load failed"
else
	for m in $pm; do
		d=$S/kernel/debug/$m
		rdv v "$S/module/$m/version"
		# The counters: debugfs (root), else the file anyone may read
		# (docs/module.md, "Counters").
		from=''
		if [ -r "$d/registrations_acquired" ]; then
			rdv acq "$d/registrations_acquired"; rdv relz "$d/registrations_released"; rdv err "$d/errors"
		elif [ -r "$P/driver/peermem" ]; then
			pc() { awk -v n="$1" '$1 == "client" && $2 == n { print $3 }' "$P/driver/peermem"; }
			acq=$(pc registrations_acquired); relz=$(pc registrations_released); err=$(pc errors)
			from=' (from /proc/driver/peermem)'
		else
			acq=''
		fi
		if [ -n "$acq" ]; then
			rdv pname "$S/module/$m/parameters/peer_name"; rdv nc "$S/module/$m/parameters/enable_nc"
			ncname=''; [ "$nc" != Y ] || ncname=", ${pname}_nc"
			say PASS peermem "$m $v loaded and registered ($pname$ncname); live registrations $((acq - ${relz:-0})), errors ${err:-0}$from"
		elif [ -d "$S/kernel/debug" ] && [ -z "$(ls -A "$S/kernel/debug" 2>/dev/null)" ]; then
			say WARN peermem "$m $v loaded (it registers at load or fails to load); debugfs is not mounted or not readable, so no counters: mount -t debugfs none /sys/kernel/debug (as root)"
		else
			say WARN peermem "$m $v loaded, but /sys/kernel/debug/$m is missing (no CONFIG_DEBUG_FS, or not root): counters unavailable"
		fi
	done
fi

# 8b. which file modprobe would load (modules.dep as depmod wrote it: a
# later install of NVIDIA's DKMS nvidia-peermem.ko must not win, see
# docs/install.md, "Which file modprobe loads")
# modfile NAME: the file modules.dep lists for module NAME (- and _ alike).
modfile() {
	[ -r "$M/modules.dep" ] || return 1
	awk -F: -v want="$1" '{ n = $1; sub(/.*\//, "", n); sub(/\.ko(\..*)?$/, "", n); gsub(/-/, "_", n)
		if (n == want) { print $1; exit } }' "$M/modules.dep" | grep .
}
# ourfile FILE: whether FILE is peermem's (it has peermem's parameter enable_nc).
ourfile() { modinfo -F parm "$1" 2>/dev/null | grep -q '^enable_nc:'; }
installed=''
compgen -G "$root/usr/src/peermem-*" >/dev/null && installed=1
[ -d "$root/var/lib/dkms/peermem" ] && installed=1
if [ ! -r "$M/modules.dep" ]; then
	say WARN module-file "no $M/modules.dep: modprobe cannot load any module for $rel until depmod runs: sudo depmod $rel"
else
	mf=''
	for m in nvidia_peermem peermem; do
		f=$(modfile "$m") || continue
		case $f in /*) ;; *) f=$M/$f ;; esac
		if ourfile "$f"; then
			mf+="${mf:+; }modprobe $m loads ${f#"$root"} (peermem $(modinfo -F version "$f" 2>/dev/null))"
		elif [ "$m" = nvidia_peermem ] && [ -n "$installed" ] && [ ! -e "$M/updates/dkms/peermem.ko" ] && ! compgen -G "$M/updates/dkms/peermem.ko.*" >/dev/null; then
			say FAIL module-file "modprobe nvidia_peermem loads ${f#"$root"}, which is not peermem (NVIDIA's nvidia-peermem), although peermem is installed: sudo dkms install peermem/<version> -k $rel puts peermem's back in front (its depmod.d override), then sudo depmod $rel"
			mf=fail
			break
		fi
	done
	if [ "$mf" = fail ]; then :
	elif [ -n "$mf" ]; then say PASS module-file "$mf"
	elif [ -n "$installed" ]; then say FAIL module-file "peermem is installed but modules.dep of $rel lists no peermem module: its build for $rel failed or was skipped (dkms status peermem; the build log: /var/lib/dkms/peermem/<version>/build/make.log)"
	else say WARN module-file "no peermem module installed for $rel (modules.dep): sudo apt install ./peermem-dkms_<version>_all.deb or sudo make dkms-install"; fi
fi

# 9. what the stacks probe (docs/module.md, "Module name")
probe() { # PATH...: the first that exists
	local p
	for p; do [ -e "$root$p" ] && { echo "$p"; return 0; }; done
	return 1
}
for s in "NCCL:/sys/kernel/mm/memory_peers/nv_mem/version /sys/kernel/mm/memory_peers/nv_mem_nc/version /sys/module/nvidia_peermem/version" \
	"UCX:/sys/kernel/mm/memory_peers/nv_mem/version /sys/module/nvidia_peermem/version /sys/module/nv_peer_mem/version" \
	"NVSHMEM:/sys/kernel/mm/memory_peers/nv_mem/version /sys/kernel/mm/memory_peers/nvidia-peermem/version /sys/module/nvidia_peermem/version"; do
	name=${s%%:*}
	# shellcheck disable=SC2086  # a list of paths
	if f=$(probe ${s#*:}); then
		say PASS "stack-$name" "will use GPUDirect RDMA (finds $f)"
	else
		say WARN "stack-$name" "finds none of ${s#*:}: it will report GPUDirect RDMA disabled (NCCL: 'GPU Direct RDMA Disabled'); load the drop-in (sudo make dkms-install, the default; module nvidia_peermem) — plain ibv_reg_mr on GPU memory works without it"
	fi
done

# 10. DMA-BUF, the alternative
rdv nvv "$P/driver/nvidia/version"
if [ -z "$cfg" ]; then
	say INFO dma-buf "unknown: no kernel configuration to read CONFIG_DMA_SHARED_BUFFER from"
elif [ "$(kconf CONFIG_DMA_SHARED_BUFFER)" != y ]; then
	say INFO dma-buf "the kernel has no CONFIG_DMA_SHARED_BUFFER: no DMA-BUF MRs; peer memory is the only way"
elif [[ $nvv == *"Open Kernel Module"* ]]; then
	say INFO dma-buf "NVIDIA open kernel modules: DMA-BUF MRs (ibv_reg_dmabuf_mr; NCCL_DMABUF_ENABLE=1) work too; NVIDIA recommends them with the open driver"
elif [ -n "$nvv" ]; then
	say INFO dma-buf "NVIDIA's proprietary kernel modules: no DMA-BUF export of GPU memory; peer memory (peermem) is the way"
else
	say INFO dma-buf "kernel has DMA-BUF; no NVIDIA driver version readable (/proc/driver/nvidia/version)"
fi

# 11. Secure Boot and signatures
sb=''
f=$S/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c
if [ -r "$f" ]; then
	b=$(od -An -tu1 -j4 -N1 "$f" 2>/dev/null | tr -d ' ')
	case $b in 1) sb=on ;; 0) sb=off ;; esac
elif [ -z "$root" ] && command -v mokutil >/dev/null 2>&1; then
	case $(mokutil --sb-state 2>/dev/null) in *enabled*) sb=on ;; *disabled*) sb=off ;; esac
fi
rdv enforce "$S/module/module/parameters/sig_enforce"
kos=''; [ ! -d "$M" ] || kos=$(find "$M" ! -type l \( -name 'peermem.ko*' -o -name 'nvidia_peermem.ko*' \) 2>/dev/null)
signed='' unsigned=''
for k in $kos; do
	if [ -n "$(modinfo -F signer "$k" 2>/dev/null)" ]; then signed+=" ${k#"$root"}"; else unsigned+=" ${k#"$root"}"; fi
done
if [ "$sb" = on ] || [ "$enforce" = Y ]; then
	if [ -n "$unsigned" ]; then
		say FAIL secure-boot "Secure Boot ${sb:-?} / sig_enforce ${enforce:-?}: unsigned:$unsigned will not load (Key was rejected by service): sign it with your MOK (docs/install.md, 'Secure Boot')"
	elif [ -z "$kos" ]; then
		say WARN secure-boot "Secure Boot on: no installed peermem module under /lib/modules/$rel to check; it must be signed with an enrolled key"
	else
		say PASS secure-boot "Secure Boot on; signed:$signed"
	fi
elif [ "$sb" = off ]; then
	say PASS secure-boot "Secure Boot off: unsigned modules load${unsigned:+ (unsigned:$unsigned)}"
else
	say INFO secure-boot "Secure Boot state unknown (no EFI variables, not UEFI, or no mokutil)${unsigned:+; unsigned:$unsigned}"
fi

echo "doctor: $npass pass, $nwarn warn, $nfail fail (kernel $rel)"
[ "$nfail" = 0 ]
