/* The batch rule's data order (sampler.h). */
#include <stddef.h> /* core/error.h uses size_t without including it */

#include "dataset/sampler.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset/files.h"

ts_status ts_sampler_open(ts_sampler *s, const ts_sampler_spec *spec)
{
    memset(s, 0, sizeof *s);
    s->seq0 = -1;
    TS_ASSERT(spec->n_sets >= 1 && spec->n_sets <= TS_MAX_DATASETS && spec->seq_len >= 1);
    s->shuffle = spec->shuffle;
    s->seed = spec->seed;
    s->T = spec->seq_len;
    double w[TS_MAX_DATASETS];
    const char **mine = ts_calloc((size_t)spec->n_patterns + 1, sizeof *mine);
    ts_status st = TS_OK;
    for (int d = 0; d < spec->n_sets && st == TS_OK; d++) {
        int n = 0;
        for (int i = 0; i < spec->n_patterns; i++)
            if (!spec->set_of || spec->set_of[i] == d) mine[n++] = spec->patterns[i];
        char key[64];
        if (spec->n_sets > 1)
            snprintf(key, sizeof key, "%s (dataset %d of the blend)", spec->key, d);
        else
            snprintf(key, sizeof key, "%s", spec->key);
        st = ts_data_open_patterns(&s->sets[d], key, mine, n, spec->vocab_size);
        if (st != TS_OK) break;
        s->n_sets = d + 1;
        s->windows[d] = ts_data_num_windows(&s->sets[d], spec->seq_len);
        if (s->windows[d] == 0)
            st = ts_fail("%s holds %" PRIu64 " tokens, fewer than one window of seq_len + 1 = "
                         "%d", key, s->sets[d].n_tokens, spec->seq_len + 1);
        s->perm_epoch[d] = -1;
        w[d] = spec->weights ? spec->weights[d] : 1.0;
    }
    free(mine);
    if (st != TS_OK) {
        ts_sampler_close(s);
        return st;
    }
    ts_blend_init(&s->blend, s->n_sets, w);
    return TS_OK;
}

void ts_sampler_close(ts_sampler *s)
{
    for (int d = 0; d < s->n_sets; d++) ts_data_close(&s->sets[d]);
    free(s->set_of_seq);
    free(s->window_of_seq);
    memset(s, 0, sizeof *s);
}

uint64_t ts_sampler_window(ts_sampler *s, int d, uint64_t j)
{
    const uint64_t S = s->windows[d];
    if (!s->shuffle) return j % S;
    const int64_t epoch = (int64_t)(j / S);
    if (s->perm_epoch[d] != epoch) {
        ts_perm_init(&s->perm[d], S, s->seed, (uint64_t)d, (uint64_t)epoch);
        s->perm_epoch[d] = epoch;
    }
    return ts_perm_apply(&s->perm[d], j % S);
}

void ts_sampler_prepare(ts_sampler *s, int64_t seq0, int global_batch)
{
    TS_ASSERT(seq0 >= 0 && global_batch >= 1);
    if (s->seq0 == seq0 && s->global_batch == global_batch) return;
    if (s->global_batch != global_batch) {
        free(s->set_of_seq);
        free(s->window_of_seq);
        s->set_of_seq = ts_malloc((size_t)global_batch * sizeof *s->set_of_seq);
        s->window_of_seq = ts_malloc((size_t)global_batch * sizeof *s->window_of_seq);
        s->global_batch = global_batch;
    }
    const uint64_t g0 = (uint64_t)seq0;
    ts_blend_seek(&s->blend, g0); /* the next step: already there; a resume: replayed */
    for (int i = 0; i < global_batch; i++) {
        int d;
        uint64_t j;
        ts_blend_next(&s->blend, &d, &j);
        s->set_of_seq[i] = d;
        s->window_of_seq[i] = ts_sampler_window(s, d, j);
    }
    s->seq0 = seq0;
}

void ts_data_microbatch(ts_sampler *s, int64_t seq0, int global_batch, int dp, int dp_rank,
                        int micro_batch, int mb, int T, int *inputs, int *targets)
{
    TS_ASSERT(seq0 >= 0 && global_batch >= 1 && dp >= 1 && global_batch % dp == 0);
    TS_ASSERT(dp_rank >= 0 && dp_rank < dp && micro_batch >= 1 && mb >= 0 && T == s->T);
    ts_sampler_prepare(s, seq0, global_batch);
    const int64_t B = global_batch;
    const int64_t first = (int64_t)dp_rank * B / dp + (int64_t)mb * micro_batch;
    TS_ASSERT(first + micro_batch <= ((int64_t)dp_rank + 1) * B / dp);
    for (int r = 0; r < micro_batch; r++) {
        const int64_t i = first + r;
        ts_data_window(&s->sets[s->set_of_seq[i]], s->window_of_seq[i], T,
                       inputs + (size_t)r * T, targets + (size_t)r * T);
    }
}

void ts_sampler_counts(const ts_sampler *s, uint64_t *counts)
{
    for (int d = 0; d < s->n_sets; d++) counts[d] = s->blend.count[d];
}

uint64_t ts_data_val_window(uint64_t i, uint64_t n, uint64_t S)
{
    TS_ASSERT(n >= 1 && i < n);
    /* floor(i * S / n) without the 128-bit product: S = q*n + r. */
    const uint64_t q = S / n, r = S % n;
    return i * q + (i * r) / n; /* i, r < n <= 2^20: no overflow */
}
