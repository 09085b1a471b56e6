/* Flash-style causal attention for both activation types (the kernels:
 * attention_flash_kernels.cuh): fp32 tables read and write fp32 q, k, v, out, dout and
 * dqkv; bf16 tables the same in bf16, widened into fp32 tiles, every sum in fp32 and
 * each output rounded once to bf16. The saved state and the workspace are fp32 rows in
 * either precision.
 *
 * Memory: the forward keeps only each row's log-sum-exp of the scaled scores, [B, NH, T]
 * floats, instead of the probabilities [B, NH, T, T]; the backward recomputes the
 * probabilities tile by tile from it. Its workspace is D = rowsum(dO * O) [B, NH, T]:
 * the slot is not given the forward's output O, so a first pass recomputes O per query
 * tile (the forward kernel again, writing only D).
 *
 * The backward is deterministic without atomics: dK and dV per key tile of each kv head,
 * looping over its query heads (NH / NKV of them; one when NKV = NH) and, for each, the
 * query tiles at or below the diagonal; dQ in a separate pass per query tile, looping
 * over the key tiles up to the diagonal. Each pass recomputes the scores (the
 * price of writing every gradient element from one block).
 *
 * Packed documents (ts_att_heads.doc_start, device int32 [B, T]): every pass skips the
 * key (or query) tiles wholly outside the tile's documents (attention_flash_kernels.cuh),
 * so the work falls with the documents' lengths, ~ sum L_i^2.
 *
 * Tiles: 32 queries x 32 keys for heads up to 128 (GPT-2's 64), 16 x 16 above that, up
 * to 256 (the wider of the q/k and the v head decides: DeepSeek-V3's 192 and 128 take
 * 16, ~64 KB), so the largest backward tile set (~105 KB at HS 128, ~99 KB at HS 256) fits
 * the shared memory of an A100 (164 KB) as well as an H100/H200 (228 KB). Plain fp32
 * FMAs, no tensor cores: a memory-light reference and the choice for long sequences,
 * not a speed record (train.attention picks; gemm is the default until measured). */
#include <limits.h>
#include <math.h>
#include <stdio.h>

#include "kernels/cuda/attention_flash.h"
#include "kernels/cuda/attention_flash_kernels.cuh"
#include "kernels/cuda/cuda_internal.h"

static_assert(TS_FLASH_MAX_HS == TS_CUDA_FLASH_MAX_HS, "one head-size limit");

/* The tile for the heads: 32 up to 128 channels, 16 above (shared memory). */
static int flash_tile(ts_att_heads h) { return h.HS <= 128 && h.HSV <= 128 ? 32 : 16; }

/* A shape this kernel does not take is a caller's bug (attention.cu never sends one):
 * stop with what and why. */
static void flash_check(const char *fn, int B, int T, ts_att_heads h)
{
    const int NH = h.NH, NKV = h.NKV;
    char why[200];
    if (NKV < 1 || NKV > NH || NH % NKV != 0) {
        snprintf(why, sizeof why,
                 "%d query heads cannot share %d key/value heads (NH %% NKV != 0)", NH, NKV);
        ts_cuda_fail(__FILE__, __LINE__, fn, why);
    }
    if (h.HS < 1 || h.HSV < 1 || h.HS > TS_FLASH_MAX_HS || h.HSV > TS_FLASH_MAX_HS) {
        snprintf(why, sizeof why,
                 "head sizes q/k %d, v %d: the flash attention takes 1..%d (use the "
                 "batched-GEMM attention: train.attention = \"gemm\")",
                 h.HS, h.HSV, TS_FLASH_MAX_HS);
        ts_cuda_fail(__FILE__, __LINE__, fn, why);
    }
    int tile = flash_tile(h);
    long long blocks = (long long)B * NH * ((T + tile - 1) / tile);
    if (blocks > INT_MAX) {
        snprintf(why, sizeof why, "B=%d x NH=%d x %d tiles is more blocks than one launch takes",
                 B, NH, (T + tile - 1) / tile);
        ts_cuda_fail(__FILE__, __LINE__, fn, why);
    }
}

/* The most dynamic shared memory a block may opt in to on the current device (one
 * device per process: ts_cuda_select_device binds it before the first call). */
static int flash_smem_limit(void)
{
    static const int limit = [] {
        int dev = 0, v = 0;
        TS_CUDA_CHECK(cudaGetDevice(&dev));
        TS_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
        return v;
    }();
    return limit;
}

/* The dynamic shared memory `kernel` has opted in to (the attribute persists per
 * kernel, so each is set once, not before every launch); with `set`, records it. The
 * flash kernels are a handful of instantiations, all launched from the host thread. */
static size_t opted_in(const void *kernel, size_t set = 0)
{
    static struct { const void *kernel; size_t bytes; } seen[32];
    static int n_seen = 0;
    for (int i = 0; i < n_seen; i++)
        if (seen[i].kernel == kernel) {
            if (set) seen[i].bytes = set;
            return seen[i].bytes;
        }
    if (set && n_seen < 32) seen[n_seen++] = { kernel, set };
    return set;
}

/* Launch `kernel` over ntiles x BH blocks with `floats` of dynamic shared memory on the
 * compute stream, opting in above the 48 KB default. */
template <typename... P, typename... A>
static void flash_launch(void (*kernel)(P...), const char *name, size_t floats, int BH,
                         int ntiles, A... args)
{
    size_t bytes = floats * sizeof(float);
    if (bytes > (size_t)flash_smem_limit()) {
        char why[200];
        snprintf(why, sizeof why,
                 "needs %zu bytes of shared memory per block, this GPU allows %d "
                 "(use train.attention = \"gemm\")",
                 bytes, flash_smem_limit());
        ts_cuda_fail(__FILE__, __LINE__, name, why);
    }
    if (bytes > 48 * 1024 && opted_in((const void *)kernel) < bytes) {
        TS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)bytes));
        opted_in((const void *)kernel, bytes);
    }
    unsigned blocks = (unsigned)ntiles * (unsigned)BH; /* flash_check bounds it */
    kernel<<<blocks, TS_FLASH_THREADS, bytes, ts_cuda_stream()>>>(args...);
    TS_CUDA_LAUNCHED();
}

template <int TILE, typename A>
static void flash_forward_tiles(A *out, float *lse, const A *qkv, int B, int T, ts_att_heads h)
{
    flash_launch(flash_forward_kernel<TILE, false, A>, "flash_forward_kernel",
                 flash_fwd_smem_floats(TILE, h.HS, h.HSV), B * h.NH, (T + TILE - 1) / TILE, out,
                 lse, (const A *)NULL, (float *)NULL, qkv, B, T, h.NH, h.NKV, h.HS, h.HSV,
                 h.scale, h.doc_start);
}

/* dK, dV: one block per (key tile, b, kv head), B * NKV pairs; the others per query head. */
template <int TILE, typename A>
static void flash_backward_tiles(A *dqkv, float *delta, const A *dout, const A *qkv,
                                 const float *lse, int B, int T, ts_att_heads h)
{
    const int ntiles = (T + TILE - 1) / TILE, NH = h.NH, NKV = h.NKV, HS = h.HS, HSV = h.HSV;
    /* D = rowsum(dO * O), O recomputed */
    flash_launch(flash_forward_kernel<TILE, true, A>, "flash_forward_kernel (D)",
                 flash_fwd_smem_floats(TILE, HS, HSV), B * NH, ntiles, (A *)NULL, (float *)NULL,
                 dout, delta, qkv, B, T, NH, NKV, HS, HSV, h.scale, h.doc_start);
    flash_launch(flash_backward_dkv_kernel<TILE, A>, "flash_backward_dkv_kernel",
                 flash_dkv_smem_floats(TILE, HS, HSV), B * NKV, ntiles, dqkv, dout, qkv, lse,
                 (const float *)delta, B, T, NH, NKV, HS, HSV, h.scale, h.doc_start);
    flash_launch(flash_backward_dq_kernel<TILE, A>, "flash_backward_dq_kernel",
                 flash_dq_smem_floats(TILE, HS, HSV), B * NH, ntiles, dqkv, dout, qkv, lse,
                 (const float *)delta, B, T, NH, NKV, HS, HSV, h.scale, h.doc_start);
}

template <typename A>
static void flash_forward(const char *fn, void *out, void *att, const void *qkv, int B, int T,
                          ts_att_heads h)
{
    if (B <= 0 || T <= 0 || h.NH <= 0) return;
    flash_check(fn, B, T, h);
    if (flash_tile(h) == 32)
        flash_forward_tiles<32, A>((A *)out, (float *)att, (const A *)qkv, B, T, h);
    else
        flash_forward_tiles<16, A>((A *)out, (float *)att, (const A *)qkv, B, T, h);
}

template <typename A>
static void flash_backward(const char *fn, void *dqkv, void *scratch, const void *dout,
                           const void *qkv, const void *att, int B, int T, ts_att_heads h)
{
    if (B <= 0 || T <= 0 || h.NH <= 0) return;
    flash_check(fn, B, T, h);
    if (flash_tile(h) == 32)
        flash_backward_tiles<32, A>((A *)dqkv, (float *)scratch, (const A *)dout, (const A *)qkv,
                                    (const float *)att, B, T, h);
    else
        flash_backward_tiles<16, A>((A *)dqkv, (float *)scratch, (const A *)dout, (const A *)qkv,
                                    (const float *)att, B, T, h);
}

/* The fp32 and the bf16 variant (attention_flash.h): the same sizes, their own types.
 * att: the row log-sum-exp, fp32 [B, NH, T]; scratch: D = rowsum(dO * O), the same
 * (kernels/attention_sizes.h). */
#define TS_FLASH_VARIANT(p, A)                                                                  \
    extern "C" size_t p##saved_bytes(int B, int T, ts_att_heads h)                              \
    {                                                                                           \
        return ts_cuda_flash_saved_bytes(B, T, h);                                              \
    }                                                                                           \
    extern "C" size_t p##scratch_bytes(int B, int T, ts_att_heads h)                            \
    {                                                                                           \
        return ts_cuda_flash_scratch_bytes(B, T, h);                                            \
    }                                                                                           \
    extern "C" void p##forward(void *out, void *att, const void *qkv, int B, int T,             \
                               ts_att_heads h)                                                  \
    {                                                                                           \
        flash_forward<A>(#p "forward", out, att, qkv, B, T, h);                                 \
    }                                                                                           \
    extern "C" void p##backward(void *dqkv, void *scratch, const void *dout, const void *qkv,  \
                                const void *att, int B, int T, ts_att_heads h)                  \
    {                                                                                           \
        flash_backward<A>(#p "backward", dqkv, scratch, dout, qkv, att, B, T, h);               \
    }

TS_FLASH_VARIANT(ts_cuda_flash_attention_, float)
TS_FLASH_VARIANT(ts_cuda_flash_bf16_attention_, bf16)
#undef TS_FLASH_VARIANT
