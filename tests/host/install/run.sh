#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# Host tests of the install tooling (TAP), each against fake trees in a
# scratch directory, nothing outside it touched:
#   symvers.sh  scripts/find-symvers.sh: every Module.symvers layout of
#               MLNX_OFED/DOCA-OFED and NVIDIA's packages, stale and
#               foreign-arch ones rejected, entries derived from installed
#               modules, the error messages, and the Makefile's use of it;
#   toolchain.sh the Makefile's Rust toolchain errors and Ubuntu's versioned rustc;
#   doctor.sh   scripts/doctor.sh on a good fake machine and on one broken
#               set-up per check;
#   dkms.sh     scripts/dkms.sh with Debian's dkms against KDIR, as root
#               (it says what it adds to the host and removes it all).
# KDIR (a built kernel tree; run-all.sh passes the rig's) enables the parts
# that need one.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/lib.sh
. "$here/../../../scripts/lib.sh"

n=0 fails=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() { n=$((n + 1)); fails=$((fails + 1)); echo "not ok $n - $1"; }
scratch=$(mktemp -d /tmp/peermem-install-test.XXXXXX)
trap 'rm -rf "$scratch"' EXIT

for t in symvers toolchain doctor dkms; do
	echo "# --- $t"
	# shellcheck source=/dev/null
	. "$here/$t.sh"
done
echo "1..$n"
[ "$fails" = 0 ]
