/* Loading a checkpoint into any grid (checkpoint.h): each rank reads, run by run through
 * its parameters' shard specs, exactly the logical slices its place in the new grid
 * holds: its parameters, and the moments of its optimizer ranges. The checksums are
 * verified first, each chunk by one rank. */
#include "checkpoint/checkpoint.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint/layout.h"
#include "checkpoint/reader.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "core/watchdog.h"

long ts_ckpt_newest_step(const char *root)
{
    long *steps;
    const long n = ts_ckpt_list_steps(root, true, &steps);
    const long newest = n > 0 ? steps[0] : -1;
    free(steps);
    return newest;
}

ts_status ts_ckpt_resolve(const char *path, char *step_dir, size_t cap)
{
    char file[TS_PATH_MAX + 32];
    struct stat sb;
    if (stat(path, &sb) != 0) return ts_fail("checkpoint %s: %s", path, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return ts_fail("checkpoint %s is not a directory", path);
    /* A step directory: it has state.json, or at least the model files of one (whose
     * missing state the reader reports as such). */
    bool step = false;
    const char *marks[] = {"state.json", "model.safetensors", "model.safetensors.index.json"};
    for (size_t i = 0; i < sizeof marks / sizeof marks[0] && !step; i++) {
        snprintf(file, sizeof file, "%s/%s", path, marks[i]);
        step = stat(file, &sb) == 0;
    }
    if (step) {
        if (strlen(path) >= cap) return ts_fail("checkpoint path %s is too long", path);
        snprintf(step_dir, cap, "%s", path);
        return TS_OK;
    }
    snprintf(file, sizeof file, "%s/latest", path);
    FILE *f = ts_fopen_input(file); /* cannot block: core/fsutil.h */
    if (f && ts_check_input(fileno(f), file, "checkpoint's", "a 'latest' file of "
                            "one line naming a step directory (or remove it: the newest "
                            "complete step is then used)",
                            4096) != TS_OK) {
        fclose(f);
        return TS_ERR;
    }
    if (!f) {
        /* No `latest` (a save stopped between its rename and `latest`, or it was deleted):
         * the newest complete step directory (only complete ones have state.json). */
        long best = ts_ckpt_newest_step(path);
        if (best < 0)
            return ts_fail("%s holds neither a checkpoint (state.json) nor a 'latest' file "
                           "naming one; give a step directory (step_NNNNNNNN) or a "
                           "checkpoint.dir that has been saved to",
                           path);
        if ((size_t)snprintf(step_dir, cap, "%s/step_%08ld", path, best) >= cap)
            return ts_fail("checkpoint path %s is too long", path);
        return TS_OK;
    }
    char name[TS_PATH_MAX] = {0};
    bool ok = fgets(name, sizeof name, f) != NULL;
    fclose(f);
    size_t n = strlen(name);
    while (n > 0 && (name[n - 1] == '\n' || name[n - 1] == '\r')) name[--n] = '\0';
    bool text = true; /* a binary `latest` is shown as such, not as its bytes */
    for (size_t i = 0; i < n; i++) text = text && isprint((unsigned char)name[i]);
    if (!ok || n == 0 || strchr(name, '/') || name[0] == '.' || !text)
        return ts_fail("%s does not name a checkpoint directory (it holds %s%s%s); it should "
                       "hold one line such as step_00000100",
                       file, text ? "'" : "", text ? name : "binary data", text ? "'" : "");
    if ((size_t)snprintf(step_dir, cap, "%s/%s", path, name) >= cap)
        return ts_fail("checkpoint path %s/%s is too long", path, name);
    if (stat(step_dir, &sb) != 0) {
        /* A save that replaced this very step and stopped between its two renames (on a
         * file system without an atomic exchange) left the complete old one aside. */
        char old[TS_PATH_MAX + 80];
        snprintf(old, sizeof old, "%s/.old-%s", path, name);
        if (stat(old, &sb) == 0 && S_ISDIR(sb.st_mode) && strlen(old) < cap) {
            snprintf(step_dir, cap, "%s", old);
            return TS_OK;
        }
    }
    if (stat(step_dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return ts_fail("%s names %s, which does not exist: the checkpoint was removed; point "
                       "checkpoint.load at another step directory",
                       file, step_dir);
    return TS_OK;
}

ts_status ts_ckpt_read_model_config(const char *step_dir, ts_model_config *mc, int *step)
{
    ts_ckpt_reader r;
    if (ts_ckpt_reader_open(&r, step_dir) != TS_OK) return TS_ERR;
    *mc = r.model;
    if (step) *step = r.step;
    ts_ckpt_reader_close(&r);
    return TS_OK;
}

/* Read this rank's part of parameter P (local elements [lo, hi)) from tensor t into
 * device memory dst of backend k (dst[0] is local element lo), through a host buffer. */
static ts_status read_part(const ts_st_file *f, const ts_st_tensor *t, const ts_param *P,
                           size_t lo, size_t hi, float *dst, const ts_kernels *k)
{
    float *host = ts_alloc_floats(hi - lo ? hi - lo : 1);
    ts_status st = TS_OK;
    ts_shard_run r;
    for (ts_shard_iter it = ts_shard_iter_begin(&P->shard, lo, hi); st == TS_OK && ts_shard_next(&it, &r);)
        st = ts_st_read(f, t, r.logical * sizeof(float), host + (r.local - lo), r.len * sizeof(float));
    if (st == TS_OK) k->memcpy_h2d(dst, host, (hi - lo) * sizeof(float));
    free(host);
    return st;
}

/* A model key's value as a config would give it. */
static void key_value(char *buf, size_t cap, bool flag, double v)
{
    if (flag)
        snprintf(buf, cap, "%s", v != 0 ? "true" : "false");
    else
        snprintf(buf, cap, "%.15g", v);
}

/* The model's keys must match: they define the tensors (the architecture, the sizes,
 * whether the head is tied) and what the model computes with them (the norm's epsilon,
 * the rotary embedding's base and scaling). */
static ts_status check_model(const ts_ckpt_reader *r, const ts_model_config *mc)
{
    const ts_model_config *m = &r->model;
    if (strcmp(m->arch, mc->arch) != 0)
        return ts_fail("checkpoint %s is of a model.arch = \"%s\" model, but the config says "
                       "\"%s\"; a checkpoint loads only into the model it was saved from (set "
                       "model.arch = \"%s\")",
                       r->dir, m->arch, mc->arch, m->arch);
    const bool scaled = m->rope_scaling != 0.0 || mc->rope_scaling != 0.0;
    const bool moe = m->moe_experts > 0 || mc->moe_experts > 0;
    const bool mla = m->kv_lora_rank > 0 || mc->kv_lora_rank > 0;
    const bool yarn = scaled && (!strcmp(m->rope_type, "yarn") || !strcmp(mc->rope_type, "yarn"));
    if (scaled && strcmp(m->rope_type, mc->rope_type) != 0)
        return ts_fail("checkpoint %s was saved with model.rope_type = \"%s\", but the config "
                       "says \"%s\"; a checkpoint loads only into the model it was saved from "
                       "(set model.rope_type = \"%s\")",
                       r->dir, m->rope_type, mc->rope_type, m->rope_type);
    if (moe && strcmp(m->moe_router, mc->moe_router) != 0)
        return ts_fail("checkpoint %s was saved with model.moe_router = \"%s\", but the config "
                       "says \"%s\"; a checkpoint loads only into the model it was saved from "
                       "(set model.moe_router = \"%s\")",
                       r->dir, m->moe_router, mc->moe_router, m->moe_router);
    const struct {
        const char *key;
        double saved, now;
        bool check;
    } keys[] = {
        {"n_layer", m->n_layer, mc->n_layer, true},
        {"n_head", m->n_head, mc->n_head, true},
        {"n_kv_head", ts_model_kv_heads(m), ts_model_kv_heads(mc), true},
        {"n_embd", m->n_embd, mc->n_embd, true},
        {"head_dim", ts_model_head_dim(m), ts_model_head_dim(mc), true},
        {"ffn_hidden", ts_model_ffn(m), ts_model_ffn(mc), true},
        {"vocab_size", m->vocab_size, mc->vocab_size, true},
        {"seq_len", m->seq_len, mc->seq_len, true},
        {"tie_embeddings", ts_model_tied(m), ts_model_tied(mc), true},
        {"qk_norm", m->qk_norm, mc->qk_norm, true},
        {"moe_experts", m->moe_experts, mc->moe_experts, true},
        {"moe_top_k", m->moe_top_k, mc->moe_top_k, moe},
        {"moe_ffn_hidden", m->moe_ffn_hidden, mc->moe_ffn_hidden, moe},
        {"moe_shared_experts", m->moe_shared_experts, mc->moe_shared_experts, moe},
        {"moe_norm_topk", m->moe_norm_topk, mc->moe_norm_topk, moe},
        {"moe_route_scale", m->moe_route_scale, mc->moe_route_scale, moe},
        {"moe_groups", m->moe_groups, mc->moe_groups, moe},
        {"moe_topk_groups", m->moe_topk_groups, mc->moe_topk_groups, moe},
        {"moe_first_dense", m->moe_first_dense, mc->moe_first_dense, moe},
        {"moe_every", m->moe_every, mc->moe_every, moe},
        /* Multi-token prediction's modules are tensors of the files: the same count. */
        {"mtp_layers", m->mtp_layers, mc->mtp_layers, true},
        {"norm_eps", m->norm_eps, mc->norm_eps, true},
        {"rope_theta", m->rope_theta, mc->rope_theta, true},
        {"rope_scaling", m->rope_scaling, mc->rope_scaling, true},
        {"rope_low_freq_factor", m->rope_low_freq_factor, mc->rope_low_freq_factor, scaled},
        {"rope_high_freq_factor", m->rope_high_freq_factor, mc->rope_high_freq_factor, scaled},
        {"rope_original_context", m->rope_original_context, mc->rope_original_context, scaled},
        {"kv_lora_rank", m->kv_lora_rank, mc->kv_lora_rank, true},
        {"q_lora_rank", m->q_lora_rank, mc->q_lora_rank, mla},
        {"qk_nope_head_dim", m->qk_nope_head_dim, mc->qk_nope_head_dim, mla},
        {"qk_rope_head_dim", m->qk_rope_head_dim, mc->qk_rope_head_dim, mla},
        {"v_head_dim", m->v_head_dim, mc->v_head_dim, mla},
        {"rope_beta_fast", m->rope_beta_fast, mc->rope_beta_fast, yarn},
        {"rope_beta_slow", m->rope_beta_slow, mc->rope_beta_slow, yarn},
        {"rope_mscale", m->rope_mscale, mc->rope_mscale, yarn},
        {"rope_mscale_all_dim", m->rope_mscale_all_dim, mc->rope_mscale_all_dim, yarn},
    };
    /* The tokenizer says what the ids mean: the same encoding, and the same ranks (by
     * their sha256: the file may lie elsewhere now). */
    if (strcmp(m->tokenizer, mc->tokenizer) != 0)
        return ts_fail("checkpoint %s was saved with model.tokenizer = \"%s\", but the config "
                       "says \"%s\"; its token ids mean text only by its own tokenizer (set "
                       "model.tokenizer = \"%s\")",
                       r->dir, m->tokenizer, mc->tokenizer, m->tokenizer);
    if (m->tokenizer[0] && strcmp(m->tokenizer_sha256, mc->tokenizer_sha256) != 0)
        return ts_fail("checkpoint %s was saved with model.tokenizer = \"%s\" whose ranks file "
                       "has sha256 %s, but the ranks file this run opened (%s) has sha256 %s: "
                       "another vocabulary; point model.tokenizer_file at the ranks the "
                       "checkpoint was trained with",
                       r->dir, m->tokenizer, m->tokenizer_sha256,
                       mc->tokenizer_file[0] ? mc->tokenizer_file : "the default path",
                       mc->tokenizer_sha256);
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        if (!keys[i].check || keys[i].saved == keys[i].now) continue;
        const bool flag = !strcmp(keys[i].key, "tie_embeddings") ||
                          !strcmp(keys[i].key, "qk_norm") || !strcmp(keys[i].key, "moe_norm_topk");
        char saved[40], now[40];
        key_value(saved, sizeof saved, flag, keys[i].saved);
        key_value(now, sizeof now, flag, keys[i].now);
        return ts_fail("checkpoint %s was saved with model.%s = %s, but the config says %s; "
                       "a checkpoint loads only into the model it was saved from (set "
                       "model.%s = %s)",
                       r->dir, keys[i].key, saved, now, keys[i].key, saved);
    }
    return TS_OK;
}

/* Every parameter m holds, from the reader (every kind checked present first). */
static ts_status read_weights(ts_ckpt_reader *r, ts_model *m)
{
    for (int p = 0; p < m->n_params; p++) {
        const ts_param *P = &m->params[p];
        const ts_st_tensor *t;
        int f;
        if (ts_ckpt_reader_expect(r, P->shard.name, P->shard.ndim, P->shard.shape, &t, &f) != TS_OK ||
            read_part(&r->files[f].st, t, P, 0, P->numel, ts_param_data(m, p), m->k) != TS_OK)
            return TS_ERR;
        ts_watchdog_progress();
    }
    return TS_OK;
}

ts_status ts_ckpt_load_weights(ts_model *m, const char *step_dir)
{
    ts_ckpt_reader r;
    if (ts_ckpt_reader_open(&r, step_dir) != TS_OK) return TS_ERR;
    ts_model_config mc = r.model;
    mc.n_layer = m->n_layer;
    mc.n_head = m->n_head;
    mc.n_embd = m->n_embd;
    mc.vocab_size = m->vocab_size;
    mc.seq_len = m->max_seq_len;
    ts_status st = check_model(&r, &mc);
    /* The model files' tensors, checked whole (one process reads them all anyway). */
    if (st == TS_OK) st = ts_ckpt_reader_check_files(&r);
    void *buf = ts_malloc((size_t)r.chunk_bytes);
    for (int p = 0; st == TS_OK && p < m->n_params; p++) {
        const ts_param *P = &m->params[p];
        const ts_st_tensor *t;
        st = ts_ckpt_reader_expect(&r, P->shard.name, P->shard.ndim, P->shard.shape, &t, NULL);
        if (st == TS_OK) st = ts_ckpt_reader_verify(&r, P->shard.name, 0, SIZE_MAX, buf);
    }
    free(buf);
    if (st == TS_OK) st = read_weights(&r, m);
    ts_ckpt_reader_close(&r);
    return st;
}

/* Every chunk of every tensor is checked by one rank: the chunks in layout order, cut
 * into world-size runs of about equal bytes. */
static ts_status verify_share(ts_ckpt_reader *r, const ts_ckpt_layout *L, const ts_comm *world)
{
    uint64_t total = 0;
    for (int e = 0; e < L->n_entries; e++) total += L->entries[e].bytes;
    void *buf = ts_malloc((size_t)r->chunk_bytes);
    uint64_t at = 0;
    ts_status st = TS_OK;
    for (int e = 0; e < L->n_entries && st == TS_OK; e++) {
        const uint64_t bytes = L->entries[e].bytes; /* 0 for an absent one: no chunk */
        const size_t n_chunks = (size_t)((bytes + r->chunk_bytes - 1) / r->chunk_bytes);
        for (size_t c = 0; c < n_chunks && st == TS_OK; c++) {
            const uint64_t len = bytes - c * r->chunk_bytes < r->chunk_bytes ? bytes - c * r->chunk_bytes
                                                                          : r->chunk_bytes;
            const int owner = (int)((long double)(at + len / 2) * world->size / total);
            at += len;
            if (owner == world->rank) {
                st = ts_ckpt_reader_verify(r, L->entries[e].name, c, c + 1, buf);
                ts_watchdog_progress(); /* a long verification is progress, not a hang */
            }
        }
    }
    free(buf);
    return st;
}

/* The moments of the optimizer's ranges: for every parameter part inside a range, its
 * exp_avg and exp_avg_sq runs. Parts left to Muon (o->excluded) have none (their moments
 * are compact then: optim.h); after an optimizer change (`switched`,
 * train.allow_optimizer_change) a part whose tensor the checkpoint L kept Muon's momentum
 * for instead keeps its zero moments. (Without one the run's Muon matrices are the
 * checkpoint's: no tensor is looked up.) */
static ts_status read_moments(ts_ckpt_reader *r, const ts_ckpt_layout *L, const ts_model *m,
                              ts_adamw *o, bool switched)
{
    char name[TS_CKPT_NAME_MAX];
    size_t base = 0, packed = 0;
    for (int k = 0; k < o->n_ranges; k++) {
        const ts_flat_range R = o->ranges[k];
        for (int p = 0; p < m->n_params; p++) {
            const ts_param *P = &m->params[p];
            if (R.end <= P->offset || R.begin >= P->offset + P->numel) continue;
            const size_t lo = R.begin > P->offset ? R.begin - P->offset : 0;
            const size_t hi = R.end < P->offset + P->numel ? R.end - P->offset : P->numel;
            if (o->excluded && o->excluded[p]) continue;
            const size_t mom = o->excluded ? packed : base + (P->offset + lo - R.begin);
            packed += hi - lo;
            if (switched) {
                const int logical = ts_ckpt_layout_find(L, P->shard.name);
                if (logical >= 0 && L->muon[logical]) continue; /* none saved: zero */
            }
            for (int kind = 0; kind < 2; kind++) {
                snprintf(name, sizeof name, "%s%s", kind ? "exp_avg_sq." : "exp_avg.", P->shard.name);
                const ts_st_tensor *t;
                int f;
                if (ts_ckpt_reader_expect(r, name, P->shard.ndim, P->shard.shape, &t, &f) != TS_OK ||
                    read_part(&r->files[f].st, t, P, lo, hi, (kind ? o->v : o->m) + mom, m->k) != TS_OK)
                    return TS_ERR;
            }
        }
        base += R.end - R.begin;
    }
    return TS_OK;
}

/* Muon's momentum of the matrices this rank owns, each whole (its local part); after an
 * optimizer change (`switched`) from an AdamW checkpoint L, which kept none, it stays
 * zero. */
static ts_status read_momentum(ts_ckpt_reader *r, const ts_ckpt_layout *L, const ts_model *m,
                               ts_muon *mu, bool switched)
{
    char name[TS_CKPT_NAME_MAX];
    for (int i = 0; mu && i < mu->n; i++) {
        const ts_param *P = &m->params[mu->param[i]];
        if (switched) {
            const int logical = ts_ckpt_layout_find(L, P->shard.name);
            if (logical < 0 || !L->muon[logical]) continue;
        }
        snprintf(name, sizeof name, "momentum_buffer.%s", P->shard.name);
        const ts_st_tensor *t;
        int f;
        if (ts_ckpt_reader_expect(r, name, P->shard.ndim, P->shard.shape, &t, &f) != TS_OK ||
            read_part(&r->files[f].st, t, P, 0, P->numel, mu->momentum + mu->offset[i], m->k) !=
                TS_OK)
            return TS_ERR;
        ts_watchdog_progress();
    }
    return TS_OK;
}

/* A run resumes with the optimizer its checkpoint ran, whose state the files hold; another
 * only with train.allow_optimizer_change, and then the state the checkpoint lacks starts
 * at zero (read_moments, read_momentum). */
static ts_status check_optimizer(const ts_ckpt_reader *r, const ts_config *cfg, bool *changed)
{
    const char *now = ts_config_muon(&cfg->train) ? "muon" : "adamw";
    *changed = strcmp(r->optimizer, now) != 0;
    if (!*changed || cfg->train.allow_optimizer_change) return TS_OK;
    return ts_fail("checkpoint %s was saved by a train.optimizer = \"%s\" run, but this run "
                   "has \"%s\": the checkpoint holds %s state, not %s's; keep "
                   "train.optimizer = \"%s\", or set train.allow_optimizer_change = true to "
                   "switch (the state the checkpoint lacks then starts at zero)",
                   r->dir, r->optimizer, now,
                   strcmp(r->optimizer, "muon") == 0 ? "Muon's momentum for the block matrices"
                                                     : "AdamW's moments for every tensor",
                   now, r->optimizer);
}

/* The MoE balancing bias state.json keeps (save.c), bit for bit, into the model; none
 * there (a run without MoE bias updates kept zeros): the model's zeros stay. */
static ts_status read_moe_bias(const ts_ckpt_reader *r, ts_model *m)
{
    const int E = m->moe_experts;
    json_t *mb = json_object_get(r->state, "moe_bias");
    if (E == 0 || !mb) return TS_OK;
    const size_t n = (size_t)ts_model_blocks(m) * E; /* MTP's blocks too (model.h) */
    json_t *bits = json_object_get(mb, "bits");
    if (json_integer_value(json_object_get(mb, "experts")) != E || !json_is_array(bits) ||
        json_array_size(bits) != n)
        return ts_fail("checkpoint %s: state.json's moe_bias is not %zu fp32 bit patterns "
                       "((model.n_layer + model.mtp_layers) * model.moe_experts = %d * %d)",
                       r->dir, n, ts_model_blocks(m), E);
    float *host = ts_malloc(n * sizeof(float));
    ts_status st = TS_OK;
    for (size_t i = 0; i < n && st == TS_OK; i++) {
        json_t *v = json_array_get(bits, i);
        const json_int_t u = json_is_integer(v) ? json_integer_value(v) : -1;
        const uint32_t u32 = (uint32_t)u;
        memcpy(&host[i], &u32, sizeof u32);
        if (u < 0 || u > 0xffffffffLL || !isfinite(host[i]))
            st = ts_fail("checkpoint %s: state.json's moe_bias element %zu is not a finite "
                         "fp32 bit pattern",
                         r->dir, i);
    }
    if (st == TS_OK) m->k->memcpy_h2d(m->moe_bias, host, n * sizeof(float));
    free(host);
    return st;
}

ts_status ts_ckpt_load(const ts_ckpt_load_args *a, const char *step_dir, int *step)
{
    const ts_comm *world = a->world;
    ts_watchdog_context("checkpoint: opening the checkpoint to load", 0, 0, 0);
    ts_ckpt_reader r;
    ts_status st = ts_ckpt_reader_open(&r, step_dir);
    bool opened = st == TS_OK;
    ts_ckpt_layout L;
    bool changed = false;
    if (opened) {
        st = check_model(&r, &a->cfg->model);
        if (st == TS_OK) st = check_optimizer(&r, a->cfg, &changed);
        if (st == TS_OK && r.global_batch != a->cfg->train.global_batch)
            st = ts_fail("checkpoint %s was saved with train.global_batch = %lld, but the config "
                         "says %d; the data position is counted in global batches (the batch "
                         "rule), so resuming needs the same global_batch (parallel.micro_batch "
                         "and the grid may change)",
                         step_dir, r.global_batch, a->cfg->train.global_batch);
        /* The checkpoint's files: its own optimizer's state tensors. */
        ts_ckpt_layout_build(&L, &a->cfg->model, a->cfg->checkpoint.file_gb,
                             !strcmp(r.optimizer, "muon"));
        /* Every tensor present with its shape, then the files' sizes and headers: the
         * same verdict on every rank (each reads the headers itself). */
        for (int e = 0; st == TS_OK && e < L.n_entries; e++) {
            if (!ts_ckpt_entry_stored(&L.entries[e])) continue; /* Muon: no exp_avg_sq */
            const ts_shard_spec *s = &L.logical[L.entries[e].logical];
            const ts_st_tensor *t;
            st = ts_ckpt_reader_expect(&r, L.entries[e].name, s->ndim, s->shape, &t, NULL);
        }
        if (st == TS_OK) st = ts_ckpt_reader_check_files(&r);
    }
    if ((st = ts_comm_agree(world, st)) != TS_OK) goto done;

    ts_watchdog_context("checkpoint: verifying this rank's share of the checksums", 0, 0, 0);
    if ((st = ts_comm_agree(world, verify_share(&r, &L, world))) != TS_OK) goto done;

    ts_watchdog_context("checkpoint: reading this rank's parameters and moments", 0, 0, 0);
    st = read_weights(&r, a->model);
    if (st == TS_OK) st = read_moments(&r, &L, a->model, a->optim, changed);
    if (st == TS_OK) st = read_momentum(&r, &L, a->model, a->muon, changed);
    if (st == TS_OK) st = read_moe_bias(&r, a->model);
    if ((st = ts_comm_agree(world, st)) == TS_OK) *step = r.step;
    if (st == TS_OK && changed && world->rank == 0)
        ts_log_warn("checkpoint: train.optimizer changes on resuming (train."
                    "allow_optimizer_change): was \"%s\", now \"%s\"; the state %s lacks "
                    "starts at zero",
                    r.optimizer, ts_config_muon(&a->cfg->train) ? "muon" : "adamw", step_dir);
done:
    if (st != TS_OK) ts_error_prefix("checkpoint.load: ");
    if (opened) {
        ts_ckpt_layout_free(&L);
        ts_ckpt_reader_close(&r);
    }
    return st;
}
