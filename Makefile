# SPDX-License-Identifier: GPL-2.0
#
# Build peermem.ko against a kernel build tree.
#
#   make                      build against /lib/modules/$(uname -r)/build
#   make KDIR=/path/to/tree   build against another tree (its O= directory)
#   make modules_install      install (INSTALL_MOD_PATH=... honoured)
#   make clean
#   make symvers              say which Module.symvers a build would use
#   make dkms-install         install with DKMS for every Rust kernel (root):
#                             the drop-in nvidia_peermem, loaded at boot;
#                             DROPIN=0 for peermem.ko, BOOT_LOAD=0, KERNELS="rel ...";
#                             make dkms-uninstall removes it
#   make deb                  the DKMS package dist/peermem-dkms_<ver>_all.deb
#                             (the same choices as dkms-install), and
#                             libpeermem1 / libpeermem-dev (lib/deb.sh)
#   make lib                  libpeermem, the user-space client of /dev/peermem
#                             (make -C lib install DESTDIR=... PREFIX=/usr)
#   make doctor               check this machine (scripts/doctor.sh)
#   make dropin               build the drop-in (below) into dropin/, a copy
#                             of the sources, beside ./peermem.ko (the tests
#                             load both)
#
# Options: LLVM=... (default: what the tree was built with), PEERMEM_KUNIT=n
# (leave the KUnit tests out), V=1 (show commands).
#
# DROPIN=1 builds the module under the name nvidia_peermem (nvidia_peermem.ko,
# /sys/module/nvidia_peermem/version), the name of NVIDIA's nvidia-peermem.
# NCCL, UCX, UCC and NVSHMEM look for that path to decide that GPUDirect RDMA
# works; on an OFED built for a current kernel (no /sys/kernel/mm/memory_peers)
# it is the only thing that satisfies them. Use it instead of nvidia-peermem,
# never beside it: the kernel refuses to load a second module of the same name
# (insmod: File exists). The tree holds one variant: switching removes the
# other .ko. Give DROPIN=1 to modules_install too. Default of `make`:
# peermem.ko (the rig's tests load it by that name); default of
# `make dkms-install`: the drop-in, what a GPU server wants.
#
# peermem links directly against two other modules' exports, resolved by
# modpost from their Module.symvers (so a mismatch is a build error, not an
# "Unknown symbol" or "disagrees about version of symbol" at load):
#   NV_SYMVERS=FILE    Module.symvers of the GPU driver (nvidia.ko) or of
#                      the rig's gpusim. Default: tests/gpusim/Module.symvers
#                      if gpusim is built for KDIR, else what
#                      `scripts/find-symvers.sh nvidia` finds (NVIDIA's DKMS
#                      build dir, /usr/src/nvidia-<ver>, or entries derived
#                      from the installed nvidia.ko; see that script).
#   OFED_SYMVERS=FILE  Module.symvers of MLNX_OFED/DOCA-OFED's ib_uverbs or
#                      ib_core, for kernels without the peer-memory core.
#                      Default: none if KDIR/Module.symvers exports
#                      ib_register_peer_memory_client, else what
#                      `scripts/find-symvers.sh ofed` finds
#                      (/usr/src/ofa_kernel{-dkms}/<arch>/<release>, ...,
#                      a `default` only if it belongs to KDIR's release, or
#                      entries derived from the installed ib_uverbs.ko/ib_core.ko).
#   PEERMEM_UNRESOLVED_OK=1  build even if either is missing (a compile
#                      check, e.g. against a plain 6.12 kernel: the module
#                      then does not load). PEERMEM_ALLOW_UNRESOLVED=1 is
#                      the same.
#
# The kernel build itself reads ./Kbuild; this file checks the tree, the
# toolchain and those symbols, with one clear line per problem, and calls it.

KDIR ?= /lib/modules/$(shell uname -r)/build
# Expand KDIR only once.
override KDIR := $(patsubst %/,%,$(KDIR))

PEERMEM_DIR := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))

kconfig = $(shell sed -n 's/^$(1)=//p' $(KDIR)/.config 2>/dev/null)

# LLVM: modules must be built with the compiler the kernel was built with.
# Our rig records its make arguments (e.g. LLVM=-19) in the tree; any other
# clang-built tree gets LLVM=1, or LLVM=-<major> when only clang-<major>
# exists. An explicit LLVM=... on the command line wins.
ifeq ($(origin LLVM),undefined)
  ifneq ($(wildcard $(KDIR)/.peermem-make-args),)
    peermem-make-args := $(strip $(shell cat $(KDIR)/.peermem-make-args))
  else ifeq ($(call kconfig,CONFIG_CC_IS_CLANG),y)
    clang-major := $(shell echo $$(( $(or $(call kconfig,CONFIG_CLANG_VERSION),0) / 10000 )))
    ifneq ($(shell command -v clang-$(clang-major) 2>/dev/null),)
      ifeq ($(shell command -v clang 2>/dev/null),)
        peermem-make-args := LLVM=-$(clang-major)
      else ifeq ($(shell clang -dumpversion 2>/dev/null | cut -d. -f1),$(clang-major))
        peermem-make-args := LLVM=1
      else
        peermem-make-args := LLVM=-$(clang-major)
      endif
    else
      peermem-make-args := LLVM=1
    endif
  endif
endif

# dkms appends CC=clang LD=ld.lld for a kernel built with clang/lld; where
# the kernel's LLVM has a version suffix (LLVM=-19: clang-19, no plain clang
# installed), those names must carry it too.
llvm-suffix := $(patsubst LLVM=%,%,$(filter LLVM=-%,$(peermem-make-args) $(if $(filter command line,$(origin LLVM)),LLVM=$(LLVM))))
ifneq ($(llvm-suffix),)
  ifeq ($(origin CC)$(CC),command lineclang)
    peermem-make-args += CC=clang$(llvm-suffix)
  endif
  ifeq ($(origin LD)$(LD),command lineld.lld)
    peermem-make-args += LD=ld.lld$(llvm-suffix)
  endif
endif

# Rust toolchain: modules need the very rustc (and a bindgen of the same
# version) that built the kernel. Ubuntu installs those under versioned names
# (rustc-1.92, bindgen-0.71, packages of the same names); when RUSTC/BINDGEN
# are not given and the plain `rustc`/`bindgen` is another version, the
# versioned one is used if it is installed.
kernel-rustc-text := $(subst ",,$(call kconfig,CONFIG_RUSTC_VERSION_TEXT))
kernel-bindgen-text := $(subst ",,$(call kconfig,CONFIG_BINDGEN_VERSION_TEXT))
rustc-mm := $(shell echo '$(word 2,$(kernel-rustc-text))' | cut -d. -f1-2)
bindgen-mm := $(shell echo '$(word 2,$(kernel-bindgen-text))' | cut -d. -f1-2)
ifeq ($(origin RUSTC),undefined)
  ifneq ($(rustc-mm),)
    ifneq ($(shell rustc --version 2>/dev/null),$(kernel-rustc-text))
      ifneq ($(shell command -v rustc-$(rustc-mm) 2>/dev/null),)
        RUSTC := rustc-$(rustc-mm)
        peermem-make-args += RUSTC=$(RUSTC)
      endif
    endif
  endif
endif
ifeq ($(origin BINDGEN),undefined)
  ifneq ($(bindgen-mm),)
    ifneq ($(word 2,$(shell bindgen --version 2>/dev/null)),$(word 2,$(kernel-bindgen-text)))
      ifneq ($(shell command -v bindgen-$(bindgen-mm) 2>/dev/null),)
        BINDGEN := bindgen-$(bindgen-mm)
        peermem-make-args += BINDGEN=$(BINDGEN)
      endif
    endif
  endif
endif
# The packages that give a distribution kernel's headers what a Rust module
# build needs (named in the errors below).
rust-pkg-hint = Ubuntu: apt install linux-lib-rust-$(kernel-release) $(if $(rustc-mm),rustc-$(rustc-mm)) $(if $(bindgen-mm),bindgen-$(bindgen-mm))

# ---- The symbols peermem links against (see the top of this file)

# has-symbol FILE SYMBOL: y if FILE is a Module.symvers exporting SYMBOL.
has-symbol = $(if $(wildcard $(1)),$(shell grep -qs '^[^	]*	$(2)	' $(1) && echo y))
kernel-release := $(shell cat $(KDIR)/include/config/kernel.release 2>/dev/null)

# The rig's gpusim only if its module was built for this kernel; else
# scripts/find-symvers.sh, which knows the layouts NVIDIA's and OFED's
# packages leave, checks that what it finds was built for this kernel release
# and architecture, and derives the entries from the installed nvidia.ko /
# ib_uverbs.ko / ib_core.ko when no Module.symvers exists (written under
# .symvers/<release>/). It runs at most once per make, and only for targets
# that build.
gpusim-dir := $(PEERMEM_DIR)/tests/gpusim
gpusim-release = $(shell modinfo -F vermagic $(gpusim-dir)/gpusim.ko 2>/dev/null | cut -d' ' -f1)
gpusim-symvers = $(if $(wildcard $(gpusim-dir)/gpusim.ko),$(if $(call streq,$(gpusim-release),$(kernel-release)),$(if $(call has-symbol,$(gpusim-dir)/Module.symvers,nvidia_p2p_get_pages),$(gpusim-dir)/Module.symvers)))
find-symvers = $(shell bash $(PEERMEM_DIR)/scripts/find-symvers.sh --kdir $(KDIR) --out $(PEERMEM_DIR)/.symvers/$(kernel-release) $(1))
nv-found = $(eval nv-found := $$(call find-symvers,nvidia))$(nv-found)
ofed-found = $(eval ofed-found := $$(call find-symvers,ofed))$(ofed-found)
found-error = $(filter error:,$(firstword $(1)))
nv-symvers = $(or $(NV_SYMVERS),$(gpusim-symvers),$(if $(call found-error,$(nv-found)),,$(nv-found)))

core-symbol := ib_register_peer_memory_client
core-in-kernel = $(call has-symbol,$(KDIR)/Module.symvers,$(core-symbol))
ofed-symvers = $(or $(OFED_SYMVERS),$(if $(core-in-kernel),,$(if $(call found-error,$(ofed-found)),,$(ofed-found))))

allow-unresolved := $(filter 1 y yes,$(PEERMEM_UNRESOLVED_OK) $(PEERMEM_ALLOW_UNRESOLVED))
unresolved-hint = PEERMEM_UNRESOLVED_OK=1 builds anyway as a compile check (that module will not load)

define peermem-check-symbols
$(if $(NV_SYMVERS),$(if $(wildcard $(NV_SYMVERS)),,$(call peermem-err,NV_SYMVERS=$(NV_SYMVERS) does not exist. Pass the Module.symvers of the built NVIDIA driver or of tests/gpusim)))
$(if $(NV_SYMVERS),$(if $(call has-symbol,$(NV_SYMVERS),nvidia_p2p_get_pages),,$(call peermem-err,NV_SYMVERS=$(NV_SYMVERS) does not export nvidia_p2p_get_pages: it is not the Module.symvers of nvidia.ko or gpusim.ko)))
$(if $(OFED_SYMVERS),$(if $(call has-symbol,$(OFED_SYMVERS),$(core-symbol)),,$(call peermem-err,OFED_SYMVERS=$(OFED_SYMVERS) does not export $(core-symbol): pass the Module.symvers of MLNX_OFED/DOCA-OFED's ib_core (e.g. /usr/src/ofa_kernel/default/Module.symvers))))
$(if $(allow-unresolved),,$(if $(nv-symvers),,$(call peermem-err,$(patsubst error:%,%,$(nv-found)). In the rig: make -C tests/gpusim KDIR=$(KDIR); $(unresolved-hint))))
$(if $(allow-unresolved),,$(if $(ofed-symvers)$(core-in-kernel),,$(call peermem-err,$(patsubst error:%,%,$(ofed-found)). In the rig: build against its kernel (scripts/kernel.sh); $(unresolved-hint))))
endef

extra-symbols = $(strip $(nv-symvers) $(ofed-symvers))
# The module's name (Kbuild reads PEERMEM_DROPIN); the other variant's .ko
# is removed when a build switches, so that no stale module is left beside.
dropin := $(filter 1 y yes,$(DROPIN))
modname := $(if $(dropin),nvidia_peermem,peermem)
other-modname := $(if $(dropin),peermem,nvidia_peermem)

kmake-base = $(MAKE) -C $(KDIR) M=$(PEERMEM_DIR) $(peermem-make-args) \
	$(if $(dropin),PEERMEM_DROPIN=1)
kmake = $(kmake-base) \
	$(if $(extra-symbols),KBUILD_EXTRA_SYMBOLS="$(extra-symbols)") \
	$(if $(allow-unresolved),KBUILD_MODPOST_WARN=1)

# Each check stops make with one line saying what is wrong and what to do.
# (They are expanded only when a target that needs the tree runs.)
peermem-err = $(error peermem: $(strip $(1)))
streq = $(if $(subst x$(1),,x$(2))$(subst x$(2),,x$(1)),,y)
define peermem-check-tree
$(if $(wildcard $(KDIR)/Makefile),,$(call peermem-err,KDIR=$(KDIR) is not a kernel build tree (no Makefile there). Install the kernel headers or pass KDIR=/path/to/built/kernel))
$(if $(wildcard $(KDIR)/.config),,$(call peermem-err,KDIR=$(KDIR) is not configured (no .config). Configure and build that kernel first))
$(if $(wildcard $(KDIR)/include/generated/autoconf.h),,$(call peermem-err,KDIR=$(KDIR) is not prepared (no include/generated/autoconf.h). Run 'make modules_prepare' or build it))
$(if $(wildcard $(KDIR)/scripts/mod/modpost),,$(call peermem-err,KDIR=$(KDIR) has no scripts/mod/modpost. Run 'make modules_prepare' or build it))
$(if $(wildcard $(KDIR)/Module.symvers),,$(call peermem-err,KDIR=$(KDIR) has no Module.symvers: the kernel there is not built (completely). Build it first))
endef
define peermem-check-rust
$(if $(filter y,$(call kconfig,CONFIG_RUST)),,$(call peermem-err,the kernel in KDIR=$(KDIR) is built without Rust (CONFIG_RUST is not y). peermem is a Rust module: use a CONFIG_RUST=y kernel (scripts/kernel.sh builds one)))
$(if $(wildcard $(KDIR)/rust/libkernel.rmeta),,$(call peermem-err,KDIR=$(KDIR) has CONFIG_RUST=y but no built Rust kernel crate (rust/libkernel.rmeta): the headers lack the Rust metadata ($(rust-pkg-hint); a self-built kernel: build it, or install its headers with the rust/ directory)))
$(if $(shell command -v $(or $(RUSTC),rustc) 2>/dev/null),,$(call peermem-err,$(or $(RUSTC),rustc) not found: the kernel was built with $(or $(kernel-rustc-text),rustc). Install that version ($(rust-pkg-hint); elsewhere rustup) or set RUSTC=))
$(if $(shell command -v $(or $(BINDGEN),bindgen) 2>/dev/null),,$(call peermem-err,$(or $(BINDGEN),bindgen) not found$(if $(kernel-bindgen-text), (the kernel used $(kernel-bindgen-text))). Install it ($(rust-pkg-hint); elsewhere 'cargo install --locked bindgen-cli'; scripts/setup-host.sh does it) or set BINDGEN=))
$(if $(call kconfig,CONFIG_RUSTC_VERSION_TEXT),$(if $(call streq,$(call kconfig,CONFIG_RUSTC_VERSION_TEXT),"$(shell $(or $(RUSTC),rustc) --version 2>/dev/null)"),,$(call peermem-err,$(shell $(or $(RUSTC),rustc) --version) is not the $(call kconfig,CONFIG_RUSTC_VERSION_TEXT) that built KDIR=$(KDIR); Rust modules need the same compiler. Install it ($(rust-pkg-hint); elsewhere rustup toolchain install $(word 2,$(kernel-rustc-text))) and pass RUSTC= if it has another name, or rebuild the kernel)))
endef

.PHONY: all modules modules_install clean help dropin symvers dkms-install dkms-uninstall doctor deb lib
all: modules

modules:
	@: $(strip $(peermem-check-tree) $(peermem-check-rust) $(peermem-check-symbols))
	@echo "peermem: nvidia_p2p_* from $(or $(nv-symvers),nowhere (unresolved)); $(core-symbol) from $(or $(ofed-symvers),$(if $(core-in-kernel),the kernel (KDIR/Module.symvers),nowhere (unresolved)))"
	@rm -f $(addprefix $(PEERMEM_DIR)/$(other-modname),.ko .o .mod .mod.c .mod.o)
	+$(kmake) modules

# The drop-in beside the default module: a copy of the module's sources in
# dropin/ (like a DKMS source tree), built there with DROPIN=1, so both
# ./peermem.ko and dropin/nvidia_peermem.ko exist. The symbols are resolved
# here (the copy has no tests/gpusim) and passed on.
dropin-dir := $(PEERMEM_DIR)/dropin
dropin-src := Kbuild Makefile scripts/bindgen.sh \
	$(filter-out rust/ffi_generated.rs,$(patsubst $(PEERMEM_DIR)/%,%,$(wildcard $(PEERMEM_DIR)/rust/*.rs $(PEERMEM_DIR)/rust/*/*.rs $(PEERMEM_DIR)/rust/*/*/*.rs $(PEERMEM_DIR)/rust/*.c $(PEERMEM_DIR)/include/*.h $(PEERMEM_DIR)/include/uapi/*.h)))
dropin:
	@: $(strip $(peermem-check-tree) $(peermem-check-rust) $(peermem-check-symbols))
	@mkdir -p $(dropin-dir)/rust/client $(dropin-dir)/rust/kapi $(dropin-dir)/include/uapi $(dropin-dir)/scripts
	@cd $(PEERMEM_DIR) && for f in $(dropin-src); do cmp -s $$f $(dropin-dir)/$$f || { mkdir -p $(dropin-dir)/$$(dirname $$f) && cp -p $$f $(dropin-dir)/$$f; } || exit 1; done
	@# Sources the tree no longer has (a file moved) must not stay in the copy.
	@cd $(dropin-dir) && for f in $$(find rust include -name '*.rs' -o -name '*.c' -o -name '*.h'); do \
		case " $(dropin-src) rust/ffi_generated.rs " in *" $$f "*) ;; *) rm -f $$f ;; esac; done
	+$(MAKE) -C $(dropin-dir) KDIR=$(KDIR) DROPIN=1 \
		$(if $(nv-symvers),NV_SYMVERS=$(nv-symvers)) $(if $(ofed-symvers),OFED_SYMVERS=$(ofed-symvers)) modules

# Say which Module.symvers a build would use (or why there is none).
symvers:
	@: $(strip $(peermem-check-symbols))
	@echo "peermem: nvidia_p2p_* from $(or $(nv-symvers),nowhere (unresolved)); $(core-symbol) from $(or $(ofed-symvers),$(if $(core-in-kernel),the kernel (KDIR/Module.symvers),nowhere (unresolved)))"

modules_install:
	@: $(strip $(peermem-check-tree))
	+$(kmake-base) modules_install

# DKMS (docs/install.md): builds for every installed Rust kernel now and for
# each new one; DROPIN=1 installs the drop-in. KERNELS="rel ..." limits the
# kernels built now. As root.
dkms-install:
	bash $(PEERMEM_DIR)/scripts/dkms.sh install $(if $(filter 0 n no,$(DROPIN)),--peermem,--dropin) $(if $(filter 0 n no,$(BOOT_LOAD)),--no-boot-load) $(foreach k,$(KERNELS),--kernel $(k))
dkms-uninstall:
	bash $(PEERMEM_DIR)/scripts/dkms.sh uninstall

# The DKMS package: dist/peermem-dkms_<version>_all.deb (scripts/deb.sh;
# DROPIN=0 and BOOT_LOAD=0 as for dkms-install). Install it with
# `sudo apt install ./dist/peermem-dkms_<version>_all.deb`.
deb:
	@bash $(PEERMEM_DIR)/scripts/deb.sh --out $(PEERMEM_DIR)/dist $(if $(filter 0 n no,$(DROPIN)),--peermem) $(if $(filter 0 n no,$(BOOT_LOAD)),--no-boot-load)
	@bash $(PEERMEM_DIR)/lib/deb.sh --out $(PEERMEM_DIR)/dist

# libpeermem (lib/Makefile: lib/build/, make -C lib install).
lib:
	+$(MAKE) -C $(PEERMEM_DIR)/lib

# Read-only checks of this machine for peermem (docs/troubleshooting.md).
doctor:
	@bash $(PEERMEM_DIR)/scripts/doctor.sh

# Works without a kernel tree too.
clean:
ifneq ($(wildcard $(KDIR)/Makefile),)
	+$(kmake-base) clean
else
	@echo "peermem: KDIR=$(KDIR) not found; removing build outputs directly"
	cd $(PEERMEM_DIR) && rm -f $(foreach m,peermem nvidia_peermem,$(m).ko $(m).o $(m).mod $(m).mod.c $(m).mod.o) .module-common.o \
		Module.symvers modules.order rust/*.o .*.cmd rust/.*.cmd rust/.*.d
endif
	rm -f $(PEERMEM_DIR)/rust/ffi_generated.rs $(PEERMEM_DIR)/rust/ffi_generated.rs.tmp.*
	rm -rf $(PEERMEM_DIR)/dropin $(PEERMEM_DIR)/.symvers

help:
	@sed -n '3,/^$$/s/^# \{0,1\}//p' $(firstword $(MAKEFILE_LIST))
