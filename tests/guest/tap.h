/* SPDX-License-Identifier: GPL-2.0 */
/*
 * tap.h - TAP output of the guest test programs (every area's helper header
 * includes it): ok(), skip(), diag(), bail() and finish().
 *
 * A program prints one "ok"/"not ok" line per check, "# " lines for
 * context, and the plan "1..N" at the end; it exits non-zero if any check
 * failed. scripts/vm.sh renumbers and collects the lines of all programs.
 */
#ifndef PEERMEM_GUEST_TAP_H
#define PEERMEM_GUEST_TAP_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static int tap_n, tap_fail;

/*
 * PEERMEM_TAP_TIMES=1 (a profiling aid, docs/testing.md): every line is
 * preceded by "# @ S" with the seconds since the program's first line, to
 * see where a slow program spends its time.
 */
static void tap_time(void)
{
	static int on = -1;
	static struct timespec t0;
	struct timespec t;

	if (on < 0) {
		on = getenv("PEERMEM_TAP_TIMES") && *getenv("PEERMEM_TAP_TIMES") == '1';
		clock_gettime(CLOCK_MONOTONIC, &t0);
	}
	if (!on)
		return;
	clock_gettime(CLOCK_MONOTONIC, &t);
	printf("# @ %.1f\n", (double)(t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9);
}

static void tap_vline(const char *prefix, const char *fmt, va_list ap,
		      const char *suffix)
{
	tap_time();
	fputs(prefix, stdout);
	vprintf(fmt, ap);
	fputs(suffix, stdout);
	fflush(stdout);
}

static void __attribute__((format(printf, 2, 3))) ok(int cond, const char *fmt, ...)
{
	char prefix[32];
	va_list ap;

	snprintf(prefix, sizeof(prefix), "%sok %d - ", cond ? "" : "not ", ++tap_n);
	va_start(ap, fmt);
	tap_vline(prefix, fmt, ap, "\n");
	va_end(ap);
	if (!cond)
		tap_fail++;
}

/* A check that cannot run here; the reason is the message. */
static void __attribute__((format(printf, 1, 2))) skip(const char *fmt, ...)
{
	char prefix[32];
	va_list ap;

	snprintf(prefix, sizeof(prefix), "ok %d - ", ++tap_n);
	va_start(ap, fmt);
	tap_vline(prefix, fmt, ap, " # SKIP\n");
	va_end(ap);
}

static void __attribute__((format(printf, 1, 2))) diag(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	tap_vline("# ", fmt, ap, "\n");
	va_end(ap);
}

/*
 * Stop the program now, with a failed check that says why: a failed
 * precondition makes the rest meaningless.
 */
static void __attribute__((noreturn, format(printf, 1, 2))) bail(const char *fmt, ...)
{
	char prefix[32];
	va_list ap;

	snprintf(prefix, sizeof(prefix), "not ok %d - ", ++tap_n);
	va_start(ap, fmt);
	tap_vline(prefix, fmt, ap, " (bailing out)\n");
	va_end(ap);
	printf("1..%d\n", tap_n);
	exit(1);
}

/* The plan line; the exit status of the program. */
static int finish(void)
{
	printf("1..%d\n", tap_n);
	fflush(stdout);
	return tap_fail ? 1 : 0;
}

#endif /* PEERMEM_GUEST_TAP_H */
