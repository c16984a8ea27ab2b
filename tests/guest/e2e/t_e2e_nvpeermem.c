// SPDX-License-Identifier: GPL-2.0
/*
 * The end-to-end test (e2e.c) with NVIDIA's nvidia-peermem, unmodified:
 *  1. 550.163.01, built from Debian's nvidia-open-kernel-dkms by
 *     tests/nvpeermem (nv_mem invalidating, nv_mem_nc persistent);
 *  2. 595.45.04, built from NVIDIA's open-gpu-kernel-modules where its
 *     source was imported into the cache (tests/nvpeermem/build.sh
 *     --import-git), with its default persistent_api_support=1: one
 *     client, nv_mem, persistent, not invalidating;
 *  3. the same 595 module with persistent_api_support=0: nv_mem
 *     invalidating and nv_mem_nc, as 550.
 * 2. and 3. are one skipped check each, with the reason, where the 595
 * module is not built (CI: NVIDIA's repository is not reachable there).
 */
#include <stdio.h>

#include "e2e.h"

int main(void)
{
	static const char *const runs[] = {
		"nvpeermem", "nvpeermem595", "nvpeermem595-legacy",
	};
	size_t i;

	for (i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
		const struct e2e_client *cl = e2e_client_find(runs[i]);

		printf("# ---- run %zu of %zu: %s\n", i + 1, sizeof(runs) / sizeof(runs[0]), runs[i]);
		fflush(stdout);
		e2e_check(cl);
	}
	return e2e_finish();
}
