/* What the CUDA backend's attention keeps, in bytes: the one place its formulas live.
 * The CUDA tables' attention_saved_bytes and attention_scratch_bytes return these
 * (kernels/cuda/attention.cu, attention_flash.cu), and so does the layout-only table a
 * build without CUDA sizes a CUDA config with (kernels.c, ts_kernels_layout_only), so a
 * plan of a CUDA run gives the same memory in every build. Plain C, header-only (nvcc
 * and the C compiler both include it); it defines:
 *
 *   TS_CUDA_FLASH_MAX_HS              the widest head the flash kernels take
 *   ts_cuda_flash_takes(h)            whether a flash table runs flash for the heads h
 *   ts_cuda_attn_tt(B, T, NH)         elements of one [B, NH, T, T] matrix
 *   ts_cuda_attn_bf16_ds_offset(...)  where dS starts in the bf16 batched-GEMM scratch
 *   ts_cuda_{gemm,gemm_bf16,flash}_{saved,scratch}_bytes(B, T, h)   each variant
 *   ts_cuda_attention_{saved,scratch}_size(bf16, flash, B, T, h)    each table
 *
 * Batched-GEMM fp32: saved = the probabilities [B, NH, T, T] fp32; scratch = dP [B, NH,
 * T, T] fp32 (dS in place). Batched-GEMM bf16: saved = the probabilities in bf16;
 * scratch = [dP fp32 | dS bf16], dS from a 64-byte boundary, the first piece also
 * holding the fp32 dK, dV accumulator [B, T, NKV (HS + HSV)] of grouped-query attention
 * (NKV < NH; for HSV == HS, 2 NKV <= NH, so max(B NH T T, B T NH HS) floats). Flash
 * (either precision): saved = one fp32 log-sum-exp per row [B, NH, T]; scratch = D =
 * rowsum(dO * O), the same. A flash table sends heads wider than TS_CUDA_FLASH_MAX_HS
 * (q/k or v) to its precision's batched-GEMM attention, sizes included. */
#ifndef TS_KERNELS_ATTENTION_SIZES_H
#define TS_KERNELS_ATTENTION_SIZES_H

#include <stdbool.h>
#include <stddef.h>

#include "kernels/kernels.h" /* ts_att_heads */

#define TS_CUDA_FLASH_MAX_HS 256

/* Heads whose q/k and v widths are both within the flash kernels' limit. */
static inline bool ts_cuda_flash_takes(ts_att_heads h)
{
    return h.HS <= TS_CUDA_FLASH_MAX_HS && h.HSV <= TS_CUDA_FLASH_MAX_HS;
}

static inline size_t ts_cuda_attn_tt(int B, int T, int NH) { return (size_t)B * NH * T * T; }

/* The bf16 scratch's first piece, in floats: dP, or the GQA dK, dV accumulator
 * [B, T, NKV (HS + HSV)] (used when NKV < NH; B T NH HS bounds it for HSV == HS). */
static inline size_t ts_cuda_attn_bf16_dp_floats(int B, int T, ts_att_heads h)
{
    const size_t tt = ts_cuda_attn_tt(B, T, h.NH);
    size_t acc = (size_t)B * T * h.NH * h.HS;
    const size_t need = h.NKV < h.NH ? (size_t)B * T * ts_att_kv_width(h) : 0;
    if (need > acc) acc = need;
    return tt > acc ? tt : acc;
}

static inline size_t ts_cuda_attn_bf16_ds_offset(int B, int T, ts_att_heads h)
{
    return (ts_cuda_attn_bf16_dp_floats(B, T, h) * sizeof(float) + 63) / 64 * 64;
}

static inline size_t ts_cuda_gemm_saved_bytes(int B, int T, ts_att_heads h)
{
    return ts_cuda_attn_tt(B, T, h.NH) * sizeof(float);
}

static inline size_t ts_cuda_gemm_scratch_bytes(int B, int T, ts_att_heads h)
{
    return ts_cuda_attn_tt(B, T, h.NH) * sizeof(float);
}

static inline size_t ts_cuda_gemm_bf16_saved_bytes(int B, int T, ts_att_heads h)
{
    return ts_cuda_attn_tt(B, T, h.NH) * 2; /* bf16 */
}

static inline size_t ts_cuda_gemm_bf16_scratch_bytes(int B, int T, ts_att_heads h)
{
    return ts_cuda_attn_bf16_ds_offset(B, T, h) + ts_cuda_attn_tt(B, T, h.NH) * 2;
}

static inline size_t ts_cuda_flash_saved_bytes(int B, int T, ts_att_heads h)
{
    return (size_t)B * h.NH * T * sizeof(float);
}

static inline size_t ts_cuda_flash_scratch_bytes(int B, int T, ts_att_heads h)
{
    return (size_t)B * h.NH * T * sizeof(float);
}

/* A table's slots: bf16 or fp32 activations, flash or batched-GEMM attention. */
static inline size_t ts_cuda_attention_saved_size(bool bf16, bool flash, int B, int T,
                                                  ts_att_heads h)
{
    if (flash && ts_cuda_flash_takes(h)) return ts_cuda_flash_saved_bytes(B, T, h);
    return bf16 ? ts_cuda_gemm_bf16_saved_bytes(B, T, h) : ts_cuda_gemm_saved_bytes(B, T, h);
}

static inline size_t ts_cuda_attention_scratch_size(bool bf16, bool flash, int B, int T,
                                                    ts_att_heads h)
{
    if (flash && ts_cuda_flash_takes(h)) return ts_cuda_flash_scratch_bytes(B, T, h);
    return bf16 ? ts_cuda_gemm_bf16_scratch_bytes(B, T, h) : ts_cuda_gemm_scratch_bytes(B, T, h);
}

/* Context parallelism's prefix attention (attention_prefix_*; the batched-GEMM kernels
 * in every CUDA table, flash or not): saved = the probabilities [B, NH, Tq, Tk] in the
 * activation type (ab bytes); scratch = dP [B, NH, Tq, Tk] fp32 (dS in place in fp32),
 * and in bf16 then dS [B, NH, Tq, Tk] bf16 and the fp32 dK, dV accumulator
 * [B, Tk, NKV (HS + HSV)], sized [B, Tk, NH (HS + HSV)] (NKV <= NH), each from a 64-byte
 * boundary. */
static inline size_t ts_cuda_prefix_tt(int B, int Tq, int Tk, int NH)
{
    return (size_t)B * NH * Tq * Tk;
}
static inline size_t ts_cuda_prefix_saved_bytes(int B, int Tq, int Tk, ts_att_heads h, int ab)
{
    return ts_cuda_prefix_tt(B, Tq, Tk, h.NH) * (size_t)ab;
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
static inline size_t ts_cuda_prefix_scratch_bytes(int B, int Tq, int Tk, ts_att_heads h, int ab)
{
    if (ab == (int)sizeof(float)) return ts_cuda_prefix_tt(B, Tq, Tk, h.NH) * sizeof(float);
    return ts_cuda_prefix_acc_offset(B, Tq, Tk, h.NH) +
           (size_t)B * Tk * h.NH * (h.HS + h.HSV) * sizeof(float);
}

/* The query-key pairs attention computes for one sequence of T queries (each query t
 * against keys [doc_start[t], t]: kernels.h ts_att_heads.doc_start, Tq = Tk = T), the
 * FLOPs actually done are proportional to: sum over t of t - doc_start[t] + 1;
 * doc_start NULL: the causal T (T + 1) / 2. MFU (data.document_mask) and the planner
 * count attention by it. */
static inline double ts_attention_pairs(const int *doc_start, int T)
{
    if (!doc_start) return (double)T * (T + 1) / 2.0;
    double n = 0.0;
    for (int t = 0; t < T; t++) n += (double)(t - doc_start[t] + 1);
    return n;
}

#endif
