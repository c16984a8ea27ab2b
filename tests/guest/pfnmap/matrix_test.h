/* SPDX-License-Identifier: GPL-2.0 */
/*
 * matrix_test.h - what the two race matrices share: t_peermem_matrix.c
 * (peermem's clients, windows held open by peermem's inject_delay_*
 * knobs) and x_nvpeermem_matrix.c (NVIDIA's nvidia-peermem, windows held
 * open by gpusim's delay_us). Both land the same causes in the same phases
 * on the same kind of memory and name them the same way (docs/testing.md
 * compares their tables), so the causes, the memory they act on and the
 * exit round's process handling live here once; how a window is held
 * open and what a round checks stay in each program.
 */
#ifndef MATRIX_TEST_H
#define MATRIX_TEST_H

#include "pfnmap_test.h"

/* zap and mprotect are the PFN exporter's: t_peermem_matrix's only. */
enum cause { FREE, MUNMAP, MREMAP, MAPFIXED, FORK, EXIT, UNLOAD, ZAP, MPROTECT, NCAUSES };
enum phase { ACQ, PREGP, GP, MAP, LIVE, UNMAP, PUT, REL, NPHASES };

static const char *cause_name[] = { "gpu_free", "munmap", "mremap", "map_fixed", "fork",
				    "exit", "unload", "zap", "mprotect" };
static const char *phase_name[] = { "acquire", "pre-gp", "get_pages", "dma_map", "live",
				    "dma_unmap", "put_pages", "release" };

/* Whether only (NAME[,NAME...], "all" for any; NULL: every cell) selects the cell named names[0..n). */
static int only_selects(const char *only, const char *const names[], int n)
{
	char want[128], *tok, *save = NULL;
	int i = 0;

	if (!only)
		return 1;
	snprintf(want, sizeof(want), "%s", only);
	for (tok = strtok_r(want, ",", &save); tok && i < n; tok = strtok_r(NULL, ",", &save), i++)
		if (strcmp(tok, "all") && strcmp(tok, names[i]))
			return 0;
	return 1;
}

/* ---- the kernel log ---- */

/* /dev/kmsg from its end (only what comes after), non-blocking; -1 if it cannot be opened. */
static int kmsg_open(void)
{
	int fd = open("/dev/kmsg", O_RDONLY | O_NONBLOCK);

	if (fd >= 0)
		lseek(fd, 0, SEEK_END);
	return fd;
}

/*
 * The next record of kmsg (from kmsg_open) read into rec: its message,
 * after the record's "level,seq,time,flags;" prefix; NULL when nothing
 * more is there (or kmsg < 0). Records overwritten before they were read
 * (EPIPE) are passed over.
 */
static const char *kmsg_next(int kmsg, char *rec, size_t n)
{
	ssize_t r;

	if (kmsg < 0)
		return NULL;
	do
		r = read(kmsg, rec, n - 1);
	while (r < 0 && errno == EPIPE);
	if (r <= 0)
		return NULL;
	rec[r] = 0;
	return strchr(rec, ';') ? strchr(rec, ';') + 1 : rec;
}

/* ---- the memory of a round ---- */

struct mem {
	struct gmem g;		/* GPU: gpusim's allocation */
	int pfn;		/* PFN: the exporter's buffer (t_peermem_matrix), no g */
	uint8_t *p;		/* the registered address */
	size_t len;
	uint8_t *moved;		/* mremap's new address (a CPU view), or NULL */
	int freed, unmapped;
};

/* len bytes of GPU memory (gpusim's, through gfd), filled with seed 0x1111; bails out on failure. */
static void mem_get_gpu(struct mem *m, int gfd, size_t len)
{
	memset(m, 0, sizeof(*m));
	m->len = len;
	if (gmem_alloc(gfd, len, &m->g))
		bail("GPUSIM_IOC_ALLOC: %s", strerror(errno));
	m->p = m->g.p;
	fill(m->p, len, 0x1111);
}

/* Unmap what the cause left mapped and free the GPU memory it left allocated. */
static void mem_put(struct mem *m, int gfd)
{
	if (m->moved)
		munmap(m->moved, m->len);
	else if (!m->unmapped)
		munmap(m->p, m->len);
	if (!m->pfn && !m->freed)
		gmem_free(gfd, &m->g);
	m->moved = NULL;
	m->unmapped = 1;
	m->freed = 1;
}

/* ---- the causes ---- */

/*
 * Fire a cause both matrices have on the memory itself: the GPU free,
 * munmap, mremap (moved away), mmap(MAP_FIXED) over it, fork then the
 * child's exit. forked (if set) runs in the parent as soon as fork()
 * returned, before the wait for the child: t_peermem_matrix checks there
 * whether the window was still open. 0 or -errno (-EINVAL: not one of
 * these causes; exit and unload need a process or a thread of their own).
 */
static int mem_cause(enum cause ca, struct mem *m, int gfd, void (*forked)(void))
{
	void *q, *r;
	pid_t pid;
	int st;

	switch (ca) {
	case FREE:
		m->freed = 1;
		return gmem_free(gfd, &m->g);
	case MUNMAP:
		m->unmapped = 1;
		return munmap(m->p, m->len) ? -errno : 0;
	case MREMAP:
		q = mmap(NULL, m->len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (q == MAP_FAILED)
			return -errno;
		r = mremap(m->p, m->len, m->len, MREMAP_MAYMOVE | MREMAP_FIXED, q);
		if (r != q)
			return -errno;
		m->unmapped = 1;
		m->moved = q;
		return 0;
	case MAPFIXED:
		r = mmap(m->p, m->len, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS,
			 -1, 0);
		if (r != m->p)
			return -errno;
		munmap(r, m->len);
		m->unmapped = 1;
		return 0;
	case FORK:
		pid = fork();
		if (pid == 0)
			_exit(0);
		if (pid < 0)
			return -errno;
		if (forked)
			forked();
		return waitpid(pid, &st, 0) == pid && WIFEXITED(st) && !WEXITSTATUS(st) ? 0 : -ECHILD;
	default:
		return -EINVAL;
	}
}

/* ---- unload ---- */

struct unloader {
	const char *module;	/* the module to unload */
	pthread_t t;
	int started, ret;
	volatile int done;
};

/*
 * delete_module of u->module, as rmmod does it, from a thread (no process
 * to start: it must begin inside the window; the module's exit may wait
 * for the core to let go of an MR).
 */
static void *unload_thread(void *arg)
{
	struct unloader *u = arg;

	u->ret = syscall(SYS_delete_module, u->module, O_NONBLOCK) ? -errno : 0;
	u->done = 1;
	return NULL;
}

/* ---- process exit: a child registers (or deregisters) and exits in the window ---- */

/*
 * Fork the child of an exit round, with a pipe for its verdict: 'L' when
 * its exit landed in the window, another byte when not. In the child (0
 * returned) p[1] is the pipe's end and *gfd a gpusim file of its own (its
 * exit frees what it allocated). Bails out if there is no pipe.
 */
static pid_t exit_fork(int p[2], int *gfd)
{
	pid_t pid;

	if (pipe(p))
		bail("pipe");
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		close(p[0]);
		if (*gfd >= 0)
			close(*gfd);
		*gfd = open("/dev/gpusim", O_RDWR);
	}
	return pid;
}

/* What an exit round's child registers: its memory, with a protection domain of its own. */
struct exit_child {
	struct mem m;
	struct ibv_pd *pd;
	struct ibv_mr *mr;	/* the MR a live or deregistration phase starts from */
};

/*
 * The start of an exit round's child (exit_fork's 0) once ch->m is got:
 * the protection domain (no QP: a registration needs none, and a process
 * start is costly here) and, for a live or deregistration phase, the MR.
 * Live: the child tells the parent its exit landed and is done (it exits
 * holding the MR and the memory). -1: on into the phase; else the child's
 * exit status (0, or which step failed).
 */
static int exit_child_start(struct exit_child *ch, enum phase ph, int pfd)
{
	struct ibv_context *ctx = open_rxe();

	ch->pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	ch->mr = NULL;
	if (!ch->pd)
		return 20;
	if (ph == LIVE || ph >= UNMAP) {
		ch->mr = ibv_reg_mr(ch->pd, ch->m.p, ch->m.len, MR_ACCESS);
		if (!ch->mr)
			return 22;
	}
	if (ph == LIVE)
		return write(pfd, "L", 1) == 1 ? 0 : 23;
	return -1;
}

/* The parent's end of exit_fork: the child's verdict (0: none), and *bad set if the child failed. */
static char exit_wait(pid_t pid, int p[2], const char *cell, int *bad)
{
	int st = -1;
	char r = 0;

	close(p[1]);
	if (read(p[0], &r, 1) != 1)
		r = 0;
	close(p[0]);
	if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st)) {
		diag("%s: the child failed (status %#x)", cell, st);
		*bad = 1;
	}
	return r;
}

#endif /* MATRIX_TEST_H */
