/* safetensors files: 8-byte little-endian header length N, N bytes of JSON mapping
 * name -> {dtype, shape, data_offsets [begin, end)} (offsets relative to the end of
 * the header), optional "__metadata__" string map, then the data (little-endian,
 * row-major). The reader checks everything a hostile or truncated file could get
 * wrong and reads any byte range of a tensor (what resharding needs). */
#ifndef TS_SAFETENSORS_H
#define TS_SAFETENSORS_H

#include <stdint.h>
#include <stdio.h>

#include "core/error.h"

#define TS_ST_MAX_DIMS 8

typedef enum {
    TS_DT_F64, TS_DT_F32, TS_DT_F16, TS_DT_BF16,
    TS_DT_I64, TS_DT_I32, TS_DT_I16, TS_DT_I8, TS_DT_U8, TS_DT_U16, TS_DT_BOOL,
} ts_st_dtype;

const char *ts_st_dtype_name(ts_st_dtype dt);   /* "F32", ... */
size_t ts_st_dtype_size(ts_st_dtype dt);        /* bytes per element */

/* A shape as messages print it, "[384,128]" or "[128]" ("[]" for a scalar), into buf
 * (truncated to cap); returns buf. */
const char *ts_st_shape_str(char *buf, size_t cap, int ndim, const int64_t *shape);

/* A tensor's bytes, numel * elem (elem: its dtype's size), into *out: 1, or 0 when a
 * dimension is negative or the product overflows. */
int ts_st_tensor_bytes(int ndim, const int64_t *shape, size_t elem, uint64_t *out);

typedef struct {
    char *name;
    ts_st_dtype dtype;
    int ndim;
    int64_t shape[TS_ST_MAX_DIMS];
    uint64_t begin, end;                  /* byte offsets relative to the data start */
} ts_st_tensor;

typedef struct {
    char *path;
    FILE *fp;
    uint64_t data_start;                  /* 8 + header length */
    uint64_t file_size;
    int n_tensors;
    ts_st_tensor *tensors;                /* sorted by begin offset */
    int n_meta;
    char **meta_keys, **meta_values;
} ts_st_file;

/* Open and validate: header length within the file, valid JSON object, known dtypes,
 * shapes >= 0, end - begin == numel * dtype size, offsets contiguous from 0 with no
 * holes or overlaps, data ending exactly at end of file, no duplicate names.
 * The error message names the file and what is wrong. */
ts_status ts_st_open(ts_st_file *f, const char *path);
void ts_st_close(ts_st_file *f);

/* Find by name (NULL if absent). */
const ts_st_tensor *ts_st_find(const ts_st_file *f, const char *name);
/* Metadata value for key (NULL if absent). */
const char *ts_st_meta(const ts_st_file *f, const char *key);

/* Read `nbytes` bytes starting `offset` bytes into tensor t's data. */
ts_status ts_st_read(const ts_st_file *f, const ts_st_tensor *t, uint64_t offset, void *dst,
                     uint64_t nbytes);

/* Check t has dtype F32 and exactly the given shape; error names the tensor, the
 * expected and the found shape. */
ts_status ts_st_expect_f32(const ts_st_tensor *t, int ndim, const int64_t *shape);

#endif
