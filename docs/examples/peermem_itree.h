/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * peermem_itree.h - an interval tree of half-open ranges [start, end): an
 * AVL tree ordered by start (ties by node address), each node also holding
 * the largest end in its subtree, so that the ranges overlapping a query
 * are found in O(log n + k). Insert and remove are O(log n); duplicates
 * (the same range twice) are allowed. Not thread-safe: the user locks.
 * Used by peermem_mtcache.h; tests/host/lib checks it against a list.
 *
 * Embed struct itree_node in your entry and set start/end before
 * itree_insert(); do not change them while the node is in a tree.
 */
#ifndef PEERMEM_ITREE_H
#define PEERMEM_ITREE_H

#include <stddef.h>
#include <stdint.h>

struct itree_node {
	uint64_t start, end;		/* [start, end), start < end */
	uint64_t max_end;		/* largest end in this subtree */
	struct itree_node *l, *r;
	int height;
};

struct itree {
	struct itree_node *root;
	size_t count;
};

#define ITREE_INIT { NULL, 0 }

static inline int itree_h_(const struct itree_node *n)
{
	return n ? n->height : 0;
}

static inline void itree_update_(struct itree_node *n)
{
	int hl = itree_h_(n->l), hr = itree_h_(n->r);

	n->height = 1 + (hl > hr ? hl : hr);
	n->max_end = n->end;
	if (n->l && n->l->max_end > n->max_end)
		n->max_end = n->l->max_end;
	if (n->r && n->r->max_end > n->max_end)
		n->max_end = n->r->max_end;
}

static inline int itree_cmp_(const struct itree_node *a, const struct itree_node *b)
{
	if (a->start != b->start)
		return a->start < b->start ? -1 : 1;
	if (a != b)
		return (uintptr_t)a < (uintptr_t)b ? -1 : 1;
	return 0;
}

static inline struct itree_node *itree_rot_right_(struct itree_node *y)
{
	struct itree_node *x = y->l;

	y->l = x->r;
	x->r = y;
	itree_update_(y);
	itree_update_(x);
	return x;
}

static inline struct itree_node *itree_rot_left_(struct itree_node *x)
{
	struct itree_node *y = x->r;

	x->r = y->l;
	y->l = x;
	itree_update_(x);
	itree_update_(y);
	return y;
}

static inline struct itree_node *itree_balance_(struct itree_node *n)
{
	int bf;

	itree_update_(n);
	bf = itree_h_(n->l) - itree_h_(n->r);
	if (bf > 1) {
		if (itree_h_(n->l->l) < itree_h_(n->l->r))
			n->l = itree_rot_left_(n->l);
		return itree_rot_right_(n);
	}
	if (bf < -1) {
		if (itree_h_(n->r->r) < itree_h_(n->r->l))
			n->r = itree_rot_right_(n->r);
		return itree_rot_left_(n);
	}
	return n;
}

static inline struct itree_node *itree_insert_(struct itree_node *n, struct itree_node *x)
{
	if (!n) {
		x->l = x->r = NULL;
		itree_update_(x);
		return x;
	}
	if (itree_cmp_(x, n) < 0)
		n->l = itree_insert_(n->l, x);
	else
		n->r = itree_insert_(n->r, x);
	return itree_balance_(n);
}

static inline struct itree_node *itree_remove_min_(struct itree_node *n, struct itree_node **min)
{
	if (!n->l) {
		*min = n;
		return n->r;
	}
	n->l = itree_remove_min_(n->l, min);
	return itree_balance_(n);
}

static inline struct itree_node *itree_remove_(struct itree_node *n, struct itree_node *x,
					       int *found)
{
	int c;

	if (!n)
		return NULL;
	c = itree_cmp_(x, n);
	if (c < 0) {
		n->l = itree_remove_(n->l, x, found);
	} else if (c > 0) {
		n->r = itree_remove_(n->r, x, found);
	} else {
		struct itree_node *l = n->l, *r = n->r, *m;

		*found = 1;
		if (!r)
			return l;
		r = itree_remove_min_(r, &m);
		m->l = l;
		m->r = r;
		return itree_balance_(m);
	}
	return itree_balance_(n);
}

/* Add x ([x->start, x->end) set by the caller). */
static inline void itree_insert(struct itree *t, struct itree_node *x)
{
	t->root = itree_insert_(t->root, x);
	t->count++;
}

/* Remove x; 0, or -1 if x is not in t. */
static inline int itree_remove(struct itree *t, struct itree_node *x)
{
	int found = 0;

	t->root = itree_remove_(t->root, x, &found);
	if (!found)
		return -1;
	t->count--;
	x->l = x->r = NULL;
	return 0;
}

/*
 * Call fn(node, arg) for each node overlapping [start, end), in order of
 * start, until fn returns non-zero (which is returned). fn must not
 * change the tree (collect, or use itree_first_overlap() to remove).
 */
static inline int itree_visit_(struct itree_node *n, uint64_t start, uint64_t end,
			       int (*fn)(struct itree_node *, void *), void *arg)
{
	int r;

	if (!n || n->max_end <= start)
		return 0;
	r = itree_visit_(n->l, start, end, fn, arg);
	if (r)
		return r;
	if (n->start >= end)
		return 0;	/* so does everything on the right */
	if (n->end > start) {
		r = fn(n, arg);
		if (r)
			return r;
	}
	return itree_visit_(n->r, start, end, fn, arg);
}

static inline int itree_visit(struct itree *t, uint64_t start, uint64_t end,
			      int (*fn)(struct itree_node *, void *), void *arg)
{
	return start < end ? itree_visit_(t->root, start, end, fn, arg) : 0;
}

/* The overlapping node of smallest start, or NULL; O(log n). */
static inline struct itree_node *itree_first_overlap(struct itree *t, uint64_t start, uint64_t end)
{
	struct itree_node *n = t->root, *best = NULL;

	if (start >= end)
		return NULL;
	while (n) {
		if (n->l && n->l->max_end > start) {
			n = n->l;	/* an overlap on the left comes first, if any */
			continue;
		}
		if (n->start >= end)
			break;
		if (n->end > start) {
			best = n;
			break;
		}
		n = n->r;
	}
	return best;
}

#endif /* PEERMEM_ITREE_H */
