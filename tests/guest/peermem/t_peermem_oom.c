// SPDX-License-Identifier: GPL-2.0
/*
 * Registrations under memory pressure: a child in a memory cgroup limited
 * to a little more than it starts with allocates GPU memory, host memory
 * (touched) and registers both, round after round, until something gives:
 * an allocation or a registration fails (it must fail with ENOMEM or
 * EFAULT, the errnos docs/module.md documents for an allocation failure),
 * or the kernel's OOM killer ends the child. Either way, once the child is
 * gone nothing may be left registered, pinned, mapped or allocated, and a
 * registration afterwards works. Two variants: the child exits holding
 * everything, and the child deregisters everything itself first.
 */
#include "peermem_test.h"
#include <sys/mount.h>
#include <sys/wait.h>

#define CG "/sys/fs/cgroup"
#define GRP CG "/peermem-oom"
#define CHUNK (256 * 1024UL)
#define ROUNDS 4000

/*
 * The child: returns 0 if it stopped at a clean ENOMEM/EFAULT, else a code
 * (60/61 no verbs or gpusim, 62 another errno, 63 a dereg failed, 64 the
 * limit was never reached).
 */
static int pressure(int cleanup)
{
	static struct ibv_mr *mrs[2 * ROUNDS];
	struct conn c;
	struct gmem g;
	int fd, n = 0, i, e = 0, rc = 0;

	if (conn_open(&c))
		return 60;
	fd = open("/dev/gpusim", O_RDWR);
	if (fd < 0)
		return 61;
	for (i = 0; i < ROUNDS; i++) {
		uint8_t *h;

		if (gmem_alloc(fd, CHUNK, &g)) {
			e = errno;
			break;
		}
		memset(g.p, i, CHUNK);
		mrs[n] = ibv_reg_mr(c.pd, g.p, CHUNK, MR_ACCESS);
		if (!mrs[n]) {
			e = errno;
			break;
		}
		n++;
		h = malloc(CHUNK);
		if (!h) {
			e = ENOMEM;
			break;
		}
		memset(h, i, CHUNK);
		mrs[n] = ibv_reg_mr(c.pd, h, CHUNK, MR_ACCESS);
		if (!mrs[n]) {
			e = errno;
			break;
		}
		n++;
	}
	printf("# child: %d MRs, then %s\n", n, i == ROUNDS ? "the round limit" : strerror(e));
	fflush(stdout);
	if (i == ROUNDS)
		rc = 64;	/* no pressure: the limit was never reached */
	else if (e != ENOMEM && e != EFAULT)
		rc = 62;
	if (cleanup) {
		for (i = 0; i < n; i++)
			if (ibv_dereg_mr(mrs[i]))
				rc = 63;
		conn_close(&c);
		close(fd);
	}
	return rc;
}

static int setup_cgroup(void)
{
	if (access(CG "/cgroup.controllers", F_OK) &&
	    mount("none", CG, "cgroup2", 0, NULL))
		return -1;
	write_str(CG "/cgroup.subtree_control", "+memory");
	rmdir(GRP);
	if (mkdir(GRP, 0755) && errno != EEXIST)
		return -1;
	/* 48 MiB: enough to start (verbs context, QPs), not for 4000 rounds of 512 KiB. */
	if (write_str(GRP "/memory.max", "50331648"))
		return -1;
	/* No swap file without CONFIG_SWAP (the rig has none): nothing to limit. */
	return access(GRP "/memory.swap.max", F_OK) == 0 && write_str(GRP "/memory.swap.max", "0") ? -1 : 0;
}

static int one_registration(void)
{
	struct conn c;
	struct gmem g;
	struct ibv_mr *mr;
	int fd = open("/dev/gpusim", O_RDWR), good;

	if (fd < 0 || conn_open(&c))
		return 0;
	if (gmem_alloc(fd, CHUNK, &g)) {
		close(fd);
		conn_close(&c);
		return 0;
	}
	mr = ibv_reg_mr(c.pd, g.p, CHUNK, MR_ACCESS);
	good = mr != NULL;
	if (mr)
		ibv_dereg_mr(mr);
	gmem_free(fd, &g);
	gmem_drop(&g);
	conn_close(&c);
	close(fd);
	return good;
}

int main(void)
{
	rxe_up();
	load_modules(NULL);
	/* The debug rig has the memory controller (CONFIG_MEMCG): its absence is a rig bug. */
	if (setup_cgroup())
		bail("memory pressure: no cgroup v2 memory controller (%s); the rig's debug.config sets CONFIG_MEMCG",
		     strerror(errno));
	for (int cleanup = 0; cleanup < 2; cleanup++) {
		const char *v = cleanup ? "deregistering first" : "exiting holding everything";
		int st = -1;
		pid_t pid;
		char pidbuf[32];

		fflush(stdout);
		pid = fork();
		if (pid == 0) {
			snprintf(pidbuf, sizeof(pidbuf), "%d", getpid());
			if (write_str(GRP "/cgroup.procs", pidbuf))
				_exit(70);
			_exit(pressure(cleanup));
		}
		if (pid < 0 || waitpid(pid, &st, 0) != pid)
			bail("fork/wait failed");
		ok((WIFEXITED(st) && WEXITSTATUS(st) == 0) || (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL),
		   "%s: the child stopped at a clean ENOMEM/EFAULT or was OOM-killed (%s %d)", v,
		   WIFEXITED(st) ? "exit" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
		run("grep -E '^(oom|oom_kill|max) ' " GRP "/memory.events | sed 's/^/# memory.events: /'");
		ok(wait_for(all_idle, 60), "%s: nothing left registered, pinned, mapped or allocated", v);
		if (!all_idle()) {
			pm_diag();
			gs_diag();
		}
		ok(one_registration(), "%s: a registration afterwards works", v);
	}
	rmdir(GRP);
	ok(pm_rmmod() == 0, "rmmod peermem");
	return finish();
}
