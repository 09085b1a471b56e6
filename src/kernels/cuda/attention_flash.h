/* The CUDA attention variants by name, each with the signatures of the attention slots
 * of kernels.h (same arguments, same rules: dqkv overwritten, `att` the variant's own
 * saved state sized by its *_saved_floats, the backward's workspace by its
 * *_scratch_floats). The tables' ts_cuda_attention_* entries run one of them
 * (attention.cu; the table is chosen by train.attention); tests call them directly.
 * C-callable. */
#ifndef TS_KERNELS_CUDA_ATTENTION_FLASH_H
#define TS_KERNELS_CUDA_ATTENTION_FLASH_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Flash-style (attention_flash.cu): fp32 storage and math, tiles in shared memory, no
 * [T, T] matrix in memory. att keeps the row log-sum-exp of the scaled scores
 * [B, NH, T]; the backward's scratch holds D = rowsum(dO * O) [B, NH, T]. Any head size
 * 1..TS_CUDA_FLASH_MAX_HS (a larger one is a fatal error naming it: the dispatch in
 * attention.cu sends those to the batched-GEMM attention). Deterministic. */
#define TS_CUDA_FLASH_MAX_HS 256
size_t ts_cuda_flash_attention_saved_floats(int B, int T, int NH, int HS);
size_t ts_cuda_flash_attention_scratch_floats(int B, int T, int NH, int HS);
void ts_cuda_flash_attention_forward(float *out, float *att, const float *qkv, int B, int T,
                                     int NH, int HS);
void ts_cuda_flash_attention_backward(float *dqkv, float *scratch, const float *dout,
                                      const float *qkv, const float *att, int B, int T, int NH,
                                      int HS);

/* Batched-GEMM, fp32 (attention.cu): cuBLAS SGEMMs and softmax kernels; att keeps the
 * probabilities [B, NH, T, T] as the CPU does; scratch holds dS [B, NH, T, T]. */
size_t ts_cuda_gemm_attention_saved_floats(int B, int T, int NH, int HS);
size_t ts_cuda_gemm_attention_scratch_floats(int B, int T, int NH, int HS);
void ts_cuda_gemm_attention_forward(float *out, float *att, const float *qkv, int B, int T,
                                    int NH, int HS);
void ts_cuda_gemm_attention_backward(float *dqkv, float *scratch, const float *dout,
                                     const float *qkv, const float *att, int B, int T, int NH,
                                     int HS);

/* Batched-GEMM with bf16 products (attention.cu): the same algorithm, the four products
 * as bf16 x bf16 GEMMs accumulating in fp32 into fp32 outputs; softmax, probabilities and
 * dS in fp32. att keeps the fp32 probabilities, their bf16 copy and a bf16 copy of qkv
 * (the backward reuses both); scratch holds dP/dS fp32, dS bf16 and a bf16 copy of dout.
 * Outputs within about 1e-2 (relative) of the fp32 ones. */
size_t ts_cuda_gemm_bf16_attention_saved_floats(int B, int T, int NH, int HS);
size_t ts_cuda_gemm_bf16_attention_scratch_floats(int B, int T, int NH, int HS);
void ts_cuda_gemm_bf16_attention_forward(float *out, float *att, const float *qkv, int B, int T,
                                         int NH, int HS);
void ts_cuda_gemm_bf16_attention_backward(float *dqkv, float *scratch, const float *dout,
                                          const float *qkv, const float *att, int B, int T,
                                          int NH, int HS);

/* The other tables' attention slots (table.cu): ts_kernels_cuda_bf16's (the bf16
 * batched-GEMM attention), and the flash tables' of either precision (the fp32 flash
 * kernels, heads wider than they take on the table's batched-GEMM attention). The fp32
 * table's own are ts_cuda_attention_* in cuda_internal.h. */
#define TS_CUDA_ATTENTION_SLOT_DECLS(suffix)                                                \
    size_t ts_cuda_attention_saved_floats##suffix(int B, int T, int NH, int HS);           \
    size_t ts_cuda_attention_scratch_floats##suffix(int B, int T, int NH, int HS);         \
    void ts_cuda_attention_forward##suffix(float *out, float *att, const float *qkv, int B, \
                                           int T, int NH, int HS);                          \
    void ts_cuda_attention_backward##suffix(float *dqkv, float *scratch, const float *dout, \
                                            const float *qkv, const float *att, int B,      \
                                            int T, int NH, int HS);
TS_CUDA_ATTENTION_SLOT_DECLS(_bf16)
TS_CUDA_ATTENTION_SLOT_DECLS(_flash)
TS_CUDA_ATTENTION_SLOT_DECLS(_bf16_flash)
#undef TS_CUDA_ATTENTION_SLOT_DECLS

#ifdef __cplusplus
}
#endif

#endif
