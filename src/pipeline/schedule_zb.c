/* Zero-bubble schedules with a loop placement (chunk c on rank c % pp): interleaved-zb
 * (torch's ScheduleInterleavedZeroBubble, the paper's ZB1P, ported) and zb-h2 (Qi et
 * al. 2023, "Zero Bubble Pipeline Parallelism", section 3, designed here from the
 * paper: torch has no ZB-H2). See the top of schedule.c for the one-paragraph view. */
#include <stdio.h>
#include <stdlib.h>

#include "pipeline/schedule_gen.h"

static int min_int(int a, int b) { return a < b ? a : b; }

/* torch's rule for its interleaved schedules: rounds = max(1, m / p) and m a multiple
 * of it; each round holds m / rounds micro-batches (>= p when m >= p). */
static int torch_rounds(int pp, int m) { return m / pp > 1 ? m / pp : 1; }
static bool torch_rounds_ok(int pp, int m) { return m % torch_rounds(pp, m) == 0; }

/* The interleaved-zb order of rank r: torch's _get_1f1b_rank_ops with
 * enable_zero_bubble (ScheduleInterleavedZeroBubble._calculate_single_rank_operations),
 * idle steps dropped (its _add_bubbles_to_actions only inserts idle steps). Step k of
 * the forwards runs local chunk (k / per_round) % v; step k of the backwards, counted
 * from the end of the warm-up, local chunk v-1 - (k / per_round) % v; micro-batches
 * count up per chunk. Warm-up: (v-1) * per_round + p-1-r forwards. Then a forward and
 * an input-gradient pass I per step, and from step r on each step also runs the oldest
 * pending weight pass W (so rank r keeps r W's back for its bubbles); then the
 * cool-down I's (with their W's) and the W's still pending. The same order as torch
 * 2.15's class, action for action, for pp in {1, 2, 3, 4, 8}, v = 2..4 and every m from
 * 1 to 3pp+2 that torch's rule accepts (and the same m refused); at v = 1 torch's
 * class gives our zb-h1 wherever its rule takes m. */
static void build_rank_interleaved_zb(ts_schedule *s, int r, int per_round, int *scratch)
{
    const int pp = s->pp, v = s->v, m = s->m, total = v * m;
    const int warmup = min_int((v - 1) * per_round + pp - 1 - r, total);
    /* the next micro-batch of each local chunk's F, I and W; the local chunk of I j */
    int *f_mb = scratch, *i_mb = scratch + v, *w_mb = scratch + 2 * v, *i_chunk = scratch + 3 * v;
    for (int c = 0; c < 3 * v; c++) scratch[c] = 0;
    int n_i = 0, n_w = 0; /* I's and W's pushed */
#define FWD(k)                                                                             \
    do {                                                                                   \
        int c_ = ((k) / per_round) % v;                                                    \
        ts_sched_push(s, r, TS_ACT_F, c_ * pp + r, f_mb[c_]++);                            \
    } while (0)
#define INPUT(k)                                                                           \
    do {                                                                                   \
        int c_ = v - 1 - (((k) - warmup) / per_round) % v;                                 \
        ts_sched_push(s, r, TS_ACT_I, c_ * pp + r, i_mb[c_]++);                            \
        i_chunk[n_i++] = c_;                                                               \
    } while (0)
#define WEIGHT()                                                                           \
    do {                                                                                   \
        int c_ = i_chunk[n_w++];                                                           \
        ts_sched_push(s, r, TS_ACT_W, c_ * pp + r, w_mb[c_]++);                            \
    } while (0)
    for (int k = 0; k < warmup; k++) FWD(k);
    for (int k = warmup; k < total + warmup; k++) {
        if (k < total) FWD(k); /* steady state: F, I (and W) */
        INPUT(k);              /* cool-down from k = total on: I (and W) */
        if (k - warmup >= r) WEIGHT();
    }
    while (n_w < n_i) WEIGHT();
#undef FWD
#undef INPUT
#undef WEIGHT
}

ts_status ts_sched_gen_interleaved_zb(ts_schedule *s, const char *name, int pp, int v, int m)
{
    if (!torch_rounds_ok(pp, m)) {
        int below = m - 1, above = m + 1;
        while (below > 0 && !torch_rounds_ok(pp, below)) below--;
        while (!torch_rounds_ok(pp, above)) above++;
        return ts_fail("schedule \"%s\" with pp = %d needs the micro-batch count m to be a "
                       "multiple of its rounds max(1, m / pp) (torch's "
                       "ScheduleInterleavedZeroBubble rule); m = %d has %d rounds: use m = %d "
                       "or %d (train.global_batch = dp * micro_batch * m), or schedule "
                       "\"interleaved-1f1b\" (any m >= pp)",
                       name, pp, m, torch_rounds(pp, m), below, above);
    }
    const int per_round = m / torch_rounds(pp, m);
    ts_sched_alloc(s, name, pp, v, m, 3 * v * m);
    int *scratch = ts_malloc((size_t)(3 * v + v * m) * sizeof(int));
    for (int r = 0; r < pp; r++) build_rank_interleaved_zb(s, r, per_round, scratch);
    free(scratch);
    return TS_OK;
}

/* ZB-H2, for M >= 2p-1 micro-batches (fewer: built for 2p-1 and pruned). With unit
 * F = I = W the I of micro-batch 0 reaches rank r at time 2p-1-r (up the forwards to
 * rank p-1, then down the I's), and rank r starts at time r: 2p-1-2r warm-up forwards
 * fill that gap exactly. Symmetrically the last I reaches rank 0 only after every
 * other rank's, so rank r ends with 2r+1 W's after its last I. In between rank r runs
 *
 *   I0, (F I) x 2r, (W F I) x (M-2p+1), (W I) x (2p-2-2r), then W x (2r+1),
 *
 * the (F I) pairs catching up on the forwards the ranks below need (they hold more
 * warm-up ones), the (W F I) triples the steady state, the (W I) pairs draining. With
 * F = I = W every rank is busy from its first action to its last: the step takes
 * 3M + p-1 units, of which rank r idles r at the start and p-1-r at the end (the
 * paper's parallelogram, whose edges successive steps could overlap without the
 * optimizer's synchronisation, the paper's post-validation; its bubble
 * (p-1)(T_F + T_I - 2 T_W) = 0 counts no edges). Within one step the idle per rank is
 * max((p-1)(T_F + T_I - 2 T_W), (p-1) T_F) (the ramp of the forwards to rank p-1
 * bounds it below), against ZB-H1's (p-1)(T_F + T_I - T_W): the two tie at F = I = W,
 * ZB-H2 wins when a backward costs more than a forward (F = 1, I = 2, W = 1: p-1
 * against 2(p-1), tested).
 *
 * Memory (F until W, as ts_schedule_report counts): rank r holds 2p-1-2r after the
 * warm-up, +2r over the (F I) pairs, and each triple frees (W) before it adds (F): at
 * most 2p-1 on every rank, twice 1F1B's p on rank 0, as the paper's (2p-1) M_B. The
 * full activations (F until I) peak at 2p-1-2r. */
static void build_zb_h2(ts_schedule *s)
{
    const int pp = s->pp, big_m = s->m;
    for (int r = 0; r < pp; r++) {
        int f = 0, i = 0, w = 0;
#define F() ts_sched_push(s, r, TS_ACT_F, r, f++)
#define I() ts_sched_push(s, r, TS_ACT_I, r, i++)
#define W() ts_sched_push(s, r, TS_ACT_W, r, w++)
        for (int k = 0; k < 2 * pp - 1 - 2 * r; k++) F();
        I();
        for (int k = 0; k < 2 * r; k++) F(), I();
        for (int k = 0; k < big_m - 2 * pp + 1; k++) W(), F(), I();
        for (int k = 0; k < 2 * pp - 2 - 2 * r; k++) W(), I();
        for (int k = 0; k < 2 * r + 1; k++) W();
#undef F
#undef I
#undef W
        TS_ASSERT(f == big_m && i == big_m && w == big_m);
    }
}

ts_status ts_sched_gen_zb_h2(ts_schedule *s, const char *name, int pp, int m)
{
    const int big_m = m > 2 * pp - 1 ? m : 2 * pp - 1;
    ts_sched_alloc(s, name, pp, 1, big_m, 3 * big_m);
    build_zb_h2(s);
    if (big_m > m) ts_sched_keep_first(s, m);
    return TS_OK;
}
