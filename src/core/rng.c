#include "core/rng.h"

#include <math.h>

uint64_t ts_rng_name_key(const char *name)
{
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        h ^= *p;
        h *= 1099511628211ull;
    }
    return h;
}

uint64_t ts_rng_mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

double ts_rng_normal(uint64_t seed, uint64_t key, uint64_t index)
{
    /* Two independent 53-bit uniforms from two chained hashes of the counter. */
    uint64_t h = ts_rng_mix64(seed ^ ts_rng_mix64(key ^ ts_rng_mix64(index)));
    uint64_t h2 = ts_rng_mix64(h);
    double u1 = ((double)(h >> 11) + 1.0) * 0x1.0p-53; /* (0, 1]: log is finite */
    double u2 = (double)(h2 >> 11) * 0x1.0p-53;        /* [0, 1) */
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}
