#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# libpeermem on the host (no VM, no /dev/peermem needed). Prints TAP.
#
#   tests/host/lib/run.sh
#
# Builds lib/ in a scratch directory (the checkout's lib/build is not
# touched) and checks:
#  - install DESTDIR=... PREFIX=/usr puts exactly the header pair, the
#    libraries, peermem.pc and the man pages in place; uninstall removes them;
#  - the shared library: soname libpeermem.so.1, every function the header
#    declares exported with version PEERMEM_1.0 and nothing else, the
#    version in the header, lib/Makefile and peermem.pc agree;
#  - the installed header compiles alone (C11 -pedantic, C++), a program
#    built with `pkg-config --cflags --libs peermem` from the staged root
#    alone runs against the shared library, and one against the static one;
#  - that program (tests/host/lib/api_host.c): the API edges that need no
#    device (no channel, bad arguments, the drain logic, a closed
#    descriptor, fork), its results renumbered into this stream;
#  - man 3 libpeermem renders without a warning and names every function;
#  - the interval tree of docs/examples/peermem_itree.h against a list
#    (itree_test.c), and docs/examples/peermem_mtcache.h compiles;
#  - lib/deb.sh builds libpeermem1 and libpeermem-dev with those files;
#    as root on a host without libpeermem: dpkg refuses -dev alone, installs
#    both, a program built with the system's pkg-config runs, and purging
#    both leaves nothing.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../../scripts/lib.sh"
top=$PEERMEM_ROOT

n=0 fails=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() { n=$((n + 1)); fails=$((fails + 1)); echo "not ok $n - $1"; }
check() { # check DESCRIPTION CMD...: ok if CMD succeeds
	local d=$1; shift
	if "$@"; then ok "$d"; else notok "$d"; fi
}

s=$(mktemp -d "${TMPDIR:-/tmp}/libpeermem-test.XXXXXX")
trap 'rm -rf "$s"' EXIT
ma=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo "$(uname -m)-linux-gnu")
root=$s/root libdir=/usr/lib/$ma

# --- build and install
if make -C "$top/lib" B="$s/build" >"$s/build.log" 2>&1 &&
   make -C "$top/lib" B="$s/build" install DESTDIR="$root" PREFIX=/usr LIBDIR="$libdir" >>"$s/build.log" 2>&1; then
	ok "make -C lib and make -C lib install DESTDIR=... PREFIX=/usr LIBDIR=$libdir (-Wall -Wextra -Werror)"
else
	notok "make -C lib (install): log follows"; sed 's/^/#   /' "$s/build.log" | tail -n 20
	echo "1..$n"; exit 1
fi
want="usr/include/peermem/libpeermem.h usr/include/peermem/peermem.h $libdir/libpeermem.so.1.0.0
$libdir/libpeermem.so.1 $libdir/libpeermem.so $libdir/libpeermem.a $libdir/pkgconfig/peermem.pc
usr/share/man/man3/libpeermem.3"
missing=
for f in $want; do [ -e "$root/${f#/}" ] || missing+=" $f"; done
check "installed: the two headers, libpeermem.so.1.0.0 + .so.1 + .so, libpeermem.a, peermem.pc, man3/libpeermem.3${missing:+ (missing:$missing)}" test -z "$missing"
check "the installed <peermem/peermem.h> is the channel's ABI header itself (a copy, not a link)" \
	bash -c "[ ! -L '$root/usr/include/peermem/peermem.h' ] && cmp -s '$root/usr/include/peermem/peermem.h' '$top/include/uapi/peermem.h'"

# --- the shared library's ABI
so=$root$libdir/libpeermem.so.1.0.0
soname=$(readelf -d "$so" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
check "soname libpeermem.so.1 ($soname)" test "$soname" = libpeermem.so.1
declared=$(grep -oE '^[a-z_0-9 *]*\bpeermem_[a-z_]+\(' "$top/lib/include/peermem/libpeermem.h" | grep -oE 'peermem_[a-z_]+' | sort -u)
exported=$(nm -D --defined-only "$so" | awk '$2 == "T" {print $3}' | sort -u)
versioned=$(nm -D --defined-only "$so" | awk '$2 == "T" {print $3}' | grep -c '@@PEERMEM_1\.0$')
other=$(nm -D --defined-only "$so" | awk '$2 != "A"' | grep -v ' peermem_[a-z_]*@@PEERMEM_1\.0$' | wc -l)
exported_names=$(echo "$exported" | sed 's/@@.*//' | sort -u)
if [ -n "$declared" ] && [ "$declared" = "$exported_names" ] && [ "$versioned" = "$(echo "$declared" | wc -l)" ] && [ "$other" = 0 ]; then
	ok "exports: exactly the $(echo "$declared" | wc -l) functions the header declares, each @@PEERMEM_1.0, nothing else"
else
	notok "exports differ from the header's functions (declared: $(echo $declared); exported: $(echo $exported); others: $other)"
fi
hmaj=$(sed -n 's/^#define LIBPEERMEM_VERSION_MAJOR //p' "$top/lib/include/peermem/libpeermem.h")
hmin=$(sed -n 's/^#define LIBPEERMEM_VERSION_MINOR //p' "$top/lib/include/peermem/libpeermem.h")
mver=$(sed -n 's/^MAJOR := //p;s/^MINOR := //p' "$top/lib/Makefile" | paste -sd.)
pcver=$(PKG_CONFIG_LIBDIR=$root$libdir/pkgconfig pkg-config --modversion peermem 2>/dev/null)
check "one version: header $hmaj.$hmin, lib/Makefile $mver, peermem.pc $pcver, soname major $hmaj" \
	bash -c "[ '$hmaj.$hmin' = '$mver' ] && [ '$pcver' = '$mver.0' ] && [ '$soname' = 'libpeermem.so.$hmaj' ]"

# --- the installed header alone, pkg-config, shared and static
# (the staged /usr paths are system paths to pkg-config: let it print them)
export PKG_CONFIG_LIBDIR=$root$libdir/pkgconfig PKG_CONFIG_SYSROOT_DIR=$root PKG_CONFIG_ALLOW_SYSTEM_CFLAGS=1 PKG_CONFIG_ALLOW_SYSTEM_LIBS=1
cflags=$(pkg-config --cflags peermem) libs=$(pkg-config --libs peermem)
echo "# pkg-config: $cflags $libs"
printf '#include <peermem/libpeermem.h>\nint main(void) { return peermem_version() > 0 ? 0 : 1; }\n' >"$s/alone.c"
check "the installed header compiles alone: C11 -pedantic -Wall -Wextra -Werror" \
	gcc -std=c11 -pedantic -Wall -Wextra -Werror $cflags -fsyntax-only "$s/alone.c"
if command -v g++ >/dev/null; then
	check "and as C++ (extern \"C\")" g++ -x c++ -Wall -Wextra -Werror $cflags -fsyntax-only "$s/alone.c"
else
	ok "and as C++ # SKIP no g++"
fi
if gcc -std=gnu11 -Wall -Wextra -Werror -Wno-unused-function -pthread $cflags -o "$s/api_shared" "$here/api_host.c" $libs >"$s/cc.log" 2>&1 &&
   gcc -std=gnu11 -Wall -Wextra -Werror -Wno-unused-function -pthread $cflags -o "$s/api_static" "$here/api_host.c" \
	"$(pkg-config --variable=libdir peermem)/libpeermem.a" >>"$s/cc.log" 2>&1; then
	ok "api_host.c built with pkg-config's --cflags/--libs from the staged root, and against libpeermem.a"
else
	notok "building api_host.c against the installed library"; sed 's/^/#   /' "$s/cc.log" | head -n 20
fi
if [ -x "$s/api_shared" ]; then
	needed=$(readelf -d "$s/api_shared" | grep -c 'Shared library: \[libpeermem.so.1\]')
	check "the program needs libpeermem.so.1 (the soname, not the .so link)" test "$needed" = 1
	LD_LIBRARY_PATH=$root$libdir TMPDIR=$s "$s/api_shared" >"$s/api.tap" 2>&1
	rc=$?
	while IFS= read -r line; do
		case $line in
		"ok "*) ok "api: ${line#ok * - }" ;;
		"not ok "*) notok "api: ${line#not ok * - }" ;;
		"1.."*) ;;
		*) echo "$line" ;;
		esac
	done <"$s/api.tap"
	check "api: the program (shared library) exits 0 (rc $rc)" test "$rc" = 0
	TMPDIR=$s "$s/api_static" >"$s/api_static.tap" 2>&1
	rc=$?
	check "api: the same program linked statically passes too (rc $rc, $(grep -c '^ok' "$s/api_static.tap") ok, $(grep -c '^not ok' "$s/api_static.tap") not ok)" test "$rc" = 0
fi
unset PKG_CONFIG_LIBDIR PKG_CONFIG_SYSROOT_DIR PKG_CONFIG_ALLOW_SYSTEM_CFLAGS PKG_CONFIG_ALLOW_SYSTEM_LIBS

# --- man page
warn=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -l "$root/usr/share/man/man3/libpeermem.3" 2>&1 >"$s/man.txt")
check "man 3 libpeermem renders without a warning${warn:+ ($warn)}" test -z "$warn"
found=$(MANPATH=$root/usr/share/man man -w 3 libpeermem 2>/dev/null)
check "man -w 3 libpeermem finds the installed page ($found)" test "$found" = "$root/usr/share/man/man3/libpeermem.3"
undoc=
for f in $declared; do
	grep -q "$f" "$s/man.txt" || undoc+=" $f"
	[ -f "$root/usr/share/man/man3/$f.3" ] || undoc+=" $f.3"
done
check "the man page covers every function, each has its own page name${undoc:+ (missing:$undoc)}" test -z "$undoc"

# --- examples
if gcc -O2 -std=gnu11 -Wall -Wextra -Werror -Wno-unused-function -o "$s/itree_test" "$here/itree_test.c" >"$s/it.log" 2>&1; then
	"$s/itree_test" >"$s/it.tap" 2>&1; rc=$?
	while IFS= read -r line; do
		case $line in
		"ok "*) ok "itree: ${line#ok * - }" ;;
		"not ok "*) notok "itree: ${line#not ok * - }" ;;
		"1.."*) ;;
		*) echo "$line" ;;
		esac
	done <"$s/it.tap"
	check "itree: the test exits 0 (rc $rc)" test "$rc" = 0
else
	notok "itree_test.c does not build"; sed 's/^/#   /' "$s/it.log" | head
fi
printf '#include "%s/docs/examples/peermem_mtcache.h"\nint main(void) { return 0; }\n' "$top" >"$s/mtc.c"
check "docs/examples/peermem_mtcache.h compiles (-Wall -Wextra -Werror) against the library's header" \
	gcc -std=gnu11 -Wall -Wextra -Werror -Wno-unused-function -I"$top/lib/include" -fsyntax-only "$s/mtc.c"

# --- uninstall
make -C "$top/lib" B="$s/build" uninstall DESTDIR="$root" PREFIX=/usr LIBDIR="$libdir" >/dev/null 2>&1
left=$(find "$root" -type f -o -type l | sed "s|^$root||" | grep -E 'peermem' || true)
check "make -C lib uninstall removes every installed file${left:+ (left: $(echo $left))}" test -z "$left"

# install_debs RUNTIME DEV VERSION: the packages as a user installs them
# (dpkg -i on this host, as root, only when no libpeermem is installed
# already), then a program built with the system's pkg-config alone, then
# dpkg --purge leaves nothing behind.
install_debs() {
	local rt=$1 dev=$2 ver=$3 have left prog rc out
	if [ "$(id -u)" != 0 ]; then ok "packages installed with dpkg -i # SKIP not root"; return; fi
	have=$(dpkg-query -W -f '${Package} ${Status}\n' libpeermem1 libpeermem-dev 2>/dev/null | grep ' installed$')
	if [ -n "$have" ]; then ok "packages installed with dpkg -i # SKIP this host has libpeermem installed ($have): not touched"; return; fi
	# -dev alone: dpkg must refuse it (the dependency on the same version).
	if dpkg -i "$dev" >"$s/dpkg-dev-alone.log" 2>&1; then
		notok "dpkg -i libpeermem-dev without libpeermem1 is refused (it was installed)"
	else
		check "dpkg -i libpeermem-dev without libpeermem1 is refused (dependency)" grep -q 'libpeermem1' "$s/dpkg-dev-alone.log"
	fi
	dpkg --purge libpeermem-dev >/dev/null 2>&1
	if ! dpkg -i "$rt" "$dev" >"$s/dpkg-i.log" 2>&1; then
		notok "dpkg -i libpeermem1 libpeermem-dev"; sed 's/^/#   /' "$s/dpkg-i.log" | tail -n 5
		dpkg --purge libpeermem-dev libpeermem1 >/dev/null 2>&1
		return
	fi
	ok "dpkg -i libpeermem1 libpeermem-dev ($ver)"
	check "installed: ldconfig knows libpeermem.so.1" bash -c "ldconfig -p | grep -q 'libpeermem.so.1 '"
	out=$(pkg-config --modversion peermem 2>&1)
	check "installed: the system's pkg-config finds peermem, the library's version ($out; staged peermem.pc: $pcver)" test "$out" = "$pcver"
	prog=$s/installed_prog
	printf '%s\n' '#include <peermem/libpeermem.h>' '#include <stdio.h>' \
		'int main(void) { struct peermem_channel *ch; int why = 0;' \
		'  int rc = peermem_open(&ch, "/nonexistent/peermem", 0, &why);' \
		'  printf("%d %d %d\n", peermem_version() > 0, rc == PEERMEM_NO_CHANNEL && ch == NULL, why);' \
		'  return 0; }' >"$prog.c"
	# shellcheck disable=SC2046
	if gcc -std=gnu11 -Wall -Wextra -Werror -o "$prog" "$prog.c" $(pkg-config --cflags --libs peermem) >"$s/inst-cc.log" 2>&1; then
		out=$("$prog" 2>&1); rc=$?
		check "installed: a program built with the system's pkg-config alone runs against /usr's library (no channel at a missing path: PEERMEM_NO_CHANNEL, reason -ENOENT; got '$out')" \
			test "$rc $out" = "0 1 1 -2"
	else
		notok "installed: a program builds with \$(pkg-config --cflags --libs peermem)"; sed 's/^/#   /' "$s/inst-cc.log" | head -n 5
	fi
	check "installed: man -w 3 libpeermem finds the page" bash -c "man -w 3 libpeermem 2>/dev/null | grep -q '^/usr/share/man/man3/libpeermem.3'"
	if dpkg --purge libpeermem-dev libpeermem1 >"$s/dpkg-purge.log" 2>&1; then
		left=$(dpkg -L libpeermem1 libpeermem-dev 2>/dev/null | grep -c / ; ls /usr/include/peermem /usr/lib/*/libpeermem* /usr/lib/*/pkgconfig/peermem.pc 2>/dev/null)
		check "dpkg --purge libpeermem-dev libpeermem1 leaves nothing (left: $left)" test "$left" = 0
	else
		notok "dpkg --purge libpeermem-dev libpeermem1"; sed 's/^/#   /' "$s/dpkg-purge.log" | tail -n 5
	fi
}

# --- packages
if command -v dpkg-deb >/dev/null && command -v dpkg-architecture >/dev/null; then
	if debs=$(TMPDIR=$s bash "$top/lib/deb.sh" --out "$s/dist" 2>"$s/deb.log"); then
		rt=$(echo "$debs" | grep '/libpeermem1_') dev=$(echo "$debs" | grep '/libpeermem-dev_')
		rtc=$(dpkg-deb -c "$rt" | awk '{print $6}' | sort | tr '\n' ' ')
		devc=$(dpkg-deb -c "$dev" | awk '{print $6}' | sort | tr '\n' ' ')
		check "libpeermem1: the shared library and its soname link, nothing of -dev" \
			bash -c "echo '$rtc' | grep -q 'libpeermem.so.1.0.0' && echo '$rtc' | grep -q 'libpeermem.so.1 ' && ! echo '$rtc' | grep -qE 'include|\.a |pkgconfig'"
		check "libpeermem-dev: headers, .so link, .a, peermem.pc, man pages" \
			bash -c "for f in include/peermem/libpeermem.h include/peermem/peermem.h libpeermem.so libpeermem.a pkgconfig/peermem.pc man3/libpeermem.3.gz; do echo '$devc' | grep -q \"\$f\" || exit 1; done"
		dep=$(dpkg-deb -f "$dev" Depends) ver=$(dpkg-deb -f "$rt" Version)
		check "libpeermem-dev depends on libpeermem1 (= $ver) ($dep)" bash -c "echo '$dep' | grep -q 'libpeermem1 (= $ver)'"
		install_debs "$rt" "$dev" "$ver"
	else
		notok "lib/deb.sh failed"; sed 's/^/#   /' "$s/deb.log" | tail
	fi
else
	ok "packages # SKIP no dpkg-deb/dpkg-architecture"
fi

echo "1..$n"
[ "$fails" = 0 ]
