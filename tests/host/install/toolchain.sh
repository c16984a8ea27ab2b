#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# shellcheck disable=SC2154  # ok, notok, scratch: from run.sh
# The Makefile's Rust toolchain checks against a fake, prepared kernel tree
# as a distribution's headers look (Ubuntu 26.04: rustc 1.92, bindgen 0.71):
# headers without the Rust metadata, the kernel's rustc missing, and the
# kernel's rustc found under Ubuntu's versioned name (rustc-1.92). Each
# error must name the packages that fix it. Sourced by run.sh.

tk=$scratch/tc-kdir
trel=7.0.0-10-generic
mkdir -p "$tk/include/config" "$tk/include/generated" "$tk/scripts/mod" "$tk/rust" "$scratch/tc-bin"
echo "$trel" >"$tk/include/config/kernel.release"
: >"$tk/Makefile"; : >"$tk/include/generated/autoconf.h"; : >"$tk/scripts/mod/modpost"; : >"$tk/Module.symvers"
printf 'CONFIG_X86_64=y\nCONFIG_RUST=y\nCONFIG_RUSTC_VERSION_TEXT="rustc 1.92.0 (ded5c06cf 2025-12-08)"\nCONFIG_BINDGEN_VERSION_TEXT="bindgen 0.71.1"\n' >"$tk/.config"
tc_make() { tout=$(cd "$scratch" && PATH="$scratch/tc-bin:$PATH" PEERMEM_SYSROOT=$scratch/tc-root make -s -C "$PEERMEM_ROOT" KDIR="$tk" LLVM=1 modules 2>&1); trc=$?; }

tc_make
if [ "$trc" != 0 ] && grep -q "no built Rust kernel crate (rust/libkernel.rmeta).*apt install linux-lib-rust-$trel rustc-1.92 bindgen-0.71" <<<"$tout"; then
	ok "make: headers without Rust metadata -> 'apt install linux-lib-rust-$trel rustc-1.92 bindgen-0.71'"
else notok "make: headers without Rust metadata (rc $trc): $tout"; fi

: >"$tk/rust/libkernel.rmeta"
tc_make
if [ "$trc" != 0 ] && grep -q "is not the \"rustc 1.92.0 (ded5c06cf 2025-12-08)\" that built KDIR.*apt install linux-lib-rust-$trel rustc-1.92" <<<"$tout"; then
	ok "make: the kernel's rustc 1.92 is not installed -> names rustc-1.92"
else notok "make: rustc mismatch (rc $trc): $tout"; fi

printf '#!/bin/sh\necho "rustc 1.92.0 (ded5c06cf 2025-12-08)"\n' >"$scratch/tc-bin/rustc-1.92"
chmod +x "$scratch/tc-bin/rustc-1.92"
tc_make
if [ "$trc" != 0 ] && ! grep -q 'rustc' <<<"$tout" && grep -q "no NVIDIA driver exports for kernel $trel" <<<"$tout"; then
	ok "make: takes Ubuntu's rustc-1.92 by itself (the next check, the NVIDIA symbols, is what stops it)"
else notok "make: versioned rustc (rc $trc): $tout"; fi

# The doctor judges the kernel's rustc as the Makefile does: the same
# version number with another --version text (another build of 1.92.0) is
# not the kernel's compiler for either of them.
mkdir -p "$scratch/tc-root/lib/modules/$trel" "$scratch/tc-bin2"
ln -sfn "$tk" "$scratch/tc-root/lib/modules/$trel/build"
printf '#!/bin/sh\necho "rustc 1.92.0 (0123456ab 2025-11-30)"\n' >"$scratch/tc-bin2/rustc-1.92"
chmod +x "$scratch/tc-bin2/rustc-1.92"
dout=$(PATH="$scratch/tc-bin2:$PATH" bash "$PEERMEM_ROOT/scripts/doctor.sh" --root "$scratch/tc-root" --release "$trel" 2>&1)
tout=$(cd "$scratch" && PATH="$scratch/tc-bin2:$PATH" PEERMEM_SYSROOT=$scratch/tc-root make -s -C "$PEERMEM_ROOT" KDIR="$tk" LLVM=1 RUSTC=rustc-1.92 modules 2>&1)
if grep -q '^FAIL  rustc: the kernel was built with rustc 1.92.0 (ded5c06cf 2025-12-08)' <<<"$dout" &&
	grep -q 'is not the "rustc 1.92.0 (ded5c06cf 2025-12-08)" that built KDIR' <<<"$tout"; then
	ok "doctor and make agree: rustc 1.92.0 of another build (another --version text) is not the kernel's compiler"
else
	notok "doctor and make disagree on a rustc of the same version, another build: doctor '$(grep 'rustc:' <<<"$dout")'; make '$(tail -n 1 <<<"$tout")'"
fi
