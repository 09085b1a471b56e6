/* The CUDA attention variants (kernels/cuda/attention.cu, attention_flash.cu) against the
 * CPU backend's attention, each called directly: the batched-GEMM and the flash-style
 * attention, each on fp32 and on bf16 activations, and the four tables' slots
 * (train.attention = "gemm" | "flash" in fp32 and bf16), multi-head (NKV = NH) and
 * grouped-query (NKV < NH key/value heads, down to one), on random inputs rounded to
 * bf16 (so the bf16 variants start from exactly the reference's values), with every
 * device output, saved state and workspace first poisoned (all bytes 0xff: NaN in
 * either type), so a value a kernel fails to write, or reads before writing, shows.
 * Also the general heads (q/k of HS, v of HSV, any scale: MLA's). fp32 variants within
 * a relative 1e-5 of the CPU, bf16 ones within 5e-2 (their scores, probabilities, dS and
 * outputs are rounded to bf16); as in test_cuda_kernels, the floor
 * of the relative error is a tenth of the largest |value| of that output. Every
 * variant's backward must repeat bit for bit.
 *
 * Packed documents (ts_att_heads.doc_start): every variant and the tables' prefix
 * slots against a per-document causal attention in plain C (test_documents).
 *
 * Without a GPU (exit 77, skipped) it still checks what needs none: the sizes each
 * variant asks for, the document reference against the CPU table, and that
 * ts_kernels_for(device, precision, attention) gives the table whose slots run that
 * variant (a wrong train.attention is the config's error: test_config). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cuda/attention_flash.h"
#include "kernels/kernels.h"
#include "test_device_util.h"
#include "test_gpu_bf16.h"

static const ts_kernels *G = &ts_kernels_cuda; /* device memory and the table's slots */
static const ts_kernels *H = &ts_kernels_cpu;  /* the reference, on host memory */

typedef size_t (*size_fn)(int B, int T, ts_att_heads h);
typedef void (*fwd_fn)(void *out, void *att, const void *qkv, int B, int T, ts_att_heads h);
typedef void (*bwd_fn)(void *dqkv, void *scratch, const void *dout, const void *qkv,
                       const void *att, int B, int T, ts_att_heads h);

typedef struct {
    const char *name;
    size_fn saved, scratch; /* bytes */
    fwd_fn forward;
    bwd_fn backward;
    double tol;
    int max_hs;   /* the largest head the variant takes */
    ts_dtype act; /* its activations' type */
} variant;

/* Host values x[0..n) in device memory of type t. */
static void *to_dev_as(ts_dtype t, const float *x, size_t n)
{
    return t == TS_DTYPE_BF16 ? ts_bf16_to_dev(G, x, n) : (void *)ts_test_to_dev(G, x, n);
}

/* The device result `d` (type t) against the CPU's `want`. */
static void expect_close(const char *who, const char *what, ts_dtype t, const void *d,
                         const float *want, size_t n, double tol)
{
    float *got = t == TS_DTYPE_BF16 ? ts_bf16_from_dev(G, d, n) : ts_test_from_dev(G, d, n);
    ts_test_expect_close(who, what, G->name, got, want, n, tol, 0.1);
    free(got);
}

/* ---- one shape, every variant ------------------------------------------------------ */

static void test_heads(const variant *vs, int nv, int B, int T, ts_att_heads h)
{
    const int NH = h.NH, NKV = h.NKV, HS = h.HS;
    const size_t nqkv = (size_t)B * T * ts_att_qkv_width(h);
    const size_t nout = (size_t)B * T * ts_att_out_width(h);
    float *qkv = ts_alloc_floats(nqkv), *dout = ts_alloc_floats(nout);
    for (size_t i = 0; i < nqkv; i++) qkv[i] = ts_bf16_round(ts_test_frand());
    for (size_t i = 0; i < nout; i++) dout[i] = ts_bf16_round(ts_test_frand());

    /* The CPU reference. */
    float *out = ts_alloc_floats(nout), *dqkv = ts_alloc_floats(nqkv);
    size_t hs = H->attention_saved_bytes(B, T, h) / sizeof(float) + 1;
    size_t hsc = H->attention_scratch_bytes(B, T, h) / sizeof(float) + 1;
    float *att = ts_alloc_floats(hs), *scr = ts_alloc_floats(hsc);
    H->attention_forward(out, att, qkv, B, T, h);
    H->attention_backward(dqkv, scr, dout, qkv, att, B, T, h);
    free(att), free(scr);

    for (int v = 0; v < nv; v++) {
        if (HS > vs[v].max_hs || h.HSV > vs[v].max_hs) continue;
        const ts_dtype t = vs[v].act;
        const size_t eb = ts_dtype_bytes(t);
        char who[120];
        snprintf(who, sizeof who, "%s B%d T%d NH%d NKV%d HS%d HSV%d", vs[v].name, B, T, NH, NKV,
                 HS, h.HSV);
        void *d_qkv = to_dev_as(t, qkv, nqkv), *d_dout = to_dev_as(t, dout, nout);
        size_t ns = vs[v].saved(B, T, h), nsc = vs[v].scratch(B, T, h);
        void *d_out = ts_gpu_dev_poison(G, nout * eb), *d_att = ts_gpu_dev_poison(G, ns);
        void *d_scr = ts_gpu_dev_poison(G, nsc), *d_dqkv = ts_gpu_dev_poison(G, nqkv * eb);
        vs[v].forward(d_out, d_att, d_qkv, B, T, h);
        expect_close(who, "out", t, d_out, out, nout, vs[v].tol);
        vs[v].backward(d_dqkv, d_scr, d_dout, d_qkv, d_att, B, T, h);
        expect_close(who, "dqkv", t, d_dqkv, dqkv, nqkv, vs[v].tol);

        /* The same again on fresh poisoned buffers must give the same bits (no atomics,
         * no reads of what was not written). */
        void *d_dqkv2 = ts_gpu_dev_poison(G, nqkv * eb), *d_scr2 = ts_gpu_dev_poison(G, nsc);
        vs[v].backward(d_dqkv2, d_scr2, d_dout, d_qkv, d_att, B, T, h);
        CHECKF(ts_gpu_dev_same_bytes(G, d_dqkv, d_dqkv2, nqkv * eb),
               "%s: a second backward differs in its bits", who);
        G->dev_free(d_out), G->dev_free(d_att), G->dev_free(d_scr), G->dev_free(d_dqkv);
        G->dev_free(d_dqkv2), G->dev_free(d_scr2), G->dev_free(d_qkv), G->dev_free(d_dout);
    }
    free(qkv), free(dout), free(out), free(dqkv);
}

/* Grouped-query (and multi-head) attention's heads: HSV = HS, scale 1/sqrt(HS). */
static void test_shape(const variant *vs, int nv, int B, int T, int NH, int NKV, int HS)
{
    test_heads(vs, nv, B, T, ts_att_heads_gqa(NH, NKV, HS));
}

/* ---- packed documents (kernels.h ts_att_heads.doc_start) ----------------------------
 *
 * The reference is per-document causal attention in plain C (double sums): query i of
 * sequence b, at key position p = i + Tk - Tq, attends keys [ds[b Tq + i], p]. Before
 * any GPU case, the reference itself is checked against the CPU table (which knows no
 * documents in this test: it runs each document alone, B = 1 over the document's rows,
 * and, with every start 0, the whole causal window), so a GPU failure is the kernels'. */

/* One attention's host buffers: q rows of qkv [B, Tq, C3]; k, v rows of qkv (kv NULL,
 * Tq = Tk) or of kv [B, Tk, KVW]. */
typedef struct {
    int B, Tq, Tk;
    ts_att_heads h;
    const float *qkv, *kv, *dout;
    const int *ds; /* [B, Tq] */
} doc_case;

/* out [B, Tq, NH HSV]; dq into dqkv's q columns (the rest of dqkv: dK, dV when kv is
 * NULL, else untouched); dkv [B, Tk, KVW] += dK, dV when kv is given. */
static void doc_reference(const doc_case *c, float *out, float *dqkv, float *dkv, float *probs)
{
    const ts_att_heads h = c->h;
    const int NH = h.NH, NKV = h.NKV, HS = h.HS, HSV = h.HSV, G = NH / NKV;
    const int C3 = (int)ts_att_qkv_width(h), C = (int)ts_att_out_width(h);
    const int KVW = (int)ts_att_kv_width(h), Tq = c->Tq, Tk = c->Tk, off = Tk - Tq;
    const int ldkv = c->kv ? KVW : C3, kcol = c->kv ? 0 : NH * HS;
    const float *kvb = c->kv ? c->kv : c->qkv;
    float *dkvb = c->kv ? dkv : dqkv;
    double *p = malloc(sizeof(double) * (size_t)Tk), *dp = malloc(sizeof(double) * (size_t)Tk);
    double *dk = calloc((size_t)c->B * Tk * (NKV * (HS + HSV)), sizeof(double));
    for (int b = 0; b < c->B; b++)
        for (int hd = 0; hd < NH; hd++) {
            const int j = hd / G;
            for (int i = 0; i < Tq; i++) {
                const float *q = c->qkv + ((size_t)b * Tq + i) * C3 + (size_t)hd * HS;
                const float *g = c->dout + ((size_t)b * Tq + i) * C + (size_t)hd * HSV;
                const int lo = c->ds[(size_t)b * Tq + i], hi = i + off;
                double mx = -INFINITY, sum = 0.0, dot = 0.0;
#define K_AT(t) (kvb + ((size_t)b * Tk + (t)) * ldkv + kcol + (size_t)j * HS)
#define V_AT(t) (kvb + ((size_t)b * Tk + (t)) * ldkv + kcol + (size_t)NKV * HS + (size_t)j * HSV)
                for (int t = lo; t <= hi; t++) {
                    double s = 0.0;
                    for (int d = 0; d < HS; d++) s += (double)q[d] * K_AT(t)[d];
                    p[t] = s * h.scale;
                    if (p[t] > mx) mx = p[t];
                }
                for (int t = lo; t <= hi; t++) sum += (p[t] = exp(p[t] - mx));
                for (int t = lo; t <= hi; t++) p[t] /= sum;
                if (probs) {
                    float *row = probs + (((size_t)b * NH + hd) * Tq + i) * Tk;
                    for (int t = 0; t < Tk; t++) row[t] = t >= lo && t <= hi ? (float)p[t] : 0.0f;
                }
                float *o = out + ((size_t)b * Tq + i) * C + (size_t)hd * HSV;
                for (int d = 0; d < HSV; d++) {
                    double a = 0.0;
                    for (int t = lo; t <= hi; t++) a += p[t] * V_AT(t)[d];
                    o[d] = (float)a;
                }
                /* backward: dP = dO.v, dS = p (dP - sum p dP) */
                for (int t = lo; t <= hi; t++) {
                    double a = 0.0;
                    for (int d = 0; d < HSV; d++) a += (double)g[d] * V_AT(t)[d];
                    dp[t] = a;
                    dot += p[t] * a;
                }
                float *dq = dqkv + ((size_t)b * Tq + i) * C3 + (size_t)hd * HS;
                for (int d = 0; d < HS; d++) {
                    double a = 0.0;
                    for (int t = lo; t <= hi; t++) a += p[t] * (dp[t] - dot) * K_AT(t)[d];
                    dq[d] = (float)(a * h.scale);
                }
                for (int t = lo; t <= hi; t++) {
                    double *dkr = dk + ((size_t)b * Tk + t) * (NKV * (HS + HSV));
                    const double ds = p[t] * (dp[t] - dot);
                    for (int d = 0; d < HS; d++) dkr[(size_t)j * HS + d] += ds * h.scale * q[d];
                    for (int d = 0; d < HSV; d++)
                        dkr[(size_t)NKV * HS + (size_t)j * HSV + d] += p[t] * g[d];
                }
#undef K_AT
#undef V_AT
            }
        }
    /* dK, dV: written (square) or added (prefix) */
    for (int b = 0; b < c->B; b++)
        for (int t = 0; t < Tk; t++)
            for (int e = 0; e < NKV * (HS + HSV); e++) {
                float *x = dkvb + ((size_t)b * Tk + t) * ldkv + kcol + e;
                const double v = dk[((size_t)b * Tk + t) * (NKV * (HS + HSV)) + e];
                *x = c->kv ? (float)(*x + v) : (float)v;
            }
    free(p), free(dp), free(dk);
}

/* Document starts [B, T] for documents of the lengths lens[0..n) repeated from each
 * sequence's start, the pattern shifted by b (so sequences differ; b = B - 1 of an
 * odd B holds one document: all zeros). */
static int *doc_starts(int B, int T, const int *lens, int n)
{
    int *ds = malloc(sizeof(int) * (size_t)B * T);
    for (int b = 0; b < B; b++) {
        int start = 0, left = lens[b % n], k = b % n;
        for (int t = 0; t < T; t++) {
            if (B % 2 && b == B - 1) {
                ds[(size_t)b * T + t] = 0;
                continue;
            }
            if (left == 0) {
                start = t;
                k = (k + 1) % n;
                left = lens[k];
            }
            ds[(size_t)b * T + t] = start;
            left--;
        }
    }
    return ds;
}

/* The reference against the CPU table: with every start 0, the causal attention (square
 * and a prefix); with documents, each document alone (square). */
static void check_doc_reference(void)
{
    const int B = 3, T = 45, Tq = 15;
    ts_att_heads h = ts_att_heads_gqa(4, 2, 8);
    h.HSV = 6, h.scale = 0.4f;
    const size_t C3 = ts_att_qkv_width(h), C = ts_att_out_width(h), KVW = ts_att_kv_width(h);
    float *qkv = ts_alloc_floats((size_t)B * T * C3), *dout = ts_alloc_floats((size_t)B * T * C);
    float *kv = ts_alloc_floats((size_t)B * T * KVW);
    for (size_t i = 0; i < (size_t)B * T * C3; i++) qkv[i] = ts_test_frand();
    for (size_t i = 0; i < (size_t)B * T * C; i++) dout[i] = ts_test_frand();
    for (size_t i = 0; i < (size_t)B * T * KVW; i++) kv[i] = ts_test_frand();
    float *out = ts_alloc_floats((size_t)B * T * C), *dqkv = ts_alloc_floats((size_t)B * T * C3);
    float *rout = ts_alloc_floats((size_t)B * T * C), *rdqkv = ts_alloc_floats((size_t)B * T * C3);
    float *att = ts_alloc_floats(H->attention_saved_bytes(B, T, h) / 4 + 1);
    float *scr = ts_alloc_floats(H->attention_scratch_bytes(B, T, h) / 4 + 1);
    int *zero = calloc((size_t)B * T, sizeof(int));
    /* causal, square */
    H->attention_forward(out, att, qkv, B, T, h);
    H->attention_backward(dqkv, scr, dout, qkv, att, B, T, h);
    doc_case c = {B, T, T, h, qkv, NULL, dout, zero};
    doc_reference(&c, rout, rdqkv, NULL, NULL);
    ts_test_expect_close("reference, causal", "out", "plain C", rout, out, (size_t)B * T * C,
                         1e-5, 0.1);
    ts_test_expect_close("reference, causal", "dqkv", "plain C", rdqkv, dqkv, (size_t)B * T * C3,
                         1e-5, 0.1);
    /* causal, a prefix: Tq queries at the last Tq of T keys */
    float *pout = ts_alloc_floats((size_t)B * Tq * C), *dkv = ts_alloc_floats((size_t)B * T * KVW);
    float *rdkv = ts_alloc_floats((size_t)B * T * KVW);
    float *patt = ts_alloc_floats(H->attention_prefix_saved_bytes(B, Tq, T, h) / 4 + 1);
    float *pscr = ts_alloc_floats(H->attention_prefix_scratch_bytes(B, Tq, T, h) / 4 + 1);
    for (size_t i = 0; i < (size_t)B * T * KVW; i++) dkv[i] = rdkv[i] = 0.5f * ts_test_frand();
    H->attention_prefix_forward(pout, patt, qkv, kv, B, Tq, T, h);
    H->attention_prefix_backward(dqkv, dkv, pscr, dout, qkv, kv, patt, B, Tq, T, h);
    doc_case cp = {B, Tq, T, h, qkv, kv, dout, zero};
    doc_reference(&cp, rout, rdqkv, rdkv, NULL);
    ts_test_expect_close("reference, causal prefix", "out", "plain C", rout, pout,
                         (size_t)B * Tq * C, 1e-5, 0.1);
    ts_test_expect_close("reference, causal prefix", "dkv", "plain C", rdkv, dkv,
                         (size_t)B * T * KVW, 1e-5, 0.1);
    /* documents, square: each document alone through the CPU table */
    static const int lens[] = {1, 9, 17, 3};
    int *ds = doc_starts(B, T, lens, 4);
    c.ds = ds;
    doc_reference(&c, rout, rdqkv, NULL, NULL);
    for (int b = 0; b < B; b++)
        for (int s = 0, e; s < T; s = e) {
            for (e = s + 1; e < T && ds[(size_t)b * T + e] == s; e++) continue;
            const int n = e - s;
            const float *sq = qkv + ((size_t)b * T + s) * C3, *sg = dout + ((size_t)b * T + s) * C;
            H->attention_forward(out + ((size_t)b * T + s) * C, att, sq, 1, n, h);
            H->attention_backward(dqkv + ((size_t)b * T + s) * C3, scr, sg, sq, att, 1, n, h);
        }
    ts_test_expect_close("reference, documents", "out", "plain C", rout, out, (size_t)B * T * C,
                         1e-5, 0.1);
    ts_test_expect_close("reference, documents", "dqkv", "plain C", rdqkv, dqkv,
                         (size_t)B * T * C3, 1e-5, 0.1);
    free(ds), free(zero), free(qkv), free(dout), free(kv), free(out), free(dqkv), free(rout);
    free(rdqkv), free(att), free(scr), free(pout), free(dkv), free(rdkv), free(patt), free(pscr);
}

/* doc_start [n] ints in device memory. */
static int *ds_to_dev(const int *ds, size_t n)
{
    int *d = G->dev_alloc(n * sizeof(int));
    G->memcpy_h2d(d, ds, n * sizeof(int));
    return d;
}

/* Every square variant with documents of the lengths lens[0..n) against the reference:
 * out, dqkv, the batched-GEMM variants' saved probabilities (exact zeros where masked),
 * and a second backward's bits. */
static void test_docs_square(const variant *vs, int nv, int B, int T, ts_att_heads h,
                             const int *lens, int n)
{
    const size_t nqkv = (size_t)B * T * ts_att_qkv_width(h);
    const size_t nout = (size_t)B * T * ts_att_out_width(h), np = (size_t)B * h.NH * T * T;
    float *qkv = ts_alloc_floats(nqkv), *dout = ts_alloc_floats(nout);
    for (size_t i = 0; i < nqkv; i++) qkv[i] = ts_bf16_round(ts_test_frand());
    for (size_t i = 0; i < nout; i++) dout[i] = ts_bf16_round(ts_test_frand());
    int *ds = doc_starts(B, T, lens, n);
    float *out = ts_alloc_floats(nout), *dqkv = ts_alloc_floats(nqkv), *probs = ts_alloc_floats(np);
    doc_case c = {B, T, T, h, qkv, NULL, dout, ds};
    doc_reference(&c, out, dqkv, NULL, probs);
    int *d_ds = ds_to_dev(ds, (size_t)B * T);
    ts_att_heads hd = h;
    hd.doc_start = d_ds;
    for (int v = 0; v < nv; v++) {
        if (h.HS > vs[v].max_hs || h.HSV > vs[v].max_hs) continue;
        const ts_dtype t = vs[v].act;
        const size_t eb = ts_dtype_bytes(t);
        char who[160];
        snprintf(who, sizeof who, "%s documents %d.. B%d T%d NH%d NKV%d HS%d HSV%d", vs[v].name,
                 lens[0], B, T, h.NH, h.NKV, h.HS, h.HSV);
        void *d_qkv = to_dev_as(t, qkv, nqkv), *d_dout = to_dev_as(t, dout, nout);
        size_t ns = vs[v].saved(B, T, hd), nsc = vs[v].scratch(B, T, hd);
        void *d_out = ts_gpu_dev_poison(G, nout * eb), *d_att = ts_gpu_dev_poison(G, ns);
        void *d_scr = ts_gpu_dev_poison(G, nsc), *d_dqkv = ts_gpu_dev_poison(G, nqkv * eb);
        vs[v].forward(d_out, d_att, d_qkv, B, T, hd);
        expect_close(who, "out", t, d_out, out, nout, vs[v].tol);
        if (!strncmp(vs[v].name, "gemm", 4)) { /* the probabilities [B, NH, T, T] */
            float *got = t == TS_DTYPE_BF16 ? ts_bf16_from_dev(G, d_att, np)
                                            : ts_test_from_dev(G, d_att, np);
            size_t bad = 0;
            for (size_t i = 0; i < np; i++)
                if (probs[i] == 0.0f && (got[i] != 0.0f || signbit(got[i]))) bad++;
            CHECKF(bad == 0, "%s: %zu masked probabilities are not exactly +0", who, bad);
            ts_test_expect_close(who, "probabilities", G->name, got, probs, np, vs[v].tol, 0.1);
            free(got);
        }
        vs[v].backward(d_dqkv, d_scr, d_dout, d_qkv, d_att, B, T, hd);
        expect_close(who, "dqkv", t, d_dqkv, dqkv, nqkv, vs[v].tol);
        void *d_dqkv2 = ts_gpu_dev_poison(G, nqkv * eb), *d_scr2 = ts_gpu_dev_poison(G, nsc);
        vs[v].backward(d_dqkv2, d_scr2, d_dout, d_qkv, d_att, B, T, hd);
        CHECKF(ts_gpu_dev_same_bytes(G, d_dqkv, d_dqkv2, nqkv * eb),
               "%s: a second backward differs in its bits", who);
        G->dev_free(d_out), G->dev_free(d_att), G->dev_free(d_scr), G->dev_free(d_dqkv);
        G->dev_free(d_dqkv2), G->dev_free(d_scr2), G->dev_free(d_qkv), G->dev_free(d_dout);
    }
    G->dev_free(d_ds);
    free(qkv), free(dout), free(ds), free(out), free(dqkv), free(probs);
}

/* Context parallelism's prefix attention with documents, through a table (fp32 or
 * bf16): Tq queries at the last Tq of Tk positions of windows in documents of lens (a
 * chunk cutting through documents); doc_start [B, Tq] in key coordinates. dqkv's q
 * columns against the reference (its k, v columns must stay as they were: poisoned),
 * dkv accumulated onto random values. */
static void test_docs_prefix(const ts_kernels *k, double tol, int B, int Tq, int Tk,
                             ts_att_heads h, const int *lens, int n)
{
    const ts_dtype t = k->act_dtype;
    const size_t eb = ts_dtype_bytes(t), C3 = ts_att_qkv_width(h), KVW = ts_att_kv_width(h);
    const size_t nqkv = (size_t)B * Tq * C3, nout = (size_t)B * Tq * ts_att_out_width(h);
    const size_t nkv = (size_t)B * Tk * KVW, QW = (size_t)h.NH * h.HS;
    float *qkv = ts_alloc_floats(nqkv), *dout = ts_alloc_floats(nout), *kv = ts_alloc_floats(nkv);
    float *dkv0 = ts_alloc_floats(nkv), *dkv = ts_alloc_floats(nkv);
    for (size_t i = 0; i < nqkv; i++) qkv[i] = ts_bf16_round(ts_test_frand());
    for (size_t i = 0; i < nout; i++) dout[i] = ts_bf16_round(ts_test_frand());
    for (size_t i = 0; i < nkv; i++) kv[i] = ts_bf16_round(ts_test_frand());
    for (size_t i = 0; i < nkv; i++) dkv[i] = dkv0[i] = ts_bf16_round(0.5f * ts_test_frand());
    int *full = doc_starts(B, Tk, lens, n), *ds = malloc(sizeof(int) * (size_t)B * Tq);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < Tq; i++) ds[(size_t)b * Tq + i] = full[(size_t)b * Tk + i + Tk - Tq];
    float *out = ts_alloc_floats(nout), *dqkv = ts_alloc_floats(nqkv);
    doc_case c = {B, Tq, Tk, h, qkv, kv, dout, ds};
    doc_reference(&c, out, dqkv, dkv, NULL);
    int *d_ds = ds_to_dev(ds, (size_t)B * Tq);
    ts_att_heads hd = h;
    hd.doc_start = d_ds;
    char who[160];
    snprintf(who, sizeof who, "%s prefix documents %d.. B%d Tq%d Tk%d NH%d NKV%d HS%d HSV%d",
             k->name, lens[0], B, Tq, Tk, h.NH, h.NKV, h.HS, h.HSV);
    void *d_qkv = to_dev_as(t, qkv, nqkv), *d_dout = to_dev_as(t, dout, nout);
    void *d_kv = to_dev_as(t, kv, nkv), *d_dkv = to_dev_as(t, dkv0, nkv);
    size_t ns = k->attention_prefix_saved_bytes(B, Tq, Tk, hd);
    size_t nsc = k->attention_prefix_scratch_bytes(B, Tq, Tk, hd);
    void *d_out = ts_gpu_dev_poison(G, nout * eb), *d_att = ts_gpu_dev_poison(G, ns);
    void *d_scr = ts_gpu_dev_poison(G, nsc), *d_dqkv = ts_gpu_dev_poison(G, nqkv * eb);
    k->attention_prefix_forward(d_out, d_att, d_qkv, d_kv, B, Tq, Tk, hd);
    expect_close(who, "out", t, d_out, out, nout, tol);
    k->attention_prefix_backward(d_dqkv, d_dkv, d_scr, d_dout, d_qkv, d_kv, d_att, B, Tq, Tk, hd);
    float *got = t == TS_DTYPE_BF16 ? ts_bf16_from_dev(G, d_dqkv, nqkv)
                                    : ts_test_from_dev(G, d_dqkv, nqkv);
    /* the q columns, packed; the k, v columns still the poison (NaN) */
    const size_t nq = (size_t)B * Tq * QW;
    float *gq = ts_alloc_floats(nq), *wq = ts_alloc_floats(nq);
    size_t touched = 0;
    for (size_t r = 0; r < (size_t)B * Tq; r++) {
        memcpy(gq + r * QW, got + r * C3, QW * sizeof(float));
        memcpy(wq + r * QW, dqkv + r * C3, QW * sizeof(float));
        for (size_t e = QW; e < C3; e++) touched += !isnan(got[r * C3 + e]);
    }
    ts_test_expect_close(who, "dq", G->name, gq, wq, nq, tol, 0.1);
    CHECKF(touched == 0, "%s: %zu of dqkv's k, v elements written", who, touched);
    expect_close(who, "dkv", t, d_dkv, dkv, nkv, tol);
    free(got), free(gq), free(wq);
    G->dev_free(d_out), G->dev_free(d_att), G->dev_free(d_scr), G->dev_free(d_dqkv);
    G->dev_free(d_qkv), G->dev_free(d_dout), G->dev_free(d_kv), G->dev_free(d_dkv);
    G->dev_free(d_ds);
    free(qkv), free(dout), free(kv), free(dkv0), free(dkv), free(full), free(ds), free(out);
    free(dqkv);
}

/* The document cases: lengths shorter than a tile (1, 3, 5 tokens), boundaries inside
 * tiles of 32 and 16 (17, 37, 45), documents over several tiles (70, 100), a sequence
 * with one document (B odd: the last), every variant and precision; prefixes (cp's
 * chunks: the last Tq of Tk, and a middle-sized chunk) on the fp32 and bf16 tables. */
static void test_documents(const variant *vs, int nv)
{
    static const int mixed[] = {37, 1, 5, 70, 3, 17}, longd[] = {100, 45}, tiny[] = {1, 2, 3};
    static const int ones[] = {1}, tile[] = {32};
    test_docs_square(vs, nv, 3, 129, ts_att_heads_gqa(4, 4, 64), mixed, 6);
    test_docs_square(vs, nv, 2, 300, ts_att_heads_gqa(8, 2, 64), longd, 2);
    test_docs_square(vs, nv, 3, 64, ts_att_heads_gqa(3, 1, 8), tiny, 3);
    test_docs_square(vs, nv, 1, 40, ts_att_heads_gqa(2, 2, 16), ones, 1);
    test_docs_square(vs, nv, 2, 96, ts_att_heads_gqa(2, 1, 32), tile, 1);
    test_docs_square(vs, nv, 3, 97, ts_att_heads_gqa(2, 2, 160), mixed, 6); /* 16-wide tiles */
    ts_att_heads mla = ts_att_heads_gqa(4, 4, 24);
    mla.HSV = 16, mla.scale = 0.3f;
    test_docs_square(vs, nv, 2, 70, mla, longd, 2);
    const ts_kernels *tables[] = {&ts_kernels_cuda, &ts_kernels_cuda_bf16};
    const double tols[] = {1e-5, 5e-2};
    for (int k = 0; k < 2; k++) {
        test_docs_prefix(tables[k], tols[k], 1, 16, 48, ts_att_heads_gqa(4, 2, 16), mixed, 6);
        test_docs_prefix(tables[k], tols[k], 3, 40, 120, ts_att_heads_gqa(4, 4, 32), longd, 2);
        test_docs_prefix(tables[k], tols[k], 2, 33, 33, ts_att_heads_gqa(2, 1, 8), tiny, 3);
        test_docs_prefix(tables[k], tols[k], 2, 10, 40, mla, mixed, 6);
    }
}

/* ---- what needs no GPU ------------------------------------------------------------- */

static void test_sizes(void)
{
    const int B = 2, T = 129, NH = 3, HS = 100;
    const size_t rows = (size_t)B * NH * T, tt = rows * T;
    /* flash: one fp32 per row, in either precision */
    CHECK(ts_cuda_flash_attention_saved_bytes(B, T, ts_att_heads_gqa(NH, NH, HS)) == rows * 4);
    CHECK(ts_cuda_flash_attention_scratch_bytes(B, T, ts_att_heads_gqa(NH, NH, HS)) == rows * 4);
    CHECK(ts_cuda_flash_bf16_attention_saved_bytes(B, T, ts_att_heads_gqa(NH, NH, HS)) == rows * 4);
    CHECK(ts_cuda_flash_bf16_attention_scratch_bytes(B, T, ts_att_heads_gqa(NH, NH, HS)) ==
          rows * 4);
    /* batched GEMMs: the probabilities in the activation type; the scratch dS fp32, or
     * dP fp32 (to a 64-byte boundary) then dS bf16 */
    CHECK(ts_cuda_gemm_attention_saved_bytes(B, T, ts_att_heads_gqa(NH, NH, HS)) == tt * 4);
    CHECK(ts_cuda_gemm_attention_scratch_bytes(B, T, ts_att_heads_gqa(NH, NH, HS)) == tt * 4);
    CHECK(ts_cuda_gemm_bf16_attention_saved_bytes(B, T, ts_att_heads_gqa(NH, NH, HS)) == tt * 2);
    size_t c16 = ts_cuda_gemm_bf16_attention_scratch_bytes(B, T, ts_att_heads_gqa(NH, NH, HS));
    CHECKF(c16 >= tt * 6 && c16 < tt * 6 + 64, "bf16 scratch bytes %zu", c16);
    /* heads wider than T: dP's piece holds the fp32 dK, dV sums of grouped-query heads,
     * [B, T, 2 NKV HS] floats with 2 NKV <= NH, so B T NH HS floats */
    const int T2 = 4, HS2 = 64;
    const size_t tt2 = (size_t)B * NH * T2 * T2, acc2 = (size_t)B * T2 * NH * HS2;
    size_t c16w = ts_cuda_gemm_bf16_attention_scratch_bytes(B, T2, ts_att_heads_gqa(NH, NH, HS2));
    CHECKF(c16w >= acc2 * 4 + tt2 * 2 && c16w < acc2 * 4 + tt2 * 2 + 64,
           "bf16 scratch bytes %zu (T %d, HS %d)", c16w, T2, HS2);
    /* v heads wider than q/k, grouped: the accumulator [B, T, NKV (HS + HSV)] floats */
    ts_att_heads g = ts_att_heads_gqa(4, 2, 8);
    g.HSV = 24;
    const size_t acc3 = (size_t)B * T2 * 2 * (8 + 24), tt3 = (size_t)B * 4 * T2 * T2;
    size_t c16g = ts_cuda_gemm_bf16_attention_scratch_bytes(B, T2, g);
    CHECKF(c16g >= acc3 * 4 + tt3 * 2 && c16g < acc3 * 4 + tt3 * 2 + 64,
           "bf16 scratch bytes %zu (HS 8, HSV 24, NKV 2)", c16g);
}

/* What the table of (precision, attention) keeps for (B, T, NH, HS): 10 flash's saved
 * size, 11 the batched-GEMM's of that precision, 12 neither. */
static int table_choice(const char *precision, const char *attention, int HS)
{
    const ts_kernels *k = ts_kernels_for("cuda", precision, attention);
    CHECKF(k != NULL, "no cuda table for %s, %s", precision, attention);
    if (!k) return -1;
    const bool bf16 = !strcmp(precision, "bf16");
    const int B = 1, T = 9, NH = 2;
    size_t got = k->attention_saved_bytes(B, T, ts_att_heads_gqa(NH, NH, HS));
    size_t gemm = bf16 ? ts_cuda_gemm_bf16_attention_saved_bytes(B, T, ts_att_heads_gqa(NH, NH, HS))
                       : ts_cuda_gemm_attention_saved_bytes(B, T, ts_att_heads_gqa(NH, NH, HS));
    size_t flash =
        bf16 ? ts_cuda_flash_bf16_attention_saved_bytes(B, T, ts_att_heads_gqa(NH, NH, HS))
             : ts_cuda_flash_attention_saved_bytes(B, T, ts_att_heads_gqa(NH, NH, HS));
    return got == flash ? 10 : got == gemm ? 11 : 12;
}

/* train.attention picks the table (ts_kernels_for), and the table the variant. */
static void test_choice(void)
{
    const char *precisions[] = {"fp32", "bf16"};
    for (int p = 0; p < 2; p++) {
        const char *pr = precisions[p];
        CHECKF(table_choice(pr, "gemm", 64) == 11, "gemm (%s)", pr);
        CHECKF(table_choice(pr, "flash", 64) == 10, "flash (%s)", pr);
        /* heads wider than the flash kernels take stay on the GEMMs */
        CHECKF(table_choice(pr, "flash", TS_CUDA_FLASH_MAX_HS + 1) == 11, "flash, HS %d (%s)",
               TS_CUDA_FLASH_MAX_HS + 1, pr);
        CHECKF(ts_kernels_for("cuda", pr, "Flash") == NULL, "no table for \"Flash\" (%s)", pr);
    }
    CHECK(ts_kernels_for("cuda", "fp32", "gemm") == &ts_kernels_cuda);
    CHECK(ts_kernels_for("cuda", "bf16", "gemm") == &ts_kernels_cuda_bf16);
    CHECK(ts_kernels_for("cuda", "fp32", "flash") == &ts_kernels_cuda_flash);
    CHECK(ts_kernels_for("cuda", "bf16", "flash") == &ts_kernels_cuda_bf16_flash);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    test_sizes();
    test_choice();
    check_doc_reference();
    int devices = ts_cuda_device_count();
    if (devices == 0) {
        printf("test_cuda_attention: no CUDA device here (ts_cuda_device_count() == 0): "
               "skipped; sizes, the tables' attention choice and the document-mask "
               "reference checked\n");
        return ts_test_failed ? ts_test_report() : 77;
    }
    printf("test_cuda_attention: %d CUDA device(s)\n", devices);
    const ts_dtype F32 = TS_DTYPE_F32, BF = TS_DTYPE_BF16;
    const int ANY = 1 << 20;
#define TS_V(name, p, tol, max_hs, act)                                                        \
    {name, p##saved_bytes, p##scratch_bytes, p##forward, p##backward, tol, max_hs, act}
    const variant vs[] = {
        TS_V("gemm fp32", ts_cuda_gemm_attention_, 1e-5, ANY, F32),
        TS_V("flash fp32", ts_cuda_flash_attention_, 1e-5, TS_CUDA_FLASH_MAX_HS, F32),
        TS_V("gemm bf16", ts_cuda_gemm_bf16_attention_, 5e-2, ANY, BF),
        TS_V("flash bf16", ts_cuda_flash_bf16_attention_, 5e-2, TS_CUDA_FLASH_MAX_HS, BF),
        {"table (fp32)", G->attention_saved_bytes, G->attention_scratch_bytes,
         G->attention_forward, G->attention_backward, 1e-5, ANY, F32},
        {"table (fp32, flash)", ts_kernels_cuda_flash.attention_saved_bytes,
         ts_kernels_cuda_flash.attention_scratch_bytes, ts_kernels_cuda_flash.attention_forward,
         ts_kernels_cuda_flash.attention_backward, 1e-5, ANY, F32},
        {"table (bf16)", ts_kernels_cuda_bf16.attention_saved_bytes,
         ts_kernels_cuda_bf16.attention_scratch_bytes, ts_kernels_cuda_bf16.attention_forward,
         ts_kernels_cuda_bf16.attention_backward, 5e-2, ANY, BF},
        {"table (bf16, flash)", ts_kernels_cuda_bf16_flash.attention_saved_bytes,
         ts_kernels_cuda_bf16_flash.attention_scratch_bytes,
         ts_kernels_cuda_bf16_flash.attention_forward,
         ts_kernels_cuda_bf16_flash.attention_backward, 5e-2, ANY, BF},
    };
#undef TS_V
    const int nv = (int)(sizeof vs / sizeof vs[0]);
    /* Every T with every HS; B and NH cycle through 1..4 and {1, 3, 12}, so both GEMM
     * batching branches (B <= NH and B > NH) and ragged last tiles are covered. */
    static const int Ts[] = {1, 7, 64, 129, 256}, HSs[] = {8, 64, 100}, NHs[] = {1, 3, 12};
    int k = 0;
    for (int t = 0; t < 5; t++)
        for (int h = 0; h < 3; h++, k++)
            test_shape(vs, nv, 1 + k % 4, Ts[t], NHs[k % 3], NHs[k % 3], HSs[h]);
    /* Odd heads (no multiple of 4 or 8), the 16-wide tiles above HS 128, the widest
     * flash head, and one past it (GEMMs only). */
    test_shape(vs, nv, 2, 33, 2, 2, 1);
    test_shape(vs, nv, 3, 50, 1, 1, 3);
    test_shape(vs, nv, 1, 97, 2, 2, 129);
    test_shape(vs, nv, 2, 70, 1, 1, TS_CUDA_FLASH_MAX_HS);
    test_shape(vs, nv, 1, 40, 1, 1, TS_CUDA_FLASH_MAX_HS + 1);
    /* Grouped-query attention: groups of 2, 3, 4 and 12 query heads, one kv head
     * (multi-query) included; B below and above NKV (both batching branches); ragged
     * tiles; the 16-wide tiles; a head past the flash limit (GEMMs only). */
    static const struct { int B, T, NH, NKV, HS; } gqa[] = {
        {1, 7, 2, 1, 8},    {2, 64, 4, 2, 16},   {3, 129, 6, 2, 64},  {1, 33, 12, 1, 8},
        {4, 40, 8, 2, 32},  {2, 97, 12, 4, 100}, {1, 1, 4, 1, 64},    {5, 17, 3, 1, 8},
        {2, 50, 4, 1, 160}, {1, 300, 8, 4, 64},  {2, 33, 4, 2, 3},    {1, 40, 2, 1, 300},
    };
    for (size_t i = 0; i < sizeof gqa / sizeof gqa[0]; i++)
        test_shape(vs, nv, gqa[i].B, gqa[i].T, gqa[i].NH, gqa[i].NKV, gqa[i].HS);
    /* The general heads (kernels.h ts_att_heads), every variant: q/k wider than v (MLA's;
     * DeepSeek-V3's 192 and 128, 16-wide flash tiles), v wider than q/k (grouped, T < the
     * heads: the bf16 accumulator NKV (HS + HSV) outgrows dP and B T NH HS), odd sizes,
     * v past the flash limit (GEMMs only), scales other than 1/sqrt(HS). */
    static const struct {
        int B, T, NH, NKV, HS, HSV;
        float scale;
    } gen[] = {
        {2, 40, 4, 4, 24, 16, 0.3f},    {1, 67, 4, 2, 24, 16, 0.35f},    {3, 33, 3, 1, 8, 12, 0.9f},
        {1, 5, 4, 2, 8, 24, 0.4f},      {1, 70, 8, 8, 192, 128, 0.135f}, {2, 19, 2, 1, 5, 3, 1.1f},
        {1, 40, 2, 2, 64, 300, 0.125f},
    };
    for (size_t i = 0; i < sizeof gen / sizeof gen[0]; i++) {
        ts_att_heads h = ts_att_heads_gqa(gen[i].NH, gen[i].NKV, gen[i].HS);
        h.HSV = gen[i].HSV, h.scale = gen[i].scale;
        test_heads(vs, nv, gen[i].B, gen[i].T, h);
    }
    test_documents(vs, nv);
    return ts_test_report();
}
