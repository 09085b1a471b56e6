/* Fused kernels (fused.h).
 *
 * residual_layernorm_forward: one warp per row, as layernorm.cu's forward, with the
 * residual add in its first pass: each lane writes its channels of a + b and sums them,
 * then reads back only what it wrote itself (its own stores, from L1/L2) for the
 * variance and the output. Each row's sums are a fixed per-lane order and a butterfly,
 * so the result is bitwise repeatable, and the same arithmetic as residual_forward
 * followed by layernorm_forward on this backend (the row math is one function,
 * layernorm_row.cuh). In bf16 the sum is rounded when it is stored and the LayerNorm reads
 * the rounded value back (its own stores), as the two unfused calls would.
 *
 * adamw_update_spans: the spans live in device memory and the host never reads them, so
 * the grid cannot be sized by the total element count. A persistent grid (the blocks
 * the device holds at once) walks every span in order, all of its threads striding over
 * each span together: every span is spread evenly over the whole device, a span smaller
 * than the grid costs the idle threads one bounds check, and no prefix array or sorting
 * is needed. Elementwise, hence deterministic; each element is adamw.cu's arithmetic
 * (adamw_step.cuh: the CPU's order of operations, step constants computed on the host as
 * the CPU does). */
#include "kernels/cuda/act.cuh"
#include "kernels/cuda/adamw_step.cuh"
#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/fused.h"
#include "kernels/cuda/layernorm_row.cuh"

#define TS_RLN_WARPS 8      /* rows (warps) per block */
#define TS_SPANS_THREADS 256

/* res_out may alias a or b: every element is read and then written by one thread. */
template <typename A>
static __global__ void residual_layernorm_kernel(A *res_out, A *ln_out, float *mean, float *rstd,
                                                 const A *a, const A *b, const float *weight,
                                                 const float *bias, int N, int C)
{
    int n = blockIdx.x * TS_RLN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (n >= N) return; /* whole warps leave together */
    const size_t row = (size_t)n * C;
    A *x = res_out + row;
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) {
        ts_act_store(x, c, ts_act_load(a, row + c) + ts_act_load(b, row + c));
        s += ts_act_load(x, c); /* the stored (rounded) sum, as layernorm_forward reads it */
    }
    layernorm_row(ln_out + row, &mean[n], &rstd[n], (const A *)x, s, weight, bias, C, lane);
}

template <typename A>
static void residual_layernorm_forward(void *res_out, void *ln_out, float *mean, float *rstd,
                                       const void *a, const void *b, const float *weight,
                                       const float *bias, int N, int C)
{
    if (N <= 0 || C <= 0) return;
    residual_layernorm_kernel<A><<<ts_cuda_blocks((size_t)N, TS_RLN_WARPS), TS_RLN_WARPS * 32, 0,
                                   ts_cuda_stream()>>>((A *)res_out, (A *)ln_out, mean, rstd,
                                                       (const A *)a, (const A *)b, weight, bias,
                                                       N, C);
    TS_CUDA_LAUNCHED();
}

extern "C" void ts_cuda_residual_layernorm_forward(void *res_out, void *ln_out, float *mean,
                                                   float *rstd, const void *a, const void *b,
                                                   const float *weight, const float *bias, int N,
                                                   int C)
{
    residual_layernorm_forward<float>(res_out, ln_out, mean, rstd, a, b, weight, bias, N, C);
}

extern "C" void ts_cuda_bf16_residual_layernorm_forward(void *res_out, void *ln_out, float *mean,
                                                        float *rstd, const void *a, const void *b,
                                                        const float *weight, const float *bias,
                                                        int N, int C)
{
    residual_layernorm_forward<bf16>(res_out, ln_out, mean, rstd, a, b, weight, bias, N, C);
}

/* The residual add and RMSNorm, as residual_layernorm_kernel. */
template <typename A>
static __global__ void residual_rmsnorm_kernel(A *res_out, A *norm_out, float *rstd, const A *a,
                                               const A *b, const float *weight, int N, int C,
                                               float eps)
{
    int n = blockIdx.x * TS_RLN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (n >= N) return; /* whole warps leave together */
    const size_t row = (size_t)n * C;
    A *x = res_out + row;
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) {
        ts_act_store(x, c, ts_act_load(a, row + c) + ts_act_load(b, row + c));
        s = rms_lane_add(s, ts_act_load(x, c)); /* the stored (rounded) sum */
    }
    rmsnorm_row(norm_out + row, &rstd[n], (const A *)x, s, weight, C, eps, lane);
}

template <typename A>
static void residual_rmsnorm_forward(void *res_out, void *norm_out, float *rstd, const void *a,
                                     const void *b, const float *weight, int N, int C, float eps)
{
    if (N <= 0 || C <= 0) return;
    residual_rmsnorm_kernel<A><<<ts_cuda_blocks((size_t)N, TS_RLN_WARPS), TS_RLN_WARPS * 32, 0,
                                 ts_cuda_stream()>>>((A *)res_out, (A *)norm_out, rstd,
                                                     (const A *)a, (const A *)b, weight, N, C,
                                                     eps);
    TS_CUDA_LAUNCHED();
}

extern "C" void ts_cuda_residual_rmsnorm_forward(void *res_out, void *norm_out, float *rstd,
                                                 const void *a, const void *b,
                                                 const float *weight, int N, int C, float eps)
{
    residual_rmsnorm_forward<float>(res_out, norm_out, rstd, a, b, weight, N, C, eps);
}

extern "C" void ts_cuda_bf16_residual_rmsnorm_forward(void *res_out, void *norm_out, float *rstd,
                                                      const void *a, const void *b,
                                                      const float *weight, int N, int C,
                                                      float eps)
{
    residual_rmsnorm_forward<bf16>(res_out, norm_out, rstd, a, b, weight, N, C, eps);
}

/* decay_on = 1 - lr*wd for spans with weight decay, decay_off = 1 - lr*0 without (the
 * factors adamw_update computes from its weight_decay argument). */
static __global__ void adamw_spans_kernel(float *param, const float *grad, float grad_scale,
                                          float *m, float *v, const ts_adamw_span *spans,
                                          int n_spans, adamw_consts k, float decay_on,
                                          float decay_off)
{
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (int s = 0; s < n_spans; s++) {
        const ts_adamw_span sp = spans[s]; /* the same address in every thread: a broadcast */
        const float decay = sp.decay ? decay_on : decay_off;
        float *p = param + sp.offset, *mk = m + sp.moment_offset, *vk = v + sp.moment_offset;
        const float *g = grad + sp.grad_offset;
        for (size_t i = tid; i < sp.count; i += stride)
            adamw_element(&p[i], &mk[i], &vk[i], g[i], grad_scale, decay, k);
    }
}

/* The blocks of TS_SPANS_THREADS the current device runs at once: one wave, no tail.
 * Asked once (one device per process: ts_cuda_select_device binds it first). */
static unsigned resident_blocks(void)
{
    static const unsigned blocks = [] {
        int dev = 0, sms = 0, per_sm = 0;
        TS_CUDA_CHECK(cudaGetDevice(&dev));
        TS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        TS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, adamw_spans_kernel,
                                                                    TS_SPANS_THREADS, 0));
        return sms * per_sm > 0 ? (unsigned)(sms * per_sm) : 1u;
    }();
    return blocks;
}

extern "C" void ts_cuda_adamw_update_spans(float *param, const float *grad, float grad_scale,
                                           float *m, float *v, const ts_adamw_span *spans,
                                           int n_spans, float lr, float beta1, float beta2,
                                           float eps, float weight_decay, int t)
{
    if (n_spans <= 0) return;
    /* The step constants exactly as ts_cuda_adamw_update and the CPU compute them. */
    const adamw_consts k = adamw_consts_of(lr, beta1, beta2, eps, t);
    float decay_on = 1.0f - lr * weight_decay, decay_off = 1.0f - lr * 0.0f;
    adamw_spans_kernel<<<resident_blocks(), TS_SPANS_THREADS, 0, ts_cuda_stream()>>>(
        param, grad, grad_scale, m, v, spans, n_spans, k, decay_on, decay_off);
    TS_CUDA_LAUNCHED();
}
