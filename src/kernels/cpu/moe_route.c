/* The mixture-of-experts router's kernels (kernels.h, "mixture of experts"): scores and
 * the top-K selection, the weights' backward into the logits, the auxiliary losses and
 * the per-expert counts. Everything here is fp32 or int32 whatever the table's act_dtype,
 * so the fp32 and bf16 tables share these entry points.
 *
 * Determinism: each row is one thread's, with its sums in a fixed order; what crosses
 * rows (the losses, a sequence's expert counts) is summed in row order afterwards, so
 * any thread count gives the same bits. The selection is repeated arg-max scans from
 * the lowest index with a strict ">", which is what makes ties go to the lower index. */
#include <math.h>
#include <stdlib.h>

#include "core/error.h"
#include "kernels/cpu/cpu_internal.h"

/* E is small (8 to 256 experts): per-row scratch lives on the stack up to this many. */
#define TS_MOE_MAX_E 1024

static void check_routing(const ts_moe_routing *r)
{
    TS_ASSERT(r->E >= 1 && r->E <= TS_MOE_MAX_E && r->K >= 1 && r->K <= r->E);
    if (r->groups > 1) {
        /* kernels.h's rules; the config refuses what breaks them before a run starts */
        TS_ASSERT(r->E % r->groups == 0 && r->topk_groups >= 1 && r->topk_groups <= r->groups &&
                  r->K % r->topk_groups == 0 && r->K / r->topk_groups <= r->E / r->groups);
    }
}

/* scores[0..E) of one row of logits: softmax (max subtracted; the sum in double) or
 * sigmoid. */
static void row_scores(const ts_moe_routing *r, float *s, const float *x)
{
    const int E = r->E;
    if (r->sigmoid) {
        for (int e = 0; e < E; e++) s[e] = 1.0f / (1.0f + expf(-x[e]));
        return;
    }
    float mx = ts_cpu_max(x, E);
    double sum = 0.0;
    for (int e = 0; e < E; e++) {
        s[e] = expf(x[e] - mx);
        sum += s[e];
    }
    for (int e = 0; e < E; e++) s[e] = (float)(s[e] / sum);
}

/* The index of the largest v[i] over i in [lo, hi) with allowed[i], the lowest index
 * among equals; -1 when none is allowed. The first allowed index is taken before any
 * comparison, so a NaN cannot leave the choice empty. */
static int arg_max(const float *v, const unsigned char *allowed, int lo, int hi)
{
    int best = -1;
    for (int i = lo; i < hi; i++)
        if (allowed[i] && (best < 0 || v[i] > v[best])) best = i;
    return best;
}

/* One row's selection over sel[0..E): topk_idx[0..K) in descending order of sel. With
 * groups, a group's score is the sum (largest first, in fp32) of its top K/topk_groups
 * values, and only the topk_groups best groups' experts stay allowed. */
static void row_select(const ts_moe_routing *r, int *idx, const float *sel)
{
    const int E = r->E, K = r->K;
    unsigned char allowed[TS_MOE_MAX_E];
    for (int e = 0; e < E; e++) allowed[e] = 1;
    if (r->groups > 1 && r->topk_groups < r->groups) {
        const int G = r->groups, per = E / G, take = K / r->topk_groups;
        float gscore[TS_MOE_MAX_E];
        unsigned char gkeep[TS_MOE_MAX_E];
        for (int g = 0; g < G; g++) {
            float sum = 0.0f;
            for (int j = 0; j < take; j++) {
                int i = arg_max(sel, allowed, g * per, (g + 1) * per);
                sum += sel[i];
                allowed[i] = 0;
            }
            for (int e = g * per; e < (g + 1) * per; e++) allowed[e] = 1;
            gscore[g] = sum;
            gkeep[g] = 1;
        }
        /* the topk_groups best groups: repeated arg-max over the groups, lower index
         * first among equals; the rest lose their experts */
        unsigned char chosen[TS_MOE_MAX_E] = {0};
        for (int j = 0; j < r->topk_groups; j++) {
            int g = arg_max(gscore, gkeep, 0, G);
            gkeep[g] = 0;
            chosen[g] = 1;
        }
        for (int e = 0; e < E; e++) allowed[e] = chosen[e / per];
    }
    for (int k = 0; k < K; k++) {
        int i = arg_max(sel, allowed, 0, E);
        TS_ASSERT(i >= 0);
        idx[k] = i;
        allowed[i] = 0;
    }
}

void ts_cpu_moe_route_forward(const ts_moe_routing *r, float *scores, int *topk_idx, float *topk_w,
                              const float *logits, const float *bias, int N)
{
    check_routing(r);
    const int E = r->E, K = r->K;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *s = scores + (size_t)n * E;
        int *idx = topk_idx + (size_t)n * K;
        float *w = topk_w + (size_t)n * K;
        row_scores(r, s, logits + (size_t)n * E);
        float sel[TS_MOE_MAX_E];
        for (int e = 0; e < E; e++) sel[e] = bias ? s[e] + bias[e] : s[e];
        row_select(r, idx, sel);
        /* the weights come from the scores, never from the bias */
        float sum = 0.0f;
        for (int k = 0; k < K; k++) {
            w[k] = s[idx[k]];
            sum += w[k];
        }
        const float denom = sum + 1e-20f;
        for (int k = 0; k < K; k++) w[k] = (r->norm_topk ? w[k] / denom : w[k]) * r->route_scale;
    }
}

/* dlogits[0..E) of one row from ds[0..E), the gradient of its scores s: through the
 * sigmoid, s (1 - s) ds; through the softmax (every score depends on every logit),
 * s_e (ds_e - sum_j s_j ds_j), the sum in double over the row in order. */
static void scores_backward(const ts_moe_routing *r, float *dx, const double *ds, const float *s)
{
    const int E = r->E;
    if (r->sigmoid) {
        for (int e = 0; e < E; e++) dx[e] = (float)(ds[e] * s[e] * (1.0 - s[e]));
        return;
    }
    double dot = 0.0;
    for (int e = 0; e < E; e++) dot += (double)s[e] * ds[e];
    for (int e = 0; e < E; e++) dx[e] = (float)(s[e] * (ds[e] - dot));
}

/* With v_k = s[idx_k], S = sum_k v_k + 1e-20 and w_k = c v_k / S (c = route_scale):
 * dv_j = (c / S) (dw_j - sum_k dw_k v_k / S); without norm_topk dv_j = c dw_j. The
 * chosen experts are distinct, so ds[idx_j] = dv_j and the other scores get 0. */
void ts_cpu_moe_route_backward(const ts_moe_routing *r, float *dlogits, const float *dtopk_w,
                               const float *scores, const int *topk_idx, int N)
{
    check_routing(r);
    const int E = r->E, K = r->K;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *s = scores + (size_t)n * E, *dw = dtopk_w + (size_t)n * K;
        const int *idx = topk_idx + (size_t)n * K;
        double ds[TS_MOE_MAX_E];
        for (int e = 0; e < E; e++) ds[e] = 0.0;
        const double c = r->route_scale;
        if (r->norm_topk) {
            /* the forward's denominator, recomputed in the forward's fp32 order */
            float sumf = 0.0f;
            for (int k = 0; k < K; k++) sumf += s[idx[k]];
            const double S = (double)(sumf + 1e-20f);
            double dot = 0.0; /* sum_k dw_k v_k / S */
            for (int k = 0; k < K; k++) dot += (double)dw[k] * s[idx[k]];
            dot /= S;
            for (int k = 0; k < K; k++) ds[idx[k]] = c * ((double)dw[k] - dot) / S;
        } else {
            for (int k = 0; k < K; k++) ds[idx[k]] = c * dw[k];
        }
        scores_backward(r, dlogits + (size_t)n * E, ds, s);
    }
}

/* A sequence's expert counts: cnt[e] = tokens among rows [n0, n0 + T) whose top-K holds
 * e (the K experts of a token are distinct, so this counts topk_idx entries). */
static void sequence_counts(int *cnt, const int *topk_idx, int n0, int T, int K, int E)
{
    for (int e = 0; e < E; e++) cnt[e] = 0;
    for (size_t a = (size_t)n0 * K; a < (size_t)(n0 + T) * K; a++) {
        TS_ASSERT(topk_idx[a] >= 0 && topk_idx[a] < E);
        cnt[topk_idx[a]]++;
    }
}

/* One row's balance-loss term: with dp_i = ac * c_i (ac = ca aux_scale E / (K T^2), c
 * its sequence's counts) the row's share sum_i dp_i p_i of the loss is returned and its
 * gradient through p = s / sum(s) and the scores' Jacobian added into dx. */
static double balance_row(const ts_moe_routing *r, float *dx, const float *s, const int *c,
                          double ac)
{
    const int E = r->E;
    if (E < 1) return 0.0; /* (check_routing's; said again for the compiler's view of ds) */
    double S = 0.0;
    for (int e = 0; e < E; e++) S += s[e];
    double dp[TS_MOE_MAX_E], dot = 0.0, term = 0.0;
    for (int e = 0; e < E; e++) {
        dp[e] = ac * c[e];
        term += dp[e] * s[e];
        dot += dp[e] * (s[e] / S);
    }
    /* p = s / S: ds_j = (dp_j - sum_i dp_i p_i) / S */
    double ds[TS_MOE_MAX_E];
    for (int e = 0; e < E; e++) ds[e] = (dp[e] - dot) / S;
    float g[TS_MOE_MAX_E];
    scores_backward(r, g, ds, s);
    for (int e = 0; e < E; e++) dx[e] += g[e];
    return term / S;
}

/* dp_i = ca aux_scale f_i / T with f_i = E cnt_i / (K T): the factor of cnt_i. */
static double balance_coef(const ts_moe_routing *r, int T, float ca, float aux_scale)
{
    return (double)ca * aux_scale * r->E / ((double)r->K * T * T);
}

/* Per row: the z-loss term lse^2 (lse = logsumexp of the logits, in double) with its
 * gradient 2 lse softmax(logits) (times cz z_scale), and the balance loss's row term
 * (balance_row). The rows' loss terms go to per-row slots, summed in row order after
 * the parallel loop, so the totals do not depend on the thread count. */
void ts_cpu_moe_aux_forward_backward(const ts_moe_routing *r, float *z_loss, float *aux_loss,
                                     float *dlogits, const float *logits, const float *scores,
                                     const int *topk_idx, int N, int T, float cz, float ca,
                                     float z_scale, float aux_scale)
{
    check_routing(r);
    const int E = r->E, K = r->K;
    const bool do_z = cz != 0.0f, do_aux = ca != 0.0f;
    if (!do_z && !do_aux) return;
    TS_ASSERT(T >= 1 && N % T == 0);
    const int nseq = N / T;
    int *cnt = do_aux ? ts_malloc((size_t)nseq * E * sizeof *cnt) : NULL;
    double *zrow = ts_malloc((size_t)N * sizeof *zrow);
    double *arow = ts_malloc((size_t)N * sizeof *arow);
    if (do_aux) {
#pragma omp parallel for schedule(static)
        for (int q = 0; q < nseq; q++)
            sequence_counts(cnt + (size_t)q * E, topk_idx, q * T, T, K, E);
    }
    const double zc = (double)cz * z_scale;
    const double ac = balance_coef(r, T, ca, aux_scale);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * E, *s = scores + (size_t)n * E;
        float *dx = dlogits + (size_t)n * E;
        zrow[n] = arow[n] = 0.0;
        if (do_z) {
            const double mx = ts_cpu_max(x, E);
            double sum = 0.0;
            for (int e = 0; e < E; e++) sum += exp((double)x[e] - mx);
            const double lse = mx + log(sum);
            zrow[n] = lse * lse;
            const double g = zc * 2.0 * lse / sum;
            for (int e = 0; e < E; e++) dx[e] += (float)(g * exp((double)x[e] - mx));
        }
        if (do_aux) arow[n] = balance_row(r, dx, s, cnt + (size_t)(n / T) * E, ac);
    }
    double zsum = 0.0, asum = 0.0;
    for (int n = 0; n < N; n++) zsum += zrow[n], asum += arow[n];
    if (do_z) *z_loss += (float)(zc * zsum);
    if (do_aux) *aux_loss += (float)asum;
    free(cnt), free(zrow), free(arow);
}

/* The same rows' terms from the caller's whole-sequence counts (kernels.h); summed in
 * row order after the parallel loop, as above. */
void ts_cpu_moe_balance_forward_backward(const ts_moe_routing *r, float *aux_loss,
                                         float *dlogits, const float *scores,
                                         const int *seq_counts, int N, int row0,
                                         int rows_per_seq, int T, float ca, float aux_scale)
{
    check_routing(r);
    if (ca == 0.0f || N <= 0) return;
    TS_ASSERT(row0 >= 0 && rows_per_seq >= 1 && T >= rows_per_seq);
    const int E = r->E;
    double *arow = ts_malloc((size_t)N * sizeof *arow);
    const double ac = balance_coef(r, T, ca, aux_scale);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const size_t q = (size_t)(row0 + n) / (size_t)rows_per_seq;
        arow[n] = balance_row(r, dlogits + (size_t)n * E, scores + (size_t)n * E,
                              seq_counts + q * E, ac);
    }
    double asum = 0.0;
    for (int n = 0; n < N; n++) asum += arow[n];
    *aux_loss += (float)asum;
    free(arow);
}

/* Integer counts: one pass in row order (N*K increments; far below the experts' GEMMs). */
void ts_cpu_moe_count(int *counts, const int *topk_idx, int N, int K, int E)
{
    for (size_t a = 0; a < (size_t)N * K; a++) {
        if (topk_idx[a] == TS_MOE_DROPPED) continue; /* over its expert's capacity */
        TS_ASSERT(topk_idx[a] >= 0 && topk_idx[a] < E);
        counts[topk_idx[a]]++;
    }
}
