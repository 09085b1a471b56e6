/* Counter-based random numbers for initialisation by index: element i of logical
 * tensor `name` depends only on (seed, name, i), so any shard of any grid draws
 * exactly the values the unsharded model has on one rank. */
#ifndef TS_RNG_H
#define TS_RNG_H

#include <stdint.h>

/* 64-bit FNV-1a of a tensor's logical name: the tensor's key. */
uint64_t ts_rng_name_key(const char *name);

/* splitmix64 finaliser: a bijective mix of 64 bits. */
uint64_t ts_rng_mix64(uint64_t x);

/* Standard normal for element `index` of the tensor keyed `key` (Box-Muller on two
 * uniforms drawn from the hash of (seed, key, index)). Computed in double. */
double ts_rng_normal(uint64_t seed, uint64_t key, uint64_t index);

#endif
