/* Reading a checkpoint directory (reader.h). */
#include "checkpoint/reader.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "checkpoint/layout.h"
#include "core/fsutil.h"

static ts_status fail_as(ts_ckpt_reader *r, ts_ckpt_verdict v)
{
    r->verdict = v;
    return TS_ERR;
}

static bool get_int(json_t *obj, const char *key, long long lo, long long hi, long long *out)
{
    json_t *v = json_object_get(obj, key);
    if (!json_is_integer(v)) return false;
    long long x = (long long)json_integer_value(v);
    if (x < lo || x > hi) return false;
    *out = x;
    return true;
}

uint32_t ts_ckpt_state_crc(const json_t *state)
{
    json_t *copy = json_deep_copy(state);
    TS_ASSERT(copy != NULL);
    json_object_del(copy, "state_crc32");
    char *text = json_dumps(copy, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    TS_ASSERT(text != NULL);
    uint32_t crc = (uint32_t)crc32(0L, (const Bytef *)text, (uInt)strlen(text));
    free(text);
    json_decref(copy);
    return crc;
}

/* The config's model keys and the rest of the state the reader needs. */
/* The learning-rate schedule state.json records ("lr_schedule"); a checkpoint older
 * than the record ran the cosine over its config's train.steps, which its config's
 * train keys give. */
static ts_status parse_lr_schedule(ts_ckpt_reader *r, json_t *s, const char *path)
{
    json_t *o = json_object_get(s, "lr_schedule");
    ts_lr_schedule *q = &r->lr_schedule;
    if (!o) {
        json_t *t = json_object_get(json_object_get(s, "config"), "train");
        ts_config d;
        ts_config_defaults(&d);
        long long steps, warmup;
        json_t *lr = json_object_get(t, "lr"), *min_lr = json_object_get(t, "min_lr");
        if (!get_int(t, "steps", 0, 2147483647LL, &steps) ||
            !get_int(t, "warmup", 0, 2147483647LL, &warmup) || !json_is_number(lr) ||
            !json_is_number(min_lr))
            return ts_fail("%s: config.train's lr, min_lr, warmup or steps is missing or "
                           "invalid",
                           path);
        d.train.steps = (int)steps;
        d.train.warmup = (int)warmup;
        d.train.lr = json_number_value(lr);
        d.train.min_lr = json_number_value(min_lr);
        ts_lr_schedule_of(&d.train, q);
        return TS_OK;
    }
    const char *name = json_string_value(json_object_get(o, "name"));
    json_t *lr = json_object_get(o, "lr"), *min_lr = json_object_get(o, "min_lr");
    long long warmup, length, decay;
    if (!name || strlen(name) >= sizeof q->name || !json_is_number(lr) ||
        !json_is_number(min_lr) || !get_int(o, "warmup", 0, 2147483647LL, &warmup) ||
        !get_int(o, "length", 0, 2147483647LL, &length) ||
        !get_int(o, "decay", 0, 2147483647LL, &decay))
        return ts_fail("%s: lr_schedule is malformed (name, lr, min_lr, warmup, length, decay)",
                       path);
    memset(q, 0, sizeof *q);
    snprintf(q->name, sizeof q->name, "%s", name);
    q->lr = json_number_value(lr);
    q->min_lr = json_number_value(min_lr);
    q->warmup = (int)warmup;
    q->length = (int)length;
    q->decay = (int)decay;
    return TS_OK;
}

/* The optimizer state.json records ("optimizer": {"name", ...}; save.c), else its
 * config's train.optimizer, else "adamw" (a checkpoint older than Muon). Only the names
 * this tessera runs: they decide which optimizer tensors the files hold (layout.h). */
static ts_status parse_optimizer(ts_ckpt_reader *r, json_t *s, const char *path)
{
    json_t *o = json_object_get(json_object_get(s, "optimizer"), "name");
    if (!o) o = json_object_get(json_object_get(json_object_get(s, "config"), "train"), "optimizer");
    const char *name = o ? json_string_value(o) : "adamw";
    if (!name || (strcmp(name, "adamw") != 0 && strcmp(name, "muon") != 0))
        return ts_fail("%s: the optimizer it records is not \"adamw\" or \"muon\"", path);
    snprintf(r->optimizer, sizeof r->optimizer, "%s", name);
    return TS_OK;
}

/* config.model: the keys that define the tensors (n_layer, n_head, n_embd, vocab_size,
 * seq_len) must be there; the architecture's other keys (n_kv_head, ffn_hidden,
 * norm_eps, tie_embeddings, rope_*, qk_norm, moe_*) take their defaults where a checkpoint older than
 * them lacks them (every such checkpoint is a gpt2 one, for which the defaults are what
 * it ran), and must have their type where present. Then the keys' ranges and relations,
 * as a config file's are checked (probe D10: n_layer = 2^30 in a hand-edited state.json
 * made info and verify allocate without end, n_embd = vocab = 2^30 overflowed the shard
 * arithmetic). */
static ts_status parse_model(json_t *model, ts_model_config *out, const char *path)
{
    long long mv[5];
    const char *keys[5] = {"n_layer", "n_head", "n_embd", "vocab_size", "seq_len"};
    for (int i = 0; i < 5; i++)
        if (!get_int(model, keys[i], 1, 1LL << 30, &mv[i]))
            return ts_fail("%s: config.model.%s is missing or invalid", path, keys[i]);
    json_t *a = json_object_get(model, "arch");
    const char *arch = a ? json_string_value(a) : "gpt2";
    if (!arch || (strcmp(arch, "gpt2") != 0 && strcmp(arch, "llama") != 0))
        return ts_fail("%s: config.model.arch is not \"gpt2\" or \"llama\"", path);
    ts_config vc;
    ts_config_defaults(&vc);
    ts_model_config *m = &vc.model;
    snprintf(m->arch, sizeof m->arch, "%s", arch);
    ts_config_arch_defaults(m, arch);
    m->n_layer = (int)mv[0];
    m->n_head = (int)mv[1];
    m->n_embd = (int)mv[2];
    m->vocab_size = (int)mv[3];
    m->seq_len = (int)mv[4];
    const struct {
        const char *key;
        int *v;
        long long lo;
    } ints[] = {{"n_kv_head", &m->n_kv_head, 0}, {"head_dim", &m->head_dim, 0},
                {"ffn_hidden", &m->ffn_hidden, 0},
                {"rope_original_context", &m->rope_original_context, 1},
                {"moe_experts", &m->moe_experts, 0}, {"moe_top_k", &m->moe_top_k, 1},
                {"moe_ffn_hidden", &m->moe_ffn_hidden, 0},
                {"moe_shared_experts", &m->moe_shared_experts, 0},
                {"moe_groups", &m->moe_groups, 1}, {"moe_topk_groups", &m->moe_topk_groups, 1},
                {"moe_first_dense", &m->moe_first_dense, 0}, {"moe_every", &m->moe_every, 1},
                {"q_lora_rank", &m->q_lora_rank, 0}, {"kv_lora_rank", &m->kv_lora_rank, 0},
                {"qk_nope_head_dim", &m->qk_nope_head_dim, 0},
                {"qk_rope_head_dim", &m->qk_rope_head_dim, 0},
                {"v_head_dim", &m->v_head_dim, 0},
                {"mtp_layers", &m->mtp_layers, 0}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        long long v;
        if (!json_object_get(model, ints[i].key)) continue;
        if (!get_int(model, ints[i].key, ints[i].lo, 1LL << 30, &v))
            return ts_fail("%s: config.model.%s is not an integer in range", path, ints[i].key);
        *ints[i].v = (int)v;
    }
    const struct {
        const char *key;
        double *v;
    } reals[] = {{"norm_eps", &m->norm_eps},
                 {"rope_theta", &m->rope_theta},
                 {"rope_scaling", &m->rope_scaling},
                 {"rope_low_freq_factor", &m->rope_low_freq_factor},
                 {"rope_high_freq_factor", &m->rope_high_freq_factor},
                 {"moe_route_scale", &m->moe_route_scale},
                 {"rope_beta_fast", &m->rope_beta_fast},
                 {"rope_beta_slow", &m->rope_beta_slow},
                 {"rope_mscale", &m->rope_mscale},
                 {"rope_mscale_all_dim", &m->rope_mscale_all_dim}};
    for (size_t i = 0; i < sizeof reals / sizeof reals[0]; i++) {
        json_t *v = json_object_get(model, reals[i].key);
        if (!v) continue;
        if (!json_is_number(v) || !isfinite(json_number_value(v)) || json_number_value(v) < 0)
            return ts_fail("%s: config.model.%s is not a finite number >= 0", path, reals[i].key);
        *reals[i].v = json_number_value(v);
    }
    json_t *tie = json_object_get(model, "tie_embeddings");
    if (tie && !json_is_boolean(tie))
        return ts_fail("%s: config.model.tie_embeddings is not true or false", path);
    if (tie) m->tie_embeddings = json_is_true(tie) ? 1 : -1;
    /* Booleans newer than the first checkpoints (absent: their defaults). */
    const struct {
        const char *key;
        bool *v;
    } bools[] = {{"qk_norm", &m->qk_norm}, {"moe_norm_topk", &m->moe_norm_topk}};
    for (size_t i = 0; i < sizeof bools / sizeof bools[0]; i++) {
        json_t *v = json_object_get(model, bools[i].key);
        if (!v) continue;
        if (!json_is_boolean(v))
            return ts_fail("%s: config.model.%s is not true or false", path, bools[i].key);
        *bools[i].v = json_is_true(v);
    }
    /* The tokenizer (none in a checkpoint older than it): the encoding is checked with
     * the other keys below, the file is where training found the ranks. */
    const struct {
        const char *key;
        char *v;
        size_t cap;
    } strs[] = {{"tokenizer", m->tokenizer, sizeof m->tokenizer},
                {"tokenizer_file", m->tokenizer_file, sizeof m->tokenizer_file},
                {"moe_router", m->moe_router, sizeof m->moe_router},
                {"rope_type", m->rope_type, sizeof m->rope_type}};
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++) {
        json_t *v = json_object_get(model, strs[i].key);
        if (!v) continue;
        if (!json_is_string(v) || strlen(json_string_value(v)) >= strs[i].cap)
            return ts_fail("%s: config.model.%s is not a string of fewer than %zu bytes", path,
                           strs[i].key, strs[i].cap);
        snprintf(strs[i].v, strs[i].cap, "%s", json_string_value(v));
    }
    if (m->tokenizer[0] && ts_config_check_tokenizer_name(m->tokenizer) != TS_OK)
        return ts_error_prefix("%s: ", path);
    ts_config_resolve_model(m);
    if (ts_config_validate(&vc, 0) != TS_OK) return ts_error_prefix("%s: its model: ", path);
    *out = vc.model;
    out->init[0] = '\0'; /* where it came from is no part of the checkpoint's model */
    return TS_OK;
}

/* "tokenizer": {"encoding", "sha256"}, there exactly when config.model.tokenizer is set
 * and naming the same encoding. */
static ts_status parse_tokenizer(json_t *s, ts_model_config *m, const char *path)
{
    json_t *t = json_object_get(s, "tokenizer");
    if (!m->tokenizer[0]) {
        if (t)
            return ts_fail("%s has a \"tokenizer\" but its config.model.tokenizer is empty: "
                           "the state was edited or damaged",
                           path);
        return TS_OK;
    }
    const char *enc = json_string_value(json_object_get(t, "encoding"));
    const char *sha = json_string_value(json_object_get(t, "sha256"));
    bool hex = sha && strlen(sha) == 64;
    for (int i = 0; hex && i < 64; i++) hex = strchr("0123456789abcdef", sha[i]) != NULL;
    if (!enc || strcmp(enc, m->tokenizer) != 0 || !hex)
        return ts_fail("%s: config.model.tokenizer = \"%s\" needs \"tokenizer\": "
                       "{\"encoding\": \"%s\", \"sha256\": 64 lowercase hex digits}, which is "
                       "missing or malformed: the state was edited or damaged",
                       path, m->tokenizer, m->tokenizer);
    snprintf(m->tokenizer_sha256, sizeof m->tokenizer_sha256, "%s", sha);
    return TS_OK;
}

static ts_status parse_state(ts_ckpt_reader *r, const char *path)
{
    json_t *s = r->state;
    long long want;
    if (!get_int(s, "state_crc32", 0, 0xffffffffLL, &want))
        return ts_fail("%s has no \"state_crc32\": not a complete Tessera checkpoint state", path);
    const uint32_t got = ts_ckpt_state_crc(s);
    if (got != (uint32_t)want)
        return ts_fail("%s does not match its own checksum (crc32 %08x, it says %08llx): the "
                       "state was edited or damaged; restore it or use another checkpoint",
                       path, got, want);
    const char *format = json_string_value(json_object_get(s, "format"));
    if (!format || strcmp(format, "tessera-checkpoint") != 0)
        return ts_fail("%s is not a Tessera checkpoint state (its \"format\" is not "
                       "\"tessera-checkpoint\")",
                       path);
    long long v, step, B, chunk;
    if (!get_int(s, "version", 1, 1 << 20, &v))
        return ts_fail("%s: \"version\" is missing or not a positive integer", path);
    if (v > TS_CKPT_FORMAT_VERSION)
        return ts_fail("%s: format version %lld is newer than this tessera reads (%d); use a "
                       "newer tessera",
                       path, v, TS_CKPT_FORMAT_VERSION);
    r->version = (int)v;
    if (!get_int(s, "step", 0, 2147483647LL, &step))
        return ts_fail("%s: \"step\" is missing or not a step number", path);
    r->step = (int)step;
    const long named = ts_ckpt_step_of_name(r->dir);
    if (named >= 0 && named != step)
        return ts_fail("%s says step %lld, but its directory is named for step %ld: the "
                       "directory was renamed or the state belongs elsewhere",
                       path, step, named);
    if (parse_model(json_object_get(json_object_get(s, "config"), "model"), &r->model, path) !=
        TS_OK)
        return TS_ERR;
    if (parse_tokenizer(s, &r->model, path) != TS_OK) return TS_ERR;
    if (parse_lr_schedule(r, s, path) != TS_OK) return TS_ERR;
    if (parse_optimizer(r, s, path) != TS_OK) return TS_ERR;
    if (!get_int(json_object_get(s, "data"), "global_batch", 1, 1LL << 40, &B))
        return ts_fail("%s: data.global_batch is missing or invalid", path);
    r->global_batch = B;
    long long consumed;
    /* With a batch ramp-up the steps' batches differ: its sum, at most step x B (no
     * ramp-up batch exceeds global_batch) and at least step (a batch is >= 1). */
    const json_t *jr = json_object_get(json_object_get(s, "data"), "batch_rampup");
    if (jr && (!json_is_string(jr) || strlen(json_string_value(jr)) >= sizeof r->batch_rampup))
        return ts_fail("%s: data.batch_rampup is not a train.batch_rampup string", path);
    snprintf(r->batch_rampup, sizeof r->batch_rampup, "%s", jr ? json_string_value(jr) : "");
    if (!get_int(json_object_get(s, "data"), "sequences_consumed", 0, 1LL << 62, &consumed) ||
        (!jr && (consumed % B != 0 || consumed / B != step)) ||
        (jr && (consumed > step * B || consumed < step)))
        return ts_fail(jr ? "%s: data.sequences_consumed is not between step and step x "
                            "global_batch (%lld x %lld) under its data.batch_rampup"
                          : "%s: data.sequences_consumed is not step x global_batch (%lld x "
                            "%lld)",
                       path, step, B);
    r->sequences_consumed = consumed;
    json_t *grid = json_object_get(s, "grid");
    const char *gk[3] = {"pp", "dp", "tp"};
    for (int i = 0; i < 3; i++) {
        long long g;
        r->grid[i] = get_int(grid, gk[i], 1, 1 << 24, &g) ? (int)g : 0;
    }
    if (!get_int(s, "chunk_bytes", 4096, 1LL << 30, &chunk))
        return ts_fail("%s: \"chunk_bytes\" is missing or invalid", path);
    r->chunk_bytes = (uint64_t)chunk;
    r->checksums = json_object_get(s, "checksums");
    json_t *files = json_object_get(s, "files");
    if (!json_is_object(r->checksums) || !json_is_object(files) || json_object_size(files) == 0)
        return ts_fail("%s: \"files\" or \"checksums\" is missing", path);
    r->n_files = (int)json_object_size(files);
    r->files = ts_calloc((size_t)r->n_files, sizeof *r->files);
    const char *name;
    json_t *info;
    int f = 0;
    json_object_foreach(files, name, info) {
        ts_ckpt_rfile *F = &r->files[f++];
        long long bytes, hb, crc;
        if (strlen(name) >= sizeof F->name || strchr(name, '/') || name[0] == '.' ||
            !get_int(info, "bytes", 8, 1LL << 52, &bytes) ||
            !get_int(info, "header_bytes", 8, bytes, &hb) ||
            !get_int(info, "header_crc32", 0, 0xffffffffLL, &crc))
            return ts_fail("%s: the entry for file '%s' is malformed", path, name);
        snprintf(F->name, sizeof F->name, "%s", name);
        F->bytes = (uint64_t)bytes;
        F->header_bytes = (uint64_t)hb;
        F->header_crc = (uint32_t)crc;
    }
    return TS_OK;
}

ts_status ts_ckpt_reader_open(ts_ckpt_reader *r, const char *step_dir)
{
    memset(r, 0, sizeof *r);
    snprintf(r->dir, sizeof r->dir, "%s", step_dir);
    char path[TS_PATH_MAX + 100];
    snprintf(path, sizeof path, "%s/state.json", step_dir);
    json_error_t jerr;
    /* Opened so it cannot block, and only a regular file of sane size is parsed. */
    FILE *sf = ts_fopen_input(path);
    if (sf && ts_check_input(fileno(sf), path, "checkpoint state", "the checkpoint's "
                             "state.json", 1ull << 30) != TS_OK) {
        fclose(sf);
        r->verdict = TS_CKPT_BAD_STATE;
        return TS_ERR;
    }
    if (sf) {
        r->state = json_loadf(sf, 0, &jerr);
        fclose(sf);
    } else if (errno != ENOENT && errno != ENOTDIR) {
        /* Not a verdict on the checkpoint: the system would not let us look. */
        r->verdict = TS_CKPT_ERROR;
        return ts_fail("cannot open %s: %s", path, strerror(errno));
    } else {
        r->state = NULL;
        snprintf(jerr.text, sizeof jerr.text, "no such file");
        jerr.line = -1;
    }
    ts_status st = TS_OK;
    if (!r->state) {
        struct stat sb;
        if (stat(step_dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
            st = ts_fail("%s is not a checkpoint directory (%s)", step_dir,
                         stat(step_dir, &sb) != 0 ? strerror(errno) : "not a directory");
        else if (stat(path, &sb) != 0)
            st = ts_fail("%s has no state.json: not a checkpoint, or a save that never "
                         "finished",
                         step_dir);
        else
            st = ts_fail("%s is damaged: %s (line %d)", path, jerr.text, jerr.line);
        r->verdict = TS_CKPT_BAD_STATE;
    } else if (parse_state(r, path) != TS_OK) {
        r->verdict = TS_CKPT_BAD_STATE;
        st = TS_ERR;
    }
    for (int f = 0; st == TS_OK && f < r->n_files; f++) {
        ts_ckpt_rfile *F = &r->files[f];
        snprintf(path, sizeof path, "%s/%s", step_dir, F->name);
        struct stat sb;
        int probe;
        if (stat(path, &sb) != 0) {
            st = ts_fail("%s is missing (state.json lists it): the checkpoint is incomplete", path);
            r->verdict = TS_CKPT_INCOMPLETE;
        } else if ((probe = ts_open_input(path)) < 0) {
            /* The file exists (stat above): failing to open it is the system's doing
             * (too many open files, permissions), not the checkpoint's. */
            const int err = errno; /* before ts_fail may change it */
            st = ts_fail("cannot open %s: %s", path, strerror(err));
            r->verdict = err == EACCES ? TS_CKPT_INCOMPLETE : TS_CKPT_ERROR;
        } else if (close(probe), ts_st_open(&F->st, path) != TS_OK) {
            r->verdict = (uint64_t)sb.st_size < F->bytes ? TS_CKPT_INCOMPLETE : TS_CKPT_CORRUPT;
            st = TS_ERR;
        } else {
            F->open = true;
        }
    }
    if (st != TS_OK) {
        ts_ckpt_verdict v = r->verdict;
        ts_ckpt_reader_close(r);
        r->verdict = v;
    }
    return st;
}

void ts_ckpt_reader_close(ts_ckpt_reader *r)
{
    for (int f = 0; f < r->n_files; f++)
        if (r->files[f].open) ts_st_close(&r->files[f].st);
    free(r->files);
    if (r->state) json_decref(r->state);
    memset(r, 0, sizeof *r);
}

const ts_st_tensor *ts_ckpt_reader_find(const ts_ckpt_reader *r, const char *name, int *file)
{
    for (int f = 0; f < r->n_files; f++) {
        const ts_st_tensor *t = ts_st_find(&r->files[f].st, name);
        if (t) {
            if (file) *file = f;
            return t;
        }
    }
    return NULL;
}

ts_status ts_ckpt_reader_expect(ts_ckpt_reader *r, const char *name, int ndim,
                                const int64_t *shape, const ts_st_tensor **t, int *file)
{
    int f = -1;
    *t = ts_ckpt_reader_find(r, name, &f);
    if (!*t) {
        char s[64];
        ts_fail("checkpoint %s has no tensor '%s' (expected F32 %s in its files); the "
                "checkpoint is incomplete or was edited",
                r->dir, name, ts_st_shape_str(s, sizeof s, ndim, shape));
        return fail_as(r, TS_CKPT_INCOMPLETE);
    }
    if (ts_st_expect_f32(*t, ndim, shape) != TS_OK) {
        ts_error_prefix("%s: ", r->files[f].st.path);
        return fail_as(r, TS_CKPT_INCOMPLETE);
    }
    if (file) *file = f;
    return TS_OK;
}

ts_status ts_ckpt_reader_check_files(ts_ckpt_reader *r)
{
    for (int f = 0; f < r->n_files; f++) {
        const ts_ckpt_rfile *F = &r->files[f];
        if (F->st.file_size != F->bytes) {
            ts_fail("%s has %llu bytes but state.json says %llu: the file was %s", F->st.path,
                    (unsigned long long)F->st.file_size, (unsigned long long)F->bytes,
                    F->st.file_size < F->bytes ? "truncated" : "replaced or extended");
            return fail_as(r, F->st.file_size < F->bytes ? TS_CKPT_INCOMPLETE : TS_CKPT_CORRUPT);
        }
        if (F->st.data_start != F->header_bytes) {
            ts_fail("%s: its header is %llu bytes but state.json says %llu: the header was "
                    "edited",
                    F->st.path, (unsigned long long)F->st.data_start,
                    (unsigned long long)F->header_bytes);
            return fail_as(r, TS_CKPT_CORRUPT);
        }
        unsigned char *h = ts_malloc(F->header_bytes);
        int rc = fseeko(F->st.fp, 0, SEEK_SET) == 0 && fread(h, 1, F->header_bytes, F->st.fp) == F->header_bytes;
        uint32_t crc = rc ? (uint32_t)crc32(0L, h, (uInt)F->header_bytes) : 0;
        free(h);
        if (!rc) {
            ts_fail("%s: cannot read its header: %s", F->st.path,
                    ferror(F->st.fp) ? strerror(errno) : "the file ends early");
            return fail_as(r, TS_CKPT_INCOMPLETE);
        }
        if (crc != F->header_crc) {
            ts_fail("%s: the header's checksum does not match state.json (crc32 %08x, expected "
                    "%08x): the header is damaged or was edited",
                    F->st.path, crc, F->header_crc);
            return fail_as(r, TS_CKPT_CORRUPT);
        }
    }
    return TS_OK;
}

ts_status ts_ckpt_reader_verify(ts_ckpt_reader *r, const char *name, size_t c0, size_t c1,
                                void *buf)
{
    int f;
    const ts_st_tensor *t = ts_ckpt_reader_find(r, name, &f);
    json_t *sums = json_object_get(r->checksums, name);
    if (!t) {
        ts_fail("checkpoint %s has no tensor '%s'", r->dir, name);
        return fail_as(r, TS_CKPT_INCOMPLETE);
    }
    const uint64_t bytes = t->end - t->begin;
    const size_t n_chunks = (size_t)((bytes + r->chunk_bytes - 1) / r->chunk_bytes);
    if (!json_is_array(sums) || json_array_size(sums) != (n_chunks ? n_chunks : 1)) {
        ts_fail("%s/state.json has no checksums for tensor '%s' (or the wrong number): the "
                "state and the files do not belong together",
                r->dir, name);
        return fail_as(r, TS_CKPT_CORRUPT);
    }
    if (c1 > n_chunks) c1 = n_chunks;
    for (size_t c = c0; c < c1; c++) {
        const uint64_t off = (uint64_t)c * r->chunk_bytes;
        const uint64_t len = bytes - off < r->chunk_bytes ? bytes - off : r->chunk_bytes;
        if (ts_st_read(&r->files[f].st, t, off, buf, len) != TS_OK) return fail_as(r, TS_CKPT_INCOMPLETE);
        const uint32_t crc = (uint32_t)crc32(0L, buf, (uInt)len);
        const json_t *want = json_array_get(sums, c);
        if (!json_is_integer(want) || (uint32_t)json_integer_value(want) != crc) {
            ts_fail("%s: tensor '%s' fails its checksum in bytes [%llu, %llu) (crc32 %08x, "
                    "state.json says %08llx): the file is damaged; restore it or use another "
                    "checkpoint",
                    r->files[f].st.path, name, (unsigned long long)off,
                    (unsigned long long)(off + len), crc,
                    (unsigned long long)json_integer_value(want));
            return fail_as(r, TS_CKPT_CORRUPT);
        }
    }
    return TS_OK;
}

ts_status ts_ckpt_reader_check_hf_config(ts_ckpt_reader *r)
{
    json_t *want = ts_ckpt_hf_config(&r->model);
    if (!want) return TS_OK;
    char path[TS_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/config.json", r->dir);
    ts_status st = TS_OK;
    json_t *have = NULL;
    FILE *f = ts_fopen_input(path);
    if (!f) {
        const int err = errno;
        st = ts_fail("%s: %s; a llama checkpoint holds its Hugging Face config there (the "
                     "checkpoint is incomplete)",
                     path, strerror(err));
        r->verdict = err == ENOENT ? TS_CKPT_INCOMPLETE : TS_CKPT_ERROR;
    } else if (ts_check_input(fileno(f), path, "checkpoint config.json", "the checkpoint's "
                              "Hugging Face config.json", 1u << 24) != TS_OK) {
        r->verdict = TS_CKPT_CORRUPT;
        st = TS_ERR;
    } else {
        json_error_t jerr;
        have = json_loadf(f, 0, &jerr);
        if (!json_is_object(have)) {
            st = ts_fail("%s is not a JSON object (%s, line %d): damaged", path,
                         have ? "another JSON value" : jerr.text, have ? 0 : jerr.line);
            r->verdict = TS_CKPT_CORRUPT;
        }
    }
    if (f) fclose(f);
    const char *key;
    json_t *v;
    json_object_foreach(want, key, v) {
        if (st != TS_OK) break;
        json_t *got = json_object_get(have, key);
        if (got && json_equal(got, v)) continue;
        char *w = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        st = ts_fail("%s: \"%s\" is %s, but the checkpoint's model (state.json) gives %s: the "
                     "file was edited or belongs to another checkpoint",
                     path, key, got ? "another value" : "missing", w ? w : "?");
        free(w);
        r->verdict = TS_CKPT_CORRUPT;
    }
    json_decref(have);
    json_decref(want);
    return st;
}

ts_status ts_ckpt_reader_check_complete(ts_ckpt_reader *r)
{
    ts_ckpt_layout L;
    ts_ckpt_layout_build(&L, &r->model, 1e6, !strcmp(r->optimizer, "muon"));
    ts_status st = TS_OK;
    for (int e = 0; e < L.n_entries && st == TS_OK; e++) {
        if (!ts_ckpt_entry_stored(&L.entries[e])) continue;
        const ts_shard_spec *s = &L.logical[L.entries[e].logical];
        const ts_st_tensor *t;
        st = ts_ckpt_reader_expect(r, L.entries[e].name, s->ndim, s->shape, &t, NULL);
    }
    ts_ckpt_layout_free(&L);
    return st;
}
