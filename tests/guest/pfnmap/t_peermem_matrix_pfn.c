// SPDX-License-Identifier: GPL-2.0
/*
 * The race matrix (t_peermem_matrix.c) for the PFN source (pfnmap=1, the rig exporter's reserved RAM).
 */
#define MATRIX_CLIENT PFN
#include "t_peermem_matrix.c"
