/* oneDNN matmul primitives, made once per description and kept (dnnl_matmul.h).
 *
 * The table is fixed (TS_DNNL_CACHE entries) and searched linearly under a mutex: a
 * step uses a few dozen descriptions (five linear layers times three GEMMs, attention's
 * per-block shapes), so a search is far cheaper than the execution it precedes. When it
 * is full the oldest entry is replaced (a longer sequence only costs re-creations).
 *
 * Scratchpad mode user: each thread brings its own scratchpad (grown as needed and
 * kept), which is what makes concurrent executions from attention's parallel region
 * safe (with oneDNN's default, library-owned scratchpad they may share one buffer), and
 * the buffer is not reallocated per call. One engine for the process; one stream per
 * calling thread (a CPU stream is cheap, and sharing one across threads is not
 * promised to be safe). */
#include "kernels/cpu/dnnl_matmul.h"

#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

#define TS_DNNL_CACHE 256
#define TS_DNNL_KEY 22

typedef struct {
    int64_t key[TS_DNNL_KEY];
    dnnl_primitive_t prim;
    dnnl_memory_desc_t a_md, b_md, c_md, bias_md, scratch_md;
    size_t scratch_bytes;
} ts_dnnl_entry;

static ts_dnnl_entry *g_cache[TS_DNNL_CACHE];
static int g_cached, g_next_evict;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static dnnl_engine_t g_engine;

static _Thread_local dnnl_stream_t tl_stream;
static _Thread_local void *tl_scratch;
static _Thread_local size_t tl_scratch_bytes;
/* A thread that ends (the pipeline pair's worker, pipeline/pair.h, and its OpenMP team)
 * frees its stream and scratchpad: a thread-specific key whose destructor runs at the
 * thread's exit, while its thread-locals still exist. */
static pthread_key_t g_thread_key;

static const char *status_name(dnnl_status_t s)
{
    switch (s) {
    case dnnl_success: return "success";
    case dnnl_out_of_memory: return "out of memory";
    case dnnl_invalid_arguments: return "invalid arguments";
    case dnnl_unimplemented: return "unimplemented (no kernel for this description)";
    case dnnl_iterator_ends: return "iterator ends";
    case dnnl_runtime_error: return "runtime error";
    case dnnl_not_required: return "not required";
    default: return "unknown status";
    }
}

static TS_NORETURN void dnnl_fail(const char *file, int line, const char *call, dnnl_status_t s)
{
    char what[512];
    snprintf(what, sizeof what, "oneDNN %s: %s", call, status_name(s));
    ts_panic(file, line, what);
}

/* Every oneDNN call is checked; a failure names the call. */
#define TS_DNNL(call)                                                                  \
    do {                                                                               \
        dnnl_status_t st_ = (call);                                                    \
        if (st_ != dnnl_success) dnnl_fail(__FILE__, __LINE__, #call, st_);            \
    } while (0)

static void free_thread_state(void *unused)
{
    (void)unused;
    if (tl_stream) dnnl_stream_destroy(tl_stream);
    free(tl_scratch);
    tl_stream = NULL;
    tl_scratch = NULL;
    tl_scratch_bytes = 0;
}

static void make_engine(void)
{
    TS_DNNL(dnnl_engine_create(&g_engine, dnnl_cpu, 0));
    TS_ASSERT(pthread_key_create(&g_thread_key, free_thread_state) == 0);
}

ts_dnnl_gemm ts_dnnl_gemm_2d(int M, int N, int K, int64_t lda, int64_t ldb, bool b_nk,
                             int64_t ldc)
{
    ts_dnnl_gemm g = {
        .batch0 = 1, .batch1 = 1, .M = M, .N = N, .K = K,
        .a_m = lda, .a_k = 1,
        .b_k = b_nk ? 1 : ldb, .b_n = b_nk ? ldb : 1,
        .c_m = ldc,
        .c_type = TS_DTYPE_BF16, .alpha = 1.0f,
    };
    return g;
}

static void make_key(const ts_dnnl_gemm *g, int64_t *key)
{
    float alpha = g->alpha;
    int32_t alpha_bits;
    memcpy(&alpha_bits, &alpha, sizeof alpha_bits);
    const int64_t M = g->runtime_m ? -1 : g->M, K = g->runtime_k ? -1 : g->K;
    int64_t k[TS_DNNL_KEY] = {g->batch0, g->batch1, M, g->N, K,
                              g->a_b0, g->a_b1, g->a_m, g->a_k,
                              g->b_b0, g->b_b1, g->b_k, g->b_n,
                              g->c_b0, g->c_b1, g->c_m,
                              g->c_type, alpha_bits, g->accumulate, g->bias,
                              g->runtime_m, g->runtime_k};
    memcpy(key, k, sizeof k);
}

/* A memory descriptor of rows x cols with the given strides, behind the batch
 * dimensions when there are any (2 or 4 dimensions: the plain case stays 2-D). */
static void init_md(dnnl_memory_desc_t *md, const ts_dnnl_gemm *g, int64_t rows, int64_t cols,
                    int64_t s0, int64_t s1, int64_t sr, int64_t sc, dnnl_data_type_t type)
{
    bool batched = g->batch0 > 1 || g->batch1 > 1;
    if (batched) {
        dnnl_dims_t dims = {g->batch0, g->batch1, rows, cols};
        dnnl_dims_t strides = {s0, s1, sr, sc};
        TS_DNNL(dnnl_memory_desc_init_by_strides(md, 4, dims, type, strides));
    } else {
        dnnl_dims_t dims = {rows, cols};
        dnnl_dims_t strides = {sr, sc};
        TS_DNNL(dnnl_memory_desc_init_by_strides(md, 2, dims, type, strides));
    }
}

/* A, B and C's descriptors with dimensions M and K (DNNL_RUNTIME_DIM_VAL in a runtime
 * primitive's, this call's values at its execution). */
static void init_operands(const ts_dnnl_gemm *g, int64_t M, int64_t K, dnnl_memory_desc_t *a_md,
                          dnnl_memory_desc_t *b_md, dnnl_memory_desc_t *c_md)
{
    dnnl_data_type_t ct = g->c_type == TS_DTYPE_BF16 ? dnnl_bf16 : dnnl_f32;
    init_md(a_md, g, M, K, g->a_b0, g->a_b1, g->a_m, g->a_k, dnnl_bf16);
    init_md(b_md, g, K, g->N, g->b_b0, g->b_b1, g->b_k, g->b_n, dnnl_bf16);
    init_md(c_md, g, M, g->N, g->c_b0, g->c_b1, g->c_m, 1, ct);
}

static ts_dnnl_entry *create_entry(const ts_dnnl_gemm *g, const int64_t *key)
{
    TS_ASSERT(g->M > 0 && g->N > 0 && g->K > 0 && g->batch0 > 0 && g->batch1 > 0);
    TS_ASSERT(!(g->bias && g->alpha != 1.0f));
    ts_dnnl_entry *e = ts_calloc(1, sizeof *e);
    memcpy(e->key, key, sizeof e->key);
    bool batched = g->batch0 > 1 || g->batch1 > 1;
    init_operands(g, g->runtime_m ? DNNL_RUNTIME_DIM_VAL : g->M,
                  g->runtime_k ? DNNL_RUNTIME_DIM_VAL : g->K, &e->a_md, &e->b_md, &e->c_md);
    if (g->bias) { /* [1, N], broadcast over the rows (and batches) */
        dnnl_dims_t dims = {1, 1, 1, g->N}, strides = {g->N, g->N, g->N, 1};
        int nd = batched ? 4 : 2;
        TS_DNNL(dnnl_memory_desc_init_by_strides(&e->bias_md, nd, dims + (4 - nd), dnnl_f32,
                                                 strides + (4 - nd)));
    }
    dnnl_matmul_desc_t desc;
    TS_DNNL(dnnl_matmul_desc_init(&desc, &e->a_md, &e->b_md, g->bias ? &e->bias_md : NULL,
                                  &e->c_md));

    dnnl_primitive_attr_t attr;
    TS_DNNL(dnnl_primitive_attr_create(&attr));
    TS_DNNL(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
    if (g->alpha != 1.0f) {
        float alpha = g->alpha;
        TS_DNNL(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha));
    }
    if (g->accumulate) {
        dnnl_post_ops_t po;
        TS_DNNL(dnnl_post_ops_create(&po));
        TS_DNNL(dnnl_post_ops_append_sum(po, 1.0f));
        TS_DNNL(dnnl_primitive_attr_set_post_ops(attr, po));
        TS_DNNL(dnnl_post_ops_destroy(po));
    }
    dnnl_primitive_desc_t pd;
    dnnl_status_t st = dnnl_primitive_desc_create(&pd, &desc, attr, g_engine, NULL);
    if (st == dnnl_unimplemented && (g->runtime_m || g->runtime_k)) {
        /* No kernel takes this shape's dimensions at run time on this CPU: kept as an
         * entry without a primitive, so the caller falls back to fixed dimensions. */
        TS_DNNL(dnnl_primitive_attr_destroy(attr));
        return e;
    }
    TS_DNNL(st);
    const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    TS_ASSERT(smd != NULL);
    e->scratch_md = *smd;
    e->scratch_bytes = dnnl_memory_desc_get_size(smd);
    TS_DNNL(dnnl_primitive_create(&e->prim, pd));
    TS_DNNL(dnnl_primitive_desc_destroy(pd));
    TS_DNNL(dnnl_primitive_attr_destroy(attr));
    return e;
}

/* The cached primitive for g, made on first use. */
static const ts_dnnl_entry *lookup(const ts_dnnl_gemm *g)
{
    TS_ASSERT(pthread_once(&g_once, make_engine) == 0);
    int64_t key[TS_DNNL_KEY];
    make_key(g, key);
    TS_ASSERT(pthread_mutex_lock(&g_lock) == 0);
    ts_dnnl_entry *found = NULL;
    for (int i = 0; i < g_cached && !found; i++)
        if (memcmp(g_cache[i]->key, key, sizeof key) == 0) found = g_cache[i];
    if (!found) {
        /* Created under the lock: two threads asking for one new shape make it once. */
        found = create_entry(g, key);
        int slot;
        if (g_cached < TS_DNNL_CACHE) {
            slot = g_cached++;
        } else {
            /* The oldest goes. An entry is used only inside the call that looked it up,
             * so it is idle here unless another thread looked it up and then sat while
             * TS_DNNL_CACHE new descriptions were made: not with a handful of threads. */
            slot = g_next_evict;
            g_next_evict = (g_next_evict + 1) % TS_DNNL_CACHE;
            if (g_cache[slot]->prim) TS_DNNL(dnnl_primitive_destroy(g_cache[slot]->prim));
            free(g_cache[slot]);
        }
        g_cache[slot] = found;
    }
    TS_ASSERT(pthread_mutex_unlock(&g_lock) == 0);
    return found;
}

static void *thread_scratch(size_t bytes)
{
    if (bytes > tl_scratch_bytes) {
        free(tl_scratch);
        size_t rounded = (bytes + 4095) / 4096 * 4096;
        tl_scratch = NULL;
        if (posix_memalign(&tl_scratch, 64, rounded) != 0 || !tl_scratch)
            ts_panic(__FILE__, __LINE__, "out of memory allocating oneDNN's scratchpad");
        tl_scratch_bytes = rounded;
    }
    return tl_scratch;
}

void ts_dnnl_matmul(const ts_dnnl_gemm *g, void *C, const void *A, const void *B,
                    const float *bias)
{
    const ts_dnnl_entry *e = lookup(g);
    if (!e->prim) { /* a runtime description this CPU has no kernel for (create_entry) */
        ts_dnnl_gemm fixed = *g;
        fixed.runtime_m = fixed.runtime_k = false;
        ts_dnnl_matmul(&fixed, C, A, B, bias);
        return;
    }
    if (!tl_stream) {
        TS_DNNL(dnnl_stream_create(&tl_stream, g_engine, dnnl_stream_default_flags));
        TS_ASSERT(pthread_setspecific(g_thread_key, &tl_stream) == 0); /* freed at its exit */
    }
    dnnl_memory_t ma, mb, mc, mbias = NULL, ms = NULL;
    /* A runtime primitive executes on memory described with this call's dimensions. */
    dnnl_memory_desc_t a_md = e->a_md, b_md = e->b_md, c_md = e->c_md;
    if (g->runtime_m || g->runtime_k) init_operands(g, g->M, g->K, &a_md, &b_md, &c_md);
    /* oneDNN takes non-const handles; A, B and the bias are only read. */
    TS_DNNL(dnnl_memory_create(&ma, &a_md, g_engine, (void *)(uintptr_t)A));
    TS_DNNL(dnnl_memory_create(&mb, &b_md, g_engine, (void *)(uintptr_t)B));
    TS_DNNL(dnnl_memory_create(&mc, &c_md, g_engine, C));
    dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}};
    int nargs = 3;
    if (g->bias) {
        TS_ASSERT(bias != NULL);
        TS_DNNL(dnnl_memory_create(&mbias, &e->bias_md, g_engine, (void *)(uintptr_t)bias));
        args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, mbias};
    }
    if (e->scratch_bytes) {
        TS_DNNL(dnnl_memory_create(&ms, &e->scratch_md, g_engine,
                                   thread_scratch(e->scratch_bytes)));
        args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, ms};
    }
    TS_DNNL(dnnl_primitive_execute(e->prim, tl_stream, nargs, args));
    TS_DNNL(dnnl_stream_wait(tl_stream));
    TS_DNNL(dnnl_memory_destroy(ma));
    TS_DNNL(dnnl_memory_destroy(mb));
    TS_DNNL(dnnl_memory_destroy(mc));
    if (mbias) TS_DNNL(dnnl_memory_destroy(mbias));
    if (ms) TS_DNNL(dnnl_memory_destroy(ms));
}
