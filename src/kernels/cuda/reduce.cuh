/* Warp and block reductions shared by the CUDA kernels. Every one adds or compares in a
 * fixed order (a butterfly over the warp, then the warps' partials in index order), so
 * a kernel built on them gives the same bits on every run. */
#ifndef TS_KERNELS_CUDA_REDUCE_CUH
#define TS_KERNELS_CUDA_REDUCE_CUH

/* Over the 32 lanes of a full warp; every lane gets the result. */
template <typename T> static __device__ __forceinline__ T warp_sum(T x)
{
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

static __device__ __forceinline__ float warp_max(float x)
{
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

/* Over the block (blockDim.x a multiple of 32, at most 1024), the same value in every
 * thread; every thread must call it. */
static __device__ __forceinline__ double block_sum(double x)
{
    __shared__ double part[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    x = warp_sum(x);
    if (lane == 0) part[warp] = x;
    __syncthreads();
    double s = 0.0;
    for (int w = 0; w < nwarps; w++) s += part[w];
    __syncthreads(); /* part can be reused by the next call */
    return s;
}

static __device__ __forceinline__ float block_max(float x)
{
    __shared__ float part[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    x = warp_max(x);
    if (lane == 0) part[warp] = x;
    __syncthreads();
    float m = part[0];
    for (int w = 1; w < nwarps; w++) m = fmaxf(m, part[w]);
    __syncthreads();
    return m;
}

#endif
