// SPDX-License-Identifier: GPL-2.0
/*
 * Kernel fault injection while loading peermem (finit_module: the module
 * loader, peermem's init, its registration with the core): the load part
 * of t_peermem_failnth, alone, so each stays within the runner's limit.
 */
#define FAILNTH_LOAD_ONLY
#include "t_peermem_failnth.c"
