// SPDX-License-Identifier: GPL-2.0
/*
 * t_peermem_genpage - the lifetime of /dev/peermem's generation page
 * against the module's (issue 21, finding 8; docs/module.md, "Revocation
 * events", Lifetime). Both promises the documentation makes:
 *
 *  - a mapping of the page holds the module: with the file closed but the
 *    page still mapped, rmmod is refused (the mapping holds the file, the
 *    file the module);
 *  - the page itself may outlive the module, through a reference taken on
 *    it from the mapping (here: vmsplice into a pipe; the same holds for
 *    an MR or O_DIRECT I/O that pinned it): with the mapping gone, rmmod
 *    succeeds, and the pipe still reads the page whole (its version and
 *    record size), then frees it with no module code involved (KASAN,
 *    kmemleak and the page allocator's checks see it).
 */
#define _GNU_SOURCE	/* vmsplice(), before the first system header */
#include "peermem_test.h"
#include <fcntl.h>
#include <sys/uio.h>
#include "../../../include/uapi/peermem.h"

int main(void)
{
	struct peermem_gen_page pg;
	struct iovec iov;
	int fd, p[2], ret;
	ssize_t n;
	void *map;
	char buf[4096];

	load_modules(NULL);
	fd = open(PEERMEM_DEVICE_PATH, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		bail("open %s: %s", PEERMEM_DEVICE_PATH, strerror(errno));
	map = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED)
		bail("mmap of the generation page: %s", strerror(errno));
	memcpy(&pg, map, sizeof(pg));
	ok(pg.version == PEERMEM_EVENTS_VERSION && pg.event_size == sizeof(struct peermem_event),
	   "the generation page maps (version %u, event size %u)", pg.version, pg.event_size);
	close(fd);
	ok(run("rmmod peermem 2>/dev/null") != 0 && access("/sys/module/peermem", F_OK) == 0,
	   "file closed, page still mapped: rmmod peermem is refused (the mapping holds the module)");

	if (pipe(p))
		bail("pipe: %s", strerror(errno));
	iov.iov_base = map;
	iov.iov_len = 4096;
	n = vmsplice(p[1], &iov, 1, 0);
	ok(n == 4096, "vmsplice of the mapped page into a pipe: the pipe holds a reference on the page (%zd, %s)",
	   n, n < 0 ? strerror(errno) : "ok");
	ok(munmap(map, 4096) == 0, "munmap of the page");
	ret = run("rmmod peermem");
	ok(ret == 0 && access("/sys/module/peermem", F_OK) != 0,
	   "mapping gone, the page only in the pipe: rmmod peermem succeeds (status %d)", ret);
	memset(buf, 0x55, sizeof(buf));
	n = n == 4096 ? read(p[0], buf, sizeof(buf)) : -1;
	memcpy(&pg, buf, sizeof(pg));
	ok(n == 4096 && pg.version == PEERMEM_EVENTS_VERSION &&
	   pg.event_size == sizeof(struct peermem_event) && pg.generation == 0,
	   "the page outlived the module: the pipe reads it whole after rmmod (%zd bytes, version %u, event size %u, generation %llu)",
	   n, pg.version, pg.event_size, (unsigned long long)pg.generation);
	close(p[0]);
	close(p[1]);
	ok(!dmesg_has("peermem: BUG|no longer holds|Bad page"), "no internal error, no bad page reported");
	return finish();
}
