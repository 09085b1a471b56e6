/* What `tessera plan --costs-from-trace` takes from a trace of a training run
 * (log.trace, core/trace.h): every chunk's forward, input-gradient and weight-gradient
 * cost, the mean (or median) over the steady steps, and the trace's own step time and
 * bubbles, so the simulator can replay the same schedule on measured costs and the two
 * be compared. Messages name the option, as the command's user gave it. */
#ifndef TS_PLAN_TRACE_COSTS_H
#define TS_PLAN_TRACE_COSTS_H

#include <stdbool.h>

#include "core/error.h"
#include "pipeline/schedule.h"
#include "pipeline/sim.h"

/* Per-chunk costs, and the trace's own step time and bubbles (medians over the steady
 * steps). */
typedef struct {
    int n_chunks;
    double *f, *i, *w;        /* [n_chunks] ms; i = w = B / 2 when the run had full B */
    int steps, skip;          /* whole steps in the trace, steps dropped as warm-up */
    int n_tracks;             /* trace tracks (ranks) with compute events */
    double step_ms;           /* makespan of a step's compute */
    double bubble;            /* idle over the makespan, mean over tracks */
    double bubble_rank_span;  /* idle until each track's last action, mean over tracks */
} ts_trace_costs;

/* Read the compute events (cat F/B/I/W) of the Chrome trace `path`, check them against
 * schedule s (every track runs one pipeline rank's action list, whole steps of it, in
 * order) and take every chunk's costs over the steps after `skip`: their mean, or with
 * use_median their median. Errors ("--costs-from-trace: ...") for a file that cannot be
 * read, no compute events, events on chunks s does not have, tracks that are not whole
 * steps of their rank's actions or differ in steps, events out of the schedule's order,
 * no step left after `skip`, and a chunk without a forward or a backward; *tc is then
 * empty. Free with ts_trace_costs_free. */
ts_status ts_trace_costs_load(const char *path, const ts_schedule *s, int skip,
                              bool use_median, ts_trace_costs *tc);
void ts_trace_costs_free(ts_trace_costs *tc);

/* The simulated bubble as the train metric counts it, the counterpart of a trace's
 * bubble_rank_span: each rank idle from the step's start until its own last compute
 * action (optimizer excluded), mean over ranks. */
double ts_plan_sim_bubble_rank_span(const ts_sim_result *r);

#endif
