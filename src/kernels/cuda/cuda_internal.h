/* What the CUDA backend's files share (not part of the public interface): the checks,
 * the one compute stream and cuBLAS handle, launch helpers, and every slot's function.
 *
 * Four tables (table.cu): "cuda" and "cuda-flash", fp32 activations, so every kernel can
 * be compared with the CPU backend to 1e-5; "cuda-bf16" and "cuda-bf16-flash", bf16
 * activations in device memory (kernels.h's act_dtype), each kernel loading bf16,
 * computing in fp32 and storing bf16 (act.cuh), GEMMs on bf16 operands with fp32
 * accumulation. Parameters' master copies, gradients and the optimizer's state are fp32
 * in every table; the bf16 matmuls' weights are the model's bf16 compute copy. GEMMs go
 * through cuBLASLt (gemm_lt.h). All work is queued on one compute stream
 * (ts_cuda_stream); copies to the host wait for it, so the table keeps the CPU backend's
 * "done when it returns" semantics for anything the host reads. */
#ifndef TS_KERNELS_CUDA_INTERNAL_H
#define TS_KERNELS_CUDA_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stddef.h>

#include "core/error.h"
#include "kernels/kernels.h"

/* A failing CUDA or cuBLAS call ends the run with where and why (there is no recovering
 * from a device fault mid-step). */
#define TS_CUDA_CHECK(call)                                                                 \
    do {                                                                                    \
        cudaError_t e_ = (call);                                                            \
        if (e_ != cudaSuccess) ts_cuda_fail(__FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
    } while (0)
#define TS_CUBLAS_CHECK(call)                                                               \
    do {                                                                                    \
        cublasStatus_t s_ = (call);                                                         \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                    \
            ts_cuda_fail(__FILE__, __LINE__, #call, cublasGetStatusString(s_));              \
    } while (0)
/* After a kernel launch: launch errors at once (a bad configuration), not at the next
 * synchronisation. */
#define TS_CUDA_LAUNCHED() TS_CUDA_CHECK(cudaGetLastError())

#ifdef __cplusplus
extern "C" {
#endif

TS_NORETURN void ts_cuda_fail(const char *file, int line, const char *call, const char *why);

/* The compute stream and the cuBLAS handle bound to it, made on first use on the
 * current device (memory.cu). */
cudaStream_t ts_cuda_stream(void);
cublasHandle_t ts_cuda_cublas(void);

/* Blocks of `threads` covering n items (at least one block). */
static inline unsigned ts_cuda_blocks(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    return b ? (unsigned)(b < 2147483647u ? b : 2147483647u) : 1u;
}

/* ---- memory and ordering (memory.cu); convert.cu: the convert slot */
void *ts_cuda_dev_alloc(size_t bytes);
void ts_cuda_dev_free(void *p);
void ts_cuda_memcpy_h2d(void *dst, const void *src, size_t bytes);
void ts_cuda_memcpy_d2h(void *dst, const void *src, size_t bytes);
void ts_cuda_memcpy_d2d(void *dst, const void *src, size_t bytes);
void ts_cuda_memcpy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                       size_t rows);
/* Context parallelism's prefix attention (attention.cu; kernels.h attention_prefix_*). */
size_t ts_cuda_attention_prefix_saved_bytes(int B, int Tq, int Tk, ts_att_heads h);
size_t ts_cuda_attention_prefix_scratch_bytes(int B, int Tq, int Tk, ts_att_heads h);
size_t ts_cuda_bf16_attention_prefix_saved_bytes(int B, int Tq, int Tk, ts_att_heads h);
size_t ts_cuda_bf16_attention_prefix_scratch_bytes(int B, int Tq, int Tk, ts_att_heads h);
void ts_cuda_attention_prefix_forward(void *out, void *att, const void *qkv, const void *kv,
                                      int B, int Tq, int Tk, ts_att_heads h);
void ts_cuda_bf16_attention_prefix_forward(void *out, void *att, const void *qkv,
                                           const void *kv, int B, int Tq, int Tk, ts_att_heads h);
void ts_cuda_attention_prefix_backward(void *dqkv, void *dkv, void *scratch, const void *dout,
                                       const void *qkv, const void *kv, const void *att, int B,
                                       int Tq, int Tk, ts_att_heads h);
void ts_cuda_bf16_attention_prefix_backward(void *dqkv, void *dkv, void *scratch,
                                            const void *dout, const void *qkv, const void *kv,
                                            const void *att, int B, int Tq, int Tk,
                                            ts_att_heads h);
void ts_cuda_memset_zero(void *dst, size_t bytes);
void ts_cuda_convert(void *dst, ts_dtype dst_type, const void *src, ts_dtype src_type, size_t n);
void ts_cuda_sum_into(double *acc, const float *x, size_t n);
void ts_cuda_sum_squares_into(double *acc, const float *x, size_t n);
double ts_cuda_sum_squares(const float *x, size_t n);
ts_stream ts_cuda_stream_create(void);
void ts_cuda_stream_destroy(ts_stream s);
void ts_cuda_stream_sync(ts_stream s);
ts_event ts_cuda_event_record(ts_stream s);
void ts_cuda_event_wait(ts_event e);

/* ---- the slots on fp32 parameters and optimizer state: one function for both
 * precisions */
void ts_cuda_adamw_update(float *param, const float *grad, float grad_scale, float *m, float *v,
                          size_t n, float lr, float beta1, float beta2, float eps,
                          float weight_decay, int t);

/* ---- Muon (muon.cu): its GEMM per precision, the elementwise steps for both */
void ts_cuda_gemm_f32(float *c, const void *a, const void *b, int M, int N, int K, bool ta,
                      bool tb, float alpha, float beta);
void ts_cuda_bf16_gemm(float *c, const void *a, const void *b, int M, int N, int K, bool ta,
                       bool tb, float alpha, float beta);
void ts_cuda_muon_momentum(float *u, float *buf, const float *grad, float grad_scale, size_t n,
                           float mu, int nesterov);
void ts_cuda_muon_apply(float *param, const float *o, size_t n, float decay, float lr_scaled,
                        double *acc);
void ts_cuda_adamw_delta_sq_spans(double *acc, const float *param, const float *m,
                                  const float *v, const ts_adamw_span *spans, int n_spans,
                                  float lr, float beta1, float beta2, float eps,
                                  float weight_decay, int t);

/* ---- the mixture-of-experts router's slots, fp32 and int32 only: one function for both
 * precisions (moe.cu) */
void ts_cuda_moe_route_forward(const ts_moe_routing *r, float *scores, int *topk_idx,
                               float *topk_w, const float *logits, const float *bias, int N);
void ts_cuda_moe_route_backward(const ts_moe_routing *r, float *dlogits, const float *dtopk_w,
                                const float *scores, const int *topk_idx, int N);
void ts_cuda_moe_aux_forward_backward(const ts_moe_routing *r, float *z_loss, float *aux_loss,
                                      float *dlogits, const float *logits, const float *scores,
                                      const int *topk_idx, int N, int T, float cz, float ca,
                                      float z_scale, float aux_scale);
void ts_cuda_moe_balance_forward_backward(const ts_moe_routing *r, float *aux_loss,
                                          float *dlogits, const float *scores,
                                          const int *seq_counts, int N, int row0,
                                          int rows_per_seq, int T, float ca, float aux_scale);
void ts_cuda_moe_count(int *counts, const int *topk_idx, int N, int K, int E);
void ts_cuda_moe_capacity(int *keep, const int *topk_idx, const float *topk_w, int N, int K,
                          int E, int T, int capacity);

/* ---- the slots on activations, kernels.h's arguments and rules: once per activation
 * type, the fp32 tables' ts_cuda_<slot> (float activations) and the bf16 tables'
 * ts_cuda_bf16_<slot> (__nv_bfloat16 activations), from one template each (encoder.cu,
 * layernorm.cu (LayerNorm, RMSNorm), matmul.cu, elementwise.cu (GELU, residual, RoPE,
 * SwiGLU), moe.cu (the MoE dispatch), crossentropy.cu, vocab_parallel.cu; fused.h has
 * residual_layernorm_forward and residual_rmsnorm_forward, attention_flash.h the
 * attention slots). */
#define TS_CUDA_ACT_SLOT_DECLS(p)                                                                \
    void p##encoder_forward(void *out, const int *tokens, const float *wte, const float *wpe,     \
                            int B, int T, int C);                                                \
    void p##encoder_backward(float *dwte, float *dwpe, const void *dout, const int *tokens,      \
                             int B, int T, int C);                                               \
    void p##layernorm_forward(void *out, float *mean, float *rstd, const void *inp,              \
                              const float *weight, const float *bias, int N, int C);             \
    void p##layernorm_backward(void *dinp, float *dweight, float *dbias, const void *dout,       \
                               const void *inp, const float *weight, const float *mean,          \
                               const float *rstd, int N, int C);                                 \
    void p##rmsnorm_forward(void *out, float *rstd, const void *inp, const float *weight, int N, \
                            int C, float eps);                                                   \
    void p##rmsnorm_backward(void *dinp, float *dweight, const void *dout, const void *inp,      \
                             const float *weight, const float *rstd, int N, int C);              \
    void p##rope_forward(void *qkv, const float *cos, const float *sin, int B, int T,            \
                         ts_att_heads h, int RD, bool interleaved);                              \
    void p##rope_backward(void *dqkv, const float *cos, const float *sin, int B, int T,          \
                          ts_att_heads h, int RD, bool interleaved);                             \
    void p##swiglu_forward(void *out, const void *inp, int N, int F);                            \
    void p##swiglu_backward(void *dinp, const void *inp, const void *dout, int N, int F);        \
    void p##moe_permute(void *xp, int *row_of, const void *x, const int *topk_idx,               \
                        const int *offsets, int N, int K, int C, int E);                         \
    void p##moe_combine(void *out, const void *yp, const float *topk_w, const int *row_of, int N, \
                        int K, int C);                                                           \
    void p##moe_combine_backward(void *dyp, float *dtopk_w, const void *dout, const void *yp,    \
                                 const float *topk_w, const int *row_of, int N, int K, int C);   \
    void p##moe_permute_backward(void *dx, const void *dxp, const int *row_of, int N, int K,     \
                                 int C);                                                         \
    void p##matmul_forward(void *out, const void *inp, const void *weight, const float *bias,    \
                           int N, int C, int OC);                                                \
    void p##matmul_backward(void *dinp, float *dweight, float *dbias, const void *dout,          \
                            const void *inp, const void *weight, int N, int C, int OC);          \
    void p##grouped_matmul_forward(void *out, const void *inp, const void *const *weights,       \
                                   const int *rows, int L, int C, int OC);                       \
    void p##grouped_matmul_backward(void *dinp, float *const *dweights, const void *dout,        \
                                    const void *inp, const void *const *weights,                 \
                                    const int *rows, int L, int C, int OC);                      \
    void p##gelu_forward(void *out, const void *inp, size_t n);                                  \
    void p##gelu_backward(void *dinp, const void *inp, const void *dout, size_t n);              \
    void p##residual_forward(void *out, const void *a, const void *b, size_t n);                 \
    void p##crossentropy_forward_backward(float *losses, void *logits, const int *targets,       \
                                          int N, int V, float dloss);                            \
    void p##vocab_embed_forward(void *out, const int *tokens, const float *wte,                  \
                                const float *wpe, int v0, int nv, int B, int T, int C);          \
    void p##vocab_embed_backward(float *dwte, float *dwpe, const void *dout, const int *tokens,  \
                                 int v0, int nv, int B, int T, int C);                           \
    void p##xent_vp_stats(float *rowmax, float *target_logit, const void *logits,                \
                          const int *targets, int v0, int nv, int N);                            \
    void p##xent_vp_sumexp(float *sumexp, const void *logits, const float *rowmax, int N,        \
                           int nv);                                                              \
    void p##xent_vp_finish(float *losses, void *logits, const int *targets, int v0, int nv,      \
                           const float *rowmax, const float *sumexp, const float *target_logit,  \
                           int N, float dloss);
TS_CUDA_ACT_SLOT_DECLS(ts_cuda_)
TS_CUDA_ACT_SLOT_DECLS(ts_cuda_bf16_)
#undef TS_CUDA_ACT_SLOT_DECLS

#ifdef __cplusplus
}
#endif

#endif
