/* Reading a checkpoint directory (reader.h). */
#include "checkpoint/reader.h"

#include <errno.h>
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

/* The model keys beyond the five every checkpoint has (llama's, and gpt2's resolved
 * ones), where state.json holds them; a missing or mistyped one keeps its default and a
 * value out of range is left to ts_config_validate. */
static void read_arch_keys(json_t *model, ts_model_config *mc)
{
    const struct {
        const char *key;
        int *dst;
    } ints[] = {{"n_kv_head", &mc->n_kv_head},
                {"ffn_hidden", &mc->ffn_hidden},
                {"rope_original_context", &mc->rope_original_context}};
    const struct {
        const char *key;
        double *dst;
    } reals[] = {{"norm_eps", &mc->norm_eps},
                 {"rope_theta", &mc->rope_theta},
                 {"rope_scaling", &mc->rope_scaling},
                 {"rope_low_freq_factor", &mc->rope_low_freq_factor},
                 {"rope_high_freq_factor", &mc->rope_high_freq_factor}};
    long long v;
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (get_int(model, ints[i].key, 0, 1LL << 30, &v)) *ints[i].dst = (int)v;
    for (size_t i = 0; i < sizeof reals / sizeof reals[0]; i++) {
        json_t *x = json_object_get(model, reals[i].key);
        if (json_is_number(x)) *reals[i].dst = json_number_value(x);
    }
    json_t *tie = json_object_get(model, "tie_embeddings");
    if (json_is_boolean(tie)) mc->tie_embeddings = json_is_true(tie);
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
    json_t *model = json_object_get(json_object_get(s, "config"), "model");
    long long mv[5];
    const char *keys[5] = {"n_layer", "n_head", "n_embd", "vocab_size", "seq_len"};
    for (int i = 0; i < 5; i++)
        if (!get_int(model, keys[i], 1, 1LL << 30, &mv[i]))
            return ts_fail("%s: config.model.%s is missing or invalid", path, keys[i]);
    /* The other model keys start from their defaults (and the architecture's), as a
     * config file's do, so that an older checkpoint without them reads as what it was. */
    ts_config vc;
    ts_config_defaults(&vc);
    ts_model_config *mc = &vc.model;
    const char *arch = json_string_value(json_object_get(model, "arch"));
    snprintf(mc->arch, sizeof mc->arch, "%s", arch ? arch : "gpt2");
    ts_config_arch_defaults(mc, mc->arch);
    mc->n_layer = (int)mv[0];
    mc->n_head = (int)mv[1];
    mc->n_embd = (int)mv[2];
    mc->vocab_size = (int)mv[3];
    mc->seq_len = (int)mv[4];
    mc->init[0] = '\0';
    read_arch_keys(model, mc);
    ts_config_resolve_model(mc);
    r->model = *mc;
    /* The model keys' ranges and relations, as a config file's are checked (probe D10:
     * n_layer = 2^30 in a hand-edited state.json made info and verify allocate without
     * end, n_embd = vocab = 2^30 overflowed the shard arithmetic). */
    if (ts_config_validate(&vc, 0) != TS_OK) return ts_error_prefix("%s: its model: ", path);
    if (parse_lr_schedule(r, s, path) != TS_OK) return TS_ERR;
    if (!get_int(json_object_get(s, "data"), "global_batch", 1, 1LL << 40, &B))
        return ts_fail("%s: data.global_batch is missing or invalid", path);
    r->global_batch = B;
    long long consumed;
    if (!get_int(json_object_get(s, "data"), "sequences_consumed", 0, 1LL << 62, &consumed) ||
        consumed % B != 0 || consumed / B != step)
        return ts_fail("%s: data.sequences_consumed is not step x global_batch (%lld x %lld)",
                       path, step, B);
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

ts_status ts_ckpt_reader_check_complete(ts_ckpt_reader *r)
{
    ts_ckpt_layout L;
    ts_ckpt_layout_build(&L, &r->model, 1e6);
    ts_status st = TS_OK;
    for (int e = 0; e < L.n_entries && st == TS_OK; e++) {
        const ts_shard_spec *s = &L.logical[L.entries[e].logical];
        const ts_st_tensor *t;
        st = ts_ckpt_reader_expect(r, L.entries[e].name, s->ndim, s->shape, &t, NULL);
    }
    ts_ckpt_layout_free(&L);
    return st;
}
