/* Byte-pair merging exactly as tiktoken's byte_pair_encode: start from single bytes and
 * repeatedly merge the adjacent pair whose concatenation has the lowest rank, the
 * leftmost on ties, until no adjacent pair is a token. tiktoken rescans all pairs after
 * each merge (quadratic in the piece); that is fastest for the short pieces of ordinary
 * text, so short pieces use the same scan and long ones a heap ordered by (rank, start),
 * which picks the same pair at every step. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

/* Pieces up to this many bytes use the linear scan: cheaper than heap upkeep at these
 * sizes, and English pieces are far shorter. (Not tuned finely: 32 and 128 timed alike
 * on the copyright corpus within this shared machine's noise.) */
#define TS_TOK_LINEAR_MAX 128

/* Room for n parts. A long piece needs 16 bytes per byte here (and the heap 8 more): a
 * 100 MB run of letters or digits asks for gigabytes, which the encoder reports as an
 * error naming the piece rather than dying. */
static ts_status scratch_reserve(ts_tok_merge_scratch *s, size_t n)
{
    if (n <= s->cap) return TS_OK;
    size_t cap = s->cap ? s->cap : 64;
    while (cap < n) cap *= 2;
    free(s->start);
    free(s->rank);
    free(s->prev);
    free(s->next);
    s->start = ts_try_malloc(cap * sizeof *s->start);
    s->rank = ts_try_malloc(cap * sizeof *s->rank);
    s->prev = ts_try_malloc(cap * sizeof *s->prev);
    s->next = ts_try_malloc(cap * sizeof *s->next);
    s->cap = cap;
    if (s->start && s->rank && s->prev && s->next) return TS_OK;
    ts_tok_merge_scratch_free(s);
    return ts_fail("out of memory merging a single pre-token piece of %zu bytes: its merge "
                   "needs about %zu MiB of scratch (24 bytes per byte of the piece); such a "
                   "piece is one run of letters, digits or symbols without a space: split the "
                   "text (or leave out the file that holds it), or allow the process more "
                   "memory",
                   n - 1, (n * (4 * sizeof(uint32_t) + sizeof(uint64_t))) >> 20);
}

void ts_tok_merge_scratch_free(ts_tok_merge_scratch *s)
{
    free(s->start);
    free(s->rank);
    free(s->prev);
    free(s->next);
    free(s->heap);
    memset(s, 0, sizeof *s);
}

static inline uint32_t span_rank(const ts_tok_ranks *r, const unsigned char *p, size_t a,
                                 size_t b)
{
    return ts_tok_rank_of(r, p + a, b - a);
}

ts_status ts_tok_merge_linear(const ts_tok_ranks *r, const unsigned char *p, size_t len,
                              ts_tok_merge_scratch *s, ts_tok_ids *out)
{
    if (scratch_reserve(s, len + 1) != TS_OK) return TS_ERR;
    uint32_t *start = s->start, *rank = s->rank;
    size_t m = len + 1; /* parts: token starts, then the end */
    for (size_t i = 0; i + 1 < len; i++) {
        start[i] = (uint32_t)i;
        rank[i] = span_rank(r, p, i, i + 2);
    }
    start[len - 1] = (uint32_t)(len - 1);
    rank[len - 1] = TS_TOK_NO_RANK;
    start[len] = (uint32_t)len;
    rank[len] = TS_TOK_NO_RANK;
    for (;;) {
        uint32_t best = TS_TOK_NO_RANK;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < m; i++) {
            if (rank[i] < best) {
                best = rank[i];
                bi = i;
            }
        }
        if (best == TS_TOK_NO_RANK) break;
        /* merge parts bi and bi+1: the pairs starting at bi-1 and bi change */
        if (bi > 0)
            rank[bi - 1] = bi + 2 < m ? span_rank(r, p, start[bi - 1], start[bi + 2])
                                      : TS_TOK_NO_RANK;
        rank[bi] = bi + 3 < m ? span_rank(r, p, start[bi], start[bi + 3]) : TS_TOK_NO_RANK;
        memmove(start + bi + 1, start + bi + 2, (m - bi - 2) * sizeof *start);
        memmove(rank + bi + 1, rank + bi + 2, (m - bi - 2) * sizeof *rank);
        m--;
    }
    for (size_t i = 0; i + 1 < m; i++) ts_tok_push(out, span_rank(r, p, start[i], start[i + 1]));
    return TS_OK;
}

static ts_status heap_push(ts_tok_merge_scratch *s, size_t *n, uint64_t v)
{
    if (*n == s->heap_cap) {
        uint64_t *grown = ts_try_grow(s->heap, &s->heap_cap, *n, sizeof *s->heap);
        if (!grown)
            return ts_fail("out of memory merging a single pre-token piece: its merge heap "
                           "of %zu entries does not fit; such a piece is one run of letters, "
                           "digits or symbols without a space: split the text (or leave out "
                           "the file that holds it), or allow the process more memory",
                           *n + 1);
        s->heap = grown;
    }
    uint64_t *h = s->heap;
    size_t i = (*n)++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (h[up] <= v) break;
        h[i] = h[up];
        i = up;
    }
    h[i] = v;
    return TS_OK;
}

static uint64_t heap_pop(ts_tok_merge_scratch *s, size_t *n)
{
    uint64_t *h = s->heap;
    uint64_t top = h[0], v = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (h[c] >= v) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = v;
    return top;
}

ts_status ts_tok_merge_heap(const ts_tok_ranks *r, const unsigned char *p, size_t len,
                            ts_tok_merge_scratch *s, ts_tok_ids *out)
{
    if (scratch_reserve(s, len + 1) != TS_OK) return TS_ERR;
    /* Tokens are a linked list of start offsets; rank[i] is the rank of token i joined
     * with the next one; start[i] says whether token i still exists. */
    uint32_t *alive = s->start, *rank = s->rank, *prev = s->prev, *next = s->next;
    size_t hn = 0;
    /* A stop is polled every 2^16 steps: a 100 MB piece takes about 20 s to merge. */
    for (size_t i = 0; i < len; i++) {
        if ((i & 0xffff) == 0 && s->stop && *s->stop) return ts_fail("stopped");
        alive[i] = 1;
        prev[i] = (uint32_t)i - 1; /* UINT32_MAX for the first */
        next[i] = (uint32_t)(i + 1);
        rank[i] = i + 1 < len ? span_rank(r, p, i, i + 2) : TS_TOK_NO_RANK;
        if (rank[i] != TS_TOK_NO_RANK && heap_push(s, &hn, (uint64_t)rank[i] << 32 | i) != TS_OK)
            return TS_ERR;
    }
    for (uint32_t polls = 0; hn; polls++) {
        if ((polls & 0xffff) == 0 && s->stop && *s->stop) return ts_fail("stopped");
        uint64_t top = heap_pop(s, &hn);
        uint32_t i = (uint32_t)top, rk = (uint32_t)(top >> 32);
        if (!alive[i] || rank[i] != rk) continue; /* stale: the pair changed since */
        uint32_t j = next[i];
        alive[j] = 0;
        next[i] = next[j];
        if (next[j] < len) prev[next[j]] = i;
        rank[i] = next[i] < len ? span_rank(r, p, i, next[next[i]]) : TS_TOK_NO_RANK;
        if (rank[i] != TS_TOK_NO_RANK && heap_push(s, &hn, (uint64_t)rank[i] << 32 | i) != TS_OK)
            return TS_ERR;
        uint32_t h = prev[i];
        if (h != UINT32_MAX) {
            rank[h] = span_rank(r, p, h, next[i]);
            if (rank[h] != TS_TOK_NO_RANK &&
                heap_push(s, &hn, (uint64_t)rank[h] << 32 | h) != TS_OK)
                return TS_ERR;
        }
    }
    for (size_t i = 0; i < len; i = next[i]) ts_tok_push(out, span_rank(r, p, i, next[i]));
    return TS_OK;
}

ts_status ts_tok_merge(const ts_tok_ranks *r, const unsigned char *p, size_t len,
                       ts_tok_merge_scratch *s, ts_tok_ids *out)
{
    if (len <= TS_TOK_LINEAR_MAX) return ts_tok_merge_linear(r, p, len, s, out);
    return ts_tok_merge_heap(r, p, len, s, out);
}
