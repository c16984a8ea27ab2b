/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * peermem_mtcache.h - a registration cache for GPU memory that many threads
 * use at once, kept correct by peermem's revocation events through
 * libpeermem (<peermem/libpeermem.h>, man 3 libpeermem): no malloc, free,
 * munmap or cudaFree hooks. docs/applications.md explains it;
 * tests/guest/lib/t_lib_mtcache runs it against GPU frees, munmap, mremap
 * and mmap(MAP_FIXED) done by other threads.
 *
 *   mtc_init(&c, pd, access, max_entries)  opens the channel (or runs
 *                                          uncached if there is none)
 *   e = mtc_get(&c, addr, len)             a registration covering the
 *                                          range, referenced; e->mr
 *   mtc_put(&c, e)                         done with it
 *   mtc_fini(&c)
 *
 * Entries live in an interval tree (peermem_itree.h): lookups and the
 * invalidation of a revoked range are O(log n + k). One mutex protects the
 * tree; the channel's drain runs under it, so the handlers (which take
 * entries out of the tree) need no lock of their own. Under the mutex:
 *
 *   - every get first asks peermem_changed() (one acquire load) and, if
 *     anything was revoked, drains the records into the tree;
 *   - a miss on a range a PENDING entry (another thread registering it)
 *     covers waits for that registration instead of making a second MR;
 *   - a miss inserts a PENDING entry, drops the mutex for ibv_reg_mr, takes
 *     it again and drains: a revocation of the new MR that another thread
 *     drained meanwhile found the pending entry and marked it stale, so
 *     the MR is thrown away and the registration retried (without the
 *     pending entry that record would have found nothing to drop, and the
 *     cache would keep a revoked MR);
 *   - an entry taken out of the tree while a thread holds it (mtc_get
 *     without mtc_put yet) is deregistered at the last mtc_put, so a
 *     thread never sees its MR freed under it.
 *
 * What the channel does not do: a revocation by another thread that lands
 * between mtc_get and the RDMA makes that RDMA fail (as without a cache);
 * the next mtc_get drops the MR. Without a channel (peermem_open said
 * PEERMEM_NO_CHANNEL) nothing is cached: every mtc_get registers, every
 * last mtc_put deregisters (a real cache keeps its memory hooks instead).
 */
#ifndef PEERMEM_MTCACHE_H
#define PEERMEM_MTCACHE_H

#include <errno.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <peermem/libpeermem.h>
#include "peermem_itree.h"

struct mtc_entry {
	struct itree_node node;			/* the registered range */
	struct ibv_mr *mr;			/* NULL while PENDING */
	unsigned int refs;			/* mtc_get()s not yet put */
	int in_tree, stale;
	struct mtc_entry *prev, *next;		/* LRU of ready entries in the tree */
};

struct mtcache {
	pthread_mutex_t lock;
	pthread_cond_t registered;		/* a PENDING entry was resolved */
	struct itree tree;
	struct mtc_entry lru;			/* list head: lru.next most recent */
	struct peermem_channel *ch;		/* NULL: no channel, nothing cached */
	uint64_t seen;				/* generation the tree is up to date with */
	struct ibv_pd *pd;
	int access;
	size_t max_entries, ready;
	int no_check;				/* tests: trust the tree without looking */
	/* statistics (under lock) */
	unsigned long hits, misses, records, flushes, dropped, evicted, retries,
		uncached, drain_errors, waits;
};

static void mtc_free_entry_(struct mtc_entry *e)
{
	if (e->mr)
		ibv_dereg_mr(e->mr);
	free(e);
}

/* Take e out of the tree (its MR goes now, or at its last put). */
static void mtc_drop_(struct mtcache *c, struct mtc_entry *e)
{
	itree_remove(&c->tree, &e->node);
	e->in_tree = 0;
	if (e->mr) {
		e->prev->next = e->next;
		e->next->prev = e->prev;
		c->ready--;
	}
	c->dropped++;
	if (e->mr && !e->refs)
		mtc_free_entry_(e);
	else
		e->stale = 1;	/* pending: its registering thread discards it */
}

static void mtc_on_revoked_(void *arg, uint64_t start, uint64_t length, uint32_t cause,
			    const char *client, uint64_t generation)
{
	struct mtcache *c = arg;
	struct itree_node *n;

	(void)cause;	/* every cause but an overflow is a revocation */
	(void)client;
	(void)generation;
	c->records++;
	if (start + length < start)
		length = UINT64_MAX - start;
	while ((n = itree_first_overlap(&c->tree, start, start + length)))
		mtc_drop_(c, (struct mtc_entry *)n);
}

static void mtc_on_flush_(void *arg)
{
	struct mtcache *c = arg;

	c->flushes++;
	while (c->tree.root)
		mtc_drop_(c, (struct mtc_entry *)c->tree.root);
}

static const struct peermem_handlers mtc_handlers_ = {
	.revoked = mtc_on_revoked_,
	.flush = mtc_on_flush_,
};

/* Bring the tree up to date with the channel (under c->lock). */
static void mtc_sync_locked_(struct mtcache *c)
{
	if (!c->ch || !peermem_changed(c->ch, c->seen))
		return;
	if (peermem_drain(c->ch, &mtc_handlers_, c, 0, &c->seen) < 0) {
		/* Lost (a forked child) or broken: nothing cached can be trusted. */
		c->drain_errors++;
		mtc_on_flush_(c);
		peermem_close(c->ch);
		c->ch = NULL;
	}
}

/*
 * 0: caching with the channel; PEERMEM_NO_CHANNEL: running uncached
 * (*reason says why); -EINVAL: bad arguments (max_entries 1 to 1<<20).
 */
static int mtc_init(struct mtcache *c, struct ibv_pd *pd, int access, size_t max_entries,
		    int *reason)
{
	int r;

	if (!c || !pd || !max_entries || max_entries > (1u << 20))
		return -EINVAL;
	memset(c, 0, sizeof(*c));
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->registered, NULL);
	c->lru.next = c->lru.prev = &c->lru;
	c->pd = pd;
	c->access = access;
	c->max_entries = max_entries;
	r = peermem_open(&c->ch, NULL, 0, reason);
	if (r == 0)
		c->seen = peermem_generation(c->ch);
	return r;
}

struct mtc_want_ {
	uint64_t start, end;
	struct mtc_entry *found;
};

/* A ready entry covering the whole wanted range. */
static int mtc_covers_(struct itree_node *n, void *arg)
{
	struct mtc_want_ *w = arg;
	struct mtc_entry *e = (struct mtc_entry *)n;

	if (e->mr && n->start <= w->start && w->end <= n->end) {
		w->found = e;
		return 1;
	}
	return 0;
}

/* A PENDING entry covering the wanted range (being registered by another thread). */
static int mtc_pending_(struct itree_node *n, void *arg)
{
	struct mtc_want_ *w = arg;

	return !((struct mtc_entry *)n)->mr && n->start <= w->start && w->end <= n->end;
}

/* Evict least recently used entries nobody holds until within max_entries. */
static void mtc_evict_locked_(struct mtcache *c)
{
	struct mtc_entry *e = c->lru.prev;

	while (c->ready > c->max_entries && e != &c->lru) {
		struct mtc_entry *p = e->prev;

		if (!e->refs) {
			c->evicted++;
			mtc_drop_(c, e);
		}
		e = p;
	}
}

/*
 * A registration covering [addr, addr + len), held until mtc_put(): from
 * the tree, or registered now. NULL with errno set: EINVAL (len 0 or the
 * range wraps), what ibv_reg_mr said, or EAGAIN (revoked at every one of
 * 8 attempts).
 */
static struct mtc_entry *mtc_get(struct mtcache *c, void *addr, size_t len)
{
	struct mtc_want_ want = { .start = (uintptr_t)addr, .end = (uintptr_t)addr + len };
	struct mtc_entry *e;

	if (!len || want.end < want.start) {
		errno = EINVAL;
		return NULL;
	}
	pthread_mutex_lock(&c->lock);
again:
	if (!c->no_check)
		mtc_sync_locked_(c);
	if (c->ch) {
		if (itree_visit(&c->tree, want.start, want.end, mtc_pending_, &want)) {
			/* Another thread registers it: one MR, not two. */
			c->waits++;
			pthread_cond_wait(&c->registered, &c->lock);
			goto again;
		}
		if (itree_visit(&c->tree, want.start, want.end, mtc_covers_, &want)) {
			e = want.found;
			e->refs++;
			/* most recently used first */
			e->prev->next = e->next;
			e->next->prev = e->prev;
			e->next = c->lru.next;
			e->prev = &c->lru;
			c->lru.next->prev = e;
			c->lru.next = e;
			c->hits++;
			pthread_mutex_unlock(&c->lock);
			return e;
		}
	}
	c->misses++;
	for (int attempt = 0; attempt < 8; attempt++) {
		struct ibv_mr *mr;
		int err;

		e = calloc(1, sizeof(*e));
		if (!e) {
			pthread_mutex_unlock(&c->lock);
			errno = ENOMEM;
			return NULL;
		}
		e->node.start = want.start;
		e->node.end = want.end;
		e->refs = 1;
		if (c->ch) {
			itree_insert(&c->tree, &e->node);	/* PENDING */
			e->in_tree = 1;
		} else {
			c->uncached++;
		}
		pthread_mutex_unlock(&c->lock);
		mr = ibv_reg_mr(c->pd, addr, len, c->access);
		err = errno;
		pthread_mutex_lock(&c->lock);
		mtc_sync_locked_(c);	/* may mark e stale, or drop the channel */
		pthread_cond_broadcast(&c->registered);	/* e is resolved below */
		if (!mr || e->stale) {
			if (e->in_tree) {
				itree_remove(&c->tree, &e->node);
				e->in_tree = 0;
			}
			free(e);
			if (mr) {
				ibv_dereg_mr(mr);	/* revoked before it was published */
				c->retries++;
				continue;
			}
			pthread_mutex_unlock(&c->lock);
			errno = err;
			return NULL;
		}
		e->mr = mr;
		if (e->in_tree && !c->ch) {
			/* The channel was lost while registering: uncached. */
			itree_remove(&c->tree, &e->node);
			e->in_tree = 0;
		}
		if (e->in_tree) {
			e->next = c->lru.next;
			e->prev = &c->lru;
			c->lru.next->prev = e;
			c->lru.next = e;
			c->ready++;
			mtc_evict_locked_(c);
		}
		pthread_mutex_unlock(&c->lock);
		return e;
	}
	pthread_mutex_unlock(&c->lock);
	errno = EAGAIN;
	return NULL;
}

static void mtc_put(struct mtcache *c, struct mtc_entry *e)
{
	pthread_mutex_lock(&c->lock);
	if (--e->refs == 0 && !e->in_tree)
		mtc_free_entry_(e);
	pthread_mutex_unlock(&c->lock);
}

/* Drain now (e.g. from an epoll loop on peermem_fd(c->ch)). */
static void mtc_sync(struct mtcache *c)
{
	pthread_mutex_lock(&c->lock);
	mtc_sync_locked_(c);
	pthread_mutex_unlock(&c->lock);
}

static int mtc_count_cb_(struct itree_node *n, void *arg)
{
	(*(size_t *)arg) += ((struct mtc_entry *)n)->mr != NULL;
	return 0;
}

/* Registrations the cache holds that overlap [addr, addr + len), after a sync. */
static size_t mtc_count(struct mtcache *c, void *addr, size_t len)
{
	size_t n = 0;

	pthread_mutex_lock(&c->lock);
	mtc_sync_locked_(c);
	itree_visit(&c->tree, (uintptr_t)addr, (uintptr_t)addr + len, mtc_count_cb_, &n);
	pthread_mutex_unlock(&c->lock);
	return n;
}

/* Deregister everything (no mtc_get may be outstanding) and close the channel. */
static void mtc_fini(struct mtcache *c)
{
	pthread_mutex_lock(&c->lock);
	while (c->tree.root)
		mtc_drop_(c, (struct mtc_entry *)c->tree.root);
	pthread_mutex_unlock(&c->lock);
	peermem_close(c->ch);
	c->ch = NULL;
	pthread_cond_destroy(&c->registered);
	pthread_mutex_destroy(&c->lock);
}

#endif /* PEERMEM_MTCACHE_H */
