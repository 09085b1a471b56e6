/* Time per element of the CPU's elementwise kernels that the planner's memory-pass model
 * can miss (exp and tanh make them compute-bound on a CPU core): GELU forward and
 * backward over N x 4C activations and LayerNorm forward and backward over N x C, one
 * thread. scripts/measure_cluster.sh writes the results into the cluster
 * file's device.elementwise_ns (src/plan/cluster.h says what an element is per kernel).
 *
 *   bench_elementwise [N] [C] [--json]   (default N 256, C 256: a micro-batch of 4 x 64
 *                                        tokens of a 256-wide model)
 *
 * Each kernel: median of 41 timed calls after 3 warm-ups, in ns per element. The data is
 * in the range real activations have (|x| up to a few), so exp takes its usual path. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/timer.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/kernels.h"
#include "bench_util.h"

enum { WARM = 3, REPS = 41 };

static const ts_kernels *K = &ts_kernels_cpu;

static float *rnd(size_t n, float scale, unsigned seed)
{
    return bench_random_floats(n, scale, seed);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median ns per element of `reps` calls of STMT (after WARM unmeasured ones). */
#define TIME_NS(out, elements, stmt)                                                         \
    do {                                                                                     \
        double t_[REPS];                                                                     \
        for (int r_ = 0; r_ < WARM; r_++) stmt;                                              \
        for (int r_ = 0; r_ < REPS; r_++) {                                                  \
            double t0_ = ts_now_ms();                                                        \
            stmt;                                                                            \
            t_[r_] = ts_now_ms() - t0_;                                                      \
        }                                                                                    \
        qsort(t_, REPS, sizeof(double), cmp_double);                                         \
        (out) = t_[REPS / 2] * 1e6 / (double)(elements);                                     \
    } while (0)

int main(int argc, char **argv)
{
    ts_blas_select_core(argc, argv); /* as tessera would run */
    ts_cpu_set_threads(1);
    int dims[2] = {256, 256}, nd = 0, json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (nd < 2) {
            dims[nd++] = atoi(argv[i]);
        } else {
            fprintf(stderr, "usage: bench_elementwise [N] [C] [--json]\n");
            return 2;
        }
    }
    const int N = dims[0], C = dims[1];
    if (N < 1 || C < 1 || (long long)N * 4 * C > (1ll << 28)) {
        fprintf(stderr, "bench_elementwise: N and C must be >= 1 with N x 4C at most 2^28 (got "
                        "%d %d)\n",
                N, C);
        return 2;
    }
    const size_t NC = (size_t)N * C, NF = NC * 4;

    float *h = rnd(NF, 6.0f, 1u), *dh = rnd(NF, 1.0f, 2u), *g = ts_alloc_floats(NF);
    float *x = rnd(NC, 4.0f, 3u), *dy = rnd(NC, 1.0f, 4u), *y = ts_alloc_floats(NC);
    float *dx = ts_alloc_floats(NC), *w = rnd((size_t)C, 1.0f, 5u), *b = rnd((size_t)C, 1.0f, 6u);
    float *dw = ts_alloc_floats((size_t)C), *db = ts_alloc_floats((size_t)C);
    float *mean = ts_alloc_floats((size_t)N), *rstd = ts_alloc_floats((size_t)N);

    double gelu_f, gelu_b, ln_f, ln_b;
    TIME_NS(gelu_f, NF, K->gelu_forward(g, h, NF));
    TIME_NS(gelu_b, NF, K->gelu_backward(g, h, dh, NF));
    TIME_NS(ln_f, NC, K->layernorm_forward(y, mean, rstd, x, w, b, N, C));
    TIME_NS(ln_b, NC, K->layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, N, C));

    if (json)
        printf("{\"n\":%d,\"c\":%d,\"gelu_forward_ns\":%.4f,\"gelu_backward_ns\":%.4f,"
               "\"layernorm_forward_ns\":%.4f,\"layernorm_backward_ns\":%.4f}\n",
               N, C, gelu_f, gelu_b, ln_f, ln_b);
    else
        printf("ns per element, one thread, median of %d calls:\n"
               "  gelu_forward      %8.3f  (N x 4C = %d x %d)\n"
               "  gelu_backward     %8.3f\n"
               "  layernorm_forward %8.3f  (N x C = %d x %d)\n"
               "  layernorm_backward%8.3f\n",
               REPS, gelu_f, N, 4 * C, gelu_b, ln_f, N, C, ln_b);

    free(h), free(dh), free(g), free(x), free(dy), free(y), free(dx), free(w), free(b);
    free(dw), free(db), free(mean), free(rstd);
    return 0;
}
