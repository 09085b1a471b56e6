/* Multi-head latent attention under context parallelism (model/mla.c's attention when
 * parallel.cp > 1), private to src/model.
 *
 * What a cp rank exchanges is not the expanded K/V but what determines them: each
 * position's [RMSNorm(c_kv) | RoPE(k_pe)], kv_lora_rank + qk_rope_head_dim values (576 in
 * DeepSeek-V3), against this rank's heads' keys and values H * (nope + rope + v) (128 *
 * 320 = 40960 at tp 1). The block all-gathers that latent over the cp group (tensor/cp.h
 * ts_cp_rows_gather) into position order and keeps it for its backward in the kvg slot
 * ([B, T, RKV + RR] in place of [B, T, H (HS + HSV)]); each rank then expands every
 * position through kv_b_proj (its heads) into the prefix kernels' kv rows [H HS k | H HSV
 * v] (the k heads' last RR channels the shared, already rotated k_pe) in the exchange's
 * work, and its two chunks' queries attend their prefixes (ts_cp_attention_recompute).
 * The backward expands again from the kept latent (the expansion is work, not kept),
 * runs the prefix backward into the gathered dK/dV, then kv_b_proj's backward over every
 * position (its weight gradient is this rank's queries' part: the replica reduction over
 * dp x cp sums it, as for every weight) and sums the k heads' rope channels into k_pe's
 * gradient; the latent's gradient [B, T, RKV + RR] is reduce-scattered to the positions'
 * owners (ts_cp_rows_reduce_scatter), which go on through RoPE's backward and the latent
 * norm as on one rank. The cost: kv_b_proj runs on all T positions, twice forward (the
 * backward's rebuild) and once backward, where one rank's share is T / cp positions
 * once each way (docs/ARCHITECTURE.md "MLA under context parallelism"). */
#ifndef TS_MODEL_MLA_CP_H
#define TS_MODEL_MLA_CP_H

#include "model/block.h"

/* The exchange's work bytes for B sequences (the scratch's cp region under MLA), and the
 * kept latent's elements [B, T, RKV + RR]. d: the layer's dims (d->mla). */
size_t ts_mla_cp_work_bytes(const ts_cp *cp, const act_dims *d, int B);
size_t ts_mla_cp_latent_elems(const ts_cp *cp, const act_dims *d, int B);

/* q|k|v [N, QKV] for the prefix kernels from q [N, QK] (before RoPE) and the block's
 * k_pe (b->v.mla_kpe): the q heads, and k_pe in every k head's rope channels, then RoPE
 * at this rank's positions (the k_nope and v columns are left as they are: the prefix
 * kernels read only the q columns; keys and values come from the gathered latent). */
void ts_mla_cp_assemble(const block_sub *b, void *qkv, const void *q);

/* The forward on b's local rows, in place of the one-rank kv_b_proj, assembly and
 * attention: assembles qkv from q (ts_mla_cp_assemble), gathers [c_kv normalised
 * (b->v.mla_ckv) | rotated k_pe] into b->v.kvg, expands it and attends: b->v.atty, and
 * the saved state into att. */
void ts_mla_cp_forward(const block_sub *b, void *qkv, const void *q, void *att);

/* Its backward, in place of the one-rank attention backward and kv_b_proj's: from dout
 * [N, H HSV] and the forward's qkv and att (att NULL: selective recompute, rebuilt here
 * into the scratch's rebuilt region; qkv then assembled again by the caller), writes
 * dqkv's q columns (the q heads' gradient before RoPE's backward) and its k heads' rope
 * channels (head 0: the rotated k_pe's gradient, summed over the heads and over the ranks
 * that attended this rank's positions; the others zero), so that the one-rank RoPE
 * backward and head sum go on unchanged (dqkv's k_nope and v columns are left as they
 * are: nothing downstream may read them); dckv [N, RKV] (overwritten) the normalised
 * latent's gradient, kv_b_proj's input gradient on one rank; adds kv_b_proj's weight
 * gradient (its output gradient spans all T positions, so it is made here, in the input
 * pass, as all of MLA's are). */
void ts_mla_cp_backward(const block_sub *b, void *dqkv, void *dckv, const void *dout,
                        const void *qkv, const void *att);

#endif
