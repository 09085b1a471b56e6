/* What the CUDA backend's attention keeps, in bytes: the one place its formulas live.
 * The CUDA tables' attention_saved_bytes and attention_scratch_bytes return these
 * (kernels/cuda/attention.cu, attention_flash.cu), and so does the layout-only table a
 * build without CUDA sizes a CUDA config with (kernels.c, ts_kernels_layout_only), so a
 * plan of a CUDA run gives the same memory in every build. Plain C, header-only (nvcc
 * and the C compiler both include it); it defines:
 *
 *   TS_CUDA_FLASH_MAX_HS              the widest head the flash kernels take
 *   ts_cuda_flash_takes(HS)           whether a flash table runs flash for heads of HS
 *   ts_cuda_attn_tt(B, T, NH)         elements of one [B, NH, T, T] matrix
 *   ts_cuda_attn_bf16_ds_offset(...)  where dS starts in the bf16 batched-GEMM scratch
 *   ts_cuda_{gemm,gemm_bf16,flash}_{saved,scratch}_bytes(B, T, NH, HS)   each variant
 *   ts_cuda_attention_{saved,scratch}_size(bf16, flash, B, T, NH, HS)    each table
 *
 * Batched-GEMM fp32: saved = the probabilities [B, NH, T, T] fp32; scratch = dP [B, NH,
 * T, T] fp32 (dS in place). Batched-GEMM bf16: saved = the probabilities in bf16;
 * scratch = [dP fp32 | dS bf16], dS from a 64-byte boundary, the first piece also
 * holding the fp32 dK, dV accumulator [B, T, 2 NKV HS] of grouped-query attention (2 NKV
 * <= NH, so max(B NH T T, B T NH HS) floats). Flash (either precision): saved = one fp32
 * log-sum-exp per row [B, NH, T]; scratch = D = rowsum(dO * O), the same. A flash table
 * sends heads wider than TS_CUDA_FLASH_MAX_HS to its precision's batched-GEMM attention,
 * sizes included. */
#ifndef TS_KERNELS_ATTENTION_SIZES_H
#define TS_KERNELS_ATTENTION_SIZES_H

#include <stdbool.h>
#include <stddef.h>

#define TS_CUDA_FLASH_MAX_HS 256

static inline bool ts_cuda_flash_takes(int HS) { return HS <= TS_CUDA_FLASH_MAX_HS; }

static inline size_t ts_cuda_attn_tt(int B, int T, int NH) { return (size_t)B * NH * T * T; }

/* The bf16 scratch's first piece, in floats: dP, or the GQA dK, dV accumulator. */
static inline size_t ts_cuda_attn_bf16_dp_floats(int B, int T, int NH, int HS)
{
    const size_t tt = ts_cuda_attn_tt(B, T, NH), acc = (size_t)B * T * NH * HS;
    return tt > acc ? tt : acc;
}

static inline size_t ts_cuda_attn_bf16_ds_offset(int B, int T, int NH, int HS)
{
    return (ts_cuda_attn_bf16_dp_floats(B, T, NH, HS) * sizeof(float) + 63) / 64 * 64;
}

static inline size_t ts_cuda_gemm_saved_bytes(int B, int T, int NH, int HS)
{
    (void)HS;
    return ts_cuda_attn_tt(B, T, NH) * sizeof(float);
}

static inline size_t ts_cuda_gemm_scratch_bytes(int B, int T, int NH, int HS)
{
    (void)HS;
    return ts_cuda_attn_tt(B, T, NH) * sizeof(float);
}

static inline size_t ts_cuda_gemm_bf16_saved_bytes(int B, int T, int NH, int HS)
{
    (void)HS;
    return ts_cuda_attn_tt(B, T, NH) * 2; /* bf16 */
}

static inline size_t ts_cuda_gemm_bf16_scratch_bytes(int B, int T, int NH, int HS)
{
    return ts_cuda_attn_bf16_ds_offset(B, T, NH, HS) + ts_cuda_attn_tt(B, T, NH) * 2;
}

static inline size_t ts_cuda_flash_saved_bytes(int B, int T, int NH, int HS)
{
    (void)HS;
    return (size_t)B * NH * T * sizeof(float);
}

static inline size_t ts_cuda_flash_scratch_bytes(int B, int T, int NH, int HS)
{
    (void)HS;
    return (size_t)B * NH * T * sizeof(float);
}

/* A table's slots: bf16 or fp32 activations, flash or batched-GEMM attention. */
static inline size_t ts_cuda_attention_saved_size(bool bf16, bool flash, int B, int T, int NH,
                                                  int HS)
{
    if (flash && ts_cuda_flash_takes(HS)) return ts_cuda_flash_saved_bytes(B, T, NH, HS);
    return bf16 ? ts_cuda_gemm_bf16_saved_bytes(B, T, NH, HS)
                : ts_cuda_gemm_saved_bytes(B, T, NH, HS);
}

static inline size_t ts_cuda_attention_scratch_size(bool bf16, bool flash, int B, int T, int NH,
                                                    int HS)
{
    if (flash && ts_cuda_flash_takes(HS)) return ts_cuda_flash_scratch_bytes(B, T, NH, HS);
    return bf16 ? ts_cuda_gemm_bf16_scratch_bytes(B, T, NH, HS)
                : ts_cuda_gemm_scratch_bytes(B, T, NH, HS);
}

/* Context parallelism's prefix attention (attention_prefix_*; the batched-GEMM kernels
 * in every CUDA table, flash or not): saved = the probabilities [B, NH, Tq, Tk] in the
 * activation type (ab bytes); scratch = dP [B, NH, Tq, Tk] fp32 (dS in place in fp32),
 * and in bf16 then dS [B, NH, Tq, Tk] bf16 and the fp32 dK, dV accumulator [B, Tk, 2 NH
 * HS] (2 NKV <= 2 NH), each from a 64-byte boundary. */
static inline size_t ts_cuda_prefix_tt(int B, int Tq, int Tk, int NH)
{
    return (size_t)B * NH * Tq * Tk;
}
static inline size_t ts_cuda_prefix_saved_bytes(int B, int Tq, int Tk, int NH, int HS, int ab)
{
    (void)HS;
    return ts_cuda_prefix_tt(B, Tq, Tk, NH) * (size_t)ab;
}
static inline size_t ts_cuda_prefix_ds_offset(int B, int Tq, int Tk, int NH)
{
    return (ts_cuda_prefix_tt(B, Tq, Tk, NH) * sizeof(float) + 63) / 64 * 64;
}
static inline size_t ts_cuda_prefix_acc_offset(int B, int Tq, int Tk, int NH)
{
    return ts_cuda_prefix_ds_offset(B, Tq, Tk, NH) +
           (ts_cuda_prefix_tt(B, Tq, Tk, NH) * 2 + 63) / 64 * 64;
}
static inline size_t ts_cuda_prefix_scratch_bytes(int B, int Tq, int Tk, int NH, int HS, int ab)
{
    if (ab == (int)sizeof(float)) return ts_cuda_prefix_tt(B, Tq, Tk, NH) * sizeof(float);
    return ts_cuda_prefix_acc_offset(B, Tq, Tk, NH) + (size_t)B * Tk * 2 * NH * HS * sizeof(float);
}

#endif
