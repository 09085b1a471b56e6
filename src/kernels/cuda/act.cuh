/* The activation element type of the CUDA kernels: float for the fp32 tables,
 * __nv_bfloat16 for the bf16 ones (kernels.h's act_dtype). Every kernel that touches
 * activations is a template on it and does its arithmetic in fp32: it loads with
 * ts_act_load (exact for both types), computes in float, and stores with ts_act_store,
 * the one place a value is rounded (to nearest even for bf16; a no-op for float, so an
 * fp32 instantiation is exactly the plain fp32 kernel). */
#ifndef TS_KERNELS_CUDA_ACT_CUH
#define TS_KERNELS_CUDA_ACT_CUH

#include <cuda_bf16.h>
#include <stddef.h>

typedef __nv_bfloat16 bf16;

static __device__ __forceinline__ float ts_act_to_float(float x) { return x; }
static __device__ __forceinline__ float ts_act_to_float(bf16 x) { return __bfloat162float(x); }

/* The activation type's value nearest x (RNE; NaN stays NaN, +-inf and +-0 are kept). */
template <typename T> static __device__ __forceinline__ T ts_act_from_float(float x);
template <> __device__ __forceinline__ float ts_act_from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 ts_act_from_float<bf16>(float x)
{
    return __float2bfloat16_rn(x);
}

template <typename T> static __device__ __forceinline__ float ts_act_load(const T *p, size_t i)
{
    return ts_act_to_float(p[i]);
}

template <typename T> static __device__ __forceinline__ void ts_act_store(T *p, size_t i, float x)
{
    p[i] = ts_act_from_float<T>(x);
}

#endif
