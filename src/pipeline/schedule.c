/* The built-in pipeline schedules as pure generators of per-rank action lists, and
 * ts_schedule_build, which picks a generator or reads a CSV file (schedule_csv.c) and
 * validates whatever it is about to return (schedule_validate.c). The generators of
 * issue 26 live in schedule_zb.c and schedule_v.c (schedule_gen.h).
 *
 * Notation below: p = pp ranks, v chunks per rank, m micro-batches, r = pipeline rank.
 * "Torch's order" means the compute actions of torch.distributed.pipelining's schedule
 * class of that name, idle steps dropped, for the same (p, v, m).
 *
 * gpipe            every forward of the rank's chunk (mb 0..m-1), then every backward
 *                  in the same order mb 0..m-1 (as torch.distributed.pipelining's
 *                  ScheduleGPipe). Holds all m activations; bubble (p-1)/(m+p-1).
 * 1f1b             warm-up min(p-r-1, m) forwards, then one forward / one backward,
 *                  then the remaining backwards. At most p-r activations on rank r.
 * interleaved-1f1b Megatron's interleaved 1F1B over v chunks per rank, with the
 *                  micro-batch group size N lifted as in current Megatron (see
 *                  interleaved_group_size). v = 1 is plain 1f1b.
 * zb-h1            Zero Bubble H1 (Qi et al. 2023): 1F1B's order of forwards and
 *                  input-gradient passes I, with the weight-gradient passes W of rank r
 *                  deferred by r micro-batches so that they fill the bubbles; the last
 *                  r W's run in the cool-down. See build_zb_h1 for the memory trade.
 * looped-bfs       Breadth-first pipeline parallelism (Lamy-Poirier 2022), torch's
 *                  ScheduleLoopedBFS: loop placement, any v; each local chunk in
 *                  ascending order runs the forwards of all m micro-batches, then the
 *                  local chunks in descending order run their backwards, micro-batches
 *                  m-1..0 (torch's order exactly). Holds v*m activations per rank.
 * interleaved-zb   torch's ScheduleInterleavedZeroBubble (the paper's ZB1P): interleaved
 *                  1F1B in rounds of m / max(1, m / p) micro-batches (torch's rule: m a
 *                  multiple of max(1, m / p)) with I/W split and rank r's W's held back
 *                  r steps into the bubbles (torch's order exactly, schedule_zb.c).
 *                  v = 1 is zb-h1 (what torch's class gives for v = 1 too).
 * zb-h2            Zero Bubble H2 (Qi et al. 2023), v = 1: 2p-1-2r warm-up forwards
 *                  fill rank r's start, the W's fill its end; with F = I = W every rank
 *                  is busy without a gap from its first action to its last (the
 *                  paper's parallelogram), at most 2p-1 micro-batches held (F until W).
 *                  Designed here from the paper (no torch class), schedule_zb.c.
 * zb-v             torch's ScheduleZBVZeroBubble (the paper's ZB-V): V placement, v = 2
 *                  exactly; 1F1B's activation memory, no gap per rank when F = I = W;
 *                  built for max(m, 2p-1) micro-batches and pruned as torch does
 *                  (torch's order exactly, schedule_v.c).
 * dualpipe-v       torch's ScheduleDualPipeV (DeepSeek's DualPipe, V variant): V
 *                  placement, v = 2, m >= 2p; its steady phase runs overlapped F/B
 *                  pairs (ts_action.overlap) (torch's order exactly, schedule_v.c). */
#include "pipeline/schedule.h"

#include "pipeline/schedule_gen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const ts_placement_names[TS_N_PLACEMENTS] = {
    [TS_PLACEMENT_LOOP] = "loop",
    [TS_PLACEMENT_V] = "v",
    [TS_PLACEMENT_OTHER] = "other",
};
static int min_int(int a, int b) { return a < b ? a : b; }

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

int ts_placement_rank(ts_placement p, int chunk, int pp)
{
    TS_ASSERT(p == TS_PLACEMENT_LOOP || p == TS_PLACEMENT_V);
    const int round = chunk / pp, pos = chunk % pp;
    return p == TS_PLACEMENT_V && round % 2 == 1 ? pp - 1 - pos : pos;
}

void ts_schedule_set_placement(ts_schedule *s, ts_placement p)
{
    s->placement = p;
    for (int c = 0; c < s->n_chunks; c++) s->chunk_rank[c] = ts_placement_rank(p, c, s->pp);
}

ts_placement ts_placement_of(const int *chunk_rank, int n_chunks, int pp)
{
    for (int p = TS_PLACEMENT_LOOP; p <= TS_PLACEMENT_V; p++) {
        bool same = true;
        for (int c = 0; c < n_chunks && same; c++)
            same = chunk_rank[c] == ts_placement_rank((ts_placement)p, c, pp);
        if (same) return (ts_placement)p;
    }
    return TS_PLACEMENT_OTHER;
}

int ts_rank_chunks(const ts_schedule *s, int r, int *out)
{
    int n = 0;
    for (int c = 0; c < s->n_chunks; c++)
        if (s->chunk_rank[c] == r) out[n++] = c;
    return n;
}

void ts_schedule_init(ts_schedule *s, const char *name, int pp, int v, int m)
{
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->pp = pp;
    s->v = v;
    s->m = m;
    s->n_chunks = pp * v;
    s->chunk_rank = ts_calloc((size_t)s->n_chunks, sizeof *s->chunk_rank);
    ts_schedule_set_placement(s, TS_PLACEMENT_LOOP);
    s->n_actions = ts_calloc((size_t)pp, sizeof *s->n_actions);
    s->actions = ts_calloc((size_t)pp, sizeof *s->actions);
}

void ts_sched_alloc(ts_schedule *s, const char *name, int pp, int v, int m, int cap)
{
    ts_schedule_init(s, name, pp, v, m);
    for (int r = 0; r < pp; r++) s->actions[r] = ts_calloc((size_t)cap, sizeof(ts_action));
}

void ts_sched_push(ts_schedule *s, int r, ts_action_kind kind, int chunk, int mb)
{
    s->actions[r][s->n_actions[r]++] = (ts_action){ .kind = kind, .chunk = chunk, .mb = mb };
}

void ts_sched_mark_overlap(ts_schedule *s, int r)
{
    TS_ASSERT(s->n_actions[r] > 0);
    s->actions[r][s->n_actions[r] - 1].overlap = true;
}

void ts_sched_keep_first(ts_schedule *s, int m)
{
    for (int r = 0; r < s->pp; r++) {
        ts_action *list = s->actions[r];
        const int n = s->n_actions[r];
        int kept = 0; /* kept <= j: list[j + 1] is still the original when read */
        for (int j = 0; j < n; j++) {
            if (list[j].mb >= m) continue;
            ts_action a = list[j];
            if (a.overlap && (j + 1 >= n || list[j + 1].mb >= m))
                a.overlap = false; /* its partner is dropped: it runs alone */
            list[kept++] = a;
        }
        s->n_actions[r] = kept;
    }
    s->m = m;
}

static void build_gpipe(ts_schedule *s)
{
    for (int r = 0; r < s->pp; r++) {
        for (int i = 0; i < s->m; i++) ts_sched_push(s, r, TS_ACT_F, r, i);
        for (int i = 0; i < s->m; i++) ts_sched_push(s, r, TS_ACT_B, r, i);
    }
}

static void build_1f1b(ts_schedule *s)
{
    int pp = s->pp, m = s->m;
    for (int r = 0; r < pp; r++) {
        int warmup = min_int(pp - r - 1, m);
        for (int i = 0; i < warmup; i++) ts_sched_push(s, r, TS_ACT_F, r, i);
        for (int k = 0; k < m - warmup; k++) { /* steady state: 1F then 1B */
            ts_sched_push(s, r, TS_ACT_F, r, warmup + k);
            ts_sched_push(s, r, TS_ACT_B, r, k);
        }
        for (int k = m - warmup; k < m; k++) ts_sched_push(s, r, TS_ACT_B, r, k); /* cool-down */
    }
}

/* Megatron's micro-batch group size N for the interleaved schedule: forwards go in
 * groups of N micro-batches, all v local chunks of a group before the next group. The
 * classic schedule has N = p and needs m % p == 0; current Megatron takes any N in
 * [p, m] with m % N == 0 or m % N >= p (the last, shorter group still holds at least
 * p micro-batches, so the steady state never waits on a chunk the pipeline has not
 * reached). We take the smallest such N (the warm-up grows with N). Returns 0 when
 * there is none, i.e. m < p. */
static int interleaved_group_size(int pp, int m)
{
    for (int n = pp; n <= m; n++)
        if (m % n == 0 || m % n >= pp) return n;
    return 0;
}

/* Megatron's schedule table: virtual micro-batch k (0 .. v*m-1) -> (mb, local chunk)
 * of the k-th forward. The k-th backward is the same entry with the local chunk
 * mirrored (v-1 - chunk). */
static void interleaved_table(int v, int m, int group, int *mb_of, int *local_of)
{
    int k = 0;
    for (int first = 0; first < m; first += group) {
        int last = first + group >= m ? m : first + group; /* the last group takes the rest */
        for (int c = 0; c < v; c++)
            for (int i = first; i < last; i++) {
                mb_of[k] = i;
                local_of[k] = c;
                k++;
            }
        if (last == m) break;
    }
}

static void build_interleaved(ts_schedule *s, int group)
{
    int pp = s->pp, v = s->v, m = s->m, total = v * m;
    int *mb_of = ts_malloc((size_t)total * sizeof(int));
    int *local_of = ts_malloc((size_t)total * sizeof(int));
    interleaved_table(v, m, group, mb_of, local_of);
    for (int r = 0; r < pp; r++) {
        int warmup = min_int(total, (pp - r - 1) * 2 + (v - 1) * group);
#define FWD(k) ts_sched_push(s, r, TS_ACT_F, local_of[k] * pp + r, mb_of[k])
#define BWD(k) ts_sched_push(s, r, TS_ACT_B, (v - 1 - local_of[k]) * pp + r, mb_of[k])
        for (int k = 0; k < warmup; k++) FWD(k);
        for (int k = 0; k < total - warmup; k++) {
            FWD(warmup + k);
            BWD(k);
        }
        for (int k = total - warmup; k < total; k++) BWD(k);
#undef FWD
#undef BWD
    }
    free(mb_of);
    free(local_of);
}

/* Zero Bubble H1. Rank r runs 1F1B's sequence of forwards and input-gradient passes
 * (warm-up min(p-r-1, m) F, then F,I pairs, then the remaining I's), and after each I
 * a W, except that rank r keeps r W's pending: the W of micro-batch k runs after the
 * I of micro-batch k+r; the r pending W's run at the end. Later ranks, whose bubbles
 * sit at the start and end of the step, thus start their I's (the critical path)
 * earlier and fill the tail with W's. With F = I = W the bubble is (p-1) units per
 * rank instead of 1F1B's 3(p-1).
 *
 * Memory, as in the paper: the full activation of a micro-batch lives from F to I,
 * at most p-r on rank r as in 1F1B; after I only W's inputs remain, and counting
 * them (F until W, as ts_schedule_report does) gives at most p on every rank, the peak of
 * 1F1B's first rank. No schedule can keep F-until-W at p-r and cut the bubble much:
 * the last rank would have to run F,I,W strictly in turn. */
static void build_zb_h1(ts_schedule *s)
{
    int pp = s->pp, m = s->m;
    for (int r = 0; r < pp; r++) {
        int c = r, warmup = min_int(pp - r - 1, m), n_w = 0; /* W's done so far */
        for (int i = 0; i < warmup; i++) ts_sched_push(s, r, TS_ACT_F, c, i);
        for (int k = 0; k < m; k++) {
            if (warmup + k < m) ts_sched_push(s, r, TS_ACT_F, c, warmup + k);
            ts_sched_push(s, r, TS_ACT_I, c, k);
            if (k - n_w >= r) ts_sched_push(s, r, TS_ACT_W, c, n_w++); /* more than r W's pending */
        }
        while (n_w < m) ts_sched_push(s, r, TS_ACT_W, c, n_w++);
    }
}

/* Breadth-first (torch's ScheduleLoopedBFS: the same order, action for action, for pp in
 * {1, 2, 3, 4, 8}, v = 1..4, m = 1..3pp+2): the local chunks ascending, each
 * running the forwards of all m micro-batches; then the local chunks descending, each
 * running the backwards of micro-batches m-1 down to 0 (the last forward's gradient
 * comes back first). */
static void build_looped_bfs(ts_schedule *s)
{
    const int pp = s->pp, v = s->v, m = s->m;
    for (int r = 0; r < pp; r++) {
        for (int k = 0; k < v; k++)
            for (int i = 0; i < m; i++) ts_sched_push(s, r, TS_ACT_F, k * pp + r, i);
        for (int k = v - 1; k >= 0; k--)
            for (int i = m - 1; i >= 0; i--) ts_sched_push(s, r, TS_ACT_B, k * pp + r, i);
    }
}

static ts_status build_builtin(ts_schedule *s, ts_schedule_kind kind, int pp, int v, int m)
{
    const char *name = ts_schedule_names[kind];
    if (ts_schedule_check_virtual_stages(kind, v) != TS_OK) return TS_ERR;
    switch (kind) {
    case TS_SCHEDULE_GPIPE:
        ts_sched_alloc(s, name, pp, v, m, 2 * m);
        build_gpipe(s);
        break;
    case TS_SCHEDULE_INTERLEAVED_1F1B:
        if (v > 1) {
            int group = interleaved_group_size(pp, m);
            if (group == 0)
                return ts_fail("schedule \"%s\" with pp = %d needs at least %d micro-batches "
                               "per step (got %d): raise train.global_batch to at least dp * "
                               "micro_batch * %d, or use schedule \"%s\" with "
                               "virtual_stages = 1",
                               name, pp, pp, m, pp, ts_schedule_names[TS_SCHEDULE_1F1B]);
            ts_sched_alloc(s, name, pp, v, m, 2 * v * m);
            build_interleaved(s, group);
            break;
        }
        /* v = 1 is plain 1F1B */
        /* fall through */
    case TS_SCHEDULE_1F1B:
        ts_sched_alloc(s, name, pp, v, m, 2 * m);
        build_1f1b(s);
        break;
    case TS_SCHEDULE_INTERLEAVED_ZB:
        if (v > 1) return ts_sched_gen_interleaved_zb(s, name, pp, v, m);
        /* v = 1 is zb-h1, for any m (torch's class gives the same order there) */
        /* fall through */
    case TS_SCHEDULE_ZB_H1:
        ts_sched_alloc(s, name, pp, v, m, 3 * m);
        build_zb_h1(s);
        break;
    case TS_SCHEDULE_LOOPED_BFS:
        ts_sched_alloc(s, name, pp, v, m, 2 * v * m);
        build_looped_bfs(s);
        break;
    case TS_SCHEDULE_ZB_H2: return ts_sched_gen_zb_h2(s, name, pp, m);
    case TS_SCHEDULE_ZB_V: return ts_sched_gen_zb_v(s, name, pp, m);
    case TS_SCHEDULE_DUALPIPE_V: return ts_sched_gen_dualpipe_v(s, name, pp, m);
    case TS_N_SCHEDULES: TS_ASSERT(!"not a schedule kind");
    }
    return TS_OK;
}

/* "\"gpipe\", \"1f1b\", ..." into buf: the built-in names for messages. */
static const char *builtin_list(char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int k = 0; k < TS_N_SCHEDULES && len < cap; k++)
        len += (size_t)snprintf(buf + len, cap - len, "\"%s\", ", ts_schedule_names[k]);
    return buf;
}

ts_status ts_schedule_build(ts_schedule *s, const char *name, int pp, int v, int m)
{
    memset(s, 0, sizeof *s);
    if (!name || !*name) return ts_fail("no pipeline schedule given (parallel.schedule)");
    if (pp < 1 || v < 1 || m < 1)
        return ts_fail("schedule \"%s\": pp = %d, virtual_stages = %d and the number of "
                       "micro-batches %d must all be >= 1",
                       name, pp, v, m);
    const int kind = ts_schedule_kind_from_name(name);
    if (kind >= 0) {
        if (build_builtin(s, (ts_schedule_kind)kind, pp, v, m) != TS_OK) {
            ts_schedule_free(s);
            return TS_ERR;
        }
    } else if (ends_with(name, ".csv")) {
        return ts_schedule_read_csv(s, name, pp, v, m); /* validated there */
    } else {
        char names[256];
        return ts_fail("unknown pipeline schedule \"%s\": choose %sor the path of a schedule "
                       "CSV file (ending in .csv)",
                       name, builtin_list(names, sizeof names));
    }
    /* Nothing invalid leaves this function, generated or not. */
    if (ts_schedule_validate(s, NULL) != TS_OK) {
        ts_error_prefix("schedule \"%s\" (pp = %d, v = %d, m = %d): ", name, pp, v, m);
        ts_schedule_free(s);
        return TS_ERR;
    }
    return TS_OK;
}

void ts_schedule_free(ts_schedule *s)
{
    if (!s) return;
    if (s->actions)
        for (int r = 0; r < s->pp; r++) free(s->actions[r]);
    free(s->actions);
    free(s->n_actions);
    free(s->chunk_rank);
    memset(s, 0, sizeof *s);
}
