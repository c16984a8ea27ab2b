// SPDX-License-Identifier: GPL-2.0
/*
 * docs/examples/peermem_itree.h against a plain list (TAP): random inserts
 * (with duplicates and nested ranges) and removals; after each step the
 * tree is a balanced AVL tree with the right heights and max_end, in order,
 * of the right size, and itree_visit / itree_first_overlap find exactly
 * the overlapping ranges the list has, for random queries.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../../docs/examples/peermem_itree.h"
#include "../../guest/tap.h"

#define N 2000
static struct itree_node nodes[N];
static int in[N];
static uint64_t rng = 88172645463325252ULL;

static uint64_t rnd(uint64_t n)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng % n;
}

/* Height of n's subtree if it is a valid AVL interval tree, else -1. */
static int check(const struct itree_node *n, const struct itree_node *lo, const struct itree_node *hi,
		 size_t *count)
{
	int hl, hr;
	uint64_t m;

	if (!n)
		return 0;
	if ((lo && itree_cmp_(n, lo) <= 0) || (hi && itree_cmp_(n, hi) >= 0))
		return -1;
	hl = check(n->l, lo, n, count);
	hr = check(n->r, n, hi, count);
	if (hl < 0 || hr < 0 || hl - hr > 1 || hr - hl > 1 || n->height != 1 + (hl > hr ? hl : hr))
		return -1;
	m = n->end;
	if (n->l && n->l->max_end > m)
		m = n->l->max_end;
	if (n->r && n->r->max_end > m)
		m = n->r->max_end;
	if (m != n->max_end)
		return -1;
	(*count)++;
	return n->height;
}

static int mark[N];
static int visit_mark(struct itree_node *n, void *arg)
{
	(void)arg;
	mark[n - nodes]++;
	return 0;
}

int main(void)
{
	unsigned long steps = 0, queries = 0, found = 0, bad_shape = 0, bad_query = 0, bad_first = 0;
	struct itree t = ITREE_INIT;
	size_t live = 0;

	for (int round = 0; round < 20000; round++) {
		int i = (int)rnd(N);
		size_t count = 0;

		if (!in[i]) {
			/* Small, clustered ranges: many overlaps, some duplicates. */
			nodes[i].start = rnd(64) * 4096;
			nodes[i].end = nodes[i].start + (1 + rnd(8)) * 4096;
			if (rnd(8) == 0 && i > 0) {
				nodes[i].start = nodes[i - 1].start;
				nodes[i].end = nodes[i - 1].end;
			}
			itree_insert(&t, &nodes[i]);
			in[i] = 1;
			live++;
		} else {
			if (itree_remove(&t, &nodes[i]))
				bad_shape++;
			in[i] = 0;
			live--;
		}
		steps++;
		if (check(t.root, NULL, NULL, &count) < 0 || count != live || t.count != live)
			bad_shape++;
		if (round % 10 == 0) {
			uint64_t s = rnd(80) * 4096 + rnd(2) * 100, e = s + (1 + rnd(6)) * 4096;
			struct itree_node *f = itree_first_overlap(&t, s, e);
			uint64_t best = UINT64_MAX;

			memset(mark, 0, sizeof(mark));
			itree_visit(&t, s, e, visit_mark, NULL);
			for (int k = 0; k < N; k++) {
				int want = in[k] && nodes[k].start < e && s < nodes[k].end;

				if (mark[k] != want)
					bad_query++;
				if (want && nodes[k].start < best)
					best = nodes[k].start;
				found += want;
			}
			if (best == UINT64_MAX ? f != NULL : (!f || f->start != best || !(f->start < e && s < f->end)))
				bad_first++;
			queries++;
		}
	}
	printf("# %lu inserts/removes, %lu queries, %lu overlaps found, %zu nodes at the end\n",
	       steps, queries, found, live);
	ok(bad_shape == 0, "after every insert and remove the tree is a balanced, ordered AVL tree with right max_end and count (%lu bad)", bad_shape);
	ok(bad_query == 0 && found > queries, "itree_visit finds exactly the overlapping ranges the list has (%lu wrong, %lu found)", bad_query, found);
	ok(bad_first == 0, "itree_first_overlap finds an overlapping range of the smallest start, or none (%lu wrong)", bad_first);
	ok(itree_remove(&t, &nodes[0]) == (in[0] ? 0 : -1), "removing a node not in the tree says -1");
	ok(itree_first_overlap(&t, 5, 5) == NULL && itree_visit(&t, 5, 5, visit_mark, NULL) == 0, "an empty query range finds nothing");
	return finish();
}
