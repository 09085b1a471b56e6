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

/* A step's constants, as torch computes them on the host (bias corrections in double). */
typedef struct {
    float grad_scale, beta1, beta2, omb1, omb2, eps, step_size, bc2_sqrt;
} adamw_consts;

static adamw_consts consts_of(float grad_scale, float lr, float beta1, float beta2, float eps,
                              int t)
{
    double bc1 = 1.0 - pow((double)beta1, (double)t);
    double bc2 = 1.0 - pow((double)beta2, (double)t);
    adamw_consts k = {.grad_scale = grad_scale, .beta1 = beta1, .beta2 = beta2,
                      .omb1 = 1.0f - beta1, .omb2 = 1.0f - beta2, .eps = eps,
                      .step_size = (float)((double)lr / bc1), .bc2_sqrt = (float)sqrt(bc2)};
    return k;
}

/* One chunk of at most TS_ADAMW_CHUNK elements; decay = 1 - lr*wd. Not inlined: both
 * slots run this same machine code, so adamw_update_spans gives adamw_update's bits
 * whatever the compiler's vectorisation or multiply-add contraction. */
static __attribute__((noinline)) void adamw_chunk(float *p, const float *g, float *mk, float *vk,
                                                  int len, const adamw_consts *k, float decay)
{
    const float grad_scale = k->grad_scale, beta1 = k->beta1, beta2 = k->beta2;
    const float omb1 = k->omb1, omb2 = k->omb2, eps = k->eps;
    const float step_size = k->step_size, bc2_sqrt = k->bc2_sqrt;
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

/* Chunk `c` of the n elements from offset `off` (gradients from `goff`, moments from
 * `moff`). */
static void span_chunk(float *param, const float *grad, float *m, float *v, size_t off,
                       size_t goff, size_t moff, size_t n, size_t c, const adamw_consts *k,
                       float decay)
{
    size_t i0 = c * TS_ADAMW_CHUNK;
    int len = (int)(n - i0 < TS_ADAMW_CHUNK ? n - i0 : TS_ADAMW_CHUNK);
    adamw_chunk(param + off + i0, grad + goff + i0, m + moff + i0, v + moff + i0, len, k, decay);
}

void ts_cpu_adamw_update(float *param, const float *grad, float grad_scale, float *m, float *v,
                         size_t n, float lr, float beta1, float beta2, float eps,
                         float weight_decay, int t)
{
    const adamw_consts k = consts_of(grad_scale, lr, beta1, beta2, eps, t);
    const float decay = 1.0f - lr * weight_decay;
    size_t nchunks = (n + TS_ADAMW_CHUNK - 1) / TS_ADAMW_CHUNK;
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < nchunks; c++) span_chunk(param, grad, m, v, 0, 0, 0, n, c, &k, decay);
}

void ts_cpu_adamw_update_spans(float *param, const float *grad, float grad_scale, float *m,
                               float *v, const ts_adamw_span *spans, int n_spans, float lr,
                               float beta1, float beta2, float eps, float weight_decay, int t)
{
    const adamw_consts k = consts_of(grad_scale, lr, beta1, beta2, eps, t);
    /* The decay factors exactly as adamw_update computes them from its weight_decay
     * argument (weight_decay, or 0 for a span without decay). */
    const float decay_on = 1.0f - lr * weight_decay, decay_off = 1.0f - lr * 0.0f;
    /* Chunks start at each span's start, as one adamw_update per span. One parallel
     * region; every thread walks the spans and takes its share of each span's chunks
     * without waiting for the others (the spans are disjoint). */
#pragma omp parallel
    for (int s = 0; s < n_spans; s++) {
        const ts_adamw_span sp = spans[s];
        const float decay = sp.decay ? decay_on : decay_off;
        size_t nchunks = (sp.count + TS_ADAMW_CHUNK - 1) / TS_ADAMW_CHUNK;
#pragma omp for schedule(static) nowait
        for (size_t c = 0; c < nchunks; c++)
            span_chunk(param, grad, m, v, sp.offset, sp.grad_offset, sp.moment_offset, sp.count, c,
                       &k, decay);
    }
}
