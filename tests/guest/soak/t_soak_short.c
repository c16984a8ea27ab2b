// SPDX-License-Identifier: GPL-2.0
/*
 * A short race soak for every run of the suite (the long one is
 * scripts/soak.sh): peermem with 3 processes of 2 threads for 60 s, in 6
 * epochs of 10 s with different delay knobs, the client unloaded and
 * reloaded every 2 epochs. Bounded by time, not rounds, so that it never
 * meets the runner's per-test limit on a slow machine: it passes with at
 * least 12 rounds and a round in every epoch (an epoch whose slice passed
 * with none goes on until it has one). The debug rig does about 3.3 rounds
 * a second on an idle 2-core machine (about 200 in 60 s), a shared one at half
 * speed about 1.2 (about 70); one core shared by two rig guests did 26 in
 * 165 s (2026-11-26, two epochs with none before the rule above). 12 is 2 an
 * epoch. Was 150 s and 24 rounds, then 90 s; cut for CI's time budget
 * (issue 27; the race matrix, t_peermem_matrix*, now lands each cause in
 * each phase on purpose, which random rounds only hoped to do):
 * longer soaks are scripts/soak.sh's, on request. SOAK_SECONDS and
 * SOAK_MIN_ROUNDS override.
 */
#include "soak.h"

int main(void)
{
	struct soak_opts o = {
		.rounds = 1000000, .min_rounds = 12, .seconds = 60, .procs = 3, .epochs = 6,
		.reload_every = 2, .client = "peermem", .seed = 20261124,
	};

	if (getenv("SOAK_SECONDS"))
		o.seconds = atoi(getenv("SOAK_SECONDS"));
	if (getenv("SOAK_MIN_ROUNDS"))
		o.min_rounds = atoll(getenv("SOAK_MIN_ROUNDS"));
	return soak_main(&o);
}
