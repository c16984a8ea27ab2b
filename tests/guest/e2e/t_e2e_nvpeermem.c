// SPDX-License-Identifier: GPL-2.0
/*
 * The end-to-end test (e2e.c) with NVIDIA's nvidia-peermem, unmodified:
 *  1. nvpeermem: 550.163.01, built from Debian's nvidia-open-kernel-dkms
 *     by tests/nvpeermem (nv_mem invalidating, nv_mem_nc persistent);
 *  2. nvpeermem595: 595.45.04, built from NVIDIA's open-gpu-kernel-modules
 *     where its source was imported into the cache (tests/nvpeermem/
 *     build.sh --import-git), with its default persistent_api_support=1:
 *     one client, nv_mem, persistent, not invalidating;
 *  3. nvpeermem595-legacy: the same 595 module with
 *     persistent_api_support=0: nv_mem invalidating and nv_mem_nc, as 550.
 * 2. and 3. are one skipped check each, with the reason, where the 595
 * module is not built (CI: NVIDIA's repository is not reachable there).
 *
 * E2E_RUNS="label ..." runs only those (e.g. with E2E_ARGS, to watch one
 * configuration's checks fail against another's module arguments).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "e2e.h"

int main(void)
{
	static const char *const all = "nvpeermem nvpeermem595 nvpeermem595-legacy";
	char runs[256], *label, *save = NULL;
	int i = 0;

	snprintf(runs, sizeof(runs), "%s", getenv("E2E_RUNS") ?: all);
	for (label = strtok_r(runs, " ,", &save); label;
	     label = strtok_r(NULL, " ,", &save)) {
		printf("# ---- run %d: %s\n", ++i, label);
		fflush(stdout);
		e2e_check(e2e_client_find(label));
	}
	return e2e_finish();
}
