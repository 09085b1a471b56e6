/* tessera plan: partition the model, build the schedule and simulate one training
 * step on a cost model, in one process (no MPI), before spending a cluster on it. Also
 * draws Chrome traces (simulated or measured by `tessera train` with log.trace) as SVG. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli.h"
#include "config/config.h"
#include "core/log.h"
#include "core/trace.h"
#include "kernels/kernels.h"
#include "pipeline/partition.h"
#include "pipeline/schedule.h"
#include "pipeline/sim.h"

static const char *k_help =
    "usage: tessera plan CONFIG [--set KEY=VALUE ...] [--json] [--cost measured|model|uniform]\n"
    "                    [--no-measure] [--latency-us X] [--bandwidth-gbs X] [--optim-ms X]\n"
    "                    [--trace FILE] [--svg FILE]\n"
    "       tessera plan --from-trace TRACE.json --svg FILE\n"
    "\n"
    "Plan a pipeline without training, in one process (no mpirun): cut the layers\n"
    "(embedding, n_layer blocks, head) into parallel.pp * virtual_stages chunks, build\n"
    "parallel.schedule for the step's micro-batches (train.global_batch / (dp * micro_batch)),\n"
    "replay it on a cost model, and print the partition, the simulated step time, the bubble\n"
    "(idle fraction of the step) overall and per pipeline rank, and each rank's peak\n"
    "activation memory. The world size is not checked: any grid can be planned anywhere.\n"
    "\n"
    "  CONFIG             a libconfig file (see configs/tiny.cfg)\n"
    "  --set KEY=VALUE    override a config key, e.g. --set parallel.pp=4\n"
    "                     --set parallel.schedule=zb-h1 --set parallel.partition=[3,1,1,1]\n"
    "  --json             print only one JSON object on stdout:\n"
    "                     {\"world\", \"pp\", \"dp\", \"tp\", \"v\", \"schedule\", \"microbatches\",\n"
    "                      \"partition\": [layers per chunk], \"step_ms\", \"bubble\",\n"
    "                      \"ranks\": [{\"pp_rank\", \"bubble\", \"peak_activation_bytes\"}]}\n"
    "  --cost measured    (default) time forward and backward of the embedding, one block and\n"
    "                     the head once with the real CPU kernels at the micro-batch shape\n"
    "                     (a few passes; seconds for GPT-2 124M) and use those per-layer costs\n"
    "  --cost model       a FLOP/byte model instead (deterministic, instant); = --no-measure\n"
    "  --cost uniform     every chunk's forward, input-gradient and weight-gradient pass costs\n"
    "                     one unit (1 ms; a full backward 2) and communication is free, so the\n"
    "                     textbook bubbles appear: (p-1)/(m+p-1) for gpipe and 1f1b,\n"
    "                     (p-1)/(v*m+p-1) for interleaved-1f1b, (p-1)/(3m+p-1) for zb-h1.\n"
    "                     The partition is still printed (balanced on the FLOP model).\n"
    "  --latency-us X     P2P latency per message (default 20)\n"
    "  --bandwidth-gbs X  P2P bandwidth in GB/s (default 5); a message is one micro-batch's\n"
    "                     activations or gradients, micro_batch * seq_len * n_embd * 4 bytes\n"
    "  --optim-ms X       append an optimizer step of X ms to every rank (default 0)\n"
    "  --trace FILE       write the simulated timeline as Chrome trace JSON (open it in\n"
    "                     ui.perfetto.dev or chrome://tracing: one track per pipeline rank)\n"
    "  --svg FILE         draw the simulated timeline as SVG (one row per rank, F blue,\n"
    "                     B green, I teal, W orange, labelled with micro-batch numbers)\n"
    "  --from-trace T     with --svg: draw the trace file T instead (e.g. the one\n"
    "                     `tessera train` writes with log.trace = \"run/trace.json\")\n"
    "\n"
    "Cost model: one micro-batch of a chunk takes the sum of its layers' forward times (F);\n"
    "its backward the sum of their backward times, split evenly into input-gradient (I) and\n"
    "weight-gradient (W) halves for zb-h1. Times are divided by parallel.tp (ideal tensor\n"
    "parallelism; its all-reduces are not modelled) and data parallelism is not modelled.\n"
    "A cross-rank dependency arrives latency + message / bandwidth after it finishes.\n"
    "Activation memory counts each chunk's saved tensors per micro-batch (and its received\n"
    "input) from its forward until its backward (or weight-gradient pass).\n"
    "\n"
    "Exit code 0 on success; on a bad config or an impossible schedule, one message on\n"
    "stderr and exit code 1 (2 for a usage error).\n";

typedef enum { COST_MEASURED, COST_MODEL, COST_UNIFORM } cost_mode;

typedef struct {
    const char *config;
    const char *sets[256];
    int n_sets;
    bool json;
    cost_mode cost;
    double latency_us, bandwidth_gbs, optim_ms;
    const char *trace, *svg, *from_trace;
} plan_args;

static int usage_error(const char *fmt, const char *what)
{
    fputs("tessera: error: ", stderr);
    fprintf(stderr, fmt, what);
    fputs(" (see tessera plan --help)\n", stderr);
    return -1;
}

/* "--name VALUE" or "--name=VALUE": the value, advancing *i; NULL if `a` is not --name. */
static const char *opt_value(int argc, char **argv, int *i, const char *name, int *missing)
{
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0) return NULL;
    if (a[n] == '=') return a + n + 1;
    if (a[n] != '\0') return NULL;
    if (*i + 1 >= argc) {
        *missing = 1;
        return NULL;
    }
    return argv[++*i];
}

static int parse_number(const char *s, const char *flag, double lo, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo) || !isfinite(v))
        return usage_error("%s needs a number >= 0", flag);
    *out = v;
    return 0;
}

static int parse_args(int argc, char **argv, plan_args *a)
{
    memset(a, 0, sizeof *a);
    a->latency_us = 20.0;
    a->bandwidth_gbs = 5.0;
    char **rest = ts_malloc(sizeof(char *) * (size_t)(argc + 1));
    int n_rest = 0, rc = 0;
    rest[n_rest++] = argv[0];
    rest[n_rest++] = argv[1];
    for (int i = 2; i < argc && rc == 0; i++) {
        const char *v;
        int missing = 0;
        if (!strcmp(argv[i], "--json")) {
            a->json = true;
        } else if (!strcmp(argv[i], "--no-measure")) {
            a->cost = COST_MODEL;
        } else if ((v = opt_value(argc, argv, &i, "--cost", &missing))) {
            if (!strcmp(v, "measured"))
                a->cost = COST_MEASURED;
            else if (!strcmp(v, "model"))
                a->cost = COST_MODEL;
            else if (!strcmp(v, "uniform"))
                a->cost = COST_UNIFORM;
            else
                rc = usage_error("--cost '%s' is not one of measured, model, uniform", v);
        } else if ((v = opt_value(argc, argv, &i, "--latency-us", &missing))) {
            rc = parse_number(v, "--latency-us", 0, &a->latency_us);
        } else if ((v = opt_value(argc, argv, &i, "--bandwidth-gbs", &missing))) {
            rc = parse_number(v, "--bandwidth-gbs", 0, &a->bandwidth_gbs);
            if (rc == 0 && a->bandwidth_gbs <= 0)
                rc = usage_error("%s must be > 0", "--bandwidth-gbs");
        } else if ((v = opt_value(argc, argv, &i, "--optim-ms", &missing))) {
            rc = parse_number(v, "--optim-ms", 0, &a->optim_ms);
        } else if ((v = opt_value(argc, argv, &i, "--trace", &missing))) {
            a->trace = v;
        } else if ((v = opt_value(argc, argv, &i, "--svg", &missing))) {
            a->svg = v;
        } else if ((v = opt_value(argc, argv, &i, "--from-trace", &missing))) {
            a->from_trace = v;
        } else if (!missing) {
            rest[n_rest++] = argv[i]; /* CONFIG, --set, or an unknown option */
        }
        if (missing) rc = usage_error("%s needs a value", argv[i]);
    }
    if (rc == 0 && ts_cli_parse_config_args(n_rest, rest, 2, &a->config, a->sets, 256,
                                            &a->n_sets, 1) != 0)
        rc = -1;
    free(rest);
    if (rc != 0) return rc;
    if (a->from_trace) {
        if (!a->svg) return usage_error("%s needs --svg FILE (what to draw it into)", "--from-trace");
        if (a->config || a->trace || a->json)
            return usage_error("%s takes only --svg FILE (no CONFIG, --trace or --json)",
                               "--from-trace");
        return 0;
    }
    if (!a->config) return usage_error("%s needs a CONFIG file", "plan");
    return 0;
}

/* ------------------------------------------------------------------ output -- */

static void format_bytes(double b, char *buf, size_t size)
{
    if (b >= 1024.0 * 1024 * 1024)
        snprintf(buf, size, "%.2f GiB", b / (1024.0 * 1024 * 1024));
    else if (b >= 1024.0 * 1024)
        snprintf(buf, size, "%.2f MiB", b / (1024.0 * 1024));
    else
        snprintf(buf, size, "%.1f KiB", b / 1024.0);
}

static int print_json(const ts_config *cfg, const ts_partition *part, const ts_schedule *s,
                      const ts_sim_result *r)
{
    const ts_parallel_config *p = &cfg->parallel;
    json_t *layers = json_array(), *ranks = json_array();
    for (int c = 0; c < part->n_chunks; c++)
        json_array_append_new(layers, json_integer(part->n_chunk_layers[c]));
    for (int q = 0; q < r->pp; q++)
        json_array_append_new(ranks, json_pack("{s:i, s:f, s:I}", "pp_rank", q, "bubble",
                                               r->bubble[q], "peak_activation_bytes",
                                               (json_int_t)llround(r->peak_act_bytes[q])));
    json_t *o = json_pack("{s:i, s:i, s:i, s:i, s:i, s:s, s:i, s:o, s:f, s:f, s:o}", "world",
                          p->pp * p->dp * p->tp, "pp", p->pp, "dp", p->dp, "tp", p->tp, "v",
                          p->virtual_stages, "schedule", p->schedule, "microbatches", s->m,
                          "partition", layers, "step_ms", r->step_time, "bubble",
                          r->bubble_mean, "ranks", ranks);
    char *text = o ? json_dumps(o, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10)) : NULL;
    json_decref(o);
    if (!text) {
        ts_log_error("plan: could not build the JSON output");
        return 1;
    }
    printf("%s\n", text);
    free(text);
    return 0;
}

static void print_text(const plan_args *a, const ts_config *cfg, const ts_partition *part,
                       const ts_schedule *s, const ts_sim_result *r, double msg_bytes)
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
    format_bytes(msg_bytes, msg, sizeof msg);
    if (a->cost == COST_UNIFORM)
        printf("costs: uniform (F = I = W = 1 ms per chunk and micro-batch, free communication)\n");
    else
        printf("costs: %s layer times%s; P2P %g us latency, %g GB/s, %s per message\n",
               part->costs.source == TS_COST_MEASURED ? "measured" : "modelled",
               p->tp > 1 ? " / tp" : "", a->latency_us, a->bandwidth_gbs, msg);
    printf("simulated step: %.3f ms\n", r->step_time);
    printf("bubble: %.4f (idle fraction of the step, mean over pipeline ranks)\n", r->bubble_mean);
    printf("  %-7s  %-7s  %10s  %s\n", "pp_rank", "bubble", "busy_ms", "peak activations");
    for (int q = 0; q < r->pp; q++) {
        char mem[32];
        format_bytes(r->peak_act_bytes[q], mem, sizeof mem);
        printf("  %-7d  %-7.4f  %10.3f  %s (%d micro-batch%s)\n", q, r->bubble[q], r->busy[q], mem,
               r->peak_act_mb[q], r->peak_act_mb[q] == 1 ? "" : "es");
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
             a->cost == COST_UNIFORM ? "uniform" : a->cost == COST_MODEL ? "modelled" : "measured");
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
    if (ts_partition_build(&cfg, a->cost == COST_MEASURED, &part) != TS_OK) {
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

    /* Chunk costs in ms; bandwidth in bytes per ms. */
    const int n = part.n_chunks;
    double *f = ts_malloc(sizeof(double) * (size_t)n), *ig = ts_malloc(sizeof(double) * (size_t)n);
    double *wg = ts_malloc(sizeof(double) * (size_t)n), *optim = NULL;
    for (int c = 0; c < n; c++) {
        if (a->cost == COST_UNIFORM) {
            f[c] = ig[c] = wg[c] = 1.0;
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

    ts_sim_result r;
    int code = 0;
    if (ts_sim_run(&s, &costs, &r) != TS_OK) {
        ts_log_error("%s", ts_error_message());
        code = 1;
    } else {
        if (a->json)
            code = print_json(&cfg, &part, &s, &r);
        else
            print_text(a, &cfg, &part, &s, &r, msg_bytes);
        if (code == 0) code = write_outputs(a, &cfg, &r);
        ts_sim_result_free(&r);
    }
    free(f);
    free(ig);
    free(wg);
    free(optim);
    ts_schedule_free(&s);
    ts_partition_free(&part);
    return code;
}

int ts_cmd_plan(int argc, char **argv)
{
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(k_help, stdout);
            return 0;
        }
    plan_args a;
    if (parse_args(argc, argv, &a) != 0) return 2;
    return a.from_trace ? draw_trace_file(&a) : plan(&a);
}
