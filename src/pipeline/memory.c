#include "pipeline/memory.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "model/model.h"

void ts_memory_peak_sets(const ts_schedule *s, int recompute, int pp_rank, int *peak_acts,
                         int *peak_stash)
{
    const int n = s->n_chunks, m = s->m;
    const bool full = recompute == TS_RECOMPUTE_FULL;
    const bool except_last = recompute == TS_RECOMPUTE_EXCEPT_LAST;
    int *live = ts_calloc((size_t)n, sizeof(int)), *stash = ts_calloc((size_t)n, sizeof(int));
    for (int c = 0; c < n; c++)
        if (ts_chunk_rank(s, c) == pp_rank) peak_acts[c] = peak_stash[c] = 0;
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

void ts_memory_chunk(const ts_memory_shape *sh, int chunk, double act_bytes,
                     double stash_bytes, ts_chunk_memory *out)
{
    const double f = sh->act_bytes, NC = (double)sh->micro_batch * sh->seq_len * sh->n_embd;
    const double ids = 2.0 * sh->micro_batch * sh->seq_len * sizeof(int); /* tokens, targets */
    out->tensors = act_bytes;
    out->set = out->tensors + ids;
    out->stash = stash_bytes;
    out->slot = NC * f * ((chunk > 0) + 1);
    if (sh->recompute != TS_RECOMPUTE_NONE)
        out->slot += NC * f * (chunk < sh->n_chunks - 1) + ids;
}

void ts_memory_rank(const ts_memory_shape *sh, const ts_memory_holdings *h, int pp_rank,
                    ts_rank_memory *est)
{
    memset(est, 0, sizeof *est);
    const double f = sizeof(float), floats = h->param_floats;
    for (int c = 0; c < sh->n_chunks; c++) {
        if (sh->chunk_rank[c] != pp_rank) continue;
        ts_chunk_memory cm;
        ts_memory_chunk(sh, c, h->act_bytes[c], h->stash_bytes[c], &cm);
        est->act_sets += h->peak_acts[c] * cm.tensors;
        est->activations += h->peak_acts[c] * cm.set + h->peak_stash[c] * cm.stash;
        est->buffers += cm.slot * sh->m;
    }
    est->params = est->grads = floats * f;
    if (sh->weight_copy_bytes > 0) est->params += floats * sh->weight_copy_bytes;
    /* The two AdamW moments; ZeRO-1 keeps this rank's 1/dp of them (grad_sync.h). */
    est->optimizer = 2.0 * floats * f / (sh->zero == 1 ? (double)sh->dp : 1.0);
    est->buffers += h->scratch_bytes;
    /* checkpoint.async copies this rank's share of the weights and both moments (1/dp
     * of what the pipeline rank holds) while a thread writes them. */
    if (sh->async_checkpoint) est->buffers += 3.0 * floats * f / (double)sh->dp;
    est->blas = sh->threads * TS_BLAS_THREAD_BYTES;
    est->total = est->params + est->grads + est->optimizer + est->activations + est->buffers +
                 est->blas;
}

void ts_memory_estimate(const ts_config *cfg, const ts_partition *part,
                        const ts_schedule *sched, int pp_rank, int threads,
                        ts_rank_memory *est)
{
    const ts_model_config *mc = &cfg->model;
    const int n_layers = mc->n_layer + 2, B = cfg->parallel.micro_batch, T = mc->seq_len;
    const int n = sched->n_chunks;

    bool *owned = ts_calloc((size_t)n_layers, sizeof(bool));
    ts_partition_owned(part, sched->chunk_rank, pp_rank, owned);
    /* The run's kernel table lays the activations out (their dtype, what attention
     * keeps); where this build lacks it, the CPU table of the same precision. */
    const ts_kernels *k = ts_kernels_layout_for(cfg->train.device, cfg->train.precision,
                                                cfg->train.attention);
    ts_model m; /* the layout only: nothing is allocated */
    ts_tp tp = ts_tp_make(cfg->parallel.tp, 0, NULL, k); /* rank 0: most vocab */
    ts_model_layout_tp(&m, mc, owned, &tp);
    free(owned);

    const int mode = ts_recompute_from_name(cfg->parallel.recompute);
    int *peak_acts = ts_calloc((size_t)n, sizeof(int));
    int *peak_stash = ts_calloc((size_t)n, sizeof(int));
    ts_memory_peak_sets(sched, mode, pp_rank, peak_acts, peak_stash);
    /* Every chunk holds at least one layer (ts_partition_build refuses an empty one). */
    double *acts = ts_calloc((size_t)n, sizeof(double));
    double *stash = ts_calloc((size_t)n, sizeof(double));
    for (int c = 0; c < n; c++) {
        if (ts_chunk_rank(sched, c) != pp_rank) continue;
        const int l0 = part->first_layer[c], l1 = l0 + part->n_chunk_layers[c];
        acts[c] = (double)ts_acts_bytes(&m, l0, l1, B, T);
        stash[c] = (double)ts_acts_stash_bytes(&m, l0, l1, B, T);
    }
    const ts_memory_shape sh = {
        .micro_batch = B, .seq_len = T, .n_embd = mc->n_embd, .pp = sched->pp, .n_chunks = n, .chunk_rank = sched->chunk_rank,
        .m = sched->m, .recompute = mode, .dp = cfg->parallel.dp, .zero = cfg->parallel.zero,
        .async_checkpoint = cfg->checkpoint.async && cfg->checkpoint.dir[0],
        .threads = threads, .weight_copy_bytes = k->weight_copy_bytes,
        .act_bytes = (int)ts_dtype_bytes(k->act_dtype)};
    const ts_memory_holdings h = {.param_floats = (double)m.num_floats,
                                  .scratch_bytes = (double)ts_scratch_bytes(&m, B, T),
                                  .act_bytes = acts, .stash_bytes = stash,
                                  .peak_acts = peak_acts, .peak_stash = peak_stash};
    ts_memory_rank(&sh, &h, pp_rank, est);
    free(acts);
    free(stash);
    free(peak_acts);
    free(peak_stash);
    ts_model_free(&m);
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
    bool *owned = ts_calloc((size_t)mc->n_layer + 2, sizeof(bool));
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
