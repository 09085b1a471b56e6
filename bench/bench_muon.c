/* Muon's Newton-Schulz iteration against the backend's GEMM rate (bench/muon.sh): for the
 * Muon matrices of a GPT-2-124M-shaped Llama (n_embd 768, SwiGLU 2048: q, k, v, o
 * [768, 768], gate and up [2048, 768], down [768, 2048]), the time of
 * ts_muon_orthogonalize (the trainer's iteration: the norm, then ns_steps of A = X X^T,
 * B = b A + c A A, X = a X + B X, with its fp32 copies), its FLOPs (2 * ns_steps *
 * ts_muon_ns_cost: three GEMMs of 2 s^2 l, 2 s^3 and 2 s^2 l) and the rate they reach; the
 * same three GEMMs alone (the iteration's ceiling on these shapes); and the whole model's
 * iteration (12 blocks of the seven matrices) against ts_blas_measure_gflops, the rate the
 * trainer's MFU is measured against. Medians of REPS runs after one warm-up (a shared
 * machine: the median, not the best).
 * Usage: bench_muon [threads] [--json] [--layers N] [--ns-steps N] [--reps N] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "core/error.h"
#include "core/timer.h"
#include "kernels/kernels.h"
#include "optim/muon.h"

typedef struct {
    const char *what;
    int rows, cols, count; /* the logical shape and how many a block has */
} shape;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ms of one ts_muon_orthogonalize of a [rows, cols] matrix (median of reps): each run
 * starts from the same random matrix (the iteration's input is the momentum). */
static double ns_ms(const ts_muon_config *c, const ts_kernels *k, int rows, int cols, int reps)
{
    const size_t n = (size_t)rows * (size_t)cols;
    float *src = bench_random_floats(n, 1.0f, 42u), *x = ts_alloc_floats(n);
    void *scratch = k->dev_alloc(ts_muon_scratch_bytes(rows, cols));
    double ms[64];
    for (int r = -1; r < reps; r++) {
        memcpy(x, src, n * sizeof(float));
        double t0 = ts_now_ms();
        ts_muon_orthogonalize(c, k, x, rows, cols, scratch);
        if (r >= 0) ms[r] = ts_now_ms() - t0;
    }
    k->dev_free(scratch);
    free(src);
    free(x);
    return median(ms, reps);
}

/* ms of the iteration's three GEMMs alone, ns_steps times, on the wide form (s <= l):
 * A[s,s] = X X^T, B[s,s] = c A A + b B, X'[s,l] = B X (the tall form's are the same
 * products transposed): what the iteration would take at the GEMMs' own rate. */
static double gemms_ms(const ts_kernels *k, int s, int l, int ns_steps, int reps)
{
    float *X = bench_random_floats((size_t)s * l, 0.01f, 7u), *Y = ts_alloc_floats((size_t)s * l);
    float *A = ts_alloc_floats((size_t)s * s), *B = bench_random_floats((size_t)s * s, 0.01f, 9u);
    double ms[64];
    for (int r = -1; r < reps; r++) {
        double t0 = ts_now_ms();
        for (int i = 0; i < ns_steps; i++) {
            k->gemm(A, X, X, s, s, l, false, true, 1.0f, 0.0f);
            k->gemm(B, A, A, s, s, s, false, false, 1e-3f, 0.5f);
            k->gemm(Y, B, X, s, l, s, false, false, 1e-3f, 0.0f);
        }
        if (r >= 0) ms[r] = ts_now_ms() - t0;
    }
    free(X);
    free(Y);
    free(A);
    free(B);
    return median(ms, reps);
}

int main(int argc, char **argv)
{
    int threads = argc > 1 && argv[1][0] != '-' ? atoi(argv[1]) : 1, json = 0, layers = 12;
    int ns_steps = 5, reps = 7;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ns-steps") && i + 1 < argc) ns_steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    }
    if (threads < 1 || layers < 1 || ns_steps < 1 || ns_steps > TS_MUON_MAX_NS_STEPS ||
        reps < 1 || reps > 64) {
        fprintf(stderr, "usage: bench_muon [threads] [--json] [--layers N] [--ns-steps N] "
                        "[--reps 1..64]\n");
        return 2;
    }
    ts_cpu_set_threads(threads);
    const ts_kernels *k = &ts_kernels_cpu;
    ts_train_config tc;
    memset(&tc, 0, sizeof tc);
    tc.muon_momentum = 0.95;
    tc.muon_nesterov = true;
    tc.muon_ns_steps = ns_steps;
    snprintf(tc.muon_coefficients, sizeof tc.muon_coefficients, "torch");
    snprintf(tc.muon_scale, sizeof tc.muon_scale, "match_rms_adamw");
    ts_muon_config c;
    ts_muon_config_of(&tc, &c);

    const shape shapes[] = {
        {"q/k/v/o 768x768", 768, 768, 4},
        {"gate/up 2048x768", 2048, 768, 2},
        {"down 768x2048", 768, 2048, 1},
    };
    const double gemm_rate = ts_blas_measure_gflops(); /* the trainer's gemm_gflops */
    double model_ms = 0.0, model_gemm_ms = 0.0, model_flop = 0.0;
    if (!json)
        printf("%-18s %9s %9s %9s %9s %9s\n", "matrix", "GFLOP", "NS ms", "GFLOP/s",
               "GEMMs ms", "GFLOP/s");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const shape *sh = &shapes[i];
        const int s = sh->rows < sh->cols ? sh->rows : sh->cols;
        const int l = sh->rows < sh->cols ? sh->cols : sh->rows;
        const double flop = 2.0 * ns_steps * ts_muon_ns_cost(sh->rows, sh->cols);
        const double t = ns_ms(&c, k, sh->rows, sh->cols, reps);
        const double tg = gemms_ms(k, s, l, ns_steps, reps);
        model_ms += (double)sh->count * layers * t;
        model_gemm_ms += (double)sh->count * layers * tg;
        model_flop += (double)sh->count * layers * flop;
        if (json)
            printf("{\"matrix\":\"%s\",\"rows\":%d,\"cols\":%d,\"gflop\":%.4f,\"ns_ms\":%.3f,"
                   "\"ns_gflops\":%.1f,\"gemms_ms\":%.3f,\"gemms_gflops\":%.1f}\n",
                   sh->what, sh->rows, sh->cols, flop / 1e9, t, flop / (t * 1e6), tg,
                   flop / (tg * 1e6));
        else
            printf("%-18s %9.3f %9.2f %9.1f %9.2f %9.1f\n", sh->what, flop / 1e9, t,
                   flop / (t * 1e6), tg, flop / (tg * 1e6));
    }
    const double rate = model_flop / (model_ms * 1e6);
    if (json)
        printf("{\"threads\":%d,\"layers\":%d,\"ns_steps\":%d,\"model_gflop\":%.3f,"
               "\"model_ns_ms\":%.1f,\"model_ns_gflops\":%.1f,\"model_gemms_ms\":%.1f,"
               "\"gemm_gflops\":%.1f,\"of_gemm\":%.3f}\n",
               threads, layers, ns_steps, model_flop / 1e9, model_ms, rate, model_gemm_ms,
               gemm_rate, rate / gemm_rate);
    else
        printf("model (%d blocks): %.2f GFLOP, NS %.1f ms = %.1f GFLOP/s (GEMMs alone %.1f ms), "
               "%.0f%% of the trainer's sgemm rate %.1f GFLOP/s (threads %d, ns_steps %d)\n",
               layers, model_flop / 1e9, model_ms, rate, model_gemm_ms, 100.0 * rate / gemm_rate,
               gemm_rate, threads, ns_steps);
    return 0;
}
