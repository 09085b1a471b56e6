/* Helpers shared by the CPU kernels (not part of the public interface). */
#ifndef TS_KERNELS_CPU_INTERNAL_H
#define TS_KERNELS_CPU_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/kernels.h"

/* expf that gcc auto-vectorises (libm's expf is a call, which blocks vectorisation
 * without -ffast-math). Cephes range reduction x = n ln2 + r, |r| <= ln2/2, and a
 * degree-7 polynomial for e^r; max relative error ~1.5 ulp on [-87.3, 88.3].
 * exp(x) = 0 below -87.34 (the smallest normal result), saturates at e^88.38. */
static inline float ts_cpu_expf(float x)
{
    const float hi = 88.3762626647949f, lo = -87.3365478515625f;
    float xc = x > hi ? hi : x;
    xc = xc < lo ? lo : xc;
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float n = (xc * 1.44269504088896341f + magic) - magic;
    float r = xc - n * 0.693359375f; /* ln2 split in two for an exact product */
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * r * r + r + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23; /* 2^n, n in [-126, 127] */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x < lo ? 0.0f : y * scale;
}

/* max(x[0..n)), n >= 1. Written as 16 independent lanes rather than a max reduction,
 * which clang does not vectorise without -ffast-math (gcc and clang both vectorise
 * this form); exact either way. */
static inline float ts_cpu_max(const float *x, int n)
{
    float lane[16];
    int i = 0;
    for (int l = 0; l < 16; l++) lane[l] = x[0];
    for (; i + 16 <= n; i += 16) {
#pragma omp simd
        for (int l = 0; l < 16; l++) lane[l] = x[i + l] > lane[l] ? x[i + l] : lane[l];
    }
    float mx = x[0];
    for (int l = 0; l < 16; l++) mx = lane[l] > mx ? lane[l] : mx;
    for (; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    return mx;
}

/* [begin, end) of part `i` of `parts` near-equal parts of `n` items. */
static inline void ts_cpu_split(size_t n, int parts, int i, size_t *begin, size_t *end)
{
    *begin = n * (size_t)i / (size_t)parts;
    *end = n * (size_t)(i + 1) / (size_t)parts;
}

/* The norms' parameter gradients (layernorm*.c, rmsnorm*.c): blocks of rows each summed
 * their rows into their own `nvec` vectors of C floats (block k at part + k*nvec*C);
 * called by every thread of the parallel region after the blocks are done, it adds the
 * blocks in order into block 0 over this thread's range of channels (whole cache lines)
 * and then into out0 (and out1, the second vector, when nvec == 2). The same order at
 * any thread count, so the same bits. */
static inline void ts_cpu_reduce_norm_blocks(float *part, int nblocks, int C, int nvec,
                                             float *out0, float *out1, int thread, int threads)
{
    size_t lines = ((size_t)C + 15) / 16, l0, l1;
    ts_cpu_split(lines, threads, thread, &l0, &l1);
    const size_t c0 = l0 * 16, c1 = l1 * 16 < (size_t)C ? l1 * 16 : (size_t)C;
    for (int k = 1; k < nblocks; k++) {
        const float *pk = part + (size_t)k * nvec * C;
        for (int v = 0; v < nvec; v++) {
#pragma omp simd
            for (size_t c = c0; c < c1; c++) part[(size_t)v * C + c] += pk[(size_t)v * C + c];
        }
    }
#pragma omp simd
    for (size_t c = c0; c < c1; c++) out0[c] += part[c];
    if (nvec == 2) {
#pragma omp simd
        for (size_t c = c0; c < c1; c++) out1[c] += part[C + c];
    }
}

/* One function per kernel, gathered into ts_kernels_cpu by table.c. */
void ts_cpu_encoder_forward(void *out, const int *tokens, const float *wte, const float *wpe,
                            int B, int T, int C);
void ts_cpu_encoder_backward(float *dwte, float *dwpe, const void *dout, const int *tokens,
                             int B, int T, int C);
void ts_cpu_layernorm_forward(void *out, float *mean, float *rstd, const void *inp,
                              const float *weight, const float *bias, int N, int C);
void ts_cpu_layernorm_backward(void *dinp, float *dweight, float *dbias, const void *dout,
                               const void *inp, const float *weight, const float *mean,
                               const float *rstd, int N, int C);
void ts_cpu_matmul_forward(void *out, const void *inp, const void *weight, const float *bias,
                           int N, int C, int OC);
void ts_cpu_matmul_backward(void *dinp, float *dweight, float *dbias, const void *dout,
                            const void *inp, const void *weight, int N, int C, int OC);
/* grouped_matmul.c: the grouped expert GEMMs (both tables' entries are there). The way
 * they spend the threads is chosen per call (TS_GROUPED_AUTO); bench/bench_grouped.c
 * forces each way to measure the choice (never set by a run). */
typedef enum { TS_GROUPED_AUTO, TS_GROUPED_SIDE_BY_SIDE, TS_GROUPED_ONE_AFTER } ts_grouped_mode;
extern ts_grouped_mode ts_cpu_grouped_mode;
void ts_cpu_grouped_matmul_forward(void *out, const void *inp, const void *const *weights,
                                   const int *rows, int L, int C, int OC);
void ts_cpu_grouped_matmul_backward(void *dinp, float *const *dweights, const void *dout,
                                    const void *inp, const void *const *weights, const int *rows,
                                    int L, int C, int OC);
/* memory.c: memory, ordering and size queries */
void *ts_cpu_dev_alloc(size_t bytes);
void ts_cpu_dev_free(void *p);
void ts_cpu_memcpy(void *dst, const void *src, size_t bytes);
void ts_cpu_memcpy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                      size_t rows);
void ts_cpu_memset_zero(void *dst, size_t bytes);
void ts_cpu_sum_into(double *acc, const float *x, size_t n);
void ts_cpu_sum_squares_into(double *acc, const float *x, size_t n);
ts_stream ts_cpu_stream_create(void);
void ts_cpu_stream_destroy(ts_stream s);
void ts_cpu_stream_sync(ts_stream s);
ts_event ts_cpu_event_record(ts_stream s);
void ts_cpu_event_wait(ts_event e);
size_t ts_cpu_attention_saved_bytes(int B, int T, ts_att_heads h);
size_t ts_cpu_attention_scratch_bytes(int B, int T, ts_att_heads h);
size_t ts_cpu_attention_prefix_saved_bytes(int B, int Tq, int Tk, ts_att_heads h);
size_t ts_cpu_attention_prefix_scratch_bytes(int B, int Tq, int Tk, ts_att_heads h);

void ts_cpu_attention_forward(void *out, void *att, const void *qkv, int B, int T,
                              ts_att_heads h);
void ts_cpu_attention_backward(void *dqkv, void *scratch, const void *dout, const void *qkv,
                               const void *att, int B, int T, ts_att_heads h);
void ts_cpu_attention_prefix_forward(void *out, void *att, const void *qkv, const void *kv,
                                     int B, int Tq, int Tk, ts_att_heads h);
void ts_cpu_attention_prefix_backward(void *dqkv, void *dkv, void *scratch,
                                      const void *dout, const void *qkv, const void *kv,
                                      const void *att, int B, int Tq, int Tk, ts_att_heads h);
void ts_cpu_rmsnorm_forward(void *out, float *rstd, const void *inp, const float *weight, int N,
                            int C, float eps);
void ts_cpu_rmsnorm_backward(void *dinp, float *dweight, const void *dout, const void *inp,
                             const float *weight, const float *rstd, int N, int C);
void ts_cpu_residual_rmsnorm_forward(void *res_out, void *norm_out, float *rstd, const void *a,
                                     const void *b, const float *weight, int N, int C, float eps);
void ts_cpu_rope_forward(void *qkv, const float *cos, const float *sin, int B, int T,
                         ts_att_heads h, int RD, bool interleaved);
void ts_cpu_rope_backward(void *dqkv, const float *cos, const float *sin, int B, int T,
                          ts_att_heads h, int RD, bool interleaved);
void ts_cpu_swiglu_forward(void *out, const void *inp, int N, int F);
void ts_cpu_swiglu_backward(void *dinp, const void *inp, const void *dout, int N, int F);
/* moe_route.c: the router's kernels, fp32 and int32 only (both tables' entries) */
void ts_cpu_moe_route_forward(const ts_moe_routing *r, float *scores, int *topk_idx,
                              float *topk_w, const float *logits, const float *bias, int N);
void ts_cpu_moe_route_backward(const ts_moe_routing *r, float *dlogits, const float *dtopk_w,
                               const float *scores, const int *topk_idx, int N);
void ts_cpu_moe_aux_forward_backward(const ts_moe_routing *r, float *z_loss, float *aux_loss,
                                     float *dlogits, const float *logits, const float *scores,
                                     const int *topk_idx, int N, int T, float cz, float ca,
                                     float z_scale, float aux_scale);
void ts_cpu_moe_balance_forward_backward(const ts_moe_routing *r, float *aux_loss,
                                         float *dlogits, const float *scores,
                                         const int *seq_counts, int N, int row0,
                                         int rows_per_seq, int T, float ca, float aux_scale);
void ts_cpu_moe_count(int *counts, const int *topk_idx, int N, int K, int E);
/* moe_dispatch.c */
void ts_cpu_moe_permute(void *xp, int *row_of, const void *x, const int *topk_idx,
                        const int *offsets, int N, int K, int C, int E);
void ts_cpu_moe_combine(void *out, const void *yp, const float *topk_w, const int *row_of, int N,
                        int K, int C);
void ts_cpu_moe_combine_backward(void *dyp, float *dtopk_w, const void *dout, const void *yp,
                                 const float *topk_w, const int *row_of, int N, int K, int C);
void ts_cpu_moe_permute_backward(void *dx, const void *dxp, const int *row_of, int N, int K, int C);
void ts_cpu_gelu_forward(void *out, const void *inp, size_t n);
void ts_cpu_gelu_backward(void *dinp, const void *inp, const void *dout, size_t n);
void ts_cpu_residual_forward(void *out, const void *a, const void *b, size_t n);
void ts_cpu_residual_layernorm_forward(void *res_out, void *ln_out, float *mean, float *rstd,
                                       const void *a, const void *b, const float *weight,
                                       const float *bias, int N, int C);
void ts_cpu_crossentropy_forward_backward(float *losses, void *logits, const int *targets,
                                          int N, int V, float dloss);
void ts_cpu_adamw_update(float *param, const float *grad, float grad_scale, float *m, float *v,
                         size_t n, float lr, float beta1, float beta2, float eps,
                         float weight_decay, int t);
void ts_cpu_adamw_update_spans(float *param, const float *grad, float grad_scale, float *m,
                               float *v, const ts_adamw_span *spans, int n_spans, float lr,
                               float beta1, float beta2, float eps, float weight_decay, int t);
double ts_cpu_sum_squares(const float *x, size_t n);
/* Muon (kernels/cpu/muon.c; the fp32 GEMM there, the bf16 one in gemm_bf16.c). */
void ts_cpu_gemm(float *c, const void *a, const void *b, int M, int N, int K, bool ta, bool tb,
                 float alpha, float beta);
void ts_cpu_muon_momentum(float *u, float *buf, const float *grad, float grad_scale, size_t n,
                          float mu, int nesterov);
void ts_cpu_muon_normalize(float *x, size_t n, const double *sumsq, float eps);
void ts_cpu_muon_apply(float *param, const float *o, size_t n, float decay, float lr_scaled,
                       double *acc);
void ts_cpu_adamw_delta_sq_spans(double *acc, const float *param, const float *m, const float *v,
                                 const ts_adamw_span *spans, int n_spans, float lr, float beta1,
                                 float beta2, float eps, float weight_decay, int t);
void ts_cpu_vocab_embed_forward(void *out, const int *tokens, const float *wte, const float *wpe,
                                int v0, int nv, int B, int T, int C);
void ts_cpu_vocab_embed_backward(float *dwte, float *dwpe, const void *dout, const int *tokens,
                                 int v0, int nv, int B, int T, int C);
void ts_cpu_xent_vp_stats(float *rowmax, float *target_logit, const void *logits,
                          const int *targets, int v0, int nv, int N);
void ts_cpu_xent_vp_sumexp(float *sumexp, const void *logits, const float *rowmax, int N, int nv);
void ts_cpu_xent_vp_finish(float *losses, void *logits, const int *targets, int v0, int nv,
                           const float *rowmax, const float *sumexp, const float *target_logit,
                           int N, float dloss);

#endif
