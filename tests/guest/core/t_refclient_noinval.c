// SPDX-License-Identifier: GPL-2.0
/* The peer-memory core tests against a non-invalidating client with 4 KiB pages. */
#include "refclient_suite.h"

int main(void)
{
	static const struct suite_cfg cfg = {
		.invalidate = 0, .unmaps = 0, .page_kb = 4, .cpu_pages = 1,
	};

	return run_refclient_suite(&cfg);
}
