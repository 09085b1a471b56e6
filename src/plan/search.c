/* The grid search (search.h). */
#include "plan/search.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


const char *const ts_loss_names[TS_N_LOSSES] = {"bubble", "communication", "recompute",
                                                "compute", "optimizer"};

/* Whether tp splits the model as ts_config_validate requires: whole query heads per
 * rank, the MLP's columns evenly, a vocabulary row each; llama's key/value heads split
 * (n_kv_head % tp == 0) or each replicated on tp / n_kv_head ranks. */
static bool tp_ok(const ts_model_config *m, int tp)
{
    const int kv = ts_model_kv_heads(m);
    if (m->n_head % tp != 0 || ts_model_ffn(m) % tp != 0 || m->vocab_size < tp) return false;
    return ts_model_arch(m) != TS_ARCH_LLAMA || kv % tp == 0 || tp % kv == 0;
}

/* Whether cp context-parallel ranks can split the sequence (ts_config_validate's rule):
 * 2cp chunks of seq_len / (2cp) positions; the search tries powers of two. */
static bool cp_ok(const ts_config *cfg, int cp)
{
    return cp == 1 || ((cp & (cp - 1)) == 0 && cfg->model.seq_len % (2 * cp) == 0);
}

/* The expert grids (ep, etp) of a stage of `stage` = tp * cp * dp ranks, as
 * config_moe.c's check_expert_grid allows them: ep dividing model.moe_experts, etp
 * dividing model.moe_ffn_hidden, ep * etp dividing the stage. A dense model has one,
 * (1, 1). Their count; the first `cap` pairs into out. */
#define TS_MAX_EXPERT_GRIDS 256
static int expert_grids(const ts_config *cfg, int stage, int *out, int cap)
{
    const ts_model_config *m = &cfg->model;
    int n = 0;
    if (m->moe_experts <= 0) {
        out[0] = out[1] = 1;
        return 1;
    }
    for (int ep = 1; ep <= stage && ep <= m->moe_experts; ep++) {
        if (m->moe_experts % ep || stage % ep) continue;
        for (int etp = 1; ep * etp <= stage; etp++) {
            if (stage % (ep * etp) || m->moe_ffn_hidden % etp || n >= cap) continue;
            out[2 * n] = ep;
            out[2 * n + 1] = etp;
            n++;
        }
    }
    return n;
}

/* Whether a (pp, dp, cp, tp) grid is valid for the model and batch: tp splits the model
 * (tp_ok), cp the sequence (cp_ok), dp the batch, every stage has a layer. */
static bool grid_ok(const ts_config *cfg, int pp, int dp, int cp, int tp)
{
    return tp_ok(&cfg->model, tp) && cp_ok(cfg, cp) && cfg->train.global_batch % dp == 0 &&
           pp <= cfg->model.n_layer + 2;
}

/* The valid (pp, dp, cp, tp) grids of n devices: their count, the first `cap` into out
 * (4 ints each). */
static int grids_for(const ts_config *cfg, int n, int *out, int cap)
{
    int count = 0;
    for (int tp = 1; tp <= n && tp <= cfg->model.n_head; tp++) {
        if (n % tp || !tp_ok(&cfg->model, tp)) continue;
        for (int cp = 1; cp <= n / tp && 2 * cp <= cfg->model.seq_len; cp *= 2) {
            if ((n / tp) % cp || !cp_ok(cfg, cp)) continue;
            const int rest = n / tp / cp;
            for (int dp = 1; dp <= rest && dp <= cfg->train.global_batch; dp++) {
                if (rest % dp) continue;
                const int pp = rest / dp;
                if (!grid_ok(cfg, pp, dp, cp, tp)) continue;
                if (out && count < cap) {
                    out[4 * count] = pp;
                    out[4 * count + 1] = dp;
                    out[4 * count + 2] = cp;
                    out[4 * count + 3] = tp;
                }
                count++;
            }
        }
    }
    return count;
}

double ts_plan_textbook_bubble(const ts_plan_grid *g)
{
    const double p = g->pp, m = g->m;
    if (g->pp == 1) return 0.0;
    switch (g->schedule) {
    case TS_SCHEDULE_INTERLEAVED_1F1B:
    case TS_SCHEDULE_LOOPED_BFS: return (p - 1) / (g->v * m + p - 1);
    /* With F = I = W the first rank cannot start its last input-gradient pass before the
     * pipeline has filled: p-1 units of idle per rank over 3m units of work is the
     * least a single step can do; zb-h2 reaches it with no gap inside a rank's run. */
    case TS_SCHEDULE_ZB_H1:
    case TS_SCHEDULE_ZB_H2: return (p - 1) / (3 * m + p - 1);
    /* The same on v chunks of 1/v the work each (zb-v, dualpipe-v: v = 2). */
    case TS_SCHEDULE_INTERLEAVED_ZB:
    case TS_SCHEDULE_ZB_V:
    case TS_SCHEDULE_DUALPIPE_V: return (p - 1) / (3 * g->v * m + p - 1);
    default: return (p - 1) / (m + p - 1);
    }
}

/* The terms of a grid never simulated: its work, and the textbook bubble. */
static void estimate_terms(ts_plan_result *r)
{
    const ts_plan_terms *t = &r->terms;
    const double busy = t->compute + t->recompute + t->tp_comm + t->cp_comm + t->optimizer;
    const double b = ts_plan_textbook_bubble(&r->g);
    r->terms.bubble = busy / (1.0 - b) - busy;
    r->step_ms = busy + r->terms.bubble;
}

ts_loss_reason ts_plan_loss_reason(const ts_plan_result *r, const ts_plan_result *best)
{
    const ts_plan_terms *a = &r->terms, *b = &best->terms;
    const double d[TS_N_LOSSES] = {
        [TS_LOSS_BUBBLE] = a->bubble - b->bubble,
        [TS_LOSS_COMMUNICATION] =
            (a->tp_comm + a->cp_comm + a->dp_exposed + a->gather_exposed) -
            (b->tp_comm + b->cp_comm + b->dp_exposed + b->gather_exposed),
        [TS_LOSS_RECOMPUTE] = a->recompute - b->recompute,
        [TS_LOSS_COMPUTE] = a->compute - b->compute,
        [TS_LOSS_OPTIMIZER] = a->optimizer - b->optimizer,
    };
    int k = 0;
    for (int j = 1; j < TS_N_LOSSES; j++)
        if (d[j] > d[k]) k = j;
    return (ts_loss_reason)k;
}

typedef struct {
    ts_plan_grid g;
    double floor;
    double shape_floor; /* its shape's memory floor when that let the search count the
                           shape out of memory (gather_expert_shape), else 0 */
} floored;

static int cmp_floor(const void *pa, const void *pb)
{
    const floored *a = pa, *b = pb;
    return a->floor < b->floor ? -1 : a->floor > b->floor;
}

static int cmp_lower(const void *pa, const void *pb)
{
    const ts_plan_result *a = pa, *b = pb;
    return a->lower_ms < b->lower_ms ? -1 : a->lower_ms > b->lower_ms;
}

/* How much machinery a grid asks for, least first, to break ties between grids equal
 * in time and memory: one virtual stage, the plain 1F1B before GPipe (which holds every
 * micro-batch) and then the interleaved and zero-bubble schedules, no recompute, no
 * ZeRO, no sequence parallelism, no context parallelism. */
static long long complexity(const ts_plan_grid *g)
{
    static const int schedule_rank[] = {
        [TS_SCHEDULE_1F1B] = 0, [TS_SCHEDULE_GPIPE] = 1, [TS_SCHEDULE_INTERLEAVED_1F1B] = 2,
        [TS_SCHEDULE_ZB_H1] = 3};
    const int sched = g->schedule >= 0 && g->schedule <= TS_SCHEDULE_ZB_H1
                          ? schedule_rank[g->schedule]
                          : 4; /* a CSV schedule */
    int cp_log = 0;
    for (int c = ts_plan_grid_cp(g); c > 1; c /= 2) cp_log++;
    /* then the smaller ep, the smaller etp (each at most the stage's ranks) */
    return ((long long)((((g->v - 1) * 8 + sched) * 16 + g->recompute * 4 + g->zero) * 2 + g->sp) *
                32 + cp_log) * (1LL << 40) +
           (long long)ts_plan_grid_ep(g) * (1LL << 20) + ts_plan_grid_etp(g);
}

/* Whether sequence parallelism can split tp's rows (ts_config_validate's rule: of the
 * seq_len / cp positions a context-parallel rank holds). */
static bool sp_ok(const ts_config *cfg, int tp, int cp)
{
    return tp > 1 && (cfg->model.seq_len / cp) % tp == 0;
}

/* Best first: the shorter step, then (on a tie) the less memory, then the simpler grid
 * (new user: GPipe ranked above 1F1B at equal times although it holds more). */
static bool differ(double a, double b) { return fabs(a - b) > 1e-9 * fmax(fabs(a), fabs(b)); }

/* Times within a part in 10^9 are a tie: the simulator sums the same terms in another
 * order for another schedule. */
static int better(const ts_plan_result *a, const ts_plan_result *b)
{
    if (differ(a->step_ms, b->step_ms)) return a->step_ms < b->step_ms;
    if (differ(a->mem.total, b->mem.total)) return a->mem.total < b->mem.total;
    return complexity(&a->g) < complexity(&b->g);
}

/* Insert into the top list (kept sorted, at most k). */
static void top_insert(ts_search_result *r, int k, const ts_plan_result *c)
{
    int at = r->n_top;
    while (at > 0 && better(c, &r->top[at - 1])) at--;
    if (at >= k) return;
    int n = r->n_top < k ? r->n_top + 1 : k;
    memmove(&r->top[at + 1], &r->top[at], sizeof *r->top * (size_t)(n - 1 - at));
    r->top[at] = *c;
    r->n_top = n;
}

typedef struct {
    int pp, dp, cp, tp;
} quad;

static long long quad_devices(const quad *q) { return (long long)q->pp * q->dp * q->cp * q->tp; }

static int cmp_quad(const void *pa, const void *pb)
{
    const long long x = quad_devices(pa), y = quad_devices(pb);
    return x < y ? -1 : x > y;
}

/* The fewest devices any grid fits on, in its lightest setting (micro_batch 1, recompute
 * full, 1f1b, ZeRO-3 when dp > 1): the grids in increasing size until one fits; 0 when
 * none does. (dp counts: the trainer keeps pipeline buffers for every micro-batch of
 * the step, global_batch / (dp * micro_batch) of them.) */
static long long fewest_devices(ts_plan_ctx *x, ts_plan_grid *found)
{
    const ts_config *cfg = ts_plan_ctx_config(x);
    const ts_cluster *cl = ts_plan_ctx_cluster(x);
    const int layers = cfg->model.n_layer + 2, gb = cfg->train.global_batch;
    quad *t = NULL;
    size_t n = 0, cap = 0;
    for (int tp = 1; tp <= cfg->model.n_head; tp++) {
        if (!tp_ok(&cfg->model, tp)) continue;
        for (int cp = 1; 2 * cp <= cfg->model.seq_len; cp *= 2) {
            if (!cp_ok(cfg, cp)) continue;
            for (int dp = 1; dp <= gb; dp++) {
                if (gb % dp) continue;
                for (int pp = 1; pp <= layers; pp++) {
                    if (!grid_ok(cfg, pp, dp, cp, tp)) continue;
                    t = ts_grow(t, &cap, n, sizeof *t);
                    t[n++] = (quad){pp, dp, cp, tp};
                }
            }
        }
    }
    if (n > 0) qsort(t, n, sizeof *t, cmp_quad); /* NULL when none */
    long long best = 0;
    for (size_t k = 0; k < n && !best; k++) {
        const int r = t[k].dp * t[k].cp; /* ZeRO shards over dp * cp */
        int xg[2 * TS_MAX_EXPERT_GRIDS];
        const int n_xg = expert_grids(cfg, t[k].tp * r, xg, TS_MAX_EXPERT_GRIDS);
        for (int j = 0; j < n_xg && !best; j++) {
            ts_plan_grid g = {.pp = t[k].pp, .dp = t[k].dp, .tp = t[k].tp, .cp = t[k].cp,
                              .v = 1, .micro_batch = 1, .m = gb / t[k].dp,
                              .schedule = TS_SCHEDULE_1F1B, .recompute = TS_RECOMPUTE_FULL,
                              .zero = r > 1 ? 3 : 0, .sp = sp_ok(cfg, t[k].tp, t[k].cp),
                              .ep = xg[2 * j], .etp = xg[2 * j + 1]};
            if (ts_plan_memory_floor(x, &g) > cl->memory) continue;
            ts_plan_result e;
            if (ts_plan_estimate(x, &g, &e) == TS_OK && e.fits) {
                best = quad_devices(&t[k]);
                *found = g;
            }
        }
    }
    free(t);
    ts_error_clear();
    return best;
}

static ts_status no_grid(const ts_config *cfg, int n)
{
    int below = 0, above = 0;
    /* No grid has more devices than pp * dp * tp at their largest: start the downward
     * scan there (a count of 10^8 would otherwise take O(n) scans of O(n) each). */
    const int layers = cfg->model.n_layer + 2;
    long long cps = 1; /* the largest cp the sequence allows */
    while (cp_ok(cfg, (int)(2 * cps)) && 4 * cps <= cfg->model.seq_len) cps *= 2;
    const long long most =
        (long long)layers * cfg->model.n_head * cfg->train.global_batch * cps;
    for (long long k = n - 1 < most ? n - 1 : most; k >= 1 && !below; k--)
        if (grids_for(cfg, (int)k, NULL, 0)) below = (int)k;
    for (long long k = n + 1; k <= most && k <= 100000000 && !above; k++)
        if (grids_for(cfg, (int)k, NULL, 0)) above = (int)k;
    char near[128] = "";
    if (below && above)
        snprintf(near, sizeof near, "; the nearest device counts with one are %d and %d", below,
                 above);
    else if (below || above)
        snprintf(near, sizeof near, "; the nearest device count with one is %d",
                 below ? below : above);
    return ts_fail("no grid uses exactly %d devices: pp * dp * cp * tp = %d needs tp "
                   "dividing model.n_head = %d (and the MLP width; llama: n_kv_head or a "
                   "multiple of it), cp a power of two with seq_len = %d dividing by 2cp, dp "
                   "dividing train.global_batch = %d and pp at most the "
                   "%d layers (embedding, %d blocks, head)%s (change --gpus or "
                   "train.global_batch)",
                   n, n, cfg->model.n_head, cfg->model.seq_len, cfg->train.global_batch, layers,
                   cfg->model.n_layer, near);
}

/* Whether a bound keeps a grid out of the top k so far. Only a bound clearly above the
 * last kept time prunes: one within better()'s tie band may still tie it and win on
 * memory or simplicity, so it is simulated. */
static bool bound_out(const ts_search_opts *o, const ts_search_result *r, int k, double bound)
{
    if (o->exhaustive || r->n_top < k) return false;
    const double last = r->top[k - 1].step_ms;
    return bound > last && differ(bound, last);
}

/* The top k: the estimated grids that fit (*fits, sorted here) and the pending ones
 * (recompute auto, bounded by none's bound) in increasing order of bound, each simulated
 * unless its bound is out; a pending grid is estimated when it comes up unpruned and
 * joins *fits at its own bound's place. */
static ts_status rank_fits(ts_plan_ctx *x, const ts_search_opts *o, int k, ts_plan_result **fits,
                           size_t *n_fits, size_t *cap, floored *pending, size_t n_pending,
                           ts_search_result *r)
{
    if (*n_fits > 0) qsort(*fits, *n_fits, sizeof **fits, cmp_lower); /* NULL when none */
    if (n_pending > 0) qsort(pending, n_pending, sizeof *pending, cmp_floor);
    size_t j = 0, p = 0;
    while (j < *n_fits || p < n_pending) {
        if (p < n_pending && (j == *n_fits || pending[p].floor < (*fits)[j].lower_ms)) {
            const floored *d = &pending[p++];
            if (bound_out(o, r, k, d->floor)) {
                r->unestimated++;
                continue;
            }
            ts_plan_result e;
            if (ts_plan_estimate(x, &d->g, &e) != TS_OK) continue; /* none's ran: cannot fail */
            if (!e.fits) { /* (cannot happen: full fits) */
                r->oom++;
                r->fit--;
                continue;
            }
            /* Into the sorted rest, after what has come up already. */
            size_t at = j;
            while (at < *n_fits && (*fits)[at].lower_ms <= e.lower_ms) at++;
            *fits = ts_grow(*fits, cap, *n_fits, sizeof **fits);
            memmove(&(*fits)[at + 1], &(*fits)[at], sizeof **fits * (*n_fits - at));
            (*fits)[at] = e;
            (*n_fits)++;
            continue;
        }
        ts_plan_result *c = &(*fits)[j++];
        if (bound_out(o, r, k, c->lower_ms)) {
            estimate_terms(c);
            continue;
        }
        if (ts_plan_simulate(x, c, NULL) != TS_OK) return TS_ERR;
        r->simulated++;
        top_insert(r, k, c);
    }
    return TS_OK;
}

/* What the search gathers over the grids: the estimated candidates that fit, the
 * pending recompute = "auto" ones, those skipped on their memory floor. */
typedef struct {
    ts_plan_result *fits;
    size_t n_fits, cap;
    floored *pruned, *pending;
    size_t n_pruned, cap_pruned, n_pending, cap_pending;
    bool have_smallest;
    long long fit;   /* n_fits + n_pending as gathered (ranking moves pending into fits) */
    bool counted;
} gathered;

/* Counts a's fitting candidates once, before a ranking changes its arrays. */
static void count_fit(gathered *a)
{
    if (!a->counted) a->fit = (long long)(a->n_fits + a->n_pending);
    a->counted = true;
}

static void gathered_free(gathered *a)
{
    free(a->fits);
    free(a->pruned);
    free(a->pending);
    memset(a, 0, sizeof *a);
}

/* Whether a shape's candidates can all be counted out of memory without estimating
 * them: its memory floor (ts_plan_shape_memory_floor, the least of its sp choices) when
 * that exceeds the device and is no less than the closest out of memory and the lightest
 * found so far, else 0. Then no candidate of it fits, and none can become the closest or
 * the lightest: those are replaced only by a strictly smaller total, and they only come
 * down. The counts are what estimating would give (ts_plan_grid_runs), so the search's
 * output stays the same to the byte. */
static double shape_out_of_memory(ts_plan_ctx *x, int pp, int dp, int cp, int tp, int ep,
                                  int etp, int mb, const gathered *a, const ts_search_result *r)
{
    const ts_config *cfg = ts_plan_ctx_config(x);
    const double memory = ts_plan_ctx_cluster(x)->memory;
    if (!r->oom || !a->have_smallest) return 0.0;
    ts_plan_grid g = {.pp = pp, .dp = dp, .tp = tp, .cp = cp, .v = 1, .micro_batch = mb,
                      .m = cfg->train.global_batch / dp / mb, .ep = ep, .etp = etp};
    double least = ts_plan_shape_memory_floor(x, &g);
    if (sp_ok(cfg, tp, cp)) {
        g.sp = 1;
        least = fmin(least, ts_plan_shape_memory_floor(x, &g));
    }
    /* (a part in 10^9 below: the estimate sums the same terms in another order) */
    least *= 1.0 - 1e-9;
    const bool out = least > memory && least >= r->oom_closest.mem.total &&
                     least >= r->smallest.mem.total;
    return out ? least : 0.0;
}

/* Every candidate of grid (pp, dp, cp, tp) with expert grid (ep, etp) at micro_batch mb,
 * estimated into a (those that fit), r (counts, the closest out of memory, the
 * lightest). */
static void gather_expert_shape(ts_plan_ctx *x, const ts_search_opts *o, int pp, int dp, int cp,
                                int tp, int ep, int etp, int mb, gathered *a,
                                ts_search_result *r)
{
    const ts_config *cfg = ts_plan_ctx_config(x);
    const ts_cluster *cl = ts_plan_ctx_cluster(x);
    const int layers = cfg->model.n_layer + 2, gb = cfg->train.global_batch;
    const int m = gb / dp / mb;
    const double over = shape_out_of_memory(x, pp, dp, cp, tp, ep, etp, mb, a, r);
    for (int s = 0; s < TS_N_SCHEDULES; s++) {
        if (pp == 1 && s != TS_SCHEDULE_1F1B) continue; /* the schedules coincide */
        /* v chunks per rank: 1, exactly 2 (the V schedules), or any v >= 2 for the
         * multi-chunk ones (their v = 1 is 1f1b, gpipe's order, zb-h1). */
        const int per_rank = ts_schedule_chunks_per_rank((ts_schedule_kind)s);
        const int v_lo = per_rank == 1 ? 1 : 2, v_hi = per_rank == 0 ? layers / pp : v_lo;
        for (int v = v_lo; v <= v_hi && pp * v <= layers; v++) {
            /* [zero][sp] */
            bool none_fits[4][2] = {{false}}, full_fits[4][2] = {{false}};
            double none_lower[4][2] = {{-1, -1}, {-1, -1}, {-1, -1}, {-1, -1}};
            for (int rc = 0; rc < TS_N_RECOMPUTES; rc++) {
                /* none, full and auto (in that order); auto only where none does not fit
                 * (where it fits, auto keeps everything: none again) and full does (where
                 * full does not, nothing does) */
                if (rc == TS_RECOMPUTE_EXCEPT_LAST) continue;
                /* zero 0..3 (0 alone when dp * cp = 1: nothing to shard over), each with
                 * sp off and on */
                const int n_sp = sp_ok(cfg, tp, cp) ? 2 : 1, n_zs = (dp * cp > 1 ? 4 : 1) * n_sp;
                for (int zs = 0; zs < n_zs; zs++) {
                    const int z = zs / n_sp, sp = zs % n_sp;
                    if (rc == TS_RECOMPUTE_AUTO && (none_fits[z][sp] || !full_fits[z][sp]))
                        continue;
                    ts_plan_grid g = {.pp = pp, .dp = dp, .tp = tp, .cp = cp, .v = v,
                                      .micro_batch = mb, .m = m, .schedule = s,
                                      .recompute = rc, .zero = z, .sp = sp, .ep = ep,
                                      .etp = etp};
                    /* auto fits where full does (its caps may all come down to full's), and
                     * recomputes no less than none: none's bound is its bound. Its memory
                     * fit, the costly part, waits until the bound says it may enter the
                     * top (rank_fits). */
                    if (rc == TS_RECOMPUTE_AUTO && !o->exhaustive && none_lower[z][sp] >= 0) {
                        a->pending = ts_grow(a->pending, &a->cap_pending, a->n_pending,
                                             sizeof *a->pending);
                        a->pending[a->n_pending++] = (floored){g, none_lower[z][sp], 0.0};
                        r->candidates++;
                        continue;
                    }
                    const double floor = ts_plan_memory_floor(x, &g);
                    if (floor > cl->memory) {
                        /* Out of memory whatever the cut: estimated exactly only if it
                         * may be the closest or the lightest. */
                        a->pruned = ts_grow(a->pruned, &a->cap_pruned, a->n_pruned,
                                            sizeof *a->pruned);
                        a->pruned[a->n_pruned++] = (floored){g, floor, over};
                        continue;
                    }
                    if (over > 0.0) {
                        /* Out of memory (the shape's floor) and neither the closest nor
                         * the lightest: counted as its estimate would be (when it runs). */
                        if (ts_plan_grid_runs(x, &g)) {
                            r->candidates++;
                            r->oom++;
                        }
                        continue;
                    }
                    ts_plan_result e;
                    if (ts_plan_estimate(x, &g, &e) != TS_OK) continue;
                    if (rc == TS_RECOMPUTE_NONE) {
                        none_fits[z][sp] = e.fits;
                        none_lower[z][sp] = e.lower_ms;
                    }
                    if (rc == TS_RECOMPUTE_FULL) full_fits[z][sp] = e.fits;
                    r->candidates++;
                    if (!a->have_smallest || e.mem.total < r->smallest.mem.total) {
                        r->smallest = e;
                        a->have_smallest = true;
                    }
                    if (!e.fits) {
                        if (!r->oom || e.mem.total < r->oom_closest.mem.total) r->oom_closest = e;
                        r->oom++;
                        continue;
                    }
                    a->fits = ts_grow(a->fits, &a->cap, a->n_fits, sizeof *a->fits);
                    a->fits[a->n_fits++] = e;
                }
            }
        }
    }
}

/* Every candidate of grid (pp, dp, cp, tp) at micro_batch mb, each expert grid of its
 * stage (one for a dense model). */
static void gather_shape(ts_plan_ctx *x, const ts_search_opts *o, int pp, int dp, int cp, int tp,
                         int mb, gathered *a, ts_search_result *r)
{
    int xg[2 * TS_MAX_EXPERT_GRIDS];
    const int n = expert_grids(ts_plan_ctx_config(x), tp * cp * dp, xg, TS_MAX_EXPERT_GRIDS);
    for (int j = 0; j < n; j++)
        gather_expert_shape(x, o, pp, dp, cp, tp, xg[2 * j], xg[2 * j + 1], mb, a, r);
}

/* The grids skipped on their memory floor: the closest and the lightest among them are
 * found in order of the floor, stopping once the floor alone is heavier. */
static void settle_pruned(ts_plan_ctx *x, gathered *a, ts_search_result *r)
{
    if (a->n_pruned > 0) qsort(a->pruned, a->n_pruned, sizeof *a->pruned, cmp_floor);
    for (size_t j = 0; j < a->n_pruned; j++) {
        if (a->have_smallest && r->oom && a->pruned[j].floor >= r->smallest.mem.total &&
            a->pruned[j].floor >= r->oom_closest.mem.total) {
            r->candidates++;
            r->oom++;
            continue;
        }
        /* Its shape's floor said it cannot be either (shape_out_of_memory: they only come
         * down): counted when its estimate would run. */
        if (a->pruned[j].shape_floor > 0.0) {
            if (ts_plan_grid_runs(x, &a->pruned[j].g)) {
                r->candidates++;
                r->oom++;
            }
            continue;
        }
        ts_plan_result e;
        if (ts_plan_estimate(x, &a->pruned[j].g, &e) != TS_OK) continue;
        r->candidates++;
        if (!a->have_smallest || e.mem.total < r->smallest.mem.total) {
            r->smallest = e;
            a->have_smallest = true;
        }
        if (!r->oom || e.mem.total < r->oom_closest.mem.total) r->oom_closest = e;
        r->oom++;
    }
    a->n_pruned = 0;
}

/* A (grid, micro_batch, expert grid) shape and its work floor: the context-parallel ones
 * and, for an MoE model, the expert grids each cp = 1 shape did not gather first. */
typedef struct {
    int pp, dp, cp, tp, mb, ep, etp;
    double floor;
} cp_shape;

static int cmp_shape(const void *pa, const void *pb)
{
    const cp_shape *a = pa, *b = pb;
    return a->floor < b->floor ? -1 : a->floor > b->floor;
}

/* The least work of a shape (ts_plan_work_floor), sequence parallelism on or off. */
static double shape_floor(ts_plan_ctx *x, const cp_shape *c)
{
    const ts_config *cfg = ts_plan_ctx_config(x);
    ts_plan_grid g = {.pp = c->pp, .dp = c->dp, .tp = c->tp, .cp = c->cp, .v = 1,
                      .micro_batch = c->mb, .m = cfg->train.global_batch / c->dp / c->mb,
                      .ep = c->ep, .etp = c->etp};
    double w = ts_plan_work_floor(x, &g);
    if (sp_ok(cfg, c->tp, c->cp)) {
        g.sp = 1;
        const double w1 = ts_plan_work_floor(x, &g);
        w = w1 < w ? w1 : w;
    }
    return w;
}

/* The shapes the bounded phase gathers (gather_cp), grown by push_shape. */
typedef struct {
    cp_shape *sh;
    size_t n, cap;
} shape_list;

static void push_shape(shape_list *l, cp_shape c)
{
    l->sh = ts_grow(l->sh, &l->cap, l->n, sizeof *l->sh);
    l->sh[l->n++] = c;
}

/* The candidates of the grids with cp == 1 into a. A dense model's one expert grid is
 * (1, 1); an MoE model's shape gathers here the expert grid of least work floor (so the
 * top list fills with a likely good one) and leaves the others to the bounded phase
 * (*later, with their floors). */
static void gather_plain(ts_plan_ctx *x, const ts_search_opts *o, const int *grids, int n_grids,
                         gathered *a, ts_search_result *r, shape_list *later)
{
    const ts_config *cfg = ts_plan_ctx_config(x);
    const int gb = cfg->train.global_batch;
    for (int k = 0; k < n_grids; k++) {
        const int *q = grids + 4 * k; /* pp, dp, cp, tp */
        if (q[2] > 1) continue;
        for (int mb = 1; mb <= gb / q[1]; mb++) {
            if ((gb / q[1]) % mb) continue;
            if (cfg->model.moe_experts <= 0) {
                gather_shape(x, o, q[0], q[1], q[2], q[3], mb, a, r);
                continue;
            }
            int xg[2 * TS_MAX_EXPERT_GRIDS];
            const int n = expert_grids(cfg, q[3] * q[2] * q[1], xg, TS_MAX_EXPERT_GRIDS);
            int first = 0;
            double least = INFINITY;
            cp_shape c[TS_MAX_EXPERT_GRIDS] = {{0}};
            if (n < 1) continue; /* (1, 1) always is one */
            for (int j = 0; j < n; j++) {
                c[j] = (cp_shape){q[0], q[1], q[2], q[3], mb, xg[2 * j], xg[2 * j + 1], 0.0};
                c[j].floor = shape_floor(x, &c[j]);
                if (c[j].floor < least) least = c[j].floor, first = j;
            }
            gather_expert_shape(x, o, q[0], q[1], q[2], q[3], c[first].ep, c[first].etp, mb, a, r);
            for (int j = 0; j < n; j++)
                if (j != first) push_shape(later, c[j]);
        }
    }
    settle_pruned(x, a, r);
    ts_error_clear();
}

#define TS_CP_BATCH 8 /* context-parallel shapes gathered between two rankings */

/* The context-parallel grids (cp > 1), each with every expert grid of its stage, and the
 * expert grids gather_plain left (*later), in increasing order of their shapes' work
 * floors, TS_CP_BATCH shapes at a time into a new entry of *batches, each batch ranked
 * into r's top k at once; once the next floor exceeds the K-th best step the rest are
 * skipped (r->bound_cp). With exhaustive: one batch of every shape. */
static ts_status gather_cp(ts_plan_ctx *x, const ts_search_opts *o, int k, const int *grids,
                           int n_grids, gathered **batches, size_t *n_batches, size_t *cap_batches,
                           ts_search_result *r, shape_list *later)
{
    const ts_config *cfg = ts_plan_ctx_config(x);
    const int gb = cfg->train.global_batch;
    for (int j = 0; j < n_grids; j++) {
        const int *q = grids + 4 * j;
        if (q[2] == 1) continue;
        int xg[2 * TS_MAX_EXPERT_GRIDS];
        const int n_xg = expert_grids(cfg, q[3] * q[2] * q[1], xg, TS_MAX_EXPERT_GRIDS);
        for (int mb = 1; mb <= gb / q[1]; mb++) {
            if ((gb / q[1]) % mb) continue;
            for (int e = 0; e < n_xg; e++) {
                cp_shape c = {q[0], q[1], q[2], q[3], mb, xg[2 * e], xg[2 * e + 1], 0.0};
                if (!o->exhaustive) c.floor = shape_floor(x, &c);
                push_shape(later, c);
            }
        }
    }
    cp_shape *sh = later->sh;
    const size_t n = later->n;
    if (n > 1 && !o->exhaustive) qsort(sh, n, sizeof *sh, cmp_shape);
    ts_status st = TS_OK;
    for (size_t j = 0; j < n && st == TS_OK;) {
        *batches = ts_grow(*batches, cap_batches, *n_batches, sizeof **batches);
        gathered *a = &(*batches)[(*n_batches)++];
        memset(a, 0, sizeof *a);
        a->have_smallest = *n_batches > 1 ? (*batches)[*n_batches - 2].have_smallest : false;
        for (size_t b = 0; j < n && (o->exhaustive || b < TS_CP_BATCH); j++, b++) {
            const double last = r->n_top == k ? r->top[k - 1].step_ms : INFINITY;
            if (!o->exhaustive && sh[j].floor > last && differ(sh[j].floor, last)) {
                r->bound_cp += (long long)(n - j); /* sorted: every later one too */
                j = n;
                break;
            }
            gather_expert_shape(x, o, sh[j].pp, sh[j].dp, sh[j].cp, sh[j].tp, sh[j].ep,
                                sh[j].etp, sh[j].mb, a, r);
        }
        settle_pruned(x, a, r);
        ts_error_clear();
        count_fit(a);
        if (!o->exhaustive && a->n_fits > 0)
            st = rank_fits(x, o, k, &a->fits, &a->n_fits, &a->cap, a->pending, a->n_pending, r);
        else if (!o->exhaustive)
            a->n_pending = 0; /* (none without fits: auto needs full's) */
    }
    return st;
}

/* No grid fits: the error naming what would. */
static ts_status none_fits(ts_plan_ctx *x, const ts_search_opts *o, const ts_search_result *r,
                           bool have_smallest)
{
    const ts_cluster *cl = ts_plan_ctx_cluster(x);
    const ts_plan_grid *g = &r->smallest.g;
    ts_plan_grid fg = {0};
    const long long least = fewest_devices(x, &fg);
    if (least > o->gpus)
        return ts_fail("%d devices are fewer than one replica of this model needs: at "
                       "least %lld (pp %d x dp %d x cp %d x tp %d, micro_batch 1, recompute "
                       "full%s%s) to fit in %.2f GB per device; give --gpus %lld or more",
                       o->gpus, least, fg.pp, fg.dp, fg.cp, fg.tp, fg.zero ? ", zero 3" : "",
                       fg.sp ? ", sequence parallel" : "", cl->memory / 1e9, least);
    if (!have_smallest)
        return ts_fail("no schedule can run any grid of %d devices for this batch", o->gpus);
    return ts_fail("the model fits nowhere on %d devices of %s: the lightest grid (pp %d, dp "
                   "%d, cp %d, tp %d, %s, v %d, micro_batch %d, recompute %s, zero %d%s) needs "
                   "%.2f GB per device, the device has %.2f GB%s",
                   o->gpus, cl->name, g->pp, g->dp, ts_plan_grid_cp(g), g->tp,
                   ts_schedule_names[g->schedule], g->v, g->micro_batch,
                   ts_recompute_names[g->recompute], g->zero, g->sp ? ", sequence parallel" : "",
                   r->smallest.mem.total / 1e9, cl->memory / 1e9,
                   least ? "" : " (no number of devices holds this model with this batch: "
                                "a device with more memory is needed)");
}

ts_status ts_plan_search(ts_plan_ctx *x, const ts_search_opts *o, ts_search_result *r)
{
    memset(r, 0, sizeof *r);
    const ts_config *cfg = ts_plan_ctx_config(x);
    const int n_grids = grids_for(cfg, o->gpus, NULL, 0);
    if (n_grids == 0) return no_grid(cfg, o->gpus);
    int *grids = ts_malloc(sizeof(int) * 4 * (size_t)n_grids);
    grids_for(cfg, o->gpus, grids, n_grids);
    r->n_grids = n_grids;
    const int k = o->top > 0 ? o->top : 10;
    r->top = ts_calloc((size_t)k, sizeof *r->top);

    /* The grids without context parallelism first (search.h), ranked once gathered
     * (exhaustive: after everything); then the context-parallel shapes in batches,
     * bounded by the K-th best step so far. Every batch enters one top list. */
    gathered *b = ts_calloc(1, sizeof *b);
    size_t n_b = 1, cap_b = 1;
    ts_status st = TS_OK;
    shape_list later = {0};
    gather_plain(x, o, grids, n_grids, &b[0], r, &later);
    bool ranked0 = false;
    count_fit(&b[0]);
    if (!o->exhaustive && b[0].n_fits > 0) {
        st = rank_fits(x, o, k, &b[0].fits, &b[0].n_fits, &b[0].cap, b[0].pending,
                       b[0].n_pending, r);
        ranked0 = true;
    }
    if (st == TS_OK) st = gather_cp(x, o, k, grids, n_grids, &b, &n_b, &cap_b, r, &later);
    free(later.sh);
    free(grids);
    size_t fits = 0;
    bool have_smallest = false;
    for (size_t j = 0; j < n_b; j++) {
        fits += b[j].n_fits;
        count_fit(&b[j]);
        r->fit += b[j].fit;
        have_smallest |= b[j].have_smallest;
    }
    if (st == TS_OK && fits == 0) /* (pending grids need their full recompute to fit) */
        st = none_fits(x, o, r, have_smallest);
    /* Exhaustive: everything ranked here. */
    for (size_t j = 0; j < n_b && st == TS_OK && o->exhaustive; j++)
        if ((j > 0 || !ranked0) && b[j].n_fits > 0)
            st = rank_fits(x, o, k, &b[j].fits, &b[j].n_fits, &b[j].cap, b[j].pending,
                           b[j].n_pending, r);
    /* Why the rest lose: everything that fits but is not in the top list. */
    for (size_t j = 0; j < n_b && st == TS_OK; j++)
        for (size_t i = 0; i < b[j].n_fits; i++) {
            const ts_plan_result *f = &b[j].fits[i];
            bool in_top = false;
            for (int t = 0; t < r->n_top && !in_top; t++)
                in_top = !memcmp(&r->top[t].g, &f->g, sizeof f->g);
            if (!in_top) r->lost[ts_plan_loss_reason(f, &r->top[0])]++;
        }
    for (size_t j = 0; j < n_b; j++) gathered_free(&b[j]);
    free(b);
    if (st != TS_OK) {
        free(r->top);
        r->top = NULL;
        r->n_top = 0;
    }
    return st;
}

void ts_search_result_free(ts_search_result *r)
{
    free(r->top);
    memset(r, 0, sizeof *r);
}
