/* testutil.h - minimal check macros for unit tests.
 * A test program runs its checks and exits non-zero if any failed. */
#ifndef KVANT_TESTUTIL_H
#define KVANT_TESTUTIL_H

#include <stddef.h>
#include <stdio.h>

extern int tu_failures;
extern int tu_checks;

#define CHECK(cond) do { tu_checks++; if (!(cond)) { tu_failures++; \
    fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); } } while (0)
#define CHECKF(cond, ...) do { tu_checks++; if (!(cond)) { tu_failures++; \
    fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

/* Prints a summary and returns the process exit code (0 only if at least
 * one check ran and none failed). */
int tu_finish(const char *name);

/* Deterministic xorshift random numbers for tests (never test on zeros). */
typedef struct tu_rng { unsigned long long s; } tu_rng;
unsigned long long tu_rand_u64(tu_rng *r);
float tu_rand_uniform(tu_rng *r, float lo, float hi);
float tu_rand_normal(tu_rng *r);

/* A new empty file ${TMPDIR:-/tmp}/kvant-STEM-XXXXXX (mkstemp), its name in
 * buf[n]; 0 on success.  The test removes it.  tu_tmp_dir: a new directory
 * the same way (mkdtemp). */
int tu_tmp_path(char *buf, size_t n, const char *stem);
int tu_tmp_dir(char *buf, size_t n, const char *stem);

#endif
