/* Warp and block reductions shared by the CUDA kernels. Every one adds or compares in a
 * fixed order (a butterfly over the warp, then the warps' partials in index order), so
 * a kernel built on them gives the same bits on every run. */
#ifndef TS_KERNELS_CUDA_REDUCE_CUH
#define TS_KERNELS_CUDA_REDUCE_CUH

struct ts_sum_op {
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct ts_max_op {
    __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

/* Over the 32 lanes of a full warp; every lane gets the result. */
template <typename T, typename Op> static __device__ __forceinline__ T warp_reduce(T x, Op op)
{
    for (int o = 16; o > 0; o >>= 1) x = op(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

/* Over the block (blockDim.x a multiple of 32, at most 1024), the same value in every
 * thread; every thread must call it. The warps' partials combine in warp order. */
template <typename T, typename Op> static __device__ __forceinline__ T block_reduce(T x, Op op)
{
    __shared__ T part[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    x = warp_reduce(x, op);
    if (lane == 0) part[warp] = x;
    __syncthreads();
    T r = part[0];
    for (int w = 1; w < nwarps; w++) r = op(r, part[w]);
    __syncthreads(); /* part can be reused by the next call */
    return r;
}

template <typename T> static __device__ __forceinline__ T warp_sum(T x)
{
    return warp_reduce(x, ts_sum_op());
}
static __device__ __forceinline__ float warp_max(float x) { return warp_reduce(x, ts_max_op()); }
static __device__ __forceinline__ double block_sum(double x) { return block_reduce(x, ts_sum_op()); }
static __device__ __forceinline__ float block_max(float x) { return block_reduce(x, ts_max_op()); }

#endif
