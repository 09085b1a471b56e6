/* The mixture-of-experts kernels (kernels.h, "mixture of experts") of the CPU tables,
 * against naive references written here in double precision:
 * - routing: scores (softmax, sigmoid), the top-K selection by another algorithm (a
 *   stable sort of the allowed experts, groups ranked by a sort of their summed top
 *   values) on the kernel's own fp32 selection values, the weights; ties checked on
 *   planted rows with the expected indices written out;
 * - route backward and the auxiliary losses' gradients against central differences of
 *   the double-precision objective (selection held fixed), and the losses' values;
 * - count, offsets, permute (exact bits and rows), combine and the backwards, in fp32
 *   and bf16 storage (bf16: exactly the fp32 kernel's result rounded once);
 * - the balance loss from given whole-sequence counts (moe_balance_forward_backward) on
 *   rows cut as sequence parallelism cuts them and split as context parallelism splits
 *   them: each row's gradient the whole-sequence kernel's bits, the parts' losses its sum;
 * - the same bits at 1, 2 and 3 threads; the strict table's entries on strict memory;
 * - the capacity (moe_capacity) against a reference by another algorithm (each
 *   assignment's rank counted among its sequence's and expert's), with planted ties,
 *   -0 against +0, an empty expert and capacities 0, 1, 2, 5 and T; hand-written cases
 *   with their expected keeps; the dispatch kernels on a kept set (dropped: no count,
 *   no row, no term, a zero weight gradient; a token with every choice dropped gives 0);
 *   the strict table's bits;
 * - the grouped expert GEMMs against the per-expert matmul loop: fp32 bit for bit (even
 *   and skewed rows, empty experts, each gradient alone, 1-3 threads), bf16's runtime-M
 *   primitives against the fixed-M ones, the strict table;
 * - planted wrong results that the comparisons must reject (so this test can fail).
 * Sizes are odd (N 37 and 39, C 45 and 600, E 8, 12, 16) and the whole run is fast. */
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cpu/bf16.h"
#include "kernels/kernels.h"
#include "test_util.h"

static const ts_kernels *K32 = &ts_kernels_cpu;
static const ts_kernels *K16 = &ts_kernels_cpu_bf16;

#define MAXE 64

/* ---- comparisons (each rejects a planted wrong result below) ------------------- */

/* Every |got - ref| <= rel |ref| + abs_. */
static bool close_each(const float *got, const double *ref, size_t n, double rel, double abs_)
{
    for (size_t i = 0; i < n; i++)
        if (!(fabs((double)got[i] - ref[i]) <= rel * fabs(ref[i]) + abs_)) return false;
    return true;
}

/* max |got - ref| <= rel * max |ref| (a gradient against finite differences). */
static bool close_max(const float *got, const double *ref, size_t n, double rel)
{
    double md = 0.0, mr = 0.0;
    for (size_t i = 0; i < n; i++) {
        md = fmax(md, fabs((double)got[i] - ref[i]));
        mr = fmax(mr, fabs(ref[i]));
    }
    return md <= rel * mr;
}

static bool same_ints(const int *a, const int *b, size_t n)
{
    return memcmp(a, b, n * sizeof(int)) == 0;
}

static float *nan_floats(size_t n)
{
    float *f = ts_alloc_floats(n);
    for (size_t i = 0; i < n; i++) f[i] = NAN;
    return f;
}

/* ---- references ------------------------------------------------------------------ */

static void ref_scores(const ts_moe_routing *r, double *s, const double *x)
{
    if (r->sigmoid) {
        for (int e = 0; e < r->E; e++) s[e] = 1.0 / (1.0 + exp(-x[e]));
        return;
    }
    double mx = x[0], sum = 0.0;
    for (int e = 1; e < r->E; e++) mx = fmax(mx, x[e]);
    for (int e = 0; e < r->E; e++) sum += exp(x[e] - mx);
    for (int e = 0; e < r->E; e++) s[e] = exp(x[e] - mx) / sum;
}

/* Indices ord[0..n) sorted by v descending, equal values by lower index (a stable
 * insertion sort of the ascending indices). */
static void sort_desc(int *ord, const double *v, int n)
{
    for (int i = 0; i < n; i++) ord[i] = i;
    for (int i = 1; i < n; i++) {
        int cur = ord[i], j = i - 1;
        while (j >= 0 && v[ord[j]] < v[cur]) {
            ord[j + 1] = ord[j];
            j--;
        }
        ord[j + 1] = cur;
    }
}

/* The selection over sel[0..E) (fp32 values, compared exactly). */
static void ref_select(const ts_moe_routing *r, int *idx, const float *sel)
{
    const int E = r->E;
    bool allowed[MAXE];
    for (int e = 0; e < E; e++) allowed[e] = true;
    if (r->groups > 1) {
        const int G = r->groups, per = E / G, take = r->K / r->topk_groups;
        double gs[MAXE];
        for (int g = 0; g < G; g++) {
            double v[MAXE];
            int ord[MAXE];
            for (int j = 0; j < per; j++) v[j] = sel[g * per + j];
            sort_desc(ord, v, per);
            gs[g] = 0.0;
            for (int j = 0; j < take; j++) gs[g] += v[ord[j]];
        }
        int gord[MAXE];
        sort_desc(gord, gs, G);
        for (int e = 0; e < E; e++) allowed[e] = false;
        for (int j = 0; j < r->topk_groups; j++)
            for (int e = gord[j] * per; e < (gord[j] + 1) * per; e++) allowed[e] = true;
    }
    double v[MAXE];
    int ord[MAXE];
    for (int e = 0; e < E; e++) v[e] = allowed[e] ? (double)sel[e] : -INFINITY;
    sort_desc(ord, v, E);
    for (int k = 0; k < r->K; k++) idx[k] = ord[k];
}

static void ref_weights(const ts_moe_routing *r, double *w, const double *s, const int *idx)
{
    double sum = 0.0;
    for (int k = 0; k < r->K; k++) sum += s[idx[k]];
    for (int k = 0; k < r->K; k++)
        w[k] = (r->norm_topk ? s[idx[k]] / (sum + 1e-20) : s[idx[k]]) * r->route_scale;
}

/* sum_{n,k} dw[n,k] w[n,k](x), the selection fixed: route backward's objective. */
static double route_objective(const ts_moe_routing *r, const double *x, const int *idx,
                              const float *dw, int N)
{
    double L = 0.0;
    for (int n = 0; n < N; n++) {
        double s[MAXE], w[MAXE];
        ref_scores(r, s, x + (size_t)n * r->E);
        ref_weights(r, w, s, idx + (size_t)n * r->K);
        for (int k = 0; k < r->K; k++) L += dw[(size_t)n * r->K + k] * w[k];
    }
    return L;
}

typedef struct {
    float cz, ca, zs, as;
    int T;
} aux_args;

/* The auxiliary losses as MOE_DESIGN.md writes them, per sequence. */
static void ref_aux(const ts_moe_routing *r, double *z, double *aux, const double *x,
                    const int *idx, int N, const aux_args *a)
{
    const int E = r->E, K = r->K, T = a->T;
    *z = *aux = 0.0;
    for (int n = 0; n < N; n++) {
        double mx = x[(size_t)n * E], sum = 0.0;
        for (int e = 1; e < E; e++) mx = fmax(mx, x[(size_t)n * E + e]);
        for (int e = 0; e < E; e++) sum += exp(x[(size_t)n * E + e] - mx);
        double lse = mx + log(sum);
        *z += a->cz * lse * lse * a->zs;
    }
    for (int q = 0; q < N / T; q++) {
        double f[MAXE] = {0}, P[MAXE] = {0};
        for (int n = q * T; n < (q + 1) * T; n++) {
            for (int k = 0; k < K; k++) f[idx[(size_t)n * K + k]] += (double)E / ((double)K * T);
            double s[MAXE], S = 0.0;
            ref_scores(r, s, x + (size_t)n * E);
            for (int e = 0; e < E; e++) S += s[e];
            for (int e = 0; e < E; e++) P[e] += s[e] / S / T;
        }
        double L = 0.0;
        for (int e = 0; e < E; e++) L += f[e] * P[e];
        *aux += a->ca * L * a->as;
    }
}

static double aux_objective(const ts_moe_routing *r, const double *x, const int *idx, int N,
                            const aux_args *a)
{
    double z, aux;
    ref_aux(r, &z, &aux, x, idx, N, a);
    return z + aux;
}

/* Central differences of f at every x[i] (x double, restored after each). */
typedef double (*objective)(const ts_moe_routing *r, const double *x, const void *ctx);

typedef struct {
    const int *idx;
    const float *dw;
    int N;
    const aux_args *a;
} fd_ctx;

static double route_obj(const ts_moe_routing *r, const double *x, const void *p)
{
    const fd_ctx *c = p;
    return route_objective(r, x, c->idx, c->dw, c->N);
}

static double aux_obj(const ts_moe_routing *r, const double *x, const void *p)
{
    const fd_ctx *c = p;
    return aux_objective(r, x, c->idx, c->N, c->a);
}

static void fd_grad(double *g, const ts_moe_routing *r, const float *logits, size_t n, objective f,
                    const void *ctx)
{
    double *x = ts_malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = logits[i];
    const double h = 1e-5;
    for (size_t i = 0; i < n; i++) {
        double saved = x[i];
        x[i] = saved + h;
        double lp = f(r, x, ctx);
        x[i] = saved - h;
        double lm = f(r, x, ctx);
        x[i] = saved;
        g[i] = (lp - lm) / (2 * h);
    }
    free(x);
}

/* ---- routing on one configuration ------------------------------------------------ */

typedef struct {
    const char *name;
    ts_moe_routing r;
    bool with_bias;
} route_case;

/* Forward against the references, backward and the auxiliary losses against finite
 * differences, the planted failures, and the same bits at 1, 2 and 3 threads. */
static void test_route_case(const route_case *rc)
{
    const ts_moe_routing *r = &rc->r;
    const int N = 39, E = r->E, K = r->K;
    const size_t NE = (size_t)N * E, NKs = (size_t)N * K;
    float *logits = ts_test_rand_floats(NE, 2.0f);
    float *bias = rc->with_bias ? ts_test_rand_floats((size_t)E, 0.05f) : NULL;
    float *scores = nan_floats(NE), *w = nan_floats(NKs);
    int *idx = ts_malloc(NKs * sizeof *idx);
    K32->moe_route_forward(r, scores, idx, w, logits, bias, N);

    /* forward */
    double *sref = ts_malloc(NE * sizeof *sref), *wref = ts_malloc(NKs * sizeof *wref);
    int *iref = ts_malloc(NKs * sizeof *iref);
    for (int n = 0; n < N; n++) {
        double x[MAXE], sk[MAXE];
        float sel[MAXE];
        for (int e = 0; e < E; e++) x[e] = logits[(size_t)n * E + e];
        ref_scores(r, sref + (size_t)n * E, x);
        for (int e = 0; e < E; e++) {
            float s = scores[(size_t)n * E + e];
            sel[e] = bias ? s + bias[e] : s;
            sk[e] = s;
        }
        ref_select(r, iref + (size_t)n * K, sel);
        ref_weights(r, wref + (size_t)n * K, sk, idx + (size_t)n * K);
    }
    CHECKF(close_each(scores, sref, NE, 1e-6, 1e-9), "%s: scores", rc->name);
    CHECKF(same_ints(idx, iref, NKs), "%s: topk_idx", rc->name);
    CHECKF(close_each(w, wref, NKs, 1e-6, 1e-9), "%s: topk_w", rc->name);
    /* planted: a swapped pair of indices, a weight off by 1e-4 relative */
    int *bad_idx = ts_malloc(NKs * sizeof *bad_idx);
    memcpy(bad_idx, idx, NKs * sizeof *idx);
    int tmp = bad_idx[3 * K];
    bad_idx[3 * K] = bad_idx[3 * K + 1], bad_idx[3 * K + 1] = tmp;
    CHECKF(!same_ints(bad_idx, iref, NKs), "%s: planted swapped indices passed", rc->name);
    float saved = w[5];
    w[5] *= 1.0001f;
    CHECKF(!close_each(w, wref, NKs, 1e-6, 1e-9), "%s: planted weight passed", rc->name);
    w[5] = saved;

    /* backward against central differences of sum dw * w */
    float *dw = ts_test_rand_floats(NKs, 1.0f), *dlogits = nan_floats(NE);
    K32->moe_route_backward(r, dlogits, dw, scores, idx, N);
    double *g = ts_malloc(NE * sizeof *g);
    fd_ctx ctx = {.idx = idx, .dw = dw, .N = N};
    fd_grad(g, r, logits, NE, route_obj, &ctx);
    CHECKF(close_max(dlogits, g, NE, 1e-4), "%s: route backward", rc->name);
    /* planted: one element off by 1% of the largest; for softmax, the Jacobian on the
     * chosen experts only (the unchosen logits' gradient dropped) */
    double gmax = 0.0;
    for (size_t i = 0; i < NE; i++) gmax = fmax(gmax, fabs(g[i]));
    float *bad = ts_alloc_floats(NE);
    memcpy(bad, dlogits, NE * sizeof *bad);
    bad[7] += (float)(0.01 * gmax);
    CHECKF(!close_max(bad, g, NE, 1e-4), "%s: planted gradient passed", rc->name);
    /* Softmax: with norm_topk the weights are the softmax of the chosen logits alone
     * (Mixtral's form), so the other logits' gradient is 0 up to rounding; without it,
     * every logit has a gradient, and dropping the unchosen ones' must fail. */
    if (!r->sigmoid) {
        memcpy(bad, dlogits, NE * sizeof *bad);
        double unchosen = 0.0;
        for (int n = 0; n < N; n++)
            for (int e = 0; e < E; e++) {
                bool chosen = false;
                for (int k = 0; k < K; k++) chosen |= idx[(size_t)n * K + k] == e;
                if (chosen) continue;
                unchosen = fmax(unchosen, fabs(bad[(size_t)n * E + e]));
                bad[(size_t)n * E + e] = 0.0f;
            }
        if (r->norm_topk)
            CHECKF(unchosen <= 1e-6 * gmax, "%s: unchosen logits' gradient %g", rc->name,
                   unchosen);
        else
            CHECKF(!close_max(bad, g, NE, 1e-4), "%s: chosen-only Jacobian passed", rc->name);
    }

    /* auxiliary losses: z only, balance only, both; gradients added onto zeros and then
     * onto a random start; the losses added to what the outputs held */
    const aux_args cases[3] = {{0.1f, 0.0f, 1.0f / 65, 1.0f / 5, 13},
                               {0.0f, 0.3f, 1.0f / 65, 1.0f / 5, 13},
                               {0.1f, 0.3f, 1.0f / 65, 1.0f / 5, 13}};
    for (int c = 0; c < 3; c++) {
        const aux_args *a = &cases[c];
        float z = 0.25f, aux = 0.5f, *da = ts_alloc_floats(NE);
        K32->moe_aux_forward_backward(r, &z, &aux, da, logits, scores, idx, N, a->T, a->cz, a->ca,
                                      a->zs, a->as);
        double *xd = ts_malloc(NE * sizeof *xd), zr, ar;
        for (size_t i = 0; i < NE; i++) xd[i] = logits[i];
        ref_aux(r, &zr, &ar, xd, idx, N, a);
        free(xd);
        CHECKF(fabs((z - 0.25) - zr) <= 1e-5 * zr + 1e-7, "%s aux %d: z %g vs %g", rc->name, c,
               z - 0.25, zr);
        CHECKF(fabs((aux - 0.5) - ar) <= 1e-5 * ar + 1e-7, "%s aux %d: aux %g vs %g", rc->name, c,
               aux - 0.5, ar);
        CHECKF(a->cz != 0.0f || z == 0.25f, "%s: z-loss changed with cz 0", rc->name);
        CHECKF(a->ca != 0.0f || aux == 0.5f, "%s: aux loss changed with ca 0", rc->name);
        fd_ctx actx = {.idx = idx, .N = N, .a = a};
        fd_grad(g, r, logits, NE, aux_obj, &actx);
        CHECKF(close_max(da, g, NE, 1e-4), "%s aux %d: gradient", rc->name, c);
        memcpy(bad, da, NE * sizeof *bad);
        for (size_t i = 0; i < NE; i++) gmax = fmax(gmax, fabs(g[i]));
        bad[11] -= (float)(0.01 * gmax);
        CHECKF(!close_max(bad, g, NE, 1e-4), "%s aux %d: planted gradient passed", rc->name, c);
        /* a planted loss 1e-4 too large fails the value check */
        CHECKF(!(fabs((ar * 1.0001) - ar) <= 1e-5 * ar + 1e-7) || ar == 0.0,
               "%s aux %d: planted loss passed", rc->name, c);
        /* ADDED: onto a random start, the same gradient (up to the one fp32 add) */
        float *start = ts_test_rand_floats(NE, 1.0f), *acc = ts_alloc_floats(NE);
        memcpy(acc, start, NE * sizeof *acc);
        float z2 = 0.0f, a2 = 0.0f;
        K32->moe_aux_forward_backward(r, &z2, &a2, acc, logits, scores, idx, N, a->T, a->cz, a->ca,
                                      a->zs, a->as);
        double *want = ts_malloc(NE * sizeof *want);
        for (size_t i = 0; i < NE; i++) want[i] = (double)start[i] + da[i];
        CHECKF(close_each(acc, want, NE, 1e-6, 1e-7), "%s aux %d: not added", rc->name, c);
        free(start), free(acc), free(want), free(da);
    }

    /* the same bits at 1, 2 and 3 threads */
    const aux_args *a = &cases[2];
    float *s1 = NULL, *w1 = NULL, *d1 = NULL, *x1 = NULL, l1[2] = {0};
    int *i1 = NULL;
    bool same = true;
    for (int th = 1; th <= 3; th++) {
        omp_set_num_threads(th);
        float *s = nan_floats(NE), *ww = nan_floats(NKs), *d = nan_floats(NE);
        float *xa = ts_alloc_floats(NE), l[2] = {0};
        int *ii = ts_malloc(NKs * sizeof *ii);
        K32->moe_route_forward(r, s, ii, ww, logits, bias, N);
        K32->moe_route_backward(r, d, dw, s, ii, N);
        K32->moe_aux_forward_backward(r, &l[0], &l[1], xa, logits, s, ii, N, a->T, a->cz, a->ca,
                                      a->zs, a->as);
        if (th == 1) {
            s1 = s, w1 = ww, d1 = d, x1 = xa, i1 = ii, l1[0] = l[0], l1[1] = l[1];
            continue;
        }
        same &= ts_test_same_bits(s, s1, NE) && ts_test_same_bits(ww, w1, NKs) &&
                ts_test_same_bits(d, d1, NE) && ts_test_same_bits(xa, x1, NE) &&
                same_ints(ii, i1, NKs) && ts_test_same_bits(l, l1, 2);
        free(s), free(ww), free(d), free(xa), free(ii);
    }
    omp_set_num_threads(2);
    CHECKF(same, "%s: results differ between 1, 2 and 3 threads", rc->name);
    free(s1), free(w1), free(d1), free(x1), free(i1);

    printf("  %-44s ok\n", rc->name);
    free(logits), free(bias), free(scores), free(w), free(idx), free(sref), free(wref), free(iref);
    free(bad_idx), free(dw), free(dlogits), free(g), free(bad);
}

static void test_routing(void)
{
    const route_case cases[] = {
        {"softmax E8 K2 norm (Mixtral)", {8, 2, 1, 1, false, true, 1.0f}, false},
        {"softmax E16 K4 groups 4/2 norm, bias", {16, 4, 4, 2, false, true, 1.0f}, true},
        {"sigmoid E16 K4 groups 4/2 norm x2.5, bias", {16, 4, 4, 2, true, true, 2.5f}, true},
        {"softmax E8 K3 no norm (Qwen3 norm off)", {8, 3, 1, 1, false, false, 1.0f}, false},
        {"sigmoid E12 K2 no norm x1.5, bias", {12, 2, 1, 1, true, false, 1.5f}, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_route_case(&cases[i]);
}

/* ---- ties and the group rule, with the expected indices written out ------------ */

static void route_one(const ts_moe_routing *r, int *idx, float *w, const float *logits,
                      const float *bias)
{
    float scores[MAXE];
    K32->moe_route_forward(r, scores, idx, w, logits, bias, 1);
}

static void test_ties(void)
{
    int idx[8];
    float w[8];
    const ts_moe_routing soft = {8, 2, 1, 1, false, true, 1.0f};
    const float zeros[16] = {0};
    route_one(&soft, idx, w, zeros, NULL);
    CHECK(idx[0] == 0 && idx[1] == 1 && w[0] == 0.5f && w[1] == 0.5f);
    const float two_high[8] = {0, 1, 0, 0, 0, 0, 1, 0};
    route_one(&soft, idx, w, two_high, NULL);
    CHECK(idx[0] == 1 && idx[1] == 6);
    const float order[8] = {0, 0, 3, 0, 0, 3, 0, 1};
    const ts_moe_routing soft3 = {8, 3, 1, 1, false, true, 1.0f};
    route_one(&soft3, idx, w, order, NULL);
    CHECK(idx[0] == 2 && idx[1] == 5 && idx[2] == 7);
    CHECK(w[0] == w[1] && w[0] > w[2]);
    /* the bias chooses (3 and 6, tied: 3 first) but the weights are the scores */
    const ts_moe_routing sig = {8, 2, 1, 1, true, false, 1.0f};
    const float b[8] = {0, 0, 0, 0.1f, 0, 0, 0.1f, 0};
    route_one(&sig, idx, w, zeros, b);
    CHECK(idx[0] == 3 && idx[1] == 6 && w[0] == 0.5f && w[1] == 0.5f);
    /* groups, all equal: groups 0 and 1 kept, their first experts */
    const ts_moe_routing grp = {16, 4, 4, 2, false, true, 1.0f};
    route_one(&grp, idx, w, zeros, NULL);
    CHECK(idx[0] == 0 && idx[1] == 1 && idx[2] == 2 && idx[3] == 3);
    /* experts 9 and 13 high: groups 2 and 3 kept, so the ties after them go to 8 and 10
     * (without groups: 0 and 1) */
    float hi[16] = {0};
    hi[9] = hi[13] = 2.0f;
    route_one(&grp, idx, w, hi, NULL);
    CHECK(idx[0] == 9 && idx[1] == 13 && idx[2] == 8 && idx[3] == 10);
    const ts_moe_routing flat = {16, 4, 1, 1, false, true, 1.0f};
    route_one(&flat, idx, w, hi, NULL);
    CHECK(idx[0] == 9 && idx[1] == 13 && idx[2] == 0 && idx[3] == 1);
    /* a group scores the sum of its top K/topk_groups values, not its maximum: group 1
     * (2.5, 2.5) beats group 0 (3, -5) */
    const ts_moe_routing sum2 = {8, 2, 4, 1, true, true, 1.0f};
    const float gl[8] = {3, -5, 2.5f, 2.5f, -5, -5, -5, -5};
    route_one(&sum2, idx, w, gl, NULL);
    CHECK(idx[0] == 2 && idx[1] == 3);
    /* tied groups: the lower group index */
    const float tg[8] = {1, 0, -5, -5, 0, 1, -5, -5};
    route_one(&sum2, idx, w, tg, NULL);
    CHECK(idx[0] == 0 && idx[1] == 1);
    printf("  %-44s ok\n", "ties and groups");
}

/* ---- count, offsets, dispatch ---------------------------------------------------- */

/* A routing of N tokens over E experts whose last expert receives none. */
static int *planted_routing(int N, int K, int E)
{
    const ts_moe_routing r = {E, K, 1, 1, false, true, 1.0f};
    float *logits = ts_test_rand_floats((size_t)N * E, 2.0f), *bias = ts_alloc_floats((size_t)E);
    float *s = ts_alloc_floats((size_t)N * E), *w = ts_alloc_floats((size_t)N * K);
    bias[E - 1] = -10.0f;
    int *idx = ts_malloc((size_t)N * K * sizeof *idx);
    K32->moe_route_forward(&r, s, idx, w, logits, bias, N);
    free(logits), free(bias), free(s), free(w);
    return idx;
}

/* What permute must give: expert by expert, assignments in (n, k) order. */
static void ref_row_of(int *row_of, const int *idx, int NK, int E)
{
    int next = 0;
    for (int e = 0; e < E; e++)
        for (int a = 0; a < NK; a++)
            if (idx[a] == e) row_of[a] = next++;
}

typedef struct {
    int *counts, *offsets, *row_of;
    void *xp, *out, *dyp, *dx;
    float *dtw;
} dispatch_out;

/* permute, combine and the two backwards on table k (x, yp, dout in its dtype). */
static dispatch_out run_dispatch(const ts_kernels *k, const int *idx, const float *tw,
                                 const void *x, const void *yp, const void *dout, int N, int K,
                                 int C, int E)
{
    const size_t b = ts_dtype_bytes(k->act_dtype), NK = (size_t)N * K;
    dispatch_out o;
    o.counts = calloc((size_t)E, sizeof(int));
    o.offsets = ts_malloc((size_t)E * sizeof(int));
    o.row_of = ts_malloc(NK * sizeof(int));
    o.xp = ts_malloc(NK * C * b), o.dyp = ts_malloc(NK * C * b);
    o.out = ts_malloc((size_t)N * C * b), o.dx = ts_malloc((size_t)N * C * b);
    memset(o.xp, 0xff, NK * C * b), memset(o.dyp, 0xff, NK * C * b); /* NaN: unwritten */
    memset(o.out, 0xff, (size_t)N * C * b), memset(o.dx, 0xff, (size_t)N * C * b);
    o.dtw = nan_floats(NK);
    k->moe_count(o.counts, idx, N, K, E);
    CHECK(ts_moe_offsets(o.offsets, o.counts, E) == (int)NK);
    k->moe_permute(o.xp, o.row_of, x, idx, o.offsets, N, K, C, E);
    k->moe_combine(o.out, yp, tw, o.row_of, N, K, C);
    k->moe_combine_backward(o.dyp, o.dtw, dout, yp, tw, o.row_of, N, K, C);
    k->moe_permute_backward(o.dx, o.dyp, o.row_of, N, K, C);
    return o;
}

static void free_dispatch(dispatch_out *o)
{
    free(o->counts), free(o->offsets), free(o->row_of), free(o->xp), free(o->out), free(o->dyp);
    free(o->dx), free(o->dtw);
}

static bool same_dispatch(const dispatch_out *a, const dispatch_out *b, size_t N, size_t NK,
                          size_t C, size_t bytes, int E)
{
    return same_ints(a->counts, b->counts, (size_t)E) && same_ints(a->row_of, b->row_of, NK) &&
           !memcmp(a->xp, b->xp, NK * C * bytes) && !memcmp(a->out, b->out, N * C * bytes) &&
           !memcmp(a->dyp, b->dyp, NK * C * bytes) && !memcmp(a->dx, b->dx, N * C * bytes) &&
           ts_test_same_bits(a->dtw, b->dtw, NK);
}

static void test_dispatch_fp32(void)
{
    enum { N = 37, K = 3, E = 8, C = 45, NK = N * K };
    int *idx = planted_routing(N, K, E);
    float *tw = ts_test_rand_floats((size_t)NK, 1.0f);
    float *x = ts_test_rand_floats((size_t)N * C, 1.0f),
          *yp = ts_test_rand_floats((size_t)NK * C, 1.0f);
    float *dout = ts_test_rand_floats((size_t)N * C, 1.0f);
    dispatch_out o = run_dispatch(K32, idx, tw, x, yp, dout, N, K, C, E);

    int counts[8] = {0}, rows[NK];
    for (int a = 0; a < NK; a++) counts[idx[a]]++;
    CHECK(same_ints(o.counts, counts, (size_t)E) && counts[E - 1] == 0);
    int before = 0;
    bool offsets_ok = true;
    for (int e = 0; e < E; e++) offsets_ok &= o.offsets[e] == before, before += counts[e];
    CHECK(offsets_ok);
    ref_row_of(rows, idx, NK, E);
    CHECK(same_ints(o.row_of, rows, (size_t)NK));
    /* planted: an unstable order within an expert */
    int bad[NK];
    memcpy(bad, rows, sizeof bad);
    for (int a = 1; a < NK; a++)
        if (idx[a] == idx[0]) {
            int t = bad[0];
            bad[0] = bad[a], bad[a] = t;
            break;
        }
    CHECK(!same_ints(o.row_of, bad, (size_t)NK));
    bool copied = true;
    for (int a = 0; a < NK; a++)
        copied &=
            ts_test_same_bits((float *)o.xp + (size_t)rows[a] * C, x + (size_t)(a / K) * C, C);
    CHECK(copied);

    double *ref = ts_malloc((size_t)NK * C * sizeof *ref),
           *tol = ts_malloc((size_t)N * C * sizeof *tol);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            double s = 0.0, m = 0.0;
            for (int k = 0; k < K; k++) {
                double t = (double)tw[n * K + k] * yp[(size_t)rows[n * K + k] * C + c];
                s += t, m += fabs(t);
            }
            ref[n * C + c] = s, tol[n * C + c] = m;
        }
    bool ok = true;
    for (int i = 0; i < N * C; i++)
        ok &= fabs(((float *)o.out)[i] - ref[i]) <= 1e-6 * tol[i] + 1e-30;
    CHECKF(ok, "combine");
    /* dyp = w dout (one fp32 product), dtopk_w = <dout, yp row>, dx = sum of dyp rows */
    ok = true;
    for (int a = 0; a < NK; a++)
        for (int c = 0; c < C; c++)
            ok &=
                ((float *)o.dyp)[(size_t)rows[a] * C + c] == tw[a] * dout[(size_t)(a / K) * C + c];
    CHECKF(ok, "combine backward dyp");
    double dref[NK];
    for (int a = 0; a < NK; a++) {
        double s = 0.0;
        for (int c = 0; c < C; c++)
            s += (double)dout[(size_t)(a / K) * C + c] * yp[(size_t)rows[a] * C + c];
        dref[a] = s;
    }
    CHECKF(close_each(o.dtw, dref, (size_t)NK, 1e-5, 1e-6), "combine backward dtopk_w");
    float planted[NK];
    memcpy(planted, o.dtw, sizeof planted);
    planted[4] += 1e-3f;
    CHECK(!close_each(planted, dref, (size_t)NK, 1e-5, 1e-6));
    ok = true;
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            double s = 0.0, m = 0.0;
            for (int k = 0; k < K; k++) {
                double t = ((float *)o.dyp)[(size_t)rows[n * K + k] * C + c];
                s += t, m += fabs(t);
            }
            ok &= fabs(((float *)o.dx)[n * C + c] - s) <= 1e-6 * m + 1e-30;
        }
    CHECKF(ok, "permute backward");

    /* counts ACCUMULATE */
    K32->moe_count(o.counts, idx, N, K, E);
    ok = true;
    for (int e = 0; e < E; e++) ok &= o.counts[e] == 2 * counts[e];
    CHECKF(ok, "moe_count does not accumulate");

    /* the same bits at 1 and 3 threads as at 2 (a fresh run: o's counts were added to) */
    dispatch_out base = run_dispatch(K32, idx, tw, x, yp, dout, N, K, C, E);
    ok = true;
    for (int th = 1; th <= 3; th += 2) {
        omp_set_num_threads(th);
        dispatch_out t = run_dispatch(K32, idx, tw, x, yp, dout, N, K, C, E);
        ok &= same_dispatch(&t, &base, (size_t)N, (size_t)NK, (size_t)C, 4, E);
        free_dispatch(&t);
    }
    omp_set_num_threads(2);
    free_dispatch(&base);
    CHECKF(ok, "dispatch differs between 1, 2 and 3 threads");
    printf("  %-44s ok\n", "count, offsets, permute, combine (fp32)");
    free_dispatch(&o), free(idx), free(tw), free(x), free(yp), free(dout), free(ref), free(tol);
}

/* bf16 storage: permute copies bits; every sum is the fp32 kernel's on the widened
 * inputs, rounded once (the same arithmetic, so exactly); dtopk_w the same fp32 bits.
 * C 600: more than one of the bf16 path's 512-wide chunks. */
static void test_dispatch_bf16(void)
{
    const int N = 37, K = 2, E = 8, C = 600, NK = N * K;
    int *idx = planted_routing(N, K, E);
    float *tw = ts_test_rand_floats((size_t)NK, 1.0f);
    const size_t nx = (size_t)N * C, ny = (size_t)NK * C;
    ts_bf16 *x = ts_malloc(nx * 2), *yp = ts_malloc(ny * 2), *dout = ts_malloc(nx * 2);
    float *xw = ts_alloc_floats(nx), *yw = ts_alloc_floats(ny), *dw = ts_alloc_floats(nx);
    for (size_t i = 0; i < nx; i++)
        x[i] = ts_f32_to_bf16(ts_test_frand()), xw[i] = ts_bf16_to_f32(x[i]);
    for (size_t i = 0; i < ny; i++)
        yp[i] = ts_f32_to_bf16(ts_test_frand()), yw[i] = ts_bf16_to_f32(yp[i]);
    for (size_t i = 0; i < nx; i++)
        dout[i] = ts_f32_to_bf16(ts_test_frand()), dw[i] = ts_bf16_to_f32(dout[i]);
    dispatch_out h = run_dispatch(K16, idx, tw, x, yp, dout, N, K, C, E);
    dispatch_out f = run_dispatch(K32, idx, tw, xw, yw, dw, N, K, C, E);
    CHECK(same_ints(h.row_of, f.row_of, (size_t)NK));
    bool ok = true;
    for (size_t i = 0; i < ny; i++)
        ok &= ((ts_bf16 *)h.xp)[i] == ts_f32_to_bf16(((float *)f.xp)[i]);
    CHECKF(ok, "bf16 permute is not a copy");
    ok = true;
    for (size_t i = 0; i < nx; i++)
        ok &= ((ts_bf16 *)h.out)[i] == ts_f32_to_bf16(((float *)f.out)[i]);
    CHECKF(ok, "bf16 combine is not the fp32 sum rounded once");
    ok = true;
    for (size_t i = 0; i < ny; i++)
        ok &= ((ts_bf16 *)h.dyp)[i] == ts_f32_to_bf16(((float *)f.dyp)[i]);
    CHECKF(ok, "bf16 combine backward dyp");
    CHECKF(ts_test_same_bits(h.dtw, f.dtw, (size_t)NK), "bf16 dtopk_w differs from fp32's");
    /* dx from the bf16 dyp: the fp32 kernel on that dyp widened, rounded once */
    float *dyw = ts_alloc_floats(ny), *dxf = ts_alloc_floats(nx);
    for (size_t i = 0; i < ny; i++) dyw[i] = ts_bf16_to_f32(((ts_bf16 *)h.dyp)[i]);
    K32->moe_permute_backward(dxf, dyw, h.row_of, N, K, C);
    ok = true;
    for (size_t i = 0; i < nx; i++) ok &= ((ts_bf16 *)h.dx)[i] == ts_f32_to_bf16(dxf[i]);
    CHECKF(ok, "bf16 permute backward is not the fp32 sum rounded once");
    /* planted: a double rounding (each term rounded, then the sum) differs somewhere */
    ok = true;
    for (int n = 0; n < N && ok; n++)
        for (int c = 0; c < C && ok; c++) {
            float s = 0.0f;
            for (int k = 0; k < K; k++)
                s = ts_bf16_round(
                    s + ts_bf16_round(tw[n * K + k] * yw[(size_t)h.row_of[n * K + k] * C + c]));
            ok &= ts_f32_to_bf16(s) == ((ts_bf16 *)h.out)[(size_t)n * C + c];
        }
    CHECKF(!ok, "a twice-rounded combine matched the kernel everywhere");
    /* the same bits at 1 and 3 threads */
    omp_set_num_threads(1);
    dispatch_out h1 = run_dispatch(K16, idx, tw, x, yp, dout, N, K, C, E);
    omp_set_num_threads(3);
    dispatch_out h3 = run_dispatch(K16, idx, tw, x, yp, dout, N, K, C, E);
    omp_set_num_threads(2);
    CHECK(same_dispatch(&h1, &h, (size_t)N, (size_t)NK, (size_t)C, 2, E) &&
          same_dispatch(&h3, &h, (size_t)N, (size_t)NK, (size_t)C, 2, E));
    printf("  %-44s ok\n", "permute, combine (bf16)");
    free_dispatch(&h), free_dispatch(&f), free_dispatch(&h1), free_dispatch(&h3);
    free(idx), free(tw), free(x), free(yp), free(dout), free(xw), free(yw), free(dw), free(dyw);
    free(dxf);
}

/* The tables: bf16 shares the router's entries; the strict table's run on strict memory
 * and give the CPU's bits. */
static void test_tables(void)
{
    CHECK(K16->moe_route_forward == K32->moe_route_forward &&
          K16->moe_aux_forward_backward == K32->moe_aux_forward_backward &&
          K16->moe_count == K32->moe_count && K16->moe_permute != K32->moe_permute);
    const ts_kernels *S = &ts_kernels_cpu_strict;
    const ts_moe_routing r = {16, 4, 4, 2, true, true, 2.5f};
    const int N = 26, E = 16, K = 4, C = 19, T = 13;
    const size_t NE = (size_t)N * E, NK = (size_t)N * K;
    float *logits = ts_test_rand_floats(NE, 2.0f), *x = ts_test_rand_floats((size_t)N * C, 1.0f);
    float *s = ts_alloc_floats(NE), *w = ts_alloc_floats(NK), *dl = ts_alloc_floats(NE);
    float *xp = ts_alloc_floats(NK * C), *out = ts_alloc_floats((size_t)N * C), loss[2] = {0};
    int *idx = ts_malloc(NK * sizeof(int)), *row_of = ts_malloc(NK * sizeof(int)), counts[16] = {0};
    int offsets[16];
    K32->moe_route_forward(&r, s, idx, w, logits, NULL, N);
    K32->moe_route_backward(&r, dl, w, s, idx, N);
    K32->moe_aux_forward_backward(&r, &loss[0], &loss[1], dl, logits, s, idx, N, T, 0.1f, 0.2f,
                                  0.5f, 0.5f);
    K32->moe_count(counts, idx, N, K, E);
    ts_moe_offsets(offsets, counts, E);
    K32->moe_permute(xp, row_of, x, idx, offsets, N, K, C, E);
    K32->moe_combine(out, xp, w, row_of, N, K, C);

    /* the same on strict memory */
    const size_t sizes[] = {NE * 4,
                            (size_t)N * C * 4,
                            NE * 4,
                            NK * 4,
                            NE * 4,
                            NK * C * 4,
                            (size_t)N * C * 4,
                            8,
                            NK * 4,
                            NK * 4,
                            64,
                            64};
    void *d[12];
    for (int i = 0; i < 12; i++) d[i] = S->dev_alloc(sizes[i]);
    S->memcpy_h2d(d[0], logits, sizes[0]);
    S->memcpy_h2d(d[1], x, sizes[1]);
    S->moe_route_forward(&r, d[2], d[8], d[3], d[0], NULL, N);
    S->moe_route_backward(&r, d[4], d[3], d[2], d[8], N);
    S->moe_aux_forward_backward(&r, (float *)d[7], (float *)d[7] + 1, d[4], d[0], d[2], d[8], N, T,
                                0.1f, 0.2f, 0.5f, 0.5f);
    S->moe_count(d[10], d[8], N, K, E);
    int sc[16], so[16];
    S->memcpy_d2h(sc, d[10], sizeof sc);
    ts_moe_offsets(so, sc, E);
    S->memcpy_h2d(d[11], so, sizeof so);
    S->moe_permute(d[5], d[9], d[1], d[8], d[11], N, K, C, E);
    S->moe_combine(d[6], d[5], d[3], d[9], N, K, C);
    float *back = ts_alloc_floats(NK * C), sl[2];
    bool ok = true;
    S->memcpy_d2h(back, d[4], sizes[4]), ok &= ts_test_same_bits(back, dl, NE);
    S->memcpy_d2h(back, d[6], sizes[6]), ok &= ts_test_same_bits(back, out, (size_t)N * C);
    S->memcpy_d2h(sl, d[7], 8), ok &= ts_test_same_bits(sl, loss, 2);
    S->memcpy_d2h(back, d[9], sizes[9]), ok &= same_ints((int *)back, row_of, NK);
    CHECKF(ok, "the strict table's MoE kernels differ from the CPU's");
    for (int i = 0; i < 12; i++) S->dev_free(d[i]);
    printf("  %-44s ok\n", "tables (bf16 shares the router; strict)");
    free(logits), free(x), free(s), free(w), free(dl), free(xp), free(out), free(idx), free(row_of);
    free(back);
}

/* Rows [lo, hi) of a whole micro-batch's (scores, counts) through the split form into
 * dl's rows [lo, hi), the loss added to *loss: sequence parallelism's cut. */
static void balance_part(const ts_kernels *k, const ts_moe_routing *r, float *loss, float *dl,
                         const float *s, const int *cnt, int lo, int hi, int T, float ca,
                         float as)
{
    k->moe_balance_forward_backward(r, loss, dl + (size_t)lo * r->E, s + (size_t)lo * r->E, cnt,
                                    hi - lo, lo, T, T, ca, as);
}

/* Rank `rank` of cp = 2 over sequences of T: its local row t of a sequence is position
 * chunk(t / c) * c + t % c with c = T/4 and chunks rank, 3 - rank (tensor/cp.h). */
static int cp2_position(int rank, int t, int T)
{
    const int c = T / 4, h = t / c;
    return (h == 0 ? rank : 3 - rank) * c + t % c;
}

/* The split form against the whole-sequence one (moe_aux_forward_backward, ca only) on 3
 * sequences of T = 12: the whole rows with the kernel's own counts give its bits; rows cut
 * at 7 and 20 (a cut inside sequences 0 and 1: sp) give each row's gradient bit for bit
 * and the losses' sum; each sequence split over cp = 2 ranks in cp.h's chunks the same.
 * Counts of a rank's own rows only (no sum over the group) must differ. */
static void test_balance_split(void)
{
    const ts_moe_routing rs[2] = {{16, 4, 4, 2, true, true, 2.5f},
                                  {8, 2, 1, 1, false, true, 1.0f}};
    for (int ri = 0; ri < 2; ri++) {
        const ts_moe_routing *r = &rs[ri];
        const int T = 12, Q = 3, N = Q * T, E = r->E, K = r->K, Tl = T / 2;
        const size_t NE = (size_t)N * E, LE = (size_t)Q * Tl * E;
        const float ca = 0.3f, as = 1.0f / 5;
        float *logits = ts_test_rand_floats(NE, 2.0f), *s = ts_alloc_floats(NE);
        float *w = ts_alloc_floats((size_t)N * K), *dl = ts_test_rand_floats(NE, 0.5f);
        int *idx = ts_malloc((size_t)N * K * sizeof(int));
        int *cnt = ts_calloc((size_t)Q * E, sizeof(int));
        K32->moe_route_forward(r, s, idx, w, logits, NULL, N);
        for (int q = 0; q < Q; q++)
            K32->moe_count(cnt + (size_t)q * E, idx + (size_t)q * T * K, T, K, E);
        float *d0 = ts_alloc_floats(NE), *d1 = ts_alloc_floats(NE);
        float l0 = 0.25f, l1 = 0.25f, z = 0.0f;
        memcpy(d0, dl, NE * sizeof *d0), memcpy(d1, dl, NE * sizeof *d1);
        K32->moe_aux_forward_backward(r, &z, &l0, d0, logits, s, idx, N, T, 0.0f, ca, 1.0f, as);
        balance_part(K32, r, &l1, d1, s, cnt, 0, N, T, ca, as);
        CHECKF(ts_test_same_bits(d0, d1, NE) && l0 == l1 && z == 0.0f,
               "balance %d: the whole rows differ from moe_aux_forward_backward", ri);
        const double whole = (double)l0 - 0.25;
        CHECKF(whole > 0.0, "balance %d: no loss", ri);
        /* sp: three ranks' contiguous rows, cutting sequences 0 and 1 */
        const int cuts[4] = {0, 7, 20, N};
        memcpy(d1, dl, NE * sizeof *d1);
        float parts = 0.0f;
        for (int p = 0; p < 3; p++) {
            float lp = 0.0f;
            balance_part(K32, r, &lp, d1, s, cnt, cuts[p], cuts[p + 1], T, ca, as);
            parts += lp;
        }
        CHECKF(ts_test_same_bits(d0, d1, NE), "balance %d: sp's cut rows' gradients", ri);
        CHECKF(fabs(parts - whole) <= 1e-6 * whole, "balance %d: sp's parts %.9g vs %.9g", ri,
               parts, whole);
        /* cp 2: each rank's local rows, its own counts and the summed ones */
        float *ls = ts_alloc_floats(LE), *ld = ts_alloc_floats(LE), *od = ts_alloc_floats(LE);
        int *own = ts_malloc((size_t)Q * E * sizeof(int));
        int *lidx = ts_malloc((size_t)Q * Tl * K * sizeof(int));
        memcpy(d1, dl, NE * sizeof *d1);
        bool own_differs = false;
        parts = 0.0f;
        for (int rank = 0; rank < 2; rank++) {
            for (int q = 0; q < Q; q++)
                for (int t = 0; t < Tl; t++) {
                    const size_t n = (size_t)q * T + cp2_position(rank, t, T);
                    const size_t l = (size_t)q * Tl + t;
                    memcpy(ls + l * E, s + n * E, E * sizeof *ls);
                    memcpy(ld + l * E, dl + n * E, E * sizeof *ld);
                    memcpy(lidx + l * K, idx + n * K, K * sizeof *lidx);
                }
            memset(own, 0, (size_t)Q * E * sizeof(int));
            for (int q = 0; q < Q; q++)
                K32->moe_count(own + (size_t)q * E, lidx + (size_t)q * Tl * K, Tl, K, E);
            memcpy(od, ld, LE * sizeof *od);
            float lp = 0.0f, lown = 0.0f;
            K32->moe_balance_forward_backward(r, &lp, ld, ls, cnt, Q * Tl, 0, Tl, T, ca, as);
            K32->moe_balance_forward_backward(r, &lown, od, ls, own, Q * Tl, 0, Tl, T, ca, as);
            own_differs |= !ts_test_same_bits(od, ld, LE);
            parts += lp;
            for (int q = 0; q < Q; q++)
                for (int t = 0; t < Tl; t++)
                    memcpy(d1 + ((size_t)q * T + cp2_position(rank, t, T)) * E,
                           ld + ((size_t)q * Tl + t) * E, E * sizeof *d1);
        }
        CHECKF(ts_test_same_bits(d0, d1, NE), "balance %d: cp's local rows' gradients", ri);
        CHECKF(fabs(parts - whole) <= 1e-6 * whole, "balance %d: cp's parts %.9g vs %.9g", ri,
               parts, whole);
        CHECKF(own_differs, "balance %d: a rank's own counts gave the summed counts' result", ri);
        /* ca 0: nothing */
        memcpy(d1, dl, NE * sizeof *d1);
        float none = 0.5f;
        K32->moe_balance_forward_backward(r, &none, d1, s, cnt, N, 0, T, T, 0.0f, as);
        CHECKF(none == 0.5f && ts_test_same_bits(d1, dl, NE), "balance %d: ca 0 changed", ri);
        /* the strict table on strict memory, rows [7, N): the CPU's bits */
        const ts_kernels *S = &ts_kernels_cpu_strict;
        const size_t cb = (size_t)Q * E * sizeof(int);
        float *sd = S->dev_alloc(NE * 4), *ss = S->dev_alloc(NE * 4), *sl = S->dev_alloc(4);
        int *scnt = S->dev_alloc(cb);
        float sl_h = 0.25f;
        S->memcpy_h2d(sd, dl, NE * 4), S->memcpy_h2d(ss, s, NE * 4);
        S->memcpy_h2d(scnt, cnt, cb), S->memcpy_h2d(sl, &sl_h, 4);
        S->moe_balance_forward_backward(r, sl, sd + 7 * E, ss + 7 * E, scnt, N - 7, 7, T, T, ca,
                                        as);
        S->memcpy_h2d(sd, d0, (size_t)7 * E * 4); /* rows 0..7 from the whole run */
        float *back = ts_alloc_floats(NE);
        S->memcpy_d2h(back, sd, NE * 4);
        CHECKF(ts_test_same_bits(back, d0, NE), "balance %d: the strict table differs", ri);
        S->dev_free(sd), S->dev_free(ss), S->dev_free(scnt), S->dev_free(sl);
        free(logits), free(s), free(w), free(dl), free(idx), free(cnt), free(d0), free(d1);
        free(ls), free(ld), free(od), free(own), free(lidx), free(back);
    }
    CHECK(K16->moe_balance_forward_backward == K32->moe_balance_forward_backward);
    printf("  %-44s ok\n", "balance loss from given counts (sp, cp)");
}

/* ---- capacity ------------------------------------------------------------------ */

/* What moe_capacity must give, by counting: assignment a of sequence q (rows [q*T,
 * (q+1)*T), position a / K within) is kept iff fewer than `capacity` assignments of its
 * sequence to its expert rank before it: a larger weight, or an equal one (as fp32
 * numbers, -0 below +0: compared as bits mapped to order) at an earlier position.
 * earlier_wins false: the reverse tie-break (a planted wrong reference). */
static uint32_t ordered_bits(float w)
{
    uint32_t u;
    memcpy(&u, &w, sizeof u);
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}
static void ref_keep(int *keep, const int *idx, const float *w, int N, int K, int T,
                     int capacity, bool earlier_wins)
{
    const int TK = T * K;
    for (int a = 0; a < N * K; a++) {
        const int q0 = a / TK * TK, t = a % TK / K;
        int before = 0;
        for (int b = q0; b < q0 + TK; b++) {
            if (b == a || idx[b] != idx[a]) continue;
            const uint32_t ub = ordered_bits(w[b]), ua = ordered_bits(w[a]);
            const int tb = b % TK / K;
            before += ub > ua || (ub == ua && (earlier_wins ? tb < t : tb > t));
        }
        keep[a] = before < capacity ? idx[a] : TS_MOE_DROPPED;
    }
}

static int dropped_count(const int *keep, int n)
{
    int d = 0;
    for (int i = 0; i < n; i++) d += keep[i] == TS_MOE_DROPPED;
    return d;
}

/* The decision on planted routings: 3 sequences of T = 13 positions, K 3 of E 8 (the
 * last expert chosen by none), weights from a few values so ties are many, one -0/+0
 * pair; capacities 0, 1, 2, 5 and T (T keeps all: a token holds an expert once). */
static void test_capacity_decision(void)
{
    enum { T = 13, B = 3, N = B * T, K = 3, E = 8, NK = N * K };
    int *idx = planted_routing(N, K, E);
    float w[NK];
    for (int a = 0; a < NK; a++) w[a] = 0.25f * (float)(1 + (int)(4.0f * fabsf(ts_test_frand())));
    /* -0 and +0 on the first two assignments to expert idx[0] in sequence 0 */
    int z = -1;
    for (int a = 1; a < T * K && z < 0; a++)
        if (idx[a] == idx[0]) z = a;
    CHECK(z > 0);
    w[0] = -0.0f, w[z] = 0.0f;
    const int caps[] = {0, 1, 2, 5, T};
    bool ok = true, some_ties = false;
    for (size_t c = 0; c < sizeof caps / sizeof *caps; c++) {
        int keep[NK], ref[NK], wrong[NK];
        K32->moe_capacity(keep, idx, w, N, K, E, T, caps[c]);
        ref_keep(ref, idx, w, N, K, T, caps[c], true);
        ok &= same_ints(keep, ref, NK);
        /* each sequence's expert keeps min(capacity, its count) */
        for (int q = 0; q < B; q++)
            for (int e = 0; e < E; e++) {
                int all = 0, kept = 0;
                for (int a = q * T * K; a < (q + 1) * T * K; a++)
                    all += idx[a] == e, kept += keep[a] == e;
                ok &= kept == (all < caps[c] ? all : caps[c]);
                ok &= e != E - 1 || all == 0; /* the empty expert */
            }
        ref_keep(wrong, idx, w, N, K, T, caps[c], false);
        some_ties |= !same_ints(keep, wrong, NK);
        if (caps[c] == 0) ok &= dropped_count(keep, NK) == NK;
        if (caps[c] == T) ok &= same_ints(keep, idx, NK);
    }
    CHECKF(ok, "moe_capacity differs from the counting reference");
    CHECKF(some_ties, "no capacity here depended on the tie-break (the planted reverse order)");

    /* Written out: one sequence of T 6, K 1, E 2; expert 0's weights .5 .7 .5 .7 .5 at
     * positions 0..4, expert 1 at 5. Capacity 2: the two .7 (1, 3); 3: and the first .5
     * (0); 1: the earlier .7 (1); 0: none. Expert 1 alone: kept from capacity 1 on. */
    const int hidx[6] = {0, 0, 0, 0, 0, 1};
    const float hw[6] = {0.5f, 0.7f, 0.5f, 0.7f, 0.5f, 0.1f};
    const int D = TS_MOE_DROPPED;
    const int want[4][6] = {{D, D, D, D, D, D},
                            {D, 0, D, D, D, 1},
                            {D, 0, D, 0, D, 1},
                            {0, 0, D, 0, D, 1}};
    ok = true;
    for (int c = 0; c < 4; c++) {
        int keep[6];
        K32->moe_capacity(keep, hidx, hw, 6, 1, 2, 6, c);
        ok &= same_ints(keep, want[c], 6);
    }
    /* +0 outranks -0 though it comes later */
    const int zidx[2] = {0, 0};
    const float zw[2] = {-0.0f, 0.0f};
    int zkeep[2];
    K32->moe_capacity(zkeep, zidx, zw, 2, 1, 1, 2, 1);
    ok &= zkeep[0] == D && zkeep[1] == 0;
    CHECKF(ok, "moe_capacity on the written-out sequences");

    /* the strict table on strict memory: the same ints */
    const ts_kernels *S = &ts_kernels_cpu_strict;
    int *di = S->dev_alloc(NK * sizeof(int)), *dk = S->dev_alloc(NK * sizeof(int));
    float *dw = S->dev_alloc(NK * sizeof(float));
    S->memcpy_h2d(di, idx, NK * sizeof(int));
    S->memcpy_h2d(dw, w, NK * sizeof(float));
    S->moe_capacity(dk, di, dw, N, K, E, T, 2);
    int keep[NK], got[NK];
    K32->moe_capacity(keep, idx, w, N, K, E, T, 2);
    S->memcpy_d2h(got, dk, NK * sizeof(int));
    CHECKF(same_ints(got, keep, NK), "the strict table's moe_capacity differs");
    S->dev_free(di), S->dev_free(dk), S->dev_free(dw);
    printf("  %-44s ok\n", "capacity decision (ties, -0, 0/1/2/5/T)");
    free(idx);
}

/* The dispatch kernels on a kept set: dropped assignments are not counted and get no
 * row (row_of TS_MOE_DROPPED), the kept ones the stable rows of a routing without them;
 * the combine and the permute backward sum the kept terms (token 0, every choice
 * dropped: 0), dtopk_w is 0 where dropped; the same bits at 1 and 3 threads; bf16 the
 * fp32 sums rounded once. */
static void test_capacity_dispatch(void)
{
    enum { N = 39, K = 3, E = 8, C = 45, NK = N * K };
    int *idx = planted_routing(N, K, E);
    float *tw = ts_test_rand_floats((size_t)NK, 1.0f);
    float *x = ts_test_rand_floats((size_t)N * C, 1.0f),
          *yp = ts_test_rand_floats((size_t)NK * C, 1.0f);
    float *dout = ts_test_rand_floats((size_t)N * C, 1.0f);
    int keep[NK];
    K32->moe_capacity(keep, idx, tw, N, K, E, 13, 2);
    for (int k = 0; k < K; k++) keep[k] = TS_MOE_DROPPED; /* token 0: all dropped */
    const int dropped = dropped_count(keep, NK);
    CHECK(dropped > K && dropped < NK);

    int counts[E], offsets[E], row_of[NK], rows[NK];
    memset(counts, 0, sizeof counts);
    K32->moe_count(counts, keep, N, K, E);
    CHECK(ts_moe_offsets(offsets, counts, E) == NK - dropped);
    float *xp = ts_alloc_floats((size_t)NK * C), *out = ts_alloc_floats((size_t)N * C);
    float *dyp = ts_alloc_floats((size_t)NK * C), *dx = ts_alloc_floats((size_t)N * C);
    float *dtw = nan_floats(NK);
    K32->moe_permute(xp, row_of, x, keep, offsets, N, K, C, E);
    K32->moe_combine(out, yp, tw, row_of, N, K, C);
    K32->moe_combine_backward(dyp, dtw, dout, yp, tw, row_of, N, K, C);
    K32->moe_permute_backward(dx, dyp, row_of, N, K, C);
    ref_row_of(rows, keep, NK, E); /* the kept ones' rows; a dropped one keeps no row */
    bool ok = true;
    for (int a = 0; a < NK; a++) {
        if (keep[a] == TS_MOE_DROPPED) {
            ok &= row_of[a] == TS_MOE_DROPPED && dtw[a] == 0.0f;
            continue;
        }
        ok &= row_of[a] == rows[a];
        ok &= ts_test_same_bits(xp + (size_t)rows[a] * C, x + (size_t)(a / K) * C, C);
    }
    CHECKF(ok, "dropped assignments: rows, copies or dtopk_w");
    ok = true;
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            double s = 0.0, m = 0.0, g = 0.0, gm = 0.0;
            for (int k = 0; k < K; k++) {
                const int a = n * K + k;
                if (keep[a] == TS_MOE_DROPPED) continue;
                const double t = (double)tw[a] * yp[(size_t)rows[a] * C + c];
                const double d = dyp[(size_t)rows[a] * C + c];
                s += t, m += fabs(t), g += d, gm += fabs(d);
            }
            ok &= fabs(out[n * C + c] - s) <= 1e-6 * m + 1e-30;
            ok &= fabs(dx[n * C + c] - g) <= 1e-6 * gm + 1e-30;
            if (n == 0) ok &= out[c] == 0.0f && dx[c] == 0.0f;
        }
    CHECKF(ok, "the combine or the permute backward over the kept terms");
    /* planted: a combine that kept a dropped term differs */
    int planted_row[NK];
    memcpy(planted_row, row_of, sizeof planted_row);
    planted_row[0] = 0; /* token 0's dropped first choice given a row */
    float *pout = ts_alloc_floats((size_t)N * C);
    K32->moe_combine(pout, yp, tw, planted_row, N, K, C);
    CHECK(memcmp(pout, out, (size_t)N * C * sizeof(float)) != 0);

    /* threads and bf16 */
    ok = true;
    for (int th = 1; th <= 3; th += 2) {
        omp_set_num_threads(th);
        float *o2 = ts_alloc_floats((size_t)N * C), *d2 = ts_alloc_floats((size_t)N * C);
        float *y2 = ts_alloc_floats((size_t)NK * C), *w2 = nan_floats(NK);
        K32->moe_combine(o2, yp, tw, row_of, N, K, C);
        K32->moe_combine_backward(y2, w2, dout, yp, tw, row_of, N, K, C);
        K32->moe_permute_backward(d2, y2, row_of, N, K, C);
        ok &= ts_test_same_bits(o2, out, (size_t)N * C) &&
              ts_test_same_bits(d2, dx, (size_t)N * C) && ts_test_same_bits(w2, dtw, NK);
        free(o2), free(d2), free(y2), free(w2);
    }
    omp_set_num_threads(2);
    CHECKF(ok, "the dispatch with drops differs between 1, 2 and 3 threads");
    ts_bf16 *yh = ts_malloc((size_t)NK * C * 2), *oh = ts_malloc((size_t)N * C * 2);
    float *yw = ts_alloc_floats((size_t)NK * C), *of = ts_alloc_floats((size_t)N * C);
    for (size_t i = 0; i < (size_t)NK * C; i++)
        yh[i] = ts_f32_to_bf16(yp[i]), yw[i] = ts_bf16_to_f32(yh[i]);
    K16->moe_combine(oh, yh, tw, row_of, N, K, C);
    K32->moe_combine(of, yw, tw, row_of, N, K, C);
    ok = true;
    for (size_t i = 0; i < (size_t)N * C; i++) ok &= oh[i] == ts_f32_to_bf16(of[i]);
    CHECKF(ok, "bf16 combine with drops is not the fp32 sum rounded once");
    printf("  %-44s ok\n", "dispatch of a kept set (drops, fp32, bf16)");
    free(idx), free(tw), free(x), free(yp), free(dout), free(xp), free(out), free(dyp), free(dx);
    free(dtw), free(pout), free(yh), free(oh), free(yw), free(of);
}

/* ---- grouped expert GEMMs ------------------------------------------------------- */

/* The experts' products one expert at a time through matmul_forward / matmul_backward:
 * what moe.c ran before the grouped calls, the reference they must equal. */
static void loop_forward(const ts_kernels *k, void *out, const void *inp,
                         const void *const *wts, const int *rows, int L, int C, int OC)
{
    const size_t es = ts_dtype_bytes(k->act_dtype);
    size_t o = 0;
    for (int e = 0; e < L; o += (size_t)rows[e], e++)
        if (rows[e] > 0)
            k->matmul_forward((char *)out + o * OC * es, (const char *)inp + o * C * es, wts[e],
                              NULL, rows[e], C, OC);
}

static void loop_backward(const ts_kernels *k, void *dinp, float *const *dw, const void *dout,
                          const void *inp, const void *const *wts, const int *rows, int L, int C,
                          int OC)
{
    const size_t es = ts_dtype_bytes(k->act_dtype);
    size_t o = 0;
    for (int e = 0; e < L; o += (size_t)rows[e], e++)
        if (rows[e] > 0)
            k->matmul_backward(dinp ? (char *)dinp + o * C * es : NULL, dw ? dw[e] : NULL, NULL,
                               (const char *)dout + o * OC * es, (const char *)inp + o * C * es,
                               wts[e], rows[e], C, OC);
}

/* Every |a - b| <= 1e-5 (|b| + 1). */
static bool near(const float *a, const float *b, size_t n)
{
    bool ok = true;
    for (size_t i = 0; i < n; i++) ok &= fabsf(a[i] - b[i]) <= 1e-5f * (fabsf(b[i]) + 1.0f);
    return ok;
}

/* One grouped case in fp32: forward, both gradients, each gradient alone, against the
 * loop (the gradients accumulating onto the same nonzero start; an empty expert's
 * untouched). Bit for bit at 1 and 2 threads: at these sizes OpenBLAS runs every GEMM on
 * one thread, so the loop's products and the grouped call's, side by side or one after
 * the other, are the same single-threaded GEMMs. (At larger sizes a threaded sgemm's bits
 * differ from a single-threaded one's: kernels/cpu/grouped_matmul.c.) At 3 threads
 * matmul_backward cuts a weight gradient's rows over two threads, and OpenBLAS's bits
 * depend on where M is cut: there the grouped call must rerun to the same bits, whichever
 * thread takes which expert, and stay within 1e-5 of the loop. */
static bool grouped_case_f32(const int *rows, int L, int C, int OC)
{
    int R = 0;
    for (int e = 0; e < L; e++) R += rows[e];
    const size_t ny = (size_t)R * OC, nx = (size_t)R * C, nw = (size_t)L * OC * C;
    float *x = ts_test_rand_floats(nx + 1, 1.0f), *dy = ts_test_rand_floats(ny + 1, 1.0f);
    float *wbuf = ts_test_rand_floats(nw, 0.3f), *g0 = ts_test_rand_floats(nw, 0.1f);
    float *gw = ts_alloc_floats(nw), *gl = ts_alloc_floats(nw), *g2 = ts_alloc_floats(nw);
    float *yg = ts_alloc_floats(ny + 1), *yl = ts_alloc_floats(ny + 1);
    float *dg = ts_alloc_floats(nx + 1), *dl = ts_alloc_floats(nx + 1), *d2 = ts_alloc_floats(nx + 1);
    const void *wts[MAXE];
    float *dwg[MAXE], *dwl[MAXE], *dw2[MAXE];
    for (int e = 0; e < L; e++) {
        wts[e] = wbuf + (size_t)e * OC * C;
        dwg[e] = gw + (size_t)e * OC * C;
        dwl[e] = gl + (size_t)e * OC * C;
        dw2[e] = g2 + (size_t)e * OC * C;
    }
    bool ok = true;
    for (int threads = 1; threads <= 3; threads++) {
        ts_cpu_set_threads(threads);
        const bool bits = threads < 3;
        loop_forward(K32, yl, x, wts, rows, L, C, OC);
        K32->grouped_matmul_forward(yg, x, wts, rows, L, C, OC);
        ok &= bits ? ts_test_same_bits(yg, yl, ny) : near(yg, yl, ny);
        memcpy(gw, g0, nw * 4), memcpy(gl, g0, nw * 4), memcpy(g2, g0, nw * 4);
        loop_backward(K32, dl, dwl, dy, x, wts, rows, L, C, OC);
        K32->grouped_matmul_backward(dg, dwg, dy, x, wts, rows, L, C, OC);
        if (bits) {
            ok &= ts_test_same_bits(dg, dl, nx) && ts_test_same_bits(gw, gl, nw);
        } else { /* a rerun gives the same bits; the loop is near */
            K32->grouped_matmul_backward(d2, dw2, dy, x, wts, rows, L, C, OC);
            ok &= ts_test_same_bits(d2, dg, nx) && ts_test_same_bits(g2, gw, nw);
            ok &= near(dg, dl, nx) && near(gw, gl, nw);
        }
        /* each gradient alone, against the loop's calls with the other NULL: the other
         * skipped (dweights untouched, dinp unwritten past its rows) */
        memcpy(gw, g0, nw * 4), memcpy(gl, g0, nw * 4);
        dg[nx] = 7.0f;
        loop_backward(K32, dl, NULL, dy, x, wts, rows, L, C, OC);
        K32->grouped_matmul_backward(dg, NULL, dy, x, wts, rows, L, C, OC);
        ok &= ts_test_same_bits(gw, g0, nw) && dg[nx] == 7.0f;
        ok &= bits ? ts_test_same_bits(dg, dl, nx) : near(dg, dl, nx);
        loop_backward(K32, NULL, dwl, dy, x, wts, rows, L, C, OC);
        K32->grouped_matmul_backward(NULL, dwg, dy, x, wts, rows, L, C, OC);
        ok &= dg[nx] == 7.0f && (bits ? ts_test_same_bits(gw, gl, nw) : near(gw, gl, nw));
    }
    ts_cpu_set_threads(2);
    free(x), free(dy), free(wbuf), free(g0), free(gw), free(gl), free(g2), free(yg), free(yl);
    free(dg), free(dl), free(d2);
    return ok;
}

static void test_grouped(void)
{
    /* Small enough that OpenBLAS runs each GEMM on one thread (so the loop's bits are the
     * grouped call's), wide enough that the even case holds more than grouped_matmul.c's
     * TS_GROUPED_MIN_MACS (152 rows x 45 x 70) and runs side by side. */
    const int C = 45, OC = 70;
    /* even rows over the experts (the two threads take experts side by side), empty
     * experts among them */
    const int even[] = {37, 0, 29, 41, 0, 33, 12, 0};
    CHECKF(grouped_case_f32(even, 8, C, OC), "grouped fp32 (even rows) differs from the loop");
    /* one expert with most of the rows, and over 1024 of them (one after the other,
     * threaded GEMMs) */
    const int skewed[] = {0, 3, 1100, 0, 2, 1};
    CHECKF(grouped_case_f32(skewed, 6, C, OC), "grouped fp32 (skewed rows) differs");
    /* no rows at all */
    const int none[] = {0, 0, 0};
    CHECKF(grouped_case_f32(none, 3, C, OC), "grouped fp32 (no rows)");

    /* planted: the same rows cut differently between the experts (a row on the wrong
     * expert's weight) must differ */
    const int L = 4, R = 44, moved[] = {10, 20, 5, 9}, real[] = {11, 19, 5, 9};
    float *x = ts_test_rand_floats((size_t)R * C, 1.0f), *w = ts_test_rand_floats((size_t)L * OC * C, 0.3f);
    float *ya = ts_alloc_floats((size_t)R * OC), *yb = ts_alloc_floats((size_t)R * OC);
    const void *wts[4];
    for (int e = 0; e < L; e++) wts[e] = w + (size_t)e * OC * C;
    K32->grouped_matmul_forward(ya, x, wts, moved, L, C, OC);
    loop_forward(K32, yb, x, wts, real, L, C, OC);
    CHECKF(!ts_test_same_bits(ya, yb, (size_t)R * OC), "a misrouted row went unnoticed");

    /* bf16 (runtime-M oneDNN primitives) against the per-expert bf16 matmuls: the same
     * products; the weight gradients' fp32 sums to 1e-5 relative (another oneDNN kernel
     * may sum in another order) */
    ts_bf16 *xb = ts_malloc((size_t)R * C * 2), *wb = ts_malloc((size_t)L * OC * C * 2);
    ts_bf16 *dyb = ts_malloc((size_t)R * OC * 2), *yg = ts_malloc((size_t)R * OC * 2);
    ts_bf16 *yl = ts_malloc((size_t)R * OC * 2), *dg = ts_malloc((size_t)R * C * 2);
    ts_bf16 *dl = ts_malloc((size_t)R * C * 2);
    for (size_t i = 0; i < (size_t)R * C; i++) xb[i] = ts_f32_to_bf16(x[i]);
    for (size_t i = 0; i < (size_t)L * OC * C; i++) wb[i] = ts_f32_to_bf16(w[i]);
    for (size_t i = 0; i < (size_t)R * OC; i++) dyb[i] = ts_f32_to_bf16(ts_test_frand());
    float *gw = ts_alloc_floats((size_t)L * OC * C), *gl = ts_alloc_floats((size_t)L * OC * C);
    float *dwg[4], *dwl[4];
    for (int e = 0; e < L; e++) {
        wts[e] = wb + (size_t)e * OC * C;
        dwg[e] = gw + (size_t)e * OC * C, dwl[e] = gl + (size_t)e * OC * C;
    }
    const int bf_rows[] = {11, 0, 27, 5};
    const bool gemms = ts_cpu_bf16_supported(); /* oneDNN has no bf16 GEMM without it */
    if (gemms) {
        K16->grouped_matmul_forward(yg, xb, wts, bf_rows, L, C, OC);
        loop_forward(K16, yl, xb, wts, bf_rows, L, C, OC);
        K16->grouped_matmul_backward(dg, dwg, dyb, xb, wts, bf_rows, L, C, OC);
        loop_backward(K16, dl, dwl, dyb, xb, wts, bf_rows, L, C, OC);
        /* bf_rows route 43 of the R = 44 rows: row 43 is written by neither side (its
         * memory is whatever ts_malloc returned), so only the routed rows compare. */
        const size_t routed = 11 + 0 + 27 + 5;
        bool same_y = !memcmp(yg, yl, routed * OC * 2), same_d = !memcmp(dg, dl, routed * C * 2);
        double worst = 0.0;
        for (size_t i = 0; i < (size_t)L * OC * C; i++) {
            double err = fabs((double)gw[i] - gl[i]) / (fabs((double)gl[i]) + 1e-3);
            worst = err > worst ? err : worst;
        }
        CHECKF(same_y && same_d && worst < 1e-5,
               "grouped bf16 differs from the loop (out %s, dinp %s, dweight worst %.2g)",
               same_y ? "same" : "differs", same_d ? "same" : "differs", worst);
        CHECK(gw[(size_t)OC * C] == 0.0f && gl[(size_t)OC * C] == 0.0f); /* expert 1: empty */
    }

    /* the strict table's entries on strict memory: the CPU's bits */
    const ts_kernels *S = &ts_kernels_cpu_strict;
    void *dx = S->dev_alloc((size_t)R * C * 4), *dw = S->dev_alloc((size_t)L * OC * C * 4);
    void *dy = S->dev_alloc((size_t)R * OC * 4);
    S->memcpy_h2d(dx, x, (size_t)R * C * 4);
    S->memcpy_h2d(dw, w, (size_t)L * OC * C * 4);
    for (int e = 0; e < L; e++) wts[e] = (float *)dw + (size_t)e * OC * C;
    S->grouped_matmul_forward(dy, dx, wts, real, L, C, OC);
    S->memcpy_d2h(ya, dy, (size_t)R * OC * 4);
    CHECKF(ts_test_same_bits(ya, yb, (size_t)R * OC), "the strict grouped forward differs");
    S->dev_free(dx), S->dev_free(dw), S->dev_free(dy);
    printf("  %-44s ok%s\n", "grouped expert GEMMs (fp32 bits, bf16, strict)",
           gemms ? "" : " (bf16 skipped: no AVX512_BF16 on this CPU)");
    free(x), free(w), free(ya), free(yb), free(xb), free(wb), free(dyb), free(yg), free(yl);
    free(dg), free(dl), free(gw), free(gl);
}

int main(void)
{
    omp_set_num_threads(2);
    test_routing();
    test_balance_split();
    test_ties();
    test_dispatch_fp32();
    test_dispatch_bf16();
    test_tables();
    test_capacity_decision();
    test_capacity_dispatch();
    test_grouped();
    return ts_test_report();
}
