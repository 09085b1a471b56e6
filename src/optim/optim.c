#include "optim/optim.h"

#include <math.h>

double ts_lr_at(const ts_train_config *tc, int step)
{
    if (step < tc->warmup) return tc->lr * (double)(step + 1) / (double)tc->warmup;
    int span = tc->steps - tc->warmup;
    double r = span > 0 ? (double)(step - tc->warmup) / (double)span : 1.0;
    if (r > 1.0) r = 1.0;
    return tc->min_lr + 0.5 * (1.0 + cos(M_PI * r)) * (tc->lr - tc->min_lr);
}

double ts_grad_sum_squares(const ts_model *m)
{
    double sum = 0.0;
    for (int p = 0; p < m->n_params; p++) {
        if (m->params[p].tied_copy) continue;
        /* A tensor-parallel replica of a replicated parameter counts once: on tp rank 0. */
        if (m->params[p].split_axis < 0 && m->tp_rank != 0) continue;
        sum += m->k->sum_squares(ts_param_grad(m, p), m->params[p].numel);
    }
    return sum;
}

float ts_clip_coef(double norm, double max_norm)
{
    if (max_norm <= 0.0) return 1.0f;
    double coef = max_norm / (norm + 1e-6);
    return coef < 1.0 ? (float)coef : 1.0f;
}

void ts_adamw_step(ts_model *m, const ts_train_config *tc, double lr, float grad_scale, int t)
{
    for (int p = 0; p < m->n_params; p++) {
        const ts_param *P = &m->params[p];
        m->k->adamw_update(ts_param_data(m, p), ts_param_grad(m, p), grad_scale, m->m_mem + P->offset,
                           m->v_mem + P->offset, P->numel, (float)lr, (float)tc->beta1,
                           (float)tc->beta2, (float)tc->eps,
                           P->decay ? (float)tc->weight_decay : 0.0f, t);
    }
}
