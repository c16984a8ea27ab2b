# SPDX-License-Identifier: GPL-2.0
#
# Build peermem.ko against a kernel build tree.
#
#   make                      build against /lib/modules/$(uname -r)/build
#   make KDIR=/path/to/tree   build against another tree (its O= directory)
#   make modules_install      install (INSTALL_MOD_PATH=... honoured)
#   make clean
#
# Options: LLVM=... (default: what the tree was built with), PEERMEM_KUNIT=n
# (leave the KUnit tests out), V=1 (show commands).
#
# The kernel build itself reads ./Kbuild; this file only checks the tree
# and the toolchain, with one clear line per problem, and calls it.

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

kmake = $(MAKE) -C $(KDIR) M=$(PEERMEM_DIR) $(peermem-make-args)

# Each check stops make with one line saying what is wrong and what to do.
# (They are expanded only when a target that needs the tree runs.)
peermem-err = $(error peermem: $(1))
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
$(if $(wildcard $(KDIR)/rust/libkernel.rmeta),,$(call peermem-err,KDIR=$(KDIR) has CONFIG_RUST=y but no built Rust kernel crate (rust/libkernel.rmeta). Build that kernel first))
$(if $(shell command -v $(or $(RUSTC),rustc) 2>/dev/null),,$(call peermem-err,rustc not found. Install Rust (rustup) as for the kernel build; or set RUSTC=))
$(if $(shell command -v $(or $(BINDGEN),bindgen) 2>/dev/null),,$(call peermem-err,bindgen not found. Install it with 'cargo install --locked bindgen-cli' (scripts/setup-host.sh does it); or set BINDGEN=))
$(if $(call kconfig,CONFIG_RUSTC_VERSION_TEXT),$(if $(call streq,$(call kconfig,CONFIG_RUSTC_VERSION_TEXT),"$(shell $(or $(RUSTC),rustc) --version 2>/dev/null)"),,$(call peermem-err,$(shell $(or $(RUSTC),rustc) --version) is not the $(call kconfig,CONFIG_RUSTC_VERSION_TEXT) that built KDIR=$(KDIR); Rust modules need the same compiler. Use that rustc or rebuild the kernel)))
endef

.PHONY: all modules modules_install clean help
all: modules

modules:
	@: $(strip $(peermem-check-tree) $(peermem-check-rust))
	+$(kmake) modules

modules_install:
	@: $(strip $(peermem-check-tree))
	+$(kmake) modules_install

# Works without a kernel tree too.
clean:
ifneq ($(wildcard $(KDIR)/Makefile),)
	+$(kmake) clean
else
	@echo "peermem: KDIR=$(KDIR) not found; removing build outputs directly"
	cd $(PEERMEM_DIR) && rm -f peermem.ko peermem.o peermem.mod peermem.mod.c peermem.mod.o .module-common.o \
		Module.symvers modules.order rust/*.o .*.cmd rust/.*.cmd rust/.*.d
endif
	rm -f $(PEERMEM_DIR)/rust/ffi_generated.rs $(PEERMEM_DIR)/rust/ffi_generated.rs.tmp.*

help:
	@sed -n '3,14s/^# \{0,1\}//p' $(firstword $(MAKEFILE_LIST))
