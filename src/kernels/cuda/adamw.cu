/* torch.optim.AdamW (decoupled weight decay, bias-corrected moments), one thread per
 * element (grid-stride), fp32. The step constants are computed on the host exactly as
 * the CPU backend computes them (bias corrections in double, as torch does on the
 * host), and each element follows the CPU's order of operations, so the two backends
 * differ only where a compiler fuses a multiply-add:
 *   g = grad * grad_scale   (the clipping coefficient, applied on the fly; grad unchanged)
 *   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
 *   p = p (1 - lr wd) - step_size m / (sqrt(v) / sqrt(bc2) + eps),  step_size = lr / bc1.
 * sqrtf and the divisions are IEEE-rounded (nvcc's defaults without --use_fast_math). */
#include "kernels/cuda/adamw_step.cuh"
#include "kernels/cuda/cuda_internal.h"

#define TS_ADAMW_THREADS 256

static __global__ void adamw_kernel(float *param, const float *grad, float grad_scale, float *m,
                                    float *v, size_t n, adamw_consts k, float decay)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        adamw_element(&param[i], &m[i], &v[i], grad[i], grad_scale, decay, k);
}

extern "C" void ts_cuda_adamw_update(float *param, const float *grad, float grad_scale, float *m,
                                     float *v, size_t n, float lr, float beta1, float beta2,
                                     float eps, float weight_decay, int t)
{
    if (n == 0) return;
    const adamw_consts k = adamw_consts_of(lr, beta1, beta2, eps, t);
    float decay = 1.0f - lr * weight_decay;
    adamw_kernel<<<ts_cuda_blocks(n, TS_ADAMW_THREADS), TS_ADAMW_THREADS, 0, ts_cuda_stream()>>>(
        param, grad, grad_scale, m, v, n, k, decay);
    TS_CUDA_LAUNCHED();
}
