/* The price of an MoE block's expert phase (moe_cost.h). */
#include "plan/moe_cost.h"

#include <math.h>

#include "plan/model_cost.h"

/* One (m, n, k) GEMM at the efficiency its size reaches, times `factor` (model_cost.c's
 * rule; the experts' grouped GEMMs pass grouped_gemm_efficiency). */
static double gemm(const ts_cluster *cl, double m, double n, double k, double factor)
{
    const double work = m * n * k;
    if (work <= 0) return 0.0;
    return 2.0 * work / (ts_cluster_peak(cl) * ts_cluster_efficiency(cl, cbrt(work)) * factor);
}

/* An elementwise pass of `bytes` over `elements`: memory time, or with the cluster's
 * measured time per element of the activation kernel (SwiGLU takes gelu's, as the dense
 * llama blocks do) the larger of the two. */
static double pass(const ts_cluster *cl, double bytes, double elements, int dir, bool activation)
{
    const double t = bytes / cl->memory_bandwidth;
    const double per = activation ? cl->elem_time[TS_ELEM_GELU][dir] : 0.0;
    return per > 0 && elements * per > t ? elements * per : t;
}

int ts_plan_ep_in_node(int ep, int etp, int devices_per_node)
{
    /* Rank 0's group: ranks 0, etp, 2 etp, ...; those below devices_per_node share its
     * node (the ranks of a node are consecutive). */
    const long long in = ((long long)devices_per_node + etp - 1) / etp;
    return in >= ep ? ep : (int)(in > 1 ? in : 1);
}

double ts_plan_a2a_time(const ts_cluster *cl, double bytes, int ep, int ep_in_node)
{
    if (ep <= 1) return 0.0;
    const double eff = cl->a2a_efficiency > 0 ? cl->a2a_efficiency : 1.0;
    const double intra = bytes * (ep_in_node - 1) / ep / (cl->intra.bandwidth * eff);
    const double inter = bytes * (ep - ep_in_node) / ep / (cl->inter.bandwidth * eff);
    const double lat = ep_in_node < ep ? cl->inter.latency : cl->intra.latency;
    return lat + (intra > inter ? intra : inter);
}

void ts_plan_moe_block_cost(const ts_model_config *mc, const ts_cluster *cl,
                            const ts_plan_moe *moe, double N, int tp, bool sp, ts_link tp_link,
                            double ab, ts_plan_moe_block *out)
{
    const double C = mc->n_embd, E = mc->moe_experts, K = mc->moe_top_k;
    const double F = mc->moe_ffn_hidden, SF = (double)mc->moe_shared_experts * F;
    const int ep = moe->ep > 1 ? moe->ep : 1, etp = moe->etp > 1 ? moe->etp : 1;
    /* Imbalance moves rows between ep ranks; one rank holding every expert does all of
     * them however they are routed. */
    const double imb = ep > 1 && moe->imbalance >= 1.0 ? moe->imbalance : 1.0;
    const double gg = cl->grouped_gemm_efficiency > 0 ? cl->grouped_gemm_efficiency : 1.0;
    /* The MoE's rows (router, shared experts) and the rows sent to the experts. */
    const double Nr = sp ? N / tp : N;
    const bool shares = (ep > 1 || etp > 1) && tp > 1 && !sp;
    const double R = shares ? N / tp : Nr;
    /* Balanced: each rank's E/ep experts receive R*k rows from the ep group, and each etp
     * rank sees its group's etp times that, on an F/etp slice. */
    const double local = E / ep, rows = R * K * etp * ep / E, Fl = F / etp;
    out->rows_per_expert = rows;
    out->router_f = gemm(cl, Nr, E, C, 1.0);
    out->router_b = 2.0 * out->router_f;
    out->experts_f = imb * local * (gemm(cl, rows, 2.0 * Fl, C, gg) + gemm(cl, rows, C, Fl, gg));
    out->experts_b = 2.0 * out->experts_f;
    out->shared_f = SF > 0 ? gemm(cl, Nr, 2.0 * SF, C, 1.0) + gemm(cl, Nr, C, SF, 1.0) : 0.0;
    out->shared_b = 2.0 * out->shared_f;
    /* SwiGLU (read gate and up, write the product) over the routed and the shared rows;
     * the permutation (read, write R*k rows), the unpermutation and the weighted combine
     * (read R*k rows, write them and the R combined ones); the router's softmax and
     * selection (3 passes over Nr x E fp32 scores). */
    const double act = imb * 3.0 * R * K * F + 3.0 * Nr * SF;
    const double moves = ab * (4.0 * R * K * C + R * C) + 4.0 * 3.0 * Nr * E;
    out->elem_f = pass(cl, ab * act, act / 3.0, 0, true) + pass(cl, moves, 0, 0, false);
    out->elem_b = pass(cl, 2.0 * ab * act, act / 3.0, 1, true) + pass(cl, 2.0 * moves, 0, 1, false);
    /* The ep exchanges: dispatch and combine, forward and backward. */
    const double bytes = R * K * C * ab;
    out->a2a_bytes = ep > 1 ? bytes * (ep - 1) / ep : 0.0;
    const double x = ts_plan_a2a_time(cl, bytes, ep, moe->ep_in_node > 0 ? moe->ep_in_node : ep);
    out->a2a_f = out->a2a_b = 2.0 * x;
    /* The shared experts' compute hides what it can (not where communication runs on the
     * compute cores). */
    const bool hide = moe->hide_shared && !cl->comm_on_compute;
    out->hidden_f = hide ? fmin(out->a2a_f, out->shared_f) : 0.0;
    out->hidden_b = hide ? fmin(out->a2a_b, out->shared_b) : 0.0;
    /* etp: the rows gathered over the group, the partial outputs reduce-scattered. */
    const double ag = ts_plan_allgather_time(etp * R * K * C * ab, etp, moe->etp_link);
    out->etp_f = out->etp_b = 2.0 * ag;
    /* The tp group's share gathers (moe.c gather_shares). */
    out->tp_f = shares ? ts_plan_allgather_time(N * C * ab, tp, tp_link) : 0.0;
    out->tp_b = shares ? ts_plan_allgather_time(N * C * ab, tp, tp_link) +
                             ts_plan_allgather_time(N * K * 4.0, tp, tp_link)
                       : 0.0;
}
