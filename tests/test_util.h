/* A minimal test harness: CHECK records a failure and goes on; main returns
 * ts_test_report(), which prints "N passed, N failed" and the exit code. */
#ifndef TS_TEST_UTIL_H
#define TS_TEST_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int ts_test_passed = 0;
static int ts_test_failed = 0;

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (cond) {                                                                   \
            ts_test_passed++;                                                         \
        } else {                                                                      \
            ts_test_failed++;                                                         \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);           \
        }                                                                             \
    } while (0)

#define CHECKF(cond, ...)                                                             \
    do {                                                                              \
        if (cond) {                                                                   \
            ts_test_passed++;                                                         \
        } else {                                                                      \
            ts_test_failed++;                                                         \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);           \
            fprintf(stderr, __VA_ARGS__);                                             \
            fputc('\n', stderr);                                                      \
        }                                                                             \
    } while (0)

static inline int ts_test_report(void)
{
    printf("%d passed, %d failed\n", ts_test_passed, ts_test_failed);
    return ts_test_failed == 0 ? 0 : 1;
}

/* Relative error |a-b| / max(|b|, floor). */
static inline double ts_rel_err(double a, double b, double floor_)
{
    double d = fabs(b) > floor_ ? fabs(b) : floor_;
    return fabs(a - b) / d;
}

#endif
