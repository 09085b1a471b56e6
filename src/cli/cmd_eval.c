/* tessera eval: downstream evaluation of a checkpoint (HellaSwag, scored as
 * lm-evaluation-harness does: src/dataset/hellaswag.h) on any grid, through the trainer's
 * model, partition and forward-only walk (the same code data.hellaswag runs in
 * training), without training data or steps. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/checkpoint.h"
#include "cli/cli.h"
#include "comm/comm.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "core/timer.h"
#include "kernels/kernels.h"
#include "model/tokenizer_open.h"
#include "topology/topology.h"
#include "train/trainer.h"

static const char *k_help =
    "usage: tessera eval DIR --hellaswag FILE [--items N] [--json] [--set KEY=VALUE ...]\n"
    "\n"
    "Score a checkpoint on HellaSwag as lm-evaluation-harness does (acc, acc_norm) and as\n"
    "llm.c does (acc_norm_tokens). Run it under mpirun or srun on any grid (one rank: run\n"
    "it directly); the checkpoint's model.tokenizer encodes the text.\n"
    "\n"
    "  DIR               a checkpoint: a step directory or a checkpoint.dir (its latest)\n"
    "  --hellaswag FILE  HellaSwag's JSONL (one item a line: activity_label, ctx_a, ctx_b,\n"
    "                    endings (4), label), e.g. hellaswag_val.jsonl; nothing is fetched\n"
    "  --items N         the first N items only (default: all)\n"
    "  --json            one JSON object on stdout (the scores, the counts and every\n"
    "                    item's four log-likelihoods) instead of the text line\n"
    "  --set KEY=VALUE   the grid and the device: parallel.* keys (pp, dp, cp, tp,\n"
    "                    micro_batch (completions per forward; default 4, one item), ...)\n"
    "                    and train.device, train.precision, train.attention,\n"
    "                    train.threads; parallel.dp defaults to the ranks that\n"
    "                    pp * cp * tp leave\n"
    "\n"
    "Exit code 0; 2 for a usage error; 1 when the checkpoint, its tokenizer or the file\n"
    "cannot be read (a bad line is named FILE:LINE) or the grid does not fit the model.\n";

typedef struct {
    const char *dir, *file;
    int items;
    bool json;
    const char *sets[256];
    int n_sets;
    bool dp_given, mb_given;
} eval_args;

static int usage(int rank, const char *fmt, const char *a)
{
    if (rank == 0) {
        fputs("tessera: error: ", stderr);
        fprintf(stderr, fmt, a);
        fputs(" (see tessera eval --help)\n", stderr);
    }
    return 2;
}

/* The keys eval takes: the grid's and the device's (the model is the checkpoint's, the
 * data the file's; any other key would be ignored, so it is refused). */
static bool settable(const char *set)
{
    static const char *const k_train[] = {"train.device=", "train.precision=",
                                          "train.attention=", "train.threads="};
    if (!strncmp(set, "parallel.", 9)) return true;
    for (size_t i = 0; i < sizeof k_train / sizeof *k_train; i++)
        if (!strncmp(set, k_train[i], strlen(k_train[i]))) return true;
    return false;
}

static int parse_args(int argc, char **argv, int rank, eval_args *a)
{
    memset(a, 0, sizeof *a);
    for (int i = 2; i < argc; i++) {
        const char *v;
        int missing = 0;
        if ((v = ts_cli_opt_value(argc, argv, &i, "--hellaswag", &missing))) {
            a->file = v;
        } else if ((v = ts_cli_opt_value(argc, argv, &i, "--items", &missing))) {
            char *end;
            long n = strtol(v, &end, 10);
            if (*end || end == v || n < 1 || n > 1 << 30)
                return usage(rank, "--items '%s' is not a whole number from 1 to 1073741824", v);
            a->items = (int)n;
        } else if ((v = ts_cli_opt_value(argc, argv, &i, "--set", &missing))) {
            if (!settable(v))
                return usage(rank,
                             "--set %s: eval takes parallel.* and train.device, precision, "
                             "attention, threads (the model is the checkpoint's)",
                             v);
            if (a->n_sets == (int)(sizeof a->sets / sizeof *a->sets))
                return usage(rank, "too many --set options%s", "");
            a->dp_given |= !strncmp(v, "parallel.dp=", 12);
            a->mb_given |= !strncmp(v, "parallel.micro_batch=", 21);
            a->sets[a->n_sets++] = v;
        } else if (!strcmp(argv[i], "--json")) {
            a->json = true;
        } else if (missing) {
            return usage(rank, "%s needs a value", argv[i]);
        } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
            return usage(rank, "unknown option '%s'", argv[i]);
        } else if (a->dir) {
            return usage(rank, "one checkpoint directory, not also '%s'", argv[i]);
        } else {
            a->dir = argv[i];
        }
    }
    if (!a->dir) return usage(rank, "eval needs a checkpoint directory DIR%s", "");
    if (!a->file) return usage(rank, "eval needs --hellaswag FILE (the task to score)%s", "");
    return 0;
}

typedef struct {
    const ts_model_config *model;
    const char *step_dir;
    const eval_args *args;
    int world_size;
} patch_ctx;

/* The checkpoint's model, its weights as model.init, the file as data.hellaswag; one
 * global batch of dp * micro_batch (the rule's minimum: eval takes no steps). */
static void patch(ts_config *cfg, void *vctx)
{
    const patch_ctx *c = vctx;
    cfg->model = *c->model;
    snprintf(cfg->model.init, sizeof cfg->model.init, "%s", c->step_dir);
    snprintf(cfg->data.hellaswag, sizeof cfg->data.hellaswag, "%s", c->args->file);
    cfg->data.hellaswag_items = c->args->items;
    cfg->data.eval_every = 1;
    cfg->data.n_val = 0;
    cfg->log.metrics[0] = '\0';
    cfg->log.progress = false;
    ts_parallel_config *p = &cfg->parallel;
    if (!c->args->mb_given) p->micro_batch = TS_HS_ENDINGS;
    const long long model_ranks = (long long)p->pp * p->cp * p->tp;
    if (!c->args->dp_given && model_ranks > 0 && c->world_size % model_ranks == 0)
        p->dp = (int)(c->world_size / model_ranks);
    cfg->train.global_batch = (p->dp > 0 ? p->dp : 1) * p->micro_batch;
    cfg->train.steps = 1;
}

/* A real, or null where it is not finite (JSON has no NaN). */
static json_t *json_number_or_null(double x) { return isfinite(x) ? json_real(x) : json_null(); }

/* The --json line, built with jansson (the checkpoint's path escaped); 0, or 1 when it
 * could not be built. */
static int print_json(const ts_trainer *t, const ts_hellaswag_score *s, const double *loss,
                      const char *step_dir, int step, double secs)
{
    const ts_hellaswag *h = &t->hellaswag;
    json_t *items = json_array();
    for (int i = 0; i < h->n_items; i++) {
        json_t *ll = json_array(), *tokens = json_array(), *chars = json_array();
        for (int j = 0; j < TS_HS_ENDINGS; j++) {
            const int k = i * TS_HS_ENDINGS + j;
            json_array_append_new(ll, json_number_or_null(-loss[k]));
            json_array_append_new(tokens, json_integer(h->cont_tokens[k]));
            json_array_append_new(chars, json_integer(h->cont_chars[k]));
        }
        json_array_append_new(items, json_pack("{s:i, s:o, s:o, s:o}", "label", h->label[i],
                                               "loglik", ll, "tokens", tokens, "chars", chars));
    }
    json_t *o = json_pack("{s:s, s:i, s:s, s:i, s:f, s:f, s:f, s:i, s:i, s:i, s:i, s:f, s:f, s:o}",
                          "checkpoint", step_dir, "step", step, "task", "hellaswag", "items",
                          s->n, "acc", (double)s->acc / s->n, "acc_norm",
                          (double)s->acc_norm / s->n, "acc_norm_tokens",
                          (double)s->acc_norm_tokens / s->n, "acc_count", s->acc,
                          "acc_norm_count", s->acc_norm, "acc_norm_tokens_count",
                          s->acc_norm_tokens, "truncated", h->truncated, "seconds", secs,
                          "items_per_s", secs > 0 ? s->n / secs : 0.0, "per_item", items);
    char *text = o ? json_dumps(o, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(o);
    if (!text) {
        ts_log_error("eval: could not build the JSON output");
        return 1;
    }
    printf("%s\n", text);
    free(text);
    return 0;
}

/* The checkpoint's model config and tokenizer, checked as `tessera sample` checks them;
 * every rank reads them (the file system is shared). */
static ts_status read_checkpoint(const eval_args *a, char *step_dir, size_t cap,
                                 ts_model_config *mc, int *step)
{
    if (ts_ckpt_resolve(a->dir, step_dir, cap) != TS_OK ||
        ts_ckpt_read_model_config(step_dir, mc, step) != TS_OK)
        return TS_ERR;
    if (!mc->tokenizer[0])
        return ts_fail("checkpoint %s was trained without a tokenizer (model.tokenizer is "
                       "\"\"): HellaSwag's text needs one (train with model.tokenizer = "
                       "\"gpt2\" or \"llama3\")",
                       step_dir);
    ts_tokenizer *tok = NULL;
    if (ts_model_tokenizer_open(mc, NULL, &tok) != TS_OK)
        return ts_error_prefix("checkpoint %s: ", step_dir);
    ts_status st = TS_OK;
    if (strcmp(ts_tokenizer_sha256(tok), mc->tokenizer_sha256) != 0)
        st = ts_fail("the ranks file %s has sha256 %s, but checkpoint %s was trained with one "
                     "of sha256 %s: its ids would mean other text",
                     ts_tokenizer_path(tok), ts_tokenizer_sha256(tok), step_dir,
                     mc->tokenizer_sha256);
    ts_tokenizer_free(tok);
    return st;
}

static int run(int argc, char **argv, int rank, int world_size)
{
    eval_args a;
    int code = parse_args(argc, argv, rank, &a);
    if (code) return code;
    ts_comm world;
    ts_comm_world(&world);
    char step_dir[TS_PATH_MAX];
    ts_model_config mc;
    int step = 0;
    ts_config cfg;
    ts_status st = read_checkpoint(&a, step_dir, sizeof step_dir, &mc, &step);
    if (st == TS_OK) {
        patch_ctx pc = {.model = &mc, .step_dir = step_dir, .args = &a, .world_size = world_size};
        st = ts_config_load_patched(&cfg, a.sets, a.n_sets, world_size, patch, &pc);
    }
    if (ts_comm_agree(&world, st) != TS_OK) {
        if (rank == 0) fprintf(stderr, "tessera: error: %s\n", ts_error_message());
        return 1;
    }
    ts_log_set_quiet(1);
    ts_topology topo;
    if (ts_topo_init(&topo, &cfg, &world) != TS_OK || ts_topo_bind(&topo, &cfg) != TS_OK) {
        if (rank == 0) fprintf(stderr, "tessera: error: %s\n", ts_error_message());
        ts_topo_free(&topo);
        return 1;
    }
    ts_cpu_set_threads(topo.threads);
    ts_trainer t;
    if (ts_trainer_init_eval(&t, &cfg, &topo) != TS_OK) {
        if (rank == 0) fprintf(stderr, "tessera: error: %s\n", ts_error_message());
        ts_topo_free(&topo);
        return 1;
    }
    double *loss = ts_malloc((size_t)t.hellaswag.n_rows * sizeof *loss);
    ts_hellaswag_score s;
    const double t0 = ts_now_ms();
    ts_trainer_hellaswag(&t, &s, loss);
    const double secs = (ts_now_ms() - t0) / 1e3;
    int rc = 0;
    if (rank == 0) {
        if (a.json) {
            print_json(&t, &s, loss, step_dir, step, secs);
        } else {
            printf("hellaswag %s: %d items, acc %.4f (%d), acc_norm %.4f (%d), acc_norm_tokens "
                   "%.4f (%d)\n",
                   a.file, s.n, (double)s.acc / s.n, s.acc, (double)s.acc_norm / s.n,
                   s.acc_norm, (double)s.acc_norm_tokens / s.n, s.acc_norm_tokens);
            fprintf(stderr, "scored %d items of %s (%d truncated to seq_len) with %s (step %d) "
                            "on %d rank%s in %.2f s (%.1f items/s)\n",
                    s.n, a.file, t.hellaswag.truncated, step_dir, step, world_size,
                    world_size == 1 ? "" : "s", secs, secs > 0 ? s.n / secs : 0.0);
        }
        if (ts_stdout_check() != TS_OK) {
            fprintf(stderr, "tessera: error: %s\n", ts_error_message());
            rc = 1;
        }
    }
    free(loss);
    ts_trainer_free(&t);
    ts_topo_free(&topo);
    ts_host_allreduce_max_i32(&world, &rc, 1);
    return rc;
}

/* --help anywhere but as an option's value is a request for help (no MPI started). */
static bool wants_help(int argc, char **argv)
{
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return true;
        if (!strcmp(argv[i], "--hellaswag") || !strcmp(argv[i], "--items") ||
            !strcmp(argv[i], "--set"))
            i++; /* skip its value */
    }
    return false;
}

int ts_cmd_eval(int argc, char **argv)
{
    if (wants_help(argc, argv)) {
        fputs(k_help, stdout);
        return 0;
    }
    return ts_cli_mpi_main(argc, argv, k_help, run);
}
