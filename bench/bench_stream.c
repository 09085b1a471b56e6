/* Memory bandwidth the way STREAM's "copy" measures it: b[i] = a[i] over arrays far
 * larger than the last-level cache, counting 2 * array bytes per pass (one read, one
 * write; the write-allocate read a CPU may add is not counted, as in STREAM). Threads
 * split the arrays (OpenMP static schedule, first-touch placement by the same threads).
 * scripts/measure_cluster.sh runs it with 1 thread and with one thread per rank of a
 * node, to find one rank's share of the node's memory bandwidth.
 * Usage: bench_stream [THREADS] [--mb MIB_PER_ARRAY] [--reps N] [--json]
 *        (default 1 thread, 256 MiB per array, 10 passes; the best pass is reported) */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/timer.h"

static int usage(void)
{
    fprintf(stderr, "usage: bench_stream [THREADS >= 1] [--mb MIB_PER_ARRAY >= 1] [--reps N >= 1] "
                    "[--json]\n");
    return 2;
}

int main(int argc, char **argv)
{
    int threads = 1, reps = 10, json = 0;
    long mb = 256;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "--mb") && i + 1 < argc) {
            mb = atol(argv[++i]);
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (argv[i][0] != '-') {
            threads = atoi(argv[i]);
        } else {
            return usage();
        }
    }
    if (threads < 1 || reps < 1 || mb < 1 || mb > (1L << 20)) return usage();

    const size_t n = (size_t)mb * 1048576 / sizeof(double);
    double *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    if (!a || !b) {
        fprintf(stderr, "bench_stream: cannot allocate 2 x %ld MiB\n", mb);
        return 1;
    }
    omp_set_num_threads(threads);
    /* First touch by the threads that copy later, so pages sit near them. */
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        a[i] = (double)(i % 1000) * 1e-3;
        b[i] = 0.0;
    }

    double best = 1e30;
    for (int rep = 0; rep <= reps; rep++) { /* rep 0 warms up: TLBs, thread start */
        double t0 = ts_now_ms();
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++) b[i] = a[i];
        double dt = ts_now_ms() - t0;
        if (rep > 0 && dt < best) best = dt;
    }
    /* Use the result so the copy cannot be optimized away. */
    double check = b[n / 2] + b[n - 1];
    const double bytes = 2.0 * (double)n * sizeof(double);
    const double gbs = bytes / (best * 1e-3) / 1e9;
    if (json)
        printf("{\"threads\":%d,\"array_mib\":%ld,\"reps\":%d,\"best_ms\":%.4f,\"copy_gbs\":%.3f,"
               "\"check\":%.3f}\n",
               threads, mb, reps, best, gbs, check);
    else
        printf("copy of %ld MiB, %d thread%s: best of %d passes %.3f ms = %.2f GB/s "
               "(2 x array bytes / time)\n",
               mb, threads, threads == 1 ? "" : "s", reps, best, gbs);
    free(a);
    free(b);
    return 0;
}
