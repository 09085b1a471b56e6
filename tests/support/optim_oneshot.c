/* optim_oneshot.h: the trainer's pieces, composed. */
#include "support/optim_oneshot.h"

#include "optim/optim.h"

double ts_lr_at(const ts_train_config *tc, int step)
{
    ts_lr_schedule s;
    ts_lr_schedule_of(tc, &s);
    return ts_lr_schedule_at(&s, step);
}

double ts_grad_sum_squares(const ts_model *m)
{
    return ts_grad_sum_squares_range(m, 0, m->num_floats);
}
