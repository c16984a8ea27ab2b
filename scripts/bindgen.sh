#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# Generate peermem's Rust FFI (rust/ffi_generated.rs) from
# include/peermem_ffi.h with the kernel's own bindgen and flags.
#
#   scripts/bindgen.sh KDIR HEADER OUTPUT [DEPFILE]
#
# KDIR is the kernel build tree (the O= directory). The kernel records the
# command that generated its own Rust bindings in
# $KDIR/rust/bindings/.bindings_generated.rs.cmd; we reuse that bindgen
# binary, its code-generation options (rust target, ctypes prefix, use-core,
# ...) and every clang flag after `--` (target, include paths, defines),
# running from KDIR so relative paths resolve. Dropped: the kernel's input,
# output and depfile, its per-item blocklists/derives/attributes (they name
# kernel items, which we do not generate) and its module-name defines.
#
# Only items declared in include/*.h are generated (--allowlist-file); the
# kernel types they use (struct sg_table, u64, ...) are not generated but
# taken from `kernel::bindings`, so they are the very same Rust types the
# kernel crate uses. Exported kernel functions, variables and types that
# `kernel::bindings` lacks on some supported kernel are generated too when
# a header in include/ names them on a line of its own:
#     * bindgen-kernel: fn follow_pfnmap_start follow_pfnmap_end
#     * bindgen-kernel: type follow_pfnmap_args
#     * bindgen-kernel: var  ... (an exported variable)
# (the header must include the kernel header that declares them). Rust then
# calls them directly, wrapped in rust/kapi/; C is needed only for static
# inline functions and macros. Kbuild calls this; it is also fine to run by
# hand.
set -euo pipefail

die() { printf 'peermem: bindgen: %s\n' "$*" >&2; exit 1; }

case ${1:-} in -h|--help) printf 'usage: scripts/bindgen.sh KDIR HEADER OUTPUT [DEPFILE]\n\n'; sed -n '4,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
[ $# -ge 3 ] && [ $# -le 4 ] || { printf 'peermem: bindgen: wrong arguments\nusage: scripts/bindgen.sh KDIR HEADER OUTPUT [DEPFILE]\n' >&2; exit 2; }
kdir=$(cd "$1" 2>/dev/null && pwd) || die "kernel build tree '$1' does not exist"
abspath() { case "$1" in /*) printf '%s\n' "$1" ;; *) printf '%s/%s\n' "$PWD" "$1" ;; esac; }
header=$(abspath "$2")
out=$(abspath "$3")
depfile=${4:+$(abspath "$4")}
[ -f "$header" ] || die "no header '$header'"
incdir=$(dirname "$header")

cmdfile=$kdir/rust/bindings/.bindings_generated.rs.cmd
[ -f "$cmdfile" ] ||
	die "$cmdfile is missing: the kernel tree's Rust bindings were never built; build the kernel (CONFIG_RUST=y) first"

# Line 1: `savedcmd_<target> := <command>[; post-processing]`, make-escaped.
line=$(head -n1 "$cmdfile")
case "$line" in savedcmd_*' := '*) ;; *) die "unexpected format of $cmdfile; is this a kernel build tree?" ;; esac
line=${line#* := }
line=${line%%; *}
line=${line//'$(pound)'/#}
line=${line//'$$'/$}
# Split into words with shell quoting rules but without evaluating anything.
mapfile -d '' -t words < <(printf '%s' "$line" | xargs printf '%s\0') ||
	die "cannot parse the bindgen command in $cmdfile"
[ "${#words[@]}" -gt 2 ] || die "no bindgen command in $cmdfile"

# The kernel build exports BINDGEN (a BINDGEN=... given to make wins).
bindgen_bin=${BINDGEN:-${words[0]}}
command -v "$bindgen_bin" >/dev/null 2>&1 ||
	die "'$bindgen_bin' (the bindgen the kernel was built with) not found; install bindgen-cli (scripts/setup-host.sh) or put it in PATH"

# words[1] is the kernel's input header. Then bindgen options up to `--`.
opts=()
ctypes_prefix=
i=2
n=${#words[@]}
while [ $i -lt $n ]; do
	w=${words[$i]}
	case "$w" in
	--) i=$((i + 1)); break ;;
	--blocklist-*=*|--opaque-type=*|--newtype-enum=*|--with-derive-custom*=*|--with-attribute-custom*=*)
		# Options naming kernel items or files, value attached: drop.
		i=$((i + 1)); continue ;;
	-o|--blocklist-*|--opaque-type|--newtype-enum|--with-derive-custom*|--with-attribute-custom*|--rustified-enum|--constified-enum*|--bitfield-enum)
		# The same with the value in the next word: drop both.
		i=$((i + 2)); continue ;;
	--ctypes-prefix)
		ctypes_prefix=${words[$((i + 1))]}
		opts+=("$w" "$ctypes_prefix"); i=$((i + 2)); continue ;;
	esac
	opts+=("$w")
	i=$((i + 1))
done

clang=()
while [ $i -lt $n ]; do
	w=${words[$i]}
	case "$w" in
	-Wp,-MMD,*|-Wp,-MD,*) ;;
	-DKBUILD_MODFILE=*|-DKBUILD_BASENAME=*|-DKBUILD_MODNAME=*|-D__KBUILD_MODNAME=*) ;;
	*) clang+=("$w") ;;
	esac
	i=$((i + 1))
done
[ ${#clang[@]} -gt 0 ] || die "no clang flags found in $cmdfile"

raw_lines=(--raw-line 'use kernel::bindings::*;')
# Kernels from 6.13 on map C types through their `ffi` crate.
[ "$ctypes_prefix" = ffi ] && raw_lines+=(--raw-line 'use kernel::ffi;')

incre=$(printf '%s' "$incdir" | sed 's/[][\.*^$+?(){}|]/\\&/g')
# Kernel items the headers ask for (see the head of this file).
kernel_items=()
while read -r kind names; do
	case "$kind" in
	fn) flag=--allowlist-function ;;
	type) flag=--allowlist-type ;;
	var) flag=--allowlist-var ;;
	*) die "bad 'bindgen-kernel: $kind $names' line in $incdir (kind must be fn, type or var)" ;;
	esac
	for name in $names; do
		case "$name" in *[!A-Za-z0-9_]*) die "bad kernel item name '$name' in a bindgen-kernel line" ;; esac
		kernel_items+=("$flag" "^${name}\$")
	done
done < <(sed -n 's/^[[:space:]]*\*[[:space:]]*bindgen-kernel:[[:space:]]*//p' "$incdir"/*.h)
dep=()
[ -n "$depfile" ] && dep=("-Wp,-MMD,$depfile")

tmp=$out.tmp.$$
trap 'rm -f "$tmp"' EXIT
cd "$kdir"
"$bindgen_bin" "$header" "${opts[@]}" \
	--allowlist-file "$incre/.*\\.h" \
	"${kernel_items[@]}" \
	--no-recursive-allowlist \
	"${raw_lines[@]}" \
	-o "$tmp" -- "${clang[@]}" -I"$incdir" \
	-DKBUILD_MODNAME='"peermem"' -D__KBUILD_MODNAME=peermem "${dep[@]}" ||
	die "bindgen failed on $header (messages above)"
grep -q 'pub fn peermem_' "$tmp" || die "bindgen produced no peermem items from $header"
# clang wrote paths relative to KDIR; make (and fixdep) read them from elsewhere.
if [ -n "$depfile" ]; then
	awk -v k="$kdir" '{ for (i = 1; i <= NF; i++) if ($i != "\\" && $i !~ /^\// && $i !~ /:$/) $i = k "/" $i; print }' \
		"$depfile" > "$depfile.tmp" && mv -f "$depfile.tmp" "$depfile"
fi
mv -f "$tmp" "$out"
trap - EXIT
