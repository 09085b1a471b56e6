/* The GEMM-efficiency curve of this CPU: OpenBLAS sgemm GFLOP/s for n x n x n products
 * at a list of sizes, with a given thread count, in the layout tessera's linear layers
 * use (C = A * B^T, row-major). scripts/measure_cluster.sh turns it into a cluster
 * file's gemm_efficiency table (rate / the best rate of the sweep).
 * Usage: bench_gemm_curve [THREADS] [--sizes 64,128,...] [--json]
 *        (default 1 thread; sizes 64,128,256,512,768,1024,2048). Each size runs until
 *        0.3 s or 3 timed calls have passed, whichever is later; the best call counts. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/timer.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/kernels.h"

#define MAX_SIZES 32

static double rate(int n)
{
    const size_t nn = (size_t)n * n;
    float *a = ts_alloc_floats(nn), *b = ts_alloc_floats(nn), *c = ts_alloc_floats(nn);
    for (size_t i = 0; i < nn; i++) {
        a[i] = (float)((i * 7) % 13) * 0.01f;
        b[i] = (float)((i * 5) % 11) * 0.01f;
    }
    /* One untimed call: page faults, OpenBLAS buffers and threads. */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    double best = 1e30, spent = 0.0;
    for (int calls = 0; calls < 3 || spent < 300.0; calls++) {
        double t0 = ts_now_ms();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        double dt = ts_now_ms() - t0;
        spent += dt;
        if (dt < best) best = dt;
    }
    free(a);
    free(b);
    free(c);
    return 2.0 * n * (double)n * n / (best * 1e-3) / 1e9;
}

static int usage(void)
{
    fprintf(stderr, "usage: bench_gemm_curve [THREADS >= 1] [--sizes N1,N2,... (1..16384, "
                    "at most %d)] [--json]\n",
            MAX_SIZES);
    return 2;
}

int main(int argc, char **argv)
{
    ts_blas_select_core(argc, argv); /* the OpenBLAS kernel tessera would run */
    int threads = 1, json = 0, n_sizes = 0;
    int sizes[MAX_SIZES];
    const char *list = "64,128,256,512,768,1024,2048";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "--sizes") && i + 1 < argc)
            list = argv[++i];
        else if (argv[i][0] != '-')
            threads = atoi(argv[i]);
        else
            return usage();
    }
    for (const char *p = list; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 16384 || n_sizes == MAX_SIZES) return usage();
        sizes[n_sizes++] = (int)v;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return usage();
    }
    if (threads < 1 || n_sizes == 0) return usage();
    ts_cpu_set_threads(threads);

    if (json) printf("{\"threads\":%d,\"core\":\"%s\",\"points\":[", threads, ts_blas_core());
    else printf("sgemm n x n x n, %d thread%s, OpenBLAS core %s\n%8s %10s\n", threads,
                threads == 1 ? "" : "s", ts_blas_core(), "n", "GFLOP/s");
    for (int i = 0; i < n_sizes; i++) {
        double r = rate(sizes[i]);
        if (json) printf("%s[%d,%.3f]", i ? "," : "", sizes[i], r);
        else printf("%8d %10.2f\n", sizes[i], r);
        fflush(stdout);
    }
    if (json) printf("]}\n");
    return 0;
}
