/* safetensors reader and writer. The reader trusts nothing in the file: every length,
 * offset and shape is checked before it is used, so a truncated or hostile file gives
 * an error that names the file and the problem, never a crash. */
#include "checkpoint/safetensors.h"
#include "core/fsutil.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "safetensors I/O assumes a little-endian host");

#define ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000) /* as the reference implementation */

static const char *const k_dtype_names[] = {
    [TS_DT_F64] = "F64", [TS_DT_F32] = "F32", [TS_DT_F16] = "F16", [TS_DT_BF16] = "BF16",
    [TS_DT_I64] = "I64", [TS_DT_I32] = "I32", [TS_DT_I16] = "I16", [TS_DT_I8] = "I8",
    [TS_DT_U8] = "U8",   [TS_DT_U16] = "U16", [TS_DT_BOOL] = "BOOL",
};
static const size_t k_dtype_sizes[] = {
    [TS_DT_F64] = 8, [TS_DT_F32] = 4, [TS_DT_F16] = 2, [TS_DT_BF16] = 2,
    [TS_DT_I64] = 8, [TS_DT_I32] = 4, [TS_DT_I16] = 2, [TS_DT_I8] = 1,
    [TS_DT_U8] = 1,  [TS_DT_U16] = 2, [TS_DT_BOOL] = 1,
};
#define N_DTYPES ((int)(sizeof k_dtype_names / sizeof k_dtype_names[0]))

static int dtype_valid(ts_st_dtype dt) { return (int)dt >= 0 && (int)dt < N_DTYPES; }

const char *ts_st_dtype_name(ts_st_dtype dt) { return dtype_valid(dt) ? k_dtype_names[dt] : "?"; }

size_t ts_st_dtype_size(ts_st_dtype dt) { return dtype_valid(dt) ? k_dtype_sizes[dt] : 0; }

static int dtype_parse(const char *s, ts_st_dtype *out)
{
    for (int i = 0; i < N_DTYPES; i++) {
        if (strcmp(s, k_dtype_names[i]) == 0) {
            *out = (ts_st_dtype)i;
            return 1;
        }
    }
    return 0;
}

static char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = ts_malloc(n);
    memcpy(p, s, n);
    return p;
}

const char *ts_st_shape_str(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t len = 0;
    buf[0] = '\0';
    len += (size_t)snprintf(buf + len, cap - len, "[");
    for (int d = 0; d < ndim && len < cap; d++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%" PRId64, d ? "," : "", shape[d]);
    if (len < cap) snprintf(buf + len, cap - len, "]");
    return buf;
}

int ts_st_tensor_bytes(int ndim, const int64_t *shape, size_t elem, uint64_t *out)
{
    uint64_t n = elem;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0 || __builtin_mul_overflow(n, (uint64_t)shape[d], &n)) return 0;
    }
    *out = n;
    return 1;
}

/* ---------------------------------------------------------------------------------- */
/* Reader                                                                              */

/* Read exactly n bytes at offset; on a short read sets *eof. */
static int pread_full(int fd, void *dst, uint64_t n, uint64_t off, int *eof)
{
    unsigned char *p = dst;
    *eof = 0;
    while (n > 0) {
        size_t chunk = n > ((uint64_t)1 << 30) ? ((size_t)1 << 30) : (size_t)n;
        ssize_t r = pread(fd, p, chunk, (off_t)off);
        if (r < 0) {
            if (errno == EINTR) continue;
            return 0;
        }
        if (r == 0) {
            *eof = 1;
            return 0;
        }
        p += r;
        n -= (uint64_t)r;
        off += (uint64_t)r;
    }
    return 1;
}

static int cmp_by_begin(const void *a, const void *b)
{
    const ts_st_tensor *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

static ts_status parse_metadata(ts_st_file *f, json_t *meta)
{
    if (!json_is_object(meta))
        return ts_fail("checkpoint file %s: \"__metadata__\" must be a JSON object of "
                       "strings", f->path);
    size_t n = json_object_size(meta);
    f->meta_keys = ts_calloc(n, sizeof(char *));
    f->meta_values = ts_calloc(n, sizeof(char *));
    const char *key;
    json_t *val;
    json_object_foreach(meta, key, val) {
        if (!json_is_string(val))
            return ts_fail("checkpoint file %s: metadata value for '%s' is not a string",
                           f->path, key);
        f->meta_keys[f->n_meta] = xstrdup(key);
        f->meta_values[f->n_meta] = xstrdup(json_string_value(val));
        f->n_meta++;
    }
    return TS_OK;
}

/* Read a non-negative JSON integer. */
static int json_u63(json_t *v, int64_t *out)
{
    if (!json_is_integer(v)) return 0;
    json_int_t x = json_integer_value(v);
    if (x < 0) return 0;
    *out = (int64_t)x;
    return 1;
}

static ts_status parse_tensor(ts_st_file *f, const char *name, json_t *info, ts_st_tensor *t)
{
    const char *p = f->path;
    if (!json_is_object(info))
        return ts_fail("checkpoint file %s: entry for tensor '%s' is not a JSON object", p,
                       name);
    json_t *jdt = json_object_get(info, "dtype");
    json_t *jshape = json_object_get(info, "shape");
    json_t *joff = json_object_get(info, "data_offsets");
    if (!json_is_string(jdt))
        return ts_fail("checkpoint file %s: tensor '%s' has no dtype string", p, name);
    if (!dtype_parse(json_string_value(jdt), &t->dtype))
        return ts_fail("checkpoint file %s: tensor '%s' has unknown dtype '%s' (supported: "
                       "F64 F32 F16 BF16 I64 I32 I16 I8 U8 U16 BOOL)",
                       p, name, json_string_value(jdt));
    if (!json_is_array(jshape))
        return ts_fail("checkpoint file %s: tensor '%s' has no shape array", p, name);
    size_t nd = json_array_size(jshape);
    if (nd > TS_ST_MAX_DIMS)
        return ts_fail("checkpoint file %s: tensor '%s' has %zu dimensions (at most %d "
                       "supported)", p, name, nd, TS_ST_MAX_DIMS);
    t->ndim = (int)nd;
    for (size_t d = 0; d < nd; d++) {
        if (!json_u63(json_array_get(jshape, d), &t->shape[d]))
            return ts_fail("checkpoint file %s: tensor '%s' has a shape entry that is not a "
                           "non-negative integer (dimension %zu)", p, name, d);
    }
    int64_t b, e;
    if (!json_is_array(joff) || json_array_size(joff) != 2 ||
        !json_u63(json_array_get(joff, 0), &b) || !json_u63(json_array_get(joff, 1), &e))
        return ts_fail("checkpoint file %s: tensor '%s' needs data_offsets [begin, end] of "
                       "two non-negative integers", p, name);
    if (e < b)
        return ts_fail("checkpoint file %s: tensor '%s' has data_offsets [%" PRId64
                       ",%" PRId64 "] with end before begin", p, name, b, e);
    t->begin = (uint64_t)b;
    t->end = (uint64_t)e;
    char sb[256];
    uint64_t want;
    if (!ts_st_tensor_bytes(t->ndim, t->shape, ts_st_dtype_size(t->dtype), &want))
        return ts_fail("checkpoint file %s: tensor '%s' has shape %s whose size overflows", p,
                       name, ts_st_shape_str(sb, sizeof sb, t->ndim, t->shape));
    if (want != t->end - t->begin)
        return ts_fail("checkpoint file %s: tensor '%s' has dtype %s and shape %s = %" PRIu64
                       " bytes but data_offsets span %" PRIu64, p, name,
                       ts_st_dtype_name(t->dtype), ts_st_shape_str(sb, sizeof sb, t->ndim, t->shape),
                       want, t->end - t->begin);
    return TS_OK;
}

static ts_status parse_header(ts_st_file *f, json_t *root)
{
    if (!json_is_object(root))
        return ts_fail("checkpoint file %s: header is not a JSON object", f->path);
    size_t n = json_object_size(root);
    f->tensors = ts_calloc(n, sizeof(ts_st_tensor));
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if (parse_metadata(f, val) != TS_OK) return TS_ERR;
            continue;
        }
        ts_st_tensor *t = &f->tensors[f->n_tensors];
        if (parse_tensor(f, key, val, t) != TS_OK) return TS_ERR;
        t->name = xstrdup(key);
        f->n_tensors++;
    }
    qsort(f->tensors, (size_t)f->n_tensors, sizeof(ts_st_tensor), cmp_by_begin);

    /* Offsets must tile [0, data size) exactly: no holes, no overlaps. */
    uint64_t pos = 0;
    const char *prev = NULL;
    for (int i = 0; i < f->n_tensors; i++) {
        const ts_st_tensor *t = &f->tensors[i];
        if (t->begin > pos)
            return ts_fail("checkpoint file %s: hole in the data: bytes [%" PRIu64 ",%" PRIu64
                           ") belong to no tensor (before tensor '%s')",
                           f->path, pos, t->begin, t->name);
        if (t->begin < pos)
            return ts_fail("checkpoint file %s: tensors '%s' and '%s' overlap (data_offsets "
                           "begin %" PRIu64 " < previous end %" PRIu64 ")",
                           f->path, prev, t->name, t->begin, pos);
        pos = t->end;
        if (t->end > t->begin) prev = t->name;
    }
    uint64_t have = f->file_size - f->data_start;
    if (pos > have)
        return ts_fail("checkpoint file %s is truncated: header says %" PRIu64
                       " bytes of data, file has %" PRIu64, f->path, pos, have);
    if (pos < have)
        return ts_fail("checkpoint file %s has %" PRIu64 " bytes of trailing data after the "
                       "last tensor (header says %" PRIu64 " bytes of data, file has %" PRIu64
                       ")", f->path, have - pos, pos, have);
    return TS_OK;
}

static ts_status open_impl(ts_st_file *f, const char *path)
{
    f->path = xstrdup(path);
    f->fp = ts_fopen_input(path); /* cannot block: core/fsutil.h (regular file checked below) */
    if (!f->fp) return ts_fail("checkpoint file %s: %s", path, strerror(errno));
    int fd = fileno(f->fp);
    struct stat st;
    if (fstat(fd, &st) != 0) return ts_fail("checkpoint file %s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return ts_fail("checkpoint file %s is not a regular file", path);
    f->file_size = (uint64_t)st.st_size;
    if (f->file_size < 8)
        return ts_fail("checkpoint file %s is truncated: %" PRIu64 " bytes, too short for the "
                       "8-byte safetensors header length", path, f->file_size);

    unsigned char lenbuf[8];
    int eof;
    if (!pread_full(fd, lenbuf, 8, 0, &eof))
        return ts_fail("checkpoint file %s: %s", path,
                       eof ? "unexpected end of file" : strerror(errno));
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | lenbuf[i];
    if (hlen > ST_MAX_HEADER)
        return ts_fail("checkpoint file %s: header length %" PRIu64 " bytes exceeds the %" PRIu64
                       " byte limit (not a safetensors file, or corrupted)",
                       path, hlen, ST_MAX_HEADER);
    if (hlen > f->file_size - 8)
        return ts_fail("checkpoint file %s is truncated: header length says %" PRIu64
                       " bytes but only %" PRIu64 " bytes follow it",
                       path, hlen, f->file_size - 8);
    if (hlen < 2)
        return ts_fail("checkpoint file %s: header length %" PRIu64 " is too short for a JSON "
                       "object", path, hlen);
    f->data_start = 8 + hlen;

    char *hdr = ts_malloc((size_t)hlen);
    if (!pread_full(fd, hdr, hlen, 8, &eof)) {
        free(hdr);
        return ts_fail("checkpoint file %s: reading the header: %s", path,
                       eof ? "unexpected end of file" : strerror(errno));
    }
    if (hdr[0] != '{') {
        free(hdr);
        return ts_fail("checkpoint file %s: header does not start with '{' (not a "
                       "safetensors file, or corrupted)", path);
    }
    json_error_t jerr;
    json_t *root = json_loadb(hdr, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    free(hdr);
    if (!root)
        return ts_fail("checkpoint file %s: header is not valid JSON: %s (line %d, column %d)",
                       path, jerr.text, jerr.line, jerr.column);
    ts_status s = parse_header(f, root);
    json_decref(root);
    return s;
}

ts_status ts_st_open(ts_st_file *f, const char *path)
{
    memset(f, 0, sizeof *f);
    if (open_impl(f, path) != TS_OK) {
        ts_st_close(f);
        return TS_ERR;
    }
    return TS_OK;
}

void ts_st_close(ts_st_file *f)
{
    if (f->fp) fclose(f->fp);
    for (int i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    for (int i = 0; i < f->n_meta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_values[i]);
    }
    free(f->meta_keys);
    free(f->meta_values);
    free(f->path);
    memset(f, 0, sizeof *f);
}

const ts_st_tensor *ts_st_find(const ts_st_file *f, const char *name)
{
    for (int i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

const char *ts_st_meta(const ts_st_file *f, const char *key)
{
    for (int i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
    return NULL;
}

ts_status ts_st_read(const ts_st_file *f, const ts_st_tensor *t, uint64_t offset, void *dst,
                     uint64_t nbytes)
{
    uint64_t size = t->end - t->begin;
    if (offset > size || nbytes > size - offset)
        return ts_fail("checkpoint file %s: read of %" PRIu64 " bytes at offset %" PRIu64
                       " is outside tensor '%s' (%" PRIu64 " bytes)",
                       f->path, nbytes, offset, t->name, size);
    if (nbytes == 0) return TS_OK;
    int eof;
    if (!pread_full(fileno(f->fp), dst, nbytes, f->data_start + t->begin + offset, &eof))
        return ts_fail("checkpoint file %s: reading tensor '%s': %s", f->path, t->name,
                       eof ? "unexpected end of file (was the file truncated after opening?)"
                           : strerror(errno));
    return TS_OK;
}

ts_status ts_st_expect_f32(const ts_st_tensor *t, int ndim, const int64_t *shape)
{
    TS_ASSERT(t && ndim >= 0 && ndim <= TS_ST_MAX_DIMS);
    int ok = t->dtype == TS_DT_F32 && t->ndim == ndim;
    for (int d = 0; ok && d < ndim; d++) ok = t->shape[d] == shape[d];
    if (ok) return TS_OK;
    char got[256], want[256];
    return ts_fail("tensor '%s' has shape %s %s, expected %s F32", t->name,
                   ts_st_shape_str(got, sizeof got, t->ndim, t->shape), ts_st_dtype_name(t->dtype),
                   ts_st_shape_str(want, sizeof want, ndim, shape));
}
