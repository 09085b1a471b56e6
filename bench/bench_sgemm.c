/* The physical ceiling: OpenBLAS sgemm GFLOP/s on this machine with a given thread
 * count, for the GEMM shapes of a GPT-2 124M step (1024 tokens) and a large square.
 * Usage: bench_sgemm [threads] [--json] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "core/error.h"
#include "core/timer.h"
#include "kernels/kernels.h"
#include "kernels/cpu/blas_core.h"

typedef struct {
    const char *what;
    int m, n, k;
} shape;

static double rate(int m, int n, int k)
{
    float *a = ts_alloc_floats((size_t)m * k), *b = ts_alloc_floats((size_t)k * n),
          *c = ts_alloc_floats((size_t)m * n);
    for (size_t i = 0; i < (size_t)m * k; i++) a[i] = (float)((i * 7) % 13) * 0.01f;
    for (size_t i = 0; i < (size_t)k * n; i++) b[i] = (float)((i * 5) % 11) * 0.01f;
    double best = 1e30;
    for (int rep = 0; rep < 6; rep++) { /* first call warms up caches and threads */
        double t0 = ts_now_ms();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a, k, b, k, 0.0f, c, n);
        double dt = ts_now_ms() - t0;
        if (rep > 0 && dt < best) best = dt;
    }
    free(a);
    free(b);
    free(c);
    return 2.0 * m * n * k / (best * 1e-3) / 1e9;
}

int main(int argc, char **argv)
{
    ts_blas_select_core(argc, argv); /* the OpenBLAS kernel tessera would run */
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    int json = argc > 2 && !strcmp(argv[2], "--json");
    ts_cpu_set_threads(threads);
    const shape shapes[] = {
        {"qkv 1024x2304x768", 1024, 2304, 768},
        {"fc 1024x3072x768", 1024, 3072, 768},
        {"proj 1024x768x3072", 1024, 768, 3072},
        {"square 2048", 2048, 2048, 2048},
    };
    double best = 0;
    if (!json) printf("%-22s %10s\n", "sgemm shape (MxNxK)", "GFLOP/s");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        double r = rate(shapes[i].m, shapes[i].n, shapes[i].k);
        if (r > best) best = r;
        if (!json) printf("%-22s %10.1f\n", shapes[i].what, r);
    }
    if (json)
        printf("{\"threads\":%d,\"sgemm_gflops\":%.1f}\n", threads, best);
    else
        printf("%-22s %10.1f  (threads %d)\n", "best", best, threads);
    return 0;
}
