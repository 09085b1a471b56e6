/* Token data: every file is mapped read-only and checked once at open (header, size,
 * every token id), so the training loop reads windows without further checks. */
#include <stddef.h> /* core/error.h uses size_t without including it */

#include "dataset/loader.h"

#include "core/fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "token shards are little-endian; the loader assumes a little-endian host");

#define SHARD_HEADER_INTS 256
#define SHARD_HEADER_BYTES (SHARD_HEADER_INTS * 4)
#define TEXT_SNIFF_BYTES 4096 /* how much of a file the text test looks at */

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

/* `key` is the config key the path came from ("data.train", "data.val"). */
static ts_status open_error(const char *key, const char *path, int err)
{
    if (err == ENOENT)
        return ts_fail("data file %s: %s (set %s or create it with `tessera data "
                       "TEXT OUT.bin`)", path, strerror(err), key);
    return ts_fail("data file %s: %s", path, strerror(err));
}

/* Map the whole file read-only into s->map / s->map_bytes. */
static ts_status map_file(ts_shard *s, const char *key, const char *path)
{
    int fd = ts_open_input(path); /* cannot block: core/fsutil.h */
    if (fd < 0) return open_error(key, path, errno);
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return open_error(key, path, err);
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

static int ends_with_bin(const char *path)
{
    size_t n = strlen(path);
    return n >= 4 && strcasecmp(path + n - 4, ".bin") == 0;
}

/* Offset of the first NUL byte among the first TEXT_SNIFF_BYTES, or -1. ASCII and
 * UTF-8 text has none; an llm.c header is mostly zero bytes, and so is the high byte
 * of every uint16 token below 256. */
static int64_t first_nul(const ts_shard *s)
{
    uint64_t n = s->map_bytes < TEXT_SNIFF_BYTES ? s->map_bytes : TEXT_SNIFF_BYTES;
    const unsigned char *z = memchr(s->map, 0, (size_t)n);
    return z ? (int64_t)(z - s->map) : -1;
}

/* A file without the shard magic that does not look like text: most likely a shard
 * with a damaged header, so say what the header holds instead of training on it. */
static ts_status not_text_error(const ts_shard *s, int named_bin, int64_t nul)
{
    char head[192], why[96];
    uint64_t size = s->map_bytes;
    if (size >= 12) {
        int32_t count = read_i32(s->map + 8);
        int fits = count >= 0 && size == SHARD_HEADER_BYTES + 2 * (uint64_t)count;
        snprintf(head, sizeof head, "its header holds magic %d (expected %d), version %d, "
                 "token count %d%s", read_i32(s->map), TS_SHARD_MAGIC, read_i32(s->map + 4),
                 count, fits ? ", and the file size fits that count" : "");
    } else {
        snprintf(head, sizeof head, "its %" PRIu64 " bytes are too few for the shard header",
                 size);
    }
    if (nul >= 0)
        snprintf(why, sizeof why, "it has a NUL byte at offset %" PRId64 "%s", nul,
                 named_bin ? " and is named *.bin" : "");
    else
        snprintf(why, sizeof why, "it is named *.bin");
    return ts_fail("data file %s is neither an llm.c token shard nor text: %s; %s, so it is "
                   "not read as text. Regenerate the shard if it is one; a text file must have "
                   "no NUL bytes (UTF-8, not UTF-16) and a name not ending in .bin, or make a "
                   "shard of it with `tessera data TEXT OUT.bin`", s->path, head, why);
}

/* Decide shard or text and set is_text/token_bytes/count; checks the shard header and
 * size. A file that does not start with a shard magic (GPT-2's or Llama 3's) is text
 * only if it looks like text: no NUL byte in its first 4 KiB and not named *.bin
 * (llm.c's name for shards). A file shorter than a shard header cannot be a damaged
 * shard and is read as bytes (unless named *.bin). */
static ts_status classify(ts_shard *s)
{
    const char *path = s->path;
    uint64_t size = s->map_bytes;
    int32_t magic = size >= 4 ? read_i32(s->map) : 0;
    const int wide = magic == TS_SHARD32_MAGIC;
    if (magic != TS_SHARD_MAGIC && !wide) {
        const uint32_t swapped = bswap32((uint32_t)magic);
        if (size >= 4 && (swapped == (uint32_t)TS_SHARD_MAGIC ||
                          swapped == (uint32_t)TS_SHARD32_MAGIC))
            return ts_fail("data file %s starts with the llm.c shard magic %d in big-endian "
                           "byte order; shards must be little-endian (rewrite it with "
                           "`tessera data` or llm.c's writer)", path, (int32_t)swapped);
        int named_bin = ends_with_bin(path);
        int64_t nul = size >= SHARD_HEADER_BYTES || named_bin ? first_nul(s) : -1;
        if (named_bin || nul >= 0) return not_text_error(s, named_bin, nul);
        s->is_text = 1;
        s->token_bytes = 1;
        s->count = size;
        return TS_OK;
    }
    /* GPT-2's uint16 shard or Llama 3's uint32 one: the same header, another width. */
    const char *kind = wide ? "Llama-3" : "GPT-2";
    const int32_t want_version = wide ? TS_SHARD32_VERSION : TS_SHARD_VERSION;
    const uint64_t width = wide ? 4 : 2;
    if (size < SHARD_HEADER_BYTES)
        return ts_fail("data file %s is truncated: it starts with the %s shard magic %d but has "
                       "only %" PRIu64 " bytes, less than the %d-byte header",
                       path, kind, magic, size, SHARD_HEADER_BYTES);
    int32_t version = read_i32(s->map + 4);
    int32_t count = read_i32(s->map + 8);
    if (version != want_version)
        return ts_fail("data file %s: shard version %d, expected %d (an llm.c %s shard with "
                       "%s tokens, magic %d)", path, version, want_version, kind,
                       wide ? "uint32" : "uint16", magic);
    if (count < 0)
        return ts_fail("data file %s: shard header has a negative token count %d", path, count);
    uint64_t want = SHARD_HEADER_BYTES + width * (uint64_t)count;
    if (size < want)
        return ts_fail("data file %s is truncated: header says %d tokens (%" PRIu64
                       " bytes) but the file has %" PRIu64 " bytes", path, count, want, size);
    if (size > want)
        return ts_fail("data file %s has %" PRIu64 " bytes of trailing data: header says %d "
                       "tokens (%" PRIu64 " bytes) but the file has %" PRIu64 " bytes",
                       path, size - want, count, want, size);
    s->is_text = 0;
    s->token_bytes = (int)width;
    s->count = (uint64_t)count;
    return TS_OK;
}

/* Token i of a file as stored (a uint32 shard may hold ids no int can: check_tokens
 * compares them as they are). */
static inline uint32_t shard_token_raw(const ts_shard *s, uint64_t i)
{
    if (s->token_bytes == 1) return s->map[i];
    if (s->token_bytes == 2) {
        uint16_t v;
        memcpy(&v, s->map + SHARD_HEADER_BYTES + 2 * i, 2);
        return v;
    }
    uint32_t v;
    memcpy(&v, s->map + SHARD_HEADER_BYTES + 4 * i, 4);
    return v;
}

/* Token i once check_tokens has passed: below vocab_size, so an int. */
static inline int shard_token(const ts_shard *s, uint64_t i) { return (int)shard_token_raw(s, i); }

/* One pass over the tokens: every id must be < vocab_size. */
static ts_status check_tokens(const ts_shard *s, int vocab_size)
{
    /* Nothing to check where no id the file can hold reaches vocab_size. */
    if ((s->token_bytes == 2 && vocab_size >= 65536) || (s->is_text && vocab_size >= 256))
        return TS_OK;
    for (uint64_t i = 0; i < s->count; i++) {
        uint32_t tok = shard_token_raw(s, i);
        if (tok >= (uint32_t)vocab_size)
            return ts_fail("data file %s: token %" PRIu32 " at position %" PRIu64 " is >= vocab_size "
                           "%d (is model.vocab_size right for this data?)%s",
                           s->path, tok, i, vocab_size,
                           s->is_text ? " (a text file's tokens are its bytes, 0..255)" : "");
    }
    return TS_OK;
}

ts_status ts_data_open(ts_dataset *ds, const char *const *paths, int n_paths, int vocab_size)
{
    return ts_data_open_key(ds, "data.train", paths, n_paths, vocab_size);
}

ts_status ts_data_open_key(ts_dataset *ds, const char *key, const char *const *paths,
                           int n_paths, int vocab_size)
{
    memset(ds, 0, sizeof *ds);
    TS_ASSERT(key != NULL);
    if (n_paths < 1) return ts_fail("no data files given (set %s)", key);
    if (vocab_size < 1) return ts_fail("vocab_size %d must be positive", vocab_size);
    ds->shards = ts_calloc((size_t)n_paths, sizeof(ts_shard));
    ds->vocab_size = vocab_size;
    for (int i = 0; i < n_paths; i++) {
        ts_shard *s = &ds->shards[i];
        ds->n_shards = i + 1; /* so close() releases whatever this one got */
        s->path = xstrdup(paths[i]);
        if (map_file(s, key, s->path) != TS_OK || classify(s) != TS_OK ||
            check_tokens(s, vocab_size) != TS_OK) {
            ts_data_close(ds);
            return TS_ERR;
        }
        s->first_token = ds->n_tokens;
        ds->n_tokens += s->count;
    }
    return TS_OK;
}

void ts_data_shard_identity(const ts_dataset *ds, int i, uint64_t *count, uint32_t *crc)
{
    const ts_shard *sh = &ds->shards[i];
    *count = sh->count;
    uLong c = crc32(0L, Z_NULL, 0);
    for (uint64_t at = 0; at < sh->map_bytes;) { /* crc32 takes at most 4 GiB a call */
        const uint64_t n = sh->map_bytes - at < (1u << 30) ? sh->map_bytes - at : (1u << 30);
        c = crc32(c, sh->map + at, (uInt)n);
        at += n;
    }
    *crc = (uint32_t)c;
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

/* ---------------------------------------------------------------------------------- */
/* Writing shards                                                                      */

#define OUT_WHAT "output shard" /* names the output in fsutil's messages */

/* The output's directory must exist and be one: name the first component of the path
 * that is missing or is not a directory ("a.txt/x.bin": a.txt is a file), rather than
 * open()'s bare "Not a directory". Nothing is created. */
static ts_status check_out_dir(const char *path)
{
    size_t n = strlen(path);
    if (n == 0) return ts_fail(OUT_WHAT ": the path is empty; give the path of a file to write");
    if (path[n - 1] == '/')
        return ts_fail(OUT_WHAT ": %s ends in '/', so it names a directory; give the path of "
                       "a file to write (such as %strain.bin)", path, path);
    char *buf = xstrdup(path);
    ts_status st = TS_OK;
    for (char *p = strchr(buf + 1, '/'); p && st == TS_OK; p = strchr(p + 1, '/')) {
        *p = '\0';
        struct stat sb;
        if (stat(buf, &sb) != 0)
            st = errno == ENOENT
                     ? ts_fail(OUT_WHAT ": cannot write %s: directory %s does not exist "
                               "(create it first)", path, buf)
                     : ts_fail(OUT_WHAT ": cannot write %s: %s: %s", path, buf, strerror(errno));
        else if (!S_ISDIR(sb.st_mode))
            st = ts_fail(OUT_WHAT ": cannot write %s: %s is %snot a directory", path, buf,
                         S_ISREG(sb.st_mode) ? "a file, " : "");
        *p = '/';
    }
    free(buf);
    return st;
}

/* Everything that must hold before an output shard is written (see loader.h). */
static ts_status check_out_path(const char *path)
{
    if (check_out_dir(path) != TS_OK) return TS_ERR;
    return ts_check_output_path(path, OUT_WHAT);
}

/* The shard's header and `count` tokens of `width` bytes each, written whole or not at
 * all. */
static ts_status write_shard(const char *out_path, const void *tokens, uint64_t count, int width)
{
    if (count > (uint64_t)INT32_MAX)
        return ts_fail("cannot write %s: %" PRIu64 " tokens is more than a shard can hold "
                       "(%d); split the data into several shards", out_path, count, INT32_MAX);
    if (check_out_path(out_path) != TS_OK) return TS_ERR;
    int32_t header[SHARD_HEADER_INTS] = {0};
    header[0] = width == 4 ? TS_SHARD32_MAGIC : TS_SHARD_MAGIC;
    header[1] = width == 4 ? TS_SHARD32_VERSION : TS_SHARD_VERSION;
    header[2] = (int32_t)count;
    ts_atomic_file af;
    if (ts_atomic_open(&af, out_path, OUT_WHAT) != TS_OK) return TS_ERR;
    /* A failed write sets the stream's error flag, which the commit reports. */
    fwrite(header, 1, sizeof header, af.f);
    if (count > 0) fwrite(tokens, (size_t)width, (size_t)count, af.f);
    return ts_atomic_commit(&af);
}

int ts_shard_format_parse(const char *name, ts_shard_format *fmt)
{
    if (strcmp(name, "gpt2") == 0) *fmt = TS_SHARD_GPT2;
    else if (strcmp(name, "llama3") == 0) *fmt = TS_SHARD_LLAMA3;
    else return 0;
    return 1;
}

ts_status ts_data_write_tokens(const char *out_path, const uint32_t *tokens, uint64_t count,
                               int vocab_size, ts_shard_format fmt)
{
    if (vocab_size < 1) return ts_fail("cannot write %s: vocab_size %d must be positive", out_path, vocab_size);
    if (fmt == TS_SHARD_AUTO) fmt = vocab_size > 65536 ? TS_SHARD_LLAMA3 : TS_SHARD_GPT2;
    for (uint64_t i = 0; i < count; i++) {
        if (tokens[i] >= (uint32_t)vocab_size)
            return ts_fail("cannot write %s: token %" PRIu32 " at position %" PRIu64
                           " is >= vocab_size %d", out_path, tokens[i], i, vocab_size);
        if (fmt == TS_SHARD_GPT2 && tokens[i] > 65535)
            return ts_fail("cannot write %s: token %" PRIu32 " at position %" PRIu64
                           " does not fit a GPT-2 shard's uint16 ids; write the Llama-3 format "
                           "(uint32 ids, `--format llama3`)", out_path, tokens[i], i);
    }
    if (fmt == TS_SHARD_LLAMA3) return write_shard(out_path, tokens, count, 4);
    uint16_t *narrow = ts_malloc((size_t)(count ? count : 1) * sizeof *narrow);
    for (uint64_t i = 0; i < count; i++) narrow[i] = (uint16_t)tokens[i];
    ts_status st = write_shard(out_path, narrow, count, 2);
    free(narrow);
    return st;
}

/* Refuse to tokenize a file that already is a token shard: its header and uint16
 * tokens would become byte tokens. */
static ts_status check_not_shard(const char *text_path, const unsigned char *bytes,
                                 uint64_t size)
{
    if (size < 4) return TS_OK;
    uint32_t m = (uint32_t)read_i32(bytes);
    if ((m == (uint32_t)TS_SHARD_MAGIC || m == (uint32_t)TS_SHARD32_MAGIC) && size >= 12)
        return ts_fail("text file %s is already an llm.c token shard (magic %d, %d tokens): "
                       "use it as data.train as it is, or give `tessera data` the text it was "
                       "made from", text_path, (int32_t)m, read_i32(bytes + 8));
    if (m == (uint32_t)TS_SHARD_MAGIC || bswap32(m) == (uint32_t)TS_SHARD_MAGIC ||
        m == (uint32_t)TS_SHARD32_MAGIC || bswap32(m) == (uint32_t)TS_SHARD32_MAGIC)
        return ts_fail("text file %s starts with a token-shard magic (%d or %d), so it is a "
                       "shard, not text; give `tessera data` the text it was made from",
                       text_path, TS_SHARD_MAGIC, TS_SHARD32_MAGIC);
    return TS_OK;
}

/* Read a whole regular file into *out (owned by the caller); `in_st` gets its stat. */
static ts_status read_text(const char *text_path, unsigned char **out, uint64_t *out_size,
                           struct stat *in_st)
{
    int fd = ts_open_input(text_path); /* cannot block: core/fsutil.h */
    if (fd < 0) return ts_fail("text file %s: %s", text_path, strerror(errno));
    if (fstat(fd, in_st) != 0) {
        int err = errno;
        close(fd);
        return ts_fail("text file %s: %s", text_path, strerror(err));
    }
    if (!S_ISREG(in_st->st_mode)) {
        close(fd);
        return ts_fail("text file %s is not a regular file", text_path);
    }
    uint64_t size = (uint64_t)in_st->st_size;
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
    *out = bytes;
    *out_size = size;
    return TS_OK;
}

ts_status ts_data_write_text_shard(const char *text_path, const char *out_path,
                                   ts_shard_format fmt)
{
    /* Every refusal comes before anything is written. */
    if (check_out_path(out_path) != TS_OK) return TS_ERR;
    unsigned char *bytes = NULL;
    uint64_t size = 0;
    struct stat in_st, out_st;
    if (read_text(text_path, &bytes, &size, &in_st) != TS_OK) return TS_ERR;
    ts_status s = check_not_shard(text_path, bytes, size);
    if (s == TS_OK && stat(out_path, &out_st) == 0 && out_st.st_dev == in_st.st_dev &&
        out_st.st_ino == in_st.st_ino)
        s = ts_fail(OUT_WHAT ": %s is the same file as the text file %s; writing the shard "
                    "there would replace the text: give another output path",
                    out_path, text_path);
    if (s != TS_OK) {
        free(bytes);
        return s;
    }
    uint32_t *tokens = ts_malloc((size_t)size * sizeof(uint32_t));
    for (uint64_t i = 0; i < size; i++) tokens[i] = bytes[i];
    free(bytes);
    s = ts_data_write_tokens(out_path, tokens, size, 256, fmt);
    free(tokens);
    return s;
}
