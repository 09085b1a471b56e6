/* AdamW over a model's flat buffers, global-norm clipping and the LR schedule
 * (CONTRACT.md "Optimizer"). The norm is a sum of squares that callers reduce across
 * ranks before taking the root, so clipping is grid-wide. */
#ifndef TS_OPTIM_H
#define TS_OPTIM_H

#include "config/config.h"
#include "model/model.h"

/* Learning rate at 0-based step s: linear warm-up, then cosine to min_lr. */
double ts_lr_at(const ts_train_config *tc, int step);

/* Sum of squares of this rank's gradients over unique parameters (tied copies are
 * skipped: the tensor they copy is counted where it lives; tp-replicated parameters
 * count on tp rank 0 only). */
double ts_grad_sum_squares(const ts_model *m);

/* torch.nn.utils.clip_grad_norm_'s factor: min(1, max_norm / (norm + 1e-6));
 * 1 when max_norm <= 0 (clipping off). */
float ts_clip_coef(double norm, double max_norm);

/* One AdamW step (t = 1-based step count) on every parameter: gradients are first
 * multiplied by grad_scale; weight decay only on tensors marked `decay`. */
void ts_adamw_step(ts_model *m, const ts_train_config *tc, double lr, float grad_scale, int t);

#endif
