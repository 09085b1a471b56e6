/* Fused CUDA kernels that save passes over memory (fused.cu): the block's residual add
 * with the LayerNorm or RMSNorm that reads it (per activation type: the fp32 tables' and
 * the bf16 tables'), and AdamW over every span of an optimizer step in one launch (fp32 state,
 * every table). */
#ifndef TS_KERNELS_CUDA_FUSED_H
#define TS_KERNELS_CUDA_FUSED_H

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

void ts_cuda_residual_layernorm_forward(void *res_out, void *ln_out, float *mean, float *rstd,
                                        const void *a, const void *b, const float *weight,
                                        const float *bias, int N, int C);
void ts_cuda_bf16_residual_layernorm_forward(void *res_out, void *ln_out, float *mean,
                                             float *rstd, const void *a, const void *b,
                                             const float *weight, const float *bias, int N,
                                             int C);
void ts_cuda_residual_rmsnorm_forward(void *res_out, void *norm_out, float *rstd, const void *a,
                                      const void *b, const float *weight, int N, int C,
                                      float eps);
void ts_cuda_bf16_residual_rmsnorm_forward(void *res_out, void *norm_out, float *rstd,
                                           const void *a, const void *b, const float *weight,
                                           int N, int C, float eps);
void ts_cuda_adamw_update_spans(float *param, const float *grad, float grad_scale, float *m,
                                float *v, const ts_adamw_span *spans, int n_spans, float lr,
                                float beta1, float beta2, float eps, float weight_decay, int t);

#ifdef __cplusplus
}
#endif

#endif
