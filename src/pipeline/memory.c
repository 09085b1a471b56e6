#include "pipeline/memory.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "kernels/kernels.h"
#include "model/model.h"

void ts_memory_peak_sets(const ts_schedule *s, int recompute, int pp_rank, int *peak_acts,
                         int *peak_stash)
{
    const int n = s->n_chunks, m = s->m;
    const bool full = recompute == TS_RECOMPUTE_FULL;
    const bool except_last = recompute == TS_RECOMPUTE_EXCEPT_LAST;
    int *live = calloc((size_t)n, sizeof(int)), *stash = calloc((size_t)n, sizeof(int));
    TS_ASSERT(live && stash);
    for (int c = pp_rank; c < n; c += s->pp) peak_acts[c] = peak_stash[c] = 0;
    for (int i = 0; i < s->n_actions[pp_rank]; i++) {
        const ts_action *a = &s->actions[pp_rank][i];
        const int c = a->chunk;
        const bool recomputed = full || (except_last && a->mb != m - 1);
        switch (a->kind) {
        case TS_ACT_F:
            if (++live[c] > peak_acts[c]) peak_acts[c] = live[c];
            if (recomputed) live[c]--;
            break;
        case TS_ACT_B:
        case TS_ACT_I:
            if (recomputed) live[c]++;
            if (live[c] > peak_acts[c]) peak_acts[c] = live[c];
            if (a->kind == TS_ACT_B)
                live[c]--;
            else if (++stash[c] > peak_stash[c])
                peak_stash[c] = stash[c];
            break;
        case TS_ACT_W:
            live[c]--;
            stash[c]--;
            break;
        }
    }
    free(live);
    free(stash);
}

void ts_memory_estimate(const ts_config *cfg, const ts_partition *part,
                        const ts_schedule *sched, int pp_rank, int threads,
                        ts_rank_memory *est)
{
    memset(est, 0, sizeof *est);
    const ts_model_config *mc = &cfg->model;
    const int n_layers = mc->n_layer + 2, B = cfg->parallel.micro_batch, T = mc->seq_len;
    const double f = sizeof(float), NC = (double)B * T * mc->n_embd;

    bool *owned = calloc((size_t)n_layers, sizeof(bool));
    TS_ASSERT(owned);
    ts_partition_owned(part, pp_rank, owned);
    ts_model m; /* the layout only: nothing is allocated */
    ts_tp tp = ts_tp_make(cfg->parallel.tp, 0, NULL, &ts_kernels_cpu); /* rank 0: most vocab */
    ts_model_layout_tp(&m, mc, owned, &tp);
    free(owned);
    est->params = est->grads = (double)m.num_floats * f;
    /* The two AdamW moments; ZeRO-1 keeps this rank's 1/dp of them (grad_sync.h). */
    est->optimizer = 2.0 * (double)m.num_floats * f /
                     (cfg->parallel.zero == 1 ? (double)cfg->parallel.dp : 1.0);

    int *peak_acts = calloc((size_t)sched->n_chunks, sizeof(int));
    int *peak_stash = calloc((size_t)sched->n_chunks, sizeof(int));
    TS_ASSERT(peak_acts && peak_stash);
    const int mode = ts_recompute_from_name(cfg->parallel.recompute);
    ts_memory_peak_sets(sched, mode, pp_rank, peak_acts, peak_stash);
    bool recompute = mode != TS_RECOMPUTE_NONE;
    for (int c = pp_rank; c < sched->n_chunks; c += sched->pp) {
        int l0 = part->first_layer[c], l1 = l0 + part->n_chunk_layers[c];
        if (l1 <= l0) continue;
        double set = (double)ts_acts_floats(&m, l0, l1, B, T) * f + 2.0 * B * T * sizeof(int);
        est->activations += peak_acts[c] * set;
        est->activations += peak_stash[c] * (double)ts_acts_stash_floats(&m, l0, l1, B, T) * f;
        /* Per micro-batch: the received input (not chunk 0), the gradient buffer, and
         * with recomputation the kept output copy and token ids (engine.c). */
        double slot = NC * f * ((c > 0) + 1);
        if (recompute) slot += NC * f * (c < sched->n_chunks - 1) + 2.0 * B * T * sizeof(int);
        est->buffers += slot * sched->m;
    }
    est->buffers += (double)ts_scratch_floats(&m, B, T) * f;
    /* checkpoint.async copies this rank's share of the weights and both moments (1/dp
     * of what the pipeline rank holds) while a thread writes them. */
    if (cfg->checkpoint.async && cfg->checkpoint.dir[0])
        est->buffers += 3.0 * (double)m.num_floats * f / (double)cfg->parallel.dp;
    free(peak_acts);
    free(peak_stash);
    ts_model_free(&m);

    est->blas = threads * TS_BLAS_THREAD_BYTES;
    est->total = est->params + est->grads + est->optimizer + est->activations + est->buffers +
                 est->blas;
}

const char *ts_memory_describe(const ts_rank_memory *e, char *buf, size_t size)
{
    char t[32], p[32], g[32], o[32], a[32], b[32], l[32];
    ts_format_bytes(e->total, t, sizeof t);
    ts_format_bytes(e->params, p, sizeof p);
    ts_format_bytes(e->grads, g, sizeof g);
    ts_format_bytes(e->optimizer, o, sizeof o);
    ts_format_bytes(e->activations, a, sizeof a);
    ts_format_bytes(e->buffers, b, sizeof b);
    ts_format_bytes(e->blas, l, sizeof l);
    snprintf(buf, size,
             "%s (parameters %s, gradients %s, optimizer state %s, activations %s, "
             "buffers %s, BLAS buffers %s)",
             t, p, g, o, a, b, l);
    return buf;
}

double ts_memory_chunk_grad_bytes(const ts_config *cfg, const ts_partition *part, int chunk)
{
    const ts_model_config *mc = &cfg->model;
    bool *owned = calloc((size_t)mc->n_layer + 2, sizeof(bool));
    TS_ASSERT(owned);
    const int l0 = part->first_layer[chunk], l1 = l0 + part->n_chunk_layers[chunk];
    for (int l = l0; l < l1; l++) owned[l] = true;
    ts_model m; /* the layout only, as in ts_memory_estimate */
    ts_tp tp = ts_tp_make(cfg->parallel.tp, 0, NULL, &ts_kernels_cpu);
    ts_model_layout_tp(&m, mc, owned, &tp);
    free(owned);
    double bytes = (double)m.num_floats * sizeof(float);
    ts_model_free(&m);
    return bytes;
}
