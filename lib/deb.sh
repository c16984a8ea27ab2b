#!/usr/bin/env bash
# SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT
# Build libpeermem's Debian packages (make deb at the top runs it after the
# DKMS package; make -C lib deb OUT=DIR alone):
#
#   lib/deb.sh [--out DIR] [--help]
#
#   libpeermem1_<version>_<arch>.deb     /usr/lib/<multiarch>/libpeermem.so.1*
#   libpeermem-dev_<version>_<arch>.deb  <peermem/libpeermem.h>, <peermem/peermem.h>,
#                                        libpeermem.so, libpeermem.a, peermem.pc,
#                                        man 3 libpeermem (and one page per function)
#
# The version is PEERMEM_VERSION in include/peermem_ffi.h (the DKMS
# package's); the library's own version (soname libpeermem.so.1) is in
# lib/Makefile. libpeermem1 depends on the libc6 its symbols need (read
# from the built library); libpeermem-dev on libpeermem1 of the same
# version and linux-libc-dev (<linux/types.h>). Needs dpkg-deb and
# dpkg-architecture; builds as any user, in a scratch directory.
# PEERMEM_MAINTAINER names the packages' maintainer (who builds them for a
# fleet: themselves; default a placeholder of the project).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
usage='lib/deb.sh [--out DIR] [--help]'
out=$top/dist
while [ $# -gt 0 ]; do
	case $1 in
	--out) [ $# -ge 2 ] && [ -n "$2" ] && [[ $2 != --* ]] || { echo "lib/deb.sh: option --out needs a value" >&2; echo "usage: $usage" >&2; exit 2; }
		out=$2; shift 2 ;;
	-h|--help) printf 'usage: lib/deb.sh [--out DIR]\n\n'; sed -n '3,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) echo "lib/deb.sh: unknown argument '$1'" >&2; echo "usage: $usage" >&2; exit 2 ;;
	esac
done
for c in dpkg-deb dpkg-architecture; do
	command -v $c >/dev/null || { echo "lib/deb.sh: $c not found (Debian/Ubuntu: apt install dpkg-dev)" >&2; exit 1; }
done
version=$(sed -n 's/^#define PEERMEM_VERSION "\(.*\)"/\1/p' "$top/include/peermem_ffi.h")
[ -n "$version" ] || { echo "lib/deb.sh: cannot read PEERMEM_VERSION from include/peermem_ffi.h" >&2; exit 1; }
arch=$(dpkg-architecture -qDEB_HOST_ARCH)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
major=$(sed -n 's/^MAJOR := //p' "$here/Makefile")

work=$(mktemp -d "${TMPDIR:-/tmp}/libpeermem-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT
stage=$work/stage
make -s -C "$here" B="$work/build" install DESTDIR="$stage" PREFIX=/usr LIBDIR="/usr/lib/$multiarch" >/dev/null
# The highest GLIBC_ symbol version the library needs.
glibc=$(objdump -T "$work/build/libpeermem.so.$major"* 2>/dev/null | sed -n 's/.*(GLIBC_\([0-9.]*\)).*/\1/p' | sort -uV | tail -n 1)

copyright() { # DIR
	mkdir -p "$1"
	cp "$top/LICENSE" "$1/copyright"
}

# --- libpeermem1: the shared library
rt=$work/libpeermem$major
mkdir -p "$rt/DEBIAN" "$rt/usr/lib/$multiarch"
cp -a "$stage/usr/lib/$multiarch"/libpeermem.so."$major"* "$rt/usr/lib/$multiarch/"
copyright "$rt/usr/share/doc/libpeermem$major"
echo "libpeermem $major libpeermem$major (>= $version)" >"$rt/DEBIAN/shlibs"
echo "activate-noawait ldconfig" >"$rt/DEBIAN/triggers"
cat >"$rt/DEBIAN/control" <<C
Package: libpeermem$major
Version: $version
Architecture: $arch
Multi-Arch: same
Section: libs
Priority: optional
Depends: libc6 (>= ${glibc:-2.34})
Suggests: peermem-dkms
Installed-Size: $(du -sk "$rt" | cut -f1)
Maintainer: ${PEERMEM_MAINTAINER:-peermem project <peermem-maintainers@example.invalid>}
Description: client library of peermem's GPU-memory revocation channel
 libpeermem reads /dev/peermem, which tells a process which of its RDMA
 registrations of GPU memory peermem revoked (GPU memory freed, unmapped,
 moved or mapped over): a lock-free check, records handed to callbacks, an
 overflow turned into one flush, safe with many threads and across fork.
 Registration caches (UCX, Open MPI, libfabric, NCCL) use it instead of
 memory hooks. Without /dev/peermem it says so and the caller keeps them.
C

# --- libpeermem-dev: headers, static library, pkg-config, man pages
dev=$work/libpeermem-dev
mkdir -p "$dev/DEBIAN" "$dev/usr/lib/$multiarch" "$dev/usr/share"
cp -a "$stage/usr/include" "$dev/usr/"
cp -a "$stage/usr/lib/$multiarch/libpeermem.so" "$stage/usr/lib/$multiarch/libpeermem.a" \
	"$stage/usr/lib/$multiarch/pkgconfig" "$dev/usr/lib/$multiarch/"
cp -a "$stage/usr/share/man" "$dev/usr/share/"
gzip -9n "$dev/usr/share/man/man3/"*.3
# The per-function pages are .so links: keep them pointing at the gzipped page.
copyright "$dev/usr/share/doc/libpeermem-dev"
cat >"$dev/DEBIAN/control" <<C
Package: libpeermem-dev
Version: $version
Architecture: $arch
Multi-Arch: same
Section: libdevel
Priority: optional
Depends: libpeermem$major (= $version), linux-libc-dev
Installed-Size: $(du -sk "$dev" | cut -f1)
Maintainer: ${PEERMEM_MAINTAINER:-peermem project <peermem-maintainers@example.invalid>}
Description: client library of peermem's revocation channel (development files)
 Headers (<peermem/libpeermem.h>, <peermem/peermem.h>, the channel's ABI),
 the static library, peermem.pc for pkg-config and man 3 libpeermem.
C

mkdir -p "$out"
for p in "$rt" "$dev"; do
	name=$(sed -n 's/^Package: //p' "$p/DEBIAN/control")
	deb=$out/${name}_${version}_${arch}.deb
	dpkg-deb --root-owner-group -Zxz --build "$p" "$deb" >/dev/null
	echo "$deb"
done
