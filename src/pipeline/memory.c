#include "pipeline/memory.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "model/model.h"

void ts_memory_peak_sets(const ts_schedule *s, int recompute, const int *keep, int pp_rank,
                         int *peak_acts, int *peak_stash, int *n_recomputed, bool *recomputed)
{
    const int n = s->n_chunks, m = s->m;
    TS_ASSERT(recompute != TS_RECOMPUTE_AUTO || keep);
    int *live = ts_calloc((size_t)n, sizeof(int)), *stash = ts_calloc((size_t)n, sizeof(int));
    int *pa = ts_calloc((size_t)n, sizeof(int)), *ps = ts_calloc((size_t)n, sizeof(int));
    int *nr = ts_calloc((size_t)n, sizeof(int));
    bool *rec = ts_calloc((size_t)n * m, sizeof(bool)); /* the decision of each F */
    for (int i = 0; i < s->n_actions[pp_rank]; i++) {
        const ts_action *a = &s->actions[pp_rank][i];
        const int c = a->chunk;
        bool *r = &rec[(size_t)c * m + a->mb];
        switch (a->kind) {
        case TS_ACT_F:
            /* auto: the cap counts every set the chunk holds when the forward starts
             * (kept ones and, with zero-bubble, re-materialised ones waiting for W). */
            *r = recompute == TS_RECOMPUTE_FULL ||
                 (recompute == TS_RECOMPUTE_EXCEPT_LAST && a->mb != m - 1) ||
                 (recompute == TS_RECOMPUTE_AUTO && live[c] >= keep[c]);
            nr[c] += *r;
            if (++live[c] > pa[c]) pa[c] = live[c];
            if (*r) live[c]--;
            break;
        case TS_ACT_B:
        case TS_ACT_I:
            if (*r) live[c]++;
            if (live[c] > pa[c]) pa[c] = live[c];
            if (a->kind == TS_ACT_B)
                live[c]--;
            else if (++stash[c] > ps[c])
                ps[c] = stash[c];
            break;
        case TS_ACT_W:
            live[c]--;
            stash[c]--;
            break;
        }
    }
    for (int c = 0; c < n; c++) {
        if (ts_chunk_rank(s, c) != pp_rank) continue;
        if (peak_acts) peak_acts[c] = pa[c];
        if (peak_stash) peak_stash[c] = ps[c];
        if (n_recomputed) n_recomputed[c] = nr[c];
        if (recomputed)
            memcpy(recomputed + (size_t)c * m, rec + (size_t)c * m, (size_t)m * sizeof(bool));
    }
    free(live);
    free(stash);
    free(pa);
    free(ps);
    free(nr);
    free(rec);
}

bool ts_memory_auto_keep(const ts_schedule *s, const ts_memory_shape *sh,
                         const ts_memory_holdings *h, int pp_rank, double room, int *keep,
                         int *peak_acts, int *peak_stash, int *n_recomputed,
                         ts_rank_memory *est)
{
    const int n = s->n_chunks;
    /* From the caps that recompute nothing: each chunk's peak without recompute. */
    ts_memory_peak_sets(s, TS_RECOMPUTE_NONE, NULL, pp_rank, peak_acts, NULL, NULL, NULL);
    for (int c = 0; c < n; c++)
        if (ts_chunk_rank(s, c) == pp_rank) keep[c] = peak_acts[c];
    ts_memory_holdings held = *h;
    held.peak_acts = peak_acts;
    held.peak_stash = peak_stash;
    held.n_recomputed = n_recomputed;
    for (;;) {
        ts_memory_peak_sets(s, TS_RECOMPUTE_AUTO, keep, pp_rank, peak_acts, peak_stash,
                            n_recomputed, NULL);
        ts_memory_rank(sh, &held, pp_rank, est);
        if (est->total - est->blas <= room) return true;
        /* Lower the cap of the chunk whose held sets weigh most. A cap one below the
         * peak often holds as much (the recomputed micro-batch's set comes back for its
         * backward), so the same chunk may come down twice in a row. */
        int fullest = -1;
        double most = -1.0;
        for (int c = 0; c < n; c++) {
            if (ts_chunk_rank(s, c) != pp_rank || keep[c] == 0) continue;
            ts_chunk_memory cm;
            ts_memory_chunk(sh, c, h->act_bytes[c], h->stash_bytes[c], &cm);
            const double bytes = peak_acts[c] * cm.set;
            if (bytes > most) {
                most = bytes;
                fullest = c;
            }
        }
        if (fullest < 0) return false; /* every cap 0: full recompute does not fit */
        keep[fullest]--;
    }
}

const char *ts_memory_describe_keep(const ts_schedule *s, int pp_rank, const int *keep,
                                    char *buf, size_t size)
{
    const int n = s->n_chunks;
    int *in_flight = ts_calloc((size_t)n, sizeof(int)), *nr = ts_calloc((size_t)n, sizeof(int));
    ts_memory_peak_sets(s, TS_RECOMPUTE_NONE, NULL, pp_rank, in_flight, NULL, NULL, NULL);
    ts_memory_peak_sets(s, TS_RECOMPUTE_AUTO, keep, pp_rank, NULL, NULL, nr, NULL);
    size_t at = 0;
    buf[0] = '\0';
    for (int c = 0; c < n && at < size; c++) {
        if (ts_chunk_rank(s, c) != pp_rank) continue;
        const int k = keep[c] < in_flight[c] ? keep[c] : in_flight[c];
        at += (size_t)snprintf(buf + at, size - at,
                               "%schunk %d keeps %d of %d in flight (recomputes %d of %d "
                               "micro-batch%s)",
                               at ? "; " : "", c, k, in_flight[c], nr[c], s->m,
                               s->m == 1 ? "" : "es");
    }
    free(in_flight);
    free(nr);
    return buf;
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
    out->replay = NC * f * (chunk < sh->n_chunks - 1) + ids;
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
        est->buffers += cm.slot * sh->m + cm.replay * h->n_recomputed[c];
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

/* A rank's shape and holdings from the model's own layout of its layers (nothing
 * allocated): what ts_memory_estimate and ts_memory_estimate_auto feed ts_memory_rank. */
typedef struct {
    ts_memory_shape sh;
    ts_memory_holdings h;
    double *acts, *stash;               /* [n_chunks], the rank's chunks filled */
    int *peak_acts, *peak_stash, *n_rc; /* [n_chunks], for the holdings' peaks */
} rank_layout;

static void rank_layout_build(const ts_config *cfg, const ts_partition *part,
                              const ts_schedule *sched, int pp_rank, int threads,
                              rank_layout *out)
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

    /* Every chunk holds at least one layer (ts_partition_build refuses an empty one). */
    out->acts = ts_calloc((size_t)n, sizeof(double));
    out->stash = ts_calloc((size_t)n, sizeof(double));
    out->peak_acts = ts_calloc((size_t)n, sizeof(int));
    out->peak_stash = ts_calloc((size_t)n, sizeof(int));
    out->n_rc = ts_calloc((size_t)n, sizeof(int));
    for (int c = 0; c < n; c++) {
        if (ts_chunk_rank(sched, c) != pp_rank) continue;
        const int l0 = part->first_layer[c], l1 = l0 + part->n_chunk_layers[c];
        out->acts[c] = (double)ts_acts_bytes(&m, l0, l1, B, T);
        out->stash[c] = (double)ts_acts_stash_bytes(&m, l0, l1, B, T);
    }
    out->sh = (ts_memory_shape){
        .micro_batch = B, .seq_len = T, .n_embd = mc->n_embd, .pp = sched->pp, .n_chunks = n,
        .chunk_rank = sched->chunk_rank, .m = sched->m, .dp = cfg->parallel.dp,
        .zero = cfg->parallel.zero,
        .async_checkpoint = cfg->checkpoint.async && cfg->checkpoint.dir[0],
        .threads = threads, .weight_copy_bytes = k->weight_copy_bytes,
        .act_bytes = (int)ts_dtype_bytes(k->act_dtype)};
    out->h = (ts_memory_holdings){.param_floats = (double)m.num_floats,
                                  .scratch_bytes = (double)ts_scratch_bytes(&m, B, T),
                                  .act_bytes = out->acts, .stash_bytes = out->stash,
                                  .peak_acts = out->peak_acts, .peak_stash = out->peak_stash,
                                  .n_recomputed = out->n_rc};
    ts_model_free(&m);
}

static void rank_layout_free(rank_layout *l)
{
    free(l->acts);
    free(l->stash);
    free(l->peak_acts);
    free(l->peak_stash);
    free(l->n_rc);
}

void ts_memory_estimate(const ts_config *cfg, const ts_partition *part,
                        const ts_schedule *sched, int pp_rank, int threads, const int *keep,
                        ts_rank_memory *est)
{
    rank_layout l;
    rank_layout_build(cfg, part, sched, pp_rank, threads, &l);
    ts_memory_peak_sets(sched, ts_recompute_from_name(cfg->parallel.recompute), keep, pp_rank,
                        l.peak_acts, l.peak_stash, l.n_rc, NULL);
    ts_memory_rank(&l.sh, &l.h, pp_rank, est);
    rank_layout_free(&l);
}

bool ts_memory_estimate_auto(const ts_config *cfg, const ts_partition *part,
                             const ts_schedule *sched, int pp_rank, int threads, double room,
                             int *keep, ts_rank_memory *est)
{
    rank_layout l;
    rank_layout_build(cfg, part, sched, pp_rank, threads, &l);
    const bool fits = ts_memory_auto_keep(sched, &l.sh, &l.h, pp_rank, room, keep, l.peak_acts,
                                          l.peak_stash, l.n_rc, est);
    rank_layout_free(&l);
    return fits;
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
