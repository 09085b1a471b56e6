/* A tensor split over a group, gathered whole into its logical (Hugging Face) layout on
 * every member, and a member's own part taken back out of it: Megatron's "duplicated"
 * mode for optimizers whose update needs the whole matrix (Muon's Newton-Schulz). The
 * shards travel in one all-gather (uneven parts: each member's count), then each part is
 * placed run by run as its shard spec's iterator says (tensor/shard.h), so any split the
 * model makes (rows, columns, grouped axes, parts shared by several ranks) is handled
 * alike. Device memory of the kernels' backend. */
#ifndef TS_TENSOR_LOGICAL_GATHER_H
#define TS_TENSOR_LOGICAL_GATHER_H

#include <stddef.h>

#include "comm/comm.h"
#include "kernels/kernels.h"
#include "tensor/shard.h"

/* Whether s is split (over a group of more than one part) and so needs the gather. */
bool ts_logical_is_split(const ts_shard_spec *s);
/* Floats of the staging buffer ts_logical_gather needs for s over a group of `size`
 * members (every member's shard, duplicates of shared parts included). */
size_t ts_logical_stage_floats(const ts_shard_spec *s, int size);
/* logical[ts_shard_logical_numel(s)] = the whole tensor, from every member's `local`
 * shard (this rank's part: s; the group's members hold parts as ts_shard_init or, with
 * fewer parts than members, ts_shard_init_shared would give them). Collective over g;
 * stage as sized above. An unsplit s: a copy. */
void ts_logical_gather(const ts_comm *g, const ts_kernels *k, const ts_shard_spec *s,
                       const float *local, float *stage, float *logical);
/* local[ts_shard_numel(s)] = this rank's part of the logical tensor. */
void ts_logical_take(const ts_kernels *k, const ts_shard_spec *s, const float *logical,
                     float *local);

#endif
