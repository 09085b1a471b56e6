/* The expert grid, folded over the dense one (Megatron's "MoE parallel folding", arXiv
 * 2504.14960): the same ranks, the same pipeline stages, but inside each stage the
 * tp x cp x dp ranks are read again as etp x ep x edp. Pure rank arithmetic, as grid.c.
 *
 * Why folding: an expert layer's parallelism need not follow the attention's. Attention
 * wants tp (and cp) for its long sequences; experts want ep (each rank a few whole
 * experts, tokens moved by all-to-all) and little or no tensor splitting of an expert
 * (etp = 1 for fine-grained experts). Folding lets ep take ranks from tp, cp and dp at
 * once: ep = 8 on tp 2 x dp 4 is legal, where an expert axis carved out of dp alone
 * (the older "ep divides dp" rule) would cap it at 4.
 *
 * The stage index. Every rank of a stage (same pp coordinate) has an index
 * d = 0 .. tp*cp*dp - 1: its coordinates on the three dense axes in the grid's own order
 * with pp left out (for "tp-cp-dp-pp", d = tp + TP*(cp + CP*dp)). Then
 *     etp = d % ETP,   ep = (d / ETP) % EP,   edp = d / (ETP * EP)
 * (etp fastest: Megatron's expert order "tp-cp-ep-dp-pp" with cp folded into ep and
 * dp). ETP * EP must divide tp * cp * dp; EDP is the quotient. Under the default order
 * the etp group is etp consecutive ranks (inside a tp group when etp divides tp, so an
 * expert's tensor split stays on the fast links tp uses), and the ep group strides by
 * ETP. Ranks with the same (etp, ep) hold the same experts' shards: they form edp, the
 * group an expert parameter's gradient is reduced (and its ZeRO state sharded) over. */
#include "topology/expert_grid.h"

static bool divides(int a, int b) { return a > 0 && b % a == 0; }

ts_status ts_expert_grid_init(ts_expert_grid *x, const ts_grid *g, int ep, int etp)
{
    const int stage = g->world / g->size[TS_AXIS_PP];
    if (ep < 1 || etp < 1)
        return ts_fail("parallel.ep = %d, parallel.etp = %d: each must be >= 1", ep, etp);
    if ((long long)ep * etp > stage || !divides(ep * etp, stage))
        return ts_fail("parallel.ep * parallel.etp = %d * %d must divide tp * cp * dp = %d * %d "
                       "* %d = %d (the ranks of a pipeline stage, which the expert grid "
                       "folds over)",
                       ep, etp, g->size[TS_AXIS_TP], g->size[TS_AXIS_CP], g->size[TS_AXIS_DP],
                       stage);
    x->etp = etp;
    x->ep = ep;
    x->edp = stage / (ep * etp);
    return TS_OK;
}

int ts_grid_stage_index(const ts_grid *g, int rank)
{
    const ts_coords c = ts_grid_coords(g, rank);
    int d = 0, scale = 1;
    for (int i = 0; i < TS_N_AXES; i++) {
        const ts_axis a = g->order[i];
        if (a == TS_AXIS_PP) continue;
        d += ts_coords_get(c, a) * scale;
        scale *= g->size[a];
    }
    return d;
}

int ts_grid_stage_rank(const ts_grid *g, int pp, int index)
{
    TS_ASSERT(pp >= 0 && pp < g->size[TS_AXIS_PP]);
    TS_ASSERT(index >= 0 && index < g->world / g->size[TS_AXIS_PP]);
    ts_coords c = { .pp = pp };
    for (int i = 0; i < TS_N_AXES; i++) {
        const ts_axis a = g->order[i];
        if (a == TS_AXIS_PP) continue;
        const int v = index % g->size[a];
        index /= g->size[a];
        if (a == TS_AXIS_TP) c.tp = v;
        else if (a == TS_AXIS_CP) c.cp = v;
        else c.dp = v;
    }
    return ts_grid_rank(g, c);
}

ts_expert_coords ts_expert_grid_coords(const ts_expert_grid *x, const ts_grid *g, int rank)
{
    const int d = ts_grid_stage_index(g, rank);
    ts_expert_coords c = { .etp = d % x->etp, .ep = d / x->etp % x->ep,
                           .edp = d / (x->etp * x->ep) };
    return c;
}

static int size_of(const ts_expert_grid *x, ts_expert_axis axis)
{
    return axis == TS_EXPERT_ETP ? x->etp : axis == TS_EXPERT_EP ? x->ep : x->edp;
}

int ts_expert_grid_group(const ts_expert_grid *x, const ts_grid *g, int rank,
                         ts_expert_axis axis, int *members)
{
    const ts_expert_coords c = ts_expert_grid_coords(x, g, rank);
    const int pp = ts_grid_coords(g, rank).pp, n = size_of(x, axis);
    for (int k = 0; k < n; k++) {
        ts_expert_coords m = c;
        if (axis == TS_EXPERT_ETP) m.etp = k;
        else if (axis == TS_EXPERT_EP) m.ep = k;
        else m.edp = k;
        members[k] = ts_grid_stage_rank(g, pp, m.etp + x->etp * (m.ep + x->ep * m.edp));
    }
    return n;
}

const char *ts_expert_axis_name(ts_expert_axis axis)
{
    return axis == TS_EXPERT_ETP ? "etp" : axis == TS_EXPERT_EP ? "ep" : "edp";
}
