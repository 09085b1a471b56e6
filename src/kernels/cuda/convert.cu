/* The convert slot: dst[i] = src[i] between fp32 and bf16 (kernels.h), queued on the
 * compute stream. fp32 -> bf16 rounds to nearest even with __float2bfloat16_rn (NaN
 * stays NaN, infinities and signed zeros are kept); bf16 -> fp32 is exact (the bf16 bits
 * are the upper half of the float's). Equal types are a plain device copy (memcpy_d2d:
 * overlap allowed). Different types are one thread per element, so dst and src must not
 * overlap (they are different buffers: the compute weights and the master weights, an
 * activation and its fp32 staging). Used for the model's bf16 compute weights, refreshed
 * once per optimizer step, and the collectives' fp32 staging of bf16 activations. */
#include <cuda_bf16.h>

#include "kernels/cuda/cuda_internal.h"

#define TS_CONVERT_THREADS 256

static __global__ void f32_to_bf16_kernel(__nv_bfloat16 *dst, const float *src, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

static __global__ void bf16_to_f32_kernel(float *dst, const __nv_bfloat16 *src, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __bfloat162float(src[i]);
}

void ts_cuda_convert(void *dst, ts_dtype dst_type, const void *src, ts_dtype src_type, size_t n)
{
    if (n == 0) return;
    if (dst_type == src_type) {
        ts_cuda_memcpy_d2d(dst, src, n * ts_dtype_bytes(dst_type));
        return;
    }
    /* Grid-stride: at most 2^24 threads, any n. */
    size_t threads_needed = n < ((size_t)1 << 24) ? n : ((size_t)1 << 24);
    unsigned blocks = ts_cuda_blocks(threads_needed, TS_CONVERT_THREADS);
    if (dst_type == TS_DTYPE_BF16)
        f32_to_bf16_kernel<<<blocks, TS_CONVERT_THREADS, 0, ts_cuda_stream()>>>(
            (__nv_bfloat16 *)dst, (const float *)src, n);
    else
        bf16_to_f32_kernel<<<blocks, TS_CONVERT_THREADS, 0, ts_cuda_stream()>>>(
            (float *)dst, (const __nv_bfloat16 *)src, n);
    TS_CUDA_LAUNCHED();
}
