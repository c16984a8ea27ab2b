/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * libpeermem.h - a small, thread-safe client of /dev/peermem, peermem's
 * revocation event channel (<peermem/peermem.h>; docs/module.md,
 * "Revocation events"). man 3 libpeermem; docs/applications.md.
 *
 * A registration cache (UCX rcache, Open MPI grdma, libfabric's or NCCL's
 * MR cache) opens one channel per process and per cache:
 *
 *	struct peermem_channel *ch;
 *	int why;
 *	if (peermem_open(&ch, NULL, 0, &why) != 0)
 *		ch = NULL;		// no channel: keep your memory hooks
 *
 * before handing out a cached MR it asks, with one acquire load and no
 * system call, whether anything of this process was revoked since it last
 * looked:
 *
 *	if (peermem_changed(ch, cache->seen))
 *		peermem_drain(ch, &handlers, cache, 0, &cache->seen);
 *
 * and peermem_drain() calls handlers.revoked(cache, start, length, cause,
 * client) once per revoked registration, or handlers.flush(cache) once in
 * place of records that were lost (queue overflow): drop every cached MR.
 *
 * Errors are negative errno values. Every function may be called from any
 * thread; peermem_close() only when no other call on that channel runs or
 * will run (like free()). See "Threads" and "fork and exec" in the man page.
 */
#ifndef PEERMEM_LIBPEERMEM_H
#define PEERMEM_LIBPEERMEM_H

#include <stddef.h>
#include <stdint.h>

#include <peermem/peermem.h>	/* the channel's ABI (installed beside this file) */

#ifdef __cplusplus
extern "C" {
#endif

/* This header's version of the library (also peermem_version()). */
#define LIBPEERMEM_VERSION_MAJOR 1
#define LIBPEERMEM_VERSION_MINOR 0

/*
 * peermem_open() returned this (positive) value: there is no revocation
 * channel for this process: /dev/peermem is absent (peermem not loaded,
 * loaded with events=0, or nvidia-peermem), or open() refused (any errno,
 * e.g. EMFILE from a per-user limit, EACCES), or it is not a peermem
 * channel of a version this library reads (EPROTO). *reason says why.
 * Keep your memory hooks: the caller must not rely on the channel.
 */
#define PEERMEM_NO_CHANNEL 1

/* An opaque handle; one per open /dev/peermem file. */
struct peermem_channel;

/* Longest path peermem_open() accepts (including the NUL). */
#define PEERMEM_PATH_MAX 4096

/*
 * Open the channel. path: NULL for PEERMEM_DEVICE_PATH ("/dev/peermem"),
 * else another node (tests). flags: 0 (reserved).
 * Returns 0 and *chp, or PEERMEM_NO_CHANNEL with *chp = NULL and *reason
 * (if reason is not NULL) = -errno of the step that failed, or
 * -EINVAL (chp NULL, flags not 0, path empty), -ENAMETOOLONG (path of
 * PEERMEM_PATH_MAX bytes or more). The file is opened O_CLOEXEC.
 */
int peermem_open(struct peermem_channel **chp, const char *path,
		 unsigned int flags, int *reason);

/*
 * Close the channel: closes the file (unless its number was closed behind
 * the library and now names another file), unmaps the page, frees the
 * handle. NULL: nothing, 0. Not while another call on ch runs in any thread, nor
 * from a handler. In a forked child it closes the inherited descriptor
 * and frees the handle (the page was not inherited). Returns 0, or the
 * -errno of close() (the handle is freed anyway).
 */
int peermem_close(struct peermem_channel *ch);

/*
 * The channel's generation: the number of this process's revocations
 * since the channel was opened. One acquire load: lock-free, no system
 * call, async-signal-safe. On a lost channel (a forked child, below):
 * PEERMEM_GENERATION_LOST, which no cursor ever holds, so that
 * peermem_changed() is true and the caller goes to peermem_drain(), which
 * says -EPERM. ch NULL: PEERMEM_GENERATION_LOST.
 */
#define PEERMEM_GENERATION_LOST UINT64_MAX
uint64_t peermem_generation(const struct peermem_channel *ch);

/*
 * Anything revoked since the caller's cursor? cursor: a generation a
 * previous peermem_drain() stored (or peermem_generation() at start, for
 * a cache that was empty then). 0: no registration of this process was
 * revoked since; 1: drain. Same cost and guarantees as
 * peermem_generation() (ch NULL: 1).
 */
int peermem_changed(const struct peermem_channel *ch, uint64_t cursor);

/* How peermem_drain() hands records over. Both are required. */
struct peermem_handlers {
	/*
	 * One revoked registration: the range given to ibv_reg_mr, its cause
	 * (enum peermem_cause; treat a value you do not know as a revocation
	 * too), the peer-memory client that held it (NUL-terminated, valid
	 * during the call), and the generation the revocation gave the counter.
	 */
	void (*revoked)(void *arg, uint64_t start, uint64_t length,
			uint32_t cause, const char *client, uint64_t generation);
	/*
	 * Records were lost (the queue overflowed): any registration of the
	 * process may have been revoked. Drop every cached one. Called once
	 * in place of the lost records and of the records read with them.
	 */
	void (*flush)(void *arg);
};

/* Largest max_records peermem_drain() accepts (0 means no limit). */
#define PEERMEM_DRAIN_MAX (1u << 24)

/*
 * Read the queued records and hand each to handlers (in generation order),
 * reading at most max_records of them (0: until the queue is empty). Never blocks
 * on an empty queue. Calls on one channel are serialized (a mutex): a
 * second thread waits, then usually finds nothing left; the handlers run
 * in the draining thread with that mutex held and must not call
 * peermem_drain() or peermem_close() on the same channel (-EDEADLK).
 * One consumer per channel: every record goes to exactly one
 * peermem_drain() call, so all callers on a channel must pass handlers
 * that act on the same cache. Two caches: two channels.
 *
 * cursor (may be NULL): set to the generation the handlers have now seen
 * everything up to (use it with peermem_changed()); also when nothing was
 * read because another thread drained first.
 *
 * Returns the number of handler calls (an overflow's flush counts one), or
 * -EINVAL (ch or handlers or a handler NULL, max_records > PEERMEM_DRAIN_MAX),
 * -EPERM (the channel is lost: this process did not open it, i.e. a forked
 * child, or the descriptor was passed on; flush and keep your hooks, or
 * open a new channel), -EBADF (the descriptor was closed or replaced
 * behind the library: the channel is lost too), -EDEADLK (called from a
 * handler), -EPROTO (the kernel returned a short record), or another
 * -errno of read(). After an error other than -EINVAL and -EDEADLK no
 * record was lost unnoticed: the channel is marked lost and every later
 * call fails the same way.
 */
int peermem_drain(struct peermem_channel *ch,
		  const struct peermem_handlers *handlers, void *arg,
		  unsigned int max_records, uint64_t *cursor);

/*
 * The channel's file descriptor for poll/select/epoll: readable (POLLIN)
 * while records are queued (also on a lost channel, so that the waiter
 * calls peermem_drain() and gets the error). Do not read, close or dup2
 * over it: peermem_close() closes it. -EINVAL if ch is NULL.
 */
int peermem_fd(const struct peermem_channel *ch);

/*
 * Wait up to timeout_ms (-1: forever, 0: just look, at most
 * PEERMEM_WAIT_MAX_MS) for queued records: 1 if there are some (or the
 * channel is lost: drain to learn it), 0 on timeout, -EINVAL (ch NULL,
 * timeout out of range), -EINTR, or another -errno of poll().
 */
#define PEERMEM_WAIT_MAX_MS (24 * 3600 * 1000)
int peermem_wait(const struct peermem_channel *ch, int timeout_ms);

/* What peermem_info() reports (fields are only ever added at the end). */
struct peermem_info {
	uint32_t version;	/* the page's version (PEERMEM_EVENTS_VERSION) */
	uint32_t queue_len;	/* records the kernel queues before it overflows */
	uint64_t generation;	/* peermem_generation() now */
	uint64_t seen;		/* generation the handlers have seen up to */
	uint64_t records;	/* revocation records handed to handlers */
	uint64_t overflows;	/* overflow records read */
	uint64_t flushes;	/* flush handler calls */
	uint64_t skipped;	/* records read together with an overflow, not handed over */
	uint64_t drains;	/* peermem_drain() calls that read the queue */
	int32_t lost;		/* 0, or the -errno that made the channel lost */
	uint32_t reserved;
};

/*
 * Copy the channel's state into *info. size: sizeof(struct peermem_info)
 * of the caller's header, from 8 to 4096 bytes (a shorter one gets the
 * first size bytes, a longer one zeros after what this library knows).
 * Returns 0, or -EINVAL (ch or info NULL, size out of range).
 */
int peermem_info(const struct peermem_channel *ch, struct peermem_info *info,
		 size_t size);

/* The library's version, major * 1000 + minor (runtime check). */
int peermem_version(void);

#ifdef __cplusplus
}
#endif

#endif /* PEERMEM_LIBPEERMEM_H */
