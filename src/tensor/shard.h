/* Shard specs: which part of which logical tensor a rank holds, and the one iterator
 * that maps this rank's local elements to the logical tensor's, run by run.
 *
 * A logical tensor is a named, unsharded, row-major tensor (nanoGPT's names, with the
 * global layer index, so a name never depends on the grid). A rank holds either all of
 * it (replicated over its group) or one part of it split along one axis. The split axis
 * may be viewed as `groups` equal groups, each split on its own: c_attn.weight [3C, C]
 * is [3, C, C] split on its middle axis, so a tensor-parallel rank holds its own heads
 * of q, k and v. A dimension of n rows over k parts gives each part a balanced
 * contiguous range (the first n % k parts one row more), so n need not divide by k.
 *
 * Everything that moves parameters between a rank's flat buffer and a logical tensor
 * (initialisation by index, model.init, ZeRO ranges, checkpoints) walks the same runs:
 *
 *     ts_shard_run r;
 *     for (ts_shard_iter it = ts_shard_iter_begin(spec, 0, numel); ts_shard_next(&it, &r);)
 *         copy r.len elements: local[r.local ..] <-> logical[r.logical ..]
 */
#ifndef TS_SHARD_H
#define TS_SHARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TS_SHARD_MAX_DIMS 4
#define TS_SHARD_NAME_MAX 96

typedef struct {
    char name[TS_SHARD_NAME_MAX]; /* logical name, e.g. "transformer.h.3.attn.c_attn.weight" */
    int ndim;
    int64_t shape[TS_SHARD_MAX_DIMS]; /* logical shape */
    int split_axis;                   /* -1: this rank holds the whole tensor */
    int groups;                       /* the split axis viewed as `groups` groups (1: plain) */
    int parts, part;                  /* split into `parts` parts; this rank holds `part` */
    int64_t local[TS_SHARD_MAX_DIMS]; /* the shape this rank holds */
    /* Which copy this is among the ranks holding the same elements within one
     * data-parallel replica: 0 owns them (counted once in norms, written once to a
     * checkpoint); the others (tp ranks 1.. of a replicated tensor, the last stage's
     * copy of a tied embedding) hold the same values. */
    int replica;
} ts_shard_spec;

/* The balanced contiguous range of part `part` when n rows are split into `parts`:
 * [*start, *start + *len). The first n % parts parts get one row more. */
void ts_shard_range(int64_t n, int parts, int part, int64_t *start, int64_t *len);

/* A spec for logical tensor `name` of shape[ndim] on rank `rank` of a group of `ranks`:
 * split along split_axis (viewed as `groups` groups, which must divide that dimension)
 * into `ranks` parts, or, with split_axis = -1, replicated (every rank holds all of it
 * and rank r is replica r). Programming errors (a bad axis, groups that do not divide)
 * abort. */
void ts_shard_init(ts_shard_spec *s, const char *name, int ndim, const int64_t *shape,
                   int split_axis, int groups, int ranks, int rank);

/* A split over fewer parts than ranks: `parts` (dividing `ranks`) parts, each held by
 * ranks/parts consecutive ranks, so rank r holds part r / (ranks/parts) as replica
 * r % (ranks/parts). Llama's key/value heads when parallel.tp > n_kv_head: each head is
 * replicated on tp/n_kv_head ranks (the replicas' gradients are summed over them). */
void ts_shard_init_shared(ts_shard_spec *s, const char *name, int ndim, const int64_t *shape,
                          int split_axis, int groups, int parts, int ranks, int rank);

/* Elements of the logical tensor, and of this rank's part. */
size_t ts_shard_logical_numel(const ts_shard_spec *s);
size_t ts_shard_numel(const ts_shard_spec *s);

/* A run: local elements [local, local + len) are logical elements [logical,
 * logical + len), in the same order. */
typedef struct {
    size_t local, logical, len;
} ts_shard_run;

/* Iterates over the runs covering local elements [lo, hi) in local order (the first and
 * last run are clipped to the range). Runs of a split tensor are whole rows of the split
 * axis' part (times the inner dimensions); a whole tensor is one run. */
typedef struct {
    size_t pos, end;      /* next local element; end of the range */
    size_t run_len;       /* local elements per run */
    size_t groups;        /* runs per outer index */
    size_t outer_stride;  /* logical elements per outer index */
    size_t group_stride;  /* logical elements per group */
    size_t start;         /* logical offset of this part within a group */
} ts_shard_iter;

ts_shard_iter ts_shard_iter_begin(const ts_shard_spec *s, size_t lo, size_t hi);
/* The next run into *run; false when the range is done. */
bool ts_shard_next(ts_shard_iter *it, ts_shard_run *run);

#endif
