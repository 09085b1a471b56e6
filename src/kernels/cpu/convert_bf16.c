/* The convert slot: fp32 <-> bf16 arrays (the compute weights' refresh, the fp32
 * staging of collectives on bf16 activations). Memory-bound: split among the threads
 * in cache-line-aligned pieces when there is enough to split. */
#include <omp.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cpu/cpu_bf16_internal.h"
#include "kernels/cpu/cpu_internal.h"

/* Below this many elements one thread is faster than waking the others. */
#define TS_CONVERT_PARALLEL ((size_t)1 << 16)

static void convert_range(void *dst, ts_dtype dt, const void *src, ts_dtype st, size_t i0,
                          size_t i1)
{
    if (dt == TS_DTYPE_BF16 && st == TS_DTYPE_F32)
        ts_f32_to_bf16_array((ts_bf16 *)dst + i0, (const float *)src + i0, i1 - i0);
    else if (dt == TS_DTYPE_F32 && st == TS_DTYPE_BF16)
        ts_bf16_to_f32_array((float *)dst + i0, (const ts_bf16 *)src + i0, i1 - i0);
    else
        memcpy((char *)dst + i0 * ts_dtype_bytes(dt), (const char *)src + i0 * ts_dtype_bytes(st),
               (i1 - i0) * ts_dtype_bytes(dt));
}

void ts_cpu_bf16_convert(void *dst, ts_dtype dst_type, const void *src, ts_dtype src_type,
                         size_t n)
{
    TS_ASSERT(dst_type == TS_DTYPE_F32 || dst_type == TS_DTYPE_BF16);
    TS_ASSERT(src_type == TS_DTYPE_F32 || src_type == TS_DTYPE_BF16);
    if (n == 0) return;
    if (n < TS_CONVERT_PARALLEL) {
        convert_range(dst, dst_type, src, src_type, 0, n);
        return;
    }
#pragma omp parallel
    {
        size_t lines = (n + 31) / 32, l0, l1; /* 32 elements: whole lines on both sides */
        ts_cpu_split(lines, omp_get_num_threads(), omp_get_thread_num(), &l0, &l1);
        size_t i0 = l0 * 32, i1 = l1 * 32 < n ? l1 * 32 : n;
        if (i1 > i0) convert_range(dst, dst_type, src, src_type, i0, i1);
    }
}
