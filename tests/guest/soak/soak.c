// SPDX-License-Identifier: GPL-2.0
/*
 * The race soak as a command (scripts/soak.sh runs it in the rig):
 *   soak [--rounds N] [--seconds S [--min-rounds M]] [--procs P] [--epochs E]
 *        [--reload-every K] [--client peermem|nvpeermem] [--seed N]
 * (or the same as SOAK_ROUNDS, SOAK_SECONDS, SOAK_MIN_ROUNDS, SOAK_PROCS, SOAK_EPOCHS,
 * SOAK_RELOAD_EVERY, SOAK_CLIENT, SOAK_SEED in the environment).
 * See soak.h for what a round does and what is checked.
 */
#include "soak.h"

int main(int argc, char **argv)
{
	struct soak_opts o = {
		.rounds = 100000, .procs = 3, .epochs = 50, .reload_every = 5,
		.client = "peermem",
	};

	/* scripts/vm.sh runs programs without arguments: SOAK_* from --env. */
	if (getenv("SOAK_ROUNDS"))
		o.rounds = atoll(getenv("SOAK_ROUNDS"));
	if (getenv("SOAK_SECONDS"))
		o.seconds = atoi(getenv("SOAK_SECONDS"));
	if (getenv("SOAK_MIN_ROUNDS"))
		o.min_rounds = atoll(getenv("SOAK_MIN_ROUNDS"));
	if (getenv("SOAK_PROCS"))
		o.procs = atoi(getenv("SOAK_PROCS"));
	if (getenv("SOAK_EPOCHS"))
		o.epochs = atoi(getenv("SOAK_EPOCHS"));
	if (getenv("SOAK_RELOAD_EVERY"))
		o.reload_every = atoi(getenv("SOAK_RELOAD_EVERY"));
	if (getenv("SOAK_CLIENT"))
		o.client = getenv("SOAK_CLIENT");
	if (getenv("SOAK_SEED"))
		o.seed = (unsigned int)strtoul(getenv("SOAK_SEED"), NULL, 0);
	soak_parse(argc, argv, &o);
	return soak_main(&o);
}
