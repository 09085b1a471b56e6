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
 * Without a GPU (exit 77, skipped) it still checks what needs none: the sizes each
 * variant asks for, and that ts_kernels_for(device, precision, attention) gives the
 * table whose slots run that variant (a wrong train.attention is the config's error:
 * test_config). */
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
    int devices = ts_cuda_device_count();
    if (devices == 0) {
        printf("test_cuda_attention: no CUDA device here (ts_cuda_device_count() == 0): "
               "skipped; sizes and the tables' attention choice checked\n");
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
    return ts_test_report();
}
