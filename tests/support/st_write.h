/* A safetensors writer for tests: whole files built from tensors in memory, valid ones
 * and (through the metadata and names given) the odd ones the reader must take or
 * refuse. Checkpoints are written by checkpoint/layout.c and save.c instead, a slice per
 * rank into files of a precomputed layout. */
#ifndef TS_TEST_SUPPORT_ST_WRITE_H
#define TS_TEST_SUPPORT_ST_WRITE_H

#include <stdint.h>

#include "checkpoint/safetensors.h"

typedef struct {
    const char *name;
    ts_st_dtype dtype;
    int ndim;
    int64_t shape[TS_ST_MAX_DIMS];
    const void *data;                     /* numel * dtype size bytes */
} ts_st_entry;

/* Write a complete file (header padded with spaces to a multiple of 8), tensors in
 * the given order, fflush + fsync before returning. Metadata: n_meta key/value pairs. */
ts_status ts_st_write(const char *path, const ts_st_entry *entries, int n,
                      const char *const *meta_keys, const char *const *meta_values, int n_meta);

#endif
