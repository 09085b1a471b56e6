/* ZeRO-2/3's residency rule (pipeline/residency.h) and the memory it implies
 * (pipeline/memory.h), on small built schedules whose action lists are worked out by
 * hand in the comments:
 *   test_gathers: weight gathers per chunk and step: looped-bfs 2 per chunk but the last
 *     (its backward follows its forwards), 1f1b and gpipe 1 (one rank's forwards and
 *     backwards are adjacent in its list), interleaved-1f1b and zb-v per chunk;
 *   test_grad_lifetimes: where each gradient buffer is allocated and freed, held to the
 *     end when the chunk holds a group-summed tensor (ts_memory_residency: a tied
 *     embedding split over two ranks, replicated key/value weights);
 *   test_peak_bytes: ts_residency_peak_bytes against the walk done by hand;
 *   test_memory_levels: ts_memory_rank's zero 0..3 on a synthetic rank (exact formulas)
 *     and the trainer's estimate on configs/tiny.cfg at dp 4: parameters + gradients +
 *     optimizer state fall to 16/dp bytes per parameter with ZeRO-3, the chunk floats
 *     tile the rank's parameters, and zero >= 1 with dp = 1 is zero 0. */
#include <string.h>

#include "pipeline/memory.h"
#include "pipeline/partition.h"
#include "pipeline/residency.h"
#include "pipeline/schedule.h"
#include "test_util.h"

enum { MAXC = 16 };

static void build(ts_schedule *s, const char *name, int pp, int v, int m)
{
    if (ts_schedule_build(s, name, pp, v, m) != TS_OK) {
        fprintf(stderr, "%s\n", ts_error_message());
        exit(2);
    }
}

/* The gathers of rank q's chunks, -1 for chunks elsewhere. */
static void gathers_of(const ts_schedule *s, int q, int *out)
{
    ts_residency r;
    ts_residency_build(s, q, -1, NULL, &r);
    for (int c = 0; c < s->n_chunks; c++) out[c] = ts_chunk_rank(s, c) == q ? r.gathers[c] : -1;
    ts_residency_free(&r);
}

static void test_gathers(void)
{
    /* looped-bfs pp 2 v 2 m 2, rank 0: F0.0 F0.1 F2.0 F2.1 B2.1 B2.0 B0.1 B0.0: chunk 0's
     * backwards come long after its forwards (2), chunk 2's follow at once (1). */
    const struct {
        const char *name;
        int pp, v, m;
        int want[MAXC]; /* per chunk over all ranks */
    } cases[] = {
        {"looped-bfs", 2, 2, 2, {2, 2, 1, 1}},
        {"looped-bfs", 2, 4, 4, {2, 2, 2, 2, 2, 2, 1, 1}},
        {"looped-bfs", 4, 2, 8, {2, 2, 2, 2, 1, 1, 1, 1}},
        {"1f1b", 2, 1, 3, {1, 1}},
        {"1f1b", 4, 1, 8, {1, 1, 1, 1}},
        {"gpipe", 2, 1, 2, {1, 1}},
        /* rank 0: F0.0 F0.1 F2.0 F2.1 F0.2 B2.0 F0.3 B2.1 F2.2 B0.0 ...: chunk 0's last
         * forward (6) and first backward (9) are apart, but its backward residency's
         * prefetch would be issued at chunk 2's first action (2), while the forward one
         * still holds the weights: they stay (one gather); chunks 1, 2, 3 overlap. */
        {"interleaved-1f1b", 2, 2, 4, {1, 1, 1, 1}},
        /* zb-v (V placement: chunks 0, 3 on rank 0): rank 0 runs F0.0-F0.2 then chunk
         * 3, and chunk 0's first I at 9; rank 1's two chunks interleave. */
        {"zb-v", 2, 2, 3, {2, 1, 1, 1}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        ts_schedule s;
        build(&s, cases[k].name, cases[k].pp, cases[k].v, cases[k].m);
        int got[MAXC], all[MAXC];
        for (int q = 0; q < s.pp; q++) {
            gathers_of(&s, q, got);
            for (int c = 0; c < s.n_chunks; c++)
                if (got[c] >= 0) all[c] = got[c];
        }
        for (int c = 0; c < s.n_chunks; c++)
            CHECKF(all[c] == cases[k].want[c], "%s pp %d v %d m %d chunk %d: %d gathers, want %d",
                   cases[k].name, s.pp, s.v, s.m, c, all[c], cases[k].want[c]);
        ts_schedule_free(&s);
    }
}

static void test_grad_lifetimes(void)
{
    ts_schedule s;
    /* looped-bfs pp 2 v 2 m 2, rank 0: B2.1 at 4, B2.0 at 5, B0.1 at 6, B0.0 at 7: one
     * allocation after chunk 2's last backward (chunk 0's at 6), none a second: both
     * buffers live to the end (8). */
    build(&s, "looped-bfs", 2, 2, 2);
    ts_residency r;
    ts_residency_build(&s, 0, -1, NULL, &r);
    CHECK(r.grad_alloc[2] == 4 && r.grad_last[2] == 5 && r.grad_free[2] == 8);
    CHECK(r.grad_alloc[0] == 6 && r.grad_last[0] == 7 && r.grad_free[0] == 8);
    CHECK(r.grad_alloc[1] == -1 && r.grad_free[1] == -1); /* chunk 1 is on rank 1 */
    ts_residency_free(&r);
    ts_schedule_free(&s);

    /* looped-bfs pp 2 v 4 m 2, rank 0 holds chunks 0, 2, 4, 6; backwards (m = 2 each) in
     * the order 6, 4, 2, 0 from action 8: chunk 6's buffer (8..9) is freed before the
     * second allocation after it (chunk 2's at 12), chunk 4's before chunk 0's (14). */
    build(&s, "looped-bfs", 2, 4, 2);
    ts_residency_build(&s, 0, -1, NULL, &r);
    CHECK(r.grad_alloc[6] == 8 && r.grad_last[6] == 9 && r.grad_free[6] == 12);
    CHECK(r.grad_alloc[4] == 10 && r.grad_free[4] == 14);
    CHECK(r.grad_alloc[2] == 12 && r.grad_free[2] == 16);
    CHECK(r.grad_alloc[0] == 14 && r.grad_free[0] == 16);
    ts_residency_free(&r);

    /* A tied embedding split over two ranks (chunk 0 on rank 0, the head's chunk 7 on
     * rank 1) is summed at the step's end: its buffers are held there. */
    const int first[8] = {0, 1, 2, 3, 4, 5, 6, 7}, layers[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    ts_memory_residency(&s, 0, true, false, first, layers, 8, &r);
    CHECK(r.grad_free[0] == 16 && r.grad_free[6] == 12);
    ts_residency_free(&r);
    ts_memory_residency(&s, 1, true, false, first, layers, 8, &r);
    CHECK(r.grad_free[7] == 16);
    ts_residency_free(&r);
    ts_memory_residency(&s, 1, false, false, first, layers, 8, &r);
    CHECK(r.grad_free[7] == 12); /* untied: freed like any other */
    ts_residency_free(&r);
    /* Replicated key/value weights: every chunk holding a block waits; the embedding's
     * chunk 0 (layer 0 alone) does not. */
    ts_memory_residency(&s, 0, false, true, first, layers, 8, &r);
    CHECK(r.grad_free[6] == 16 && r.grad_free[4] == 16 && r.grad_free[2] == 16);
    CHECK(r.grad_free[0] == 16); /* the last one allocated: the end anyway */
    ts_residency_free(&r);
    ts_schedule_free(&s);

    /* V placement with a tied model: the head (chunk 3) sits with the embedding on rank
     * 0, reads its tensor (tied chunk 0), and no group sum holds anything. */
    build(&s, "zb-v", 2, 2, 3);
    CHECK(ts_residency_tied_chunk(&s, true) == 0 && ts_residency_tied_chunk(&s, false) == -1);
    ts_schedule_free(&s);
}

static void test_peak_bytes(void)
{
    ts_schedule s;
    build(&s, "looped-bfs", 2, 2, 2);
    ts_residency r;
    ts_residency_build(&s, 0, -1, NULL, &r);
    /* Spans: chunk 0 [0,1] issued at 0, chunk 2 [2,5] issued at 0 (prefetched while
     * chunk 0 computes), chunk 0 [6,7] issued at 2. Weights 1 (chunk 0), 2 (chunk 2);
     * gradients 10, 20. Live: action 0: 1 + 2 = 3; after 1: 2; at 2: 3; at 4: + 20 = 23;
     * after 5: 21; at 6: + 10 = 31; at 7: 31. */
    const double w[4] = {1, 0, 2, 0}, g[4] = {10, 0, 20, 0};
    CHECKF(ts_residency_peak_bytes(&r, w, g) == 31.0, "%g", ts_residency_peak_bytes(&r, w, g));
    CHECK(ts_residency_peak_bytes(&r, NULL, g) == 30.0); /* ZeRO-2: both buffers at the end */
    const double w_big[4] = {100, 0, 200, 0};
    /* 300 at action 0 (both gathered), 200 + 100 at 2 (chunk 0 prefetched again beside
     * chunk 2), + 20 at 4 (chunk 2's gradients): 320; 100 + 20 + 10 at 6. */
    CHECK(ts_residency_peak_bytes(&r, w_big, g) == 320.0);
    ts_residency_free(&r);
    ts_schedule_free(&s);

    /* 1f1b pp 2 m 3: one chunk, resident throughout, gradient buffer from its first B. */
    build(&s, "1f1b", 2, 1, 3);
    ts_residency_build(&s, 1, -1, NULL, &r);
    const double w1[2] = {0, 5}, g1[2] = {0, 7};
    CHECK(ts_residency_peak_bytes(&r, w1, g1) == 12.0);
    ts_residency_free(&r);
    ts_schedule_free(&s);
}

/* ts_memory_rank on looped-bfs pp 2 v 2 m 2's rank 0 holding N floats in two chunks. */
static void synthetic_rank(const ts_schedule *s, int zero, int dp, const ts_residency *res,
                           ts_rank_memory *est)
{
    static const double zeros[4] = {0}, floats_c[4] = {400000, 0, 600000, 0};
    static const int none[4] = {0};
    const ts_memory_shape sh = {.micro_batch = 1, .seq_len = 1, .n_embd = 1, .pp = s->pp,
                                .n_chunks = s->n_chunks, .chunk_rank = s->chunk_rank, .m = s->m,
                                .dp = dp, .zero = zero, .weight_copy_bytes = 2, .act_bytes = 4};
    const ts_memory_holdings h = {.param_floats = 1e6, .act_bytes = zeros, .stash_bytes = zeros,
                                  .peak_acts = none, .peak_stash = none, .n_recomputed = none,
                                  .chunk_floats = floats_c, .res = res};
    ts_memory_rank(&sh, &h, 0, est);
}

static void test_memory_levels(void)
{
    ts_schedule s;
    build(&s, "looped-bfs", 2, 2, 2);
    ts_residency r;
    ts_residency_build(&s, 0, -1, NULL, &r);
    const double N = 1e6;
    ts_rank_memory e[4];
    for (int z = 0; z < 4; z++) synthetic_rank(&s, z, 4, &r, &e[z]);
    /* bf16 copy (2 bytes), dp 4 */
    CHECK(e[0].params == 6 * N && e[0].grads == 4 * N && e[0].optimizer == 8 * N);
    CHECK(e[1].params == 6 * N && e[1].grads == 4 * N && e[1].optimizer == 2 * N);
    CHECK(e[0].chunk_buffers == 0 && e[1].chunk_buffers == 0);
    CHECK(e[2].params == 6 * N && e[2].grads == N && e[2].optimizer == 2 * N);
    /* ZeRO-2: both chunks' gradient buffers at the end: 4 * (0.4 + 0.6) N */
    CHECK(e[2].chunk_buffers == 4 * N);
    CHECK(e[3].params == N && e[3].grads == N && e[3].optimizer == 2 * N);
    /* ZeRO-3: weights 6 bytes a float: 6 * 1.0 N at action 0 (both gathered), at 4
     * chunk 2 (3.6 N) and chunk 0 again (2.4 N) plus chunk 2's gradients (2.4 N) = 8.4 N,
     * above the validation gather's 6 N. */
    CHECKF(fabs(e[3].chunk_buffers - 8.4 * N) < 1e-6, "%.1f", e[3].chunk_buffers);
    for (int z = 0; z < 4; z++)
        CHECK(e[z].total == e[z].params + e[z].grads + e[z].optimizer + e[z].chunk_buffers +
                                e[z].activations + e[z].buffers + e[z].blas);
    /* One replica: every level is zero 0. */
    ts_rank_memory one;
    for (int z = 1; z < 4; z++) {
        synthetic_rank(&s, z, 1, &r, &one);
        CHECK(one.params == e[0].params && one.grads == e[0].grads &&
              one.optimizer == e[0].optimizer && one.chunk_buffers == 0);
    }
    ts_residency_free(&r);
    ts_schedule_free(&s);

    /* The trainer's estimate (configs/tiny.cfg with 6 blocks, pp 2 looped-bfs v 4, dp 4,
     * fp32). */
    const char *src = getenv("TS_SOURCE_DIR");
    char path[1200];
    snprintf(path, sizeof path, "%s/configs/tiny.cfg", src && *src ? src : ".");
    ts_rank_memory t[4];
    double floats_sum = 0.0, n0 = 0.0;
    for (int z = 0; z < 4; z++) {
        char zs[32];
        snprintf(zs, sizeof zs, "parallel.zero=%d", z);
        const char *sets[] = {"model.n_layer=6", "parallel.pp=2", "parallel.dp=4", "parallel.virtual_stages=4",
                              "parallel.schedule=looped-bfs", "train.global_batch=32",
                              "parallel.micro_batch=2", zs};
        ts_config cfg;
        if (ts_config_load_plan(&cfg, path, sets, 8) != TS_OK) {
            fprintf(stderr, "%s\n", ts_error_message());
            exit(2);
        }
        ts_partition part;
        CHECK(ts_partition_build(&cfg, false, &part) == TS_OK);
        ts_schedule sc;
        build(&sc, "looped-bfs", 2, 4, ts_config_num_microbatches(&cfg));
        ts_memory_estimate(&cfg, &part, &sc, 0, 1, NULL, &t[z]);
        if (z == 3) {
            double fc[MAXC] = {0};
            ts_memory_chunk_floats(&cfg, &part, &sc, 0, fc);
            for (int c = 0; c < sc.n_chunks; c++) floats_sum += fc[c];
        }
        ts_schedule_free(&sc);
        ts_partition_free(&part);
    }
    n0 = t[0].grads / 4.0; /* fp32: N floats of gradients with zero 0 */
    CHECKF(floats_sum == n0, "chunk floats %.0f, parameters %.0f", floats_sum, n0);
    const double ppo[4] = {t[0].params + t[0].grads + t[0].optimizer,
                           t[1].params + t[1].grads + t[1].optimizer,
                           t[2].params + t[2].grads + t[2].optimizer,
                           t[3].params + t[3].grads + t[3].optimizer};
    CHECKF(ts_rel_err(ppo[0], 16.0 * n0, 1) < 1e-12, "%.0f", ppo[0]);
    CHECK(ts_rel_err(ppo[1], (8.0 + 8.0 / 4) * n0, 1) < 1e-12);
    CHECK(ts_rel_err(ppo[2], (4.0 + 12.0 / 4) * n0, 1) < 1e-12);
    CHECKF(ts_rel_err(ppo[3], 16.0 / 4 * n0, 1) < 1e-12, "zero 3: %.0f of %.0f", ppo[3], n0);
    /* ZeRO-3's buffers: at least the whole-rank gather (4 N), at most every chunk's
     * weights and gradients at once (8 N). */
    CHECK(t[3].chunk_buffers >= 4.0 * n0 && t[3].chunk_buffers <= 8.0 * n0);
    CHECK(t[2].chunk_buffers > 0 && t[2].chunk_buffers <= 4.0 * n0);
    char line[512];
    ts_memory_describe(&t[3], line, sizeof line);
    CHECKF(strstr(line, "chunk buffers") != NULL, "%s", line);
    ts_memory_describe(&t[0], line, sizeof line);
    CHECK(strstr(line, "chunk buffers") == NULL);
}

int main(void)
{
    test_gathers();
    test_grad_lifetimes();
    test_peak_bytes();
    test_memory_levels();
    return ts_test_report();
}
