# SPDX-License-Identifier: GPL-2.0
# Common rules of the guest test directories (included by their Makefiles):
# every t_*.c is one program t_*, built on the host with warnings as errors
# and run in the rig VM. A Makefile sets LDLIBS and DEPS (the headers its
# programs include) first. KDIR and the other kernel-build variables
# tests/run-all.sh passes are accepted and ignored.

CC ?= gcc
CFLAGS ?= -O2 -g
CFLAGS += -Wall -Wextra -Werror -Wno-unused-function -std=gnu11
SRCS := $(wildcard t_*.c)
BINS := $(SRCS:.c=)
GUEST_DIR := $(dir $(lastword $(MAKEFILE_LIST)))

.PHONY: all clean
all: $(BINS)

t_%: t_%.c $(DEPS) $(GUEST_DIR)tap.h
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

# x_*.c: programs run on request or by a host test, never by the guest
# suite (tests/run-all.sh runs t_* only); the directory's Makefile says
# what they are for.
XBINS := $(patsubst %.c,%,$(wildcard x_*.c))
all: $(XBINS)
x_%: x_%.c $(DEPS) $(GUEST_DIR)tap.h
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

clean:
	rm -f $(BINS) $(XBINS)
