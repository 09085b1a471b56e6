/* Streaming llm.c shard output for `tessera data` (see shard_writer.h). */
#include "dataset/shard_writer.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fsutil.h"
#include "dataset/loader.h"

#define HEADER_INTS 256
#define MAX_SHARDS 1000000 /* NNNNNN has six digits */

/* PREFIX's directory ("." for a bare name) and base name, both malloc'd. */
static void split_prefix(const char *prefix, char **dir, char **base)
{
    const char *slash = strrchr(prefix, '/');
    if (!slash) {
        *dir = strdup(".");
        *base = strdup(prefix);
    } else {
        size_t n = slash == prefix ? 1 : (size_t)(slash - prefix);
        *dir = strndup(prefix, n);
        *base = strdup(slash + 1);
    }
    if (!*dir || !*base) ts_panic(__FILE__, __LINE__, "out of memory");
}

/* Whether name is base + "_train_" or "_val_" + six digits + ".bin". */
static int is_shard_name(const char *base, const char *name)
{
    size_t nb = strlen(base);
    if (strncmp(name, base, nb) != 0) return 0;
    const char *p = name + nb;
    if (!strncmp(p, "_train_", 7)) p += 7;
    else if (!strncmp(p, "_val_", 5)) p += 5;
    else return 0;
    for (int i = 0; i < 6; i++, p++)
        if (*p < '0' || *p > '9') return 0;
    return strcmp(p, ".bin") == 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

void ts_shard_paths_free(char **paths)
{
    if (!paths) return;
    for (char **p = paths; *p; p++) free(*p);
    free(paths);
}

static char *join_suffix(const char *prefix, const char *suffix)
{
    size_t n = strlen(prefix) + strlen(suffix) + 1;
    char *s = ts_malloc(n);
    snprintf(s, n, "%s%s", prefix, suffix);
    return s;
}

ts_status ts_shard_outputs_check(const char *prefix, int overwrite, char ***existing)
{
    *existing = NULL;
    size_t len = strlen(prefix);
    if (len == 0 || prefix[len - 1] == '/')
        return ts_fail("--out '%s' names a directory, not a prefix: give --out DIR/NAME, "
                       "and the shards are DIR/NAME_val_000000.bin, DIR/NAME_train_000001.bin, ...",
                       prefix);
    char *dir, *base;
    split_prefix(prefix, &dir, &base);
    ts_status st = TS_OK;
    struct stat sb;
    if (base[0] == '\0' || !strcmp(base, ".") || !strcmp(base, "..")) {
        st = ts_fail("--out '%s' has no name part: give --out DIR/NAME", prefix);
    } else if (stat(dir, &sb) != 0) {
        st = ts_fail("--out %s: directory %s %s: create it first or give another --out", prefix,
                     dir, errno == ENOENT ? "does not exist" : strerror(errno));
    } else if (!S_ISDIR(sb.st_mode)) {
        st = ts_fail("--out %s: %s is %s, not a directory", prefix, dir,
                     S_ISREG(sb.st_mode) ? "a file" : ts_file_kind(sb.st_mode));
    }
    DIR *d = st == TS_OK ? opendir(dir) : NULL;
    if (st == TS_OK && !d) st = ts_fail("--out %s: cannot list directory %s: %s", prefix, dir, strerror(errno));
    char **found = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (!is_shard_name(base, e->d_name)) continue;
        found = ts_grow(found, &cap, n + 1, sizeof *found);
        /* Spelled as the sink spells its shards (PREFIX + suffix), so that a commit
         * knows the ones it replaced by name. */
        found[n++] = join_suffix(prefix, e->d_name + strlen(base));
        found[n] = NULL;
    }
    if (d) closedir(d);
    if (n > 1) qsort(found, n, sizeof *found, cmp_str);
    for (size_t i = 0; st == TS_OK && i < n; i++) {
        struct stat fs;
        if (lstat(found[i], &fs) == 0 && !S_ISREG(fs.st_mode))
            st = ts_fail("output shard %s exists and is %s, not a regular file: remove it or "
                         "give another --out", found[i], ts_file_kind(fs.st_mode));
    }
    if (st == TS_OK && n > 0 && !overwrite)
        st = ts_fail("output shards of --out %s exist already: %s%s%s (%zu in all); pass "
                     "--overwrite to replace them or give another --out", prefix, found[0],
                     n > 1 ? " ... " : "", n > 1 ? found[n - 1] : "", n);
    free(dir);
    free(base);
    if (st != TS_OK) {
        ts_shard_paths_free(found);
        return TS_ERR;
    }
    *existing = found;
    return TS_OK;
}

int ts_shard_is_output_name(const char *prefix, const char *path)
{
    char *pdir, *pbase, *idir, *ibase;
    split_prefix(prefix, &pdir, &pbase);
    split_prefix(path, &idir, &ibase);
    struct stat a, b;
    int same = is_shard_name(pbase, ibase) && stat(pdir, &a) == 0 && stat(idir, &b) == 0 &&
               a.st_dev == b.st_dev && a.st_ino == b.st_ino;
    free(pdir);
    free(pbase);
    free(idir);
    free(ibase);
    return same;
}

ts_status ts_shard_sink_init(ts_shard_sink *s, const char *prefix, int width,
                             uint64_t shard_tokens, const char *split)
{
    memset(s, 0, sizeof *s);
    TS_ASSERT(width == 2 || width == 4);
    TS_ASSERT(shard_tokens >= 1 && shard_tokens <= (uint64_t)INT32_MAX);
    s->prefix = strdup(prefix);
    if (!s->prefix) ts_panic(__FILE__, __LINE__, "out of memory");
    s->width = width;
    s->shard_tokens = shard_tokens;
    s->split = split;
    return TS_OK;
}

static ts_status open_shard(ts_shard_sink *s)
{
    if (s->next_index >= MAX_SHARDS)
        return ts_fail("--out %s: more than %d shards; give a larger --shard-tokens", s->prefix,
                       MAX_SHARDS);
    size_t n = strlen(s->prefix) + 64;
    char *final = ts_malloc(n), *tmp = ts_malloc(n + 32);
    snprintf(final, n, "%s_%s_%06d.bin", s->prefix, s->split, s->next_index);
    snprintf(tmp, n + 32, "%s.tmp.%ld", final, (long)getpid());
    s->f = fopen(tmp, "wb");
    if (!s->f) {
        ts_status st = ts_fail("cannot create output shard %s: %s", tmp, strerror(errno));
        free(final);
        free(tmp);
        return st;
    }
    /* Recorded at once, so that a failure from here on removes it. */
    if (s->n_shards == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 16;
        s->tmp = realloc(s->tmp, (size_t)s->cap * sizeof *s->tmp);
        s->final = realloc(s->final, (size_t)s->cap * sizeof *s->final);
        s->counts = realloc(s->counts, (size_t)s->cap * sizeof *s->counts);
        if (!s->tmp || !s->final || !s->counts) ts_panic(__FILE__, __LINE__, "out of memory");
    }
    s->tmp[s->n_shards] = tmp;
    s->final[s->n_shards] = final;
    s->counts[s->n_shards] = 0;
    s->n_shards++;
    s->next_index++;
    s->count = 0;
    /* The header's count is known when the shard is full: a zero header now, the real
     * one written over it by close_shard. */
    int32_t header[HEADER_INTS] = {0};
    fwrite(header, 1, sizeof header, s->f);
    return TS_OK;
}

static ts_status close_shard(ts_shard_sink *s)
{
    if (!s->f) return TS_OK;
    const char *tmp = s->tmp[s->n_shards - 1];
    int32_t header[HEADER_INTS] = {0};
    header[0] = s->width == 4 ? TS_SHARD32_MAGIC : TS_SHARD_MAGIC;
    header[1] = s->width == 4 ? TS_SHARD32_VERSION : TS_SHARD_VERSION;
    header[2] = (int32_t)s->count;
    int bad = fseek(s->f, 0, SEEK_SET) != 0;
    bad = bad || fwrite(header, 1, sizeof header, s->f) != sizeof header;
    bad = bad || fflush(s->f) != 0 || ferror(s->f) || fsync(fileno(s->f)) != 0;
    int err = errno;
    bad = (fclose(s->f) != 0) || bad;
    if (!err) err = errno;
    s->f = NULL;
    if (bad) return ts_fail("writing output shard %s: %s", tmp, strerror(err ? err : EIO));
    s->counts[s->n_shards - 1] = s->count;
    if (!strcmp(s->split, "val")) s->n_val++;
    else s->n_train++;
    return TS_OK;
}

ts_status ts_shard_sink_split(ts_shard_sink *s, const char *split)
{
    if (close_shard(s) != TS_OK) return TS_ERR;
    s->split = split;
    return TS_OK;
}

ts_status ts_shard_sink_write(ts_shard_sink *s, const uint32_t *ids, size_t n)
{
    while (n > 0) {
        if (!s->f && open_shard(s) != TS_OK) return TS_ERR;
        uint64_t room = s->shard_tokens - s->count;
        size_t k = n < room ? n : (size_t)room;
        if (s->width == 4) {
            fwrite(ids, 4, k, s->f);
        } else {
            if (s->buf_cap < k * 2) {
                free(s->buf);
                s->buf_cap = k * 2;
                s->buf = ts_malloc(s->buf_cap);
            }
            uint16_t *narrow = (uint16_t *)(void *)s->buf;
            for (size_t i = 0; i < k; i++) narrow[i] = (uint16_t)ids[i];
            fwrite(narrow, 2, k, s->f);
        }
        if (ferror(s->f))
            return ts_fail("writing output shard %s: %s", s->tmp[s->n_shards - 1], strerror(errno));
        s->count += k;
        ids += k;
        n -= k;
        if (s->count == s->shard_tokens && close_shard(s) != TS_OK) return TS_ERR;
    }
    return TS_OK;
}

ts_status ts_shard_sink_commit(ts_shard_sink *s, char **stale)
{
    if (close_shard(s) != TS_OK) return TS_ERR;
    for (int i = 0; i < s->n_shards; i++) {
        if (rename(s->tmp[i], s->final[i]) != 0)
            return ts_fail("renaming output shard %s to %s: %s", s->tmp[i], s->final[i],
                           strerror(errno));
        free(s->tmp[i]);
        s->tmp[i] = NULL; /* renamed: nothing to remove */
    }
    for (char **p = stale; p && *p; p++) {
        int replaced = 0;
        for (int i = 0; i < s->n_shards && !replaced; i++) replaced = !strcmp(*p, s->final[i]);
        if (!replaced && unlink(*p) != 0 && errno != ENOENT)
            return ts_fail("removing the earlier run's shard %s (--overwrite): %s", *p,
                           strerror(errno));
    }
    return TS_OK;
}

void ts_shard_sink_free(ts_shard_sink *s)
{
    if (s->f) fclose(s->f);
    for (int i = 0; i < s->n_shards; i++) {
        if (s->tmp[i]) unlink(s->tmp[i]);
        free(s->tmp[i]);
        free(s->final[i]);
    }
    free(s->tmp);
    free(s->final);
    free(s->counts);
    free(s->buf);
    free(s->prefix);
    memset(s, 0, sizeof *s);
}
