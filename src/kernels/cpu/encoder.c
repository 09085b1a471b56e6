/* Token + position embedding (wpe NULL: token embedding only, llama's rotary
 * positions are applied to q and k instead), from the fp32 tables into activations of
 * either storage type, and its backward from either into the fp32 tables (storage.h:
 * fp32 rows in place, bf16 ones through stack chunks). V is not passed, so token ids
 * cannot be range-checked here: callers must pass ids in [0, V). */
#include <omp.h>

#include "core/error.h"
#include "kernels/cpu/cpu_bf16_internal.h"
#include "kernels/cpu/cpu_internal.h"

static void encoder_forward(ts_dtype t, void *out, const int *tokens, const float *wte,
                            const float *wpe, int B, int T, int C)
{
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        const size_t r = (size_t)bt * C;
        const float *e = wte + (size_t)tokens[bt] * C;
        if (!wpe) { /* the token embedding alone: copied (fp32) or rounded (bf16) */
            ts_cpu_store(t, out, r, e, (size_t)C);
            continue;
        }
        const float *p = wpe + (size_t)(bt % T) * C;
        float yb[TS_BF16_CHUNK];
        for (int c0 = 0, n; c0 < C; c0 += n) {
            n = (int)ts_cpu_chunk(t, (size_t)(C - c0));
            float *y = ts_cpu_out(t, yb, out, r + c0);
#pragma omp simd
            for (int c = 0; c < n; c++) y[c] = e[c0 + c] + p[c0 + c];
            ts_cpu_store(t, out, r + c0, y, (size_t)n);
        }
    }
}

/* A token can repeat within the batch, so rows of dwte cannot be split among threads.
 * Each thread owns a range of channels instead and walks all rows in order: no races,
 * and every element is summed in the same order whatever the thread count. */
static void encoder_backward(ts_dtype t, float *dwte, float *dwpe, const void *dout,
                             const int *tokens, int B, int T, int C)
{
#pragma omp parallel
    {
        /* Channel ranges rounded to 16 floats (one cache line) to avoid false sharing. */
        size_t lines = ((size_t)C + 15) / 16, l0, l1;
        ts_cpu_split(lines, omp_get_num_threads(), omp_get_thread_num(), &l0, &l1);
        size_t c0 = l0 * 16, c1 = l1 * 16 < (size_t)C ? l1 * 16 : (size_t)C;
        float db[TS_BF16_CHUNK];
        for (int bt = 0; bt < B * T; bt++) {
            float *we = dwte + (size_t)tokens[bt] * C;
            float *pe = dwpe ? dwpe + (size_t)(bt % T) * C : NULL;
            for (size_t k0 = c0, n; k0 < c1; k0 += n) {
                n = ts_cpu_chunk(t, c1 - k0);
                const float *d = ts_cpu_load(t, db, dout, (size_t)bt * C + k0, n);
#pragma omp simd
                for (size_t c = 0; c < n; c++) we[k0 + c] += d[c];
                if (!pe) continue;
#pragma omp simd
                for (size_t c = 0; c < n; c++) pe[k0 + c] += d[c];
            }
        }
    }
}

void ts_cpu_encoder_forward(void *out, const int *tokens, const float *wte, const float *wpe,
                            int B, int T, int C)
{
    encoder_forward(TS_DTYPE_F32, out, tokens, wte, wpe, B, T, C);
}

void ts_cpu_bf16_encoder_forward(void *out, const int *tokens, const float *wte, const float *wpe,
                                 int B, int T, int C)
{
    encoder_forward(TS_DTYPE_BF16, out, tokens, wte, wpe, B, T, C);
}

void ts_cpu_encoder_backward(float *dwte, float *dwpe, const void *dout, const int *tokens,
                             int B, int T, int C)
{
    encoder_backward(TS_DTYPE_F32, dwte, dwpe, dout, tokens, B, T, C);
}

void ts_cpu_bf16_encoder_backward(float *dwte, float *dwpe, const void *dout, const int *tokens,
                                  int B, int T, int C)
{
    encoder_backward(TS_DTYPE_BF16, dwte, dwpe, dout, tokens, B, T, C);
}
