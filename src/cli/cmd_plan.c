/* tessera plan: partition the model, build the schedule and simulate one training
 * step on a cost model, in one process (no MPI), before spending a cluster on it. Also
 * draws Chrome traces (simulated or measured by `tessera train` with log.trace) as SVG. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli.h"
#include "cli/cmd_plan_search.h"
#include "cli/plan_cli.h"
#include "config/config.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "core/sysmem.h"
#include "core/trace.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/kernels.h"
#include "pipeline/partition.h"
#include "pipeline/schedule.h"
#include "pipeline/sim.h"
#include "pipeline/memory.h"

static const char *k_help =
    "usage: tessera plan CONFIG [--set KEY=VALUE ...] [--json] [--cost measured|model|uniform]\n"
    "                    [--no-measure] [--latency-us X] [--bandwidth-gbs X] [--optim-ms X]\n"
    "                    [--dp-latency-us X] [--dp-bandwidth-gbs X]\n"
    "                    [--trace FILE] [--svg FILE] [--costs-from-trace TRACE.json\n"
    "                    [--trace-skip-steps N] [--trace-stat mean|median]]\n"
    "       tessera plan --from-trace TRACE.json --svg FILE\n"
    "\n"
    "Plan a pipeline without training, in one process (no mpirun): cut the layers\n"
    "(embedding, n_layer blocks, head) into parallel.pp * virtual_stages chunks, build\n"
    "parallel.schedule for the step's micro-batches (train.global_batch / (dp * micro_batch)),\n"
    "replay it on a cost model, and print the partition, the simulated step time, the bubble\n"
    "(idle fraction of the step) overall and per pipeline rank, each rank's peak\n"
    "activation memory, and with dp > 1 the data-parallel gradient reduction and how much of\n"
    "it the step waits for. The world size is not checked: any grid can be planned anywhere.\n"
    "\n"
    "  CONFIG             a libconfig file (see configs/tiny.cfg)\n"
    "  --set KEY=VALUE    override a config key, e.g. --set parallel.pp=4\n"
    "                     --set parallel.schedule=zb-h1 --set parallel.partition=[3,1,1,1]\n"
    "  --json             print only one JSON object on stdout:\n"
    "                     {\"world\", \"pp\", \"dp\", \"tp\", \"v\", \"schedule\", \"microbatches\",\n"
    "                      \"partition\": [layers per chunk], \"step_ms\", \"bubble\",\n"
    "                      \"dp_reduction_ms\", \"dp_exposed_ms\",\n"
    "                      \"ranks\": [{\"pp_rank\", \"bubble\", \"peak_activation_bytes\",\n"
    "                                 \"dp_reduction_ms\", \"dp_wait_ms\", ...}]}\n"
    "  --cost measured    (default) time forward and backward of the embedding, one block and\n"
    "                     the head once with the real CPU kernels at the micro-batch shape\n"
    "                     (a few passes; seconds for GPT-2 124M) and use those per-layer costs\n"
    "  --cost model       a FLOP/byte model instead (deterministic, instant); = --no-measure\n"
    "  --cost uniform     every chunk's forward, input-gradient and weight-gradient pass costs\n"
    "                     one unit (1 ms; a full backward 2) and communication is free, so the\n"
    "                     textbook bubbles appear: (p-1)/(m+p-1) for gpipe and 1f1b,\n"
    "                     (p-1)/(v*m+p-1) for interleaved-1f1b, (p-1)/(3m+p-1) for zb-h1.\n"
    "                     The partition is still printed (balanced on the FLOP model).\n"
    "  --latency-us X     P2P latency per message, 0 to 1000000 us (default 20)\n"
    "  --bandwidth-gbs X  P2P bandwidth, 0.001 to 1000000000 GB/s (default 5); a message is\n"
    "                     one micro-batch's activations or gradients,\n"
    "                     micro_batch * seq_len * n_embd * 4 bytes\n"
    "  --optim-ms X       append an optimizer step of X ms, 0 to 1000000, to every rank\n"
    "                     (default 0)\n"
    "  --dp-latency-us X  latency of each chunk's data-parallel reduction, 0 to 1000000 us\n"
    "                     (default: --latency-us)\n"
    "  --dp-bandwidth-gbs X  its bandwidth, 0.001 to 1000000000 GB/s, as an all-reduce's\n"
    "                     algorithm bandwidth: gradient bytes / time, what bench_allreduce\n"
    "                     prints (default: --bandwidth-gbs)\n"
    "  --trace FILE       write the simulated timeline as Chrome trace JSON (open it in\n"
    "                     ui.perfetto.dev or chrome://tracing: one track per pipeline rank)\n"
    "  --svg FILE         draw the simulated timeline as SVG (one row per rank, F blue,\n"
    "                     B green, I teal, W orange, labelled with micro-batch numbers)\n"
    "  --from-trace T     with --svg: draw the trace file T instead (e.g. the one\n"
    "                     `tessera train` writes with log.trace = \"run/trace.json\"); its\n"
    "                     events must have tid 0..65535, args.chunk -1..65535, args.mb\n"
    "                     -1..2147483646 (whole numbers) and ts, dur in microseconds,\n"
    "                     0 <= x < 2^53; an event outside is an error naming it\n"
    "  --costs-from-trace T\n"
    "                     take every chunk's costs from a trace of a training run of this\n"
    "                     config (log.trace; pass the run's --set options too): the mean\n"
    "                     duration of its F, and B (or I and W) events over the steady steps,\n"
    "                     then simulate the same schedule with them (communication per\n"
    "                     --latency-us and --bandwidth-gbs). Also prints what the trace itself\n"
    "                     measured (median over the steady steps), and both the simulated and\n"
    "                     measured bubble two ways: idle over the step's makespan (the\n"
    "                     textbook bubble), and idle until each rank's own last action (how\n"
    "                     the train metric `bubble` counts: a rank's wait after its last\n"
    "                     action falls outside its pipeline span). --json adds\n"
    "                     \"bubble_rank_span\" and \"costs_from_trace\": {\"file\", \"stat\",\n"
    "                     \"steps\", \"steps_used\", \"chunk_f_ms\", \"chunk_i_ms\", \"chunk_w_ms\",\n"
    "                     \"measured_step_ms\", \"measured_bubble\", \"measured_bubble_rank_span\"}\n"
    "  --trace-skip-steps N  with --costs-from-trace: steps dropped from the start of the\n"
    "                     trace as warm-up, 0 to 1000000000 (default 1; at least one step\n"
    "                     must remain)\n"
    "  --trace-stat S     with --costs-from-trace: mean (default) or median of the durations\n"
    "                     (the median ignores steps slowed by other processes on the machine)\n"
    "\n"
    "Cost model: one micro-batch of a chunk takes the sum of its layers' forward times (F);\n"
    "its backward the sum of their backward times, split evenly into input-gradient (I) and\n"
    "weight-gradient (W) halves for zb-h1. Times are divided by parallel.tp (ideal tensor\n"
    "parallelism; its all-reduces are not modelled). A cross-rank dependency arrives\n"
    "latency + message / bandwidth after it finishes. With dp > 1, a chunk's gradients are\n"
    "reduced across the replicas in parallel.bucket_mb buckets (at most one per layer),\n"
    "each once final, as its last backward (or last W with zb-h1) finishes their layers:\n"
    "dp latency + the bucket's bytes / dp bandwidth, on the rank's own dp lane, one at a\n"
    "time, overlapping the rank's later compute; the optimizer (or the end\n"
    "of the step) waits for the rank's last one. dp_exposed_ms is how much that lengthens\n"
    "the step; dp_wait_ms is each rank's wait after its last action. --cost uniform keeps\n"
    "communication free and leaves the reduction out.\n"
    "Activation memory counts each chunk's saved tensors per micro-batch (and its received\n"
    "input) from its forward until its backward (or weight-gradient pass).\n"
    "\n"
    "Outputs (--trace, --svg) are written whole or not at all: to a temporary file in the\n"
    "same directory, renamed into place when complete.\n"
    "\n"
    "Exit code 0 on success; on a bad config, an impossible schedule or an output that\n"
    "cannot be written (standard output included), one message on stderr and exit code 1\n"
    "(2 for a usage error).\n";

typedef enum { COST_MEASURED, COST_MODEL, COST_UNIFORM } cost_mode;

typedef struct {
    const char *config;
    const char *sets[256];
    int n_sets;
    bool json;
    cost_mode cost;
    double latency_us, bandwidth_gbs, optim_ms;
    double dp_latency_us, dp_bandwidth_gbs; /* < 0: the P2P values */
    const char *trace, *svg, *from_trace, *costs_trace;
    double trace_skip;
    bool trace_skip_set, trace_median, trace_stat_set;
} plan_args;

/* The numeric options' ranges. The upper bounds keep the simulated times finite and
 * readable (--latency-us 1e308 would print a 300-digit step time). */
static const ts_plan_number_opt k_latency = {"--latency-us", 0, 1e6, "microseconds", false};
static const ts_plan_number_opt k_bandwidth = {"--bandwidth-gbs", 1e-3, 1e9, "GB/s", false};
static const ts_plan_number_opt k_optim = {"--optim-ms", 0, 1e6, "milliseconds", false};
static const ts_plan_number_opt k_dp_latency = {"--dp-latency-us", 0, 1e6, "microseconds",
                                                false};
static const ts_plan_number_opt k_dp_bandwidth = {"--dp-bandwidth-gbs", 1e-3, 1e9, "GB/s",
                                                  false};
static const ts_plan_number_opt k_skip = {"--trace-skip-steps", 0, 1e9, "steps", true};

/* plan's own options (ts_plan_opt_fn). */
static bool plan_opt(void *args, int argc, char **argv, int *i, int *missing, int *rc)
{
    plan_args *a = args;
    const char *v;
    if (!strcmp(argv[*i], "--json")) {
        a->json = true;
    } else if (!strcmp(argv[*i], "--no-measure")) {
        a->cost = COST_MODEL;
    } else if ((v = ts_cli_opt_value(argc, argv, i, "--cost", missing))) {
        if (!strcmp(v, "measured"))
            a->cost = COST_MEASURED;
        else if (!strcmp(v, "model"))
            a->cost = COST_MODEL;
        else if (!strcmp(v, "uniform"))
            a->cost = COST_UNIFORM;
        else
            *rc = ts_plan_usage("--cost '%s' is not one of measured, model, uniform", v);
    } else if ((v = ts_cli_opt_value(argc, argv, i, "--latency-us", missing))) {
        *rc = ts_plan_parse_number(v, &k_latency, &a->latency_us);
    } else if ((v = ts_cli_opt_value(argc, argv, i, "--bandwidth-gbs", missing))) {
        *rc = ts_plan_parse_number(v, &k_bandwidth, &a->bandwidth_gbs);
    } else if ((v = ts_cli_opt_value(argc, argv, i, "--optim-ms", missing))) {
        *rc = ts_plan_parse_number(v, &k_optim, &a->optim_ms);
    } else if ((v = ts_cli_opt_value(argc, argv, i, "--dp-latency-us", missing))) {
        *rc = ts_plan_parse_number(v, &k_dp_latency, &a->dp_latency_us);
    } else if ((v = ts_cli_opt_value(argc, argv, i, "--dp-bandwidth-gbs", missing))) {
        *rc = ts_plan_parse_number(v, &k_dp_bandwidth, &a->dp_bandwidth_gbs);
    } else if ((v = ts_cli_opt_value(argc, argv, i, "--trace", missing))) {
        a->trace = v;
    } else if ((v = ts_cli_opt_value(argc, argv, i, "--svg", missing))) {
        a->svg = v;
    } else if ((v = ts_cli_opt_value(argc, argv, i, "--from-trace", missing))) {
        a->from_trace = v;
    } else if ((v = ts_cli_opt_value(argc, argv, i, "--costs-from-trace", missing))) {
        a->costs_trace = v;
    } else if ((v = ts_cli_opt_value(argc, argv, i, "--trace-stat", missing))) {
        if (!strcmp(v, "mean") || !strcmp(v, "median"))
            a->trace_median = !strcmp(v, "median");
        else
            *rc = ts_plan_usage("--trace-stat '%s' is not one of mean, median", v);
        a->trace_stat_set = true;
    } else if ((v = ts_cli_opt_value(argc, argv, i, "--trace-skip-steps", missing))) {
        *rc = ts_plan_parse_number(v, &k_skip, &a->trace_skip);
        a->trace_skip_set = true;
    } else {
        return false; /* CONFIG, --set, or an unknown option */
    }
    return true;
}

static int parse_args(int argc, char **argv, plan_args *a)
{
    memset(a, 0, sizeof *a);
    a->latency_us = 20.0;
    a->bandwidth_gbs = 5.0;
    a->dp_latency_us = a->dp_bandwidth_gbs = -1.0;
    a->trace_skip = 1.0;
    if (ts_plan_parse_argv(argc, argv, plan_opt, a, &a->config, a->sets, 256, &a->n_sets) != 0)
        return -1;
    if (a->from_trace) {
        if (!a->svg)
            return ts_plan_usage("%s needs --svg FILE (what to draw it into)", "--from-trace");
        if (a->config || a->trace || a->json || a->costs_trace)
            return ts_plan_usage("%s takes only --svg FILE (no CONFIG, --trace, --json or "
                                 "--costs-from-trace)",
                                 "--from-trace");
        return 0;
    }
    if (a->costs_trace && a->cost == COST_UNIFORM)
        return ts_plan_usage("%s replaces the cost model: drop --cost uniform",
                             "--costs-from-trace");
    if (a->trace_skip_set && !a->costs_trace)
        return ts_plan_usage("%s goes with --costs-from-trace", "--trace-skip-steps");
    if (a->trace_stat_set && !a->costs_trace)
        return ts_plan_usage("%s goes with --costs-from-trace", "--trace-stat");
    if (!a->config) return ts_plan_usage("%s needs a CONFIG file", "plan");
    return 0;
}

/* ------------------------------------------------------- costs from a trace -- */

/* What --costs-from-trace takes from a measured trace: per-chunk mean costs, and the
 * trace's own step time and bubbles (medians over the steady steps). */
typedef struct {
    int n_chunks;
    double *f, *i, *w;        /* [n_chunks] ms; i = w = B / 2 when the run had full B */
    int steps, skip;          /* whole steps in the trace, steps dropped as warm-up */
    int n_tracks;             /* trace tracks (ranks) with compute events */
    double step_ms;           /* makespan of a step's compute */
    double bubble;            /* idle over the makespan, mean over tracks */
    double bubble_rank_span;  /* idle until each track's last action, mean over tracks */
} trace_costs;

static void trace_costs_free(trace_costs *tc)
{
    free(tc->f);
    free(tc->i);
    free(tc->w);
    memset(tc, 0, sizeof *tc);
}

static int kind_of_cat(const char *cat)
{
    if (!strcmp(cat, "F")) return TS_ACT_F;
    if (!strcmp(cat, "B")) return TS_ACT_B;
    if (!strcmp(cat, "I")) return TS_ACT_I;
    if (!strcmp(cat, "W")) return TS_ACT_W;
    return -1;
}

static int cmp_event_start(const void *pa, const void *pb)
{
    const ts_trace_event *a = pa, *b = pb;
    if (a->rank != b->rank) return a->rank < b->rank ? -1 : 1;
    if (a->start_us != b->start_us) return a->start_us < b->start_us ? -1 : 1;
    return 0;
}

typedef struct {
    int group; /* chunk * 4 + kind */
    double ms;
} group_dur;

static int cmp_group_dur(const void *pa, const void *pb)
{
    const group_dur *a = pa, *b = pb;
    if (a->group != b->group) return a->group < b->group ? -1 : 1;
    return a->ms < b->ms ? -1 : a->ms > b->ms;
}

static int cmp_double(const void *pa, const void *pb)
{
    double a = *(const double *)pa, b = *(const double *)pb;
    return a < b ? -1 : a > b;
}

static double median(double *x, int n)
{
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* Read the compute events (cat F/B/I/W) of `path`, check them against the schedule
 * (every track runs one pipeline rank's action list, whole steps of it, in order) and
 * average every chunk's costs over the steps after `skip`. */
static ts_status trace_costs_load(const char *path, const ts_schedule *s, int skip,
                                  bool use_median, trace_costs *tc)
{
    memset(tc, 0, sizeof *tc);
    ts_trace_event *all = NULL;
    int n_all = 0, n_ranks = 0;
    if (ts_trace_read_chrome(path, &all, &n_all, &n_ranks) != TS_OK)
        return ts_error_prefix("--costs-from-trace: ");

    /* Keep the compute events, grouped by track in time order. */
    int n = 0;
    for (int k = 0; k < n_all; k++)
        if (kind_of_cat(all[k].cat) >= 0) all[n++] = all[k];
    ts_status st = TS_OK;
    if (n == 0) {
        free(all);
        return ts_fail("--costs-from-trace: %s has no F/B/I/W events (write one with "
                       "tessera train --set log.trace=\"FILE\")", path);
    }
    qsort(all, (size_t)n, sizeof *all, cmp_event_start);

    const int nc = s->n_chunks;
    group_dur *dur = ts_malloc(sizeof *dur * (size_t)n); /* the steady steps' durations */
    int n_dur = 0;
    double *step_start = NULL, *step_end = NULL, *b_make = NULL, *b_span = NULL;
    int steps = -1, tracks = 0;
    /* Pass 1: check every track, count steps. */
    for (int k = 0; k < n && st == TS_OK;) {
        int e = k;
        while (e < n && all[e].rank == all[k].rank) e++;
        const int q = all[k].chunk >= 0 ? ts_chunk_rank(all[k].chunk, s->pp) : -1;
        const int na = q >= 0 ? s->n_actions[q] : 0;
        if (q < 0 || all[k].chunk >= nc) {
            st = ts_fail("--costs-from-trace: %s has an event on chunk %d, but this config has "
                         "%d chunks (pass the training run's --set options to plan)",
                         path, all[k].chunk, nc);
        } else if ((e - k) % na != 0) {
            st = ts_fail("--costs-from-trace: rank %d of %s has %d compute events, not whole "
                         "steps of the %d actions schedule %s gives pipeline rank %d with "
                         "%d micro-batches (pass the training run's --set options to plan)",
                         all[k].rank, path, e - k, na, s->name, q, s->m);
        } else if (steps >= 0 && (e - k) / na != steps) {
            st = ts_fail("--costs-from-trace: rank %d of %s ran %d steps, another rank %d",
                         all[k].rank, path, (e - k) / na, steps);
        } else {
            steps = (e - k) / na;
            for (int j = k; j < e && st == TS_OK; j++) {
                const ts_action *a = &s->actions[q][(j - k) % na];
                const ts_trace_event *ev = &all[j];
                if (kind_of_cat(ev->cat) != (int)a->kind || ev->chunk != a->chunk ||
                    ev->mb != a->mb)
                    st = ts_fail("--costs-from-trace: event %d of rank %d in %s is %s on chunk %d, "
                                 "micro-batch %d; schedule %s has %c on chunk %d, micro-batch %d "
                                 "there (pass the training run's --set options to plan)",
                                 j - k, ev->rank, path, ev->cat, ev->chunk, ev->mb, s->name,
                                 *ts_action_letter(a->kind), a->chunk, a->mb);
            }
            tracks++;
        }
        k = e;
    }
    if (st == TS_OK && steps <= skip)
        st = ts_fail("--costs-from-trace: %s holds %d step%s; nothing is left after dropping "
                     "%d (--trace-skip-steps)", path, steps, steps == 1 ? "" : "s", skip);
    if (st == TS_OK) {
        const int used = steps - skip;
        step_start = ts_malloc(sizeof(double) * (size_t)used);
        step_end = ts_malloc(sizeof(double) * (size_t)used);
        b_make = ts_calloc((size_t)used, sizeof(double));
        b_span = ts_calloc((size_t)used, sizeof(double));
        for (int u = 0; u < used; u++) {
            step_start[u] = INFINITY;
            step_end[u] = -INFINITY;
        }
        /* Pass 2: sums per chunk and kind; each step's window over all tracks. */
        for (int k = 0; k < n;) {
            int e = k;
            while (e < n && all[e].rank == all[k].rank) e++;
            const int na = s->n_actions[ts_chunk_rank(all[k].chunk, s->pp)];
            for (int j = k + skip * na; j < e; j++) {
                const ts_trace_event *ev = &all[j];
                const int u = (j - k) / na - skip, kind = kind_of_cat(ev->cat);
                dur[n_dur++] = (group_dur){ev->chunk * 4 + kind, ev->dur_us * 1e-3};
                if (ev->start_us < step_start[u]) step_start[u] = ev->start_us;
                if (ev->start_us + ev->dur_us > step_end[u]) step_end[u] = ev->start_us + ev->dur_us;
            }
            k = e;
        }
        /* Pass 3: per track and step, busy time and last end. */
        for (int k = 0; k < n;) {
            int e = k;
            while (e < n && all[e].rank == all[k].rank) e++;
            const int na = s->n_actions[ts_chunk_rank(all[k].chunk, s->pp)];
            for (int u = 0; u < used; u++) {
                double busy = 0.0, last = -INFINITY;
                for (int j = k + (u + skip) * na; j < k + (u + skip + 1) * na; j++) {
                    busy += all[j].dur_us;
                    if (all[j].start_us + all[j].dur_us > last) last = all[j].start_us + all[j].dur_us;
                }
                const double span = step_end[u] - step_start[u], own = last - step_start[u];
                b_make[u] += (span > 0 ? 1.0 - busy / span : 0.0) / tracks;
                b_span[u] += (own > 0 ? 1.0 - busy / own : 0.0) / tracks;
            }
            k = e;
        }
        tc->n_chunks = nc;
        tc->f = ts_malloc(sizeof(double) * (size_t)nc);
        tc->i = ts_malloc(sizeof(double) * (size_t)nc);
        tc->w = ts_malloc(sizeof(double) * (size_t)nc);
        /* Sorted by chunk, kind and duration: each group is a sorted run. */
        qsort(dur, (size_t)n_dur, sizeof *dur, cmp_group_dur);
        double *stat = ts_calloc((size_t)nc * 4, sizeof(double));
        int *cnt = ts_calloc((size_t)nc * 4, sizeof(int));
        for (int k = 0; k < n_dur;) {
            int e = k;
            double sum = 0.0;
            while (e < n_dur && dur[e].group == dur[k].group) sum += dur[e++].ms;
            const int len = e - k, mid = k + len / 2;
            cnt[dur[k].group] = len;
            stat[dur[k].group] = !use_median ? sum / len
                                 : len % 2  ? dur[mid].ms
                                            : 0.5 * (dur[mid - 1].ms + dur[mid].ms);
            k = e;
        }
        for (int c = 0; c < nc && st == TS_OK; c++) {
            const int *nk = cnt + c * 4;
            const double *sc = stat + c * 4;
            if (!nk[TS_ACT_F])
                st = ts_fail("--costs-from-trace: no forward of chunk %d in %s", c, path);
            tc->f[c] = sc[TS_ACT_F];
            if (nk[TS_ACT_I] && nk[TS_ACT_W]) {
                tc->i[c] = sc[TS_ACT_I];
                tc->w[c] = sc[TS_ACT_W];
            } else if (nk[TS_ACT_B]) {
                tc->i[c] = tc->w[c] = 0.5 * sc[TS_ACT_B];
            } else if (st == TS_OK) {
                st = ts_fail("--costs-from-trace: no backward (B, or I and W) of chunk %d in %s", c,
                             path);
            }
        }
        free(stat);
        free(cnt);
        tc->steps = steps;
        tc->skip = skip;
        tc->n_tracks = tracks;
        for (int u = 0; u < used; u++) step_end[u] = (step_end[u] - step_start[u]) * 1e-3;
        tc->step_ms = median(step_end, used);
        tc->bubble = median(b_make, used);
        tc->bubble_rank_span = median(b_span, used);
    }
    free(step_start);
    free(step_end);
    free(b_make);
    free(b_span);
    free(dur);
    free(all);
    if (st != TS_OK) trace_costs_free(tc);
    return st;
}

/* The simulated bubble as the train metric counts it: each rank idle from the step's
 * start until its own last compute action (optimizer excluded), mean over ranks. */
static double sim_bubble_rank_span(const ts_sim_result *r)
{
    double total = 0.0;
    for (int q = 0; q < r->pp; q++) {
        double busy = 0.0, last = 0.0;
        for (int k = 0; k < r->n_events; k++) {
            const ts_sim_event *e = &r->events[k];
            if (e->rank != q || e->kind == TS_SIM_OPTIM) continue;
            busy += e->end - e->start;
            if (e->end > last) last = e->end;
        }
        total += last > 0 ? 1.0 - busy / last : 0.0;
    }
    return r->pp > 0 ? total / r->pp : 0.0;
}

/* ------------------------------------------------------------------ output -- */

/* The dp reduction's cost options: the P2P ones unless given. */
static double dp_latency_us(const plan_args *a)
{
    return a->dp_latency_us >= 0 ? a->dp_latency_us : a->latency_us;
}
static double dp_bandwidth_gbs(const plan_args *a)
{
    return a->dp_bandwidth_gbs >= 0 ? a->dp_bandwidth_gbs : a->bandwidth_gbs;
}

/* The longest dp lane over the ranks. */
static double dp_reduction_max(const ts_sim_result *r)
{
    double most = 0.0;
    for (int q = 0; q < r->pp; q++) most = r->dp_busy[q] > most ? r->dp_busy[q] : most;
    return most;
}

static json_t *json_doubles(const double *x, int n)
{
    json_t *a = json_array();
    for (int k = 0; k < n; k++) json_array_append_new(a, json_real(x[k]));
    return a;
}

/* The same per-rank memory estimate `tessera train` checks before it allocates, with
 * train.threads BLAS threads (1 when it is 0: the plan cannot know the cores). */
static void rank_memory(const ts_config *cfg, const ts_partition *part, const ts_schedule *s,
                        int pp_rank, ts_rank_memory *est)
{
    int threads = cfg->train.threads > 0 ? cfg->train.threads : 1;
    ts_memory_estimate(cfg, part, s, pp_rank, threads, est);
}

static int print_json(const plan_args *a, const ts_config *cfg, const ts_partition *part,
                      const ts_schedule *s, const ts_sim_result *r, const trace_costs *tc)
{
    const ts_parallel_config *p = &cfg->parallel;
    json_t *layers = json_array(), *ranks = json_array();
    for (int c = 0; c < part->n_chunks; c++)
        json_array_append_new(layers, json_integer(part->n_chunk_layers[c]));
    for (int q = 0; q < r->pp; q++) {
        ts_rank_memory est;
        rank_memory(cfg, part, s, q, &est);
        json_array_append_new(
            ranks, json_pack("{s:i, s:f, s:I, s:I, s:{s:I, s:I, s:I, s:I, s:I, s:I}}", "pp_rank", q,
                             "bubble", r->bubble[q], "peak_activation_bytes",
                             (json_int_t)llround(r->peak_act_bytes[q]), "memory_bytes",
                             (json_int_t)llround(est.total), "memory", "parameters",
                             (json_int_t)llround(est.params), "gradients",
                             (json_int_t)llround(est.grads), "optimizer",
                             (json_int_t)llround(est.optimizer), "activations",
                             (json_int_t)llround(est.activations), "buffers",
                             (json_int_t)llround(est.buffers), "blas",
                             (json_int_t)llround(est.blas)));
        json_t *rank = json_array_get(ranks, (size_t)q);
        json_object_set_new(rank, "dp_reduction_ms", json_real(r->dp_busy[q]));
        json_object_set_new(rank, "dp_wait_ms", json_real(r->dp_wait[q]));
    }
    json_t *o = json_pack("{s:i, s:i, s:i, s:i, s:i, s:s, s:i, s:o, s:f, s:f, s:o}", "world",
                          p->pp * p->dp * p->tp, "pp", p->pp, "dp", p->dp, "tp", p->tp, "v",
                          p->virtual_stages, "schedule", p->schedule, "microbatches", s->m,
                          "partition", layers, "step_ms", r->step_time, "bubble",
                          r->bubble_mean, "ranks", ranks);
    if (o) {
        json_object_set_new(o, "dp_reduction_ms", json_real(dp_reduction_max(r)));
        json_object_set_new(o, "dp_exposed_ms", json_real(r->dp_exposed));
    }
    if (o && tc) {
        json_object_set_new(o, "bubble_rank_span", json_real(sim_bubble_rank_span(r)));
        json_object_set_new(
            o, "costs_from_trace",
            json_pack("{s:s, s:s, s:i, s:i, s:o, s:o, s:o, s:f, s:f, s:f}", "file", a->costs_trace,
                      "stat", a->trace_median ? "median" : "mean",
                      "steps", tc->steps, "steps_used", tc->steps - tc->skip, "chunk_f_ms",
                      json_doubles(tc->f, tc->n_chunks), "chunk_i_ms",
                      json_doubles(tc->i, tc->n_chunks), "chunk_w_ms",
                      json_doubles(tc->w, tc->n_chunks), "measured_step_ms", tc->step_ms,
                      "measured_bubble", tc->bubble, "measured_bubble_rank_span",
                      tc->bubble_rank_span));
    }
    return ts_plan_print_json(o);
}

/* The data-parallel reduction: none (dp = 1), left out (uniform costs), or its cost,
 * what the step waits for, and per pipeline rank its gradients, lane time and wait. */
static void print_dp(const plan_args *a, const ts_config *cfg, const ts_sim_result *r,
                     const double *dp_bytes)
{
    const int dp = cfg->parallel.dp;
    if (dp == 1) {
        printf("dp reduction: none (dp = 1)\n");
        return;
    }
    if (!dp_bytes) {
        printf("dp reduction: not modelled with --cost uniform (dp = %d)\n", dp);
        return;
    }
    printf("dp reduction: %d replicas; each chunk's gradients once final, %g us + bytes / %g "
           "GB/s\n",
           dp, dp_latency_us(a), dp_bandwidth_gbs(a));
    printf("  %.3f ms on the busiest rank's dp lane; exposed %.3f ms (the step waits for it at "
           "the end)\n",
           dp_reduction_max(r), r->dp_exposed);
    printf("  %-7s  %12s  %15s  %10s\n", "pp_rank", "gradients", "dp_reduction_ms", "dp_wait_ms");
    for (int q = 0; q < r->pp; q++) {
        double bytes = 0.0;
        for (int c = q; c < cfg->parallel.pp * cfg->parallel.virtual_stages; c += r->pp)
            bytes += dp_bytes[c];
        char mem[32];
        ts_format_bytes(bytes, mem, sizeof mem);
        printf("  %-7d  %12s  %15.3f  %10.3f\n", q, mem, r->dp_busy[q], r->dp_wait[q]);
    }
}

static void print_text(const plan_args *a, const ts_config *cfg, const ts_partition *part,
                       const ts_schedule *s, const ts_sim_result *r, double msg_bytes,
                       const trace_costs *tc, const double *dp_bytes)
{
    const ts_parallel_config *p = &cfg->parallel;
    printf("tessera plan: %s\n", a->config);
    printf("grid: world %d = pp %d x dp %d x tp %d; schedule %s, virtual stages %d, "
           "%d micro-batches of %d x %d tokens\n",
           p->pp * p->dp * p->tp, p->pp, p->dp, p->tp, p->schedule, p->virtual_stages, s->m,
           p->micro_batch, cfg->model.seq_len);
    char *d = ts_partition_describe(part);
    fputs(d, stdout);
    free(d);
    char msg[32];
    ts_format_bytes(msg_bytes, msg, sizeof msg);
    if (a->cost == COST_UNIFORM) {
        printf("costs: uniform (F = I = W = 1 ms per chunk and micro-batch, free communication)\n");
    } else if (tc) {
        printf("costs: chunk %ss from %s (steps %d..%d of %d, %d rank%s); P2P %g us latency, "
               "%g GB/s, %s per message\n",
               a->trace_median ? "median" : "mean", a->costs_trace, tc->skip, tc->steps - 1, tc->steps, tc->n_tracks,
               tc->n_tracks == 1 ? "" : "s", a->latency_us, a->bandwidth_gbs, msg);
        for (int c = 0; c < tc->n_chunks; c++)
            printf("  chunk %d (pp rank %d): F %.3f ms, backward %.3f ms (I %.3f + W %.3f)\n", c,
                   ts_chunk_rank(c, p->pp), tc->f[c], tc->i[c] + tc->w[c], tc->i[c], tc->w[c]);
    } else
        printf("costs: %s layer times%s%s%s; P2P %g us latency, %g GB/s, %s per message\n",
               part->costs.source == TS_COST_MEASURED ? "measured" : "modelled",
               part->costs.source == TS_COST_MEASURED ? " with OpenBLAS core " : "",
               part->costs.source == TS_COST_MEASURED ? ts_blas_core() : "",
               p->tp > 1 ? " / tp" : "", a->latency_us, a->bandwidth_gbs, msg);
    printf("simulated step: %.3f ms\n", r->step_time);
    printf("bubble: %.4f (idle fraction of the step, mean over pipeline ranks)\n", r->bubble_mean);
    printf("  %-7s  %-7s  %10s  %s\n", "pp_rank", "bubble", "busy_ms", "peak activations");
    for (int q = 0; q < r->pp; q++) {
        char mem[32];
        ts_format_bytes(r->peak_act_bytes[q], mem, sizeof mem);
        printf("  %-7d  %-7.4f  %10.3f  %s (%d micro-batch%s)\n", q, r->bubble[q], r->busy[q], mem,
               r->peak_act_mb[q], r->peak_act_mb[q] == 1 ? "" : "es");
    }
    print_dp(a, cfg, r, dp_bytes);
    printf("memory per rank (the estimate tessera train checks; %d BLAS thread%s):\n",
           cfg->train.threads > 0 ? cfg->train.threads : 1, cfg->train.threads > 1 ? "s" : "");
    for (int q = 0; q < r->pp; q++) {
        ts_rank_memory est;
        char what[256];
        rank_memory(cfg, part, s, q, &est);
        printf("  pp rank %d: %s\n", q, ts_memory_describe(&est, what, sizeof what));
    }
    if (tc) {
        printf("bubble until each rank's last action (as the train metric counts it): %.4f\n",
               sim_bubble_rank_span(r));
        printf("measured in the trace (median over steps %d..%d): step %.3f ms, bubble %.4f, "
               "until each rank's last action %.4f\n",
               tc->skip, tc->steps - 1, tc->step_ms, tc->bubble, tc->bubble_rank_span);
    }
}

/* ------------------------------------------------------------------- steps -- */

static int draw_trace_file(const plan_args *a)
{
    ts_trace_event *ev = NULL;
    int n = 0, ranks = 0;
    if (ts_trace_read_chrome(a->from_trace, &ev, &n, &ranks) != TS_OK) {
        ts_log_error("%s", ts_error_message());
        return 1;
    }
    char title[1200];
    snprintf(title, sizeof title, "trace %s", a->from_trace);
    ts_status st = ts_trace_write_svg(a->svg, ev, n, ranks, title);
    free(ev);
    if (st != TS_OK) {
        ts_log_error("%s", ts_error_message());
        return 1;
    }
    fprintf(stderr, "plan: drew %d events on %d rank%s into %s\n", n, ranks, ranks == 1 ? "" : "s",
            a->svg);
    return 0;
}

static int write_outputs(const plan_args *a, const ts_config *cfg, const ts_sim_result *r)
{
    if (!a->trace && !a->svg) return 0;
    ts_trace t;
    ts_trace_init(&t);
    ts_sim_to_trace(r, 1000.0, &t); /* ms -> us */
    char title[TS_PATH_MAX + 160];
    snprintf(title, sizeof title, "tessera plan: %s, pp=%d v=%d m=%d (%s costs)",
             cfg->parallel.schedule, cfg->parallel.pp, cfg->parallel.virtual_stages,
             ts_config_num_microbatches(cfg),
             a->costs_trace         ? "trace"
             : a->cost == COST_UNIFORM ? "uniform"
             : a->cost == COST_MODEL   ? "modelled"
                                       : "measured");
    ts_status st = TS_OK;
    if (a->trace) st = ts_trace_write_chrome(a->trace, t.events, t.n, r->pp, title);
    if (st == TS_OK && a->svg) st = ts_trace_write_svg(a->svg, t.events, t.n, r->pp, title);
    ts_trace_free(&t);
    if (st != TS_OK) {
        ts_log_error("%s", ts_error_message());
        return 1;
    }
    return 0;
}

static int plan(const plan_args *a)
{
    ts_config cfg;
    if (ts_config_load(&cfg, a->config, a->sets, a->n_sets, 0) != TS_OK) {
        ts_log_error("%s", ts_error_message());
        return 1;
    }
    if (cfg.train.threads > 0) ts_cpu_set_threads(cfg.train.threads);
    const ts_parallel_config *p = &cfg.parallel;

    ts_partition part;
    if (ts_partition_build(&cfg, a->cost == COST_MEASURED && !a->costs_trace, &part) != TS_OK) {
        ts_log_error("%s", ts_error_message());
        return 1;
    }
    ts_schedule s;
    if (ts_schedule_build(&s, p->schedule, p->pp, p->virtual_stages,
                          ts_config_num_microbatches(&cfg)) != TS_OK) {
        ts_log_error("%s", ts_error_message());
        ts_partition_free(&part);
        return 1;
    }

    trace_costs tc_store, *tc = NULL;
    if (a->costs_trace) {
        if (trace_costs_load(a->costs_trace, &s, (int)a->trace_skip, a->trace_median, &tc_store) !=
            TS_OK) {
            ts_log_error("%s", ts_error_message());
            ts_schedule_free(&s);
            ts_partition_free(&part);
            return 1;
        }
        tc = &tc_store;
    }

    /* Chunk costs in ms; bandwidth in bytes per ms. */
    const int n = part.n_chunks;
    double *f = ts_malloc(sizeof(double) * (size_t)n), *ig = ts_malloc(sizeof(double) * (size_t)n);
    double *wg = ts_malloc(sizeof(double) * (size_t)n), *optim = NULL;
    for (int c = 0; c < n; c++) {
        if (a->cost == COST_UNIFORM) {
            f[c] = ig[c] = wg[c] = 1.0;
        } else if (tc) {
            f[c] = tc->f[c];
            ig[c] = tc->i[c];
            wg[c] = tc->w[c];
        } else {
            f[c] = part.chunk_fwd_ms[c] / p->tp;
            ig[c] = wg[c] = 0.5 * part.chunk_bwd_ms[c] / p->tp;
        }
    }
    const double msg_bytes = 4.0 * p->micro_batch * cfg.model.seq_len * cfg.model.n_embd;
    ts_sim_costs costs = {.n_chunks = n, .f = f, .i = ig, .w = wg,
                          .act_bytes = part.chunk_act_bytes, .msg_bytes = msg_bytes};
    if (a->cost != COST_UNIFORM) {
        costs.latency = a->latency_us * 1e-3;
        costs.bandwidth = a->bandwidth_gbs * 1e6;
    }
    if (a->optim_ms > 0) {
        optim = ts_malloc(sizeof(double) * (size_t)p->pp);
        for (int q = 0; q < p->pp; q++) optim[q] = a->optim_ms;
        costs.optim = optim;
    }
    /* The dp reduction: every chunk's gradient bytes, on the dp link's costs, in the
     * trainer's buckets (parallel.bucket_mb; at most one per layer): each starts as the
     * chunk's last backward finishes its layers, not after the whole chunk. */
    double *dp_bytes = NULL;
    int *dp_pieces = NULL;
    if (p->dp > 1 && a->cost != COST_UNIFORM) {
        dp_bytes = ts_malloc(sizeof(double) * (size_t)n);
        dp_pieces = ts_malloc(sizeof(int) * (size_t)n);
        const double bucket = (double)p->bucket_mb * 1048576.0;
        for (int c = 0; c < n; c++) {
            dp_bytes[c] = ts_memory_chunk_grad_bytes(&cfg, &part, c);
            double k = ceil(dp_bytes[c] / bucket);
            int layers = part.n_chunk_layers[c] > 0 ? part.n_chunk_layers[c] : 1;
            dp_pieces[c] = k < 1 ? 1 : k > layers ? layers : (int)k;
        }
        costs.dp_bytes = dp_bytes;
        costs.dp_pieces = p->overlap_grad_sync ? dp_pieces : NULL;
        costs.dp_latency = dp_latency_us(a) * 1e-3;
        costs.dp_bandwidth = dp_bandwidth_gbs(a) * 1e6;
    }

    ts_sim_result r;
    int code = 0;
    if (ts_sim_run(&s, &costs, &r) != TS_OK) {
        ts_log_error("%s", ts_error_message());
        code = 1;
    } else {
        if (a->json)
            code = print_json(a, &cfg, &part, &s, &r, tc);
        else
            print_text(a, &cfg, &part, &s, &r, msg_bytes, tc, dp_bytes);
        if (code == 0) code = write_outputs(a, &cfg, &r);
        ts_sim_result_free(&r);
    }
    free(f);
    free(ig);
    free(wg);
    free(optim);
    free(dp_bytes);
    free(dp_pieces);
    if (tc) trace_costs_free(tc);
    ts_schedule_free(&s);
    ts_partition_free(&part);
    return code;
}

/* A command whose result is on stdout has not succeeded until stdout took it. */
static int check_stdout(int code)
{
    if (code == 0 && ts_stdout_check() != TS_OK) {
        ts_log_error("%s", ts_error_message());
        return 1;
    }
    return code;
}

int ts_cmd_plan(int argc, char **argv)
{
    /* Keep the whole report (or the help) in stdout's buffer until check_stdout flushes
     * it: with the default 4 KiB, a full disk shows at an intermediate flush whose errno
     * is lost, and the message could only say "Input/output error". */
    static char out_buf[1 << 16];
    setvbuf(stdout, out_buf, _IOFBF, sizeof out_buf);
    /* --help anywhere (plan --help, plan CONFIG --json --help) is a request for help. */
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(k_help, stdout);
            fputs(ts_plan_cluster_help, stdout);
            return check_stdout(0);
        }
    /* --cluster: predictions on a described cluster (cmd_plan_search.c). */
    if (ts_plan_has_cluster(argc, argv)) return check_stdout(ts_cmd_plan_cluster(argc, argv));
    plan_args a;
    if (parse_args(argc, argv, &a) != 0) return 2;
    return check_stdout(a.from_trace ? draw_trace_file(&a) : plan(&a));
}
