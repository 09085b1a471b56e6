/* The planner's price of Muon (muon_cost.h). */
#include "plan/muon_cost.h"

#include <math.h>
#include <stdlib.h>

#include "core/error.h"
#include "model/model.h"
#include "optim/muon.h"
#include "tensor/tp.h"

/* s = the smaller dimension (the Gram matrix's side), l = the larger. */
static void sides(double rows, double cols, double *s, double *l)
{
    *s = rows < cols ? rows : cols;
    *l = rows < cols ? cols : rows;
}

double ts_plan_muon_ns_flops(double rows, double cols, int ns_steps)
{
    double s, l;
    sides(rows, cols, &s, &l);
    /* A = X X^T (2 s^2 l), A A (2 s^3), B X (2 s^2 l) per iteration */
    return ns_steps * (4.0 * s * s * l + 2.0 * s * s * s);
}

/* One (m, n, k) GEMM at the efficiency its size reaches (model_cost.c's rule). */
static double gemm(const ts_cluster *cl, double m, double n, double k)
{
    const double work = m * n * k;
    return 2.0 * work / (ts_cluster_peak(cl) * ts_cluster_efficiency(cl, cbrt(work)));
}

double ts_plan_muon_ns_time(const ts_cluster *cl, double rows, double cols, int ns_steps)
{
    double s, l;
    sides(rows, cols, &s, &l);
    return ns_steps * (gemm(cl, s, s, l) + gemm(cl, s, s, s) + gemm(cl, s, l, s));
}

void ts_plan_muon_add(ts_plan_muon *acc, const ts_cluster *cl, int ns_steps, double rows,
                      double cols, double local_numel, double local_floats, int group,
                      ts_link link, bool expert)
{
    const double flops = ts_plan_muon_ns_flops(rows, cols, ns_steps);
    const double time = ts_plan_muon_ns_time(cl, rows, cols, ns_steps);
    /* Duplicated mode: the group's ranks gather the matrix's fp32 parts (a ring:
     * (g-1)/g of the logical matrix per rank on an even split, g-1 latencies). */
    const double bytes = group > 1 ? 4.0 * (rows * cols - local_numel) : 0.0;
    const double gather =
        bytes > 0 ? bytes / link.bandwidth + (group - 1.0) * link.latency : 0.0;
    acc->floats += local_floats;
    acc->flops += flops;
    acc->time += time;
    acc->gather += gather;
    acc->gather_bytes += bytes;
    if (expert) {
        acc->xfloats += local_floats;
        acc->xflops += flops;
        acc->xtime += time;
        acc->xgather += gather;
        acc->xgather_bytes += bytes;
    }
    const double n = rows * cols, sb = (double)ts_muon_scratch_bytes((int64_t)rows, (int64_t)cols);
    if (n > acc->max_logical) acc->max_logical = n;
    if (sb > acc->max_scratch) acc->max_scratch = sb;
    if (group > 1 && n > acc->max_split_logical) acc->max_split_logical = n;
    if (group > 1 && local_numel > acc->max_split_local) acc->max_split_local = local_numel;
    if (local_floats > acc->max_floats) acc->max_floats = local_floats;
    if (flops > acc->max_flops) acc->max_flops = flops;
    if (time > acc->max_time) acc->max_time = time;
    acc->matrices++;
}

void ts_plan_muon_sum(ts_plan_muon *acc, const ts_plan_muon *b)
{
    acc->floats += b->floats;
    acc->xfloats += b->xfloats;
    acc->flops += b->flops;
    acc->xflops += b->xflops;
    acc->time += b->time;
    acc->xtime += b->xtime;
    acc->gather += b->gather;
    acc->xgather += b->xgather;
    acc->gather_bytes += b->gather_bytes;
    acc->xgather_bytes += b->xgather_bytes;
    if (b->max_floats > acc->max_floats) acc->max_floats = b->max_floats;
    if (b->max_logical > acc->max_logical) acc->max_logical = b->max_logical;
    if (b->max_scratch > acc->max_scratch) acc->max_scratch = b->max_scratch;
    if (b->max_split_logical > acc->max_split_logical) acc->max_split_logical = b->max_split_logical;
    if (b->max_split_local > acc->max_split_local) acc->max_split_local = b->max_split_local;
    if (b->max_flops > acc->max_flops) acc->max_flops = b->max_flops;
    if (b->max_time > acc->max_time) acc->max_time = b->max_time;
    acc->matrices += b->matrices;
}

double ts_plan_muon_owner_share(double dense, double experts, double largest, int ranks,
                                int edp)
{
    const double share = dense / (ranks > 1 ? ranks : 1) + experts / (edp > 1 ? edp : 1);
    return share > largest ? share : largest;
}

ts_plan_muon *ts_plan_muon_layers(const ts_model_config *mc, const ts_cluster *cl,
                                  const ts_kernels *k, int tp, int ep, int etp, int ns_steps,
                                  ts_link tp_link, ts_link etp_link)
{
    const int n = mc->n_layer + 2;
    ts_plan_muon *out = ts_calloc((size_t)n, sizeof *out);
    const bool xgrid = mc->moe_experts > 0 && (ep > 1 || etp > 1);
    ts_model_spec spec = {.arch = mc, .k = k, .tp = ts_tp_make(tp, 0, NULL, k),
                          .ep_size = xgrid ? ep : 1, .etp_size = xgrid ? etp : 1};
    ts_model m; /* the layout only (model_cost.c's, whose floats it matches) */
    ts_model_layout(&m, &spec);
    for (int l = 0; l < n; l++) {
        const ts_layer *ly = &m.layers[l];
        for (int p = ly->first_param; p < ly->first_param + ly->n_params; p++) {
            if (!ts_param_is_muon(&m, p)) continue;
            const ts_param *P = &m.params[p];
            const bool expert = xgrid && P->expert;
            const int group = P->shard.parts > 1 ? (expert ? etp : tp) : 1;
            ts_plan_muon_add(&out[l], cl, ns_steps, (double)P->shard.shape[0],
                             (double)P->shard.shape[1], (double)P->numel,
                             (double)((P->numel + 15) / 16 * 16), group,
                             expert ? etp_link : tp_link, expert);
        }
    }
    ts_model_free(&m);
    return out;
}
