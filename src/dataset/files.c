/* Glob expansion of data paths (files.h). */
#include <stddef.h> /* core/error.h uses size_t without including it */

#include "dataset/files.h"

#include <errno.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>

int ts_data_is_pattern(const char *s) { return strpbrk(s, "*?[") != NULL; }

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static char *dup_str(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = ts_malloc(n);
    memcpy(p, s, n);
    return p;
}

/* Append `add` paths to *out, refusing more than TS_MAX_DATA_FILES in all. */
static ts_status append(const char *key, char ***out, int *n, size_t *cap, char *const *add,
                        size_t n_add)
{
    if ((size_t)*n + n_add > TS_MAX_DATA_FILES)
        return ts_fail("%s names more than %d files; at most %d are supported (merge shards "
                       "into bigger ones with `tessera data`)",
                       key, TS_MAX_DATA_FILES, TS_MAX_DATA_FILES);
    for (size_t i = 0; i < n_add; i++) {
        *out = ts_grow(*out, cap, (size_t)*n, sizeof **out);
        (*out)[(*n)++] = dup_str(add[i]);
    }
    return TS_OK;
}

ts_status ts_data_expand(const char *key, const char *const *patterns, int n, char ***paths,
                         int *n_paths)
{
    char **out = NULL;
    int count = 0;
    size_t cap = 0;
    ts_status st = TS_OK;
    for (int i = 0; i < n && st == TS_OK; i++) {
        const char *p = patterns[i];
        if (!ts_data_is_pattern(p)) {
            char *one[1] = {(char *)p};
            st = append(key, &out, &count, &cap, one, 1);
            continue;
        }
        glob_t g;
        memset(&g, 0, sizeof g);
        /* Sorted here by strcmp, not by glob's locale-dependent collation. */
        int rc = glob(p, GLOB_NOSORT | GLOB_ERR, NULL, &g);
        if (rc == GLOB_NOMATCH)
            st = ts_fail("%s: the pattern \"%s\" matches no file (check the directory and the "
                         "pattern; a path without * ? [ is read as it is)", key, p);
        else if (rc == GLOB_ABORTED)
            st = ts_fail("%s: cannot read a directory of the pattern \"%s\": %s", key, p,
                         strerror(errno));
        else if (rc != 0)
            st = ts_fail("%s: cannot expand the pattern \"%s\" (glob error %d)", key, p, rc);
        else {
            qsort(g.gl_pathv, g.gl_pathc, sizeof *g.gl_pathv, cmp_str);
            st = append(key, &out, &count, &cap, g.gl_pathv, g.gl_pathc);
        }
        globfree(&g);
    }
    if (st != TS_OK) {
        ts_data_free_paths(out, count);
        return st;
    }
    *paths = out;
    *n_paths = count;
    return TS_OK;
}

void ts_data_free_paths(char **paths, int n)
{
    for (int i = 0; i < n; i++) free(paths[i]);
    free(paths);
}

ts_status ts_data_open_patterns(ts_dataset *ds, const char *key, const char *const *patterns,
                                int n, int vocab_size)
{
    memset(ds, 0, sizeof *ds);
    char **paths = NULL;
    int n_paths = 0;
    if (ts_data_expand(key, patterns, n, &paths, &n_paths) != TS_OK) return TS_ERR;
    ts_status st = ts_data_open_key(ds, key, (const char *const *)paths, n_paths, vocab_size);
    ts_data_free_paths(paths, n_paths);
    return st;
}

ts_status ts_data_check_encoded(const ts_dataset *ds, const char *key, const char *tokenizer)
{
    if (!tokenizer || !tokenizer[0]) return TS_OK;
    for (int i = 0; i < ds->n_shards; i++) {
        const ts_shard *s = &ds->shards[i];
        if (!s->is_text) continue;
        return ts_fail("%s: %s is a text file (it has no llm.c shard magic), which is read "
                       "as byte ids 0-255, but model.tokenizer = \"%s\" trains on %s token "
                       "ids: tokenize it first with `tessera data %s --encoding %s --out "
                       "PREFIX` and train on PREFIX_train_*.bin",
                       key, s->path, tokenizer, tokenizer, s->path, tokenizer);
    }
    return TS_OK;
}
