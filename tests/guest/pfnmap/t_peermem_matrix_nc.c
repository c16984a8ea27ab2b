// SPDX-License-Identifier: GPL-2.0
/*
 * The race matrix (t_peermem_matrix.c) for nv_mem_nc, the non-invalidating client (peermem loaded with enable_invalidate=0).
 */
#define MATRIX_CLIENT NC
#include "t_peermem_matrix.c"
