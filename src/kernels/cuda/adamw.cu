/* torch.optim.AdamW (decoupled weight decay, bias-corrected moments), one thread per
 * element (grid-stride), fp32. The step constants are computed on the host exactly as
 * the CPU backend computes them (bias corrections in double, as torch does on the
 * host), and each element follows the CPU's order of operations, so the two backends
 * differ only where a compiler fuses a multiply-add:
 *   g = grad * grad_scale   (the clipping coefficient, applied on the fly; grad unchanged)
 *   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
 *   p = p (1 - lr wd) - step_size m / (sqrt(v) / sqrt(bc2) + eps),  step_size = lr / bc1.
 * sqrtf and the divisions are IEEE-rounded (nvcc's defaults without --use_fast_math). */
#include <math.h>

#include "kernels/cuda/cuda_internal.h"

#define TS_ADAMW_THREADS 256

static __global__ void adamw_kernel(float *param, const float *grad, float grad_scale, float *m,
                                    float *v, size_t n, float beta1, float beta2, float omb1,
                                    float omb2, float eps, float step_size, float bc2_sqrt,
                                    float decay)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = grad[i] * grad_scale;
        float mi = beta1 * m[i] + omb1 * g;
        float vi = beta2 * v[i] + omb2 * g * g;
        m[i] = mi;
        v[i] = vi;
        param[i] = param[i] * decay - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
    }
}

extern "C" void ts_cuda_adamw_update(float *param, const float *grad, float grad_scale, float *m,
                                     float *v, size_t n, float lr, float beta1, float beta2,
                                     float eps, float weight_decay, int t)
{
    if (n == 0) return;
    double bc1 = 1.0 - pow((double)beta1, (double)t);
    double bc2 = 1.0 - pow((double)beta2, (double)t);
    float step_size = (float)((double)lr / bc1);
    float bc2_sqrt = (float)sqrt(bc2);
    float decay = 1.0f - lr * weight_decay;
    float omb1 = 1.0f - beta1, omb2 = 1.0f - beta2;
    adamw_kernel<<<ts_cuda_blocks(n, TS_ADAMW_THREADS), TS_ADAMW_THREADS, 0, ts_cuda_stream()>>>(
        param, grad, grad_scale, m, v, n, beta1, beta2, omb1, omb2, eps, step_size, bc2_sqrt,
        decay);
    TS_CUDA_LAUNCHED();
}
