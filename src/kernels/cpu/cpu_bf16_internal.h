/* The bf16 CPU kernels' entry points, gathered into ts_kernels_cpu_bf16 by table.c. Each
 * has the fp32 kernel's semantics: most are the same body as their fp32 twin in
 * kernels/cpu/<name>.c, run over bf16 storage (storage.h: loaded into fp32, computed in
 * fp32, stored with one rounding to nearest even, bf16.h); matmul and attention have
 * their own oneDNN files (matmul_bf16.c, attention_bf16.c). */
#ifndef TS_KERNELS_CPU_BF16_INTERNAL_H
#define TS_KERNELS_CPU_BF16_INTERNAL_H

#include <stddef.h>

#include "kernels/cpu/bf16.h"
#include "kernels/cpu/storage.h"
#include "kernels/kernels.h"

void ts_cpu_bf16_convert(void *dst, ts_dtype dst_type, const void *src, ts_dtype src_type,
                         size_t n);
size_t ts_cpu_bf16_attention_saved_bytes(int B, int T, ts_att_heads h);
size_t ts_cpu_bf16_attention_scratch_bytes(int B, int T, ts_att_heads h);
size_t ts_cpu_bf16_attention_prefix_saved_bytes(int B, int Tq, int Tk, ts_att_heads h);
size_t ts_cpu_bf16_attention_prefix_scratch_bytes(int B, int Tq, int Tk, ts_att_heads h);

void ts_cpu_bf16_encoder_forward(void *out, const int *tokens, const float *wte, const float *wpe,
                                 int B, int T, int C);
void ts_cpu_bf16_encoder_backward(float *dwte, float *dwpe, const void *dout, const int *tokens,
                                  int B, int T, int C);
void ts_cpu_bf16_layernorm_forward(void *out, float *mean, float *rstd, const void *inp,
                                   const float *weight, const float *bias, int N, int C);
void ts_cpu_bf16_layernorm_backward(void *dinp, float *dweight, float *dbias, const void *dout,
                                    const void *inp, const float *weight, const float *mean,
                                    const float *rstd, int N, int C);
/* Muon's GEMM: bf16 operands, fp32 c and accumulation (oneDNN; gemm_bf16.c). */
void ts_cpu_bf16_gemm(float *c, const void *a, const void *b, int M, int N, int K, bool ta,
                      bool tb, float alpha, float beta);
void ts_cpu_bf16_matmul_forward(void *out, const void *inp, const void *weight, const float *bias,
                                int N, int C, int OC);
void ts_cpu_bf16_matmul_backward(void *dinp, float *dweight, float *dbias, const void *dout,
                                 const void *inp, const void *weight, int N, int C, int OC);
void ts_cpu_bf16_grouped_matmul_forward(void *out, const void *inp, const void *const *weights,
                                        const int *rows, int L, int C, int OC);
void ts_cpu_bf16_grouped_matmul_backward(void *dinp, float *const *dweights, const void *dout,
                                         const void *inp, const void *const *weights,
                                         const int *rows, int L, int C, int OC);
void ts_cpu_bf16_attention_forward(void *out, void *att, const void *qkv, int B, int T,
                                   ts_att_heads h);
void ts_cpu_bf16_attention_backward(void *dqkv, void *scratch, const void *dout, const void *qkv,
                                    const void *att, int B, int T, ts_att_heads h);
void ts_cpu_bf16_attention_prefix_forward(void *out, void *att, const void *qkv, const void *kv,
                                          int B, int Tq, int Tk, ts_att_heads h);
void ts_cpu_bf16_attention_prefix_backward(void *dqkv, void *dkv, void *scratch,
                                           const void *dout, const void *qkv, const void *kv,
                                           const void *att, int B, int Tq, int Tk, ts_att_heads h);
void ts_cpu_bf16_rmsnorm_forward(void *out, float *rstd, const void *inp, const float *weight,
                                 int N, int C, float eps);
void ts_cpu_bf16_rmsnorm_backward(void *dinp, float *dweight, const void *dout, const void *inp,
                                  const float *weight, const float *rstd, int N, int C);
void ts_cpu_bf16_residual_rmsnorm_forward(void *res_out, void *norm_out, float *rstd,
                                          const void *a, const void *b, const float *weight,
                                          int N, int C, float eps);
void ts_cpu_bf16_rope_forward(void *qkv, const float *cos, const float *sin, int B, int T,
                              ts_att_heads h, int RD, bool interleaved);
void ts_cpu_bf16_rope_backward(void *dqkv, const float *cos, const float *sin, int B, int T,
                               ts_att_heads h, int RD, bool interleaved);
void ts_cpu_bf16_swiglu_forward(void *out, const void *inp, int N, int F);
void ts_cpu_bf16_swiglu_backward(void *dinp, const void *inp, const void *dout, int N, int F);
void ts_cpu_bf16_moe_permute(void *xp, int *row_of, const void *x, const int *topk_idx,
                             const int *offsets, int N, int K, int C, int E);
void ts_cpu_bf16_moe_combine(void *out, const void *yp, const float *topk_w, const int *row_of,
                             int N, int K, int C);
void ts_cpu_bf16_moe_combine_backward(void *dyp, float *dtopk_w, const void *dout, const void *yp,
                                      const float *topk_w, const int *row_of, int N, int K, int C);
void ts_cpu_bf16_moe_permute_backward(void *dx, const void *dxp, const int *row_of, int N, int K,
                                      int C);
void ts_cpu_bf16_gelu_forward(void *out, const void *inp, size_t n);
void ts_cpu_bf16_gelu_backward(void *dinp, const void *inp, const void *dout, size_t n);
void ts_cpu_bf16_residual_forward(void *out, const void *a, const void *b, size_t n);
void ts_cpu_bf16_residual_layernorm_forward(void *res_out, void *ln_out, float *mean, float *rstd,
                                            const void *a, const void *b, const float *weight,
                                            const float *bias, int N, int C);
void ts_cpu_bf16_crossentropy_forward_backward(float *losses, void *logits, const int *targets,
                                               int N, int V, float dloss);
void ts_cpu_bf16_vocab_embed_forward(void *out, const int *tokens, const float *wte,
                                     const float *wpe, int v0, int nv, int B, int T, int C);
void ts_cpu_bf16_vocab_embed_backward(float *dwte, float *dwpe, const void *dout,
                                      const int *tokens, int v0, int nv, int B, int T, int C);
void ts_cpu_bf16_xent_vp_stats(float *rowmax, float *target_logit, const void *logits,
                               const int *targets, int v0, int nv, int N);
void ts_cpu_bf16_xent_vp_sumexp(float *sumexp, const void *logits, const float *rowmax, int N,
                                int nv);
void ts_cpu_bf16_xent_vp_finish(float *losses, void *logits, const int *targets, int v0, int nv,
                                const float *rowmax, const float *sumexp,
                                const float *target_logit, int N, float dloss);

#endif
