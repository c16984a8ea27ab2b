// SPDX-License-Identifier: GPL-2.0
/*
 * Debian's perftest, unmodified, moving data through peermem: the tools an
 * operator verifies GPUDirect RDMA with (docs/install.md, "Verifying"),
 * server and client over rxe0 in one guest, the server's buffer registered
 * through peermem with perftest's --mmap=FILE:
 *  - the PFN exporter's reserved-RAM ring (/dev/pfnmap_exporter, peermem's
 *    PFN source, pfnmap=1), and host memory in the same boot for
 *    comparison: ib_write_bw, ib_read_bw, ib_send_bw, ib_write_lat each
 *    exit 0 with a result line, and peermem's PFN counters show the
 *    registration served and released (ib_write_bw on host memory too);
 *  - a PCI BAR: the ivshmem device behind the rig's PCIe switch, mapped by
 *    perftest itself through its sysfs file
 *    (--mmap=/sys/bus/pci/devices/<dev>/resource2, io_remap_pfn_range):
 *    the four tools exit 0 with a result line, and peermem's PFN source
 *    maps the BAR by its bus addresses (bar_maps_bus_addr), peer-to-peer
 *    through the switch (QEMU's switch ports have no ACS to redirect it;
 *    t_peermem_p2p covers ACS);
 *  - the ring zapped by its exporter mid-run (PFNMAP_IOC_ZAP): peermem
 *    revokes the MR, perftest reports the failed completion and exits
 *    non-zero, nothing stays registered, no kernel report.
 * Each result line is printed as a diagnostic beside host memory's, the
 * bandwidth of each buffer kind in the same boot.
 *  - emulated GPU memory: gpusim's /dev/gpusim_mmap, whose every mmap
 *    allocates GPU memory at a 64 KiB aligned address (what cudaMalloc
 *    gives; on a GPU server perftest's --use_cuda reaches GPU memory):
 *    the four tools through peermem's nv_mem client, and the memory freed
 *    mid-run (gpusim's free_mmap_allocs, a cudaFree): the free callback
 *    revokes the MR, perftest fails, nothing stays pinned.
 * Not here: the BAR revoked mid-run (nothing revokes a sysfs resource
 * mapping short of removing the device; the exporter's window zap,
 * t_peermem_p2p, is that case).
 */
#include <sys/wait.h>

#include "pfnmap_test.h"

#define RING (4 * 1024 * 1024UL)
#define GPUSIM_MMAP "/dev/gpusim_mmap"
#define OUT_DIR_DEFAULT "/tmp"

static char out_dir[256];

/* Runs cmd in the background with its output in file; returns the pid. */
static pid_t spawn(const char *cmd, const char *file)
{
	pid_t pid;

	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		char sh[1024];

		snprintf(sh, sizeof(sh), "exec %s > %s 2>&1", cmd, file);
		execl("/bin/sh", "sh", "-c", sh, (char *)NULL);
		_exit(127);
	}
	return pid;
}

/* Waits (bounded) for pid; its exit status, or -1 (killed after the limit). */
static int reap(pid_t pid, double secs)
{
	double end = now_s() + slow_s(secs);
	int st;

	while (now_s() < end) {
		if (waitpid(pid, &st, WNOHANG) == pid)
			return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
		usleep(50000);
	}
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	return -1;
}

/* The first result line of a perftest output: the one after its "#bytes" header. */
static int result_line(const char *file, char *line, size_t n)
{
	FILE *f = fopen(file, "r");
	char buf[512];
	int next = 0, found = 0;

	if (!f)
		return 0;
	while (fgets(buf, sizeof(buf), f)) {
		if (next && buf[strspn(buf, " ")] >= '0' && buf[strspn(buf, " ")] <= '9') {
			snprintf(line, n, "%s", buf + strspn(buf, " "));
			line[strcspn(line, "\n")] = 0;
			found = 1;
			break;
		}
		if (strstr(buf, "#bytes"))
			next = 1;
	}
	fclose(f);
	return found;
}

/*
 * A failed run's evidence: the last lines of a perftest output, as TAP
 * comments (the files are in the guest's tmpfs and go with it).
 */
static void show_tail(const char *what, const char *file)
{
	char lines[20][256];
	unsigned int n = 0;
	FILE *f = fopen(file, "r");

	if (!f) {
		printf("# %s: %s is missing\n", what, file);
		return;
	}
	while (fgets(lines[n % 20], sizeof(lines[0]), f))
		n++;
	fclose(f);
	printf("# %s (%s), its last %u of %u lines:\n", what, file, n < 20 ? n : 20, n);
	for (unsigned int i = n < 20 ? 0 : n - 20; i < n; i++) {
		lines[i % 20][strcspn(lines[i % 20], "\n")] = 0;
		printf("#   %s\n", lines[i % 20]);
	}
	fflush(stdout);
}

/*
 * One perftest run: server (with --mmap=mmap if given) and client over
 * rxe0. Returns the client's status; the server's in *srv; the client's
 * result line in line.
 */
static int perftest(const char *tool, const char *mmap, const char *extra, int *srv, char *line,
		    size_t n)
{
	char cmd[512], sfile[300], cfile[300];
	pid_t s, cl;
	int rc = -1;

	snprintf(sfile, sizeof(sfile), "%s/%s-server.txt", out_dir, tool);
	snprintf(cfile, sizeof(cfile), "%s/%s-client.txt", out_dir, tool);
	snprintf(cmd, sizeof(cmd), "%s -d " RXE_DEV " -x 1 -F %s%s %s", tool, mmap ? "--mmap=" : "",
		 mmap ? mmap : "", extra);
	s = spawn(cmd, sfile);
	/*
	 * The server listens once it has set up; retry the client while it
	 * runs. Five tries (about 5 s) were once too few on a loaded machine
	 * (the ib_write_lat server on GPU memory, the client failing every
	 * time and the server killed waiting for it): twelve.
	 */
	for (int i = 0; i < 12; i++) {
		usleep((useconds_t)(slow_s(1.0) * 1e6));
		snprintf(cmd, sizeof(cmd), "%s -d " RXE_DEV " -x 1 -F %s 10.55.0.1", tool, extra);
		cl = spawn(cmd, cfile);
		rc = reap(cl, 60);
		/* Done, or the server gave up (then its status tells). */
		if (rc == 0 || kill(s, 0) != 0)
			break;
	}
	*srv = reap(s, 30);
	if (rc != 0 || *srv != 0) {
		printf("# %s: client %d (its last try), server %d\n", tool, rc, *srv);
		show_tail("the server's output", sfile);
		show_tail("the client's output, its last try", cfile);
	}
	if (!result_line(cfile, line, n) && !result_line(sfile, line, n))
		snprintf(line, n, "(no result line)");
	return rc;
}

int main(void)
{
	static const char *const tools[] = { "ib_write_bw", "ib_read_bw", "ib_send_bw", "ib_write_lat" };
	static const char *const extras[] = { "-s 65536 -n 10", "-s 65536 -n 10", "-s 65536 -n 10",
					       "-s 4096 -n 10" };
	char line[256], host_line[256];
	long long acq0, rel0;
	int efd, rc, srv;

	snprintf(out_dir, sizeof(out_dir), "%s", getenv("PEERMEM_RESULTS") ?: OUT_DIR_DEFAULT);
	if (access("/usr/bin/ib_write_bw", X_OK))
		bail("perftest is not installed (Debian's perftest; scripts/setup-host.sh installs it)");
	rxe_up();
	exporter_load();
	load_modules("pfnmap=1");
	efd = exporter_open(O_RDWR);
	if (exporter_alloc(efd, RING, PFNMAP_RESERVED, NULL))
		bail("the exporter cannot allocate a %lu-byte ring", RING);

	/* Host memory, for comparison (ib_write_bw; the others take as long). */
	rc = perftest(tools[0], NULL, extras[0], &srv, host_line, sizeof(host_line));
	ok(rc == 0 && srv == 0, "%s, host memory: client %d, server %d: %s", tools[0], rc, srv, host_line);
	for (unsigned i = 0; i < sizeof(tools) / sizeof(tools[0]); i++) {
		acq0 = pf("registrations_acquired");
		rel0 = pf("registrations_released");
		rc = perftest(tools[i], PFNMAP_DEV, extras[i], &srv, line, sizeof(line));
		ok(rc == 0 && srv == 0 && strcmp(line, "(no result line)") &&
		   pf("registrations_acquired") > acq0 &&
		   pf("registrations_released") - rel0 == pf("registrations_acquired") - acq0,
		   "%s, the exporter's ring through peermem's PFN source (--mmap=%s): client %d, server %d, registered %+lld and released: %s",
		   tools[i], PFNMAP_DEV, rc, srv, pf("registrations_acquired") - acq0, line);
	}

	/* A PCI BAR, through its sysfs resource file: perftest maps it itself. */
	{
		struct rig_bar sw, rc_bar;
		char port[32], bar[128];

		if (rig_ivshmem(&sw, &rc_bar, port, sizeof(port)))
			bail("the rig's ivshmem devices were not found (scripts/vm.sh adds them)");
		snprintf(bar, sizeof(bar), "/sys/bus/pci/devices/%s/resource2", sw.dev);
		for (unsigned i = 0; i < sizeof(tools) / sizeof(tools[0]); i++) {
			long long bus0 = pf("bar_maps_bus_addr");

			acq0 = pf("registrations_acquired");
			rel0 = pf("registrations_released");
			rc = perftest(tools[i], bar, extras[i], &srv, line, sizeof(line));
			ok(rc == 0 && srv == 0 && strcmp(line, "(no result line)") &&
			   pf("bar_maps_bus_addr") > bus0 &&
			   pf("registrations_released") - rel0 == pf("registrations_acquired") - acq0,
			   "%s, a PCI BAR behind the switch (--mmap=%s): client %d, server %d, mapped by bus address %+lld, registered %+lld and released: %s",
			   tools[i], bar, rc, srv, pf("bar_maps_bus_addr") - bus0,
			   pf("registrations_acquired") - acq0, line);
		}
		ok(pf_idle(), "after the BAR runs: nothing registered or mapped by the PFN source");
	}

	/* Emulated GPU memory: perftest maps /dev/gpusim_mmap itself. */
	{
		static const char *const gextras[] = { "-s 65536 -n 10", "-s 65536 -n 10",
						       "-s 65536 -n 10", "-s 32768 -n 10" };
		char sfile[300], cfile[300];
		long long inv0;
		pid_t s, cl;

		for (unsigned i = 0; i < sizeof(tools) / sizeof(tools[0]); i++) {
			acq0 = pmc(PMDBG, "registrations_acquired");
			rel0 = pmc(PMDBG, "registrations_released");
			rc = perftest(tools[i], GPUSIM_MMAP, gextras[i], &srv, line, sizeof(line));
			ok(rc == 0 && srv == 0 && strcmp(line, "(no result line)") &&
			   pmc(PMDBG, "registrations_acquired") > acq0 &&
			   pmc(PMDBG, "registrations_released") - rel0 ==
				   pmc(PMDBG, "registrations_acquired") - acq0,
			   "%s, emulated GPU memory through peermem's nv_mem (--mmap=%s): client %d, server %d, registered %+lld and released: %s",
			   tools[i], GPUSIM_MMAP, rc, srv, pmc(PMDBG, "registrations_acquired") - acq0,
			   line);
		}
		/* The GPU memory freed mid-run (a cudaFree): revoked, perftest fails. */
		inv0 = pmc(PMDBG, "invalidations_gpu_free");
		acq0 = pmc(PMDBG, "registrations_acquired");
		snprintf(sfile, sizeof(sfile), "%s/gpufree-server.txt", out_dir);
		snprintf(cfile, sizeof(cfile), "%s/gpufree-client.txt", out_dir);
		s = spawn("ib_write_bw -d " RXE_DEV " -x 1 -F -s 65536 -D 10 --mmap=" GPUSIM_MMAP, sfile);
		usleep((useconds_t)(slow_s(1.5) * 1e6));
		cl = spawn("ib_write_bw -d " RXE_DEV " -x 1 -F -s 65536 -D 10 10.55.0.1", cfile);
		for (double end = now_s() + slow_s(20);
		     pmc(PMDBG, "registrations_acquired") == acq0 && now_s() < end;)
			usleep(50000);
		usleep((useconds_t)(slow_s(1.0) * 1e6));
		write_str(GSDBG "free_mmap_allocs", "1");
		srv = reap(s, 40);
		rc = reap(cl, 40);
		ok(pmc(PMDBG, "invalidations_gpu_free") > inv0 && rc != 0 && srv != -1,
		   "ib_write_bw on GPU memory freed mid-run (gpusim free_mmap_allocs): the MR is revoked (invalidations_gpu_free %+lld), the client exits with %d, the server with %d",
		   pmc(PMDBG, "invalidations_gpu_free") - inv0, rc, srv);
		ok(wait_for(gs_idle, 10), "after the GPU runs: gpusim idle (nothing allocated, pinned or mapped)");
		if (!gs_idle())
			gs_diag();
	}

	/* The ring zapped mid-run: revoked, perftest fails, nothing left. */
	{
		char sfile[300], cfile[300];
		long long inv0 = pf("invalidations_mmu_notifier");
		pid_t s, cl;

		acq0 = pf("registrations_acquired");
		snprintf(sfile, sizeof(sfile), "%s/zap-server.txt", out_dir);
		snprintf(cfile, sizeof(cfile), "%s/zap-client.txt", out_dir);
		s = spawn("ib_write_bw -d " RXE_DEV " -x 1 -F -s 65536 -D 10 --mmap=" PFNMAP_DEV, sfile);
		usleep((useconds_t)(slow_s(1.5) * 1e6));
		cl = spawn("ib_write_bw -d " RXE_DEV " -x 1 -F -s 65536 -D 10 10.55.0.1", cfile);
		for (double end = now_s() + slow_s(20);
		     pf("registrations_acquired") == acq0 && now_s() < end;)
			usleep(50000);
		usleep((useconds_t)(slow_s(1.0) * 1e6));
		rc = ioctl(efd, PFNMAP_IOC_ZAP);
		srv = reap(s, 40);
		rc = reap(cl, 40);
		ok(pf("invalidations_mmu_notifier") > inv0 && rc != 0 && srv != -1,
		   "ib_write_bw on the ring, zapped by its exporter mid-run: the MR is revoked (invalidations %+lld), the client exits with %d, the server with %d",
		   pf("invalidations_mmu_notifier") - inv0, rc, srv);
		ok(wait_for(pf_idle, 10), "after the zap: nothing registered or mapped by the PFN source");
	}
	ioctl(efd, PFNMAP_IOC_FREE);
	close(efd);
	ok(pm_rmmod() == 0 && run("rmmod pfnmap_exporter") == 0, "rmmod peermem and the exporter");
	return finish();
}
