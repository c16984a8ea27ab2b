/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * peermem.h - the user-space interface of /dev/peermem, peermem's
 * revocation event channel (docs/module.md, "Revocation events").
 *
 * A process opens /dev/peermem to learn when peermem revokes one of ITS OWN
 * GPU memory registrations (the GPU memory was freed, or the process
 * unmapped or moved the registered range). The open file is bound to the
 * opener's address space (its mm): only revocations of registrations made
 * by that address space are reported, and read() and mmap() from any
 * other address space (a forked child, a process the fd was passed to,
 * the opener after execve) fail with EPERM (poll() there reports POLLIN,
 * so that a waiter gets the error from read()).
 *
 * One user may hold at most event_files_per_user open files (a module
 * parameter, 1-65536, default 1024): open() fails with EMFILE beyond it.
 * Each open file's kernel memory is charged to the opener's memory cgroup.
 *
 * 1. The generation page. mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0)
 *    maps one read-only page laid out as struct peermem_gen_page. Its
 *    generation is 0 at open and is incremented by one for every revoked
 *    registration of the process, BEFORE peermem asks the peer-memory core
 *    to invalidate it (release store). Load it with acquire ordering
 *    (__atomic_load_n(&pg->generation, __ATOMIC_ACQUIRE)): a registration
 *    cache that sees the same value as at its last look knows nothing was
 *    revoked in between. The mapping must be exactly one page at offset 0,
 *    and never writable (PROT_WRITE, or a later mprotect to it, is refused
 *    with EPERM / EACCES); it is not inherited by fork(), and
 *    madvise(MADV_DOFORK) on it fails with EINVAL. Another process does
 *    not read it through the kernel either: a read of /proc/<pid>/mem or
 *    process_vm_readv() at the page fails (EIO, EFAULT).
 *
 * 2. The event queue. read(fd, buf, n) returns whole struct peermem_event
 *    records, oldest first: n must be a non-zero multiple of
 *    sizeof(struct peermem_event) (else EINVAL). It blocks until at least
 *    one record is queued (EAGAIN with O_NONBLOCK); poll() reports
 *    POLLIN | POLLRDNORM while one is. Each record carries the generation
 *    its revocation gave the counter, so records and counter agree: when the
 *    counter shows G, the record of generation G is already queued (or an
 *    overflow record of a generation >= G). Records come in generation
 *    order. An unmap while ibv_reg_mr() is still running is reported, if
 *    the registration survives it, before ibv_reg_mr() returns.
 *
 *    The queue holds a fixed number of records per open file
 *    (gen_page.queue_len, the event_queue_len module parameter). When a
 *    revocation finds it full, its record is dropped and the queue ends
 *    with one record of cause PEERMEM_CAUSE_OVERFLOW instead, whose
 *    generation is that of the last record dropped; later revocations are
 *    dropped into it until it is read. On an overflow record a cache must
 *    flush every registration (it cannot know which ones were revoked).
 *    A record read() could not copy to the buffer (EFAULT, or a short
 *    count) is lost too: it and every record queued after it are
 *    replaced by one overflow record of the newest generation.
 *
 * Every record but PEERMEM_CAUSE_OVERFLOW is one revoked registration,
 * whatever its cause: treat a cause this header does not name as a
 * revocation too (causes may be added without a version change).
 *
 * Layouts are fixed: fields only ever get added at the end of the page
 * header and in the reserved bytes, with PEERMEM_EVENTS_VERSION raised.
 * Check gen_page.version and gen_page.event_size before using records.
 */
#ifndef _UAPI_PEERMEM_H
#define _UAPI_PEERMEM_H

#include <linux/types.h>

/* The device node (a misc device, mode 0666, owner root). */
#define PEERMEM_DEVICE_PATH "/dev/peermem"

/* Version of this interface, in struct peermem_gen_page's version. */
#define PEERMEM_EVENTS_VERSION 1

/* Why a registration was revoked (struct peermem_event's cause). */
enum peermem_cause {
	/* The GPU memory was freed (cudaFree; the GPU driver's free callback). */
	PEERMEM_CAUSE_GPU_FREE = 1,
	/* The process unmapped the range: munmap, or mmap(MAP_FIXED) over it. */
	PEERMEM_CAUSE_UNMAP = 2,
	/* The process moved the range away with mremap. */
	PEERMEM_CAUSE_MOVE = 3,
	/*
	 * The process is exiting. Never delivered: the only readers of an
	 * address space's events are that address space's own threads, and
	 * none is left at its teardown (reserved for a future interface).
	 */
	PEERMEM_CAUSE_EXIT = 4,
	/*
	 * The driver that mapped the memory revoked it: for PFN-mapped memory
	 * (peermem's pfnmap parameter), the exporting driver zapped its
	 * mappings of the range (unmap_mapping_range, e.g. it reallocated its
	 * buffer). Never for GPU memory: the NVIDIA P2P free callback does not
	 * say why it runs, so every free callback is PEERMEM_CAUSE_GPU_FREE.
	 */
	PEERMEM_CAUSE_DRIVER = 5,
	/*
	 * The process changed the range's protection (mprotect). Only
	 * PFN-mapped registrations are revoked for it (peermem holds no
	 * reference on that memory, so it follows every change of the mapping).
	 */
	PEERMEM_CAUSE_PROTECT = 6,
	/*
	 * Not a revocation: the queue was full and records were dropped.
	 * Flush the whole registration cache. start, length and client are 0.
	 */
	PEERMEM_CAUSE_OVERFLOW = 0x100,
};

/* Length of struct peermem_event's client (the core's names are shorter). */
#define PEERMEM_CLIENT_NAME_LEN 64

/* One revocation, as read() returns it (96 bytes, 8-byte aligned). */
struct peermem_event {
	/* The counter's value right after this revocation. */
	__u64 generation;
	/* The registered range: the address and length given to ibv_reg_mr. */
	__u64 start;
	__u64 length;
	/* enum peermem_cause. */
	__u32 cause;
	/* 0 (reserved). */
	__u32 flags;
	/*
	 * The name of the peer-memory client that held the registration, as
	 * the core knows it (peermem's peer_name parameter, "nv_mem" by
	 * default), NUL-terminated and NUL-padded.
	 */
	char client[PEERMEM_CLIENT_NAME_LEN];
};

/* The page mmap() gives (4096 bytes; what follows the fields is 0). */
struct peermem_gen_page {
	/* Revocations of the process since the file was opened. Acquire-load it. */
	__u64 generation;
	/* PEERMEM_EVENTS_VERSION. */
	__u32 version;
	/* sizeof(struct peermem_event) */
	__u32 event_size;
	/* Records the queue holds before it overflows. */
	__u32 queue_len;
	__u32 reserved;
};

#endif /* _UAPI_PEERMEM_H */
