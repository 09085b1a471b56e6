/* Muon's kernels on CUDA (kernels.h "Muon"): the Newton-Schulz GEMM on cuBLAS (fp32
 * operands, or bf16 operands under the bf16 tables; fp32 c, CUBLAS_COMPUTE_32F: no TF32),
 * the momentum and the update elementwise on fp32 memory (one function for both
 * precisions), and the update's squared changes for the metrics (block sums added to the
 * accumulator with atomicAdd: the order of the blocks' additions may vary, a metric's
 * last bits only; the weights themselves are elementwise, the same bits every run). */
#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/reduce.cuh"

#define TS_MUON_THREADS 256
#define TS_MUON_MAX_BLOCKS 1024

/* Row-major c[M,N] = alpha op(a) op(b) + beta c is column-major c^T = op(b)^T op(a)^T:
 * cuBLAS's A is b (stored [K,N], col-major [N,K] ld N: no transpose; stored [N,K] when tb:
 * transposed, ld K), its B is a (stored [M,K]: col-major [K,M] ld K; [K,M] when ta:
 * transposed, ld M). */
static void gemm(cudaDataType_t ab, float *c, const void *a, const void *b, int M, int N, int K,
                 bool ta, bool tb, float alpha, float beta)
{
    if (M <= 0 || N <= 0) return;
    TS_CUBLAS_CHECK(cublasGemmEx(ts_cuda_cublas(), tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                               ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, b, ab,
                               tb ? K : N, a, ab, ta ? M : K, &beta, c, CUDA_R_32F, N,
                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

extern "C" void ts_cuda_gemm_f32(float *c, const void *a, const void *b, int M, int N, int K,
                                 bool ta, bool tb, float alpha, float beta)
{
    gemm(CUDA_R_32F, c, a, b, M, N, K, ta, tb, alpha, beta);
}

extern "C" void ts_cuda_bf16_gemm(float *c, const void *a, const void *b, int M, int N, int K,
                                  bool ta, bool tb, float alpha, float beta)
{
    gemm(CUDA_R_16BF, c, a, b, M, N, K, ta, tb, alpha, beta);
}

/* The CPU's lerp (kernels/cpu/muon.c): torch's two forms around w = 0.5. */
static __device__ __forceinline__ float lerp(float start, float end, float w)
{
    const float d = end - start;
    return fabsf(w) < 0.5f ? __fadd_rn(start, __fmul_rn(w, d))
                           : __fsub_rn(end, __fmul_rn(d, 1.0f - w));
}

static __global__ void momentum_kernel(float *u, float *buf, const float *grad, float grad_scale,
                                       size_t n, float mu, int nesterov)
{
    const float w = 1.0f - mu;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float g = __fmul_rn(grad[i], grad_scale);
        const float b = lerp(buf[i], g, w);
        buf[i] = b;
        u[i] = nesterov ? lerp(g, b, mu) : b;
    }
}

extern "C" void ts_cuda_muon_momentum(float *u, float *buf, const float *grad, float grad_scale,
                                      size_t n, float mu, int nesterov)
{
    if (n == 0) return;
    const unsigned blocks = ts_cuda_blocks(n, TS_MUON_THREADS);
    momentum_kernel<<<blocks < TS_MUON_MAX_BLOCKS ? blocks : TS_MUON_MAX_BLOCKS, TS_MUON_THREADS, 0,
                      ts_cuda_stream()>>>(u, buf, grad, grad_scale, n, mu, nesterov);
    TS_CUDA_LAUNCHED();
}

static __global__ void apply_kernel(float *param, const float *o, size_t n, float decay,
                                    float lr_scaled, double *acc)
{
    double s = 0.0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float old = param[i];
        /* torch: mul_ then add_, two roundings (no fused multiply-add) */
        const float p = __fsub_rn(__fmul_rn(old, decay), __fmul_rn(lr_scaled, o[i]));
        param[i] = p;
        const double d = (double)p - (double)old;
        s += d * d;
    }
    if (!acc) return; /* the same in every thread: no thread waits in block_sum alone */
    s = block_sum(s);
    if (threadIdx.x == 0) atomicAdd(acc, s);
}

extern "C" void ts_cuda_muon_apply(float *param, const float *o, size_t n, float decay,
                                   float lr_scaled, double *acc)
{
    if (n == 0) return;
    const unsigned blocks = ts_cuda_blocks(n, TS_MUON_THREADS);
    apply_kernel<<<blocks < TS_MUON_MAX_BLOCKS ? blocks : TS_MUON_MAX_BLOCKS, TS_MUON_THREADS, 0,
                   ts_cuda_stream()>>>(param, o, n, decay, lr_scaled, acc);
    TS_CUDA_LAUNCHED();
}

/* Every block walks every span (device memory the host never reads, as
 * adamw_update_spans's kernel does), its threads striding over each with the grid. */
static __global__ void adamw_delta_kernel(double *acc, const float *param, const float *m,
                                          const float *v, const ts_adamw_span *spans, int n_spans,
                                          double step_size, double bc2_sqrt, double eps,
                                          double decay_on)
{
    double s = 0.0;
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (int k = 0; k < n_spans; k++) {
        const ts_adamw_span sp = spans[k];
        const double decay = sp.decay ? decay_on : 1.0;
        for (size_t i = tid; i < sp.count; i += stride) {
            const double upd = step_size * (double)m[sp.moment_offset + i] /
                               (sqrt((double)v[sp.moment_offset + i]) / bc2_sqrt + eps);
            const double p = param[sp.offset + i];
            const double d = p - (p + upd) / decay;
            s += d * d;
        }
    }
    s = block_sum(s);
    if (threadIdx.x == 0) atomicAdd(acc, s);
}

extern "C" void ts_cuda_adamw_delta_sq_spans(double *acc, const float *param, const float *m,
                                             const float *v, const ts_adamw_span *spans,
                                             int n_spans, float lr, float beta1, float beta2,
                                             float eps, float weight_decay, int t)
{
    if (n_spans <= 0) return;
    /* The CPU's constants (kernels/cpu/muon.c). */
    const double step_size = (double)lr / (1.0 - pow((double)beta1, (double)t));
    const double bc2_sqrt = sqrt(1.0 - pow((double)beta2, (double)t));
    const double decay_on = (double)(1.0f - lr * weight_decay);
    adamw_delta_kernel<<<TS_MUON_MAX_BLOCKS / 4, TS_MUON_THREADS, 0, ts_cuda_stream()>>>(
        acc, param, m, v, spans, n_spans, step_size, bc2_sqrt, (double)eps, decay_on);
    TS_CUDA_LAUNCHED();
}
