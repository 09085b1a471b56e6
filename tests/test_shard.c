/* Shard specs and their run iterator (src/tensor/shard.h): balanced ranges; for random
 * shapes, split axes, groups and grids of up to 8 ranks, every logical element is owned
 * by exactly one rank of each data-parallel replica, the runs agree element by element
 * with an independent index formula, local <-> logical copies round-trip, and any split
 * of the local range into sub-ranges walks the same runs. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/shard.h"
#include "test_util.h"

static uint64_t rng_state = 12345;
static uint64_t next_u64(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static int rand_in(int lo, int hi) { return lo + (int)(next_u64() % (uint64_t)(hi - lo + 1)); }

static void test_shard_range_balanced(void)
{
    for (int64_t n = 0; n <= 50; n++) {
        for (int parts = 1; parts <= 8; parts++) {
            int64_t next = 0, lo = n, hi = 0;
            for (int p = 0; p < parts; p++) {
                int64_t start, len;
                ts_shard_range(n, parts, p, &start, &len);
                CHECKF(start == next, "n=%lld parts=%d part %d starts at %lld", (long long)n,
                       parts, p, (long long)start);
                next = start + len;
                lo = len < lo ? len : lo;
                hi = len > hi ? len : hi;
            }
            CHECKF(next == n && hi - lo <= 1, "n=%lld parts=%d: covers %lld, sizes %lld..%lld",
                   (long long)n, parts, (long long)next, (long long)lo, (long long)hi);
        }
    }
    /* GPT-2's vocabulary over 3 ranks: 16753, 16752, 16752 rows. */
    int64_t start, len;
    ts_shard_range(50257, 3, 0, &start, &len);
    CHECK(start == 0 && len == 16753);
    ts_shard_range(50257, 3, 2, &start, &len);
    CHECK(start == 33505 && len == 16752);
}

/* The logical flat index of local element i, by multi-indices (not by runs). */
static size_t reference_logical(const ts_shard_spec *s, size_t i)
{
    int64_t idx[TS_SHARD_MAX_DIMS];
    for (int d = s->ndim - 1; d >= 0; d--) {
        idx[d] = (int64_t)(i % (size_t)s->local[d]);
        i /= (size_t)s->local[d];
    }
    const int a = s->split_axis;
    if (a >= 0) {
        int64_t m = s->shape[a] / s->groups, start, len;
        ts_shard_range(m, s->parts, s->part, &start, &len);
        idx[a] = idx[a] / len * m + start + idx[a] % len;
    }
    size_t at = 0;
    for (int d = 0; d < s->ndim; d++) at = at * (size_t)s->shape[d] + (size_t)idx[d];
    return at;
}

/* Local element -> logical element through the runs of [lo, hi); checks the runs tile
 * the range in order. */
static int walk(const ts_shard_spec *s, size_t lo, size_t hi, size_t *logical_of)
{
    ts_shard_run r;
    size_t at = lo;
    int ok = 1;
    for (ts_shard_iter it = ts_shard_iter_begin(s, lo, hi); ts_shard_next(&it, &r);) {
        ok &= r.local == at && r.len > 0 && r.local + r.len <= hi;
        ok &= r.logical + r.len <= ts_shard_logical_numel(s);
        for (size_t j = 0; j < r.len && ok; j++) logical_of[r.local + j] = r.logical + j;
        at = r.local + r.len;
    }
    return ok && at == hi;
}

static void random_spec_case(int trial)
{
    /* A random logical shape, split axis and groups. */
    int ndim = rand_in(1, 4), split = rand_in(-1, ndim - 1), groups = rand_in(1, 3);
    int64_t shape[TS_SHARD_MAX_DIMS];
    for (int d = 0; d < ndim; d++) shape[d] = rand_in(1, 6);
    if (split >= 0) shape[split] = (int64_t)groups * rand_in(1, 11);
    /* A grid of tp x dp <= 8 ranks. */
    int tp = rand_in(1, 8), dp = rand_in(1, 8 / tp);
    size_t n = 1;
    for (int d = 0; d < ndim; d++) n *= (size_t)shape[d];

    int *owners = calloc(n, sizeof(int));
    float *logical = malloc(n * sizeof(float)), *back = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) logical[i] = (float)i + 0.5f;
    int ok_runs = 1, ok_ref = 1, ok_sub = 1, ok_trip = 1, ok_replica = 1, ok_count = 1;
    for (int d = 0; d < dp; d++) {
        memset(owners, 0, n * sizeof(int));
        memset(back, 0, n * sizeof(float));
        size_t held = 0;
        for (int r = 0; r < tp; r++) {
            ts_shard_spec s;
            ts_shard_init(&s, "t", ndim, shape, split, groups, tp, r);
            const size_t ln = ts_shard_numel(&s);
            held += ln;
            ok_replica &= split >= 0 ? s.replica == 0 : s.replica == r;
            size_t *map = malloc((ln + 1) * sizeof(size_t));
            size_t *map2 = malloc((ln + 1) * sizeof(size_t));
            ok_runs &= walk(&s, 0, ln, map);
            for (size_t i = 0; i < ln; i++) ok_ref &= map[i] == reference_logical(&s, i);
            /* Sub-ranges cut at random points walk the same elements. */
            size_t at = 0;
            while (at < ln) {
                size_t to = at + 1 + next_u64() % (ln - at);
                ok_sub &= walk(&s, at, to, map2);
                at = to;
            }
            for (size_t i = 0; i < ln; i++) ok_sub &= map2[i] == map[i];
            /* Gather this rank's part, scatter it back (owners only). */
            float *local = malloc((ln + 1) * sizeof(float));
            ts_shard_run run;
            for (ts_shard_iter it = ts_shard_iter_begin(&s, 0, ln); ts_shard_next(&it, &run);)
                memcpy(local + run.local, logical + run.logical, run.len * sizeof(float));
            if (s.replica == 0) {
                for (ts_shard_iter it = ts_shard_iter_begin(&s, 0, ln); ts_shard_next(&it, &run);) {
                    memcpy(back + run.logical, local + run.local, run.len * sizeof(float));
                    for (size_t j = 0; j < run.len; j++) owners[run.logical + j]++;
                }
            }
            for (size_t i = 0; i < ln; i++) ok_trip &= local[i] == (float)map[i] + 0.5f;
            free(local);
            free(map);
            free(map2);
        }
        for (size_t i = 0; i < n; i++) ok_count &= owners[i] == 1;
        ok_trip &= !memcmp(back, logical, n * sizeof(float));
        ok_count &= held == (split >= 0 ? n : (size_t)tp * n);
    }
    char what[160];
    snprintf(what, sizeof what, "trial %d: ndim %d shape [%lld,%lld,%lld,%lld] split %d groups %d "
             "grid tp %d x dp %d", trial, ndim, (long long)shape[0],
             (long long)(ndim > 1 ? shape[1] : 0), (long long)(ndim > 2 ? shape[2] : 0),
             (long long)(ndim > 3 ? shape[3] : 0), split, groups, tp, dp);
    CHECKF(ok_runs, "%s: runs do not tile the local range", what);
    CHECKF(ok_ref, "%s: runs disagree with the index formula", what);
    CHECKF(ok_sub, "%s: sub-ranges walk other elements", what);
    CHECKF(ok_trip, "%s: local <-> logical does not round-trip", what);
    CHECKF(ok_replica, "%s: replica numbers", what);
    CHECKF(ok_count, "%s: an element is not owned exactly once per replica", what);
    free(owners);
    free(logical);
    free(back);
}

static void test_shard_random_specs(void)
{
    for (int trial = 0; trial < 2000; trial++) random_spec_case(trial);
}

/* c_attn.weight [3C, C] as [3, C, C] over 2 ranks: rank 1 holds rows C/2..C of each of
 * q, k, v, one run per group; c_proj.weight [C, C] split by columns: one run per row. */
static void test_shard_megatron_examples(void)
{
    const int64_t C = 8, qkv[2] = {3 * C, C}, proj[2] = {C, C};
    ts_shard_spec s;
    ts_shard_init(&s, "transformer.h.0.attn.c_attn.weight", 2, qkv, 0, 3, 2, 1);
    CHECK(s.local[0] == 3 * C / 2 && s.local[1] == C && ts_shard_numel(&s) == 12 * 8);
    ts_shard_run r;
    int runs = 0;
    const size_t n = ts_shard_numel(&s);
    for (ts_shard_iter it = ts_shard_iter_begin(&s, 0, n); ts_shard_next(&it, &r);) {
        CHECKF(r.local == (size_t)runs * 32 && r.logical == (size_t)runs * 64 + 32 && r.len == 32,
               "c_attn run %d: local %zu logical %zu len %zu", runs, r.local, r.logical, r.len);
        runs++;
    }
    CHECK(runs == 3);
    ts_shard_init(&s, "transformer.h.0.attn.c_proj.weight", 2, proj, 1, 1, 2, 1);
    runs = 0;
    for (ts_shard_iter it = ts_shard_iter_begin(&s, 0, ts_shard_numel(&s)); ts_shard_next(&it, &r);)
        runs += r.local == (size_t)runs * 4 && r.logical == (size_t)runs * 8 + 4 && r.len == 4;
    CHECK(runs == 8);
    /* A whole tensor is one run, clipped to the range asked for. */
    ts_shard_init(&s, "transformer.wpe.weight", 2, proj, -1, 1, 4, 3);
    CHECK(s.replica == 3 && s.parts == 1);
    ts_shard_iter it = ts_shard_iter_begin(&s, 5, 20);
    CHECK(ts_shard_next(&it, &r) && r.local == 5 && r.logical == 5 && r.len == 15);
    CHECK(!ts_shard_next(&it, &r));
    /* An empty range has no runs. */
    it = ts_shard_iter_begin(&s, 7, 7);
    CHECK(!ts_shard_next(&it, &r));
}

int main(void)
{
    test_shard_range_balanced();
    test_shard_megatron_examples();
    test_shard_random_specs();
    return ts_test_report();
}
