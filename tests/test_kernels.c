/* CPU kernels: every backward against central finite differences of a scalar
 * objective L = sum(out * R) (R fixed and random, L accumulated in double), forwards
 * against naive references, the accumulate/overwrite semantics, AdamW against a
 * double-precision reference, the fused kernels against the unfused calls bit for bit
 * (CPU and strict tables), and bitwise determinism at 1 and 2 threads. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/kernels.h"
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
    int B, T, NH, HS;
} att_ctx;

static double att_obj(void *p)
{
    att_ctx *a = p;
    K->attention_forward(a->out, a->att, a->qkv, a->B, a->T, a->NH, a->NH, a->HS);
    return dot_d(a->out, a->R, (size_t)a->B * a->T * a->NH * a->HS);
}

/* Naive causal attention in double: max |out - ref| and max |att - ref|. */
static double att_reference_err(const att_ctx *a)
{
    int B = a->B, T = a->T, NH = a->NH, HS = a->HS, C = NH * HS;
    double err = 0.0, *p = malloc((size_t)T * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < T; i++) {
                const float *q = a->qkv + ((size_t)b * T + i) * 3 * C + h * HS;
                double mx = -1e300, sum = 0.0;
                for (int j = 0; j <= i; j++) {
                    const float *k = a->qkv + ((size_t)b * T + j) * 3 * C + C + h * HS;
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
                        o += p[j] / sum * a->qkv[((size_t)b * T + j) * 3 * C + 2 * C + h * HS + d];
                    err = fmax(err, fabs(o - a->out[((size_t)b * T + i) * C + h * HS + d]));
                }
            }
    free(p);
    return err;
}

static void test_attention(int B, int T, int NH, int HS, const char *label)
{
    att_ctx a = {.B = B, .T = T, .NH = NH, .HS = HS};
    int C = NH * HS;
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, natt = (size_t)B * NH * T * T;
    a.qkv = ts_test_rand_floats(nqkv, 1.5f);
    a.out = ts_alloc_floats(nout), a.R = ts_test_rand_floats(nout, 1.0f);
    a.att = ts_test_rand_floats(natt, 1.0f); /* garbage: zeros above the diagonal must be written */

    att_obj(&a);
    double ferr = att_reference_err(&a);
    printf("  attention forward %-16s max err vs naive %.2e\n", label, ferr);
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

    float *dqkv = ts_test_rand_floats(nqkv, 1.0f); /* garbage: overwritten */
    float *scratch = ts_test_rand_floats(natt, 1.0f);
    K->attention_backward(dqkv, scratch, a.R, a.qkv, a.att, B, T, NH, NH, HS);
    char what[64];
    snprintf(what, sizeof what, "attention dqkv %s", label);
    check_fd(what, fd_rel_err(a.qkv, nqkv, dqkv, att_obj, &a, 1e-3f));
    free(dqkv), free(scratch), free(a.qkv), free(a.out), free(a.R), free(a.att);
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
        spans[i] = (ts_adamw_span){.offset = off, .moment_offset = moff, .count = counts[i],
                                   .decay = decays[i]};
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
    K->attention_forward(att_out, att, in->qkv, B, T, NH, NH, C / NH);
    K->attention_backward(dqkv, scratch, in->dout, in->qkv, att, B, T, NH, NH, C / NH);
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

/* The table is complete; a missing slot is named; the memory calls copy, zero and sum. */
static void test_table_and_memory(void)
{
    const ts_kernels *k = &ts_kernels_cpu;
    CHECK(ts_kernels_missing(k) == NULL);
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
    CHECK(k->attention_saved_bytes(2, 5, 3, 4) == 2 * 3 * 5 * 5 * sizeof(float));
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
        test_attention(2, 5, 2, 4, "T=5");
        test_attention(1, 70, 2, 4, "T=70 (3 blocks)");
        test_attention(1, 45, 2, 40, "T=45 HS=40");
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
    return ts_test_report();
}
