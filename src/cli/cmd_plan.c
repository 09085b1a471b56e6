/* tessera plan: partition the model, build the schedule and simulate one training
 * step on a cost model, in one process (no MPI), before spending a cluster on it. Also
 * draws Chrome traces (simulated or measured by `tessera train` with log.trace) as SVG.
 * This file parses the options and prints; the planning is plan/local_plan.c's (and,
 * with --cluster, plan/predict.c's and plan/search.c's through cmd_plan_search.c). */
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
#include "core/trace.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/kernels.h"
#include "pipeline/memory.h"
#include "pipeline/partition.h"
#include "pipeline/schedule.h"
#include "pipeline/sim.h"
#include "plan/local_plan.h"
#include "plan/sim_costs.h"
#include "plan/trace_costs.h"
#include "plan/zero.h"

static const char *k_help =
    "usage: tessera plan CONFIG [--set KEY=VALUE ...] [--json] [--cost measured|model|uniform]\n"
    "                    [--no-measure] [--latency-us X] [--bandwidth-gbs X] [--optim-ms X]\n"
    "                    [--dp-latency-us X] [--dp-bandwidth-gbs X]\n"
    "                    [--trace FILE] [--svg FILE] [--costs-from-trace TRACE.json\n"
    "                    [--trace-skip-steps N] [--trace-stat mean|median]]\n"
    "                    [--write-csv PATH]\n"
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
    "                     {\"world\", \"pp\", \"dp\", \"tp\", \"cp\", \"v\", \"schedule\",\n"
    "                      \"microbatches\",\n"
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
    "                     micro_batch * seq_len * n_embd * 4 bytes (/ cp with\n"
    "                     parallel.cp, / tp under parallel.sequence_parallel)\n"
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
    "  --write-csv PATH   write the planned schedule (parallel.schedule: a built-in name or a\n"
    "                     CSV, for the config's pp, virtual_stages and micro-batches, after\n"
    "                     --set) as a CSV in torch.distributed.pipelining's compute-only\n"
    "                     format, one line per pipeline rank (the format parallel.schedule\n"
    "                     reads back), and say on stderr where\n"
    "\n"
    "Cost model: one micro-batch of a chunk takes the sum of its layers' forward times (F);\n"
    "its backward the sum of their backward times, split evenly into input-gradient (I) and\n"
    "weight-gradient (W) halves for zb-h1. Times are divided by parallel.tp * parallel.cp\n"
    "(ideal tensor and context parallelism; their collectives are not modelled: plan with\n"
    "--cluster for them). A cross-rank dependency arrives\n"
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
    "Outputs (--trace, --svg, --write-csv) are written whole or not at all: to a temporary\n"
    "file in the same directory, renamed into place when complete.\n"
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
    const char *trace, *svg, *from_trace, *costs_trace, *write_csv;
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
    } else if ((v = ts_cli_opt_value(argc, argv, i, "--write-csv", missing))) {
        a->write_csv = v;
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
    } else if (!strcmp(argv[*i], "--gpus") || !strcmp(argv[*i], "--search") ||
               !strcmp(argv[*i], "--top") || !strcmp(argv[*i], "--exhaustive") ||
               !strcmp(argv[*i], "--doc-len") || !strncmp(argv[*i], "--doc-len=", 10)) {
        /* The cluster planner's options, given without its cluster. */
        *rc = ts_plan_usage("%s plans on a cluster: give it with --cluster FILE (e.g. "
                            "configs/clusters/dgx-h100.cfg), as in tessera plan CONFIG "
                            "--cluster FILE --gpus N --search",
                            argv[*i]);
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
        if (a->config || a->trace || a->json || a->costs_trace || a->write_csv)
            return ts_plan_usage("%s takes only --svg FILE (no CONFIG, --trace, --json, "
                                 "--costs-from-trace or --write-csv)",
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

static json_t *json_doubles(const double *x, int n)
{
    json_t *a = json_array();
    for (int k = 0; k < n; k++) json_array_append_new(a, json_real(x[k]));
    return a;
}

/* Rank q's recompute per chunk: [{"chunk", "in_flight" (sets held without recompute),
 * "peak_sets", "recomputed" (micro-batches), "keep" (auto's cap), "selective" (auto: laid
 * out selective)}]. */
static json_t *recompute_json(const ts_config *cfg, const ts_schedule *s, int q, const int *keep,
                              const bool *selective)
{
    const int n = s->n_chunks;
    int *in_flight = ts_calloc((size_t)n, sizeof(int)), *peak = ts_calloc((size_t)n, sizeof(int));
    int *nr = ts_calloc((size_t)n, sizeof(int));
    ts_local_plan_recompute(cfg, s, q, keep, in_flight, peak, nr);
    json_t *a = json_array();
    for (int c = 0; c < n; c++) {
        if (ts_chunk_rank(s, c) != q) continue;
        json_t *o = json_pack("{s:i, s:i, s:i, s:i}", "chunk", c, "in_flight", in_flight[c],
                              "peak_sets", peak[c], "recomputed", nr[c]);
        if (keep) json_object_set_new(o, "keep", json_integer(keep[c]));
        if (selective) json_object_set_new(o, "selective", json_boolean(selective[c]));
        json_array_append_new(a, o);
    }
    free(in_flight);
    free(peak);
    free(nr);
    return a;
}

/* Rank q's traffic as JSON: {"gathers", "reductions", "gather_bytes", "reduce_bytes",
 * "allgather_bytes", "dp_bytes", "chunks": [{"chunk", "gathers", "reductions",
 * "dp_bytes"}]}. */
static json_t *zero_json(const ts_config *cfg, const ts_partition *part, const ts_schedule *s,
                         int q)
{
    int *gathers = ts_calloc((size_t)s->n_chunks, sizeof(int));
    double *bytes = ts_calloc((size_t)s->n_chunks, sizeof(double));
    ts_zero_traffic t;
    ts_local_plan_zero_traffic(cfg, part, s, q, &t, gathers, bytes);
    json_t *chunks = json_array();
    for (int c = 0; c < s->n_chunks; c++)
        if (ts_chunk_rank(s, c) == q)
            json_array_append_new(chunks, json_pack("{s:i, s:i, s:i, s:I}", "chunk", c, "gathers",
                                                    gathers[c], "reductions", 1, "dp_bytes",
                                                    (json_int_t)llround(bytes[c])));
    free(gathers);
    free(bytes);
    return json_pack("{s:i, s:i, s:I, s:I, s:I, s:I, s:o}", "gathers", t.gathers, "reductions",
                     t.reductions, "gather_bytes", (json_int_t)llround(t.gather_bytes),
                     "reduce_bytes", (json_int_t)llround(t.reduce_bytes), "allgather_bytes",
                     (json_int_t)llround(t.allgather_bytes), "dp_bytes",
                     (json_int_t)llround(t.bytes), "chunks", chunks);
}

/* ZeRO-2/3's per-step traffic, per pipeline rank and chunk (text). */
static void print_zero(const ts_config *cfg, const ts_partition *part, const ts_schedule *s)
{
    /* ZeRO shards over the dp * cp ranks that hold the same weights */
    const int zero = cfg->parallel.zero, dp = cfg->parallel.dp * cfg->parallel.cp;
    if (zero < 2 || dp == 1) return;
    printf("zero %d over %d replicas, per step (ring, bytes each rank sends; %s):\n", zero, dp,
           zero == 3 ? "each chunk's weights all-gathered in the compute dtype when resident, "
                       "its gradients reduce-scattered once"
                     : "each chunk's gradients reduce-scattered once, the parameters "
                       "all-gathered after the optimizer");
    int *gathers = ts_calloc((size_t)s->n_chunks, sizeof(int));
    double *bytes = ts_calloc((size_t)s->n_chunks, sizeof(double));
    for (int q = 0; q < s->pp; q++) {
        ts_zero_traffic t;
        ts_local_plan_zero_traffic(cfg, part, s, q, &t, gathers, bytes);
        char total[32], b[32];
        printf("  pp rank %d: %d weight gathers, %d gradient reductions, dp %s per step:", q,
               t.gathers, t.reductions, ts_format_bytes(t.bytes, total, sizeof total));
        for (int c = 0; c < s->n_chunks; c++)
            if (ts_chunk_rank(s, c) == q)
                printf(" chunk %d %d gather%s + 1 reduction (%s);", c, gathers[c],
                       gathers[c] == 1 ? "" : "s", ts_format_bytes(bytes[c], b, sizeof b));
        printf("\n");
    }
    free(gathers);
    free(bytes);
}

static int print_json(const plan_args *a, const ts_config *cfg, const ts_partition *part,
                      const ts_schedule *s, const ts_sim_result *r, const ts_trace_costs *tc)
{
    const ts_parallel_config *p = &cfg->parallel;
    json_t *layers = json_array(), *ranks = json_array();
    for (int c = 0; c < part->n_chunks; c++)
        json_array_append_new(layers, json_integer(part->n_chunk_layers[c]));
    const bool auto_rc = ts_recompute_from_name(p->recompute) == TS_RECOMPUTE_AUTO;
    const double room = ts_local_plan_room(cfg);
    int *keep = auto_rc ? ts_calloc((size_t)s->n_chunks, sizeof(int)) : NULL;
    bool *selective = auto_rc ? ts_calloc((size_t)s->n_chunks, sizeof(bool)) : NULL;
    for (int q = 0; q < r->pp; q++) {
        ts_rank_memory est;
        const bool fits = ts_local_plan_rank_memory(cfg, part, s, q, room, keep, selective, &est);
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
        json_object_set_new(json_object_get(rank, "memory"), "activation_sets",
                            json_integer((json_int_t)llround(est.act_sets)));
        json_object_set_new(rank, "recompute", recompute_json(cfg, s, q, keep, selective));
        if (p->dp * p->cp > 1)
            json_object_set_new(rank, "zero_traffic", zero_json(cfg, part, s, q));
        json_object_set_new(json_object_get(rank, "memory"), "chunk_buffers",
                            json_integer((json_int_t)llround(est.chunk_buffers)));
        if (room > 0) json_object_set_new(rank, "memory_fits", json_boolean(fits));
    }
    free(keep);
    free(selective);
    json_t *o = json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:i, s:o, s:f, s:f, s:o}",
                          "world", p->pp * p->dp * p->cp * p->tp, "pp", p->pp, "dp", p->dp, "tp",
                          p->tp, "cp", p->cp, "v", p->virtual_stages, "schedule", p->schedule, "microbatches", s->m,
                          "partition", layers, "step_ms", r->step_time, "bubble",
                          r->bubble_mean, "ranks", ranks);
    if (o) {
        json_t *where = json_array();
        for (int c = 0; c < s->n_chunks; c++) json_array_append_new(where, json_integer(s->chunk_rank[c]));
        json_object_set_new(o, "placement", json_string(ts_placement_names[s->placement]));
        json_object_set_new(o, "chunk_rank", where);
        json_object_set_new(o, "dp_reduction_ms", json_real(ts_local_plan_dp_reduction_max(r)));
        json_object_set_new(o, "dp_exposed_ms", json_real(r->dp_exposed));
        json_object_set_new(o, "recompute", json_string(p->recompute));
        json_object_set_new(o, "zero", json_integer(p->zero));
        if (room > 0)
            json_object_set_new(o, "memory_budget_bytes", json_integer((json_int_t)llround(room)));
    }
    if (o && tc) {
        json_object_set_new(o, "bubble_rank_span", json_real(ts_plan_sim_bubble_rank_span(r)));
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
static void print_dp(const plan_args *a, const ts_config *cfg, const ts_schedule *s,
                     const ts_sim_result *r, const double *dp_bytes)
{
    const int dp = cfg->parallel.dp * cfg->parallel.cp; /* cp ranks reduce with the replicas */
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
           ts_local_plan_dp_reduction_max(r), r->dp_exposed);
    printf("  %-7s  %12s  %15s  %10s\n", "pp_rank", "gradients", "dp_reduction_ms", "dp_wait_ms");
    for (int q = 0; q < r->pp; q++) {
        double bytes = 0.0;
        for (int c = 0; c < s->n_chunks; c++)
            if (ts_chunk_rank(s, c) == q) bytes += dp_bytes[c];
        char mem[32];
        ts_format_bytes(bytes, mem, sizeof mem);
        printf("  %-7d  %12s  %15.3f  %10.3f\n", q, mem, r->dp_busy[q], r->dp_wait[q]);
    }
}

static void print_text(const plan_args *a, const ts_config *cfg, const ts_partition *part,
                       const ts_schedule *s, const ts_sim_result *r, double msg_bytes,
                       const ts_trace_costs *tc, const double *dp_bytes)
{
    const ts_parallel_config *p = &cfg->parallel;
    printf("tessera plan: %s\n", a->config);
    printf("grid: world %d = pp %d x dp %d x cp %d x tp %d; schedule %s, virtual stages %d, "
           "%d micro-batches of %d x %d tokens%s\n",
           p->pp * p->dp * p->cp * p->tp, p->pp, p->dp, p->cp, p->tp, p->schedule,
           p->virtual_stages, s->m, p->micro_batch, cfg->model.seq_len,
           p->cp > 1 ? " (each split over the cp ranks)" : "");
    if (cfg->train.batch_rampup[0]) /* docs/CONTRACT.md "plan" */
        printf("batch ramp-up: planned at train.global_batch = %d, the batch it ends at and "
               "its largest (its earlier, smaller steps are not planned)\n",
               cfg->train.global_batch);
    char *d = ts_partition_describe(part, s->chunk_rank), where[512];
    fputs(d, stdout);
    free(d);
    printf("%s\n", ts_placement_describe(s, where, sizeof where));
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
                   ts_chunk_rank(s, c), tc->f[c], tc->i[c] + tc->w[c], tc->i[c], tc->w[c]);
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
    print_dp(a, cfg, s, r, dp_bytes);
    print_zero(cfg, part, s);
    printf("memory per rank (the estimate tessera train checks; %d BLAS thread%s):\n",
           cfg->train.threads > 0 ? cfg->train.threads : 1, cfg->train.threads > 1 ? "s" : "");
    const bool auto_rc = ts_recompute_from_name(p->recompute) == TS_RECOMPUTE_AUTO;
    const double room = ts_local_plan_room(cfg);
    char budget[32], over[32], line[1024];
    if (room > 0)
        printf("  each rank may allocate %s besides its BLAS buffers (%s)%s\n",
               ts_format_bytes(room, budget, sizeof budget),
               p->memory_budget_mb > 0 ? "parallel.memory_budget_mb"
                                       : "this machine shared by the grid's ranks",
               auto_rc ? "; recompute auto recomputes per chunk only what does not fit" : "");
    int *keep = auto_rc ? ts_calloc((size_t)s->n_chunks, sizeof(int)) : NULL;
    bool *selective = auto_rc ? ts_calloc((size_t)s->n_chunks, sizeof(bool)) : NULL;
    for (int q = 0; q < r->pp; q++) {
        ts_rank_memory est;
        char what[512];
        const bool fits = ts_local_plan_rank_memory(cfg, part, s, q, room, keep, selective, &est);
        printf("  pp rank %d: %s\n", q, ts_memory_describe(&est, what, sizeof what));
        if (auto_rc)
            printf("    recompute auto: %s\n",
                   ts_memory_describe_keep_selective(s, q, keep, selective, line,
                                                     sizeof line));
        if (!fits)
            printf("    DOES NOT FIT: %s beyond its BLAS buffers%s\n",
                   ts_format_bytes(est.total - est.blas, over, sizeof over),
                   auto_rc ? " even recomputing every micro-batch" : "");
    }
    free(keep);
    free(selective);
    if (tc) {
        printf("bubble until each rank's last action (as the train metric counts it): %.4f\n",
               ts_plan_sim_bubble_rank_span(r));
        printf("measured in the trace (median over steps %d..%d): step %.3f ms, bubble %.4f, "
               "until each rank's last action %.4f\n",
               tc->skip, tc->steps - 1, tc->step_ms, tc->bubble, tc->bubble_rank_span);
    }
}

/* ------------------------------------------------------------------- steps -- */

static int draw_trace_file(const plan_args *a)
{
    ts_trace_event *ev = NULL; /* NULL still when the read fails */
    int n = 0, ranks = 0;
    ts_status st = ts_trace_read_chrome(a->from_trace, &ev, &n, &ranks);
    if (st == TS_OK) {
        char title[1200];
        snprintf(title, sizeof title, "trace %s", a->from_trace);
        st = ts_trace_write_svg(a->svg, ev, n, ranks, title);
    }
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

/* --write-csv: the schedule just planned, in the format parallel.schedule reads. */
static int write_schedule_csv(const plan_args *a, const ts_schedule *s)
{
    if (!a->write_csv) return 0;
    if (ts_schedule_write_csv(s, a->write_csv) != TS_OK) {
        ts_log_error("%s", ts_error_message());
        return 1;
    }
    fprintf(stderr, "plan: wrote schedule %s (pp=%d v=%d m=%d, %s placement) to %s\n", s->name,
            s->pp, s->v, s->m, ts_placement_names[s->placement], a->write_csv);
    return 0;
}

static int plan(const plan_args *a)
{
    ts_local_plan lp = {0}; /* empty first, so the one cleanup path below frees what was built */
    int code = 1;
    ts_config cfg;
    if (ts_config_load_plan(&cfg, a->config, a->sets, a->n_sets) != TS_OK) goto fail;
    const ts_local_plan_opts o = {
        .measure = a->cost == COST_MEASURED, .costs_trace = a->costs_trace,
        .trace_skip = (int)a->trace_skip, .trace_median = a->trace_median,
        .cost = {.uniform = a->cost == COST_UNIFORM, .latency_us = a->latency_us,
                 .bandwidth_gbs = a->bandwidth_gbs, .optim_ms = a->optim_ms,
                 .dp_latency_us = dp_latency_us(a), .dp_bandwidth_gbs = dp_bandwidth_gbs(a)}};
    if (ts_local_plan_run(&lp, &cfg, &o) != TS_OK) goto fail;
    if (a->json) {
        code = print_json(a, &cfg, &lp.part, &lp.schedule, &lp.sim, lp.traced);
    } else {
        print_text(a, &cfg, &lp.part, &lp.schedule, &lp.sim, lp.costs.costs.msg_bytes,
                   lp.traced, lp.costs.dp_bytes);
        code = 0;
    }
    if (code == 0) code = write_outputs(a, &cfg, &lp.sim);
    if (code == 0) code = write_schedule_csv(a, &lp.schedule);
    goto done;

fail:
    ts_log_error("%s", ts_error_message());
done:
    ts_local_plan_free(&lp);
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
