/* libts_slow_sgemm.so: a planted straggler for the tests (tests/test_train_cli.sh).
 * Preloaded into one rank only, it makes each cblas_sgemm that rank calls sleep
 * TS_TEST_SGEMM_SLEEP_US microseconds (default 2000) after doing the real work, so that
 * rank computes the same numbers more slowly: the straggler metrics and
 * log.straggler_every's report must name it. Test infrastructure only: tessera neither
 * loads it nor reads its variable. */
#define _GNU_SOURCE
#include <cblas.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>

typedef void (*sgemm_fn)(const enum CBLAS_ORDER, const enum CBLAS_TRANSPOSE,
                         const enum CBLAS_TRANSPOSE, const blasint, const blasint, const blasint,
                         const float, const float *, const blasint, const float *,
                         const blasint, const float, float *, const blasint);

void cblas_sgemm(const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE ta,
                 const enum CBLAS_TRANSPOSE tb, const blasint m, const blasint n,
                 const blasint k, const float alpha, const float *a, const blasint lda,
                 const float *b, const blasint ldb, const float beta, float *c,
                 const blasint ldc)
{
    static sgemm_fn real;
    static long sleep_us = -1;
    if (!real) real = (sgemm_fn)dlsym(RTLD_NEXT, "cblas_sgemm");
    if (sleep_us < 0) {
        const char *v = getenv("TS_TEST_SGEMM_SLEEP_US");
        sleep_us = v ? atol(v) : 2000;
    }
    real(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    struct timespec ts = {sleep_us / 1000000, (sleep_us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}
