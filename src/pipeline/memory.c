#include "pipeline/memory.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "model/model.h"
#include "optim/muon.h"

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

void ts_peak_memo_init(ts_peak_memo *pm, const ts_schedule *s)
{
    *pm = (ts_peak_memo){.n_chunks = s->n_chunks, .m = s->m, .pp = s->pp};
    pm->rows = ts_calloc((size_t)s->pp * (size_t)(s->m + 1), sizeof(int *));
}

void ts_peak_memo_free(ts_peak_memo *pm)
{
    for (size_t k = 0; pm->rows && k < (size_t)pm->pp * (size_t)(pm->m + 1); k++)
        free(pm->rows[k]);
    free(pm->rows);
    memset(pm, 0, sizeof *pm);
}

/* The row of cap k on rank q: ts_memory_peak_sets with every chunk's cap k. */
static const int *peak_row(ts_peak_memo *pm, const ts_schedule *s, int q, int k)
{
    int **row = &pm->rows[(size_t)q * (size_t)(pm->m + 1) + (size_t)k];
    if (!*row) {
        /* Kept for the rank's own chunks alone, in chunk order (3 ints each). */
        const int n = pm->n_chunks;
        int *all = ts_calloc(3 * (size_t)n, sizeof(int));
        int *caps = ts_malloc(sizeof(int) * (size_t)n);
        for (int c = 0; c < n; c++) caps[c] = k;
        ts_memory_peak_sets(s, TS_RECOMPUTE_AUTO, caps, q, all, all + n, all + 2 * n, NULL);
        int own = 0;
        for (int c = 0; c < n; c++) own += ts_chunk_rank(s, c) == q;
        *row = ts_malloc(3 * sizeof(int) * (size_t)(own > 0 ? own : 1));
        for (int c = 0, j = 0; c < n; c++) {
            if (ts_chunk_rank(s, c) != q) continue;
            (*row)[3 * j] = all[c];
            (*row)[3 * j + 1] = all[n + c];
            (*row)[3 * j + 2] = all[2 * n + c];
            j++;
        }
        free(caps);
        free(all);
    }
    return *row;
}

/* The estimate of rank pp_rank under caps keep: the peaks and counts into the holdings'
 * arrays (held's), then ts_memory_rank. Whether it fits room. */
static bool auto_estimate(const ts_schedule *s, const ts_memory_shape *sh,
                          const ts_memory_holdings *held, int pp_rank, double room,
                          const int *keep, int *peak_acts, int *peak_stash, int *n_recomputed,
                          ts_rank_memory *est)
{
    ts_peak_memo *pm = held->peak_memo;
    bool memo = pm && pm->n_chunks == s->n_chunks && pm->m == s->m && pm->pp == s->pp;
    for (int c = 0; memo && c < s->n_chunks; c++)
        if (ts_chunk_rank(s, c) == pp_rank && (keep[c] < 0 || keep[c] > s->m)) memo = false;
    if (memo) {
        for (int c = 0, j = 0; c < s->n_chunks; c++) {
            if (ts_chunk_rank(s, c) != pp_rank) continue;
            const int *row = peak_row(pm, s, pp_rank, keep[c]);
            peak_acts[c] = row[3 * j];
            peak_stash[c] = row[3 * j + 1];
            n_recomputed[c] = row[3 * j + 2];
            j++;
        }
    } else {
        ts_memory_peak_sets(s, TS_RECOMPUTE_AUTO, keep, pp_rank, peak_acts, peak_stash,
                            n_recomputed, NULL);
    }
    ts_memory_rank(sh, held, pp_rank, est);
    return est->total - est->blas <= room;
}

/* Chunk c of the rank laid out selective or not: its set's bytes in `acts` (held's
 * act_bytes) and the scratch with the rebuilt area while any chunk is. */
static void auto_lay_out(const ts_schedule *s, const ts_memory_holdings *h, int pp_rank,
                         int c, bool on, bool *selective, double *acts,
                         ts_memory_holdings *held)
{
    selective[c] = on;
    acts[c] = on ? h->sel_act_bytes[c] : h->act_bytes[c];
    bool any = false;
    for (int j = 0; j < s->n_chunks; j++) any |= ts_chunk_rank(s, j) == pp_rank && selective[j];
    held->scratch_bytes = any ? h->sel_scratch_bytes : h->scratch_bytes;
}

/* Whether making a chunk selective is worth its compute: its share of the chunk's set
 * that attention's state is (what selective drops) at least the share of a block's
 * forward FLOPs that attention's core is (what it runs again), T / (6C + T) (the core's
 * 4 T^2 C against 24 T C^2 for the linear layers). Below that a lower cap saves the
 * same bytes for less recompute per byte: with a flash kernel's one value per row
 * (against [T, T] probabilities on the CPU) selective saves almost nothing. */
static bool selective_pays(const ts_memory_shape *sh, double act_bytes, double sel_act_bytes)
{
    if (act_bytes <= 0.0) return false;
    const double T = sh->seq_len, C = sh->n_embd;
    return (act_bytes - sel_act_bytes) / act_bytes >= T / (6.0 * C + T);
}

bool ts_memory_auto_keep_selective(const ts_schedule *s, const ts_memory_shape *sh,
                                   const ts_memory_holdings *h, int pp_rank, double room,
                                   int *keep, bool *selective, int *peak_acts,
                                   int *peak_stash, int *n_recomputed, ts_rank_memory *est)
{
    const int n = s->n_chunks;
    const bool may_select = selective && h->sel_act_bytes;
    /* From the caps that recompute nothing: each chunk's peak without recompute, no
     * chunk selective. */
    ts_memory_peak_sets(s, TS_RECOMPUTE_NONE, NULL, pp_rank, peak_acts, NULL, NULL, NULL);
    double *acts = ts_calloc((size_t)n, sizeof(double));
    for (int c = 0; c < n; c++) {
        if (ts_chunk_rank(s, c) != pp_rank) continue;
        keep[c] = peak_acts[c];
        acts[c] = h->act_bytes[c];
        if (selective) selective[c] = false;
    }
    ts_memory_holdings held = *h;
    held.act_bytes = acts;
    held.peak_acts = peak_acts;
    held.peak_stash = peak_stash;
    held.n_recomputed = n_recomputed;
#define ESTIMATE() \
    auto_estimate(s, sh, &held, pp_rank, room, keep, peak_acts, peak_stash, n_recomputed, est)
    bool fits = ESTIMATE();
    /* The chunk buffers follow from the chunks' floats and the residency alone, which no
     * step below changes: counted once (ts_residency_peak_bytes per estimate was half
     * the time of a large search's "auto" grids). */
    held.chunk_buffers_known = true;
    held.chunk_buffer_bytes = est->chunk_buffers;
    /* 1. Chunks go selective, the one saving the most first (the caps are the peaks). */
    if (!fits && may_select) {
        const double none_total = est->total;
        bool any = false;
        for (;;) {
            int best = -1;
            double most = 0.0;
            for (int c = 0; c < n; c++) {
                if (ts_chunk_rank(s, c) != pp_rank || selective[c]) continue;
                if (!selective_pays(sh, h->act_bytes[c], h->sel_act_bytes[c])) continue;
                const double saves = peak_acts[c] * (h->act_bytes[c] - h->sel_act_bytes[c]);
                if (saves > most) {
                    most = saves;
                    best = c;
                }
            }
            if (best < 0) break;
            auto_lay_out(s, h, pp_rank, best, true, selective, acts, &held);
            any = true;
            if ((fits = ESTIMATE())) break;
        }
        if (!fits && any && est->total > none_total) {
            for (int c = 0; c < n; c++)
                if (ts_chunk_rank(s, c) == pp_rank)
                    auto_lay_out(s, h, pp_rank, c, false, selective, acts, &held);
            fits = ESTIMATE();
        }
    }
    /* 2. Caps come down, the chunk whose held sets weigh most first. A cap one below
     * the peak often holds as much (the recomputed micro-batch's set comes back for its
     * backward), so the same chunk may come down twice in a row. */
    while (!fits) {
        int fullest = -1;
        double most = -1.0;
        for (int c = 0; c < n; c++) {
            if (ts_chunk_rank(s, c) != pp_rank || keep[c] == 0) continue;
            ts_chunk_memory cm;
            ts_memory_chunk(sh, c, acts[c], h->stash_bytes[c], &cm);
            const double bytes = peak_acts[c] * cm.set;
            if (bytes > most) {
                most = bytes;
                fullest = c;
            }
        }
        if (fullest < 0) break; /* every cap 0: full recompute does not fit */
        keep[fullest]--;
        fits = ESTIMATE();
    }
#undef ESTIMATE
    free(acts);
    return fits;
}

const char *ts_memory_describe_keep_selective(const ts_schedule *s, int pp_rank,
                                              const int *keep, const bool *selective,
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
                               "%schunk %d keeps %d of %d in flight%s (recomputes %d of %d "
                               "micro-batch%s)",
                               at ? "; " : "", c, k, in_flight[c],
                               selective && selective[c] ? ", selective" : "", nr[c], s->m,
                               s->m == 1 ? "" : "es");
    }
    free(in_flight);
    free(nr);
    return buf;
}

void ts_memory_chunk(const ts_memory_shape *sh, int chunk, double act_bytes,
                     double stash_bytes, ts_chunk_memory *out)
{
    const double split = sh->seq_split > 1 ? sh->seq_split : 1;
    const double f = sh->act_bytes,
                 NC = (double)sh->micro_batch * sh->seq_len * sh->n_embd / split;
    const double ids = 2.0 * sh->micro_batch * sh->seq_len * sizeof(int); /* tokens, targets */
    out->tensors = act_bytes;
    out->set = out->tensors + ids;
    out->stash = stash_bytes;
    out->slot = NC * f * ((chunk > 0) + 1);
    out->replay = NC * f * (chunk < sh->n_chunks - 1) + ids;
}

/* ZeRO-2/3's per-chunk buffers at their peak (memory.h): the gradient buffers (4 bytes a
 * float of the chunk), with ZeRO-3 the gathered weights ((4 + the compute copy's bytes)
 * a float) while resident, or ZeRO-3's whole-rank gather for validation and checkpoints
 * when larger. */
static double chunk_buffers(const ts_memory_shape *sh, const ts_memory_holdings *h, int zero,
                            int pp_rank)
{
    TS_ASSERT(h->chunk_floats && h->res && h->res->n_chunks == sh->n_chunks);
    const double f = sizeof(float), wf = f + sh->weight_copy_bytes;
    double *grad = ts_calloc((size_t)sh->n_chunks, sizeof(double));
    double *weight = ts_calloc((size_t)sh->n_chunks, sizeof(double));
    for (int c = 0; c < sh->n_chunks; c++) {
        if (sh->chunk_rank[c] != pp_rank) continue;
        grad[c] = f * h->chunk_floats[c];
        weight[c] = wf * h->chunk_floats[c];
    }
    double peak = ts_residency_peak_bytes(h->res, zero == 3 ? weight : NULL, grad);
    if (zero == 3 && wf * h->param_floats > peak) peak = wf * h->param_floats;
    free(grad);
    free(weight);
    return peak;
}

/* The temporaries Open MPI 4.1 keeps for the replica group's gradient reductions on host
 * memory (measured, bench/RESULTS.md 4.1; grad_bytes = the rank's fp32 gradient buffer):
 * ZeRO-0 overlapped, a copy of every non-blocking all-reduce's bucket in flight, and at
 * the step's end every bucket may be: grad_bytes; ZeRO-0 without overlap, the one
 * blocking all-reduce of the whole buffer (its large-message algorithm's pieces):
 * grad_bytes / dp; ZeRO-1, the non-blocking reduce-scatters' copies on the group's first
 * rank (the pipeline rank's most): grad_bytes; ZeRO-2/3 reduce one chunk's buffer at a
 * time, whose copies stay inside what the chunk buffers' residency already counts. */
static double reduce_copies(const ts_memory_shape *sh, const ts_memory_holdings *h, int zero,
                            double grad_bytes)
{
    if (sh->dp <= 1) return 0.0;
    /* Expert parallelism: the experts' buckets reduce over edp, which copies nothing
     * with one member, and two groups run as buckets even without overlap (reducer.c's
     * one blocking all-reduce needs a single group). */
    const double f = sizeof(float);
    const bool experts = h->expert_floats > 0;
    const int edp = sh->edp > 0 ? sh->edp : sh->dp;
    const double bucketed = experts && edp <= 1 ? grad_bytes - f * h->expert_floats : grad_bytes;
    if (zero == 0)
        return sh->overlap_grad_sync || experts ? bucketed : grad_bytes / sh->dp;
    return zero == 1 ? bucketed : 0.0;
}

/* Muon's optimizer state (memory.h): AdamW's two moments on the floats that are not Muon
 * matrices, sharded by ZeRO level as the dense rule does, and one momentum on the Muon
 * matrices the rank owns. Returns the optimizer bytes; *state_floats the floats of state
 * (what checkpoint.async copies besides the weights). */
static double muon_optimizer(const ts_memory_shape *sh, const ts_memory_holdings *h, int zero,
                             double edp, double *state_floats)
{
    const double f = sizeof(float);
    const double adam = h->param_floats - h->muon_floats;
    const double xadam = h->expert_floats - h->muon_expert_floats;
    const double adam_shard = zero < 1      ? adam
                              : xadam > 0 ? (adam - xadam) / (double)sh->dp + xadam / edp
                                          : adam / (double)sh->dp;
    double owned = h->muon_floats;
    if (sh->dp > 1) {
        const double mx = h->muon_expert_floats;
        owned = (h->muon_floats - mx) / (double)sh->dp + mx / edp;
        if (owned < h->muon_max_floats) owned = h->muon_max_floats;
    }
    *state_floats = 2.0 * adam + h->muon_floats;
    return 2.0 * f * adam_shard + f * owned;
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
    /* Parameters, gradients and moments by ZeRO level (memory.h); with one replica
     * there is nothing to shard and every level is zero 0. */
    const int zero = sh->dp > 1 ? sh->zero : 0;
    /* The routed experts shard over their own group, edp (expert_grid.h), the rest over
     * the dp replicas; a dense model (no expert floats) is floats / dp to the bit. */
    const double xf = h->expert_floats, edp = sh->edp > 0 ? sh->edp : sh->dp;
    const double shard = xf > 0 ? (floats - xf) / (double)sh->dp + xf / edp
                                : floats / (double)sh->dp;
    const double wcb = sh->weight_copy_bytes;
    est->params = zero == 3 ? shard * f : floats * (f + wcb);
    est->grads = (zero >= 2 ? shard : floats) * f;
    est->optimizer = 2.0 * f * (zero >= 1 ? shard : floats);
    double state = 2.0 * floats;
    if (h->muon_floats > 0) est->optimizer = muon_optimizer(sh, h, zero, edp, &state);
    if (zero >= 2)
        est->chunk_buffers =
            h->chunk_buffers_known ? h->chunk_buffer_bytes : chunk_buffers(sh, h, zero, pp_rank);
    est->buffers += h->scratch_bytes + h->muon_buffer_bytes;
    /* checkpoint.async copies this rank's share of the weights and the optimizer state
     * (1/dp of what the pipeline rank holds) while a thread writes them. */
    if (sh->async_checkpoint) {
        est->buffers += h->muon_floats > 0 ? (floats + state) * f / (double)sh->dp
                                           : 3.0 * floats * f / (double)sh->dp;
    }
    /* The replica group's copies are freed before the group sums run (data/reducer.c):
     * the larger of the two is held. */
    est->reduce_copies = sh->host_reductions ? fmax(reduce_copies(sh, h, zero, floats * f),
                                                    h->group_sum_copy)
                                             : 0.0;
    est->blas = sh->threads * TS_BLAS_THREAD_BYTES;
    est->total = est->params + est->grads + est->optimizer + est->chunk_buffers +
                 est->activations + est->buffers + est->reduce_copies + est->blas;
}

/* The ep a rank's layout takes: parallel.ep for an MoE model (its E/ep experts), else 1. */
static int layout_ep(const ts_config *cfg)
{
    return cfg->model.moe_experts > 0 && cfg->parallel.ep > 1 ? cfg->parallel.ep : 1;
}

/* The etp the same way: parallel.etp for an MoE model (F/etp slices), else 1. */
static int layout_etp(const ts_config *cfg)
{
    return cfg->model.moe_experts > 0 && cfg->parallel.etp > 1 ? cfg->parallel.etp : 1;
}

/* A rank's shape and holdings from the model's own layout of its layers (nothing
 * allocated): what ts_memory_estimate and ts_memory_estimate_auto_selective feed
 * ts_memory_rank. */
typedef struct {
    ts_memory_shape sh;
    ts_memory_holdings h;
    double *acts, *stash;               /* [n_chunks], the rank's chunks filled */
    double *sel_acts;                   /* [n_chunks] the same laid out selective (auto) */
    int *peak_acts, *peak_stash, *n_rc; /* [n_chunks], for the holdings' peaks */
    double *chunk_floats;               /* [n_chunks], ZeRO-2/3 */
    ts_residency res;                   /* ZeRO-2/3 */
} rank_layout;

/* Floats of each of the rank's chunks in the layout m: chunks tile the rank's flat
 * buffer in layer order, each from its first layer's first parameter (the rank's first
 * chunk from 0) to the next local chunk's start, the last to num_floats. */
static void layout_chunk_floats(const ts_model *m, const ts_partition *part,
                                const ts_schedule *sched, int pp_rank, double *out)
{
    int prev = -1;
    size_t prev_at = 0;
    for (int c = 0; c < sched->n_chunks; c++) {
        if (ts_chunk_rank(sched, c) != pp_rank) continue;
        const int l0 = part->first_layer[c];
        const size_t at = prev < 0 ? 0 : m->params[m->layers[l0].first_param].offset;
        if (prev >= 0) out[prev] = (double)(at - prev_at);
        prev = c;
        prev_at = at;
    }
    if (prev >= 0) out[prev] = (double)(m->num_floats - prev_at);
}

/* The temporary of the one large blocking all-reduce the rank's gradients take beside the
 * replica group's (data/group_sum.h): a tied embedding split over the pipeline's
 * ends, summed over the embedding group of 2, of which Open MPI's large-message
 * all-reduce keeps 1/2. (Replicated key/value heads' sums are one layer's k/v weights:
 * left out.) */
static double group_sum_copy(const ts_model *m)
{
    /* Untied with multi-token prediction, the modules' copy of the embedding (model.h
     * mtp_wte_param) is summed the same way. */
    const int head_copy = m->tied ? m->head_wte_param : m->mtp_layers > 0 ? m->mtp_wte_param : -1;
    const int tied = m->wte_param >= 0 ? m->wte_param : head_copy;
    const bool one_end = m->wte_param < 0 || head_copy < 0; /* the other elsewhere */
    if ((!m->tied && m->mtp_layers == 0) || tied < 0 || !one_end) return 0.0;
    return 4.0 * (double)((m->params[tied].numel + 15) / 16 * 16) / 2.0; /* as laid out */
}

/* The floats of the routed experts' tensors in the layout m (ts_param.expert), each to
 * the next tensor's start (its alignment gap with it). */
static double expert_floats(const ts_model *m)
{
    double x = 0.0;
    for (int p = 0; p < m->n_params; p++) {
        if (!m->params[p].expert) continue;
        const size_t end = p + 1 < m->n_params ? m->params[p + 1].offset : m->num_floats;
        x += (double)(end - m->params[p].offset);
    }
    return x;
}

double ts_memory_muon_buffer_bytes(double logical, double scratch, double split_logical,
                                   double split_local)
{
    return 4.0 * logical + scratch + 4.0 * (split_logical + split_local);
}

/* Muon's matrices in the layout m (optim/muon.h ts_param_is_muon), each to the next
 * tensor's start as expert_floats counts: their floats, of those the routed experts'
 * (with `experts`, an expert grid's own group), the largest, and the buffers. */
static void muon_floats(const ts_model *m, bool experts, ts_memory_holdings *h)
{
    double logical = 0, scratch = 0, split_logical = 0, split_local = 0;
    for (int p = 0; p < m->n_params; p++) {
        if (!ts_param_is_muon(m, p)) continue;
        const ts_param *P = &m->params[p];
        const size_t end = p + 1 < m->n_params ? m->params[p + 1].offset : m->num_floats;
        const double f = (double)(end - P->offset);
        h->muon_floats += f;
        if (experts && P->expert) h->muon_expert_floats += f;
        if (f > h->muon_max_floats) h->muon_max_floats = f;
        const double n = (double)P->shard.shape[0] * (double)P->shard.shape[1];
        const double sb = (double)ts_muon_scratch_bytes(P->shard.shape[0], P->shard.shape[1]);
        logical = n > logical ? n : logical;
        scratch = sb > scratch ? sb : scratch;
        if (P->shard.parts > 1) {
            split_logical = n > split_logical ? n : split_logical;
            split_local = (double)P->numel > split_local ? (double)P->numel : split_local;
        }
    }
    h->muon_buffer_bytes = ts_memory_muon_buffer_bytes(logical, scratch, split_logical, split_local);
}

static void rank_layout_build(const ts_config *cfg, const ts_partition *part,
                              const ts_schedule *sched, int pp_rank, int threads,
                              rank_layout *out)
{
    const ts_model_config *mc = &cfg->model;
    /* Under context parallelism a rank holds seq_len / cp positions of each sequence
     * (tensor/cp.h), and dp * cp ranks hold the same weights (ZeRO shards over them). */
    const int cp = cfg->parallel.cp > 1 ? cfg->parallel.cp : 1;
    const int n_layers = mc->n_layer + 2, B = cfg->parallel.micro_batch, T = mc->seq_len / cp;
    const int replicas = cfg->parallel.dp * cp;
    const int n = sched->n_chunks;
    /* Expert parallelism: the rank lays out its E/ep experts (every ep rank as many),
     * each an F/etp slice under expert tensor parallelism, and the worst-case exchange
     * buffers (act_layout.h's MR, MX: etp times more rows); the experts reduce over
     * edp = tp * cp * dp / (ep * etp) ranks (expert_grid.h). */
    const int ep = layout_ep(cfg);
    const int etp = layout_etp(cfg);
    const bool split = ep > 1 || etp > 1; /* the experts' own group */
    const int edp = split ? cfg->parallel.tp * replicas / (ep * etp) : 0;

    bool *owned = ts_calloc((size_t)n_layers, sizeof(bool));
    ts_partition_owned(part, sched->chunk_rank, pp_rank, owned);
    /* The run's kernel table lays the activations out (their dtype, what attention
     * keeps); where this build lacks it, the CPU table of the same precision. */
    const ts_kernels *k = ts_kernels_layout_for(cfg->train.device, cfg->train.precision,
                                                cfg->train.attention);
    const int mode = ts_recompute_from_name(cfg->parallel.recompute);
    const bool selective = mode == TS_RECOMPUTE_SELECTIVE;
    ts_model_spec spec = {.arch = mc, .k = k, .owned = owned,
                          .tp = ts_tp_make(cfg->parallel.tp, 0, NULL, k), /* rank 0: most vocab */
                          .sequence_parallel = cfg->parallel.sequence_parallel,
                          .cp = ts_cp_make(cp, 0, NULL, k, mc->seq_len),
                          .selective_all = selective, .ep_size = ep, .ep_rank = 0,
                          .etp_size = etp, .document_mask = cfg->data.document_mask,
                          .document_token = ts_config_document_token(cfg)};
    ts_model m; /* the layout only: nothing is allocated */
    ts_model_layout(&m, &spec);

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
    /* recompute = "auto" may lay chunks out selective: their sets and the scratch so. */
    const double scratch = (double)ts_scratch_bytes(&m, B, T);
    double sel_scratch = 0.0;
    out->sel_acts = NULL;
    if (mode == TS_RECOMPUTE_AUTO) {
        ts_model sel; /* the same layout with every layer selective */
        spec.selective_all = true;
        ts_model_layout(&sel, &spec);
        out->sel_acts = ts_calloc((size_t)n, sizeof(double));
        for (int c = 0; c < n; c++) {
            if (ts_chunk_rank(sched, c) != pp_rank) continue;
            const int l0 = part->first_layer[c], l1 = l0 + part->n_chunk_layers[c];
            out->sel_acts[c] = (double)ts_acts_bytes(&sel, l0, l1, B, T);
        }
        sel_scratch = (double)ts_scratch_bytes(&sel, B, T);
        ts_model_free(&sel);
    }
    free(owned);
    out->chunk_floats = NULL;
    memset(&out->res, 0, sizeof out->res);
    const bool sharded = replicas > 1 && cfg->parallel.zero >= 2;
    if (sharded) {
        out->chunk_floats = ts_calloc((size_t)n, sizeof(double));
        layout_chunk_floats(&m, part, sched, pp_rank, out->chunk_floats);
        ts_memory_residency(sched, pp_rank, ts_model_head_reads_embedding(mc), m.kv_replicas > 1,
                            part->first_layer, part->n_chunk_layers, n_layers, &out->res);
    }
    out->sh = (ts_memory_shape){
        .micro_batch = B, .seq_len = T, .n_embd = mc->n_embd, .pp = sched->pp, .n_chunks = n,
        .chunk_rank = sched->chunk_rank, .m = sched->m, .dp = replicas,
        .zero = cfg->parallel.zero,
        .async_checkpoint = cfg->checkpoint.async && cfg->checkpoint.dir[0],
        .threads = threads, .weight_copy_bytes = k->weight_copy_bytes,
        .host_reductions = !k->device_memory,
        .overlap_grad_sync = cfg->parallel.overlap_grad_sync,
        .act_bytes = (int)ts_dtype_bytes(k->act_dtype), .selective = selective,
        .seq_split = cfg->parallel.sequence_parallel ? cfg->parallel.tp : 1, .edp = edp};
    out->h = (ts_memory_holdings){.param_floats = (double)m.num_floats,
                                  .expert_floats = split ? expert_floats(&m) : 0.0,
                                  .group_sum_copy = group_sum_copy(&m),
                                  .scratch_bytes = scratch,
                                  .act_bytes = out->acts, .stash_bytes = out->stash,
                                  .sel_act_bytes = out->sel_acts,
                                  .sel_scratch_bytes = sel_scratch,
                                  .peak_acts = out->peak_acts, .peak_stash = out->peak_stash,
                                  .n_recomputed = out->n_rc,
                                  .chunk_floats = out->chunk_floats,
                                  .res = sharded ? &out->res : NULL};
    if (ts_config_muon(&cfg->train)) muon_floats(&m, split, &out->h);
    ts_model_free(&m);
}

static void rank_layout_free(rank_layout *l)
{
    free(l->acts);
    free(l->stash);
    free(l->sel_acts);
    free(l->peak_acts);
    free(l->peak_stash);
    free(l->n_rc);
    free(l->chunk_floats);
    ts_residency_free(&l->res);
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

bool ts_memory_estimate_auto_selective(const ts_config *cfg, const ts_partition *part,
                                       const ts_schedule *sched, int pp_rank, int threads,
                                       double room, int *keep, bool *selective,
                                       ts_rank_memory *est)
{
    rank_layout l;
    rank_layout_build(cfg, part, sched, pp_rank, threads, &l);
    const bool fits = ts_memory_auto_keep_selective(sched, &l.sh, &l.h, pp_rank, room, keep,
                                                    selective, l.peak_acts, l.peak_stash,
                                                    l.n_rc, est);
    rank_layout_free(&l);
    return fits;
}

void ts_memory_residency(const ts_schedule *s, int pp_rank, bool model_tied, bool kv_replicated,
                         const int *first_layer, const int *n_chunk_layers, int n_layers,
                         ts_residency *r)
{
    const int n = s->n_chunks, head = n - 1;
    bool *held = ts_calloc((size_t)n, sizeof(bool));
    /* The tied embedding is summed over the embedding group when its two ends are on
     * different pipeline ranks (one rank: the head reads the embedding's own tensor). */
    if (model_tied && head > 0 && ts_chunk_rank(s, 0) != ts_chunk_rank(s, head))
        held[0] = held[head] = true;
    /* Replicated key/value weights are summed over their kv group: every block's. */
    if (kv_replicated)
        for (int c = 0; c < n; c++) {
            const int l0 = first_layer[c], l1 = l0 + n_chunk_layers[c];
            if (l0 < n_layers - 1 && l1 > 1) held[c] = true; /* holds one of layers 1..n-2 */
        }
    ts_residency_build(s, pp_rank, ts_residency_tied_chunk(s, model_tied), held, r);
    free(held);
}

void ts_memory_residency_of_config(const ts_config *cfg, const ts_partition *part,
                                   const ts_schedule *s, int pp_rank, ts_residency *r)
{
    const ts_model_config *mc = &cfg->model;
    const bool kv = ts_model_arch(mc) == TS_ARCH_LLAMA && cfg->parallel.tp > ts_model_kv_heads(mc);
    ts_memory_residency(s, pp_rank, ts_model_head_reads_embedding(mc), kv, part->first_layer, part->n_chunk_layers,
                        mc->n_layer + 2, r);
}

/* The parameters' layout of pipeline rank pp_rank (tp rank 0, ep rank 0), nothing
 * allocated. */
static void rank_params_layout(const ts_config *cfg, const ts_partition *part,
                               const ts_schedule *s, int pp_rank, ts_model *m)
{
    const ts_model_config *mc = &cfg->model;
    bool *owned = ts_calloc((size_t)mc->n_layer + 2, sizeof(bool));
    ts_partition_owned(part, s->chunk_rank, pp_rank, owned);
    const ts_kernels *k = ts_kernels_layout_for(cfg->train.device, cfg->train.precision,
                                                cfg->train.attention);
    ts_model_layout(m, &(ts_model_spec){.arch = mc, .k = k, .owned = owned,
                                        .tp = ts_tp_make(cfg->parallel.tp, 0, NULL, k),
                                        .ep_size = layout_ep(cfg),
                                        .etp_size = layout_etp(cfg)});
    free(owned);
}

void ts_memory_chunk_floats(const ts_config *cfg, const ts_partition *part,
                            const ts_schedule *s, int pp_rank, double *out)
{
    ts_model m; /* the layout only */
    rank_params_layout(cfg, part, s, pp_rank, &m);
    layout_chunk_floats(&m, part, s, pp_rank, out);
    ts_model_free(&m);
}

void ts_memory_chunk_muon_floats(const ts_config *cfg, const ts_partition *part,
                                 const ts_schedule *s, int pp_rank, double *out)
{
    ts_model m;
    rank_params_layout(cfg, part, s, pp_rank, &m);
    for (int c = 0; c < s->n_chunks; c++) {
        if (ts_chunk_rank(s, c) != pp_rank) continue;
        out[c] = 0.0;
        const int l0 = part->first_layer[c], l1 = l0 + part->n_chunk_layers[c];
        for (int l = l0; l < l1; l++)
            for (int p = m.layers[l].first_param; p < m.layers[l].first_param + m.layers[l].n_params;
                 p++) {
                if (!ts_param_is_muon(&m, p)) continue;
                const size_t end = p + 1 < m.n_params ? m.params[p + 1].offset : m.num_floats;
                out[c] += (double)(end - m.params[p].offset);
            }
    }
    ts_model_free(&m);
}

/* "parameters P, gradients G, optimizer state O[, chunk buffers C], activations A,
 * buffers B[, MPI reduction copies R]": the parts both lines below name. ZeRO-2/3's chunk
 * buffers and the host reductions' copies only where there are some. */
static void describe_parts(const ts_rank_memory *e, char *out, size_t size)
{
    char p[32], g[32], o[32], a[32], b[32], c[32], r[32], cb[64] = "", rc[64] = "";
    if (e->chunk_buffers > 0)
        snprintf(cb, sizeof cb, ", chunk buffers %s", ts_format_bytes(e->chunk_buffers, c, sizeof c));
    if (e->reduce_copies > 0)
        snprintf(rc, sizeof rc, ", MPI reduction copies %s",
                 ts_format_bytes(e->reduce_copies, r, sizeof r));
    snprintf(out, size, "parameters %s, gradients %s, optimizer state %s%s, activations %s, buffers %s%s",
             ts_format_bytes(e->params, p, sizeof p), ts_format_bytes(e->grads, g, sizeof g),
             ts_format_bytes(e->optimizer, o, sizeof o), cb,
             ts_format_bytes(e->activations, a, sizeof a), ts_format_bytes(e->buffers, b, sizeof b),
             rc);
}

const char *ts_memory_describe(const ts_rank_memory *e, char *buf, size_t size)
{
    char t[32], l[32], parts[320];
    describe_parts(e, parts, sizeof parts);
    snprintf(buf, size, "%s (%s, BLAS buffers %s)", ts_format_bytes(e->total, t, sizeof t), parts,
             ts_format_bytes(e->blas, l, sizeof l));
    return buf;
}

const char *ts_memory_describe_resident(const ts_rank_memory *e, double process_bytes,
                                        char *buf, size_t size)
{
    char t[32], n[32], l[32], parts[320];
    describe_parts(e, parts, sizeof parts);
    snprintf(buf, size,
             "%s resident (the process before its model %s, %s), and %s of address space for "
             "BLAS buffers",
             ts_format_bytes(process_bytes + e->total - e->blas, t, sizeof t),
             ts_format_bytes(process_bytes, n, sizeof n), parts,
             ts_format_bytes(e->blas, l, sizeof l));
    return buf;
}

double ts_memory_chunk_grad_bytes(const ts_config *cfg, const ts_partition *part, int chunk)
{
    const ts_model_config *mc = &cfg->model;
    bool *owned = ts_calloc((size_t)mc->n_layer + 2, sizeof(bool));
    const int l0 = part->first_layer[chunk], l1 = l0 + part->n_chunk_layers[chunk];
    for (int l = l0; l < l1; l++) owned[l] = true;
    ts_model m; /* the layout only, as in ts_memory_estimate */
    const ts_kernels *k = &ts_kernels_cpu;
    ts_model_layout(&m, &(ts_model_spec){.arch = mc, .k = k, .owned = owned,
                                         .tp = ts_tp_make(cfg->parallel.tp, 0, NULL, k),
                                         .ep_size = layout_ep(cfg),
                                         .etp_size = layout_etp(cfg)});
    free(owned);
    double bytes = (double)m.num_floats * sizeof(float);
    ts_model_free(&m);
    return bytes;
}
