/* The run's configuration: libconfig file + `--set` overrides -> ts_config.
 *
 * Loading happens in three passes over a libconfig tree:
 *   1. read the file (syntax errors carry file:line and libconfig's text),
 *   2. apply each override "dotted.key=value" by parsing the value as libconfig parses
 *      one (falling back to a bare string) and grafting it into the tree,
 *   3. walk every setting in the tree against one table of known keys (type, range,
 *      allowed values) and copy it into the struct.
 * ts_config_validate then checks every key's range again (so a config built in code is
 * checked too) and the relations between keys. Nothing here prints or exits: every
 * problem is a ts_fail message naming the key and how to fix it. */
#include "config/config.h"
#include "kernels/kernels.h"
#include "pipeline/schedule.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <libconfig.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---------------------------------------------------------------- defaults -- */

static void copy_str(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src);
}

void ts_config_defaults(ts_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);

    ts_model_config *m = &cfg->model;
    copy_str(m->arch, sizeof m->arch, "gpt2");
    m->n_layer = 4;
    m->n_head = 4;
    m->n_embd = 128;
    m->vocab_size = 256;
    m->seq_len = 64;

    ts_parallel_config *p = &cfg->parallel;
    p->pp = p->dp = p->tp = 1;
    p->virtual_stages = 1;
    copy_str(p->schedule, sizeof p->schedule, ts_schedule_names[TS_SCHEDULE_1F1B]);
    p->micro_batch = 2;
    p->n_partition = 0; /* "balanced" */
    copy_str(p->recompute, sizeof p->recompute, ts_recompute_names[TS_RECOMPUTE_NONE]);
    copy_str(p->order, sizeof p->order, "tp-dp-pp");
    p->overlap_grad_sync = true;
    copy_str(p->grad_sync_progress, sizeof p->grad_sync_progress, "poll");
    p->zero = 0;
    p->bucket_mb = 4;
    copy_str(p->comm, sizeof p->comm, "auto");

    ts_train_config *t = &cfg->train;
    t->global_batch = 16;
    t->steps = 100;
    t->seed = 1234;
    t->lr = 6e-4;
    t->min_lr = 6e-5;
    t->warmup = 10;
    t->weight_decay = 0.1;
    t->beta1 = 0.9;
    t->beta2 = 0.95;
    t->eps = 1e-8;
    t->grad_clip = 1.0;
    t->threads = 0;
    t->timeout_s = 600;
    copy_str(t->device, sizeof t->device, "cpu");
    copy_str(t->precision, sizeof t->precision, "fp32");

    ts_data_config *d = &cfg->data;
    d->n_train = 1;
    copy_str(d->train[0], sizeof d->train[0], "data/train.bin");
    d->eval_every = 0;
    d->val_windows = 16;

    cfg->checkpoint.every = 0;
    cfg->checkpoint.keep = 2;
    cfg->checkpoint.file_gb = 5.0;

    copy_str(cfg->log.metrics, sizeof cfg->log.metrics, "metrics.jsonl");
    cfg->log.progress = true;
}

/* ------------------------------------------------------------ the key table -- */

typedef enum { K_INT, K_INT64, K_FLOAT, K_BOOL, K_STR, K_PARTITION, K_SHARDS } key_kind;

typedef struct key_spec key_spec;
/* Extra per-key check on the value already stored in cfg; `where` is "" or
 * " (file:line)". */
typedef ts_status (*key_check)(const key_spec *k, const ts_config *cfg, const char *where);

struct key_spec {
    const char *section, *name;
    key_kind kind;
    size_t offset;   /* of the field in ts_config */
    size_t size;     /* K_STR: capacity of the char array */
    double lo, hi;   /* numeric range */
    bool lo_open, hi_open;
    key_check check; /* enumerations and other per-key rules; NULL = none */
};

static ts_status check_arch(const key_spec *k, const ts_config *cfg, const char *where);
static ts_status check_schedule(const key_spec *k, const ts_config *cfg, const char *where);
static ts_status check_recompute(const key_spec *k, const ts_config *cfg, const char *where);
static ts_status check_order(const key_spec *k, const ts_config *cfg, const char *where);
static ts_status check_progress(const key_spec *k, const ts_config *cfg, const char *where);
static ts_status check_device(const key_spec *k, const ts_config *cfg, const char *where);
static ts_status check_precision(const key_spec *k, const ts_config *cfg, const char *where);
static ts_status check_comm(const key_spec *k, const ts_config *cfg, const char *where);

#define OFF(field) offsetof(ts_config, field)
#define FIELD_SIZE(field) sizeof(((ts_config *)0)->field)
#define INT_KEY(sec, key, field, lo, hi)                                               \
    { sec, key, K_INT, OFF(field), 0, lo, hi, false, false, NULL }
#define FLOAT_KEY(sec, key, field, lo, lo_open, hi, hi_open)                           \
    { sec, key, K_FLOAT, OFF(field), 0, lo, hi, lo_open, hi_open, NULL }
#define STR_KEY(sec, key, field, check)                                                \
    { sec, key, K_STR, OFF(field), FIELD_SIZE(field), 0, 0, false, false, check }
#define BOOL_KEY(sec, key, field) { sec, key, K_BOOL, OFF(field), 0, 0, 0, false, false, NULL }

#define BIG ((double)INT_MAX)

static const key_spec KEYS[] = {
    STR_KEY("model", "arch", model.arch, check_arch),
    INT_KEY("model", "n_layer", model.n_layer, 1, 1 << 16),
    INT_KEY("model", "n_head", model.n_head, 1, 1 << 16),
    INT_KEY("model", "n_embd", model.n_embd, 1, 1 << 20),
    INT_KEY("model", "vocab_size", model.vocab_size, 2, (double)(1 << 24)),
    INT_KEY("model", "seq_len", model.seq_len, 1, 1 << 20),
    STR_KEY("model", "init", model.init, NULL),

    INT_KEY("parallel", "pp", parallel.pp, 1, 1 << 16),
    INT_KEY("parallel", "dp", parallel.dp, 1, 1 << 20),
    INT_KEY("parallel", "tp", parallel.tp, 1, 1 << 16),
    INT_KEY("parallel", "virtual_stages", parallel.virtual_stages, 1, TS_MAX_CHUNKS),
    STR_KEY("parallel", "schedule", parallel.schedule, check_schedule),
    INT_KEY("parallel", "micro_batch", parallel.micro_batch, 1, 1 << 20),
    { "parallel", "partition", K_PARTITION, OFF(parallel), 0, 0, 0, false, false, NULL },
    STR_KEY("parallel", "recompute", parallel.recompute, check_recompute),
    STR_KEY("parallel", "order", parallel.order, check_order),
    BOOL_KEY("parallel", "overlap_grad_sync", parallel.overlap_grad_sync),
    STR_KEY("parallel", "grad_sync_progress", parallel.grad_sync_progress, check_progress),
    INT_KEY("parallel", "zero", parallel.zero, 0, 1),
    INT_KEY("parallel", "bucket_mb", parallel.bucket_mb, 1, 4096),
    STR_KEY("parallel", "comm", parallel.comm, check_comm),

    INT_KEY("train", "global_batch", train.global_batch, 1, BIG),
    INT_KEY("train", "steps", train.steps, 0, BIG),
    { "train", "seed", K_INT64, OFF(train.seed), 0, 0, 0, false, false, NULL },
    FLOAT_KEY("train", "lr", train.lr, 0, true, INFINITY, false),
    FLOAT_KEY("train", "min_lr", train.min_lr, 0, false, INFINITY, false),
    INT_KEY("train", "warmup", train.warmup, 0, BIG),
    FLOAT_KEY("train", "weight_decay", train.weight_decay, 0, false, INFINITY, false),
    FLOAT_KEY("train", "beta1", train.beta1, 0, false, 1, true),
    FLOAT_KEY("train", "beta2", train.beta2, 0, false, 1, true),
    FLOAT_KEY("train", "eps", train.eps, 0, true, INFINITY, false),
    FLOAT_KEY("train", "grad_clip", train.grad_clip, 0, false, INFINITY, false),
    INT_KEY("train", "threads", train.threads, 0, 4096),
    INT_KEY("train", "timeout_s", train.timeout_s, 0, 7 * 24 * 3600),
    STR_KEY("train", "device", train.device, check_device),
    STR_KEY("train", "precision", train.precision, check_precision),

    { "data", "train", K_SHARDS, OFF(data), 0, 0, 0, false, false, NULL },
    STR_KEY("data", "val", data.val, NULL),
    INT_KEY("data", "eval_every", data.eval_every, 0, BIG),
    INT_KEY("data", "val_windows", data.val_windows, 1, 1 << 20),

    STR_KEY("checkpoint", "dir", checkpoint.dir, NULL),
    INT_KEY("checkpoint", "every", checkpoint.every, 0, BIG),
    INT_KEY("checkpoint", "keep", checkpoint.keep, 1, BIG),
    STR_KEY("checkpoint", "load", checkpoint.load, NULL),
    FLOAT_KEY("checkpoint", "file_gb", checkpoint.file_gb, 0, true, 1e6, false),
    BOOL_KEY("checkpoint", "async", checkpoint.async),

    STR_KEY("log", "metrics", log.metrics, NULL),
    STR_KEY("log", "trace", log.trace, NULL),
    BOOL_KEY("log", "progress", log.progress),
};
#define N_KEYS ((int)(sizeof KEYS / sizeof KEYS[0]))

static const char *const SECTIONS[] = { "model", "parallel", "train", "data", "checkpoint", "log" };
#define N_SECTIONS ((int)(sizeof SECTIONS / sizeof SECTIONS[0]))

static void *field_ptr(ts_config *cfg, const key_spec *k) { return (char *)cfg + k->offset; }
static const void *cfield_ptr(const ts_config *cfg, const key_spec *k)
{
    return (const char *)cfg + k->offset;
}

static const key_spec *find_key(const char *section, const char *name)
{
    for (int i = 0; i < N_KEYS; i++)
        if (strcmp(KEYS[i].section, section) == 0 && strcmp(KEYS[i].name, name) == 0)
            return &KEYS[i];
    return NULL;
}

static bool is_section(const char *name)
{
    for (int i = 0; i < N_SECTIONS; i++)
        if (strcmp(SECTIONS[i], name) == 0) return true;
    return false;
}

/* --------------------------------------------------------- per-key checks -- */

static int index_of(const char *s, const char *const *list, int n)
{
    for (int i = 0; i < n; i++)
        if (strcmp(s, list[i]) == 0) return i;
    return -1;
}

static void join_quoted(char *buf, size_t cap, const char *const *list, int n)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s\"%s\"", i ? ", " : "", list[i]);
}

static ts_status check_arch(const key_spec *k, const ts_config *cfg, const char *where)
{
    (void)k;
    if (strcmp(cfg->model.arch, "gpt2") == 0) return TS_OK;
    return ts_fail("config key 'model.arch' = \"%s\"%s is not supported; the only "
                   "architecture is \"gpt2\"",
                   cfg->model.arch, where);
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n > m && strcmp(s + n - m, suffix) == 0;
}

static ts_status check_schedule(const key_spec *k, const ts_config *cfg, const char *where)
{
    (void)k;
    const char *s = cfg->parallel.schedule;
    if (ts_schedule_kind_from_name(s) >= 0 || ends_with(s, ".csv")) return TS_OK;
    char choices[256];
    join_quoted(choices, sizeof choices, ts_schedule_names, TS_N_SCHEDULES);
    return ts_fail("config key 'parallel.schedule' = \"%s\"%s is not a schedule; choose "
                   "one of %s, or the path of a schedule CSV file (ending in .csv)",
                   s, where, choices);
}

static ts_status check_recompute(const key_spec *k, const ts_config *cfg, const char *where)
{
    (void)k;
    if (ts_recompute_from_name(cfg->parallel.recompute) >= 0) return TS_OK;
    char choices[128];
    join_quoted(choices, sizeof choices, ts_recompute_names, TS_N_RECOMPUTES);
    return ts_fail("config key 'parallel.recompute' = \"%s\"%s is not valid; choose one "
                   "of %s",
                   cfg->parallel.recompute, where, choices);
}

static ts_status check_order(const key_spec *k, const ts_config *cfg, const char *where)
{
    (void)k;
    const char *s = cfg->parallel.order;
    /* Exactly three two-letter names separated by '-', each of tp/dp/pp once. */
    bool ok = strlen(s) == 8 && s[2] == '-' && s[5] == '-';
    if (ok) {
        const char *names[3] = { "tp", "dp", "pp" };
        for (int i = 0; i < 3 && ok; i++) {
            int seen = 0;
            for (int j = 0; j < 3; j++)
                if (strncmp(s + 3 * j, names[i], 2) == 0) seen++;
            ok = seen == 1;
        }
    }
    if (ok) return TS_OK;
    return ts_fail("config key 'parallel.order' = \"%s\"%s is not valid; give tp, dp and "
                   "pp once each joined by '-', fastest-varying first (e.g. \"tp-dp-pp\" "
                   "or \"dp-tp-pp\")",
                   s, where);
}

/* The compute backends this build has (kernels/kernels.h). "cuda" is a real backend
 * name that a CPU-only build lacks: say so rather than "not a device". Where the build
 * has it, "cuda" is accepted without looking for a GPU: configs are validated on
 * machines without one too (the launcher, CI); the run itself checks for a device. */
static ts_status check_device(const key_spec *k, const ts_config *cfg, const char *where)
{
    const char *v = (const char *)cfield_ptr(cfg, k);
    if (ts_kernels_find(v)) return TS_OK;
    if (strcmp(v, "cuda") == 0)
        return ts_fail("config key 'train.device' = \"cuda\"%s: this tessera was built "
                       "without the CUDA backend; use \"cpu\"",
                       where);
    return ts_fail("config key 'train.device' = \"%s\"%s is not a device; choose \"cpu\" "
                   "(or \"cpu-strict\", the test mode whose device memory the host cannot "
                   "touch)",
                   v, where);
}

static const char *const PRECISIONS[] = { "fp32", "bf16" };

static ts_status check_precision(const key_spec *k, const ts_config *cfg, const char *where)
{
    const char *v = (const char *)cfield_ptr(cfg, k);
    if (index_of(v, PRECISIONS, 2) >= 0) return TS_OK;
    return ts_fail("config key 'train.precision' = \"%s\"%s is not a precision; choose "
                   "\"fp32\" (every kernel in float32) or \"bf16\" (GEMMs in bfloat16 with "
                   "float32 accumulation and float32 master weights; train.device = \"cuda\")",
                   v, where);
}

/* The data plane of the dp/pp/tp groups (comm/comm.h). "nccl" is a real backend name
 * that a build without NCCL lacks: say so rather than "not a backend". */
static const char *const COMM_BACKENDS[] = { "auto", "mpi", "nccl" };

static ts_status check_comm(const key_spec *k, const ts_config *cfg, const char *where)
{
    const char *v = (const char *)cfield_ptr(cfg, k);
#ifndef TS_HAVE_NCCL
    if (strcmp(v, "nccl") == 0)
        return ts_fail("config key 'parallel.comm' = \"nccl\"%s: this tessera was built "
                       "without NCCL; use \"auto\" or \"mpi\"",
                       where);
#endif
    if (index_of(v, COMM_BACKENDS, 3) >= 0) return TS_OK;
    return ts_fail("config key 'parallel.comm' = \"%s\"%s is not a communication backend; "
                   "choose \"auto\" (NCCL for train.device = \"cuda\" where built, else MPI), "
                   "\"mpi\" (device memory staged through the host when the host cannot "
                   "touch it) or \"nccl\"",
                   v, where);
}

/* Human-readable range, e.g. ">= 1", "> 0", "in [0, 1)", "0 or 1". */
static const char *const PROGRESS_MODES[] = { "poll", "thread" };

static ts_status check_progress(const key_spec *k, const ts_config *cfg, const char *where)
{
    const char *v = (const char *)cfield_ptr(cfg, k);
    if (index_of(v, PROGRESS_MODES, 2) >= 0) return TS_OK;
    return ts_fail("config key 'parallel.grad_sync_progress' = \"%s\"%s is not a progress mode; "
                   "choose \"poll\" (test the pending reductions between layers) or \"thread\" "
                   "(a communication thread drives them)",
                   v, where);
}

static void describe_range(const key_spec *k, char *buf, size_t cap)
{
    bool has_hi = isfinite(k->hi) && !(k->kind == K_INT && k->hi >= BIG);
    /* Integers print whole (16777216, not 1.67772e+07). */
    const char *num = k->kind == K_INT ? "%.0f" : "%g";
    char lo[32], hi[32];
    snprintf(lo, sizeof lo, num, k->lo);
    snprintf(hi, sizeof hi, num, k->hi);
    if (k->kind == K_INT && has_hi && k->hi - k->lo == 1)
        snprintf(buf, cap, "%s or %s", lo, hi);
    else if (!has_hi)
        snprintf(buf, cap, "%s %s", k->lo_open ? ">" : ">=", lo);
    else
        snprintf(buf, cap, "in %c%s, %s%c", k->lo_open ? '(' : '[', lo, hi, k->hi_open ? ')' : ']');
}

static bool in_range(const key_spec *k, double v)
{
    if (k->lo_open ? !(v > k->lo) : !(v >= k->lo)) return false;
    if (k->hi_open ? !(v < k->hi) : !(v <= k->hi)) return false;
    return true;
}

static ts_status range_error(const key_spec *k, const char *value, const char *where)
{
    char range[96];
    describe_range(k, range, sizeof range);
    return ts_fail("config key '%s.%s' = %s%s is out of range: it must be %s", k->section,
                   k->name, value, where, range);
}

/* Check one key's stored value: range, allowed values, list contents. Used when a key
 * is read (where = its file:line) and by ts_config_validate for every key. */
static ts_status check_value(const key_spec *k, const ts_config *cfg, const char *where)
{
    char value[64];
    switch (k->kind) {
    case K_INT: {
        int v = *(const int *)cfield_ptr(cfg, k);
        snprintf(value, sizeof value, "%d", v);
        if (!in_range(k, v)) return range_error(k, value, where);
        break;
    }
    case K_FLOAT: {
        double v = *(const double *)cfield_ptr(cfg, k);
        snprintf(value, sizeof value, "%g", v);
        if (!isfinite(v)) /* 1e309 parses as inf */
            return ts_fail("config key '%s.%s' = %s%s is not a finite number", k->section,
                           k->name, value, where);
        if (!in_range(k, v)) return range_error(k, value, where);
        break;
    }
    case K_PARTITION: {
        const ts_parallel_config *p = &cfg->parallel;
        if (p->n_partition < 0 || p->n_partition > TS_MAX_CHUNKS)
            return ts_fail("config key 'parallel.partition'%s lists %d chunks; at most %d "
                           "are supported",
                           where, p->n_partition, TS_MAX_CHUNKS);
        for (int i = 0; i < p->n_partition; i++)
            if (p->partition[i] < 0)
                return ts_fail("config key 'parallel.partition'%s: chunk %d has %d layers; "
                               "each layer count must be >= 0",
                               where, i, p->partition[i]);
        break;
    }
    case K_SHARDS: {
        const ts_data_config *d = &cfg->data;
        if (d->n_train < 1)
            return ts_fail("config key 'data.train'%s names no files; give a shard path "
                           "or a list of them, e.g. train = [\"a.bin\", \"b.bin\"];",
                           where);
        if (d->n_train > TS_MAX_SHARDS)
            return ts_fail("config key 'data.train'%s lists %d files; at most %d are "
                           "supported (concatenate shards)",
                           where, d->n_train, TS_MAX_SHARDS);
        for (int i = 0; i < d->n_train; i++)
            if (d->train[i][0] == '\0')
                return ts_fail("config key 'data.train'%s: entry %d is an empty path", where,
                               i);
        break;
    }
    default:
        break;
    }
    if (k->check) return k->check(k, cfg, where);
    return TS_OK;
}

/* ------------------------------------------------------- reading settings -- */

static const char *type_name(int type)
{
    switch (type) {
    case CONFIG_TYPE_GROUP: return "a group";
    case CONFIG_TYPE_INT:
    case CONFIG_TYPE_INT64: return "an integer";
    case CONFIG_TYPE_FLOAT: return "a float";
    case CONFIG_TYPE_STRING: return "a string";
    case CONFIG_TYPE_BOOL: return "a boolean";
    case CONFIG_TYPE_ARRAY: return "an array";
    case CONFIG_TYPE_LIST: return "a list";
    default: return "nothing";
    }
}

/* "a string (\"four\")", "a float (1.5)", "a list". */
static void describe_found(const config_setting_t *s, char *buf, size_t cap)
{
    int type = config_setting_type(s);
    switch (type) {
    case CONFIG_TYPE_INT:
    case CONFIG_TYPE_INT64:
        snprintf(buf, cap, "an integer (%lld)", config_setting_get_int64(s));
        break;
    case CONFIG_TYPE_FLOAT:
        snprintf(buf, cap, "a float (%g)", config_setting_get_float(s));
        break;
    case CONFIG_TYPE_STRING:
        snprintf(buf, cap, "a string (\"%.60s\")", config_setting_get_string(s));
        break;
    case CONFIG_TYPE_BOOL:
        snprintf(buf, cap, "a boolean (%s)", config_setting_get_bool(s) ? "true" : "false");
        break;
    default: snprintf(buf, cap, "%s", type_name(type)); break;
    }
}

/* " (file:line)" for a setting read from a file, " (from --set)" for an override. */
/* The config file being read: libconfig names included files in a setting's source,
 * but not the main text, which is parsed from memory (read_file). */
static _Thread_local const char *g_main_path;

static void where_of(const config_setting_t *s, char *buf, size_t cap)
{
    unsigned line = config_setting_source_line(s);
    const char *file = config_setting_source_file(s);
    if (line == 0)
        snprintf(buf, cap, " (from --set)");
    else
        snprintf(buf, cap, " (%s:%u)", file ? file : g_main_path ? g_main_path : "config", line);
}

static ts_status type_error(const key_spec *k, const config_setting_t *s, const char *where,
                            const char *expected, const char *hint)
{
    char found[128];
    describe_found(s, found, sizeof found);
    return ts_fail("config key '%s.%s'%s must be %s, but is %s%s%s", k->section, k->name,
                   where, expected, found, hint ? "; " : "", hint ? hint : "");
}

static bool is_int_type(int type)
{
    return type == CONFIG_TYPE_INT || type == CONFIG_TYPE_INT64;
}

static ts_status read_string(const key_spec *k, const config_setting_t *s, const char *where,
                             char *dst, size_t cap)
{
    const char *v = config_setting_get_string(s);
    size_t len = strlen(v);
    if (len >= cap)
        return ts_fail("config key '%s.%s'%s is too long (%zu characters; at most %zu)",
                       k->section, k->name, where, len, cap - 1);
    memcpy(dst, v, len + 1);
    return TS_OK;
}

static ts_status read_partition(const key_spec *k, const config_setting_t *s,
                                const char *where, ts_config *cfg)
{
    ts_parallel_config *p = &cfg->parallel;
    int type = config_setting_type(s);
    if (type == CONFIG_TYPE_STRING) {
        const char *v = config_setting_get_string(s);
        if (strcmp(v, "balanced") != 0)
            return ts_fail("config key 'parallel.partition' = \"%s\"%s is not valid; use "
                           "\"balanced\" or a list of layer counts per chunk, e.g. "
                           "partition = [2, 2, 1, 1];",
                           v, where);
        p->n_partition = 0;
        return TS_OK;
    }
    if (type != CONFIG_TYPE_ARRAY && type != CONFIG_TYPE_LIST)
        return type_error(k, s, where, "\"balanced\" or a list of integers",
                          "e.g. partition = [2, 2, 1, 1]; (layers per chunk)");
    int n = config_setting_length(s);
    if (n == 0)
        return ts_fail("config key 'parallel.partition'%s is an empty list; use "
                       "\"balanced\" or one layer count per chunk",
                       where);
    if (n > TS_MAX_CHUNKS)
        return ts_fail("config key 'parallel.partition'%s lists %d chunks; at most %d are "
                       "supported",
                       where, n, TS_MAX_CHUNKS);
    for (int i = 0; i < n; i++) {
        const config_setting_t *e = config_setting_get_elem(s, (unsigned)i);
        if (!is_int_type(config_setting_type(e))) {
            char found[128];
            describe_found(e, found, sizeof found);
            return ts_fail("config key 'parallel.partition'%s: entry %d must be an integer "
                           "layer count, but is %s",
                           where, i, found);
        }
        long long v = config_setting_get_int64(e);
        if (v < 0 || v > INT_MAX)
            return ts_fail("config key 'parallel.partition'%s: entry %d = %lld is out of "
                           "range; each layer count must be >= 0",
                           where, i, v);
        p->partition[i] = (int)v;
    }
    p->n_partition = n;
    return TS_OK;
}

static ts_status read_shards(const key_spec *k, const config_setting_t *s, const char *where,
                             ts_config *cfg)
{
    ts_data_config *d = &cfg->data;
    int type = config_setting_type(s);
    if (type == CONFIG_TYPE_STRING) {
        d->n_train = 1;
        return read_string(k, s, where, d->train[0], sizeof d->train[0]);
    }
    if (type != CONFIG_TYPE_ARRAY && type != CONFIG_TYPE_LIST)
        return type_error(k, s, where, "a string or a list of strings",
                          "e.g. train = \"data/train.bin\"; or train = [\"a.bin\", \"b.bin\"];");
    int n = config_setting_length(s);
    if (n > TS_MAX_SHARDS)
        return ts_fail("config key 'data.train'%s lists %d files; at most %d are supported",
                       where, n, TS_MAX_SHARDS);
    for (int i = 0; i < n; i++) {
        const config_setting_t *e = config_setting_get_elem(s, (unsigned)i);
        if (config_setting_type(e) != CONFIG_TYPE_STRING) {
            char found[128];
            describe_found(e, found, sizeof found);
            return ts_fail("config key 'data.train'%s: entry %d must be a string (a file "
                           "path), but is %s",
                           where, i, found);
        }
        if (read_string(k, e, where, d->train[i], sizeof d->train[i]) != TS_OK) return TS_ERR;
    }
    d->n_train = n;
    return TS_OK;
}

/* Type-check one setting against its spec and store it in cfg. */
static ts_status read_key(const key_spec *k, const config_setting_t *s, ts_config *cfg)
{
    char where[TS_PATH_MAX + 32];
    where_of(s, where, sizeof where);
    int type = config_setting_type(s);
    void *dst = field_ptr(cfg, k);
    ts_status st = TS_OK;

    switch (k->kind) {
    case K_INT: {
        if (type == CONFIG_TYPE_FLOAT)
            return type_error(k, s, where, "an integer",
                              "write a whole number without a decimal point or exponent");
        if (!is_int_type(type)) return type_error(k, s, where, "an integer", NULL);
        long long v = config_setting_get_int64(s);
        if (v < INT_MIN || v > INT_MAX || !in_range(k, (double)v)) {
            char value[32];
            snprintf(value, sizeof value, "%lld", v);
            return range_error(k, value, where);
        }
        *(int *)dst = (int)v;
        break;
    }
    case K_INT64:
        if (type == CONFIG_TYPE_FLOAT)
            return type_error(k, s, where, "an integer",
                              "write a whole number without a decimal point or exponent");
        if (!is_int_type(type)) return type_error(k, s, where, "an integer", NULL);
        *(int64_t *)dst = (int64_t)config_setting_get_int64(s);
        break;
    case K_FLOAT:
        if (type == CONFIG_TYPE_FLOAT)
            *(double *)dst = config_setting_get_float(s);
        else if (is_int_type(type))
            *(double *)dst = (double)config_setting_get_int64(s);
        else
            return type_error(k, s, where, "a number", NULL);
        break;
    case K_BOOL:
        if (type != CONFIG_TYPE_BOOL)
            return type_error(k, s, where, "a boolean", "write true or false");
        *(bool *)dst = config_setting_get_bool(s) != 0;
        break;
    case K_STR:
        if (type != CONFIG_TYPE_STRING)
            return type_error(k, s, where, "a string", "put the value in double quotes");
        st = read_string(k, s, where, (char *)dst, k->size);
        break;
    case K_PARTITION: st = read_partition(k, s, where, cfg); break;
    case K_SHARDS: st = read_shards(k, s, where, cfg); break;
    }
    if (st != TS_OK) return st;
    return check_value(k, cfg, where);
}

/* ------------------------------------------------- unknown-key diagnostics -- */

/* Edit distance counting an adjacent transposition as one edit ("stpes" -> "steps"). */
static int edit_distance(const char *a, const char *b)
{
    enum { MAXL = 64 };
    size_t n = strlen(a), m = strlen(b);
    if (n >= MAXL || m >= MAXL) return INT_MAX;
    int d[MAXL + 1][MAXL + 1];
    for (size_t i = 0; i <= n; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            int best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[n][m];
}

/* A close spelling is within a third of the name's length (at least 1, at most 3). */
static bool close_spelling(const char *typed, const char *known)
{
    int limit = (int)strlen(known) / 3;
    if (limit < 1) limit = 1;
    if (limit > 3) limit = 3;
    return edit_distance(typed, known) <= limit;
}

static ts_status unknown_key(const char *section, const char *name, const config_setting_t *s)
{
    char where[TS_PATH_MAX + 32];
    where_of(s, where, sizeof where);

    /* Suggest: the same name in another section, else a close spelling here. */
    char suggest[128] = "";
    for (int i = 0; i < N_KEYS && !suggest[0]; i++)
        if (strcmp(KEYS[i].name, name) == 0)
            snprintf(suggest, sizeof suggest, "; did you mean '%s.%s'?", KEYS[i].section,
                     name);
    int best = INT_MAX;
    bool elsewhere = suggest[0] != '\0';
    for (int i = 0; i < N_KEYS && !elsewhere; i++) {
        if (strcmp(KEYS[i].section, section) != 0) continue;
        int d = edit_distance(name, KEYS[i].name);
        if (close_spelling(name, KEYS[i].name) && d < best) {
            best = d;
            snprintf(suggest, sizeof suggest, "; did you mean '%s.%s'?", section,
                     KEYS[i].name);
        }
    }

    char known[512];
    size_t len = 0;
    known[0] = '\0';
    for (int i = 0; i < N_KEYS && len < sizeof known; i++)
        if (strcmp(KEYS[i].section, section) == 0)
            len += (size_t)snprintf(known + len, sizeof known - len, "%s%s", len ? ", " : "",
                                    KEYS[i].name);
    return ts_fail("unknown config key '%s.%s'%s%s; known keys in '%s' are: %s", section,
                   name, where, suggest, section, known);
}

static ts_status unknown_section(const char *name, const config_setting_t *s)
{
    char where[TS_PATH_MAX + 32];
    where_of(s, where, sizeof where);
    char suggest[96] = "";
    for (int i = 0; i < N_SECTIONS; i++)
        if (close_spelling(name, SECTIONS[i])) {
            snprintf(suggest, sizeof suggest, "; did you mean '%s'?", SECTIONS[i]);
            break;
        }
    /* A known key written at the top level ("steps = 10;" outside train = {...}). */
    for (int i = 0; i < N_KEYS && !suggest[0]; i++)
        if (strcmp(KEYS[i].name, name) == 0)
            snprintf(suggest, sizeof suggest, "; did you mean '%s.%s'?", KEYS[i].section,
                     name);
    return ts_fail("unknown config section '%s'%s%s; known sections are: model, parallel, "
                   "train, data, checkpoint, log",
                   name, where, suggest);
}

/* Walk the whole tree: every top-level setting a known section (a group), every
 * member of a section a known key of the right type and range. */
static ts_status read_tree(const config_setting_t *root, ts_config *cfg)
{
    int n = config_setting_length(root);
    for (int i = 0; i < n; i++) {
        const config_setting_t *sec = config_setting_get_elem(root, (unsigned)i);
        const char *sname = config_setting_name(sec);
        if (!is_section(sname)) return unknown_section(sname, sec);
        if (config_setting_type(sec) != CONFIG_TYPE_GROUP) {
            char where[TS_PATH_MAX + 32], found[128];
            where_of(sec, where, sizeof where);
            describe_found(sec, found, sizeof found);
            return ts_fail("config section '%s'%s must be a group, written %s = { key = "
                           "value; ... };, but is %s",
                           sname, where, sname, found);
        }
        int m = config_setting_length(sec);
        for (int j = 0; j < m; j++) {
            const config_setting_t *s = config_setting_get_elem(sec, (unsigned)j);
            const char *kname = config_setting_name(s);
            const key_spec *k = find_key(sname, kname);
            if (!k) return unknown_key(sname, kname, s);
            if (read_key(k, s, cfg) != TS_OK) return TS_ERR;
        }
    }
    return TS_OK;
}

/* -------------------------------------------------------------- overrides -- */

static int find_wide_int(const char *text, char *tok, size_t cap, bool *beyond_64);
static ts_status huge_int_error(const char *where, const char *tok);

/* Deep-copy `src` into `parent` under `name` (NULL inside arrays and lists). */
static config_setting_t *copy_setting(config_setting_t *parent, const char *name,
                                      const config_setting_t *src)
{
    int type = config_setting_type(src);
    config_setting_t *dst = config_setting_add(parent, name, type);
    if (!dst) return NULL;
    int ok = CONFIG_TRUE;
    switch (type) {
    case CONFIG_TYPE_INT: ok = config_setting_set_int(dst, config_setting_get_int(src)); break;
    case CONFIG_TYPE_INT64:
        ok = config_setting_set_int64(dst, config_setting_get_int64(src));
        break;
    case CONFIG_TYPE_FLOAT:
        ok = config_setting_set_float(dst, config_setting_get_float(src));
        break;
    case CONFIG_TYPE_STRING:
        ok = config_setting_set_string(dst, config_setting_get_string(src));
        break;
    case CONFIG_TYPE_BOOL: ok = config_setting_set_bool(dst, config_setting_get_bool(src)); break;
    case CONFIG_TYPE_GROUP:
    case CONFIG_TYPE_ARRAY:
    case CONFIG_TYPE_LIST: {
        int n = config_setting_length(src);
        for (int i = 0; i < n; i++) {
            const config_setting_t *e = config_setting_get_elem(src, (unsigned)i);
            const char *ename = type == CONFIG_TYPE_GROUP ? config_setting_name(e) : NULL;
            if (!copy_setting(dst, ename, e)) return NULL;
        }
        break;
    }
    default: break;
    }
    return ok == CONFIG_TRUE ? dst : NULL;
}

static void trim(char *s)
{
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t')) s[--n] = '\0';
    size_t i = 0;
    while (s[i] == ' ' || s[i] == '\t') i++;
    if (i) memmove(s, s + i, n - i + 1);
}

/* Graft the override's value, parsed as a libconfig value or else taken as a bare
 * string, at the dotted path `key` of `lc`, replacing whatever was there. `key` is
 * modified (split in place). */
static ts_status set_path(config_t *lc, char *key, const char *value, const char *ov)
{
    /* Parse the value as libconfig parses one: "v = VALUE;". */
    const config_setting_t *parsed = NULL;
    /* A lone integer beyond 32 bits gets libconfig's 64-bit suffix; anywhere else
     * (in a list) it would be truncated, so it is an error. */
    char tok[64];
    bool beyond_64 = false;
    bool wide = find_wide_int(value, tok, sizeof tok, &beyond_64) != 0;
    if (wide && beyond_64) {
        char where[600];
        snprintf(where, sizeof where, "override '%.500s'", ov);
        return huge_int_error(where, tok);
    }
    config_t scratch;
    config_init(&scratch);
    size_t len = strlen(value) + 8;
    char *text = ts_malloc(len);
    bool lone = value[0] != '\0' && strspn(value + (value[0] == '-' || value[0] == '+'),
                                            "0123456789") ==
                                         strlen(value) - (value[0] == '-' || value[0] == '+');
    snprintf(text, len, wide && lone ? "v = %sL;" : "v = %s;", value);
    if (config_read_string(&scratch, text) == CONFIG_TRUE) {
        const config_setting_t *root = config_root_setting(&scratch);
        if (config_setting_length(root) == 1) parsed = config_setting_get_member(root, "v");
    }
    free(text);
    if (parsed && wide && !lone) {
        config_destroy(&scratch);
        return ts_fail("override '%s': the integer %s does not fit in 32 bits; write %sL",
                       ov, tok, tok);
    }

    ts_status st = TS_OK;
    config_setting_t *parent = config_root_setting(lc);
    char *save = NULL;
    char *part = strtok_r(key, ".", &save);
    while (part && st == TS_OK) {
        char *next = strtok_r(NULL, ".", &save);
        config_setting_t *cur = config_setting_get_member(parent, part);
        if (next) { /* an intermediate group */
            if (!cur) cur = config_setting_add(parent, part, CONFIG_TYPE_GROUP);
            if (!cur)
                st = ts_fail("invalid config key in override '%s': '%s' is not a valid "
                             "name (letters, digits, '_' and '-', starting with a letter)",
                             ov, part);
            else if (config_setting_type(cur) != CONFIG_TYPE_GROUP)
                st = ts_fail("cannot apply override '%s': '%s' is %s, not a group of keys",
                             ov, part, type_name(config_setting_type(cur)));
            parent = cur;
        } else { /* the leaf: replace */
            if (cur) config_setting_remove(parent, part);
            config_setting_t *leaf;
            if (parsed) {
                leaf = copy_setting(parent, part, parsed);
            } else {
                leaf = config_setting_add(parent, part, CONFIG_TYPE_STRING);
                if (leaf && config_setting_set_string(leaf, value) != CONFIG_TRUE) leaf = NULL;
            }
            if (!leaf)
                st = ts_fail("invalid config key in override '%s': '%s' is not a valid "
                             "name (letters, digits, '_' and '-', starting with a letter)",
                             ov, part);
        }
        part = next;
    }
    config_destroy(&scratch);
    return st;
}

static ts_status apply_override(config_t *lc, const char *ov)
{
    const char *eq = strchr(ov, '=');
    if (!eq)
        return ts_fail("malformed override '%s': expected KEY=VALUE with a dotted key, "
                       "e.g. --set parallel.pp=4",
                       ov);
    size_t klen = (size_t)(eq - ov);
    char *key = ts_malloc(klen + 1);
    memcpy(key, ov, klen);
    key[klen] = '\0';
    trim(key);
    char *value = ts_malloc(strlen(eq + 1) + 1);
    strcpy(value, eq + 1);
    trim(value);

    ts_status st = TS_OK;
    if (key[0] == '\0' || key[0] == '.' || key[strlen(key) - 1] == '.' || strstr(key, ".."))
        st = ts_fail("malformed override '%s': the key must be a dotted config key such "
                     "as train.steps",
                     ov);
    else
        st = set_path(lc, key, value, ov);
    free(key);
    free(value);
    return st;
}

/* ---------------------------------------------------------------- loading -- */

/* libconfig 1.5 reads a decimal integer literal that does not fit in 32 bits and has
 * no `L` suffix as its low 32 bits (5000000000 becomes 705032704), and one beyond 64
 * bits (with or without `L`) as INT64_MAX, both silently. Find the first such literal
 * in libconfig text, outside strings and comments: returns its line (from 1), copies
 * it to `tok` and sets *beyond_64 (else it is a 32-bit overflow without `L`), or
 * returns 0 when there is none. */
static int find_wide_int(const char *text, char *tok, size_t cap, bool *beyond_64)
{
    int line = 1;
    const char *p = text;
    while (*p) {
        if (*p == '\n') {
            line++;
            p++;
        } else if (*p == '"') { /* a string: skip to the closing quote */
            for (p++; *p && *p != '"'; p++) {
                if (*p == '\\' && p[1]) p++;
                if (*p == '\n') line++;
            }
            if (*p) p++;
        } else if (*p == '#' || (p[0] == '/' && p[1] == '/')) {
            while (*p && *p != '\n') p++;
        } else if (p[0] == '/' && p[1] == '*') {
            for (p += 2; *p && !(p[0] == '*' && p[1] == '/'); p++)
                if (*p == '\n') line++;
            if (*p) p += 2;
        } else if (isdigit((unsigned char)*p) &&
                   (p == text || !(isalnum((unsigned char)p[-1]) || p[-1] == '_' || p[-1] == '.'))) {
            const char *start = p;
            while (isalnum((unsigned char)*p) || *p == '_' || *p == '.' ||
                   ((*p == '+' || *p == '-') && (p[-1] == 'e' || p[-1] == 'E')))
                p++;
            /* Decimal digits, optionally with libconfig's 64-bit suffix L or LL. */
            size_t n = (size_t)(p - start), digits = strspn(start, "0123456789");
            size_t suffix = n - digits;
            if (digits == 0 || suffix > 2 || strspn(start + digits, "L") != suffix) continue;
            bool neg = start > text && start[-1] == '-';
            errno = 0;
            unsigned long long v = strtoull(start, NULL, 10);
            bool over64 = errno == ERANGE || v > (neg ? 9223372036854775808ULL
                                                      : 9223372036854775807ULL);
            bool over32 = v > (neg ? 2147483648ULL : 2147483647ULL);
            if (over64 || (suffix == 0 && over32)) {
                snprintf(tok, cap, "%.*s", (int)n, start);
                *beyond_64 = over64;
                return line;
            }
        } else {
            p++;
        }
    }
    return 0;
}

static ts_status huge_int_error(const char *where, const char *tok)
{
    return ts_fail("%s: the integer %s does not fit in 64 bits (-2^63 .. 2^63-1) and "
                   "libconfig would silently clamp it; use a smaller number",
                   where, tok);
}

/* The whole stream as a string (malloc'd), or NULL with errno set on a read error. */
static char *slurp(FILE *f, size_t *out_len)
{
    size_t cap = 4096, len = 0;
    char *buf = ts_malloc(cap);
    for (;;) {
        size_t got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
        if (got == 0) break;
        if (cap - len - 1 == 0) {
            if (cap > ((size_t)1 << 30)) { /* no config is a gigabyte */
                free(buf);
                errno = EFBIG;
                return NULL;
            }
            cap *= 2;
            char *bigger = realloc(buf, cap);
            if (!bigger) {
                free(buf);
                errno = ENOMEM;
                return NULL;
            }
            buf = bigger;
        }
    }
    if (ferror(f)) {
        int err = errno ? errno : EIO;
        free(buf);
        errno = err;
        return NULL;
    }
    buf[len] = '\0';
    *out_len = len;
    return buf;
}

/* The file is read exactly once and parsed from memory, so a pipe or process
 * substitution (`tessera train /dev/stdin`, `<(...)`) works like a regular file. */
static ts_status read_file(config_t *lc, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return ts_fail("cannot open config file '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(f);
        return ts_fail("config file '%s' is a directory; give the path of a libconfig file "
                       "such as configs/tiny.cfg",
                       path);
    }
    errno = 0;
    size_t len = 0;
    char *text = slurp(f, &len);
    int err = errno;
    fclose(f);
    if (!text) return ts_fail("cannot read config file '%s': %s", path, strerror(err));
    if (strlen(text) != len) { /* libconfig would stop at the NUL and ignore the rest */
        size_t at = strlen(text);
        free(text);
        return ts_fail("config file '%s' holds a NUL byte at offset %zu: it is not a text "
                       "file; give a libconfig file such as configs/tiny.cfg",
                       path, at);
    }

    /* @include "x.cfg" is resolved next to the config file. */
    char *dir = ts_malloc(strlen(path) + 2);
    strcpy(dir, path);
    char *slash = strrchr(dir, '/');
    if (slash)
        slash[1] = '\0';
    else
        strcpy(dir, ".");
    config_set_include_dir(lc, dir);
    free(dir);

    char tok[64];
    bool beyond_64 = false;
    int line = find_wide_int(text, tok, sizeof tok, &beyond_64);
    int ok = config_read_string(lc, text);
    free(text);
    if (ok == CONFIG_TRUE) {
        if (line && beyond_64) {
            char where[TS_PATH_MAX + 32];
            snprintf(where, sizeof where, "config file %s:%d", path, line);
            return huge_int_error(where, tok);
        }
        if (line)
            return ts_fail("config file %s:%d: the integer %s does not fit in 32 bits and "
                           "libconfig would silently truncate it; write %sL if the key "
                           "takes 64-bit values (train.seed), else a smaller number",
                           path, line, tok, tok);
        return TS_OK;
    }
    if (config_error_type(lc) == CONFIG_ERR_FILE_IO)
        return ts_fail("cannot read a file included by config file '%s'%s%s", path,
                       config_error_file(lc) ? ": " : "",
                       config_error_file(lc) ? config_error_file(lc) : "");
    const char *file = config_error_file(lc) ? config_error_file(lc) : path;
    return ts_fail("config file %s:%d: %s (libconfig syntax: key = value; groups "
                   "name = { ... }; strings in double quotes)",
                   file, config_error_line(lc), config_error_text(lc));
}

ts_status ts_config_load(ts_config *cfg, const char *path, const char *const *overrides,
                         int n_overrides, int world_size)
{
    ts_config_defaults(cfg);
    config_t lc;
    config_init(&lc);
    ts_status st = TS_OK;
    g_main_path = path;
    if (path) st = read_file(&lc, path);
    for (int i = 0; i < n_overrides && st == TS_OK; i++) st = apply_override(&lc, overrides[i]);
    if (st == TS_OK) st = read_tree(config_root_setting(&lc), cfg);
    g_main_path = NULL;
    config_destroy(&lc);
    if (st != TS_OK) return st;
    return ts_config_validate(cfg, world_size);
}

/* ------------------------------------------------------------- relations -- */

int ts_config_num_microbatches(const ts_config *cfg)
{
    long long per = (long long)cfg->parallel.dp * cfg->parallel.micro_batch;
    if (per <= 0) return 0;
    return (int)(cfg->train.global_batch / per);
}

static ts_status batch_error(const ts_config *cfg)
{
    long long B = cfg->train.global_batch, dp = cfg->parallel.dp, mb = cfg->parallel.micro_batch;
    long long unit = dp * mb;
    char msg[512];
    size_t len = 0;
    len += (size_t)snprintf(msg + len, sizeof msg - len,
                            "train.global_batch = %lld is not a whole number of micro-batches: "
                            "it must equal parallel.dp * parallel.micro_batch * "
                            "num_microbatches = %lld * %lld * m for a whole m >= 1",
                            B, dp, mb);
    /* Suggest the nearest valid values that the key's range (<= INT_MAX) allows. */
    long long lower = (B / unit) * unit, upper = lower + unit;
    bool upper_ok = upper <= INT_MAX;
    if (lower >= unit && upper_ok)
        len += (size_t)snprintf(msg + len, sizeof msg - len,
                                "; use global_batch = %lld or %lld", lower, upper);
    else if (lower >= unit)
        len += (size_t)snprintf(msg + len, sizeof msg - len, "; use global_batch = %lld",
                                lower);
    else if (upper_ok)
        len += (size_t)snprintf(msg + len, sizeof msg - len, "; use global_batch = %lld",
                                upper);
    if (B % dp == 0 && len < sizeof msg) {
        /* Or keep global_batch and pick a micro_batch dividing B/dp: the smallest
         * divisors, found up to sqrt(B/dp) with their cofactors (B/dp may be ~2^31). */
        long long per = B / dp, divs[16];
        int n = 0;
        for (long long d = 1; d * d <= per && n < 8; d++)
            if (per % d == 0) divs[n++] = d;
        for (int i = n - 1; i >= 0 && n < 16; i--) {
            long long co = per / divs[i];
            if (co != divs[i]) divs[n++] = co;
        }
        len += (size_t)snprintf(msg + len, sizeof msg - len,
                                ", or a parallel.micro_batch dividing global_batch/dp = %lld (",
                                per);
        int shown = 0;
        for (int i = 0; i < n && shown < 8 && len < sizeof msg; i++)
            len += (size_t)snprintf(msg + len, sizeof msg - len, "%s%lld", shown++ ? ", " : "",
                                    divs[i]);
        if (len < sizeof msg) snprintf(msg + len, sizeof msg - len, "%s)", n > 8 ? ", ..." : "");
    } else if (len < sizeof msg) {
        snprintf(msg + len, sizeof msg - len, " (global_batch must divide by dp = %lld)", dp);
    }
    return ts_fail("%s", msg);
}

/* Checkpoint keys that only make sense together. */
static ts_status check_checkpoint(const ts_config *cfg)
{
    const ts_checkpoint_config *k = &cfg->checkpoint;
    if (k->dir[0]) return TS_OK;
    if (k->every > 0)
        return ts_fail("checkpoint.every = %d needs checkpoint.dir (where to save); set "
                       "checkpoint.dir or remove checkpoint.every",
                       k->every);
    if (!strcmp(k->load, "latest"))
        return ts_fail("checkpoint.load = \"latest\" means the newest checkpoint in "
                       "checkpoint.dir, which is not set; set checkpoint.dir or give "
                       "checkpoint.load a checkpoint directory");
    return TS_OK;
}

ts_status ts_config_validate(const ts_config *cfg, int world_size)
{
    for (int i = 0; i < N_KEYS; i++)
        if (check_value(&KEYS[i], cfg, "") != TS_OK) return TS_ERR;

    const ts_model_config *m = &cfg->model;
    const ts_parallel_config *p = &cfg->parallel;
    const ts_train_config *t = &cfg->train;

    if (t->min_lr > t->lr)
        return ts_fail("train.min_lr = %g must be <= train.lr = %g (the cosine schedule "
                       "decays from lr down to min_lr)",
                       t->min_lr, t->lr);

    long long grid = (long long)p->pp * p->dp * p->tp;
    if (world_size > 0 && grid != world_size)
        return ts_fail("the grid pp*dp*tp = %d*%d*%d = %lld does not match the %d ranks "
                       "launched; launch with mpirun -np %lld or change parallel.pp/dp/tp",
                       p->pp, p->dp, p->tp, grid, world_size, grid);

    long long unit = (long long)p->dp * p->micro_batch;
    if (t->global_batch % unit != 0 || t->global_batch < unit) return batch_error(cfg);

    if (m->n_embd % m->n_head != 0)
        return ts_fail("model.n_embd = %d must divide by model.n_head = %d (each head has "
                       "n_embd/n_head channels); change n_embd or n_head",
                       m->n_embd, m->n_head);
    if (m->n_head % p->tp != 0)
        return ts_fail("model.n_head = %d must divide by parallel.tp = %d (each "
                       "tensor-parallel rank holds n_head/tp heads); change n_head or tp",
                       m->n_head, p->tp);
    /* Vocabulary rows are split as evenly as possible (tensor/shard.h): any size works
     * as long as every tensor-parallel rank gets at least one row. */
    if (m->vocab_size < p->tp)
        return ts_fail("model.vocab_size = %d is smaller than parallel.tp = %d (each "
                       "tensor-parallel rank holds at least one vocabulary row); lower tp",
                       m->vocab_size, p->tp);

    long long chunks = (long long)p->pp * p->virtual_stages;
    long long layers = (long long)m->n_layer + 2;
    if (chunks > layers)
        return ts_fail("more pipeline chunks than layers: parallel.pp * "
                       "parallel.virtual_stages = %d * %d = %lld chunks, but the model has "
                       "only model.n_layer + 2 = %lld layers (embedding, %d blocks, head); "
                       "lower pp or virtual_stages",
                       p->pp, p->virtual_stages, chunks, layers, m->n_layer);
    if (chunks > TS_MAX_CHUNKS)
        return ts_fail("parallel.pp * parallel.virtual_stages = %lld chunks; at most %d are "
                       "supported",
                       chunks, TS_MAX_CHUNKS);
    if (p->n_partition > 0) {
        if (p->n_partition != chunks)
            return ts_fail("parallel.partition lists %d chunks but parallel.pp * "
                           "parallel.virtual_stages = %d * %d = %lld; give one layer count "
                           "per chunk",
                           p->n_partition, p->pp, p->virtual_stages, chunks);
        long long sum = 0;
        for (int i = 0; i < p->n_partition; i++) sum += p->partition[i];
        if (sum != layers)
            return ts_fail("parallel.partition sums to %lld layers but the model has "
                           "model.n_layer + 2 = %lld (embedding, %d blocks, head)",
                           sum, layers, m->n_layer);
    }
    if (p->virtual_stages > 1 &&
        ts_schedule_kind_from_name(p->schedule) != TS_SCHEDULE_INTERLEAVED_1F1B &&
        !ends_with(p->schedule, ".csv"))
        return ts_fail("parallel.virtual_stages = %d needs parallel.schedule = "
                       "\"%s\" or a CSV schedule; \"%s\" runs one chunk per "
                       "pipeline rank (set virtual_stages = 1)",
                       p->virtual_stages, ts_schedule_names[TS_SCHEDULE_INTERLEAVED_1F1B],
                       p->schedule);

    if (strcmp(cfg->train.precision, "bf16") == 0 && strcmp(cfg->train.device, "cuda") != 0)
        return ts_fail("train.precision = \"bf16\" runs the GEMMs on a GPU's bfloat16 tensor "
                       "cores, but train.device = \"%s\"; set train.device = \"cuda\" or "
                       "train.precision = \"fp32\"",
                       cfg->train.device);
    if (strcmp(p->comm, "nccl") == 0 && strcmp(cfg->train.device, "cuda") != 0)
        return ts_fail("parallel.comm = \"nccl\" moves GPU memory, but train.device = \"%s\"; "
                       "set train.device = \"cuda\" or parallel.comm = \"auto\"",
                       cfg->train.device);
#ifdef TS_HAVE_NCCL
    /* "auto" and "nccl" both mean NCCL for cuda in a build that has it (trainer.c). */
    if (strcmp(cfg->train.device, "cuda") == 0 && strcmp(p->comm, "mpi") != 0 &&
        strcmp(p->grad_sync_progress, "thread") == 0)
        return ts_fail("parallel.grad_sync_progress = \"thread\" drives MPI reductions from "
                       "a host thread; with train.device = \"cuda\" the reductions are NCCL's "
                       "(parallel.comm = \"%s\"), which run on the GPU by themselves, and a "
                       "second thread issuing NCCL calls could order them differently on "
                       "different ranks; use \"poll\" (or parallel.comm = \"mpi\")",
                       p->comm);
#endif
    if (strcmp(p->grad_sync_progress, "thread") == 0 && !p->overlap_grad_sync)
        return ts_fail("parallel.grad_sync_progress = \"thread\" drives the overlapped "
                       "reduction, but parallel.overlap_grad_sync = false runs one blocking "
                       "all-reduce after the step; set overlap_grad_sync = true or remove the "
                       "progress mode");
    /* Sizes whose products index buffers with int: one micro-batch's N = micro_batch *
     * seq_len rows, and the whole grid's rank count. */
    if ((long long)p->micro_batch * m->seq_len > (1LL << 30))
        return ts_fail("parallel.micro_batch * model.seq_len = %d * %d = %lld rows per "
                       "micro-batch; at most 2^30 are supported (lower micro_batch)",
                       p->micro_batch, m->seq_len, (long long)p->micro_batch * m->seq_len);
    if (grid > (1LL << 24))
        return ts_fail("the grid pp*dp*tp = %d*%d*%d = %lld ranks; at most 2^24 are "
                       "supported",
                       p->pp, p->dp, p->tp, grid);
    return check_checkpoint(cfg);
}

/* ------------------------------------------------------------------- JSON -- */

static json_t *key_json(const key_spec *k, const ts_config *cfg)
{
    const void *v = cfield_ptr(cfg, k);
    switch (k->kind) {
    case K_INT: return json_integer(*(const int *)v);
    case K_INT64: return json_integer((json_int_t) * (const int64_t *)v);
    case K_FLOAT: return json_real(*(const double *)v);
    case K_BOOL: return json_boolean(*(const bool *)v);
    case K_STR: return json_string((const char *)v);
    case K_PARTITION: {
        const ts_parallel_config *p = &cfg->parallel;
        if (p->n_partition == 0) return json_string("balanced");
        json_t *a = json_array();
        for (int i = 0; i < p->n_partition; i++) json_array_append_new(a, json_integer(p->partition[i]));
        return a;
    }
    case K_SHARDS: {
        const ts_data_config *d = &cfg->data;
        json_t *a = json_array();
        for (int i = 0; i < d->n_train; i++) json_array_append_new(a, json_string(d->train[i]));
        return a;
    }
    }
    return json_null();
}

/* Does every float key of `text` read back as exactly the value in cfg? */
static bool reals_round_trip(const char *text, const ts_config *cfg)
{
    json_t *j = json_loads(text, 0, NULL);
    if (!j) return false;
    bool same = true;
    for (int i = 0; i < N_KEYS && same; i++) {
        if (KEYS[i].kind != K_FLOAT) continue;
        json_t *v = json_object_get(json_object_get(j, KEYS[i].section), KEYS[i].name);
        same = json_number_value(v) == *(const double *)cfield_ptr(cfg, &KEYS[i]);
    }
    json_decref(j);
    return same;
}

char *ts_config_to_json(const ts_config *cfg)
{
    json_t *root = json_object();
    for (int s = 0; s < N_SECTIONS; s++) {
        json_t *sec = json_object();
        for (int i = 0; i < N_KEYS; i++)
            if (strcmp(KEYS[i].section, SECTIONS[s]) == 0)
                json_object_set_new(sec, KEYS[i].name, key_json(&KEYS[i], cfg));
        json_object_set_new(root, SECTIONS[s], sec);
    }
    /* Floats with 15 significant digits ("lr":0.0006, not 0.00059999999999999995)
     * unless that would not read back exactly; then 17, which always does. */
    char *text = json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(15));
    TS_ASSERT(text != NULL);
    if (!reals_round_trip(text, cfg)) {
        free(text);
        text = json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(17));
        TS_ASSERT(text != NULL);
    }
    json_decref(root);
    return text;
}
