/* Vocab-parallel embedding and cross-entropy: each tensor-parallel rank holds the
 * vocabulary rows [v0, v0 + nv). The embedding looks up only its own tokens (zeros
 * elsewhere) before an all-reduce; the cross-entropy is split in three passes so the
 * row max, the sum of exponentials and the target logit can each be reduced across
 * ranks in between, and the full logits are never gathered. One body per kernel for
 * both storage types (storage.h): fp32 rows in place, bf16 ones widened a chunk at a
 * time onto the stack (the passes run in fp32, sums in double) and rounded back once. */
#include <math.h>
#include <omp.h>

#include "core/error.h"
#include "kernels/cpu/cpu_bf16_internal.h"
#include "kernels/cpu/cpu_internal.h"

/* Float partial sums over chunks of this many logits, added in double (as crossentropy.c). */
#define VP_CHUNK 512
_Static_assert(VP_CHUNK <= TS_BF16_CHUNK, "a chunk of logits fits the stack buffer");

static void vocab_embed_forward(ts_dtype t, void *out, const int *tokens, const float *wte,
                                const float *wpe, int v0, int nv, int B, int T, int C)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < B * T; n++) {
        const size_t r = (size_t)n * C;
        int tok = tokens[n] - v0;
        const float *w = tok >= 0 && tok < nv ? wte + (size_t)tok * C : NULL;
        const float *p = wpe ? wpe + (size_t)(n % T) * C : NULL;
        float yb[TS_BF16_CHUNK];
        for (int c0 = 0, m; c0 < C; c0 += m) {
            m = (int)ts_cpu_chunk(t, (size_t)(C - c0));
            float *y = ts_cpu_out(t, yb, out, r + c0);
            for (int c = 0; c < m; c++) y[c] = (w ? w[c0 + c] : 0.0f) + (p ? p[c0 + c] : 0.0f);
            ts_cpu_store(t, out, r + c0, y, (size_t)m);
        }
    }
}

/* Each thread owns a range of channels and walks the rows in order: deterministic for
 * any thread count, and no two threads touch the same gradient element. */
static void vocab_embed_backward(ts_dtype t, float *dwte, float *dwpe, const void *dout,
                                 const int *tokens, int v0, int nv, int B, int T, int C)
{
#pragma omp parallel
    {
        size_t c0, c1;
        ts_cpu_split((size_t)C, omp_get_num_threads(), omp_get_thread_num(), &c0, &c1);
        float db[TS_BF16_CHUNK];
        for (int n = 0; n < B * T; n++) {
            int tok = tokens[n] - v0;
            float *w = tok >= 0 && tok < nv ? dwte + (size_t)tok * C : NULL;
            float *p = dwpe ? dwpe + (size_t)(n % T) * C : NULL;
            if (!w && !p) continue;
            for (size_t k0 = c0, m; k0 < c1; k0 += m) {
                m = ts_cpu_chunk(t, c1 - k0);
                const float *d = ts_cpu_load(t, db, dout, (size_t)n * C + k0, m);
                if (w)
                    for (size_t c = 0; c < m; c++) w[k0 + c] += d[c];
                if (p)
                    for (size_t c = 0; c < m; c++) p[k0 + c] += d[c];
            }
        }
    }
}

/* The row max is exact in any order (fp32 takes the row in one piece, bf16 a chunk at
 * a time); the target logit as stored. */
static void xent_vp_stats(ts_dtype t, float *rowmax, float *target_logit, const void *logits,
                          const int *targets, int v0, int nv, int N)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const size_t r = (size_t)n * nv;
        float buf[TS_BF16_CHUNK], mx = 0.0f;
        for (int i0 = 0, m; i0 < nv; i0 += m) {
            m = (int)ts_cpu_chunk(t, (size_t)(nv - i0));
            float cm = ts_cpu_max(ts_cpu_load(t, buf, logits, r + i0, (size_t)m), m);
            mx = i0 == 0 || cm > mx ? cm : mx;
        }
        rowmax[n] = mx;
        int tt = targets[n] - v0;
        target_logit[n] = tt >= 0 && tt < nv ? *ts_cpu_load(t, buf, logits, r + tt, 1) : 0.0f;
    }
}

static void xent_vp_sumexp(ts_dtype t, float *sumexp, const void *logits, const float *rowmax,
                           int N, int nv)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const size_t r = (size_t)n * nv;
        const float mx = rowmax[n];
        float buf[VP_CHUNK];
        double sum = 0.0;
        for (int i0 = 0; i0 < nv; i0 += VP_CHUNK) {
            int m = nv - i0 < VP_CHUNK ? nv - i0 : VP_CHUNK;
            const float *x = ts_cpu_load(t, buf, logits, r + i0, (size_t)m);
            float part = 0.0f;
#pragma omp simd reduction(+ : part)
            for (int i = 0; i < m; i++) part += ts_cpu_expf(x[i] - mx);
            sum += part;
        }
        sumexp[n] = (float)sum;
    }
}

static void xent_vp_finish(ts_dtype t, float *losses, void *logits, const int *targets, int v0,
                           int nv, const float *rowmax, const float *sumexp,
                           const float *target_logit, int N, float dloss)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const size_t r = (size_t)n * nv;
        const float mx = rowmax[n];
        losses[n] = (float)(log((double)sumexp[n]) + (double)mx - (double)target_logit[n]);
        const float s = dloss / sumexp[n];
        int tt = targets[n] - v0;
        float buf[TS_BF16_CHUNK];
        for (int i0 = 0, m; i0 < nv; i0 += m) {
            m = (int)ts_cpu_chunk(t, (size_t)(nv - i0));
            float *x = ts_cpu_load_out(t, buf, logits, r + i0, (size_t)m);
#pragma omp simd
            for (int i = 0; i < m; i++) x[i] = ts_cpu_expf(x[i] - mx) * s;
            /* the one-hot term in fp32, before any rounding */
            if (tt >= i0 && tt < i0 + m) x[tt - i0] -= dloss;
            ts_cpu_store(t, logits, r + i0, x, (size_t)m);
        }
    }
}

void ts_cpu_vocab_embed_forward(void *out, const int *tokens, const float *wte, const float *wpe,
                                int v0, int nv, int B, int T, int C)
{
    vocab_embed_forward(TS_DTYPE_F32, out, tokens, wte, wpe, v0, nv, B, T, C);
}

void ts_cpu_bf16_vocab_embed_forward(void *out, const int *tokens, const float *wte,
                                     const float *wpe, int v0, int nv, int B, int T, int C)
{
    vocab_embed_forward(TS_DTYPE_BF16, out, tokens, wte, wpe, v0, nv, B, T, C);
}

void ts_cpu_vocab_embed_backward(float *dwte, float *dwpe, const void *dout, const int *tokens,
                                 int v0, int nv, int B, int T, int C)
{
    vocab_embed_backward(TS_DTYPE_F32, dwte, dwpe, dout, tokens, v0, nv, B, T, C);
}

void ts_cpu_bf16_vocab_embed_backward(float *dwte, float *dwpe, const void *dout,
                                      const int *tokens, int v0, int nv, int B, int T, int C)
{
    vocab_embed_backward(TS_DTYPE_BF16, dwte, dwpe, dout, tokens, v0, nv, B, T, C);
}

void ts_cpu_xent_vp_stats(float *rowmax, float *target_logit, const void *logits,
                          const int *targets, int v0, int nv, int N)
{
    xent_vp_stats(TS_DTYPE_F32, rowmax, target_logit, logits, targets, v0, nv, N);
}

void ts_cpu_bf16_xent_vp_stats(float *rowmax, float *target_logit, const void *logits,
                               const int *targets, int v0, int nv, int N)
{
    xent_vp_stats(TS_DTYPE_BF16, rowmax, target_logit, logits, targets, v0, nv, N);
}

void ts_cpu_xent_vp_sumexp(float *sumexp, const void *logits, const float *rowmax, int N, int nv)
{
    xent_vp_sumexp(TS_DTYPE_F32, sumexp, logits, rowmax, N, nv);
}

void ts_cpu_bf16_xent_vp_sumexp(float *sumexp, const void *logits, const float *rowmax, int N,
                                int nv)
{
    xent_vp_sumexp(TS_DTYPE_BF16, sumexp, logits, rowmax, N, nv);
}

void ts_cpu_xent_vp_finish(float *losses, void *logits, const int *targets, int v0, int nv,
                           const float *rowmax, const float *sumexp, const float *target_logit,
                           int N, float dloss)
{
    xent_vp_finish(TS_DTYPE_F32, losses, logits, targets, v0, nv, rowmax, sumexp, target_logit, N,
                   dloss);
}

void ts_cpu_bf16_xent_vp_finish(float *losses, void *logits, const int *targets, int v0, int nv,
                                const float *rowmax, const float *sumexp,
                                const float *target_logit, int N, float dloss)
{
    xent_vp_finish(TS_DTYPE_BF16, losses, logits, targets, v0, nv, rowmax, sumexp, target_logit,
                   N, dloss);
}
