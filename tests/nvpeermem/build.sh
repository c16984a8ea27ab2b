#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# NVIDIA's own peer-memory client, nvidia-peermem, UNMODIFIED, built against
# the rig kernel and gpusim so that the end-to-end test can run it
# (tests/guest/e2e/t_e2e_nvpeermem, docs/testing.md).
#
#   tests/nvpeermem/build.sh [--kdir DIR] [--llvm SUFFIX]
#   make -C tests/nvpeermem [KDIR=DIR] [LLVM=SUFFIX]     (the same)
#   tests/nvpeermem/build.sh --import-git DIR --tag TAG  (see 6.; builds nothing)
#
# 1. Finds Debian's nvidia-open-kernel-dkms $NV_REF_VERSION (default
#    550.163.01) in $PEERMEM_CACHE/debs, or downloads it there with apt-get
#    (scripts/nvidia-deb.sh, shared with tests/host/abi).
# 2. Extracts nvidia-peermem.c and the headers it includes (nv-p2p.h,
#    peer_mem.h) into $PEERMEM_CACHE/nvpeermem/src-<Debian version>/.
# 3. Writes the one conftest.h result nvidia-peermem.c uses,
#    NV_MLNX_IB_PEER_MEM_SYMBOLS_PRESENT, decided as NVIDIA's conftest.sh
#    does (ib_register/unregister_peer_memory_client exported in the
#    kernel's Module.symvers), and a Kbuild with the package's flags for it.
# 4. Builds in $PEERMEM_CACHE/nvpeermem/build-<hash of KDIR, kernel release,
#    package version, compiler>/, linking to gpusim's nvidia_p2p_* through
#    tests/gpusim/Module.symvers (build gpusim first); an unresolved symbol
#    is an error.
# 5. Copies the module to tests/nvpeermem/nvidia-peermem.ko (git-ignored),
#    where the guest finds it (it sees the host's / read-only).
# 6. Newer nvidia-peermem.c, from NVIDIA's open-gpu-kernel-modules (not
#    packaged by Debian): for each tag in $NV_GIT_VERSIONS (default
#    595.45.04) whose source is in $PEERMEM_CACHE/nvidia-src/<tag>/, builds it
#    the same way (steps 3-4) into tests/nvpeermem/<major>/nvidia-peermem.ko
#    (595/, git-ignored). Where the source is absent (CI cannot reach
#    NVIDIA's repository) it says so in one line and skips it: not an error.
#    The source gets there, from a clone of that repository (bare or not),
#    with
#      tests/nvpeermem/build.sh --import-git DIR --tag 595.45.04
#    which copies kernel-open/nvidia-peermem/{nvidia-peermem.c,nv-p2p.h,
#    peer_mem.h} of that tag, takes NV_VERSION_STRING from the tag's
#    version.mk, and checks that every header nvidia-peermem.c includes is
#    there (conftest.h is written per build, as in 3.).
# 7. --calibration DIR (the benchmark's calibration, docs/history.md,
#    "Code footprint under TCG, and a calibration"): also builds the Debian nvidia-peermem.c under the
#    module name peermem, so that scripts/bench.sh can run it in peermem's
#    turn (BENCH_PM_KO=DIR/aa/peermem.ko: an A/A run), and a variant with
#    nv_mem_acquire's probe pin (its nvidia_p2p_get_pages and put_pages)
#    compiled out, one pin per registration (DIR/onepin/peermem.ko; an
#    experiment, not a client: it claims every address). The variant's
#    source is made in the cache at build time, never committed. DIR must
#    be where the guest sees it (not under /tmp, which it has its own of).
#
# Nothing of NVIDIA's is ever written into the repository except that
# built, ignored .ko. Exit status 0 on success; on failure the last lines
# say what went wrong and how to fix it.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../scripts/lib.sh"
. "$PEERMEM_ROOT/scripts/nvidia-deb.sh"

NV_REF_VERSION=${NV_REF_VERSION:-$NV_DEB_DEFAULT_VERSION}
NV_GIT_VERSIONS=${NV_GIT_VERSIONS-595.45.04}
kdir=${KDIR:-} llvm=${LLVM:-} import_git= import_tag= calibration=
usage='tests/nvpeermem/build.sh [--kdir DIR] [--llvm SUFFIX] [--calibration DIR] | --import-git DIR --tag TAG'
while [ $# -gt 0 ]; do
	case "$1" in
	--kdir|--llvm|--import-git|--tag|--calibration)
		pm_need_value "$usage" "$@"
		case $1 in --kdir) kdir=$2 ;; --llvm) llvm=$2 ;; --import-git) import_git=$2 ;; --tag) import_tag=$2 ;; --calibration) calibration=$2 ;; esac
		shift 2 ;;
	-h|--help) printf 'usage: %s\n\n' "$usage"; sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) echo "nvpeermem: error: unknown argument '$1'; usage: $usage" >&2; exit 2 ;;
	esac
done
case $calibration in /tmp/*) echo "nvpeermem: error: --calibration $calibration: the guest has a /tmp of its own; use a directory it sees (e.g. under \$PEERMEM_CACHE)" >&2; exit 2 ;; esac

say() { printf 'nvpeermem: %s\n' "$*"; }
# fail WHAT FIX: the reason and the fix as the last lines of the output.
fail() {
	printf 'nvpeermem: error: %s\n' "$1" >&2
	printf 'nvpeermem: fix: %s\n' "$2" >&2
	exit 1
}
# put_if_changed FILE: stdin into FILE unless FILE already holds exactly
# that (an unchanged file keeps its mtime, so kbuild rebuilds nothing).
put_if_changed() {
	local tmp=$1.tmp.$$
	cat > "$tmp" || { rm -f "$tmp"; return 1; }
	if cmp -s "$tmp" "$1"; then rm -f "$tmp"; else mv -f "$tmp" "$1"; fi
}

# --- 6a. --import-git: a newer source into the cache ---------------------------
# import_src DIR TAG: kernel-open/nvidia-peermem/ of TAG in the git
# repository DIR into $PEERMEM_CACHE/nvidia-src/TAG/ (never the repository).
import_src() {
	local git=$1 tag=$2 dst tmp commit f ver incs h
	command -v git >/dev/null 2>&1 || fail "'git' not found" "install git"
	[ -n "$git" ] && [ -n "$tag" ] ||
		fail "--import-git needs a repository and --tag TAG" \
			"tests/nvpeermem/build.sh --import-git <clone of NVIDIA/open-gpu-kernel-modules> --tag 595.45.04"
	case "$tag" in
	*/*|.*|*[!A-Za-z0-9._-]*) fail "'$tag' is not a tag name of NVIDIA's releases" "pass a tag such as 595.45.04" ;;
	esac
	commit=$(git -C "$git" rev-parse -q --verify "refs/tags/$tag^{commit}" 2>/dev/null) ||
		fail "$git has no tag $tag (or is not a git repository)" \
			"point --import-git at a clone of https://github.com/NVIDIA/open-gpu-kernel-modules with its tags"
	dst=$PEERMEM_CACHE/nvidia-src/$tag tmp=$PEERMEM_CACHE/nvidia-src/$tag.tmp.$$
	rm -rf "$tmp" && mkdir -p "$tmp" || fail "cannot create $tmp" "check the permissions of $PEERMEM_CACHE"
	for f in nvidia-peermem.c nv-p2p.h peer_mem.h; do
		git -C "$git" show "$commit:kernel-open/nvidia-peermem/$f" > "$tmp/$f" 2>/dev/null ||
			{ rm -rf "$tmp"; fail "$tag has no kernel-open/nvidia-peermem/$f" \
				"that tag predates the layout this script knows; update tests/nvpeermem/build.sh"; }
	done
	incs=$(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$tmp/nvidia-peermem.c")
	for h in $incs; do
		[ "$h" = conftest.h ] || [ -f "$tmp/$h" ] ||
			{ rm -rf "$tmp"; fail "nvidia-peermem.c of $tag includes \"$h\", which this import does not copy" \
				"add $h to the files --import-git copies in tests/nvpeermem/build.sh"; }
	done
	# NV_VERSION_STRING: what NVIDIA's build gives it (version.mk's NVIDIA_VERSION).
	ver=$(git -C "$git" show "$commit:version.mk" 2>/dev/null |
		sed -n 's/^NVIDIA_VERSION[[:space:]]*=[[:space:]]*\([^[:space:]]*\).*/\1/p' | head -n1)
	[ -n "$ver" ] || ver=$tag
	printf '%s\n' "$ver" > "$tmp/nv_version_string"
	printf 'repository %s\ntag %s\ncommit %s\nfiles nvidia-peermem.c nv-p2p.h peer_mem.h\n' \
		"$git" "$tag" "$commit" > "$tmp/origin"
	rm -rf "$dst" && mv "$tmp" "$dst" && touch "$dst/.imported" ||
		fail "cannot move $tmp to $dst" "check the permissions of $PEERMEM_CACHE"
	say "imported: $tag (commit ${commit:0:12}) from $git into $dst: nvidia-peermem.c (sha256 $(sha256sum "$dst/nvidia-peermem.c" | cut -c1-16)), includes: $(echo $incs), NV_VERSION_STRING $ver"
	say "next:     make -C tests/nvpeermem (builds it beside the $NV_REF_VERSION one)"
}
if [ -n "$import_git$import_tag" ]; then
	import_src "$import_git" "$import_tag"
	exit 0
fi

for c in dpkg-deb tar sha256sum make modinfo flock; do
	command -v "$c" >/dev/null 2>&1 || fail "'$c' not found" "run scripts/setup-host.sh"
done

# --- the kernel tree -------------------------------------------------------
if [ -z "$kdir" ]; then
	kdir=$("$PEERMEM_ROOT/scripts/kernel.sh" --print-kdir 2>/dev/null) ||
		fail "no built rig kernel (scripts/kernel.sh --print-kdir found none)" \
			"run scripts/kernel.sh first, or pass KDIR=<built kernel tree>"
fi
[ -f "$kdir/Makefile" ] && [ -f "$kdir/Module.symvers" ] && [ -f "$kdir/include/config/kernel.release" ] ||
	fail "KDIR=$kdir is not a built kernel tree (no Makefile, Module.symvers or include/config/kernel.release)" \
		"run scripts/kernel.sh, or point KDIR at a fully built tree"
kdir=$(cd "$kdir" && pwd -P)
krel=$(cat "$kdir/include/config/kernel.release")
if [ -z "$llvm" ]; then llvm=$(sed -n 's/^LLVM=//p' "$kdir/.peermem-make-args" 2>/dev/null); fi
llvm=${llvm:--19}
gsyms=$PEERMEM_ROOT/tests/gpusim/Module.symvers

# --- 1. the package --------------------------------------------------------
say "wanted: Debian $NV_DEB_PKG $NV_REF_VERSION (any Debian revision) in $PEERMEM_CACHE/debs, for its nvidia-peermem.c"
pm_nvidia_deb "$NV_REF_VERSION" ||
	fail "cannot get $NV_DEB_PKG $NV_REF_VERSION: $NV_DEB_ERR" "$NV_DEB_FIX"
say "found:  $NV_DEB (Debian version $NV_DEBVER)"

# --- 2. the source ---------------------------------------------------------
mkdir -p "$PEERMEM_CACHE/nvpeermem" || fail "cannot create $PEERMEM_CACHE/nvpeermem" "check the permissions of $PEERMEM_CACHE"
exec 8>>"$PEERMEM_CACHE/nvpeermem/.lock" && flock 8 # one build at a time
src=$PEERMEM_CACHE/nvpeermem/src-$NV_DEBVER
if [ ! -f "$src/.extracted" ]; then
	rm -rf "$src" "$src.tmp"
	mkdir -p "$src.tmp/deb" || fail "cannot create $src.tmp" "check the permissions of $PEERMEM_CACHE"
	dpkg-deb --fsys-tarfile "$NV_DEB" | tar -x -C "$src.tmp/deb" --wildcards \
		'./usr/src/*/nvidia-peermem/*' './usr/src/*/Kbuild' ||
		fail "cannot extract usr/src/*/nvidia-peermem/ from $NV_DEB" "delete $NV_DEB and rerun"
	d=$(ls -d "$src.tmp"/deb/usr/src/*/nvidia-peermem 2>/dev/null | head -n1)
	[ -n "$d" ] && [ -f "$d/nvidia-peermem.c" ] ||
		fail "$NV_DEB has no usr/src/*/nvidia-peermem/nvidia-peermem.c" \
			"the package layout changed; update tests/nvpeermem/build.sh"
	cp -p "$d"/* "$src.tmp/" && cp -p "${d%/nvidia-peermem}/Kbuild" "$src.tmp/nvidia.Kbuild" ||
		fail "cannot copy the extracted files into $src.tmp" "check the free space in $PEERMEM_CACHE"
	rm -rf "$src.tmp/deb"
	mv "$src.tmp" "$src" && touch "$src/.extracted"
fi
# Every local header nvidia-peermem.c includes must be there, but conftest.h
# (generated per kernel by NVIDIA's build; written below).
incs=$(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$src/nvidia-peermem.c")
for h in $incs; do
	[ "$h" = conftest.h ] || [ -f "$src/$h" ] ||
		fail "nvidia-peermem.c includes \"$h\", which $NV_DEB does not ship beside it" \
			"the package layout changed; update tests/nvpeermem/build.sh to extract $h"
done
# The version string NVIDIA's top-level Kbuild gives every object.
nvver=$(sed -n 's/.*-DNV_VERSION_STRING=\\"\([^\\"]*\)\\".*/\1/p' "$src/nvidia.Kbuild" | head -n1)
[ -n "$nvver" ] || fail "no NV_VERSION_STRING in the package's Kbuild ($src/nvidia.Kbuild)" \
	"the package layout changed; update tests/nvpeermem/build.sh"
say "source: $src: nvidia-peermem.c (sha256 $(sha256sum "$src/nvidia-peermem.c" | cut -c1-16)), includes: $(echo $incs), NV_VERSION_STRING $nvver"

# --- 3. the kernel and gpusim it links to ------------------------------------
# NVIDIA's conftest.sh (ib_peer_memory_symbols): both exported by the kernel.
tab=$'\t'
for s in ib_register_peer_memory_client ib_unregister_peer_memory_client; do
	grep -q "${tab}${s}${tab}.*${tab}EXPORT_SYMBOL" "$kdir/Module.symvers" ||
		fail "$kdir/Module.symvers exports no $s: nvidia-peermem would build as a module that refuses to load" \
			"build the rig kernel with its peer-memory core (scripts/kernel.sh; tests/rig/patches/7.3)"
done
[ -f "$gsyms" ] && grep -q "${tab}nvidia_p2p_get_pages${tab}" "$gsyms" ||
	fail "no gpusim exports in $gsyms (gpusim is the nvidia.ko nvidia-peermem links to)" \
		"build gpusim first: make -C tests/gpusim KDIR=$kdir LLVM=$llvm"
say "kernel: $kdir (release $krel, LLVM=$llvm); nvidia_p2p_* from $gsyms"

# build_ko SRC NVVER KEYID DST [NAME]: nvidia-peermem.c and its headers in
# SRC, built as NVIDIA's build would (NV_VERSION_STRING NVVER) in the
# cache as module NAME (default nvidia-peermem), then copied to DST. KEYID
# names the source in the build directory's key.
build_ko() {
	local src=$1 nvver=$2 keyid=$3 dst=$4 name=${5:-nvidia-peermem} key b f log ko vm incs objm
	incs=$(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$src/nvidia-peermem.c")
	key=$(printf '%s\n' "$kdir" "$krel" "$keyid" "$llvm" | sha256sum | cut -c1-12)
	b=$PEERMEM_CACHE/nvpeermem/build-$key
	mkdir -p "$b" || fail "cannot create $b" "check the permissions of $PEERMEM_CACHE"
	for f in nvidia-peermem.c $incs; do
		[ "$f" = conftest.h ] && continue
		put_if_changed "$b/$f" < "$src/$f" || fail "cannot write $b/$f" "check the free space in $PEERMEM_CACHE"
	done
	put_if_changed "$b/conftest.h" <<'EOF'
/* Written by peermem's tests/nvpeermem/build.sh: the result of NVIDIA's
 * conftest "ib_peer_memory_symbols" for the rig kernel (its Module.symvers
 * exports ib_register_peer_memory_client and ib_unregister_peer_memory_client). */
#define NV_MLNX_IB_PEER_MEM_SYMBOLS_PRESENT 1
EOF
	objm="obj-m := $name.o"
	[ "$name" = nvidia-peermem ] || objm+=$'\n'"$name-y := nvidia-peermem.o"
	# The flags nvidia-peermem.Kbuild and the package's Kbuild give it.
	put_if_changed "$b/Kbuild" <<EOF
# Written by peermem's tests/nvpeermem/build.sh: nvidia-peermem.c alone
# (module $name), with the flags of the package's Kbuild and nvidia-peermem.Kbuild.
$objm
ccflags-y += -I\$(src) -DNV_VERSION_STRING=\\"$nvver\\"
ccflags-y += -UDEBUG -U_DEBUG -DNDEBUG -DNV_BUILD_MODULE_INSTANCES=0
EOF

	# --- 4. the build ----------------------------------------------------------
	say "building in $b"
	log=$b/make.log
	if ! make -C "$kdir" M="$b" LLVM="$llvm" KBUILD_EXTRA_SYMBOLS="$gsyms" modules >"$log" 2>&1; then
		tail -n 25 "$log" | sed 's/^/nvpeermem: | /' >&2
		fail "building nvidia-peermem.c $nvver against $kdir failed (log: $log)" \
			"if the rig kernel changed its peer-memory ABI, that is what to fix: nvidia-peermem.c is NVIDIA's and must build unchanged"
	fi
	if grep -E 'undefined!' "$log" >&2; then
		fail "modpost reported unresolved symbols for nvidia-peermem.ko $nvver (log: $log)" \
			"the rig kernel or gpusim must export what nvidia-peermem.c calls, under the same names"
	fi
	ko=$b/$name.ko
	[ -f "$ko" ] || fail "the build left no $ko (log: $log)" "read the log"
	vm=$(modinfo -F vermagic "$ko" | cut -d' ' -f1)
	[ "$vm" = "$krel" ] || fail "$ko is for kernel $vm, not $krel" "delete $b and rerun"

	# --- 5. where the guest finds it --------------------------------------------
	mkdir -p "${dst%/*}" || fail "cannot create ${dst%/*}" "check the permissions of $here"
	cp -f "$ko" "$dst.tmp.$$" && mv -f "$dst.tmp.$$" "$dst" ||
		fail "cannot copy $ko to $dst" "check the permissions of $here"
	say "built:  $ko (module $(modinfo -F name "$ko"), version $(modinfo -F version "$ko"), vermagic $vm)"
	say "ready:  $dst (where the guest finds it; git-ignored in the repository)"
}

build_ko "$src" "$nvver" "$NV_DEBVER" "$here/nvidia-peermem.ko"

# --- 6. newer versions from NVIDIA's repository, where imported ---------------
for tag in $NV_GIT_VERSIONS; do
	gsrc=$PEERMEM_CACHE/nvidia-src/$tag
	if [ ! -f "$gsrc/.imported" ]; then
		say "nvidia-peermem $tag: source not in $PEERMEM_CACHE/nvidia-src (NVIDIA's public open-gpu-kernel-modules is not reachable from CI); skipped"
		# An earlier build of it (another cache, another kernel) must not
		# be loaded as if built now: the kcsan run loaded one built against
		# the KASAN kernel ("Unknown symbol __asan_load8_noabort").
		rm -f "$here/${tag%%.*}/nvidia-peermem.ko"
		continue
	fi
	gver=$(cat "$gsrc/nv_version_string" 2>/dev/null)
	[ -n "$gver" ] || fail "$gsrc has no nv_version_string" \
		"import it again: tests/nvpeermem/build.sh --import-git DIR --tag $tag"
	say "source: $gsrc (commit $(sed -n 's/^commit //p' "$gsrc/origin" | cut -c1-12)): nvidia-peermem.c (sha256 $(sha256sum "$gsrc/nvidia-peermem.c" | cut -c1-16)), NV_VERSION_STRING $gver"
	build_ko "$gsrc" "$gver" "git-$tag" "$here/${tag%%.*}/nvidia-peermem.ko"
done

# --- 7. --calibration: the benchmark's calibration modules --------------------
if [ -n "$calibration" ]; then
	csrc=$PEERMEM_CACHE/nvpeermem/calib-onepin-$NV_DEBVER
	mkdir -p "$csrc" && cp -p "$src"/*.h "$csrc/" ||
		fail "cannot prepare $csrc" "check the permissions and free space of $PEERMEM_CACHE"
	# From nv_mem_acquire's first nvidia_p2p_get_pages( to its "1 means
	# mine": the probe pin and its put, compiled out.
	python3 - "$src/nvidia-peermem.c" <<'PY' | put_if_changed "$csrc/nvidia-peermem.c" ||
import sys
s = open(sys.argv[1]).read()
f = s.index("static int nv_mem_acquire(")
a = s.index("    ret = nvidia_p2p_get_pages(", f)
b = s.index("    /* 1 means mine */", a)
if s.find("static int", f + 1, b) != -1:
    sys.exit("nv_mem_acquire's probe pin is not where expected")
sys.stdout.write(s[:a] + "#if 0 /* peermem's calibration: no probe pin */\n" + s[a:b] + "#endif\n" + s[b:])
PY
		fail "cannot make the one-pin variant of $src/nvidia-peermem.c" \
			"nvidia-peermem.c changed shape: update step 7 of tests/nvpeermem/build.sh"
	build_ko "$src" "$nvver" "$NV_DEBVER-calibration-aa" "$calibration/aa/peermem.ko" peermem
	build_ko "$csrc" "$nvver" "$NV_DEBVER-calibration-onepin" "$calibration/onepin/peermem.ko" peermem
fi
