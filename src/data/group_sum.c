/* The group sums (data/group_sum.h): the tied embedding over the embedding group, the
 * replicated key/value weights over the kv group. */
#include "data/group_sum.h"

#include <stdlib.h>
#include <string.h>

#include "core/timer.h"

static void add(ts_group_sums *s, int p, const ts_comm *group)
{
    const ts_param *P = &s->model->params[p];
    s->sums[s->n++] = (ts_group_sum){p, P->offset, P->numel, group};
}

void ts_group_sums_init(ts_group_sums *s, const ts_model *m, const ts_comm *embed,
                        const ts_comm *kv)
{
    memset(s, 0, sizeof *s);
    s->model = m;
    s->sums = ts_calloc((size_t)m->n_params + 1, sizeof *s->sums);
    /* pp > 1: this stage holds wte without the head, or the head's copy of wte; the two
     * are summed over the embedding group. */
    const int tied = m->wte_param >= 0 ? m->wte_param : m->head_wte_param;
    const bool split_tie = m->tied && tied >= 0 &&
                           (m->head_wte_param < 0 || m->params[tied].tied_copy);
    if (split_tie && ts_comm_member(embed) && embed->size >= 2) add(s, tied, embed);
    /* Untied with multi-token prediction: the modules read the embedding through the
     * last stage's copy (model.h mtp_wte_param), summed with the first stage's the same
     * way: the first stage's wte, or the copy. */
    const int mtp_wte = m->wte_param >= 0 ? m->wte_param : m->mtp_wte_param;
    const bool split_mtp = m->mtp_layers > 0 && !m->tied && mtp_wte >= 0 &&
                           (m->mtp_wte_param < 0 || m->params[mtp_wte].tied_copy);
    if (split_mtp && ts_comm_member(embed) && embed->size >= 2) add(s, mtp_wte, embed);
    /* Replicated key/value heads: k_proj and v_proj of every block this rank holds. */
    if (m->kv_replicas > 1 && kv->size > 1)
        for (int l = 0; l < m->n_layers; l++) {
            const ts_layer *L = &m->layers[l];
            if (!L->owned || L->kind != TS_LAYER_BLOCK) continue;
            add(s, L->first_param + TS_L_K_W, kv);
            add(s, L->first_param + TS_L_V_W, kv);
        }
    /* The MTP modules' blocks (model.h: entries after the head's, held with it). */
    if (m->kv_replicas > 1 && kv->size > 1)
        for (int l = m->n_layers; l < m->n_layers + m->mtp_layers; l++) {
            const ts_layer *L = &m->layers[l];
            if (!L->owned) continue;
            add(s, L->first_param + TS_L_K_W, kv);
            add(s, L->first_param + TS_L_V_W, kv);
        }
}

void ts_group_sums_free(ts_group_sums *s)
{
    free(s->sums);
    memset(s, 0, sizeof *s);
}

bool ts_group_sums_has(const ts_group_sums *s, int p)
{
    for (int i = 0; s && i < s->n; i++)
        if (s->sums[i].param == p) return true;
    return false;
}

double ts_group_sums_run(const ts_group_sums *s)
{
    if (s->n == 0) return 0.0;
    double t0 = ts_now_ms();
    for (int i = 0; i < s->n; i++) {
        const ts_group_sum *x = &s->sums[i];
        ts_allreduce_sum_f32(x->group, ts_param_grad(s->model, x->param), x->numel);
    }
    return ts_now_ms() - t0;
}
