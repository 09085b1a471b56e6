/* The Feistel permutation of permutation.h. */
#include "dataset/permutation.h"

#include "core/error.h"
#include "core/rng.h" /* ts_rng_mix64, splitmix64's finaliser: the mixer and the round function */

void ts_perm_init(ts_perm *p, uint64_t n, uint64_t seed, uint64_t dataset, uint64_t epoch)
{
    TS_ASSERT(n >= 1 && n <= (1ull << 62));
    p->n = n;
    /* Domain 2^(2h) >= n, with h >= 1 so both halves hold a bit. */
    int bits = 0;
    while ((1ull << bits) < n) bits++;
    if (bits % 2) bits++;
    if (bits < 2) bits = 2;
    p->half_bits = bits / 2;
    p->half_mask = (1ull << p->half_bits) - 1;
    /* Each input passes its own mixer, so nearby seeds, datasets and epochs give
     * unrelated keys. */
    uint64_t k = ts_rng_mix64(ts_rng_mix64(ts_rng_mix64(seed) ^ dataset) ^ epoch);
    for (int r = 0; r < TS_PERM_ROUNDS; r++) {
        k = ts_rng_mix64(k + (uint64_t)r);
        p->keys[r] = k;
    }
}

/* One pass of the network over the whole power-of-two domain. */
static uint64_t feistel(const ts_perm *p, uint64_t x)
{
    uint64_t l = x >> p->half_bits, r = x & p->half_mask;
    for (int i = 0; i < TS_PERM_ROUNDS; i++) {
        const uint64_t f = ts_rng_mix64(r ^ p->keys[i]) & p->half_mask;
        const uint64_t nl = r;
        r = l ^ f;
        l = nl;
    }
    return (l << p->half_bits) | r;
}

uint64_t ts_perm_apply(const ts_perm *p, uint64_t x)
{
    TS_ASSERT(x < p->n);
    /* Cycle-walking: a bijection of the domain, applied until the value is back inside
     * [0, n), is a bijection of [0, n) (each cycle of the domain's permutation is
     * visited in order, skipping the values outside). */
    do x = feistel(p, x);
    while (x >= p->n);
    return x;
}
