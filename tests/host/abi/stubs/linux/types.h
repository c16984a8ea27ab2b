/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Stand-in for <linux/types.h> used only to *enumerate* what a header
 * declares (names, field order, declared type spellings) without parsing
 * the whole kernel. Layouts and values are never taken from here: every
 * check is compiled against the real kernel tree with its own flags.
 */
#ifndef PEERMEM_ABI_STUB_LINUX_TYPES_H
#define PEERMEM_ABI_STUB_LINUX_TYPES_H
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef signed char s8;
typedef short s16;
typedef int s32;
typedef long long s64;
typedef u8 uint8_t;
typedef u16 uint16_t;
typedef u32 uint32_t;
typedef u64 uint64_t;
typedef s8 int8_t;
typedef s16 int16_t;
typedef s32 int32_t;
typedef s64 int64_t;
typedef unsigned long size_t;
typedef long ssize_t;
typedef _Bool bool;
typedef u64 dma_addr_t;
typedef u64 phys_addr_t;
#define NULL ((void *)0)
#endif
