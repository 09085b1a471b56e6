/* How a CPU kernel reads and writes activations of either storage type, so each kernel
 * is written once over fp32 rows (the pattern of llm.c's floatX and of the CUDA
 * backend's templates, in C). A kernel body takes the table's `ts_dtype` and works on
 * fp32 pointers the adapters below hand it; its two entry points (ts_cpu_X and
 * ts_cpu_bf16_X) call it with TS_DTYPE_F32 and TS_DTYPE_BF16. It defines:
 *
 *   ts_cpu_chunk(t, n)            how many of n elements one adapter call covers
 *   ts_cpu_buffer(t, n)           a per-thread fp32 buffer the bf16 path needs (fp32: NULL)
 *   ts_cpu_load(t, buf, src, i, n)      n elements from src[i], as fp32, to read
 *   ts_cpu_load_out(t, buf, dst, i, n)  the same, to update in place (+=, overwrite)
 *   ts_cpu_out(t, buf, dst, i)          where to compute values meant for dst[i..]
 *   ts_cpu_store(t, dst, i, y, n)       make dst[i..i+n) hold the fp32 values y
 *
 * fp32 storage IS the fp32 row: load returns src + i, out returns dst + i, and store has
 * nothing to do (it copies only when y lives elsewhere), so an fp32 kernel computes in
 * place with no copies, and ts_cpu_chunk gives it whole rows: its reductions run over
 * the same spans as before the kernels were merged (the same bits in both dtypes as the
 * separate fp32 and bf16 files gave). bf16 storage is widened into `buf` (exact) and
 * rounded back once on store (bf16.h: nearest even, the one rounding on every path).
 *
 * The dtype is a run-time argument: the branches sit at row or chunk granularity, never
 * inside the arithmetic loops, which see plain fp32 pointers in both cases. */
#ifndef TS_KERNELS_CPU_STORAGE_H
#define TS_KERNELS_CPU_STORAGE_H

#include <stddef.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cpu/bf16.h"
#include "kernels/kernels.h"

/* bf16 chunks of row or elementwise work go through fp32 buffers of this many elements
 * on the stack: load (widen) a chunk, compute, store (round) it. */
#define TS_BF16_CHUNK 512

/* Elements per adapter call for a span of n: all of them for fp32 (used in place, one
 * pass as the fp32 loops always ran), a stack buffer's worth for bf16. */
static inline size_t ts_cpu_chunk(ts_dtype t, size_t n)
{
    return t == TS_DTYPE_F32 || n < TS_BF16_CHUNK ? n : TS_BF16_CHUNK;
}

/* n fp32 scratch elements for the bf16 path (free() it; free(NULL) is fine); fp32
 * needs none. */
static inline float *ts_cpu_buffer(ts_dtype t, size_t n)
{
    return t == TS_DTYPE_F32 ? NULL : ts_alloc_floats(n);
}

static inline const float *ts_cpu_load(ts_dtype t, float *buf, const void *src, size_t i,
                                       size_t n)
{
    if (t == TS_DTYPE_F32) return (const float *)src + i;
    ts_bf16_to_f32_array(buf, (const ts_bf16 *)src + i, n);
    return buf;
}

static inline float *ts_cpu_load_out(ts_dtype t, float *buf, void *dst, size_t i, size_t n)
{
    if (t == TS_DTYPE_F32) return (float *)dst + i;
    ts_bf16_to_f32_array(buf, (const ts_bf16 *)dst + i, n);
    return buf;
}

static inline float *ts_cpu_out(ts_dtype t, float *buf, void *dst, size_t i)
{
    return t == TS_DTYPE_F32 ? (float *)dst + i : buf;
}

static inline void ts_cpu_store(ts_dtype t, void *dst, size_t i, const float *y, size_t n)
{
    if (t == TS_DTYPE_BF16)
        ts_f32_to_bf16_array((ts_bf16 *)dst + i, y, n);
    else if ((const float *)dst + i != y)
        memcpy((float *)dst + i, y, n * sizeof(float));
}

/* Row r (C wide) of res_out = a + b, rounded once to the storage type and stored; returns
 * the STORED sum in fp32 (for bf16 widened back, exactly, into xb; for fp32 res_out's own
 * row), which a fused norm then reads: the same bits as residual_forward followed by the
 * norm's kernel. xb: ts_cpu_buffer(t, 2 * C) (NULL for fp32). */
static inline const float *ts_cpu_residual_row(ts_dtype t, float *xb, void *res_out,
                                               const void *a, const void *b, size_t r, int C)
{
    const float *pa = ts_cpu_load(t, xb, a, r, (size_t)C);
    const float *pb = ts_cpu_load(t, xb ? xb + C : NULL, b, r, (size_t)C);
    float *x = ts_cpu_out(t, xb, res_out, r);
#pragma omp simd
    for (int c = 0; c < C; c++) x[c] = pa[c] + pb[c];
    ts_cpu_store(t, res_out, r, x, (size_t)C);
    return ts_cpu_load(t, xb, res_out, r, (size_t)C);
}

#endif
