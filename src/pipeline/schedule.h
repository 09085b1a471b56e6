/* Pipeline schedules as data. A schedule is, for every pipeline rank, an ordered list
 * of compute actions on (chunk, micro-batch). Three consumers read the same lists: the
 * engine runs them (deriving the P2P transfers from chunk placement), the simulator
 * times them on a cost model, and the tests check them.
 *
 * Chunks: the layer list (embedding, n_layer blocks, head) is cut into n_chunks =
 * pp * v contiguous chunks. Which pipeline rank holds each chunk (the placement) is part
 * of the schedule, chunk_rank[c]: "loop" puts chunk c on rank c % pp (Megatron's
 * interleaving: rank r holds chunks r, r + pp, r + 2pp, ...); "v" walks the ranks down
 * and back up (rank r holds chunks r and 2pp-1-r for v = 2, so the last chunk, the LM
 * head, sits with the embedding on rank 0; torch's "v" style); a CSV may give any map
 * ("other"). Two consecutive chunks on one rank hand their tensors over in memory.
 * Micro-batches 0..m-1.
 *
 * Dependencies (what the validator checks and the engine/simulator wait for):
 *   F(c, i)  needs F(c-1, i)                (its input activation), c > 0
 *   B(c, i)  needs F(c, i) on the same rank and B/I(c+1, i) (its output gradient),
 *            c < n_chunks-1; the last chunk's backward needs only its own F
 *   I(c, i)  like B(c, i): input gradient only, keeps what W needs
 *   W(c, i)  needs I(c, i) on the same rank: weight gradient
 * Every (c, i) gets exactly one F and either one B or one I and one W, all on the
 * rank that holds chunk c. */
#ifndef TS_SCHEDULE_H
#define TS_SCHEDULE_H

#include <stdbool.h>

#include "config/pipeline_names.h" /* ts_schedule_kind, ts_recompute and their names */
#include "core/error.h"

typedef enum {
    TS_ACT_F, /* forward */
    TS_ACT_B, /* full backward: input and weight gradient */
    TS_ACT_I, /* backward for the input gradient only */
    TS_ACT_W, /* backward for the weight gradient only */
} ts_action_kind;

typedef struct {
    ts_action_kind kind;
    int chunk;    /* global chunk index, 0 .. n_chunks-1 */
    int mb;       /* micro-batch, 0 .. m-1 */
    bool overlap; /* paired with the rank's next action (DualPipe's overlapped F/B pair,
                     torch's OVERLAP_F_B): the CPU runs the two in turn; on a GPU one's
                     communication overlaps the other's compute */
} ts_action;

/* Where the chunks live: see the top of this file. */
typedef enum {
    TS_PLACEMENT_LOOP,  /* chunk c on rank c % pp */
    TS_PLACEMENT_V,     /* down and back: rank r holds r, 2pp-1-r, 2pp+r, ... */
    TS_PLACEMENT_OTHER, /* any other map (a CSV schedule's) */
    TS_N_PLACEMENTS
} ts_placement;
extern const char *const ts_placement_names[TS_N_PLACEMENTS]; /* "loop", "v", "other" */
/* The rank of `chunk` under a loop or v placement of pp ranks. */
int ts_placement_rank(ts_placement p, int chunk, int pp);

typedef struct {
    char name[64];       /* a built-in name ("gpipe", "zb-v", ...) or the CSV path */
    int pp, v, m;        /* pipeline ranks, chunks per rank, micro-batches */
    int n_chunks;        /* pp * v */
    ts_placement placement;
    int *chunk_rank;     /* [n_chunks]: the pipeline rank holding each chunk */
    int *n_actions;      /* [pp] */
    ts_action **actions; /* [pp][n_actions[r]] */
} ts_schedule;

static inline int ts_chunk_rank(const ts_schedule *s, int chunk) { return s->chunk_rank[chunk]; }
/* The chunks rank r holds, ascending, into out (room for n_chunks); returns how many. */
int ts_rank_chunks(const ts_schedule *s, int r, int *out);
/* Set the placement (loop or v) and chunk_rank from it. */
void ts_schedule_set_placement(ts_schedule *s, ts_placement p);
/* Classify chunk_rank: loop, v or other (after a CSV filled it). */
ts_placement ts_placement_of(const int *chunk_rank, int n_chunks, int pp);
/* "placement v: rank 0: chunks 0, 3; rank 1: chunks 1, 2" into buf (truncated to size);
 * returns buf. */
char *ts_placement_describe(const ts_schedule *s, char *buf, size_t size);
static inline const char *ts_action_letter(ts_action_kind k) { return &"FBIW"[k]; }

/* Build the named schedule (a name of ts_schedule_names: "gpipe", "1f1b",
 * "interleaved-1f1b", "zb-h1", "looped-bfs", "interleaved-zb", "zb-h2", "zb-v",
 * "dualpipe-v"; schedule.c says what each is and needs) or read
 * a CSV file in torch.distributed.pipelining's compute-only format (one row per
 * pipeline rank, cells "<stage><F|B|I|W><micro-batch>", empty cells ignored). Errors
 * (unsupported combinations of pp, v, m; a malformed CSV) name the problem and the fix. */
ts_status ts_schedule_build(ts_schedule *s, const char *name, int pp, int v, int m);
void ts_schedule_free(ts_schedule *s);
/* Zero s and set its shape: name, pp, v, m, n_chunks, the loop placement, and empty
 * [pp] action arrays (n_actions all 0, actions all NULL) for a builder to fill. */
void ts_schedule_init(ts_schedule *s, const char *name, int pp, int v, int m);

typedef struct {
    int pp;
    int *peak_activations;  /* [pp]: most micro-batch activations held at once per rank
                               (counted per chunk: F adds one, B or W frees it) */
    int total_peak;         /* max over ranks */
} ts_schedule_report;

/* Complete (every chunk does F and B — or I and W — of every micro-batch exactly once,
 * on the rank that holds it), dependency-ordered per rank, and deadlock-free (a
 * round-robin replay where each rank runs its next action once its dependencies are
 * done reaches the end). On success fills *rep (may be NULL); free with
 * ts_schedule_report_free. */
ts_status ts_schedule_validate(const ts_schedule *s, ts_schedule_report *rep);
void ts_schedule_report_free(ts_schedule_report *rep);

/* Write the schedule as CSV in the same format (round trip for tests and users). */
ts_status ts_schedule_write_csv(const ts_schedule *s, const char *path);

/* Read a CSV schedule (the format of ts_schedule_build) for pp ranks, v chunks per
 * rank and m micro-batches and validate it; ts_schedule_build calls this for names
 * ending in ".csv". Errors say "path:line: cell 'X': ..." or what the file has
 * against what the config gives. */
ts_status ts_schedule_read_csv(ts_schedule *s, const char *path, int pp, int v, int m);

/* Format an action as its CSV cell "<chunk><F|B|I|W><mb>" ("1B2") into buf; returns
 * buf. 32 bytes are always enough. */
char *ts_action_cell(char *buf, size_t size, ts_action a);

#endif
