/* The bf16 GEMM ceiling: OpenBLAS sgemm against oneDNN bf16 (through the cpu-bf16
 * table's matmul slots, exactly what training runs) for GPT-2 124M's GEMMs at
 * B*T = 2048 tokens: each linear layer's forward and its two backward GEMMs (dinp =
 * dout @ W; dweight += dout^T @ inp), with the transposes matmul.c and matmul_bf16.c
 * use. GFLOP/s from the median of several runs after a warm-up (the first run also
 * creates oneDNN's primitive).
 * Usage: bench_gemm_bf16 [threads (2)] [tokens (2048)]
 * DNNL_VERBOSE=1 names the kernel oneDNN picks; DNNL_MAX_CPU_ISA=AVX512_CORE measures
 * it without the BF16 instructions. */
#include <cblas.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>

#include "core/error.h"
#include "core/timer.h"
#include "kernels/cpu/bf16.h"
#include "kernels/kernels.h"

typedef struct {
    const char *what;
    int C, OC; /* nn.Linear C -> OC */
} layer;

typedef enum { FWD, DINP, DWEIGHT } pass;
static const char *pass_name[] = {"fwd", "dinp", "dweight"};

typedef struct {
    float *x, *w, *dout, *out, *dinp, *dw;
    ts_bf16 *xh, *wh, *douth, *outh, *dinph;
} buffers;

static void run_sgemm(const buffers *b, pass p, int N, int C, int OC)
{
    if (p == FWD)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, b->x, C, b->w, C,
                    0.0f, b->out, OC);
    else if (p == DINP)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, b->dout, OC, b->w,
                    C, 0.0f, b->dinp, C);
    else
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, b->dout, OC, b->x, C,
                    1.0f, b->dw, C);
}

static void run_bf16(const buffers *b, pass p, int N, int C, int OC)
{
    const ts_kernels *k = &ts_kernels_cpu_bf16;
    if (p == FWD) k->matmul_forward(b->outh, b->xh, b->wh, NULL, N, C, OC);
    else if (p == DINP) k->matmul_backward(b->dinph, NULL, NULL, b->douth, b->xh, b->wh, N, C, OC);
    else k->matmul_backward(NULL, b->dw, NULL, b->douth, b->xh, b->wh, N, C, OC);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* GFLOP/s of the median run after one warm-up (the median, not the best: on a shared
 * machine the best run of a few can catch a boost clock the others do not see). */
static double rate(const buffers *b, pass p, int N, int C, int OC, int bf16)
{
    double flop = 2.0 * N * C * OC, ms[9];
    int reps = flop > 5e10 ? 3 : 9;
    for (int r = -1; r < reps; r++) {
        double t0 = ts_now_ms();
        if (bf16) run_bf16(b, p, N, C, OC);
        else run_sgemm(b, p, N, C, OC);
        if (r >= 0) ms[r] = ts_now_ms() - t0;
    }
    qsort(ms, (size_t)reps, sizeof ms[0], cmp_double);
    return flop / (ms[reps / 2] * 1e-3) / 1e9;
}

static float *rand_floats(size_t n)
{
    float *x = ts_alloc_floats(n);
    for (size_t i = 0; i < n; i++) x[i] = (float)((i * 7) % 13) * 0.01f - 0.06f;
    return x;
}

static ts_bf16 *to_bf16(const float *x, size_t n)
{
    ts_bf16 *h = ts_malloc(n * sizeof *h);
    ts_f32_to_bf16_array(h, x, n);
    return h;
}

int main(int argc, char **argv)
{
    /* Positional THREADS and TOKENS; --json anywhere adds a last line for scripts
     * (bench/bf16.sh reads the time-weighted rates from it). */
    int threads = 2, N = 2048, pos = 0;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = true;
        else if (pos++ == 0) threads = atoi(argv[i]);
        else N = atoi(argv[i]);
    }
    if (threads < 1 || N < 1) {
        fprintf(stderr, "usage: bench_gemm_bf16 [threads >= 1] [tokens >= 1] [--json]\n");
        return 2;
    }
    ts_cpu_set_threads(threads);
    const layer layers[] = {
        {"qkv", 768, 2304}, {"attproj", 768, 768}, {"fc", 768, 3072},
        {"fcproj", 3072, 768}, {"lm_head", 768, 50257},
    };
    size_t nl = sizeof layers / sizeof layers[0], maxc = 3072, maxoc = 50257;
    size_t nw = maxoc * 768; /* the LM head's weight, the largest OC * C */
    buffers b = {
        .x = rand_floats((size_t)N * maxc), .w = rand_floats(nw),
        .dout = rand_floats((size_t)N * maxoc), .out = ts_alloc_floats((size_t)N * maxoc),
        .dinp = ts_alloc_floats((size_t)N * maxc), .dw = ts_alloc_floats(maxoc * 768),
    };
    b.xh = to_bf16(b.x, (size_t)N * maxc);
    b.wh = to_bf16(b.w, nw);
    b.douth = to_bf16(b.dout, (size_t)N * maxoc);
    b.outh = ts_malloc((size_t)N * maxoc * sizeof(ts_bf16));
    b.dinph = ts_malloc((size_t)N * maxc * sizeof(ts_bf16));

    printf("GPT-2 124M GEMMs at %d tokens, %d thread%s; oneDNN ISA %s (cpu-bf16 matmul "
           "slots), OpenBLAS sgemm\n",
           N, threads, threads == 1 ? "" : "s", ts_dnnl_isa());
    printf("%-9s %-8s %6s %6s %6s %12s %12s %7s\n", "layer", "gemm", "M", "N", "K",
           "sgemm GF/s", "bf16 GF/s", "ratio");
    double t32 = 0, t16 = 0, flops = 0;
    for (size_t i = 0; i < nl; i++) {
        int C = layers[i].C, OC = layers[i].OC;
        for (int p = FWD; p <= DWEIGHT; p++) {
            int m = p == DWEIGHT ? OC : N, n = p == DINP ? C : p == FWD ? OC : C;
            int k = p == FWD ? C : p == DINP ? OC : N;
            double r32 = rate(&b, (pass)p, N, C, OC, 0), r16 = rate(&b, (pass)p, N, C, OC, 1);
            double f = 2.0 * N * C * OC;
            t32 += f / r32;
            t16 += f / r16;
            flops += f;
            printf("%-9s %-8s %6d %6d %6d %12.1f %12.1f %6.2fx\n", layers[i].what,
                   pass_name[p], m, n, k, r32, r16, r16 / r32);
        }
    }
    printf("%-9s %-8s %6s %6s %6s %12.1f %12.1f %6.2fx  (time-weighted)\n", "all", "", "", "",
           "", flops / t32, flops / t16, t32 / t16);
    printf("reproduce: env -u OPENBLAS_CORETYPE %s %d %d\n", argv[0], threads, N);
    if (json)
        printf("{\"threads\": %d, \"tokens\": %d, \"dnnl_isa\": \"%s\", \"sgemm_gflops\": %.1f, "
               "\"bf16_gflops\": %.1f}\n",
               threads, N, ts_dnnl_isa(), flops / t32, flops / t16);
    return 0;
}
