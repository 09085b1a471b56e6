/* Vocab-parallel embedding and cross-entropy: each tensor-parallel rank holds the
 * vocabulary rows [v0, v0 + nv). The embedding looks up only its own tokens (zeros
 * elsewhere) before an all-reduce; the cross-entropy is split in three passes so the
 * row max, the sum of exponentials and the target logit can each be reduced across
 * ranks in between, and the full logits are never gathered. */
#include <math.h>
#include <omp.h>

#include "core/error.h"
#include "kernels/cpu/cpu_internal.h"

/* Float partial sums over chunks of this many logits, added in double (as crossentropy.c). */
#define VP_CHUNK 512

void ts_cpu_vocab_embed_forward(void *out_, const int *tokens, const float *wte, const float *wpe,
                                int v0, int nv, int B, int T, int C)
{
    float *out = out_;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < B * T; n++) {
        float *o = out + (size_t)n * C;
        int tok = tokens[n] - v0;
        const float *w = tok >= 0 && tok < nv ? wte + (size_t)tok * C : NULL;
        const float *p = wpe ? wpe + (size_t)(n % T) * C : NULL;
        for (int c = 0; c < C; c++) o[c] = (w ? w[c] : 0.0f) + (p ? p[c] : 0.0f);
    }
}

void ts_cpu_vocab_embed_backward(float *dwte, float *dwpe, const void *dout_, const int *tokens,
                                 int v0, int nv, int B, int T, int C)
{
    const float *dout = dout_;
    /* Each thread owns a range of channels and walks the rows in order: deterministic
     * for any thread count, and no two threads touch the same gradient element. */
#pragma omp parallel
    {
        size_t c0, c1;
        ts_cpu_split((size_t)C, omp_get_num_threads(), omp_get_thread_num(), &c0, &c1);
        for (int n = 0; n < B * T; n++) {
            const float *d = dout + (size_t)n * C;
            int tok = tokens[n] - v0;
            if (tok >= 0 && tok < nv) {
                float *w = dwte + (size_t)tok * C;
                for (size_t c = c0; c < c1; c++) w[c] += d[c];
            }
            if (dwpe) {
                float *p = dwpe + (size_t)(n % T) * C;
                for (size_t c = c0; c < c1; c++) p[c] += d[c];
            }
        }
    }
}

void ts_cpu_xent_vp_stats(float *rowmax, float *target_logit, const void *logits_,
                          const int *targets, int v0, int nv, int N)
{
    const float *logits = logits_;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * nv;
        rowmax[n] = ts_cpu_max(x, nv);
        int t = targets[n] - v0;
        target_logit[n] = t >= 0 && t < nv ? x[t] : 0.0f;
    }
}

void ts_cpu_xent_vp_sumexp(float *sumexp, const void *logits_, const float *rowmax, int N, int nv)
{
    const float *logits = logits_;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * nv;
        const float mx = rowmax[n];
        double sum = 0.0;
        for (int i0 = 0; i0 < nv; i0 += VP_CHUNK) {
            int i1 = i0 + VP_CHUNK < nv ? i0 + VP_CHUNK : nv;
            float part = 0.0f;
#pragma omp simd reduction(+ : part)
            for (int i = i0; i < i1; i++) part += ts_cpu_expf(x[i] - mx);
            sum += part;
        }
        sumexp[n] = (float)sum;
    }
}

void ts_cpu_xent_vp_finish(float *losses, void *logits_, const int *targets, int v0, int nv,
                           const float *rowmax, const float *sumexp, const float *target_logit,
                           int N, float dloss)
{
    float *logits = logits_;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *x = logits + (size_t)n * nv;
        const float mx = rowmax[n];
        losses[n] = (float)(log((double)sumexp[n]) + (double)mx - (double)target_logit[n]);
        const float s = dloss / sumexp[n];
#pragma omp simd
        for (int i = 0; i < nv; i++) x[i] = ts_cpu_expf(x[i] - mx) * s;
        int t = targets[n] - v0;
        if (t >= 0 && t < nv) x[t] -= dloss;
    }
}
