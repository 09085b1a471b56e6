/* One-call forms of what the trainer computes in parts, for tests that check a step
 * against a reference: the trainer resolves the learning-rate schedule once
 * (ts_lr_schedule_of) and reads each step's rate (ts_lr_schedule_at), and sums squared
 * gradients over its own ranges (ts_grad_sum_squares_range). */
#ifndef TS_TEST_SUPPORT_OPTIM_ONESHOT_H
#define TS_TEST_SUPPORT_OPTIM_ONESHOT_H

#include "config/config.h"
#include "model/model.h"

/* Learning rate at 0-based step `step` of the schedule the train keys describe: linear
 * warm-up, then train.lr_schedule to min_lr (config.h ts_lr_schedule). */
double ts_lr_at(const ts_train_config *tc, int step);

/* Sum of squares of the rank's gradients over its whole gradient buffer, each parameter
 * counted once (optim.h ts_grad_sum_squares_range over [0, num_floats)). */
double ts_grad_sum_squares(const ts_model *m);

#endif
