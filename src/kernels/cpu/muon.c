/* Muon's kernels on the CPU (kernels.h "Muon"): the fp32 GEMM of the Newton-Schulz
 * iteration on OpenBLAS, and the elementwise steps shared by the fp32 and bf16 tables
 * (their buffers are fp32 whatever the table: momentum, gradients, master weights). */
#include <cblas.h>
#include <math.h>

#include "kernels/cpu/cpu_internal.h"

void ts_cpu_gemm(float *c, const void *a, const void *b, int M, int N, int K, bool ta, bool tb,
                 float alpha, float beta)
{
    if (M <= 0 || N <= 0) return;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M,
                N, K, alpha, (const float *)a, ta ? M : K, (const float *)b, tb ? K : N, beta, c,
                N);
}

/* torch.optim.Muon's buf.lerp_(g, 1 - mu) and g.lerp(buf, mu), written as torch's CPU
 * lerp computes them (weight < 0.5: start + w * (end - start); else end - (end - start) *
 * (1 - w)), so the fp32 results match torch's to the rounding of each product. */
static inline float lerp(float start, float end, float w)
{
    const float d = end - start;
    return fabsf(w) < 0.5f ? start + w * d : end - d * (1.0f - w);
}

void ts_cpu_muon_momentum(float *u, float *buf, const float *grad, float grad_scale, size_t n,
                          float mu, int nesterov)
{
    const float w = 1.0f - mu;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) {
        const float g = grad[i] * grad_scale;
        const float b = lerp(buf[i], g, w);
        buf[i] = b;
        u[i] = nesterov ? lerp(g, b, mu) : b;
    }
}

void ts_cpu_muon_normalize(float *x, size_t n, const double *sumsq, float eps)
{
    const double norm = sqrt(*sumsq);
    const float inv = (float)(1.0 / (norm > (double)eps ? norm : (double)eps));
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) x[i] *= inv;
}

void ts_cpu_muon_apply(float *param, const float *o, size_t n, float decay, float lr_scaled,
                       double *acc)
{
    double s = 0.0;
#pragma omp parallel for reduction(+ : s) schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) {
        const float old = param[i];
        const float decayed = old * decay; /* torch: mul_ then add_, two roundings */
        const float p = decayed - lr_scaled * o[i];
        param[i] = p;
        const double d = (double)p - (double)old;
        s += d * d;
    }
    if (acc) *acc += s;
}

void ts_cpu_adamw_delta_sq_spans(double *acc, const float *param, const float *m, const float *v,
                                 const ts_adamw_span *spans, int n_spans, float lr, float beta1,
                                 float beta2, float eps, float weight_decay, int t)
{
    /* adamw.c's constants: step_size = lr / (1 - beta1^t), sqrt(1 - beta2^t). */
    const double step_size = (double)lr / (1.0 - pow((double)beta1, (double)t));
    const double bc2_sqrt = sqrt(1.0 - pow((double)beta2, (double)t));
    const double decay_on = (double)(1.0f - lr * weight_decay);
    double s = 0.0;
    for (int k = 0; k < n_spans; k++) {
        const ts_adamw_span sp = spans[k];
        const double decay = sp.decay ? decay_on : 1.0;
        /* new = old * decay - upd, so old = (new + upd) / decay. */
#pragma omp parallel for reduction(+ : s) schedule(static) if (sp.count > 65536)
        for (size_t i = 0; i < sp.count; i++) {
            const double mi = m[sp.moment_offset + i], vi = v[sp.moment_offset + i];
            const double upd = step_size * mi / (sqrt(vi) / bc2_sqrt + (double)eps);
            const double p = param[sp.offset + i];
            const double d = p - (p + upd) / decay;
            s += d * d;
        }
    }
    *acc += s;
}
