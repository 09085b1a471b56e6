/* Streaming llm.c shard output for `tessera data` (see shard_writer.h). */
#define _GNU_SOURCE /* renameat2, RENAME_NOREPLACE */
#include "dataset/shard_writer.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
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

/* Whether name is a temporary a run of this prefix leaves while it writes or commits:
 * a shard name + ".tmp." or ".old." + a pid. */
static int is_temp_name(const char *base, const char *name)
{
    const char *dot = strstr(name, ".bin.");
    if (!dot) return 0;
    char shard[NAME_MAX + 1];
    size_t n = (size_t)(dot - name) + 4;
    if (n > NAME_MAX) return 0;
    memcpy(shard, name, n);
    shard[n] = '\0';
    if (!is_shard_name(base, shard)) return 0;
    const char *p = dot + 4;
    if (strncmp(p, ".tmp.", 5) != 0 && strncmp(p, ".old.", 5) != 0) return 0;
    p += 5;
    if (!*p) return 0;
    for (; *p; p++)
        if (*p < '0' || *p > '9') return 0;
    return 1;
}

/* Whether a lock file's content is what take_lock writes: empty, or a pid and a newline.
 * Anything else is somebody's file under that name, not to be truncated. */
static int lock_content_ok(int fd)
{
    char buf[34];
    ssize_t n = pread(fd, buf, sizeof buf, 0);
    if (n < 0 || n > 32) return 0;
    for (ssize_t i = 0; i < n; i++)
        if (!((buf[i] >= '0' && buf[i] <= '9') || (buf[i] == '\n' && i == n - 1))) return 0;
    return 1;
}

/* Lock PREFIX.lock. A run removes its lock file when it ends, so a file opened just
 * before its holder removed it can be locked, yet no longer be PREFIX.lock: the lock
 * counts only when the path still names the locked inode; otherwise open it again. */
static ts_status take_lock(ts_shard_claim *c, const char *prefix)
{
    for (int tries = 0; tries < 100; tries++) {
        int fd = open(c->lock_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
        struct stat a, b;
        if (fd < 0) {
            int err = errno;
            if (lstat(c->lock_path, &a) == 0 && !S_ISREG(a.st_mode))
                return ts_fail("--out %s: its lock file %s is not a regular file (it is %s): "
                               "remove it or give another --out", prefix, c->lock_path,
                               ts_file_kind(a.st_mode));
            return ts_fail("--out %s: cannot open its lock file %s: %s", prefix, c->lock_path,
                           strerror(err));
        }
        if (fstat(fd, &a) != 0 || !S_ISREG(a.st_mode)) {
            close(fd);
            return ts_fail("--out %s: its lock file %s is not a regular file (it is %s): "
                           "remove it or give another --out", prefix, c->lock_path,
                           ts_file_kind(a.st_mode));
        }
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            int err = errno;
            char holder[40];
            ts_lock_file_holder(fd, holder, sizeof holder);
            close(fd);
            if (err == EWOULDBLOCK)
                return ts_fail("--out %s is in use by another run (pid %s, its lock file %s): "
                               "two runs on one prefix would mix their shards; wait for it "
                               "to end, stop it, or give another --out", prefix, holder,
                               c->lock_path);
            return ts_fail("--out %s: cannot lock %s: %s", prefix, c->lock_path, strerror(err));
        }
        if (stat(c->lock_path, &b) != 0 || a.st_dev != b.st_dev || a.st_ino != b.st_ino) {
            close(fd); /* its holder removed it meanwhile: not the lock any more */
            continue;
        }
        if (!lock_content_ok(fd)) {
            close(fd);
            return ts_fail("--out %s: %s exists and is not a lock file of `tessera data` "
                           "(it holds something else than a pid): move it away or give "
                           "another --out", prefix, c->lock_path);
        }
        char line[32];
        int n = snprintf(line, sizeof line, "%ld\n", (long)getpid());
        if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)n, 0) != n) {
            int err = errno;
            close(fd);
            return ts_fail("--out %s: cannot write its lock file %s: %s", prefix, c->lock_path,
                           strerror(err));
        }
        c->fd = fd;
        return TS_OK;
    }
    return ts_fail("--out %s: its lock file %s keeps being replaced: is another program "
                   "removing it?", prefix, c->lock_path);
}

void ts_shard_claim_release(ts_shard_claim *c)
{
    if (c->fd > 0) {
        /* Removed while still locked, and only when it is still ours (take_lock's rule
         * makes a run that opened it before the removal open it again). */
        struct stat a, b;
        if (fstat(c->fd, &a) == 0 && lstat(c->lock_path, &b) == 0 && a.st_dev == b.st_dev &&
            a.st_ino == b.st_ino)
            unlink(c->lock_path);
        close(c->fd);
    }
    free(c->lock_path);
    ts_shard_paths_free(c->existing);
    memset(c, 0, sizeof *c);
    c->fd = -1;
}

ts_status ts_shard_outputs_claim(ts_shard_claim *c, const char *prefix, int overwrite)
{
    memset(c, 0, sizeof *c);
    c->fd = -1;
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
    if (st == TS_OK) {
        c->lock_path = join_suffix(prefix, ".lock");
        st = take_lock(c, prefix);
    }
    DIR *d = st == TS_OK ? opendir(dir) : NULL;
    if (st == TS_OK && !d) st = ts_fail("--out %s: cannot list directory %s: %s", prefix, dir, strerror(errno));
    char **found = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while (st == TS_OK && d && (e = readdir(d)) != NULL) {
        if (is_temp_name(base, e->d_name)) {
            /* A killed run's: this run holds the lock, so no live run is writing it. */
            char *path = join_suffix(prefix, e->d_name + strlen(base));
            struct stat fs;
            if (lstat(path, &fs) == 0 && S_ISREG(fs.st_mode)) {
                if (unlink(path) == 0) c->n_removed++;
                else if (errno != ENOENT)
                    st = ts_fail("--out %s: cannot remove %s, a temporary file an earlier run "
                                 "left: %s", prefix, path, strerror(errno));
            }
            free(path);
            continue;
        }
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
    c->existing = found;
    if (st != TS_OK) {
        ts_shard_claim_release(c);
        return TS_ERR;
    }
    return TS_OK;
}

/* Whether path's directory is prefix's (by device and inode) and its name passes
 * is_name(prefix's base, path's name). */
static int same_dir_name(const char *prefix, const char *path,
                         int (*is_name)(const char *base, const char *name))
{
    char *pdir, *pbase, *idir, *ibase;
    split_prefix(prefix, &pdir, &pbase);
    split_prefix(path, &idir, &ibase);
    struct stat a, b;
    int same = is_name(pbase, ibase) && stat(pdir, &a) == 0 && stat(idir, &b) == 0 &&
               a.st_dev == b.st_dev && a.st_ino == b.st_ino;
    free(pdir);
    free(pbase);
    free(idir);
    free(ibase);
    return same;
}

static int is_lock_name(const char *base, const char *name)
{
    size_t n = strlen(base);
    return strncmp(name, base, n) == 0 && strcmp(name + n, ".lock") == 0;
}

int ts_shard_is_output_name(const char *prefix, const char *path)
{
    return same_dir_name(prefix, path, is_shard_name);
}

int ts_shard_is_lock_name(const char *prefix, const char *path)
{
    return same_dir_name(prefix, path, is_lock_name);
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
        if (!s->tmp || !s->final || !s->counts)
            ts_out_of_memory((size_t)s->cap * (sizeof *s->tmp + sizeof *s->final + sizeof *s->counts),
                             "the list of output shards");
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

/* rename(2) that never replaces an existing file: the final names are free once the
 * old shards are set aside, and a file that appears there meanwhile is not ours to
 * destroy. Where the file system cannot say no-replace (EINVAL: NFS, some FUSE), a
 * check just before the rename does nearly as well, since this run holds the lock. */
static int rename_noreplace(const char *from, const char *to)
{
#ifdef RENAME_NOREPLACE
    if (renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) == 0) return 0;
    if (errno != EINVAL && errno != ENOSYS) return -1;
#endif
    struct stat sb;
    if (lstat(to, &sb) == 0) {
        errno = EEXIST;
        return -1;
    }
    return rename(from, to);
}

/* Undo the first n renames from[i] -> to[i] (to[i] back to from[i]); the first failure
 * is said in `why` (cap bytes) when it is still empty. */
static void undo_renames(char *const *from, char *const *to, int n, char *why, size_t cap)
{
    for (int i = n - 1; i >= 0; i--) {
        if (!to[i] || rename(to[i], from[i]) == 0 || why[0]) continue;
        snprintf(why, cap, "; undoing the rename of %s failed too (%s): it is left as %s",
                 from[i], strerror(errno), to[i]);
    }
}

ts_status ts_shard_sink_commit(ts_shard_sink *s, char **stale)
{
    if (close_shard(s) != TS_OK) return TS_ERR;
    int n_old = 0;
    while (stale && stale[n_old]) n_old++;
    /* 1. The earlier run's shards aside (--overwrite), so that a failure below can put
     * them back, and no new shard replaces a file by its rename. aside[i] NULL: stale[i]
     * was gone already. */
    char **aside = ts_calloc((size_t)n_old + 1, sizeof *aside);
    char undo[1024] = "";
    int failed = 0, n_aside = 0, n_renamed = 0;
    for (; !failed && n_aside < n_old; n_aside++) {
        size_t n = strlen(stale[n_aside]) + 32;
        aside[n_aside] = ts_malloc(n);
        snprintf(aside[n_aside], n, "%s.old.%ld", stale[n_aside], (long)getpid());
        if (rename(stale[n_aside], aside[n_aside]) == 0) continue;
        int err = errno;
        free(aside[n_aside]);
        aside[n_aside] = NULL;
        if (err == ENOENT) continue; /* gone meanwhile: nothing to keep */
        ts_fail("moving the earlier run's shard %s aside (--overwrite): %s", stale[n_aside],
                strerror(err));
        failed = 1;
    }
    /* 2. The new shards to their final names. */
    for (; !failed && n_renamed < s->n_shards; n_renamed++) {
        if (rename_noreplace(s->tmp[n_renamed], s->final[n_renamed]) == 0) continue;
        ts_fail("renaming output shard %s to %s: %s", s->tmp[n_renamed], s->final[n_renamed],
                strerror(errno));
        failed = 1;
        break;
    }
    if (failed) {
        /* 3. All or nothing: the new shards back to their temporary names (which
         * ts_shard_sink_free removes), the old ones back to theirs. */
        undo_renames(s->tmp, s->final, n_renamed, undo, sizeof undo);
        undo_renames(stale, aside, n_aside, undo, sizeof undo);
        char *why = strdup(ts_error_message());
        if (!why) ts_panic(__FILE__, __LINE__, "out of memory");
        ts_fail("%s: no shard of this run is left%s%s", why,
                n_old && !undo[0] ? ", and the earlier run's shards are as they were" : "", undo);
        free(why);
    } else {
        for (int i = 0; i < s->n_shards; i++) {
            free(s->tmp[i]);
            s->tmp[i] = NULL; /* renamed: nothing to remove */
        }
        /* 4. The old shards set aside are not needed any more. Failing to remove one does
         * not undo a complete corpus: a warning, and the next run on PREFIX removes it. */
        for (int i = 0; i < n_aside; i++)
            if (aside[i] && unlink(aside[i]) != 0 && errno != ENOENT)
                fprintf(stderr, "tessera: warning: cannot remove %s, the earlier run's shard "
                        "(--overwrite): %s\n", aside[i], strerror(errno));
    }
    for (int i = 0; i < n_old; i++) free(aside[i]);
    free(aside);
    return failed ? TS_ERR : TS_OK;
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
