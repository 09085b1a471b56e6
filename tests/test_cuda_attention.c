/* The CUDA attention variants (kernels/cuda/attention.cu, attention_flash.cu) against the
 * CPU backend's attention, each called directly: the batched-GEMM attention in fp32 and
 * with bf16 products, the flash-style attention, and the four tables' slots
 * (train.attention = "gemm" | "flash" in fp32 and bf16), on random inputs with every device output, saved state and
 * workspace first poisoned with NaN (a value a kernel fails to write, or reads before
 * writing, shows). fp32 variants within a relative 1e-5 of the CPU, bf16 products
 * within 1e-2; as in test_cuda_kernels, the floor of the relative error is a tenth of
 * the largest |value| of that output. The flash backward must repeat bit for bit.
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

static const ts_kernels *G = &ts_kernels_cuda; /* device memory and the table's slots */
static const ts_kernels *H = &ts_kernels_cpu;  /* the reference, on host memory */

typedef size_t (*size_fn)(int B, int T, int NH, int HS);
typedef void (*fwd_fn)(float *out, float *att, const float *qkv, int B, int T, int NH, int HS);
typedef void (*bwd_fn)(float *dqkv, float *scratch, const float *dout, const float *qkv,
                       const float *att, int B, int T, int NH, int HS);

typedef struct {
    const char *name;
    size_fn saved, scratch;
    fwd_fn forward;
    bwd_fn backward;
    double tol;
    int max_hs; /* the largest head the variant takes */
} variant;

/* The device result `d` against the CPU's `want`. */
static void expect_close(const char *who, const char *what, const float *d, const float *want,
                         size_t n, double tol)
{
    ts_test_expect_close_dev(G, who, what, d, want, n, tol, 0.1);
}

/* ---- one shape, every variant ------------------------------------------------------ */

static void test_shape(const variant *vs, int nv, int B, int T, int NH, int HS)
{
    const int C = NH * HS;
    const size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C;
    float *qkv = ts_alloc_floats(nqkv), *dout = ts_alloc_floats(nout);
    for (size_t i = 0; i < nqkv; i++) qkv[i] = ts_test_frand();
    for (size_t i = 0; i < nout; i++) dout[i] = ts_test_frand();

    /* The CPU reference. */
    float *out = ts_alloc_floats(nout), *dqkv = ts_alloc_floats(nqkv);
    size_t hs = H->attention_saved_floats(B, T, NH, HS);
    size_t hsc = H->attention_scratch_floats(B, T, NH, HS);
    float *att = ts_alloc_floats(hs ? hs : 1), *scr = ts_alloc_floats(hsc ? hsc : 1);
    H->attention_forward(out, att, qkv, B, T, NH, HS);
    H->attention_backward(dqkv, scr, dout, qkv, att, B, T, NH, HS);
    free(att), free(scr);

    float *d_qkv = ts_test_to_dev(G, qkv, nqkv), *d_dout = ts_test_to_dev(G, dout, nout);
    for (int v = 0; v < nv; v++) {
        if (HS > vs[v].max_hs) continue;
        char who[120];
        snprintf(who, sizeof who, "%s B%d T%d NH%d HS%d", vs[v].name, B, T, NH, HS);
        size_t ns = vs[v].saved(B, T, NH, HS), nsc = vs[v].scratch(B, T, NH, HS);
        float *d_out = ts_test_dev_nan(G, nout), *d_att = ts_test_dev_nan(G, ns);
        float *d_scr = ts_test_dev_nan(G, nsc), *d_dqkv = ts_test_dev_nan(G, nqkv);
        vs[v].forward(d_out, d_att, d_qkv, B, T, NH, HS);
        expect_close(who, "out", d_out, out, nout, vs[v].tol);
        vs[v].backward(d_dqkv, d_scr, d_dout, d_qkv, d_att, B, T, NH, HS);
        expect_close(who, "dqkv", d_dqkv, dqkv, nqkv, vs[v].tol);

        /* The same again on fresh NaN buffers must give the same bits (no atomics, no
         * reads of what was not written). */
        float *d_dqkv2 = ts_test_dev_nan(G, nqkv), *d_scr2 = ts_test_dev_nan(G, nsc);
        vs[v].backward(d_dqkv2, d_scr2, d_dout, d_qkv, d_att, B, T, NH, HS);
        float *a = ts_test_from_dev(G, d_dqkv, nqkv), *b = ts_test_from_dev(G, d_dqkv2, nqkv);
        CHECKF(!memcmp(a, b, nqkv * sizeof(float)), "%s: a second backward differs in its bits",
               who);
        free(a), free(b);
        G->dev_free(d_out), G->dev_free(d_att), G->dev_free(d_scr), G->dev_free(d_dqkv);
        G->dev_free(d_dqkv2), G->dev_free(d_scr2);
    }
    G->dev_free(d_qkv), G->dev_free(d_dout);
    free(qkv), free(dout), free(out), free(dqkv);
}

/* ---- what needs no GPU ------------------------------------------------------------- */

static void test_sizes(void)
{
    const int B = 2, T = 129, NH = 3, HS = 100;
    const size_t rows = (size_t)B * NH * T, tt = rows * T;
    CHECK(ts_cuda_flash_attention_saved_floats(B, T, NH, HS) == rows);
    CHECK(ts_cuda_flash_attention_scratch_floats(B, T, NH, HS) == rows);
    CHECK(ts_cuda_gemm_attention_saved_floats(B, T, NH, HS) == tt);
    CHECK(ts_cuda_gemm_attention_scratch_floats(B, T, NH, HS) == tt);
    /* bf16: fp32 probabilities, their bf16 copy and a bf16 qkv (64-byte pieces);
     * scratch: dS fp32, dS bf16 and a bf16 dout */
    size_t nqkv = (size_t)B * T * 3 * NH * HS, nout = (size_t)B * T * NH * HS;
    size_t s16 = ts_cuda_gemm_bf16_attention_saved_floats(B, T, NH, HS);
    size_t c16 = ts_cuda_gemm_bf16_attention_scratch_floats(B, T, NH, HS);
    CHECKF(s16 >= tt + tt / 2 + nqkv / 2 && s16 <= tt + tt / 2 + nqkv / 2 + 48,
           "bf16 saved floats %zu", s16);
    CHECKF(c16 >= tt + tt / 2 + nout / 2 && c16 <= tt + tt / 2 + nout / 2 + 48,
           "bf16 scratch floats %zu", c16);
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
    size_t got = k->attention_saved_floats(B, T, NH, HS);
    size_t gemm = bf16 ? ts_cuda_gemm_bf16_attention_saved_floats(B, T, NH, HS)
                       : ts_cuda_gemm_attention_saved_floats(B, T, NH, HS);
    return got == ts_cuda_flash_attention_saved_floats(B, T, NH, HS) ? 10 : got == gemm ? 11 : 12;
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
    const variant vs[] = {
        {"gemm fp32", ts_cuda_gemm_attention_saved_floats, ts_cuda_gemm_attention_scratch_floats,
         ts_cuda_gemm_attention_forward, ts_cuda_gemm_attention_backward, 1e-5, 1 << 20},
        {"flash fp32", ts_cuda_flash_attention_saved_floats,
         ts_cuda_flash_attention_scratch_floats, ts_cuda_flash_attention_forward,
         ts_cuda_flash_attention_backward, 1e-5, TS_CUDA_FLASH_MAX_HS},
        {"gemm bf16", ts_cuda_gemm_bf16_attention_saved_floats,
         ts_cuda_gemm_bf16_attention_scratch_floats, ts_cuda_gemm_bf16_attention_forward,
         ts_cuda_gemm_bf16_attention_backward, 1e-2, 1 << 20},
        {"table (fp32)", G->attention_saved_floats, G->attention_scratch_floats,
         G->attention_forward, G->attention_backward, 1e-5, 1 << 20},
        {"table (fp32, flash)", ts_kernels_cuda_flash.attention_saved_floats,
         ts_kernels_cuda_flash.attention_scratch_floats, ts_kernels_cuda_flash.attention_forward,
         ts_kernels_cuda_flash.attention_backward, 1e-5, 1 << 20},
        {"table (bf16)", ts_cuda_attention_saved_floats_bf16,
         ts_cuda_attention_scratch_floats_bf16, ts_cuda_attention_forward_bf16,
         ts_cuda_attention_backward_bf16, 1e-2, 1 << 20},
        {"table (bf16, flash)", ts_cuda_attention_saved_floats_bf16_flash,
         ts_cuda_attention_scratch_floats_bf16_flash, ts_cuda_attention_forward_bf16_flash,
         ts_cuda_attention_backward_bf16_flash, 1e-2, 1 << 20},
    };
    const int nv = (int)(sizeof vs / sizeof vs[0]);
    /* Every T with every HS; B and NH cycle through 1..4 and {1, 3, 12}, so both GEMM
     * batching branches (B <= NH and B > NH) and ragged last tiles are covered. */
    static const int Ts[] = {1, 7, 64, 129, 256}, HSs[] = {8, 64, 100}, NHs[] = {1, 3, 12};
    int k = 0;
    for (int t = 0; t < 5; t++)
        for (int h = 0; h < 3; h++, k++) test_shape(vs, nv, 1 + k % 4, Ts[t], NHs[k % 3], HSs[h]);
    /* Odd heads (no multiple of 4 or 8), the 16-wide tiles above HS 128, the widest
     * flash head, and one past it (GEMMs only). */
    test_shape(vs, nv, 2, 33, 2, 1);
    test_shape(vs, nv, 3, 50, 1, 3);
    test_shape(vs, nv, 1, 97, 2, 129);
    test_shape(vs, nv, 2, 70, 1, TS_CUDA_FLASH_MAX_HS);
    test_shape(vs, nv, 1, 40, 1, TS_CUDA_FLASH_MAX_HS + 1);
    return ts_test_report();
}
