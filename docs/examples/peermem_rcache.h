/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * peermem_rcache.h - a minimal registration cache for GPU memory that
 * stays correct through peermem's revocation events (/dev/peermem,
 * include/uapi/peermem.h): no malloc/free hooks, no cudaFree hooks, no
 * munmap interposition. docs/applications.md explains it;
 * tests/guest/peermem/t_peermem_rcache.c runs it thousands of times.
 *
 * The idea (what UCX's rcache or Open MPI's mpool would do):
 *
 *   - Open /dev/peermem once and map its generation page.
 *   - Before using a cached MR, load the page's generation (one acquire
 *     load). Unchanged since the last look: nothing of this process was
 *     revoked, every cached MR is still good.
 *   - Changed: read the event records and drop every cached MR that
 *     overlaps a revoked range (an overflow record: drop them all), then
 *     remember the generation of the last record read.
 *   - Look the range up; on a miss register it (ibv_reg_mr) and cache it.
 *
 * peermem bumps the counter before it asks the core to invalidate an MR,
 * and for munmap/mremap/MAP_FIXED before the unmapping call returns, for
 * GPU frees before the free call returns: a thread that revoked memory and
 * then asks the cache never gets the stale MR. A revocation by another
 * thread that races the lookup can still make one RDMA fail with a remote
 * access error (as without the cache); the cache then finds the event on
 * its next look.
 *
 * Single-threaded and deliberately small: a fixed array, linear search.
 */
#ifndef PEERMEM_RCACHE_H
#define PEERMEM_RCACHE_H

#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../../include/uapi/peermem.h"

#ifndef RCACHE_MAX
#define RCACHE_MAX 64
#endif

struct rcache_entry {
	uintptr_t start;
	size_t len;
	struct ibv_mr *mr;	/* NULL: free slot */
};

struct rcache {
	struct ibv_pd *pd;
	int access;
	int fd;					/* /dev/peermem, non-blocking */
	const struct peermem_gen_page *page;	/* its generation page */
	uint64_t seen;				/* generation the cache is up to date with */
	struct rcache_entry e[RCACHE_MAX];
	/* statistics */
	unsigned long hits, misses, events, overflows, dropped;
};

/* Deregister and forget entry i. */
static void rcache_drop(struct rcache *rc, int i)
{
	ibv_dereg_mr(rc->e[i].mr);
	rc->e[i].mr = NULL;
	rc->dropped++;
}

static void rcache_flush(struct rcache *rc)
{
	for (int i = 0; i < RCACHE_MAX; i++)
		if (rc->e[i].mr)
			rcache_drop(rc, i);
}

/* 0, or -errno (no /dev/peermem: peermem not loaded, or events=0). */
static int rcache_init(struct rcache *rc, struct ibv_pd *pd, int access)
{
	void *p;

	memset(rc, 0, sizeof(*rc));
	rc->pd = pd;
	rc->access = access;
	rc->fd = open(PEERMEM_DEVICE_PATH, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	if (rc->fd < 0)
		return -errno;
	p = mmap(NULL, 4096, PROT_READ, MAP_SHARED, rc->fd, 0);
	if (p == MAP_FAILED) {
		int e = -errno;

		close(rc->fd);
		return e;
	}
	rc->page = p;
	if (rc->page->version != PEERMEM_EVENTS_VERSION ||
	    rc->page->event_size != sizeof(struct peermem_event)) {
		munmap(p, 4096);
		close(rc->fd);
		return -EPROTO;
	}
	rc->seen = __atomic_load_n(&rc->page->generation, __ATOMIC_ACQUIRE);
	return 0;
}

static void rcache_fini(struct rcache *rc)
{
	rcache_flush(rc);
	munmap((void *)rc->page, 4096);
	close(rc->fd);
}

/*
 * Bring the cache up to date: read every queued record and drop the MRs
 * they name. Cheap when nothing happened (one load).
 */
static void rcache_sync(struct rcache *rc)
{
	struct peermem_event ev[16];
	ssize_t n;

	if (__atomic_load_n(&rc->page->generation, __ATOMIC_ACQUIRE) == rc->seen)
		return;
	while ((n = read(rc->fd, ev, sizeof(ev))) > 0) {
		for (size_t k = 0; k < (size_t)n / sizeof(ev[0]); k++) {
			const struct peermem_event *v = &ev[k];

			rc->events++;
			if (v->generation > rc->seen)
				rc->seen = v->generation;
			if (v->cause == PEERMEM_CAUSE_OVERFLOW) {
				/* Records were lost: anything may be stale. */
				rc->overflows++;
				rcache_flush(rc);
				continue;
			}
			for (int i = 0; i < RCACHE_MAX; i++)
				if (rc->e[i].mr && rc->e[i].start < v->start + v->length &&
				    v->start < rc->e[i].start + rc->e[i].len)
					rcache_drop(rc, i);
		}
	}
	/* n < 0 with EAGAIN: drained. Records are queued before the counter
	 * moves, so rc->seen now covers the generation loaded above. */
}

/* The MR for [addr, addr + len): cached, or registered now (NULL: errno). */
static struct ibv_mr *rcache_get(struct rcache *rc, void *addr, size_t len)
{
	uintptr_t a = (uintptr_t)addr;
	int free_slot = -1;

	rcache_sync(rc);
	for (int i = 0; i < RCACHE_MAX; i++) {
		if (rc->e[i].mr && rc->e[i].start <= a && a + len <= rc->e[i].start + rc->e[i].len) {
			rc->hits++;
			return rc->e[i].mr;
		}
		if (!rc->e[i].mr && free_slot < 0)
			free_slot = i;
	}
	rc->misses++;
	if (free_slot < 0) {
		rcache_drop(rc, 0);	/* full: evict something (a real cache: LRU) */
		free_slot = 0;
	}
	rc->e[free_slot].mr = ibv_reg_mr(rc->pd, addr, len, rc->access);
	if (!rc->e[free_slot].mr)
		return NULL;
	rc->e[free_slot].start = a;
	rc->e[free_slot].len = len;
	return rc->e[free_slot].mr;
}

#endif /* PEERMEM_RCACHE_H */
