/* The CUDA attention variants by name, each with the signatures of the attention slots
 * of kernels.h (same arguments, same rules: NKV key/value heads (NH % NKV == 0, a shape
 * that breaks it is a fatal error), dqkv overwritten, `att` the variant's own
 * saved state sized by its *_saved_bytes, the backward's workspace by its
 * *_scratch_bytes; activations in the variant's type). The tables' ts_cuda_attention_*
 * entries run one of them (attention.cu; the table is chosen by train.attention); tests
 * call them directly. C-callable. Every variant honours h.doc_start (packed documents,
 * device int32 [B, T]; NULL: causal): the flash ones skip the masked tiles, the
 * batched-GEMM ones mask in their softmax (docs/ARCHITECTURE.md "Packed documents on
 * CUDA and in the planner"). */
#ifndef TS_KERNELS_CUDA_ATTENTION_FLASH_H
#define TS_KERNELS_CUDA_ATTENTION_FLASH_H

#include <stddef.h>

#include "kernels/attention_sizes.h" /* TS_CUDA_FLASH_MAX_HS and every variant's sizes */

#ifdef __cplusplus
extern "C" {
#endif

/* The four functions of one variant, named prefix##saved_bytes ... prefix##backward. */
#define TS_CUDA_ATTENTION_DECLS(p)                                                          \
    size_t p##saved_bytes(int B, int T, ts_att_heads h);                                     \
    size_t p##scratch_bytes(int B, int T, ts_att_heads h);                                   \
    void p##forward(void *out, void *att, const void *qkv, int B, int T, ts_att_heads h);    \
    void p##backward(void *dqkv, void *scratch, const void *dout, const void *qkv,          \
                     const void *att, int B, int T, ts_att_heads h);

/* Flash-style (attention_flash.cu): tiles in shared memory, fp32 math, no [T, T] matrix
 * in memory. att keeps the row log-sum-exp of the scaled scores, fp32 [B, NH, T]; the
 * backward's scratch holds D = rowsum(dO * O), fp32 [B, NH, T]. fp32 activations
 * (ts_cuda_flash_attention_*) or bf16 ones (ts_cuda_flash_bf16_attention_*: loads
 * widened to fp32, outputs rounded once to bf16). Any q/k and v head sizes (HS, HSV)
 * 1..TS_CUDA_FLASH_MAX_HS (a larger one is a fatal error naming it: the dispatch in
 * attention.cu sends those to the batched-GEMM attention), any softmax scale.
 * Deterministic: the backward's dK and dV come from one block per (key tile, kv head)
 * that loops over the head's query heads. */
TS_CUDA_ATTENTION_DECLS(ts_cuda_flash_attention_)
TS_CUDA_ATTENTION_DECLS(ts_cuda_flash_bf16_attention_)

/* Batched-GEMM, fp32 (attention.cu): cuBLAS SGEMMs and softmax kernels; att keeps the
 * probabilities fp32 [B, NH, T, T] as the CPU does; scratch holds dS fp32 [B, NH, T, T]. */
TS_CUDA_ATTENTION_DECLS(ts_cuda_gemm_attention_)

/* Batched-GEMM, bf16 (attention.cu): the same algorithm on bf16 q, k, v and dout, the
 * products bf16 x bf16 GEMMs accumulating in fp32; the scores and the outputs rounded to
 * bf16 by the GEMMs, the softmax and its backward in fp32. att keeps the probabilities
 * bf16 [B, NH, T, T]; scratch holds dP fp32 [B, NH, T, T] and dS bf16 [B, NH, T, T]. */
TS_CUDA_ATTENTION_DECLS(ts_cuda_gemm_bf16_attention_)

/* The tables' attention slots (table.cu): ts_kernels_cuda's (suffix none), the fp32 flash
 * table's (_flash), the bf16 tables' (_bf16, _bf16_flash). A flash table sends heads
 * wider than the flash kernels take to its precision's batched-GEMM attention. */
#define TS_CUDA_ATTENTION_SLOT_DECLS(suffix)                                                  \
    size_t ts_cuda_attention_saved_bytes##suffix(int B, int T, ts_att_heads h);              \
    size_t ts_cuda_attention_scratch_bytes##suffix(int B, int T, ts_att_heads h);            \
    void ts_cuda_attention_forward##suffix(void *out, void *att, const void *qkv, int B,     \
                                           int T, ts_att_heads h);                           \
    void ts_cuda_attention_backward##suffix(void *dqkv, void *scratch, const void *dout,     \
                                            const void *qkv, const void *att, int B, int T,  \
                                            ts_att_heads h);
TS_CUDA_ATTENTION_SLOT_DECLS()
TS_CUDA_ATTENTION_SLOT_DECLS(_flash)
TS_CUDA_ATTENTION_SLOT_DECLS(_bf16)
TS_CUDA_ATTENTION_SLOT_DECLS(_bf16_flash)
#undef TS_CUDA_ATTENTION_SLOT_DECLS
#undef TS_CUDA_ATTENTION_DECLS

#ifdef __cplusplus
}
#endif

#endif
