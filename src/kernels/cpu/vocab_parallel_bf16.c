/* Vocab-parallel embedding and cross-entropy (vocab_parallel.c's semantics) on bf16
 * activations: the embedding's partial rows are rounded once; the logits are widened
 * for the three cross-entropy passes, which run in fp32 (sums in double) as there. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "core/error.h"
#include "kernels/cpu/cpu_bf16_internal.h"
#include "kernels/cpu/cpu_internal.h"

#define VP_CHUNK 512
_Static_assert(VP_CHUNK <= TS_BF16_CHUNK, "a chunk of logits fits the stack buffer");

void ts_cpu_bf16_vocab_embed_forward(void *out, const int *tokens, const float *wte,
                                     const float *wpe, int v0, int nv, int B, int T, int C)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < B * T; n++) {
        ts_bf16 *o = (ts_bf16 *)out + (size_t)n * C;
        int tok = tokens[n] - v0;
        const float *w = tok >= 0 && tok < nv ? wte + (size_t)tok * C : NULL;
        const float *p = wpe ? wpe + (size_t)(n % T) * C : NULL;
        float y[TS_BF16_CHUNK];
        for (int c0 = 0; c0 < C; c0 += TS_BF16_CHUNK) {
            int m = C - c0 < TS_BF16_CHUNK ? C - c0 : TS_BF16_CHUNK;
            for (int c = 0; c < m; c++)
                y[c] = (w ? w[c0 + c] : 0.0f) + (p ? p[c0 + c] : 0.0f);
            ts_f32_to_bf16_array(o + c0, y, (size_t)m);
        }
    }
}

/* Each thread owns a range of channels and walks the rows in order: deterministic for
 * any thread count, and no two threads touch the same gradient element. */
void ts_cpu_bf16_vocab_embed_backward(float *dwte, float *dwpe, const void *dout,
                                      const int *tokens, int v0, int nv, int B, int T, int C)
{
#pragma omp parallel
    {
        size_t c0, c1;
        ts_cpu_split((size_t)C, omp_get_num_threads(), omp_get_thread_num(), &c0, &c1);
        float d[TS_BF16_CHUNK];
        for (int n = 0; n < B * T; n++) {
            const ts_bf16 *drow = (const ts_bf16 *)dout + (size_t)n * C;
            int tok = tokens[n] - v0;
            float *w = tok >= 0 && tok < nv ? dwte + (size_t)tok * C : NULL;
            float *p = dwpe ? dwpe + (size_t)(n % T) * C : NULL;
            if (!w && !p) continue;
            for (size_t k0 = c0; k0 < c1; k0 += TS_BF16_CHUNK) {
                size_t m = c1 - k0 < TS_BF16_CHUNK ? c1 - k0 : TS_BF16_CHUNK;
                ts_bf16_to_f32_array(d, drow + k0, m);
                if (w)
                    for (size_t c = 0; c < m; c++) w[k0 + c] += d[c];
                if (p)
                    for (size_t c = 0; c < m; c++) p[k0 + c] += d[c];
            }
        }
    }
}

/* The row max of bf16 values is exact in any order: widened a chunk at a time. */
void ts_cpu_bf16_xent_vp_stats(float *rowmax, float *target_logit, const void *logits,
                               const int *targets, int v0, int nv, int N)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const ts_bf16 *x = (const ts_bf16 *)logits + (size_t)n * nv;
        float buf[TS_BF16_CHUNK], mx = ts_bf16_to_f32(x[0]);
        for (int i0 = 0; i0 < nv; i0 += TS_BF16_CHUNK) {
            int m = nv - i0 < TS_BF16_CHUNK ? nv - i0 : TS_BF16_CHUNK;
            ts_bf16_to_f32_array(buf, x + i0, (size_t)m);
            float cm = ts_cpu_max(buf, m);
            mx = cm > mx ? cm : mx;
        }
        rowmax[n] = mx;
        int t = targets[n] - v0;
        target_logit[n] = t >= 0 && t < nv ? ts_bf16_to_f32(x[t]) : 0.0f;
    }
}

void ts_cpu_bf16_xent_vp_sumexp(float *sumexp, const void *logits, const float *rowmax, int N,
                                int nv)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const ts_bf16 *x = (const ts_bf16 *)logits + (size_t)n * nv;
        const float mx = rowmax[n];
        float buf[VP_CHUNK];
        double sum = 0.0;
        for (int i0 = 0; i0 < nv; i0 += VP_CHUNK) {
            int m = nv - i0 < VP_CHUNK ? nv - i0 : VP_CHUNK;
            ts_bf16_to_f32_array(buf, x + i0, (size_t)m);
            float part = 0.0f;
#pragma omp simd reduction(+ : part)
            for (int i = 0; i < m; i++) part += ts_cpu_expf(buf[i] - mx);
            sum += part;
        }
        sumexp[n] = (float)sum;
    }
}

void ts_cpu_bf16_xent_vp_finish(float *losses, void *logits, const int *targets, int v0, int nv,
                                const float *rowmax, const float *sumexp,
                                const float *target_logit, int N, float dloss)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        ts_bf16 *x = (ts_bf16 *)logits + (size_t)n * nv;
        const float mx = rowmax[n];
        losses[n] = (float)(log((double)sumexp[n]) + (double)mx - (double)target_logit[n]);
        const float s = dloss / sumexp[n];
        int t = targets[n] - v0;
        float buf[TS_BF16_CHUNK];
        for (int i0 = 0; i0 < nv; i0 += TS_BF16_CHUNK) {
            int m = nv - i0 < TS_BF16_CHUNK ? nv - i0 : TS_BF16_CHUNK;
            ts_bf16_to_f32_array(buf, x + i0, (size_t)m);
#pragma omp simd
            for (int i = 0; i < m; i++) buf[i] = ts_cpu_expf(buf[i] - mx) * s;
            /* the one-hot term in fp32, before the rounding */
            if (t >= i0 && t < i0 + m) buf[t - i0] -= dloss;
            ts_f32_to_bf16_array(x + i0, buf, (size_t)m);
        }
    }
}
