/* The layout a plan sizes a run with (kernels.h ts_kernels_layout_for): a CUDA config
 * gets the CUDA tables' sizes in every build. In a CUDA build the layout-only tables
 * (ts_kernels_layout_only, what a CPU-only build plans with) report exactly what the
 * real tables report, for shapes across the flash kernels' head-size limit, so the two
 * cannot drift; in any build cuda-flash's layout is the flash kernel's (one fp32
 * log-sum-exp per row), not the CPU's probabilities. */
#include <string.h>

#include "kernels/attention_sizes.h"
#include "kernels/kernels.h"
#include "test_util.h"

static const char *const PRECISIONS[] = {"fp32", "bf16"};
static const char *const ATTENTIONS[] = {"gemm", "flash"};

/* B, T, NH, HS: GPT-2 124M, odd T, Llama 3 405B on tp 8 (16 query heads of 128, T 8192),
 * heads at and past the flash limit, a head wider than T (the bf16 scratch's
 * accumulator wins), one row. */
static const int SHAPES[][4] = {
    {4, 1024, 12, 64}, {3, 77, 5, 48}, {1, 8192, 16, 128}, {2, 64, 4, TS_CUDA_FLASH_MAX_HS},
    {2, 64, 4, TS_CUDA_FLASH_MAX_HS + 1}, {1, 8, 2, 512}, {1, 1, 1, 1},
};
enum { N_SHAPES = sizeof SHAPES / sizeof SHAPES[0] };

/* Every layout-only table: complete (a model layout asserts it), named by what it is. */
static void test_layout_only_tables(void)
{
    for (int p = 0; p < 2; p++)
        for (int a = 0; a < 2; a++) {
            const ts_kernels *k = ts_kernels_layout_only("cuda", PRECISIONS[p], ATTENTIONS[a]);
            CHECKF(k != NULL, "no layout-only table for cuda %s %s", PRECISIONS[p], ATTENTIONS[a]);
            if (!k) continue;
            CHECKF(!ts_kernels_missing(k), "%s misses %s", k->name, ts_kernels_missing(k));
            CHECK(!strcmp(k->device, "cuda") && !strcmp(k->precision, PRECISIONS[p]) &&
                  !strcmp(k->attention, ATTENTIONS[a]));
            CHECK(k->device_memory && !k->host_accessible);
            CHECK(k->act_dtype == (p ? TS_DTYPE_BF16 : TS_DTYPE_F32));
            CHECK(k->weight_copy_bytes == (p ? 2 : 0));
            CHECK(k->native_comm && !strcmp(k->native_comm, "nccl"));
            /* Never a run's table. */
            CHECK(ts_kernels_find(k->name) == NULL);
            CHECK(ts_kernels_for("cuda", PRECISIONS[p], ATTENTIONS[a]) != k);
        }
    CHECK(ts_kernels_layout_only("cpu", "fp32", "gemm") == NULL);
    CHECK(ts_kernels_layout_only("cuda", "fp16", "gemm") == NULL);
    CHECK(ts_kernels_layout_only("cuda", "bf16", "Flash") == NULL);
}

#ifdef TS_HAVE_CUDA
/* The layout-only tables against the CUDA tables themselves (their size slots are host
 * functions: no device needed). */
static void test_layout_matches_cuda(void)
{
    for (int p = 0; p < 2; p++)
        for (int a = 0; a < 2; a++) {
            const ts_kernels *real = ts_kernels_for("cuda", PRECISIONS[p], ATTENTIONS[a]);
            const ts_kernels *lay = ts_kernels_layout_only("cuda", PRECISIONS[p], ATTENTIONS[a]);
            CHECK(real != NULL && lay != NULL);
            if (!real || !lay) continue;
            CHECK(ts_kernels_layout_for("cuda", PRECISIONS[p], ATTENTIONS[a]) == real);
            CHECK(lay->act_dtype == real->act_dtype);
            CHECK(lay->weight_copy_bytes == real->weight_copy_bytes);
            CHECK(lay->device_memory == real->device_memory);
            CHECK(!strcmp(lay->native_comm, real->native_comm));
            for (int s = 0; s < N_SHAPES; s++) {
                const int B = SHAPES[s][0], T = SHAPES[s][1], NH = SHAPES[s][2], HS = SHAPES[s][3];
                CHECKF(lay->attention_saved_bytes(B, T, ts_att_heads_gqa(NH, NH, HS)) ==
                           real->attention_saved_bytes(B, T, ts_att_heads_gqa(NH, NH, HS)),
                       "%s saved B%d T%d NH%d HS%d: %zu, the table %zu", real->name, B, T, NH, HS,
                       lay->attention_saved_bytes(B, T, ts_att_heads_gqa(NH, NH, HS)),
                       real->attention_saved_bytes(B, T, ts_att_heads_gqa(NH, NH, HS)));
                CHECKF(lay->attention_scratch_bytes(B, T, ts_att_heads_gqa(NH, NH, HS)) ==
                           real->attention_scratch_bytes(B, T, ts_att_heads_gqa(NH, NH, HS)),
                       "%s scratch B%d T%d NH%d HS%d: %zu, the table %zu", real->name, B, T, NH, HS,
                       lay->attention_scratch_bytes(B, T, ts_att_heads_gqa(NH, NH, HS)),
                       real->attention_scratch_bytes(B, T, ts_att_heads_gqa(NH, NH, HS)));
            }
        }
}
#endif

/* What a plan of a CUDA run sizes, in this build: the flash kernel's rows, not the
 * CPU's probabilities; the bf16 batched-GEMM scratch with its fp32 dP (or GQA
 * accumulator) piece, not the CPU's bf16 dS alone; the GEMM fallback past the flash
 * limit. */
static void test_cuda_layout_in_this_build(void)
{
    const int B = 1, T = 8192, NH = 16, HS = 128;
    const size_t rows = (size_t)B * NH * T, tt = rows * T;
    for (int p = 0; p < 2; p++) {
        const ts_kernels *flash = ts_kernels_layout_for("cuda", PRECISIONS[p], "flash");
        const ts_kernels *cpu = ts_kernels_layout_for("cpu", PRECISIONS[p], "gemm");
        CHECK(!strcmp(flash->device, "cuda") && !strcmp(flash->attention, "flash"));
        CHECK(flash->device_memory && !cpu->device_memory);
        CHECK(flash->attention_saved_bytes(B, T, ts_att_heads_gqa(NH, NH, HS)) ==
              rows * sizeof(float));
        CHECK(flash->attention_scratch_bytes(B, T, ts_att_heads_gqa(NH, NH, HS)) ==
              rows * sizeof(float));
        CHECK(flash->attention_saved_bytes(B, T, ts_att_heads_gqa(NH, NH, HS)) !=
              cpu->attention_saved_bytes(B, T, ts_att_heads_gqa(NH, NH, HS)));
        const size_t ab = p ? 2 : 4;
        CHECK(cpu->attention_saved_bytes(B, T, ts_att_heads_gqa(NH, NH, HS)) == tt * ab);
        /* Heads too wide for the flash kernels: the batched-GEMM attention's sizes. */
        CHECK(flash->attention_saved_bytes(1, 64, ts_att_heads_gqa(2, 2, 512)) ==
              (size_t)2 * 64 * 64 * ab);
    }
    const ts_kernels *g16 = ts_kernels_layout_for("cuda", "bf16", "gemm");
    CHECK(g16->attention_saved_bytes(B, T, ts_att_heads_gqa(NH, NH, HS)) == tt * 2);
    CHECK(g16->attention_scratch_bytes(B, T, ts_att_heads_gqa(NH, NH, HS)) == tt * 4 + tt * 2);
    /* T < HS: the accumulator [B, T, NH HS] fp32 outgrows dP, then dS from 64 bytes on. */
    const size_t acc = (size_t)1 * 8 * 2 * 512 * 4;
    CHECK(g16->attention_scratch_bytes(1, 8, ts_att_heads_gqa(2, 2, 512)) ==
          (acc + 63) / 64 * 64 + 2 * 8 * 8 * 2);
    /* fp32 batched-GEMM: the CPU's sizes. */
    const ts_kernels *g32 = ts_kernels_layout_for("cuda", "fp32", "gemm");
    CHECK(g32->attention_saved_bytes(B, T, ts_att_heads_gqa(NH, NH, HS)) ==
          ts_kernels_cpu.attention_saved_bytes(B, T, ts_att_heads_gqa(NH, NH, HS)));
    CHECK(g32->attention_scratch_bytes(B, T, ts_att_heads_gqa(NH, NH, HS)) ==
          ts_kernels_cpu.attention_scratch_bytes(B, T, ts_att_heads_gqa(NH, NH, HS)));
    /* Any other device: its own table, or the CPU's of that precision. */
    CHECK(ts_kernels_layout_for("cpu", "bf16", "gemm") == &ts_kernels_cpu_bf16);
    CHECK(ts_kernels_layout_for("cpu-strict", "fp32", "gemm") == &ts_kernels_cpu_strict);
}

int main(void)
{
    test_layout_only_tables();
#ifdef TS_HAVE_CUDA
    test_layout_matches_cuda();
#endif
    test_cuda_layout_in_this_build();
    return ts_test_report();
}
