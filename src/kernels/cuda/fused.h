/* Fused CUDA kernels that save passes over memory (fused.cu): the block's residual add
 * with the LayerNorm that reads it, and AdamW over every span of an optimizer step in one
 * launch. Slots residual_layernorm_forward and adamw_update_spans of ts_kernels_cuda. */
#ifndef TS_KERNELS_CUDA_FUSED_H
#define TS_KERNELS_CUDA_FUSED_H

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

void ts_cuda_residual_layernorm_forward(float *res_out, float *ln_out, float *mean, float *rstd,
                                        const float *a, const float *b, const float *weight,
                                        const float *bias, int N, int C);
void ts_cuda_adamw_update_spans(float *param, const float *grad, float grad_scale, float *m,
                                float *v, const ts_adamw_span *spans, int n_spans, float lr,
                                float beta1, float beta2, float eps, float weight_decay, int t);

#ifdef __cplusplus
}
#endif

#endif
