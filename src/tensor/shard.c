/* Shard specs and their run iterator (shard.h). */
#include "tensor/shard.h"

#include <stdio.h>
#include <string.h>

#include "core/error.h"

void ts_shard_range(int64_t n, int parts, int part, int64_t *start, int64_t *len)
{
    TS_ASSERT(n >= 0 && parts >= 1 && part >= 0 && part < parts);
    const int64_t base = n / parts, extra = n % parts;
    *start = part * base + (part < extra ? part : extra);
    *len = base + (part < extra ? 1 : 0);
}

void ts_shard_init(ts_shard_spec *s, const char *name, int ndim, const int64_t *shape,
                   int split_axis, int groups, int ranks, int rank)
{
    TS_ASSERT(ndim >= 1 && ndim <= TS_SHARD_MAX_DIMS);
    TS_ASSERT(split_axis >= -1 && split_axis < ndim && groups >= 1);
    TS_ASSERT(ranks >= 1 && rank >= 0 && rank < ranks);
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->ndim = ndim;
    for (int d = 0; d < ndim; d++) {
        TS_ASSERT(shape[d] >= 0);
        s->shape[d] = s->local[d] = shape[d];
    }
    s->split_axis = split_axis;
    s->groups = split_axis >= 0 ? groups : 1;
    if (split_axis < 0) { /* replicated: every rank holds it all; rank r is replica r */
        s->parts = 1;
        s->part = 0;
        s->replica = rank;
        return;
    }
    TS_ASSERT(shape[split_axis] % groups == 0);
    s->parts = ranks;
    s->part = rank;
    int64_t start, len;
    ts_shard_range(shape[split_axis] / groups, ranks, rank, &start, &len);
    s->local[split_axis] = groups * len;
}

void ts_shard_init_shared(ts_shard_spec *s, const char *name, int ndim, const int64_t *shape,
                          int split_axis, int groups, int parts, int ranks, int rank)
{
    TS_ASSERT(split_axis >= 0 && parts >= 1 && ranks % parts == 0 && rank >= 0 && rank < ranks);
    const int per_part = ranks / parts;
    ts_shard_init(s, name, ndim, shape, split_axis, groups, parts, rank / per_part);
    s->replica = rank % per_part;
}

static size_t product(const int64_t *dims, int from, int to)
{
    size_t n = 1;
    for (int d = from; d < to; d++) n *= (size_t)dims[d];
    return n;
}

size_t ts_shard_logical_numel(const ts_shard_spec *s) { return product(s->shape, 0, s->ndim); }
size_t ts_shard_numel(const ts_shard_spec *s) { return product(s->local, 0, s->ndim); }

/* With the split axis a viewed as [groups, m] (m = shape[a] / groups), this part holding
 * rows [start, start + len) of each group: local element (o, g, j, i) (outer index o,
 * group g, row j < len, inner index i) is logical element (o, g, start + j, i). For each
 * (o, g) the len * inner elements are contiguous on both sides: that is one run. */
ts_shard_iter ts_shard_iter_begin(const ts_shard_spec *s, size_t lo, size_t hi)
{
    const size_t numel = ts_shard_numel(s);
    TS_ASSERT(lo <= hi && hi <= numel);
    ts_shard_iter it = {.pos = lo, .end = hi, .run_len = numel, .groups = 1,
                        .outer_stride = numel, .group_stride = 0, .start = 0};
    const int a = s->split_axis;
    if (a < 0 || s->parts == 1) return it; /* the whole tensor: one run */
    const size_t inner = product(s->shape, a + 1, s->ndim);
    const size_t m = (size_t)s->shape[a] / (size_t)s->groups;
    int64_t start, len;
    ts_shard_range((int64_t)m, s->parts, s->part, &start, &len);
    it.run_len = (size_t)len * inner;
    it.groups = (size_t)s->groups;
    it.outer_stride = (size_t)s->shape[a] * inner;
    it.group_stride = m * inner;
    it.start = (size_t)start * inner;
    return it;
}

bool ts_shard_next(ts_shard_iter *it, ts_shard_run *run)
{
    if (it->pos >= it->end) return false;
    const size_t k = it->pos / it->run_len, within = it->pos % it->run_len;
    const size_t left = it->run_len - within, want = it->end - it->pos;
    run->local = it->pos;
    run->logical = (k / it->groups) * it->outer_stride + (k % it->groups) * it->group_stride +
                   it->start + within;
    run->len = left < want ? left : want;
    it->pos += run->len;
    return true;
}
