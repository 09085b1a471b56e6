/* torch.optim.AdamW (decoupled weight decay, bias-corrected moments). */
#include <math.h>

#include "kernels/cpu/cpu_internal.h"

void ts_cpu_adamw_update(float *param, const float *grad, float *m, float *v, size_t n,
                         float lr, float beta1, float beta2, float eps, float weight_decay,
                         int t)
{
    /* Bias corrections in double, as torch computes them on the host. */
    double bc1 = 1.0 - pow((double)beta1, (double)t);
    double bc2 = 1.0 - pow((double)beta2, (double)t);
    float step_size = (float)((double)lr / bc1);
    float bc2_sqrt = (float)sqrt(bc2);
    float decay = 1.0f - lr * weight_decay;
    float omb1 = 1.0f - beta1, omb2 = 1.0f - beta2;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = grad[i];
        float mi = beta1 * m[i] + omb1 * g;
        float vi = beta2 * v[i] + omb2 * g * g;
        m[i] = mi;
        v[i] = vi;
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        param[i] = param[i] * decay - step_size * mi / denom;
    }
}
