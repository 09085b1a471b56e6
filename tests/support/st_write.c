/* ts_st_write (st_write.h). */
#include "support/st_write.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The header JSON (unpadded), or NULL with an error recorded. */
static char *build_header(const char *path, const ts_st_entry *entries, int n,
                          const char *const *meta_keys, const char *const *meta_values,
                          int n_meta)
{
    json_t *root = json_object();
    if (n_meta > 0) {
        json_t *meta = json_object();
        json_object_set_new(root, "__metadata__", meta);
        for (int i = 0; i < n_meta; i++) {
            if (!meta_keys[i] || !meta_values[i] || json_object_get(meta, meta_keys[i])) {
                json_decref(root);
                ts_fail("writing %s: metadata key %d ('%s') is missing or repeated", path, i,
                        meta_keys[i] ? meta_keys[i] : "(null)");
                return NULL;
            }
            if (json_object_set_new(meta, meta_keys[i], json_string(meta_values[i])) != 0) {
                json_decref(root);
                ts_fail("writing %s: metadata key '%s' or its value is not valid UTF-8", path,
                        meta_keys[i]);
                return NULL;
            }
        }
    }
    uint64_t pos = 0;
    for (int i = 0; i < n; i++) {
        const ts_st_entry *e = &entries[i];
        const char *why = NULL;
        uint64_t bytes = 0;
        if (!e->name)
            why = "has no name";
        else if (strcmp(e->name, "__metadata__") == 0 || json_object_get(root, e->name))
            why = "is repeated or reserved";
        else if (ts_st_dtype_size(e->dtype) == 0)
            why = "has an invalid dtype";
        else if (e->ndim < 0 || e->ndim > TS_ST_MAX_DIMS)
            why = "has an invalid number of dimensions";
        else if (!ts_st_tensor_bytes(e->ndim, e->shape, ts_st_dtype_size(e->dtype), &bytes))
            why = "has a negative or overflowing shape";
        else if (bytes > 0 && !e->data)
            why = "has no data";
        if (why) {
            json_decref(root);
            ts_fail("writing %s: tensor %d ('%s') %s", path, i, e->name ? e->name : "(null)",
                    why);
            return NULL;
        }
        json_t *info = json_object();
        json_object_set_new(info, "dtype", json_string(ts_st_dtype_name(e->dtype)));
        json_t *shape = json_array();
        for (int d = 0; d < e->ndim; d++)
            json_array_append_new(shape, json_integer((json_int_t)e->shape[d]));
        json_object_set_new(info, "shape", shape);
        json_t *off = json_array();
        json_array_append_new(off, json_integer((json_int_t)pos));
        json_array_append_new(off, json_integer((json_int_t)(pos + bytes)));
        json_object_set_new(info, "data_offsets", off);
        if (json_object_set_new(root, e->name, info) != 0) {
            json_decref(root);
            ts_fail("writing %s: tensor name '%s' is not valid UTF-8", path, e->name);
            return NULL;
        }
        pos += bytes;
    }
    char *s = json_dumps(root, JSON_PRESERVE_ORDER | JSON_COMPACT);
    json_decref(root);
    if (!s) ts_fail("writing %s: could not encode the header", path);
    return s;
}

static int write_all(FILE *fp, const void *p, uint64_t n)
{
    return n == 0 || fwrite(p, 1, (size_t)n, fp) == (size_t)n;
}

ts_status ts_st_write(const char *path, const ts_st_entry *entries, int n,
                      const char *const *meta_keys, const char *const *meta_values, int n_meta)
{
    char *json = build_header(path, entries, n, meta_keys, meta_values, n_meta);
    if (!json) return TS_ERR;
    size_t jlen = strlen(json);
    uint64_t hlen = (jlen + 7) / 8 * 8;
    char *hdr = ts_malloc((size_t)hlen);
    memcpy(hdr, json, jlen);
    memset(hdr + jlen, ' ', (size_t)hlen - jlen);
    free(json);

    FILE *fp = fopen(path, "wb");
    if (!fp) {
        free(hdr);
        return ts_fail("cannot create %s: %s", path, strerror(errno));
    }
    unsigned char lenbuf[8];
    for (int i = 0; i < 8; i++) lenbuf[i] = (unsigned char)(hlen >> (8 * i));
    int ok = write_all(fp, lenbuf, 8) && write_all(fp, hdr, hlen);
    free(hdr);
    for (int i = 0; ok && i < n; i++) {
        uint64_t bytes = 0;
        ts_st_tensor_bytes(entries[i].ndim, entries[i].shape, ts_st_dtype_size(entries[i].dtype),
                     &bytes);
        ok = write_all(fp, entries[i].data, bytes);
    }
    ok = ok && fflush(fp) == 0 && fsync(fileno(fp)) == 0;
    int err = errno;
    if (fclose(fp) != 0 && ok) {
        ok = 0;
        err = errno;
    }
    if (!ok) {
        unlink(path);
        return ts_fail("writing %s: %s", path, strerror(err));
    }
    return TS_OK;
}
