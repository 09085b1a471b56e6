/* The experts' GEMMs of an MoE layer, fp32 on the CPU: GFLOP/s of the L experts' SwiGLU
 * projections (forward: gate|up [2F,C] and down [C,F]; backward: both gradients of both)
 * run as moe.c ran them before the grouped calls (one matmul call per expert), as the
 * grouped calls (kernels.h grouped_matmul_*: the automatic choice, and each of its two
 * ways forced), against one dense GEMM pair of the same total rows (a dense MLP of width
 * F on every row: the ceiling the experts' GEMMs are measured against).
 *
 *   cmake --build build --target bench_grouped && ./build/bench/bench_grouped [threads]
 *
 * Shapes: the Mixtral-4l bench model's layer (bench/moe.sh: C 512, F 1024, E 8, top-2,
 * 1024 tokens: 2048 rows), a fine-grained one (E 64, top-8, F 128, 1024 tokens: 8192
 * rows), and rows-per-expert sweeps (8 experts at C 512, F 1024: even, and one expert
 * holding 3/4 of the rows) that
 * the choice's rule is read from (kernels/cpu/grouped_matmul.c). Rows per expert come
 * from a fixed-seed uniform top-K routing (what a balanced router gives). FLOPs: forward
 * 6 R C F, backward 12 R C F (R rows). Best of the timed reps after a warm-up. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "core/error.h"
#include "core/timer.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/kernels.h"

static const ts_kernels *K = &ts_kernels_cpu;

typedef struct {
    int L, C, F, R;
    const int *rows;
    float *x, *h, *a, *y, *dy, *da, *dh, *dx, *w, *g; /* w, g: every expert's fc|proj */
    const void **wfc, **wproj;
    float **gfc, **gproj;
} layer;

static layer layer_make(int L, int C, int F, const int *rows)
{
    layer t = {.L = L, .C = C, .F = F, .rows = rows};
    for (int e = 0; e < L; e++) t.R += rows[e];
    const size_t R = (size_t)t.R, per = 3 * (size_t)F * C;
    t.x = bench_random_floats(R * C, 1.0f, 1u);
    t.h = bench_random_floats(R * 2 * F, 1.0f, 2u);
    t.a = bench_random_floats(R * F, 1.0f, 3u);
    t.dy = bench_random_floats(R * C, 1.0f, 4u);
    t.y = ts_alloc_floats(R * C), t.da = ts_alloc_floats(R * F);
    t.dh = bench_random_floats(R * 2 * F, 1.0f, 5u), t.dx = ts_alloc_floats(R * C);
    t.w = bench_random_floats((size_t)L * per, 0.05f, 6u), t.g = ts_alloc_floats((size_t)L * per);
    t.wfc = ts_malloc(2 * (size_t)L * sizeof(void *)), t.wproj = t.wfc + L;
    t.gfc = ts_malloc(2 * (size_t)L * sizeof(float *)), t.gproj = t.gfc + L;
    for (int e = 0; e < L; e++) {
        t.wfc[e] = t.w + e * per, t.wproj[e] = t.w + e * per + 2 * (size_t)F * C;
        t.gfc[e] = t.g + e * per, t.gproj[e] = t.g + e * per + 2 * (size_t)F * C;
    }
    return t;
}

static void layer_free(layer *t)
{
    free(t->x), free(t->h), free(t->a), free(t->dy), free(t->y), free(t->da), free(t->dh);
    free(t->dx), free(t->w), free(t->g), free(t->wfc), free(t->gfc);
}

/* moe.c before the grouped calls: one matmul per expert and weight. */
static void loop_step(const layer *t)
{
    const int C = t->C, F = t->F;
    size_t o = 0;
    for (int e = 0; e < t->L; o += (size_t)t->rows[e], e++) {
        const int n = t->rows[e];
        if (n == 0) continue;
        K->matmul_forward(t->h + o * 2 * F, t->x + o * C, t->wfc[e], NULL, n, C, 2 * F);
        K->matmul_forward(t->y + o * C, t->a + o * F, t->wproj[e], NULL, n, F, C);
    }
    o = 0;
    for (int e = 0; e < t->L; o += (size_t)t->rows[e], e++) {
        const int n = t->rows[e];
        if (n == 0) continue;
        K->matmul_backward(t->da + o * F, t->gproj[e], NULL, t->dy + o * C, t->a + o * F,
                           t->wproj[e], n, F, C);
        K->matmul_backward(t->dx + o * C, t->gfc[e], NULL, t->dh + o * 2 * F, t->x + o * C,
                           t->wfc[e], n, C, 2 * F);
    }
}

static void grouped_step(const layer *t)
{
    const int C = t->C, F = t->F, L = t->L;
    K->grouped_matmul_forward(t->h, t->x, t->wfc, t->rows, L, C, 2 * F);
    K->grouped_matmul_forward(t->y, t->a, t->wproj, t->rows, L, F, C);
    K->grouped_matmul_backward(t->da, t->gproj, t->dy, t->a, t->wproj, t->rows, L, F, C);
    K->grouped_matmul_backward(t->dx, t->gfc, t->dh, t->x, t->wfc, t->rows, L, C, 2 * F);
}

/* One dense MLP's GEMMs on all R rows (expert 0's weights). */
static void dense_step(const layer *t)
{
    const int C = t->C, F = t->F, R = t->R;
    K->matmul_forward(t->h, t->x, t->wfc[0], NULL, R, C, 2 * F);
    K->matmul_forward(t->y, t->a, t->wproj[0], NULL, R, F, C);
    K->matmul_backward(t->da, t->gproj[0], NULL, t->dy, t->a, t->wproj[0], R, F, C);
    K->matmul_backward(t->dx, t->gfc[0], NULL, t->dh, t->x, t->wfc[0], R, C, 2 * F);
}

static double best_ms(void (*step)(const layer *), const layer *t, int reps)
{
    step(t); /* warm-up */
    double best = 1e300;
    for (int r = 0; r < reps; r++) {
        double t0 = ts_now_ms();
        step(t);
        double dt = ts_now_ms() - t0;
        best = dt < best ? dt : best;
    }
    return best;
}

static void grouped_auto(const layer *t)
{
    ts_cpu_grouped_mode = TS_GROUPED_AUTO;
    grouped_step(t);
}
static void grouped_sbs(const layer *t)
{
    ts_cpu_grouped_mode = TS_GROUPED_SIDE_BY_SIDE;
    grouped_step(t);
}
static void grouped_one(const layer *t)
{
    ts_cpu_grouped_mode = TS_GROUPED_ONE_AFTER;
    grouped_step(t);
}

/* One row of the table: GFLOP/s of each way, and the grouped (auto) against dense. */
static void measure(const char *name, int L, int C, int F, const int *rows, int reps)
{
    layer t = layer_make(L, C, F, rows);
    const double gf = 18.0 * t.R * (double)C * F / 1e9; /* forward 6RCF + backward 12RCF */
    int most = 0, empty = 0;
    for (int e = 0; e < L; e++) most = rows[e] > most ? rows[e] : most, empty += rows[e] == 0;
    const double loop = best_ms(loop_step, &t, reps), autom = best_ms(grouped_auto, &t, reps);
    const double sbs = best_ms(grouped_sbs, &t, reps), one = best_ms(grouped_one, &t, reps);
    const double dense = best_ms(dense_step, &t, reps);
    ts_cpu_grouped_mode = TS_GROUPED_AUTO;
    printf("%-26s %5d %5d %4d %6d %5d | %7.1f %7.1f %7.1f %7.1f | %7.1f | %5.2f\n", name, t.R,
           L, empty, t.R / L, most, gf / loop * 1e3, gf / autom * 1e3, gf / sbs * 1e3,
           gf / one * 1e3, gf / dense * 1e3, dense / autom);
    layer_free(&t);
}

/* Rows per expert of a uniform top-K routing of `tokens` tokens over E experts (each
 * token K distinct experts), fixed seed: what a balanced router gives. */
static int *uniform_routing(int tokens, int E, int K, unsigned seed)
{
    int *rows = calloc((size_t)E, sizeof(int));
    srand(seed);
    for (int n = 0; n < tokens; n++) {
        int chosen[64], c = 0;
        while (c < K) {
            int e = rand() % E, dup = 0;
            for (int i = 0; i < c; i++) dup |= chosen[i] == e;
            if (!dup) chosen[c++] = e;
        }
        for (int i = 0; i < K; i++) rows[chosen[i]]++;
    }
    return rows;
}

int main(int argc, char **argv)
{
    ts_blas_select_core(argc, argv);
    setvbuf(stdout, NULL, _IOLBF, 0);
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    ts_cpu_set_threads(threads);
    char cpu[128];
    printf("bench_grouped: fp32, %d threads, OpenBLAS %s, %s\n", threads, ts_blas_core(),
           ts_cpu_model(cpu, sizeof cpu));
    printf("GFLOP/s of the experts' SwiGLU GEMMs (forward + backward, 18 R C F FLOPs)\n");
    printf("%-26s %5s %5s %4s %6s %5s | %7s %7s %7s %7s | %7s | %5s\n", "case", "rows", "E",
           "empty", "mean", "most", "loop", "grouped", "sbs", "one", "dense", "g/d");
    int *mix = uniform_routing(1024, 8, 2, 7u);
    measure("mixtral-4l C512 F1024 E8k2", 8, 512, 1024, mix, 4);
    int *fine = uniform_routing(1024, 64, 8, 8u);
    measure("fine C512 F128 E64k8", 64, 512, 128, fine, 4);
    int *fine_small = uniform_routing(256, 64, 8, 9u);
    measure("fine 256 tokens", 64, 512, 128, fine_small, 5);
    /* sweeps: 8 experts (C 512, F 1024) with r rows each, and with expert 0 holding half */
    static const int per[] = {16, 64, 256, 1024};
    for (size_t i = 0; i < sizeof per / sizeof per[0]; i++) {
        int even[8], skew[8];
        for (int e = 0; e < 8; e++) even[e] = per[i], skew[e] = per[i] * 2 / 7;
        skew[0] = per[i] * 6; /* 3/4 of the rows: the threads cannot share them evenly */
        char name[64];
        snprintf(name, sizeof name, "even %d/expert", per[i]);
        measure(name, 8, 512, 1024, even, 3);
        snprintf(name, sizeof name, "3/4 on one, %d total", per[i] * 8);
        measure(name, 8, 512, 1024, skew, 3);
    }
    free(mix), free(fine), free(fine_small);
    return 0;
}
