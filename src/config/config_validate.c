/* Validation: the per-key checks (ranges, allowed values, list contents) that run as
 * each setting is read (config_load.c) and again in ts_config_validate, so a config
 * built in code is checked too, and the relations between keys (batch rule,
 * divisibility, grid, device and precision). Nothing here prints or exits: every
 * problem is a ts_fail message naming the key and how to fix it. */
#include "config/batch_rampup.h"
#include "config/config_internal.h"
#include "config/pipeline_names.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kernels/kernels.h"

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

ts_status ts_config_check_arch(const key_spec *k, const ts_config *cfg, const char *where)
{
    (void)k;
    if (strcmp(cfg->model.arch, "gpt2") == 0 || strcmp(cfg->model.arch, "llama") == 0)
        return TS_OK;
    return ts_fail("config key 'model.arch' = \"%s\"%s is not supported; the "
                   "architectures are \"gpt2\" and \"llama\"",
                   cfg->model.arch, where);
}

/* model.tokenizer: none, or an encoding of src/tokenizer (the byte-level "bytes" is no
 * value: a vocab-256 model without a tokenizer already is byte-level). */
static ts_status check_tokenizer(const char *t, const char *where)
{
    if (!t[0] || strcmp(t, "gpt2") == 0 || strcmp(t, "llama3") == 0) return TS_OK;
    return ts_fail("config key 'model.tokenizer' = \"%s\"%s is not an encoding; choose "
                   "\"gpt2\" (GPT-2's BPE, 50257 ids), \"llama3\" (Llama 3's, 128256 ids) or "
                   "\"\" (none: token ids, or bytes at model.vocab_size = 256)",
                   t, where);
}

ts_status ts_config_check_tokenizer(const key_spec *k, const ts_config *cfg, const char *where)
{
    (void)k;
    return check_tokenizer(cfg->model.tokenizer, where);
}

ts_status ts_config_check_tokenizer_name(const char *name)
{
    return check_tokenizer(name, "");
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n > m && strcmp(s + n - m, suffix) == 0;
}

ts_status ts_config_check_schedule(const key_spec *k, const ts_config *cfg, const char *where)
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

ts_status ts_config_check_recompute(const key_spec *k, const ts_config *cfg, const char *where)
{
    (void)k;
    if (ts_recompute_from_name(cfg->parallel.recompute) >= 0) return TS_OK;
    char choices[128];
    join_quoted(choices, sizeof choices, ts_recompute_names, TS_N_RECOMPUTES);
    return ts_fail("config key 'parallel.recompute' = \"%s\"%s is not valid; choose one "
                   "of %s",
                   cfg->parallel.recompute, where, choices);
}

ts_status ts_config_check_order(const key_spec *k, const ts_config *cfg, const char *where)
{
    (void)k;
    const char *s = cfg->parallel.order;
    /* Four two-letter names separated by '-', each of tp/cp/dp/pp once; or three, each of
     * tp/dp/pp once (cp then goes right after tp: src/topology/grid.c). */
    const char *names[4] = { "tp", "dp", "pp", "cp" };
    size_t len = strlen(s);
    int n = len == 11 ? 4 : len == 8 ? 3 : 0;
    bool ok = n > 0;
    for (int j = 1; j < n && ok; j++) ok = s[3 * j - 1] == '-';
    for (int i = 0; i < n && ok; i++) {
        int seen = 0;
        for (int j = 0; j < n; j++)
            if (strncmp(s + 3 * j, names[i], 2) == 0) seen++;
        ok = seen == 1;
    }
    if (ok) return TS_OK;
    return ts_fail("config key 'parallel.order' = \"%s\"%s is not valid; give tp, cp, dp "
                   "and pp once each joined by '-', fastest-varying first (e.g. "
                   "\"tp-cp-dp-pp\" or \"dp-tp-cp-pp\"), or tp, dp and pp once each "
                   "(cp then varies right after tp: \"tp-dp-pp\" is \"tp-cp-dp-pp\")",
                   s, where);
}

/* The devices this build has (kernels/kernels.h: a device is one with an fp32 table
 * of the default attention; the other tables, "cuda-bf16" and so on, are chosen by
 * train.precision and train.attention, never named here). "cuda" is a real backend
 * name that a CPU-only build lacks: say so rather than "not a device". Where the build
 * has it, "cuda" is accepted without looking for a GPU: configs are validated on
 * machines without one too (the launcher, CI); the run itself checks for a device. A
 * plan (ts_config_load_plan) accepts "cuda" in any build: it only sizes the run. */
ts_status ts_config_check_device(const key_spec *k, const ts_config *cfg, const char *where)
{
    const char *v = (const char *)cfield_ptr(cfg, k);
    if (ts_kernels_for(v, "fp32", "gemm")) return TS_OK;
    if (strcmp(v, "cuda") == 0 && ts_config_planning()) return TS_OK; /* a plan sizes it */
    if (strcmp(v, "cuda") == 0)
        return ts_fail("config key 'train.device' = \"cuda\"%s: this tessera was built "
                       "without the CUDA backend; use \"cpu\"",
                       where);
    return ts_fail("config key 'train.device' = \"%s\"%s is not a device; choose \"cpu\" "
                   "(or \"cpu-strict\", the test mode whose device memory the host cannot "
                   "touch)",
                   v, where);
}

/* An enumeration key: TS_OK when its value is one of `values`, else "config key 'S.K' =
 * "V"(where) is not WHAT; CHOICES" (what every enumeration's message says). */
static ts_status check_choice(const key_spec *k, const ts_config *cfg, const char *where,
                              const char *const *values, int n, const char *what,
                              const char *choices)
{
    const char *v = (const char *)cfield_ptr(cfg, k);
    if (index_of(v, values, n) >= 0) return TS_OK;
    return ts_fail("config key '%s.%s' = \"%s\"%s is not %s; %s", k->section, k->name, v, where,
                   what, choices);
}

static const char *const PRECISIONS[] = { "fp32", "bf16" };

ts_status ts_config_check_precision(const key_spec *k, const ts_config *cfg, const char *where)
{
    return check_choice(k, cfg, where, PRECISIONS, 2, "a precision",
                        "choose \"fp32\" (every kernel in float32) or \"bf16\" (bfloat16 "
                        "activations and compute weights, float32 accumulation, master weights "
                        "and optimizer state)");
}

/* The CUDA attention kernels (kernels/cuda/attention.cu; the backend table is picked by
 * ts_kernels_for): "gemm" is every backend's default, "flash" needs train.device =
 * "cuda" (ts_config_validate). */
static const char *const ATTENTIONS[] = { "gemm", "flash" };

ts_status ts_config_check_attention(const key_spec *k, const ts_config *cfg, const char *where)
{
    return check_choice(k, cfg, where, ATTENTIONS, 2, "an attention kernel",
                        "choose \"gemm\" (batched GEMMs with a [B, NH, T, T] score buffer, the "
                        "default) or \"flash\" (the flash-style kernel, one log-sum-exp per "
                        "row; train.device = \"cuda\")");
}

ts_status ts_config_allow_auto(const key_spec *k, const ts_config *cfg, const char *where)
{
    (void)k, (void)cfg, (void)where;
    return TS_OK;
}

/* The learning-rate schedules after the warm-up (optim/optim.h). */
static const char *const LR_SCHEDULES[] = { "cosine", "linear", "constant", "wsd" };

ts_status ts_config_check_lr_schedule(const key_spec *k, const ts_config *cfg,
                                       const char *where)
{
    return check_choice(k, cfg, where, LR_SCHEDULES, 4, "a schedule",
                        "choose \"cosine\" (the default), \"linear\", \"constant\" or \"wsd\" "
                        "(warmup-stable-decay, with train.decay_steps or train.decay_fraction)");
}

/* What a step with a non-finite loss or gradient norm does (trainer.c): its update is
 * never applied; "stop" ends the run with an error, "skip" goes on to the next step. */
static const char *const ON_NONFINITE[] = { "stop", "skip" };

ts_status ts_config_check_on_nonfinite(const key_spec *k, const ts_config *cfg,
                                        const char *where)
{
    return check_choice(k, cfg, where, ON_NONFINITE, 2, "a choice",
                        "use \"stop\" (end the run at a step whose loss or gradient norm is not "
                        "finite, the default) or \"skip\" (drop that step's update and go on)");
}

/* The data plane of the dp/pp/tp groups (comm/comm.h). "nccl" is a real backend name
 * that a build without NCCL lacks: say so rather than "not a backend". */
static const char *const COMM_BACKENDS[] = { "auto", "mpi", "nccl" };

ts_status ts_config_check_comm(const key_spec *k, const ts_config *cfg, const char *where)
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

static const char *const PROGRESS_MODES[] = { "poll", "thread" };

ts_status ts_config_check_progress(const key_spec *k, const ts_config *cfg, const char *where)
{
    return check_choice(k, cfg, where, PROGRESS_MODES, 2, "a progress mode",
                        "choose \"poll\" (test the pending reductions between layers) or "
                        "\"thread\" (a communication thread drives them)");
}

/* Human-readable range, e.g. ">= 1", "> 0", "in [0, 1)", "0 or 1". */
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

bool ts_config_in_range(const key_spec *k, double v)
{
    if (k->lo_open ? !(v > k->lo) : !(v >= k->lo)) return false;
    if (k->hi_open ? !(v < k->hi) : !(v <= k->hi)) return false;
    return true;
}

ts_status ts_config_range_error(const key_spec *k, const char *value, const char *where)
{
    char range[96];
    describe_range(k, range, sizeof range);
    return ts_fail("config key '%s.%s' = %s%s is out of range: it must be %s", k->section,
                   k->name, value, where, range);
}

/* Check one key's stored value (config_internal.h). */
ts_status ts_config_check_value(const key_spec *k, const ts_config *cfg, const char *where)
{
    char value[64];
    switch (k->kind) {
    case K_INT: {
        int v = *(const int *)cfield_ptr(cfg, k);
        snprintf(value, sizeof value, "%d", v);
        if (v == 0 && k->check == ts_config_allow_auto) break; /* "auto", resolved at load */
        if (!ts_config_in_range(k, v)) return ts_config_range_error(k, value, where);
        break;
    }
    case K_FLOAT: {
        double v = *(const double *)cfield_ptr(cfg, k);
        snprintf(value, sizeof value, "%g", v);
        if (!isfinite(v)) /* 1e309 parses as inf */
            return ts_fail("config key '%s.%s' = %s%s is not a finite number", k->section,
                           k->name, value, where);
        /* The kernels take these in single precision (AdamW's lr, eps, betas, decay): a
         * value past FLT_MAX would become inf there and train on non-finite weights. */
        if (fabs(v) > FLT_MAX)
            return ts_fail("config key '%s.%s' = %s%s overflows single precision (the "
                           "kernels' float): it must be at most %g",
                           k->section, k->name, value, where, (double)FLT_MAX);
        if (!ts_config_in_range(k, v)) return ts_config_range_error(k, value, where);
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
            return ts_fail("config key 'data.train'%s lists %d paths; at most %d are "
                           "supported (a glob pattern such as \"data/train_*.bin\" names any "
                           "number of files)",
                           where, d->n_train, TS_MAX_SHARDS);
        if (d->n_sets < 1 || d->n_sets > TS_MAX_DATA_SETS)
            return ts_fail("config key 'data.train'%s blends %d datasets; 1 to %d are "
                           "supported", where, d->n_sets, TS_MAX_DATA_SETS);
        for (int i = 0; i < d->n_train; i++) {
            if (d->train[i][0] == '\0')
                return ts_fail("config key 'data.train'%s: entry %d is an empty path", where,
                               i);
            if (d->train_set[i] < 0 || d->train_set[i] >= d->n_sets)
                return ts_fail("config key 'data.train'%s: entry %d belongs to no dataset of "
                               "the blend", where, i);
        }
        for (int s = 0; s < d->n_sets; s++) {
            if (!(d->weight[s] > 0.0) || !isfinite(d->weight[s]))
                return ts_fail("config key 'data.train'%s: dataset %d's weight %g must be a "
                               "positive number", where, s, d->weight[s]);
            bool named = false;
            for (int i = 0; i < d->n_train; i++) named = named || d->train_set[i] == s;
            if (!named)
                return ts_fail("config key 'data.train'%s: dataset %d of the blend names no "
                               "files; give it a path", where, s);
        }
        break;
    }
    case K_PATHS: {
        const ts_data_config *d = &cfg->data;
        if (d->n_val < 0 || d->n_val > TS_MAX_SHARDS)
            return ts_fail("config key 'data.val'%s lists %d paths; at most %d are supported "
                           "(a glob pattern names any number of files)", where, d->n_val,
                           TS_MAX_SHARDS);
        for (int i = 0; i < d->n_val; i++)
            if (d->val[i][0] == '\0')
                return ts_fail("config key 'data.val'%s: entry %d is an empty path (data.val "
                               "= \"\" turns validation off)", where, i);
        break;
    }
    default:
        break;
    }
    if (k->check) return k->check(k, cfg, where);
    return TS_OK;
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
    for (int i = 0; i < ts_config_n_keys; i++)
        if (ts_config_check_value(&ts_config_keys[i], cfg, "") != TS_OK) return TS_ERR;

    const ts_model_config *m = &cfg->model;
    const ts_parallel_config *p = &cfg->parallel;
    const ts_train_config *t = &cfg->train;
    /* "auto" is stored as 0 until ts_config_load resolves it from the ranks launched; a
     * config built in code must give the number. */
    if (p->dp < 1)
        return ts_fail("parallel.dp = %d: give the number of data-parallel replicas (\"auto\" is "
                       "resolved only when a config is loaded for a launch)",
                       p->dp);

    if (t->min_lr > t->lr)
        return ts_fail("train.min_lr = %g must be <= train.lr = %g (the cosine schedule "
                       "decays from lr down to min_lr)",
                       t->min_lr, t->lr);
    /* The wsd keys belong to wsd alone (no key is accepted and ignored), and wsd needs
     * exactly one of them; its decay fits after the warm-up. */
    const bool wsd = strcmp(t->lr_schedule, "wsd") == 0;
    const bool by_steps = t->decay_steps > 0, by_fraction = t->decay_fraction > 0;
    if (!wsd && (by_steps || by_fraction))
        return ts_fail("train.%s is set, but only train.lr_schedule = \"wsd\" has a final "
                       "decay phase (train.lr_schedule = \"%s\"); remove it or use \"wsd\"",
                       by_steps ? "decay_steps" : "decay_fraction", t->lr_schedule);
    if (wsd && by_steps == by_fraction)
        return ts_fail("train.lr_schedule = \"wsd\" needs %s: train.decay_steps (steps of "
                       "the final decay) or train.decay_fraction (that as a fraction of the "
                       "schedule's length)",
                       by_steps ? "one of its decay keys, not both" : "the length of its decay");
    if (wsd) {
        ts_lr_schedule s;
        ts_lr_schedule_of(t, &s);
        if (s.decay > s.length - t->warmup || s.decay < 1)
            return ts_fail("train.lr_schedule = \"wsd\": a final decay of %d steps does not "
                           "fit in the schedule's %d steps after the %d warm-up steps; "
                           "shorten the decay or lengthen train.lr_decay_steps",
                           s.decay, s.length, t->warmup);
    }

    /* All four axes, cp = 1 included, so the message teaches the whole grid. */
    long long grid = (long long)p->pp * p->dp * p->cp * p->tp;
    if (world_size > 0 && grid != world_size)
        return ts_fail("the grid pp*dp*cp*tp = %d*%d*%d*%d = %lld does not match the %d "
                       "ranks launched; launch with mpirun -np %lld or change "
                       "parallel.pp/dp/cp/tp",
                       p->pp, p->dp, p->cp, p->tp, grid, world_size, grid);

    long long unit = (long long)p->dp * p->micro_batch;
    if (t->global_batch % unit != 0 || t->global_batch < unit) return batch_error(cfg);
    if (ts_config_check_batch_rampup(cfg) != TS_OK) return TS_ERR;
    if (ts_config_validate_documents(cfg) != TS_OK) return TS_ERR;

    if (m->head_dim == 0 && m->n_embd % m->n_head != 0)
        return ts_fail("model.n_embd = %d must divide by model.n_head = %d (each head has "
                       "n_embd/n_head channels unless model.head_dim says otherwise); "
                       "change n_embd or n_head",
                       m->n_embd, m->n_head);
    if (m->n_head % p->tp != 0)
        return ts_fail("model.n_head = %d must divide by parallel.tp = %d (each "
                       "tensor-parallel rank holds n_head/tp heads); change n_head or tp",
                       m->n_head, p->tp);
    if (m->n_kv_head < 0 || m->n_kv_head > m->n_head)
        return ts_fail("model.n_kv_head = %d must be between 1 and model.n_head = %d", m->n_kv_head,
                       m->n_head);
    const int kv = ts_model_kv_heads(m), ffn = ts_model_ffn(m);
    if (ts_model_arch(m) == TS_ARCH_GPT2) {
        /* The keys of the other architecture are refused, never ignored. */
        if (kv != m->n_head)
            return ts_fail("model.n_kv_head = %d: grouped-query attention is a llama feature; "
                           "gpt2 has n_kv_head = n_head = %d (remove the key or set "
                           "model.arch = \"llama\")",
                           m->n_kv_head, m->n_head);
        if (m->norm_eps != 1e-5)
            return ts_fail("model.norm_eps = %g: gpt2's LayerNorm uses eps 1e-5 (GPT-2 and "
                           "nanoGPT); remove the key or set model.arch = \"llama\"",
                           m->norm_eps);
        if (m->head_dim != 0 && m->head_dim * m->n_head != m->n_embd)
            return ts_fail("model.head_dim = %d: gpt2's heads have n_embd / n_head = %d / %d "
                           "channels; remove the key or set model.arch = \"llama\"",
                           m->head_dim, m->n_embd, m->n_head);
        if (m->rope_theta != 0.0 || m->rope_scaling != 0.0)
            return ts_fail("model.%s is set, but gpt2 has learned position embeddings, not "
                           "rotary ones; remove it or set model.arch = \"llama\"",
                           m->rope_theta != 0.0 ? "rope_theta" : "rope_scaling");
    } else {
        if (m->rope_theta <= 0.0)
            return ts_fail("model.rope_theta = %g: llama's rotary embeddings need a base > 0 "
                           "(500000 for Llama 3, 10000 for Llama 2)",
                           m->rope_theta);
        if (ts_model_head_dim(m) % 2 != 0)
            return ts_fail("model.%s = %d: rotary embeddings rotate pairs of channels, so the "
                           "head dimension must be even",
                           m->head_dim ? "head_dim" : "n_embd / model.n_head", ts_model_head_dim(m));
        if (m->n_head % kv != 0)
            return ts_fail("model.n_head = %d must divide by model.n_kv_head = %d (each "
                           "key/value head serves n_head/n_kv_head query heads)",
                           m->n_head, kv);
        if (kv % p->tp != 0 && p->tp % kv != 0)
            return ts_fail("model.n_kv_head = %d and parallel.tp = %d: the key/value heads "
                           "split over the tensor-parallel ranks (n_kv_head %% tp == 0) or each "
                           "is replicated on tp/n_kv_head ranks (tp %% n_kv_head == 0); "
                           "change n_kv_head or tp",
                           kv, p->tp);
        if (m->rope_scaling != 0.0 &&
            (m->rope_scaling < 1.0 || m->rope_high_freq_factor <= m->rope_low_freq_factor))
            return ts_fail("model.rope_scaling = %g with rope_low_freq_factor = %g and "
                           "rope_high_freq_factor = %g: Llama 3.1's scaling needs a factor "
                           ">= 1 and high_freq_factor > low_freq_factor (Llama 3.1: 8, 1, 4)",
                           m->rope_scaling, m->rope_low_freq_factor, m->rope_high_freq_factor);
    }
    if (ffn % p->tp != 0)
        return ts_fail("model.ffn_hidden = %d must divide by parallel.tp = %d (each "
                       "tensor-parallel rank holds ffn_hidden/tp MLP columns)",
                       ffn, p->tp);
    /* The tokenizer's own vocabulary is checked against vocab_size when the trainer opens
     * its ranks file (train/setup.c); these relations need no file. */
    if (m->tokenizer_file[0] && !m->tokenizer[0])
        return ts_fail("model.tokenizer_file = \"%s\" is set, but model.tokenizer is not: "
                       "name the encoding of that ranks file (model.tokenizer = \"gpt2\" or "
                       "\"llama3\") or remove tokenizer_file",
                       m->tokenizer_file);
    /* Downstream evaluation reads text: it needs the tokenizer, and a cadence. */
    if (cfg->data.hellaswag[0] && !m->tokenizer[0])
        return ts_fail("data.hellaswag = \"%s\" needs model.tokenizer (\"gpt2\" or \"llama3\"): "
                       "HellaSwag's text is encoded by the model's tokenizer",
                       cfg->data.hellaswag);
    if (cfg->data.hellaswag[0] && cfg->data.eval_every <= 0)
        return ts_fail("data.hellaswag = \"%s\" is scored every data.eval_every steps, and "
                       "data.eval_every = %d: set it > 0",
                       cfg->data.hellaswag, cfg->data.eval_every);
    if (m->tokenizer[0] && m->vocab_size == 256)
        return ts_fail("model.tokenizer = \"%s\" with model.vocab_size = 256: a vocab-256 "
                       "model is byte-level (its ids are bytes); a BPE tokenizer needs "
                       "vocab_size >= its vocabulary (%s; llm.c pads gpt2 to 50304)",
                       m->tokenizer, strcmp(m->tokenizer, "gpt2") == 0 ? "50257" : "128256");
    if (p->sequence_parallel && p->tp < 2)
        return ts_fail("parallel.sequence_parallel = true needs parallel.tp >= 2 (it splits "
                       "the norms' and residuals' rows over the tensor-parallel ranks; "
                       "tp = %d has none to split over); set tp >= 2 or remove the key",
                       p->tp);
    if (p->sequence_parallel && m->seq_len % p->tp != 0)
        return ts_fail("parallel.sequence_parallel = true needs model.seq_len = %d to divide "
                       "by parallel.tp = %d (each tensor-parallel rank holds seq_len/tp "
                       "positions of every sequence's norms and residuals; nothing is "
                       "padded); change seq_len or tp",
                       m->seq_len, p->tp);
    /* Context parallelism (tensor/cp.h): 2*cp chunks of c = seq_len/(2 cp) positions,
     * rank i holding chunks i and 2cp-1-i; nothing is padded. */
    if (p->cp > 1 && m->seq_len % (2 * p->cp) != 0)
        return ts_fail("parallel.cp = %d needs model.seq_len = %d to divide by 2*cp = %d "
                       "(each sequence is cut into 2*cp equal chunks, context-parallel rank "
                       "i holding chunks i and 2cp-1-i; nothing is padded); change seq_len "
                       "or cp",
                       p->cp, m->seq_len, 2 * p->cp);
    if (p->cp > 1 && p->sequence_parallel && (m->seq_len / p->cp) % p->tp != 0)
        return ts_fail("parallel.cp = %d with parallel.sequence_parallel = true needs the "
                       "seq_len/cp = %d positions each context-parallel rank holds to divide "
                       "by parallel.tp = %d; change seq_len, cp or tp",
                       p->cp, m->seq_len / p->cp, p->tp);
    if (p->tp_overlap > 1 && p->tp < 2)
        return ts_fail("parallel.tp_overlap = %d needs parallel.tp >= 2 (it overlaps the "
                       "tensor-parallel collectives, which tp = %d does not have); set tp >= 2 "
                       "or tp_overlap = 1",
                       p->tp_overlap, p->tp);
    if (p->tp_overlap > 1 && p->micro_batch % p->tp_overlap != 0)
        return ts_fail("parallel.tp_overlap = %d needs parallel.micro_batch = %d to divide by "
                       "it (each sub-batch holds micro_batch/tp_overlap whole sequences: "
                       "attention does not split a sequence); change micro_batch or "
                       "tp_overlap",
                       p->tp_overlap, p->micro_batch);
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
    /* The chunks per rank a built-in schedule runs (one, exactly two for the V
     * placement, or any); a CSV schedule says its own (checked when it is read). */
    const int kind = ts_schedule_kind_from_name(p->schedule);
    if (kind >= 0 && ts_schedule_check_virtual_stages((ts_schedule_kind)kind,
                                                      p->virtual_stages) != TS_OK)
        return TS_ERR;

    if (strcmp(cfg->train.attention, "flash") == 0 && strcmp(cfg->train.device, "cuda") != 0)
        return ts_fail("train.attention = \"flash\" runs the CUDA backend's flash-style "
                       "attention kernel, but train.device = \"%s\"; set train.device = "
                       "\"cuda\" or train.attention = \"gemm\"",
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
        return ts_fail("the grid pp*dp*cp*tp = %d*%d*%d*%d = %lld ranks; at most 2^24 are "
                       "supported",
                       p->pp, p->dp, p->cp, p->tp, grid);
    if (ts_config_validate_moe(cfg) != TS_OK) return TS_ERR;
    if (ts_config_validate_mla(cfg) != TS_OK) return TS_ERR;
    if (ts_config_validate_mtp(cfg) != TS_OK) return TS_ERR;
    if (ts_config_validate_muon(cfg) != TS_OK) return TS_ERR;
    if (ts_config_validate_spikes(cfg) != TS_OK) return TS_ERR;
    return check_checkpoint(cfg);
}
