/* Backend-neutral helpers of the kernel interface. */
#include "kernels/kernels.h"

#include <pthread.h>
#include <string.h>

#include "core/error.h"
#include "kernels/attention_sizes.h"

/* Every function slot of ts_kernels that every backend fills, by name. Not listed: the
 * context-parallel attention slots (attention_prefix_*), which the layout-only CUDA
 * tables size but cannot run (every runnable table fills them), and the mixture-of-experts
 * slots (moe_*), which a backend may lack: the model refuses an MoE config on such a
 * table with its own message rather than this check's. */
#define TS_KERNEL_SLOTS(X)                                                                   \
    X(dev_alloc) X(dev_free) X(memcpy_h2d) X(memcpy_d2h) X(memcpy_d2d) X(memcpy_2d) X(memset_zero) X(convert) \
    X(sum_into) X(sum_squares_into) X(stream_create) X(stream_destroy) X(stream_sync)       \
    X(event_record) X(event_wait) X(attention_saved_bytes) X(attention_scratch_bytes)    \
    X(encoder_forward) X(encoder_backward) X(layernorm_forward) X(layernorm_backward)       \
    X(matmul_forward) X(matmul_backward) X(attention_forward) X(attention_backward)         \
    X(gelu_forward) X(gelu_backward) X(residual_forward) X(residual_layernorm_forward)     \
    X(crossentropy_forward_backward) X(adamw_update) X(adamw_update_spans) X(sum_squares)  \
    X(vocab_embed_forward) X(vocab_embed_backward) X(xent_vp_stats) X(xent_vp_sumexp)      \
    X(xent_vp_finish) X(rmsnorm_forward) X(rmsnorm_backward) X(residual_rmsnorm_forward)    \
    X(rope_forward) X(rope_backward) X(swiglu_forward) X(swiglu_backward)                  \
    X(gemm) X(muon_momentum) X(muon_normalize) X(muon_apply) X(adamw_delta_sq_spans)

const char *ts_kernels_missing(const ts_kernels *k)
{
#define TS_CHECK_SLOT(slot) \
    if (!k->slot) return #slot;
    TS_KERNEL_SLOTS(TS_CHECK_SLOT)
#undef TS_CHECK_SLOT
    return NULL;
}

int ts_moe_offsets(int *offsets, const int *counts, int E)
{
    int total = 0;
    for (int e = 0; e < E; e++) {
        TS_ASSERT(counts[e] >= 0);
        offsets[e] = total;
        total += counts[e];
    }
    return total;
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

/* ---- layout-only tables: the CUDA tables' sizes, for a build that may lack them.
 * Each is the CPU table of its precision (so ts_kernels_missing finds every slot, as a
 * model layout asserts) with the CUDA table's identity and sizes: device, attention,
 * device_memory, weight_copy_bytes, native_comm and the attention sizes of
 * kernels/attention_sizes.h, the formulas the CUDA tables themselves return. Its
 * kernels would be the CPU's, whose attention writes [B, NH, T, T] probabilities where
 * a flash layout has room for [B, NH, T] floats: so it never runs. ts_kernels_for and
 * ts_kernels_find never give it, and its dev_alloc aborts, so no model is built on it. */
static void *layout_only_alloc(size_t bytes)
{
    (void)bytes;
    ts_panic(__FILE__, __LINE__,
             "a layout-only kernel table (ts_kernels_layout_only) sizes a CUDA run; it cannot "
             "allocate or run one");
}

#define TS_LAYOUT_SIZES(suffix, bf16, flash)                                                  \
    static size_t layout_saved##suffix(int B, int T, ts_att_heads h)                         \
    {                                                                                        \
        return ts_cuda_attention_saved_size(bf16, flash, B, T, h);                           \
    }                                                                                        \
    static size_t layout_scratch##suffix(int B, int T, ts_att_heads h)                       \
    {                                                                                        \
        return ts_cuda_attention_scratch_size(bf16, flash, B, T, h);                         \
    }
TS_LAYOUT_SIZES(_f32, false, false)
TS_LAYOUT_SIZES(_f32_flash, false, true)
TS_LAYOUT_SIZES(_bf16, true, false)
TS_LAYOUT_SIZES(_bf16_flash, true, true)
#undef TS_LAYOUT_SIZES

/* In ts_kernels_for's order of the CUDA tables: cuda, cuda-flash, cuda-bf16,
 * cuda-bf16-flash (table.cu). */
static const struct {
    const char *name, *precision, *attention;
    size_t (*saved)(int B, int T, ts_att_heads h);
    size_t (*scratch)(int B, int T, ts_att_heads h);
} cuda_layouts[] = {
    {"cuda (layout only)", "fp32", "gemm", layout_saved_f32, layout_scratch_f32},
    {"cuda-flash (layout only)", "fp32", "flash", layout_saved_f32_flash,
     layout_scratch_f32_flash},
    {"cuda-bf16 (layout only)", "bf16", "gemm", layout_saved_bf16, layout_scratch_bf16},
    {"cuda-bf16-flash (layout only)", "bf16", "flash", layout_saved_bf16_flash,
     layout_scratch_bf16_flash},
};
enum { N_LAYOUTS = sizeof cuda_layouts / sizeof cuda_layouts[0] };
static ts_kernels layout_tables[N_LAYOUTS];
static pthread_once_t layout_once = PTHREAD_ONCE_INIT;

static size_t layout_prefix_saved(int B, int Tq, int Tk, ts_att_heads h)
{
    return ts_cuda_prefix_saved_bytes(B, Tq, Tk, h, 4);
}
static size_t layout_prefix_saved_bf16(int B, int Tq, int Tk, ts_att_heads h)
{
    return ts_cuda_prefix_saved_bytes(B, Tq, Tk, h, 2);
}
static size_t layout_prefix_scratch(int B, int Tq, int Tk, ts_att_heads h)
{
    return ts_cuda_prefix_scratch_bytes(B, Tq, Tk, h, 4);
}
static size_t layout_prefix_scratch_bf16(int B, int Tq, int Tk, ts_att_heads h)
{
    return ts_cuda_prefix_scratch_bytes(B, Tq, Tk, h, 2);
}

static void make_layouts(void)
{
    for (int i = 0; i < N_LAYOUTS; i++) {
        const bool bf16 = !strcmp(cuda_layouts[i].precision, "bf16");
        ts_kernels k = bf16 ? ts_kernels_cpu_bf16 : ts_kernels_cpu;
        k.name = cuda_layouts[i].name;
        k.device = "cuda";
        k.attention = cuda_layouts[i].attention;
        k.device_memory = true;
        k.host_accessible = false;
        k.weight_copy_bytes = bf16 ? 2 : 0; /* the bf16 compute copy (table.cu) */
        k.native_comm = "nccl";
        k.attention_saved_bytes = cuda_layouts[i].saved;
        k.attention_scratch_bytes = cuda_layouts[i].scratch;
        /* the CUDA prefix attention's sizes (attention_sizes.h); never run */
        k.attention_prefix_saved_bytes = bf16 ? layout_prefix_saved_bf16 : layout_prefix_saved;
        k.attention_prefix_scratch_bytes =
            bf16 ? layout_prefix_scratch_bf16 : layout_prefix_scratch;
        k.attention_prefix_forward = NULL;
        k.attention_prefix_backward = NULL;
        k.dev_alloc = layout_only_alloc;
        layout_tables[i] = k;
    }
}

const ts_kernels *ts_kernels_layout_only(const char *device, const char *precision,
                                         const char *attention)
{
    if (strcmp(device, "cuda")) return NULL;
    TS_ASSERT(pthread_once(&layout_once, make_layouts) == 0);
    for (int i = 0; i < N_LAYOUTS; i++)
        if (!strcmp(cuda_layouts[i].precision, precision) &&
            !strcmp(cuda_layouts[i].attention, attention))
            return &layout_tables[i];
    return NULL;
}

const ts_kernels *ts_kernels_layout_for(const char *device, const char *precision,
                                        const char *attention)
{
    const ts_kernels *k = ts_kernels_for(device, precision, attention);
    if (!k) k = ts_kernels_layout_only(device, precision, attention);
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
