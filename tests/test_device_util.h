/* Helpers for the tests that run a kernel table on its own memory (device memory, or
 * the strict backend's) and compare it with a host reference: copies through the
 * table's slots, outputs poisoned with NaN, and a result against the reference. The
 * table is an argument: test_cuda_kernels runs the same checks on two, test_kernels on
 * the CPU and strict tables. */
#ifndef TS_TEST_DEVICE_UTIL_H
#define TS_TEST_DEVICE_UTIL_H

#include "kernels/kernels.h"
#include "test_util.h"

/* A copy of host h[0..n) in k's memory. */
static inline float *ts_test_to_dev(const ts_kernels *k, const float *h, size_t n)
{
    float *d = k->dev_alloc(n * sizeof(float));
    k->memcpy_h2d(d, h, n * sizeof(float));
    return d;
}

/* A host copy of k's d[0..n) (free it with free). */
static inline float *ts_test_from_dev(const ts_kernels *k, const float *d, size_t n)
{
    float *h = ts_alloc_floats(n);
    k->memcpy_d2h(h, d, n * sizeof(float));
    return h;
}

/* n NaNs on the host: what an output starts as, so a value a kernel fails to write (or
 * a workspace it reads before writing) shows. */
static inline float *ts_test_nan_floats(size_t n)
{
    float *x = ts_alloc_floats(n);
    for (size_t i = 0; i < n; i++) x[i] = NAN;
    return x;
}

/* n NaNs in k's memory (at least one float, so a zero size still has a pointer). */
static inline float *ts_test_dev_nan(const ts_kernels *k, size_t n)
{
    if (n == 0) n = 1;
    float *h = ts_test_nan_floats(n);
    float *d = ts_test_to_dev(k, h, n);
    free(h);
    return d;
}

/* Whether k's d[0..n) holds the same bits as host h[0..n). */
static inline int ts_test_dev_same_bits(const ts_kernels *k, const float *d, const float *h,
                                        size_t n)
{
    float *got = ts_test_from_dev(k, d, n);
    int same = ts_test_same_bits(got, h, n);
    free(got);
    return same;
}

/* got[0..n) (host floats, from `source`) against the host reference want[0..n): the
 * worst relative error must be under tol, with a floor of floor_frac x the largest
 * |want| (values near zero are judged on the output's own scale); an unwritten (NaN) or
 * infinite value is the worst. Prints one line (who, what, the worst error); a failure
 * names the index and both values. */
static inline void ts_test_expect_close(const char *who, const char *what, const char *source,
                                        const float *got, const float *want, size_t n,
                                        double tol, double floor_frac)
{
    double maxw = 0.0;
    for (size_t i = 0; i < n; i++)
        if (fabs((double)want[i]) > maxw) maxw = fabs((double)want[i]);
    double floor_ = maxw > 0.0 ? floor_frac * maxw : 1e-30;
    double worst = 0.0;
    size_t wi = 0;
    for (size_t i = 0; i < n; i++) {
        double e = ts_rel_err((double)got[i], (double)want[i], floor_);
        if (isnan(e) || isinf(e)) e = INFINITY; /* unwritten (NaN) or blown up */
        if (e > worst) {
            worst = e;
            wi = i;
        }
    }
    printf("  %-40s %-14s %8zu values  worst rel err %.2e\n", who, what, n, worst);
    CHECKF(worst < tol,
           "%s: output '%s': worst relative error %.3g (tolerance %.0e) at [%zu]: %s %.9g, "
           "reference %.9g (floor %.3g, %zu values)",
           who, what, worst, tol, wi, source, n ? (double)got[wi] : 0.0,
           n ? (double)want[wi] : 0.0, floor_, n);
}

/* k's d[0..n) against the host reference want[0..n), as ts_test_expect_close judges. */
static inline void ts_test_expect_close_dev(const ts_kernels *k, const char *who,
                                            const char *what, const float *d,
                                            const float *want, size_t n, double tol,
                                            double floor_frac)
{
    float *got = ts_test_from_dev(k, d, n);
    ts_test_expect_close(who, what, k->name, got, want, n, tol, floor_frac);
    free(got);
}

#endif
