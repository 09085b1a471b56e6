/* CPU kernels: every backward against central finite differences of a scalar
 * objective L = sum(out * R) (R fixed and random, L accumulated in double), forwards
 * against naive references, the accumulate/overwrite semantics, AdamW against a
 * double-precision reference, the fused kernels against the unfused calls bit for bit
 * (CPU and strict tables), and bitwise determinism at 1 and 2 threads. The llama
 * kernels likewise: RMSNorm (and its fused residual form), RoPE (also against its
 * formula and as its own transpose), SwiGLU, grouped-query attention (also against
 * multi-head attention on the key/value heads repeated), the encoder without wpe.
 * Context parallelism's prefix attention: against attention_forward/backward at
 * Tq == Tk, and chunk by chunk against the full sequence's attention (out, dq, dk/dv
 * summed over the chunks, masked probabilities exactly 0), on the strict table and at
 * 1 and 2 threads with the same bits. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/kernels.h"
#include "test_att_reference.h"
#include "test_blas_kernel.h"
#include "test_device_util.h"

static const ts_kernels *K = &ts_kernels_cpu;

/* ---- helpers ------------------------------------------------------------------ */

static float *copy_floats(const float *x, size_t n)
{
    float *y = ts_alloc_floats(n);
    memcpy(y, x, n * sizeof(float));
    return y;
}

static double dot_d(const float *a, const float *b, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * (double)b[i];
    return s;
}

static double max_abs_diff(const float *a, const float *b, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > m) m = d;
    }
    return m;
}

typedef double (*objective_fn)(void *ctx);

/* Central differences of f with respect to every element of x, compared with the
 * analytic gradient: max |numeric - analytic| / max |numeric|. */
static double fd_rel_err(float *x, size_t n, const float *grad, objective_fn f, void *ctx,
                         float eps)
{
    double max_diff = 0.0, max_ref = 0.0;
    for (size_t i = 0; i < n; i++) {
        float saved = x[i];
        float xp = saved + eps, xm = saved - eps;
        x[i] = xp;
        double lp = f(ctx);
        x[i] = xm;
        double lm = f(ctx);
        x[i] = saved;
        double num = (lp - lm) / ((double)xp - (double)xm);
        double d = fabs(num - (double)grad[i]);
        if (d > max_diff) max_diff = d;
        if (fabs(num) > max_ref) max_ref = fabs(num);
    }
    return max_diff / (max_ref > 1e-6 ? max_ref : 1e-6);
}

#define FD_TOL 1e-2

static void check_fd(const char *what, double err)
{
    printf("  %-34s fd rel err %.2e\n", what, err);
    CHECKF(err < FD_TOL, "%s: %g", what, err);
}

/* ---- encoder ------------------------------------------------------------------ */

typedef struct {
    float *out, *wte, *wpe, *R;
    int *tokens;
    int B, T, C;
} enc_ctx;

static double enc_obj(void *p)
{
    enc_ctx *e = p;
    K->encoder_forward(e->out, e->tokens, e->wte, e->wpe, e->B, e->T, e->C);
    return dot_d(e->out, e->R, (size_t)e->B * e->T * e->C);
}

static void test_encoder(void)
{
    enc_ctx e = {.B = 2, .T = 5, .C = 8};
    int V = 11, N = e.B * e.T, C = e.C;
    int tokens[10] = {3, 7, 3, 0, 10, 7, 7, 1, 3, 5}; /* repeats, within and across rows */
    e.tokens = tokens;
    e.wte = ts_test_rand_floats((size_t)V * C, 1.0f);
    e.wpe = ts_test_rand_floats((size_t)(e.T + 2) * C, 1.0f); /* wpe may hold more positions */
    e.out = ts_alloc_floats((size_t)N * C);
    e.R = ts_test_rand_floats((size_t)N * C, 1.0f);
    float *dwte = ts_alloc_floats((size_t)V * C), *dwpe = ts_alloc_floats((size_t)(e.T + 2) * C);

    enc_obj(&e);
    double ferr = 0.0;
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            float ref = e.wte[tokens[n] * C + c] + e.wpe[(n % e.T) * C + c];
            ferr = fmax(ferr, fabs(ref - e.out[n * C + c]));
        }
    CHECKF(ferr == 0.0, "encoder forward %g", ferr);

    K->encoder_backward(dwte, dwpe, e.R, tokens, e.B, e.T, C);
    check_fd("encoder dwte", fd_rel_err(e.wte, (size_t)V * C, dwte, enc_obj, &e, 1e-2f));
    check_fd("encoder dwpe", fd_rel_err(e.wpe, (size_t)(e.T + 2) * C, dwpe, enc_obj, &e, 1e-2f));

    /* Accumulation: a second call doubles both gradients. */
    float *dwte1 = copy_floats(dwte, (size_t)V * C), *dwpe1 = copy_floats(dwpe, (size_t)e.T * C);
    K->encoder_backward(dwte, dwpe, e.R, tokens, e.B, e.T, C);
    for (int i = 0; i < V * C; i++) dwte1[i] *= 2.0f;
    for (int i = 0; i < e.T * C; i++) dwpe1[i] *= 2.0f;
    CHECK(max_abs_diff(dwte, dwte1, (size_t)V * C) < 1e-5);
    CHECK(max_abs_diff(dwpe, dwpe1, (size_t)e.T * C) < 1e-5);
    free(dwte1), free(dwpe1), free(e.wte), free(e.wpe), free(e.out), free(e.R), free(dwte),
        free(dwpe);
}

/* wpe NULL (llama: no position embedding): out is the token's row of wte exactly, and
 * dwpe NULL: dwte is what it is with a dwpe, bit for bit. */
static void test_encoder_no_wpe(void)
{
    enc_ctx e = {.B = 2, .T = 5, .C = 40}; /* C: more than one 16-float line per thread */
    int V = 11, N = e.B * e.T, C = e.C;
    int tokens[10] = {3, 7, 3, 0, 10, 7, 7, 1, 3, 5};
    e.tokens = tokens;
    e.wte = ts_test_rand_floats((size_t)V * C, 1.0f);
    e.wpe = NULL;
    e.out = ts_test_nan_floats((size_t)N * C);
    e.R = ts_test_rand_floats((size_t)N * C, 1.0f);
    enc_obj(&e);
    int same = 1;
    for (int n = 0; n < N; n++) same &= ts_test_same_bits(e.out + n * C, e.wte + tokens[n] * C, C);
    CHECKF(same, "encoder_forward with wpe NULL is not the token embedding");

    float *dwte = ts_alloc_floats((size_t)V * C), *dwte_ref = ts_alloc_floats((size_t)V * C);
    float *dwpe = ts_alloc_floats((size_t)e.T * C);
    K->encoder_backward(dwte, NULL, e.R, tokens, e.B, e.T, C);
    K->encoder_backward(dwte_ref, dwpe, e.R, tokens, e.B, e.T, C);
    CHECKF(ts_test_same_bits(dwte, dwte_ref, (size_t)V * C),
           "encoder_backward with dwpe NULL changes dwte");
    check_fd("encoder dwte (no wpe)", fd_rel_err(e.wte, (size_t)V * C, dwte, enc_obj, &e, 1e-2f));
    free(dwte), free(dwte_ref), free(dwpe), free(e.wte), free(e.out), free(e.R);
}

/* ---- layernorm ---------------------------------------------------------------- */

typedef struct {
    float *out, *mean, *rstd, *inp, *w, *b, *R;
    int N, C;
} ln_ctx;

static double ln_obj(void *p)
{
    ln_ctx *l = p;
    K->layernorm_forward(l->out, l->mean, l->rstd, l->inp, l->w, l->b, l->N, l->C);
    return dot_d(l->out, l->R, (size_t)l->N * l->C);
}

static void test_layernorm(int N, int C)
{
    ln_ctx l = {.N = N, .C = C};
    size_t NC = (size_t)N * C;
    l.inp = ts_test_rand_floats(NC, 2.0f);
    for (size_t i = 0; i < NC; i++) l.inp[i] += 0.5f; /* a non-zero mean */
    l.w = ts_test_rand_floats((size_t)C, 1.0f), l.b = ts_test_rand_floats((size_t)C, 1.0f);
    l.out = ts_alloc_floats(NC), l.mean = ts_alloc_floats((size_t)N);
    l.rstd = ts_alloc_floats((size_t)N), l.R = ts_test_rand_floats(NC, 1.0f);

    ln_obj(&l);
    /* Forward against a double reference. */
    double ferr = 0.0;
    for (int n = 0; n < N; n++) {
        double m = 0.0, v = 0.0;
        for (int c = 0; c < C; c++) m += l.inp[n * C + c];
        m /= C;
        for (int c = 0; c < C; c++) v += (l.inp[n * C + c] - m) * (l.inp[n * C + c] - m);
        double rs = 1.0 / sqrt(v / C + 1e-5);
        for (int c = 0; c < C; c++) {
            double ref = (l.inp[n * C + c] - m) * rs * l.w[c] + l.b[c];
            ferr = fmax(ferr, fabs(ref - l.out[n * C + c]));
        }
        ferr = fmax(ferr, fabs(m - l.mean[n]) + fabs(rs - l.rstd[n]) / rs);
    }
    CHECKF(ferr < 1e-5, "layernorm forward %g", ferr);

    /* dinp accumulates: start it from random values and subtract them afterwards. */
    float *dinp0 = ts_test_rand_floats(NC, 1.0f), *dinp = copy_floats(dinp0, NC);
    float *dw = ts_alloc_floats((size_t)C), *db = ts_alloc_floats((size_t)C);
    K->layernorm_backward(dinp, dw, db, l.R, l.inp, l.w, l.mean, l.rstd, N, C);
    for (size_t i = 0; i < NC; i++) dinp[i] -= dinp0[i];
    if (NC <= 4096) {
        check_fd("layernorm dinp (+=)", fd_rel_err(l.inp, NC, dinp, ln_obj, &l, 1e-3f));
    }
    check_fd("layernorm dweight", fd_rel_err(l.w, (size_t)C, dw, ln_obj, &l, 1e-2f));
    check_fd("layernorm dbias", fd_rel_err(l.b, (size_t)C, db, ln_obj, &l, 1e-2f));

    float *dw1 = copy_floats(dw, (size_t)C), *db1 = copy_floats(db, (size_t)C);
    K->layernorm_backward(dinp, dw, db, l.R, l.inp, l.w, l.mean, l.rstd, N, C);
    for (int c = 0; c < C; c++) dw1[c] *= 2.0f, db1[c] *= 2.0f;
    CHECK(max_abs_diff(dw, dw1, (size_t)C) < 1e-4);
    CHECK(max_abs_diff(db, db1, (size_t)C) < 1e-4);
    free(dw1), free(db1), free(dinp0), free(dinp), free(dw), free(db);
    free(l.inp), free(l.w), free(l.b), free(l.out), free(l.mean), free(l.rstd), free(l.R);
}

/* ---- rmsnorm ------------------------------------------------------------------ */

typedef struct {
    float *out, *rstd, *inp, *w, *R;
    int N, C;
    float eps;
} rms_ctx;

static double rms_obj(void *p)
{
    rms_ctx *r = p;
    K->rmsnorm_forward(r->out, r->rstd, r->inp, r->w, r->N, r->C, r->eps);
    return dot_d(r->out, r->R, (size_t)r->N * r->C);
}

static void test_rmsnorm(int N, int C, float eps)
{
    rms_ctx r = {.N = N, .C = C, .eps = eps};
    size_t NC = (size_t)N * C;
    r.inp = ts_test_rand_floats(NC, 2.0f);
    for (size_t i = 0; i < NC; i++) r.inp[i] += 0.5f; /* a non-zero mean: RMSNorm keeps it */
    r.w = ts_test_rand_floats((size_t)C, 1.0f);
    r.out = ts_test_nan_floats(NC), r.rstd = ts_test_nan_floats((size_t)N);
    r.R = ts_test_rand_floats(NC, 1.0f);

    rms_obj(&r);
    /* Forward against a double reference. */
    double ferr = 0.0;
    for (int n = 0; n < N; n++) {
        double ms = 0.0;
        for (int c = 0; c < C; c++) ms += (double)r.inp[n * C + c] * r.inp[n * C + c];
        double rs = 1.0 / sqrt(ms / C + eps);
        for (int c = 0; c < C; c++)
            ferr = fmax(ferr, fabs(r.inp[n * C + c] * rs * r.w[c] - r.out[n * C + c]));
        ferr = fmax(ferr, fabs(rs - r.rstd[n]) / rs);
    }
    printf("  rmsnorm N=%-3d C=%-3d forward max err vs double %.2e\n", N, C, ferr);
    CHECKF(ferr < 1e-5, "rmsnorm forward %g", ferr);

    /* dinp accumulates: start it from random values and subtract them afterwards. */
    float *dinp0 = ts_test_rand_floats(NC, 1.0f), *dinp = copy_floats(dinp0, NC);
    float *dw0 = ts_test_rand_floats((size_t)C, 1.0f), *dw = copy_floats(dw0, (size_t)C);
    K->rmsnorm_backward(dinp, dw, r.R, r.inp, r.w, r.rstd, N, C);
    for (size_t i = 0; i < NC; i++) dinp[i] -= dinp0[i];
    float *dw1 = copy_floats(dw, (size_t)C); /* dw0 + g */
    for (int c = 0; c < C; c++) dw[c] -= dw0[c];
    if (NC <= 4096) check_fd("rmsnorm dinp (+=)", fd_rel_err(r.inp, NC, dinp, rms_obj, &r, 1e-3f));
    check_fd("rmsnorm dweight (+=)", fd_rel_err(r.w, (size_t)C, dw, rms_obj, &r, 1e-2f));

    /* A second call adds g again: dw0 + 2 g. */
    float *dinp2 = copy_floats(dinp0, NC);
    K->rmsnorm_backward(dinp2, dw1, r.R, r.inp, r.w, r.rstd, N, C);
    for (int c = 0; c < C; c++) dw1[c] -= dw0[c] + 2.0f * dw[c];
    float *zero = ts_alloc_floats((size_t)C);
    CHECK(max_abs_diff(dw1, zero, (size_t)C) < 1e-4);
    free(zero), free(dinp0), free(dinp), free(dinp2), free(dw0), free(dw), free(dw1);
    free(r.inp), free(r.w), free(r.out), free(r.rstd), free(r.R);
}

/* ---- rope --------------------------------------------------------------------- */

/* Llama's tables: angle t * theta^(-2i/HS) for position t, channel pair i < HS/2. */
static void rope_tables(float *cos_t, float *sin_t, int T, int HS)
{
    for (int t = 0; t < T; t++)
        for (int i = 0; i < HS / 2; i++) {
            double ang = t * pow(10000.0, -2.0 * i / HS);
            cos_t[t * HS / 2 + i] = (float)cos(ang);
            sin_t[t * HS / 2 + i] = (float)sin(ang);
        }
}

typedef struct {
    float *x, *work, *cos, *sin, *R;
    int B, T, NH, NKV, HS;
} rope_ctx;

static size_t rope_n(const rope_ctx *r)
{
    return (size_t)r->B * r->T * (r->NH + 2 * r->NKV) * r->HS;
}

static double rope_obj(void *p)
{
    rope_ctx *r = p;
    memcpy(r->work, r->x, rope_n(r) * sizeof(float));
    K->rope_forward(r->work, r->cos, r->sin, r->B, r->T, ts_att_heads_gqa(r->NH, r->NKV, r->HS),
                    r->HS, false);
    return dot_d(r->work, r->R, rope_n(r));
}

static void test_rope(int B, int T, int NH, int NKV, int HS)
{
    rope_ctx r = {.B = B, .T = T, .NH = NH, .NKV = NKV, .HS = HS};
    const size_t n = rope_n(&r), row = (size_t)(NH + 2 * NKV) * HS;
    const int half = HS / 2;
    r.x = ts_test_rand_floats(n, 1.0f), r.work = ts_alloc_floats(n);
    r.R = ts_test_rand_floats(n, 1.0f);
    r.cos = ts_alloc_floats((size_t)T * half), r.sin = ts_alloc_floats((size_t)T * half);
    rope_tables(r.cos, r.sin, T, HS);

    /* Forward against x cos + rotate_half(x) sin, rotate_half(x) = cat(-x[HS/2:], x[:HS/2]),
     * on the q and k heads; the v heads are left exactly as they were. */
    rope_obj(&r);
    double ferr = 0.0;
    int v_same = 1;
    for (size_t bt = 0; bt < (size_t)B * T; bt++) {
        const int t = (int)(bt % T);
        for (int h = 0; h < NH + 2 * NKV; h++) {
            const size_t off = bt * row + (size_t)h * HS;
            const float *x = r.x + off, *y = r.work + off;
            if (h >= NH + NKV) {
                v_same &= ts_test_same_bits(x, y, (size_t)HS);
                continue;
            }
            for (int i = 0; i < HS; i++) {
                double rot = i < half ? -(double)x[i + half] : (double)x[i - half];
                double c = r.cos[t * half + i % half], sn = r.sin[t * half + i % half];
                ferr = fmax(ferr, fabs(x[i] * c + rot * sn - y[i]));
            }
        }
    }
    printf("  rope NH=%d NKV=%d HS=%d forward max err vs x cos + rotate_half(x) sin %.2e\n", NH,
           NKV, HS, ferr);
    CHECKF(ferr < 1e-6, "rope forward %g", ferr);
    CHECKF(v_same, "rope_forward changed a value head");

    /* Backward: the gradient of L = sum(rope(x) R) is rope_backward(R), which is the
     * transpose: <rope(x), R> = <x, rope_backward(R)> (rope is linear). */
    float *dx = copy_floats(r.R, n);
    K->rope_backward(dx, r.cos, r.sin, B, T, ts_att_heads_gqa(NH, NKV, HS), HS, false);
    int dv_same = 1;
    for (size_t bt = 0; bt < (size_t)B * T; bt++)
        dv_same &= ts_test_same_bits(dx + bt * row + (size_t)(NH + NKV) * HS,
                                     r.R + bt * row + (size_t)(NH + NKV) * HS,
                                     (size_t)NKV * HS);
    CHECKF(dv_same, "rope_backward changed a value head's gradient");
    double lhs = rope_obj(&r), rhs = dot_d(r.x, dx, n);
    printf("  rope transpose: <rope(x), R> - <x, rope_backward(R)> = %.2e (of %.2f)\n", lhs - rhs,
           lhs);
    CHECKF(fabs(lhs - rhs) < 1e-5 * fmax(1.0, fabs(lhs)), "rope backward is not the transpose");
    check_fd("rope dqkv", fd_rel_err(r.x, n, dx, rope_obj, &r, 1e-2f));
    /* and the inverse: backward after forward gives x back (a rotation) */
    memcpy(r.work, r.x, n * sizeof(float));
    K->rope_forward(r.work, r.cos, r.sin, B, T, ts_att_heads_gqa(NH, NKV, HS), HS, false);
    K->rope_backward(r.work, r.cos, r.sin, B, T, ts_att_heads_gqa(NH, NKV, HS), HS, false);
    CHECKF(max_abs_diff(r.work, r.x, n) < 1e-6, "rope backward does not undo the forward");
    free(dx), free(r.x), free(r.work), free(r.R), free(r.cos), free(r.sin);
}

/* RoPE on the last RD < HS channels of each q and k head (DeepSeek-V3's decoupled rope
 * part), in halves or in adjacent pairs (interleaved), with v heads of HSV != HS: against
 * the double-precision formula (test_att_reference.h); the first HS - RD channels of each
 * q and k head and every v head are left with their bits; the backward is the inverse
 * rotation (against the formula with sin negated, and undoing the forward). Also the
 * same bits as a plain call where they must agree: RD == HS halves is llama's. */
static void test_rope_heads(int B, int T, ts_att_heads h, int RD, bool interleaved)
{
    const size_t row = ts_att_qkv_width(h), n = (size_t)B * T * row;
    float *x = ts_test_rand_floats(n, 1.0f), *y = copy_floats(x, n), *want = ts_alloc_floats(n);
    float *cs = ts_alloc_floats((size_t)T * RD / 2), *sn = ts_alloc_floats((size_t)T * RD / 2);
    rope_tables(cs, sn, T, RD);
    char who[96];
    snprintf(who, sizeof who, "rope NH=%d NKV=%d HS=%d HSV=%d RD=%d %s", h.NH, h.NKV, h.HS,
             h.HSV, RD, interleaved ? "interleaved" : "halves");
    K->rope_forward(y, cs, sn, B, T, h, RD, interleaved);
    ts_ref_rope(want, x, cs, sn, B, T, h, RD, interleaved, 1.0);
    ts_test_expect_close(who, "forward", K->name, y, want, n, 1e-6, 0.1);
    /* untouched: each q/k head's first HS - RD channels and the v heads, bit for bit */
    int same = 1;
    for (size_t r = 0; r < (size_t)B * T; r++) {
        for (int hd = 0; hd < h.NH + h.NKV; hd++)
            same &= ts_test_same_bits(y + r * row + (size_t)hd * h.HS,
                                      x + r * row + (size_t)hd * h.HS, (size_t)(h.HS - RD));
        const size_t v0 = (size_t)(h.NH + h.NKV) * h.HS;
        same &= ts_test_same_bits(y + r * row + v0, x + r * row + v0, row - v0);
    }
    CHECKF(same, "%s: a channel outside the rotated part changed", who);
    /* backward: the formula with sin negated, on a gradient */
    float *d = copy_floats(x, n);
    K->rope_backward(d, cs, sn, B, T, h, RD, interleaved);
    ts_ref_rope(want, x, cs, sn, B, T, h, RD, interleaved, -1.0);
    ts_test_expect_close(who, "backward", K->name, d, want, n, 1e-6, 0.1);
    K->rope_backward(y, cs, sn, B, T, h, RD, interleaved);
    CHECKF(max_abs_diff(y, x, n) < 1e-6, "%s: backward does not undo the forward", who);
    if (interleaved) {
        /* Hugging Face's apply_rotary_pos_emb_interleave: de-interleave the rotated part
         * ([x0, x2, ..., x1, x3, ...]), then rotate halves. The adjacent pairs give the
         * same values in the interleaved order, so the same q.k: the same bits here. */
        float *p = copy_floats(x, n), *yi = copy_floats(x, n);
        for (size_t r = 0; r < (size_t)B * T; r++)
            for (int hd = 0; hd < h.NH + h.NKV; hd++) {
                const size_t at = r * row + (size_t)hd * h.HS + (size_t)(h.HS - RD);
                for (int i = 0; i < RD / 2; i++) {
                    p[at + i] = x[at + 2 * i];
                    p[at + RD / 2 + i] = x[at + 2 * i + 1];
                }
            }
        K->rope_forward(p, cs, sn, B, T, h, RD, false);
        K->rope_forward(yi, cs, sn, B, T, h, RD, true);
        int hf_same = 1;
        for (size_t r = 0; r < (size_t)B * T; r++)
            for (int hd = 0; hd < h.NH + h.NKV; hd++) {
                const size_t at = r * row + (size_t)hd * h.HS + (size_t)(h.HS - RD);
                for (int i = 0; i < RD / 2; i++)
                    hf_same &= ts_test_same_bits(&p[at + i], &yi[at + 2 * i], 1) &&
                               ts_test_same_bits(&p[at + RD / 2 + i], &yi[at + 2 * i + 1], 1);
            }
        CHECKF(hf_same, "%s: not HF's de-interleave-then-rotate-halves", who);
        free(p), free(yi);
    }
    free(x), free(y), free(want), free(cs), free(sn), free(d);
}

/* ---- swiglu ------------------------------------------------------------------- */

typedef struct {
    float *out, *inp, *R;
    int N, F;
} swiglu_ctx;

static double swiglu_obj(void *p)
{
    swiglu_ctx *g = p;
    K->swiglu_forward(g->out, g->inp, g->N, g->F);
    return dot_d(g->out, g->R, (size_t)g->N * g->F);
}

static void test_swiglu(int N, int F)
{
    swiglu_ctx g = {.N = N, .F = F};
    const size_t n2 = (size_t)N * 2 * F, n = (size_t)N * F;
    g.inp = ts_test_rand_floats(n2, 4.0f), g.out = ts_test_nan_floats(n);
    g.R = ts_test_rand_floats(n, 1.0f);
    /* gates at the ends of the exp range and at 0 */
    g.inp[0] = 0.0f, g.inp[1] = -30.0f, g.inp[2] = 30.0f, g.inp[3] = -200.0f, g.inp[4] = 200.0f;
    swiglu_obj(&g);
    double ferr = 0.0;
    for (int r = 0; r < N; r++)
        for (int f = 0; f < F; f++) {
            double x = g.inp[(size_t)r * 2 * F + f], u = g.inp[(size_t)r * 2 * F + F + f];
            double ref = x / (1.0 + exp(-x)) * u;
            ferr = fmax(ferr, fabs(ref - g.out[(size_t)r * F + f]) / fmax(fabs(ref), 1e-3));
        }
    printf("  swiglu N=%d F=%d forward rel err vs silu(gate) * up %.2e\n", N, F, ferr);
    CHECKF(ferr < 1e-5, "swiglu forward %g", ferr);

    float *dinp = ts_test_nan_floats(n2);
    K->swiglu_backward(dinp, g.inp, g.R, N, F);
    int finite = 1;
    for (size_t i = 0; i < n2; i++) finite &= isfinite(dinp[i]) != 0;
    CHECKF(finite, "swiglu dinp not finite (or not written)");
    check_fd("swiglu dinp (gate, up)", fd_rel_err(g.inp, n2, dinp, swiglu_obj, &g, 1e-3f));
    free(dinp), free(g.inp), free(g.out), free(g.R);
}

/* ---- matmul ------------------------------------------------------------------- */

typedef struct {
    float *out, *inp, *w, *b, *R;
    int N, C, OC;
} mm_ctx;

static double mm_obj(void *p)
{
    mm_ctx *m = p;
    K->matmul_forward(m->out, m->inp, m->w, m->b, m->N, m->C, m->OC);
    return dot_d(m->out, m->R, (size_t)m->N * m->OC);
}

static void test_matmul(int with_bias)
{
    mm_ctx m = {.N = 10, .C = 8, .OC = 12};
    int N = m.N, C = m.C, OC = m.OC;
    m.inp = ts_test_rand_floats((size_t)N * C, 1.0f);
    m.w = ts_test_rand_floats((size_t)OC * C, 1.0f);
    m.b = with_bias ? ts_test_rand_floats((size_t)OC, 1.0f) : NULL;
    m.out = ts_test_rand_floats((size_t)N * OC, 1.0f); /* garbage: forward must overwrite */
    m.R = ts_test_rand_floats((size_t)N * OC, 1.0f);

    mm_obj(&m);
    double ferr = 0.0;
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double ref = m.b ? m.b[o] : 0.0;
            for (int c = 0; c < C; c++) ref += (double)m.inp[n * C + c] * m.w[o * C + c];
            ferr = fmax(ferr, fabs(ref - m.out[n * OC + o]));
        }
    CHECKF(ferr < 1e-5, "matmul forward %g", ferr);

    float *dinp = ts_test_rand_floats((size_t)N * C, 1.0f); /* garbage: overwritten */
    float *dw = ts_alloc_floats((size_t)OC * C), *db = ts_alloc_floats((size_t)OC);
    K->matmul_backward(dinp, dw, m.b ? db : NULL, m.R, m.inp, m.w, N, C, OC);
    check_fd(with_bias ? "matmul dinp (bias)" : "matmul dinp (no bias)",
             fd_rel_err(m.inp, (size_t)N * C, dinp, mm_obj, &m, 1e-2f));
    check_fd(with_bias ? "matmul dweight (bias)" : "matmul dweight (no bias)",
             fd_rel_err(m.w, (size_t)OC * C, dw, mm_obj, &m, 1e-2f));
    if (m.b) check_fd("matmul dbias", fd_rel_err(m.b, (size_t)OC, db, mm_obj, &m, 1e-2f));

    /* Second call with dinp = NULL: dweight and dbias double, dinp untouched. */
    float *dw1 = copy_floats(dw, (size_t)OC * C), *db1 = copy_floats(db, (size_t)OC);
    K->matmul_backward(NULL, dw, m.b ? db : NULL, m.R, m.inp, m.w, N, C, OC);
    for (int i = 0; i < OC * C; i++) dw1[i] *= 2.0f;
    for (int i = 0; i < OC; i++) db1[i] *= 2.0f;
    CHECK(max_abs_diff(dw, dw1, (size_t)OC * C) < 1e-5);
    CHECK(max_abs_diff(db, db1, (size_t)OC) < 1e-5);
    free(dw1), free(db1), free(dinp), free(dw), free(db);
    free(m.inp), free(m.w), free(m.b), free(m.out), free(m.R);
}

/* ---- attention ---------------------------------------------------------------- */

typedef struct {
    float *out, *att, *qkv, *R;
    int B, T, NH, NKV, HS;
} att_ctx;

static double att_obj(void *p)
{
    att_ctx *a = p;
    K->attention_forward(a->out, a->att, a->qkv, a->B, a->T,
                         ts_att_heads_gqa(a->NH, a->NKV, a->HS));
    return dot_d(a->out, a->R, (size_t)a->B * a->T * a->NH * a->HS);
}

/* Naive causal grouped-query attention in double (query head h reads key/value head
 * h / (NH/NKV)): max |out - ref| and max |att - ref|. */
static double att_reference_err(const att_ctx *a)
{
    int B = a->B, T = a->T, NH = a->NH, NKV = a->NKV, HS = a->HS, C = NH * HS;
    int C3 = (NH + 2 * NKV) * HS, group = NH / NKV;
    double err = 0.0, *p = malloc((size_t)T * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < T; i++) {
                const float *q = a->qkv + ((size_t)b * T + i) * C3 + h * HS;
                const int koff = C + (h / group) * HS, voff = C + NKV * HS + (h / group) * HS;
                double mx = -1e300, sum = 0.0;
                for (int j = 0; j <= i; j++) {
                    const float *k = a->qkv + ((size_t)b * T + j) * C3 + koff;
                    double s = 0.0;
                    for (int d = 0; d < HS; d++) s += (double)q[d] * k[d];
                    p[j] = s / sqrt((double)HS);
                    if (p[j] > mx) mx = p[j];
                }
                for (int j = 0; j <= i; j++) sum += (p[j] = exp(p[j] - mx));
                const float *arow = a->att + (((size_t)b * NH + h) * T + i) * T;
                for (int j = 0; j < T; j++)
                    err = fmax(err, fabs((j <= i ? p[j] / sum : 0.0) - arow[j]));
                for (int d = 0; d < HS; d++) {
                    double o = 0.0;
                    for (int j = 0; j <= i; j++)
                        o += p[j] / sum * a->qkv[((size_t)b * T + j) * C3 + voff + d];
                    err = fmax(err, fabs(o - a->out[((size_t)b * T + i) * C + h * HS + d]));
                }
            }
    free(p);
    return err;
}

static void test_attention(int B, int T, int NH, int NKV, int HS, const char *label)
{
    att_ctx a = {.B = B, .T = T, .NH = NH, .NKV = NKV, .HS = HS};
    int C = NH * HS;
    size_t nqkv = (size_t)B * T * (NH + 2 * NKV) * HS, nout = (size_t)B * T * C;
    size_t natt = (size_t)B * NH * T * T;
    CHECK(K->attention_saved_bytes(B, T, ts_att_heads_gqa(NH, NH, HS)) >= natt * sizeof(float));
    CHECK(K->attention_scratch_bytes(B, T, ts_att_heads_gqa(NH, NH, HS)) >= natt * sizeof(float));
    a.qkv = ts_test_rand_floats(nqkv, 1.5f);
    a.out = ts_alloc_floats(nout), a.R = ts_test_rand_floats(nout, 1.0f);
    a.att = ts_test_rand_floats(natt, 1.0f); /* garbage: zeros above the diagonal must be written */

    att_obj(&a);
    double ferr = att_reference_err(&a);
    printf("  attention forward %-22s max err vs naive %.2e\n", label, ferr);
    CHECKF(ferr < 1e-5, "attention forward %s %g", label, ferr);
    int causal_ok = 1;
    double sum_err = 0.0;
    for (size_t r = 0; r < (size_t)B * NH * T; r++) {
        int i = (int)(r % T);
        double s = 0.0;
        for (int j = 0; j < T; j++) {
            float v = a.att[r * T + j];
            if (j > i && v != 0.0f) causal_ok = 0;
            s += v;
        }
        sum_err = fmax(sum_err, fabs(s - 1.0));
    }
    CHECKF(causal_ok, "attention probabilities above the diagonal are not exactly 0");
    CHECKF(sum_err < 1e-5, "attention rows sum to 1: err %g", sum_err);

    float *dqkv = ts_test_nan_floats(nqkv); /* NaN: every element must be overwritten */
    float *scratch = ts_test_nan_floats(natt);
    K->attention_backward(dqkv, scratch, a.R, a.qkv, a.att, B, T, ts_att_heads_gqa(NH, NKV, HS));
    char what[64];
    snprintf(what, sizeof what, "attention dqkv %s", label);
    check_fd(what, fd_rel_err(a.qkv, nqkv, dqkv, att_obj, &a, 1e-3f));
    free(dqkv), free(scratch), free(a.qkv), free(a.out), free(a.R), free(a.att);
}

/* The general heads (kernels.h ts_att_heads: q/k heads of HS channels, v and output
 * heads of HSV, any scale) against the double-precision reference (test_att_reference.h):
 * attention_forward's out and probabilities, attention_backward's dq, dk, dv; the prefix
 * kernels on Tq = T - off queries against T keys and values from a separate kv buffer,
 * with dkv ACCUMULATING onto what it held and dqkv's k, v columns untouched. */
static void test_attention_heads(const char *label, int B, int T, ts_att_heads h, int off)
{
    const size_t C3 = ts_att_qkv_width(h), KVW = ts_att_kv_width(h), OW = ts_att_out_width(h);
    const size_t QW = (size_t)h.NH * h.HS, N = (size_t)B * T, natt = (size_t)B * h.NH * T * T;
    char who[96];
    snprintf(who, sizeof who, "attention %s", label);
    CHECK(K->attention_saved_bytes(B, T, h) >= natt * sizeof(float));
    CHECK(K->attention_scratch_bytes(B, T, h) >= natt * sizeof(float));
    float *qkv = ts_test_rand_floats(N * C3, 1.5f), *dout = ts_test_rand_floats(N * OW, 1.0f);
    float *out = ts_test_nan_floats(N * OW), *att = ts_test_rand_floats(natt, 1.0f);
    double *rout = malloc(N * OW * sizeof(double)), *ratt = malloc(natt * sizeof(double));
    double *rdq = malloc(N * QW * sizeof(double)), *rdk = malloc(N * h.NKV * h.HS * sizeof(double));
    double *rdv = malloc(N * h.NKV * h.HSV * sizeof(double));
    K->attention_forward(out, att, qkv, B, T, h);
    ts_ref_attention(qkv, C3, qkv + QW, qkv + QW + (size_t)h.NKV * h.HS, C3, dout, B, T, T, h,
                     rout, ratt, rdq, rdk, rdv);
    float *want = ts_ref_to_floats(rout, N * OW), *want_att = ts_ref_to_floats(ratt, natt);
    ts_test_expect_close(who, "out", K->name, out, want, N * OW, 1e-5, 0.1);
    ts_test_expect_close(who, "att", K->name, att, want_att, natt, 1e-5, 0.1);
    float *dqkv = ts_test_nan_floats(N * C3), *scratch = ts_test_nan_floats(natt);
    K->attention_backward(dqkv, scratch, dout, qkv, att, B, T, h);
    /* the reference's dq | dk | dv laid out as a dqkv row */
    float *wd = ts_alloc_floats(N * C3);
    for (size_t r = 0; r < N; r++) {
        for (size_t c = 0; c < QW; c++) wd[r * C3 + c] = (float)rdq[r * QW + c];
        for (size_t c = 0; c < (size_t)h.NKV * h.HS; c++)
            wd[r * C3 + QW + c] = (float)rdk[r * h.NKV * h.HS + c];
        for (size_t c = 0; c < (size_t)h.NKV * h.HSV; c++)
            wd[r * C3 + QW + (size_t)h.NKV * h.HS + c] = (float)rdv[r * h.NKV * h.HSV + c];
    }
    ts_test_expect_close(who, "dqkv", K->name, dqkv, wd, N * C3, 1e-5, 0.1);

    /* The prefix form: the last Tq = T - off queries of the same sequences, keys and
     * values from kv [B, T, KVW] (qkv's k|v columns), dkv starting from random values. */
    const int Tq = T - off;
    const size_t Nq = (size_t)B * Tq, pat = (size_t)B * h.NH * Tq * T;
    float *pq = ts_alloc_floats(Nq * C3), *kv = ts_alloc_floats(N * KVW);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < Tq; i++)
            memcpy(pq + ((size_t)b * Tq + i) * C3, qkv + ((size_t)b * T + off + i) * C3,
                   C3 * sizeof(float));
    for (size_t r = 0; r < N; r++) memcpy(kv + r * KVW, qkv + r * C3 + QW, KVW * sizeof(float));
    float *pdout = ts_alloc_floats(Nq * OW);
    for (int b = 0; b < B; b++)
        memcpy(pdout + (size_t)b * Tq * OW, dout + ((size_t)b * T + off) * OW,
               (size_t)Tq * OW * sizeof(float));
    CHECK(K->attention_prefix_saved_bytes(B, Tq, T, h) >= pat * sizeof(float));
    CHECK(K->attention_prefix_scratch_bytes(B, Tq, T, h) >= pat * sizeof(float));
    float *pout = ts_test_nan_floats(Nq * OW), *patt = ts_test_rand_floats(pat, 1.0f);
    K->attention_prefix_forward(pout, patt, pq, kv, B, Tq, T, h);
    double *prq = malloc(Nq * QW * sizeof(double));
    ts_ref_attention(pq, C3, kv, kv + (size_t)h.NKV * h.HS, KVW, pdout, B, Tq, T, h, rout, ratt,
                     prq, rdk, rdv);
    free(want), free(want_att);
    want = ts_ref_to_floats(rout, Nq * OW), want_att = ts_ref_to_floats(ratt, pat);
    ts_test_expect_close(who, "prefix out", K->name, pout, want, Nq * OW, 1e-5, 0.1);
    ts_test_expect_close(who, "prefix att", K->name, patt, want_att, pat, 1e-5, 0.1);
    float *pdqkv = ts_test_rand_floats(Nq * C3, 1.0f), *pdqkv0 = copy_floats(pdqkv, Nq * C3);
    float *dkv = ts_test_rand_floats(N * KVW, 1.0f), *wkv = copy_floats(dkv, N * KVW);
    float *pscr = ts_test_nan_floats(K->attention_prefix_scratch_bytes(B, Tq, T, h) / 4);
    K->attention_prefix_backward(pdqkv, dkv, pscr, pdout, pq, kv, patt, B, Tq, T, h);
    float *wq = ts_alloc_floats(Nq * QW), *gq = ts_alloc_floats(Nq * QW);
    int kv_cols_same = 1;
    for (size_t r = 0; r < Nq; r++) {
        for (size_t c = 0; c < QW; c++) wq[r * QW + c] = (float)prq[r * QW + c];
        memcpy(gq + r * QW, pdqkv + r * C3, QW * sizeof(float));
        kv_cols_same &= ts_test_same_bits(pdqkv + r * C3 + QW, pdqkv0 + r * C3 + QW, C3 - QW);
    }
    for (size_t r = 0; r < N; r++) { /* dkv += dk | dv */
        for (size_t c = 0; c < (size_t)h.NKV * h.HS; c++)
            wkv[r * KVW + c] += (float)rdk[r * h.NKV * h.HS + c];
        for (size_t c = 0; c < (size_t)h.NKV * h.HSV; c++)
            wkv[r * KVW + (size_t)h.NKV * h.HS + c] += (float)rdv[r * h.NKV * h.HSV + c];
    }
    ts_test_expect_close(who, "prefix dq", K->name, gq, wq, Nq * QW, 1e-5, 0.1);
    ts_test_expect_close(who, "prefix dkv (+=)", K->name, dkv, wkv, N * KVW, 1e-5, 0.1);
    CHECKF(kv_cols_same, "%s: the prefix backward wrote dqkv's k/v columns", who);
    free(qkv), free(dout), free(out), free(att), free(rout), free(ratt), free(rdq), free(rdk);
    free(rdv), free(want), free(want_att), free(dqkv), free(scratch), free(wd), free(pq);
    free(kv), free(pdout), free(pout), free(patt), free(prq), free(pdqkv), free(pdqkv0);
    free(dkv), free(wkv), free(pscr), free(wq), free(gq);
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

/* Grouped-query attention is multi-head attention on the key/value heads repeated
 * (query head h gets a copy of kv head h / (NH/NKV)): the same output and
 * probabilities, the same dQ, and each kv head's dK, dV the sum of its copies'. */
static void test_attention_gqa_is_repeated_mha(int B, int T, int NH, int NKV, int HS)
{
    const int C = NH * HS, group = NH / NKV, Cg = (NH + 2 * NKV) * HS, Cm = 3 * C;
    const size_t N = (size_t)B * T, nout = N * C, natt = (size_t)B * NH * T * T;
    float *qg = ts_test_rand_floats(N * Cg, 1.5f), *qm = ts_alloc_floats(N * Cm);
    for (size_t n = 0; n < N; n++) {
        const float *g = qg + n * Cg;
        float *m = qm + n * Cm;
        memcpy(m, g, (size_t)C * sizeof(float)); /* the q heads */
        for (int h = 0; h < NH; h++) {
            memcpy(m + C + h * HS, g + C + (h / group) * HS, (size_t)HS * sizeof(float));
            memcpy(m + 2 * C + h * HS, g + C + NKV * HS + (h / group) * HS,
                   (size_t)HS * sizeof(float));
        }
    }
    float *og = ts_alloc_floats(nout), *om = ts_alloc_floats(nout);
    float *ag = ts_alloc_floats(natt), *am = ts_alloc_floats(natt);
    K->attention_forward(og, ag, qg, B, T, ts_att_heads_gqa(NH, NKV, HS));
    K->attention_forward(om, am, qm, B, T, ts_att_heads_gqa(NH, NH, HS));
    double fdiff = fmax(max_abs_diff(og, om, nout), max_abs_diff(ag, am, natt));
    printf("  attention NH=%d NKV=%d vs MHA with kv repeated: forward max diff %.2e%s\n", NH,
           NKV, fdiff,
           ts_test_same_bits(og, om, nout) && ts_test_same_bits(ag, am, natt) ? " (same bits)"
                                                                               : "");
    CHECKF(fdiff < 1e-6, "GQA forward differs from MHA on repeated kv heads: %g", fdiff);

    float *dout = ts_test_rand_floats(nout, 1.0f);
    float *dg = ts_test_nan_floats(N * Cg), *dm = ts_test_nan_floats(N * Cm);
    float *scratch = ts_test_nan_floats(natt);
    K->attention_backward(dg, scratch, dout, qg, ag, B, T, ts_att_heads_gqa(NH, NKV, HS));
    K->attention_backward(dm, scratch, dout, qm, am, B, T, ts_att_heads_gqa(NH, NH, HS));
    /* dQ alike; dK, dV of kv head g = sum over its group of the MHA heads' (in double) */
    double qerr = 0.0, kverr = 0.0, kvmax = 0.0;
    for (size_t n = 0; n < N; n++) {
        const float *g = dg + n * Cg, *m = dm + n * Cm;
        for (int c = 0; c < C; c++) qerr = fmax(qerr, fabs((double)g[c] - m[c]));
        for (int part = 0; part < 2; part++) /* k, then v */
            for (int kv = 0; kv < NKV; kv++)
                for (int d = 0; d < HS; d++) {
                    double sum = 0.0;
                    for (int h = kv * group; h < (kv + 1) * group; h++)
                        sum += m[(1 + part) * C + h * HS + d];
                    double got = g[C + part * NKV * HS + kv * HS + d];
                    kverr = fmax(kverr, fabs(got - sum));
                    kvmax = fmax(kvmax, fabs(sum));
                    if (isnan(got)) kverr = INFINITY;
                }
    }
    printf("  attention NH=%d NKV=%d vs MHA backward: dq max diff %.2e, dk/dv vs sums of the "
           "copies %.2e (of max %.2f)\n",
           NH, NKV, qerr, kverr, kvmax);
    CHECKF(qerr < 1e-6, "GQA dq differs from MHA's: %g", qerr);
    CHECKF(kverr < 1e-5 * fmax(kvmax, 1.0), "GQA dk/dv differ from the sums of MHA's: %g", kverr);
    free(qg), free(qm), free(og), free(om), free(ag), free(am), free(dout), free(dg), free(dm);
    free(scratch);
}

/* ---- context parallelism's prefix attention ----------------------------------- */

/* Rows [t0, t0 + n) of each batch of x [B, T, width], as [B, n, width]. */
static float *batch_rows(const float *x, int B, int T, int width, int t0, int n)
{
    float *y = ts_alloc_floats((size_t)B * n * width);
    for (int b = 0; b < B; b++)
        memcpy(y + (size_t)b * n * width, x + ((size_t)b * T + t0) * width,
               (size_t)n * width * sizeof(float));
    return y;
}

/* y's rows back into rows [t0, t0 + n) of each batch of x [B, T, width]. */
static void put_batch_rows(float *x, const float *y, int B, int T, int width, int t0, int n)
{
    for (int b = 0; b < B; b++)
        memcpy(x + ((size_t)b * T + t0) * width, y + (size_t)b * n * width,
               (size_t)n * width * sizeof(float));
}

/* The k and v columns of qkv [B, T, (NH+2*NKV)*HS] (each row's last 2*NKV*HS: the k
 * heads, then the v heads), rows [0, Tk) of each batch: kv [B, Tk, 2*NKV*HS]. */
static float *kv_prefix(const float *qkv, int B, int T, int NH, int NKV, int HS, int Tk)
{
    const int C = NH * HS, C2 = 2 * NKV * HS, C3 = C + C2;
    float *kv = ts_alloc_floats((size_t)B * Tk * C2);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < Tk; t++)
            memcpy(kv + ((size_t)b * Tk + t) * C2, qkv + ((size_t)b * T + t) * C3 + C,
                   (size_t)C2 * sizeof(float));
    return kv;
}

/* Columns [c0, c0 + w) of every row of x [N, width], packed [N, w]. */
static float *columns(const float *x, size_t N, int width, int c0, int w)
{
    float *y = ts_alloc_floats(N * w);
    for (size_t n = 0; n < N; n++)
        memcpy(y + n * w, x + n * width + c0, (size_t)w * sizeof(float));
    return y;
}

/* Whether every masked probability of att [B, NH, Tq, Tk] is exactly 0 (query t sees
 * keys 0..t + Tk - Tq), and the worst |row sum - 1|. */
static int prefix_mask_is_zero(const float *att, int B, int NH, int Tq, int Tk, double *sum_err)
{
    int ok = 1;
    *sum_err = 0.0;
    for (size_t r = 0; r < (size_t)B * NH * Tq; r++) {
        int t = (int)(r % Tq);
        double s = 0.0;
        for (int j = 0; j < Tk; j++) {
            float v = att[r * Tk + j];
            if (j > t + Tk - Tq && v != 0.0f) ok = 0;
            s += v;
        }
        *sum_err = fmax(*sum_err, fabs(s - 1.0));
    }
    return ok;
}

/* Tq == Tk: the prefix kernels are attention_forward/backward on the same q, k, v (out,
 * the probabilities, dq and dk, dv); the backward leaves dqkv's k and v columns alone and
 * adds into dkv. */
static void test_attention_prefix_square(int B, int T, int NH, int NKV, int HS)
{
    const int C = NH * HS, C2 = 2 * NKV * HS, C3 = C + C2;
    const size_t N = (size_t)B * T, natt = (size_t)B * NH * T * T;
    char who[64];
    snprintf(who, sizeof who, "prefix Tq=Tk=%d NH=%d NKV=%d", T, NH, NKV);
    CHECK(K->attention_prefix_saved_bytes(B, T, T, ts_att_heads_gqa(NH, NH, HS)) ==
          K->attention_saved_bytes(B, T, ts_att_heads_gqa(NH, NH, HS)));
    CHECK(K->attention_prefix_scratch_bytes(B, T, T, ts_att_heads_gqa(NH, NH, HS)) >=
          natt * sizeof(float));
    float *qkv = ts_test_rand_floats(N * C3, 1.5f), *kv = kv_prefix(qkv, B, T, NH, NKV, HS, T);
    float *out = ts_test_nan_floats(N * C), *att = ts_test_rand_floats(natt, 1.0f);
    float *pout = ts_test_nan_floats(N * C), *patt = ts_test_rand_floats(natt, 1.0f);
    K->attention_forward(out, att, qkv, B, T, ts_att_heads_gqa(NH, NKV, HS));
    K->attention_prefix_forward(pout, patt, qkv, kv, B, T, T, ts_att_heads_gqa(NH, NKV, HS));
    ts_test_expect_close(who, "out", "prefix", pout, out, N * C, 1e-5, 0.1);
    ts_test_expect_close(who, "att", "prefix", patt, att, natt, 1e-5, 0.1);

    float *dout = ts_test_rand_floats(N * C, 1.0f), *scratch = ts_test_nan_floats(natt);
    float *dqkv = ts_test_nan_floats(N * C3), *pdqkv = ts_test_rand_floats(N * C3, 1.0f);
    float *pdqkv0 = copy_floats(pdqkv, N * C3), *dkv = ts_alloc_floats(N * C2); /* zeros */
    K->attention_backward(dqkv, scratch, dout, qkv, att, B, T, ts_att_heads_gqa(NH, NKV, HS));
    K->attention_prefix_backward(pdqkv, dkv, scratch, dout, qkv, kv, patt, B, T, T,
                                 ts_att_heads_gqa(NH, NKV, HS));
    float *dq = columns(dqkv, N, C3, 0, C), *pdq = columns(pdqkv, N, C3, 0, C);
    float *dkv_want = columns(dqkv, N, C3, C, C2);
    ts_test_expect_close(who, "dq", "prefix", pdq, dq, N * C, 1e-5, 0.1);
    ts_test_expect_close(who, "dk, dv", "prefix", dkv, dkv_want, N * C2, 1e-5, 0.1);
    float *kvcols = columns(pdqkv, N, C3, C, C2), *kvcols0 = columns(pdqkv0, N, C3, C, C2);
    CHECKF(ts_test_same_bits(kvcols, kvcols0, N * C2),
           "%s: the backward wrote dqkv's k/v columns", who);
    /* dkv accumulates: a second call adds as much again */
    K->attention_prefix_backward(pdqkv, dkv, scratch, dout, qkv, kv, patt, B, T, T,
                                 ts_att_heads_gqa(NH, NKV, HS));
    for (size_t i = 0; i < N * C2; i++) dkv_want[i] *= 2.0f;
    ts_test_expect_close(who, "dk, dv (+= twice)", "prefix", dkv, dkv_want, N * C2, 1e-5, 0.1);
    free(qkv), free(kv), free(out), free(att), free(pout), free(patt), free(dout);
    free(scratch), free(dqkv), free(pdqkv), free(pdqkv0), free(dkv), free(dq);
    free(pdq), free(dkv_want), free(kvcols), free(kvcols0);
}

/* Context parallelism's split: full causal attention over T = 2*cp*c tokens, then each
 * chunk g (queries [g*c, (g+1)*c)) against the key/value prefix [0, (g+1)*c): its out
 * rows are the full output's, its dq rows (given its rows of the full dout) the full
 * dq's, and the chunks' dkv, added into one gathered buffer, the full dk and dv. Every
 * masked probability is exactly 0. T and c are not multiples of 16 or 32. */
static void test_attention_prefix_chunks(int cp, int c, int B, int NH, int NKV, int HS)
{
    const int T = 2 * cp * c, C = NH * HS, C2 = 2 * NKV * HS, C3 = C + C2;
    const size_t N = (size_t)B * T, natt = (size_t)B * NH * T * T;
    char who[80];
    snprintf(who, sizeof who, "prefix cp=%d c=%d NH=%d NKV=%d", cp, c, NH, NKV);
    float *qkv = ts_test_rand_floats(N * C3, 1.5f), *dout = ts_test_rand_floats(N * C, 1.0f);
    float *out = ts_alloc_floats(N * C), *att = ts_alloc_floats(natt);
    float *dqkv = ts_alloc_floats(N * C3), *scratch = ts_alloc_floats(natt);
    K->attention_forward(out, att, qkv, B, T, ts_att_heads_gqa(NH, NKV, HS));
    K->attention_backward(dqkv, scratch, dout, qkv, att, B, T, ts_att_heads_gqa(NH, NKV, HS));

    /* The chunks' outputs and dq rows, gathered back into [B, T] order; dkv summed. */
    float *got_out = ts_test_nan_floats(N * C), *got_dqkv = ts_test_nan_floats(N * C3);
    float *dkv_total = ts_alloc_floats(N * C2); /* zeros: the gathered gradient buffer */
    int mask_ok = 1;
    double sum_err = 0.0;
    for (int g = 0; g < 2 * cp; g++) {
        const int Tq = c, Tk = (g + 1) * c;
        const size_t natt_g = (size_t)B * NH * Tq * Tk;
        CHECK(K->attention_prefix_saved_bytes(B, Tq, Tk, ts_att_heads_gqa(NH, NH, HS)) >=
              natt_g * sizeof(float));
        CHECK(K->attention_prefix_scratch_bytes(B, Tq, Tk, ts_att_heads_gqa(NH, NH, HS)) >=
              natt_g * sizeof(float));
        float *q = batch_rows(qkv, B, T, C3, g * c, c), *kv = kv_prefix(qkv, B, T, NH, NKV, HS, Tk);
        float *o = ts_test_nan_floats((size_t)B * c * C);
        float *a = ts_test_rand_floats(natt_g, 1.0f); /* garbage: the zeros must be written */
        K->attention_prefix_forward(o, a, q, kv, B, Tq, Tk, ts_att_heads_gqa(NH, NKV, HS));
        double e;
        mask_ok &= prefix_mask_is_zero(a, B, NH, Tq, Tk, &e);
        sum_err = fmax(sum_err, e);
        put_batch_rows(got_out, o, B, T, C, g * c, c);

        /* The backward adds into the gathered buffer's prefix rows (copied out and back
         * here: a [B, Tk] prefix of a [B, T] buffer is contiguous only for B = 1). */
        float *dq = ts_test_nan_floats((size_t)B * c * C3), *s = ts_test_nan_floats(natt_g);
        float *d = batch_rows(dout, B, T, C, g * c, c);
        float *dkv = batch_rows(dkv_total, B, T, C2, 0, Tk);
        K->attention_prefix_backward(dq, dkv, s, d, q, kv, a, B, Tq, Tk,
                                     ts_att_heads_gqa(NH, NKV, HS));
        put_batch_rows(dkv_total, dkv, B, T, C2, 0, Tk);
        put_batch_rows(got_dqkv, dq, B, T, C3, g * c, c);
        free(q), free(kv), free(o), free(a), free(dq), free(s), free(d), free(dkv);
    }
    CHECKF(mask_ok, "%s: masked probabilities are not exactly 0", who);
    CHECKF(sum_err < 1e-5, "%s: probability rows sum to 1: err %g", who, sum_err);
    /* relative 1e-5 of max(|want|, 0.1 max|want|): fp32 sums in other orders */
    ts_test_expect_close(who, "out", "chunks", got_out, out, N * C, 1e-5, 0.1);
    float *dq_want = columns(dqkv, N, C3, 0, C), *dq_got = columns(got_dqkv, N, C3, 0, C);
    float *dkv_want = columns(dqkv, N, C3, C, C2);
    ts_test_expect_close(who, "dq", "chunks", dq_got, dq_want, N * C, 1e-5, 0.1);
    ts_test_expect_close(who, "dk, dv (summed)", "chunks", dkv_total, dkv_want, N * C2, 1e-5,
                         0.1);
    free(qkv), free(dout), free(out), free(att), free(dqkv), free(scratch), free(got_out);
    free(got_dqkv), free(dkv_total), free(dq_want), free(dq_got), free(dkv_want);
}

/* One chunk (Tq < Tk, off not a multiple of the block) through a table: out, att, the
 * dq part of dqkv and dkv (+=), as host copies. */
typedef struct {
    float *out, *att, *dqkv, *dkv;
} prefix_run;

static prefix_run prefix_on(const ts_kernels *k, const float *q, const float *kv,
                            const float *dout, const float *dkv0, int B, int Tq, int Tk,
                            int NH, int NKV, int HS)
{
    const int C = NH * HS, C2 = 2 * NKV * HS, C3 = C + C2;
    const size_t nq = (size_t)B * Tq, natt = (size_t)B * NH * Tq * Tk, nkv = (size_t)B * Tk * C2;
    float *dq = ts_test_to_dev(k, q, nq * C3), *dkvv = ts_test_to_dev(k, kv, nkv);
    float *dd = ts_test_to_dev(k, dout, nq * C), *dacc = ts_test_to_dev(k, dkv0, nkv);
    float *o = ts_test_dev_nan(k, nq * C), *a = ts_test_dev_nan(k, natt);
    float *g = ts_test_dev_nan(k, nq * C3);
    float *s = ts_test_dev_nan(
        k, k->attention_prefix_scratch_bytes(B, Tq, Tk, ts_att_heads_gqa(NH, NH, HS)) / 4);
    k->attention_prefix_forward(o, a, dq, dkvv, B, Tq, Tk, ts_att_heads_gqa(NH, NKV, HS));
    k->attention_prefix_backward(g, dacc, s, dd, dq, dkvv, a, B, Tq, Tk,
                                 ts_att_heads_gqa(NH, NKV, HS));
    prefix_run r = {ts_test_from_dev(k, o, nq * C), ts_test_from_dev(k, a, natt),
                    ts_test_from_dev(k, g, nq * C3), ts_test_from_dev(k, dacc, nkv)};
    k->dev_free(dq), k->dev_free(dkvv), k->dev_free(dd), k->dev_free(dacc), k->dev_free(o);
    k->dev_free(a), k->dev_free(g), k->dev_free(s);
    return r;
}

/* The same bits on the strict table (its wrappers open device memory around the CPU
 * kernels) and at 1 and 2 threads (one (batch, head) pair per OpenMP iteration). */
static void test_attention_prefix_strict_and_threads(void)
{
    const int B = 2, Tq = 40, Tk = 120, NH = 4, NKV = 2, HS = 8;
    const int C = NH * HS, C2 = 2 * NKV * HS, C3 = C + C2;
    const size_t nq = (size_t)B * Tq, natt = (size_t)B * NH * Tq * Tk, nkv = (size_t)B * Tk * C2;
    float *q = ts_test_rand_floats(nq * C3, 1.5f), *kv = ts_test_rand_floats(nkv, 1.5f);
    float *dout = ts_test_rand_floats(nq * C, 1.0f), *dkv0 = ts_test_rand_floats(nkv, 1.0f);
    const int threads = ts_cpu_get_threads();
    ts_cpu_set_threads(1);
    prefix_run one = prefix_on(&ts_kernels_cpu, q, kv, dout, dkv0, B, Tq, Tk, NH, NKV, HS);
    ts_cpu_set_threads(2);
    prefix_run two = prefix_on(&ts_kernels_cpu, q, kv, dout, dkv0, B, Tq, Tk, NH, NKV, HS);
    prefix_run strict =
        prefix_on(&ts_kernels_cpu_strict, q, kv, dout, dkv0, B, Tq, Tk, NH, NKV, HS);
    ts_cpu_set_threads(threads);
    prefix_run *runs[] = {&two, &strict};
    const char *names[] = {"2 threads", "cpu-strict"};
    for (int r = 0; r < 2; r++) {
        int same = ts_test_same_bits(runs[r]->out, one.out, nq * C) &&
                   ts_test_same_bits(runs[r]->att, one.att, natt) &&
                   ts_test_same_bits(runs[r]->dkv, one.dkv, nkv);
        for (size_t n = 0; n < nq; n++)
            same &= ts_test_same_bits(runs[r]->dqkv + n * C3, one.dqkv + n * C3, (size_t)C);
        printf("  attention prefix Tq=%d Tk=%d on %-10s: %s as 1 thread\n", Tq, Tk, names[r],
               same ? "the same bits" : "DIFFERENT bits");
        CHECKF(same, "attention prefix on %s differs from 1 thread on cpu", names[r]);
    }
    prefix_run *all[] = {&one, &two, &strict};
    for (int r = 0; r < 3; r++)
        free(all[r]->out), free(all[r]->att), free(all[r]->dqkv), free(all[r]->dkv);
    free(q), free(kv), free(dout), free(dkv0);
}

/* ---- gelu, residual, sum_squares ---------------------------------------------- */

typedef struct {
    float *out, *inp, *R;
    size_t n;
} gelu_ctx;

static double gelu_obj(void *p)
{
    gelu_ctx *g = p;
    K->gelu_forward(g->out, g->inp, g->n);
    return dot_d(g->out, g->R, g->n);
}

static void test_gelu(void)
{
    gelu_ctx g = {.n = 200};
    g.inp = ts_test_rand_floats(g.n, 5.0f), g.out = ts_alloc_floats(g.n);
    g.R = ts_test_rand_floats(g.n, 1.0f);
    g.inp[0] = 0.0f, g.inp[1] = -30.0f, g.inp[2] = 30.0f, g.inp[3] = -200.0f, g.inp[4] = 1e-3f;
    gelu_obj(&g);
    double ferr = 0.0;
    for (size_t i = 0; i < g.n; i++) {
        double x = g.inp[i];
        double ref = 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
        ferr = fmax(ferr, fabs(ref - g.out[i]) / fmax(fabs(ref), 1e-3));
    }
    printf("  gelu forward rel err vs tanh formula %.2e\n", ferr);
    CHECKF(ferr < 1e-5, "gelu forward %g", ferr);
    CHECK(g.out[3] == 0.0f || fabsf(g.out[3]) < 1e-30f);
    CHECK(g.out[2] == 30.0f);

    float *dinp = ts_alloc_floats(g.n);
    K->gelu_backward(dinp, g.inp, g.R, g.n);
    for (size_t i = 0; i < g.n; i++) CHECKF(isfinite(dinp[i]), "gelu dinp[%zu] not finite", i);
    check_fd("gelu dinp", fd_rel_err(g.inp, g.n, dinp, gelu_obj, &g, 1e-3f));
    /* dinp may alias dout. */
    float *alias = copy_floats(g.R, g.n);
    K->gelu_backward(alias, g.inp, alias, g.n);
    CHECK(max_abs_diff(alias, dinp, g.n) == 0.0);
    free(alias), free(dinp), free(g.inp), free(g.out), free(g.R);
}

static void test_elementwise(void)
{
    size_t n = 100003; /* several sum_squares blocks and a ragged tail */
    float *a = ts_test_rand_floats(n, 1.0f), *b = ts_test_rand_floats(n, 1.0f);
    float *out = ts_alloc_floats(n);
    K->residual_forward(out, a, b, n);
    int ok = 1;
    for (size_t i = 0; i < n; i++) ok &= out[i] == a[i] + b[i];
    CHECKF(ok, "residual_forward");
    K->residual_forward(a, a, b, n); /* in place */
    CHECK(max_abs_diff(a, out, n) == 0.0);

    double ref = 0.0;
    for (size_t i = 0; i < n; i++) ref += (double)b[i] * b[i];
    double ss = K->sum_squares(b, n);
    CHECKF(fabs(ss - ref) < 1e-10 * ref, "sum_squares %.17g vs %.17g", ss, ref);
    CHECK(K->sum_squares(b, 0) == 0.0);
    size_t nbig = ((size_t)65 << 15) + 5; /* more block sums than the on-stack array holds */
    float *big = ts_test_rand_floats(nbig, 1.0f);
    ref = 0.0;
    for (size_t i = 0; i < nbig; i++) ref += (double)big[i] * big[i];
    ss = K->sum_squares(big, nbig);
    CHECKF(fabs(ss - ref) < 1e-10 * ref, "sum_squares (many blocks) %.17g vs %.17g", ss, ref);
    free(big);
    free(a), free(b), free(out);
}

/* ---- cross-entropy ------------------------------------------------------------ */

typedef struct {
    float *logits, *work, *losses;
    int *targets;
    int N, V;
    float dloss;
} xent_ctx;

static double xent_obj(void *p)
{
    xent_ctx *x = p;
    memcpy(x->work, x->logits, (size_t)x->N * x->V * sizeof(float));
    K->crossentropy_forward_backward(x->losses, x->work, x->targets, x->N, x->V, x->dloss);
    double s = 0.0;
    for (int n = 0; n < x->N; n++) s += x->losses[n];
    return s * x->dloss;
}

static void test_crossentropy(int N, int V)
{
    xent_ctx x = {.N = N, .V = V, .dloss = 0.1f};
    int targets[10] = {0, 10, 5, 5, 3, 9, 1, 2, 7, 10};
    for (int n = 0; n < N; n++) targets[n] = n == 1 ? V - 1 : targets[n] % V; /* both ends */
    x.targets = targets;
    x.logits = ts_test_rand_floats((size_t)N * V, 4.0f);
    x.logits[3 * V + V / 2] = 60.0f; /* a dominant logit: max-subtraction must hold */
    x.work = ts_alloc_floats((size_t)N * V), x.losses = ts_alloc_floats((size_t)N);

    xent_obj(&x);
    double lerr = 0.0;
    for (int n = 0; n < N; n++) {
        double mx = -1e300, s = 0.0;
        for (int v = 0; v < V; v++) mx = fmax(mx, x.logits[n * V + v]);
        for (int v = 0; v < V; v++) s += exp(x.logits[n * V + v] - mx);
        // cppcheck-suppress invalidFunctionArg ; s >= 1 (the max term is exp(0))
        double ref = -(x.logits[n * V + targets[n]] - mx - log(s));
        lerr = fmax(lerr, fabs(ref - x.losses[n]) / fmax(ref, 1e-3));
    }
    printf("  crossentropy V=%-5d loss rel err vs log-softmax %.2e\n", V, lerr);
    CHECKF(lerr < 1e-5, "crossentropy losses %g", lerr);

    float *dlogits = copy_floats(x.work, (size_t)N * V);
    double row_sum = 0.0;
    for (int n = 0; n < N; n++) {
        double s = 0.0;
        for (int v = 0; v < V; v++) s += dlogits[n * V + v];
        row_sum = fmax(row_sum, fabs(s));
    }
    CHECKF(row_sum < 1e-7, "dlogits rows sum to 0: %g", row_sum);
    check_fd(V < 100 ? "crossentropy dlogits V=11" : "crossentropy dlogits V=1500",
             fd_rel_err(x.logits, (size_t)N * V, dlogits, xent_obj, &x, 1e-2f));
    free(dlogits), free(x.logits), free(x.work), free(x.losses);
}

/* ---- AdamW -------------------------------------------------------------------- */

static void test_adamw(void)
{
    size_t n = 1000;
    float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    float *p = ts_test_rand_floats(n, 1.0f), *m = ts_alloc_floats(n), *v = ts_alloc_floats(n);
    float *g = ts_alloc_floats(n);
    double *rp = malloc(n * sizeof(double)), *rm = calloc(n, sizeof(double));
    double *rv = calloc(n, sizeof(double));
    for (size_t i = 0; i < n; i++) rp[i] = p[i];
    double err;
    for (int t = 1; t <= 6; t++) {
        /* Steps 4..6 clip: the kernel applies the coefficient to the gradient it reads. */
        float gs = t > 3 ? 0.37f : 1.0f;
        for (size_t i = 0; i < n; i++) g[i] = ts_test_frand() * (i % 7 == 0 ? 1e-4f : 1.0f);
        K->adamw_update(p, g, gs, m, v, n, lr, b1, b2, eps, wd, t);
        for (size_t i = 0; i < n; i++) g[i] *= gs; /* the reference sees the clipped gradient */
        double bc1 = 1.0 - pow(b1, t), bc2 = 1.0 - pow(b2, t);
        for (size_t i = 0; i < n; i++) {
            rp[i] *= 1.0 - (double)lr * wd;
            rm[i] = b1 * rm[i] + (1.0 - b1) * g[i];
            rv[i] = b2 * rv[i] + (1.0 - b2) * (double)g[i] * g[i];
            rp[i] -= (lr / bc1) * rm[i] / (sqrt(rv[i]) / sqrt(bc2) + eps);
        }
    }
    /* Moments: max error relative to the largest moment (some cancel to ~0). */
    double perr = 0.0, merr = 0.0, mmax = 0.0, verr = 0.0, vmax = 0.0;
    for (size_t i = 0; i < n; i++) {
        perr = fmax(perr, fabs(rp[i] - p[i])); /* float rounding of |p| ~ 1: ~1e-7 a step */
        merr = fmax(merr, fabs(rm[i] - m[i])), mmax = fmax(mmax, fabs(rm[i]));
        verr = fmax(verr, fabs(rv[i] - v[i])), vmax = fmax(vmax, fabs(rv[i]));
    }
    err = fmax(merr / mmax, verr / vmax);
    printf("  adamw 6 steps vs double reference: param abs err %.2e, moments rel err %.2e\n",
           perr, err);
    CHECKF(perr < 1e-6, "adamw param %g (steps are ~%g)", perr, (double)lr);
    CHECKF(err < 1e-5, "adamw moments %g", err);
    free(p), free(m), free(v), free(g), free(rp), free(rm), free(rv);
}

/* ---- fused kernels ------------------------------------------------------------- */

/* residual_layernorm_forward gives residual_forward then layernorm_forward's bits, into
 * a separate sum buffer or in place over either input, on the CPU and strict tables. */
static void test_residual_layernorm(int N, int C)
{
    const size_t NC = (size_t)N * C;
    float *a = ts_test_rand_floats(NC, 2.0f), *b = ts_test_rand_floats(NC, 1.0f);
    float *w = ts_test_rand_floats((size_t)C, 1.0f), *bias = ts_test_rand_floats((size_t)C, 1.0f);
    /* the unfused reference */
    float *res = ts_alloc_floats(NC), *ln = ts_alloc_floats(NC);
    float *mean = ts_alloc_floats((size_t)N), *rstd = ts_alloc_floats((size_t)N);
    ts_kernels_cpu.residual_forward(res, a, b, NC);
    ts_kernels_cpu.layernorm_forward(ln, mean, rstd, res, w, bias, N, C);

    const ts_kernels *tables[] = {&ts_kernels_cpu, &ts_kernels_cpu_strict};
    for (int ti = 0; ti < 2; ti++) {
        const ts_kernels *k = tables[ti];
        for (int alias = 0; alias < 3; alias++) { /* res_out: its own buffer, a, b */
            float *da = ts_test_to_dev(k, a, NC), *db = ts_test_to_dev(k, b, NC);
            float *dw = ts_test_to_dev(k, w, (size_t)C);
            float *dbias = ts_test_to_dev(k, bias, (size_t)C);
            float *dres = alias == 1 ? da : alias == 2 ? db : k->dev_alloc(NC * sizeof(float));
            float *dln = k->dev_alloc(NC * sizeof(float));
            float *dmean = k->dev_alloc((size_t)N * sizeof(float));
            float *drstd = k->dev_alloc((size_t)N * sizeof(float));
            k->residual_layernorm_forward(dres, dln, dmean, drstd, da, db, dw, dbias, N, C);
            float *hres = ts_test_from_dev(k, dres, NC), *hln = ts_test_from_dev(k, dln, NC);
            float *hmean = ts_test_from_dev(k, dmean, (size_t)N);
            float *hrstd = ts_test_from_dev(k, drstd, (size_t)N);
            CHECKF(ts_test_same_bits(hres, res, NC) && ts_test_same_bits(hln, ln, NC) &&
                       ts_test_same_bits(hmean, mean, (size_t)N) &&
                       ts_test_same_bits(hrstd, rstd, (size_t)N),
                   "residual_layernorm_forward N=%d C=%d on %s (res_out %s) differs from "
                   "residual_forward + layernorm_forward",
                   N, C, k->name, alias == 1 ? "= a" : alias == 2 ? "= b" : "separate");
            free(hres), free(hln), free(hmean), free(hrstd);
            if (alias == 0) k->dev_free(dres);
            k->dev_free(da), k->dev_free(db), k->dev_free(dw), k->dev_free(dbias);
            k->dev_free(dln), k->dev_free(dmean), k->dev_free(drstd);
        }
    }
    free(a), free(b), free(w), free(bias), free(res), free(ln), free(mean), free(rstd);
}

/* residual_rmsnorm_forward gives residual_forward then rmsnorm_forward's bits, as
 * test_residual_layernorm. */
static void test_residual_rmsnorm(int N, int C)
{
    const size_t NC = (size_t)N * C;
    const float eps = 1e-6f;
    float *a = ts_test_rand_floats(NC, 2.0f), *b = ts_test_rand_floats(NC, 1.0f);
    float *w = ts_test_rand_floats((size_t)C, 1.0f);
    float *res = ts_alloc_floats(NC), *nrm = ts_alloc_floats(NC);
    float *rstd = ts_alloc_floats((size_t)N);
    ts_kernels_cpu.residual_forward(res, a, b, NC);
    ts_kernels_cpu.rmsnorm_forward(nrm, rstd, res, w, N, C, eps);

    const ts_kernels *tables[] = {&ts_kernels_cpu, &ts_kernels_cpu_strict};
    for (int ti = 0; ti < 2; ti++) {
        const ts_kernels *k = tables[ti];
        for (int alias = 0; alias < 3; alias++) { /* res_out: its own buffer, a, b */
            float *da = ts_test_to_dev(k, a, NC), *db = ts_test_to_dev(k, b, NC);
            float *dw = ts_test_to_dev(k, w, (size_t)C);
            float *dres = alias == 1 ? da : alias == 2 ? db : ts_test_dev_nan(k, NC);
            float *dnrm = ts_test_dev_nan(k, NC), *drstd = ts_test_dev_nan(k, (size_t)N);
            k->residual_rmsnorm_forward(dres, dnrm, drstd, da, db, dw, N, C, eps);
            CHECKF(ts_test_dev_same_bits(k, dres, res, NC) &&
                       ts_test_dev_same_bits(k, dnrm, nrm, NC) &&
                       ts_test_dev_same_bits(k, drstd, rstd, (size_t)N),
                   "residual_rmsnorm_forward N=%d C=%d on %s (res_out %s) differs from "
                   "residual_forward + rmsnorm_forward",
                   N, C, k->name, alias == 1 ? "= a" : alias == 2 ? "= b" : "separate");
            if (alias == 0) k->dev_free(dres);
            k->dev_free(da), k->dev_free(db), k->dev_free(dw), k->dev_free(dnrm);
            k->dev_free(drstd);
        }
    }
    free(a), free(b), free(w), free(res), free(nrm), free(rstd);
}

/* adamw_update_spans gives one adamw_update per span bit for bit: spans shorter than,
 * equal to and longer than the CPU's 512-float chunks, ragged, with gaps between them
 * (left alone) and moments packed apart from the parameters' offsets, decay on and off;
 * the spans in device memory (the strict table reads them inside its call). */
static void test_adamw_spans(void)
{
    enum { S = 7 };
    const size_t counts[S] = {1, 511, 512, 513, 1500, 3000, 17};
    const int decays[S] = {1, 0, 1, 1, 0, 1, 0};
    ts_adamw_span spans[S];
    size_t off = 3, moff = 0;
    for (int i = 0; i < S; i++) {
        spans[i] = (ts_adamw_span){.offset = off, .grad_offset = off, .moment_offset = moff,
                                   .count = counts[i], .decay = decays[i]};
        off += counts[i] + (size_t)(i % 3) * 5; /* gaps of 0, 5, 10 floats */
        moff += counts[i];
    }
    const size_t np = off + 4, nm = moff;
    float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    float *p0 = ts_test_rand_floats(np, 1.0f);
    /* the reference: one adamw_update per span on the CPU */
    float *rp = copy_floats(p0, np), *rm = ts_alloc_floats(nm), *rv = ts_alloc_floats(nm);
    float *g[4];
    for (int t = 1; t <= 4; t++) {
        g[t - 1] = ts_test_rand_floats(np, 1.0f);
        float gs = t > 2 ? 0.37f : 1.0f;
        for (int i = 0; i < S; i++)
            ts_kernels_cpu.adamw_update(rp + spans[i].offset, g[t - 1] + spans[i].offset, gs,
                                        rm + spans[i].moment_offset, rv + spans[i].moment_offset,
                                        spans[i].count, lr, b1, b2, eps,
                                        spans[i].decay ? wd : 0.0f, t);
    }
    const ts_kernels *tables[] = {&ts_kernels_cpu, &ts_kernels_cpu_strict};
    for (int ti = 0; ti < 2; ti++) {
        const ts_kernels *k = tables[ti];
        float *dp = ts_test_to_dev(k, p0, np);
        float *dm = k->dev_alloc(nm * sizeof(float)), *dv = k->dev_alloc(nm * sizeof(float));
        ts_adamw_span *dspans = k->dev_alloc(sizeof spans);
        k->memcpy_h2d(dspans, spans, sizeof spans);
        for (int t = 1; t <= 4; t++) {
            float *dg = ts_test_to_dev(k, g[t - 1], np);
            float gs = t > 2 ? 0.37f : 1.0f;
            k->adamw_update_spans(dp, dg, gs, dm, dv, dspans, S, lr, b1, b2, eps, wd, t);
            k->adamw_update_spans(dp, dg, gs, dm, dv, dspans, 0, lr, b1, b2, eps, wd, t); /* no-op */
            float *hg = ts_test_from_dev(k, dg, np);
            CHECKF(ts_test_same_bits(hg, g[t - 1], np), "adamw_update_spans on %s changed grad",
                   k->name);
            free(hg);
            k->dev_free(dg);
        }
        float *hp = ts_test_from_dev(k, dp, np), *hm = ts_test_from_dev(k, dm, nm);
        float *hv = ts_test_from_dev(k, dv, nm);
        CHECKF(ts_test_same_bits(hp, rp, np) && ts_test_same_bits(hm, rm, nm) &&
                   ts_test_same_bits(hv, rv, nm),
               "adamw_update_spans on %s differs from one adamw_update per span", k->name);
        free(hp), free(hm), free(hv);
        k->dev_free(dp), k->dev_free(dm), k->dev_free(dv), k->dev_free(dspans);
    }
    /* the gaps are the reference's untouched floats, so same_bits above covers them too */
    for (int i = 0; i < 4; i++) free(g[i]);
    free(p0), free(rp), free(rm), free(rv);
}

/* ---- determinism -------------------------------------------------------------- */

/* Every kernel on a medium shape (several layernorm blocks, attention blocks, ...),
 * all outputs appended to one buffer so runs can be compared bitwise. */
typedef struct {
    int B, T, C, NH, V, OC;
    int *tokens;
    float *wte, *wpe, *x, *lnw, *lnb, *w, *bias, *qkv, *dout, *logits, *p, *g;
} det_inputs;

/* [*gemm0, *gemm1) is the span of plain OpenBLAS GEMM outputs (matmul out, dinp, dweight). */
static float *det_run(const det_inputs *in, size_t *count, double *ss, size_t *gemm0,
                      size_t *gemm1)
{
    int B = in->B, T = in->T, C = in->C, NH = in->NH, V = in->V, OC = in->OC, N = B * T;
    size_t NC = (size_t)N * C, total = 0;
    size_t sizes[] = {NC, (size_t)V * C, (size_t)T * C, NC, (size_t)N, (size_t)N,
                      NC, (size_t)C, (size_t)C, (size_t)N * OC, NC, (size_t)OC * C,
                      (size_t)OC, NC, (size_t)B * NH * T * T, (size_t)N * 3 * C, NC, NC,
                      (size_t)N, (size_t)N * V, NC, NC, NC};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) total += sizes[i];
    float *buf = ts_alloc_floats(total), *q = buf;
    float *enc = q; q += NC;
    float *dwte = q; q += (size_t)V * C;
    float *dwpe = q; q += (size_t)T * C;
    float *ln = q; q += NC;
    float *mean = q; q += N;
    float *rstd = q; q += N;
    float *dln = q; q += NC;
    float *dlnw = q; q += C;
    float *dlnb = q; q += C;
    float *mm = q; q += (size_t)N * OC;
    float *dmm = q; q += NC;
    float *dw = q; q += (size_t)OC * C;
    float *db = q; q += OC;
    float *att_out = q; q += NC;
    float *att = q; q += (size_t)B * NH * T * T;
    float *dqkv = q; q += (size_t)N * 3 * C;
    float *gel = q; q += NC;
    float *dgel = q; q += NC;
    float *losses = q; q += N;
    float *lg = q; q += (size_t)N * V;
    float *p = q; q += NC;
    float *m = q; q += NC;
    float *v = q;
    float *scratch = ts_alloc_floats((size_t)B * NH * T * T);

    K->encoder_forward(enc, in->tokens, in->wte, in->wpe, B, T, C);
    K->encoder_backward(dwte, dwpe, in->dout, in->tokens, B, T, C);
    K->layernorm_forward(ln, mean, rstd, in->x, in->lnw, in->lnb, N, C);
    K->layernorm_backward(dln, dlnw, dlnb, in->dout, in->x, in->lnw, mean, rstd, N, C);
    K->matmul_forward(mm, in->x, in->w, in->bias, N, C, OC);
    K->matmul_backward(dmm, dw, db, in->logits, in->x, in->w, N, C, OC);
    K->attention_forward(att_out, att, in->qkv, B, T, ts_att_heads_gqa(NH, NH, C / NH));
    K->attention_backward(dqkv, scratch, in->dout, in->qkv, att, B, T,
                          ts_att_heads_gqa(NH, NH, C / NH));
    K->gelu_forward(gel, in->x, NC);
    K->gelu_backward(dgel, in->x, in->dout, NC);
    memcpy(lg, in->logits, (size_t)N * V * sizeof(float));
    K->crossentropy_forward_backward(losses, lg, in->tokens, N, V, 1.0f / N);
    memcpy(p, in->p, NC * sizeof(float));
    for (int t = 1; t <= 3; t++) K->adamw_update(p, in->g, 1.0f, m, v, NC, 1e-3f, 0.9f, 0.95f, 1e-8f,
                                                 0.1f, t);
    *ss = K->sum_squares(in->logits, (size_t)N * V);
    free(scratch);
    *count = total;
    *gemm0 = (size_t)(mm - buf);
    *gemm1 = (size_t)(db - buf);
    return buf;
}

static void test_determinism(void)
{
    det_inputs in = {.B = 3, .T = 100, .C = 48, .NH = 4, .V = 300, .OC = 300};
    int N = in.B * in.T;
    size_t NC = (size_t)N * in.C;
    in.tokens = malloc((size_t)N * sizeof(int));
    for (int i = 0; i < N; i++)
        in.tokens[i] = (int)((ts_test_frand() + 1.0f) * 0.5f * 40); /* repeats */
    in.wte = ts_test_rand_floats((size_t)in.V * in.C, 1.0f);
    in.wpe = ts_test_rand_floats((size_t)in.T * in.C, 1.0f);
    in.x = ts_test_rand_floats(NC, 2.0f);
    in.lnw = ts_test_rand_floats(in.C, 1.0f), in.lnb = ts_test_rand_floats(in.C, 1.0f);
    in.w = ts_test_rand_floats((size_t)in.OC * in.C, 1.0f);
    in.bias = ts_test_rand_floats(in.OC, 1.0f);
    in.qkv = ts_test_rand_floats(NC * 3, 2.0f), in.dout = ts_test_rand_floats(NC, 1.0f);
    in.logits = ts_test_rand_floats((size_t)N * in.V, 3.0f);
    in.p = ts_test_rand_floats(NC, 1.0f), in.g = ts_test_rand_floats(NC, 1.0f);

    size_t count = 0, gemm0 = 0, gemm1 = 0;
    double ss[2][2];
    float *runs[2][2];
    for (int th = 1; th <= 2; th++) {
        ts_cpu_set_threads(th);
        CHECK(ts_cpu_get_threads() == th);
        for (int r = 0; r < 2; r++)
            runs[th - 1][r] = det_run(&in, &count, &ss[th - 1][r], &gemm0, &gemm1);
        CHECKF(memcmp(runs[th - 1][0], runs[th - 1][1], count * sizeof(float)) == 0 &&
                   ss[th - 1][0] == ss[th - 1][1],
               "repeated runs differ at %d thread(s)", th);
    }
    /* Our kernels fix their reduction orders independently of the thread count (attention
     * runs each head's GEMMs on one thread), so 1 and 2 threads agree bit for bit. Plain
     * multi-threaded sgemm makes no such promise: reported, not required. */
    size_t ours_differ = 0, gemm_differ = 0;
    for (size_t i = 0; i < count; i++) {
        if (memcmp(&runs[0][0][i], &runs[1][0][i], sizeof(float)) == 0) continue;
        if (i >= gemm0 && i < gemm1)
            gemm_differ++;
        else
            ours_differ++;
    }
    printf("  determinism: repeated runs identical; 1 vs 2 threads: %zu of our outputs differ, "
           "%zu of OpenBLAS sgemm outputs differ\n",
           ours_differ, gemm_differ);
    CHECKF(ours_differ == 0 && ss[0][0] == ss[1][0], "1 vs 2 threads: %zu floats differ",
           ours_differ);
    for (int th = 0; th < 2; th++) free(runs[th][0]), free(runs[th][1]);
    free(in.tokens), free(in.wte), free(in.wpe), free(in.x), free(in.lnw), free(in.lnb);
    free(in.w), free(in.bias), free(in.qkv), free(in.dout), free(in.logits), free(in.p), free(in.g);
}

/* The llama kernels at 1 and 2 threads, twice each: bit for bit the same (the GQA
 * backward's kv-head sums have one owner and one order; rmsnorm's dweight reduces
 * fixed row blocks). Shapes with several row blocks and attention blocks. */
static float *llama_det_run(int B, int T, int NH, int NKV, int HS, int F, const float *x,
                            const float *w, const float *qkv_in, const float *cos_t,
                            const float *sin_t, const float *dout, size_t *count)
{
    const int C = NH * HS, N = B * T;
    const size_t NC = (size_t)N * C, nqkv = (size_t)N * (NH + 2 * NKV) * HS;
    const size_t natt = (size_t)B * NH * T * T, NF = (size_t)N * F;
    size_t total = NC + N + NC + C + NC + N + nqkv + NC + natt + nqkv + NF + 2 * NF;
    float *buf = ts_alloc_floats(total), *q = buf;
    float *nrm = q; q += NC;
    float *rstd = q; q += N;
    float *dx = q; q += NC;
    float *dw = q; q += C;
    float *res = q; q += NC;
    float *rstd2 = q; q += N;
    float *qkv = q; q += nqkv;
    float *att_out = q; q += NC;
    float *att = q; q += natt;
    float *dqkv = q; q += nqkv;
    float *sw = q; q += NF;
    float *dsw = q;
    float *scratch = ts_alloc_floats(natt), *nrm2 = ts_alloc_floats(NC);
    K->rmsnorm_forward(nrm, rstd, x, w, N, C, 1e-5f);
    K->rmsnorm_backward(dx, dw, dout, x, w, rstd, N, C);
    K->residual_rmsnorm_forward(res, nrm2, rstd2, x, dout, w, N, C, 1e-5f);
    memcpy(qkv, qkv_in, nqkv * sizeof(float));
    K->rope_forward(qkv, cos_t, sin_t, B, T, ts_att_heads_gqa(NH, NKV, HS), HS, false);
    K->attention_forward(att_out, att, qkv, B, T, ts_att_heads_gqa(NH, NKV, HS));
    K->attention_backward(dqkv, scratch, dout, qkv, att, B, T, ts_att_heads_gqa(NH, NKV, HS));
    K->rope_backward(dqkv, cos_t, sin_t, B, T, ts_att_heads_gqa(NH, NKV, HS), HS, false);
    K->swiglu_forward(sw, qkv_in, N, F); /* any [N, 2F] input will do */
    K->swiglu_backward(dsw, qkv_in, att_out, N, F);
    free(scratch), free(nrm2);
    *count = total;
    return buf;
}

static void test_llama_determinism(void)
{
    const int B = 2, T = 70, NH = 4, NKV = 2, HS = 16, C = NH * HS, N = B * T;
    const int F = C / 2; /* 2F <= the qkv row, NC >= N F: the inputs above fit */
    const size_t NC = (size_t)N * C, nqkv = (size_t)N * (NH + 2 * NKV) * HS;
    float *x = ts_test_rand_floats(NC, 2.0f), *w = ts_test_rand_floats((size_t)C, 1.0f);
    float *qkv = ts_test_rand_floats(nqkv, 1.5f), *dout = ts_test_rand_floats(NC, 1.0f);
    float *cos_t = ts_alloc_floats((size_t)T * HS / 2);
    float *sin_t = ts_alloc_floats((size_t)T * HS / 2);
    rope_tables(cos_t, sin_t, T, HS);
    float *runs[4];
    size_t count = 0;
    for (int r = 0; r < 4; r++) {
        ts_cpu_set_threads(1 + r / 2);
        runs[r] = llama_det_run(B, T, NH, NKV, HS, F, x, w, qkv, cos_t, sin_t, dout, &count);
    }
    CHECKF(memcmp(runs[0], runs[1], count * sizeof(float)) == 0 &&
               memcmp(runs[2], runs[3], count * sizeof(float)) == 0,
           "llama kernels: repeated runs differ");
    size_t differ = 0;
    for (size_t i = 0; i < count; i++)
        differ += memcmp(&runs[0][i], &runs[2][i], sizeof(float)) != 0;
    printf("  llama kernels (GQA NH=%d NKV=%d): repeated runs identical; 1 vs 2 threads: %zu of "
           "%zu floats differ\n",
           NH, NKV, differ, count);
    CHECKF(differ == 0, "llama kernels, 1 vs 2 threads: %zu floats differ", differ);
    for (int r = 0; r < 4; r++) free(runs[r]);
    free(x), free(w), free(qkv), free(dout), free(cos_t), free(sin_t);
}

/* The table is complete; a missing slot is named; the memory calls copy, zero and sum. */
static void test_table_and_memory(void)
{
    const ts_kernels *k = &ts_kernels_cpu;
    CHECK(ts_kernels_missing(k) == NULL);
    /* every CPU table fills the llama slots too */
    CHECK(ts_kernels_missing(&ts_kernels_cpu_bf16) == NULL);
    CHECK(ts_kernels_missing(&ts_kernels_cpu_strict) == NULL);
    CHECK(ts_kernels_missing(&ts_kernels_cpu_strict_bf16) == NULL);
    /* and the context-parallel attention, which ts_kernels_missing does not require */
    const ts_kernels *cpu_tables[] = {&ts_kernels_cpu, &ts_kernels_cpu_bf16,
                                      &ts_kernels_cpu_strict, &ts_kernels_cpu_strict_bf16};
    for (int i = 0; i < 4; i++) {
        const ts_kernels *t = cpu_tables[i];
        CHECKF(t->attention_prefix_forward && t->attention_prefix_backward &&
                   t->attention_prefix_saved_bytes && t->attention_prefix_scratch_bytes,
               "%s lacks the prefix attention", t->name);
    }
    ts_kernels broken = *k;
    broken.memcpy_d2h = NULL;
    CHECK(ts_kernels_missing(&broken) && strcmp(ts_kernels_missing(&broken), "memcpy_d2h") == 0);
    float host[100], back[100];
    for (int i = 0; i < 100; i++) host[i] = (float)i - 49.5f;
    float *dev = k->dev_alloc(sizeof host), *dev2 = k->dev_alloc(sizeof host);
    CHECK(((uintptr_t)dev & 63) == 0);
    k->memcpy_h2d(dev, host, sizeof host);
    k->memcpy_d2d(dev2, dev, sizeof host);
    k->memcpy_d2h(back, dev2, sizeof back);
    CHECK(memcmp(host, back, sizeof host) == 0);
    double *acc = k->dev_alloc(2 * sizeof(double)), got[2];
    k->sum_into(acc, dev, 100);
    k->sum_into(acc, dev, 10);
    k->sum_squares_into(acc + 1, dev, 100);
    k->memcpy_d2h(got, acc, sizeof got);
    double want = 0.0, want_sq = 0.0;
    for (int i = 0; i < 100; i++) want_sq += (double)host[i] * host[i];
    for (int i = 0; i < 10; i++) want += host[i];
    CHECK(fabs(got[0] - want) < 1e-9 && fabs(got[1] - want_sq) < 1e-6 * want_sq);
    k->memset_zero(dev2, sizeof host);
    k->memcpy_d2h(back, dev2, sizeof back);
    for (int i = 0; i < 100; i++) CHECK(back[i] == 0.0f);
    ts_stream st = k->stream_create();
    k->event_wait(k->event_record(st));
    k->stream_sync(st);
    k->stream_destroy(st);
    CHECK(k->attention_saved_bytes(2, 5, ts_att_heads_gqa(3, 3, 4)) ==
          2 * 3 * 5 * 5 * sizeof(float));
    k->dev_free(dev);
    k->dev_free(dev2);
    k->dev_free(acc);
}

int main(void)
{
    ts_test_require_blas_core();
    test_table_and_memory();
    for (int th = 1; th <= 2; th++) {
        ts_cpu_set_threads(th);
        printf("threads = %d\n", th);
        test_encoder();
        test_layernorm(10, 8);   /* B=2, T=5, C=8 */
        test_layernorm(100, 24); /* several row blocks: dweight/dbias reduction */
        test_matmul(1);
        test_matmul(0);
        test_attention(2, 5, 2, 2, 4, "T=5");
        test_attention(1, 70, 2, 2, 4, "T=70 (3 blocks)");
        test_attention(1, 45, 2, 2, 40, "T=45 HS=40");
        test_attention(2, 5, 4, 2, 4, "T=5 GQA NH=4 NKV=2");
        test_attention(2, 5, 4, 1, 4, "T=5 MQA NH=4 NKV=1");
        test_attention(1, 40, 4, 2, 8, "T=40 GQA (2 blocks)");
        /* the general heads: q/k wider than v (MLA's), v wider than q/k, grouped,
         * scales other than 1/sqrt(HS); T = 37 crosses a 32-row block */
        test_attention_heads("HS=24 HSV=16 NH=4 NKV=4", 2, 37, heads(4, 4, 24, 16, 0.3f), 9);
        test_attention_heads("HS=24 HSV=16 GQA NH=4 NKV=2", 2, 37, heads(4, 2, 24, 16, 0.35f), 5);
        test_attention_heads("HS=8 HSV=12 MQA NH=3 NKV=1", 1, 21, heads(3, 1, 8, 12, 0.9f), 7);
        test_attention_gqa_is_repeated_mha(2, 70, 4, 2, 8);
        test_attention_gqa_is_repeated_mha(1, 45, 6, 1, 16);
        for (int nkv = 4; nkv >= 1; nkv /= 2) { /* multi-head, grouped, multi-query */
            test_attention_prefix_square(2, 70, 4, nkv, 8);
            test_attention_prefix_chunks(2, 24, 2, 4, nkv, 8);  /* T = 96 */
            test_attention_prefix_chunks(4, 40, 2, 4, nkv, 16); /* T = 320 */
        }
        test_encoder_no_wpe();
        test_rmsnorm(10, 8, 1e-5f);
        test_rmsnorm(100, 24, 1e-6f); /* several row blocks: the dweight reduction */
        test_rope(2, 5, 4, 2, 8);
        test_rope(1, 7, 2, 1, 6); /* HS/2 odd */
        for (int il = 0; il < 2; il++) { /* halves, then adjacent pairs */
            test_rope_heads(2, 5, heads(4, 4, 24, 16, 0.3f), 8, il);
            test_rope_heads(1, 7, heads(4, 2, 10, 6, 0.3f), 6, il); /* RD/2 odd */
            test_rope_heads(1, 3, heads(2, 1, 8, 8, 0.3f), 8, il);  /* RD == HS */
        }
        test_swiglu(6, 11);
        test_residual_rmsnorm(10, 8);
        test_residual_rmsnorm(67, 771);
        test_gelu();
        test_elementwise();
        test_crossentropy(10, 11);
        test_crossentropy(4, 1500); /* several sum chunks, a ragged tail */
        test_adamw();
        test_residual_layernorm(10, 8);
        test_residual_layernorm(67, 771); /* ragged vector tails, rows split over threads */
        test_adamw_spans();
    }
    test_determinism();
    test_llama_determinism();
    test_attention_prefix_strict_and_threads();
    return ts_test_report();
}
