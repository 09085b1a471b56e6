/* torch.optim.AdamW (decoupled weight decay, bias-corrected moments). */
#include <math.h>

#if defined(__AVX512F__) || defined(__AVX__)
#include <immintrin.h>
#endif

#include "kernels/cpu/cpu_internal.h"

/* Elements per chunk: the three loops below share a stack buffer that stays in L1. */
#define TS_ADAMW_CHUNK 512

/* y = sqrt(x), correctly rounded. gcc does not vectorise sqrtf unless errno is
 * disabled (-fno-math-errno), which is a build-wide flag, so use the instruction. */
static void sqrt_into(float *y, const float *x, int n)
{
    int i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_sqrt_ps(_mm512_loadu_ps(x + i)));
#elif defined(__AVX__)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_sqrt_ps(_mm256_loadu_ps(x + i)));
#endif
    for (; i < n; i++) y[i] = sqrtf(x[i]);
}

void ts_cpu_adamw_update(float *param, const float *grad, float grad_scale, float *m, float *v,
                         size_t n, float lr, float beta1, float beta2, float eps,
                         float weight_decay, int t)
{
    /* Bias corrections in double, as torch computes them on the host. */
    double bc1 = 1.0 - pow((double)beta1, (double)t);
    double bc2 = 1.0 - pow((double)beta2, (double)t);
    float step_size = (float)((double)lr / bc1);
    float bc2_sqrt = (float)sqrt(bc2);
    float decay = 1.0f - lr * weight_decay;
    float omb1 = 1.0f - beta1, omb2 = 1.0f - beta2;
    size_t nchunks = (n + TS_ADAMW_CHUNK - 1) / TS_ADAMW_CHUNK;
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < nchunks; k++) {
        size_t i0 = k * TS_ADAMW_CHUNK;
        int len = (int)(n - i0 < TS_ADAMW_CHUNK ? n - i0 : TS_ADAMW_CHUNK);
        float *p = param + i0, *mk = m + i0, *vk = v + i0;
        const float *g = grad + i0;
        float denom[TS_ADAMW_CHUNK];
#pragma omp simd
        for (int i = 0; i < len; i++) {
            float gi = g[i] * grad_scale; /* the float product torch's clip_grad_norm_ makes */
            mk[i] = beta1 * mk[i] + omb1 * gi;
            vk[i] = beta2 * vk[i] + omb2 * gi * gi;
        }
        sqrt_into(denom, vk, len); /* denom = sqrt(v), finished below */
        /* p *= 1 - lr*wd;  p -= step_size * m / (sqrt(v) / sqrt(bc2) + eps) */
#pragma omp simd
        for (int i = 0; i < len; i++)
            p[i] = p[i] * decay - step_size * mk[i] / (denom[i] / bc2_sqrt + eps);
    }
}
