/* The CUDA backend (kernels/cuda) against the CPU backend, slot by slot: the same random
 * inputs on both, every device output first poisoned with NaN (so a value the kernel
 * fails to write shows), gradients that accumulate pre-filled with non-zero values (so
 * `=` where `+=` is due shows), and each result within a relative 1e-5 of the CPU's
 * (the floor of the relative error is a tenth of the largest |value| of that output, so
 * values near zero are judged on the output's own scale). Also: copies, overlapping
 * device-to-device moves in both directions, the double sums and their bitwise
 * determinism, streams and events.
 *
 * The llama kernels too: RMSNorm (and its backward's bits on a rerun), RoPE in place (the
 * v heads untouched, the backward undoing the forward), SwiGLU, grouped-query attention
 * (NKV < NH key/value heads, down to one), the encoder without a position embedding. The
 * mixture-of-experts kernels (fp32 table; test_moe) and the grouped expert GEMMs
 * (test_grouped_matmul: uneven rows, empty experts, against the CPU's grouped calls; the
 * bf16 table's against the fp32 one's, test_bf16_grouped_matmul).
 *
 * Then the bf16 tables ("cuda-bf16", or "cuda-bf16-flash" with the flash argument)
 * against the fp32 CUDA table of the same attention, kernel by kernel (test_bf16_*): the
 * same inputs on both, rounded to bf16 first so both start from the same values; every
 * bf16 output first poisoned with NaN (all bytes 0xff), every fp32 output of a bf16
 * kernel too; activations within bf16 tolerance (TOL_BF16: a relative 1e-2, floor a
 * tenth of the output's largest value; attention, with its rounded scores and
 * probabilities, TOL_BF16_ATT), fp32 results computed in fp32 from the same values
 * (losses, statistics, parameter gradients) to TOL or TOL_BF16_GRAD. Also the convert
 * slot bit by bit (round to nearest even, ties to even, NaN kept, infinities, overflow,
 * subnormals; the exact widening; same-type copies), the biased bf16 matmul's chunks
 * through its fp32 scratch, unaligned bf16 operands, and bitwise reruns.
 *
 * Built in CUDA builds only (tests/CMakeLists.txt, label "gpu"); exits 77 (skipped)
 * where there is no CUDA device. Each comparison prints one line (slot, output, worst
 * error), and a failure names the slot, the output, the index and both values. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/kernels.h"
#include "test_device_util.h"
#include "test_gpu_bf16.h"

static const ts_kernels *G = &ts_kernels_cuda; /* under test (the bf16 table, later) */
static const ts_kernels *H = &ts_kernels_cpu;  /* the reference, on host memory */

#define TOL 1e-5
/* The bf16 tables against the fp32 CUDA tables on the same (bf16-valued) inputs: an
 * activation is rounded once to bf16 (a relative 2^-9 = 2e-3) after fp32 arithmetic
 * that may differ in order; attention also rounds its scores, probabilities and dS;
 * fp32 gradients accumulated from the same bf16 values differ only in summation order. */
#define TOL_BF16 1e-2
#define TOL_BF16_ATT 5e-2
#define TOL_BF16_GRAD 1e-4

/* ---- random inputs (test_util.h's generator, this file's seed: main) --------------- */

static int irand(int n) { return (int)(ts_test_next_u64() % (uint64_t)n); }

/* ---- a host reference buffer and its device twin ----------------------------------- */

typedef struct {
    float *h; /* the CPU backend's buffer (host memory) */
    float *d; /* the CUDA backend's buffer */
    size_t n;
    float *base; /* what dev_alloc returned, when d is an offset into it (else NULL) */
} pair;

/* An input, or a gradient that accumulates: the same random values on both sides. */
static pair p_in(size_t n, float scale)
{
    pair p = { ts_test_rand_floats(n, scale), NULL, n, NULL };
    p.d = ts_test_to_dev(G, p.h, n);
    return p;
}

/* An output: zero on the host (the CPU kernel writes it), NaN on the device. */
static pair p_out(size_t n)
{
    pair p = { ts_alloc_floats(n), NULL, n, NULL };
    p.d = ts_test_dev_nan(G, n);
    return p;
}

/* A device copy of values[0..p->n) at address base + off (off floats), base kept in p:
 * a pointer only 4-byte aligned, as a weight inside the flat parameter buffer may be. */
static float *d_at(pair *p, const float *values, size_t off)
{
    p->base = G->dev_alloc((p->n + off) * sizeof(float));
    G->memcpy_h2d(p->base + off, values, p->n * sizeof(float));
    return p->base + off;
}

/* p_in's values at device address base + off. */
static pair p_in_at(size_t n, float scale, size_t off)
{
    pair p = { ts_test_rand_floats(n, scale), NULL, n, NULL };
    p.d = d_at(&p, p.h, off);
    return p;
}

/* p_out's at device address base + off. */
static pair p_out_at(size_t n, size_t off)
{
    pair p = { ts_alloc_floats(n), NULL, n, NULL };
    float *nan = ts_test_nan_floats(n);
    p.d = d_at(&p, nan, off);
    free(nan);
    return p;
}

static void p_free(pair *p)
{
    free(p->h);
    G->dev_free(p->base ? p->base : p->d);
    p->h = p->d = p->base = NULL;
}

/* Integers (tokens, targets) on the device. */
static int *d_ints(const int *h, size_t n)
{
    int *d = G->dev_alloc(n * sizeof(int));
    G->memcpy_h2d(d, h, n * sizeof(int));
    return d;
}

/* Device values dev[0..n) against host values want[0..n): relative error under tol,
 * with a floor of floor_frac x the largest |want|. */
static void expect_close_to(const char *slot, const char *what, const float *want,
                            const float *dev, size_t n, double tol, double floor_frac)
{
    ts_test_expect_close_dev(G, slot, what, dev, want, n, tol, floor_frac);
}

/* The device buffer against the host one. */
static void expect_close(const char *slot, const char *what, const pair *p)
{
    expect_close_to(slot, what, p->h, p->d, p->n, TOL, 0.1);
}

/* The device buffer holds the same bits as host copy `before`. */
static void expect_same_bits(const char *slot, const char *what, const float *before,
                             const float *dev, size_t n)
{
    CHECKF(ts_test_dev_same_bits(G, dev, before, n), "%s: output '%s' differs between two runs",
           slot, what);
}

/* Whole floats holding `bytes`. */
static size_t floats_for(size_t bytes) { return (bytes + sizeof(float) - 1) / sizeof(float); }

/* ---- the table and memory ---------------------------------------------------------- */

/* Every CUDA table is complete, says what it is and needs, and is the one
 * ts_kernels_for gives for its (device, precision, attention). */
static void test_table(void)
{
    const ts_kernels *all[] = {&ts_kernels_cuda, &ts_kernels_cuda_flash, &ts_kernels_cuda_bf16,
                               &ts_kernels_cuda_bf16_flash};
    const char *names[] = {"cuda", "cuda-flash", "cuda-bf16", "cuda-bf16-flash"};
    for (int i = 0; i < 4; i++) {
        const ts_kernels *k = all[i];
        const char *missing = ts_kernels_missing(k);
        CHECKF(!missing, "%s leaves slot '%s' empty", names[i], missing);
        CHECK(!strcmp(k->name, names[i]));
        CHECK(!k->host_accessible && k->device_memory);
        CHECK(ts_kernels_find(names[i]) == k);
        CHECK(ts_kernels_for(k->device, k->precision, k->attention) == k);
        CHECK(!strcmp(k->device, "cuda") && !strcmp(k->native_comm, "nccl"));
        CHECK(!strcmp(k->precision, i < 2 ? "fp32" : "bf16"));
        CHECK(k->act_dtype == (i < 2 ? TS_DTYPE_F32 : TS_DTYPE_BF16));
        CHECK(!strcmp(k->attention, i % 2 ? "flash" : "gemm"));
        CHECK(k->weight_copy_bytes == (i < 2 ? 0 : 2));
        CHECK(k->device_count && k->select_device && k->current_device && k->memory_info);
        /* the MoE slots (not in ts_kernels_missing's list: a table may lack them) */
        CHECKF(k->moe_route_forward && k->moe_route_backward && k->moe_aux_forward_backward &&
                   k->moe_balance_forward_backward && k->moe_count && k->moe_permute &&
                   k->moe_combine &&
                   k->moe_combine_backward && k->moe_permute_backward && k->moe_capacity &&
                   k->grouped_matmul_forward && k->grouped_matmul_backward,
               "%s lacks an MoE slot", names[i]);
    }
    /* The slots on fp32 memory alone are the fp32 table's in every table, so the memory,
     * sum and AdamW checks of the fp32 table cover them. */
    for (int i = 1; i < 4; i++) {
        const ts_kernels *k = all[i], *f = &ts_kernels_cuda;
        CHECKF(k->dev_alloc == f->dev_alloc && k->dev_free == f->dev_free &&
                   k->memcpy_h2d == f->memcpy_h2d && k->memcpy_d2h == f->memcpy_d2h &&
                   k->memcpy_d2d == f->memcpy_d2d && k->memset_zero == f->memset_zero &&
                   k->convert == f->convert && k->sum_into == f->sum_into &&
                   k->sum_squares_into == f->sum_squares_into &&
                   k->adamw_update == f->adamw_update &&
                   k->adamw_update_spans == f->adamw_update_spans,
               "%s: a memory, sum or AdamW slot differs from the fp32 table's", names[i]);
    }
}

static void test_memory(void)
{
    enum { N = 1000 };
    float host[N], back[N], want[N];
    CHECK(G->dev_alloc(0) == NULL);
    float *d = G->dev_alloc(N * sizeof(float));
    CHECK(d != NULL && (uintptr_t)d % 64 == 0);
    G->memcpy_d2h(back, d, sizeof back);
    int zero = 1;
    for (int i = 0; i < N; i++) zero &= back[i] == 0.0f;
    CHECKF(zero, "dev_alloc: memory not zeroed");

    for (int i = 0; i < N; i++) host[i] = (float)i + 0.25f;
    G->memcpy_h2d(d, host, sizeof host);
    G->memcpy_d2h(back, d, sizeof back);
    CHECKF(!memcmp(back, host, sizeof host), "memcpy_h2d/memcpy_d2h round trip differs");

    float *e = G->dev_alloc(N * sizeof(float));
    G->memcpy_d2d(e, d, sizeof host);
    G->memcpy_d2h(back, e, sizeof back);
    CHECKF(!memcmp(back, host, sizeof host), "memcpy_d2d (disjoint) differs");

    /* Overlapping moves, memmove's rule, both directions, near and far shifts. */
    static const struct { int dst, src, count; } moves[] = {
        { 0, 100, 800 }, { 100, 0, 800 }, { 0, 1, 999 }, { 1, 0, 999 }, { 7, 7, 500 },
        { 3, 500, 497 }, { 500, 3, 497 },
    };
    for (size_t m = 0; m < sizeof moves / sizeof moves[0]; m++) {
        for (int i = 0; i < N; i++) host[i] = (float)i * 0.5f - 3.0f;
        memcpy(want, host, sizeof host);
        memmove(want + moves[m].dst, want + moves[m].src, (size_t)moves[m].count * sizeof(float));
        G->memcpy_h2d(d, host, sizeof host);
        G->memcpy_d2d(d + moves[m].dst, d + moves[m].src, (size_t)moves[m].count * sizeof(float));
        G->memcpy_d2h(back, d, sizeof back);
        CHECKF(!memcmp(back, want, sizeof want),
               "memcpy_d2d(dst = +%d, src = +%d, %d floats): differs from memmove", moves[m].dst,
               moves[m].src, moves[m].count);
    }

    G->memcpy_h2d(d, host, sizeof host);
    G->memset_zero(d + 10, 20 * sizeof(float));
    G->memcpy_d2h(back, d, sizeof back);
    int ok = back[9] == host[9] && back[30] == host[30];
    for (int i = 10; i < 30; i++) ok &= back[i] == 0.0f;
    CHECKF(ok, "memset_zero: wrong range zeroed");
    G->dev_free(d);
    G->dev_free(e);
    G->dev_free(NULL);
    printf("  %-30s ok\n", "memory and copies");
}

/* sum_into / sum_squares_into / sum_squares: the CPU's sums (in double, another order)
 * to 1e-9, and the same bits on every run. */
static void test_sums(void)
{
    static const size_t sizes[] = { 0, 1, 1000, 65537, 3000001 };
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        pair x = p_in(n ? n : 1, 1.0f);
        double acc0[2] = { 1.5, -2.0 }, want[2], got[2], again[2];
        memcpy(want, acc0, sizeof acc0);
        H->sum_into(&want[0], x.h, n);
        H->sum_squares_into(&want[1], x.h, n);
        double *dacc = G->dev_alloc(sizeof acc0);
        for (int rep = 0; rep < 3; rep++) {
            G->memcpy_h2d(dacc, acc0, sizeof acc0);
            G->sum_into(&dacc[0], x.d, n);
            G->sum_squares_into(&dacc[1], x.d, n);
            G->memcpy_d2h(rep ? again : got, dacc, sizeof got);
            if (rep)
                CHECKF(!memcmp(again, got, sizeof got),
                       "sum_into/sum_squares_into (n = %zu) not deterministic: %.17g %.17g then "
                       "%.17g %.17g",
                       n, got[0], got[1], again[0], again[1]);
        }
        double e0 = ts_rel_err(got[0], want[0], 1.0), e1 = ts_rel_err(got[1], want[1], 1.0);
        CHECKF(e0 < 1e-9, "sum_into (n = %zu): cuda %.17g, cpu %.17g", n, got[0], want[0]);
        CHECKF(e1 < 1e-9, "sum_squares_into (n = %zu): cuda %.17g, cpu %.17g", n, got[1],
               want[1]);
        double ss = G->sum_squares(x.d, n), ss_want = H->sum_squares(x.h, n);
        CHECKF(ts_rel_err(ss, ss_want, 1e-300) < 1e-9 || (n == 0 && ss == 0.0),
               "sum_squares (n = %zu): cuda %.17g, cpu %.17g", n, ss, ss_want);
        CHECKF(G->sum_squares(x.d, n) == ss, "sum_squares (n = %zu) not deterministic", n);
        printf("  %-30s n = %-8zu rel err %.2e %.2e\n", "sum_into / sum_squares*", n, e0, e1);
        G->dev_free(dacc);
        p_free(&x);
    }
}

static void test_streams(void)
{
    ts_stream s = G->stream_create();
    CHECK(s != NULL);
    ts_event e = G->event_record(s);
    G->event_wait(e);
    e = G->event_record(NULL); /* the compute stream */
    G->event_wait(e);
    G->stream_sync(s);
    G->stream_sync(NULL);
    G->stream_destroy(s);
    printf("  %-30s ok\n", "streams and events");
}

/* ---- kernels ------------------------------------------------------------------------ */

enum { B = 2, T = 7, C = 12, NH = 3, V = 37, N = B * T };

static void test_encoder(void)
{
    int tok[N];
    for (int i = 0; i < N; i++) tok[i] = irand(V);
    tok[5] = tok[0]; /* repeated tokens: their gradient rows accumulate */
    tok[11] = tok[0];
    int *dtok = d_ints(tok, N);
    pair wte = p_in((size_t)V * C, 1.0f), wpe = p_in((size_t)(T + 3) * C, 1.0f); /* wpe [>=T,C] */
    pair out = p_out((size_t)N * C);
    H->encoder_forward(out.h, tok, wte.h, wpe.h, B, T, C);
    G->encoder_forward(out.d, dtok, wte.d, wpe.d, B, T, C);
    expect_close("encoder_forward", "out", &out);

    pair dout = p_in((size_t)N * C, 1.0f);
    pair dwte = p_in((size_t)V * C, 0.5f), dwpe = p_in((size_t)(T + 3) * C, 0.5f);
    H->encoder_backward(dwte.h, dwpe.h, dout.h, tok, B, T, C);
    G->encoder_backward(dwte.d, dwpe.d, dout.d, dtok, B, T, C);
    expect_close("encoder_backward", "dwte (+=)", &dwte);
    expect_close("encoder_backward", "dwpe (+=)", &dwpe);

    /* No position embedding (llama: wpe and dwpe NULL). */
    pair out0 = p_out((size_t)N * C), dwte0 = p_in((size_t)V * C, 0.5f);
    H->encoder_forward(out0.h, tok, wte.h, NULL, B, T, C);
    G->encoder_forward(out0.d, dtok, wte.d, NULL, B, T, C);
    expect_close("encoder_forward nowpe", "out", &out0);
    H->encoder_backward(dwte0.h, NULL, dout.h, tok, B, T, C);
    G->encoder_backward(dwte0.d, NULL, dout.d, dtok, B, T, C);
    expect_close("encoder_backward nowpe", "dwte (+=)", &dwte0);
    p_free(&wte), p_free(&wpe), p_free(&out), p_free(&dout), p_free(&dwte), p_free(&dwpe);
    p_free(&out0), p_free(&dwte0);
    G->dev_free(dtok);
}

static void test_layernorm(int Nr, int Cc)
{
    pair inp = p_in((size_t)Nr * Cc, 2.0f), w = p_in((size_t)Cc, 1.0f), b = p_in((size_t)Cc, 1.0f);
    for (size_t i = 0; i < inp.n; i++) inp.h[i] += 0.5f; /* a non-zero mean */
    G->memcpy_h2d(inp.d, inp.h, inp.n * sizeof(float));
    pair out = p_out((size_t)Nr * Cc), mean = p_out((size_t)Nr), rstd = p_out((size_t)Nr);
    H->layernorm_forward(out.h, mean.h, rstd.h, inp.h, w.h, b.h, Nr, Cc);
    G->layernorm_forward(out.d, mean.d, rstd.d, inp.d, w.d, b.d, Nr, Cc);
    char slot[64];
    snprintf(slot, sizeof slot, "layernorm_forward %dx%d", Nr, Cc);
    expect_close(slot, "out", &out);
    expect_close(slot, "mean", &mean);
    expect_close(slot, "rstd", &rstd);

    pair dout = p_in((size_t)Nr * Cc, 1.0f);
    pair dinp = p_in((size_t)Nr * Cc, 0.5f), dw = p_in((size_t)Cc, 0.5f), db = p_in((size_t)Cc, 0.5f);
    H->layernorm_backward(dinp.h, dw.h, db.h, dout.h, inp.h, w.h, mean.h, rstd.h, Nr, Cc);
    G->layernorm_backward(dinp.d, dw.d, db.d, dout.d, inp.d, w.d, mean.d, rstd.d, Nr, Cc);
    snprintf(slot, sizeof slot, "layernorm_backward %dx%d", Nr, Cc);
    expect_close(slot, "dinp (+=)", &dinp);
    expect_close(slot, "dweight (+=)", &dw);
    expect_close(slot, "dbias (+=)", &db);
    p_free(&inp), p_free(&w), p_free(&b), p_free(&out), p_free(&mean), p_free(&rstd);
    p_free(&dout), p_free(&dinp), p_free(&dw), p_free(&db);
}

/* RMSNorm: the forward's out and rstd, the backward's accumulating dinp and dweight, and
 * the backward's bits again from the same pre-fill (dweight's block sums: no atomics). */
static void test_rmsnorm(int Nr, int Cc, float eps)
{
    char slot[64];
    const size_t n = (size_t)Nr * Cc;
    pair inp = p_in(n, 2.0f), w = p_in((size_t)Cc, 1.0f);
    pair out = p_out(n), rstd = p_out((size_t)Nr);
    H->rmsnorm_forward(out.h, rstd.h, inp.h, w.h, Nr, Cc, eps);
    G->rmsnorm_forward(out.d, rstd.d, inp.d, w.d, Nr, Cc, eps);
    snprintf(slot, sizeof slot, "rmsnorm_forward %dx%d eps %.0e", Nr, Cc, (double)eps);
    expect_close(slot, "out", &out);
    expect_close(slot, "rstd", &rstd);

    pair dout = p_in(n, 1.0f), dinp = p_in(n, 0.5f), dw = p_in((size_t)Cc, 0.5f);
    float *dinp0 = ts_alloc_floats(n), *dw0 = ts_alloc_floats((size_t)Cc); /* the pre-fill */
    memcpy(dinp0, dinp.h, n * sizeof(float));
    memcpy(dw0, dw.h, (size_t)Cc * sizeof(float));
    H->rmsnorm_backward(dinp.h, dw.h, dout.h, inp.h, w.h, rstd.h, Nr, Cc);
    G->rmsnorm_backward(dinp.d, dw.d, dout.d, inp.d, w.d, rstd.d, Nr, Cc);
    snprintf(slot, sizeof slot, "rmsnorm_backward %dx%d", Nr, Cc);
    expect_close(slot, "dinp (+=)", &dinp);
    expect_close(slot, "dweight (+=)", &dw);
    float *dinp1 = ts_test_from_dev(G, dinp.d, n), *dw1 = ts_test_from_dev(G, dw.d, (size_t)Cc);
    G->memcpy_h2d(dinp.d, dinp0, n * sizeof(float));
    G->memcpy_h2d(dw.d, dw0, (size_t)Cc * sizeof(float));
    G->rmsnorm_backward(dinp.d, dw.d, dout.d, inp.d, w.d, rstd.d, Nr, Cc);
    expect_same_bits(slot, "dinp (+=)", dinp1, dinp.d, n);
    expect_same_bits(slot, "dweight (+=)", dw1, dw.d, (size_t)Cc);
    free(dinp0), free(dw0), free(dinp1), free(dw1);
    p_free(&inp), p_free(&w), p_free(&out), p_free(&rstd), p_free(&dout), p_free(&dinp);
    p_free(&dw);
}

/* RoPE tables for T positions of heads of HS (Hugging Face's inverse frequencies,
 * theta 10000): cos and sin [T, HS/2], host memory. */
static void rope_tables(float **cosb, float **sinb, int Tt, int HS)
{
    const int half = HS / 2;
    *cosb = ts_alloc_floats((size_t)Tt * half + 1);
    *sinb = ts_alloc_floats((size_t)Tt * half + 1);
    for (int t = 0; t < Tt; t++)
        for (int i = 0; i < half; i++) {
            double a = t * pow(10000.0, -2.0 * i / HS);
            (*cosb)[(size_t)t * half + i] = (float)cos(a);
            (*sinb)[(size_t)t * half + i] = (float)sin(a);
        }
}

/* RoPE in place on the q and k heads of qkv [B, T, ts_att_qkv_width(h)], on their last
 * RD channels (halves, or adjacent pairs when interleaved): the forward and the backward
 * against the CPU, every channel outside the rotated parts (the v heads, each q/k head's
 * first HS - RD) left alone bit for bit, and the backward undoing the forward (a
 * rotation) to fp32 rounding. */
static void test_rope_heads(int Bb, int Tt, ts_att_heads h, int RD, bool il) {
    char slot[120];
    const int nh = h.NH, nkv = h.NKV, HS = h.HS;
    const size_t row = ts_att_qkv_width(h), n = (size_t)Bb * Tt * row;
    const size_t ntab = (size_t)Tt * (RD / 2);
    float *cs, *sn;
    rope_tables(&cs, &sn, Tt, RD);
    float *dcs = ts_test_to_dev(G, cs, ntab + 1), *dsn = ts_test_to_dev(G, sn, ntab + 1);
    pair x = p_in(n, 1.0f);
    float *x0 = ts_alloc_floats(n);
    memcpy(x0, x.h, n * sizeof(float));
    H->rope_forward(x.h, cs, sn, Bb, Tt, h, RD, il);
    G->rope_forward(x.d, dcs, dsn, Bb, Tt, h, RD, il);
    snprintf(slot, sizeof slot, "rope_forward B%d T%d NH%d NKV%d HS%d HSV%d RD%d%s", Bb, Tt, nh,
             nkv, HS, h.HSV, RD, il ? " interleaved" : "");
    expect_close(slot, "qkv (in place)", &x);
    float *got = ts_test_from_dev(G, x.d, n);
    size_t moved = 0;
    for (size_t r = 0; r < (size_t)Bb * Tt; r++)
        for (size_t c = 0; c < row; c++) {
            const bool rotated = c < (size_t)(nh + nkv) * HS && (int)(c % HS) >= HS - RD;
            if (!rotated) moved += memcmp(&got[r * row + c], &x0[r * row + c], sizeof(float)) != 0;
        }
    CHECKF(moved == 0, "%s: %zu values outside the rotated channels changed", slot, moved);
    /* the inverse rotation brings the input back */
    G->rope_backward(x.d, dcs, dsn, Bb, Tt, h, RD, il);
    expect_close_to(slot, "backward(forward(x)) = x", x0, x.d, n, TOL, 0.1);

    pair d = p_in(n, 1.0f);
    H->rope_backward(d.h, cs, sn, Bb, Tt, h, RD, il);
    G->rope_backward(d.d, dcs, dsn, Bb, Tt, h, RD, il);
    snprintf(slot, sizeof slot, "rope_backward B%d T%d NH%d NKV%d HS%d HSV%d RD%d%s", Bb, Tt, nh,
             nkv, HS, h.HSV, RD, il ? " interleaved" : "");
    expect_close(slot, "dqkv (in place)", &d);
    p_free(&x), p_free(&d);
    G->dev_free(dcs), G->dev_free(dsn);
    free(cs), free(sn), free(x0), free(got);
}

/* llama's: the whole head, halves. */
static void test_rope(int Bb, int Tt, int nh, int nkv, int HS) {
    test_rope_heads(Bb, Tt, ts_att_heads_gqa(nh, nkv, HS), HS, false);
}

/* SwiGLU: out [N, F] from the gate and up halves of inp [N, 2F]; the backward's dinp
 * [N, 2F] overwritten (NaN first). */
static void test_swiglu(int Nr, int F)
{
    char slot[64];
    pair inp = p_in((size_t)Nr * 2 * F, 4.0f), out = p_out((size_t)Nr * F);
    H->swiglu_forward(out.h, inp.h, Nr, F);
    G->swiglu_forward(out.d, inp.d, Nr, F);
    snprintf(slot, sizeof slot, "swiglu_forward N%d F%d", Nr, F);
    expect_close(slot, "out", &out);
    pair dout = p_in((size_t)Nr * F, 1.0f), dinp = p_out((size_t)Nr * 2 * F);
    H->swiglu_backward(dinp.h, inp.h, dout.h, Nr, F);
    G->swiglu_backward(dinp.d, inp.d, dout.d, Nr, F);
    snprintf(slot, sizeof slot, "swiglu_backward N%d F%d", Nr, F);
    expect_close(slot, "dinp", &dinp);
    p_free(&inp), p_free(&out), p_free(&dout), p_free(&dinp);
}

/* The mixture-of-experts kernels: routing (scores, the chosen experts exactly, the
 * weights), its backward, the auxiliary losses (their gradients added onto a pre-fill),
 * the counts, the permutation (rows exactly) and the combine and its backwards. Both
 * sides dispatch by the CPU's topk_idx, so a near-tie chosen differently by a last-bit
 * difference in expf cannot cascade. */
static void test_moe(int Nr, int T, ts_moe_routing r, int C, bool with_bias)
{
    char slot[96];
    const int E = r.E, K = r.K;
    const size_t NE = (size_t)Nr * E, NK = (size_t)Nr * K;
    snprintf(slot, sizeof slot, "moe_route_forward N%d E%d K%d G%d/%d %s", Nr, E, K, r.groups,
             r.topk_groups, r.sigmoid ? "sigmoid" : "softmax");
    pair logits = p_in(NE, 2.0f), scores = p_out(NE), w = p_out(NK);
    pair bias = p_in((size_t)E, with_bias ? 0.05f : 0.0f);
    int *idx = ts_malloc(NK * sizeof(int)), *didx_h = ts_malloc(NK * sizeof(int));
    int *didx = G->dev_alloc(NK * sizeof(int));
    H->moe_route_forward(&r, scores.h, idx, w.h, logits.h, with_bias ? bias.h : NULL, Nr);
    G->moe_route_forward(&r, scores.d, didx, w.d, logits.d, with_bias ? bias.d : NULL, Nr);
    expect_close(slot, "scores", &scores);
    G->memcpy_d2h(didx_h, didx, NK * sizeof(int));
    CHECKF(!memcmp(idx, didx_h, NK * sizeof(int)), "%s: topk_idx differs from the CPU's", slot);
    expect_close(slot, "topk_w", &w);
    G->memcpy_h2d(didx, idx, NK * sizeof(int));
    /* the CPU's weights and scores on both sides from here on */
    G->memcpy_h2d(w.d, w.h, NK * sizeof(float));
    G->memcpy_h2d(scores.d, scores.h, NE * sizeof(float));

    pair dw = p_in(NK, 1.0f), dl = p_out(NE);
    H->moe_route_backward(&r, dl.h, dw.h, scores.h, idx, Nr);
    G->moe_route_backward(&r, dl.d, dw.d, scores.d, didx, Nr);
    expect_close("moe_route_backward", "dlogits", &dl);
    pair acc = p_in(NE, 1.0f), loss = p_in(2, 1.0f);
    H->moe_aux_forward_backward(&r, &loss.h[0], &loss.h[1], acc.h, logits.h, scores.h, idx, Nr, T,
                                0.1f, 0.3f, 1.0f / (4 * T), 0.25f);
    G->moe_aux_forward_backward(&r, loss.d, loss.d + 1, acc.d, logits.d, scores.d, didx, Nr, T,
                                0.1f, 0.3f, 1.0f / (4 * T), 0.25f);
    expect_close("moe_aux_forward_backward", "dlogits (added)", &acc);
    expect_close("moe_aux_forward_backward", "losses (added)", &loss);
    /* The balance loss from given whole-sequence counts on rows [5, Nr): a cut inside the
     * first sequence, as sequence parallelism makes. */
    const int Q = Nr / T;
    int *seq_cnt = calloc((size_t)Q * E, sizeof(int));
    for (int q = 0; q < Q; q++)
        H->moe_count(seq_cnt + (size_t)q * E, idx + (size_t)q * T * K, T, K, E);
    int *dseq_cnt = G->dev_alloc((size_t)Q * E * sizeof(int));
    G->memcpy_h2d(dseq_cnt, seq_cnt, (size_t)Q * E * sizeof(int));
    pair acc2 = p_in(NE, 1.0f), loss2 = p_in(1, 1.0f);
    H->moe_balance_forward_backward(&r, loss2.h, acc2.h + 5 * E, scores.h + 5 * E, seq_cnt,
                                    Nr - 5, 5, T, T, 0.3f, 0.25f);
    G->moe_balance_forward_backward(&r, loss2.d, acc2.d + 5 * E, scores.d + 5 * E, dseq_cnt,
                                    Nr - 5, 5, T, T, 0.3f, 0.25f);
    expect_close("moe_balance_forward_backward", "dlogits (added)", &acc2);
    expect_close("moe_balance_forward_backward", "loss (added)", &loss2);
    p_free(&acc2), p_free(&loss2), G->dev_free(dseq_cnt), free(seq_cnt);

    int *counts = calloc((size_t)E, sizeof(int)), *got = ts_malloc((size_t)E * sizeof(int));
    int *offsets = ts_malloc((size_t)E * sizeof(int));
    int *dcounts = G->dev_alloc((size_t)E * sizeof(int));
    int *doffsets = G->dev_alloc((size_t)E * sizeof(int));
    H->moe_count(counts, idx, Nr, K, E);
    G->moe_count(dcounts, didx, Nr, K, E);
    G->memcpy_d2h(got, dcounts, (size_t)E * sizeof(int));
    CHECKF(!memcmp(got, counts, (size_t)E * sizeof(int)), "moe_count differs from the CPU's");
    ts_moe_offsets(offsets, counts, E);
    G->memcpy_h2d(doffsets, offsets, (size_t)E * sizeof(int));
    int *row_of = ts_malloc(NK * sizeof(int)), *drow_of = G->dev_alloc(NK * sizeof(int));
    int *row_back = ts_malloc(NK * sizeof(int));
    pair x = p_in((size_t)Nr * C, 1.0f), xp = p_out(NK * C);
    H->moe_permute(xp.h, row_of, x.h, idx, offsets, Nr, K, C, E);
    G->moe_permute(xp.d, drow_of, x.d, didx, doffsets, Nr, K, C, E);
    G->memcpy_d2h(row_back, drow_of, NK * sizeof(int));
    CHECKF(!memcmp(row_back, row_of, NK * sizeof(int)), "moe_permute: row_of differs");
    expect_close("moe_permute", "xp", &xp);
    pair yp = p_in(NK * C, 1.0f), out = p_out((size_t)Nr * C);
    H->moe_combine(out.h, yp.h, w.h, row_of, Nr, K, C);
    G->moe_combine(out.d, yp.d, w.d, drow_of, Nr, K, C);
    expect_close("moe_combine", "out", &out);
    pair dout = p_in((size_t)Nr * C, 1.0f), dyp = p_out(NK * C), dtw = p_out(NK);
    H->moe_combine_backward(dyp.h, dtw.h, dout.h, yp.h, w.h, row_of, Nr, K, C);
    G->moe_combine_backward(dyp.d, dtw.d, dout.d, yp.d, w.d, drow_of, Nr, K, C);
    expect_close("moe_combine_backward", "dyp", &dyp);
    expect_close("moe_combine_backward", "dtopk_w", &dtw);
    pair dx = p_out((size_t)Nr * C);
    H->moe_permute_backward(dx.h, dyp.h, row_of, Nr, K, C);
    G->moe_permute_backward(dx.d, dyp.d, drow_of, Nr, K, C);
    expect_close("moe_permute_backward", "dx", &dx);

    /* The capacity (CUDA's bitwise threshold search, the CPU's sort: the same keys) on the
     * weights as they are and rounded to quarters (many ties, broken by position), at
     * capacities 0, 1, 2 and T; then the dispatch of the kept set of capacity 1. */
    int *keep = ts_malloc(NK * sizeof(int)), *dkeep_h = ts_malloc(NK * sizeof(int));
    int *dkeep = G->dev_alloc(NK * sizeof(int));
    float *wq = ts_malloc(NK * sizeof(float));
    for (size_t a = 0; a < NK; a++) wq[a] = roundf(4.0f * w.h[a]) / 4.0f;
    float *dwq = G->dev_alloc(NK * sizeof(float));
    G->memcpy_h2d(dwq, wq, NK * sizeof(float));
    const int caps[] = {0, 1, 2, T};
    for (int quarters = 0; quarters < 2; quarters++)
        for (size_t c = 0; c < sizeof caps / sizeof *caps; c++) {
            H->moe_capacity(keep, idx, quarters ? wq : w.h, Nr, K, E, T, caps[c]);
            G->moe_capacity(dkeep, didx, quarters ? dwq : w.d, Nr, K, E, T, caps[c]);
            G->memcpy_d2h(dkeep_h, dkeep, NK * sizeof(int));
            CHECKF(!memcmp(keep, dkeep_h, NK * sizeof(int)),
                   "moe_capacity %d%s differs from the CPU's", caps[c],
                   quarters ? " (weights in quarters)" : "");
        }
    H->moe_capacity(keep, idx, w.h, Nr, K, E, T, 1);
    G->memcpy_h2d(dkeep, keep, NK * sizeof(int));
    memset(counts, 0, (size_t)E * sizeof(int));
    G->memset_zero(dcounts, (size_t)E * sizeof(int));
    H->moe_count(counts, keep, Nr, K, E);
    G->moe_count(dcounts, dkeep, Nr, K, E);
    G->memcpy_d2h(got, dcounts, (size_t)E * sizeof(int));
    CHECKF(!memcmp(got, counts, (size_t)E * sizeof(int)), "moe_count of a kept set differs");
    ts_moe_offsets(offsets, counts, E);
    G->memcpy_h2d(doffsets, offsets, (size_t)E * sizeof(int));
    pair xk = p_out(NK * C), outk = p_out((size_t)Nr * C), dypk = p_out(NK * C);
    pair dtwk = p_out(NK), dxk = p_out((size_t)Nr * C);
    H->moe_permute(xk.h, row_of, x.h, keep, offsets, Nr, K, C, E);
    G->moe_permute(xk.d, drow_of, x.d, dkeep, doffsets, Nr, K, C, E);
    G->memcpy_d2h(row_back, drow_of, NK * sizeof(int));
    CHECKF(!memcmp(row_back, row_of, NK * sizeof(int)), "moe_permute (kept): row_of differs");
    H->moe_combine(outk.h, yp.h, w.h, row_of, Nr, K, C);
    G->moe_combine(outk.d, yp.d, w.d, drow_of, Nr, K, C);
    expect_close("moe_combine (kept)", "out", &outk);
    H->moe_combine_backward(dypk.h, dtwk.h, dout.h, yp.h, w.h, row_of, Nr, K, C);
    G->moe_combine_backward(dypk.d, dtwk.d, dout.d, yp.d, w.d, drow_of, Nr, K, C);
    expect_close("moe_combine_backward (kept)", "dtopk_w", &dtwk);
    H->moe_permute_backward(dxk.h, dypk.h, row_of, Nr, K, C);
    G->moe_permute_backward(dxk.d, dypk.d, drow_of, Nr, K, C);
    expect_close("moe_permute_backward (kept)", "dx", &dxk);
    p_free(&xk), p_free(&outk), p_free(&dypk), p_free(&dtwk), p_free(&dxk);
    G->dev_free(dkeep), G->dev_free(dwq), free(keep), free(dkeep_h), free(wq);

    p_free(&logits), p_free(&scores), p_free(&w), p_free(&bias), p_free(&dw), p_free(&dl);
    p_free(&acc), p_free(&loss), p_free(&x), p_free(&xp), p_free(&yp), p_free(&out);
    p_free(&dout), p_free(&dyp), p_free(&dtw), p_free(&dx);
    G->dev_free(didx), G->dev_free(dcounts), G->dev_free(doffsets), G->dev_free(drow_of);
    free(idx), free(didx_h), free(counts), free(got), free(offsets), free(row_of), free(row_back);
}

/* The same bits on a second run: forward, then backward with all three gradients
 * (dweight and dbias accumulating from the same pre-fill both times). */
static void matmul_determinism(const char *slot, const pair *inp, const pair *w, const pair *b,
                               const pair *dout, int Nr, int Cc, int OC, size_t off)
{
    pair out = p_in_at((size_t)Nr * OC, 1.0f, off);
    G->matmul_forward(out.d, inp->d, w->d, b->d, Nr, Cc, OC);
    float *out1 = ts_test_from_dev(G, out.d, out.n);
    G->matmul_forward(out.d, inp->d, w->d, b->d, Nr, Cc, OC);
    expect_same_bits(slot, "out", out1, out.d, out.n);

    pair dinp = p_in_at((size_t)Nr * Cc, 1.0f, off);
    pair dw = p_in_at((size_t)OC * Cc, 0.5f, off), db = p_in_at((size_t)OC, 0.5f, off);
    G->matmul_backward(dinp.d, dw.d, db.d, dout->d, inp->d, w->d, Nr, Cc, OC);
    float *dinp1 = ts_test_from_dev(G, dinp.d, dinp.n), *dw1 = ts_test_from_dev(G, dw.d, dw.n);
    float *db1 = ts_test_from_dev(G, db.d, db.n);
    G->memcpy_h2d(dw.d, dw.h, dw.n * sizeof(float)); /* the pre-fill again */
    G->memcpy_h2d(db.d, db.h, db.n * sizeof(float));
    G->matmul_backward(dinp.d, dw.d, db.d, dout->d, inp->d, w->d, Nr, Cc, OC);
    expect_same_bits(slot, "dinp", dinp1, dinp.d, dinp.n);
    expect_same_bits(slot, "dweight (+=)", dw1, dw.d, dw.n);
    expect_same_bits(slot, "dbias (+=)", db1, db.d, db.n);
    printf("  %-30s same bits on a second run\n", slot);
    free(out1), free(dinp1), free(dw1), free(db1);
    p_free(&out), p_free(&dinp), p_free(&dw), p_free(&db);
}

/* Every device operand at `off` floats past its buffer's start (off 1: 4-byte aligned
 * pointers, which cuBLASLt's fastest algorithms refuse). */
static void test_matmul(int Nr, int Cc, int OC, size_t off)
{
    char slot[96];
    pair inp = p_in_at((size_t)Nr * Cc, 1.0f, off), w = p_in_at((size_t)OC * Cc, 1.0f, off);
    pair b = p_in_at((size_t)OC, 1.0f, off);
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        pair out = p_out_at((size_t)Nr * OC, off);
        H->matmul_forward(out.h, inp.h, w.h, with_bias ? b.h : NULL, Nr, Cc, OC);
        G->matmul_forward(out.d, inp.d, w.d, with_bias ? b.d : NULL, Nr, Cc, OC);
        snprintf(slot, sizeof slot, "matmul_forward %dx%dx%d%s%s", Nr, Cc, OC,
                 with_bias ? "" : " nobias", off ? " +1" : "");
        expect_close(slot, "out", &out);
        p_free(&out);
    }
    /* Every combination of the three gradients (bit 0 dinp, 1 dweight, 2 dbias). */
    pair dout = p_in_at((size_t)Nr * OC, 1.0f, off);
    for (int mask = 1; mask < 8; mask++) {
        pair dinp = p_out_at((size_t)Nr * Cc, off);
        pair dw = p_in_at((size_t)OC * Cc, 0.5f, off), db = p_in_at((size_t)OC, 0.5f, off);
        H->matmul_backward(mask & 1 ? dinp.h : NULL, mask & 2 ? dw.h : NULL, mask & 4 ? db.h : NULL,
                           dout.h, inp.h, w.h, Nr, Cc, OC);
        G->matmul_backward(mask & 1 ? dinp.d : NULL, mask & 2 ? dw.d : NULL, mask & 4 ? db.d : NULL,
                           dout.d, inp.d, w.d, Nr, Cc, OC);
        snprintf(slot, sizeof slot, "matmul_backward %dx%dx%d [%s%s%s]%s", Nr, Cc, OC,
                 mask & 1 ? "i" : "-", mask & 2 ? "w" : "-", mask & 4 ? "b" : "-",
                 off ? " +1" : "");
        if (mask & 1) expect_close(slot, "dinp", &dinp);
        /* A skipped gradient is left alone: both sides still hold the same pre-fill. */
        expect_close(slot, mask & 2 ? "dweight (+=)" : "dweight (untouched)", &dw);
        expect_close(slot, mask & 4 ? "dbias (+=)" : "dbias (untouched)", &db);
        p_free(&dinp), p_free(&dw), p_free(&db);
    }
    snprintf(slot, sizeof slot, "matmul %dx%dx%d%s", Nr, Cc, OC, off ? " +1" : "");
    matmul_determinism(slot, &inp, &w, &b, &dout, Nr, Cc, OC, off);
    p_free(&inp), p_free(&w), p_free(&b), p_free(&dout);
}

/* The grouped expert GEMMs (cublasGemmGroupedBatchedEx) against the CPU's grouped calls:
 * uneven rows with empty experts (first, middle, last), each expert's weight at its own
 * place in one buffer, the weight gradients accumulating onto a pre-fill (an empty
 * expert's untouched), each gradient alone, and a rerun's bits. */
static const int GROUPED_ROWS[] = {0, 37, 5, 0, 130, 1, 64, 0};
enum { GROUPED_L = 8 };

static void test_grouped_matmul(int Cc, int OC)
{
    char slot[96];
    const int L = GROUPED_L, *rows = GROUPED_ROWS;
    int R = 0;
    for (int e = 0; e < L; e++) R += rows[e];
    const size_t nw = (size_t)OC * Cc;
    pair inp = p_in((size_t)R * Cc, 1.0f), w = p_in(L * nw, 1.0f), out = p_out((size_t)R * OC);
    const void *wh[GROUPED_L], *wd[GROUPED_L];
    for (int e = 0; e < L; e++) wh[e] = w.h + e * nw, wd[e] = w.d + e * nw;
    H->grouped_matmul_forward(out.h, inp.h, wh, rows, L, Cc, OC);
    G->grouped_matmul_forward(out.d, inp.d, wd, rows, L, Cc, OC);
    snprintf(slot, sizeof slot, "grouped_matmul_forward L%d C%d OC%d", L, Cc, OC);
    expect_close(slot, "out", &out);
    pair dout = p_in((size_t)R * OC, 1.0f);
    for (int mask = 1; mask < 4; mask++) { /* bit 0 dinp, 1 dweights */
        pair dinp = p_out((size_t)R * Cc), dw = p_in(L * nw, 0.5f);
        float *dwh[GROUPED_L], *dwd[GROUPED_L];
        for (int e = 0; e < L; e++) dwh[e] = dw.h + e * nw, dwd[e] = dw.d + e * nw;
        H->grouped_matmul_backward(mask & 1 ? dinp.h : NULL, mask & 2 ? dwh : NULL, dout.h, inp.h,
                                   wh, rows, L, Cc, OC);
        G->grouped_matmul_backward(mask & 1 ? dinp.d : NULL, mask & 2 ? dwd : NULL, dout.d, inp.d,
                                   wd, rows, L, Cc, OC);
        snprintf(slot, sizeof slot, "grouped_matmul_backward L%d C%d OC%d [%s%s]", L, Cc, OC,
                 mask & 1 ? "i" : "-", mask & 2 ? "w" : "-");
        if (mask & 1) expect_close(slot, "dinp", &dinp);
        expect_close(slot, mask & 2 ? "dweights (+=)" : "dweights (untouched)", &dw);
        p_free(&dinp), p_free(&dw);
    }
    /* a rerun: the same bits */
    float *first = ts_test_from_dev(G, out.d, out.n);
    G->grouped_matmul_forward(out.d, inp.d, wd, rows, L, Cc, OC);
    snprintf(slot, sizeof slot, "grouped_matmul_forward L%d C%d OC%d", L, Cc, OC);
    expect_same_bits(slot, "out (rerun)", first, out.d, out.n);
    free(first);
    p_free(&inp), p_free(&w), p_free(&out), p_free(&dout);
}

/* att's layout is the backend's own (attention_saved_bytes): only `out` and `dqkv` are
 * compared; each backend's backward reads its own forward's att. Sizes in bytes: fp32
 * buffers of that many bytes, rounded up to whole floats. */
static void test_attention_heads(int Bb, int Tt, ts_att_heads h) {
    char slot[120];
    const int nh = h.NH, nkv = h.NKV, HS = h.HS;
    size_t nqkv = (size_t)Bb * Tt * ts_att_qkv_width(h),
           nout = (size_t)Bb * Tt * ts_att_out_width(h);
    pair qkv = p_in(nqkv, 1.0f);
    pair out = p_out(nout);
    size_t hs = floats_for(H->attention_saved_bytes(Bb, Tt, h));
    size_t gs = floats_for(G->attention_saved_bytes(Bb, Tt, h));
    size_t hsc = floats_for(H->attention_scratch_bytes(Bb, Tt, h));
    size_t gsc = floats_for(G->attention_scratch_bytes(Bb, Tt, h));
    pair hatt = p_out(hs ? hs : 1), gatt = p_out(gs ? gs : 1);
    pair hscr = p_out(hsc ? hsc : 1), gscr = p_out(gsc ? gsc : 1); /* workspace: NaN too */
    H->attention_forward(out.h, hatt.h, qkv.h, Bb, Tt, h);
    G->attention_forward(out.d, gatt.d, qkv.d, Bb, Tt, h);
    snprintf(slot, sizeof slot, "attention_forward B%d T%d NH%d NKV%d HS%d HSV%d scale%.3g", Bb, Tt,
             nh, nkv, HS, h.HSV, h.scale);
    expect_close(slot, "out", &out);

    pair dout = p_in(nout, 1.0f), dqkv = p_out(nqkv);
    H->attention_backward(dqkv.h, hscr.h, dout.h, qkv.h, hatt.h, Bb, Tt, h);
    G->attention_backward(dqkv.d, gscr.d, dout.d, qkv.d, gatt.d, Bb, Tt, h);
    snprintf(slot, sizeof slot, "attention_backward B%d T%d NH%d NKV%d HS%d HSV%d scale%.3g", Bb,
             Tt, nh, nkv, HS, h.HSV, h.scale);
    expect_close(slot, "dqkv", &dqkv);
    p_free(&qkv), p_free(&out), p_free(&hatt), p_free(&gatt), p_free(&hscr), p_free(&gscr);
    p_free(&dout), p_free(&dqkv);
}

static void test_attention(int Bb, int Tt, int nh, int nkv, int HS) {
    test_attention_heads(Bb, Tt, ts_att_heads_gqa(nh, nkv, HS));
}

/* Context parallelism's prefix attention: Tq queries (rows of qkv) at the last Tq of Tk
 * key positions of kv. dqkv and dkv start from the same values on both sides: the
 * backward overwrites dqkv's q columns, leaves its k and v columns, and ADDS into dkv. */
static void test_attention_prefix_heads(int Bb, int Tq, int Tk, ts_att_heads h) {
    char slot[120];
    const int nh = h.NH, nkv = h.NKV, HS = h.HS;
    size_t nqkv = (size_t)Bb * Tq * ts_att_qkv_width(h),
           nout = (size_t)Bb * Tq * ts_att_out_width(h);
    size_t nkvb = (size_t)Bb * Tk * ts_att_kv_width(h);
    pair qkv = p_in(nqkv, 1.0f), kv = p_in(nkvb, 1.0f), out = p_out(nout);
    size_t hs = floats_for(H->attention_prefix_saved_bytes(Bb, Tq, Tk, h));
    size_t gs = floats_for(G->attention_prefix_saved_bytes(Bb, Tq, Tk, h));
    size_t hsc = floats_for(H->attention_prefix_scratch_bytes(Bb, Tq, Tk, h));
    size_t gsc = floats_for(G->attention_prefix_scratch_bytes(Bb, Tq, Tk, h));
    pair hatt = p_out(hs ? hs : 1), gatt = p_out(gs ? gs : 1);
    pair hscr = p_out(hsc ? hsc : 1), gscr = p_out(gsc ? gsc : 1);
    H->attention_prefix_forward(out.h, hatt.h, qkv.h, kv.h, Bb, Tq, Tk, h);
    G->attention_prefix_forward(out.d, gatt.d, qkv.d, kv.d, Bb, Tq, Tk, h);
    snprintf(slot, sizeof slot, "attention_prefix_forward B%d Tq%d Tk%d NH%d NKV%d HS%d HSV%d", Bb,
             Tq, Tk, nh, nkv, HS, h.HSV);
    expect_close(slot, "out", &out);

    pair dout = p_in(nout, 1.0f), dqkv = p_in(nqkv, 0.5f), dkv = p_in(nkvb, 0.5f);
    H->attention_prefix_backward(dqkv.h, dkv.h, hscr.h, dout.h, qkv.h, kv.h, hatt.h, Bb, Tq, Tk, h);
    G->attention_prefix_backward(dqkv.d, dkv.d, gscr.d, dout.d, qkv.d, kv.d, gatt.d, Bb, Tq, Tk, h);
    snprintf(slot, sizeof slot, "attention_prefix_backward B%d Tq%d Tk%d NH%d NKV%d HS%d HSV%d", Bb,
             Tq, Tk, nh, nkv, HS, h.HSV);
    expect_close(slot, "dqkv (q overwritten, k v untouched)", &dqkv);
    expect_close(slot, "dkv (+=)", &dkv);
    p_free(&qkv), p_free(&kv), p_free(&out), p_free(&hatt), p_free(&gatt), p_free(&hscr);
    p_free(&gscr), p_free(&dout), p_free(&dqkv), p_free(&dkv);
}

static void test_attention_prefix(int Bb, int Tq, int Tk, int nh, int nkv, int HS) {
    test_attention_prefix_heads(Bb, Tq, Tk, ts_att_heads_gqa(nh, nkv, HS));
}

/* MLA's kind of heads: q/k of HS, v of HSV, a scale that is not 1/sqrt(HS). */
static ts_att_heads heads(int NH, int NKV, int HS, int HSV, float scale) {
    ts_att_heads h = ts_att_heads_gqa(NH, NKV, HS);
    h.HSV = HSV;
    h.scale = scale;
    return h;
}

static void test_elementwise(size_t n)
{
    char slot[80];
    pair inp = p_in(n, 3.0f), out = p_out(n);
    H->gelu_forward(out.h, inp.h, n);
    G->gelu_forward(out.d, inp.d, n);
    snprintf(slot, sizeof slot, "gelu_forward n%zu", n);
    expect_close(slot, "out", &out);

    pair dout = p_in(n, 1.0f), dinp = p_out(n);
    H->gelu_backward(dinp.h, inp.h, dout.h, n);
    G->gelu_backward(dinp.d, inp.d, dout.d, n);
    snprintf(slot, sizeof slot, "gelu_backward n%zu", n);
    expect_close(slot, "dinp", &dinp);
    /* dinp aliasing dout: the CPU's result above, in place on the device. */
    G->gelu_backward(dout.d, inp.d, dout.d, n);
    pair alias = { dinp.h, dout.d, n, NULL };
    snprintf(slot, sizeof slot, "gelu_backward n%zu in place", n);
    expect_close(slot, "dinp=dout", &alias);

    pair a = p_in(n, 1.0f), b = p_in(n, 1.0f), r = p_out(n);
    H->residual_forward(r.h, a.h, b.h, n);
    G->residual_forward(r.d, a.d, b.d, n);
    snprintf(slot, sizeof slot, "residual_forward n%zu", n);
    expect_close(slot, "out", &r);
    G->residual_forward(a.d, a.d, b.d, n); /* out aliasing a */
    pair alias2 = { r.h, a.d, n, NULL };
    snprintf(slot, sizeof slot, "residual_forward n%zu in place", n);
    expect_close(slot, "out=a", &alias2);
    p_free(&inp), p_free(&out), p_free(&dout), p_free(&dinp), p_free(&a), p_free(&b), p_free(&r);
}

static void test_crossentropy(int Nr, int Vv)
{
    char slot[80];
    int *tgt = ts_malloc((size_t)Nr * sizeof(int));
    for (int i = 0; i < Nr; i++) tgt[i] = irand(Vv);
    tgt[Nr - 1] = Vv - 1; /* the last column */
    int *dtgt = d_ints(tgt, (size_t)Nr);
    pair logits = p_in((size_t)Nr * Vv, 4.0f), losses = p_out((size_t)Nr);
    float dloss = 1.0f / (float)Nr;
    H->crossentropy_forward_backward(losses.h, logits.h, tgt, Nr, Vv, dloss);
    G->crossentropy_forward_backward(losses.d, logits.d, dtgt, Nr, Vv, dloss);
    snprintf(slot, sizeof slot, "crossentropy_fwd_bwd N%d V%d", Nr, Vv);
    expect_close(slot, "losses", &losses);
    expect_close(slot, "dlogits", &logits);
    p_free(&logits), p_free(&losses);
    G->dev_free(dtgt);
    free(tgt);
}

static void test_adamw(size_t n)
{
    char slot[80];
    pair p = p_in(n, 1.0f), g = p_in(n, 0.1f), m = p_in(n, 0.01f), v = p_in(n, 0.001f);
    for (size_t i = 0; i < n; i++) v.h[i] = fabsf(v.h[i]);
    G->memcpy_h2d(v.d, v.h, n * sizeof(float));
    for (int t = 1; t <= 3; t++) {
        float scale = t == 2 ? 0.7f : 1.0f, wd = t == 3 ? 0.0f : 0.1f;
        H->adamw_update(p.h, g.h, scale, m.h, v.h, n, 1e-2f, 0.9f, 0.95f, 1e-8f, wd, t);
        G->adamw_update(p.d, g.d, scale, m.d, v.d, n, 1e-2f, 0.9f, 0.95f, 1e-8f, wd, t);
        snprintf(slot, sizeof slot, "adamw_update n%zu t%d", n, t);
        expect_close(slot, "param", &p);
        expect_close(slot, "m", &m);
        expect_close(slot, "v", &v);
    }
    expect_close("adamw_update", "grad (unchanged)", &g);
    p_free(&p), p_free(&g), p_free(&m), p_free(&v);
}

static void test_vocab_parallel(void)
{
    const int v0 = 10, nv = 15; /* rows [10, 25) of V = 37 */
    int tok[N];
    for (int i = 0; i < N; i++) tok[i] = irand(V);
    tok[0] = v0, tok[1] = v0 + nv - 1, tok[2] = v0 - 1, tok[3] = v0 + nv, tok[4] = v0;
    int *dtok = d_ints(tok, N);
    pair wte = p_in((size_t)nv * C, 1.0f), wpe = p_in((size_t)T * C, 1.0f);
    for (int with_wpe = 0; with_wpe < 2; with_wpe++) {
        pair out = p_out((size_t)N * C);
        H->vocab_embed_forward(out.h, tok, wte.h, with_wpe ? wpe.h : NULL, v0, nv, B, T, C);
        G->vocab_embed_forward(out.d, dtok, wte.d, with_wpe ? wpe.d : NULL, v0, nv, B, T, C);
        expect_close(with_wpe ? "vocab_embed_forward" : "vocab_embed_forward nowpe", "out", &out);
        p_free(&out);

        pair dout = p_in((size_t)N * C, 1.0f);
        pair dwte = p_in((size_t)nv * C, 0.5f), dwpe = p_in((size_t)T * C, 0.5f);
        H->vocab_embed_backward(dwte.h, with_wpe ? dwpe.h : NULL, dout.h, tok, v0, nv, B, T, C);
        G->vocab_embed_backward(dwte.d, with_wpe ? dwpe.d : NULL, dout.d, dtok, v0, nv, B, T, C);
        const char *slot = with_wpe ? "vocab_embed_backward" : "vocab_embed_backward nowpe";
        expect_close(slot, "dwte (+=)", &dwte);
        expect_close(slot, with_wpe ? "dwpe (+=)" : "dwpe (untouched)", &dwpe);
        p_free(&dout), p_free(&dwte), p_free(&dwpe);
    }
    p_free(&wte), p_free(&wpe);
    G->dev_free(dtok);

    /* Cross-entropy over this rank's columns; one rank, so the caller's all-reduces are
     * identities. Each backend's later pass reads its own earlier results. */
    int tgt[N];
    for (int i = 0; i < N; i++) tgt[i] = irand(V);
    tgt[0] = v0, tgt[1] = v0 + nv - 1, tgt[2] = v0 - 1, tgt[3] = v0 + nv;
    int *dtgt = d_ints(tgt, N);
    pair logits = p_in((size_t)N * nv, 4.0f);
    pair rowmax = p_out(N), tlogit = p_out(N), sumexp = p_out(N), losses = p_out(N);
    H->xent_vp_stats(rowmax.h, tlogit.h, logits.h, tgt, v0, nv, N);
    G->xent_vp_stats(rowmax.d, tlogit.d, logits.d, dtgt, v0, nv, N);
    expect_close("xent_vp_stats", "rowmax", &rowmax);
    expect_close("xent_vp_stats", "target_logit", &tlogit);
    H->xent_vp_sumexp(sumexp.h, logits.h, rowmax.h, N, nv);
    G->xent_vp_sumexp(sumexp.d, logits.d, rowmax.d, N, nv);
    expect_close("xent_vp_sumexp", "sumexp", &sumexp);
    float dloss = 1.0f / N;
    H->xent_vp_finish(losses.h, logits.h, tgt, v0, nv, rowmax.h, sumexp.h, tlogit.h, N, dloss);
    G->xent_vp_finish(losses.d, logits.d, dtgt, v0, nv, rowmax.d, sumexp.d, tlogit.d, N, dloss);
    expect_close("xent_vp_finish", "losses", &losses);
    expect_close("xent_vp_finish", "dlogits", &logits);
    p_free(&logits), p_free(&rowmax), p_free(&tlogit), p_free(&sumexp), p_free(&losses);
    G->dev_free(dtgt);
}

/* ---- the bf16 tables against the fp32 CUDA tables -------------------------------- */

static const ts_kernels *F = &ts_kernels_cuda;      /* the reference (fp32 activations) */
static const ts_kernels *Q = &ts_kernels_cuda_bf16; /* under test (bf16 activations) */

/* An activation of both: host values (rounded to bf16), the fp32 table's copy and the
 * bf16 table's, each at its buffer's start plus `off` elements (off 1: 4- or 2-byte
 * aligned, as a piece of a flat buffer may be). */
typedef struct {
    float *h;
    float *f, *fbase;
    void *b, *bbase;
    size_t n;
} act_pair;

static act_pair a_from(float *h, size_t n, size_t off)
{
    act_pair p = { h, NULL, NULL, NULL, NULL, n };
    ts_bf16_round_all(h, n);
    float *padded = ts_alloc_floats(n + off);
    memcpy(padded + off, h, n * sizeof(float));
    p.fbase = ts_test_to_dev(F, padded, n + off);
    p.bbase = ts_bf16_to_dev(Q, padded, n + off);
    p.f = p.fbase + off;
    p.b = (char *)p.bbase + off * sizeof(uint16_t);
    free(padded);
    return p;
}

/* Random values in [-scale, scale), rounded to bf16. */
static act_pair a_in(size_t n, float scale, size_t off)
{
    return a_from(ts_test_rand_floats(n ? n : 1, scale), n, off);
}

/* An output: NaN in both (the fp32 one as floats, the bf16 one as 0xff bytes). */
static act_pair a_out(size_t n, size_t off)
{
    act_pair p = { NULL, NULL, NULL, NULL, NULL, n };
    p.fbase = ts_test_dev_nan(F, n + off);
    p.bbase = ts_gpu_dev_poison(Q, (n + off) * sizeof(uint16_t));
    p.f = p.fbase + off;
    p.b = (char *)p.bbase + off * sizeof(uint16_t);
    return p;
}

static void a_free(act_pair *p)
{
    free(p->h);
    F->dev_free(p->fbase);
    Q->dev_free(p->bbase);
    memset(p, 0, sizeof *p);
}

/* The bf16 table's result against the fp32 table's. */
static void a_expect(const char *slot, const char *what, const act_pair *p, double tol)
{
    float *want = ts_test_from_dev(F, p->f, p->n);
    ts_bf16_expect_close(Q, slot, what, p->b, want, p->n, tol, 0.1);
    free(want);
}

/* An fp32 buffer of both tables (statistics, losses, parameter gradients): the same
 * random pre-fill (a gradient that accumulates) or NaN (an output). */
typedef struct {
    float *ref, *got;
    size_t n;
} f32_pair;

static f32_pair g_acc(size_t n, float scale)
{
    float *h = ts_test_rand_floats(n ? n : 1, scale);
    f32_pair p = { ts_test_to_dev(F, h, n ? n : 1), ts_test_to_dev(Q, h, n ? n : 1), n };
    free(h);
    return p;
}

static f32_pair g_out(size_t n)
{
    return (f32_pair){ ts_test_dev_nan(F, n), ts_test_dev_nan(Q, n), n };
}

static void g_free(f32_pair *p)
{
    F->dev_free(p->ref);
    Q->dev_free(p->got);
}

static void g_expect(const char *slot, const char *what, const f32_pair *p, double tol)
{
    float *want = ts_test_from_dev(F, p->ref, p->n), *got = ts_test_from_dev(Q, p->got, p->n);
    ts_test_expect_close(slot, what, Q->name, got, want, p->n, tol, 0.1);
    free(want), free(got);
}

/* convert, bit for bit against the host's rounding (ts_bf16_bits). */
static void test_bf16_convert(void)
{
    enum { NE = 12, NR = 100000, NT = NE + NR };
    uint32_t edge_bits[NE] = {
        0x3f800000u, /* 1 */
        0x3f808000u, /* 1 + 2^-8: a tie, to even (down) */
        0x3f818000u, /* 1 + 3 * 2^-8: a tie, to even (up) */
        0x3f808001u, /* just above the tie: up */
        0x80000000u, /* -0 */
        0x7f800000u, /* +inf */
        0xff800000u, /* -inf */
        0x7fc00000u, /* NaN */
        0x7f800001u, /* a NaN whose payload truncation would make +inf */
        0x7f7fffffu, /* FLT_MAX: rounds to +inf */
        0x00000001u, /* the smallest subnormal: to +0 */
        0x00408000u, /* a subnormal tie */
    };
    float *x = ts_alloc_floats(NT);
    memcpy(x, edge_bits, sizeof edge_bits);
    for (int i = NE; i < NT; i++) x[i] = ts_test_frand() * 1000.0f;
    float *dx = ts_test_to_dev(F, x, NT);
    void *db = ts_gpu_dev_poison(Q, NT * sizeof(uint16_t));
    Q->convert(db, TS_DTYPE_BF16, dx, TS_DTYPE_F32, NT);
    uint16_t *bits = ts_malloc(NT * sizeof(uint16_t));
    Q->memcpy_d2h(bits, db, NT * sizeof(uint16_t));
    int bad = 0;
    for (int i = 0; i < NT; i++) {
        uint16_t want = ts_bf16_bits(x[i]);
        bool nan_in = isnan(x[i]), nan_out = (bits[i] & 0x7fffu) > 0x7f80u;
        bool ok = nan_in ? nan_out : bits[i] == want;
        if (!ok && bad++ < 5) {
            uint32_t in;
            memcpy(&in, &x[i], sizeof in);
            fprintf(stderr, "convert fp32->bf16 [%d]: 0x%08x -> 0x%04x, want 0x%04x\n", i,
                    (unsigned)in, bits[i], want);
        }
    }
    CHECKF(bad == 0, "convert fp32 -> bf16: %d of %d values wrong", bad, NT);

    /* bf16 -> fp32: exact, the bf16 bits in the upper half */
    float *dback = ts_test_dev_nan(F, NT);
    Q->convert(dback, TS_DTYPE_F32, db, TS_DTYPE_BF16, NT);
    float *back = ts_test_from_dev(F, dback, NT);
    bad = 0;
    for (int i = 0; i < NT; i++) {
        float want = ts_bf16_float(bits[i]);
        bad += isnan(want) ? !isnan(back[i]) : memcmp(&want, &back[i], sizeof want) != 0;
    }
    CHECKF(bad == 0, "convert bf16 -> fp32: %d of %d values not exact", bad, NT);

    /* equal types: copies, bit for bit; n = 0 writes nothing */
    float *dcopy = ts_test_dev_nan(F, NT);
    Q->convert(dcopy, TS_DTYPE_F32, dx, TS_DTYPE_F32, NT);
    CHECKF(ts_gpu_dev_same_bytes(Q, dcopy, dx, NT * sizeof(float)), "convert fp32 -> fp32");
    void *bcopy = ts_gpu_dev_poison(Q, NT * sizeof(uint16_t));
    Q->convert(bcopy, TS_DTYPE_BF16, db, TS_DTYPE_BF16, NT);
    CHECKF(ts_gpu_dev_same_bytes(Q, bcopy, db, NT * sizeof(uint16_t)), "convert bf16 -> bf16");
    void *untouched = ts_gpu_dev_poison(Q, 16);
    Q->convert(untouched, TS_DTYPE_BF16, dx, TS_DTYPE_F32, 0);
    unsigned char u[16];
    Q->memcpy_d2h(u, untouched, sizeof u);
    int all_ff = 1;
    for (int i = 0; i < 16; i++) all_ff &= u[i] == 0xff;
    CHECKF(all_ff, "convert with n = 0 wrote memory");
    printf("  %-40s %d values, edge cases and round trips bit for bit\n", "convert", NT);
    Q->dev_free(db), Q->dev_free(dback), Q->dev_free(dcopy), Q->dev_free(bcopy);
    Q->dev_free(untouched), F->dev_free(dx);
    free(x), free(bits), free(back);
}

static void test_bf16_encoder(void)
{
    int tok[N];
    for (int i = 0; i < N; i++) tok[i] = irand(V);
    tok[5] = tok[0], tok[11] = tok[0]; /* repeated tokens accumulate */
    int *dtok = d_ints(tok, N);
    float *wte_h = ts_test_rand_floats((size_t)V * C, 1.0f);
    float *wpe_h = ts_test_rand_floats((size_t)T * C, 1.0f);
    float *wte = ts_test_to_dev(F, wte_h, (size_t)V * C);
    float *wpe = ts_test_to_dev(F, wpe_h, (size_t)T * C);
    act_pair out = a_out((size_t)N * C, 0);
    F->encoder_forward(out.f, dtok, wte, wpe, B, T, C);
    Q->encoder_forward(out.b, dtok, wte, wpe, B, T, C);
    a_expect("bf16 encoder_forward", "out", &out, TOL_BF16);

    act_pair dout = a_in((size_t)N * C, 1.0f, 0);
    f32_pair dwte = g_acc((size_t)V * C, 0.5f), dwpe = g_acc((size_t)T * C, 0.5f);
    F->encoder_backward(dwte.ref, dwpe.ref, dout.f, dtok, B, T, C);
    Q->encoder_backward(dwte.got, dwpe.got, dout.b, dtok, B, T, C);
    g_expect("bf16 encoder_backward", "dwte (+=)", &dwte, TOL);
    g_expect("bf16 encoder_backward", "dwpe (+=)", &dwpe, TOL);

    /* vocab-parallel: rows [10, 25) of V, wpe on this rank or not */
    const int v0 = 10, nv = 15;
    for (int with_wpe = 0; with_wpe < 2; with_wpe++) {
        act_pair o = a_out((size_t)N * C, 0);
        F->vocab_embed_forward(o.f, dtok, wte, with_wpe ? wpe : NULL, v0, nv, B, T, C);
        Q->vocab_embed_forward(o.b, dtok, wte, with_wpe ? wpe : NULL, v0, nv, B, T, C);
        a_expect("bf16 vocab_embed_forward", with_wpe ? "out" : "out (no wpe)", &o, TOL_BF16);
        f32_pair dw = g_acc((size_t)nv * C, 0.5f), dp = g_acc((size_t)T * C, 0.5f);
        F->vocab_embed_backward(dw.ref, with_wpe ? dp.ref : NULL, dout.f, dtok, v0, nv, B, T, C);
        Q->vocab_embed_backward(dw.got, with_wpe ? dp.got : NULL, dout.b, dtok, v0, nv, B, T, C);
        g_expect("bf16 vocab_embed_backward", "dwte (+=)", &dw, TOL);
        g_expect("bf16 vocab_embed_backward", with_wpe ? "dwpe (+=)" : "dwpe (untouched)", &dp,
                 TOL);
        a_free(&o), g_free(&dw), g_free(&dp);
    }
    /* no position embedding (wpe, dwpe NULL) */
    act_pair out0 = a_out((size_t)N * C, 0);
    F->encoder_forward(out0.f, dtok, wte, NULL, B, T, C);
    Q->encoder_forward(out0.b, dtok, wte, NULL, B, T, C);
    a_expect("bf16 encoder_forward nowpe", "out", &out0, TOL_BF16);
    f32_pair dwte0 = g_acc((size_t)V * C, 0.5f);
    F->encoder_backward(dwte0.ref, NULL, dout.f, dtok, B, T, C);
    Q->encoder_backward(dwte0.got, NULL, dout.b, dtok, B, T, C);
    g_expect("bf16 encoder_backward nowpe", "dwte (+=)", &dwte0, TOL);
    a_free(&out0), g_free(&dwte0);
    a_free(&out), a_free(&dout), g_free(&dwte), g_free(&dwpe);
    F->dev_free(wte), F->dev_free(wpe), F->dev_free(dtok);
    free(wte_h), free(wpe_h);
}

static void test_bf16_layernorm(int Nr, int Cc)
{
    char slot[64];
    float *x = ts_test_rand_floats((size_t)Nr * Cc, 2.0f);
    for (size_t i = 0; i < (size_t)Nr * Cc; i++) x[i] += 0.5f; /* a non-zero mean */
    act_pair inp = a_from(x, (size_t)Nr * Cc, 0);
    float *w_h = ts_test_rand_floats((size_t)Cc, 1.0f);
    float *b_h = ts_test_rand_floats((size_t)Cc, 1.0f);
    float *w = ts_test_to_dev(F, w_h, (size_t)Cc), *b = ts_test_to_dev(F, b_h, (size_t)Cc);
    act_pair out = a_out((size_t)Nr * Cc, 0);
    f32_pair mean = g_out((size_t)Nr), rstd = g_out((size_t)Nr);
    F->layernorm_forward(out.f, mean.ref, rstd.ref, inp.f, w, b, Nr, Cc);
    Q->layernorm_forward(out.b, mean.got, rstd.got, inp.b, w, b, Nr, Cc);
    snprintf(slot, sizeof slot, "bf16 layernorm_forward %dx%d", Nr, Cc);
    a_expect(slot, "out", &out, TOL_BF16);
    g_expect(slot, "mean", &mean, TOL);
    g_expect(slot, "rstd", &rstd, TOL);

    act_pair dout = a_in((size_t)Nr * Cc, 1.0f, 0), dinp = a_in((size_t)Nr * Cc, 0.5f, 0);
    f32_pair dw = g_acc((size_t)Cc, 0.5f), db = g_acc((size_t)Cc, 0.5f);
    F->layernorm_backward(dinp.f, dw.ref, db.ref, dout.f, inp.f, w, mean.ref, rstd.ref, Nr, Cc);
    Q->layernorm_backward(dinp.b, dw.got, db.got, dout.b, inp.b, w, mean.got, rstd.got, Nr, Cc);
    snprintf(slot, sizeof slot, "bf16 layernorm_backward %dx%d", Nr, Cc);
    a_expect(slot, "dinp (+=)", &dinp, TOL_BF16);
    g_expect(slot, "dweight (+=)", &dw, TOL_BF16_GRAD);
    g_expect(slot, "dbias (+=)", &db, TOL_BF16_GRAD);
    a_free(&inp), a_free(&out), a_free(&dout), a_free(&dinp);
    g_free(&mean), g_free(&rstd), g_free(&dw), g_free(&db);
    F->dev_free(w), F->dev_free(b);
    free(w_h), free(b_h);
}

static void test_bf16_rmsnorm(int Nr, int Cc, float eps)
{
    char slot[64];
    const size_t n = (size_t)Nr * Cc;
    act_pair inp = a_in(n, 2.0f, 0), out = a_out(n, 0);
    float *w_h = ts_test_rand_floats((size_t)Cc, 1.0f);
    float *w = ts_test_to_dev(F, w_h, (size_t)Cc);
    f32_pair rstd = g_out((size_t)Nr);
    F->rmsnorm_forward(out.f, rstd.ref, inp.f, w, Nr, Cc, eps);
    Q->rmsnorm_forward(out.b, rstd.got, inp.b, w, Nr, Cc, eps);
    snprintf(slot, sizeof slot, "bf16 rmsnorm_forward %dx%d", Nr, Cc);
    a_expect(slot, "out", &out, TOL_BF16);
    g_expect(slot, "rstd", &rstd, TOL);

    act_pair dout = a_in(n, 1.0f, 0), dinp = a_in(n, 0.5f, 0);
    f32_pair dw = g_acc((size_t)Cc, 0.5f);
    F->rmsnorm_backward(dinp.f, dw.ref, dout.f, inp.f, w, rstd.ref, Nr, Cc);
    Q->rmsnorm_backward(dinp.b, dw.got, dout.b, inp.b, w, rstd.got, Nr, Cc);
    snprintf(slot, sizeof slot, "bf16 rmsnorm_backward %dx%d", Nr, Cc);
    a_expect(slot, "dinp (+=)", &dinp, TOL_BF16);
    g_expect(slot, "dweight (+=)", &dw, TOL_BF16_GRAD);
    a_free(&inp), a_free(&out), a_free(&dout), a_free(&dinp);
    g_free(&rstd), g_free(&dw);
    F->dev_free(w);
    free(w_h);
}

/* The bf16 RoPE against the fp32 one on the same values, in place; the v heads keep
 * their bits. */
static void test_bf16_rope(int Bb, int Tt, int nh, int nkv, int HS)
{
    char slot[96];
    const size_t row = (size_t)(nh + 2 * nkv) * HS, n = (size_t)Bb * Tt * row;
    const size_t ntab = (size_t)Tt * (HS / 2);
    float *cs, *sn;
    rope_tables(&cs, &sn, Tt, HS);
    float *dcs = ts_test_to_dev(F, cs, ntab + 1), *dsn = ts_test_to_dev(F, sn, ntab + 1);
    act_pair x = a_in(n, 1.0f, 0);
    uint16_t *before = ts_malloc(n * sizeof(uint16_t)), *after = ts_malloc(n * sizeof(uint16_t));
    Q->memcpy_d2h(before, x.b, n * sizeof(uint16_t));
    F->rope_forward(x.f, dcs, dsn, Bb, Tt, ts_att_heads_gqa(nh, nkv, HS), HS, false);
    Q->rope_forward(x.b, dcs, dsn, Bb, Tt, ts_att_heads_gqa(nh, nkv, HS), HS, false);
    snprintf(slot, sizeof slot, "bf16 rope_forward B%d T%d NH%d NKV%d HS%d", Bb, Tt, nh, nkv, HS);
    a_expect(slot, "qkv (in place)", &x, TOL_BF16);
    Q->memcpy_d2h(after, x.b, n * sizeof(uint16_t));
    size_t moved = 0;
    for (size_t r = 0; r < (size_t)Bb * Tt; r++)
        for (size_t c = (size_t)(nh + nkv) * HS; c < row; c++)
            moved += before[r * row + c] != after[r * row + c];
    CHECKF(moved == 0, "%s: %zu values of the v heads changed", slot, moved);

    act_pair d = a_in(n, 1.0f, 0);
    F->rope_backward(d.f, dcs, dsn, Bb, Tt, ts_att_heads_gqa(nh, nkv, HS), HS, false);
    Q->rope_backward(d.b, dcs, dsn, Bb, Tt, ts_att_heads_gqa(nh, nkv, HS), HS, false);
    snprintf(slot, sizeof slot, "bf16 rope_backward B%d T%d NH%d NKV%d HS%d", Bb, Tt, nh, nkv,
             HS);
    a_expect(slot, "dqkv (in place)", &d, TOL_BF16);
    a_free(&x), a_free(&d);
    F->dev_free(dcs), F->dev_free(dsn);
    free(cs), free(sn), free(before), free(after);
}

static void test_bf16_swiglu(int Nr, int Ff)
{
    char slot[64];
    act_pair inp = a_in((size_t)Nr * 2 * Ff, 4.0f, 0), out = a_out((size_t)Nr * Ff, 0);
    F->swiglu_forward(out.f, inp.f, Nr, Ff);
    Q->swiglu_forward(out.b, inp.b, Nr, Ff);
    snprintf(slot, sizeof slot, "bf16 swiglu_forward N%d F%d", Nr, Ff);
    a_expect(slot, "out", &out, TOL_BF16);
    act_pair dout = a_in((size_t)Nr * Ff, 1.0f, 0), dinp = a_out((size_t)Nr * 2 * Ff, 0);
    F->swiglu_backward(dinp.f, inp.f, dout.f, Nr, Ff);
    Q->swiglu_backward(dinp.b, inp.b, dout.b, Nr, Ff);
    snprintf(slot, sizeof slot, "bf16 swiglu_backward N%d F%d", Nr, Ff);
    a_expect(slot, "dinp", &dinp, TOL_BF16);
    a_free(&inp), a_free(&out), a_free(&dout), a_free(&dinp);
}

/* Operands at `off` elements past their buffers' starts (off 1: bf16 operands only
 * 2-byte aligned, which cuBLASLt's algorithms refuse: the cublasGemmEx fallback; a bias
 * 4-byte aligned: no fused epilogue). N * OC above 8 Mi takes the biased forward through
 * more than one chunk of its fp32 scratch. */
static void test_bf16_matmul(int Nr, int Cc, int OC, size_t off)
{
    char slot[96];
    size_t ni = (size_t)Nr * Cc, nw = (size_t)OC * Cc, no = (size_t)Nr * OC;
    act_pair inp = a_in(ni, 1.0f, off), w = a_in(nw, 1.0f, off);
    float *bias_h = ts_test_rand_floats((size_t)OC + off, 1.0f);
    float *bias_base = ts_test_to_dev(F, bias_h, (size_t)OC + off), *bias = bias_base + off;
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        act_pair out = a_out(no, off);
        F->matmul_forward(out.f, inp.f, w.f, with_bias ? bias : NULL, Nr, Cc, OC);
        Q->matmul_forward(out.b, inp.b, w.b, with_bias ? bias : NULL, Nr, Cc, OC);
        snprintf(slot, sizeof slot, "bf16 matmul_forward %dx%dx%d%s%s", Nr, Cc, OC,
                 with_bias ? "" : " nobias", off ? " +1" : "");
        a_expect(slot, "out", &out, TOL_BF16);
        /* the same bits again, on a fresh poisoned output */
        act_pair again = a_out(no, off);
        Q->matmul_forward(again.b, inp.b, w.b, with_bias ? bias : NULL, Nr, Cc, OC);
        CHECKF(ts_gpu_dev_same_bytes(Q, out.b, again.b, no * sizeof(uint16_t)),
               "%s: a second run differs in its bits", slot);
        a_free(&out), a_free(&again);
    }
    act_pair dout = a_in(no, 1.0f, off);
    for (int mask = 1; mask < 8; mask++) { /* bit 0 dinp, 1 dweight, 2 dbias */
        act_pair dinp = a_out(ni, off);
        f32_pair dw = g_acc(nw, 0.5f), db = g_acc((size_t)OC, 0.5f);
        F->matmul_backward(mask & 1 ? dinp.f : NULL, mask & 2 ? dw.ref : NULL,
                           mask & 4 ? db.ref : NULL, dout.f, inp.f, w.f, Nr, Cc, OC);
        Q->matmul_backward(mask & 1 ? dinp.b : NULL, mask & 2 ? dw.got : NULL,
                           mask & 4 ? db.got : NULL, dout.b, inp.b, w.b, Nr, Cc, OC);
        snprintf(slot, sizeof slot, "bf16 matmul_backward %dx%dx%d [%s%s%s]%s", Nr, Cc, OC,
                 mask & 1 ? "i" : "-", mask & 2 ? "w" : "-", mask & 4 ? "b" : "-",
                 off ? " +1" : "");
        if (mask & 1) a_expect(slot, "dinp", &dinp, TOL_BF16);
        g_expect(slot, mask & 2 ? "dweight (+=)" : "dweight (untouched)", &dw, TOL_BF16_GRAD);
        g_expect(slot, mask & 4 ? "dbias (+=)" : "dbias (untouched)", &db, TOL_BF16_GRAD);
        a_free(&dinp), g_free(&dw), g_free(&db);
    }
    a_free(&inp), a_free(&w), a_free(&dout);
    F->dev_free(bias_base);
    free(bias_h);
}

/* The bf16 grouped GEMMs (grouped bf16 forward and input gradient; the fp32 weight
 * gradients one cuBLASLt call per expert) against the fp32 table's on the same values. */
static void test_bf16_grouped_matmul(int Cc, int OC)
{
    char slot[96];
    const int L = GROUPED_L, *rows = GROUPED_ROWS;
    int R = 0;
    for (int e = 0; e < L; e++) R += rows[e];
    const size_t nw = (size_t)OC * Cc;
    act_pair inp = a_in((size_t)R * Cc, 1.0f, 0), w = a_in(L * nw, 1.0f, 0);
    act_pair out = a_out((size_t)R * OC, 0), dout = a_in((size_t)R * OC, 1.0f, 0);
    act_pair dinp = a_out((size_t)R * Cc, 0);
    f32_pair dw = g_acc(L * nw, 0.5f);
    const void *wf[GROUPED_L], *wb[GROUPED_L];
    float *dwf[GROUPED_L], *dwb[GROUPED_L];
    for (int e = 0; e < L; e++) {
        wf[e] = w.f + e * nw, wb[e] = (const uint16_t *)w.b + e * nw;
        dwf[e] = dw.ref + e * nw, dwb[e] = dw.got + e * nw;
    }
    F->grouped_matmul_forward(out.f, inp.f, wf, rows, L, Cc, OC);
    Q->grouped_matmul_forward(out.b, inp.b, wb, rows, L, Cc, OC);
    snprintf(slot, sizeof slot, "bf16 grouped_matmul_forward L%d C%d OC%d", L, Cc, OC);
    a_expect(slot, "out", &out, TOL_BF16);
    F->grouped_matmul_backward(dinp.f, dwf, dout.f, inp.f, wf, rows, L, Cc, OC);
    Q->grouped_matmul_backward(dinp.b, dwb, dout.b, inp.b, wb, rows, L, Cc, OC);
    snprintf(slot, sizeof slot, "bf16 grouped_matmul_backward L%d C%d OC%d", L, Cc, OC);
    a_expect(slot, "dinp", &dinp, TOL_BF16);
    g_expect(slot, "dweights (+=)", &dw, TOL_BF16_GRAD);
    a_free(&inp), a_free(&w), a_free(&out), a_free(&dout), a_free(&dinp), g_free(&dw);
}

/* The bf16 table's attention (its own saved state and scratch, poisoned) against the
 * fp32 table's of the same choice (gemm or flash). */
static void test_bf16_attention_heads(int Bb, int Tt, ts_att_heads h) {
    char slot[120];
    const int nh = h.NH, nkv = h.NKV, HS = h.HS;
    size_t nqkv = (size_t)Bb * Tt * ts_att_qkv_width(h),
           nout = (size_t)Bb * Tt * ts_att_out_width(h);
    act_pair qkv = a_in(nqkv, 1.0f, 0), out = a_out(nout, 0);
    float *fatt = ts_test_dev_nan(F, floats_for(F->attention_saved_bytes(Bb, Tt, h)));
    float *fscr = ts_test_dev_nan(F, floats_for(F->attention_scratch_bytes(Bb, Tt, h)));
    void *qatt = ts_gpu_dev_poison(Q, Q->attention_saved_bytes(Bb, Tt, h));
    void *qscr = ts_gpu_dev_poison(Q, Q->attention_scratch_bytes(Bb, Tt, h));
    F->attention_forward(out.f, fatt, qkv.f, Bb, Tt, h);
    Q->attention_forward(out.b, qatt, qkv.b, Bb, Tt, h);
    snprintf(slot, sizeof slot, "bf16 attention_forward B%d T%d NH%d NKV%d HS%d HSV%d", Bb, Tt, nh,
             nkv, HS, h.HSV);
    a_expect(slot, "out", &out, TOL_BF16_ATT);

    act_pair dout = a_in(nout, 1.0f, 0), dqkv = a_out(nqkv, 0);
    F->attention_backward(dqkv.f, fscr, dout.f, qkv.f, fatt, Bb, Tt, h);
    Q->attention_backward(dqkv.b, qscr, dout.b, qkv.b, qatt, Bb, Tt, h);
    snprintf(slot, sizeof slot, "bf16 attention_backward B%d T%d NH%d NKV%d HS%d HSV%d", Bb, Tt, nh,
             nkv, HS, h.HSV);
    a_expect(slot, "dqkv", &dqkv, TOL_BF16_ATT);
    /* the same bits again, on fresh poisoned buffers (a kv head's sums in a fixed order) */
    void *again = ts_gpu_dev_poison(Q, nqkv * sizeof(uint16_t));
    void *qscr2 = ts_gpu_dev_poison(Q, Q->attention_scratch_bytes(Bb, Tt, h));
    Q->attention_backward(again, qscr2, dout.b, qkv.b, qatt, Bb, Tt, h);
    CHECKF(ts_gpu_dev_same_bytes(Q, again, dqkv.b, nqkv * sizeof(uint16_t)),
           "%s: a second backward differs in its bits", slot);
    Q->dev_free(again), Q->dev_free(qscr2);
    a_free(&qkv), a_free(&out), a_free(&dout), a_free(&dqkv);
    F->dev_free(fatt), F->dev_free(fscr), Q->dev_free(qatt), Q->dev_free(qscr);
}

static void test_bf16_attention(int Bb, int Tt, int nh, int nkv, int HS) {
    test_bf16_attention_heads(Bb, Tt, ts_att_heads_gqa(nh, nkv, HS));
}

static void test_bf16_elementwise(size_t n)
{
    char slot[80];
    act_pair inp = a_in(n, 3.0f, 0), out = a_out(n, 0);
    F->gelu_forward(out.f, inp.f, n);
    Q->gelu_forward(out.b, inp.b, n);
    snprintf(slot, sizeof slot, "bf16 gelu_forward n%zu", n);
    a_expect(slot, "out", &out, TOL_BF16);

    act_pair dout = a_in(n, 1.0f, 0), dinp = a_out(n, 0);
    F->gelu_backward(dinp.f, inp.f, dout.f, n);
    Q->gelu_backward(dinp.b, inp.b, dout.b, n);
    snprintf(slot, sizeof slot, "bf16 gelu_backward n%zu", n);
    a_expect(slot, "dinp", &dinp, TOL_BF16);
    /* dinp aliasing dout: the same bits as into a separate buffer */
    Q->gelu_backward(dout.b, inp.b, dout.b, n);
    CHECKF(ts_gpu_dev_same_bytes(Q, dout.b, dinp.b, n * sizeof(uint16_t)),
           "%s: in place (dinp = dout) differs from a separate dinp", slot);

    act_pair a = a_in(n, 1.0f, 0), b = a_in(n, 1.0f, 0), r = a_out(n, 0);
    F->residual_forward(r.f, a.f, b.f, n);
    Q->residual_forward(r.b, a.b, b.b, n);
    snprintf(slot, sizeof slot, "bf16 residual_forward n%zu", n);
    a_expect(slot, "out", &r, TOL_BF16);
    Q->residual_forward(a.b, a.b, b.b, n); /* out aliasing a */
    CHECKF(ts_gpu_dev_same_bytes(Q, a.b, r.b, n * sizeof(uint16_t)),
           "%s: in place (out = a) differs from a separate out", slot);
    a_free(&inp), a_free(&out), a_free(&dout), a_free(&dinp), a_free(&a), a_free(&b), a_free(&r);
}

static void test_bf16_crossentropy(int Nr, int Vv)
{
    char slot[80];
    int *tgt = ts_malloc((size_t)Nr * sizeof(int));
    for (int i = 0; i < Nr; i++) tgt[i] = irand(Vv);
    tgt[Nr - 1] = Vv - 1;
    int *dtgt = d_ints(tgt, (size_t)Nr);
    act_pair logits = a_in((size_t)Nr * Vv, 4.0f, 0);
    f32_pair losses = g_out((size_t)Nr);
    float dloss = 1.0f / (float)Nr;
    F->crossentropy_forward_backward(losses.ref, logits.f, dtgt, Nr, Vv, dloss);
    Q->crossentropy_forward_backward(losses.got, logits.b, dtgt, Nr, Vv, dloss);
    snprintf(slot, sizeof slot, "bf16 crossentropy_fwd_bwd N%d V%d", Nr, Vv);
    g_expect(slot, "losses", &losses, TOL);
    a_expect(slot, "dlogits", &logits, TOL_BF16);
    a_free(&logits), g_free(&losses);
    F->dev_free(dtgt);
    free(tgt);
}

static void test_bf16_xent_vp(void)
{
    const int v0 = 10, nv = 15;
    int tgt[N];
    for (int i = 0; i < N; i++) tgt[i] = irand(V);
    tgt[0] = v0, tgt[1] = v0 + nv - 1, tgt[2] = v0 - 1, tgt[3] = v0 + nv;
    int *dtgt = d_ints(tgt, N);
    act_pair logits = a_in((size_t)N * nv, 4.0f, 0);
    f32_pair rowmax = g_out(N), tlogit = g_out(N), sumexp = g_out(N), losses = g_out(N);
    F->xent_vp_stats(rowmax.ref, tlogit.ref, logits.f, dtgt, v0, nv, N);
    Q->xent_vp_stats(rowmax.got, tlogit.got, logits.b, dtgt, v0, nv, N);
    g_expect("bf16 xent_vp_stats", "rowmax", &rowmax, TOL);
    g_expect("bf16 xent_vp_stats", "target_logit", &tlogit, TOL);
    F->xent_vp_sumexp(sumexp.ref, logits.f, rowmax.ref, N, nv);
    Q->xent_vp_sumexp(sumexp.got, logits.b, rowmax.got, N, nv);
    g_expect("bf16 xent_vp_sumexp", "sumexp", &sumexp, TOL);
    float dloss = 1.0f / N;
    F->xent_vp_finish(losses.ref, logits.f, dtgt, v0, nv, rowmax.ref, sumexp.ref, tlogit.ref, N,
                      dloss);
    Q->xent_vp_finish(losses.got, logits.b, dtgt, v0, nv, rowmax.got, sumexp.got, tlogit.got, N,
                      dloss);
    g_expect("bf16 xent_vp_finish", "losses", &losses, TOL);
    a_expect("bf16 xent_vp_finish", "dlogits", &logits, TOL_BF16);
    a_free(&logits), g_free(&rowmax), g_free(&tlogit), g_free(&sumexp), g_free(&losses);
    F->dev_free(dtgt);
}

/* Every bf16 kernel of table `bf16` against the fp32 table `fp32` of the same attention. */
static void test_bf16_table(const ts_kernels *fp32, const ts_kernels *bf16)
{
    F = fp32, Q = bf16;
    printf("test_cuda_kernels: %s vs %s, relative tolerance %.0e (attention %.0e)\n", Q->name,
           F->name, TOL_BF16, TOL_BF16_ATT);
    test_bf16_convert();
    test_bf16_encoder();
    test_bf16_layernorm(N, C);
    test_bf16_layernorm(5, 200);
    test_bf16_layernorm(3, 1031);
    test_bf16_matmul(N, C, 3 * C, 0);
    test_bf16_matmul(N, C, V, 0);
    test_bf16_matmul(67, 96, 130, 0);
    test_bf16_matmul(128, 256, 768, 0);
    test_bf16_matmul(67, 96, 130, 1);
    test_bf16_matmul(2100, 64, 4096, 0); /* 8.6 Mi outputs: two chunks of the bias scratch */
    test_bf16_grouped_matmul(96, 130);
    test_bf16_grouped_matmul(512, 2048);
    test_bf16_rmsnorm(N, C, 1e-5f);
    test_bf16_rmsnorm(5, 200, 1e-6f);
    test_bf16_rmsnorm(3, 1031, 1e-5f);
    test_bf16_attention(B, T, NH, NH, C / NH);
    test_bf16_attention(1, 67, 2, 2, 16);
    test_bf16_attention(2, 40, 2, 2, 64);
    test_bf16_attention(4, 33, 2, 2, 16); /* B > NH: the other batching branch */
    test_bf16_attention(3, 5, 1, 1, 8);
    test_bf16_attention(1, 40, 1, 1, 300); /* wider than flash takes: the GEMMs either way */
    /* grouped-query: groups of 2, 3 and 4, one kv head, B below and above NKV */
    test_bf16_attention(2, 40, 4, 2, 16);
    test_bf16_attention(1, 67, 6, 1, 64);
    test_bf16_attention(4, 33, 8, 2, 32);
    test_bf16_attention(3, 5, 3, 1, 8);
    test_bf16_attention(1, 40, 2, 1, 300);
    test_bf16_rope(B, T, NH, NH, C / NH);
    test_bf16_rope(2, 33, 8, 2, 64);
    test_bf16_rope(1, 17, 4, 1, 128);
    /* the general heads: q/k wider than v, v wider than q/k (grouped: the bf16
     * accumulator's NKV (HS + HSV) columns outgrow NH HS), DeepSeek-V3's 192 / 128 */
    test_bf16_attention_heads(2, 40, heads(4, 4, 24, 16, 0.3f));
    test_bf16_attention_heads(1, 5, heads(4, 2, 8, 24, 0.35f));
    test_bf16_attention_heads(1, 70, heads(8, 8, 192, 128, 0.135f));
    test_bf16_swiglu(N, 4 * C);
    test_bf16_swiglu(67, 1001);
    test_bf16_elementwise((size_t)N * 4 * C + 1);
    test_bf16_elementwise(100003);
    test_bf16_crossentropy(N, V);
    test_bf16_crossentropy(5, 1000);
    test_bf16_xent_vp();
}

/* Usage: test_cuda_kernels [gemm|flash]: the attention of the fp32 and bf16 tables under
 * test (train.attention; default gemm). */
int main(int argc, char **argv)
{
    ts_test_rng = 0x2545F4914F6CDD1Dull; /* this file's inputs, as they always were */
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *attention = argc > 1 ? argv[1] : "gemm";
    const ts_kernels *fp32 = ts_kernels_for("cuda", "fp32", attention);
    const ts_kernels *bf16 = ts_kernels_for("cuda", "bf16", attention);
    if (!fp32 || !bf16) {
        fprintf(stderr, "test_cuda_kernels: no CUDA tables for attention '%s' (gemm, flash)\n",
                attention);
        return 2;
    }
    G = fp32;
    test_table(); /* needs no device */
    int devices = ts_cuda_device_count();
    if (devices == 0) {
        printf("test_cuda_kernels: no CUDA device here (ts_cuda_device_count() == 0): "
               "skipped; the table is complete\n");
        return ts_test_failed ? ts_test_report() : 77;
    }
    printf("test_cuda_kernels: %d CUDA device(s); %s vs cpu, relative tolerance %.0e\n",
           devices, G->name, TOL);
    test_memory();
    test_sums();
    test_streams();
    test_encoder();
    test_layernorm(N, C);
    test_layernorm(5, 200);
    test_layernorm(3, 1031);
    test_matmul(N, C, 3 * C, 0);
    test_matmul(N, C, V, 0);
    test_matmul(67, 96, 130, 0);
    test_matmul(128, 256, 768, 0);
    test_matmul(67, 96, 130, 1);
    test_grouped_matmul(96, 130);
    test_grouped_matmul(512, 2048); /* Mixtral-4l's gate|up shape (bench/RESULTS.md) */
    test_rmsnorm(N, C, 1e-5f);
    test_rmsnorm(5, 200, 1e-6f);
    test_rmsnorm(3, 1031, 1e-5f);
    test_rmsnorm(67, 4096, 1e-5f);
    test_attention(B, T, NH, NH, C / NH);
    test_attention(1, 67, 2, 2, 16);
    test_attention(2, 40, 2, 2, 64);
    /* B > NH: the GEMMs loop over heads and batch over sequences (the other branch). */
    test_attention(4, 33, 2, 2, 16);
    test_attention(3, 5, 1, 1, 8);
    /* Grouped-query attention: groups of 2, 3 and 4 query heads, one kv head
     * (multi-query), B below and above NKV; a head wider than flash takes. */
    test_attention(2, 40, 4, 2, 16);
    test_attention(1, 67, 6, 1, 64);
    test_attention(4, 33, 8, 2, 32);
    test_attention(3, 5, 3, 1, 8);
    test_attention(1, 40, 2, 1, 300);
    /* cp's chunks: c queries against a prefix of (j + 1) c keys; Tq = Tk is the square */
    test_attention_prefix(1, 16, 48, 4, 2, 16);
    test_attention_prefix(2, 10, 40, 4, 1, 32);
    test_attention_prefix(1, 33, 33, 2, 2, 8);
    test_rope(B, T, NH, NH, C / NH);
    test_rope(2, 33, 8, 2, 64);
    test_rope(1, 17, 4, 1, 128);
    test_rope(3, 5, 2, 1, 6);
    /* the general heads (kernels.h ts_att_heads): q/k wider than v (DeepSeek-V3's 192 and
     * 128 at 8 heads), v wider than q/k, grouped, 16- and 32-wide flash tiles, scales not
     * 1/sqrt(HS); the prefix kernels on them; RoPE on the last RD channels, both orders */
    test_attention_heads(2, 40, heads(4, 4, 24, 16, 0.3f));
    test_attention_heads(1, 67, heads(4, 2, 24, 16, 0.35f));
    test_attention_heads(3, 33, heads(3, 1, 8, 12, 0.9f));
    test_attention_heads(1, 70, heads(8, 8, 192, 128, 0.135f));
    test_attention_prefix_heads(1, 16, 48, heads(4, 4, 24, 16, 0.3f));
    test_attention_prefix_heads(2, 10, 40, heads(4, 2, 24, 16, 0.35f));
    for (int il = 0; il < 2; il++) {
        test_rope_heads(2, 33, heads(4, 4, 24, 16, 0.3f), 8, il);
        test_rope_heads(1, 17, heads(4, 2, 10, 6, 0.3f), 6, il);
        test_rope_heads(1, 9, heads(2, 1, 8, 8, 0.3f), 8, il);
    }
    test_swiglu(N, 4 * C);
    test_swiglu(67, 1001);
    test_swiglu(3, 1);
    test_moe(39, 13, (ts_moe_routing){8, 2, 1, 1, false, true, 1.0f}, 45, false);
    test_moe(26, 13, (ts_moe_routing){16, 4, 4, 2, true, true, 2.5f}, 300, true);
    test_moe(64, 32, (ts_moe_routing){64, 6, 1, 1, false, false, 1.0f}, 129, false);
    test_elementwise((size_t)N * 4 * C + 1);
    test_elementwise(100003);
    test_crossentropy(N, V);
    test_crossentropy(5, 1000);
    test_adamw(1001);
    test_vocab_parallel();

    /* The bf16 table of the same attention against the fp32 one. */
    test_bf16_table(fp32, bf16);
    return ts_test_report();
}
