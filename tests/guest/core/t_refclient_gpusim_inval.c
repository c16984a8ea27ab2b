// SPDX-License-Identifier: GPL-2.0
/* The peer-memory core tests with gpusim memory through an invalidating client. */
#include "refclient_suite.h"

int main(void)
{
	static const struct suite_cfg cfg = {
		.invalidate = 1, .unmaps = 0, .page_kb = 64, .cpu_pages = 1,
		.gpusim = 1,
	};

	return run_refclient_suite(&cfg);
}
