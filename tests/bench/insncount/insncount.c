// SPDX-License-Identifier: GPL-2.0
/*
 * insncount: a QEMU TCG plugin that counts the guest instructions executed
 * per translation block, between two markers the guest executes itself:
 * a deterministic profile of the work a guest operation does, which the
 * host's load cannot move (the benchmark kernel has no ftrace, kprobes or
 * BPF, and under a loaded host its CPU profiles and timings move by 2x
 * from pass to pass; docs/history.md, "Guest instructions counted").
 *
 * Markers (instructions no compiler emits): "xchg %r13,%r13" (4d 87 ed)
 * zeroes every count; "xchg %r14,%r14" (4d 87 f6) appends, to the file
 * given as out=FILE, a block "dump N" followed by one line per guest
 * block executed since the reset: start address, instructions in the
 * block, executions. tests/bench/bench_peermem executes them around its
 * --profile loop with BENCH_PROF_INSNS=1; tests/bench/report.py insns
 * names the addresses from the guest's kallsyms.
 *
 * Load: qemu-system-x86_64 ... -plugin /path/insncount.so,out=/tmp/x
 * (scripts/vm.sh: PEERMEM_QEMU_PLUGIN). Every block's execution calls
 * back into the plugin: the guest runs a few times slower.
 *
 * Only the few entry points used are declared here (QEMU's plugin API,
 * include/qemu/qemu-plugin.h, as of QEMU 9.0-10.x).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;
struct qemu_plugin_insn;
enum qemu_plugin_cb_flags { CB_NO_REGS, CB_R_REGS, CB_RW_REGS };
typedef void (*tb_trans_cb_t)(qemu_plugin_id_t id, struct qemu_plugin_tb *tb);
typedef void (*vcpu_udata_cb_t)(unsigned int vcpu_index, void *userdata);
typedef void (*udata_cb_t)(qemu_plugin_id_t id, void *userdata);

void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, tb_trans_cb_t cb);
void qemu_plugin_register_vcpu_tb_exec_cb(struct qemu_plugin_tb *tb, vcpu_udata_cb_t cb,
					  enum qemu_plugin_cb_flags flags, void *userdata);
void qemu_plugin_register_vcpu_insn_exec_cb(struct qemu_plugin_insn *insn, vcpu_udata_cb_t cb,
					    enum qemu_plugin_cb_flags flags, void *userdata);
uint64_t qemu_plugin_insn_vaddr(const struct qemu_plugin_insn *insn);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
uint64_t qemu_plugin_tb_vaddr(const struct qemu_plugin_tb *tb);
struct qemu_plugin_insn *qemu_plugin_tb_get_insn(const struct qemu_plugin_tb *tb, size_t idx);
typedef uint32_t qemu_plugin_meminfo_t;
struct qemu_plugin_hwaddr;
enum qemu_plugin_mem_rw { MEM_R = 1, MEM_W, MEM_RW };
typedef void (*vcpu_mem_cb_t)(unsigned int vcpu_index, qemu_plugin_meminfo_t info,
			      uint64_t vaddr, void *userdata);
void qemu_plugin_register_vcpu_mem_cb(struct qemu_plugin_insn *insn, vcpu_mem_cb_t cb,
				      enum qemu_plugin_cb_flags flags, enum qemu_plugin_mem_rw rw,
				      void *userdata);
struct qemu_plugin_hwaddr *qemu_plugin_get_hwaddr(qemu_plugin_meminfo_t info, uint64_t vaddr);
bool qemu_plugin_hwaddr_is_io(const struct qemu_plugin_hwaddr *haddr);
uint64_t qemu_plugin_hwaddr_phys_addr(const struct qemu_plugin_hwaddr *haddr);
size_t qemu_plugin_insn_data(const struct qemu_plugin_insn *insn, void *dest, size_t len);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, udata_cb_t cb, void *userdata);
/* Inline counters (QEMU 9.0 on): no call into the plugin per block. */
struct qemu_plugin_scoreboard;
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64, QEMU_PLUGIN_INLINE_STORE_U64 };
typedef struct {
	struct qemu_plugin_scoreboard *score;
	size_t offset;
} qemu_plugin_u64;
struct qemu_plugin_scoreboard *qemu_plugin_scoreboard_new(size_t element_size);
void qemu_plugin_register_vcpu_tb_exec_inline_per_vcpu(struct qemu_plugin_tb *tb,
							enum qemu_plugin_op op,
							qemu_plugin_u64 entry, uint64_t imm);
uint64_t qemu_plugin_u64_get(qemu_plugin_u64 entry, unsigned int vcpu_index);
void qemu_plugin_u64_set(qemu_plugin_u64 entry, unsigned int vcpu_index, uint64_t val);
int qemu_plugin_num_vcpus(void);

EXPORT int qemu_plugin_version = 2;

struct block {
	uint64_t vaddr, count;
	/*
	 * Instructions, and of them atomic ones (a lock prefix), and those
	 * that flush QEMU's software TLB: a write to CR3, INVLPG, INVPCID.
	 */
	uint32_t ninsns, nlock, nflush;
	/*
	 * Instructions QEMU runs through a helper or a loop rather than a few
	 * host instructions, by class (see slow_class()).
	 */
	uint8_t nslow[6];
	/*
	 * How the block ends (its last instruction): 0 anything else, 1 a
	 * return, 2 an indirect call or jump (each a lookup of the next block
	 * in QEMU: never chained), 3 popf, sti, stac or clac (which end
	 * QEMU's block: the flags they change select how the next is run).
	 */
	uint8_t exit;
	/* Lookups of this block, and misses, in the jump-cache model. */
	uint64_t jc_lookups, jc_misses;
	struct block *next;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct block *blocks;
static const char *out_path;
static unsigned int dumps;
/*
 * mem=1: every load and store is looked at too; the accesses to device
 * memory (MMIO: an exit to QEMU's device model each) are counted by the
 * instruction that made them and the 4 KiB page of their address.
 */
static bool mem;
#define NIO 4096
static struct io_site {
	uint64_t pc, page, count;
} io[NIO];
static uint64_t io_lost, mem_accesses;
/* mem=1: the distinct 4 KiB pages (virtual) loaded from or stored to. */
#define NPAGES (1 << 18)
static uint64_t *pages_seen;
static uint64_t pages_distinct, pages_lost;
/*
 * slow=ADDR (hex, the guest's queued_spin_lock_slowpath): who spins. Each
 * vCPU's last blocks run are kept; each entry into the block at ADDR
 * counts the blocks run before it (the lock function's, its caller's).
 */
static uint64_t slow_addr;
#define HIST 4
#define MAXVCPU 8
static uint64_t hist[MAXVCPU][HIST];
static unsigned int hpos[MAXVCPU];
#define NSLOW 1024
static struct slow_site {
	uint64_t a1, a2, a3, count;
} slow[NSLOW];
/*
 * Per vCPU, inline counters (no call into the plugin): instructions and
 * blocks run since the reset, and the instructions by where they ran
 * (user space, the kernel's text, module space), dumped as "vcpu" and
 * "split" lines. fast=1: nothing else, no callback per block (the guest
 * runs at nearly its usual speed, so what depends on time, such as RCU's
 * grace periods per operation, is as in a run without the plugin), no
 * per-block lines.
 */
static bool fast;
struct vcpu_counts {
	uint64_t insns, blocks, user, kernel, module;
};
static struct qemu_plugin_scoreboard *counts;
#define COUNT(f) ((qemu_plugin_u64){ counts, offsetof(struct vcpu_counts, f) })

/* Blocks translated since the reset, and their instructions. */
static uint64_t translated, translated_insns;
/*
 * A model of QEMU's per-vCPU jump cache (TB_JMP_CACHE_BITS 12: 4096
 * entries indexed by a hash of the block's address; accel/tcg/tb-jmp-cache.h
 * and tb-hash.h). QEMU chains a block to the next without a lookup when
 * the jump is direct and stays in the page; every other transition (a
 * return, an indirect jump or call, a jump to another page, a block that
 * ends on popf/sti/stac/clac) looks the next block up in the jump cache,
 * and in the global hash table when the cache's entry holds another
 * block (a miss). Counted per block (struct block): lookups, misses.
 */
#define JC_BITS 12
#define JC_SIZE (1u << JC_BITS)
static uint64_t jc[MAXVCPU][JC_SIZE];
static uint64_t jc_prev[MAXVCPU];
static uint8_t jc_prev_exit[MAXVCPU];

static unsigned int jc_hash(uint64_t pc)
{
	/* tb_jmp_cache_hash_func(): TB_JMP_ADDR_MASK, TB_JMP_PAGE_BITS 6 */
	uint64_t tmp = pc ^ (pc >> (12 - 6));

	return (unsigned int)(((tmp >> (12 - 6)) & (((JC_SIZE - 1) >> 6) << 6)) |
			      (tmp & ((1u << 6) - 1)));
}

static void on_exec(unsigned int vcpu, void *udata)
{
	struct block *b = udata;

	__atomic_fetch_add(&b->count, 1, __ATOMIC_RELAXED);
	if (vcpu < MAXVCPU) {
		if (jc_prev_exit[vcpu] || (jc_prev[vcpu] >> 12) != (b->vaddr >> 12)) {
			unsigned int h = jc_hash(b->vaddr);

			__atomic_fetch_add(&b->jc_lookups, 1, __ATOMIC_RELAXED);
			if (jc[vcpu][h] != b->vaddr) {
				__atomic_fetch_add(&b->jc_misses, 1, __ATOMIC_RELAXED);
				jc[vcpu][h] = b->vaddr;
			}
		}
		jc_prev[vcpu] = b->vaddr;
		jc_prev_exit[vcpu] = b->exit;
	}
	if (!slow_addr || vcpu >= MAXVCPU)
		return;
	if (b->vaddr == slow_addr) {
		unsigned int p = hpos[vcpu];
		uint64_t a1 = hist[vcpu][(p + HIST - 1) % HIST], a2 = hist[vcpu][(p + HIST - 2) % HIST],
			 a3 = hist[vcpu][(p + HIST - 3) % HIST];
		unsigned int k = (unsigned int)((a1 ^ a2 ^ a3) * 0x9e3779b97f4a7c15ULL >> 54) % NSLOW;

		pthread_mutex_lock(&lock);
		for (unsigned int i = 0; i < NSLOW; i++, k = (k + 1) % NSLOW) {
			if (!slow[k].count) {
				slow[k].a1 = a1;
				slow[k].a2 = a2;
				slow[k].a3 = a3;
			}
			if (slow[k].a1 == a1 && slow[k].a2 == a2 && slow[k].a3 == a3) {
				slow[k].count++;
				break;
			}
		}
		pthread_mutex_unlock(&lock);
	}
	hist[vcpu][hpos[vcpu]] = b->vaddr;
	hpos[vcpu] = (hpos[vcpu] + 1) % HIST;
}

static void on_reset(unsigned int vcpu, void *udata)
{
	(void)vcpu;
	(void)udata;
	pthread_mutex_lock(&lock);
	for (struct block *b = blocks; b; b = b->next) {
		__atomic_store_n(&b->count, 0, __ATOMIC_RELAXED);
		__atomic_store_n(&b->jc_lookups, 0, __ATOMIC_RELAXED);
		__atomic_store_n(&b->jc_misses, 0, __ATOMIC_RELAXED);
	}
	translated = translated_insns = 0;
	for (int i = 0; i < qemu_plugin_num_vcpus(); i++) {
		qemu_plugin_u64_set(COUNT(insns), i, 0);
		qemu_plugin_u64_set(COUNT(blocks), i, 0);
		qemu_plugin_u64_set(COUNT(user), i, 0);
		qemu_plugin_u64_set(COUNT(kernel), i, 0);
		qemu_plugin_u64_set(COUNT(module), i, 0);
	}
	memset(io, 0, sizeof(io));
	memset(slow, 0, sizeof(slow));
	io_lost = 0;
	__atomic_store_n(&mem_accesses, 0, __ATOMIC_RELAXED);
	if (pages_seen)
		memset(pages_seen, 0, NPAGES * sizeof(*pages_seen));
	pages_distinct = pages_lost = 0;
	pthread_mutex_unlock(&lock);
}

static void on_dump(unsigned int vcpu, void *udata)
{
	FILE *f;

	(void)vcpu;
	(void)udata;
	pthread_mutex_lock(&lock);
	f = fopen(out_path, "a");
	if (f) {
		fprintf(f, "dump %u translated %" PRIu64 " %" PRIu64 "\n", dumps++, translated,
			translated_insns);
		for (struct block *b = blocks; b; b = b->next) {
			uint64_t c = __atomic_load_n(&b->count, __ATOMIC_RELAXED);

			if (c)
				fprintf(f, "%" PRIx64 " %u %" PRIu64 " %u %u %u,%u,%u,%u,%u,%u %u %" PRIu64
					" %" PRIu64 "\n", b->vaddr, b->ninsns, c, b->nlock, b->nflush,
					b->nslow[0], b->nslow[1], b->nslow[2], b->nslow[3], b->nslow[4],
					b->nslow[5], b->exit, b->jc_lookups, b->jc_misses);
		}
		for (int i = 0; i < NIO; i++)
			if (io[i].count)
				fprintf(f, "io %" PRIx64 " %" PRIx64 " %" PRIu64 "\n", io[i].pc, io[i].page,
					io[i].count);
		for (int i = 0; i < NSLOW; i++)
			if (slow[i].count)
				fprintf(f, "slow %" PRIx64 " %" PRIx64 " %" PRIx64 " %" PRIu64 "\n", slow[i].a1,
					slow[i].a2, slow[i].a3, slow[i].count);
		/* The blocks translated since the reset: the list's head. */
		{
			uint64_t k = 0;

			for (struct block *b = blocks; b && k < translated; b = b->next, k++)
				fprintf(f, "tr %" PRIx64 " %u\n", b->vaddr, b->ninsns);
		}
		for (int i = 0; i < qemu_plugin_num_vcpus(); i++) {
			uint64_t n = qemu_plugin_u64_get(COUNT(insns), i);

			if (n)
				fprintf(f, "vcpu %d %" PRIu64 " %" PRIu64 "\nsplit %d %" PRIu64 " %" PRIu64
					" %" PRIu64 "\n", i, n, qemu_plugin_u64_get(COUNT(blocks), i), i,
					qemu_plugin_u64_get(COUNT(user), i),
					qemu_plugin_u64_get(COUNT(kernel), i),
					qemu_plugin_u64_get(COUNT(module), i));
		}
		if (mem)
			fprintf(f, "mem %" PRIu64 " io_lost %" PRIu64 " pages %" PRIu64 " pages_lost %" PRIu64 "\n",
				__atomic_load_n(&mem_accesses, __ATOMIC_RELAXED), io_lost, pages_distinct,
				pages_lost);
		fprintf(f, "end\n");
		fclose(f);
	}
	pthread_mutex_unlock(&lock);
}

static void on_mem(unsigned int vcpu, qemu_plugin_meminfo_t info, uint64_t vaddr, void *udata)
{
	struct qemu_plugin_hwaddr *h = qemu_plugin_get_hwaddr(info, vaddr);
	uint64_t pc = (uint64_t)(uintptr_t)udata, page;
	unsigned int k;

	(void)vcpu;
	__atomic_fetch_add(&mem_accesses, 1, __ATOMIC_RELAXED);
	if (pages_seen) {
		uint64_t key = (vaddr >> 12) | 1;	/* never 0: 0 is an empty slot */
		unsigned int k = (unsigned int)(key * 0x9e3779b97f4a7c15ULL >> 46) % NPAGES;

		pthread_mutex_lock(&lock);
		for (unsigned int i = 0;; i++, k = (k + 1) % NPAGES) {
			if (pages_seen[k] == key)
				break;
			if (!pages_seen[k]) {
				pages_seen[k] = key;
				pages_distinct++;
				break;
			}
			if (i == NPAGES / 2) {
				pages_lost++;
				break;
			}
		}
		pthread_mutex_unlock(&lock);
	}
	if (!h || !qemu_plugin_hwaddr_is_io(h))
		return;
	page = qemu_plugin_hwaddr_phys_addr(h) & ~0xfffULL;
	pthread_mutex_lock(&lock);
	k = (unsigned int)((pc ^ page) * 0x9e3779b97f4a7c15ULL >> 52) % NIO;
	for (unsigned int i = 0; i < NIO; i++, k = (k + 1) % NIO) {
		if (!io[k].count) {
			io[k].pc = pc;
			io[k].page = page;
		}
		if (io[k].pc == pc && io[k].page == page) {
			io[k].count++;
			break;
		}
		if (i == NIO - 1)
			io_lost++;
	}
	pthread_mutex_unlock(&lock);
}

/*
 * The length of the instruction's prefixes: the legacy ones (operand and
 * address size, rep/repne, segment overrides, lock), then REX.
 */
static size_t prefix_len(const uint8_t *p, size_t len)
{
	size_t j = 0;

	while (j < len && (p[j] == 0x66 || p[j] == 0x67 || p[j] == 0xf2 || p[j] == 0xf3 ||
			   p[j] == 0x2e || p[j] == 0x3e || p[j] == 0x26 || p[j] == 0x64 ||
			   p[j] == 0x65 || p[j] == 0x36 || p[j] == 0xf0 || (p[j] & 0xf0) == 0x40))
		j++;
	return j;
}

/*
 * Classes of instructions that cost TCG far more than an average one:
 * 0 div/idiv (F7 /6, /7), 1 rdtsc/rdtscp, 2 rep string ops (one
 * iteration per execution of the block, counted as executions), 3 pause,
 * 4 cpuid/rdmsr/wrmsr, 5 a far call, iret, sysret, syscall, or a
 * segment load. -1: none of them.
 */
static int slow_class(const uint8_t *p, size_t len)
{
	size_t j = prefix_len(p, len);
	bool rep = memchr(p, 0xf2, j) || memchr(p, 0xf3, j);

	if (j >= len)
		return -1;
	if (p[j] == 0x90 && j > 0 && p[j - 1] == 0xf3)
		return 3;
	if (rep && (p[j] == 0xa4 || p[j] == 0xa5 || p[j] == 0xaa || p[j] == 0xab ||
		    p[j] == 0xa6 || p[j] == 0xa7 || p[j] == 0xae || p[j] == 0xaf))
		return 2;
	if ((p[j] == 0xf7 || p[j] == 0xf6) && j + 1 < len && ((p[j + 1] >> 3) & 7) >= 6)
		return 0;
	if (p[j] == 0xcf || p[j] == 0x9a || p[j] == 0x8e)
		return 5;
	if (p[j] == 0x0f && j + 1 < len) {
		uint8_t o = p[j + 1];

		if (o == 0x31 || (o == 0x01 && j + 2 < len && p[j + 2] == 0xf9))
			return 1;
		if (o == 0xa2 || o == 0x30 || o == 0x32)
			return 4;
		if (o == 0x05 || o == 0x07)
			return 5;
	}
	return -1;
}

/* The block-exit kind of its last instruction (struct block's exit). */
static uint8_t exit_kind(const uint8_t *p, size_t len)
{
	size_t j = prefix_len(p, len);

	if (j >= len)
		return 0;
	if (p[j] == 0xc3 || p[j] == 0xc2)
		return 1;
	if (p[j] == 0xff && j + 1 < len && ((p[j + 1] >> 3) & 7) >= 2 && ((p[j + 1] >> 3) & 7) <= 5)
		return 2;
	if (p[j] == 0x9d || p[j] == 0xfb)
		return 3;
	if (p[j] == 0x0f && j + 2 < len && p[j + 1] == 0x01 && (p[j + 2] == 0xca || p[j + 2] == 0xcb))
		return 3;
	return 0;
}

static void on_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
	static const uint8_t reset[3] = { 0x4d, 0x87, 0xed }, dump[3] = { 0x4d, 0x87, 0xf6 };
	size_t n = qemu_plugin_tb_n_insns(tb);
	struct block *b = calloc(1, sizeof(*b));
	qemu_plugin_u64 where;

	(void)id;
	if (!b)
		return;
	b->vaddr = qemu_plugin_tb_vaddr(tb);
	b->ninsns = n;
	pthread_mutex_lock(&lock);
	b->next = blocks;
	blocks = b;
	translated++;
	translated_insns += n;
	pthread_mutex_unlock(&lock);
	/* x86-64: module space from 0xffffffffa0000000, the kernel's text below it. */
	where = b->vaddr < 0xffff800000000000ULL ? COUNT(user) :
		b->vaddr >= 0xffffffffa0000000ULL ? COUNT(module) : COUNT(kernel);
	qemu_plugin_register_vcpu_tb_exec_inline_per_vcpu(tb, QEMU_PLUGIN_INLINE_ADD_U64, COUNT(insns), n);
	qemu_plugin_register_vcpu_tb_exec_inline_per_vcpu(tb, QEMU_PLUGIN_INLINE_ADD_U64, COUNT(blocks), 1);
	qemu_plugin_register_vcpu_tb_exec_inline_per_vcpu(tb, QEMU_PLUGIN_INLINE_ADD_U64, where, n);
	if (!fast)
		qemu_plugin_register_vcpu_tb_exec_cb(tb, on_exec, CB_NO_REGS, b);
	for (size_t i = 0; i < n; i++) {
		struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
		uint8_t d[3] = { 0 };
		uint8_t p[8] = { 0 };
		size_t len = qemu_plugin_insn_data(insn, p, sizeof(p));
		int cls = slow_class(p, len);

		if (cls >= 0 && b->nslow[cls] < 255)
			b->nslow[cls]++;
		if (i == n - 1)
			b->exit = exit_kind(p, len);

		/*
		 * After any prefixes: mov %reg,%cr3 (0f 22, ModRM reg 3, mod 11),
		 * invlpg (0f 01, ModRM reg 7, mod not 11), invpcid (66 0f 38 82).
		 */
		if (len >= 4 && p[0] == 0x66 && p[1] == 0x0f && p[2] == 0x38 && p[3] == 0x82)
			b->nflush++;
		else
			for (size_t j = 0; j + 2 < 4; j++) {
				if (p[j] == 0x0f && p[j + 1] == 0x22 && (p[j + 2] & 0xf8) == 0xd8) {
					b->nflush++;
					break;
				}
				if (p[j] == 0x0f && p[j + 1] == 0x01 && (p[j + 2] & 0x38) == 0x38 &&
				    (p[j + 2] & 0xc0) != 0xc0) {
					b->nflush++;
					break;
				}
				if (p[j] != 0x66 && p[j] != 0xf2 && p[j] != 0xf3 && (p[j] & 0xf0) != 0x40)
					break;
			}
		/* A lock prefix among the prefixes. */
		if (memchr(p, 0xf0, prefix_len(p, len)))
			b->nlock++;
		if (mem)
			qemu_plugin_register_vcpu_mem_cb(insn, on_mem, CB_NO_REGS, MEM_RW,
							 (void *)(uintptr_t)qemu_plugin_insn_vaddr(insn));
		if (qemu_plugin_insn_data(insn, d, sizeof(d)) != sizeof(d))
			continue;
		if (!memcmp(d, reset, 3))
			qemu_plugin_register_vcpu_insn_exec_cb(insn, on_reset, CB_NO_REGS, NULL);
		else if (!memcmp(d, dump, 3))
			qemu_plugin_register_vcpu_insn_exec_cb(insn, on_dump, CB_NO_REGS, NULL);
	}
}

EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const void *info, int argc, char **argv)
{
	(void)info;
	for (int i = 0; i < argc; i++) {
		if (!strncmp(argv[i], "out=", 4))
			out_path = argv[i] + 4;
		else if (!strcmp(argv[i], "mem=1"))
			mem = true;
		else if (!strcmp(argv[i], "fast=1"))
			fast = true;
		else if (!strncmp(argv[i], "slow=", 5))
			slow_addr = strtoull(argv[i] + 5, NULL, 16);
	}
	if (!out_path) {
		fprintf(stderr, "insncount: out=FILE is required\n");
		return -1;
	}
	if (fast && mem) {
		fprintf(stderr, "insncount: fast=1 and mem=1 do not go together\n");
		return -1;
	}
	counts = qemu_plugin_scoreboard_new(sizeof(struct vcpu_counts));
	if (!counts)
		return -1;
	if (mem) {
		pages_seen = calloc(NPAGES, sizeof(*pages_seen));
		if (!pages_seen)
			return -1;
	}
	qemu_plugin_register_vcpu_tb_trans_cb(id, on_trans);
	return 0;
}
