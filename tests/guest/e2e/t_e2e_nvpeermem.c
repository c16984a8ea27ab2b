// SPDX-License-Identifier: GPL-2.0
/*
 * The end-to-end test (e2e.c) with NVIDIA's nvidia-peermem, unmodified,
 * built from Debian's nvidia-open-kernel-dkms by tests/nvpeermem.
 */
#include "e2e.h"

int main(void)
{
	return e2e_run(e2e_client_find("nvpeermem"));
}
