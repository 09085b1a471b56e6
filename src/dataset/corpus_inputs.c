/* Input discovery and checks for `tessera data` (see corpus_inputs.h). */
#include "dataset/corpus_inputs.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fsutil.h"
#include "dataset/loader.h"
#include "dataset/shard_writer.h"

typedef struct {
    char **v;
    size_t n, cap;
} path_list;

static void list_push(path_list *l, char *p)
{
    l->v = ts_grow(l->v, &l->cap, l->n, sizeof *l->v);
    l->v[l->n++] = p;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* Every file under dir into l (unsorted); lstat, so a link to a directory is not
 * followed (no loops), while a link to a file is read as that file. */
static ts_status walk(const char *dir, path_list *l)
{
    DIR *d = opendir(dir);
    if (!d) return ts_fail("input directory %s: %s", dir, strerror(errno));
    ts_status st = TS_OK;
    struct dirent *e;
    while (st == TS_OK && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue; /* hidden, and . and .. */
        size_t n = strlen(dir) + strlen(e->d_name) + 2;
        char *p = ts_malloc(n);
        snprintf(p, n, "%s%s%s", dir, ends_with(dir, "/") ? "" : "/", e->d_name);
        struct stat sb;
        if (lstat(p, &sb) != 0) {
            st = ts_fail("input %s: %s", p, strerror(errno));
            free(p);
        } else if (S_ISDIR(sb.st_mode)) {
            st = walk(p, l);
            free(p);
        } else if (S_ISLNK(sb.st_mode) && stat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            free(p); /* a link to a directory: not followed */
        } else {
            list_push(l, p);
        }
    }
    closedir(d);
    return st;
}

/* A file that can be read: a regular file, opened, not a shard. */
static ts_status check_file(const char *path, const char *out_prefix, uint64_t *size)
{
    if (ts_shard_is_output_name(out_prefix, path))
        return ts_fail("input %s is named as one of this run's output shards (--out %s): "
                       "give `tessera data` the text, not its shards", path, out_prefix);
    if (ts_shard_is_lock_name(out_prefix, path))
        return ts_fail("input %s is this run's lock file (--out %s): give `tessera data` the "
                       "text", path, out_prefix);
    int fd = ts_open_input(path); /* cannot block on a FIFO */
    if (fd < 0) return ts_fail("input %s: %s", path, strerror(errno));
    if (ts_check_input(fd, path, "input", "a text or JSONL file", 0) != TS_OK) {
        close(fd);
        return TS_ERR;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int err = errno;
        close(fd);
        return ts_fail("input %s: %s", path, strerror(err));
    }
    /* The loader's rule for text (loader.h): no NUL byte in the first 4 KiB. A binary
     * file in a directory (an image, a .gz) would otherwise become tokens of noise. */
    unsigned char head[4096];
    ssize_t r, got = 0;
    while (got < (ssize_t)sizeof head &&
           ((r = read(fd, head + got, sizeof head - (size_t)got)) > 0 || (r < 0 && errno == EINTR)))
        if (r > 0) got += r;
    int err = errno;
    close(fd);
    if (r < 0) return ts_fail("input %s: %s", path, strerror(err));
    if (got >= 4) {
        int32_t m;
        memcpy(&m, head, 4);
        if (m == TS_SHARD_MAGIC || m == TS_SHARD32_MAGIC)
            return ts_fail("input %s is an llm.c token shard (magic %d), not text: give "
                           "`tessera data` the text it was made from", path, (int)m);
    }
    if (got >= 2 && head[0] == 0x1f && head[1] == 0x8b)
        return ts_fail("input %s is gzip-compressed: decompress it first (tessera data reads "
                       "plain text and JSONL)", path);
    const unsigned char *nul = memchr(head, 0, (size_t)got);
    if (nul)
        return ts_fail("input %s is not text: it has a NUL byte at offset %td; remove it from "
                       "the inputs", path, nul - head);
    *size = (uint64_t)sb.st_size;
    return TS_OK;
}

static void add_file(ts_corpus_files *out, size_t *cap, char *path, uint64_t size, int jsonl)
{
    out->files = ts_grow(out->files, cap, (size_t)out->n, sizeof *out->files);
    out->files[out->n].path = path;
    out->files[out->n].size = size;
    out->files[out->n].jsonl = jsonl;
    out->n++;
    out->total_bytes += size;
}

ts_status ts_corpus_files_collect(ts_corpus_files *out, const char *const *paths, int n_paths,
                                  int force_jsonl, const char *out_prefix)
{
    memset(out, 0, sizeof *out);
    size_t cap = 0;
    for (int i = 0; i < n_paths; i++) {
        struct stat sb;
        path_list l = {0};
        int is_dir = stat(paths[i], &sb) == 0 && S_ISDIR(sb.st_mode);
        if (is_dir) {
            if (walk(paths[i], &l) != TS_OK) goto fail_list;
            if (l.n == 0) {
                ts_fail("input directory %s holds no file (names starting with '.' are "
                        "skipped)", paths[i]);
                goto fail_list;
            }
            qsort(l.v, l.n, sizeof *l.v, cmp_str);
        } else {
            char *p = strdup(paths[i]);
            if (!p) ts_panic(__FILE__, __LINE__, "out of memory");
            list_push(&l, p);
        }
        for (size_t k = 0; k < l.n; k++) {
            uint64_t size = 0;
            if (is_dir && ts_shard_is_lock_name(out_prefix, l.v[k])) {
                free(l.v[k]); /* this run's lock file, under a directory it reads */
                l.v[k] = NULL;
                continue;
            }
            if (check_file(l.v[k], out_prefix, &size) != TS_OK) goto fail_list;
            int jsonl = force_jsonl || ends_with(l.v[k], ".jsonl") || ends_with(l.v[k], ".json-lines");
            add_file(out, &cap, l.v[k], size, jsonl);
            l.v[k] = NULL; /* owned by out now */
        }
        free(l.v);
        continue;
    fail_list:
        for (size_t k = 0; k < l.n; k++) free(l.v[k]);
        free(l.v);
        ts_corpus_files_free(out);
        return TS_ERR;
    }
    return TS_OK;
}

void ts_corpus_files_free(ts_corpus_files *f)
{
    for (int i = 0; i < f->n; i++) free(f->files[i].path);
    free(f->files);
    memset(f, 0, sizeof *f);
}
