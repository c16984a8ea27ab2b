// SPDX-License-Identifier: GPL-2.0
/* The end-to-end test (e2e.c) with peermem, the module under test. */
#include "e2e.h"

int main(void)
{
	return e2e_run(e2e_client_find("peermem"));
}
