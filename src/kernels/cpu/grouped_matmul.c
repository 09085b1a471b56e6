/* The grouped expert GEMMs (kernels.h grouped_matmul_*) on the CPU, one body for both
 * tables: fp32 through OpenBLAS (the same per-expert products as matmul.c), bf16 through
 * oneDNN primitives whose rows are a runtime dimension (dnnl_matmul.h), so the row
 * counts of dropless experts, which change every micro-batch, reuse one primitive per
 * weight shape instead of making one per count.
 *
 * Two ways to spend the threads (ts_cpu_set_threads' budget; Debian's OpenBLAS is the
 * OpenMP build, so OpenBLAS and these loops share libgomp's pool and OpenBLAS runs
 * single-threaded inside a parallel region: never more threads than the budget):
 * - side by side: the experts' products are tasks (forward: one per expert; backward:
 *   the input gradient and the weight gradient of each expert, two tasks), each run
 *   whole by one thread with a single-threaded GEMM, largest first over a dynamic
 *   schedule. A GEMM of few rows keeps one core busy where a threaded GEMM of those rows
 *   loses its threads to partitioning and waiting on each other's packed panels.
 * - one after the other: each expert's product on every thread (the threaded GEMM),
 *   as the per-expert loop did. It wins when one expert has most of the rows, where the
 *   tasks cannot be spread evenly.
 * grouped_side_by_side chooses (bench/bench_grouped.c measures both ways; its
 * numbers and the rule's derivation: bench/RESULTS.md "Grouped expert GEMMs").
 *
 * Bits: every product is one GEMM call on one expert's rows either way, and the way is a
 * function of the rows and the thread count only, so a rerun gives the same bits
 * whichever thread takes which expert. The two ways need not agree with each other:
 * OpenBLAS's results depend on its thread count and on how M is cut (measured, Zen core
 * of 0.3.21: a 2-thread and a 1-thread sgemm of 256 x 2048 x 512 differ in ~8% of the
 * outputs' last bits), as the per-expert loop's did on the rows an expert happened to
 * get. Where every GEMM runs on one thread (small products, or one thread) the grouped
 * call is the loop bit for bit (test_moe_kernels). */
#include <omp.h>
#include <stdlib.h>

#include "core/error.h"
#include "kernels/cpu/cpu_bf16_internal.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/dnnl_matmul.h"

/* The products of one grouped call. */
typedef enum { PRODUCT_OUT, PRODUCT_DINP, PRODUCT_DWEIGHT } product;

typedef struct {
    ts_dtype t;
    void *out;       /* forward: out; backward: dinp (NULL: none) */
    float *const *dweights; /* backward (NULL: none) */
    const void *src; /* forward: inp; backward: dout */
    const void *inp; /* backward: the forward's input */
    const void *const *weights;
    const int *rows;
    const size_t *first; /* each expert's first row */
    int C, OC;
} grouped;

/* The choice. Side by side loses only to the threads' imbalance: when one expert holds
 * more than its share of the rows, its GEMM alone outlasts the others'. The
 * largest-first greedy assignment (what the dynamic schedule does when a task's time is
 * proportional to its rows) predicts the span; it is set against the threaded GEMM's
 * efficiency, which is poor on few rows: measured on 2 Zen 3 cores (bench_grouped,
 * bench/RESULTS.md "Grouped expert GEMMs"), with 3/4 of the rows on one expert (a span
 * 1.5x the even split) side by side was 1.13x and 1.06x one after the other's speed with
 * 96 and 384 rows on that expert (3.1-3.7x with the machine loaded), 0.96x and 0.90x with
 * 1536 and 6144; with even rows it was never slower (1.03-1.27x). So:
 * side by side when the span is within TS_GROUPED_SLACK of the even split, or, while
 * every expert has fewer than TS_GROUPED_ROWS rows, within 2x of it (at 2 threads: any
 * split of two or more experts). */
#define TS_GROUPED_SLACK 0.10
#define TS_GROUPED_ROWS 1024
/* And only when the call holds work enough: below 2^18 multiply-adds in all (a tiny
 * model's experts: tens of rows of tens of columns) a parallel region's start and barrier
 * cost more than the products, and far more where the cores are shared (measured: CI's
 * two tests at a time took test_moe_fixture from 0.2 to 9 s under the sanitizers, its
 * threads waiting on a descheduled team mate); one after the other runs them unthreaded
 * there, as OpenBLAS leaves a small GEMM. */
#define TS_GROUPED_MIN_MACS 262144.0

ts_grouped_mode ts_cpu_grouped_mode = TS_GROUPED_AUTO;

/* order: the n tasks' experts; row_macs: one row's multiply-adds in one product. */
static bool grouped_side_by_side(const int *order, int n, const int *rows, int threads,
                                 double row_macs)
{
    if (threads < 2 || n < 2 || omp_in_parallel()) return false;
    if (ts_cpu_grouped_mode != TS_GROUPED_AUTO) return ts_cpu_grouped_mode == TS_GROUPED_SIDE_BY_SIDE;
    double all_rows = 0.0;
    for (int i = 0; i < n; i++) all_rows += rows[order[i]];
    if (all_rows * row_macs < TS_GROUPED_MIN_MACS) return false;
    double load[64] = {0}, total = 0.0;
    if (threads > 64) threads = 64;
    const int most = rows[order[0]];
    for (int i = 0; i < n; i++) { /* order: most rows first */
        int best = 0;
        for (int t = 1; t < threads; t++) best = load[t] < load[best] ? t : best;
        load[best] += rows[order[i]];
        total += rows[order[i]];
    }
    double span = 0.0;
    for (int t = 0; t < threads; t++) span = load[t] > span ? load[t] : span;
    const double even = total / threads;
    return span <= (1.0 + TS_GROUPED_SLACK) * even || (most < TS_GROUPED_ROWS && span <= 2.0 * even);
}

/* The experts that have rows, most rows first (ties: lower index first). */
static int experts_by_rows(int *order, const int *rows, int L)
{
    int n = 0;
    for (int e = 0; e < L; e++) {
        if (rows[e] == 0) continue;
        int i = n++;
        for (; i > 0 && rows[order[i - 1]] < rows[e]; i--) order[i] = order[i - 1];
        order[i] = e;
    }
    return n;
}

/* bf16: one product on oneDNN with the rows (M, or the weight gradient's K) given at
 * execution, in the layouts matmul_bf16.c uses. */
static void bf16_product(const grouped *g, product p, int e)
{
    const int n = g->rows[e], C = g->C, OC = g->OC;
    const size_t o = g->first[e];
    const ts_bf16 *src = (const ts_bf16 *)g->src;
    if (p == PRODUCT_OUT) {
        ts_dnnl_gemm d = ts_dnnl_gemm_2d(n, OC, C, C, C, true, OC);
        d.runtime_m = true;
        ts_dnnl_matmul(&d, (ts_bf16 *)g->out + o * OC, src + o * C, g->weights[e], NULL);
    } else if (p == PRODUCT_DINP) {
        ts_dnnl_gemm d = ts_dnnl_gemm_2d(n, C, OC, OC, C, false, C);
        d.runtime_m = true;
        ts_dnnl_matmul(&d, (ts_bf16 *)g->out + o * C, src + o * OC, g->weights[e], NULL);
    } else { /* dweight[OC,C] += dout^T @ inp, A = dout^T read in place */
        ts_dnnl_gemm d = ts_dnnl_gemm_2d(OC, C, n, 0, C, false, C);
        d.a_m = 1;
        d.a_k = OC;
        d.c_type = TS_DTYPE_F32;
        d.accumulate = true;
        d.runtime_k = true;
        ts_dnnl_matmul(&d, g->dweights[e], src + o * OC, (const ts_bf16 *)g->inp + o * C, NULL);
    }
}

/* One product of expert e: on the calling thread alone inside the side-by-side loop,
 * on every thread otherwise (the GEMM libraries' own threading). */
static void expert_product(const grouped *g, product p, int e)
{
    if (g->t == TS_DTYPE_BF16) {
        bf16_product(g, p, e);
        return;
    }
    const int n = g->rows[e], C = g->C, OC = g->OC;
    const size_t o = g->first[e];
    const float *src = g->src;
    if (p == PRODUCT_OUT)
        ts_cpu_matmul_forward((float *)g->out + o * OC, src + o * C, g->weights[e], NULL, n, C,
                              OC);
    else if (p == PRODUCT_DINP)
        ts_cpu_matmul_backward((float *)g->out + o * C, NULL, NULL, src + o * OC, NULL,
                               g->weights[e], n, C, OC);
    else
        ts_cpu_matmul_backward(NULL, g->dweights[e], NULL, src + o * OC,
                               (const float *)g->inp + o * C, NULL, n, C, OC);
}

/* Expert e's whole backward one after the other on every thread: fp32 as matmul.c's
 * backward runs it (the input and weight gradients side by side on halves of the
 * threads), bf16 as matmul_bf16.c's (each in turn). */
static void expert_backward(const grouped *g, int e)
{
    if (g->t == TS_DTYPE_F32) {
        const int n = g->rows[e], C = g->C, OC = g->OC;
        const size_t o = g->first[e];
        const float *dout = (const float *)g->src + o * OC;
        ts_cpu_matmul_backward(g->out ? (float *)g->out + o * C : NULL,
                               g->dweights ? g->dweights[e] : NULL, NULL, dout,
                               (const float *)g->inp + o * C, g->weights[e], n, C, OC);
        return;
    }
    if (g->out) bf16_product(g, PRODUCT_DINP, e);
    if (g->dweights) bf16_product(g, PRODUCT_DWEIGHT, e);
}

/* Runs a grouped call: `kinds` products per expert (forward: PRODUCT_OUT; backward: the
 * input and/or weight gradients). */
static void grouped_run(grouped *g, int L, bool backward)
{
    int *order = ts_malloc(3 * (size_t)L * sizeof(int)), *task = order + L;
    size_t *first = ts_malloc((size_t)L * sizeof(size_t));
    size_t o = 0;
    for (int e = 0; e < L; e++) {
        TS_ASSERT(g->rows[e] >= 0);
        first[e] = o;
        o += (size_t)g->rows[e];
    }
    g->first = first;
    const int n = experts_by_rows(order, g->rows, L);
    product kinds[2];
    int nk = 0;
    if (!backward) kinds[nk++] = PRODUCT_OUT;
    if (backward && g->out) kinds[nk++] = PRODUCT_DINP;
    if (backward && g->dweights) kinds[nk++] = PRODUCT_DWEIGHT;
    /* The tasks, largest first: each expert's products side by side in the list. */
    for (int i = 0; i < n; i++)
        for (int k = 0; k < nk; k++) task[i * nk + k] = order[i];
    const int tasks = n * nk;
    if (nk > 0 && grouped_side_by_side(task, tasks, g->rows, ts_cpu_get_threads(),
                                       (double)g->C * g->OC)) {
#pragma omp parallel for schedule(dynamic, 1)
        for (int i = 0; i < tasks; i++) expert_product(g, kinds[i % nk], task[i]);
    } else {
        for (int i = 0; i < n; i++) {
            if (backward && nk > 0)
                expert_backward(g, order[i]);
            else if (!backward)
                expert_product(g, PRODUCT_OUT, order[i]);
        }
    }
    free(first);
    free(order);
}

static void grouped_forward(ts_dtype t, void *out, const void *inp, const void *const *weights,
                            const int *rows, int L, int C, int OC)
{
    grouped g = {.t = t, .out = out, .src = inp, .weights = weights, .rows = rows, .C = C,
                 .OC = OC};
    grouped_run(&g, L, false);
}

static void grouped_backward(ts_dtype t, void *dinp, float *const *dweights, const void *dout,
                             const void *inp, const void *const *weights, const int *rows, int L,
                             int C, int OC)
{
    grouped g = {.t = t, .out = dinp, .dweights = dweights, .src = dout, .inp = inp,
                 .weights = weights, .rows = rows, .C = C, .OC = OC};
    grouped_run(&g, L, true);
}

void ts_cpu_grouped_matmul_forward(void *out, const void *inp, const void *const *weights,
                                   const int *rows, int L, int C, int OC)
{
    grouped_forward(TS_DTYPE_F32, out, inp, weights, rows, L, C, OC);
}

void ts_cpu_bf16_grouped_matmul_forward(void *out, const void *inp, const void *const *weights,
                                        const int *rows, int L, int C, int OC)
{
    grouped_forward(TS_DTYPE_BF16, out, inp, weights, rows, L, C, OC);
}

void ts_cpu_grouped_matmul_backward(void *dinp, float *const *dweights, const void *dout,
                                    const void *inp, const void *const *weights, const int *rows,
                                    int L, int C, int OC)
{
    grouped_backward(TS_DTYPE_F32, dinp, dweights, dout, inp, weights, rows, L, C, OC);
}

void ts_cpu_bf16_grouped_matmul_backward(void *dinp, float *const *dweights, const void *dout,
                                         const void *inp, const void *const *weights,
                                         const int *rows, int L, int C, int OC)
{
    grouped_backward(TS_DTYPE_BF16, dinp, dweights, dout, inp, weights, rows, L, C, OC);
}
