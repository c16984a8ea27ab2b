// SPDX-License-Identifier: GPL-2.0
/*
 * t_peermem_p2p - peermem's PFN-map source on a PCI BAR (docs/module.md,
 * "PFN-mapped memory"): device memory a driver maps to user space with
 * io_remap_pfn_range, registered with plain ibv_reg_mr and reached by the
 * RDMA device peer-to-peer.
 *
 * The rig (scripts/vm.sh) puts the DMA device (edu) and an ivshmem device
 * (a 32 MiB memory BAR) behind one PCIe switch, and a second ivshmem on the
 * root complex. rxe reaches a bus address of the switch's ivshmem the way
 * the switch would route it, unless a downstream port on the way redirects
 * peer requests upstream (ACS), and then only through the IOMMU (docs/core.md).
 * The exporter's physical window maps a BAR as a driver would.
 *
 *  - where the switch ports have ACS (QEMU's xio3130 has not: skipped,
 *    cause named): with ACS redirect on (the kernel's choice with an
 *    IOMMU) pci_p2pdma_distance says no, ibv_reg_mr fails with EOPNOTSUPP,
 *    the kernel says which parameter would change that and nothing is held;
 *    the redirect turned on under a live MR makes the next RDMA complete in
 *    error (the request goes to the IOMMU, where nothing mapped the bus
 *    address) without writing anything;
 *  - with no redirect (no ACS, or turned off as `setpci` does, what
 *    GPUDirect guides tell administrators to do), the BAR is registered by
 *    its bus addresses (one scatter entry), RDMA WRITE, READ and atomics
 *    reach it, every byte checked through the BAR's own sysfs mapping;
 *  - the driver's zap (unmap_mapping_range) revokes the MR, nothing written
 *    after;
 *  - the root complex's ivshmem is refused (EOPNOTSUPP: q35's host bridge
 *    is not one the kernel allows peer-to-peer through);
 *  - with pfnmap_ram_only=1 a BAR is "not mine" (EFAULT) while RAM still
 *    works (t_peermem_pfnmap);
 *  - counters move and come back, the core's balance, nothing leaks, and
 *    the ports' ACS control is restored.
 */
#include "pfnmap_test.h"

#define XFER (4u << 20)
#define ACS_CAP_ID 0x000d
#define ACS_CTRL 6
#define ACS_REDIRECT (0x0004 | 0x0008 | 0x0020)	/* RR | CR | EC */

static struct conn c;
static struct ibv_mr *lmr;
static uint8_t *h, *buf;
static int efd;

static struct rig_bar sw, rc;	/* ivshmem behind the switch, on the root complex */
static char dma_port[32];
/* The ports whose ACS control the test changes, and their values before. */
static const char *acs_port[2];
static int acs_off[2] = { -1, -1 }, acs_orig[2];

/* RDMA op between h + hoff and the remote MR at raddr; recreates the QPs after an error. */
static int rdma(enum ibv_wr_opcode op, uint64_t hoff, uint32_t len, uint64_t raddr, uint32_t rkey)
{
	return rdma_op_renew(&c, op, lmr, h + hoff, len, raddr, rkey);
}

/* Find the two ivshmem devices and the DMA device's port. */
static void find_devices(void)
{
	if (rig_ivshmem(&sw, &rc, dma_port, sizeof(dma_port)))
		bail("the rig's two ivshmem devices were not found (behind the switch: %s, on the root complex: %s); scripts/vm.sh sets them up",
		     sw.dev[0] ? sw.dev : "none", rc.dev[0] ? rc.dev : "none");
	diag("DMA device %s below port %s; ivshmem %s below port %s, BAR 2 %#llx+%#llx; ivshmem %s on the root complex, BAR 2 %#llx+%#llx",
	     getenv("PEERMEM_DMA_DEVICE"), dma_port, sw.dev, sw.port, (unsigned long long)sw.phys,
	     (unsigned long long)sw.len, rc.dev, (unsigned long long)rc.phys, (unsigned long long)rc.len);
}

/* The sysfs resource2 mapping of a BAR (the BAR's CPU view). */
static void map_cpu_view(struct rig_bar *b)
{
	char path[256];
	int fd;

	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/resource2", b->dev);
	fd = open(path, O_RDWR | O_SYNC);
	if (fd < 0)
		bail("open %s: %s", path, strerror(errno));
	b->cpu = mmap(NULL, b->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (b->cpu == MAP_FAILED)
		bail("mmap %s: %s", path, strerror(errno));
}

/* ACS capability offset of a port in its config space, 0 if none. */
static int acs_offset(const char *port)
{
	char path[256];
	uint32_t hdr;
	int fd, off = 0x100, n = 0;

	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/config", port);
	fd = open(path, O_RDONLY);
	if (fd < 0)
		return 0;
	while (off >= 0x100 && n++ < 64) {
		if (pread(fd, &hdr, 4, off) != 4 || hdr == 0 || hdr == 0xffffffff)
			break;
		if ((hdr & 0xffff) == ACS_CAP_ID) {
			close(fd);
			return off;
		}
		off = (hdr >> 20) & 0xffc;
	}
	close(fd);
	return 0;
}

static int acs_rw(int i, int write, uint16_t *v)
{
	char path[256];
	int fd, r;

	if (acs_off[i] <= 0)
		return -1;

	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/config", acs_port[i]);
	fd = open(path, write ? O_WRONLY : O_RDONLY);
	if (fd < 0)
		return -1;
	r = write ? pwrite(fd, v, 2, acs_off[i] + ACS_CTRL) : pread(fd, v, 2, acs_off[i] + ACS_CTRL);
	close(fd);
	return r == 2 ? 0 : -1;
}

/* Whether both ports have an ACS capability the test can change. */
static int have_acs(void)
{
	return acs_off[0] > 0 && acs_off[1] > 0;
}

/* Turn request redirect on, or every redirect bit off, at port i. */
static int acs_port_redirect(int i, int on)
{
	uint16_t v;

	if (acs_rw(i, 0, &v))
		return -1;
	v = on ? (v | 0x0004) : (v & ~ACS_REDIRECT);
	return acs_rw(i, 1, &v);
}

/* Clear the redirect bits on both ports. */
static int acs_clear_all(void)
{
	return acs_port_redirect(0, 0) || acs_port_redirect(1, 0) ? -1 : 0;
}

static void acs_restore(void)
{
	for (int i = 0; i < 2; i++) {
		uint16_t v = acs_orig[i];

		if (acs_off[i] > 0)
			acs_rw(i, 1, &v);
	}
}

/* Map [phys, phys + len) through the exporter's window (as a driver maps its BAR). */
static uint8_t *map_window(uint64_t phys, uint64_t len)
{
	struct pfnmap_window w = { .phys = phys, .len = len };
	void *p;

	if (ioctl(efd, PFNMAP_IOC_WINDOW, &w))
		bail("PFNMAP_IOC_WINDOW %#llx+%#llx: %s", (unsigned long long)phys,
		     (unsigned long long)len, strerror(errno));
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, efd, PFNMAP_WINDOW_OFFSET);
	if (p == MAP_FAILED)
		bail("mmap of the window %#llx+%#llx: %s", (unsigned long long)phys,
		     (unsigned long long)len, strerror(errno));
	return p;
}

/* ibv_reg_mr that must fail: its errno (0 if it did not fail). */
static int reg_fails(void *p, size_t len, int access)
{
	struct ibv_mr *mr;

	errno = 0;
	mr = ibv_reg_mr(c.pd, p, len, access);
	if (mr) {
		ibv_dereg_mr(mr);
		return 0;
	}
	return errno;
}

/* Fetch-and-add of add at raddr: the old value in *old; the completion status. */
static int fetch_add(uint64_t raddr, uint32_t rkey, uint64_t add, uint64_t *old)
{
	struct ibv_sge sge = { .addr = (uintptr_t)h, .length = 8, .lkey = lmr->lkey };
	struct ibv_send_wr wr;
	int rc;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = 7;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.atomic.remote_addr = raddr;
	wr.wr.atomic.rkey = rkey;
	wr.wr.atomic.compare_add = add;
	rc = post_wait(&c, &wr);
	memcpy(old, h, 8);
	return rc;
}

/* Allow remote atomics on the responder QP (conn_open's QPs do not). */
static void allow_atomics(void)
{
	struct ibv_qp_attr a = {
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC,
	};

	if (ibv_modify_qp(c.qb, &a, IBV_QP_ACCESS_FLAGS))
		bail("cannot allow remote atomics on the responder QP");
}

static void test_acs_on(uint8_t *p)
{
	long long acq = pf("registrations_acquired"), rel = pf("registrations_released");
	long long refused = pf("bar_maps_refused");
	int e;

	if (!have_acs()) {
		skip("the refusal under ACS redirect is not checked: the switch's downstream ports have no ACS capability (QEMU's xio3130 implements none; docs/core.md)");
		return;
	}
	if (!(acs_orig[0] & ACS_REDIRECT)) {
		skip("the refusal under ACS redirect is not checked: the kernel left ACS redirect off on %s (control %#x)",
		     dma_port, acs_orig[0]);
		return;
	}
	e = reg_fails(p, sw.len, MR_ACCESS);
	ok(e == EOPNOTSUPP && pf("bar_maps_refused") == refused + 1 &&
	   pf("registrations_acquired") == acq + 1 && pf("registrations_released") == rel + 1,
	   "ACS redirect on the switch ports: ibv_reg_mr of the BAR fails with EOPNOTSUPP (got errno %d), pfn bar_maps_refused +1, claimed and given back",
	   e);
	ok(dmesg_has("ACS redirect is set between the client and provider") &&
	   dmesg_has("pci=disable_acs_redir=") && dmesg_has("cannot reach this PCI BAR peer-to-peer"),
	   "the kernel log says why (ACS redirect), what to change (pci=disable_acs_redir=) and what failed");
	ok(pf_idle() && pm_balanced(), "nothing held after the refusal: pfn counters idle, the core's balance");
}

static void test_bus_addr(uint8_t *p)
{
	long long bus0 = pf("bar_maps_bus_addr"), coal0 = pf("sg_entries_coalesced");
	uint64_t off = sw.len / 2 + 4096, old = 0, now_v;
	struct ibv_mr *mr;
	int rc;

	if (have_acs())
		ok(acs_clear_all() == 0, "ACS redirect turned off on the ports of the DMA device (%s) and the BAR (%s), as setpci would",
		   dma_port, sw.port);
	mr = ibv_reg_mr(c.pd, p, sw.len, MR_ACCESS | IBV_ACCESS_REMOTE_ATOMIC);
	ok(mr && pf("bar_maps_bus_addr") == bus0 + 1 && pf("sg_entries_coalesced") == coal0 + 1,
	   "ACS redirect off: ibv_reg_mr of the %llu MiB BAR succeeds (errno %d), mapped by bus address (pfn bar_maps_bus_addr %+lld), one scatter entry (%+lld)",
	   (unsigned long long)(sw.len >> 20), mr ? 0 : errno, pf("bar_maps_bus_addr") - bus0,
	   pf("sg_entries_coalesced") - coal0);
	if (!mr)
		bail("no MR on the BAR; the rest would mean nothing");

	/* XFER bytes per transfer: rxe copies MMIO at TCG speed. */
	fill(buf, sw.len, 0x7000);
	memcpy(sw.cpu, buf, sw.len);
	fill(h, XFER, 0x7101);
	rc = rdma(IBV_WR_RDMA_WRITE, 0, XFER, (uintptr_t)p + sw.len - XFER, mr->rkey);
	memcpy(buf + sw.len - XFER, h, XFER);
	ok(rc == 0 && !memcmp(sw.cpu, buf, sw.len),
	   "RDMA WRITE of the BAR's last %u MiB: status %d, every byte of the BAR read back through its sysfs mapping (written there, nowhere else)",
	   XFER >> 20, rc);
	fill(buf, sw.len, 0x7202);
	memcpy(sw.cpu, buf, sw.len);
	memset(h, 0, XFER);
	rc = rdma(IBV_WR_RDMA_READ, 0, XFER, (uintptr_t)p, mr->rkey);
	ok(rc == 0 && !memcmp(h, buf, XFER),
	   "RDMA READ of the BAR's first %u MiB: status %d, every byte is what the CPU wrote there", XFER >> 20, rc);
	fill(h, 100000, 0x7303);
	rc = rdma(IBV_WR_RDMA_WRITE, 0, 100000, (uintptr_t)p + off - 50001, mr->rkey);
	memcpy(buf + off - 50001, h, 100000);
	ok(rc == 0 && !memcmp(sw.cpu, buf, sw.len),
	   "RDMA WRITE of 100000 bytes at an odd offset lands there and nowhere else (status %d)", rc);
	memcpy(&now_v, sw.cpu + off, 8);
	allow_atomics();
	rc = fetch_add((uintptr_t)p + off, mr->rkey, 5, &old);
	{
		uint64_t after;

		memcpy(&after, sw.cpu + off, 8);
		ok(rc == 0 && old == now_v && after == now_v + 5,
		   "atomic fetch-and-add on the BAR: status %d, returned the old value (%s), the BAR holds old + 5 (%s)",
		   rc, old == now_v ? "yes" : "no", after == now_v + 5 ? "yes" : "no");
		memcpy(buf + off, &after, 8);
	}

	/* The path changes under the live MR. */
	if (have_acs()) {
		ok(acs_port_redirect(0, 1) == 0, "ACS redirect turned back on at the DMA device's port (%s), the MR live", dma_port);
		fill(h, 4096, 0x7404);
		rc = rdma(IBV_WR_RDMA_WRITE, 0, 4096, (uintptr_t)p, mr->rkey);
		ok(rc == IBV_WC_REM_ACCESS_ERR && !memcmp(sw.cpu, buf, sw.len),
		   "the next RDMA WRITE completes with status 10, remote access error (got %d, %s), and writes nothing: redirected upstream, the bus address is not mapped in the IOMMU",
		   rc, wc_str(rc));
		ok(acs_port_redirect(0, 0) == 0, "ACS redirect off again at %s", dma_port);
	} else {
		skip("ACS redirect turned on under a live MR is not checked: the switch's downstream ports have no ACS capability (QEMU's xio3130 implements none; docs/core.md)");
	}
	fill(h, 4096, 0x7404);
	rc = rdma(IBV_WR_RDMA_WRITE, 0, 4096, (uintptr_t)p, mr->rkey);
	memcpy(buf, h, 4096);
	ok(rc == 0 && !memcmp(sw.cpu, buf, sw.len), "RDMA WRITE of 4 KiB at the start lands (status %d)", rc);

	/* The driver zaps its mappings (device removal, reset). */
	{
		long long inv = pf("invalidations_mmu_notifier");

		if (ioctl(efd, PFNMAP_IOC_ZAP))
			bail("zap: %s", strerror(errno));
		ok(pf("invalidations_mmu_notifier") == inv + 1 && pmc_live_maps(PMDBG_PFN) == 0,
		   "the driver's unmap_mapping_range revoked the BAR's MR before it returned (pfn invalidations_mmu_notifier +1, no live mapping)");
	}
	fill(h, 4096, 0x7505);
	rc = rdma(IBV_WR_RDMA_WRITE, 0, 4096, (uintptr_t)p, mr->rkey);
	ok(rc == IBV_WC_REM_ACCESS_ERR && !memcmp(sw.cpu, buf, sw.len),
	   "RDMA WRITE to the revoked MR completes with status 10 and writes nothing (got %d, %s)", rc, wc_str(rc));
	ok(ibv_dereg_mr(mr) == 0 && pf_idle() && pm_balanced(),
	   "ibv_dereg_mr; pfn counters idle, the core's balance");
}

static void test_root_complex(void)
{
	long long refused = pf("bar_maps_refused");
	uint8_t *p = map_window(rc.phys, rc.len);
	int e = reg_fails(p, rc.len, MR_ACCESS);

	ok(e == EOPNOTSUPP && pf("bar_maps_refused") == refused + 1,
	   "the root complex's ivshmem BAR (%s): ibv_reg_mr fails with EOPNOTSUPP (got errno %d), pfn bar_maps_refused +1: no switch in common, q35's host bridge is not allowed peer-to-peer",
	   rc.dev, e);
	munmap(p, rc.len);
	ok(dmesg_has("do not share an upstream bridge or whitelisted host bridge") &&
	   dmesg_has("cannot reach this PCI BAR peer-to-peer"),
	   "the kernel log says why (pci_p2pdma_distance: no upstream bridge or allowed host bridge in common) and what failed");
	ok(pf_idle() && pm_balanced(), "nothing held: pfn counters idle, the core's balance");
}

static void test_ram_only(void)
{
	long long decl;
	uint8_t *p;
	int e;

	conn_close(&c);
	ibv_dereg_mr(lmr);
	load_modules("pfnmap=1 pfnmap_ram_only=1");
	ok(pm_param_on("pfnmap_ram_only"), "peermem reloaded with pfnmap=1 pfnmap_ram_only=1");
	if (conn_open(&c))
		bail("cannot open rxe0 after the reload");
	lmr = ibv_reg_mr(c.pd, h, sw.len, MR_ACCESS);
	if (!lmr)
		bail("ibv_reg_mr on host memory: %s", strerror(errno));
	decl = pf("registrations_declined");
	p = map_window(sw.phys, sw.len);
	e = reg_fails(p, sw.len, MR_ACCESS);
	ok(e == EFAULT && pf("registrations_declined") == decl + 1 && pf("bar_maps_refused") == 0 &&
	   pf("bar_maps_bus_addr") == 0,
	   "pfnmap_ram_only=1: the switch's BAR, reachable peer-to-peer, is not served: EFAULT as without peermem (got errno %d), pfn registrations_declined +1",
	   e);
	ok(dmesg_has("maps a PCI BAR and pfnmap_ram_only=Y"), "the kernel log says the BAR was refused for pfnmap_ram_only");
	munmap(p, sw.len);
}

int main(void)
{
	uint8_t *p;

	find_devices();
	acs_port[0] = dma_port;
	acs_port[1] = sw.port;
	for (int i = 0; i < 2; i++) {
		uint16_t v = 0;

		acs_off[i] = acs_offset(acs_port[i]);
		if (acs_off[i] > 0 && acs_rw(i, 0, &v) == 0)
			acs_orig[i] = v;
		diag("port %s: ACS capability at %#x, control %#x", acs_port[i], acs_off[i], v);
	}
	atexit(acs_restore);
	h = aligned_alloc(4096, sw.len);
	buf = malloc(sw.len);
	if (!h || !buf)
		bail("out of memory");
	map_cpu_view(&sw);
	rxe_up();
	exporter_load();
	efd = exporter_open(O_RDWR);
	load_modules("pfnmap=1");
	if (conn_open(&c))
		bail("cannot open rxe0");
	lmr = ibv_reg_mr(c.pd, h, sw.len, MR_ACCESS);
	if (!lmr)
		bail("ibv_reg_mr on host memory: %s", strerror(errno));
	p = map_window(sw.phys, sw.len);

	test_acs_on(p);
	test_bus_addr(p);
	munmap(p, sw.len);
	test_root_complex();
	test_ram_only();

	acs_restore();
	if (have_acs()) {
		uint16_t v0 = 0, v1 = 0;

		ok(acs_rw(0, 0, &v0) == 0 && acs_rw(1, 0, &v1) == 0 && v0 == acs_orig[0] &&
		   v1 == acs_orig[1], "the ports' ACS control is restored (%#x, %#x)", v0, v1);
	}
	ibv_dereg_mr(lmr);
	conn_close(&c);
	close(efd);
	ok(wait_for(all_idle, 10) && pf_idle(), "peermem (every client and the pfn source) and gpusim idle at the end");
	ok(run("rmmod peermem") == 0 && run("rmmod pfnmap_exporter") == 0, "rmmod peermem and the exporter");
	ok(!dmesg_has("peermem: BUG|no longer holds"), "peermem reported no internal error");
	return finish();
}
