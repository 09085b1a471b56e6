/* AdamW's per-step constants and its update of one element, shared by adamw.cu (one
 * buffer) and fused.cu (every span of a step in one launch): one definition, so the
 * two slots give the same bits, each the CPU backend's order of operations (adamw.cu's
 * comment has the formulas). */
#ifndef TS_KERNELS_CUDA_ADAMW_STEP_CUH
#define TS_KERNELS_CUDA_ADAMW_STEP_CUH

#include <math.h>

/* What every element of one step shares (weight decay aside: fused.cu's spans have it
 * on or off). */
struct adamw_consts {
    float beta1, beta2, omb1, omb2; /* omb = 1 - beta */
    float eps, step_size, bc2_sqrt; /* step_size = lr / bc1; bc2_sqrt = sqrt(bc2) */
};

/* The constants of step t, on the host exactly as the CPU backend computes them (the
 * bias corrections in double, as torch does on the host). */
static inline adamw_consts adamw_consts_of(float lr, float beta1, float beta2, float eps, int t)
{
    double bc1 = 1.0 - pow((double)beta1, (double)t);
    double bc2 = 1.0 - pow((double)beta2, (double)t);
    adamw_consts k;
    k.beta1 = beta1, k.beta2 = beta2;
    k.omb1 = 1.0f - beta1, k.omb2 = 1.0f - beta2;
    k.eps = eps;
    k.step_size = (float)((double)lr / bc1);
    k.bc2_sqrt = (float)sqrt(bc2);
    return k;
}

/* One element: the gradient scaled on the fly (grad itself unchanged), the moments,
 * then the parameter with decoupled decay (decay = 1 - lr * weight_decay). */
static __device__ __forceinline__ void adamw_element(float *p, float *m, float *v, float grad,
                                                     float grad_scale, float decay,
                                                     const adamw_consts &k)
{
    float g = grad * grad_scale;
    float mi = k.beta1 * *m + k.omb1 * g;
    float vi = k.beta2 * *v + k.omb2 * g * g;
    *m = mi;
    *v = vi;
    *p = *p * decay - k.step_size * mi / (sqrtf(vi) / k.bc2_sqrt + k.eps);
}

#endif
