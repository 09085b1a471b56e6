/* Timelines of what every pipeline rank did: recorded by the engine (measured) or made
 * by the simulator, written as Chrome trace JSON (chrome://tracing, ui.perfetto.dev:
 * one track per rank, and one more per rank for its data-parallel reduction) and drawn
 * as SVG the way the pipeline papers draw schedules. */
#ifndef TS_TRACE_H
#define TS_TRACE_H

#include "core/error.h"

/* One timed span. Plain data of fixed size, so ranks can gather events as bytes
 * (sizeof(ts_trace_event) each) to the rank that writes the file.
 *   cat:   "F" "B" "I" "W" (compute on chunk/mb), "wait" (blocked on a send/recv),
 *          "optim" (optimizer step), "dpsync" (the step blocked finishing the data-
 *          parallel gradient sync), "tpcomm" (a tensor-parallel collective, the call or,
 *          under tp_overlap, its start to completion, on the dp track), "cpcomm" (a
 *          context-parallel K/V all-gather or dK/dV reduce-scatter, on the dp track),
 *          "pair" (a segment an overlapped pair's body computed between two yields,
 *          pipeline/pair.h: named and attributed like its action's span, "F3" on its
 *          chunk and mb, on the main track; the action's own "F"/"B" span then starts at
 *          its first segment and lasts their sum, its own compute),
 *          "dpreduce"
 *          (one dp collective from its start to its
 *          completion, on the dp track), "a2a" (an expert layer's ep all-to-all from its
 *          start to its completion, on the dp track, named "F dispatch L3", "B combine
 *          L3": the pass, the direction, the MoE block), "a2await" (the part of one the
 *          layer spent blocked in its finish, on the main track, inside its action)
 *   name:  "F3" for compute (kind + micro-batch), else usually the category (for
 *          "dpreduce" the collective: "all-reduce", "reduce-scatter", ...)
 *   rank:  the rank (pipeline rank; tid in the Chrome trace)
 *   track: TS_TRACE_TRACK_MAIN (its actions, waits, optimizer) or TS_TRACE_TRACK_DP
 *          (its data-parallel reduction, which overlaps the actions). In the Chrome
 *          trace the track is the pid: process 0 holds the ranks' main tracks, process
 *          1 ("data-parallel reduction") their dp tracks, tid = rank in both.
 *   chunk, mb: -1 when not applicable */
enum { TS_TRACE_TRACK_MAIN = 0, TS_TRACE_TRACK_DP = 1 };
typedef struct {
    char name[16];
    char cat[12];
    int rank;
    int track;
    int chunk;
    int mb;
    double start_us;
    double dur_us;
} ts_trace_event;

/* What a trace may hold, checked when one is read, written or drawn (so no file can make
 * the reader overflow or the SVG writer run away):
 *   rank (tid):  0 .. TS_TRACE_MAX_RANKS-1 (a pipeline rank of `plan`, pp <= 65536, or a
 *                global rank of `train`)
 *   track (pid): TS_TRACE_TRACK_MAIN or TS_TRACE_TRACK_DP (a file's other pids read as
 *                the main track)
 *   chunk:       -1 (none) .. TS_TRACE_MAX_CHUNKS-1 (configs allow pp * v <= 1024)
 *   mb:          -1 (none) .. TS_TRACE_MAX_MB (micro-batches per step fit an int)
 *   start, dur:  finite, 0 <= x < TS_TRACE_MAX_US microseconds (2^53 us, ~285 years: every
 *                whole microsecond is exact, and epoch timestamps fit)
 *   events:      at most TS_TRACE_MAX_EVENTS */
#define TS_TRACE_MAX_RANKS 65536
#define TS_TRACE_MAX_CHUNKS 65536
#define TS_TRACE_MAX_MB 2147483646
#define TS_TRACE_MAX_US 9007199254740992.0
#define TS_TRACE_MAX_EVENTS (1 << 28)

/* TS_OK when every field of `e` is in the ranges above; else a message "event INDEX:
 * FIELD VALUE ..." that the caller prefixes with the file it was working on. */
ts_status ts_trace_event_check(const ts_trace_event *e, long long index);

/* A span with the usual name: cat + mb for F/B/I/W ("B7"), cat otherwise; on the main
 * track (set .track after for the dp track). */
ts_trace_event ts_trace_event_make(const char *cat, int rank, int chunk, int mb,
                                   double start_us, double dur_us);

/* The action this thread is running (the engine sets it around each action, -1 -1
 * after), so a span recorded inside one (an expert layer's all-to-all) carries its chunk
 * and micro-batch. Per thread: an overlapped pair's two actions run on two threads. */
void ts_trace_set_action(int chunk, int mb);
void ts_trace_current_action(int *chunk, int *mb);

/* The share of the spans of category `comm` (e.g. "a2a") hidden behind compute: over
 * every rank, the time of those spans covered by the same rank's compute spans (F, B, I,
 * W on the main track), less the part covered by its spans of category `blocked` (the
 * time its compute spent waiting for them, inside the actions), over the comm spans'
 * total; *total_us gets that total. 0 when there are none. In [0, 1]. */
double ts_trace_hidden_share(const ts_trace_event *events, int n, const char *comm,
                             const char *blocked, double *total_us);

/* A growable event buffer (owner: whoever called ts_trace_init). */
typedef struct {
    ts_trace_event *events;
    int n, cap;
} ts_trace;

void ts_trace_init(ts_trace *t);
void ts_trace_add(ts_trace *t, const ts_trace_event *e);
void ts_trace_free(ts_trace *t);

/* Chrome trace JSON: {"traceEvents":[...], "displayTimeUnit":"ms",
 * "otherData":{"title":...}}; every event a complete event ("ph":"X", pid = track, tid =
 * rank, ts/dur in microseconds, args {chunk, mb}), plus a "thread_name" metadata event
 * "pipeline rank r" (and sort index) for r = 0..n_ranks-1, and when there are dp-track
 * events, process 1 named "data-parallel reduction" with a thread "rank r dp" for each
 * rank that has some. Written whole or not at all
 * (ts_atomic_file: a failed write leaves no file, or the old one); events outside the
 * ranges above and n_ranks > TS_TRACE_MAX_RANKS are refused. */
ts_status ts_trace_write_chrome(const char *path, const ts_trace_event *events, int n,
                                int n_ranks, const char *title);

/* Read the complete ("X") events of a Chrome trace file (object or bare-array form)
 * back (pid 1: the dp track, any other pid: the main track); *n_ranks = 1 + the largest
 * tid seen (or named by thread_name metadata).
 * *events is malloc'd (caller frees; NULL when n = 0). Every number is checked before it
 * is converted: tid, args.chunk and args.mb must be whole numbers and ts, dur finite, all
 * in the ranges above; an error names the event's index in the array, the field and its
 * value ("trace F: event 3: \"tid\" 1e+30 is out of range: ..."). */
ts_status ts_trace_read_chrome(const char *path, ts_trace_event **events, int *n,
                               int *n_ranks);

/* SVG: one row per rank, x = time; F blue, B green, I teal, W orange, optim grey,
 * dpsync a thin purple strip at the bottom of its row, wait not drawn (idle is blank);
 * when there are dp-track events, every row gets a thin lane under it where they are
 * drawn (pink).
 * Later virtual stages (chunk >= n_ranks) are drawn in a lighter shade. Every F/B/I/W/
 * optim block is one <rect class="ev">, labelled with its micro-batch number when it
 * is wide enough; a legend and a time axis. Bounded whatever the input: events are
 * checked as above (so at most TS_TRACE_MAX_RANKS rows), the axis has at most a few
 * dozen ticks, and the output grows linearly with n and n_ranks. Written whole or not
 * at all (ts_atomic_file). */
ts_status ts_trace_write_svg(const char *path, const ts_trace_event *events, int n,
                             int n_ranks, const char *title);

#endif
