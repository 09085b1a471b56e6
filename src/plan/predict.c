/* Predicting one grid (predict.h). */
#include "plan/predict.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/sysmem.h"
#include "pipeline/partition.h"
#include "pipeline/schedule.h"
#include "pipeline/memory.h"
#include "plan/sim_costs.h"
#include "plan/zero.h"

typedef struct {
    int tp, cp, B, sp, sub, ep, etp;
    ts_plan_layers L;
} layers_entry;

typedef struct {
    int tp, cp, B, sp, n_chunks, ep, etp;
    int *sizes, *first;
} part_entry;

typedef struct {
    int kind, pp, v, m;
    ts_status st;
    char error[512];
    ts_schedule s;
    bool *split;    /* [n_chunks]: the chunk's backward runs as I + W (chunk_splits) */
    /* Lazily, [n_chunks], per fixed mode (auto depends on the grid's memory: rc_plan). */
    int *peak_acts[TS_N_RECOMPUTES], *peak_stash[TS_N_RECOMPUTES], *n_rc[TS_N_RECOMPUTES];
    ts_peak_memo *auto_peaks; /* lazily: recompute = "auto"'s peaks per rank and cap */
} sched_entry;

/* ZeRO-2/3's residencies of a schedule, one per pipeline rank (residency.h), for one
 * partition when replicated key/value weights make them depend on it (first: its
 * first_layer array, stable while ctx lives), else first = NULL. */
typedef struct {
    size_t sched;       /* index into ts_plan_ctx.scheds */
    const int *first;
    ts_residency *res;  /* [pp] */
    int pp;
} res_entry;

/* The parameter floats of a (tp, ep, etp) layout (model_cost.h), shared by every
 * layers entry of that triple. */
typedef struct {
    int tp, ep, etp;
    ts_plan_param_floats pf;
} param_entry;

/* A layers key's (layers_entry) sum of the layers' work (ts_plan_work_floor). */
typedef struct {
    int key[7];
    double sum;
} work_entry;

/* An open-addressed index of a cache's entries by key hash (the search asks the layers
 * and cuts of hundreds of thousands of shapes: a linear scan per lookup was quadratic).
 * slot: entry index + 1, 0 empty. */
typedef struct {
    size_t *slot;
    size_t cap; /* a power of two, or 0 */
} cache_index;

struct ts_plan_ctx {
    ts_config cfg;
    ts_cluster cl;
    const ts_kernels *k; /* the run's layout (ts_plan_kernels) */
    double imbalance;    /* an MoE's load imbalance (ts_plan_ctx_set_moe) */
    bool hide_shared;
    int doc_len;         /* packed documents' length (ts_plan_ctx_set_documents); 0: none */
    param_entry *params;
    size_t n_params, cap_params;
    int muon_steps;      /* train.optimizer = "muon": its Newton-Schulz steps; 0: AdamW */
    layers_entry *layers;
    size_t n_layers, cap_layers;
    cache_index layers_index, parts_index, scheds_index;
    /* ts_plan_work_floor's layer sums by layers key, for shapes whose layers were never
     * cached: the search floors a million shapes and estimates few of them. */
    work_entry *works;
    size_t n_works, cap_works;
    cache_index works_index;
    part_entry *parts;
    size_t n_parts, cap_parts;
    sched_entry *scheds;
    size_t n_scheds, cap_scheds;
    res_entry *res;
    size_t n_res, cap_res;
};

ts_plan_ctx *ts_plan_ctx_new(const ts_config *cfg, const ts_cluster *cl)
{
    ts_plan_ctx *x = ts_calloc(1, sizeof *x);
    x->cfg = *cfg;
    x->cl = *cl;
    x->k = ts_plan_kernels(cfg, cl);
    x->imbalance = 1.0;
    x->hide_shared = true;
    x->muon_steps = ts_config_muon(&cfg->train) ? ts_config_muon_ns_steps(&cfg->train) : 0;
    return x;
}

void ts_plan_ctx_set_moe(ts_plan_ctx *x, double imbalance, bool hide_shared)
{
    TS_ASSERT(x->n_layers == 0 && imbalance >= 1.0);
    x->imbalance = imbalance;
    x->hide_shared = hide_shared;
}

void ts_plan_ctx_set_documents(ts_plan_ctx *x, int doc_len)
{
    TS_ASSERT(x->n_layers == 0 && doc_len >= 0);
    x->doc_len = doc_len;
}

void ts_plan_ctx_free(ts_plan_ctx *x)
{
    if (!x) return;
    for (size_t k = 0; k < x->n_params; k++) ts_plan_param_floats_free(&x->params[k].pf);
    free(x->params);
    free(x->layers_index.slot);
    free(x->parts_index.slot);
    free(x->scheds_index.slot);
    free(x->works);
    free(x->works_index.slot);
    for (size_t k = 0; k < x->n_layers; k++) ts_plan_layers_free(&x->layers[k].L);
    for (size_t k = 0; k < x->n_parts; k++) {
        free(x->parts[k].sizes);
        free(x->parts[k].first);
    }
    for (size_t k = 0; k < x->n_scheds; k++) {
        sched_entry *e = &x->scheds[k];
        if (e->st == TS_OK) ts_schedule_free(&e->s);
        free(e->split);
        for (int r = 0; r < TS_N_RECOMPUTES; r++) {
            free(e->peak_acts[r]);
            free(e->peak_stash[r]);
            free(e->n_rc[r]);
        }
        if (e->auto_peaks) ts_peak_memo_free(e->auto_peaks);
        free(e->auto_peaks);
    }
    for (size_t k = 0; k < x->n_res; k++) {
        for (int q = 0; q < x->res[k].pp; q++) ts_residency_free(&x->res[k].res[q]);
        free(x->res[k].res);
    }
    free(x->layers);
    free(x->parts);
    free(x->scheds);
    free(x->res);
    free(x);
}

const ts_cluster *ts_plan_ctx_cluster(const ts_plan_ctx *x) { return &x->cl; }
const ts_config *ts_plan_ctx_config(const ts_plan_ctx *x) { return &x->cfg; }

/* ------------------------------------------------------------------- links -- */

static bool inside_node(const ts_cluster *cl, long long span)
{
    return span <= cl->devices_per_node && cl->devices_per_node % span == 0;
}

ts_link ts_plan_tp_link(const ts_cluster *cl, const ts_plan_grid *g)
{
    return inside_node(cl, g->tp) ? cl->intra : cl->inter;
}

ts_link ts_plan_cp_link(const ts_cluster *cl, const ts_plan_grid *g)
{
    return inside_node(cl, (long long)g->tp * ts_plan_grid_cp(g)) ? cl->intra : cl->inter;
}

ts_link ts_plan_dp_link(const ts_cluster *cl, const ts_plan_grid *g)
{
    return inside_node(cl, (long long)g->tp * ts_plan_grid_cp(g) * g->dp) ? cl->intra : cl->inter;
}

ts_link ts_plan_pp_link(const ts_cluster *cl, const ts_plan_grid *g)
{
    return (long long)g->tp * ts_plan_grid_cp(g) * g->dp * g->pp <= cl->devices_per_node
               ? cl->intra
               : cl->inter;
}

ts_link ts_plan_etp_link(const ts_cluster *cl, const ts_plan_grid *g)
{
    return inside_node(cl, ts_plan_grid_etp(g)) ? cl->intra : cl->inter;
}

int ts_plan_ep_node_members(const ts_cluster *cl, const ts_plan_grid *g)
{
    return ts_plan_ep_in_node(ts_plan_grid_ep(g), ts_plan_grid_etp(g), cl->devices_per_node);
}

/* ------------------------------------------------------------------ caches -- */

/* The sub-batches a grid's blocks run in: tp_overlap where it applies to the grid (tp >
 * 1, micro_batch divisible by it), else 1 (the search's other micro-batch sizes). */
static int sub_of(const ts_plan_grid *g)
{
    return g->sub > 1 && g->tp > 1 && g->micro_batch % g->sub == 0 ? g->sub : 1;
}

/* A hash of a cache key's ints (FNV-1a over their bytes). */
static size_t key_hash(const int *key, int n)
{
    size_t h = 1469598103934665603u;
    for (int j = 0; j < n; j++) {
        unsigned v = (unsigned)key[j];
        for (int b = 0; b < 4; b++, v >>= 8) h = (h ^ (v & 0xffu)) * 1099511628211u;
    }
    return h;
}

/* The first slot of hash h's probe sequence that is empty or whose entry `same` accepts
 * (same(arg, entry index)); the index is grown to hold n_entries + 1 first, rehashed by
 * rehash(arg, entry index). */
typedef bool (*cache_same_fn)(const void *arg, size_t entry, const void *key);
typedef size_t (*cache_hash_fn)(const void *arg, size_t entry);

static size_t *index_find(cache_index *ix, size_t n_entries, size_t h, cache_same_fn same,
                          cache_hash_fn rehash, const void *arg, const void *key)
{
    if (2 * (n_entries + 1) > ix->cap) { /* at most half full */
        const size_t cap = ix->cap ? 2 * ix->cap : 1024;
        size_t *slot = ts_calloc(cap, sizeof *slot);
        for (size_t e = 0; e < n_entries; e++) {
            size_t j = rehash(arg, e) & (cap - 1);
            while (slot[j]) j = (j + 1) & (cap - 1);
            slot[j] = e + 1;
        }
        free(ix->slot);
        ix->slot = slot;
        ix->cap = cap;
    }
    size_t j = h & (ix->cap - 1);
    while (ix->slot[j] && !same(arg, ix->slot[j] - 1, key)) j = (j + 1) & (ix->cap - 1);
    return &ix->slot[j];
}

/* A layers entry's key: tp, cp, B, sp, sub, ep, etp. */
static void layers_key_of(const layers_entry *e, int *key)
{
    const int k[7] = {e->tp, e->cp, e->B, e->sp, e->sub, e->ep, e->etp};
    memcpy(key, k, sizeof k);
}

static size_t layers_rehash(const void *arg, size_t entry)
{
    int key[7];
    layers_key_of(&((const ts_plan_ctx *)arg)->layers[entry], key);
    return key_hash(key, 7);
}

static bool layers_same(const void *arg, size_t entry, const void *key)
{
    int k[7];
    layers_key_of(&((const ts_plan_ctx *)arg)->layers[entry], k);
    return !memcmp(k, key, sizeof k);
}

/* The parameter floats of g's (tp, ep, etp), built on first use. */
static const ts_plan_param_floats *params_for(ts_plan_ctx *x, const ts_plan_grid *g)
{
    /* (a dense model's layout has no expert grid, as ts_plan_layers_build_moe says) */
    const bool moe = x->cfg.model.moe_experts > 0;
    const int ep = moe ? ts_plan_grid_ep(g) : 1, etp = moe ? ts_plan_grid_etp(g) : 1;
    for (size_t k = 0; k < x->n_params; k++) /* (a few hundred triples at most) */
        if (x->params[k].tp == g->tp && x->params[k].ep == ep && x->params[k].etp == etp)
            return &x->params[k].pf;
    x->params = ts_grow(x->params, &x->cap_params, x->n_params, sizeof *x->params);
    param_entry *e = &x->params[x->n_params++];
    *e = (param_entry){.tp = g->tp, .ep = ep, .etp = etp};
    ts_plan_param_floats_build(&e->pf, &x->cfg.model, x->k, g->tp, ep, etp);
    return &e->pf;
}

/* g's layers key (layers_entry's fields in layers_key_of's order). */
static void grid_layers_key(const ts_plan_grid *g, int *key)
{
    const int k[7] = {g->tp, ts_plan_grid_cp(g), g->micro_batch, g->sp, sub_of(g),
                      ts_plan_grid_ep(g), ts_plan_grid_etp(g)};
    memcpy(key, k, sizeof k);
}

/* Build g's layers into *L (the caller frees them). */
static void layers_build(ts_plan_ctx *x, const ts_plan_grid *g, ts_plan_layers *L)
{
    const ts_plan_param_floats *pf = params_for(x, g);
    const ts_plan_moe moe = {.ep = ts_plan_grid_ep(g), .etp = ts_plan_grid_etp(g),
                             .ep_in_node = ts_plan_ep_node_members(&x->cl, g),
                             .etp_link = ts_plan_etp_link(&x->cl, g),
                             .imbalance = x->imbalance, .hide_shared = x->hide_shared};
    ts_plan_layers_build_sized(L, &x->cfg.model, &x->cl, x->k, g->tp, g->sp != 0, sub_of(g),
                               g->micro_batch, ts_plan_tp_link(&x->cl, g), ts_plan_grid_cp(g),
                               ts_plan_cp_link(&x->cl, g), &moe, pf, x->doc_len);
    if (x->muon_steps > 0)
        L->muon = ts_plan_muon_layers(&x->cfg.model, &x->cl, x->k, g->tp, moe.ep, moe.etp,
                                      x->muon_steps, ts_plan_tp_link(&x->cl, g), moe.etp_link);
}

/* g's layers' times alone (ts_plan_layers_build_times; the caller frees them). */
static void layers_build_times(ts_plan_ctx *x, const ts_plan_grid *g, ts_plan_layers *L)
{
    const ts_plan_moe moe = {.ep = ts_plan_grid_ep(g), .etp = ts_plan_grid_etp(g),
                             .ep_in_node = ts_plan_ep_node_members(&x->cl, g),
                             .etp_link = ts_plan_etp_link(&x->cl, g),
                             .imbalance = x->imbalance, .hide_shared = x->hide_shared};
    ts_plan_layers_build_times(L, &x->cfg.model, &x->cl, x->k, g->tp, g->sp != 0, sub_of(g),
                               g->micro_batch, ts_plan_tp_link(&x->cl, g), ts_plan_grid_cp(g),
                               ts_plan_cp_link(&x->cl, g), &moe, x->doc_len);
}

/* g's cached layers, or NULL. */
static const ts_plan_layers *layers_cached(ts_plan_ctx *x, const ts_plan_grid *g)
{
    int key[7];
    grid_layers_key(g, key);
    const size_t *slot = index_find(&x->layers_index, x->n_layers, key_hash(key, 7), layers_same,
                                    layers_rehash, x, key);
    return *slot ? &x->layers[*slot - 1].L : NULL;
}

static const ts_plan_layers *layers_for(ts_plan_ctx *x, const ts_plan_grid *g)
{
    int key[7];
    grid_layers_key(g, key);
    size_t *slot = index_find(&x->layers_index, x->n_layers, key_hash(key, 7), layers_same,
                              layers_rehash, x, key);
    if (*slot) return &x->layers[*slot - 1].L;
    ts_plan_layers L;
    layers_build(x, g, &L); /* (before the slot's entry exists: it indexes no cut) */
    *slot = x->n_layers + 1;
    x->layers = ts_grow(x->layers, &x->cap_layers, x->n_layers, sizeof *x->layers);
    layers_entry *e = &x->layers[x->n_layers++];
    *e = (layers_entry){.tp = key[0], .cp = key[1], .B = key[2], .sp = key[3], .sub = key[4],
                        .ep = key[5], .etp = key[6], .L = L};
    return &e->L;
}

/* A cut's key: tp, cp, B, sp, n_chunks, ep, etp. */
static void part_key_of(const part_entry *e, int *key)
{
    const int k[7] = {e->tp, e->cp, e->B, e->sp, e->n_chunks, e->ep, e->etp};
    memcpy(key, k, sizeof k);
}

static size_t part_rehash(const void *arg, size_t entry)
{
    int key[7];
    part_key_of(&((const ts_plan_ctx *)arg)->parts[entry], key);
    return key_hash(key, 7);
}

static bool part_same(const void *arg, size_t entry, const void *key)
{
    int k[7];
    part_key_of(&((const ts_plan_ctx *)arg)->parts[entry], k);
    return !memcmp(k, key, sizeof k);
}

static const part_entry *part_for(ts_plan_ctx *x, const ts_plan_grid *g)
{
    const int n = g->pp * g->v;
    /* (sequence and context parallelism change the layer costs: their own cut) */
    const int key[7] = {g->tp, ts_plan_grid_cp(g), g->micro_batch, g->sp, n, ts_plan_grid_ep(g),
                        ts_plan_grid_etp(g)};
    size_t *slot = index_find(&x->parts_index, x->n_parts, key_hash(key, 7), part_same,
                              part_rehash, x, key);
    if (*slot) return &x->parts[*slot - 1];
    const ts_plan_layers *L = layers_for(x, g);
    int *sizes = ts_malloc(sizeof(int) * (size_t)n);
    if (x->cfg.parallel.n_partition == n) {
        memcpy(sizes, x->cfg.parallel.partition, sizeof(int) * (size_t)n);
    } else {
        /* Balanced on forward + backward time without recompute, as the trainer cuts;
         * it refuses (with a message) more chunks than layers. */
        double *cost = ts_malloc(sizeof(double) * (size_t)L->n_layers);
        for (int l = 0; l < L->n_layers; l++) cost[l] = L->f[l] + L->i[l] + L->w[l];
        ts_status st = ts_partition_balance(cost, L->n_layers, n, sizes);
        free(cost);
        if (st != TS_OK) {
            free(sizes);
            return NULL;
        }
    }
    int *first = ts_malloc(sizeof(int) * (size_t)n);
    for (int c = 0, at = 0; c < n; c++) {
        first[c] = at;
        at += sizes[c];
    }
    /* (layers_for above may have grown no index of the cuts: the slot stands) */
    *slot = x->n_parts + 1;
    x->parts = ts_grow(x->parts, &x->cap_parts, x->n_parts, sizeof *x->parts);
    part_entry *e = &x->parts[x->n_parts++];
    *e = (part_entry){.tp = g->tp, .cp = ts_plan_grid_cp(g), .B = g->micro_batch, .sp = g->sp,
                      .n_chunks = n, .ep = ts_plan_grid_ep(g), .etp = ts_plan_grid_etp(g),
                      .sizes = sizes, .first = first};
    return e;
}

const char *ts_plan_schedule_name(const ts_plan_ctx *x, int schedule)
{
    return schedule >= 0 ? ts_schedule_names[schedule] : x->cfg.parallel.schedule;
}

/* Whether chunk c's backward is split into I and W passes (zero-bubble schedules): a
 * schedule runs each chunk's backwards all as B or all as I + W (sim.c checks). */
static bool chunk_splits(const ts_schedule *s, int c)
{
    const int q = ts_chunk_rank(s, c);
    for (int k = 0; k < s->n_actions[q]; k++)
        if (s->actions[q][k].chunk == c) {
            const ts_action_kind kind = s->actions[q][k].kind;
            if (kind == TS_ACT_W || kind == TS_ACT_I) return true;
            if (kind == TS_ACT_B) return false;
        }
    return false;
}

static size_t sched_rehash(const void *arg, size_t entry)
{
    const sched_entry *e = &((const ts_plan_ctx *)arg)->scheds[entry];
    const int key[4] = {e->kind, e->pp, e->v, e->m};
    return key_hash(key, 4);
}

static bool sched_same(const void *arg, size_t entry, const void *key)
{
    const sched_entry *e = &((const ts_plan_ctx *)arg)->scheds[entry];
    const int *k = key;
    return e->kind == k[0] && e->pp == k[1] && e->v == k[2] && e->m == k[3];
}

static sched_entry *sched_for(ts_plan_ctx *x, const ts_plan_grid *g)
{
    const int key[4] = {g->schedule, g->pp, g->v, g->m};
    size_t *slot = index_find(&x->scheds_index, x->n_scheds, key_hash(key, 4), sched_same,
                              sched_rehash, x, key);
    if (*slot) return &x->scheds[*slot - 1];
    *slot = x->n_scheds + 1;
    x->scheds = ts_grow(x->scheds, &x->cap_scheds, x->n_scheds, sizeof *x->scheds);
    sched_entry *e = &x->scheds[x->n_scheds++];
    memset(e, 0, sizeof *e);
    e->kind = g->schedule;
    e->pp = g->pp;
    e->v = g->v;
    e->m = g->m;
    e->st = ts_schedule_build(&e->s, ts_plan_schedule_name(x, g->schedule), g->pp, g->v, g->m);
    if (e->st != TS_OK) {
        snprintf(e->error, sizeof e->error, "%s", ts_error_message());
        return e;
    }
    /* Once per schedule: scanning the actions per estimate costs more than the rest. */
    e->split = ts_calloc((size_t)e->s.n_chunks, sizeof(bool));
    for (int c = 0; c < e->s.n_chunks; c++) e->split[c] = chunk_splits(&e->s, c);
    return e;
}

static void peaks_for(sched_entry *e, int recompute, const int **acts, const int **stash,
                      const int **n_rc)
{
    TS_ASSERT(recompute != TS_RECOMPUTE_AUTO);
    if (!e->peak_acts[recompute]) {
        e->peak_acts[recompute] = ts_calloc((size_t)e->s.n_chunks, sizeof(int));
        e->peak_stash[recompute] = ts_calloc((size_t)e->s.n_chunks, sizeof(int));
        e->n_rc[recompute] = ts_calloc((size_t)e->s.n_chunks, sizeof(int));
        for (int q = 0; q < e->pp; q++)
            ts_memory_peak_sets(&e->s, recompute, NULL, q, e->peak_acts[recompute],
                                e->peak_stash[recompute], e->n_rc[recompute], NULL);
    }
    *acts = e->peak_acts[recompute];
    *stash = e->peak_stash[recompute];
    *n_rc = e->n_rc[recompute];
}

/* Whether a grid shards gradients (ZeRO-2, 3): only with more than one rank reducing
 * them (dp * cp). */
static bool sharded(const ts_plan_grid *g) { return g->zero >= 2 && ts_plan_grad_ranks(g) > 1; }

/* The residencies ([pp]) of grid g's schedule se cut as p, or NULL when the grid does
 * not shard its gradients. */
static const ts_residency *res_for(ts_plan_ctx *x, const ts_plan_grid *g, const part_entry *p,
                                   const sched_entry *se)
{
    if (!sharded(g)) return NULL;
    const ts_model_config *mc = &x->cfg.model;
    const bool kv = ts_model_arch(mc) == TS_ARCH_LLAMA && g->tp > ts_model_kv_heads(mc);
    const size_t si = (size_t)(se - x->scheds);
    const int *first = kv ? p->first : NULL;
    for (size_t k = 0; k < x->n_res; k++)
        if (x->res[k].sched == si && x->res[k].first == first) return x->res[k].res;
    x->res = ts_grow(x->res, &x->cap_res, x->n_res, sizeof *x->res);
    res_entry *e = &x->res[x->n_res++];
    *e = (res_entry){.sched = si, .first = first, .pp = g->pp,
                     .res = ts_calloc((size_t)g->pp, sizeof(ts_residency))};
    for (int q = 0; q < g->pp; q++)
        ts_memory_residency(&se->s, q, ts_model_head_reads_embedding(mc), kv, p->first, p->sizes,
                            mc->n_layer + 2, &e->res[q]);
    return e->res;
}

const int *ts_plan_partition(ts_plan_ctx *x, const ts_plan_grid *g)
{
    const part_entry *p = part_for(x, g);
    return p ? p->sizes : NULL;
}

void ts_plan_grid_of(const ts_config *cfg, ts_plan_grid *g)
{
    const ts_parallel_config *p = &cfg->parallel;
    *g = (ts_plan_grid){.pp = p->pp, .dp = p->dp, .tp = p->tp,
                        .cp = p->cp > 1 ? p->cp : 1, .v = p->virtual_stages,
                        .micro_batch = p->micro_batch, .m = ts_config_num_microbatches(cfg),
                        .schedule = ts_schedule_kind_from_name(p->schedule),
                        .recompute = ts_recompute_from_name(p->recompute), .zero = p->zero,
                        .sp = p->sequence_parallel, .sub = p->tp_overlap,
                        .ep = cfg->model.moe_experts > 0 ? p->ep : 1,
                        .etp = cfg->model.moe_experts > 0 ? p->etp : 1};
}

/* -------------------------------------------------------------- the model -- */

/* Chunk costs in ms: f, i (with recompute), w, and the parts the terms need; per
 * pipeline rank [pp], its optimizer and its serial dp reduction (dp_serial_ms). Built
 * once per estimate or prediction, shared by the bound and the simulation. */
typedef struct {
    double *f, *i, *w, *tp, *cp, *rc, *dp_floats;
    double *dp_xfloats; /* [n_chunks] of dp_floats, the routed experts' (reduced over edp);
                           0 without an expert grid */
    double *f_comm, *i_comm; /* [n_chunks] the exposed a2a in f and i (sim.h f_comm) */
    double *moe;        /* [n_chunks * MOE_TERMS] per micro-batch: moe_term's */
    double *floats;     /* [n_chunks] as its rank lays them out (memory.h's F_c) */
    double *gather;     /* [n_chunks] ZeRO-3: one all-gather of the chunk's weights (ms) */
    double *opt, *dp_serial;
    /* [pp] Muon (zero under AdamW): the busiest owner's Newton-Schulz and tp gathers (ms,
     * part of opt) and its Newton-Schulz FLOPs */
    double *muon_ns, *muon_gather, *muon_flops;
    const ts_residency *res; /* [pp] ZeRO-2/3, else NULL */
} chunk_costs;

/* An MoE chunk's terms per micro-batch (ms; chunk_costs.moe). */
enum { MOE_ROUTER, MOE_EXPERTS, MOE_SHARED, MOE_A2A, MOE_HIDDEN, MOE_ETP, MOE_TERMS };

/* One pipeline message (ms): latency + one micro-batch's activations / bandwidth. */
static double hop_ms(const ts_plan_ctx *x, const ts_plan_layers *L, const ts_plan_grid *g)
{
    const ts_link pl = ts_plan_pp_link(&x->cl, g);
    return (pl.latency + L->msg_bytes / pl.bandwidth) * 1e3;
}

/* The dp reduction's lane (r = dp * cp > 1: context-parallel ranks hold the same weights
 * and reduce their gradients with the replicas', as Megatron's distributed optimizer
 * does): a ring over r ranks all-reduces 2(r-1)/r of the bytes in 2(r-1) steps, ZeRO-1,
 * 2 and 3's reduce-scatter half of that; per latency (ms) and bytes per ms, as the
 * simulator's dp lane takes them. */
static void dp_lane(const ts_plan_ctx *x, const ts_plan_grid *g, double *latency_ms,
                    double *bytes_per_ms)
{
    const ts_link dl = ts_plan_dp_link(&x->cl, g);
    const double r = ts_plan_grad_ranks(g);
    const double k = r - 1.0, halves = g->zero >= 1 ? 1.0 : 2.0;
    *latency_ms = halves * k * dl.latency * 1e3;
    *bytes_per_ms = dl.bandwidth * r / (halves * k) * 1e-3;
}

/* The bytes chunk c's reduction puts on the dp lane: its gradients, the routed experts'
 * scaled from a ring over edp to the lane's ring over r = dp * cp ((edp-1)/edp against
 * (r-1)/r of them; none with edp = 1); the lane's link prices both. */
static double lane_bytes(const ts_plan_grid *g, const chunk_costs *cc, int c)
{
    const double xf = cc->dp_xfloats[c];
    if (xf <= 0) return cc->dp_floats[c] * 4.0;
    const double r = ts_plan_grad_ranks(g), e = ts_plan_grid_edp(g);
    const double scale = r > 1 ? ((e - 1.0) / e) / ((r - 1.0) / r) : 0.0;
    return (cc->dp_floats[c] - xf) * 4.0 + xf * 4.0 * scale;
}

/* The reductions chunk c issues: the trainer's buckets (ts_plan_dp_buckets) when they
 * overlap the backward, else one. */
static int dp_pieces(const ts_plan_ctx *x, const part_entry *p, const chunk_costs *cc, int c)
{
    if (!x->cfg.parallel.overlap_grad_sync) return 1;
    return ts_plan_dp_buckets(cc->dp_floats[c] * 4.0, p->sizes[c], x->cfg.parallel.bucket_mb);
}

/* Rank q's dp reduction time when it cannot overlap (comm_on_compute): every chunk's
 * reductions back to back after the rank's last backward (ms); 0 otherwise. */
static double dp_serial_ms(const ts_plan_ctx *x, const ts_plan_grid *g, const part_entry *p,
                           const chunk_costs *cc, const int *chunk_rank, int q)
{
    if (!x->cl.comm_on_compute || ts_plan_grad_ranks(g) <= 1) return 0.0;
    double lat, bw, t = 0.0;
    dp_lane(x, g, &lat, &bw);
    for (int c = 0; c < p->n_chunks; c++) {
        if (chunk_rank[c] != q) continue;
        t += dp_pieces(x, p, cc, c) * lat + lane_bytes(g, cc, c) / bw;
        if (g->zero == 3) t += cc->res[q].gathers[c] * cc->gather[c]; /* stalls compute too */
    }
    return t;
}

/* Muon's part of the rank's optimizer (seconds; muon_cost.h) over its matrices mu: the
 * busiest owner's momentum and update passes, 28 bytes a float it owns (gradient read,
 * momentum read and written, the iteration's input written and output read, weight read
 * and written) plus the weight copy, its Newton-Schulz GEMMs and its tp gathers (into
 * *ns and *gather), and under ZeRO-0 the all-gather of the updated matrices over the
 * reduction group (experts: edp), which ZeRO-1/2's parameter all-gather otherwise does. */
static double muon_s(const ts_plan_ctx *x, const ts_plan_grid *g, const ts_plan_muon *mu,
                     double *ns, double *gather)
{
    const int r = ts_plan_grad_ranks(g), e = ts_plan_grid_edp(g);
    const bool owners = r > 1; /* one rank: every matrix is its own */
    const double owned = owners ? ts_plan_muon_owner_share(mu->floats - mu->xfloats, mu->xfloats,
                                                           mu->max_floats, r, e)
                                : mu->floats;
    *ns = owners ? ts_plan_muon_owner_share(mu->time - mu->xtime, mu->xtime, mu->max_time, r, e)
                 : mu->time;
    *gather = owners ? ts_plan_muon_owner_share(mu->gather - mu->xgather, mu->xgather, 0.0, r, e)
                     : mu->gather;
    double t = owned * (28.0 + x->k->weight_copy_bytes) / x->cl.memory_bandwidth + *ns + *gather;
    if (g->zero == 0 && owners && mu->floats > 0) {
        const ts_link l = ts_plan_dp_link(&x->cl, g);
        t += ((r - 1.0) / r * (mu->floats - mu->xfloats) + (e - 1.0) / e * mu->xfloats) * 4.0 /
                 l.bandwidth +
             (r - 1.0) * l.latency;
    }
    return t;
}

/* The rank's optimizer (ms): AdamW over its parameters' shard; ZeRO-1 and 2's all-gather
 * of the updated parameters (ZeRO-3 gathers each chunk when the next step needs it).
 * xfloats of floats are routed experts', sharded and gathered over edp instead. Under
 * Muon (mu non-NULL) AdamW covers the floats that are not Muon matrices, and muon_s adds
 * Muon's part (its Newton-Schulz and gathers into *ns_ms, *gather_ms). */
static double optimizer_ms(const ts_plan_ctx *x, const ts_plan_grid *g, double all_floats,
                           double all_xfloats, const ts_plan_muon *mu, double *ns_ms,
                           double *gather_ms)
{
    const double r = ts_plan_grad_ranks(g); /* ZeRO shards over dp * cp */
    const double e = ts_plan_grid_edp(g);
    const double floats = mu ? all_floats - mu->floats : all_floats;
    const double xfloats = mu ? all_xfloats - mu->xfloats : all_xfloats;
    const double shard = g->zero < 1 ? floats
                         : xfloats > 0 ? (floats - xfloats) / r + xfloats / e
                                       : floats / r;
    double t = shard * (36.0 + x->k->weight_copy_bytes) / x->cl.memory_bandwidth;
    double ns = 0.0, gather = 0.0;
    if (mu) t += muon_s(x, g, mu, &ns, &gather);
    *ns_ms = ns * 1e3;
    *gather_ms = gather * 1e3;
    if ((g->zero == 1 || g->zero == 2) && r > 1) {
        const ts_link l = ts_plan_dp_link(&x->cl, g);
        const double k = r - 1.0;
        if (all_xfloats > 0)
            t += (k / r * (all_floats - all_xfloats) + (e - 1.0) / e * all_xfloats) * 4.0 /
                     l.bandwidth +
                 k * l.latency;
        else
            t += k / r * all_floats * 4.0 / l.bandwidth + k * l.latency;
    }
    return t * 1e3;
}

/* The chunk and rank costs of a grid. With comm_on_compute (overlap_comm = false) a
 * pipeline message is the sending rank's work: chunk c's forward sends its activations
 * on (c < n-1), its input gradient sends the gradient back (c > 0), and the link itself
 * is free. */
static void chunk_costs_make(const ts_plan_ctx *x, const ts_plan_layers *L, const part_entry *p,
                             const ts_plan_grid *g, const sched_entry *se, const int *n_rc,
                             const bool *selective, const ts_residency *res, chunk_costs *cc)
{
    const int *chunk_rank = se->s.chunk_rank;
    const double send = x->cl.comm_on_compute ? hop_ms(x, L, g) : 0.0;
    const int n = p->n_chunks;
    double **arrays[] = {&cc->f, &cc->i, &cc->w, &cc->tp, &cc->cp, &cc->rc, &cc->dp_floats,
                         &cc->floats, &cc->gather, &cc->dp_xfloats, &cc->f_comm, &cc->i_comm};
    for (size_t a = 0; a < sizeof arrays / sizeof *arrays; a++)
        *arrays[a] = ts_calloc((size_t)n, sizeof(double));
    cc->moe = ts_calloc((size_t)n * MOE_TERMS, sizeof(double));
    /* The routed experts reduce over their own group when there is an expert grid. */
    const bool expert_group = L->ep > 1 || L->etp > 1;
    cc->res = res;
    for (int q = 0; q < g->pp; q++)
        ts_plan_chunk_floats(L, chunk_rank, n, p->first, p->sizes, q, cc->floats);
    /* ZeRO-3's gathers: a ring all-gather of the chunk's weights in the compute dtype
     * over the r = dp * cp ranks sharing them, (r-1)/r of them in r-1 steps. */
    const ts_link dl = ts_plan_dp_link(&x->cl, g);
    const double r = ts_plan_grad_ranks(g);
    if (g->zero == 3 && r > 1)
        for (int c = 0; c < n; c++)
            cc->gather[c] = ((r - 1.0) * dl.latency +
                             (r - 1.0) / r * (double)ts_dtype_bytes(x->k->act_dtype) *
                                 cc->floats[c] / dl.bandwidth) * 1e3;
    for (int c = 0; c < n; c++) {
        const int l0 = p->first[c], l1 = l0 + p->sizes[c];
        /* Sequence parallelism's gathers a split W repeats (zero without it). */
        const bool split = L->sp && se->split[c];
        double f = 0, i = 0, w = 0, tp = 0, cpx = 0, att = 0, xf = 0, fa = 0, ia = 0;
        double *mt = cc->moe + (size_t)c * MOE_TERMS;
        for (int l = l0; l < l1; l++) {
            const ts_plan_moe_block *mb = &L->moe[l];
            xf += L->expert_floats[l];
            fa += L->f_a2a[l];
            ia += L->i_a2a[l];
            mt[MOE_ROUTER] += (mb->router_f + mb->router_b) * 1e3;
            mt[MOE_EXPERTS] += (mb->experts_f + mb->experts_b) * 1e3;
            mt[MOE_SHARED] += (mb->shared_f + mb->shared_b) * 1e3;
            mt[MOE_A2A] += (mb->a2a_f + mb->a2a_b) * 1e3;
            mt[MOE_HIDDEN] += (mb->hidden_f + mb->hidden_b) * 1e3;
            mt[MOE_ETP] += (mb->etp_f + mb->etp_b) * 1e3;
            f += L->f[l];
            i += L->i[l];
            w += L->w[l] + (split ? L->w_split_tp[l] : 0.0);
            tp += L->f_tp[l] + L->i_tp[l] + (split ? L->w_split_tp[l] : 0.0);
            cpx += L->f_cp[l] + L->i_cp[l];
            att += L->f_att[l];
        }
        cc->f[c] = f * 1e3 + (c + 1 < n ? send : 0.0);
        /* The forwards rerun: the chunk's recomputed share of its micro-batches (the
         * simulator times every micro-batch of a chunk alike). */
        cc->rc[c] = (double)n_rc[c] / g->m * f * 1e3;
        /* Selective recompute reruns the attention core in every backward: every chunk's
         * with "selective", auto's selective chunks' (their recomputed micro-batches'
         * replays keep no attention state either). */
        if (g->recompute == TS_RECOMPUTE_SELECTIVE || (selective && selective[c]))
            cc->rc[c] += att * 1e3;
        cc->i[c] = i * 1e3 + cc->rc[c] + (c > 0 ? send : 0.0);
        cc->w[c] = w * 1e3;
        cc->tp[c] = tp * 1e3;
        cc->cp[c] = cpx * 1e3;
        cc->dp_floats[c] = ts_plan_chunk_param_floats(L, l0, l1);
        cc->dp_xfloats[c] = expert_group ? xf : 0.0;
        cc->f_comm[c] = fa * 1e3;
        cc->i_comm[c] = ia * 1e3;
    }
    cc->opt = ts_malloc(sizeof(double) * (size_t)g->pp);
    cc->dp_serial = ts_malloc(sizeof(double) * (size_t)g->pp);
    cc->muon_ns = ts_calloc((size_t)g->pp, sizeof(double));
    cc->muon_gather = ts_calloc((size_t)g->pp, sizeof(double));
    cc->muon_flops = ts_calloc((size_t)g->pp, sizeof(double));
    for (int q = 0; q < g->pp; q++) {
        double floats = 0.0, xfloats = 0.0;
        ts_plan_muon mu = {0};
        for (int c = 0; c < n; c++)
            if (chunk_rank[c] == q) {
                floats += cc->dp_floats[c];
                xfloats += cc->dp_xfloats[c];
                for (int l = p->first[c]; L->muon && l < p->first[c] + p->sizes[c]; l++)
                    ts_plan_muon_sum(&mu, &L->muon[l]);
            }
        cc->opt[q] = optimizer_ms(x, g, floats, xfloats, L->muon ? &mu : NULL, &cc->muon_ns[q],
                                  &cc->muon_gather[q]);
        if (L->muon) {
            const int r = ts_plan_grad_ranks(g);
            cc->muon_flops[q] = r > 1 ? ts_plan_muon_owner_share(mu.flops - mu.xflops, mu.xflops,
                                                                 mu.max_flops, r,
                                                                 ts_plan_grid_edp(g))
                                      : mu.flops;
        }
        cc->dp_serial[q] = dp_serial_ms(x, g, p, cc, chunk_rank, q);
    }
}

static void chunk_costs_free(chunk_costs *cc)
{
    free(cc->f);
    free(cc->i);
    free(cc->w);
    free(cc->tp);
    free(cc->cp);
    free(cc->rc);
    free(cc->dp_floats);
    free(cc->floats);
    free(cc->gather);
    free(cc->dp_xfloats);
    free(cc->f_comm);
    free(cc->i_comm);
    free(cc->moe);
    free(cc->opt);
    free(cc->dp_serial);
    free(cc->muon_ns);
    free(cc->muon_gather);
    free(cc->muon_flops);
}

static ts_memory_shape mem_shape(const ts_plan_ctx *x, const ts_plan_grid *g,
                                 const sched_entry *se)
{
    const ts_model_config *mc = &x->cfg.model;
    return (ts_memory_shape){
        .micro_batch = g->micro_batch, .seq_len = mc->seq_len, .n_embd = mc->n_embd,
        .pp = g->pp, .n_chunks = g->pp * g->v, .chunk_rank = se->s.chunk_rank, .m = g->m,
        .dp = ts_plan_grad_ranks(g), .zero = g->zero, /* ZeRO shards over dp * cp */
        .async_checkpoint = x->cfg.checkpoint.async && x->cfg.checkpoint.dir[0],
        .weight_copy_bytes = x->k->weight_copy_bytes,
        .act_bytes = (int)ts_dtype_bytes(x->k->act_dtype),
        .threads = x->cfg.train.threads > 0 ? x->cfg.train.threads : 1,
        .host_reductions = x->cl.host_collectives && !x->k->device_memory,
        .overlap_grad_sync = x->cfg.parallel.overlap_grad_sync,
        .selective = g->recompute == TS_RECOMPUTE_SELECTIVE,
        /* a boundary's rows: B*T / cp, and / tp under sequence parallelism */
        .seq_split = (g->sp ? g->tp : 1) * ts_plan_grid_cp(g),
        /* the experts' own group under an expert grid (memory.c's rule) */
        .edp = ts_plan_grid_ep(g) > 1 || ts_plan_grid_etp(g) > 1 ? ts_plan_grid_edp(g) : 0};
}

/* What a grid recomputes and holds, every rank's chunks ([n_chunks]): a fixed mode's
 * peaks from the schedule's cache; for "auto" each rank's caps fitted into the device
 * (the cluster's memory, or parallel.memory_budget_mb when smaller), owned here. */
typedef struct {
    const int *peak_acts, *peak_stash, *n_rc;
    int *keep;       /* auto only */
    bool *selective; /* auto only: the chunks it made selective */
    int *own[3];
} rc_plan;

static void rc_plan_make(ts_plan_ctx *x, const ts_plan_layers *L, const part_entry *p,
                         sched_entry *se, const ts_plan_grid *g, rc_plan *rp)
{
    memset(rp, 0, sizeof *rp);
    if (g->recompute != TS_RECOMPUTE_AUTO) {
        peaks_for(se, g->recompute, &rp->peak_acts, &rp->peak_stash, &rp->n_rc);
        return;
    }
    const int n = p->n_chunks;
    for (int k = 0; k < 3; k++) rp->own[k] = ts_calloc((size_t)n, sizeof(int));
    rp->keep = ts_calloc((size_t)n, sizeof(int));
    rp->selective = ts_calloc((size_t)n, sizeof(bool));
    rp->peak_acts = rp->own[0];
    rp->peak_stash = rp->own[1];
    rp->n_rc = rp->own[2];
    const ts_memory_shape ms = mem_shape(x, g, se);
    /* The room is what the estimate less its workspace may take: fits is total <= memory. */
    double room = x->cl.memory - ms.threads * TS_BLAS_THREAD_BYTES;
    const double budget = (double)x->cfg.parallel.memory_budget_mb * 1048576.0;
    if (budget > 0 && budget < room) room = budget;
    const ts_residency *res = res_for(x, g, p, se);
    /* The schedule's peaks per cap, shared by every grid of it (memory.h). */
    if (!se->auto_peaks) {
        se->auto_peaks = ts_malloc(sizeof *se->auto_peaks);
        ts_peak_memo_init(se->auto_peaks, &se->s);
    }
    for (int q = 0; q < g->pp; q++) {
        ts_rank_memory mem;
        ts_plan_rank_auto(L, &ms, p->first, p->sizes, &se->s, res ? &res[q] : NULL, q, room,
                          rp->keep, rp->selective, rp->own[0], rp->own[1], rp->own[2],
                          se->auto_peaks, &mem);
    }
}

static void rc_plan_free(rc_plan *rp)
{
    for (int k = 0; k < 3; k++) free(rp->own[k]);
    free(rp->keep);
    free(rp->selective);
}

/* The layers, cut, schedule and recompute plan of a grid the estimate accepted. */
static void grid_rc_plan(ts_plan_ctx *x, const ts_plan_grid *g, const ts_plan_layers **L,
                         const part_entry **p, sched_entry **se, rc_plan *rp)
{
    *L = layers_for(x, g);
    *p = part_for(x, g);
    *se = sched_for(x, g);
    TS_ASSERT(*p && (*se)->st == TS_OK);
    rc_plan_make(x, *L, *p, *se, g, rp);
}

void ts_plan_rank_memory_of(ts_plan_ctx *x, const ts_plan_grid *g, int q, ts_rank_memory *m)
{
    const ts_plan_layers *L;
    const part_entry *p;
    sched_entry *se;
    rc_plan rp;
    grid_rc_plan(x, g, &L, &p, &se, &rp);
    const ts_memory_shape ms = mem_shape(x, g, se);
    const ts_residency *res = res_for(x, g, p, se);
    ts_plan_rank_memory(L, &ms, p->first, p->sizes, rp.peak_acts, rp.peak_stash, rp.n_rc,
                        rp.selective, res ? &res[q] : NULL, q, m);
    rc_plan_free(&rp);
}

const int *ts_plan_chunk_rank(ts_plan_ctx *x, const ts_plan_grid *g)
{
    sched_entry *se = sched_for(x, g);
    TS_ASSERT(se->st == TS_OK);
    return se->s.chunk_rank;
}

void ts_plan_zero_of(ts_plan_ctx *x, const ts_plan_grid *g, int q, ts_zero_traffic *t,
                     int *gathers, double *chunk_bytes)
{
    const ts_plan_layers *L = layers_for(x, g);
    const part_entry *p = part_for(x, g);
    sched_entry *se = sched_for(x, g);
    TS_ASSERT(p && se->st == TS_OK);
    const int n = p->n_chunks;
    const ts_residency *res = g->zero == 3 ? res_for(x, g, p, se) : NULL;
    double *floats = ts_calloc((size_t)n, sizeof(double));
    ts_plan_chunk_floats(L, se->s.chunk_rank, n, p->first, p->sizes, q, floats);
    const int eb = (int)ts_dtype_bytes(x->k->act_dtype); /* ZeRO-3 gathers the compute dtype */
    ts_zero_traffic_of(g->zero, ts_plan_grad_ranks(g), &se->s, q, res ? &res[q] : NULL, floats,
                       eb, t);
    for (int c = 0; c < n; c++) {
        if (ts_chunk_rank(&se->s, c) != q) continue;
        /* Muon under ZeRO-0: the all-gather of the chunk's matrices after the update */
        double muon = 0.0;
        for (int l = p->first[c]; L->muon && l < p->first[c] + p->sizes[c]; l++)
            muon += L->muon[l].floats;
        ts_zero_add_muon(t, g->zero, ts_plan_grad_ranks(g), muon);
        if (gathers) gathers[c] = res ? res[q].gathers[c] : 0;
        if (chunk_bytes)
            chunk_bytes[c] =
                ts_zero_chunk_bytes(g->zero, ts_plan_grad_ranks(g), res ? &res[q] : NULL, c,
                                    floats[c], eb) +
                ts_zero_muon_bytes(g->zero, ts_plan_grad_ranks(g), muon);
    }
    free(floats);
}

void ts_plan_recompute_of(ts_plan_ctx *x, const ts_plan_grid *g, int *keep, bool *selective,
                          int *n_recomputed)
{
    const ts_plan_layers *L;
    const part_entry *p;
    sched_entry *se;
    rc_plan rp;
    grid_rc_plan(x, g, &L, &p, &se, &rp);
    const int n = p->n_chunks;
    if (keep && rp.keep) memcpy(keep, rp.keep, sizeof(int) * (size_t)n);
    if (selective) {
        memset(selective, 0, sizeof(bool) * (size_t)n);
        if (rp.selective) memcpy(selective, rp.selective, sizeof(bool) * (size_t)n);
    }
    if (n_recomputed) memcpy(n_recomputed, rp.n_rc, sizeof(int) * (size_t)n);
    rc_plan_free(&rp);
}

/* The layers, cut and schedule of a grid; fails (with a message) when the grid cannot
 * be cut or the schedule cannot run it. */
static ts_status grid_parts(ts_plan_ctx *x, const ts_plan_grid *g, const ts_plan_layers **L,
                            const part_entry **p, sched_entry **se)
{
    *L = layers_for(x, g);
    *p = part_for(x, g);
    if (!*p) return TS_ERR;
    *se = sched_for(x, g);
    if ((*se)->st != TS_OK) return ts_fail("%s", (*se)->error);
    return TS_OK;
}

/* ts_plan_estimate on the grid's parts and costs. */
static void estimate_with(ts_plan_ctx *x, const ts_plan_layers *L, const part_entry *p,
                          sched_entry *se, const rc_plan *rp, const chunk_costs *cc,
                          ts_plan_result *r)
{
    const ts_plan_grid *g = &r->g;
    const ts_memory_shape ms = mem_shape(x, g, se);
    for (int q = 0; q < g->pp; q++) {
        ts_rank_memory mem;
        ts_plan_rank_memory(L, &ms, p->first, p->sizes, rp->peak_acts, rp->peak_stash,
                            rp->n_rc, rp->selective, cc->res ? &cc->res[q] : NULL, q, &mem);
        if (q == 0 || mem.total > r->mem.total) {
            r->mem = mem;
            r->mem_rank = q;
        }
    }
    r->fits = r->mem.total <= x->cl.memory;

    /* The bound: rank q cannot start before micro-batch 0 has passed chunks 0..q-1, and
     * then has all its own work and its optimizer to do. */
    /* with comm_on_compute the message is in the sender's f, the link free */
    const double hop = hop_ms(x, L, g), wire = x->cl.comm_on_compute ? 0.0 : hop;
    double head = 0.0, busiest = -1.0;
    for (int q = 0; q < g->pp; q++) {
        double busy = 0.0, tp = 0.0, cpx = 0.0, rc = 0.0, mt[MOE_TERMS] = {0};
        for (int c = 0; c < p->n_chunks; c++) {
            if (ts_chunk_rank(&se->s, c) != q) continue;
            busy += g->m * (cc->f[c] + cc->i[c] + cc->w[c]);
            tp += g->m * cc->tp[c];
            cpx += g->m * cc->cp[c];
            rc += g->m * cc->rc[c];
            for (int k = 0; k < MOE_TERMS; k++) mt[k] += g->m * cc->moe[(size_t)c * MOE_TERMS + k];
        }
        const double opt = cc->opt[q], dp = cc->dp_serial[q];
        /* The bound leaves out the exchanges an overlapped pair may hide (sim.h): at most
         * all of them (none in a dense model). */
        double pairable = 0.0;
        for (int c = 0; c < p->n_chunks; c++)
            if (ts_chunk_rank(&se->s, c) == q) pairable += g->m * (cc->f_comm[c] + cc->i_comm[c]);
        const double bound = head + busy - pairable + opt + dp;
        if (bound > r->lower_ms) r->lower_ms = bound;
        if (busy + opt + dp > busiest) {
            busiest = busy + opt + dp;
            const double a2a_exposed = mt[MOE_A2A] - mt[MOE_HIDDEN];
            r->terms = (ts_plan_terms){.compute = busy - tp - cpx - rc, .recompute = rc,
                                       .tp_comm = tp, .cp_comm = cpx, .optimizer = opt,
                                       .pp_comm = hop, .muon_ns = cc->muon_ns[q],
                                       .muon_gather = cc->muon_gather[q],
                                       .muon_ns_flops = cc->muon_flops[q]};
            if (x->cfg.model.moe_experts > 0) {
                /* The exposed exchanges and the etp collectives are communication. */
                r->terms.compute -= a2a_exposed + mt[MOE_ETP];
                r->terms.router = mt[MOE_ROUTER];
                r->terms.experts = mt[MOE_EXPERTS];
                r->terms.shared = mt[MOE_SHARED];
                r->terms.a2a = mt[MOE_A2A];
                r->terms.a2a_hidden = mt[MOE_HIDDEN];
                r->terms.a2a_exposed = a2a_exposed;
                r->terms.etp_comm = mt[MOE_ETP];
                for (int l = 1; l < L->n_layers - 1; l++)
                    if (ts_model_block_is_moe(&x->cfg.model, l - 1)) {
                        r->terms.rows_per_expert = L->moe[l].rows_per_expert;
                        r->terms.a2a_bytes = L->moe[l].a2a_bytes;
                        break;
                    }
            }
        }
        head += cc->f[q] + (q + 1 < g->pp ? wire : 0.0);
    }
}

ts_status ts_plan_estimate(ts_plan_ctx *x, const ts_plan_grid *g, ts_plan_result *r)
{
    memset(r, 0, sizeof *r);
    r->g = *g;
    const ts_plan_layers *L;
    const part_entry *p;
    sched_entry *se;
    if (grid_parts(x, g, &L, &p, &se) != TS_OK) return TS_ERR;
    rc_plan rp;
    rc_plan_make(x, L, p, se, g, &rp);
    chunk_costs cc;
    chunk_costs_make(x, L, p, g, se, rp.n_rc, rp.selective, res_for(x, g, p, se), &cc);
    estimate_with(x, L, p, se, &rp, &cc, r);
    chunk_costs_free(&cc);
    rc_plan_free(&rp);
    return TS_OK;
}

double ts_plan_memory_floor(ts_plan_ctx *x, const ts_plan_grid *g)
{
    const ts_plan_layers *L = layers_for(x, g);
    double floats = 0.0, acts = 0.0;
    for (int l = 0; l < L->n_layers; l++) {
        floats += L->param_floats[l];
        acts += L->act_bytes[l] - L->att_bytes[l]; /* the floor: selective keeps least */
    }
    /* Per parameter, what persists (memory.h; ZeRO-2/3's chunk buffers come on top). */
    int r = ts_plan_grad_ranks(g); /* ZeRO shards over dp * cp */
    /* Under an expert grid the experts shard over edp: the larger of the two keeps this
     * a floor. */
    if ((ts_plan_grid_ep(g) > 1 || ts_plan_grid_etp(g) > 1) && ts_plan_grid_edp(g) > r)
        r = ts_plan_grid_edp(g);
    const double wcb = x->k->weight_copy_bytes, dp = r > 1 ? r : 1.0;
    const int zero = r > 1 ? g->zero : 0;
    const double per_param = zero == 3   ? 16.0 / dp
                             : zero == 2 ? 4.0 + wcb + 12.0 / dp
                                         : 4.0 + wcb + 4.0 + 8.0 / (zero == 1 ? dp : 1.0);
    /* Muon's matrices hold one momentum, owned 1/dp at least, instead of AdamW's two
     * moments (8 bytes, 1/dp of them with ZeRO): a floor keeps only that. */
    double muon = 0.0;
    for (int l = 0; L->muon && l < L->n_layers; l++) muon += L->muon[l].floats;
    const double saved = muon * (8.0 / (zero >= 1 ? dp : 1.0) - 4.0 / dp);
    const int threads = x->cfg.train.threads > 0 ? x->cfg.train.threads : 1;
    return (floats * per_param - saved + acts) / g->pp + threads * TS_BLAS_THREAD_BYTES;
}

/* Why this is a lower bound of ts_plan_estimate's mem.total for every candidate of the
 * shape (any schedule, v, cut, recompute mode incl. "auto", ZeRO level): the total is the
 * fullest rank's ts_memory_rank, a sum of terms none negative, so it is at least the
 * mean over the pp ranks and at least any one rank's, and each term is at least:
 * - activations: every chunk runs a forward, and ts_memory_peak_sets counts the set live
 *   at that forward whatever the mode (a recomputed one too), so each chunk holds >= 1
 *   set, its layers' act_bytes (less att_bytes when laid out selective; the smaller of
 *   the two here) plus the token ids; every layer sits in some chunk, so the ranks
 *   together hold >= the sum over layers, and the rank holding the largest layer >= it;
 * - buffers: each rank has >= 1 chunk, whose m pipeline slots are >= m rows of C
 *   (ts_memory_chunk: the gradient buffer; the rows / (tp under sequence parallelism)
 *   / cp), and the scratch (the smaller of plain and selective's);
 * - parameters, gradients, moments and ZeRO's chunk buffers per float of the rank (N, its
 *   shard S >= N / max(dp * cp, edp)): zero 0 16 + wcb, 1 8 + wcb + 8/r, 2 4 + wcb +
 *   12/r, 3 16/r plus its whole-rank gather (4 + wcb) N; the least of those the search
 *   tries (zero 0 alone with dp * cp = 1) times the layers' floats over the pp ranks;
 * - the BLAS buffers as they are.
 * test_plan_model checks it against every candidate of a few shapes. */
double ts_plan_shape_memory_floor(ts_plan_ctx *x, const ts_plan_grid *g)
{
    const ts_plan_layers *L = layers_for(x, g);
    const ts_model_config *mc = &x->cfg.model;
    const double ids = 2.0 * g->micro_batch * mc->seq_len * (double)sizeof(int);
    double floats = 0.0, acts = 0.0, widest = 0.0;
    for (int l = 0; l < L->n_layers; l++) {
        floats += L->param_floats[l];
        const double a = fmin(L->act_bytes[l], L->act_bytes[l] - L->att_bytes[l]);
        acts += a;
        widest = fmax(widest, a);
    }
    const int ranks = ts_plan_grad_ranks(g);
    double r = ranks;
    if ((ts_plan_grid_ep(g) > 1 || ts_plan_grid_etp(g) > 1) && ts_plan_grid_edp(g) > r)
        r = ts_plan_grid_edp(g);
    const double wcb = x->k->weight_copy_bytes;
    double per_param = 16.0 + wcb; /* zero 0 */
    if (ranks > 1) {
        per_param = fmin(per_param, 8.0 + wcb + 8.0 / r);       /* zero 1 */
        per_param = fmin(per_param, 4.0 + wcb + 12.0 / r);      /* zero 2 */
        per_param = fmin(per_param, 16.0 / r + 4.0 + wcb);      /* zero 3 */
    }
    /* Muon's matrices hold one momentum, owned (at every level) by one member of a group
     * of at most r: >= 4/r bytes a float instead of AdamW's moments; the least over the
     * levels the search tries, as above. */
    double muon = 0.0;
    for (int l = 0; L->muon && l < L->n_layers; l++) muon += L->muon[l].floats;
    double per_muon = 8.0 + wcb + 4.0 / r; /* zero 0 and 1 */
    if (ranks > 1) {
        per_muon = fmin(per_muon, 4.0 + wcb + 8.0 / r); /* zero 2 */
        per_muon = fmin(per_muon, 12.0 / r + 4.0 + wcb); /* zero 3 */
    }
    const double split = (double)(g->sp ? g->tp : 1) * ts_plan_grid_cp(g);
    const double slots = (double)g->m * g->micro_batch * mc->seq_len * mc->n_embd / split *
                         (double)ts_dtype_bytes(x->k->act_dtype);
    const double scratch = fmin(L->scratch_bytes, L->scratch_bytes + L->rebuild_bytes);
    const int threads = x->cfg.train.threads > 0 ? x->cfg.train.threads : 1;
    const double mean = ((floats - muon) * per_param + muon * per_muon + acts) / g->pp + ids;
    return fmax(mean, widest + ids) + slots + scratch + threads * TS_BLAS_THREAD_BYTES;
}

bool ts_plan_grid_runs(ts_plan_ctx *x, const ts_plan_grid *g)
{
    const ts_plan_layers *L;
    const part_entry *p;
    sched_entry *se;
    return grid_parts(x, g, &L, &p, &se) == TS_OK;
}

/* The layers' work of a floor: their forward, input- and weight-gradient time less
 * what an overlapped pair may hide (sim.h; nothing in a dense model), in seconds. */
static double layers_work(const ts_plan_layers *L)
{
    double w = 0.0;
    for (int l = 0; l < L->n_layers; l++)
        w += L->f[l] + L->i[l] + L->w[l] - L->f_a2a[l] - L->i_a2a[l];
    return w;
}

static size_t work_rehash(const void *arg, size_t entry)
{
    return key_hash(((const ts_plan_ctx *)arg)->works[entry].key, 7);
}

static bool work_same(const void *arg, size_t entry, const void *key)
{
    return !memcmp(((const ts_plan_ctx *)arg)->works[entry].key, key, 7 * sizeof(int));
}

double ts_plan_work_floor(ts_plan_ctx *x, const ts_plan_grid *g)
{
    /* The search floors every shape but estimates few: a shape's layers are built for
     * its floor and dropped (the sum kept), and cached only when a grid of it is
     * estimated (the cache would otherwise hold every shape's, gigabytes at 2048
     * devices of DeepSeek-V3). The same sum either way, to the bit. */
    double w;
    const ts_plan_layers *C = layers_cached(x, g);
    if (C) {
        w = layers_work(C);
    } else {
        int key[7];
        grid_layers_key(g, key);
        size_t *slot = index_find(&x->works_index, x->n_works, key_hash(key, 7), work_same,
                                  work_rehash, x, key);
        if (*slot) {
            w = x->works[*slot - 1].sum;
        } else {
            ts_plan_layers L;
            layers_build_times(x, g, &L);
            w = layers_work(&L);
            ts_plan_layers_free(&L);
            *slot = x->n_works + 1;
            x->works = ts_grow(x->works, &x->cap_works, x->n_works, sizeof *x->works);
            work_entry *e = &x->works[x->n_works++];
            memcpy(e->key, key, sizeof e->key);
            e->sum = w;
        }
    }
    return w * 1e3 * g->m / g->pp;
}

static void finish(const ts_plan_ctx *x, ts_plan_result *r)
{
    const ts_plan_grid *g = &r->g;
    const double tokens = (double)x->cfg.train.global_batch * x->cfg.model.seq_len;
    const double world = (double)g->pp * g->dp * ts_plan_grid_cp(g) * g->tp;
    r->tokens_per_s = tokens / (r->step_ms * 1e-3);
    r->mfu = ts_plan_model_flops_docs(&x->cfg.model, x->cfg.train.global_batch, x->doc_len) /
             (r->step_ms * 1e-3 * ts_cluster_peak(&x->cl) * world);
}

/* ZeRO-3's weight gathers on rank q of a simulated step (residency.h): residency k's
 * gather is issued when residency k-1's first action starts (the first at the step's
 * start), one gather at a time on the link, and the rank stalls before residency k's
 * first action until its gather is done; a stall delays the rank's later actions, and
 * so the later issues. The total stall (ms) and, into *busy, the gathers' time. Events
 * of rank q start after every earlier rank's actions and optimizer step (sim.c). */
static double gather_stall(const ts_sim_result *sr, const ts_schedule *s, const ts_residency *res,
                           const double *gather, int q, double *busy)
{
    int first_event = 0;
    for (int k = 0; k < q; k++) first_event += s->n_actions[k] + 1;
    const ts_sim_event *ev = sr->events + first_event;
    double stall = 0.0, link_free = 0.0;
    *busy = 0.0;
    for (int k = 0; k < res->n_spans; k++) {
        const ts_residency_span *sp = &res->spans[k];
        const double issue = k == 0 ? 0.0 : ev[res->spans[k - 1].first].start + stall;
        const double start = issue > link_free ? issue : link_free;
        link_free = start + gather[sp->chunk];
        *busy += gather[sp->chunk];
        const double need = ev[sp->first].start + stall;
        if (link_free > need) stall += link_free - need;
    }
    return stall;
}

/* ts_plan_simulate on the grid's parts and costs. */
static ts_status simulate_with(ts_plan_ctx *x, const ts_plan_layers *L, const part_entry *p,
                               sched_entry *se, const chunk_costs *cc, ts_plan_result *r,
                               ts_sim_result *keep)
{
    const ts_plan_grid *g = &r->g;
    const int n = p->n_chunks;
    const ts_link pl = ts_plan_pp_link(&x->cl, g);
    const bool serial = x->cl.comm_on_compute;
    const double *dp_serial = cc->dp_serial;
    ts_plan_sim_costs sc;
    ts_plan_sim_costs_init(&sc, n, L->msg_bytes);
    memcpy(sc.f, cc->f, sizeof(double) * (size_t)n);
    memcpy(sc.i, cc->i, sizeof(double) * (size_t)n);
    memcpy(sc.w, cc->w, sizeof(double) * (size_t)n);
    if (x->cfg.model.moe_experts > 0) { /* the overlapped pairs' exchanges (sim.h) */
        sc.costs.f_comm = cc->f_comm;
        sc.costs.i_comm = cc->i_comm;
    }
    sc.costs.latency = serial ? 0.0 : pl.latency * 1e3;
    sc.costs.bandwidth = serial ? 0.0 : pl.bandwidth * 1e-3;
    /* The optimizer, after (serial) the rank's whole dp reduction. */
    double *optim = ts_plan_sim_costs_optim(&sc, g->pp);
    for (int q = 0; q < g->pp; q++) optim[q] = cc->opt[q] + dp_serial[q];
    if (ts_plan_grad_ranks(g) > 1 && !serial) {
        /* Overlapped: the simulator's dp lane, per bucket as the trainer issues them. */
        double *bytes = ts_malloc(sizeof(double) * (size_t)n), lat, bw;
        for (int c = 0; c < n; c++) bytes[c] = lane_bytes(g, cc, c);
        dp_lane(x, g, &lat, &bw);
        ts_plan_sim_costs_dp(&sc, bytes, p->sizes, x->cfg.parallel.bucket_mb,
                             x->cfg.parallel.overlap_grad_sync, lat, bw);
        free(bytes);
    }
    ts_sim_result sr;
    ts_status st = ts_sim_run(&se->s, &sc.costs, &sr);
    /* ZeRO-3's gathers, overlapped: their stalls (from this step's timeline) join each
     * rank's optimizer, and the step is simulated again; what it lengthens the step by
     * is the gathers' exposed time. (A stall inside the step would also delay the ranks
     * downstream; at the end it delays only its own: an approximation, see predict.h.) */
    double *stall = ts_calloc((size_t)g->pp, sizeof(double)), gather_lane = 0.0, before = 0.0;
    if (st == TS_OK && g->zero == 3 && ts_plan_grad_ranks(g) > 1 && !serial) {
        bool any = false;
        for (int q = 0; q < g->pp; q++) {
            double t;
            stall[q] = gather_stall(&sr, &se->s, &cc->res[q], cc->gather, q, &t);
            gather_lane = t > gather_lane ? t : gather_lane;
            optim[q] += stall[q];
            any |= stall[q] > 0;
        }
        before = sr.step_time;
        if (any) {
            ts_sim_result_free(&sr);
            st = ts_sim_run(&se->s, &sc.costs, &sr);
        }
    }
    if (st == TS_OK) {
        r->simulated = true;
        if (g->zero == 3 && ts_plan_grad_ranks(g) > 1 && !serial) {
            r->terms.dp_gather = gather_lane;
            r->terms.gather_exposed = sr.step_time - before;
        }
        r->step_ms = sr.step_time;
        r->bubble = sr.bubble_mean;
        /* The busiest rank's compute and optimizer; a serial dp reduction (in its optim)
         * is the exposed term, not busy time. */
        double most = -1.0, busy = 0.0, lane = 0.0, exposed = serial ? 0.0 : sr.dp_exposed;
        double pair_hidden = 0.0;
        for (int q = 0; q < g->pp; q++) {
            if (sr.busy[q] > most) {
                most = sr.busy[q];
                busy = sr.busy[q] - dp_serial[q] - stall[q];
                if (serial) exposed = dp_serial[q];
                pair_hidden = sr.comm_hidden[q];
            }
            const double d = serial ? dp_serial[q] : sr.dp_busy[q];
            lane = d > lane ? d : lane;
        }
        r->terms.dp_exposed = exposed;
        r->terms.dp_reduction = lane;
        /* What the overlapped pairs hid of the busiest rank's exchanges (the estimate's
         * terms are per rank, summed before the simulation). */
        if (pair_hidden > 0) {
            r->terms.a2a_hidden += pair_hidden;
            r->terms.a2a_exposed -= pair_hidden;
        }
        const double idle = sr.step_time - busy - exposed - r->terms.gather_exposed;
        r->terms.bubble = idle > 0 ? idle : 0.0;
        finish(x, r);
        if (keep)
            *keep = sr;
        else
            ts_sim_result_free(&sr);
    }
    free(stall);
    ts_plan_sim_costs_free(&sc);
    return st;
}

ts_status ts_plan_simulate(ts_plan_ctx *x, ts_plan_result *r, ts_sim_result *keep)
{
    const ts_plan_layers *L;
    const part_entry *p;
    sched_entry *se;
    /* Cached since the estimate, which succeeded: this cannot fail. */
    ts_status st = grid_parts(x, &r->g, &L, &p, &se);
    TS_ASSERT(st == TS_OK);
    rc_plan rp;
    rc_plan_make(x, L, p, se, &r->g, &rp);
    chunk_costs cc;
    chunk_costs_make(x, L, p, &r->g, se, rp.n_rc, rp.selective, res_for(x, &r->g, p, se), &cc);
    rc_plan_free(&rp);
    st = simulate_with(x, L, p, se, &cc, r, keep);
    chunk_costs_free(&cc);
    return st;
}

ts_status ts_plan_predict(ts_plan_ctx *x, const ts_plan_grid *g, ts_plan_result *r,
                          ts_sim_result *keep)
{
    memset(r, 0, sizeof *r);
    r->g = *g;
    const ts_plan_layers *L;
    const part_entry *p;
    sched_entry *se;
    if (grid_parts(x, g, &L, &p, &se) != TS_OK) return TS_ERR;
    /* One build of the costs for both the estimate and the simulation. */
    rc_plan rp;
    rc_plan_make(x, L, p, se, g, &rp);
    chunk_costs cc;
    chunk_costs_make(x, L, p, g, se, rp.n_rc, rp.selective, res_for(x, g, p, se), &cc);
    estimate_with(x, L, p, se, &rp, &cc, r);
    rc_plan_free(&rp);
    const ts_status st = simulate_with(x, L, p, se, &cc, r, keep);
    chunk_costs_free(&cc);
    return st;
}
