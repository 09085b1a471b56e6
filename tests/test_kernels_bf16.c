/* The bf16 CPU kernels (ts_kernels_cpu_bf16) against the fp32 CPU kernels (the
 * reference, called through ts_kernels_cpu) run on the same inputs: random bf16 values,
 * widened exactly for the fp32 kernel, so the only differences left are the bf16
 * kernels' own roundings. Every bf16 output starts as NaN (an element a kernel fails to
 * write fails the check); accumulating outputs start random in both runs.
 *
 * Tolerances, |got - ref| <= rel |ref| + floor max|ref| per element:
 * - one rounding to bf16 (elementwise kernels, LayerNorm, dlogits, the saved
 *   probabilities, a GEMM's bf16 output): rel 2^-7. Half an ulp of bf16 is 2^-9..2^-8
 *   of the value; 2^-7 allows a rounding flipped by fp32 differences before it.
 *   floor 1e-5 for elementwise results, 2^-12 for GEMM outputs, where the two
 *   libraries' fp32 accumulation orders differ by ~K 2^-24 of sum |a b|.
 * - fp32 outputs of the same arithmetic (losses, LayerNorm's dweight/dbias, embedding
 *   gradients): rel 1e-5; fp32 GEMM outputs (dweight): floor 1e-5.
 * - attention, where the probabilities (forward) and dS (backward) are rounded to bf16
 *   before a GEMM reads them: floor 2^-8 (forward) and 2^-7 (backward) of the largest
 *   output: sums of T terms each off by up to 2^-8 relative, then the output rounded
 *   (measured 0.13-0.46 of these tolerances at T 67 and 200).
 * Shapes: odd (C, OC, N, V not multiples of 16; T not a multiple of attention's
 * 64-row block) and GPT-2-like (C 768, 12 heads of 64, V 50257).
 *
 * Skipped (77) on CPUs without AVX512_BF16 / AMX-BF16. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cpu/bf16.h"
#include "kernels/kernels.h"
#include "test_util.h"

static const ts_kernels *K32 = &ts_kernels_cpu;
static const ts_kernels *K16 = &ts_kernels_cpu_bf16;

#define ROUND_REL (1.0 / 128) /* 2^-7 */
#define ELEM_FLOOR 1e-5
#define GEMM_FLOOR (1.0 / 4096) /* 2^-12 */
#define F32_REL 1e-5

/* ---- helpers ------------------------------------------------------------------ */

/* n random bf16 values in [-scale, scale); *wide receives them widened (fp32). */
static ts_bf16 *rand_bf16(size_t n, float scale, float **wide)
{
    ts_bf16 *h = ts_malloc(n * sizeof *h);
    float *f = ts_alloc_floats(n);
    for (size_t i = 0; i < n; i++) {
        h[i] = ts_f32_to_bf16(scale * ts_test_frand());
        f[i] = ts_bf16_to_f32(h[i]);
    }
    *wide = f;
    return h;
}

static ts_bf16 *nan_bf16(size_t n)
{
    ts_bf16 *h = ts_malloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = TS_BF16_QNAN;
    return h;
}

static float *nan_f32(size_t n)
{
    float *f = ts_alloc_floats(n);
    for (size_t i = 0; i < n; i++) f[i] = NAN;
    return f;
}

static float *widen(const ts_bf16 *h, size_t n)
{
    float *f = ts_alloc_floats(n);
    ts_bf16_to_f32_array(f, h, n);
    return f;
}

static float *copy_f32(const float *x, size_t n)
{
    float *y = ts_alloc_floats(n);
    memcpy(y, x, n * sizeof *y);
    return y;
}

static ts_bf16 *copy_bf16(const ts_bf16 *x, size_t n)
{
    ts_bf16 *y = ts_malloc(n * sizeof *y);
    memcpy(y, x, n * sizeof *y);
    return y;
}

/* got (fp32) against ref: the largest |got - ref| / (rel |ref| + floor max|ref|), which
 * must be <= 1 (a NaN fails). */
static void check_close(const char *what, const float *got, const float *ref, size_t n,
                        double rel, double floor_)
{
    double mx = 0.0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs((double)ref[i]));
    double worst = 0.0;
    size_t at = 0, exact = 0;
    for (size_t i = 0; i < n; i++) {
        double allowed = rel * fabs((double)ref[i]) + floor_ * mx + 1e-30;
        double r = fabs((double)got[i] - (double)ref[i]) / allowed;
        if (!(r <= worst)) { /* NaN included */
            worst = isnan(r) ? INFINITY : r;
            at = i;
        }
        exact += ts_f32_to_bf16(ref[i]) == ts_f32_to_bf16(got[i]);
    }
    printf("  %-36s err/tol %.3f  (%5.1f%% equal the reference rounded)\n", what, worst,
           100.0 * (double)exact / (double)(n ? n : 1));
    CHECKF(worst <= 1.0, "%s: element %zu: got %g, ref %g", what, at, (double)got[at],
           (double)ref[at]);
}

static void check_bf16(const char *what, const ts_bf16 *got, const float *ref, size_t n,
                       double rel, double floor_)
{
    float *g = widen(got, n);
    check_close(what, g, ref, n, rel, floor_);
    free(g);
}

/* ---- conversion --------------------------------------------------------------- */

static void test_convert(void)
{
    /* Round to nearest even, ties to even, NaN quiet, denormals to zero, overflow. */
    const uint32_t in[] = {0x3f800000, 0x3f808000, 0x3f818000, 0x3f808001, 0x7f7fffff,
                           0x7f800001, 0xff800000, 0x00000001, 0x807fffff, 0x00800000};
    const ts_bf16 want[] = {0x3f80, 0x3f80, 0x3f82, 0x3f81, 0x7f80,
                            0x7fc0, 0xff80, 0x0000, 0x8000, 0x0080};
    size_t ns = sizeof in / sizeof in[0];
    for (size_t i = 0; i < ns; i++) {
        float f;
        memcpy(&f, &in[i], sizeof f);
        CHECKF(ts_f32_to_bf16(f) == want[i], "scalar %08x -> %04x", in[i], ts_f32_to_bf16(f));
    }
    /* The table's convert (vector, threaded) against the scalar on many bit patterns. */
    size_t n = (size_t)1 << 20;
    float *f = ts_alloc_floats(n), *back = ts_alloc_floats(n);
    ts_bf16 *h = ts_malloc(n * sizeof *h);
    size_t bad = 0;
    for (uint64_t base = 0; base < ((uint64_t)1 << 32); base += (uint64_t)n * 4093) {
        for (size_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)(base + i * 4093 + (i & 7));
            memcpy(&f[i], &u, sizeof u);
        }
        memcpy(f, in, sizeof in);
        K16->convert(h, TS_DTYPE_BF16, f, TS_DTYPE_F32, n - 3); /* a ragged tail */
        for (size_t i = 0; i < n - 3; i++) bad += h[i] != ts_f32_to_bf16(f[i]);
        K16->convert(back, TS_DTYPE_F32, h, TS_DTYPE_BF16, n - 3);
        for (size_t i = 0; i < n - 3; i++) { /* widening is exact: the bits shifted */
            uint32_t u;
            memcpy(&u, &back[i], sizeof u);
            bad += u != (uint32_t)h[i] << 16;
        }
    }
    CHECKF(bad == 0, "convert: %zu elements differ from the scalar conversion", bad);
    K16->convert(back, TS_DTYPE_F32, f, TS_DTYPE_F32, 100); /* equal types copy */
    CHECK(memcmp(back, f, 100 * sizeof(float)) == 0);
    free(f);
    free(back);
    free(h);
}

/* ---- the kernels, one shape ----------------------------------------------------- */

typedef struct {
    const char *name;
    int B, T, NH, HS, OC, V;
} shape;

static void test_encoder(const shape *s)
{
    int B = s->B, T = s->T, C = s->NH * s->HS, V = s->V;
    size_t N = (size_t)B * T;
    int *tok = ts_malloc(N * sizeof *tok);
    for (size_t i = 0; i < N; i++) tok[i] = (int)(ts_test_next_u64() % (uint64_t)(i % 5 ? V : 7));
    float *wte = ts_test_rand_floats((size_t)V * C, 1.0f), *wpe = ts_test_rand_floats((size_t)T * C, 1.0f);
    ts_bf16 *out = nan_bf16(N * C);
    float *ref = ts_alloc_floats(N * C);
    K16->encoder_forward(out, tok, wte, wpe, B, T, C);
    K32->encoder_forward(ref, tok, wte, wpe, B, T, C);
    check_bf16("encoder_forward", out, ref, N * C, ROUND_REL, ELEM_FLOOR);

    float *dw = ts_test_rand_floats((size_t)V * C, 1.0f), *dp = ts_test_rand_floats((size_t)T * C, 1.0f);
    float *dw32 = copy_f32(dw, (size_t)V * C), *dp32 = copy_f32(dp, (size_t)T * C), *dout32;
    ts_bf16 *dout = rand_bf16(N * C, 1.0f, &dout32);
    K16->encoder_backward(dw, dp, dout, tok, B, T, C);
    K32->encoder_backward(dw32, dp32, dout32, tok, B, T, C);
    check_close("encoder_backward dwte", dw, dw32, (size_t)V * C, F32_REL, 0);
    check_close("encoder_backward dwpe", dp, dp32, (size_t)T * C, F32_REL, 0);

    /* vocab-parallel embedding: this rank's rows [v0, v0 + nv); wpe on and off */
    int v0 = V / 3, nv = V / 2;
    for (int with_wpe = 0; with_wpe < 2; with_wpe++) {
        const float *pe = with_wpe ? wpe : NULL;
        ts_bf16 *o = nan_bf16(N * C);
        K16->vocab_embed_forward(o, tok, wte + (size_t)v0 * C, pe, v0, nv, B, T, C);
        K32->vocab_embed_forward(ref, tok, wte + (size_t)v0 * C, pe, v0, nv, B, T, C);
        check_bf16(with_wpe ? "vocab_embed_forward (wpe)" : "vocab_embed_forward", o, ref, N * C,
                   ROUND_REL, ELEM_FLOOR);
        memcpy(dw32, dw, (size_t)V * C * sizeof(float));
        memcpy(dp32, dp, (size_t)T * C * sizeof(float));
        K16->vocab_embed_backward(dw, with_wpe ? dp : NULL, dout, tok, v0, nv, B, T, C);
        K32->vocab_embed_backward(dw32, with_wpe ? dp32 : NULL, dout32, tok, v0, nv, B, T, C);
        check_close("vocab_embed_backward dwte", dw, dw32, (size_t)V * C, F32_REL, 0);
        check_close("vocab_embed_backward dwpe", dp, dp32, (size_t)T * C, F32_REL, 0);
        free(o);
    }
    free(tok), free(wte), free(wpe), free(out), free(ref), free(dw), free(dp), free(dw32);
    free(dp32), free(dout), free(dout32);
}

static void test_layernorm(const shape *s)
{
    int N = s->B * s->T, C = s->NH * s->HS;
    size_t n = (size_t)N * C;
    float *x32, *w = ts_test_rand_floats((size_t)C, 1.0f), *b = ts_test_rand_floats((size_t)C, 0.5f);
    for (int c = 0; c < C; c++) w[c] += 1.0f;
    ts_bf16 *x = rand_bf16(n, 2.0f, &x32);
    ts_bf16 *out = nan_bf16(n);
    float *mean = nan_f32((size_t)N), *rstd = nan_f32((size_t)N);
    float *ref = ts_alloc_floats(n), *mean32 = ts_alloc_floats((size_t)N), *rstd32 = ts_alloc_floats((size_t)N);
    K16->layernorm_forward(out, mean, rstd, x, w, b, N, C);
    K32->layernorm_forward(ref, mean32, rstd32, x32, w, b, N, C);
    check_bf16("layernorm_forward", out, ref, n, ROUND_REL, ELEM_FLOOR);
    check_close("layernorm_forward mean", mean, mean32, (size_t)N, F32_REL, 1e-6);
    check_close("layernorm_forward rstd", rstd, rstd32, (size_t)N, F32_REL, 0);

    /* backward: dinp ACCUMULATES (starts random, rounded once after the add) */
    float *dout32, *dinp32;
    ts_bf16 *dout = rand_bf16(n, 1.0f, &dout32), *dinp = rand_bf16(n, 1.0f, &dinp32);
    float *dw = ts_test_rand_floats((size_t)C, 1.0f), *db = ts_test_rand_floats((size_t)C, 1.0f);
    float *dw32 = copy_f32(dw, (size_t)C), *db32 = copy_f32(db, (size_t)C);
    ts_bf16 *dinp1 = copy_bf16(dinp, n);
    float *dw1 = copy_f32(dw, (size_t)C), *db1 = copy_f32(db, (size_t)C);
    K16->layernorm_backward(dinp, dw, db, dout, x, w, mean, rstd, N, C);
    K32->layernorm_backward(dinp32, dw32, db32, dout32, x32, w, mean, rstd, N, C);
    check_bf16("layernorm_backward dinp (+=)", dinp, dinp32, n, ROUND_REL, ELEM_FLOOR);
    check_close("layernorm_backward dweight", dw, dw32, (size_t)C, F32_REL, 1e-6);
    check_close("layernorm_backward dbias", db, db32, (size_t)C, F32_REL, 1e-6);

    /* the same bits at one thread as at two, from the same start */
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    K16->layernorm_backward(dinp1, dw1, db1, dout, x, w, mean, rstd, N, C);
    omp_set_num_threads(threads);
    CHECK(memcmp(dinp1, dinp, n * sizeof *dinp1) == 0 && ts_test_same_bits(dw, dw1, C) &&
          ts_test_same_bits(db, db1, C));
    free(x), free(x32), free(w), free(b), free(out), free(mean), free(rstd), free(ref);
    free(mean32), free(rstd32), free(dout), free(dout32), free(dinp), free(dinp32), free(dw);
    free(db), free(dw32), free(db32), free(dinp1), free(dw1), free(db1);
}

static void test_residual_gelu(const shape *s)
{
    int N = s->B * s->T, C = s->NH * s->HS;
    size_t n = (size_t)N * C;
    float *a32, *b32, *w = ts_test_rand_floats((size_t)C, 1.0f), *bias = ts_test_rand_floats((size_t)C, 1.0f);
    ts_bf16 *a = rand_bf16(n, 2.0f, &a32), *b = rand_bf16(n, 2.0f, &b32);
    ts_bf16 *out = nan_bf16(n);
    float *ref = ts_alloc_floats(n);
    K16->residual_forward(out, a, b, n);
    K32->residual_forward(ref, a32, b32, n);
    check_bf16("residual_forward", out, ref, n, ROUND_REL, ELEM_FLOOR);

    /* fused: the LayerNorm reads the rounded sum, so it is the two bf16 calls' bits */
    ts_bf16 *res = nan_bf16(n), *ln = nan_bf16(n), *ln2 = nan_bf16(n);
    float *mean = nan_f32((size_t)N), *rstd = nan_f32((size_t)N);
    float *mean2 = nan_f32((size_t)N), *rstd2 = nan_f32((size_t)N);
    K16->residual_layernorm_forward(res, ln, mean, rstd, a, b, w, bias, N, C);
    K16->layernorm_forward(ln2, mean2, rstd2, out, w, bias, N, C);
    CHECK(memcmp(res, out, n * sizeof *res) == 0);
    CHECK(memcmp(ln, ln2, n * sizeof *ln) == 0 && ts_test_same_bits(mean, mean2, N) &&
          ts_test_same_bits(rstd, rstd2, N));
    /* and against fp32 LayerNorm on the rounded sum */
    float *sum32 = widen(out, n), *ln32 = ts_alloc_floats(n);
    K32->layernorm_forward(ln32, mean2, rstd2, sum32, w, bias, N, C);
    check_bf16("residual_layernorm_forward ln", ln, ln32, n, ROUND_REL, ELEM_FLOOR);

    /* in place: out aliases a */
    ts_bf16 *a2 = copy_bf16(a, n);
    K16->residual_forward(a2, a2, b, n);
    CHECK(memcmp(a2, out, n * sizeof *a2) == 0);

    ts_bf16 *g = nan_bf16(n);
    K16->gelu_forward(g, a, n);
    K32->gelu_forward(ref, a32, n);
    check_bf16("gelu_forward", g, ref, n, ROUND_REL, ELEM_FLOOR);
    ts_bf16 *dg = nan_bf16(n);
    K16->gelu_backward(dg, a, b, n);
    K32->gelu_backward(ref, a32, b32, n);
    check_bf16("gelu_backward", dg, ref, n, ROUND_REL, ELEM_FLOOR);
    ts_bf16 *b2 = copy_bf16(b, n); /* dinp aliasing dout */
    K16->gelu_backward(b2, a, b2, n);
    CHECK(memcmp(b2, dg, n * sizeof *b2) == 0);
    free(a), free(b), free(a32), free(b32), free(w), free(bias), free(out), free(ref), free(res);
    free(ln), free(ln2), free(mean), free(rstd), free(mean2), free(rstd2), free(sum32), free(ln32);
    free(a2), free(g), free(dg), free(b2);
}

static void test_matmul(const shape *s)
{
    int N = s->B * s->T, C = s->NH * s->HS, OC = s->OC;
    float *x32, *w32, *dout32, *bias = ts_test_rand_floats((size_t)OC, 1.0f);
    ts_bf16 *x = rand_bf16((size_t)N * C, 1.0f, &x32), *w = rand_bf16((size_t)OC * C, 0.1f, &w32);
    ts_bf16 *dout = rand_bf16((size_t)N * OC, 1.0f, &dout32);
    float *ref = ts_alloc_floats((size_t)N * OC);
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        ts_bf16 *out = nan_bf16((size_t)N * OC);
        const float *bb = with_bias ? bias : NULL;
        K16->matmul_forward(out, x, w, bb, N, C, OC);
        K32->matmul_forward(ref, x32, w32, bb, N, C, OC);
        check_bf16(with_bias ? "matmul_forward (bias)" : "matmul_forward", out, ref,
                   (size_t)N * OC, ROUND_REL, GEMM_FLOOR);
        free(out);
    }
    ts_bf16 *dinp = nan_bf16((size_t)N * C);
    float *dinp32 = ts_alloc_floats((size_t)N * C);
    float *dw = ts_test_rand_floats((size_t)OC * C, 1.0f), *db = ts_test_rand_floats((size_t)OC, 1.0f);
    float *dw32 = copy_f32(dw, (size_t)OC * C), *db32 = copy_f32(db, (size_t)OC);
    K16->matmul_backward(dinp, dw, db, dout, x, w, N, C, OC);
    K32->matmul_backward(dinp32, dw32, db32, dout32, x32, w32, N, C, OC);
    check_bf16("matmul_backward dinp", dinp, dinp32, (size_t)N * C, ROUND_REL, GEMM_FLOOR);
    check_close("matmul_backward dweight (+=)", dw, dw32, (size_t)OC * C, F32_REL, 1e-5);
    check_close("matmul_backward dbias (+=)", db, db32, (size_t)OC, F32_REL, 1e-6);
    /* the NULL skips: dweight alone, then dinp alone */
    K16->matmul_backward(NULL, dw, NULL, dout, x, w, N, C, OC);
    K32->matmul_backward(NULL, dw32, NULL, dout32, x32, w32, N, C, OC);
    check_close("matmul_backward dweight only", dw, dw32, (size_t)OC * C, F32_REL, 1e-5);
    ts_bf16 *dinp2 = nan_bf16((size_t)N * C);
    K16->matmul_backward(dinp2, NULL, NULL, dout, x, w, N, C, OC);
    CHECK(memcmp(dinp2, dinp, (size_t)N * C * sizeof *dinp) == 0);
    free(x), free(w), free(x32), free(w32), free(dout), free(dout32), free(bias), free(ref);
    free(dinp), free(dinp32), free(dw), free(db), free(dw32), free(db32), free(dinp2);
}

static void test_attention(const shape *s)
{
    int B = s->B, T = s->T, NH = s->NH, HS = s->HS, C = NH * HS;
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, natt = (size_t)B * NH * T * T;
    CHECK(K16->attention_saved_bytes(B, T, NH, HS) == natt * 2);
    float *qkv32, *dout32;
    ts_bf16 *qkv = rand_bf16(nqkv, 2.0f, &qkv32), *dout = rand_bf16(nout, 1.0f, &dout32);
    ts_bf16 *out = nan_bf16(nout), *att = nan_bf16(natt);
    float *out32 = ts_alloc_floats(nout);
    float *att32 = ts_alloc_floats(K32->attention_saved_bytes(B, T, NH, HS) / sizeof(float));
    K16->attention_forward(out, att, qkv, B, T, NH, NH, HS);
    K32->attention_forward(out32, att32, qkv32, B, T, NH, NH, HS);
    check_bf16("attention_forward att", att, att32, natt, ROUND_REL, ELEM_FLOOR);
    check_bf16("attention_forward out", out, out32, nout, ROUND_REL, 1.0 / 256);

    /* backward: the fp32 kernel reads the probabilities the bf16 forward saved */
    size_t nscratch = K16->attention_scratch_bytes(B, T, NH, HS) / sizeof(ts_bf16);
    ts_bf16 *scratch = nan_bf16(nscratch), *dqkv = nan_bf16(nqkv);
    float *p32 = widen(att, natt), *dqkv32 = ts_alloc_floats(nqkv);
    float *scratch32 = ts_alloc_floats(K32->attention_scratch_bytes(B, T, NH, HS) / sizeof(float));
    K16->attention_backward(dqkv, scratch, dout, qkv, att, B, T, NH, NH, HS);
    K32->attention_backward(dqkv32, scratch32, dout32, qkv32, p32, B, T, NH, NH, HS);
    check_bf16("attention_backward dqkv", dqkv, dqkv32, nqkv, ROUND_REL, 1.0 / 128);

    /* the same bits at one thread (each pair is one thread's work) */
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    ts_bf16 *out1 = nan_bf16(nout), *att1 = nan_bf16(natt), *dqkv1 = nan_bf16(nqkv);
    K16->attention_forward(out1, att1, qkv, B, T, NH, NH, HS);
    K16->attention_backward(dqkv1, scratch, dout, qkv, att1, B, T, NH, NH, HS);
    omp_set_num_threads(threads);
    CHECK(memcmp(out1, out, nout * 2) == 0 && memcmp(att1, att, natt * 2) == 0 &&
          memcmp(dqkv1, dqkv, nqkv * 2) == 0);
    free(qkv), free(qkv32), free(dout), free(dout32), free(out), free(att), free(out32);
    free(att32), free(scratch), free(dqkv), free(p32), free(dqkv32), free(scratch32), free(out1);
    free(att1), free(dqkv1);
}

static void test_crossentropy(const shape *s)
{
    int N = s->B * s->T, V = s->V;
    size_t n = (size_t)N * V;
    int *tgt = ts_malloc((size_t)N * sizeof *tgt);
    for (int i = 0; i < N; i++) tgt[i] = (int)(ts_test_next_u64() % (uint64_t)V);
    float *x32, dloss = 1.0f / (float)N;
    ts_bf16 *x = rand_bf16(n, 4.0f, &x32), *x0 = copy_bf16(x, n);
    float *loss = nan_f32((size_t)N), *loss32 = ts_alloc_floats((size_t)N);
    K16->crossentropy_forward_backward(loss, x, tgt, N, V, dloss);
    K32->crossentropy_forward_backward(loss32, x32, tgt, N, V, dloss);
    check_close("crossentropy losses", loss, loss32, (size_t)N, F32_REL, 0);
    check_bf16("crossentropy dlogits", x, x32, n, ROUND_REL, ELEM_FLOOR);

    /* vocab-parallel, one rank's columns [v0, v0 + nv) of the same logits */
    int v0 = V / 4, nv = V / 2 + 3;
    ts_bf16 *xs = ts_malloc((size_t)N * nv * sizeof *xs);
    float *xs32 = ts_alloc_floats((size_t)N * nv);
    for (int r = 0; r < N; r++) {
        memcpy(xs + (size_t)r * nv, x0 + (size_t)r * V + v0, (size_t)nv * sizeof *xs);
        ts_bf16_to_f32_array(xs32 + (size_t)r * nv, xs + (size_t)r * nv, (size_t)nv);
    }
    float *mx = nan_f32(N), *tl = nan_f32(N), *se = nan_f32(N), *ls = nan_f32(N);
    float *mx32 = ts_alloc_floats(N), *tl32 = ts_alloc_floats(N), *se32 = ts_alloc_floats(N),
          *ls32 = ts_alloc_floats(N);
    K16->xent_vp_stats(mx, tl, xs, tgt, v0, nv, N);
    K32->xent_vp_stats(mx32, tl32, xs32, tgt, v0, nv, N);
    CHECK(ts_test_same_bits(mx, mx32, N) && ts_test_same_bits(tl, tl32, N));
    K16->xent_vp_sumexp(se, xs, mx32, N, nv);
    K32->xent_vp_sumexp(se32, xs32, mx32, N, nv);
    check_close("xent_vp_sumexp", se, se32, (size_t)N, F32_REL, 0);
    K16->xent_vp_finish(ls, xs, tgt, v0, nv, mx32, se32, tl32, N, dloss);
    K32->xent_vp_finish(ls32, xs32, tgt, v0, nv, mx32, se32, tl32, N, dloss);
    check_close("xent_vp_finish losses", ls, ls32, (size_t)N, F32_REL, 0);
    check_bf16("xent_vp_finish dlogits", xs, xs32, (size_t)N * nv, ROUND_REL, ELEM_FLOOR);
    free(tgt), free(x), free(x0), free(x32), free(loss), free(loss32), free(xs), free(xs32);
    free(mx), free(tl), free(se), free(ls), free(mx32), free(tl32), free(se32), free(ls32);
}

int main(void)
{
    if (!ts_cpu_bf16_supported()) {
        printf("skipped: this CPU has neither AVX512_BF16 nor AMX-BF16 (cpu-bf16 needs one)\n");
        return 77;
    }
    printf("cpu-bf16 kernels, oneDNN ISA %s, %d threads\n", ts_dnnl_isa(), omp_get_max_threads());
    test_convert();
    const shape shapes[] = {
        {"odd", 2, 67, 3, 25, 300, 1013},      /* C 75, N 134: no multiple of 16 */
        {"gpt2", 2, 200, 12, 64, 3072, 50257}, /* T 200: not a multiple of 64 */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const shape *s = &shapes[i];
        printf("shape %s: B %d T %d C %d (%d heads of %d) OC %d V %d\n", s->name, s->B, s->T,
               s->NH * s->HS, s->NH, s->HS, s->OC, s->V);
        test_encoder(s);
        test_layernorm(s);
        test_residual_gelu(s);
        test_matmul(s);
        test_attention(s);
        test_crossentropy(s);
    }
    return ts_test_report();
}
