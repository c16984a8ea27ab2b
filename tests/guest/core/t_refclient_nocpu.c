// SPDX-License-Identifier: GPL-2.0
/* The peer-memory core tests against a client whose memory is not the kernel's pages (reserved, mapped with dma_map_resource, no page pointers in its table). */
#include "refclient_suite.h"

int main(void)
{
	static const struct suite_cfg cfg = {
		.invalidate = 1, .unmaps = 0, .page_kb = 64, .cpu_pages = 0,
	};

	return run_refclient_suite(&cfg);
}
