/* The planner (src/plan/): textbook bubbles of the formula the search uses for grids it
 * does not simulate; the step's lower bound never above the simulated step (so the
 * pruned search is exact) and the pruned search's top list equal to the exhaustive
 * one's; doubling the link bandwidths never predicts a slower step; and the memory
 * prediction equal to the trainer's own estimate (pipeline/memory.c) for every grid of up
 * to 4 ranks of the tiny and a 12-layer config (both count a rank with ts_memory_rank:
 * this holds the planner's per-layer tables to the model's layout of each rank's
 * chunks); the optional cluster keys (GELU's time
 * per element, overlap_comm = false) change nothing when absent, add what they say when
 * present, and no overlap never predicts a faster step; the dp bucket rule; the memory
 * comparison for llama-tiny too (with and without sequence parallelism at tp 2 and 4);
 * Llama 3's parameter counts, FLOPs per token and the planner's per-block GEMM work and
 * parameters (test_llama3); sequence parallelism's collectives, messages and a search
 * that picks it (test_sequence_parallel); context parallelism's exchange, compute, the
 * 405B long-context grid and searches (test_context_parallel); the search's shape memory
 * floor at most every candidate's estimate (test_shape_memory_floor); Muon's pricing
 * (test_muon_formulas and the Muon grids). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "pipeline/partition.h"
#include "pipeline/schedule.h"
#include "pipeline/sim.h"
#include "model/model.h"
#include "plan/cluster.h"
#include "plan/model_cost.h"
#include "plan/muon_cost.h"
#include "plan/predict.h"
#include "plan/search.h"
#include "plan/sim_costs.h"
#include "test_util.h"
#include "pipeline/memory.h"

static char g_src[1024];

static const char *path(const char *rel, char *buf, size_t n)
{
    snprintf(buf, n, "%s/%s", g_src, rel);
    return buf;
}

static void load_cluster(const char *rel, ts_cluster *c)
{
    char p[1200];
    if (ts_cluster_load(path(rel, p, sizeof p), c) != TS_OK) {
        fprintf(stderr, "%s\n", ts_error_message());
        exit(2);
    }
}

static void load_config(const char *rel, const char *const *sets, int n, ts_config *cfg)
{
    char p[1200];
    /* As tessera plan loads (llama3-405b.cfg names train.device = "cuda"). */
    if (ts_config_load_plan(cfg, path(rel, p, sizeof p), sets, n) != TS_OK) {
        fprintf(stderr, "%s\n", ts_error_message());
        exit(2);
    }
}

/* 1. The textbook formula against the simulator with uniform costs, free links. */
static void test_textbook(void)
{
    for (int s = 0; s < TS_N_SCHEDULES; s++)
        for (int p = 2; p <= 4; p += 2)
            for (int m = p; m <= 4 * p; m *= 2)
                for (int v = 1; v <= 3; v++) {
                    const int per_rank = ts_schedule_chunks_per_rank((ts_schedule_kind)s);
                    if (per_rank ? v != per_rank : v == 1) continue; /* v = 1: the base ones */
                    /* The zero-bubble formulas hold once the pipeline can fill (zb-h2,
                     * zb-v from m >= 2p-1; dualpipe-v needs m >= 2p). */
                    if ((s == TS_SCHEDULE_ZB_H2 || s == TS_SCHEDULE_ZB_V) && m < 2 * p - 1) continue;
                    if (s == TS_SCHEDULE_DUALPIPE_V && m < 2 * p) continue;
                    ts_schedule sc;
                    CHECK(ts_schedule_build(&sc, ts_schedule_names[s], p, v, m) == TS_OK);
                    double f[16], iw[16];
                    for (int c = 0; c < p * v; c++) f[c] = iw[c] = 1.0;
                    ts_sim_costs k = {.n_chunks = p * v, .f = f, .i = iw, .w = iw};
                    ts_sim_result r;
                    CHECK(ts_sim_run(&sc, &k, &r) == TS_OK);
                    ts_plan_grid g = {.pp = p, .dp = 1, .tp = 1, .v = v, .m = m, .schedule = s};
                    const double want = ts_plan_textbook_bubble(&g);
                    CHECKF(ts_rel_err(r.bubble_mean, want, 1e-9) < 0.01,
                           "%s p %d v %d m %d: simulated %.5f, formula %.5f",
                           ts_schedule_names[s], p, v, m, r.bubble_mean, want);
                    ts_sim_result_free(&r);
                    ts_schedule_free(&sc);
                }
}

/* The dp bucket rule both planners use (plan/sim_costs.h): ceil(bytes / bucket), at
 * least one, at most one per layer. */
static void test_dp_buckets(void)
{
    const double mib = 1048576.0;
    CHECK(ts_plan_dp_buckets(0.0, 3, 4) == 1);
    CHECK(ts_plan_dp_buckets(4 * mib, 3, 4) == 1);
    CHECK(ts_plan_dp_buckets(4 * mib + 1, 3, 4) == 2);
    CHECK(ts_plan_dp_buckets(9 * mib, 5, 4) == 3);
    CHECK(ts_plan_dp_buckets(100 * mib, 5, 4) == 5);
    CHECK(ts_plan_dp_buckets(100 * mib, 0, 4) == 1);
}

/* Both links' bandwidths multiplied by `factor` (a faster cluster, for monotonicity). */
static void scale_links(ts_cluster *c, double factor)
{
    c->intra.bandwidth *= factor;
    c->inter.bandwidth *= factor;
}

static int same_grid(const ts_plan_grid *a, const ts_plan_grid *b)
{
    return !memcmp(a, b, sizeof *a);
}

/* 2 and 3: bound below the simulation, pruned = exhaustive, faster links never
 * slower, on every grid that fits for a few device counts. */
static void test_search(const char *cfg_rel, const char *cluster_rel, int gpus)
{
    const char *sets[] = {"train.global_batch=32"};
    ts_config cfg;
    load_config(cfg_rel, sets, 1, &cfg);
    ts_cluster cl, fast;
    load_cluster(cluster_rel, &cl);
    fast = cl;
    scale_links(&fast, 2.0);
    ts_plan_ctx *x = ts_plan_ctx_new(&cfg, &cl);
    ts_search_opts all = {.gpus = gpus, .top = 1000, .exhaustive = true};
    ts_search_opts pruned = {.gpus = gpus, .top = 10};
    ts_search_result ra, rp;
    CHECK(ts_plan_search(x, &all, &ra) == TS_OK);
    CHECK(ts_plan_search(x, &pruned, &rp) == TS_OK);
    CHECKF(ra.n_top > 10, "%s on %d: %d grids fit", cfg_rel, gpus, ra.n_top);
    for (int k = 0; k < rp.n_top && k < ra.n_top; k++)
        CHECKF(same_grid(&rp.top[k].g, &ra.top[k].g) && rp.top[k].step_ms == ra.top[k].step_ms,
               "%s on %d: pruned #%d (%.4f ms) differs from exhaustive (%.4f ms)", cfg_rel, gpus,
               k, rp.top[k].step_ms, ra.top[k].step_ms);
    CHECK(rp.simulated <= ra.simulated);
    int slower = 0, above = 0;
    for (int k = 0; k < ra.n_top; k++) {
        const ts_plan_result *r = &ra.top[k];
        if (r->lower_ms > r->step_ms * (1 + 1e-12)) above++;
        /* The same cut: faster tp links change the layer costs and so may move the
         * balanced cut, which is a different plan, not the same one on faster links. */
        ts_config same = cfg;
        const int *cut = ts_plan_partition(x, &r->g);
        same.parallel.n_partition = r->g.pp * r->g.v;
        memcpy(same.parallel.partition, cut, sizeof(int) * (size_t)(r->g.pp * r->g.v));
        ts_plan_ctx *xs = ts_plan_ctx_new(&same, &fast);
        ts_plan_result f;
        CHECK(ts_plan_predict(xs, &r->g, &f, NULL) == TS_OK);
        ts_plan_ctx_free(xs);
        if (f.step_ms > r->step_ms * (1 + 1e-12)) {
            if (!slower)
                fprintf(stderr, "pp %d dp %d tp %d %s v %d mb %d: %.6f ms at 2x bandwidth, %.6f "
                                "at 1x\n",
                        r->g.pp, r->g.dp, r->g.tp, ts_schedule_names[r->g.schedule], r->g.v,
                        r->g.micro_batch, f.step_ms, r->step_ms);
            slower++;
        }
    }
    CHECKF(above == 0, "%s on %d: %d grids' lower bound above their simulated step", cfg_rel,
           gpus, above);
    CHECKF(slower == 0, "%s on %d: %d of %d grids slower with 2x link bandwidth", cfg_rel, gpus,
           slower, ra.n_top);
    printf("%s on %d devices: %d grids fit, %lld simulated exhaustively, %lld pruned\n", cfg_rel,
           gpus, ra.n_top, ra.simulated, rp.simulated);
    ts_search_result_free(&ra);
    ts_search_result_free(&rp);
    ts_plan_ctx_free(x);
}

/* 5. The optional cluster keys (cluster.h): absent = the old model; a GELU time per
 * element adds exactly its excess over the memory pass; overlap_comm = false never
 * predicts a faster step than overlapping, and exposes the whole dp reduction. */
static void test_optional_keys(void)
{
    ts_cluster base, keys;
    load_cluster("tests/fixtures/plan_cluster_cpu.cfg", &base);
    load_cluster("tests/fixtures/plan_cluster_cpu_measured.cfg", &keys);
    CHECK(!base.comm_on_compute && base.elem_time[TS_ELEM_GELU][0] == 0.0 &&
          base.elem_time[TS_ELEM_LAYERNORM][1] == 0.0);
    CHECK(keys.comm_on_compute && ts_rel_err(keys.elem_time[TS_ELEM_GELU][0], 6e-9, 0) < 1e-12 &&
          ts_rel_err(keys.elem_time[TS_ELEM_GELU][1], 8e-9, 0) < 1e-12 &&
          keys.elem_time[TS_ELEM_LAYERNORM][0] == 0.0);
    ts_cluster gelu = keys, serial = keys, none = keys;
    gelu.comm_on_compute = false;
    memset(serial.elem_time, 0, sizeof serial.elem_time);
    none.comm_on_compute = false;
    memset(none.elem_time, 0, sizeof none.elem_time);

    int grids = 0;
    for (int pp = 1; pp <= 2; pp++)
        for (int dp = 1; dp <= 2; dp++)
            for (int tp = 1; tp <= 2; tp++)
                for (int z = 0; z <= (dp > 1); z++)
                    for (int ov = 0; ov <= 1; ov++) {
                        char set[6][64];
                        const char *sets[6];
                        snprintf(set[0], 64, "parallel.pp=%d", pp);
                        snprintf(set[1], 64, "parallel.dp=%d", dp);
                        snprintf(set[2], 64, "parallel.tp=%d", tp);
                        snprintf(set[3], 64, "parallel.zero=%d", z);
                        snprintf(set[4], 64, "parallel.overlap_grad_sync=%s", ov ? "true" : "false");
                        snprintf(set[5], 64, "train.global_batch=%d", 16 * dp);
                        for (int k = 0; k < 6; k++) sets[k] = set[k];
                        ts_config cfg;
                        load_config("configs/tiny.cfg", sets, 6, &cfg);
                        ts_plan_grid g;
                        ts_plan_grid_of(&cfg, &g);
                        /* the same cut on every cluster: GELU's cost may move the balanced one */
                        ts_plan_ctx *x0 = ts_plan_ctx_new(&cfg, &base);
                        ts_plan_result r0, rn, rg, rs, rk;
                        CHECK(ts_plan_predict(x0, &g, &r0, NULL) == TS_OK);
                        const int *cut = ts_plan_partition(x0, &g);
                        cfg.parallel.n_partition = pp;
                        memcpy(cfg.parallel.partition, cut, sizeof(int) * (size_t)pp);
                        const ts_cluster *cls[] = {&none, &gelu, &serial, &keys};
                        ts_plan_result *rs_[] = {&rn, &rg, &rs, &rk};
                        for (int c = 0; c < 4; c++) {
                            ts_plan_ctx *x = ts_plan_ctx_new(&cfg, cls[c]);
                            CHECK(ts_plan_predict(x, &g, rs_[c], NULL) == TS_OK);
                            CHECK(rs_[c]->lower_ms <= rs_[c]->step_ms * (1 + 1e-12));
                            ts_plan_ctx_free(x);
                        }
                        ts_plan_ctx_free(x0);
                        /* absent keys: the same prediction, to the bit */
                        CHECKF(rn.step_ms == r0.step_ms, "pp %d dp %d tp %d: %.9f vs %.9f ms",
                               pp, dp, tp, rn.step_ms, r0.step_ms);
                        /* GELU: each of a rank's layers' m micro-batches adds N x 4C/tp
                         * elements forward and backward at their time, less the memory
                         * pass (8 and 16 bytes per element); with pp = 1 the step is the
                         * rank's work, so the step grows by exactly that */
                        if (pp == 1) {
                            const double el = (double)g.micro_batch * cfg.model.seq_len * 4.0 *
                                              cfg.model.n_embd / tp;
                            const double per = 6e-9 + 8e-9 - 24.0 / base.memory_bandwidth;
                            const double want = g.m * cfg.model.n_layer * el * per * 1e3;
                            CHECKF(ts_rel_err(rg.step_ms - r0.step_ms, want, 1e-9) < 1e-6,
                                   "dp %d tp %d: GELU added %.4f ms, expected %.4f", dp, tp,
                                   rg.step_ms - r0.step_ms, want);
                        }
                        CHECK(rg.step_ms > r0.step_ms);
                        /* no overlap: never faster; with dp, the reduction fully exposed */
                        CHECKF(rs.step_ms >= r0.step_ms * (1 - 1e-12) &&
                                   rk.step_ms >= rg.step_ms * (1 - 1e-12),
                               "pp %d dp %d tp %d zero %d: no overlap %.4f / %.4f ms, overlap "
                               "%.4f / %.4f",
                               pp, dp, tp, z, rs.step_ms, rk.step_ms, r0.step_ms, rg.step_ms);
                        /* (with pp > 1 the busiest rank need not reduce the most) */
                        if (dp > 1)
                            CHECKF(rs.terms.dp_exposed > 0 &&
                                       rs.terms.dp_exposed <= rs.terms.dp_reduction &&
                                       (pp > 1 || ts_rel_err(rs.terms.dp_exposed,
                                                             rs.terms.dp_reduction, 1e-12) < 1e-12),
                                   "dp %d: exposed %.4f of %.4f ms", dp, rs.terms.dp_exposed,
                                   rs.terms.dp_reduction);
                        grids++;
                    }
    printf("optional cluster keys checked on %d grids\n", grids);
}

/* 4. The planner's memory against pipeline/memory.c's for every grid of <= 4 ranks: one
 * rule (ts_memory_rank) fed from two sources, the planner's per-layer tables summed per
 * chunk and the trainer's layout of the rank's layers, which must give the same floats. */
static int g_mem_grids;
static int g_auto_partial; /* recompute = "auto" grids recomputing some, not all */
static int g_auto_selective; /* recompute = "auto" grids with a chunk selective */
static int g_sp_grids;     /* of them, with parallel.sequence_parallel (tp 2 and 4) */
static void compare_memory(const char *cfg_rel, const char *const *extra, int n_extra,
                           const ts_cluster *cl)
{
    for (int pp = 1; pp <= 4; pp++)
        for (int dp = 1; pp * dp <= 4; dp++)
            for (int tp = 1; pp * dp * tp <= 4; tp++)
                for (int s = 0; s < TS_N_SCHEDULES; s++)
                    for (int v = 1; v <= (pp > 1 ? 2 : 1); v++) /* what a schedule refuses: skipped below */
                        for (int rc = 0; rc < TS_N_RECOMPUTES; rc++)
                            for (int zs = 0; zs < (dp > 1 ? 4 : 1) * (tp > 1 ? 2 : 1); zs++) {
                                /* zero 0..3, each without and (tp > 1) with sequence
                                 * parallelism */
                                const int z = zs / (tp > 1 ? 2 : 1), sp = tp > 1 && zs % 2;
                                char set[9][96];
                                const char *sets[16];
                                int n = 0;
                                snprintf(set[0], 96, "parallel.pp=%d", pp);
                                snprintf(set[1], 96, "parallel.dp=%d", dp);
                                snprintf(set[2], 96, "parallel.tp=%d", tp);
                                snprintf(set[3], 96, "parallel.schedule=%s", ts_schedule_names[s]);
                                snprintf(set[4], 96, "parallel.virtual_stages=%d", v);
                                snprintf(set[5], 96, "parallel.recompute=%s", ts_recompute_names[rc]);
                                snprintf(set[6], 96, "parallel.zero=%d", z);
                                snprintf(set[7], 96, "parallel.micro_batch=%d", 2);
                                snprintf(set[8], 96, "parallel.sequence_parallel=%s",
                                         sp ? "true" : "false");
                                for (int k = 0; k < 9; k++) sets[n++] = set[k];
                                for (int k = 0; k < n_extra; k++) sets[n++] = extra[k];
                                ts_config cfg;
                                char p[1200];
                                if (ts_config_load(&cfg, path(cfg_rel, p, sizeof p), sets, n, 0) !=
                                    TS_OK)
                                    continue; /* e.g. fewer micro-batches than interleaving needs */
                                ts_plan_ctx *x = ts_plan_ctx_new(&cfg, cl);
                                ts_plan_grid g;
                                ts_plan_grid_of(&cfg, &g);
                                CHECK(g.sp == sp);
                                ts_plan_result r;
                                if (ts_plan_estimate(x, &g, &r) != TS_OK) {
                                    ts_plan_ctx_free(x);
                                    continue;
                                }
                                /* The trainer's estimate on the planner's cut. */
                                const int *sizes = ts_plan_partition(x, &g);
                                cfg.parallel.n_partition = pp * v;
                                memcpy(cfg.parallel.partition, sizes, sizeof(int) * (size_t)(pp * v));
                                ts_partition part;
                                ts_schedule sc;
                                CHECK(ts_partition_build(&cfg, false, &part) == TS_OK);
                                CHECK(ts_schedule_build(&sc, cfg.parallel.schedule, pp, v,
                                                        ts_config_num_microbatches(&cfg)) == TS_OK);
                                /* auto: the planner's caps and selective chunks against
                                 * the trainer's own choice in the same room, and its
                                 * estimate under that choice; else the trainer's estimate
                                 * of the mode. */
                                int keep[2 * 4] = {0}, mine[2 * 4] = {0}; /* pp * v <= 8 */
                                bool sel[2 * 4] = {0}, mine_sel[2 * 4] = {0};
                                int nr[2 * 4] = {0};
                                const bool autorc = rc == TS_RECOMPUTE_AUTO;
                                ts_rank_memory e;
                                if (autorc) {
                                    ts_plan_recompute_of(x, &g, keep, sel, nr);
                                    int total = 0, n_sel = 0;
                                    for (int c = 0; c < pp * v; c++) {
                                        total += nr[c];
                                        n_sel += sel[c];
                                    }
                                    g_auto_partial += total > 0 && total < pp * v * g.m;
                                    g_auto_selective += n_sel > 0;
                                    double room = cl->memory - TS_BLAS_THREAD_BYTES;
                                    const double mb = cfg.parallel.memory_budget_mb * 1048576.0;
                                    if (mb > 0 && mb < room) room = mb;
                                    ts_memory_estimate_auto_selective(&cfg, &part, &sc, r.mem_rank,
                                                                      1, room, mine, mine_sel, &e);
                                    for (int c = 0; c < pp * v; c++)
                                        if (sc.chunk_rank[c] == r.mem_rank)
                                            CHECKF(keep[c] == mine[c] && sel[c] == mine_sel[c],
                                                   "chunk %d: planner keeps %d%s, trainer %d%s", c,
                                                   keep[c], sel[c] ? " selective" : "", mine[c],
                                                   mine_sel[c] ? " selective" : "");
                                } else
                                    ts_memory_estimate(&cfg, &part, &sc, r.mem_rank, 1, NULL, &e);
                                const ts_rank_memory *mm = &r.mem;
                                const bool ok = ts_rel_err(mm->params, e.params, 1) < 1e-12 &&
                                                ts_rel_err(mm->grads, e.grads, 1) < 1e-12 &&
                                                ts_rel_err(mm->optimizer, e.optimizer, 1) < 1e-12 &&
                                                ts_rel_err(mm->activations, e.activations, 1) < 1e-12 &&
                                                ts_rel_err(mm->buffers, e.buffers, 1) < 1e-12 &&
                                                ts_rel_err(mm->act_sets, e.act_sets, 1) < 1e-12 &&
                                                ts_rel_err(mm->blas, e.blas, 1) < 1e-12 &&
                                                ts_rel_err(mm->chunk_buffers, e.chunk_buffers, 1) < 1e-12 &&
                                                ts_rel_err(mm->total, e.total, 1) < 1e-12;
                                /* ZeRO-2/3 hold chunk buffers, zero 0/1 none */
                                CHECK((mm->chunk_buffers > 0) == (z >= 2 && dp > 1));
                                CHECKF(ok,
                                       "%s pp %d dp %d tp %d%s %s v %d %s zero %d rank %d: planner "
                                       "%.0f/%.0f/%.0f/%.0f/%.0f/%.0f, trainer "
                                       "%.0f/%.0f/%.0f/%.0f/%.0f/%.0f "
                                       "(params/grads/optimizer/activations/buffers/chunk buffers)",
                                       cfg_rel, pp, dp, tp, sp ? " sp" : "", ts_schedule_names[s], v,
                                       ts_recompute_names[rc], z, r.mem_rank, mm->params, mm->grads,
                                       mm->optimizer, mm->activations, mm->buffers,
                                       mm->chunk_buffers, e.params, e.grads, e.optimizer,
                                       e.activations, e.buffers, e.chunk_buffers);
                                g_mem_grids++;
                                g_sp_grids += sp;
                                ts_schedule_free(&sc);
                                ts_partition_free(&part);
                                ts_plan_ctx_free(x);
                            }
}

/* 6. Llama 3 on paper (configs/llama3-*.cfg): the parameter counts of the paper's Table 3
 * shapes (8.03B, 70.6B, 405.9B; from the shapes here, not from the model's formula), the
 * model FLOPs per token 6N + 12 * n_layer * seq_len * n_head * head_dim, and the
 * planner's GEMM work per block and head on an ideal device (efficiency 1): q, k and v of
 * the rank's query and key/value heads (split over tp = 8, one replicated key/value head
 * per rank at tp = 16), o_proj, gate+up and down, attention per query head; one
 * micro-batch's bf16 message; the head's parameters untied (no copy of the embedding). */
static void test_llama3(void)
{
    static const struct {
        const char *cfg, *published;
        int L, C, F, NH;
    } m[] = {{"configs/llama3-8b.cfg", "8.03B", 32, 4096, 14336, 32},
             {"configs/llama3-70b.cfg", "70.6B", 80, 8192, 28672, 64},
             {"configs/llama3-405b.cfg", "405.9B", 126, 16384, 53248, 128}};
    ts_cluster ideal;
    load_cluster("tests/fixtures/plan_cluster_h100.cfg", &ideal);
    ideal.n_eff = 1;
    ideal.eff_n[0] = 1.0;
    ideal.eff[0] = 1.0;
    for (size_t k = 0; k < sizeof m / sizeof *m; k++) {
        ts_config cfg;
        load_config(m[k].cfg, NULL, 0, &cfg);
        const ts_model_config *mc = &cfg.model;
        const double V = 128256, C = m[k].C, F = m[k].F, HS = 128, Q = m[k].NH * HS, KV = 8 * HS;
        const double block = 2 * C + Q * C + 2 * KV * C + C * Q + 3 * F * C;
        const double N = 2 * V * C + m[k].L * block + C; /* embedding, blocks, norm, lm_head */
        const size_t got = ts_model_logical_params(mc);
        char shown[32];
        snprintf(shown, sizeof shown, N < 1e10 ? "%.2fB" : "%.1fB", (double)got / 1e9);
        CHECKF((double)got == N && !strcmp(shown, m[k].published),
               "%s: %zu parameters (%s), want %.0f (%s)", m[k].cfg, got, shown, N,
               m[k].published);
        CHECKF(mc->n_layer == m[k].L && mc->n_head == m[k].NH && ts_model_kv_heads(mc) == 8 &&
                   ts_model_ffn(mc) == m[k].F && mc->vocab_size == 128256 &&
                   mc->seq_len == 8192 && !ts_model_tied(mc),
               "%s: not the paper's shape", m[k].cfg);
        const double T = mc->seq_len, tokens = cfg.train.global_batch * T;
        /* Megatron's count: the untied input embedding is a lookup (its lm_head counts). */
        const double per_token = 6.0 * (N - V * C) + 12.0 * m[k].L * T * Q;
        CHECKF(ts_rel_err(ts_plan_model_flops(mc, cfg.train.global_batch), per_token * tokens,
                          1) < 1e-12,
               "%s: model FLOPs %.6g per step, want (6(N - VC) + 12 L T C) x tokens = %.6g",
               m[k].cfg,
               ts_plan_model_flops(mc, cfg.train.global_batch), per_token * tokens);
        if (k != 2) continue;
        for (int tp = 8; tp <= 16; tp *= 2) {
            ts_plan_layers L;
            /* The CPU's layout (the batched-GEMM attention's probabilities), as a run
             * on train.device = "cpu" keeps them, and the CPU kernels' causal blocks (the
             * key blocks above the diagonal skipped; bf16's blocks of 64 key positions,
             * this cluster's dtype: per query block [64(b-1), 64b), 64b keys; sum T^2/2 +
             * 32T); the flash layout below. */
            ts_config cpu = cfg;
            snprintf(cpu.train.device, sizeof cpu.train.device, "cpu");
            snprintf(cpu.train.attention, sizeof cpu.train.attention, "gemm");
            ts_plan_layers_build(&L, mc, &ideal, ts_plan_kernels(&cpu, &ideal), tp, false, 1, 1,
                                 ideal.intra, 1, ideal.intra);
            const double kvl = tp <= 8 ? 8.0 / tp : 1.0, hl = m[k].NH / tp, Tk = T;
            const double gemm = 2 * T * ((hl + 2 * kvl) * HS * C + C * hl * HS + 3 * F / tp * C) +
                                4 * hl * (Tk * Tk / 2 + 32 * Tk) * HS;
            const double peak = ts_cluster_peak(&ideal);
            CHECKF(ts_rel_err(L.f_gemm[1] * peak, gemm, 1) < 1e-9,
                   "405B tp %d: block forward GEMMs %.6g FLOP, want %.6g", tp, L.f_gemm[1] * peak,
                   gemm);
            double vl = ceil(V / tp);
            CHECKF(ts_rel_err(L.f_gemm[L.n_layers - 1] * peak, 2 * T * vl * C, 1) < 1e-9,
                   "405B tp %d: head GEMM %.6g FLOP, want %.6g", tp,
                   L.f_gemm[L.n_layers - 1] * peak, 2 * T * vl * C);
            CHECKF(L.msg_bytes == T * C * 2 && L.wte_floats == 0.0,
                   "405B tp %d: message %.0f bytes (want bf16 %.0f), tied copy %.0f floats", tp,
                   L.msg_bytes, T * C * 2, L.wte_floats);
            /* Parameters as laid out: the rank's share of the block (k/v split or one
             * replicated head each) and of the vocabulary, padded to 16 floats. */
            const double blk = 2 * C + (hl + 2 * kvl) * HS * C + C * hl * HS + 3 * F / tp * C;
            CHECKF(L.param_floats[1] >= blk && L.param_floats[1] < blk + 16 * 16,
                   "405B tp %d: block parameters %.0f floats, want %.0f", tp, L.param_floats[1],
                   blk);
            CHECKF(L.param_floats[L.n_layers - 1] >= vl * C + C &&
                       L.param_floats[L.n_layers - 1] < vl * C + C + 64,
                   "405B tp %d: head parameters %.0f floats, want %.0f", tp,
                   L.param_floats[L.n_layers - 1], vl * C + C);
            /* The same layers laid out for a GPU run with the flash kernel (train.device =
             * "cuda", train.attention = "flash"; the layout-only table in a CPU-only
             * build): each block keeps one fp32 log-sum-exp per row of its hl heads in
             * place of the bf16 [hl, T, T] probabilities; parameters do not change. */
            ts_config gpu = cfg; /* the file's own: "cuda", "flash" */
            snprintf(gpu.train.device, sizeof gpu.train.device, "cuda");
            snprintf(gpu.train.attention, sizeof gpu.train.attention, "flash");
            const ts_kernels *kf = ts_plan_kernels(&gpu, &ideal);
            CHECK(ts_plan_kernels(&cfg, &ideal) == kf);
            CHECK(!strcmp(kf->device, "cuda") && !strcmp(kf->attention, "flash") &&
                  kf->act_dtype == TS_DTYPE_BF16 && kf->weight_copy_bytes == 2);
            ts_plan_layers Lf;
            ts_plan_layers_build(&Lf, mc, &ideal, kf, tp, false, 1, 1, ideal.intra, 1,
                                 ideal.intra);
            const double saved = hl * Tk * Tk * 2 - hl * Tk * 4;
            CHECKF(L.act_bytes[1] - Lf.act_bytes[1] == saved &&
                       Lf.param_floats[1] == L.param_floats[1],
                   "405B tp %d: flash block keeps %.0f bytes, gemm %.0f: want %.0f fewer", tp,
                   Lf.act_bytes[1], L.act_bytes[1], saved);
            ts_plan_layers_free(&Lf);
            ts_plan_layers_free(&L);
        }
    }
}

/* 7b. Packed documents (model_cost.h; tessera plan --doc-len): a window of T = 4096 in
 * documents of 512 tokens attends 8 * 512 * 513 / 2 (query, key) pairs where one
 * document attends 4096 * 4097 / 2: MFU's attention FLOPs fall by exactly that ratio,
 * its 6 * parameters * tokens do not move. The CPU tables' attention GEMMs start each
 * query block at the key block holding its document's start (bf16's blocks of 64 here,
 * 512 a multiple: per document 8 query blocks of 64 rows against 64 j keys), the CUDA
 * tables' batched GEMMs compute the whole square either way. Through the predictor:
 * MFU x step time (the FLOPs over a constant) falls by the FLOPs' ratio. */
static void test_documents(void)
{
    /* the pairs, counted here query by query */
    static const struct { int T, L; } w[] = {{4096, 512}, {4096, 0}, {4096, 5000}, {100, 30},
                                               {100, 100}, {7, 1}, {64, 63}};
    for (size_t c = 0; c < sizeof w / sizeof *w; c++) {
        double want = 0.0;
        for (int t = 0; t < w[c].T; t++) {
            const int start = w[c].L > 0 ? t - t % w[c].L : 0;
            want += t - start + 1;
        }
        CHECKF(ts_plan_doc_pairs(w[c].T, w[c].L) == want,
               "pairs of T %d, documents of %d: %.0f, want %.0f", w[c].T, w[c].L,
               ts_plan_doc_pairs(w[c].T, w[c].L), want);
    }
    const char *sets[] = {"model.seq_len=4096", "train.global_batch=8", "parallel.micro_batch=1",
                          "train.device=\"cpu\"", "train.attention=\"gemm\""};
    ts_config cfg;
    load_config("configs/gpt2-124m.cfg", sets, 5, &cfg);
    const ts_model_config *mc = &cfg.model;
    const double T = 4096, L = 512, gb = 8, tokens = gb * T;
    const double ratio = (T / L) * L * (L + 1) / (T * (T + 1)); /* 0.12512... */
    const double dense = 6.0 * (ts_plan_flops_params(mc) + ts_plan_mtp_flops_params(mc)) * tokens;
    const double att_doc = ts_plan_model_flops_docs(mc, 8, 512) - dense;
    const double att_one = ts_plan_model_flops_docs(mc, 8, 4096) - dense;
    CHECKF(ts_rel_err(att_doc / att_one, ratio, 1) < 1e-12,
           "documents of 512 in 4096: attention FLOPs x %.9f of one document's, want x %.9f",
           att_doc / att_one, ratio);
    /* 12 n_layer n_embd per pair (gpt2-124m: 12 x 12 x 768), per sequence */
    CHECKF(ts_rel_err(att_one, 12.0 * 12 * 768 * gb * T * (T + 1) / 2, 1) < 1e-12,
           "one document per window: attention FLOPs %.6g", att_one);
    CHECK(ts_plan_model_flops_docs(mc, 8, 0) == ts_plan_model_flops(mc, 8));
    CHECKF(ts_rel_err(ts_plan_model_flops(mc, 8) - dense, 12.0 * 12 * 768 * gb * T * T, 1) <
               1e-12,
           "no documents: the square, %.6g", ts_plan_model_flops(mc, 8) - dense);

    ts_cluster ideal;
    load_cluster("tests/fixtures/plan_cluster_h100.cfg", &ideal);
    ideal.n_eff = 1;
    ideal.eff_n[0] = 1.0;
    ideal.eff[0] = 1.0;
    const double peak = ts_cluster_peak(&ideal), HS = 64, NH = 12;
    const ts_kernels *k = ts_plan_kernels(&cfg, &ideal);
    const int blk = k->act_dtype == TS_DTYPE_BF16 ? 64 : 32;
    ts_plan_layers none, docs;
    ts_plan_layers_build_sized(&none, mc, &ideal, k, 1, false, 1, 1, ideal.intra, 1, ideal.intra,
                               NULL, NULL, 0);
    ts_plan_layers_build_sized(&docs, mc, &ideal, k, 1, false, 1, 1, ideal.intra, 1, ideal.intra,
                               NULL, NULL, 512);
    /* the score entries each kernel computes: causal blocks [blk(b-1), blk b) x blk b keys;
     * with documents, keys from the document's start */
    double area_none = 0.0, area_docs = 0.0;
    for (int b = 1; b <= 4096 / blk; b++) {
        area_none += (double)blk * blk * b;
        area_docs += (double)blk * (blk * b - (blk * (b - 1)) / 512 * 512);
    }
    const double d_att = 4.0 * NH * HS * (area_docs - area_none); /* q.k and p.v, 2 each */
    CHECKF(ts_rel_err((docs.f_gemm[1] - none.f_gemm[1]) * peak, d_att, 1) < 1e-9,
           "CPU table, documents of 512: block forward GEMMs change by %.6g FLOP, want %.6g",
           (docs.f_gemm[1] - none.f_gemm[1]) * peak, d_att);
    CHECK(docs.f_gemm[0] == none.f_gemm[0] && docs.act_bytes[1] == none.act_bytes[1]);
    ts_plan_layers_free(&docs);
    ts_plan_layers_free(&none);
    /* the CUDA tables: the whole square with documents too */
    ts_config gpu = cfg;
    snprintf(gpu.train.device, sizeof gpu.train.device, "cuda");
    const ts_kernels *kg = ts_plan_kernels(&gpu, &ideal);
    ts_plan_layers_build_sized(&none, mc, &ideal, kg, 1, false, 1, 1, ideal.intra, 1, ideal.intra,
                               NULL, NULL, 0);
    ts_plan_layers_build_sized(&docs, mc, &ideal, kg, 1, false, 1, 1, ideal.intra, 1,
                               ideal.intra, NULL, NULL, 512);
    CHECK(docs.f_gemm[1] == none.f_gemm[1] && docs.f[1] == none.f[1]);
    ts_plan_layers_free(&docs);
    ts_plan_layers_free(&none);

    /* the predictor: MFU counts the documents' FLOPs, the CPU step is shorter */
    ts_plan_grid g;
    ts_plan_grid_of(&cfg, &g);
    ts_plan_result r0, r1;
    ts_plan_ctx *x0 = ts_plan_ctx_new(&cfg, &ideal), *x1 = ts_plan_ctx_new(&cfg, &ideal);
    ts_plan_ctx_set_documents(x1, 512);
    CHECK(ts_plan_predict(x0, &g, &r0, NULL) == TS_OK);
    CHECK(ts_plan_predict(x1, &g, &r1, NULL) == TS_OK);
    const double flops_ratio = ts_plan_model_flops_docs(mc, 8, 512) / ts_plan_model_flops(mc, 8);
    CHECKF(ts_rel_err(r1.mfu * r1.step_ms / (r0.mfu * r0.step_ms), flops_ratio, 1) < 1e-9,
           "predicted MFU x step: x %.9f with documents, want the FLOPs' x %.9f",
           r1.mfu * r1.step_ms / (r0.mfu * r0.step_ms), flops_ratio);
    CHECKF(r1.step_ms < r0.step_ms, "documents of 512 on the CPU table: step %.3f ms, none %.3f ms",
           r1.step_ms, r0.step_ms);
    ts_plan_ctx_free(x0);
    ts_plan_ctx_free(x1);
}

/* 7. Sequence parallelism's costs (model_cost.h): a block's forward moves what its two
 * all-reduces did (reduce-scatter + all-gather pairs), its backward 1.5 times (the
 * norms gathered again), a split W 2 more gathers; the embedding's sum a
 * reduce-scatter and its backward a gather; the head one gather more forward, the same
 * backward; messages and the norms' elementwise work / tp, the GEMMs and parameters
 * unchanged, fewer activation bytes. Then a search where activation memory decides:
 * the best grid is sequence parallel and faster than the best without. */
static void test_sequence_parallel(void)
{
    ts_config cfg;
    load_config("configs/gpt2-124m.cfg", NULL, 0, &cfg);
    ts_cluster cl;
    load_cluster("tests/fixtures/plan_cluster_h100.cfg", &cl);
    const ts_kernels *k = ts_plan_kernels(&cfg, &cl);
    const double NC = 2.0 * cfg.model.seq_len * cfg.model.n_embd * ts_dtype_bytes(k->act_dtype);
    for (int tp = 2; tp <= 4; tp *= 2) {
        ts_plan_layers a, b;
        ts_plan_layers_build(&a, &cfg.model, &cl, k, tp, false, 1, 2, cl.intra, 1, cl.intra);
        ts_plan_layers_build(&b, &cfg.model, &cl, k, tp, true, 1, 2, cl.intra, 1, cl.intra);
        const int h = a.n_layers - 1;
        const double ar = ts_plan_allreduce_time(NC, tp, cl.intra);
        const double ag = ts_plan_allgather_time(NC, tp, cl.intra);
        CHECK(ts_rel_err(2 * ag, ar, 0) < 1e-12);
        CHECKF(ts_rel_err(b.f_tp[1], a.f_tp[1], 0) < 1e-12 &&
                   ts_rel_err(b.i_tp[1], 1.5 * a.i_tp[1], 0) < 1e-12 &&
                   ts_rel_err(b.w_split_tp[1], 2 * ag, 0) < 1e-12 && a.w_split_tp[1] == 0,
               "tp %d: block tp %.4g/%.4g/%.4g ms with sp, %.4g/%.4g without", tp,
               b.f_tp[1] * 1e3, b.i_tp[1] * 1e3, b.w_split_tp[1] * 1e3, a.f_tp[1] * 1e3,
               a.i_tp[1] * 1e3);
        CHECK(ts_rel_err(b.f_tp[0], ag, 0) < 1e-12 && ts_rel_err(b.i_tp[0], ag, 0) < 1e-12 &&
              a.i_tp[0] == 0 && ts_rel_err(a.f_tp[0], ar, 0) < 1e-12);
        CHECK(ts_rel_err(b.f_tp[h] - a.f_tp[h], ag, 0) < 1e-9 &&
              ts_rel_err(b.i_tp[h], a.i_tp[h], 0) < 1e-12 && b.w_split_tp[h] == ag);
        CHECK(b.msg_bytes * tp == a.msg_bytes && b.f_gemm[1] == a.f_gemm[1] &&
              b.b_gemm[1] == a.b_gemm[1] && b.param_floats[1] == a.param_floats[1]);
        CHECK(b.f[1] - b.f_tp[1] < a.f[1] - a.f_tp[1] && b.act_bytes[1] < a.act_bytes[1] &&
              b.act_bytes[0] * tp == a.act_bytes[0]);
        ts_plan_layers_free(&a);
        ts_plan_layers_free(&b);
    }
    /* tp_overlap 2 and 4 on tp 2: the block's exposed collectives are c/S plus what the
     * compute g cannot hide, max(0, c - g)(S - 1)/S; its GEMMs are priced at the
     * sub-batch's rows; with communication on the compute cores nothing is hidden. */
    for (int S = 2; S <= 4; S *= 2) {
        ts_plan_layers a, b;
        ts_plan_layers_build(&a, &cfg.model, &cl, k, 2, true, 1, 4, cl.intra, 1, cl.intra);
        ts_plan_layers_build(&b, &cfg.model, &cl, k, 2, true, S, 4, cl.intra, 1, cl.intra);
        const double c = a.f_tp[1], g = b.f_gemm[1], ci = a.i_tp[1], gi = b.b_gemm[1];
        const double want = c / S + (c > g ? (c - g) * (S - 1) / S : 0.0);
        const double want_i = ci / S + (ci > gi ? (ci - gi) * (S - 1) / S : 0.0);
        CHECKF(ts_rel_err(b.f_tp[1], want, 0) < 1e-12 && ts_rel_err(b.i_tp[1], want_i, 0) < 1e-12 &&
                   b.f_tp[1] < a.f_tp[1] && b.f_gemm[1] >= a.f_gemm[1] && b.f_tp[0] == a.f_tp[0],
               "tp_overlap %d: block tp %.4g ms (want %.4g) against %.4g; gemm %.4g vs %.4g", S,
               b.f_tp[1] * 1e3, want * 1e3, a.f_tp[1] * 1e3, b.f_gemm[1] * 1e3, a.f_gemm[1] * 1e3);
        ts_plan_layers_free(&b);
        ts_cluster serial = cl;
        serial.comm_on_compute = true;
        ts_plan_layers_build(&b, &cfg.model, &serial, k, 2, true, S, 4, serial.intra, 1,
                             serial.intra);
        CHECK(b.f_tp[1] == a.f_tp[1] && b.i_tp[1] == a.i_tp[1]);
        ts_plan_layers_free(&a);
        ts_plan_layers_free(&b);
    }
    /* GPT-3 13B on 16 devices of 80 GB: the grids that keep their activations need sp.
     * (seq_len 2046: 2 divides it, 4 not, so no context parallelism, which at 2048 wins
     * with cp 2 instead: test_context_parallel.) On the GPUs' kernels (device cuda):
     * the CPU's causal blocks halve attention's work, and tp 1 then wins by 0.4%. */
    const char *sets[] = {"train.global_batch=32", "model.seq_len=2046", "train.device=\"cuda\""};
    load_config("configs/gpt3-13b.cfg", sets, 3, &cfg);
    ts_plan_ctx *x = ts_plan_ctx_new(&cfg, &cl);
    ts_search_opts o = {.gpus = 16, .top = 200};
    ts_search_result r;
    CHECK(ts_plan_search(x, &o, &r) == TS_OK);
    int best_off = -1;
    for (int j = 0; j < r.n_top && best_off < 0; j++)
        if (!r.top[j].g.sp) best_off = j;
    CHECKF(r.n_top > 0 && r.top[0].g.sp && r.top[0].g.tp > 1 &&
               (best_off < 0 || r.top[best_off].step_ms > r.top[0].step_ms),
           "sp search: best tp %d sp %d %.3f ms (%s); best without sp #%d", r.top[0].g.tp,
           r.top[0].g.sp, r.top[0].step_ms, ts_recompute_names[r.top[0].g.recompute], best_off);
    printf("sequence parallel search: best pp %d dp %d tp %d sp %s %.3f ms, recompute %s; "
           "best without sp at #%d\n",
           r.top[0].g.pp, r.top[0].g.dp, r.top[0].g.tp, r.top[0].g.sp ? "on" : "off",
           r.top[0].step_ms, ts_recompute_names[r.top[0].g.recompute], best_off + 1);
    ts_search_result_free(&r);
    ts_plan_ctx_free(x);
}

/* 8. Context parallelism (model_cost.h, predict.h): a block's K/V exchange is a ring
 * all-gather of [B, T, 2 kvl HS] bf16 values over cp ranks forward and the same
 * reduce-scatter backward, on the link of tp * cp consecutive ranks; every GEMM at
 * T / cp rows and attention the two chunks' prefix rectangles c x (j+1)c (exact FLOPs
 * on an ideal device), so the block's compute falls with cp; messages / cp; cp = 1 is
 * the model without it to the bit. Then Llama 3 405B's long-context grid (seq 131072,
 * tp 8, cp 16, pp 16, dp 4, 128 sequences) in a plausible band, a seq_len that 2cp
 * does not divide refused, and the 16,384-GPU search at 131072 picking cp > 1. */
static void test_context_parallel(void)
{
    const char *sets[] = {"model.seq_len=131072", "train.global_batch=128"};
    const char *long8b[] = {"model.seq_len=131072", "train.global_batch=128",
                            "train.device=\"cuda\"", "train.attention=\"flash\""};
    ts_config cfg;
    load_config("configs/llama3-405b.cfg", sets, 2, &cfg);
    const ts_model_config *mc = &cfg.model;
    ts_cluster cl, ideal;
    load_cluster("configs/clusters/dgx-h100.cfg", &cl);
    ideal = cl;
    ideal.n_eff = 1;
    ideal.eff_n[0] = 1.0;
    ideal.eff[0] = 1.0;
    const ts_kernels *k = ts_plan_kernels(&cfg, &cl);
    const double T = mc->seq_len, C = mc->n_embd, HS = 128, F = ts_model_ffn(mc), tp = 8;
    const double hl = mc->n_head / tp, kvl = 1.0, ab = 2.0;
    ts_plan_layers base, plain;
    ts_plan_layers_build(&base, mc, &ideal, k, 8, false, 1, 1, ideal.intra, 1, ideal.inter);
    ts_plan_layers_build(&plain, mc, &ideal, k, 8, false, 1, 1, ideal.intra, 1, ideal.intra);
    CHECK(plain.f[1] == base.f[1] && plain.i[1] == base.i[1] && plain.msg_bytes == base.msg_bytes);
    ts_plan_layers_free(&plain);
    double prev = -1.0;
    for (int cp = 1; cp <= 32; cp *= 2) {
        ts_plan_layers L;
        ts_plan_layers_build(&L, mc, &ideal, k, 8, false, 1, 1, ideal.intra, cp, ideal.inter);
        const double peak = ts_cluster_peak(&ideal), N = T / cp, c = T / (2 * cp);
        /* the exchange: (cp-1)/cp of the gathered bytes / bandwidth + (cp-1) latencies */
        const double bytes = 1 * T * 2 * kvl * HS * ab;
        const double want = cp == 1 ? 0.0
                                    : (cp - 1.0) / cp * bytes / ideal.inter.bandwidth +
                                          (cp - 1.0) * ideal.inter.latency;
        CHECKF(ts_rel_err(L.f_cp[1], want, 1e-30) < 1e-12 && L.i_cp[1] == L.f_cp[1] &&
                   L.f_cp[0] == 0.0 && L.f_cp[L.n_layers - 1] == 0.0 &&
                   ts_rel_err(ts_plan_cp_exchange_time(mc, 8, cp, 1, ab, ideal.inter), want,
                              1e-30) < 1e-12,
               "cp %d: exchange %.6g s, want %.6g", cp, L.f_cp[1], want);
        /* GEMM FLOPs per block forward: the linears at N rows, attention's rectangles */
        const double lin = 2 * N * ((hl + 2 * kvl) * HS * C + C * hl * HS + 3 * F / tp * C);
        const double att = cp == 1 ? 4 * hl * T * T * HS : 4 * hl * HS * c * c * (2 * cp + 1);
        CHECKF(ts_rel_err(L.f_gemm[1] * peak, lin + att, 1) < 1e-9,
               "cp %d: block GEMMs %.6g FLOP, want %.6g", cp, L.f_gemm[1] * peak, lin + att);
        CHECKF(prev < 0 || L.f[1] - L.f_cp[1] < prev, "cp %d: block compute %.6g s not below %.6g",
               cp, L.f[1] - L.f_cp[1], prev);
        prev = L.f[1] - L.f_cp[1];
        CHECK(ts_rel_err(L.msg_bytes * cp, base.msg_bytes, 0) < 1e-12 &&
              L.param_floats[1] == base.param_floats[1]);
        if (cp == 1)
            CHECK(L.f[1] == base.f[1] && L.i[1] == base.i[1] && L.act_bytes[1] == base.act_bytes[1]);
        ts_plan_layers_free(&L);
    }
    ts_plan_layers_free(&base);
    /* The CPU kernels' rule is one for every cp: the key blocks above the diagonal
     * skipped, at cp 1 as on a cp rank's prefix rectangles. Tiny at 4096 in bf16 (the
     * cluster's dtype; blocks of 64): cp 1 computes T^2/2 + 32T scores a head, a cp 2
     * rank c^2/2 + 32c + (3c^2 + c^2/2 + 32c) = T^2/4 + 16T, half (c = T/4); with the
     * linears at half the rows the block's GEMMs halve. */
    {
        const char *t4k[] = {"model.seq_len=4096"};
        ts_config tc;
        load_config("configs/tiny.cfg", t4k, 1, &tc);
        const ts_kernels *kc = ts_plan_kernels(&tc, &ideal);
        ts_plan_layers one, two;
        ts_plan_layers_build(&one, &tc.model, &ideal, kc, 1, false, 1, 1, ideal.intra, 1,
                                ideal.intra);
        ts_plan_layers_build(&two, &tc.model, &ideal, kc, 1, false, 1, 1, ideal.intra, 2,
                                ideal.intra);
        const double t4 = 4096, hs4 = 32, h4 = 4, c4 = 128;
        const double lin4 = 2 * t4 * (3 * c4 * c4 + c4 * c4 + 8 * c4 * c4);
        const double want1 = lin4 + 4 * h4 * hs4 * (t4 * t4 / 2 + 32 * t4);
        CHECKF(ts_rel_err(one.f_gemm[1] * ts_cluster_peak(&ideal), want1, 1) < 1e-9 &&
                   ts_rel_err(two.f_gemm[1], one.f_gemm[1] / 2, 1e-30) < 1e-12 &&
                   ts_rel_err(two.b_gemm[1], one.b_gemm[1] / 2, 1e-30) < 1e-12,
               "CPU causal blocks: cp 1 block GEMMs %.6g FLOP (want %.6g), cp 2 %.6g (want half)",
               one.f_gemm[1] * ts_cluster_peak(&ideal), want1,
               two.f_gemm[1] * ts_cluster_peak(&ideal));
        ts_plan_layers_free(&one);
        ts_plan_layers_free(&two);
    }
    /* The link: tp * cp consecutive ranks inside a node of 8, else between nodes. */
    ts_plan_grid g = {.pp = 1, .dp = 1, .tp = 2, .cp = 4};
    CHECK(ts_plan_cp_link(&cl, &g).bandwidth == cl.intra.bandwidth);
    g.cp = 8;
    CHECK(ts_plan_cp_link(&cl, &g).bandwidth == cl.inter.bandwidth &&
          ts_plan_dp_link(&cl, &g).bandwidth == cl.inter.bandwidth);

    /* Meta's long-context grid: tp 8, cp 16, pp 16, dp 4 (the product is 8,192 devices),
     * sequence parallel, recompute auto, interleaved v 4; 128 sequences: 32 per replica.
     * Its time is plausible; its memory is not asked to fit: Tessera's CUDA prefix
     * attention is the batched-GEMM one (no flash prefix kernel yet), which keeps each
     * chunk's [c, (j+1)c] probabilities per head, over 80 GB at cp 16 (bench/RESULTS.md
     * 4.4's long-context addendum). */
    const char *meta[] = {"model.seq_len=131072", "train.global_batch=128", "parallel.dp=4",
                          "parallel.cp=16", "parallel.sequence_parallel=true",
                          "parallel.recompute=\"auto\"", "parallel.schedule=\"interleaved-1f1b\"",
                          "parallel.virtual_stages=4"};
    load_config("configs/llama3-405b.cfg", meta, 8, &cfg);
    ts_plan_grid_of(&cfg, &g);
    ts_plan_ctx *x = ts_plan_ctx_new(&cfg, &cl);
    ts_plan_result r;
    CHECK(ts_plan_predict(x, &g, &r, NULL) == TS_OK);
    CHECKF(g.cp == 16 && g.m == 32 && r.mfu > 0.20 && r.mfu < 0.60 &&
               r.terms.cp_comm > 0 && r.terms.cp_comm < r.terms.compute,
           "405B long context: cp %d m %d fits %d MFU %.3f, cp %.1f ms of compute %.1f", g.cp,
           g.m, r.fits, r.mfu, r.terms.cp_comm, r.terms.compute);
    printf("405B at 131072 on tp 8 x cp 16 x pp 16 x dp 4: %.2f s, MFU %.1f%% (paper 38%%), "
           "%.1f GB (%s)\n",
           r.step_ms / 1e3, 100 * r.mfu, r.mem.total / 1e9, r.fits ? "fits" : "does not fit");
    ts_plan_ctx_free(x);

    /* A seq_len that 2cp does not divide: the config is refused, the search never
     * proposes it. */
    const char *bad[] = {"model.seq_len=1000", "parallel.cp=8"};
    char pth[1200];
    CHECK(ts_config_load_plan(&cfg, path("configs/gpt2-124m.cfg", pth, sizeof pth), bad, 2) != TS_OK);
    ts_error_clear();
    /* One sequence per step on 16 devices (dp 1): pp * cp * tp = 16 grids only, cp 2
     * and 4 at seq_len 1000 (8 divides it, 16 not), cp 8 too at 1024. */
    ts_search_result sr;
    for (int sl = 1000; sl <= 1024; sl += 24) {
        char seq[64];
        snprintf(seq, sizeof seq, "model.seq_len=%d", sl);
        const char *odd[] = {seq, "train.global_batch=1", "parallel.micro_batch=1"};
        load_config("configs/gpt2-124m.cfg", odd, 3, &cfg);
        x = ts_plan_ctx_new(&cfg, &cl);
        ts_search_opts all = {.gpus = 16, .top = 1000, .exhaustive = true};
        CHECK(ts_plan_search(x, &all, &sr) == TS_OK);
        int seen = 0, wrong = 0; /* bit cp: a cp seen */
        for (int j = 0; j < sr.n_top; j++) {
            const int cp = ts_plan_grid_cp(&sr.top[j].g);
            seen |= cp;
            wrong += sl % (2 * cp) != 0 || (cp & (cp - 1)) != 0;
        }
        const int want = sl == 1000 ? 2 | 4 : 2 | 4 | 8; /* (16's grids rank below 1000) */
        CHECKF(wrong == 0 && (seen & want) == want && (sl != 1000 || (seen & ~7) == 0), "seq %d search: cp seen 0x%x (want 0x%x), %d "
               "not dividing", sl, seen & ~1, want, wrong);
        ts_search_result_free(&sr);
        ts_plan_ctx_free(x);
    }
    /* GPT-3 13B at 2048 on 16 devices: context parallelism wins (no such grid at 2046,
     * test_sequence_parallel). */
    const char *b13[] = {"train.global_batch=32"};
    load_config("configs/gpt3-13b.cfg", b13, 1, &cfg);
    ts_cluster fx;
    load_cluster("tests/fixtures/plan_cluster_h100.cfg", &fx);
    x = ts_plan_ctx_new(&cfg, &fx);
    ts_search_opts o13 = {.gpus = 16, .top = 10};
    CHECK(ts_plan_search(x, &o13, &sr) == TS_OK);
    CHECKF(sr.n_top > 0 && sr.top[0].g.cp > 1, "13B at 2048: best cp %d", sr.top[0].g.cp);
    ts_search_result_free(&sr);
    ts_plan_ctx_free(x);

    /* At 131072 the search's best splits the sequence: Llama 3 8B on 256 GPUs (1.6 s in
     * a release build; 405B on 16,384, RESULTS 4.4's addendum, takes about 25 times as
     * long for the same property). */
    load_config("configs/llama3-8b.cfg", long8b, 4, &cfg);
    x = ts_plan_ctx_new(&cfg, &cl);
    ts_search_opts o = {.gpus = 256, .top = 1};
    CHECK(ts_plan_search(x, &o, &sr) == TS_OK);
    CHECKF(sr.n_top == 1 && sr.top[0].g.cp > 1 && sr.top[0].mfu > 0.2 && sr.top[0].mfu < 0.6,
           "8B 131072 search: best cp %d, MFU %.3f", sr.n_top ? sr.top[0].g.cp : 0,
           sr.n_top ? sr.top[0].mfu : 0.0);
    if (sr.n_top)
        printf("8B at 131072 on 256 GPUs: best pp %d dp %d cp %d tp %d, MFU %.1f%%\n",
               sr.top[0].g.pp, sr.top[0].g.dp, sr.top[0].g.cp, sr.top[0].g.tp, 100 * sr.top[0].mfu);
    ts_search_result_free(&sr);
    ts_plan_ctx_free(x);
}


/* 9. Mixture of Experts (plan/moe_cost.h). The expert phase's FLOPs and bytes by hand on a
 * small config with an ideal device (efficiency 1): the router (N, E, C), the rank's E/ep
 * experts over R k etp ep / E rows each on their F/etp slice (x imbalance), the shared
 * experts; the exchange's bytes R k C (ep-1)/ep and its time on NVLink inside a node and
 * on the network across; the etp gather; the shared experts hiding the exchange. Then
 * the layer tables (an MoE block's backward all in I; the model FLOPs of the active
 * parameters) and a search whose every grid the trainer's rules accept. */
static const char *const k_moe_sets[] = {
    "model.moe_experts=8", "model.moe_top_k=2", "model.moe_ffn_hidden=64",
    "model.moe_shared_experts=1", "model.moe_first_dense=1"};
#define N_MOE_SETS 5

static void test_moe_formulas(void)
{
    ts_config cfg;
    load_config("configs/llama-tiny.cfg", k_moe_sets, N_MOE_SETS, &cfg);
    const ts_model_config *mc = &cfg.model;
    ts_cluster cl;
    load_cluster("tests/fixtures/plan_cluster_h100.cfg", &cl);
    cl.n_eff = 1;
    cl.eff_n[0] = 1.0;
    cl.eff[0] = 1.0;
    const double peak = ts_cluster_peak(&cl), C = mc->n_embd, E = 8, K = 2, F = 64, ab = 2.0;
    /* ts_plan_ep_in_node: ep 8 at stride etp 1 on 8-GPU nodes is all on one; at stride 2
     * half; ep 16 half; ep 4 at stride 4 two of four. */
    CHECK(ts_plan_ep_in_node(8, 1, 8) == 8 && ts_plan_ep_in_node(8, 2, 8) == 4 &&
          ts_plan_ep_in_node(16, 1, 8) == 8 && ts_plan_ep_in_node(4, 4, 8) == 2 &&
          ts_plan_ep_in_node(2, 8, 8) == 1 && ts_plan_ep_in_node(1, 1, 8) == 1);
    static const struct {
        int ep, etp, tp, in_node;
        bool sp;
        double imbalance;
    } k_cases[] = {{1, 1, 1, 1, false, 1.0}, {2, 1, 1, 2, false, 1.0}, {4, 2, 1, 2, false, 1.5},
                   {2, 1, 2, 2, false, 1.0}, {2, 2, 2, 1, true, 1.0}, {8, 1, 1, 8, false, 1.0},
                   {1, 2, 1, 1, false, 2.0}}; /* ep 1: one rank does every row, imbalanced or not */
    for (size_t c = 0; c < sizeof k_cases / sizeof *k_cases; c++) {
        const int ep = k_cases[c].ep, etp = k_cases[c].etp, tp = k_cases[c].tp;
        const bool sp = k_cases[c].sp;
        const double N = 2 * 64.0, imb = ep > 1 ? k_cases[c].imbalance : 1.0;
        const ts_plan_moe moe = {.ep = ep, .etp = etp, .ep_in_node = k_cases[c].in_node,
                                 .etp_link = cl.intra, .imbalance = k_cases[c].imbalance,
                                 .hide_shared = true};
        ts_plan_moe_block b;
        ts_plan_moe_block_cost(mc, &cl, &moe, N, tp, sp, cl.intra, ab, &b);
        /* The rows: the router's and the shared experts' (N / tp under sp, else all N),
         * the ones sent (a tp share under ep or etp without sp). */
        const double Nr = sp ? N / tp : N, R = (ep > 1 || etp > 1) && tp > 1 && !sp ? N / tp : Nr;
        const double rows = R * K * etp * ep / E;
        CHECKF(ts_rel_err(b.rows_per_expert, rows, 1) < 1e-12, "case %zu: %g rows per expert, want %g",
               c, b.rows_per_expert, rows);
        CHECKF(ts_rel_err(b.router_f * peak, 2 * Nr * E * C, 1) < 1e-12 &&
                   ts_rel_err(b.router_b, 2 * b.router_f, 1) < 1e-12,
               "case %zu: router %g FLOP", c, b.router_f * peak);
        const double xf = imb * (E / ep) * (2 * rows * (2 * F / etp) * C + 2 * rows * C * (F / etp));
        CHECKF(ts_rel_err(b.experts_f * peak, xf, 1) < 1e-12 &&
                   ts_rel_err(b.experts_b, 2 * b.experts_f, 1) < 1e-12,
               "case %zu: experts %g FLOP, want %g", c, b.experts_f * peak, xf);
        /* Without imbalance every rank's experts do the active FLOPs of its rows: 6 x the
         * 3 C F parameters of an expert for each of the k experts of each of its R rows,
         * forward and backward. */
        if (imb == 1.0)
            CHECKF(ts_rel_err((b.experts_f + b.experts_b) * peak, 18.0 * C * F * K * R,
                              1) < 1e-12,
                   "case %zu: routed experts' FLOPs are not the active ones", c);
        CHECKF(ts_rel_err(b.shared_f * peak, 2 * Nr * 2 * F * C + 2 * Nr * C * F, 1) < 1e-12,
               "case %zu: shared experts %g FLOP", c, b.shared_f * peak);
        const double bytes = R * K * C * ab, out = ep > 1 ? bytes * (ep - 1) / ep : 0.0;
        CHECKF(ts_rel_err(b.a2a_bytes, out, 1) < 1e-12, "case %zu: %g bytes leave, want %g", c,
               b.a2a_bytes, out);
        const int in = k_cases[c].in_node;
        const double intra = bytes * (in - 1) / ep / cl.intra.bandwidth;
        const double inter = bytes * (ep - in) / ep / cl.inter.bandwidth;
        const double x = ep > 1 ? (in < ep ? cl.inter.latency : cl.intra.latency) +
                                      (intra > inter ? intra : inter)
                                : 0.0;
        CHECKF(ts_rel_err(b.a2a_f, 2 * x, 1) < 1e-12 && b.a2a_b == b.a2a_f,
               "case %zu: exchanges %g s, want 2 x %g", c, b.a2a_f, x);
        CHECKF(b.hidden_f == (b.a2a_f < b.shared_f ? b.a2a_f : b.shared_f),
               "case %zu: the shared experts hide %g of %g", c, b.hidden_f, b.a2a_f);
        const double ag = ts_plan_allgather_time(etp * R * K * C * ab, etp, cl.intra);
        CHECKF(b.etp_f == 2 * ag && b.etp_b == 2 * ag, "case %zu: etp %g, want %g", c, b.etp_f,
               2 * ag);
    }
    /* a2a_efficiency halves the bandwidth: the byte term doubles. */
    ts_cluster half = cl;
    half.a2a_efficiency = 0.5;
    const double t1 = ts_plan_a2a_time(&cl, 1e8, 8, 8), t2 = ts_plan_a2a_time(&half, 1e8, 8, 8);
    CHECKF(ts_rel_err(t2 - cl.intra.latency, 2 * (t1 - cl.intra.latency), 1) < 1e-12,
           "a2a_efficiency 0.5: %g s, 1: %g s", t2, t1);

    /* The layer tables: block 0 dense, blocks 1.. MoE with all of their MoE's backward in
     * I (W holds the attention's weight gradients alone), the exchange's exposed part in
     * f_a2a, the experts' floats E/ep of the whole. */
    ts_plan_layers L1, L2;
    const ts_plan_moe m2 = {.ep = 2, .etp = 1, .ep_in_node = 2, .etp_link = cl.intra,
                            .imbalance = 1.0, .hide_shared = false};
    const ts_kernels *k = ts_plan_kernels(&cfg, &cl);
    ts_plan_layers_build(&L1, mc, &cl, k, 1, false, 1, 2, cl.intra, 1, cl.intra);
    ts_plan_layers_build_moe(&L2, mc, &cl, k, 1, false, 1, 2, cl.intra, 1, cl.intra, &m2);
    CHECK(L1.expert_floats[1] == 0 && L1.expert_floats[2] > 0);
    CHECKF(ts_rel_err(L2.expert_floats[2], L1.expert_floats[2] / 2, 1) < 1e-12,
           "ep 2 lays out %g expert floats, ep 1 %g", L2.expert_floats[2], L1.expert_floats[2]);
    CHECK(L1.f[1] == L2.f[1] && L1.moe[1].experts_f == 0 && L2.f_a2a[1] == 0);
    CHECKF(L2.f_a2a[2] == L2.moe[2].a2a_f && L2.f_a2a[2] > 0 && L2.i_a2a[2] == L2.moe[2].a2a_b,
           "ep 2: exposed exchanges %g of %g", L2.f_a2a[2], L2.moe[2].a2a_f);
    /* W is the attention's GEMMs alone: f_gemm less the MoE's GEMMs. */
    const ts_plan_moe_block *b = &L2.moe[2];
    CHECKF(ts_rel_err(L2.w[2], L2.f_gemm[2] - b->router_f - b->experts_f - b->shared_f -
                                   (L1.f_gemm[1] - L1.w[1]),
                      1) < 1e-9,
           "MoE block W %g: not the attention's dW", L2.w[2]);
    ts_plan_layers_free(&L1);
    ts_plan_layers_free(&L2);
    /* MFU's FLOPs: 6 x the active parameters (router, top_k routed, shared) per token. */
    const double tokens = (double)cfg.train.global_batch * mc->seq_len;
    const double attn = 12.0 * mc->n_layer * mc->seq_len * C * tokens;
    CHECKF(ts_rel_err(ts_plan_model_flops(mc, cfg.train.global_batch) - attn,
                      6.0 * ts_plan_flops_params(mc) * tokens, 1) < 1e-12 &&
               ts_plan_flops_params(mc) < (double)ts_model_logical_params(mc),
           "MoE model FLOPs: %g", ts_plan_model_flops(mc, cfg.train.global_batch));
}

/* llama-tiny with multi-head latent attention: a q latent of 48, a kv latent of 32,
 * heads of 16 + 8 channels and values of 16 (n_kv_head = n_head, as MLA has). */
static const char *const k_mla_sets[] = {
    "model.n_kv_head=4", "model.q_lora_rank=48", "model.kv_lora_rank=32",
    "model.qk_nope_head_dim=16", "model.qk_rope_head_dim=8", "model.v_head_dim=16"};
#define N_MLA_SETS 6

/* DeepSeek-V3 671B (configs/deepseek-v3-671b.cfg): multi-head latent attention's and
 * multi-token prediction's parameters and FLOPs against formulas derived by hand from
 * the report's shapes, and the planner's GEMMs at a unit efficiency. */
static void test_mla_formulas(void)
{
    ts_config cfg;
    const char *sets[] = {"train.device=\"cuda\"", "train.attention=\"flash\""};
    load_config("configs/deepseek-v3-671b.cfg", sets, 2, &cfg);
    const ts_model_config *mc = &cfg.model;
    CHECK(ts_model_is_mla(mc) && mc->mtp_layers == 1);
    const double C = 7168, H = 128, RQ = 1536, RKV = 512, NOPE = 128, RD = 64, VD = 128,
                 V = 129280, F = 18432, MF = 2048, E = 256, K = 8, T = 4096, HS = NOPE + RD;
    /* One block's MLA: q_a_proj + q_a_layernorm, q_b_proj, kv_a_proj_with_mqa +
     * kv_a_layernorm, kv_b_proj, o_proj. */
    const double mla = RQ * C + RQ + H * HS * RQ + (RKV + RD) * C + RKV + H * (NOPE + VD) * RKV +
                       C * H * VD;
    CHECKF((double)ts_model_mla_attention_params(mc) == mla && mla == 187107328.0,
           "MLA parameters per block: %zu, want %.0f", ts_model_mla_attention_params(mc), mla);
    /* 61 blocks (their two norms, MLA), 3 dense SwiGLU of 18432, 58 MoE (router, 256
     * experts, 1 shared), the embedding, the final norm and the untied head. */
    const double dense = 3 * F * C, moe_all = E * C + E * 3 * MF * C + 3 * MF * C,
                 moe_used = E * C + K * 3 * MF * C + 3 * MF * C;
    const double total = V * C + 61 * (2 * C + mla) + 3 * dense + 58 * moe_all + C + V * C;
    const double active = V * C + 61 * (2 * C + mla) + 3 * dense + 58 * moe_used + C + V * C;
    /* The main model (the report's 671B); with the MTP module, what Tessera trains and
     * saves: block 61's MLA and MoE, its norms, enorm, hnorm, shared_head.norm and
     * eh_proj (11.6B; README_WEIGHTS: 11.5B unique, 685B in all). */
    ts_model_config main_only = *mc;
    main_only.mtp_layers = 0;
    CHECKF((double)ts_model_logical_params(&main_only) == total,
           "671B: %zu parameters, want %.0f", ts_model_logical_params(&main_only), total);
    CHECKF((double)ts_model_active_params(&main_only) == active, "37B: %zu active, want %.0f",
           ts_model_active_params(&main_only), active);
    const double mtp_all = 2 * C + mla + moe_all + 3 * C + 2 * C * C,
                 mtp_used = 2 * C + mla + moe_used + 3 * C + 2 * C * C;
    CHECKF((double)ts_model_logical_params(mc) == total + mtp_all,
           "with MTP: %zu parameters, want %.0f", ts_model_logical_params(mc), total + mtp_all);
    CHECK((double)ts_model_active_params(mc) == active + mtp_used);
    /* The report's rounding: 671B total; "37B activated" (README_WEIGHTS: 36.7B), ours
     * 37.55B with both embedding and head, 36.63B without the looked-up embedding. */
    CHECKF(total > 670.5e9 && total < 671.5e9, "total %.4gB is not the report's 671B", total / 1e9);
    CHECKF(active > 36.5e9 && active < 37.6e9, "active %.4gB is not the report's 37B",
           active / 1e9);
    CHECK(ts_plan_flops_params(mc) == active - V * C);
    /* MTP (D = 1): block 61 (MoE) with its norms, enorm, hnorm, shared_head.norm, eh_proj
     * [C, 2C] and the shared head once more: 0.688B + 0.927B (README_WEIGHTS: 11.5B
     * unique parameters, 2.4B activated with the shared embedding and head). */
    const double mtp = 2 * C + mla + moe_used + 3 * C + 2 * C * C + V * C;
    CHECKF(ts_plan_mtp_flops_params(mc) == mtp, "MTP FLOPs parameters %.0f, want %.0f",
           ts_plan_mtp_flops_params(mc), mtp);
    /* Attention: q.k over nope + rope, the values' v_head_dim, the full square, 62 blocks
     * (61 + the module's). */
    const double att = 6.0 * 62 * T * H * (HS + VD);
    CHECKF(ts_plan_attention_flops_per_token(mc) == att, "attention FLOPs per token %.6g, want %.6g",
           ts_plan_attention_flops_per_token(mc), att);
    const double per_token = 6.0 * (active - V * C + mtp) + att;
    CHECKF(ts_rel_err(ts_plan_flops_per_token(mc), per_token, 1) < 1e-12 &&
               ts_rel_err(ts_plan_model_flops(mc, 15360), per_token * 15360 * T, 1) < 1e-12,
           "FLOPs per token %.6g, want %.6g", ts_plan_flops_per_token(mc), per_token);
    ts_model_config no_mtp = *mc;
    no_mtp.mtp_layers = 0;
    CHECK(ts_rel_err(ts_plan_flops_per_token(&no_mtp),
                     6.0 * (active - V * C) + 6.0 * 61 * T * H * (HS + VD), 1) < 1e-12);

    /* The layer tables at a unit efficiency (a GEMM is 2mnk / peak), the CUDA table's
     * whole rectangles, tp 2 (the latent trunk replicated, 64 heads a rank): a dense
     * block's GEMMs and an MoE block's attention part, and the head's layer with the
     * MTP module (eh_proj, its MoE block, the head again). The shapes per block are
     * DeepSeek-V3's; 5 blocks (3 dense, 2 MoE) keep the layouts small (the sanitizers'
     * share of CI). */
    ts_model_config mc5 = *mc;
    mc5.n_layer = 5;
    ts_model_config no_mtp5 = mc5;
    no_mtp5.mtp_layers = 0;
    ts_cluster cl;
    load_cluster("configs/clusters/h800-node.cfg", &cl);
    cl.n_eff = 1;
    cl.eff_n[0] = 1.0;
    cl.eff[0] = 1.0;
    const double peak = ts_cluster_peak(&cl), N = T, hl = H / 2;
    const ts_kernels *k = ts_plan_kernels(&cfg, &cl);
    ts_plan_layers L, L0;
    ts_plan_layers_build_moe(&L, &mc5, &cl, k, 2, false, 1, 1, cl.intra, 1, cl.intra, NULL);
    ts_plan_layers_build_moe(&L0, &no_mtp5, &cl, k, 2, false, 1, 1, cl.intra, 1, cl.intra, NULL);
    const double lin_att = 2 * N * ((RQ + RKV + RD) * C + hl * HS * RQ + hl * (NOPE + VD) * RKV +
                                    C * hl * VD);
    const double core = 2 * hl * (T * T * HS + T * VD * T);
    const double mlp = 2 * N * 3 * (F / 2) * C;
    /* mla.c makes its phase's weight gradients in the input pass: W is the MLP's. */
    CHECKF(ts_rel_err(L.f_gemm[1] * peak, lin_att + core + mlp, 1) < 1e-12 &&
               ts_rel_err(L.b_gemm[1], 2 * L.f_gemm[1], 1) < 1e-12 &&
               ts_rel_err(L.w[1] * peak, mlp, 1) < 1e-12,
           "MLA dense block: %.6g GEMM FLOPs, want %.6g", L.f_gemm[1] * peak,
           lin_att + core + mlp);
    const ts_plan_moe_block *b = &L.moe[4];
    CHECKF(ts_rel_err((L.f_gemm[4] - b->router_f - b->experts_f - b->shared_f) * peak,
                      lin_att + core, 1) < 1e-12 &&
               L.w[4] == 0.0,
           "MLA MoE block: attention %.6g FLOPs, want %.6g",
           (L.f_gemm[4] - b->router_f - b->experts_f - b->shared_f) * peak, lin_att + core);
    /* Selective recompute reruns the core and rebuilds k and v from the kept latent:
     * kv_b_proj, RoPE (q's rope channels, the shared key) and the q|k|v assembly, bf16. */
    const double bw = cl.memory_bandwidth;
    const double rebuild = 2 * N * hl * (NOPE + VD) * RKV / peak +
                           2.0 * (N * (hl * (NOPE + VD) + RD + hl * (HS + VD)) +
                                  2 * N * (hl + 1) * RD) / bw;
    CHECKF(ts_rel_err(L.f_att[1], core / peak + 2.0 * 3 * hl * T * T / bw + rebuild, 1) < 1e-12,
           "MLA selective rerun %g s, want %g", L.f_att[1],
           core / peak + 2.0 * 3 * hl * T * T / bw + rebuild);
    const int h = L.n_layers - 1;
    const double eh = 2 * N * C * 2 * C / peak;
    CHECKF(ts_rel_err(L.f_gemm[h], 2 * L0.f_gemm[h] + eh + L.f_gemm[4], 1) < 1e-12 &&
               ts_rel_err(L.b_gemm[h], 2 * L0.b_gemm[h] + 2 * eh + L.b_gemm[4], 1) < 1e-12 &&
               ts_rel_err(L.w[h] - L0.w[h], L0.w[h] + eh + L.w[4] +
                                                 N * C * 3 * 2.0 / cl.memory_bandwidth,
                          1) < 1e-12,
           "MTP head layer: %.6g s of GEMMs, want %.6g", L.f_gemm[h],
           2 * L0.f_gemm[h] + eh + L.f_gemm[4]);
    /* The module's MoE block and its exchanges are the head layer's; its attention core
     * what selective recompute reruns there. */
    CHECK(L.moe[h].experts_f == b->experts_f && L.f_a2a[h] == L.f_a2a[4] &&
          L.f_att[h] == L.f_att[4] && L0.moe[h].experts_f == 0 && L0.f_att[h] == 0);
    CHECK(L.f[h] > L0.f[h] + L.f[4] && L.i[h] > L0.i[h] + L.i[4]);
    ts_plan_layers_free(&L);
    ts_plan_layers_free(&L0);
    /* Context parallelism exchanges the latent and the rope key (576 values a position),
     * the same on every tp rank, and up-projects the gathered sequence's rows. */
    const double lat = ts_plan_allgather_time(T * (RKV + RD) * 2.0, 2, cl.intra);
    CHECKF(ts_plan_cp_exchange_time(mc, 1, 2, 1, 2.0, cl.intra) == lat &&
               ts_plan_cp_exchange_time(mc, 8, 2, 1, 2.0, cl.intra) == lat,
           "MLA cp exchange %g s, want %g", ts_plan_cp_exchange_time(mc, 1, 2, 1, 2.0, cl.intra),
           lat);
    ts_plan_layers_build_moe(&L, &no_mtp5, &cl, k, 1, false, 1, 1, cl.intra, 2, cl.intra, NULL);
    const double kvb = 2 * T * H * (NOPE + VD) * RKV; /* the whole sequence's rows */
    const double lin_cp = 2 * (N / 2) * ((RQ + RKV + RD) * C + H * HS * RQ + C * H * VD) + kvb;
    /* ... and rebuilds kv_b_proj's output in the backward. */
    const ts_plan_moe_block *b4 = &L.moe[4];
    const double c = T / 4; /* each rank's two chunks against prefixes of 5 chunks in all */
    CHECKF(ts_rel_err((L.f_gemm[4] - b4->router_f - b4->experts_f - b4->shared_f) * peak,
                      lin_cp + 2 * H * 5 * c * c * (HS + VD), 1) < 1e-12 &&
               L.w[4] == 0.0 && L.f_cp[4] == lat &&
               ts_rel_err((L.b_gemm[4] - b4->router_b - b4->experts_b - b4->shared_b) * peak,
                          2 * (L.f_gemm[4] - b4->router_f - b4->experts_f - b4->shared_f) * peak +
                              kvb,
                          1) < 1e-12,
           "MLA under cp 2: %.6g attention FLOPs", L.f_gemm[4] * peak);
    ts_plan_layers_free(&L);
}

/* The search's expert grids (ep, etp) pass the trainer's own rules (config_moe.c), and
 * where the links are all but free (the exchanges cost nothing, a rank with fewer experts
 * steps its optimizer sooner) the best uses ep > 1. */
static void test_moe_search(int gpus)
{
    ts_config cfg;
    const char *sets[N_MOE_SETS + 1];
    for (int k = 0; k < N_MOE_SETS; k++) sets[k] = k_moe_sets[k];
    sets[N_MOE_SETS] = "train.global_batch=16";
    load_config("configs/llama-tiny.cfg", sets, N_MOE_SETS + 1, &cfg);
    ts_cluster cl;
    load_cluster("tests/fixtures/plan_cluster_h100.cfg", &cl);
    cl.intra.latency = cl.inter.latency = 1e-12;
    cl.intra.bandwidth = cl.inter.bandwidth = 1e18;
    ts_plan_ctx *x = ts_plan_ctx_new(&cfg, &cl);
    ts_search_opts o = {.gpus = gpus, .top = 40};
    ts_search_result sr;
    CHECK(ts_plan_search(x, &o, &sr) == TS_OK);
    int with_ep = 0, with_etp = 0;
    for (int t = 0; t < sr.n_top; t++) {
        const ts_plan_grid *g = &sr.top[t].g;
        char set[12][96];
        const char *gs[12 + N_MOE_SETS + 1];
        int n = 0;
        for (int k = 0; k < N_MOE_SETS + 1; k++) gs[n++] = sets[k];
        snprintf(set[0], 96, "parallel.pp=%d", g->pp);
        snprintf(set[1], 96, "parallel.dp=%d", g->dp);
        snprintf(set[2], 96, "parallel.tp=%d", g->tp);
        snprintf(set[3], 96, "parallel.cp=%d", ts_plan_grid_cp(g));
        snprintf(set[4], 96, "parallel.ep=%d", ts_plan_grid_ep(g));
        snprintf(set[5], 96, "parallel.etp=%d", ts_plan_grid_etp(g));
        snprintf(set[6], 96, "parallel.micro_batch=%d", g->micro_batch);
        snprintf(set[7], 96, "parallel.schedule=%s", ts_schedule_names[g->schedule]);
        snprintf(set[8], 96, "parallel.virtual_stages=%d", g->v);
        snprintf(set[9], 96, "parallel.zero=%d", g->zero);
        snprintf(set[10], 96, "parallel.sequence_parallel=%s", g->sp ? "true" : "false");
        snprintf(set[11], 96, "parallel.recompute=%s", ts_recompute_names[g->recompute]);
        for (int k = 0; k < 12; k++) gs[n++] = set[k];
        ts_config c2;
        char p[1200];
        const ts_status st = ts_config_load_plan(&c2, path("configs/llama-tiny.cfg", p, sizeof p), gs, n);
        CHECKF(st == TS_OK, "search grid %d (pp %d dp %d cp %d tp %d ep %d etp %d) refused: %s", t,
               g->pp, g->dp, ts_plan_grid_cp(g), g->tp, g->ep, g->etp, ts_error_message());
        with_ep += ts_plan_grid_ep(g) > 1;
        with_etp += ts_plan_grid_etp(g) > 1;
    }
    printf("MoE search on %d devices: %d of the top %d grids with ep > 1, %d with etp > 1; best "
           "ep %d etp %d\n",
           gpus, with_ep, sr.n_top, with_etp, sr.n_top ? ts_plan_grid_ep(&sr.top[0].g) : 0,
           sr.n_top ? ts_plan_grid_etp(&sr.top[0].g) : 0);
    CHECK(with_ep > 0 && sr.n_top > 0 && ts_plan_grid_ep(&sr.top[0].g) > 1);
    /* The bounded phase (expert grids deferred by their work floor) is exact: the same top
     * list as simulating every grid that fits. */
    ts_search_opts ox = o;
    ox.exhaustive = true;
    ts_search_result ex;
    CHECK(ts_plan_search(x, &ox, &ex) == TS_OK);
    CHECKF(ex.n_top == sr.n_top, "MoE search: %d grids pruned, %d exhaustive", sr.n_top, ex.n_top);
    for (int t = 0; t < sr.n_top && t < ex.n_top; t++)
        CHECKF(same_grid(&sr.top[t].g, &ex.top[t].g) && sr.top[t].step_ms == ex.top[t].step_ms,
               "MoE search #%d: pruned and exhaustive differ", t);
    ts_search_result_free(&ex);
    ts_search_result_free(&sr);
    ts_plan_ctx_free(x);
}

/* Muon (plan/muon_cost.h, pipeline/memory.h): Newton-Schulz FLOPs and GEMM time of small
 * shapes by hand, the tp gather, the busiest owner's share, and the memory rule's one
 * momentum on the owned matrices against AdamW's two moments. */
static void test_muon_formulas(void)
{
    /* [4, 8]: s = 4, l = 8; an iteration is X X^T 2*16*8 = 256, A A 2*64 = 128, B X 256:
     * 640; five: 3200. Transposed the same; [6, 6]: (4*216 + 2*216) = 1296 an iteration. */
    CHECK(ts_plan_muon_ns_flops(4, 8, 5) == 3200.0);
    CHECK(ts_plan_muon_ns_flops(8, 4, 5) == 3200.0);
    CHECK(ts_plan_muon_ns_flops(6, 6, 1) == 1296.0);
    CHECK(ts_plan_muon_ns_flops(6, 6, 0) == 0.0);
    /* The CPU test cluster: 0.1 TFLOP/s, efficiency 0.3 below n = 64 (these GEMMs). */
    ts_cluster cl;
    load_cluster("tests/fixtures/plan_cluster_cpu.cfg", &cl);
    CHECK(fabs(ts_plan_muon_ns_time(&cl, 8, 4, 5) - 3200.0 / (0.1e12 * 0.3)) < 1e-18);
    /* A [1024, 256] matrix: s = 256, l = 1024; the Gram GEMM (256, 256, 1024) at n =
     * cbrt(2^26) = 406.4 (between 256 at 0.6 and 1024 at 0.8: log-linear), A A (256^3) at
     * 0.6, B X like the Gram one. */
    const double e406 = 0.6 + 0.2 * log(cbrt(256.0 * 256 * 1024) / 256.0) / log(4.0);
    const double t1 = 2 * (2.0 * 256 * 256 * 1024) / (0.1e12 * e406) +
                      2.0 * 256 * 256 * 256 / (0.1e12 * 0.6);
    CHECK(fabs(ts_plan_muon_ns_time(&cl, 1024, 256, 1) - t1) < 1e-12 * t1);
    /* Sums: a [8, 4] matrix split in two over tp (16 of its 32 floats here) on the intra
     * link (5 GB/s, 20 us): this rank receives the other 16 fp32, 64 bytes, one latency;
     * a replicated [4, 4] gathers nothing; an expert [4, 8] counts in the x fields too. */
    ts_plan_muon mu = {0}, ex = {0};
    ts_plan_muon_add(&mu, &cl, 5, 8, 4, 16, 16, 2, cl.intra, false);
    CHECK(mu.gather_bytes == 64.0 && fabs(mu.gather - (64.0 / 5e9 + 20e-6)) < 1e-15);
    ts_plan_muon_add(&mu, &cl, 5, 4, 4, 16, 16, 1, cl.intra, false);
    CHECK(mu.gather_bytes == 64.0 && mu.floats == 32.0 && mu.matrices == 2);
    CHECK(mu.flops == 3200.0 + 5 * (4.0 * 64 + 2.0 * 64) && mu.max_flops == 3200.0);
    ts_plan_muon_add(&ex, &cl, 5, 4, 8, 32, 32, 1, cl.intra, true);
    ts_plan_muon_sum(&mu, &ex);
    CHECK(mu.floats == 64.0 && mu.xfloats == 32.0 && mu.xflops == 3200.0 && mu.matrices == 3);
    /* The busiest owner: 1200 dense over 4 ranks and 400 experts over 2 (500), no less
     * than the largest matrix (600 then). */
    CHECK(ts_plan_muon_owner_share(1200, 400, 100, 4, 2) == 500.0);
    CHECK(ts_plan_muon_owner_share(1200, 400, 600, 4, 2) == 600.0);
    CHECK(ts_plan_muon_owner_share(1200, 0, 0, 1, 1) == 1200.0);

    /* The memory rule: 1000 floats, 600 of them Muon matrices (the largest 200). */
    const int chunk_rank[1] = {0}, zero_i[1] = {0};
    const double zero_d[1] = {0.0};
    ts_memory_shape sh = {.micro_batch = 1, .seq_len = 1, .n_embd = 1, .pp = 1,
                          .n_chunks = 1, .chunk_rank = chunk_rank, .m = 1, .dp = 2,
                          .zero = 1, .threads = 1};
    ts_memory_holdings h = {.param_floats = 1000, .muon_floats = 600, .muon_max_floats = 200,
                            .act_bytes = zero_d, .stash_bytes = zero_d, .peak_acts = zero_i,
                            .peak_stash = zero_i, .n_recomputed = zero_i};
    ts_rank_memory est, adam;
    /* ZeRO-1 over 2: AdamW 8 * 400 / 2 + Muon 4 * 600 / 2 (against AdamW's 8 * 1000 / 2) */
    ts_memory_rank(&sh, &h, 0, &est);
    CHECK(est.optimizer == 2800.0);
    ts_memory_holdings ha = h;
    ha.muon_floats = ha.muon_max_floats = 0;
    ts_memory_rank(&sh, &ha, 0, &adam);
    CHECK(adam.optimizer == 4000.0 && adam.params == est.params && adam.grads == est.grads);
    /* ZeRO-0: AdamW's on every rank, the momentum on the owner's share */
    sh.zero = 0;
    ts_memory_rank(&sh, &h, 0, &est);
    CHECK(est.optimizer == 8.0 * 400 + 4.0 * 300);
    /* over 4 the largest matrix (200) exceeds the even share (150) */
    sh.zero = 1;
    sh.dp = 4;
    ts_memory_rank(&sh, &h, 0, &est);
    CHECK(est.optimizer == 8.0 * 100 + 4.0 * 200);
    /* one rank holds every momentum; checkpoint.async copies weights, moments, momentum */
    sh.dp = 1;
    ts_memory_rank(&sh, &h, 0, &est);
    CHECK(est.optimizer == 8.0 * 400 + 4.0 * 600);
    sh.dp = 2;
    sh.async_checkpoint = true;
    ts_memory_rank(&sh, &h, 0, &est);
    ts_memory_rank(&sh, &ha, 0, &adam);
    CHECK(est.buffers - adam.buffers == (1000.0 + 800 + 600) * 4 / 2 - 3.0 * 1000 * 4 / 2);
    /* experts: 300 of the Muon floats (and 300 of all) owned over edp 1 under dp 2 */
    sh.async_checkpoint = false;
    sh.edp = 1;
    h.expert_floats = h.muon_expert_floats = 300;
    ts_memory_rank(&sh, &h, 0, &est);
    CHECK(est.optimizer == 8.0 * 400 / 2 + 4.0 * (300.0 / 2 + 300));
}

/* Muon planned on llama-tiny (4 blocks of q, o [128, 128], k, v [64, 128], gate, up
 * [384, 128], down [128, 384]: 196,608 Muon floats a block, 786,432 in all, of 853,120)
 * on the CPU test cluster, by hand: the optimizer memory, the busiest owner's
 * Newton-Schulz FLOPs (one rank, and over dp 2, whose grids the planner prices before
 * the trainer runs them), ZeRO-0's all-gather of the matrices, tp 2's gathers; and the
 * planner's memory against the trainer's estimate on every grid the config accepts. */
static void test_muon_plan(const ts_cluster *cl)
{
    const char *sets[] = {"train.optimizer=\"muon\""};
    ts_config cfg, adam;
    load_config("configs/llama-tiny.cfg", sets, 1, &cfg);
    load_config("configs/llama-tiny.cfg", NULL, 0, &adam);
    const double N = 853120, M = 786432;
    /* per block: q, o 5 * 6 * 128^3; k, v 5 * (4 * 64^2 * 128 + 2 * 64^3); gate, up, down
     * 5 * (4 * 128^2 * 384 + 2 * 128^3) */
    const double block = 2 * 62914560.0 + 2 * 13107200.0 + 3 * 146800640.0;
    ts_plan_ctx *x = ts_plan_ctx_new(&cfg, cl), *xa = ts_plan_ctx_new(&adam, cl);
    ts_plan_grid g;
    ts_plan_grid_of(&cfg, &g);
    g.dp = 1;
    g.m = 1;
    ts_plan_result r, ra;
    CHECK(ts_plan_estimate(x, &g, &r) == TS_OK && ts_plan_estimate(xa, &g, &ra) == TS_OK);
    CHECKF(r.mem.optimizer == 8.0 * (N - M) + 4.0 * M && ra.mem.optimizer == 8.0 * N,
           "%.0f %.0f", r.mem.optimizer, ra.mem.optimizer);
    CHECKF(r.terms.muon_ns_flops == 4 * block, "%.0f", r.terms.muon_ns_flops);
    CHECK(r.terms.muon_ns > 0 && r.terms.muon_gather == 0.0 && ra.terms.muon_ns == 0.0);
    CHECK(r.terms.optimizer > r.terms.muon_ns);
    /* Muon's buffers: the update of the largest matrix ([384, 128]: 4 * 49,152 bytes) and
     * its iteration's scratch (64 + X 4 * 49,152 + three 4 * 128^2) */
    const double work = 4 * 49152.0 + 64 + 4 * 49152.0 + 3 * 4 * 16384.0;
    CHECKF(r.mem.buffers - ra.mem.buffers == work, "%.0f", r.mem.buffers - ra.mem.buffers);
    /* dp 2: half of everything on the busiest owner (the largest matrix is smaller) */
    g.dp = 2;
    for (int z = 0; z <= 1; z++) {
        g.zero = z;
        CHECK(ts_plan_estimate(x, &g, &r) == TS_OK);
        CHECKF(r.mem.optimizer == 8.0 * (N - M) / (z ? 2 : 1) + 4.0 * M / 2, "zero %d: %.0f", z,
               r.mem.optimizer);
        CHECK(r.terms.muon_ns_flops == 2 * block);
        ts_zero_traffic t, ta;
        ts_plan_zero_of(x, &g, 0, &t, NULL, NULL);
        ts_plan_zero_of(xa, &g, 0, &ta, NULL, NULL);
        CHECKF(t.allgather_bytes - ta.allgather_bytes == (z == 0 ? 0.5 * 4 * M : 0.0),
               "zero %d: %.0f", z, t.allgather_bytes - ta.allgather_bytes);
    }
    /* tp 2 (one node's intra link, 5 GB/s and 20 us): each of the 28 matrices split, a
     * tp rank receiving the other half, 98,304 floats a block */
    g.dp = 1;
    g.zero = 0;
    g.tp = 2;
    CHECK(ts_plan_estimate(x, &g, &r) == TS_OK);
    const double want = (4 * 98304 * 4.0 / 5e9 + 28 * 20e-6) * 1e3;
    CHECKF(fabs(r.terms.muon_gather - want) < 1e-12, "%.9f %.9f", r.terms.muon_gather, want);
    CHECK(r.terms.muon_ns_flops == 4 * block); /* duplicated: not divided by tp */
    /* and the gathered [384, 128] and a [192, 128] shard */
    CHECK(ts_plan_estimate(xa, &g, &ra) == TS_OK);
    CHECKF(r.mem.buffers - ra.mem.buffers == work + 4 * (49152.0 + 24576),
           "%.0f", r.mem.buffers - ra.mem.buffers);
    ts_plan_ctx_free(x);
    ts_plan_ctx_free(xa);
    const int before = g_mem_grids;
    compare_memory("configs/llama-tiny.cfg", sets, 1, cl);
    printf("memory compared on %d Muon grids\n", g_mem_grids - before);
    CHECK(g_mem_grids - before > 20);
}

/* The shape memory floor (ts_plan_shape_memory_floor, by which the search counts a
 * shape's candidates out of memory unestimated) is at most every candidate's estimated
 * memory: each schedule, v, recompute mode ("auto" too) and ZeRO level the search tries,
 * on shapes with and without an expert grid, context and sequence parallelism. Returns
 * the candidates compared. */
static int check_shape_floor(ts_plan_ctx *x, int pp, int dp, int cp, int tp, int ep, int etp,
                             int mb)
{
    const ts_config *cfg = ts_plan_ctx_config(x);
    const int layers = cfg->model.n_layer + 2, m = cfg->train.global_batch / dp / mb;
    const bool sp_ok = tp > 1 && (cfg->model.seq_len / cp) % tp == 0;
    int n = 0;
    for (int sp = 0; sp <= (sp_ok ? 1 : 0); sp++) {
        ts_plan_grid g = {.pp = pp, .dp = dp, .tp = tp, .cp = cp, .v = 1, .micro_batch = mb,
                          .m = m, .sp = sp, .ep = ep, .etp = etp};
        const double floor = ts_plan_shape_memory_floor(x, &g);
        CHECK(floor > 0.0);
        for (int s = 0; s < TS_N_SCHEDULES; s++) {
            if (pp == 1 && s != TS_SCHEDULE_1F1B) continue;
            const int per = ts_schedule_chunks_per_rank((ts_schedule_kind)s);
            const int v_lo = per == 1 ? 1 : 2, v_hi = per == 0 ? layers / pp : v_lo;
            for (int v = v_lo; v <= v_hi && pp * v <= layers; v++)
                for (int rc = 0; rc < TS_N_RECOMPUTES; rc++)
                    for (int z = 0; z < (dp * cp > 1 ? 4 : 1); z++) {
                        if (rc == TS_RECOMPUTE_EXCEPT_LAST) continue;
                        g.schedule = s;
                        g.v = v;
                        g.recompute = rc;
                        g.zero = z;
                        ts_plan_result e;
                        if (ts_plan_estimate(x, &g, &e) != TS_OK) continue;
                        CHECKF(e.mem.total >= floor,
                               "shape floor %.0f above the estimate %.0f (pp %d dp %d cp %d "
                               "tp %d ep %d etp %d mb %d sp %d %s v %d %s zero %d)",
                               floor, e.mem.total, pp, dp, cp, tp, ep, etp, mb, sp,
                               ts_schedule_names[s], v, ts_recompute_names[rc], z);
                        n++;
                    }
        }
    }
    ts_error_clear();
    return n;
}

static void test_shape_memory_floor(void)
{
    ts_cluster cl;
    load_cluster("configs/clusters/h800-node.cfg", &cl);
    ts_config cfg;
    const char *sets[] = {"train.global_batch=8"};
    load_config("configs/deepseek-4l.cfg", sets, 1, &cfg);
    ts_plan_ctx *x = ts_plan_ctx_new(&cfg, &cl);
    int n = check_shape_floor(x, 2, 2, 1, 2, 2, 1, 1);
    n += check_shape_floor(x, 2, 2, 2, 1, 4, 1, 2);
    n += check_shape_floor(x, 3, 2, 1, 2, 2, 2, 1);
    n += check_shape_floor(x, 1, 1, 1, 1, 1, 1, 4);
    ts_plan_ctx_free(x);
    /* Muon (one momentum on the matrices instead of two moments) lowers the estimates:
     * the floor must follow. */
    const char *muon_sets[] = {"train.global_batch=8", "train.optimizer=\"muon\""};
    load_config("configs/deepseek-4l.cfg", muon_sets, 2, &cfg);
    x = ts_plan_ctx_new(&cfg, &cl);
    n += check_shape_floor(x, 2, 2, 1, 2, 2, 1, 1);
    n += check_shape_floor(x, 1, 4, 1, 1, 2, 1, 1);
    n += check_shape_floor(x, 1, 1, 1, 1, 1, 1, 4);
    ts_plan_ctx_free(x);
    printf("shape memory floor at most the estimate of %d candidates\n", n);
    CHECK(n > 200);
}

int main(void)
{
    const char *src = getenv("TS_SOURCE_DIR");
    snprintf(g_src, sizeof g_src, "%s", src && *src ? src : ".");

    test_textbook();
    test_dp_buckets();
    test_muon_formulas();

    test_search("configs/tiny.cfg", "tests/fixtures/plan_cluster_cpu.cfg", 4);
    test_search("configs/gpt2-124m.cfg", "tests/fixtures/plan_cluster_h100.cfg", 8);
    test_shape_memory_floor();
    /* Under the sanitizers (TS_TEST_PLAN_QUICK, tests/CMakeLists.txt) the 8-device search
     * and three of the four memory sweeps look for memory errors; the release build runs
     * every case. */
    const char *quick = getenv("TS_TEST_PLAN_QUICK");
    const bool full = !(quick && *quick && strcmp(quick, "0") != 0);
    if (full) test_search("configs/gpt2-124m.cfg", "tests/fixtures/plan_cluster_h100.cfg", 16);
    /* the bound and the pruning hold without overlap too */
    test_search("configs/tiny.cfg", "tests/fixtures/plan_cluster_cpu_measured.cfg", 4);
    test_optional_keys();
    test_sequence_parallel();
    test_documents();
    test_context_parallel();

    ts_cluster cpu;
    load_cluster("tests/fixtures/plan_cluster_cpu.cfg", &cpu);
    const char *twelve[] = {"model.n_layer=12"};
    compare_memory("configs/tiny.cfg", NULL, 0, &cpu);
    if (full) compare_memory("configs/tiny.cfg", twelve, 1, &cpu);
    compare_memory("configs/llama-tiny.cfg", NULL, 0, &cpu);
    test_muon_plan(&cpu);
    /* A budget that makes recompute = "auto" recompute part of the micro-batches of
     * some grids: the planner's caps are the trainer's own choice. */
    const char *budget[] = {"parallel.memory_budget_mb=16"};
    compare_memory("configs/tiny.cfg", budget, 1, &cpu);
    printf("recompute auto recomputed part on %d grids, made a chunk selective on %d\n",
           g_auto_partial, g_auto_selective);
    CHECK(g_auto_partial >= 5);
    CHECK(g_auto_selective >= 5);
    test_llama3();
    /* The memory of expert grids (ep, etp) against the trainer's estimate: the MoE layout,
     * edp's shards (the grids ep * etp does not fold over are refused by the config and
     * skipped). */
    const int before = g_mem_grids;
    const char *moe_ep[N_MOE_SETS + 1], *moe_etp[N_MOE_SETS + 2];
    for (int k = 0; k < N_MOE_SETS; k++) moe_ep[k] = moe_etp[k] = k_moe_sets[k];
    moe_ep[N_MOE_SETS] = "parallel.ep=2";
    moe_etp[N_MOE_SETS] = "parallel.ep=2";
    moe_etp[N_MOE_SETS + 1] = "parallel.etp=2";
    compare_memory("configs/llama-tiny.cfg", moe_ep, N_MOE_SETS + 1, &cpu);
    if (full) compare_memory("configs/llama-tiny.cfg", moe_etp, N_MOE_SETS + 2, &cpu);
    moe_etp[N_MOE_SETS] = "parallel.etp=2"; /* etp alone (ep 1) */
    if (full) compare_memory("configs/llama-tiny.cfg", moe_etp, N_MOE_SETS + 1, &cpu);
    printf("memory compared on %d expert grids\n", g_mem_grids - before);
    CHECK(g_mem_grids - before > 50);
    test_moe_formulas();
    test_mla_formulas();
    /* Multi-head latent attention's memory (model/mla.c's layout: the latents, the
     * selective layout rebuilding from them) against the trainer's estimate, release
     * builds only (a sweep of about a thousand grids). */
    if (full) {
        const int mla_before = g_mem_grids;
        compare_memory("configs/llama-tiny.cfg", k_mla_sets, N_MLA_SETS, &cpu);
        printf("memory compared on %d MLA grids\n", g_mem_grids - mla_before);
        CHECK(g_mem_grids - mla_before > 500);
        /* DeepSeek-V3's form in small: MLA, the MoE (first block dense, a shared expert)
         * and one MTP module (in the head's layer, on the last stage), ep 2. */
        const char *ds[N_MLA_SETS + N_MOE_SETS + 2];
        int n_ds = 0;
        for (int k = 0; k < N_MLA_SETS; k++) ds[n_ds++] = k_mla_sets[k];
        for (int k = 0; k < N_MOE_SETS; k++) ds[n_ds++] = k_moe_sets[k];
        ds[n_ds++] = "model.mtp_layers=1";
        ds[n_ds++] = "parallel.ep=2";
        const int ds_before = g_mem_grids;
        compare_memory("configs/llama-tiny.cfg", ds, n_ds, &cpu);
        printf("memory compared on %d MLA + MoE + MTP grids\n", g_mem_grids - ds_before);
        CHECK(g_mem_grids - ds_before > 200);
    }
    test_moe_search(4);
    printf("memory compared with pipeline/memory.c on %d grids (%d sequence parallel)\n",
           g_mem_grids, g_sp_grids);
    CHECK(g_mem_grids > 100);
    CHECK(g_sp_grids > 50);
    return ts_test_report();
}
