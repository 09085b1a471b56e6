/* Times the CPU's row and elementwise kernels (every kernel but the GEMMs and attention)
 * in both storage types, fp32 (ts_kernels_cpu) and bf16 (ts_kernels_cpu_bf16), at GPT-2
 * 124M training shapes (B=4, T=256, C=768, V=50257) and, for the llama kernels, a
 * llama-shaped block of the same width (F=2048, NH=12, NKV=4, HS=64). These kernels run
 * on any x86 CPU in both dtypes (the bf16 table's GEMMs need AVX512_BF16 or AMX, which
 * bench_kernels and bench_step time where the CPU has them).
 *
 *   cmake --build build --target bench_rows && ./build/bench/bench_rows [threads] [reps]
 *
 * Each row is the best of `reps` calls after one warm-up (default 15), in wall time and
 * in the process's CPU time (all threads; with 1 thread the kernel's own work, which
 * time slices lost to other processes do not inflate: on a shared, oversubscribed
 * machine the column to compare). Only the public kernel table is called, so the same
 * file builds against an older library for a before/after run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "core/timer.h"
#include "kernels/kernels.h"
#include "bench_util.h"

enum { B = 4, T = 256, C = 768, V = 50257, N = B * T, F = 2048, NH = 12, NKV = 4, HS = 64 };

static float *rnd(size_t n, float scale) { return bench_random_floats(n, scale, 12345u); }

/* n random activations in the table's storage type. */
static void *act(const ts_kernels *k, size_t n, float scale)
{
    float *f = rnd(n, scale);
    void *a = ts_malloc(n * ts_dtype_bytes(k->act_dtype));
    k->convert(a, k->act_dtype, f, TS_DTYPE_F32, n);
    free(f);
    return a;
}

static double cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

#define NROWS 32
static const char *names[NROWS];
static double best[2][NROWS], best_cpu[2][NROWS]; /* [dtype][row] ms */
static int nrows;

#define TIME(d, row, reps, stmt)                                                             \
    do {                                                                                     \
        const int i_ = (row);                                                                \
        names[i_] = #stmt;                                                                   \
        stmt; /* warm-up */                                                                  \
        double b_ = 1e300, c_ = 1e300;                                                       \
        for (int r_ = 0; r_ < (reps); r_++) {                                                \
            double t0_ = ts_now_ms(), u0_ = cpu_ms();                                        \
            stmt;                                                                            \
            double du_ = cpu_ms() - u0_, dt_ = ts_now_ms() - t0_;                            \
            b_ = dt_ < b_ ? dt_ : b_;                                                        \
            c_ = du_ < c_ ? du_ : c_;                                                        \
        }                                                                                    \
        best[d][i_] = b_;                                                                    \
        best_cpu[d][i_] = c_;                                                                \
        nrows = i_ + 1 > nrows ? i_ + 1 : nrows;                                             \
    } while (0)

/* One table's rows; `d` indexes the result columns. Logits are refreshed from a copy
 * before each cross-entropy call (it works in place): the copy is timed with it, the
 * same in both dtypes and before and after. */
static void run(const ts_kernels *k, int d, int reps)
{
    const size_t NC = (size_t)N * C, es = ts_dtype_bytes(k->act_dtype);
    int *tokens = ts_malloc(N * sizeof(int));
    for (int i = 0; i < N; i++) tokens[i] = (i * 7919) % V;
    float *wte = rnd((size_t)V * C, 0.04f), *wpe = rnd((size_t)T * C, 0.04f);
    float *dwte = ts_alloc_floats((size_t)V * C), *dwpe = ts_alloc_floats((size_t)T * C);
    float *w = rnd(C, 1.0f), *bias = rnd(C, 1.0f), *dw = ts_alloc_floats(C);
    float *db = ts_alloc_floats(C), *mean = ts_alloc_floats(N), *rstd = ts_alloc_floats(N);
    void *x = act(k, NC, 2.0f), *y = act(k, NC, 2.0f), *dy = act(k, NC, 1.0f);
    void *dx = act(k, NC, 1.0f), *res = act(k, NC, 1.0f);
    void *h = act(k, NC * 4, 2.0f), *dh = act(k, NC * 4, 1.0f), *h2 = act(k, NC * 4, 1.0f);
    void *gu = act(k, (size_t)N * 2 * F, 2.0f), *dgu = act(k, (size_t)N * 2 * F, 1.0f);
    void *sw = act(k, (size_t)N * F, 1.0f);
    const size_t R = (size_t)N * (NH + 2 * NKV) * HS;
    void *qkv = act(k, R, 2.0f);
    float *cs = rnd((size_t)T * HS / 2, 2.0f), *sn = rnd((size_t)T * HS / 2, 2.0f);
    void *logits0 = act(k, (size_t)N * V, 4.0f), *logits = ts_malloc((size_t)N * V * es);
    int nv = (V + 1) / 2; /* vocab parallelism over 2 ranks: this rank's half */
    float *losses = ts_alloc_floats(N), *rowmax = ts_alloc_floats(N);
    float *tl = ts_alloc_floats(N), *se = ts_alloc_floats(N);
    int row = 0;

    TIME(d, row++, reps, k->encoder_forward(y, tokens, wte, wpe, B, T, C));
    TIME(d, row++, reps, k->encoder_backward(dwte, dwpe, dy, tokens, B, T, C));
    TIME(d, row++, reps, k->layernorm_forward(y, mean, rstd, x, w, bias, N, C));
    TIME(d, row++, reps, k->residual_layernorm_forward(res, y, mean, rstd, x, dy, w, bias, N, C));
    TIME(d, row++, reps, k->layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, N, C));
    TIME(d, row++, reps, k->gelu_forward(h2, h, NC * 4));
    TIME(d, row++, reps, k->gelu_backward(h2, h, dh, NC * 4));
    TIME(d, row++, reps, k->residual_forward(y, x, dy, NC));
    TIME(d, row++, reps, k->rmsnorm_forward(y, rstd, x, w, N, C, 1e-5f));
    TIME(d, row++, reps, k->residual_rmsnorm_forward(res, y, rstd, x, dy, w, N, C, 1e-5f));
    TIME(d, row++, reps, k->rmsnorm_backward(dx, dw, dy, x, w, rstd, N, C));
    TIME(d, row++, reps, k->swiglu_forward(sw, gu, N, F));
    TIME(d, row++, reps, k->swiglu_backward(dgu, gu, sw, N, F));
    TIME(d, row++, reps,
         k->rope_forward(qkv, cs, sn, B, T, ts_att_heads_gqa(NH, NKV, HS), HS, false));
    TIME(d, row++, reps,
         k->rope_backward(qkv, cs, sn, B, T, ts_att_heads_gqa(NH, NKV, HS), HS, false));
    TIME(d, row++, reps / 3 + 1,
         (memcpy(logits, logits0, (size_t)N * V * es),
          k->crossentropy_forward_backward(losses, logits, tokens, N, V, 1.0f / N)));
    TIME(d, row++, reps, k->vocab_embed_forward(y, tokens, wte, wpe, 0, nv, B, T, C));
    TIME(d, row++, reps, k->vocab_embed_backward(dwte, dwpe, dy, tokens, 0, nv, B, T, C));
    TIME(d, row++, reps / 3 + 1, k->xent_vp_stats(rowmax, tl, logits0, tokens, 0, nv, N));
    TIME(d, row++, reps / 3 + 1, k->xent_vp_sumexp(se, logits0, rowmax, N, nv));
    TIME(d, row++, reps / 3 + 1,
         (memcpy(logits, logits0, (size_t)N * nv * es),
          k->xent_vp_finish(losses, logits, tokens, 0, nv, rowmax, se, tl, N, 1.0f / N)));

    free(tokens), free(wte), free(wpe), free(dwte), free(dwpe), free(w), free(bias), free(dw);
    free(db), free(mean), free(rstd), free(x), free(y), free(dy), free(dx), free(res), free(h);
    free(dh), free(h2), free(gu), free(dgu), free(sw), free(qkv), free(cs), free(sn);
    free(logits0), free(logits), free(losses), free(rowmax), free(tl), free(se);
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 2, reps = argc > 2 ? atoi(argv[2]) : 15;
    if (threads < 1 || reps < 1) {
        fprintf(stderr, "usage: bench_rows [threads] [reps]\n");
        return 2;
    }
    ts_cpu_set_threads(threads);
    run(&ts_kernels_cpu, 0, reps);
    run(&ts_kernels_cpu_bf16, 1, reps);
    printf("bench_rows: B=%d T=%d C=%d V=%d F=%d NH=%d NKV=%d HS=%d, %d threads, best of %d\n",
           B, T, C, V, F, NH, NKV, HS, threads, reps);
    printf("%-30s %10s %10s %10s %10s\n", "kernel", "fp32 ms", "fp32 cpu", "bf16 ms",
           "bf16 cpu");
    for (int i = 0; i < nrows; i++) {
        /* the kernel's name: the call's text from "k->" to its "(" */
        const char *s = strstr(names[i], "k->") + 3;
        printf("%-30.*s %10.3f %10.3f %10.3f %10.3f\n", (int)strcspn(s, "("), s, best[0][i],
               best_cpu[0][i], best[1][i], best_cpu[1][i]);
    }
    return 0;
}
