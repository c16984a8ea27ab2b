// SPDX-License-Identifier: GPL-2.0
/*
 * A short race soak for every run of the suite (the long one is
 * scripts/soak.sh): 600 rounds of peermem with 3 processes of 2 threads,
 * 6 epochs with different delay knobs, the client unloaded and reloaded
 * every 2 epochs (the debug rig does about 3.5 rounds a second: this
 * stays within the runner's 300 s). SOAK_ROUNDS overrides the count.
 */
#include "soak.h"

int main(void)
{
	struct soak_opts o = {
		.rounds = 600, .procs = 3, .epochs = 6, .reload_every = 2,
		.client = "peermem", .seed = 20261124,
	};

	if (getenv("SOAK_ROUNDS"))
		o.rounds = atoll(getenv("SOAK_ROUNDS"));
	return soak_main(&o);
}
