/* What the CUDA backend's files share (not part of the public interface): the checks,
 * the one compute stream and cuBLAS handle, launch helpers, and every slot's function.
 *
 * Two tables (table.cu): "cuda", fp32 throughout, so every kernel can be compared with
 * the CPU backend to 1e-5; and "cuda-bf16", the same but for the matmuls, whose GEMMs
 * take bf16 operands with fp32 accumulation (bf16.cu; fp32 master weights, fp32
 * activations and gradients in memory). GEMMs go through cuBLASLt (gemm_lt.h). All
 * work is queued on one compute stream (ts_cuda_stream); copies to the host wait for
 * it, so the table keeps the CPU backend's "done when it returns" semantics for
 * anything the host reads. */
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

/* ---- memory and ordering (memory.cu) */
void *ts_cuda_dev_alloc(size_t bytes);
void ts_cuda_dev_free(void *p);
void ts_cuda_memcpy_h2d(void *dst, const void *src, size_t bytes);
void ts_cuda_memcpy_d2h(void *dst, const void *src, size_t bytes);
void ts_cuda_memcpy_d2d(void *dst, const void *src, size_t bytes);
void ts_cuda_memset_zero(void *dst, size_t bytes);
void ts_cuda_sum_into(double *acc, const float *x, size_t n);
void ts_cuda_sum_squares_into(double *acc, const float *x, size_t n);
double ts_cuda_sum_squares(const float *x, size_t n);
ts_stream ts_cuda_stream_create(void);
void ts_cuda_stream_destroy(ts_stream s);
void ts_cuda_stream_sync(ts_stream s);
ts_event ts_cuda_event_record(ts_stream s);
void ts_cuda_event_wait(ts_event e);
size_t ts_cuda_attention_saved_floats(int B, int T, int NH, int HS);
size_t ts_cuda_attention_scratch_floats(int B, int T, int NH, int HS);

/* ---- kernels: the slots of kernels.h, same arguments and rules */
void ts_cuda_encoder_forward(float *out, const int *tokens, const float *wte, const float *wpe,
                             int B, int T, int C);
void ts_cuda_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *tokens,
                              int B, int T, int C);
void ts_cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                               const float *weight, const float *bias, int N, int C);
void ts_cuda_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                const float *inp, const float *weight, const float *mean,
                                const float *rstd, int N, int C);
void ts_cuda_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                            int N, int C, int OC);
void ts_cuda_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, int N, int C, int OC);
void ts_cuda_attention_forward(float *out, float *att, const float *qkv, int B, int T, int NH,
                               int HS);
void ts_cuda_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                                const float *att, int B, int T, int NH, int HS);
void ts_cuda_gelu_forward(float *out, const float *inp, size_t n);
void ts_cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);
void ts_cuda_residual_forward(float *out, const float *a, const float *b, size_t n);
void ts_cuda_crossentropy_forward_backward(float *losses, float *logits, const int *targets,
                                           int N, int V, float dloss);
void ts_cuda_adamw_update(float *param, const float *grad, float grad_scale, float *m, float *v,
                          size_t n, float lr, float beta1, float beta2, float eps,
                          float weight_decay, int t);
void ts_cuda_vocab_embed_forward(float *out, const int *tokens, const float *wte,
                                 const float *wpe, int v0, int nv, int B, int T, int C);
void ts_cuda_vocab_embed_backward(float *dwte, float *dwpe, const float *dout, const int *tokens,
                                  int v0, int nv, int B, int T, int C);
void ts_cuda_xent_vp_stats(float *rowmax, float *target_logit, const float *logits,
                           const int *targets, int v0, int nv, int N);
void ts_cuda_xent_vp_sumexp(float *sumexp, const float *logits, const float *rowmax, int N,
                            int nv);
void ts_cuda_xent_vp_finish(float *losses, float *logits, const int *targets, int v0, int nv,
                            const float *rowmax, const float *sumexp, const float *target_logit,
                            int N, float dloss);

/* ---- the bf16 table's own slots (bf16.cu): its matmuls, and the fp32 slots that write
 * or free device memory, wrapped to keep its cache of bf16 weight copies current */
void ts_cuda_bf16_matmul_forward(float *out, const float *inp, const float *weight,
                                 const float *bias, int N, int C, int OC);
void ts_cuda_bf16_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                  const float *inp, const float *weight, int N, int C, int OC);
void ts_cuda_bf16_adamw_update(float *param, const float *grad, float grad_scale, float *m,
                               float *v, size_t n, float lr, float beta1, float beta2, float eps,
                               float weight_decay, int t);
void ts_cuda_bf16_adamw_update_spans(float *param, const float *grad, float grad_scale,
                                     float *m, float *v, const ts_adamw_span *spans, int n_spans,
                                     float lr, float beta1, float beta2, float eps,
                                     float weight_decay, int t);
void *ts_cuda_bf16_dev_alloc(size_t bytes);
void ts_cuda_bf16_dev_free(void *p);
void ts_cuda_bf16_memcpy_h2d(void *dst, const void *src, size_t bytes);
void ts_cuda_bf16_memcpy_d2d(void *dst, const void *src, size_t bytes);
void ts_cuda_bf16_memset_zero(void *dst, size_t bytes);

/* ---- shared between kernel files */
/* matmul.cu: dbias[OC] += column sums of dout[N,OC], deterministic (a fixed order, the
 * same bits every run); nothing when dbias is NULL. And out[N,OC] = bias (or 0) on every
 * row: the forward of an empty inner dimension (C = 0). */
void ts_cuda_dbias_accumulate(float *dbias, const float *dout, int N, int OC);
void ts_cuda_matmul_empty_forward(float *out, const float *bias, int N, int OC);
/* encoder.cu: the embedding for vocabulary rows [v0, v0 + nv) (wpe, dwpe may be NULL),
 * behind both encoder_* (v0 = 0, every row) and vocab_embed_*. */
void ts_cuda_embed_forward(float *out, const int *tokens, const float *wte, const float *wpe,
                           int v0, int nv, int B, int T, int C);
void ts_cuda_embed_backward(float *dwte, float *dwpe, const float *dout, const int *tokens,
                            int v0, int nv, int B, int T, int C);

#ifdef __cplusplus
}
#endif

#endif
