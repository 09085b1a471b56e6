/* Gathering a split tensor into its logical layout (tensor/logical_gather.h). */
#include "tensor/logical_gather.h"

#include <limits.h>
#include <stdlib.h>

#include "core/error.h"

bool ts_logical_is_split(const ts_shard_spec *s) { return s->split_axis >= 0 && s->parts > 1; }

/* Member q's spec of the tensor s describes, in a group of `size`. */
static ts_shard_spec member_spec(const ts_shard_spec *s, int size, int q)
{
    ts_shard_spec o;
    TS_ASSERT(size % s->parts == 0);
    if (s->parts < size)
        ts_shard_init_shared(&o, s->name, s->ndim, s->shape, s->split_axis, s->groups, s->parts,
                             size, q);
    else
        ts_shard_init(&o, s->name, s->ndim, s->shape, s->split_axis, s->groups, s->parts, q);
    return o;
}

size_t ts_logical_stage_floats(const ts_shard_spec *s, int size)
{
    if (!ts_logical_is_split(s)) return 0;
    size_t n = 0;
    for (int q = 0; q < size; q++) {
        const ts_shard_spec o = member_spec(s, size, q);
        n += ts_shard_numel(&o);
    }
    return n;
}

/* Copy spec o's elements between its local buffer and the logical tensor: its runs
 * (tensor/shard.h) are, for each of the split axis' groups, one run per outer index at a
 * fixed pitch on either side, so each group is one strided 2-D copy (the backend's
 * memcpy_2d: one cudaMemcpy2DAsync on CUDA, not a copy per row). */
static void copy_runs(const ts_kernels *k, const ts_shard_spec *o, float *local,
                      float *logical, bool to_logical)
{
    const size_t numel = ts_shard_numel(o);
    if (numel == 0) return;
    const ts_shard_iter it = ts_shard_iter_begin(o, 0, numel);
    const size_t rows = numel / (it.run_len * it.groups), w = it.run_len * sizeof(float);
    const size_t lpitch = it.groups * w, gpitch = it.outer_stride * sizeof(float);
    for (size_t g = 0; g < it.groups; g++) {
        float *l = local + g * it.run_len, *x = logical + g * it.group_stride + it.start;
        if (to_logical) k->memcpy_2d(x, gpitch, l, lpitch, w, rows);
        else k->memcpy_2d(l, lpitch, x, gpitch, w, rows);
    }
}

void ts_logical_gather(const ts_comm *g, const ts_kernels *k, const ts_shard_spec *s,
                       const float *local, float *stage, float *logical)
{
    if (!ts_logical_is_split(s)) {
        k->memcpy_d2d(logical, local, ts_shard_logical_numel(s) * sizeof(float));
        return;
    }
    TS_ASSERT(g && g->size % s->parts == 0);
    const int n = g->size;
    int *counts = ts_malloc((size_t)n * sizeof(int)), *displs = ts_malloc((size_t)n * sizeof(int));
    ts_shard_spec *specs = ts_malloc((size_t)n * sizeof *specs);
    size_t at = 0;
    for (int q = 0; q < n; q++) {
        specs[q] = member_spec(s, n, q);
        const size_t c = ts_shard_numel(&specs[q]);
        TS_ASSERT(at + c <= INT_MAX);
        counts[q] = (int)c;
        displs[q] = (int)at;
        at += c;
    }
    TS_ASSERT(specs[g->rank].part == s->part);
    k->memcpy_d2d(stage + displs[g->rank], local, (size_t)counts[g->rank] * sizeof(float));
    ts_request req;
    ts_iallgather_f32(g, stage, counts, displs, &req);
    ts_request_wait(&req);
    for (int q = 0; q < n; q++) /* a part shared by several members: its first copy */
        if (specs[q].replica == 0) copy_runs(k, &specs[q], stage + displs[q], logical, true);
    free(specs);
    free(counts);
    free(displs);
}

void ts_logical_take(const ts_kernels *k, const ts_shard_spec *s, const float *logical,
                     float *local)
{
    if (!ts_logical_is_split(s)) {
        k->memcpy_d2d(local, logical, ts_shard_numel(s) * sizeof(float));
        return;
    }
    copy_runs(k, s, local, (float *)logical, false);
}
