/* The capacity decision (kernels.h moe_capacity, model.moe_capacity > 0) on host memory:
 * the CPU tables' slot, and model/moe.c's when it gathered a split sequence's
 * assignments on the host. Per sequence, its T*K assignments sorted by expert and then by
 * their key, largest first; each expert keeps its first `capacity`. A sort rather than
 * CUDA's threshold search (moe.cu): a different algorithm for the same keys, which
 * test_cuda_kernels compares. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/kernels.h"

typedef struct {
    int e;        /* the expert */
    int a;        /* the assignment within the sequence: position a / K, choice a % K */
    uint64_t key; /* capacity_key: larger is kept first */
} ranked;

/* The weight's fp32 bits mapped so that unsigned order is numeric order (negative values
 * flipped), above the position reversed: a larger weight first, then an earlier
 * position. Within one expert of one sequence every key differs (a token holds an expert
 * once), so the order is total and no sort stability matters. */
static uint64_t capacity_key(float w, int t)
{
    uint32_t u;
    memcpy(&u, &w, sizeof u);
    u = (u & 0x80000000u) ? ~u : u | 0x80000000u;
    return (uint64_t)u << 32 | (uint32_t)(0xFFFFFFFFu - (uint32_t)t);
}

static int by_expert_then_key(const void *pa, const void *pb)
{
    const ranked *x = pa, *y = pb;
    if (x->e != y->e) return x->e < y->e ? -1 : 1;
    return x->key > y->key ? -1 : x->key < y->key ? 1 : 0;
}

void ts_moe_capacity_keep(int *keep, const int *topk_idx, const float *topk_w, int N, int K,
                          int E, int T, int capacity)
{
    TS_ASSERT(T > 0 && K > 0 && N % T == 0 && capacity >= 0);
    const size_t TK = (size_t)T * K;
    ranked *r = ts_malloc(TK * sizeof *r);
    for (int q = 0; q < N / T; q++) {
        const size_t a0 = (size_t)q * TK;
        for (size_t i = 0; i < TK; i++) {
            const int e = topk_idx[a0 + i];
            TS_ASSERT(e >= 0 && e < E);
            r[i] = (ranked){.e = e, .a = (int)i, .key = capacity_key(topk_w[a0 + i], (int)(i / K))};
        }
        qsort(r, TK, sizeof *r, by_expert_then_key);
        size_t rank = 0; /* r[i]'s place among its expert's assignments */
        for (size_t i = 0; i < TK; i++) {
            const bool same = i > 0 && r[i].e == r[i - 1].e;
            TS_ASSERT(!same || r[i].key != r[i - 1].key); /* a token chose e twice */
            rank = same ? rank + 1 : 0;
            keep[a0 + (size_t)r[i].a] = rank < (size_t)capacity ? r[i].e : TS_MOE_DROPPED;
        }
    }
    free(r);
}
