/* Backend-neutral helpers of the kernel interface. */
#include "kernels/kernels.h"

#include <string.h>

/* Every function slot of ts_kernels, by name. */
#define TS_KERNEL_SLOTS(X)                                                                   \
    X(dev_alloc) X(dev_free) X(memcpy_h2d) X(memcpy_d2h) X(memcpy_d2d) X(memset_zero) X(convert) \
    X(sum_into) X(sum_squares_into) X(stream_create) X(stream_destroy) X(stream_sync)       \
    X(event_record) X(event_wait) X(attention_saved_bytes) X(attention_scratch_bytes)    \
    X(encoder_forward) X(encoder_backward) X(layernorm_forward) X(layernorm_backward)       \
    X(matmul_forward) X(matmul_backward) X(attention_forward) X(attention_backward)         \
    X(gelu_forward) X(gelu_backward) X(residual_forward) X(residual_layernorm_forward)     \
    X(crossentropy_forward_backward) X(adamw_update) X(adamw_update_spans) X(sum_squares)  \
    X(vocab_embed_forward) X(vocab_embed_backward) X(xent_vp_stats) X(xent_vp_sumexp)      \
    X(xent_vp_finish) X(rmsnorm_forward) X(rmsnorm_backward) X(residual_rmsnorm_forward)    \
    X(rope_forward) X(rope_backward) X(swiglu_forward) X(swiglu_backward)

const char *ts_kernels_missing(const ts_kernels *k)
{
#define TS_CHECK_SLOT(slot) \
    if (!k->slot) return #slot;
    TS_KERNEL_SLOTS(TS_CHECK_SLOT)
#undef TS_CHECK_SLOT
    return NULL;
}

/* Every table this build has. */
static const ts_kernels *const all_tables[] = {
    &ts_kernels_cpu,
    &ts_kernels_cpu_strict,
    &ts_kernels_cpu_bf16,
    &ts_kernels_cpu_strict_bf16,
#ifdef TS_HAVE_CUDA
    &ts_kernels_cuda,
    &ts_kernels_cuda_flash,
    &ts_kernels_cuda_bf16,
    &ts_kernels_cuda_bf16_flash,
#endif
};
enum { N_TABLES = sizeof all_tables / sizeof all_tables[0] };

const ts_kernels *ts_kernels_find(const char *name)
{
    for (size_t i = 0; i < N_TABLES; i++)
        if (!strcmp(all_tables[i]->name, name)) return all_tables[i];
    return NULL;
}

const ts_kernels *ts_kernels_layout_for(const char *device, const char *precision,
                                        const char *attention)
{
    const ts_kernels *k = ts_kernels_for(device, precision, attention);
    if (!k) k = ts_kernels_for("cpu", precision, "gemm");
    return k ? k : &ts_kernels_cpu;
}

const ts_kernels *ts_kernels_for(const char *device, const char *precision,
                                 const char *attention)
{
    for (size_t i = 0; i < N_TABLES; i++) {
        const ts_kernels *k = all_tables[i];
        if (!strcmp(k->device, device) && !strcmp(k->precision, precision) &&
            !strcmp(k->attention, attention))
            return k;
    }
    return NULL;
}
