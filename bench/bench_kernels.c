/* Times every CPU kernel at GPT-2 124M training shapes (B=4, T=256, C=768, NH=12,
 * V=50257, 12 layers) and compares the whole step's rate with plain cblas_sgemm.
 *
 *   cmake --build build --target bench_kernels && ./build/bench/bench_kernels [threads]
 *
 * GFLOP/s use nominal FLOPs: 2*M*N*K per GEMM, attention counted as if not causal
 * (4*B*NH*T*T*HS forward, twice that backward), as model-FLOP estimates do. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/error.h"
#include "core/timer.h"
#include "kernels/kernels.h"
#include "bench_util.h"
#include "kernels/cpu/blas_core.h"

enum { B = 4, T = 256, C = 768, NH = 12, V = 50257, L = 12, N = B * T };
#define NPARAMS 124475904ull /* GPT-2 124M with tied embeddings, wpe of 1024 rows */

static const ts_kernels *K = &ts_kernels_cpu;

static float *rnd(size_t n, float scale) { return bench_random_floats(n, scale, 12345u); }

typedef struct {
    const char *name;
    double ms, gflop, per_step; /* per_step: calls in one training step */
} row;

static row rows[32];
static int nrows = 0;

/* Best of `reps` timed calls after one warm-up: the machine may be shared, and the
 * minimum is the least disturbed estimate. */
#define TIME(label, gf, calls, reps, stmt)                                                   \
    do {                                                                                     \
        stmt; /* warm-up */                                                                  \
        double best_ = 1e300;                                                                \
        for (int r_ = 0; r_ < (reps); r_++) {                                                \
            double t0_ = ts_now_ms();                                                        \
            stmt;                                                                            \
            double dt_ = ts_now_ms() - t0_;                                                  \
            best_ = dt_ < best_ ? dt_ : best_;                                               \
        }                                                                                    \
        rows[nrows++] = (row){label, best_, (gf), (calls)};                                  \
    } while (0)

int main(int argc, char **argv)
{
    ts_blas_select_core(argc, argv); /* the OpenBLAS kernel tessera would run */
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    ts_cpu_set_threads(threads);

    size_t NC = (size_t)N * C;
    int *tokens = ts_malloc(N * sizeof(int));
    for (int i = 0; i < N; i++) tokens[i] = (i * 7919) % V;
    float *wte = rnd((size_t)V * C, 0.04f), *wpe = rnd((size_t)1024 * C, 0.04f);
    float *dwte = ts_alloc_floats((size_t)V * C), *dwpe = ts_alloc_floats((size_t)1024 * C);
    float *x = rnd(NC, 2.0f), *y = ts_alloc_floats(NC), *dy = rnd(NC, 1.0f);
    float *dx = ts_alloc_floats(NC), *lnw = rnd(C, 1.0f), *lnb = rnd(C, 1.0f);
    float *mean = ts_alloc_floats(N), *rstd = ts_alloc_floats(N);
    float *dlnw = ts_alloc_floats(C), *dlnb = ts_alloc_floats(C);
    float *w = rnd((size_t)4 * C * C, 0.04f), *bias = rnd(4 * C, 0.1f);
    float *dw = ts_alloc_floats((size_t)4 * C * C), *db = ts_alloc_floats(4 * C);
    float *h = rnd(NC * 4, 2.0f), *dh = rnd(NC * 4, 1.0f), *h2 = ts_alloc_floats(NC * 4);
    float *qkv = rnd(NC * 3, 2.0f), *dqkv = ts_alloc_floats(NC * 3);
    float *att = ts_alloc_floats((size_t)B * NH * T * T);
    float *scratch = ts_alloc_floats((size_t)B * NH * T * T);
    float *logits = ts_alloc_floats((size_t)N * V), *losses = ts_alloc_floats(N);
    float *dlogits = rnd((size_t)N * V, 1e-3f);
    size_t np = NPARAMS;
    float *p = rnd(np, 0.1f), *g = rnd(np, 1e-2f), *m = ts_alloc_floats(np),
          *v = ts_alloc_floats(np);

    /* Reference: plain sgemm, 1024 x 3072 x 768 (the MLP's fc layer). */
    double gf_ref = 2.0 * N * 4 * C * C * 1e-9;
    TIME("cblas_sgemm 1024x768x3072", gf_ref, 0, 10,
         cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, 4 * C, C, 1.0f, x, C, w, C,
                     0.0f, h2, 4 * C));
    double sgemm_rate = gf_ref / (rows[0].ms * 1e-3);

    double gf_att = 4.0 * B * NH * T * T * (C / NH) * 1e-9;
    TIME("encoder_forward", 0, 1, 20, K->encoder_forward(y, tokens, wte, wpe, B, T, C));
    TIME("encoder_backward", 0, 1, 20, K->encoder_backward(dwte, dwpe, dy, tokens, B, T, C));
    TIME("layernorm_forward", 0, 2 * L + 1, 20,
         K->layernorm_forward(y, mean, rstd, x, lnw, lnb, N, C));
    TIME("layernorm_backward", 0, 2 * L + 1, 20,
         K->layernorm_backward(dx, dlnw, dlnb, dy, x, lnw, mean, rstd, N, C));
    TIME("matmul_forward qkv (C->3C)", 2.0 * N * C * 3 * C * 1e-9, L, 10,
         K->matmul_forward(qkv, x, w, bias, N, C, 3 * C));
    TIME("matmul_backward qkv", 4.0 * N * C * 3 * C * 1e-9, L, 10,
         K->matmul_backward(dx, dw, db, dqkv, x, w, N, C, 3 * C));
    TIME("matmul_forward proj (C->C)", 2.0 * N * C * C * 1e-9, L, 10,
         K->matmul_forward(y, x, w, bias, N, C, C));
    TIME("matmul_backward proj", 4.0 * N * C * C * 1e-9, L, 10,
         K->matmul_backward(dx, dw, db, dy, x, w, N, C, C));
    TIME("matmul_forward fc (C->4C)", 2.0 * N * C * 4 * C * 1e-9, L, 10,
         K->matmul_forward(h2, x, w, bias, N, C, 4 * C));
    TIME("matmul_backward fc", 4.0 * N * C * 4 * C * 1e-9, L, 10,
         K->matmul_backward(dx, dw, db, dh, x, w, N, C, 4 * C));
    TIME("matmul_forward fcproj (4C->C)", 2.0 * N * C * 4 * C * 1e-9, L, 10,
         K->matmul_forward(y, h, w, bias, N, 4 * C, C));
    TIME("matmul_backward fcproj", 4.0 * N * C * 4 * C * 1e-9, L, 10,
         K->matmul_backward(h2, dw, db, dy, h, w, N, 4 * C, C));
    const ts_att_heads heads = ts_att_heads_gqa(NH, NH, C / NH);
    TIME("attention_forward", gf_att, L, 10, K->attention_forward(y, att, qkv, B, T, heads));
    TIME("attention_backward", 2 * gf_att, L, 10,
         K->attention_backward(dqkv, scratch, dy, qkv, att, B, T, heads));
    TIME("gelu_forward", 0, L, 20, K->gelu_forward(h2, h, NC * 4));
    TIME("gelu_backward", 0, L, 20, K->gelu_backward(h2, h, dh, NC * 4));
    TIME("residual_forward", 0, 2 * L, 20, K->residual_forward(y, x, dy, NC));
    TIME("matmul_forward lm_head (C->V)", 2.0 * N * C * V * 1e-9, 1, 2,
         K->matmul_forward(logits, x, wte, NULL, N, C, V));
    TIME("crossentropy_forward_backward", 0, 1, 3,
         K->crossentropy_forward_backward(losses, logits, tokens, N, V, 1.0f / N));
    TIME("matmul_backward lm_head", 4.0 * N * C * V * 1e-9, 1, 2,
         K->matmul_backward(dx, dwte, NULL, dlogits, x, wte, N, C, V));
    double ssq = 0.0;
    TIME("sum_squares (124M)", 0, 1, 3, ssq += K->sum_squares(g, np));
    int t = 1;
    TIME("adamw_update (124M)", 0, 1, 3,
         K->adamw_update(p, g, 1.0f, m, v, np, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t++));

    printf("bench_kernels: GPT-2 124M shapes B=%d T=%d C=%d NH=%d V=%d, %d threads "
           "(checksum %.3g)\n\n",
           B, T, C, NH, V, threads, ssq);
    printf("%-32s %10s %10s %8s %12s\n", "kernel", "ms/call", "GFLOP/s", "calls", "ms/step");
    double step_ms = 0.0, step_gf = 0.0, gemm_ms = 0.0, other_ms = 0.0;
    for (int i = 0; i < nrows; i++) {
        row *r = &rows[i];
        char rate[32] = "";
        if (r->gflop > 0) snprintf(rate, sizeof rate, "%.1f", r->gflop / (r->ms * 1e-3));
        printf("%-32s %10.3f %10s %8.0f %12.1f\n", r->name, r->ms, rate, r->per_step,
               r->ms * r->per_step);
        step_ms += r->ms * r->per_step;
        step_gf += r->gflop * r->per_step;
        if (r->per_step > 0) *(r->gflop > 0 ? &gemm_ms : &other_ms) += r->ms * r->per_step;
    }
    double step_rate = step_gf / (step_ms * 1e-3);
    printf("\none training step (sum of kernels): %.0f ms, %.1f GFLOP, %.1f GFLOP/s = %.0f%% of "
           "sgemm's %.1f GFLOP/s\n",
           step_ms, step_gf, step_rate, 100.0 * step_rate / sgemm_rate, sgemm_rate);
    printf("  GEMM + attention kernels %.0f ms, everything else %.0f ms\n", gemm_ms, other_ms);

    free(tokens), free(wte), free(wpe), free(dwte), free(dwpe), free(x), free(y), free(dy);
    free(dx), free(lnw), free(lnb), free(mean), free(rstd), free(dlnw), free(dlnb), free(w);
    free(bias), free(dw), free(db), free(h), free(dh), free(h2), free(qkv), free(dqkv);
    free(att), free(scratch), free(logits), free(losses), free(dlogits), free(p), free(g);
    free(m), free(v);
    return 0;
}
