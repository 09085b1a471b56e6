/* Token data: every file is mapped read-only and checked once at open (header, size,
 * every token id), so the training loop reads windows without further checks. */
#include <stddef.h> /* core/error.h uses size_t without including it */

#include "data/loader.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "token shards are little-endian; the loader assumes a little-endian host");

#define SHARD_HEADER_INTS 256
#define SHARD_HEADER_BYTES (SHARD_HEADER_INTS * 4)
#define LLAMA3_MAGIC 20240801

static int32_t read_i32(const unsigned char *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint32_t bswap32(uint32_t v) { return __builtin_bswap32(v); }

static char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = ts_malloc(n);
    memcpy(p, s, n);
    return p;
}

static ts_status open_error(const char *path, int err)
{
    if (err == ENOENT)
        return ts_fail("data file %s: %s (set data.train or create it with `tessera data "
                       "TEXT OUT.bin`)", path, strerror(err));
    return ts_fail("data file %s: %s", path, strerror(err));
}

/* Map the whole file read-only into s->map / s->map_bytes. */
static ts_status map_file(ts_shard *s, const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return open_error(path, errno);
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return open_error(path, err);
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return ts_fail("data file %s is not a regular file", path);
    }
    if (st.st_size == 0) {
        close(fd);
        return ts_fail("data file %s is empty (expected an llm.c token shard or a text file)",
                       path);
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    close(fd);
    if (m == MAP_FAILED) return ts_fail("data file %s: cannot map it: %s", path, strerror(err));
    s->map = m;
    s->map_bytes = (uint64_t)st.st_size;
    return TS_OK;
}

/* Decide shard or text and set is_text/count; checks the shard header and size. */
static ts_status classify(ts_shard *s)
{
    const char *path = s->path;
    uint64_t size = s->map_bytes;
    int32_t magic = size >= 4 ? read_i32(s->map) : 0;
    if (magic != TS_SHARD_MAGIC) {
        /* Not a shard: read it as text, unless it looks like a shard gone wrong. */
        if (size >= 4 && bswap32((uint32_t)magic) == (uint32_t)TS_SHARD_MAGIC)
            return ts_fail("data file %s starts with the llm.c shard magic %d in big-endian "
                           "byte order; shards must be little-endian (rewrite it with "
                           "`tessera data` or llm.c's writer)", path, TS_SHARD_MAGIC);
        if (size >= 4 && (magic == LLAMA3_MAGIC ||
                          bswap32((uint32_t)magic) == (uint32_t)LLAMA3_MAGIC))
            return ts_fail("data file %s is a Llama-3 token shard (magic %d, uint32 tokens), "
                           "which tessera does not read; use a GPT-2 shard (magic %d) or a "
                           "text file", path, LLAMA3_MAGIC, TS_SHARD_MAGIC);
        s->is_text = 1;
        s->count = size;
        return TS_OK;
    }
    if (size < SHARD_HEADER_BYTES)
        return ts_fail("data file %s is truncated: it starts with the shard magic %d but has "
                       "only %" PRIu64 " bytes, less than the %d-byte header",
                       path, TS_SHARD_MAGIC, size, SHARD_HEADER_BYTES);
    int32_t version = read_i32(s->map + 4);
    int32_t count = read_i32(s->map + 8);
    if (version != TS_SHARD_VERSION)
        return ts_fail("data file %s: shard version %d, expected %d (an llm.c GPT-2 shard "
                       "with uint16 tokens)", path, version, TS_SHARD_VERSION);
    if (count < 0)
        return ts_fail("data file %s: shard header has a negative token count %d", path, count);
    uint64_t want = SHARD_HEADER_BYTES + 2 * (uint64_t)count;
    if (size < want)
        return ts_fail("data file %s is truncated: header says %d tokens (%" PRIu64
                       " bytes) but the file has %" PRIu64 " bytes", path, count, want, size);
    if (size > want)
        return ts_fail("data file %s has %" PRIu64 " bytes of trailing data: header says %d "
                       "tokens (%" PRIu64 " bytes) but the file has %" PRIu64 " bytes",
                       path, size - want, count, want, size);
    s->is_text = 0;
    s->count = (uint64_t)count;
    return TS_OK;
}

static inline int shard_token(const ts_shard *s, uint64_t i)
{
    if (s->is_text) return s->map[i];
    uint16_t v;
    memcpy(&v, s->map + SHARD_HEADER_BYTES + 2 * i, 2);
    return v;
}

/* One pass over the tokens: every id must be < vocab_size. */
static ts_status check_tokens(const ts_shard *s, int vocab_size)
{
    if (vocab_size >= 65536 || (s->is_text && vocab_size >= 256)) return TS_OK;
    for (uint64_t i = 0; i < s->count; i++) {
        int tok = shard_token(s, i);
        if (tok >= vocab_size)
            return ts_fail("data file %s: token %d at position %" PRIu64 " is >= vocab_size "
                           "%d (is model.vocab_size right for this data?)%s",
                           s->path, tok, i, vocab_size,
                           s->is_text ? " (a text file's tokens are its bytes, 0..255)" : "");
    }
    return TS_OK;
}

ts_status ts_data_open(ts_dataset *ds, const char *const *paths, int n_paths, int vocab_size)
{
    memset(ds, 0, sizeof *ds);
    if (n_paths < 1) return ts_fail("no data files given (set data.train)");
    if (vocab_size < 1) return ts_fail("vocab_size %d must be positive", vocab_size);
    ds->shards = ts_calloc((size_t)n_paths, sizeof(ts_shard));
    ds->vocab_size = vocab_size;
    for (int i = 0; i < n_paths; i++) {
        ts_shard *s = &ds->shards[i];
        ds->n_shards = i + 1; /* so close() releases whatever this one got */
        s->path = xstrdup(paths[i]);
        if (map_file(s, s->path) != TS_OK || classify(s) != TS_OK ||
            check_tokens(s, vocab_size) != TS_OK) {
            ts_data_close(ds);
            return TS_ERR;
        }
        s->first_token = ds->n_tokens;
        ds->n_tokens += s->count;
    }
    return TS_OK;
}

void ts_data_close(ts_dataset *ds)
{
    for (int i = 0; i < ds->n_shards; i++) {
        ts_shard *s = &ds->shards[i];
        if (s->map) munmap((void *)s->map, (size_t)s->map_bytes);
        free(s->path);
    }
    free(ds->shards);
    memset(ds, 0, sizeof *ds);
}

uint64_t ts_data_num_windows(const ts_dataset *ds, int T)
{
    TS_ASSERT(T >= 1);
    if (ds->n_tokens < (uint64_t)T + 1) return 0;
    return (ds->n_tokens - 1) / (uint64_t)T;
}

/* Index of the shard holding stream position pos (binary search on first_token). */
static int find_shard(const ts_dataset *ds, uint64_t pos)
{
    int lo = 0, hi = ds->n_shards - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (ds->shards[mid].first_token <= pos)
            lo = mid;
        else
            hi = mid - 1;
    }
    /* Skip empty shards that share this first_token. */
    while (lo < ds->n_shards - 1 && pos >= ds->shards[lo].first_token + ds->shards[lo].count)
        lo++;
    return lo;
}

void ts_data_window(const ts_dataset *ds, uint64_t k, int T, int *inputs, int *targets)
{
    TS_ASSERT(T >= 1 && k < ts_data_num_windows(ds, T));
    uint64_t pos = k * (uint64_t)T;
    int si = find_shard(ds, pos);
    uint64_t local = pos - ds->shards[si].first_token;
    for (int j = 0; j <= T; j++) {
        while (local >= ds->shards[si].count) { /* cross into the next file */
            si++;
            local = 0;
            TS_ASSERT(si < ds->n_shards);
        }
        int tok = shard_token(&ds->shards[si], local++);
        if (j < T) inputs[j] = tok;
        if (j > 0) targets[j - 1] = tok;
    }
}

void ts_data_microbatch(const ts_dataset *ds, int64_t step, int global_batch, int dp,
                        int dp_rank, int micro_batch, int mb, int T, int *inputs, int *targets)
{
    uint64_t S = ts_data_num_windows(ds, T);
    TS_ASSERT(S >= 1);
    TS_ASSERT(step >= 0 && global_batch >= 1 && dp >= 1 && global_batch % dp == 0);
    TS_ASSERT(dp_rank >= 0 && dp_rank < dp && micro_batch >= 1 && mb >= 0);
    int64_t B = global_batch;
    int64_t first = (int64_t)dp_rank * B / dp + (int64_t)mb * micro_batch;
    TS_ASSERT(first + micro_batch <= ((int64_t)dp_rank + 1) * B / dp);
    for (int r = 0; r < micro_batch; r++) {
        uint64_t g = (uint64_t)step * (uint64_t)B + (uint64_t)(first + r);
        ts_data_window(ds, g % S, T, inputs + (size_t)r * T, targets + (size_t)r * T);
    }
}

/* ---------------------------------------------------------------------------------- */
/* Writing shards                                                                      */

/* Best effort: make the rename durable by syncing the directory holding `path`. */
static void sync_parent_dir(const char *path)
{
    char *dir = xstrdup(path);
    char *slash = strrchr(dir, '/');
    if (slash == dir)
        slash[1] = '\0';
    else if (slash)
        *slash = '\0';
    else
        strcpy(dir, ".");
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    free(dir);
}

ts_status ts_data_write_shard(const char *out_path, const uint16_t *tokens, uint64_t count)
{
    if (count > (uint64_t)INT32_MAX)
        return ts_fail("cannot write %s: %" PRIu64 " tokens is more than a shard can hold "
                       "(%d); split the data into several shards", out_path, count, INT32_MAX);
    int32_t header[SHARD_HEADER_INTS] = {0};
    header[0] = TS_SHARD_MAGIC;
    header[1] = TS_SHARD_VERSION;
    header[2] = (int32_t)count;

    size_t tlen = strlen(out_path) + 32;
    char *tmp = ts_malloc(tlen);
    snprintf(tmp, tlen, "%s.tmp.%ld", out_path, (long)getpid());
    FILE *fp = fopen(tmp, "wb");
    if (!fp) {
        ts_status s = ts_fail("cannot create %s: %s", tmp, strerror(errno));
        free(tmp);
        return s;
    }
    int ok = fwrite(header, 1, sizeof header, fp) == sizeof header &&
             (count == 0 || fwrite(tokens, 2, (size_t)count, fp) == (size_t)count) &&
             fflush(fp) == 0 && fsync(fileno(fp)) == 0;
    int err = errno;
    if (fclose(fp) != 0 && ok) {
        ok = 0;
        err = errno;
    }
    if (ok && rename(tmp, out_path) != 0) {
        ok = 0;
        err = errno;
    }
    if (!ok) {
        unlink(tmp);
        free(tmp);
        return ts_fail("writing %s: %s", out_path, strerror(err));
    }
    free(tmp);
    sync_parent_dir(out_path);
    return TS_OK;
}

ts_status ts_data_write_text_shard(const char *text_path, const char *out_path)
{
    int fd = open(text_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ts_fail("text file %s: %s", text_path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return ts_fail("text file %s: %s", text_path, strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return ts_fail("text file %s is not a regular file", text_path);
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size == 0) {
        close(fd);
        return ts_fail("text file %s is empty: nothing to tokenize", text_path);
    }
    if (size > (uint64_t)INT32_MAX) {
        close(fd);
        return ts_fail("text file %s has %" PRIu64 " bytes, more than one shard can hold (%d); "
                       "split it", text_path, size, INT32_MAX);
    }
    unsigned char *bytes = ts_malloc((size_t)size);
    uint64_t got = 0;
    while (got < size) {
        ssize_t r = read(fd, bytes + got, (size_t)(size - got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int err = errno;
            close(fd);
            free(bytes);
            return r == 0 ? ts_fail("text file %s shrank while reading it", text_path)
                          : ts_fail("text file %s: %s", text_path, strerror(err));
        }
        got += (uint64_t)r;
    }
    close(fd);
    uint16_t *tokens = ts_malloc((size_t)size * sizeof(uint16_t));
    for (uint64_t i = 0; i < size; i++) tokens[i] = bytes[i];
    free(bytes);
    ts_status s = ts_data_write_shard(out_path, tokens, size);
    free(tokens);
    return s;
}
