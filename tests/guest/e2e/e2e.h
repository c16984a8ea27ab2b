/* SPDX-License-Identifier: GPL-2.0 */
/*
 * e2e.h - the end-to-end test of GPU-memory registration over rxe, run the
 * same way against each peer-memory client that can serve gpusim memory.
 *
 * A client is described by one entry of the adapter table (clients.c):
 * which module to load and how, the name it registers with the core, and
 * what its own debugfs counters must say while an MR is live and when
 * nothing is. Everything else (the checks, the memory, the RDMA traffic)
 * is the same for every client.
 *
 * common.c: the adapter table and the gpusim helpers; e2e.c: the test.
 *
 * Shared by the test (e2e.c, t_e2e_*.c) and the demo program (pm_demo.c);
 * the TAP, rxe0 and RC-loopback helpers come from ../core/core_test.h.
 */
#ifndef E2E_H
#define E2E_H

#include <stddef.h>
#include <stdint.h>

/*
 * One quantity a client shows about itself: file @a, minus file @b if @b
 * is set (monotonic counters in pairs); a relative name is a file of the
 * client's debugfs directory (dbg), an absolute one is read as it is (a
 * client without counters of its own may still show something in sysfs).
 * While one MR of n GPU pages (64 KiB) is registered it must read
 * @per_mr + n * @per_gpu_page; with nothing registered, 0.
 */
struct e2e_live {
	const char *a, *b;
	long long per_mr, per_gpu_page;
};

struct e2e_client {
	const char *label;	/* what t_e2e_<label> and pm_demo <label> name */
	const char *ko;		/* module file, relative to PEERMEM_ROOT */
	const char *module;	/* module name (/sys/module/<module>, rmmod) */
	const char *args;	/* insmod arguments */
	const char *core_name;	/* /sys/kernel/debug/peer_memory/<core_name> */
	const char *dbg;	/* its own debugfs directory, or NULL */
	/*
	 * What it shows about what it holds, ending with an entry whose a is
	 * NULL; or NULL if it shows nothing: then the checks of it are
	 * skipped (saying so), and only the core and gpusim are checked.
	 */
	const struct e2e_live *live;
	const char *live_what;	/* for messages: "its debugfs counters" */
	/*
	 * Scatter-gather entries its dma_map() gives per GPU page, which is
	 * what the core's num_reg_pages adds (it counts entries, as OFED
	 * does): exactly 1, or 0 if it may coalesce contiguous bus addresses
	 * (then from 1 to one per GPU page).
	 */
	int sg_per_gpu_page;
	/*
	 * 1: the client registered as core_name pins with
	 * nvidia_p2p_get_pages_persistent and registers no invalidation
	 * callback (nvidia-peermem 560+ with persistent_api_support=1). Then
	 * the core does not treat it as invalidating, and freeing the GPU
	 * memory under a live MR invalidates nothing: the persistent pin
	 * keeps the memory (NVIDIA's driver dups the RM memory object; gpusim
	 * holds a reference), so RDMA through the MR keeps reaching the old
	 * memory until ibv_dereg_mr. 0: pins with a free callback, invalidating.
	 */
	int persistent;
	/*
	 * 1: besides its pin with a free callback, the client takes a
	 * persistent "keeper" pin of the same range (peermem's nv_mem since
	 * issue 22, docs/architecture.md "The keeper"): gpusim sees two page
	 * tables per registration, one of them persistent.
	 */
	int keeper;
	/*
	 * Optional checks, each only if set: the module's version
	 * (/sys/module/<module>/version) starts with @version; a second core
	 * entry @other_core exists (other_core_present 1) or must not (0).
	 */
	const char *version;
	const char *other_core;
	int other_core_present;
	/*
	 * Set for a module that may legitimately be absent (built only where
	 * its source is available): if @ko is missing, the whole run is one
	 * skipped check whose reason is this text. Unset: a missing module
	 * fails.
	 */
	const char *absent_why;
};

extern const struct e2e_client e2e_clients[];	/* ends with label NULL */

/* The client labelled @label, or NULL (and a list of labels on stderr). */
const struct e2e_client *e2e_client_find(const char *label);
/* The checkout: $PEERMEM_ROOT, else found from this program's path. */
const char *e2e_root(void);

/* The whole test against @cl: TAP on stdout, exit status. */
int e2e_run(const struct e2e_client *cl);
/*
 * The same checks without the plan line, so that one program can run them
 * for several clients (or one module in several configurations) in turn;
 * end with e2e_finish(). Returns the number of failed checks so far.
 */
int e2e_check(const struct e2e_client *cl);
/* The plan line after the e2e_check() calls (tap.h's counters are e2e.c's). */
int e2e_finish(void);

#define GPU_PAGE (64 * 1024UL)
#define GSDBG "/sys/kernel/debug/gpusim/"
#define CORE_DBG "/sys/kernel/debug/peer_memory/"
#define OFED_SYSFS "/sys/kernel/mm/memory_peers/"

/* gpusim memory, allocated and mapped like cudaMalloc() memory. */
struct gpu_buf {
	int fd;			/* /dev/gpusim */
	uint8_t *p;		/* its CPU mapping (also the GPU virtual address) */
	size_t len;
	uint64_t handle;
};

/* Allocates @len bytes; 0 or -errno. */
int gpu_alloc(struct gpu_buf *g, int fd, size_t len);
/* GPUSIM_IOC_FREE (what cudaFree is): 0 or -errno. The CPU mapping stays. */
int gpu_free(struct gpu_buf *g);
/* Drops the CPU mapping (after gpu_free, or to free at close/exit). */
void gpu_unmap(struct gpu_buf *g);

/* The first line of a file, without its newline, into @buf (empty if the
 * file cannot be read); returns its length, or -1 if unreadable. */
int read_line(char *buf, size_t len, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* GPU pages (64 KiB) that [addr, addr + len) touches. */
static inline long long gpu_pages(uintptr_t addr, size_t len)
{
	return (long long)((addr + len + GPU_PAGE - 1) / GPU_PAGE - addr / GPU_PAGE);
}

#ifdef CORE_TEST_H
/*
 * Every registration the core made through the client is undone, counted
 * as OFED 25.10 counts (the rig's core follows it): one num_dealloc_mrs per
 * num_alloc_mrs (an invalidation counts it), the bytes back (for a
 * PEER_MEM_INVALIDATE_UNMAPS client an invalidated MR's at its
 * deregistration); num_reg_pages counts sg entries and num_dereg_pages
 * never moves.
 */
static inline int e2e_core_balanced(const struct peer_stats *s)
{
	return s->alloc_mrs == s->dealloc_mrs && s->reg_bytes == s->dereg_bytes &&
	       s->dereg_pages == 0;
}
#endif

#endif /* E2E_H */
