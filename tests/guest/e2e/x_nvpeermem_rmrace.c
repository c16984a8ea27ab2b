// SPDX-License-Identifier: GPL-2.0
/*
 * NVIDIA's nvidia-peermem (its invalidating client nv_mem, unmodified)
 * under the race t_peermem_rmrace runs against peermem: a GPU free landing
 * in each phase of a registration, with gpusim's RM lock (rm_lock=1, held
 * as NVIDIA's driver holds RM's API lock: across get_pages, dma_map_pages,
 * put_pages and a whole free with its callbacks) and lockdep on (issue 22,
 * item 3). On request only (x_: not part of any area, see the Makefile);
 * it may leave the boot spent. docs/testing.md says how to run it and what
 * it showed.
 *
 * The predicted deadlock: the core holds the umem's mapping lock across
 * the client's get_pages and dma_map, where nvidia-peermem calls
 * nvidia_p2p_get_pages / nvidia_p2p_dma_map_pages, which take RM's lock;
 * its free callback runs under RM's lock and calls the core's invalidate,
 * which takes the mapping lock. A free whose callback invalidates a umem
 * whose registering thread waits for RM under that umem's mapping lock
 * never returns, nor does the registration.
 *
 * The racing work runs in a child process (a registering thread and, each
 * round, a freeing thread); the parent is a watchdog. If the child makes
 * no progress for a scaled time (slow_s), the parent reads the child's
 * threads (state, wchan, /proc/<pid>/task/<tid>/stack) and the kernel's
 * hung-task report (30 s in the rig), prints them as diagnostics and says
 * whether they show the predicted cycle; then it exits: the blocked tasks
 * never return, the boot is spent (it stops further hung-task reports,
 * which would otherwise land after this test). tests/vm/known-reports lets
 * the lockdep and hung-task lines through during this program only; the
 * program itself checks them.
 *
 * Environment: NVPEERMEM_BRANCH=550 (default: tests/nvpeermem/
 * nvidia-peermem.ko) or 595 (tests/nvpeermem/595/nvidia-peermem.ko with
 * persistent_api_support=0: nv_mem invalidating plus nv_mem_nc, as 550);
 * RMRACE_SECONDS (default 60) split between the phases, each at least
 * RMRACE_MIN_ROUNDS (default 8) rounds.
 */
#define _GNU_SOURCE
#include "e2e.h"
#include "../core/core_test.h"
#include "../../gpusim/gpusim_uapi.h"
#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/wait.h>

#define LEN (4 * GPU_PAGE)
#define MR_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
/* gpusim sleeps this long at the start of each nvidia_p2p_* call, before RM's lock. */
#define DELAY_US 100000
/* No round for this long (times the slowdown): the child is stuck. */
#define STALL_S 45

struct phase {
	const char *name;
	const char *mark;	/* gpusim calls/<mark> ... */
	int mark_n;		/* ... moved this many times: the registration is in the phase */
	int dereg;		/* the free races the deregistration */
	int after;		/* the free comes after the registration returned */
	unsigned int offset_us, window_us;	/* then the free starts at offset + [0, window) */
};

static const struct phase phases[] = {
	{ "inside acquire's pin (nvidia_p2p_get_pages, core's peer_clients_lock held)", "get_pages", 1, 0, 0, 0, 80000 },
	{ "inside acquire's unpin (nvidia_p2p_put_pages)", "put_pages", 1, 0, 0, 0, 80000 },
	{ "inside get_pages (nvidia_p2p_get_pages, core's mapping lock held)", "get_pages", 2, 0, 0, 0, 80000 },
	{ "inside dma_map (nvidia_p2p_dma_map_pages, core's mapping lock held)", "dma_map_pages", 1, 0, 0, 0, 80000 },
	{ "just after dma_map (mapping lock held until rxe's MR is live)", "dma_map_pages", 1, 0, 0, DELAY_US, 30000 },
	{ "while mapped (MR live)", NULL, 0, 0, 1, 0, 2000 },
	{ "inside deregistration's dma_unmap (nvidia_p2p_dma_unmap_pages)", "dma_unmap_pages", 1, 1, 0, 0, 80000 },
	{ "inside deregistration's put_pages (nvidia_p2p_put_pages)", "put_pages", 1, 1, 0, 0, 80000 },
};
#define NPHASES ((int)(sizeof(phases) / sizeof(phases[0])))

struct cell {
	int rounds, in_phase, reg_ok, reg_efault, reg_einval, bad;
};

/* What the child shows the watchdog (a shared anonymous mapping). */
struct shared {
	volatile int phase;		/* index, or -1 before the first */
	volatile long long round;	/* moves at every step of a round */
	volatile double beat;		/* now_s() of the last move */
	volatile pid_t reg_tid, free_tid;
	volatile int step;		/* what the registering thread is doing */
	volatile int done;
	struct cell cells[NPHASES];
};

static const char *const steps[] = { "between rounds", "in ibv_reg_mr", "in ibv_dereg_mr", "joining the freeing thread" };

static struct shared *sh;
static const char *branch;

static long long gsv(const char *what)
{
	return read_ll(GSDBG "%s", what);
}

static int gs_set(const char *knob, const char *v)
{
	char p[128];

	snprintf(p, sizeof(p), GSDBG "%s", knob);
	return write_str(p, v);
}

static void beat(int step)
{
	sh->step = step;
	sh->round++;
	sh->beat = now_s();
}

/* ---- the child: the race ---- */

struct racer {
	const struct phase *p;
	struct gpu_buf *g;
	long long mark0;
	int marked, ret;
};

static void *free_racer(void *arg)
{
	struct racer *x = arg;
	double end = now_s() + slow_s(5);

	sh->free_tid = (pid_t)syscall(SYS_gettid);
	if (x->p->mark) {
		char c[64];

		snprintf(c, sizeof(c), "calls/%s", x->p->mark);
		while (gsv(c) < x->mark0 + x->p->mark_n && now_s() < end)
			usleep(200);
		x->marked = gsv(c) >= x->mark0 + x->p->mark_n;
	}
	usleep(x->p->offset_us + (useconds_t)(random() % x->p->window_us));
	/* The free's own callback must not sleep delay_us (under RM) first. */
	gs_set("delay_us", "0");
	x->ret = gpu_free(x->g);
	return NULL;
}

static void round_of(struct ibv_pd *pd, int fd, const struct phase *p, struct cell *cl)
{
	struct racer x = { .p = p };
	struct ibv_mr *mr = NULL;
	struct gpu_buf g;
	char c[64], d[16];
	pthread_t t;
	int err = 0;

	if (gpu_alloc(&g, fd, LEN))
		bail("GPUSIM_IOC_ALLOC: %s", strerror(errno));
	x.g = &g;
	cl->rounds++;
	snprintf(c, sizeof(c), "calls/%s", p->mark ? p->mark : "get_pages");
	snprintf(d, sizeof(d), "%d", DELAY_US);
	if (p->dereg) {
		beat(1);
		mr = ibv_reg_mr(pd, g.p, LEN, MR_ACCESS);
		if (!mr) {
			diag("%s: ibv_reg_mr before the race failed: %s", p->name, strerror(errno));
			cl->bad++;
			gpu_free(&g);
			gpu_unmap(&g);
			return;
		}
		cl->reg_ok++;
		x.mark0 = gsv(c);
		gs_set("delay_us", d);
		pthread_create(&t, NULL, free_racer, &x);
		beat(2);
		if (ibv_dereg_mr(mr)) {
			diag("%s: ibv_dereg_mr failed: %s", p->name, strerror(errno));
			cl->bad++;
		}
		mr = NULL;
	} else if (p->after) {
		beat(1);
		mr = ibv_reg_mr(pd, g.p, LEN, MR_ACCESS);
		err = errno;
		pthread_create(&t, NULL, free_racer, &x);
	} else {
		x.mark0 = gsv(c);
		gs_set("delay_us", d);
		pthread_create(&t, NULL, free_racer, &x);
		beat(1);
		mr = ibv_reg_mr(pd, g.p, LEN, MR_ACCESS);
		err = errno;
	}
	beat(3);
	pthread_join(t, NULL);
	gs_set("delay_us", "0");
	if (!p->dereg) {
		if (mr)
			cl->reg_ok++;
		else if (err == EFAULT)
			cl->reg_efault++;
		else if (err == EINVAL)
			cl->reg_einval++;
		else {
			diag("%s: ibv_reg_mr failed with %s", p->name, strerror(err));
			cl->bad++;
		}
	}
	if (!p->mark || x.marked)
		cl->in_phase++;
	if (x.ret) {
		diag("%s: the free failed: %s", p->name, strerror(-x.ret));
		cl->bad++;
	}
	if (mr) {
		beat(2);
		if (ibv_dereg_mr(mr)) {
			diag("%s: ibv_dereg_mr failed: %s", p->name, strerror(errno));
			cl->bad++;
		}
	}
	gpu_unmap(&g);
	beat(0);
}

static int gpu_idle(void)
{
	return gsv("live_pins") == 0 && gsv("live_persistent_pins") == 0 &&
	       gsv("live_dma_mappings") == 0 && gsv("live_allocs") == 0;
}

static int wait_gpu_idle(double secs)
{
	double end = now_s() + secs;

	while (now_s() < end && !gpu_idle())
		usleep(20000);
	return gpu_idle();
}

static void child(double budget, int min_rounds)
{
	struct conn c;
	int fd;

	sh->reg_tid = (pid_t)syscall(SYS_gettid);
	if (conn_open(&c))
		bail("cannot set up rxe0's verbs context");
	fd = open("/dev/gpusim", O_RDWR);
	if (fd < 0)
		bail("cannot open /dev/gpusim: %s", strerror(errno));
	for (int i = 0; i < NPHASES; i++) {
		struct cell *cl = &sh->cells[i];
		double end = now_s() + budget / NPHASES;

		sh->phase = i;
		beat(0);
		while (now_s() < end || cl->rounds < min_rounds) {
			round_of(c.pd, fd, &phases[i], cl);
			if (cl->rounds % 50 == 0)
				diag("nvidia-peermem %s, free %s: %d rounds so far", branch, phases[i].name, cl->rounds);
		}
		if (!wait_gpu_idle(slow_s(10))) {
			diag("%s: 10 s (scaled) after the phase gpusim still holds pins %lld, persistent %lld, DMA mappings %lld, allocations %lld",
			     phases[i].name, gsv("live_pins"), gsv("live_persistent_pins"),
			     gsv("live_dma_mappings"), gsv("live_allocs"));
			cl->bad++;
		}
	}
	close(fd);
	conn_close(&c);
	sh->done = 1;
	exit(0);
}

/* ---- the parent: the watchdog ---- */

/* Up to max lines of `dmesg` from the first match of ere on (after lines each). */
static void dmesg_diag(const char *ere, int after, int max)
{
	char cmd[512], line[512];
	FILE *f;
	int n = 0;

	snprintf(cmd, sizeof(cmd), "dmesg | grep -E -A%d -- '%s'", after, ere);
	f = popen(cmd, "r");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f) && n++ < max) {
		line[strcspn(line, "\n")] = 0;
		diag("  | %s", line);
	}
	pclose(f);
}

static int dmesg_has(const char *ere)
{
	return run("dmesg | grep -qE -- '%s'", ere) == 0;
}

static int dmesg_count(const char *ere)
{
	char cmd[256];
	int n = -1;
	FILE *f;

	snprintf(cmd, sizeof(cmd), "dmesg | grep -cE -- '%s'", ere);
	f = popen(cmd, "r");
	if (!f)
		return -1;
	if (fscanf(f, "%d", &n) != 1)
		n = -1;
	pclose(f);
	return n;
}

/* dmesg lines of a lockdep cycle report that name the locks, one string. */
static void lockdep_locks(char *out, size_t len)
{
	char line[512];
	/*
	 * The report's first 200 lines, only the frames of the core, the
	 * clients, rxe and gpusim (stacks in short) and the lines that name
	 * the locks.
	 */
	FILE *f = popen("dmesg | sed -n '/possible circular locking dependency/,/<\\/TASK>/p' | head -200 | "
			"grep -E -- '-> #[0-9]|is trying to acquire|already holding|lock\\(|\\(&|ib_|nv_|nvidia|gpusim|rxe|peer|ioctl' | "
			"sed 's/^\\[ *[0-9.]*\\] //' | head -70", "r");
	size_t o = 0;

	out[0] = 0;
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = 0;
		diag("  | %s", line);
		o += snprintf(out + o, o < len ? len - o : 0, "%s\n", line);
		if (o >= len)
			break;
	}
	pclose(f);
}

struct task_view {
	pid_t tid;
	char state;
	char wchan[128];
	char stack[4096];
};

static void read_task(pid_t pid, pid_t tid, struct task_view *v)
{
	char p[128], buf[1024];
	int fd;
	ssize_t n;
	char *s;

	memset(v, 0, sizeof(*v));
	v->tid = tid;
	v->state = '?';
	snprintf(p, sizeof(p), "/proc/%d/task/%d/stat", pid, tid);
	fd = open(p, O_RDONLY);
	if (fd >= 0) {
		n = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		buf[n > 0 ? n : 0] = 0;
		s = strrchr(buf, ')');
		if (s && s[1] == ' ')
			v->state = s[2];
	}
	snprintf(p, sizeof(p), "/proc/%d/task/%d/wchan", pid, tid);
	fd = open(p, O_RDONLY);
	if (fd >= 0) {
		n = read(fd, v->wchan, sizeof(v->wchan) - 1);
		close(fd);
		v->wchan[n > 0 ? n : 0] = 0;
	}
	snprintf(p, sizeof(p), "/proc/%d/task/%d/stack", pid, tid);
	fd = open(p, O_RDONLY);
	if (fd >= 0) {
		n = read(fd, v->stack, sizeof(v->stack) - 1);
		close(fd);
		v->stack[n > 0 ? n : 0] = 0;
	}
}

static void show_task(const struct task_view *v, const char *role)
{
	char copy[4096], *save = NULL, *l;

	diag("task %d (%s): state %c, wchan %s", v->tid, role, v->state, v->wchan[0] ? v->wchan : "-");
	snprintf(copy, sizeof(copy), "%s", v->stack);
	for (l = strtok_r(copy, "\n", &save); l; l = strtok_r(NULL, "\n", &save))
		diag("  %s", l);
}

/* The first nvidia_p2p_* function named in a stack, or NULL. */
static const char *rm_entry(const char *stack, char *buf, size_t len)
{
	const char *s = strstr(stack, "nvidia_p2p_");
	size_t n = 0;

	if (!s)
		return NULL;
	while (s[n] && (isalnum((unsigned char)s[n]) || s[n] == '_') && n + 1 < len)
		n++;
	memcpy(buf, s, n);
	buf[n] = 0;
	return buf;
}

/*
 * The child is stuck: show its threads and the kernel's hung-task report,
 * and say whether the stacks are the predicted cycle. Never returns.
 */
static void __attribute__((noreturn)) report_hang(pid_t pid)
{
	struct task_view reg, fr, other[8];
	int nother = 0, predicted;
	char entry[64], p[64];
	const char *rm;
	double end;
	DIR *d;
	struct dirent *e;
	int ph = sh->phase;
	const char *phase = ph >= 0 ? phases[ph].name : "before the first phase";

	diag("the racing child (pid %d) made no progress for %.0f s (limit %.0f s: %d s times the slowdown), phase \"%s\", round %d of it, its registering thread %s",
	     pid, now_s() - sh->beat, slow_s(STALL_S), STALL_S, phase,
	     ph >= 0 ? sh->cells[ph].rounds : 0, steps[sh->step]);
	read_task(pid, sh->reg_tid, &reg);
	read_task(pid, sh->free_tid, &fr);
	snprintf(p, sizeof(p), "/proc/%d/task", pid);
	d = opendir(p);
	while (d && (e = readdir(d)) && nother < 8) {
		pid_t tid = atoi(e->d_name);

		if (tid > 0 && tid != sh->reg_tid && tid != sh->free_tid)
			read_task(pid, tid, &other[nother++]);
	}
	if (d)
		closedir(d);
	show_task(&reg, "registering thread");
	show_task(&fr, "freeing thread");
	for (int i = 0; i < nother; i++)
		show_task(&other[i], "other thread of the child");

	/* The kernel's own report: blocked for more than 30 s, checked every 30 s. */
	end = now_s() + slow_s(90);
	while (!dmesg_has("blocked for more than") && now_s() < end)
		sleep(2);
	if (dmesg_has("blocked for more than")) {
		diag("the kernel's hung-task report (first lines):");
		dmesg_diag("INFO: task .* blocked for more than", 28, 60);
	} else {
		diag("no hung-task report in the kernel log within 90 s (scaled): is CONFIG_DETECT_HUNG_TASK on, hung_task_timeout_secs %lld?",
		     read_ll("/proc/sys/kernel/hung_task_timeout_secs"));
	}
	if (dmesg_has("possible circular locking dependency")) {
		char locks[8192];

		diag("lockdep's cycle report, the locks it names:");
		lockdep_locks(locks, sizeof(locks));
	}

	rm = rm_entry(reg.stack, entry, sizeof(entry));
	predicted = reg.state == 'D' && fr.state == 'D' && rm && strstr(reg.stack, "ib_peer_umem_get") &&
		    strstr(fr.stack, "ib_invalidate_peer_memory") && strstr(fr.stack, "gpusim");
	ok(predicted,
	   "nvidia-peermem %s: deadlock %s in \"%s\": %s",
	   branch, predicted ? "reproduced" : "of another shape", phase,
	   predicted ? "the registering thread waits for RM's lock in %s under the core's mapping lock (ib_peer_umem_get), "
		       "the freeing thread holds RM's lock in gpusim's free and waits for that mapping lock in the core's invalidate "
		       "(ib_invalidate_peer_memory), called by nvidia-peermem's free callback" :
		       "the stacks above are not the predicted cycle (registering thread waiting for RM in an nvidia_p2p_* call under "
		       "ib_peer_umem_get, freeing thread in ib_invalidate_peer_memory under gpusim's free): read them, and the "
		       "hung-task report, to see what it waits for");
	if (!predicted && rm)
		diag("(the registering thread is in %s)", rm);
	diag("the boot is spent: the blocked tasks never return; hung-task reports are switched off now so that none lands after this test");
	write_str("/proc/sys/kernel/hung_task_warnings", "0");
	printf("1..%d\n", tap_n);
	fflush(stdout);
	_exit(tap_fail ? 1 : 0);
}

int main(void)
{
	const struct e2e_client *cl;
	const char *root = e2e_root();
	double budget = getenv("RMRACE_SECONDS") ? atof(getenv("RMRACE_SECONDS")) : 60;
	int min_rounds = getenv("RMRACE_MIN_ROUNDS") ? atoi(getenv("RMRACE_MIN_ROUNDS")) : 8;
	char ko[600], locks[8192];
	long long total = 0, last_round = -1;
	int lockdep_on, status, total_in = 0;
	double limit, seen;
	struct peer_stats s;
	pid_t pid;

	branch = getenv("NVPEERMEM_BRANCH") ?: "550";
	if (!strcmp(branch, "550"))
		cl = e2e_client_find("nvpeermem");
	else if (!strcmp(branch, "595"))
		cl = e2e_client_find("nvpeermem595-legacy");
	else
		bail("NVPEERMEM_BRANCH=%s: say 550 or 595", branch);
	if (!cl)
		bail("no such client in tests/guest/e2e/common.c's table");
	snprintf(ko, sizeof(ko), "%s/%s", root, cl->ko);
	if (access(ko, R_OK)) {
		if (cl->absent_why) {
			skip("%s", cl->absent_why);
			return finish();
		}
		bail("%s is not built: make -C tests/nvpeermem", ko);
	}

	srandom(22);
	rxe_up();
	run("dmesg -C");
	if (access("/sys/module/gpusim", F_OK)) {
		snprintf(ko, sizeof(ko), "%s/tests/gpusim/gpusim.ko", root);
		if (run("insmod %s rm_lock=1", ko))
			bail("cannot load %s", ko);
	}
	gs_set("rm_lock", "1");
	ok(gsv("rm_lock") == 1, "gpusim holds its RM lock (rm_lock=%lld) across get_pages, dma_map_pages, put_pages and a free with its callbacks",
	   gsv("rm_lock"));
	snprintf(ko, sizeof(ko), "%s/%s", root, cl->ko);
	if (run("insmod %s %s", ko, cl->args))
		bail("insmod %s %s failed (dmesg says why)", ko, cl->args);
	ok(read_ll(CORE_DBG "%s/num_alloc_mrs", cl->core_name) == 0,
	   "nvidia-peermem %s (%s %s) registered %s with the core", branch, cl->ko, cl->args, cl->core_name);
	lockdep_on = run("grep -qE 'debug_locks: +1' /proc/lockdep_stats") == 0;
	diag("lockdep %s; hung-task timeout %lld s", lockdep_on ? "on" : "off (or already turned off in this boot)",
	     read_ll("/proc/sys/kernel/hung_task_timeout_secs"));

	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED)
		bail("mmap: %s", strerror(errno));
	memset(sh, 0, sizeof(*sh));
	sh->phase = -1;
	sh->beat = now_s();
	fflush(stdout);
	pid = fork();
	if (pid < 0)
		bail("fork: %s", strerror(errno));
	if (pid == 0)
		child(budget, min_rounds);

	/* The watchdog: rounds must keep coming; the whole race must end in time. */
	limit = now_s() + budget + slow_s(NPHASES * 20 + 60);
	seen = now_s();
	for (;;) {
		pid_t w = waitpid(pid, &status, WNOHANG);

		if (w == pid)
			break;
		if (sh->round != last_round) {
			last_round = sh->round;
			seen = now_s();
		}
		if (now_s() - seen > slow_s(STALL_S) || now_s() > limit)
			report_hang(pid);
		usleep(200000);
	}
	ok(WIFEXITED(status) && WEXITSTATUS(status) == 0 && sh->done,
	   "the racing child finished (%s %d)", WIFEXITED(status) ? "exit status" : "signal",
	   WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));

	for (int i = 0; i < NPHASES; i++) {
		const struct cell *c = &sh->cells[i];

		total += c->rounds;
		total_in += c->in_phase;
		diag("nvidia-peermem %s, free %s: %d rounds (%d with the free after the phase began); registrations %d ok, %d EFAULT, %d EINVAL",
		     branch, phases[i].name, c->rounds, c->in_phase, c->reg_ok, c->reg_efault, c->reg_einval);
		ok(c->bad == 0 && c->rounds >= min_rounds && c->in_phase > 0,
		   "nvidia-peermem %s, free %s: %d rounds (at least %d, %d in the phase), none hung, every registration succeeded or failed with EFAULT/EINVAL, every free returned 0, nothing left at gpusim",
		   branch, phases[i].name, c->rounds, min_rounds, c->in_phase);
	}
	/* A result, not a failure: the prediction did not come true in these rounds. */
	ok(1, "nvidia-peermem %s: no deadlock in %lld rounds (%d with the free inside its phase)", branch, total, total_in);
	diag("nvidia-peermem's free callback said \"invalid dma_mapping\" %d times: a callback that comes before dma_map stored its mapping returns without calling the core's invalidate (nvidia-peermem.c, nv_get_p2p_free_callback), so it never waits for a mapping lock held across an RM call",
	     dmesg_count("invalid dma_mapping"));
	if (lockdep_on) {
		int rep = dmesg_has("possible circular locking dependency");

		if (rep)
			diag("lockdep's cycle report, the locks it names:");
		lockdep_locks(locks, sizeof(locks));
		ok(rep && strstr(locks, "mapping_lock") && strstr(locks, "GPUSIM_RM_API_LOCK"),
		   "lockdep reports the lock-order cycle between the core's umem mapping lock and gpusim's RM lock (%s)",
		   rep ? "the report is in the kernel log; it is about lock classes: the orders exist, for different umems" :
			 "no report: nvidia-peermem's callback never called the core's invalidate under RM after a dma_map under the mapping lock?");
	} else {
		skip("lockdep is off in this boot: no lock-order check");
	}
	ok(!dmesg_has("blocked for more than"), "no hung task in the kernel log");
	if (peer_stats(cl->core_name, &s) == 0) {
		ok(s.alloc_mrs == s.dealloc_mrs, "the core's counters balance (alloc %lld, dealloc %lld MRs, %lld invalidated)",
		   s.alloc_mrs, s.dealloc_mrs, s.invalidated_mrs);
		peer_stats_diag(cl->core_name);
	}
	ok(gpu_idle(), "gpusim holds nothing (pins %lld, persistent %lld, DMA mappings %lld, allocations %lld)",
	   gsv("live_pins"), gsv("live_persistent_pins"), gsv("live_dma_mappings"), gsv("live_allocs"));
	ok(run("rmmod %s", cl->module) == 0, "rmmod %s", cl->module);
	ok(run("rmmod gpusim") == 0, "rmmod gpusim");
	return finish();
}
