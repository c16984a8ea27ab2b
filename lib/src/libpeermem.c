// SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT
/*
 * libpeermem - a thread-safe client of /dev/peermem (libpeermem.h,
 * man 3 libpeermem).
 *
 * State of a channel:
 *   page    the generation page (read-only shared mapping), or lost_page
 *           in a forked child, whose generation no cursor holds;
 *   seen    the generation the handlers have seen everything up to;
 *   lock    serializes drains (the queue has one consumer);
 *   lost    0, or the -errno every later drain returns.
 * Every open channel is on a list, so that the fork child handler can mark
 * each one lost before any code of the child looks at it: the page is not
 * inherited (VM_DONTCOPY), a load from its old address would fault.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <peermem/libpeermem.h>

#define EXPORT __attribute__((visibility("default")))
#define PAGE_LEN 4096
/* Records read per read() call (on the stack: 6 KiB). */
#define BATCH 64

struct peermem_channel {
	const struct peermem_gen_page *page;	/* the mapping, or &lost_page */
	void *map;				/* what to munmap (NULL: nothing) */
	int fd;					/* -1 once known not to be ours */
	pid_t pid;				/* the opener */
	dev_t dev, rdev;			/* what fd was at open */
	ino_t ino;
	uint32_t version, queue_len;
	pthread_mutex_t lock;			/* one drain at a time */
	const void *owner;			/* the draining thread (its tls_id) */
	uint64_t seen;				/* atomic */
	int lost;				/* atomic: 0 or -errno */
	uint64_t records, overflows, flushes, skipped, drains;	/* atomic */
	struct peermem_channel *next, *prev;	/* reg_head's list */
};

/* What a lost channel's generation loads come from. */
static const struct peermem_gen_page lost_page = {
	.generation = PEERMEM_GENERATION_LOST,
};

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct peermem_channel *reg_head;
static pthread_once_t reg_once = PTHREAD_ONCE_INIT;
static int reg_err;
/* Its address identifies the calling thread (drain recursion check). */
static __thread char tls_id;

static void atfork_prepare(void)
{
	pthread_mutex_lock(&reg_lock);
}

static void atfork_parent(void)
{
	pthread_mutex_unlock(&reg_lock);
}

/*
 * The child has one thread and none of the parent's mappings of the pages:
 * every channel is lost. A drain mutex another thread held at the fork
 * stays locked in the child: make it new (nobody can be waiting on it).
 */
static void atfork_child(void)
{
	for (struct peermem_channel *ch = reg_head; ch; ch = ch->next) {
		__atomic_store_n(&ch->page, &lost_page, __ATOMIC_RELAXED);
		ch->map = NULL;
		__atomic_store_n(&ch->lost, -EPERM, __ATOMIC_RELEASE);
		ch->owner = NULL;
		pthread_mutex_init(&ch->lock, NULL);
	}
	pthread_mutex_unlock(&reg_lock);
}

static void reg_init(void)
{
	reg_err = pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

static void set_lost(struct peermem_channel *ch, int err)
{
	int zero = 0;

	__atomic_compare_exchange_n(&ch->lost, &zero, err, 0, __ATOMIC_RELEASE,
				    __ATOMIC_RELAXED);
}

static void stat_add(uint64_t *p, uint64_t n)
{
	__atomic_fetch_add(p, n, __ATOMIC_RELAXED);
}

EXPORT int peermem_open(struct peermem_channel **chp, const char *path,
			unsigned int flags, int *reason)
{
	struct peermem_channel *ch;
	const struct peermem_gen_page *pg;
	struct stat st;
	size_t len;
	void *map;
	int err;

	if (reason)
		*reason = 0;
	if (!chp)
		return -EINVAL;
	*chp = NULL;
	if (flags)
		return -EINVAL;
	if (!path)
		path = PEERMEM_DEVICE_PATH;
	len = strnlen(path, PEERMEM_PATH_MAX);
	if (len == 0)
		return -EINVAL;
	if (len >= PEERMEM_PATH_MAX)
		return -ENAMETOOLONG;

	pthread_once(&reg_once, reg_init);
	if (reg_err) {
		/* Without the fork handler a child would fault on the page. */
		err = -reg_err;
		goto none;
	}
	ch = calloc(1, sizeof(*ch));
	if (!ch) {
		err = -ENOMEM;
		goto none;
	}
	ch->fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	if (ch->fd < 0) {
		err = -errno;
		goto free_ch;
	}
	if (fstat(ch->fd, &st)) {
		err = -errno;
		goto close_fd;
	}
	map = mmap(NULL, PAGE_LEN, PROT_READ, MAP_SHARED, ch->fd, 0);
	if (map == MAP_FAILED) {
		err = -errno;
		goto close_fd;
	}
	pg = map;
	/* Version 1 layout; later versions only add fields (peermem.h). */
	if (pg->version < PEERMEM_EVENTS_VERSION ||
	    pg->event_size != sizeof(struct peermem_event) || pg->queue_len == 0) {
		err = -EPROTO;
		goto unmap;
	}
	err = pthread_mutex_init(&ch->lock, NULL);
	if (err) {
		err = -err;
		goto unmap;
	}
	ch->map = map;
	ch->page = pg;
	ch->pid = getpid();
	ch->dev = st.st_dev;
	ch->rdev = st.st_rdev;
	ch->ino = st.st_ino;
	ch->version = pg->version;
	ch->queue_len = pg->queue_len;
	ch->seen = __atomic_load_n(&pg->generation, __ATOMIC_ACQUIRE);

	pthread_mutex_lock(&reg_lock);
	ch->next = reg_head;
	if (reg_head)
		reg_head->prev = ch;
	reg_head = ch;
	pthread_mutex_unlock(&reg_lock);
	*chp = ch;
	return 0;

unmap:
	munmap(map, PAGE_LEN);
close_fd:
	close(ch->fd);
free_ch:
	free(ch);
none:
	if (reason)
		*reason = err;
	return PEERMEM_NO_CHANNEL;
}

/* Is ch->fd still the file opened? 0, or -EBADF (closed or replaced). */
static int fd_still_ours(struct peermem_channel *ch)
{
	struct stat st;

	if (fstat(ch->fd, &st)) {
		ch->fd = -1;	/* closed behind the library: whatever gets the number is not ours */
		return -EBADF;
	}
	if (st.st_dev != ch->dev || st.st_ino != ch->ino || st.st_rdev != ch->rdev) {
		ch->fd = -1;	/* someone else's file now: never read or close it */
		return -EBADF;
	}
	return 0;
}

EXPORT int peermem_close(struct peermem_channel *ch)
{
	int r = 0;

	if (!ch)
		return 0;
	pthread_mutex_lock(&reg_lock);
	if (ch->prev)
		ch->prev->next = ch->next;
	else
		reg_head = ch->next;
	if (ch->next)
		ch->next->prev = ch->prev;
	pthread_mutex_unlock(&reg_lock);
	if (ch->map)
		munmap(ch->map, PAGE_LEN);
	/* Never close a file that took the number after ours was closed. */
	if (ch->fd >= 0 && !fd_still_ours(ch) && close(ch->fd))
		r = -errno;
	pthread_mutex_destroy(&ch->lock);
	free(ch);
	return r;
}

EXPORT uint64_t peermem_generation(const struct peermem_channel *ch)
{
	const struct peermem_gen_page *pg;

	if (!ch)
		return PEERMEM_GENERATION_LOST;
	pg = __atomic_load_n(&ch->page, __ATOMIC_RELAXED);
	return __atomic_load_n(&pg->generation, __ATOMIC_ACQUIRE);
}

EXPORT int peermem_changed(const struct peermem_channel *ch, uint64_t cursor)
{
	return peermem_generation(ch) != cursor;
}

/* Record the generation the handlers have seen up to (it only grows). */
static void seen_up_to(struct peermem_channel *ch, uint64_t g)
{
	if (g > __atomic_load_n(&ch->seen, __ATOMIC_RELAXED))
		__atomic_store_n(&ch->seen, g, __ATOMIC_RELEASE);
}

EXPORT int peermem_drain(struct peermem_channel *ch,
			 const struct peermem_handlers *h, void *arg,
			 unsigned int max_records, uint64_t *cursor)
{
	struct peermem_event ev[BATCH];
	unsigned int n = 0, nread = 0;
	uint64_t g0;
	int r;

	if (!ch || !h || !h->revoked || !h->flush || max_records > PEERMEM_DRAIN_MAX)
		return -EINVAL;
	if (__atomic_load_n(&ch->owner, __ATOMIC_RELAXED) == &tls_id)
		return -EDEADLK;
	r = __atomic_load_n(&ch->lost, __ATOMIC_ACQUIRE);
	if (r)
		goto out_nolock;
	pthread_mutex_lock(&ch->lock);
	__atomic_store_n(&ch->owner, &tls_id, __ATOMIC_RELAXED);
	r = __atomic_load_n(&ch->lost, __ATOMIC_ACQUIRE);
	if (r)
		goto out;
	if (getpid() != ch->pid) {
		/* A child the fork handler did not run in (_Fork, clone): the
		 * page is not mapped here, do not load from it. */
		r = -EPERM;
		set_lost(ch, r);
		goto out;
	}
	/*
	 * Every record of a generation up to g0 is queued (records are queued
	 * before the counter moves): reading until the queue is empty covers g0.
	 */
	g0 = peermem_generation(ch);
	if (g0 == __atomic_load_n(&ch->seen, __ATOMIC_RELAXED))
		goto out;	/* another thread drained it all */
	r = fd_still_ours(ch);
	if (r) {
		set_lost(ch, r);
		goto out;
	}
	stat_add(&ch->drains, 1);
	for (;;) {
		unsigned int want = BATCH, k, first = 0;
		ssize_t got;

		if (max_records && max_records - nread < want)
			want = max_records - nread;
		got = read(ch->fd, ev, want * sizeof(ev[0]));
		if (got < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN) {
				seen_up_to(ch, g0);	/* drained */
				r = 0;
				break;
			}
			r = errno == EBADF ? -EBADF : -errno;
			set_lost(ch, r);
			break;
		}
		if (got == 0 || got % sizeof(ev[0])) {
			r = -EPROTO;
			set_lost(ch, r);
			break;
		}
		k = (unsigned int)(got / sizeof(ev[0]));
		nread += k;
		/* An overflow stands for everything read with it before it. */
		for (unsigned int i = k; i-- > 0;)
			if (ev[i].cause == PEERMEM_CAUSE_OVERFLOW) {
				first = i + 1;
				break;
			}
		if (first) {
			stat_add(&ch->skipped, first - 1);
			stat_add(&ch->overflows, 1);
			stat_add(&ch->flushes, 1);
			seen_up_to(ch, ev[first - 1].generation);
			h->flush(arg);
			n++;
		}
		for (unsigned int i = first; i < k; i++) {
			ev[i].client[PEERMEM_CLIENT_NAME_LEN - 1] = 0;
			seen_up_to(ch, ev[i].generation);
			stat_add(&ch->records, 1);
			h->revoked(arg, ev[i].start, ev[i].length, ev[i].cause,
				   ev[i].client, ev[i].generation);
			n++;
		}
		if (max_records && nread >= max_records) {
			r = 0;
			break;
		}
		if (k < want) {
			/* The queue held less than asked: it is empty now. */
			seen_up_to(ch, g0);
			r = 0;
			break;
		}
	}
out:
	__atomic_store_n(&ch->owner, NULL, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&ch->lock);
out_nolock:
	if (cursor)
		*cursor = __atomic_load_n(&ch->seen, __ATOMIC_ACQUIRE);
	return r ? r : (int)n;
}

EXPORT int peermem_fd(const struct peermem_channel *ch)
{
	if (!ch)
		return -EINVAL;
	return ch->fd >= 0 ? ch->fd : -EBADF;
}

EXPORT int peermem_wait(const struct peermem_channel *ch, int timeout_ms)
{
	struct pollfd p;
	int r;

	if (!ch || timeout_ms < -1 || timeout_ms > PEERMEM_WAIT_MAX_MS)
		return -EINVAL;
	if (__atomic_load_n(&ch->lost, __ATOMIC_ACQUIRE))
		return 1;
	if (ch->fd < 0)
		return -EBADF;
	p.fd = ch->fd;
	p.events = POLLIN;
	p.revents = 0;
	r = poll(&p, 1, timeout_ms);
	if (r < 0)
		return -errno;
	if (r == 0)
		return 0;
	if (p.revents & POLLNVAL)
		return -EBADF;
	return 1;
}

EXPORT int peermem_info(const struct peermem_channel *ch, struct peermem_info *info,
			size_t size)
{
	struct peermem_info i;

	if (!ch || !info || size < 8 || size > 4096)
		return -EINVAL;
	memset(&i, 0, sizeof(i));
	i.version = ch->version;
	i.queue_len = ch->queue_len;
	i.generation = peermem_generation(ch);
	i.seen = __atomic_load_n(&ch->seen, __ATOMIC_ACQUIRE);
	i.records = __atomic_load_n(&ch->records, __ATOMIC_RELAXED);
	i.overflows = __atomic_load_n(&ch->overflows, __ATOMIC_RELAXED);
	i.flushes = __atomic_load_n(&ch->flushes, __ATOMIC_RELAXED);
	i.skipped = __atomic_load_n(&ch->skipped, __ATOMIC_RELAXED);
	i.drains = __atomic_load_n(&ch->drains, __ATOMIC_RELAXED);
	i.lost = __atomic_load_n(&ch->lost, __ATOMIC_ACQUIRE);
	if (size > sizeof(i)) {
		memset((char *)info + sizeof(i), 0, size - sizeof(i));
		size = sizeof(i);
	}
	memcpy(info, &i, size);
	return 0;
}

EXPORT int peermem_version(void)
{
	return LIBPEERMEM_VERSION_MAJOR * 1000 + LIBPEERMEM_VERSION_MINOR;
}
