/* A keyed pseudo-random permutation of [0, n) that is never materialised: a balanced
 * Feistel network over the smallest even power of two >= n, walked until it lands
 * inside [0, n) (cycle-walking). O(1) memory for any n (a 100B-token corpus has 10^8
 * windows), O(1) expected work per element (the domain is < 4n, so fewer than 4
 * rounds of walking on average). The data pipeline's epoch order: the same (n, seed,
 * dataset, epoch) gives the same permutation on every rank and machine. */
#ifndef TS_PERMUTATION_H
#define TS_PERMUTATION_H

#include <stdint.h>

#define TS_PERM_ROUNDS 6 /* Luby-Rackoff needs 4 for a strong PRP; 6 for margin */

typedef struct {
    uint64_t n;                       /* the permutation's size */
    int half_bits;                    /* bits of each Feistel half */
    uint64_t half_mask;
    uint64_t keys[TS_PERM_ROUNDS];    /* round keys from (seed, dataset, epoch) */
} ts_perm;

/* The permutation of [0, n) keyed by (seed, dataset, epoch); n >= 1. */
void ts_perm_init(ts_perm *p, uint64_t n, uint64_t seed, uint64_t dataset, uint64_t epoch);

/* Its value at x < n: a bijection of [0, n). */
uint64_t ts_perm_apply(const ts_perm *p, uint64_t x);

#endif
