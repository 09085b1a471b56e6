/* The CUDA backend (kernels/cuda) against the CPU backend, slot by slot: the same random
 * inputs on both, every device output first poisoned with NaN (so a value the kernel
 * fails to write shows), gradients that accumulate pre-filled with non-zero values (so
 * `=` where `+=` is due shows), and each result within a relative 1e-5 of the CPU's
 * (the floor of the relative error is a tenth of the largest |value| of that output, so
 * values near zero are judged on the output's own scale). Also: copies, overlapping
 * device-to-device moves in both directions, the double sums and their bitwise
 * determinism, streams and events.
 *
 * Then the bf16 table ("cuda-bf16"), through the same helpers with every device buffer
 * going through its slots (as a trainer's would): its memory and AdamW slots (wrapped
 * for its weight cache) to 1e-5; its matmuls, whose GEMMs round their operands to bf16,
 * against the CPU on the same operands rounded to bf16 on the host (the products are then
 * exact in fp32 on both sides, so 1e-4 catches a layout, a rounding mode or a stale
 * weight), and against the CPU on the fp32 operands (1e-2 of the output's largest value:
 * bf16's 8-bit significand); the bias gradient, summed from the fp32 dout, to 1e-5. And
 * its cache of bf16 weight copies: used while the weight is unchanged, refreshed after an
 * adamw_update, a memcpy_h2d, a memcpy_d2d or a memset_zero over the weight, and never
 * met again after the buffer's dev_free (a new buffer at the same address).
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

static const ts_kernels *G = &ts_kernels_cuda; /* under test (the bf16 table, later) */
static const ts_kernels *H = &ts_kernels_cpu;  /* the reference, on host memory */

#define TOL 1e-5
/* The bf16 table's matmuls against the CPU on bf16-rounded operands (floor 0.1, as
 * TOL), and against the CPU on the fp32 operands (floor 1.0: a normwise bound; the
 * rounding error of a near-zero output is a fraction of the output's scale, not of its
 * own value). */
#define TOL_BF16 1e-4
#define TOL_BF16_FP32 1e-2

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
        CHECK(!strcmp(k->attention, i % 2 ? "flash" : "gemm"));
        CHECK(k->weight_copy_bytes == (i < 2 ? 0 : 2));
        CHECK(k->device_count && k->select_device && k->current_device && k->memory_info);
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
    p_free(&wte), p_free(&wpe), p_free(&out), p_free(&dout), p_free(&dwte), p_free(&dwpe);
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

/* ---- the bf16 table's matmuls --------------------------------------------------- */

/* x rounded to bf16, to nearest even (what __float2bfloat16 does on the device). */
static float bf16_round(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7f800000u) == 0x7f800000u) return x; /* inf, NaN: not in these tests */
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&x, &u, sizeof x);
    return x;
}

static float *bf16_rounded(const float *x, size_t n)
{
    float *r = ts_alloc_floats(n);
    for (size_t i = 0; i < n; i++) r[i] = bf16_round(x[i]);
    return r;
}

/* G is the bf16 table. Each output against two CPU references: on the bf16-rounded
 * operands (TOL_BF16) and on the fp32 ones (TOL_BF16_FP32). The bias gradient sums the
 * fp32 dout: TOL. */
static void test_matmul_bf16(int Nr, int Cc, int OC, size_t off)
{
    char slot[96];
    size_t ni = (size_t)Nr * Cc, nw = (size_t)OC * Cc, no = (size_t)Nr * OC;
    pair inp = p_in_at(ni, 1.0f, off), w = p_in_at(nw, 1.0f, off);
    pair b = p_in_at((size_t)OC, 1.0f, off);
    float *inp_r = bf16_rounded(inp.h, ni), *w_r = bf16_rounded(w.h, nw);
    float *ref32 = ts_alloc_floats(no > ni ? (no > nw ? no : nw) : (ni > nw ? ni : nw));
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        pair out = p_out_at(no, off);
        const float *bh = with_bias ? b.h : NULL;
        H->matmul_forward(out.h, inp_r, w_r, bh, Nr, Cc, OC);
        H->matmul_forward(ref32, inp.h, w.h, bh, Nr, Cc, OC);
        G->matmul_forward(out.d, inp.d, w.d, with_bias ? b.d : NULL, Nr, Cc, OC);
        snprintf(slot, sizeof slot, "bf16 matmul_forward %dx%dx%d%s%s", Nr, Cc, OC,
                 with_bias ? "" : " nobias", off ? " +1" : "");
        expect_close_to(slot, "out", out.h, out.d, no, TOL_BF16, 0.1);
        expect_close_to(slot, "out vs fp32", ref32, out.d, no, TOL_BF16_FP32, 1.0);
        p_free(&out);
    }
    pair dout = p_in_at(no, 1.0f, off);
    float *dout_r = bf16_rounded(dout.h, no);
    for (int mask = 1; mask < 8; mask++) {
        pair dinp = p_out_at(ni, off);
        pair dw = p_in_at(nw, 0.5f, off), db = p_in_at((size_t)OC, 0.5f, off);
        float *dw32 = ts_alloc_floats(nw);
        memcpy(dw32, dw.h, nw * sizeof(float)); /* the same pre-fill */
        float *di = mask & 1 ? dinp.h : NULL, *dwh = mask & 2 ? dw.h : NULL;
        H->matmul_backward(di, dwh, NULL, dout_r, inp_r, w_r, Nr, Cc, OC);
        H->matmul_backward(NULL, NULL, mask & 4 ? db.h : NULL, dout.h, inp.h, w.h, Nr, Cc, OC);
        G->matmul_backward(mask & 1 ? dinp.d : NULL, mask & 2 ? dw.d : NULL, mask & 4 ? db.d : NULL,
                           dout.d, inp.d, w.d, Nr, Cc, OC);
        snprintf(slot, sizeof slot, "bf16 matmul_backward %dx%dx%d [%s%s%s]%s", Nr, Cc, OC,
                 mask & 1 ? "i" : "-", mask & 2 ? "w" : "-", mask & 4 ? "b" : "-",
                 off ? " +1" : "");
        if (mask & 1) {
            expect_close_to(slot, "dinp", dinp.h, dinp.d, ni, TOL_BF16, 0.1);
            H->matmul_backward(ref32, NULL, NULL, dout.h, inp.h, w.h, Nr, Cc, OC);
            expect_close_to(slot, "dinp vs fp32", ref32, dinp.d, ni, TOL_BF16_FP32, 1.0);
        }
        expect_close_to(slot, mask & 2 ? "dweight (+=)" : "dweight (untouched)", dw.h, dw.d, nw,
                        mask & 2 ? TOL_BF16 : TOL, 0.1);
        if (mask & 2) {
            H->matmul_backward(NULL, dw32, NULL, dout.h, inp.h, w.h, Nr, Cc, OC);
            expect_close_to(slot, "dweight vs fp32", dw32, dw.d, nw, TOL_BF16_FP32, 1.0);
        }
        expect_close(slot, mask & 4 ? "dbias (+=)" : "dbias (untouched)", &db);
        free(dw32);
        p_free(&dinp), p_free(&dw), p_free(&db);
    }
    snprintf(slot, sizeof slot, "bf16 matmul %dx%dx%d%s", Nr, Cc, OC, off ? " +1" : "");
    matmul_determinism(slot, &inp, &w, &b, &dout, Nr, Cc, OC, off);
    free(inp_r), free(w_r), free(ref32), free(dout_r);
    p_free(&inp), p_free(&w), p_free(&b), p_free(&dout);
}

/* G is the bf16 table. Its matmul's output for weight w against the CPU's on the
 * bf16-rounded operands, for the weight values the host holds now. */
static void cache_check(const char *when, const pair *inp, const pair *w, const pair *out, int Nr,
                        int Cc, int OC)
{
    float *inp_r = bf16_rounded(inp->h, inp->n), *w_r = bf16_rounded(w->h, w->n);
    H->matmul_forward(out->h, inp_r, w_r, NULL, Nr, Cc, OC);
    G->matmul_forward(out->d, inp->d, w->d, NULL, Nr, Cc, OC);
    expect_close_to("bf16 weight cache", when, out->h, out->d, out->n, TOL_BF16, 0.1);
    free(inp_r), free(w_r);
}

/* G is the bf16 table. The weight's bf16 copy is reused while the weight is unchanged,
 * and refreshed after every kind of write this table makes to it. */
static void test_bf16_weight_cache(void)
{
    enum { NR = 9, CC = 24, OCC = 20, NW = OCC * CC };
    const ts_kernels *fp32 = &ts_kernels_cuda; /* the same device memory; the cache not told */
    pair inp = p_in((size_t)NR * CC, 1.0f), w = p_in(NW, 1.0f), out = p_out((size_t)NR * OCC);
    cache_check("first use", &inp, &w, &out, NR, CC, OCC);

    /* Cached: a write the table does not see is not seen (the contract: parameters are
     * written through this table's slots). Without this the checks below prove
     * nothing. */
    float *w_old = ts_alloc_floats(NW), *w_new = ts_alloc_floats(NW);
    memcpy(w_old, w.h, sizeof(float) * NW);
    for (int i = 0; i < NW; i++) w_new[i] = ts_test_frand();
    fp32->memcpy_h2d(w.d, w_new, sizeof(float) * NW);
    cache_check("copy reused", &inp, &w, &out, NR, CC, OCC); /* w.h: the old values */
    fp32->memcpy_h2d(w.d, w_old, sizeof(float) * NW);        /* as the copy says again */

    /* adamw_update (lr 0.05: every weight moves by about 0.05, far beyond TOL_BF16). */
    pair g = p_in(NW, 0.1f), m = p_in(NW, 0.0f), v = p_in(NW, 0.0f);
    H->adamw_update(w.h, g.h, 1.0f, m.h, v.h, NW, 0.05f, 0.9f, 0.95f, 1e-8f, 0.1f, 1);
    G->adamw_update(w.d, g.d, 1.0f, m.d, v.d, NW, 0.05f, 0.9f, 0.95f, 1e-8f, 0.1f, 1);
    expect_close("bf16 adamw_update", "param", &w);
    cache_check("after adamw", &inp, &w, &out, NR, CC, OCC);
    /* The backward's dinp reads the same copy. */
    pair dout = p_in((size_t)NR * OCC, 1.0f), dinp = p_out((size_t)NR * CC);
    {
        float *inp_r = bf16_rounded(inp.h, inp.n), *w_r = bf16_rounded(w.h, NW);
        float *dout_r = bf16_rounded(dout.h, dout.n);
        H->matmul_backward(dinp.h, NULL, NULL, dout_r, inp_r, w_r, NR, CC, OCC);
        G->matmul_backward(dinp.d, NULL, NULL, dout.d, inp.d, w.d, NR, CC, OCC);
        expect_close_to("bf16 weight cache", "dinp after adamw", dinp.h, dinp.d, dinp.n,
                        TOL_BF16, 0.1);
        free(inp_r), free(w_r), free(dout_r);
    }

    /* memcpy_h2d of a piece in the middle (a ZeRO-1 gather writes pieces). */
    const int lo = NW / 3, cnt = NW / 4;
    for (int i = lo; i < lo + cnt; i++) w.h[i] = ts_test_frand();
    G->memcpy_h2d(w.d + lo, w.h + lo, sizeof(float) * cnt);
    cache_check("after memcpy_h2d", &inp, &w, &out, NR, CC, OCC);

    /* memcpy_d2d into the weight from another buffer. */
    pair src = p_in((size_t)cnt, 1.0f);
    memcpy(w.h + 5, src.h, sizeof(float) * cnt);
    G->memcpy_d2d(w.d + 5, src.d, sizeof(float) * cnt);
    cache_check("after memcpy_d2d", &inp, &w, &out, NR, CC, OCC);

    /* memset_zero of the last rows. */
    memset(w.h + NW - 2 * CC, 0, sizeof(float) * 2 * CC);
    G->memset_zero(w.d + NW - 2 * CC, sizeof(float) * 2 * CC);
    cache_check("after memset_zero", &inp, &w, &out, NR, CC, OCC);

    /* dev_free, then a new buffer (cudaMalloc usually hands the same address back)
     * filled behind the cache's back: no copy of the old buffer may be used. */
    float *old_d = w.d;
    G->dev_free(w.d);
    w.d = G->dev_alloc(sizeof(float) * NW);
    for (int i = 0; i < NW; i++) w.h[i] = ts_test_frand();
    fp32->memcpy_h2d(w.d, w.h, sizeof(float) * NW);
    cache_check(w.d == old_d ? "after free, same address" : "after free, new address", &inp, &w,
                &out, NR, CC, OCC);
    printf("  %-30s dev_free then dev_alloc: %s address\n", "bf16 weight cache",
           w.d == old_d ? "the same" : "a different");

    free(w_old), free(w_new);
    p_free(&inp), p_free(&w), p_free(&out), p_free(&g), p_free(&m), p_free(&v);
    p_free(&dout), p_free(&dinp), p_free(&src);
}

/* att's layout is the backend's own (attention_saved_floats): only `out` and `dqkv` are
 * compared; each backend's backward reads its own forward's att. */
static void test_attention(int Bb, int Tt, int nh, int HS)
{
    char slot[80];
    int Cc = nh * HS;
    size_t nqkv = (size_t)Bb * Tt * 3 * Cc, nout = (size_t)Bb * Tt * Cc;
    pair qkv = p_in(nqkv, 1.0f);
    pair out = p_out(nout);
    size_t hs = H->attention_saved_floats(Bb, Tt, nh, HS), gs = G->attention_saved_floats(Bb, Tt, nh, HS);
    size_t hsc = H->attention_scratch_floats(Bb, Tt, nh, HS);
    size_t gsc = G->attention_scratch_floats(Bb, Tt, nh, HS);
    pair hatt = p_out(hs ? hs : 1), gatt = p_out(gs ? gs : 1);
    pair hscr = p_out(hsc ? hsc : 1), gscr = p_out(gsc ? gsc : 1); /* workspace: NaN too */
    H->attention_forward(out.h, hatt.h, qkv.h, Bb, Tt, nh, HS);
    G->attention_forward(out.d, gatt.d, qkv.d, Bb, Tt, nh, HS);
    snprintf(slot, sizeof slot, "attention_forward B%d T%d NH%d HS%d", Bb, Tt, nh, HS);
    expect_close(slot, "out", &out);

    pair dout = p_in(nout, 1.0f), dqkv = p_out(nqkv);
    H->attention_backward(dqkv.h, hscr.h, dout.h, qkv.h, hatt.h, Bb, Tt, nh, HS);
    G->attention_backward(dqkv.d, gscr.d, dout.d, qkv.d, gatt.d, Bb, Tt, nh, HS);
    snprintf(slot, sizeof slot, "attention_backward B%d T%d NH%d HS%d", Bb, Tt, nh, HS);
    expect_close(slot, "dqkv", &dqkv);
    p_free(&qkv), p_free(&out), p_free(&hatt), p_free(&gatt), p_free(&hscr), p_free(&gscr);
    p_free(&dout), p_free(&dqkv);
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
    test_attention(B, T, NH, C / NH);
    test_attention(1, 67, 2, 16);
    test_attention(2, 40, 2, 64);
    /* B > NH: the GEMMs loop over heads and batch over sequences (the other branch). */
    test_attention(4, 33, 2, 16);
    test_attention(3, 5, 1, 8);
    test_elementwise((size_t)N * 4 * C + 1);
    test_elementwise(100003);
    test_crossentropy(N, V);
    test_crossentropy(5, 1000);
    test_adamw(1001);
    test_vocab_parallel();

    /* The bf16 table, every device buffer through its own slots. */
    G = bf16;
    printf("test_cuda_kernels: the bf16 table (%s): matmuls %.0e vs bf16-rounded operands, "
           "%.0e of the largest value vs fp32\n",
           G->name, TOL_BF16, TOL_BF16_FP32);
    test_memory();
    test_adamw(1001);
    test_matmul_bf16(N, C, 3 * C, 0);
    test_matmul_bf16(N, C, V, 0);
    test_matmul_bf16(67, 96, 130, 0);
    test_matmul_bf16(128, 256, 768, 0);
    test_matmul_bf16(67, 96, 130, 1);
    test_bf16_weight_cache();
    G = fp32;
    return ts_test_report();
}
