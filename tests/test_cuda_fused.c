/* The CUDA backend's fused slots (kernels/cuda/fused.cu) against the CPU backend:
 * residual_layernorm_forward (separate sum buffer, and in place over either input) and
 * adamw_update_spans (spans shorter and longer than a thread's stride, gaps between them
 * left alone, moments packed apart from the parameters, decay on and off, several steps
 * with and without clipping). Device outputs start as NaN, so an unwritten value shows;
 * each result is within a relative 1e-5 of the CPU's (floor: a tenth of the output's
 * largest |value|), and the gaps and the gradient must come back bit for bit. Also:
 * the fused kernel equals this backend's unfused residual_forward + layernorm_forward,
 * and reruns are bitwise identical. And the bf16 tables' residual_layernorm_forward:
 * bit for bit the bf16 table's unfused pair (the LayerNorm reads the rounded sum, as
 * kernels.h promises), in place over either input too, and within bf16 tolerance of the
 * fp32 table on the same bf16-valued inputs, its outputs first poisoned. The same for
 * llama's residual_rmsnorm_forward (against the CPU, against residual_forward +
 * rmsnorm_forward bit for bit, in fp32 and bf16).
 *
 * Built in CUDA builds only; exits 77 (skipped) where there is no CUDA device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/kernels.h"
#include "test_device_util.h"
#include "test_gpu_bf16.h"

static const ts_kernels *G = &ts_kernels_cuda; /* under test */
static const ts_kernels *H = &ts_kernels_cpu;  /* the reference, on host memory */

#define TOL 1e-5

/* The device buffer `d` against the CPU's `want`. */
static void expect_close(const char *slot, const char *what, const float *d, const float *want,
                         size_t n)
{
    ts_test_expect_close_dev(G, slot, what, d, want, n, TOL, 0.1);
}

static void test_table(void)
{
    CHECKF(G->residual_layernorm_forward != NULL,
           "ts_kernels_cuda lacks residual_layernorm_forward");
    CHECKF(G->adamw_update_spans != NULL, "ts_kernels_cuda lacks adamw_update_spans");
    CHECKF(ts_kernels_cuda_bf16.residual_layernorm_forward != G->residual_layernorm_forward,
           "ts_kernels_cuda_bf16 runs the fp32 residual_layernorm_forward");
    CHECKF(G->residual_rmsnorm_forward != NULL, "ts_kernels_cuda lacks residual_rmsnorm_forward");
    CHECKF(ts_kernels_cuda_bf16.residual_rmsnorm_forward != G->residual_rmsnorm_forward,
           "ts_kernels_cuda_bf16 runs the fp32 residual_rmsnorm_forward");
}

static void test_residual_layernorm(int N, int C)
{
    const size_t NC = (size_t)N * C;
    float *a = ts_test_rand_floats(NC, 2.0f), *b = ts_test_rand_floats(NC, 1.0f);
    float *w = ts_test_rand_floats((size_t)C, 1.0f);
    float *bias = ts_test_rand_floats((size_t)C, 1.0f);
    float *res = ts_alloc_floats(NC), *ln = ts_alloc_floats(NC);
    float *mean = ts_alloc_floats((size_t)N), *rstd = ts_alloc_floats((size_t)N);
    H->residual_layernorm_forward(res, ln, mean, rstd, a, b, w, bias, N, C);
    char slot[64];
    snprintf(slot, sizeof slot, "residual_layernorm N%d C%d", N, C);

    float *dw = ts_test_to_dev(G, w, (size_t)C), *dbias = ts_test_to_dev(G, bias, (size_t)C);
    /* this backend's unfused pair, for the bitwise comparison */
    float *ua = ts_test_to_dev(G, a, NC), *ub = ts_test_to_dev(G, b, NC);
    float *ures = ts_test_dev_nan(G, NC), *uln = ts_test_dev_nan(G, NC);
    float *umean = ts_test_dev_nan(G, (size_t)N), *urstd = ts_test_dev_nan(G, (size_t)N);
    G->residual_forward(ures, ua, ub, NC);
    G->layernorm_forward(uln, umean, urstd, ures, dw, dbias, N, C);
    float *uln_h = ts_test_from_dev(G, uln, NC);
    float *umean_h = ts_test_from_dev(G, umean, (size_t)N);
    float *urstd_h = ts_test_from_dev(G, urstd, (size_t)N);

    for (int alias = 0; alias < 3; alias++) { /* res_out: its own buffer, a, b */
        float *da = ts_test_to_dev(G, a, NC), *db = ts_test_to_dev(G, b, NC);
        float *dres = alias == 1 ? da : alias == 2 ? db : ts_test_dev_nan(G, NC);
        float *dln = ts_test_dev_nan(G, NC), *dmean = ts_test_dev_nan(G, (size_t)N);
        float *drstd = ts_test_dev_nan(G, (size_t)N);
        G->residual_layernorm_forward(dres, dln, dmean, drstd, da, db, dw, dbias, N, C);
        if (alias == 0) {
            expect_close(slot, "res_out", dres, res, NC);
            expect_close(slot, "ln_out", dln, ln, NC);
            expect_close(slot, "mean", dmean, mean, (size_t)N);
            expect_close(slot, "rstd", drstd, rstd, (size_t)N);
        }
        CHECKF(ts_test_dev_same_bits(G, dres, res, NC),
               "%s: res_out (alias %d) is not a + b exactly", slot, alias);
        CHECKF(ts_test_dev_same_bits(G, dln, uln_h, NC) &&
                   ts_test_dev_same_bits(G, dmean, umean_h, (size_t)N) &&
                   ts_test_dev_same_bits(G, drstd, urstd_h, (size_t)N),
               "%s (alias %d): differs from this backend's residual_forward + layernorm_forward",
               slot, alias);
        if (alias == 0) G->dev_free(dres);
        G->dev_free(da), G->dev_free(db), G->dev_free(dln), G->dev_free(dmean),
            G->dev_free(drstd);
    }
    G->dev_free(dw), G->dev_free(dbias), G->dev_free(ua), G->dev_free(ub), G->dev_free(ures);
    G->dev_free(uln), G->dev_free(umean), G->dev_free(urstd);
    free(uln_h), free(umean_h), free(urstd_h);
    free(a), free(b), free(w), free(bias), free(res), free(ln), free(mean), free(rstd);
}

/* The bf16 table's fused kernel: its unfused pair's bits (res_out its own buffer, or a
 * or b), and the fp32 table's results to bf16 rounding (ln_out, res_out) or to fp32
 * rounding (mean, rstd: the same fp32 arithmetic, but on the rounded sum). */
static void test_residual_layernorm_bf16(int N, int C)
{
    const ts_kernels *Q = &ts_kernels_cuda_bf16;
    const size_t NC = (size_t)N * C, bytes = NC * sizeof(uint16_t);
    float *a = ts_test_rand_floats(NC, 2.0f), *b = ts_test_rand_floats(NC, 1.0f);
    ts_bf16_round_all(a, NC), ts_bf16_round_all(b, NC);
    float *w = ts_test_rand_floats((size_t)C, 1.0f), *bias = ts_test_rand_floats((size_t)C, 1.0f);
    float *dw = ts_test_to_dev(G, w, (size_t)C), *dbias = ts_test_to_dev(G, bias, (size_t)C);
    char slot[64];
    snprintf(slot, sizeof slot, "bf16 residual_layernorm N%d C%d", N, C);

    /* the fp32 table on the same values */
    float *fa = ts_test_to_dev(G, a, NC), *fb = ts_test_to_dev(G, b, NC);
    float *fres = ts_test_dev_nan(G, NC), *fln = ts_test_dev_nan(G, NC);
    float *fmean = ts_test_dev_nan(G, (size_t)N), *frstd = ts_test_dev_nan(G, (size_t)N);
    G->residual_layernorm_forward(fres, fln, fmean, frstd, fa, fb, dw, dbias, N, C);
    float *res_h = ts_test_from_dev(G, fres, NC), *ln_h = ts_test_from_dev(G, fln, NC);
    float *mean_h = ts_test_from_dev(G, fmean, (size_t)N);
    float *rstd_h = ts_test_from_dev(G, frstd, (size_t)N);

    /* the bf16 table's unfused pair */
    void *ua = ts_bf16_to_dev(Q, a, NC), *ub = ts_bf16_to_dev(Q, b, NC);
    void *ures = ts_gpu_dev_poison(Q, bytes), *uln = ts_gpu_dev_poison(Q, bytes);
    float *umean = ts_test_dev_nan(Q, (size_t)N), *urstd = ts_test_dev_nan(Q, (size_t)N);
    Q->residual_forward(ures, ua, ub, NC);
    Q->layernorm_forward(uln, umean, urstd, ures, dw, dbias, N, C);

    for (int alias = 0; alias < 3; alias++) { /* res_out: its own buffer, a, b */
        void *da = ts_bf16_to_dev(Q, a, NC), *db = ts_bf16_to_dev(Q, b, NC);
        void *dres = alias == 1 ? da : alias == 2 ? db : ts_gpu_dev_poison(Q, bytes);
        void *dln = ts_gpu_dev_poison(Q, bytes);
        float *dmean = ts_test_dev_nan(Q, (size_t)N), *drstd = ts_test_dev_nan(Q, (size_t)N);
        Q->residual_layernorm_forward(dres, dln, dmean, drstd, da, db, dw, dbias, N, C);
        if (alias == 0) {
            ts_bf16_expect_close(Q, slot, "res_out", dres, res_h, NC, 1e-2, 0.1);
            ts_bf16_expect_close(Q, slot, "ln_out", dln, ln_h, NC, 2e-2, 0.1);
            float *m = ts_test_from_dev(Q, dmean, (size_t)N);
            float *r = ts_test_from_dev(Q, drstd, (size_t)N);
            /* the rounded sum moves the statistics by about bf16's 2^-9 */
            ts_test_expect_close(slot, "mean", Q->name, m, mean_h, (size_t)N, 1e-2, 0.1);
            ts_test_expect_close(slot, "rstd", Q->name, r, rstd_h, (size_t)N, 1e-2, 0.1);
            free(m), free(r);
        }
        CHECKF(ts_gpu_dev_same_bytes(Q, dres, ures, bytes) &&
                   ts_gpu_dev_same_bytes(Q, dln, uln, bytes) &&
                   ts_gpu_dev_same_bytes(Q, dmean, umean, (size_t)N * sizeof(float)) &&
                   ts_gpu_dev_same_bytes(Q, drstd, urstd, (size_t)N * sizeof(float)),
               "%s (alias %d): differs from the bf16 residual_forward + layernorm_forward", slot,
               alias);
        if (alias == 0) Q->dev_free(dres);
        Q->dev_free(da), Q->dev_free(db), Q->dev_free(dln), Q->dev_free(dmean), Q->dev_free(drstd);
    }
    G->dev_free(fa), G->dev_free(fb), G->dev_free(fres), G->dev_free(fln), G->dev_free(fmean);
    G->dev_free(frstd), G->dev_free(dw), G->dev_free(dbias);
    Q->dev_free(ua), Q->dev_free(ub), Q->dev_free(ures), Q->dev_free(uln), Q->dev_free(umean);
    Q->dev_free(urstd);
    free(a), free(b), free(w), free(bias), free(res_h), free(ln_h), free(mean_h), free(rstd_h);
}

/* residual_rmsnorm_forward against the CPU (res_out its own buffer), and bit for bit
 * against this backend's residual_forward + rmsnorm_forward with res_out its own buffer,
 * a, or b. */
static void test_residual_rmsnorm(int N, int C, float eps)
{
    const size_t NC = (size_t)N * C;
    float *a = ts_test_rand_floats(NC, 2.0f), *b = ts_test_rand_floats(NC, 1.0f);
    float *w = ts_test_rand_floats((size_t)C, 1.0f);
    float *res = ts_alloc_floats(NC), *nrm = ts_alloc_floats(NC);
    float *rstd = ts_alloc_floats((size_t)N);
    H->residual_rmsnorm_forward(res, nrm, rstd, a, b, w, N, C, eps);
    char slot[64];
    snprintf(slot, sizeof slot, "residual_rmsnorm N%d C%d", N, C);

    float *dw = ts_test_to_dev(G, w, (size_t)C);
    float *ua = ts_test_to_dev(G, a, NC), *ub = ts_test_to_dev(G, b, NC);
    float *ures = ts_test_dev_nan(G, NC), *unrm = ts_test_dev_nan(G, NC);
    float *urstd = ts_test_dev_nan(G, (size_t)N);
    G->residual_forward(ures, ua, ub, NC);
    G->rmsnorm_forward(unrm, urstd, ures, dw, N, C, eps);
    float *ures_h = ts_test_from_dev(G, ures, NC), *unrm_h = ts_test_from_dev(G, unrm, NC);
    float *urstd_h = ts_test_from_dev(G, urstd, (size_t)N);

    for (int alias = 0; alias < 3; alias++) { /* res_out: its own buffer, a, b */
        float *da = ts_test_to_dev(G, a, NC), *db = ts_test_to_dev(G, b, NC);
        float *dres = alias == 1 ? da : alias == 2 ? db : ts_test_dev_nan(G, NC);
        float *dnrm = ts_test_dev_nan(G, NC), *drstd = ts_test_dev_nan(G, (size_t)N);
        G->residual_rmsnorm_forward(dres, dnrm, drstd, da, db, dw, N, C, eps);
        if (alias == 0) {
            expect_close(slot, "res_out", dres, res, NC);
            expect_close(slot, "norm_out", dnrm, nrm, NC);
            expect_close(slot, "rstd", drstd, rstd, (size_t)N);
        }
        CHECKF(ts_test_dev_same_bits(G, dres, ures_h, NC) &&
                   ts_test_dev_same_bits(G, dnrm, unrm_h, NC) &&
                   ts_test_dev_same_bits(G, drstd, urstd_h, (size_t)N),
               "%s (alias %d): differs from this backend's residual_forward + rmsnorm_forward",
               slot, alias);
        if (alias == 0) G->dev_free(dres);
        G->dev_free(da), G->dev_free(db), G->dev_free(dnrm), G->dev_free(drstd);
    }
    G->dev_free(dw), G->dev_free(ua), G->dev_free(ub), G->dev_free(ures), G->dev_free(unrm);
    G->dev_free(urstd);
    free(ures_h), free(unrm_h), free(urstd_h);
    free(a), free(b), free(w), free(res), free(nrm), free(rstd);
}

/* The bf16 table's residual_rmsnorm_forward: its unfused pair's bits (res_out its own
 * buffer, a or b), and the fp32 table's results to bf16 rounding. */
static void test_residual_rmsnorm_bf16(int N, int C, float eps)
{
    const ts_kernels *Q = &ts_kernels_cuda_bf16;
    const size_t NC = (size_t)N * C, bytes = NC * sizeof(uint16_t);
    float *a = ts_test_rand_floats(NC, 2.0f), *b = ts_test_rand_floats(NC, 1.0f);
    ts_bf16_round_all(a, NC), ts_bf16_round_all(b, NC);
    float *w = ts_test_rand_floats((size_t)C, 1.0f);
    float *dw = ts_test_to_dev(G, w, (size_t)C);
    char slot[64];
    snprintf(slot, sizeof slot, "bf16 residual_rmsnorm N%d C%d", N, C);

    /* the fp32 table on the same values */
    float *fa = ts_test_to_dev(G, a, NC), *fb = ts_test_to_dev(G, b, NC);
    float *fres = ts_test_dev_nan(G, NC), *fnrm = ts_test_dev_nan(G, NC);
    float *frstd = ts_test_dev_nan(G, (size_t)N);
    G->residual_rmsnorm_forward(fres, fnrm, frstd, fa, fb, dw, N, C, eps);
    float *res_h = ts_test_from_dev(G, fres, NC), *nrm_h = ts_test_from_dev(G, fnrm, NC);
    float *rstd_h = ts_test_from_dev(G, frstd, (size_t)N);

    /* the bf16 table's unfused pair */
    void *ua = ts_bf16_to_dev(Q, a, NC), *ub = ts_bf16_to_dev(Q, b, NC);
    void *ures = ts_gpu_dev_poison(Q, bytes), *unrm = ts_gpu_dev_poison(Q, bytes);
    float *urstd = ts_test_dev_nan(Q, (size_t)N);
    Q->residual_forward(ures, ua, ub, NC);
    Q->rmsnorm_forward(unrm, urstd, ures, dw, N, C, eps);

    for (int alias = 0; alias < 3; alias++) { /* res_out: its own buffer, a, b */
        void *da = ts_bf16_to_dev(Q, a, NC), *db = ts_bf16_to_dev(Q, b, NC);
        void *dres = alias == 1 ? da : alias == 2 ? db : ts_gpu_dev_poison(Q, bytes);
        void *dnrm = ts_gpu_dev_poison(Q, bytes);
        float *drstd = ts_test_dev_nan(Q, (size_t)N);
        Q->residual_rmsnorm_forward(dres, dnrm, drstd, da, db, dw, N, C, eps);
        if (alias == 0) {
            ts_bf16_expect_close(Q, slot, "res_out", dres, res_h, NC, 1e-2, 0.1);
            ts_bf16_expect_close(Q, slot, "norm_out", dnrm, nrm_h, NC, 2e-2, 0.1);
            float *r = ts_test_from_dev(Q, drstd, (size_t)N);
            ts_test_expect_close(slot, "rstd", Q->name, r, rstd_h, (size_t)N, 1e-2, 0.1);
            free(r);
        }
        CHECKF(ts_gpu_dev_same_bytes(Q, dres, ures, bytes) &&
                   ts_gpu_dev_same_bytes(Q, dnrm, unrm, bytes) &&
                   ts_gpu_dev_same_bytes(Q, drstd, urstd, (size_t)N * sizeof(float)),
               "%s (alias %d): differs from the bf16 residual_forward + rmsnorm_forward", slot,
               alias);
        if (alias == 0) Q->dev_free(dres);
        Q->dev_free(da), Q->dev_free(db), Q->dev_free(dnrm), Q->dev_free(drstd);
    }
    G->dev_free(fa), G->dev_free(fb), G->dev_free(fres), G->dev_free(fnrm), G->dev_free(frstd);
    G->dev_free(dw);
    Q->dev_free(ua), Q->dev_free(ub), Q->dev_free(ures), Q->dev_free(unrm), Q->dev_free(urstd);
    free(a), free(b), free(w), free(res_h), free(nrm_h), free(rstd_h);
}

/* Spans of every size class, with gaps, run 4 steps on both backends; then the same on
 * the device again, for bitwise repeatability. */
static void test_adamw_spans(void)
{
    enum { S = 8 };
    const size_t counts[S] = {1, 255, 256, 1000, 70001, 3, 1u << 21, 517};
    const int decays[S] = {1, 0, 1, 1, 0, 1, 1, 0};
    ts_adamw_span spans[S];
    size_t off = 7, moff = 0;
    for (int i = 0; i < S; i++) {
        spans[i] = (ts_adamw_span){.offset = off, .grad_offset = off, .moment_offset = moff,
                                   .count = counts[i], .decay = decays[i]};
        off += counts[i] + (size_t)(i % 3) * 9; /* gaps of 0, 9, 18 floats */
        moff += counts[i];
    }
    const size_t np = off + 5, nm = moff;
    const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    float *p0 = ts_test_rand_floats(np, 1.0f), *g[4];
    for (int t = 0; t < 4; t++) g[t] = ts_test_rand_floats(np, 1.0f);
    float *hp = ts_alloc_floats(np), *hm = ts_alloc_floats(nm), *hv = ts_alloc_floats(nm);
    memcpy(hp, p0, np * sizeof(float));
    for (int t = 1; t <= 4; t++)
        H->adamw_update_spans(hp, g[t - 1], t > 2 ? 0.37f : 1.0f, hm, hv, spans, S, lr, b1, b2,
                              eps, wd, t);

    ts_adamw_span *dspans = G->dev_alloc(sizeof spans);
    G->memcpy_h2d(dspans, spans, sizeof spans);
    float *first = NULL;
    for (int run = 0; run < 2; run++) {
        float *dp = ts_test_to_dev(G, p0, np);
        float *dm = G->dev_alloc(nm * sizeof(float)), *dv = G->dev_alloc(nm * sizeof(float));
        for (int t = 1; t <= 4; t++) {
            float *dg = ts_test_to_dev(G, g[t - 1], np);
            G->adamw_update_spans(dp, dg, t > 2 ? 0.37f : 1.0f, dm, dv, dspans, S, lr, b1, b2,
                                  eps, wd, t);
            G->adamw_update_spans(dp, dg, 1.0f, dm, dv, dspans, 0, lr, b1, b2, eps, wd, t);
            CHECKF(ts_test_dev_same_bits(G, dg, g[t - 1], np), "adamw_update_spans changed grad");
            G->dev_free(dg);
        }
        if (run == 0) {
            expect_close("adamw_update_spans", "param", dp, hp, np);
            expect_close("adamw_update_spans", "m", dm, hm, nm);
            expect_close("adamw_update_spans", "v", dv, hv, nm);
            /* the floats outside every span are the initial ones, bit for bit */
            float *got = ts_test_from_dev(G, dp, np);
            size_t at = 0, bad = 0;
            for (int i = 0; i < S; i++) {
                for (; at < spans[i].offset; at++) bad += memcmp(&got[at], &p0[at], 4) != 0;
                at = spans[i].offset + spans[i].count;
            }
            for (; at < np; at++) bad += memcmp(&got[at], &p0[at], 4) != 0;
            CHECKF(bad == 0, "adamw_update_spans wrote %zu floats outside its spans", bad);
            first = got;
        } else {
            CHECKF(ts_test_dev_same_bits(G, dp, first, np), "adamw_update_spans: reruns differ");
        }
        G->dev_free(dp), G->dev_free(dm), G->dev_free(dv);
    }
    G->dev_free(dspans);
    for (int t = 0; t < 4; t++) free(g[t]);
    free(first), free(p0), free(hp), free(hm), free(hv);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    test_table(); /* needs no device */
    int devices = ts_cuda_device_count();
    if (devices == 0) {
        printf("test_cuda_fused: no CUDA device here (ts_cuda_device_count() == 0): skipped\n");
        return ts_test_failed ? ts_test_report() : 77;
    }
    ts_cuda_select_device(0);
    printf("test_cuda_fused: %d CUDA device(s); cuda vs cpu, relative tolerance %.0e\n", devices,
           TOL);
    if (ts_test_failed) return ts_test_report(); /* the slots are not in the table */
    test_residual_layernorm(10, 8);
    test_residual_layernorm(67, 771);
    test_residual_layernorm(3, 1031);
    test_residual_layernorm(256, 768);
    test_residual_layernorm_bf16(10, 8);
    test_residual_layernorm_bf16(67, 771);
    test_residual_layernorm_bf16(256, 768);
    test_residual_rmsnorm(10, 8, 1e-5f);
    test_residual_rmsnorm(67, 771, 1e-6f);
    test_residual_rmsnorm(3, 1031, 1e-5f);
    test_residual_rmsnorm(256, 4096, 1e-5f);
    test_residual_rmsnorm_bf16(10, 8, 1e-5f);
    test_residual_rmsnorm_bf16(67, 771, 1e-6f);
    test_residual_rmsnorm_bf16(256, 4096, 1e-5f);
    test_adamw_spans();
    return ts_test_report();
}
