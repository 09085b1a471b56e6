/* Schedules with the V placement (rank r holds chunks r and 2p-1-r, so the embedding
 * and the LM head share rank 0): zb-v (torch's ScheduleZBVZeroBubble, the zero-bubble
 * paper's ZB-V) and dualpipe-v (torch's ScheduleDualPipeV, DeepSeek's DualPipe folded
 * onto p ranks). Both ported from torch 2.15's _calculate_single_rank_operations: our
 * code, the same order of compute actions (idle steps dropped, DualPipeV's OVERLAP_F_B
 * pairs as ts_action.overlap pairs), action for action, for pp in {1, 2, 3, 4, 8} and
 * every m from 1 to 3pp+2 (dualpipe-v refusing the same m < 2pp torch refuses). Below, "chunk 0/1" of a rank are its down and up chunks
 * r and 2p-1-r. */
#include <stdio.h>
#include <stdlib.h>

#include "pipeline/schedule_gen.h"

/* Per rank: its two chunks and the next micro-batch of each kind on each. */
typedef struct {
    ts_schedule *s;
    int r;
    int chunk[2];
    int f[2], i[2], w[2];
} rank_gen;

static rank_gen rank_gen_init(ts_schedule *s, int r)
{
    return (rank_gen){ .s = s, .r = r, .chunk = { r, 2 * s->pp - 1 - r } };
}

static void f_of(rank_gen *g, int k)
{
    ts_sched_push(g->s, g->r, TS_ACT_F, g->chunk[k], g->f[k]++);
}

static void i_of(rank_gen *g, int k)
{
    ts_sched_push(g->s, g->r, TS_ACT_I, g->chunk[k], g->i[k]++);
}

static void w_of(rank_gen *g, int k)
{
    ts_sched_push(g->s, g->r, TS_ACT_W, g->chunk[k], g->w[k]++);
}

/* I then W at once (torch's ZB-V runs them back to back outside the cool-down). */
static void iw_of(rank_gen *g, int k)
{
    i_of(g, k);
    w_of(g, k);
}

/* ZB-V for n micro-batches (torch builds max(m, 2p-1) and prunes the rest). Warm-up:
 * 2(p-r)-1 forwards of chunk 0, r pairs F1 F0, p-r triples F1 I1 W1 (the up chunk's
 * first backwards start on the rank that holds the last chunk); steady: F0 I0 W0
 * F1 I1 W1 (F0 while micro-batches remain); cool-down: r pairs I0 I1, p-r pairs I0 W0,
 * then chunk 1's and chunk 0's pending W's. From m >= 2p-1 on, every rank's F-until-W
 * peak is 2p chunk activations (chunks of half a rank's layers: the bytes of 1F1B's p
 * on its rank 0), and with F = I = W every rank is busy from its first action to its
 * last (tested). */
static void build_rank_zb_v(ts_schedule *s, int r, int n)
{
    const int pp = s->pp;
    rank_gen g = rank_gen_init(s, r);
    for (int k = 0; k < 2 * (pp - r) - 1; k++) f_of(&g, 0);
    for (int k = 0; k < r; k++) f_of(&g, 1), f_of(&g, 0);
    for (int k = 0; k < pp - r; k++) f_of(&g, 1), iw_of(&g, 1);
    while (g.f[1] < g.f[0] || g.f[0] < n) {
        if (g.f[0] < n) f_of(&g, 0);
        iw_of(&g, 0);
        f_of(&g, 1);
        iw_of(&g, 1);
    }
    for (int k = 0; k < r; k++) i_of(&g, 0), i_of(&g, 1);
    for (int k = 0; k < pp - r; k++) i_of(&g, 0), w_of(&g, 0);
    while (g.w[1] < g.i[1]) w_of(&g, 1);
    while (g.w[0] < g.i[0]) w_of(&g, 0);
    TS_ASSERT(g.f[0] == n && g.i[0] == n && g.w[0] == n);
    TS_ASSERT(g.f[1] == n && g.i[1] == n && g.w[1] == n);
}

ts_status ts_sched_gen_zb_v(ts_schedule *s, const char *name, int pp, int m)
{
    const int n = m > 2 * pp - 1 ? m : 2 * pp - 1; /* enough to fill the pipeline */
    ts_sched_alloc(s, name, pp, 2, n, 6 * n);
    ts_schedule_set_placement(s, TS_PLACEMENT_V);
    for (int r = 0; r < pp; r++) build_rank_zb_v(s, r, n);
    if (n > m) ts_sched_keep_first(s, m);
    return TS_OK;
}

/* DualPipeV's weight passes wait in a queue, oldest first: the (local chunk, micro-batch)
 * of each I whose W has not run (torch's weight_queue). */
typedef struct {
    int *chunk, *mb; /* [2m] */
    int n_queued, n_done;
} w_queue;

/* The backwards of dualpipe-v: B (full) or I with its W queued. B and I of a chunk
 * share one micro-batch counter (torch's BACKWARD_INPUT key). */
static void b_of(rank_gen *g, int k)
{
    ts_sched_push(g->s, g->r, TS_ACT_B, g->chunk[k], g->i[k]++);
}

static void dual_i(rank_gen *g, int k, w_queue *q)
{
    q->chunk[q->n_queued] = k;
    q->mb[q->n_queued++] = g->i[k];
    i_of(g, k);
}

/* The oldest pending W, if any (torch's add_weight_action_if_pending). */
static void dual_w(rank_gen *g, w_queue *q)
{
    if (q->n_done == q->n_queued) return;
    const int k = q->chunk[q->n_done], mb = q->mb[q->n_done++];
    ts_sched_push(g->s, g->r, TS_ACT_W, g->chunk[k], mb);
}

/* A backward of local chunk k: full, or once `split`, I (its W queued). */
static void dual_backward(rank_gen *g, int k, bool split, w_queue *q)
{
    if (split)
        dual_i(g, k, q);
    else
        b_of(g, k);
}

/* An overlapped pair: forward of local chunk kf and full backward of chunk kb. */
static void dual_pair(rank_gen *g, int kf, int kb)
{
    f_of(g, kf);
    ts_sched_mark_overlap(g->s, g->r);
    b_of(g, kb);
}

/* DualPipeV (torch's step numbering): 1. 2(p-r-1) forwards of chunk 0; 2. r+1 pairs
 * F0 F1; 3. p-r-1 triples I1 W F1 (zero-bubble style); 4. the main phase, m-2p+r+1
 * times the overlapped pairs (F0;B1) (F1;B0), the first (F0;B1) of the last rank
 * not overlapped; 5. p-r-1 times B1 then the pair (F1;B0); 6. r+1 pairs of backwards
 * B1 B0, the later half as I's (the switch falls between B1 and B0 on even ranks,
 * before B1 on odd ones); 7. p-r-1 times a pending W then the chunk-0 backward;
 * 8. the r+1 W's still pending. Every rank's F-until-W peak is 2p+1 chunk activations,
 * one more than zb-v (tested). */
static void build_rank_dualpipe_v(ts_schedule *s, int r, w_queue *q)
{
    const int pp = s->pp, m = s->m;
    rank_gen g = rank_gen_init(s, r);
    q->n_queued = q->n_done = 0;
    for (int k = 0; k < 2 * (pp - r - 1); k++) f_of(&g, 0);
    for (int k = 0; k < r + 1; k++) f_of(&g, 0), f_of(&g, 1);
    for (int k = 0; k < pp - r - 1; k++) {
        dual_i(&g, 1, q);
        dual_w(&g, q);
        f_of(&g, 1);
    }
    for (int k = 0; k < m - 2 * pp + r + 1; k++) {
        if (k == 0 && r == pp - 1) {
            f_of(&g, 0); /* not overlapped: a smaller bubble (torch's note) */
            b_of(&g, 1);
        } else {
            dual_pair(&g, 0, 1);
        }
        dual_pair(&g, 1, 0);
    }
    for (int k = 0; k < pp - r - 1; k++) {
        b_of(&g, 1);
        dual_pair(&g, 1, 0);
    }
    bool split = false;
    const int half = (r + 1) / 2;
    for (int k = 0; k < r + 1; k++) {
        if (k == half && r % 2 == 1) split = true;
        dual_backward(&g, 1, split, q);
        if (k == half && r % 2 == 0) split = true;
        dual_backward(&g, 0, split, q);
    }
    for (int k = 0; k < pp - r - 1; k++) {
        dual_w(&g, q);
        dual_backward(&g, 0, split, q);
    }
    for (int k = 0; k < r + 1; k++) dual_w(&g, q);
    TS_ASSERT(q->n_done == q->n_queued);
    TS_ASSERT(g.f[0] == m && g.f[1] == m && g.i[0] == m && g.i[1] == m);
}

ts_status ts_sched_gen_dualpipe_v(ts_schedule *s, const char *name, int pp, int m)
{
    if (m < 2 * pp)
        return ts_fail("schedule \"%s\" with pp = %d needs at least 2 * pp = %d micro-batches "
                       "per step (torch's ScheduleDualPipeV rule: m >= the number of chunks), "
                       "got %d: raise train.global_batch to at least dp * micro_batch * %d, "
                       "or use schedule \"zb-v\" (any m)",
                       name, pp, 2 * pp, m, 2 * pp);
    ts_sched_alloc(s, name, pp, 2, m, 6 * m);
    ts_schedule_set_placement(s, TS_PLACEMENT_V);
    w_queue q = { .chunk = ts_malloc((size_t)(2 * m) * sizeof(int)),
                  .mb = ts_malloc((size_t)(2 * m) * sizeof(int)) };
    for (int r = 0; r < pp; r++) build_rank_dualpipe_v(s, r, &q);
    free(q.chunk);
    free(q.mb);
    return TS_OK;
}
