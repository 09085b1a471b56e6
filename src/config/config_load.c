/* Loading: libconfig file + `--set` overrides -> ts_config, in three passes over a
 * libconfig tree:
 *   1. read the file (syntax errors carry file:line and libconfig's text),
 *   2. apply each override "dotted.key=value" by parsing the value as libconfig parses
 *      one (falling back to a bare string) and grafting it into the tree
 *      (config_override.c),
 *   3. walk every setting in the tree against the table of known keys (config_keys.c:
 *      type, range, allowed values) and copy it into the struct,
 * then ts_config_validate (config_validate.c). An unknown key or section gets a
 * spelling hint (config_spelling.c). Nothing here prints or exits: every problem is a
 * ts_fail message naming the key and how to fix it. */
#include "config/config_internal.h"

#include <ctype.h>
#include <errno.h>
#include <libconfig.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/fsutil.h"

/* ------------------------------------------------------------ key look-up -- */

static const key_spec *find_key(const char *section, const char *name)
{
    for (int i = 0; i < ts_config_n_keys; i++)
        if (strcmp(ts_config_keys[i].section, section) == 0 &&
            strcmp(ts_config_keys[i].name, name) == 0)
            return &ts_config_keys[i];
    return NULL;
}

static bool is_section(const char *name)
{
    for (int i = 0; i < ts_config_n_sections; i++)
        if (strcmp(ts_config_sections[i], name) == 0) return true;
    return false;
}

/* ------------------------------------------------------- reading settings -- */

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
    default: snprintf(buf, cap, "%s", ts_config_type_name(type)); break;
    }
}

/* The config file being read: libconfig names included files in a setting's source,
 * but not the main text, which is parsed from memory (read_file). */
static _Thread_local const char *g_main_path;

/* " (file:line)" for a setting read from a file, " (from --set)" for an override. */
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

/* A string or a list of strings (paths or glob patterns) of config key `name` into
 * out[*n ..], each stored with dataset `set` in sets (when given). */
static ts_status read_path_list(const key_spec *k, const config_setting_t *s, const char *where,
                                const char *name, char (*out)[TS_PATH_MAX], int *sets, int set,
                                int *n)
{
    int type = config_setting_type(s);
    if (type == CONFIG_TYPE_STRING) {
        if (*n >= TS_MAX_SHARDS)
            return ts_fail("config key '%s'%s names more than %d paths; at most %d are supported "
                           "(a glob pattern such as \"data/train_*.bin\" names any number of "
                           "files)", name, where, TS_MAX_SHARDS, TS_MAX_SHARDS);
        if (sets) sets[*n] = set;
        return read_string(k, s, where, out[(*n)++], TS_PATH_MAX);
    }
    if (type != CONFIG_TYPE_ARRAY && type != CONFIG_TYPE_LIST)
        return type_error(k, s, where, "a string or a list of strings",
                          "e.g. \"data/train.bin\", [\"a.bin\", \"b.bin\"] or "
                          "\"data/train_*.bin\"");
    int len = config_setting_length(s);
    if (len == 0)
        return ts_fail("config key '%s'%s is an empty list; give a path or a glob pattern",
                       name, where);
    for (int i = 0; i < len; i++) {
        const config_setting_t *e = config_setting_get_elem(s, (unsigned)i);
        if (config_setting_type(e) != CONFIG_TYPE_STRING) {
            char found[128];
            describe_found(e, found, sizeof found);
            return ts_fail("config key '%s'%s: entry %d must be a string (a file path or "
                           "glob pattern), but is %s",
                           name, where, i, found);
        }
        if (read_path_list(k, e, where, name, out, sets, set, n) != TS_OK) return TS_ERR;
    }
    return TS_OK;
}

/* One group of a blend: { path = "web_*.bin" (or a list); weight = 0.7; }. */
static ts_status read_blend_group(const key_spec *k, const config_setting_t *g, const char *where,
                                  int set, ts_data_config *d)
{
    char gw[TS_PATH_MAX + 32];
    where_of(g, gw, sizeof gw);
    if (!gw[0]) snprintf(gw, sizeof gw, "%s", where);
    for (int i = 0; i < config_setting_length(g); i++) {
        const char *name = config_setting_name(config_setting_get_elem(g, (unsigned)i));
        if (strcmp(name, "path") != 0 && strcmp(name, "weight") != 0)
            return ts_fail("config key 'data.train'%s: blend entry %d has an unknown key '%s'; "
                           "each entry is { path = \"web_*.bin\"; weight = 0.7; }",
                           gw, set, name);
    }
    const config_setting_t *p = config_setting_get_member(g, "path");
    const config_setting_t *w = config_setting_get_member(g, "weight");
    if (!p || !w)
        return ts_fail("config key 'data.train'%s: blend entry %d lacks '%s'; each entry is "
                       "{ path = \"web_*.bin\"; weight = 0.7; }",
                       gw, set, p ? "weight" : "path");
    int wt = config_setting_type(w);
    if (wt != CONFIG_TYPE_FLOAT && !is_int_type(wt)) {
        char found[128];
        describe_found(w, found, sizeof found);
        return ts_fail("config key 'data.train'%s: blend entry %d's weight must be a number, "
                       "but is %s", gw, set, found);
    }
    double v = wt == CONFIG_TYPE_FLOAT ? config_setting_get_float(w)
                                       : (double)config_setting_get_int64(w);
    if (!(v > 0.0) || !isfinite(v))
        return ts_fail("config key 'data.train'%s: blend entry %d's weight = %g must be a "
                       "positive number (the weights are normalised to sum to 1)", gw, set, v);
    d->weight[set] = v;
    return read_path_list(k, p, gw, "data.train", d->train, d->train_set, set, &d->n_train);
}

/* data.train: a path, a list of paths (one dataset, read in order), or a blend: a list
 * of groups, one dataset each. */
static ts_status read_shards(const key_spec *k, const config_setting_t *s, const char *where,
                             ts_config *cfg)
{
    ts_data_config *d = &cfg->data;
    d->n_train = 0;
    d->n_sets = 1;
    d->blend = false;
    d->weight[0] = 1.0;
    int type = config_setting_type(s);
    bool groups = false;
    if (type == CONFIG_TYPE_LIST || type == CONFIG_TYPE_ARRAY) {
        int len = config_setting_length(s);
        for (int i = 0; i < len; i++)
            if (config_setting_type(config_setting_get_elem(s, (unsigned)i)) == CONFIG_TYPE_GROUP)
                groups = true;
    }
    if (!groups) return read_path_list(k, s, where, "data.train", d->train, d->train_set, 0,
                                       &d->n_train);
    int len = config_setting_length(s);
    if (len > TS_MAX_DATA_SETS)
        return ts_fail("config key 'data.train'%s blends %d datasets; at most %d are supported",
                       where, len, TS_MAX_DATA_SETS);
    for (int i = 0; i < len; i++) {
        const config_setting_t *g = config_setting_get_elem(s, (unsigned)i);
        if (config_setting_type(g) != CONFIG_TYPE_GROUP) {
            char found[128];
            describe_found(g, found, sizeof found);
            return ts_fail("config key 'data.train'%s: entry %d is %s, but the other entries "
                           "are blend groups; write every entry as { path = ...; weight = w; }",
                           where, i, found);
        }
        if (read_blend_group(k, g, where, i, d) != TS_OK) return TS_ERR;
    }
    d->n_sets = len;
    d->blend = true;
    return TS_OK;
}

/* data.val: a path or a list of them (glob patterns too), read as one stream; "" is no
 * validation. */
static ts_status read_val(const key_spec *k, const config_setting_t *s, const char *where,
                          ts_config *cfg)
{
    ts_data_config *d = &cfg->data;
    d->n_val = 0;
    if (config_setting_type(s) == CONFIG_TYPE_STRING && !config_setting_get_string(s)[0])
        return TS_OK;
    return read_path_list(k, s, where, "data.val", d->val, NULL, 0, &d->n_val);
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
        if (type == CONFIG_TYPE_STRING && k->check == ts_config_allow_auto) {
            const char *v = config_setting_get_string(s);
            if (strcmp(v, "auto") != 0)
                return type_error(k, s, where, "a whole number or \"auto\"",
                                  "\"auto\" takes what pp * tp leave of the ranks launched");
            *(int *)dst = 0;
            break;
        }
        if (type == CONFIG_TYPE_FLOAT)
            return type_error(k, s, where, "an integer",
                              "write a whole number without a decimal point or exponent");
        if (!is_int_type(type)) return type_error(k, s, where, "an integer", NULL);
        long long v = config_setting_get_int64(s);
        if (v < INT_MIN || v > INT_MAX || !ts_config_in_range(k, (double)v)) {
            char value[32];
            snprintf(value, sizeof value, "%lld", v);
            return ts_config_range_error(k, value, where);
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
    case K_TRIBOOL:
        if (type != CONFIG_TYPE_BOOL)
            return type_error(k, s, where, "a boolean", "write true or false");
        *(int *)dst = config_setting_get_bool(s) != 0 ? 1 : -1;
        break;
    case K_STR:
        if (type != CONFIG_TYPE_STRING)
            return type_error(k, s, where, "a string", "put the value in double quotes");
        st = read_string(k, s, where, (char *)dst, k->size);
        break;
    case K_PARTITION: st = read_partition(k, s, where, cfg); break;
    case K_SHARDS: st = read_shards(k, s, where, cfg); break;
    case K_PATHS: st = read_val(k, s, where, cfg); break;
    }
    if (st != TS_OK) return st;
    return ts_config_check_value(k, cfg, where);
}

/* Walk the whole tree: every top-level setting a known section (a group), every
 * member of a section a known key of the right type and range. */
static ts_status read_tree(const config_setting_t *root, ts_config *cfg)
{
    int n = config_setting_length(root);
    for (int i = 0; i < n; i++) {
        const config_setting_t *sec = config_setting_get_elem(root, (unsigned)i);
        const char *sname = config_setting_name(sec);
        if (!is_section(sname)) {
            char where[TS_PATH_MAX + 32];
            where_of(sec, where, sizeof where);
            return ts_config_unknown_section(sname, where);
        }
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
            if (!k) {
                char where[TS_PATH_MAX + 32];
                where_of(s, where, sizeof where);
                return ts_config_unknown_key(sname, kname, where);
            }
            if (read_key(k, s, cfg) != TS_OK) return TS_ERR;
        }
    }
    return TS_OK;
}

/* ---------------------------------------------------------------- loading -- */

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
    FILE *f = ts_fopen_input(path); /* cannot block: core/fsutil.h */
    if (!f) return ts_fail("cannot open config file '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(f);
        return ts_fail("config file '%s' is a directory; give the path of a libconfig file "
                       "such as configs/tiny.cfg",
                       path);
    }
    /* A regular file, or a pipe that has its writer (a shell's | or <(...)); a named
     * FIFO would wait for a writer that may never come. */
    if (!ts_is_anonymous_pipe(fileno(f))) {
        ts_status st_in = ts_check_input(fileno(f), path, "config file",
                                         "a libconfig file such as configs/tiny.cfg, or pipe "
                                         "one in (tessera train /dev/stdin < FILE)",
                                         0);
        if (st_in != TS_OK) {
            fclose(f);
            return st_in;
        }
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
    int line = ts_config_find_wide_int(text, tok, sizeof tok, &beyond_64);
    int ok = config_read_string(lc, text);
    free(text);
    if (ok == CONFIG_TRUE) {
        if (line && beyond_64) {
            char where[TS_PATH_MAX + 32];
            snprintf(where, sizeof where, "config file %s:%d", path, line);
            return ts_config_huge_int_error(where, tok);
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

/* parallel.dp = "auto": the ranks launched over pp * cp * tp, as Megatron infers its
 * data-parallel size. A command that launches no ranks (tessera plan: world_size <= 0)
 * plans one replica. */
static ts_status resolve_auto_dp(ts_config *cfg, int world_size)
{
    const ts_parallel_config *p = &cfg->parallel;
    const long long model_ranks = (long long)p->pp * p->cp * p->tp;
    if (world_size <= 0) {
        cfg->parallel.dp = 1;
        return TS_OK;
    }
    if (world_size % model_ranks != 0 && p->cp == 1)
        return ts_fail("parallel.dp = \"auto\" takes what pp * tp = %d * %d = %lld leave of "
                       "the %d ranks launched, but %d is not a multiple of %lld; launch a "
                       "multiple of %lld ranks or set parallel.dp",
                       p->pp, p->tp, model_ranks, world_size, world_size, model_ranks,
                       model_ranks);
    if (world_size % model_ranks != 0)
        return ts_fail("parallel.dp = \"auto\" takes what pp * cp * tp = %d * %d * %d = %lld "
                       "leave of the %d ranks launched, but %d is not a multiple of %lld; "
                       "launch a multiple of %lld ranks or set parallel.dp",
                       p->pp, p->cp, p->tp, model_ranks, world_size, world_size, model_ranks,
                       model_ranks);
    cfg->parallel.dp = (int)(world_size / model_ranks);
    return TS_OK;
}

/* Set while ts_config_load_plan loads: train.device = "cuda" is a device to plan for
 * even in a build without the CUDA backend (ts_config_check_device). */
static _Thread_local bool g_planning;

bool ts_config_planning(void) { return g_planning; }

ts_status ts_config_load_plan(ts_config *cfg, const char *path, const char *const *overrides,
                              int n_overrides)
{
    g_planning = true;
    ts_status st = ts_config_load(cfg, path, overrides, n_overrides, 0);
    g_planning = false;
    return st;
}

/* Whether the config file or a --set gave `key` ("model.n_head"). */
static bool key_given(void *ctx, const char *key) { return config_lookup((config_t *)ctx, key) != NULL; }

static ts_status load(ts_config *cfg, const char *path, const char *const *overrides,
                     int n_overrides, int world_size, ts_config_patch_fn patch, void *ctx);

ts_status ts_config_load(ts_config *cfg, const char *path, const char *const *overrides,
                         int n_overrides, int world_size)
{
    return load(cfg, path, overrides, n_overrides, world_size, NULL, NULL);
}

ts_status ts_config_load_patched(ts_config *cfg, const char *const *overrides, int n_overrides,
                                 int world_size, ts_config_patch_fn patch, void *ctx)
{
    return load(cfg, NULL, overrides, n_overrides, world_size, patch, ctx);
}

static ts_status load(ts_config *cfg, const char *path, const char *const *overrides,
                     int n_overrides, int world_size, ts_config_patch_fn patch, void *ctx)
{
    ts_config_defaults(cfg);
    config_t lc;
    config_init(&lc);
    ts_status st = TS_OK;
    g_main_path = path;
    if (path) st = read_file(&lc, path);
    for (int i = 0; i < n_overrides && st == TS_OK; i++)
        st = ts_config_apply_override(&lc, overrides[i]);
    if (st == TS_OK) {
        /* The architecture's defaults first, so the file's keys override them. */
        const char *arch = NULL;
        if (config_lookup_string(&lc, "model.arch", &arch) == CONFIG_TRUE)
            ts_config_arch_defaults(&cfg->model, arch);
        st = read_tree(config_root_setting(&lc), cfg);
        /* model.init's config.json fills the model keys neither the file nor --set gave. */
        if (st == TS_OK) st = ts_config_from_hf(cfg, key_given, &lc);
        /* data.seed defaults to train.seed (whichever value that key was given). */
        if (st == TS_OK && !config_lookup(&lc, "data.seed")) cfg->data.seed = cfg->train.seed;
    }
    g_main_path = NULL;
    if (st == TS_OK && patch) patch(cfg, ctx);
    if (st == TS_OK && cfg->parallel.dp == 0) st = resolve_auto_dp(cfg, world_size);
    if (st == TS_OK) {
        ts_config_resolve_model(&cfg->model);
        st = ts_config_validate(cfg, world_size);
    }
    /* Last, on a valid config: which keys the file and --set gave (lc) against what the
     * rest of the config reads. */
    if (st == TS_OK) st = ts_config_check_inert(cfg, key_given, &lc);
    config_destroy(&lc);
    return st;
}
