/* The configuration's keys: every key's default (ts_config_defaults), the one table
 * of known keys (section, name, type, field, range, per-key check) that loading and
 * validation walk, and the effective config as JSON (ts_config_to_json). */
#include "config/config_internal.h"
#include "config/pipeline_names.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


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
    m->n_kv_head = 0; /* = n_head */
    m->head_dim = 0;  /* = n_embd / n_head */
    m->ffn_hidden = 0; /* the architecture's */
    m->norm_eps = 1e-5;
    m->tie_embeddings = 0; /* the architecture's: ts_model_tied */
    m->rope_theta = 0.0; /* gpt2: no rotary embedding */
    m->rope_scaling = 0.0;
    m->rope_low_freq_factor = 1.0;
    m->rope_high_freq_factor = 4.0;
    m->rope_original_context = 8192;
    m->moe_experts = 0; /* dense */
    m->moe_top_k = 2;
    m->moe_ffn_hidden = 0; /* required with experts */
    m->moe_shared_experts = 0;
    copy_str(m->moe_router, sizeof m->moe_router, "softmax");
    m->moe_norm_topk = true;
    m->moe_route_scale = 1.0;
    m->moe_groups = 1;
    m->moe_topk_groups = 1;
    m->moe_first_dense = 0;
    m->moe_every = 1;
    m->moe_capacity = 0.0; /* dropless */
    m->qk_norm = false;
    m->q_lora_rank = m->kv_lora_rank = 0; /* no MLA */
    m->qk_nope_head_dim = m->qk_rope_head_dim = m->v_head_dim = 0;
    copy_str(m->rope_type, sizeof m->rope_type, "llama3");
    m->rope_beta_fast = 32.0; /* transformers' YaRN defaults */
    m->rope_beta_slow = 1.0;
    m->rope_mscale = 1.0;
    m->rope_mscale_all_dim = 0.0;
    m->mtp_layers = 0;

    ts_parallel_config *p = &cfg->parallel;
    p->pp = p->dp = p->tp = p->cp = 1;
    p->virtual_stages = 1;
    copy_str(p->schedule, sizeof p->schedule, ts_schedule_names[TS_SCHEDULE_1F1B]);
    p->micro_batch = 2;
    p->n_partition = 0; /* "balanced" */
    copy_str(p->recompute, sizeof p->recompute, ts_recompute_names[TS_RECOMPUTE_NONE]);
    p->tp_overlap = 1;
    copy_str(p->order, sizeof p->order, "tp-dp-pp");
    p->overlap_grad_sync = true;
    copy_str(p->grad_sync_progress, sizeof p->grad_sync_progress, "poll");
    p->zero = 0;
    p->bucket_mb = 4;
    p->memory_budget_mb = 0; /* what the machine offers */
    copy_str(p->comm, sizeof p->comm, "auto");
    p->ep = p->etp = 1;
    p->ep_overlap = true;

    ts_train_config *t = &cfg->train;
    t->global_batch = 16;
    t->steps = 100;
    t->batch_rampup[0] = '\0'; /* off */
    t->seed = 1234;
    t->lr = 6e-4;
    t->min_lr = 6e-5;
    t->warmup = 10;
    copy_str(t->lr_schedule, sizeof t->lr_schedule, "cosine");
    t->lr_decay_steps = 0;
    t->decay_steps = 0;
    t->decay_fraction = 0.0;
    t->allow_schedule_change = false;
    t->weight_decay = 0.1;
    t->beta1 = 0.9;
    t->beta2 = 0.95;
    t->eps = 1e-8;
    t->grad_clip = 1.0;
    t->threads = 0;
    t->timeout_s = 600;
    copy_str(t->on_nonfinite, sizeof t->on_nonfinite, "stop");
    t->skip_spikes = 0.0;
    t->spike_window = 128; /* llm.c's OUTLIER_DETECTOR_WINDOW_SIZE */
    copy_str(t->device, sizeof t->device, "cpu");
    copy_str(t->precision, sizeof t->precision, "fp32");
    copy_str(t->attention, sizeof t->attention, "gemm");
    t->moe_aux_loss = t->moe_z_loss = t->moe_bias_rate = 0.0;
    t->mtp_loss = 0.1; /* Megatron's mtp_loss_scaling_factor */
    copy_str(t->optimizer, sizeof t->optimizer, "adamw");
    t->muon_momentum = 0.95;
    t->muon_nesterov = true;
    t->muon_ns_steps = 0; /* the coefficient set's own count */
    copy_str(t->muon_coefficients, sizeof t->muon_coefficients, "torch");
    copy_str(t->muon_scale, sizeof t->muon_scale, "match_rms_adamw");
    t->allow_optimizer_change = false;

    ts_data_config *d = &cfg->data;
    d->n_train = 1;
    copy_str(d->train[0], sizeof d->train[0], "data/train.bin");
    d->n_sets = 1;
    d->weight[0] = 1.0;
    d->eval_every = 0;
    d->val_windows = 16;
    d->shuffle = true;
    d->document_mask = false;
    d->document_token = -1;
    d->seed = t->seed; /* ts_config_load sets it to train.seed unless data.seed is given */

    cfg->checkpoint.every = 0;
    cfg->checkpoint.keep = 2;
    cfg->checkpoint.file_gb = 5.0;

    copy_str(cfg->log.metrics, sizeof cfg->log.metrics, "metrics.jsonl");
    cfg->log.progress = true;
    cfg->log.straggler_threshold = 0.7; /* NVRx's default relative-performance threshold */
}

void ts_config_arch_defaults(ts_model_config *m, const char *arch)
{
    if (strcmp(arch, "llama") != 0) return;
    m->rope_theta = 500000.0;
    m->norm_eps = 1e-5;
}

void ts_config_resolve_model(ts_model_config *m)
{
    m->n_kv_head = ts_model_kv_heads(m);
    m->ffn_hidden = ts_model_ffn(m);
    m->tie_embeddings = ts_model_tied(m) ? 1 : -1;
}

/* ------------------------------------------------------------ the key table -- */

#define OFF(field) offsetof(ts_config, field)
#define FIELD_SIZE(field) sizeof(((ts_config *)0)->field)
#define INT_KEY(sec, key, field, lo, hi)                                               \
    { sec, key, K_INT, OFF(field), 0, lo, hi, false, false, NULL }
#define FLOAT_KEY(sec, key, field, lo, lo_open, hi, hi_open)                           \
    { sec, key, K_FLOAT, OFF(field), 0, lo, hi, lo_open, hi_open, NULL }
#define STR_KEY(sec, key, field, check)                                                \
    { sec, key, K_STR, OFF(field), FIELD_SIZE(field), 0, 0, false, false, check }
#define BOOL_KEY(sec, key, field) { sec, key, K_BOOL, OFF(field), 0, 0, 0, false, false, NULL }

const key_spec ts_config_keys[] = {
    STR_KEY("model", "arch", model.arch, ts_config_check_arch),
    INT_KEY("model", "n_layer", model.n_layer, 1, 1 << 16),
    INT_KEY("model", "n_head", model.n_head, 1, 1 << 16),
    INT_KEY("model", "n_embd", model.n_embd, 1, 1 << 20),
    INT_KEY("model", "vocab_size", model.vocab_size, 2, (double)(1 << 24)),
    INT_KEY("model", "seq_len", model.seq_len, 1, 1 << 20),
    INT_KEY("model", "n_kv_head", model.n_kv_head, 0, 1 << 16),
    INT_KEY("model", "head_dim", model.head_dim, 0, 1 << 16),
    INT_KEY("model", "ffn_hidden", model.ffn_hidden, 0, 1 << 24),
    FLOAT_KEY("model", "norm_eps", model.norm_eps, 0, true, 1, false),
    { "model", "tie_embeddings", K_TRIBOOL, OFF(model.tie_embeddings), 0, 0, 0, false, false,
      NULL },
    FLOAT_KEY("model", "rope_theta", model.rope_theta, 0, false, 1e12, false),
    FLOAT_KEY("model", "rope_scaling", model.rope_scaling, 0, false, 1e6, false),
    FLOAT_KEY("model", "rope_low_freq_factor", model.rope_low_freq_factor, 0, true, 1e6, false),
    FLOAT_KEY("model", "rope_high_freq_factor", model.rope_high_freq_factor, 0, true, 1e6,
              false),
    INT_KEY("model", "rope_original_context", model.rope_original_context, 1, 1 << 24),
    STR_KEY("model", "init", model.init, NULL),
    BOOL_KEY("model", "init_upcycle", model.init_upcycle),
    STR_KEY("model", "tokenizer", model.tokenizer, ts_config_check_tokenizer),
    STR_KEY("model", "tokenizer_file", model.tokenizer_file, NULL),
    INT_KEY("model", "moe_experts", model.moe_experts, 0, 1 << 16),
    INT_KEY("model", "moe_top_k", model.moe_top_k, 1, 1 << 16),
    INT_KEY("model", "moe_ffn_hidden", model.moe_ffn_hidden, 0, 1 << 24),
    INT_KEY("model", "moe_shared_experts", model.moe_shared_experts, 0, 1 << 10),
    STR_KEY("model", "moe_router", model.moe_router, ts_config_check_moe_router),
    BOOL_KEY("model", "moe_norm_topk", model.moe_norm_topk),
    FLOAT_KEY("model", "moe_route_scale", model.moe_route_scale, 0, true, 1e6, false),
    INT_KEY("model", "moe_groups", model.moe_groups, 1, 1 << 16),
    INT_KEY("model", "moe_topk_groups", model.moe_topk_groups, 1, 1 << 16),
    INT_KEY("model", "moe_first_dense", model.moe_first_dense, 0, 1 << 16),
    INT_KEY("model", "moe_every", model.moe_every, 1, 1 << 16),
    FLOAT_KEY("model", "moe_capacity", model.moe_capacity, 0, false, 1e6, false),
    BOOL_KEY("model", "qk_norm", model.qk_norm),
    INT_KEY("model", "q_lora_rank", model.q_lora_rank, 0, 1 << 20),
    INT_KEY("model", "kv_lora_rank", model.kv_lora_rank, 0, 1 << 20),
    INT_KEY("model", "qk_nope_head_dim", model.qk_nope_head_dim, 0, 1 << 16),
    INT_KEY("model", "qk_rope_head_dim", model.qk_rope_head_dim, 0, 1 << 16),
    INT_KEY("model", "v_head_dim", model.v_head_dim, 0, 1 << 16),
    STR_KEY("model", "rope_type", model.rope_type, ts_config_check_rope_type),
    FLOAT_KEY("model", "rope_beta_fast", model.rope_beta_fast, 0, true, 1e6, false),
    FLOAT_KEY("model", "rope_beta_slow", model.rope_beta_slow, 0, true, 1e6, false),
    FLOAT_KEY("model", "rope_mscale", model.rope_mscale, 0, false, 1e6, false),
    FLOAT_KEY("model", "rope_mscale_all_dim", model.rope_mscale_all_dim, 0, false, 1e6, false),
    INT_KEY("model", "mtp_layers", model.mtp_layers, 0, 64),

    INT_KEY("parallel", "pp", parallel.pp, 1, 1 << 16),
    /* "auto": what pp * tp leave of the ranks launched (ts_config_load resolves it). */
    { "parallel", "dp", K_INT, OFF(parallel.dp), 0, 1, 1 << 20, false, false,
      ts_config_allow_auto },
    INT_KEY("parallel", "tp", parallel.tp, 1, 1 << 16),
    INT_KEY("parallel", "cp", parallel.cp, 1, 1 << 16),
    BOOL_KEY("parallel", "sequence_parallel", parallel.sequence_parallel),
    INT_KEY("parallel", "tp_overlap", parallel.tp_overlap, 1, 8),
    INT_KEY("parallel", "virtual_stages", parallel.virtual_stages, 1, TS_MAX_CHUNKS),
    STR_KEY("parallel", "schedule", parallel.schedule, ts_config_check_schedule),
    INT_KEY("parallel", "micro_batch", parallel.micro_batch, 1, 1 << 20),
    { "parallel", "partition", K_PARTITION, OFF(parallel), 0, 0, 0, false, false, NULL },
    STR_KEY("parallel", "recompute", parallel.recompute, ts_config_check_recompute),
    INT_KEY("parallel", "memory_budget_mb", parallel.memory_budget_mb, 0, BIG),
    STR_KEY("parallel", "order", parallel.order, ts_config_check_order),
    BOOL_KEY("parallel", "overlap_grad_sync", parallel.overlap_grad_sync),
    STR_KEY("parallel", "grad_sync_progress", parallel.grad_sync_progress,
            ts_config_check_progress),
    INT_KEY("parallel", "zero", parallel.zero, 0, 3),
    INT_KEY("parallel", "bucket_mb", parallel.bucket_mb, 1, 4096),
    STR_KEY("parallel", "comm", parallel.comm, ts_config_check_comm),
    INT_KEY("parallel", "ep", parallel.ep, 1, 1 << 16),
    INT_KEY("parallel", "etp", parallel.etp, 1, 1 << 16),
    BOOL_KEY("parallel", "ep_overlap", parallel.ep_overlap),

    INT_KEY("train", "global_batch", train.global_batch, 1, BIG),
    STR_KEY("train", "batch_rampup", train.batch_rampup, NULL),
    INT_KEY("train", "steps", train.steps, 0, BIG),
    { "train", "seed", K_INT64, OFF(train.seed), 0, 0, 0, false, false, NULL },
    FLOAT_KEY("train", "lr", train.lr, 0, true, INFINITY, false),
    FLOAT_KEY("train", "min_lr", train.min_lr, 0, false, INFINITY, false),
    INT_KEY("train", "warmup", train.warmup, 0, BIG),
    STR_KEY("train", "lr_schedule", train.lr_schedule, ts_config_check_lr_schedule),
    INT_KEY("train", "lr_decay_steps", train.lr_decay_steps, 0, BIG),
    INT_KEY("train", "decay_steps", train.decay_steps, 0, BIG),
    FLOAT_KEY("train", "decay_fraction", train.decay_fraction, 0, false, 1, false),
    BOOL_KEY("train", "allow_schedule_change", train.allow_schedule_change),
    FLOAT_KEY("train", "weight_decay", train.weight_decay, 0, false, INFINITY, false),
    FLOAT_KEY("train", "beta1", train.beta1, 0, false, 1, true),
    FLOAT_KEY("train", "beta2", train.beta2, 0, false, 1, true),
    FLOAT_KEY("train", "eps", train.eps, 0, true, INFINITY, false),
    FLOAT_KEY("train", "grad_clip", train.grad_clip, 0, false, INFINITY, false),
    INT_KEY("train", "threads", train.threads, 0, 4096),
    INT_KEY("train", "timeout_s", train.timeout_s, 0, 7 * 24 * 3600),
    STR_KEY("train", "device", train.device, ts_config_check_device),
    STR_KEY("train", "precision", train.precision, ts_config_check_precision),
    STR_KEY("train", "attention", train.attention, ts_config_check_attention),
    STR_KEY("train", "on_nonfinite", train.on_nonfinite, ts_config_check_on_nonfinite),
    FLOAT_KEY("train", "skip_spikes", train.skip_spikes, 0, false, 1e6, false),
    INT_KEY("train", "spike_window", train.spike_window, 2, 1 << 14),
    FLOAT_KEY("train", "moe_aux_loss", train.moe_aux_loss, 0, false, 1e6, false),
    FLOAT_KEY("train", "moe_z_loss", train.moe_z_loss, 0, false, 1e6, false),
    FLOAT_KEY("train", "moe_bias_rate", train.moe_bias_rate, 0, false, 1e6, false),
    FLOAT_KEY("train", "mtp_loss", train.mtp_loss, 0, false, 1e6, false),
    STR_KEY("train", "optimizer", train.optimizer, ts_config_check_optimizer),
    FLOAT_KEY("train", "muon_momentum", train.muon_momentum, 0, false, 1, true),
    BOOL_KEY("train", "muon_nesterov", train.muon_nesterov),
    INT_KEY("train", "muon_ns_steps", train.muon_ns_steps, 0, 99),
    STR_KEY("train", "muon_coefficients", train.muon_coefficients,
            ts_config_check_muon_coefficients),
    STR_KEY("train", "muon_scale", train.muon_scale, ts_config_check_muon_scale),
    BOOL_KEY("train", "allow_optimizer_change", train.allow_optimizer_change),

    { "data", "train", K_SHARDS, OFF(data), 0, 0, 0, false, false, NULL },
    { "data", "val", K_PATHS, OFF(data), 0, 0, 0, false, false, NULL },
    INT_KEY("data", "eval_every", data.eval_every, 0, BIG),
    STR_KEY("data", "hellaswag", data.hellaswag, NULL),
    INT_KEY("data", "hellaswag_items", data.hellaswag_items, 0, BIG),
    INT_KEY("data", "val_windows", data.val_windows, 1, 1 << 20),
    BOOL_KEY("data", "shuffle", data.shuffle),
    BOOL_KEY("data", "document_mask", data.document_mask),
    INT_KEY("data", "document_token", data.document_token, -1, BIG),
    { "data", "seed", K_INT64, OFF(data.seed), 0, 0, 0, false, false, NULL },

    STR_KEY("checkpoint", "dir", checkpoint.dir, NULL),
    INT_KEY("checkpoint", "every", checkpoint.every, 0, BIG),
    INT_KEY("checkpoint", "keep", checkpoint.keep, 1, BIG),
    STR_KEY("checkpoint", "load", checkpoint.load, NULL),
    FLOAT_KEY("checkpoint", "file_gb", checkpoint.file_gb, 0, true, 1e6, false),
    BOOL_KEY("checkpoint", "async", checkpoint.async),
    BOOL_KEY("checkpoint", "overwrite", checkpoint.overwrite),

    STR_KEY("log", "metrics", log.metrics, NULL),
    STR_KEY("log", "trace", log.trace, NULL),
    BOOL_KEY("log", "progress", log.progress),
    INT_KEY("log", "moe_every", log.moe_every, 0, BIG),
    STR_KEY("log", "tensorboard", log.tensorboard, NULL),
    INT_KEY("log", "straggler_every", log.straggler_every, 0, BIG),
    FLOAT_KEY("log", "straggler_threshold", log.straggler_threshold, 0, true, 1, false),
};
const int ts_config_n_keys = (int)(sizeof ts_config_keys / sizeof ts_config_keys[0]);

const char *const ts_config_sections[] = {
    "model", "parallel", "train", "data", "checkpoint", "log",
};
const int ts_config_n_sections =
    (int)(sizeof ts_config_sections / sizeof ts_config_sections[0]);

/* ------------------------------------------------------------------- JSON -- */

static json_t *key_json(const key_spec *k, const ts_config *cfg)
{
    const void *v = cfield_ptr(cfg, k);
    switch (k->kind) {
    case K_INT: return json_integer(*(const int *)v);
    case K_INT64: return json_integer((json_int_t) * (const int64_t *)v);
    case K_FLOAT: return json_real(*(const double *)v);
    case K_BOOL: return json_boolean(*(const bool *)v);
    case K_TRIBOOL: return json_boolean(ts_model_tied(&cfg->model)); /* its one key */
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
        if (!d->blend) {
            for (int i = 0; i < d->n_train; i++) json_array_append_new(a, json_string(d->train[i]));
            return a;
        }
        for (int s = 0; s < d->n_sets; s++) { /* as written: [{"path": [...], "weight": w}] */
            json_t *paths = json_array();
            for (int i = 0; i < d->n_train; i++)
                if (d->train_set[i] == s) json_array_append_new(paths, json_string(d->train[i]));
            json_array_append_new(a, json_pack("{s:o, s:f}", "path", paths, "weight", d->weight[s]));
        }
        return a;
    }
    case K_PATHS: {
        const ts_data_config *d = &cfg->data;
        if (d->n_val == 0) return json_string(""); /* no validation, as before lists */
        if (d->n_val == 1) return json_string(d->val[0]);
        json_t *a = json_array();
        for (int i = 0; i < d->n_val; i++) json_array_append_new(a, json_string(d->val[i]));
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
    for (int i = 0; i < ts_config_n_keys && same; i++) {
        const key_spec *k = &ts_config_keys[i];
        if (k->kind != K_FLOAT) continue;
        json_t *v = json_object_get(json_object_get(j, k->section), k->name);
        same = json_number_value(v) == *(const double *)cfield_ptr(cfg, k);
    }
    json_decref(j);
    return same;
}

char *ts_config_to_json(const ts_config *cfg)
{
    json_t *root = json_object();
    for (int s = 0; s < ts_config_n_sections; s++) {
        json_t *sec = json_object();
        for (int i = 0; i < ts_config_n_keys; i++)
            if (strcmp(ts_config_keys[i].section, ts_config_sections[s]) == 0)
                json_object_set_new(sec, ts_config_keys[i].name,
                                    key_json(&ts_config_keys[i], cfg));
        json_object_set_new(root, ts_config_sections[s], sec);
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
