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
 * Context parallelism's prefix attention: against the bf16 attention at Tq == Tk and,
 * chunk by chunk, against the full sequence's (the attention tolerances above), on
 * cpu-strict-bf16 and at one thread with the same bits.
 *
 * On CPUs without AVX512_BF16 / AMX-BF16 the kernels on oneDNN (matmul, attention) are
 * not run; the rest (plain C, bf16.h's scalar conversion) still are, and a run with
 * no failures then reports skipped (77): the file's whole set did not run. */
#include <math.h>
#include <omp.h>
#include <stdbool.h>
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

    /* no position embedding (wpe, dwpe NULL): the token rows rounded, dwte alike */
    ts_bf16 *o0 = nan_bf16(N * C);
    K16->encoder_forward(o0, tok, wte, NULL, B, T, C);
    K32->encoder_forward(ref, tok, wte, NULL, B, T, C);
    check_bf16("encoder_forward (no wpe)", o0, ref, N * C, ROUND_REL, ELEM_FLOOR);
    int rounded = 1;
    for (size_t i = 0; i < N * C; i++) rounded &= o0[i] == ts_f32_to_bf16(ref[i]);
    CHECKF(rounded, "encoder_forward (no wpe) is not wte rounded once");
    K16->encoder_backward(dw, NULL, dout, tok, B, T, C);
    K32->encoder_backward(dw32, NULL, dout32, tok, B, T, C);
    check_close("encoder_backward dwte (no dwpe)", dw, dw32, (size_t)V * C, F32_REL, 0);
    free(o0);

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

static void test_rmsnorm(const shape *s)
{
    int N = s->B * s->T, C = s->NH * s->HS;
    size_t n = (size_t)N * C;
    const float eps = 1e-6f;
    float *x32, *w = ts_test_rand_floats((size_t)C, 1.0f);
    for (int c = 0; c < C; c++) w[c] += 1.0f;
    ts_bf16 *x = rand_bf16(n, 2.0f, &x32);
    ts_bf16 *out = nan_bf16(n);
    float *rstd = nan_f32((size_t)N), *ref = ts_alloc_floats(n);
    float *rstd32 = ts_alloc_floats((size_t)N);
    K16->rmsnorm_forward(out, rstd, x, w, N, C, eps);
    K32->rmsnorm_forward(ref, rstd32, x32, w, N, C, eps);
    check_bf16("rmsnorm_forward", out, ref, n, ROUND_REL, ELEM_FLOOR);
    check_close("rmsnorm_forward rstd", rstd, rstd32, (size_t)N, F32_REL, 0);

    /* backward: dinp ACCUMULATES (starts random, rounded once after the add) */
    float *dout32, *dinp32;
    ts_bf16 *dout = rand_bf16(n, 1.0f, &dout32), *dinp = rand_bf16(n, 1.0f, &dinp32);
    float *dw = ts_test_rand_floats((size_t)C, 1.0f), *dw32 = copy_f32(dw, (size_t)C);
    ts_bf16 *dinp1 = copy_bf16(dinp, n);
    float *dw1 = copy_f32(dw, (size_t)C);
    K16->rmsnorm_backward(dinp, dw, dout, x, w, rstd, N, C);
    K32->rmsnorm_backward(dinp32, dw32, dout32, x32, w, rstd, N, C);
    check_bf16("rmsnorm_backward dinp (+=)", dinp, dinp32, n, ROUND_REL, ELEM_FLOOR);
    check_close("rmsnorm_backward dweight (+=)", dw, dw32, (size_t)C, F32_REL, 1e-6);

    /* the same bits at one thread as at two, from the same start */
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    K16->rmsnorm_backward(dinp1, dw1, dout, x, w, rstd, N, C);
    omp_set_num_threads(threads);
    CHECK(memcmp(dinp1, dinp, n * sizeof *dinp1) == 0 && ts_test_same_bits(dw, dw1, C));

    /* fused with the residual add: the two bf16 calls' bits (the norm reads the rounded
     * sum), res_out separate and in place over a */
    float *b32;
    ts_bf16 *b = rand_bf16(n, 1.0f, &b32), *sum = nan_bf16(n), *nrm = nan_bf16(n);
    ts_bf16 *res = nan_bf16(n), *nrm2 = nan_bf16(n), *a2 = copy_bf16(x, n);
    float *rstd2 = nan_f32((size_t)N), *rstd3 = nan_f32((size_t)N);
    K16->residual_forward(sum, x, b, n);
    K16->rmsnorm_forward(nrm, rstd, sum, w, N, C, eps);
    K16->residual_rmsnorm_forward(res, nrm2, rstd2, x, b, w, N, C, eps);
    CHECK(memcmp(res, sum, n * sizeof *res) == 0 && memcmp(nrm2, nrm, n * sizeof *nrm) == 0 &&
          ts_test_same_bits(rstd2, rstd, N));
    K16->residual_rmsnorm_forward(a2, nrm2, rstd3, a2, b, w, N, C, eps);
    CHECK(memcmp(a2, sum, n * sizeof *a2) == 0 && memcmp(nrm2, nrm, n * sizeof *nrm) == 0 &&
          ts_test_same_bits(rstd3, rstd, N));
    free(x), free(x32), free(w), free(out), free(rstd), free(ref), free(rstd32), free(dout);
    free(dout32), free(dinp), free(dinp32), free(dw), free(dw32), free(dinp1), free(dw1), free(b);
    free(b32), free(sum), free(nrm), free(res), free(nrm2), free(a2), free(rstd2), free(rstd3);
}

static void test_rope(const shape *s)
{
    /* an even head size (rotate_half pairs channel i with i + HS/2), NKV < NH */
    int B = s->B, T = s->T, NH = s->NH, HS = s->HS & ~1, NKV = NH % 3 == 0 ? NH / 3 : 1;
    int half = HS / 2;
    size_t row = (size_t)(NH + 2 * NKV) * HS, n = (size_t)B * T * row;
    float *cs = ts_alloc_floats((size_t)T * half), *sn = ts_alloc_floats((size_t)T * half);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            double ang = t * pow(10000.0, -2.0 * i / HS);
            cs[t * half + i] = (float)cos(ang), sn[t * half + i] = (float)sin(ang);
        }
    float *x32;
    ts_bf16 *x = rand_bf16(n, 2.0f, &x32), *x0 = copy_bf16(x, n);
    K16->rope_forward(x, cs, sn, B, T, ts_att_heads_gqa(NH, NKV, HS), HS, false);
    K32->rope_forward(x32, cs, sn, B, T, ts_att_heads_gqa(NH, NKV, HS), HS, false);
    check_bf16("rope_forward", x, x32, n, ROUND_REL, ELEM_FLOOR);
    int v_same = 1; /* the value heads are not touched */
    for (size_t r = 0; r < (size_t)B * T; r++)
        v_same &= memcmp(x + r * row + (size_t)(NH + NKV) * HS,
                         x0 + r * row + (size_t)(NH + NKV) * HS, (size_t)NKV * HS * sizeof *x) == 0;
    CHECKF(v_same, "rope_forward changed a value head");
    float *d32;
    ts_bf16 *d = rand_bf16(n, 1.0f, &d32);
    K16->rope_backward(d, cs, sn, B, T, ts_att_heads_gqa(NH, NKV, HS), HS, false);
    K32->rope_backward(d32, cs, sn, B, T, ts_att_heads_gqa(NH, NKV, HS), HS, false);
    check_bf16("rope_backward", d, d32, n, ROUND_REL, ELEM_FLOOR);
    free(cs), free(sn), free(x32), free(x), free(x0), free(d32), free(d);
}

/* RoPE on the last RD < HS channels of each q and k head, halves and adjacent pairs,
 * with v heads of HSV != HS, against the fp32 kernel (the channels outside the rotated
 * part are not touched: the same bits). */
static void test_rope_heads(int B, int T, ts_att_heads h, int RD, bool interleaved)
{
    const size_t row = ts_att_qkv_width(h), n = (size_t)B * T * row;
    float *cs = ts_alloc_floats((size_t)T * RD / 2), *sn = ts_alloc_floats((size_t)T * RD / 2);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < RD / 2; i++) {
            double ang = t * pow(10000.0, -2.0 * i / RD);
            cs[t * RD / 2 + i] = (float)cos(ang), sn[t * RD / 2 + i] = (float)sin(ang);
        }
    float *x32;
    ts_bf16 *x = rand_bf16(n, 2.0f, &x32), *x0 = copy_bf16(x, n);
    char what[80];
    snprintf(what, sizeof what, "rope HS %d HSV %d RD %d %s", h.HS, h.HSV, RD,
             interleaved ? "interleaved" : "halves");
    K16->rope_forward(x, cs, sn, B, T, h, RD, interleaved);
    K32->rope_forward(x32, cs, sn, B, T, h, RD, interleaved);
    check_bf16(what, x, x32, n, ROUND_REL, ELEM_FLOOR);
    bool same = true;
    for (size_t r = 0; r < (size_t)B * T; r++) {
        for (int hd = 0; hd < h.NH + h.NKV; hd++)
            same &= memcmp(x + r * row + (size_t)hd * h.HS, x0 + r * row + (size_t)hd * h.HS,
                           (size_t)(h.HS - RD) * sizeof *x) == 0;
        const size_t v0 = (size_t)(h.NH + h.NKV) * h.HS;
        same &= memcmp(x + r * row + v0, x0 + r * row + v0, (row - v0) * sizeof *x) == 0;
    }
    CHECKF(same, "%s: a channel outside the rotated part changed", what);
    float *d32;
    ts_bf16 *d = rand_bf16(n, 1.0f, &d32);
    K16->rope_backward(d, cs, sn, B, T, h, RD, interleaved);
    K32->rope_backward(d32, cs, sn, B, T, h, RD, interleaved);
    check_bf16(what, d, d32, n, ROUND_REL, ELEM_FLOOR);
    free(cs), free(sn), free(x32), free(x), free(x0), free(d32), free(d);
}

/* An MLA-shaped head set: q/k heads of HS, v heads of HSV, a scale that is not
 * 1/sqrt(HS). */
static ts_att_heads heads(int NH, int NKV, int HS, int HSV, float scale)
{
    ts_att_heads h = ts_att_heads_gqa(NH, NKV, HS);
    h.HSV = HSV;
    h.scale = scale;
    return h;
}

static void test_swiglu(const shape *s)
{
    int N = s->B * s->T, F = s->OC;
    size_t n = (size_t)N * F;
    float *x32, *d32;
    ts_bf16 *x = rand_bf16(2 * n, 4.0f, &x32), *d = rand_bf16(n, 1.0f, &d32);
    ts_bf16 *out = nan_bf16(n), *dx = nan_bf16(2 * n);
    float *ref = ts_alloc_floats(n), *dref = ts_alloc_floats(2 * n);
    K16->swiglu_forward(out, x, N, F);
    K32->swiglu_forward(ref, x32, N, F);
    check_bf16("swiglu_forward", out, ref, n, ROUND_REL, ELEM_FLOOR);
    K16->swiglu_backward(dx, x, d, N, F);
    K32->swiglu_backward(dref, x32, d32, N, F);
    check_bf16("swiglu_backward", dx, dref, 2 * n, ROUND_REL, ELEM_FLOOR);
    free(x32), free(d32), free(x), free(d), free(out), free(dx), free(ref), free(dref);
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

/* NKV key/value heads: NH (multi-head) or fewer (grouped-query). */
static void test_attention(const shape *s, int NKV)
{
    int B = s->B, T = s->T, NH = s->NH, HS = s->HS, C = NH * HS;
    size_t nqkv = (size_t)B * T * (NH + 2 * NKV) * HS, nout = (size_t)B * T * C;
    size_t natt = (size_t)B * NH * T * T;
    printf("  attention NKV = %d\n", NKV);
    CHECK(K16->attention_saved_bytes(B, T, ts_att_heads_gqa(NH, NH, HS)) == natt * 2);
    float *qkv32, *dout32;
    ts_bf16 *qkv = rand_bf16(nqkv, 2.0f, &qkv32), *dout = rand_bf16(nout, 1.0f, &dout32);
    ts_bf16 *out = nan_bf16(nout), *att = nan_bf16(natt);
    float *out32 = ts_alloc_floats(nout);
    float *att32 = ts_alloc_floats(K32->attention_saved_bytes(B, T, ts_att_heads_gqa(NH, NH, HS)) /
                                   sizeof(float));
    K16->attention_forward(out, att, qkv, B, T, ts_att_heads_gqa(NH, NKV, HS));
    K32->attention_forward(out32, att32, qkv32, B, T, ts_att_heads_gqa(NH, NKV, HS));
    check_bf16("attention_forward att", att, att32, natt, ROUND_REL, ELEM_FLOOR);
    check_bf16("attention_forward out", out, out32, nout, ROUND_REL, 1.0 / 256);

    /* backward: the fp32 kernel reads the probabilities the bf16 forward saved */
    size_t nscratch =
        K16->attention_scratch_bytes(B, T, ts_att_heads_gqa(NH, NH, HS)) / sizeof(ts_bf16);
    ts_bf16 *scratch = nan_bf16(nscratch), *dqkv = nan_bf16(nqkv);
    float *p32 = widen(att, natt), *dqkv32 = ts_alloc_floats(nqkv);
    float *scratch32 = ts_alloc_floats(
        K32->attention_scratch_bytes(B, T, ts_att_heads_gqa(NH, NH, HS)) / sizeof(float));
    K16->attention_backward(dqkv, scratch, dout, qkv, att, B, T, ts_att_heads_gqa(NH, NKV, HS));
    K32->attention_backward(dqkv32, scratch32, dout32, qkv32, p32, B, T,
                            ts_att_heads_gqa(NH, NKV, HS));
    check_bf16("attention_backward dqkv", dqkv, dqkv32, nqkv, ROUND_REL, 1.0 / 128);

    /* the same bits at one thread (each pair is one thread's work) */
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    ts_bf16 *out1 = nan_bf16(nout), *att1 = nan_bf16(natt), *dqkv1 = nan_bf16(nqkv);
    K16->attention_forward(out1, att1, qkv, B, T, ts_att_heads_gqa(NH, NKV, HS));
    K16->attention_backward(dqkv1, scratch, dout, qkv, att1, B, T, ts_att_heads_gqa(NH, NKV, HS));
    omp_set_num_threads(threads);
    CHECK(memcmp(out1, out, nout * 2) == 0 && memcmp(att1, att, natt * 2) == 0 &&
          memcmp(dqkv1, dqkv, nqkv * 2) == 0);
    free(qkv), free(qkv32), free(dout), free(dout32), free(out), free(att), free(out32);
    free(att32), free(scratch), free(dqkv), free(p32), free(dqkv32), free(scratch32), free(out1);
    free(att1), free(dqkv1);
}

/* ---- context parallelism's prefix attention ----------------------------------- */

/* Rows [t0, t0 + n) of each batch of x [B, T, width], as [B, n, width]. */
static ts_bf16 *batch_rows(const ts_bf16 *x, int B, int T, int width, int t0, int n)
{
    ts_bf16 *y = ts_malloc((size_t)B * n * width * sizeof *y);
    for (int b = 0; b < B; b++)
        memcpy(y + (size_t)b * n * width, x + ((size_t)b * T + t0) * width,
               (size_t)n * width * sizeof *y);
    return y;
}

/* y's rows back into rows [t0, t0 + n) of each batch of x [B, T, width]. */
static void put_batch_rows(ts_bf16 *x, const ts_bf16 *y, int B, int T, int width, int t0, int n)
{
    for (int b = 0; b < B; b++)
        memcpy(x + ((size_t)b * T + t0) * width, y + (size_t)b * n * width,
               (size_t)n * width * sizeof *y);
}

/* Columns [c0, c0 + w) of rows [0, Tk) of each batch of x [B, T, width], as
 * [B, Tk, w]: qkv's k and v columns make kv, dqkv's q or k/v columns the gradients. */
static ts_bf16 *batch_columns(const ts_bf16 *x, int B, int T, int width, int Tk, int c0, int w)
{
    ts_bf16 *y = ts_malloc((size_t)B * Tk * w * sizeof *y);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < Tk; t++)
            memcpy(y + ((size_t)b * Tk + t) * w, x + ((size_t)b * T + t) * width + c0,
                   (size_t)w * sizeof *y);
    return y;
}

/* The general heads (kernels.h ts_att_heads: q/k heads of HS, v and output heads of
 * HSV, a scale not 1/sqrt(HS)) against the fp32 kernels (which test_kernels.c checks
 * against a double-precision reference), attention's tolerances: attention_forward and
 * _backward, and the prefix kernels on the last Tq = T - off queries against T keys and
 * values, dkv adding onto random values (the fp32 run onto the same values widened). */
static void test_attention_heads(const char *label, int B, int T, ts_att_heads h, int off)
{
    const size_t C3 = ts_att_qkv_width(h), KVW = ts_att_kv_width(h), OW = ts_att_out_width(h);
    const size_t QW = (size_t)h.NH * h.HS, N = (size_t)B * T, natt = (size_t)B * h.NH * T * T;
    char what[96];
    printf("  attention %s\n", label);
    CHECK(K16->attention_saved_bytes(B, T, h) == natt * 2);
    float *qkv32, *dout32;
    ts_bf16 *qkv = rand_bf16(N * C3, 2.0f, &qkv32), *dout = rand_bf16(N * OW, 1.0f, &dout32);
    ts_bf16 *out = nan_bf16(N * OW), *att = nan_bf16(natt);
    float *out32 = ts_alloc_floats(N * OW), *att32 = ts_alloc_floats(natt);
    K16->attention_forward(out, att, qkv, B, T, h);
    K32->attention_forward(out32, att32, qkv32, B, T, h);
    snprintf(what, sizeof what, "%s att", label);
    check_bf16(what, att, att32, natt, ROUND_REL, ELEM_FLOOR);
    snprintf(what, sizeof what, "%s out", label);
    check_bf16(what, out, out32, N * OW, ROUND_REL, 1.0 / 256);
    ts_bf16 *scratch = nan_bf16(K16->attention_scratch_bytes(B, T, h) / 2);
    ts_bf16 *dqkv = nan_bf16(N * C3);
    float *p32 = widen(att, natt), *dqkv32 = ts_alloc_floats(N * C3);
    float *scratch32 = ts_alloc_floats(natt);
    K16->attention_backward(dqkv, scratch, dout, qkv, att, B, T, h);
    K32->attention_backward(dqkv32, scratch32, dout32, qkv32, p32, B, T, h);
    snprintf(what, sizeof what, "%s dqkv", label);
    check_bf16(what, dqkv, dqkv32, N * C3, ROUND_REL, 1.0 / 128);

    /* the prefix form: queries = the last Tq rows of each sequence, k|v columns as kv */
    const int Tq = T - off;
    const size_t Nq = (size_t)B * Tq, pat = (size_t)B * h.NH * Tq * T;
    ts_bf16 *pq = batch_rows(qkv, B, T, (int)C3, off, Tq);
    ts_bf16 *kv = batch_columns(qkv, B, T, (int)C3, T, (int)QW, (int)KVW);
    ts_bf16 *pdout = batch_rows(dout, B, T, (int)OW, off, Tq);
    float *pq32 = widen(pq, Nq * C3), *kv32 = widen(kv, N * KVW), *pdout32 = widen(pdout, Nq * OW);
    ts_bf16 *pout = nan_bf16(Nq * OW), *patt = nan_bf16(pat);
    float *pout32 = ts_alloc_floats(Nq * OW), *patt32 = ts_alloc_floats(pat);
    CHECK(K16->attention_prefix_saved_bytes(B, Tq, T, h) == pat * 2);
    K16->attention_prefix_forward(pout, patt, pq, kv, B, Tq, T, h);
    K32->attention_prefix_forward(pout32, patt32, pq32, kv32, B, Tq, T, h);
    snprintf(what, sizeof what, "%s prefix att", label);
    check_bf16(what, patt, patt32, pat, ROUND_REL, ELEM_FLOOR);
    snprintf(what, sizeof what, "%s prefix out", label);
    check_bf16(what, pout, pout32, Nq * OW, ROUND_REL, 1.0 / 256);
    float *dkv32;
    ts_bf16 *dkv = rand_bf16(N * KVW, 1.0f, &dkv32), *pdqkv = nan_bf16(Nq * C3);
    float *pdqkv32 = ts_alloc_floats(Nq * C3), *pp32 = widen(patt, pat);
    ts_bf16 *pscr = nan_bf16(K16->attention_prefix_scratch_bytes(B, Tq, T, h) / 2);
    float *pscr32 = ts_alloc_floats(K32->attention_prefix_scratch_bytes(B, Tq, T, h) / 4);
    K16->attention_prefix_backward(pdqkv, dkv, pscr, pdout, pq, kv, patt, B, Tq, T, h);
    K32->attention_prefix_backward(pdqkv32, dkv32, pscr32, pdout32, pq32, kv32, pp32, B, Tq, T, h);
    ts_bf16 *dq = batch_columns(pdqkv, B, Tq, (int)C3, Tq, 0, (int)QW);
    float *dq32 = ts_alloc_floats(Nq * QW);
    bool untouched = true;
    for (size_t r = 0; r < Nq; r++) {
        memcpy(dq32 + r * QW, pdqkv32 + r * C3, QW * sizeof(float));
        for (size_t c = QW; c < C3; c++) untouched &= pdqkv[r * C3 + c] == TS_BF16_QNAN;
    }
    snprintf(what, sizeof what, "%s prefix dq", label);
    check_bf16(what, dq, dq32, Nq * QW, ROUND_REL, 1.0 / 128);
    snprintf(what, sizeof what, "%s prefix dkv (+=)", label);
    check_bf16(what, dkv, dkv32, N * KVW, ROUND_REL, 1.0 / 128);
    CHECKF(untouched, "%s: the bf16 prefix backward wrote dqkv's k/v columns", label);
    free(qkv), free(qkv32), free(dout), free(dout32), free(out), free(att), free(out32);
    free(att32), free(scratch), free(dqkv), free(p32), free(dqkv32), free(scratch32), free(pq);
    free(kv), free(pdout), free(pq32), free(kv32), free(pdout32), free(pout), free(patt);
    free(pout32), free(patt32), free(dkv), free(dkv32), free(pdqkv), free(pdqkv32), free(pp32);
    free(pscr), free(pscr32), free(dq), free(dq32);
}

/* Whether every masked probability of att [B, NH, Tq, Tk] is exactly +0 (query t sees
 * keys 0..t + Tk - Tq). */
static bool prefix_mask_is_zero(const ts_bf16 *att, int B, int NH, int Tq, int Tk)
{
    for (size_t r = 0; r < (size_t)B * NH * Tq; r++)
        for (int j = (int)(r % Tq) + Tk - Tq + 1; j < Tk; j++)
            if (att[r * Tk + j] != 0) return false;
    return true;
}

/* Tq == Tk: the bf16 prefix kernels are the bf16 attention_forward/backward on the
 * same q, k, v (judged with test_attention's tolerances; one code path, so in fact the
 * same bits). */
static void test_attention_prefix_square(const shape *s, int NKV)
{
    const int B = s->B, T = s->T, NH = s->NH, HS = s->HS, C = NH * HS, C2 = 2 * NKV * HS;
    const int C3 = C + C2;
    const size_t N = (size_t)B * T, natt = (size_t)B * NH * T * T;
    printf("  attention prefix Tq = Tk, NKV = %d\n", NKV);
    CHECK(K16->attention_prefix_saved_bytes(B, T, T, ts_att_heads_gqa(NH, NH, HS)) == natt * 2);
    CHECK(K16->attention_prefix_scratch_bytes(B, T, T, ts_att_heads_gqa(NH, NH, HS)) >= natt * 2);
    float *qkv32, *dout32;
    ts_bf16 *qkv = rand_bf16(N * C3, 2.0f, &qkv32), *dout = rand_bf16(N * C, 1.0f, &dout32);
    ts_bf16 *kv = batch_columns(qkv, B, T, C3, T, C, C2);
    ts_bf16 *out = nan_bf16(N * C), *att = nan_bf16(natt), *pout = nan_bf16(N * C);
    ts_bf16 *patt = nan_bf16(natt);
    K16->attention_forward(out, att, qkv, B, T, ts_att_heads_gqa(NH, NKV, HS));
    K16->attention_prefix_forward(pout, patt, qkv, kv, B, T, T, ts_att_heads_gqa(NH, NKV, HS));
    float *out_w = widen(out, N * C), *att_w = widen(att, natt);
    check_bf16("prefix Tq=Tk out", pout, out_w, N * C, ROUND_REL, 1.0 / 256);
    check_bf16("prefix Tq=Tk att", patt, att_w, natt, ROUND_REL, ELEM_FLOOR);

    ts_bf16 *scratch =
        nan_bf16(K16->attention_prefix_scratch_bytes(B, T, T, ts_att_heads_gqa(NH, NH, HS)) / 2);
    ts_bf16 *dqkv = nan_bf16(N * C3), *pdqkv = nan_bf16(N * C3);
    ts_bf16 *dkv = ts_malloc(N * C2 * sizeof *dkv);
    for (size_t i = 0; i < N * C2; i++) dkv[i] = 0; /* +0: what dkv adds onto */
    K16->attention_backward(dqkv, scratch, dout, qkv, att, B, T, ts_att_heads_gqa(NH, NKV, HS));
    K16->attention_prefix_backward(pdqkv, dkv, scratch, dout, qkv, kv, patt, B, T, T,
                                   ts_att_heads_gqa(NH, NKV, HS));
    ts_bf16 *dq = batch_columns(dqkv, B, T, C3, T, 0, C);
    ts_bf16 *pdq = batch_columns(pdqkv, B, T, C3, T, 0, C);
    ts_bf16 *dkv_want = batch_columns(dqkv, B, T, C3, T, C, C2);
    float *dq_w = widen(dq, N * C), *dkv_w = widen(dkv_want, N * C2);
    check_bf16("prefix Tq=Tk dq", pdq, dq_w, N * C, ROUND_REL, 1.0 / 128);
    check_bf16("prefix Tq=Tk dk, dv", dkv, dkv_w, N * C2, ROUND_REL, 1.0 / 128);
    /* dqkv's k and v columns are untouched (still NaN) */
    bool untouched = true;
    for (size_t n = 0; n < N; n++)
        for (int c = C; c < C3; c++) untouched &= pdqkv[n * C3 + c] == TS_BF16_QNAN;
    CHECKF(untouched, "bf16 prefix backward wrote dqkv's k/v columns");
    free(qkv), free(qkv32), free(dout), free(dout32), free(kv), free(out), free(att);
    free(pout), free(patt), free(out_w), free(att_w), free(scratch), free(dqkv), free(pdqkv);
    free(dkv), free(dq), free(pdq), free(dkv_want), free(dq_w), free(dkv_w);
}

/* Context parallelism's split in bf16, as test_kernels.c's fp32 test: the bf16 full
 * causal attention over T = 2*cp*c tokens against its chunks g (queries [g*c, (g+1)*c)
 * against keys/values [0, (g+1)*c)): out and dq rows, and dk, dv summed over the chunks
 * into one bf16 buffer (each call rounds its sum once), within the bf16 attention
 * tolerances; masked probabilities exactly 0. */
static void test_attention_prefix_chunks(int cp, int c, int B, int NH, int NKV, int HS)
{
    const int T = 2 * cp * c, C = NH * HS, C2 = 2 * NKV * HS, C3 = C + C2;
    const size_t N = (size_t)B * T, natt = (size_t)B * NH * T * T;
    printf("  attention prefix chunks cp = %d, c = %d, NKV = %d\n", cp, c, NKV);
    float *qkv32, *dout32;
    ts_bf16 *qkv = rand_bf16(N * C3, 2.0f, &qkv32), *dout = rand_bf16(N * C, 1.0f, &dout32);
    ts_bf16 *out = nan_bf16(N * C), *att = nan_bf16(natt), *dqkv = nan_bf16(N * C3);
    ts_bf16 *scratch =
        nan_bf16(K16->attention_scratch_bytes(B, T, ts_att_heads_gqa(NH, NH, HS)) / 2);
    K16->attention_forward(out, att, qkv, B, T, ts_att_heads_gqa(NH, NKV, HS));
    K16->attention_backward(dqkv, scratch, dout, qkv, att, B, T, ts_att_heads_gqa(NH, NKV, HS));

    ts_bf16 *got_out = nan_bf16(N * C), *got_dqkv = nan_bf16(N * C3);
    ts_bf16 *dkv_total = ts_malloc(N * C2 * sizeof *dkv_total);
    for (size_t i = 0; i < N * C2; i++) dkv_total[i] = 0;
    bool mask_ok = true;
    for (int g = 0; g < 2 * cp; g++) {
        const int Tq = c, Tk = (g + 1) * c;
        const size_t natt_g = (size_t)B * NH * Tq * Tk;
        CHECK(K16->attention_prefix_saved_bytes(B, Tq, Tk, ts_att_heads_gqa(NH, NH, HS)) ==
              natt_g * 2);
        ts_bf16 *q = batch_rows(qkv, B, T, C3, g * c, c);
        ts_bf16 *kv = batch_columns(qkv, B, T, C3, Tk, C, C2);
        ts_bf16 *o = nan_bf16((size_t)B * c * C), *a = nan_bf16(natt_g);
        K16->attention_prefix_forward(o, a, q, kv, B, Tq, Tk, ts_att_heads_gqa(NH, NKV, HS));
        mask_ok &= prefix_mask_is_zero(a, B, NH, Tq, Tk);
        put_batch_rows(got_out, o, B, T, C, g * c, c);
        ts_bf16 *dq = nan_bf16((size_t)B * c * C3);
        ts_bf16 *sc = nan_bf16(
            K16->attention_prefix_scratch_bytes(B, Tq, Tk, ts_att_heads_gqa(NH, NH, HS)) / 2);
        ts_bf16 *d = batch_rows(dout, B, T, C, g * c, c);
        ts_bf16 *dkv = batch_rows(dkv_total, B, T, C2, 0, Tk);
        K16->attention_prefix_backward(dq, dkv, sc, d, q, kv, a, B, Tq, Tk,
                                       ts_att_heads_gqa(NH, NKV, HS));
        put_batch_rows(dkv_total, dkv, B, T, C2, 0, Tk);
        put_batch_rows(got_dqkv, dq, B, T, C3, g * c, c);
        free(q), free(kv), free(o), free(a), free(dq), free(sc), free(d), free(dkv);
    }
    CHECKF(mask_ok, "bf16 prefix: masked probabilities are not exactly 0");
    float *out_w = widen(out, N * C);
    ts_bf16 *dq_want = batch_columns(dqkv, B, T, C3, T, 0, C);
    ts_bf16 *dq_got = batch_columns(got_dqkv, B, T, C3, T, 0, C);
    ts_bf16 *dkv_want = batch_columns(dqkv, B, T, C3, T, C, C2);
    float *dq_w = widen(dq_want, N * C), *dkv_w = widen(dkv_want, N * C2);
    check_bf16("prefix chunks out", got_out, out_w, N * C, ROUND_REL, 1.0 / 256);
    check_bf16("prefix chunks dq", dq_got, dq_w, N * C, ROUND_REL, 1.0 / 128);
    check_bf16("prefix chunks dk, dv (summed)", dkv_total, dkv_w, N * C2, ROUND_REL, 1.0 / 128);
    free(qkv), free(qkv32), free(dout), free(dout32), free(out), free(att), free(dqkv);
    free(scratch), free(got_out), free(got_dqkv), free(dkv_total), free(out_w), free(dq_want);
    free(dq_got), free(dkv_want), free(dq_w), free(dkv_w);
}

/* One chunk on a bf16 table through its own memory: out, att, dqkv and dkv (+=) back on
 * the host, in one buffer each of bf16. */
typedef struct {
    ts_bf16 *out, *att, *dqkv, *dkv;
} prefix_run;

static void *to_table(const ts_kernels *k, const void *h, size_t bytes)
{
    void *d = k->dev_alloc(bytes);
    k->memcpy_h2d(d, h, bytes);
    return d;
}

static ts_bf16 *from_table(const ts_kernels *k, const void *d, size_t n)
{
    ts_bf16 *h = ts_malloc(n * sizeof *h);
    k->memcpy_d2h(h, d, n * sizeof *h);
    return h;
}

static prefix_run prefix_on(const ts_kernels *k, const ts_bf16 *q, const ts_bf16 *kv,
                            const ts_bf16 *dout, const ts_bf16 *dkv0, int B, int Tq, int Tk,
                            int NH, int NKV, int HS)
{
    const int C = NH * HS, C2 = 2 * NKV * HS, C3 = C + C2;
    const size_t nq = (size_t)B * Tq, natt = (size_t)B * NH * Tq * Tk, nkv = (size_t)B * Tk * C2;
    ts_bf16 *nan = nan_bf16(natt > nq * C3 ? natt : nq * C3);
    void *dq = to_table(k, q, nq * C3 * 2), *dkvv = to_table(k, kv, nkv * 2);
    void *dd = to_table(k, dout, nq * C * 2), *dacc = to_table(k, dkv0, nkv * 2);
    void *o = to_table(k, nan, nq * C * 2), *a = to_table(k, nan, natt * 2);
    void *g = to_table(k, nan, nq * C3 * 2);
    void *s =
        k->dev_alloc(k->attention_prefix_scratch_bytes(B, Tq, Tk, ts_att_heads_gqa(NH, NH, HS)));
    k->attention_prefix_forward(o, a, dq, dkvv, B, Tq, Tk, ts_att_heads_gqa(NH, NKV, HS));
    k->attention_prefix_backward(g, dacc, s, dd, dq, dkvv, a, B, Tq, Tk,
                                 ts_att_heads_gqa(NH, NKV, HS));
    prefix_run r = {from_table(k, o, nq * C), from_table(k, a, natt), from_table(k, g, nq * C3),
                    from_table(k, dacc, nkv)};
    k->dev_free(dq), k->dev_free(dkvv), k->dev_free(dd), k->dev_free(dacc), k->dev_free(o);
    k->dev_free(a), k->dev_free(g), k->dev_free(s);
    free(nan);
    return r;
}

/* The same bits on cpu-strict-bf16 (its wrappers around these kernels) and at one
 * thread (one (batch, head) pair per OpenMP iteration); dkv starts nonzero (+=). */
static void test_attention_prefix_strict_and_threads(void)
{
    const int B = 2, Tq = 40, Tk = 150, NH = 4, NKV = 2, HS = 16;
    const int C = NH * HS, C2 = 2 * NKV * HS, C3 = C + C2;
    const size_t nq = (size_t)B * Tq, natt = (size_t)B * NH * Tq * Tk, nkv = (size_t)B * Tk * C2;
    float *w1, *w2, *w3, *w4;
    ts_bf16 *q = rand_bf16(nq * C3, 2.0f, &w1), *kv = rand_bf16(nkv, 2.0f, &w2);
    ts_bf16 *dout = rand_bf16(nq * C, 1.0f, &w3), *dkv0 = rand_bf16(nkv, 1.0f, &w4);
    prefix_run all = prefix_on(K16, q, kv, dout, dkv0, B, Tq, Tk, NH, NKV, HS);
    prefix_run strict = prefix_on(&ts_kernels_cpu_strict_bf16, q, kv, dout, dkv0, B, Tq, Tk, NH,
                                  NKV, HS);
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    prefix_run one = prefix_on(K16, q, kv, dout, dkv0, B, Tq, Tk, NH, NKV, HS);
    omp_set_num_threads(threads);
    const prefix_run *runs[] = {&strict, &one};
    const char *names[] = {"cpu-strict-bf16", "1 thread"};
    for (int r = 0; r < 2; r++) {
        bool same = !memcmp(runs[r]->out, all.out, nq * C * 2) &&
                    !memcmp(runs[r]->att, all.att, natt * 2) &&
                    !memcmp(runs[r]->dkv, all.dkv, nkv * 2);
        for (size_t n = 0; n < nq; n++)
            same &= !memcmp(runs[r]->dqkv + n * C3, all.dqkv + n * C3, (size_t)C * 2);
        printf("  attention prefix Tq=%d Tk=%d on %s: %s as cpu-bf16 at %d threads\n", Tq, Tk,
               names[r], same ? "the same bits" : "DIFFERENT bits", threads);
        CHECKF(same, "bf16 attention prefix on %s differs", names[r]);
    }
    const prefix_run *mine[] = {&all, &strict, &one};
    for (int r = 0; r < 3; r++)
        free(mine[r]->out), free(mine[r]->att), free(mine[r]->dqkv), free(mine[r]->dkv);
    free(q), free(kv), free(dout), free(dkv0), free(w1), free(w2), free(w3), free(w4);
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
    /* The kernels on oneDNN GEMMs need the BF16 instructions; the others are plain C. */
    const bool gemms = ts_cpu_bf16_supported();
    if (gemms)
        printf("cpu-bf16 kernels, oneDNN ISA %s, %d threads\n", ts_dnnl_isa(),
               omp_get_max_threads());
    else
        printf("this CPU has neither AVX512_BF16 nor AMX-BF16 (cpu-bf16's GEMMs need one): "
               "matmul and attention skipped, the plain-C kernels run (%d threads)\n",
               omp_get_max_threads());
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
        test_rmsnorm(s);
        test_residual_gelu(s);
        test_rope(s);
        test_swiglu(s);
        test_crossentropy(s);
        if (!gemms) continue;
        test_matmul(s);
        test_attention(s, s->NH);
        test_attention(s, s->NH % 3 == 0 ? s->NH / 3 : 1); /* grouped-query */
        test_attention_prefix_square(s, s->NH % 3 == 0 ? s->NH / 3 : 1);
    }
    printf("rope on the last RD channels, q/k heads wider than v\n");
    for (int il = 0; il < 2; il++) {
        test_rope_heads(2, 9, heads(4, 4, 24, 16, 0.3f), 8, il);
        test_rope_heads(1, 7, heads(4, 2, 10, 6, 0.3f), 6, il);
    }
    if (gemms) {
        printf("the general heads: q/k %s v, grouped, scales not 1/sqrt(HS)\n", "!=");
        test_attention_heads("HS=24 HSV=16 NH=4 NKV=4", 2, 67, heads(4, 4, 24, 16, 0.3f), 9);
        test_attention_heads("HS=24 HSV=16 GQA NH=4 NKV=2", 2, 67, heads(4, 2, 24, 16, 0.35f), 5);
        test_attention_heads("HS=8 HSV=12 MQA NH=3 NKV=1", 1, 21, heads(3, 1, 8, 12, 0.9f), 7);
    }
    if (gemms) {
        printf("context parallelism's prefix attention: B 2, 4 heads of 16\n");
        for (int nkv = 4; nkv >= 1; nkv /= 2) { /* multi-head, grouped, multi-query */
            test_attention_prefix_chunks(2, 24, 2, 4, nkv, 16); /* T = 96 */
            test_attention_prefix_chunks(4, 40, 2, 4, nkv, 16); /* T = 320 */
        }
        test_attention_prefix_strict_and_threads();
    }
    if (!gemms && ts_test_failed == 0) {
        ts_test_report();
        printf("skipped: matmul and attention did not run\n");
        return 77;
    }
    return ts_test_report();
}
