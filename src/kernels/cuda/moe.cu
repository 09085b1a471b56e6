/* The mixture-of-experts kernels on CUDA (kernels.h, "mixture of experts"), the CPU
 * backend's arithmetic (kernels/cpu/moe_route.c, moe_dispatch.c) in the simplest
 * deterministic form: built and compiled, NOT yet run on a GPU (no device was lent while
 * they were written; tests/test_cuda_kernels.c compares them with the CPU's when one is).
 *
 * - Routing: one thread per row, its sums and its selection serial in the CPU's order
 *   (repeated arg-max scans from the lowest index, strict ">", so ties go to the lower
 *   index). Per-thread state is bit masks and K or G values, not E-sized arrays, so E is
 *   limited to TS_MOE_CUDA_MAX_E experts and groups to 64 (checked on the host).
 * - The auxiliary losses: per-sequence counts (one thread per sequence and expert), one
 *   thread per row for the gradient and its row's loss terms, then one block summing
 *   the rows' terms in a fixed order (reduce.cuh): the same bits on every run. Scratch is
 *   stream-ordered (cudaMallocAsync), as memory.cu's overlapping copy does.
 * - counts: integer atomics (exact in any order).
 * - permute: the stable ranks by one thread per expert scanning the assignments in
 *   order, then a copy per element; combine and the backwards one thread per output
 *   element summing k = 0..K-1 in order in fp32, one rounding (act.cuh); dtopk_w one
 *   block per assignment, summed in double by block_sum. A dropped assignment
 *   (TS_MOE_DROPPED, model.moe_capacity) is skipped by each: no count, no row, no term.
 * - capacity: one block per sequence finds, for each expert over its capacity, the key
 *   of its capacity-th largest assignment by a bitwise search from the top bit (64
 *   passes over the sequence's assignments, integer counts in shared memory: exact in
 *   any order), then keeps the assignments at or above it; the CPU sorts instead
 *   (kernels/cpu/moe_capacity.c), the same keys. */
#include <math.h>
#include <stdio.h>

#include "kernels/cuda/act.cuh"
#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/reduce.cuh"

#define TS_MOE_CUDA_MAX_E 256
#define TS_MOE_CUDA_MAX_G 64
#define TS_MOE_CUDA_MAX_K 64
#define TS_MOE_ROW_THREADS 128
#define TS_MOE_EW_THREADS 256
#define TS_MOE_SUM_THREADS 256

static void check_routing(const ts_moe_routing *r, const char *slot)
{
    bool ok = r->E >= 1 && r->E <= TS_MOE_CUDA_MAX_E && r->K >= 1 && r->K <= r->E &&
              r->K <= TS_MOE_CUDA_MAX_K;
    if (r->groups > 1)
        ok = ok && r->groups <= TS_MOE_CUDA_MAX_G && r->E % r->groups == 0 && r->topk_groups >= 1 &&
             r->topk_groups <= r->groups && r->K % r->topk_groups == 0 &&
             r->K / r->topk_groups <= r->E / r->groups;
    if (!ok) {
        char why[200];
        snprintf(why, sizeof why,
                 "routing E %d, K %d, groups %d, topk_groups %d is outside what the CUDA MoE "
                 "kernels take (E <= %d, K <= %d, groups <= %d, kernels.h's group rules)",
                 r->E, r->K, r->groups, r->topk_groups, TS_MOE_CUDA_MAX_E, TS_MOE_CUDA_MAX_K,
                 TS_MOE_CUDA_MAX_G);
        ts_cuda_fail(__FILE__, __LINE__, slot, why);
    }
}

/* E <= 256 experts as 8 words of bits. */
struct expert_mask {
    unsigned w[TS_MOE_CUDA_MAX_E / 32];
    __device__ bool get(int i) const { return (w[i >> 5] >> (i & 31)) & 1u; }
    __device__ void set(int i) { w[i >> 5] |= 1u << (i & 31); }
    __device__ void clear(int i) { w[i >> 5] &= ~(1u << (i & 31)); }
};

/* sel[e] = s[e] + bias[e] (bias NULL: s[e]): the CPU's one fp32 add. */
static __device__ __forceinline__ float sel_of(const float *s, const float *bias, int e)
{
    return bias ? s[e] + bias[e] : s[e];
}

/* The largest sel over [lo, hi) with `allowed`, lowest index among equals; -1 if none. */
static __device__ int arg_max_sel(const float *s, const float *bias, const expert_mask &allowed,
                                  int lo, int hi)
{
    int best = -1;
    float bv = 0.0f;
    for (int i = lo; i < hi; i++) {
        if (!allowed.get(i)) continue;
        float v = sel_of(s, bias, i);
        if (best < 0 || v > bv) best = i, bv = v;
    }
    return best;
}

static __global__ void route_forward_kernel(ts_moe_routing r, float *scores, int *topk_idx,
                                            float *topk_w, const float *logits, const float *bias,
                                            int N)
{
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const int E = r.E, K = r.K;
    const float *x = logits + (size_t)n * E;
    float *s = scores + (size_t)n * E;
    if (r.sigmoid) {
        for (int e = 0; e < E; e++) s[e] = 1.0f / (1.0f + expf(-x[e]));
    } else {
        float mx = x[0];
        for (int e = 1; e < E; e++) mx = x[e] > mx ? x[e] : mx;
        double sum = 0.0;
        for (int e = 0; e < E; e++) {
            s[e] = expf(x[e] - mx);
            sum += s[e];
        }
        for (int e = 0; e < E; e++) s[e] = (float)(s[e] / sum);
    }
    expert_mask allowed;
    for (int i = 0; i < TS_MOE_CUDA_MAX_E / 32; i++) allowed.w[i] = 0;
    for (int e = 0; e < E; e++) allowed.set(e);
    if (r.groups > 1 && r.topk_groups < r.groups) {
        const int G = r.groups, per = E / G, take = K / r.topk_groups;
        float gscore[TS_MOE_CUDA_MAX_G];
        for (int g = 0; g < G; g++) {
            float sum = 0.0f;
            for (int j = 0; j < take; j++) {
                int i = arg_max_sel(s, bias, allowed, g * per, (g + 1) * per);
                sum += sel_of(s, bias, i);
                allowed.clear(i);
            }
            for (int e = g * per; e < (g + 1) * per; e++) allowed.set(e);
            gscore[g] = sum;
        }
        unsigned long long keep = 0, chosen = 0;
        for (int g = 0; g < G; g++) keep |= 1ull << g;
        for (int j = 0; j < r.topk_groups; j++) {
            int best = -1;
            for (int g = 0; g < G; g++)
                if ((keep >> g) & 1ull && (best < 0 || gscore[g] > gscore[best])) best = g;
            keep &= ~(1ull << best);
            chosen |= 1ull << best;
        }
        for (int e = 0; e < E; e++)
            if (!((chosen >> (e / per)) & 1ull)) allowed.clear(e);
    }
    int *idx = topk_idx + (size_t)n * K;
    float *w = topk_w + (size_t)n * K;
    float sum = 0.0f;
    for (int k = 0; k < K; k++) {
        int i = arg_max_sel(s, bias, allowed, 0, E);
        idx[k] = i;
        allowed.clear(i);
        w[k] = s[i];
        sum += w[k];
    }
    const float denom = sum + 1e-20f;
    for (int k = 0; k < K; k++) w[k] = (r.norm_topk ? w[k] / denom : w[k]) * r.route_scale;
}

static __global__ void route_backward_kernel(ts_moe_routing r, float *dlogits, const float *dtopk_w,
                                             const float *scores, const int *topk_idx, int N)
{
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const int E = r.E, K = r.K;
    const float *s = scores + (size_t)n * E, *dw = dtopk_w + (size_t)n * K;
    const int *idx = topk_idx + (size_t)n * K;
    float *dx = dlogits + (size_t)n * E;
    const double c = r.route_scale;
    double ds[TS_MOE_CUDA_MAX_K];
    if (r.norm_topk) {
        float sumf = 0.0f;
        for (int k = 0; k < K; k++) sumf += s[idx[k]];
        const double S = (double)(sumf + 1e-20f);
        double dot = 0.0;
        for (int k = 0; k < K; k++) dot += (double)dw[k] * s[idx[k]];
        dot /= S;
        for (int k = 0; k < K; k++) ds[k] = c * ((double)dw[k] - dot) / S;
    } else {
        for (int k = 0; k < K; k++) ds[k] = c * dw[k];
    }
    if (r.sigmoid) {
        for (int e = 0; e < E; e++) dx[e] = 0.0f;
        for (int k = 0; k < K; k++) {
            const double se = s[idx[k]];
            dx[idx[k]] = (float)(ds[k] * se * (1.0 - se));
        }
        return;
    }
    /* softmax: dx_e = s_e (ds_e - sum_j s_j ds_j), ds zero off the chosen experts. The
     * CPU sums s_j ds_j over the whole row in expert order; only the chosen terms are
     * nonzero, so summing them in expert order gives the same value. */
    double dot = 0.0;
    for (int e = 0; e < E; e++)
        for (int k = 0; k < K; k++)
            if (idx[k] == e) dot += (double)s[e] * ds[k];
    for (int e = 0; e < E; e++) dx[e] = (float)(s[e] * (0.0 - dot));
    for (int k = 0; k < K; k++) {
        const int e = idx[k];
        dx[e] = (float)(s[e] * (ds[k] - dot));
    }
}

/* cnt[q*E + e] = tokens of sequence q whose top-K holds e. */
static __global__ void sequence_counts_kernel(int *cnt, const int *topk_idx, int nseq, int T, int K,
                                              int E)
{
    const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (size_t)nseq * E) return;
    const int q = (int)(t / E), e = (int)(t % E);
    int c = 0;
    for (size_t a = (size_t)q * T * K; a < (size_t)(q + 1) * T * K; a++) c += topk_idx[a] == e;
    cnt[t] = c;
}

/* Row n's z-loss and balance terms; its sequence's counts are cnt[q*E ..], q = (row0 + n) /
 * rows_per_seq (moe_aux_forward_backward's whole sequences: row0 0, rows_per_seq T). */
static __global__ void aux_rows_kernel(ts_moe_routing r, double *zrow, double *arow, float *dlogits,
                                       const float *logits, const float *scores, const int *cnt,
                                       int N, int row0, int rows_per_seq, bool do_z, bool do_aux,
                                       double zc, double ac)
{
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const int E = r.E;
    const float *x = logits + (size_t)n * E, *s = scores + (size_t)n * E;
    float *dx = dlogits + (size_t)n * E;
    zrow[n] = arow[n] = 0.0;
    if (do_z) {
        float mxf = x[0];
        for (int e = 1; e < E; e++) mxf = x[e] > mxf ? x[e] : mxf;
        const double mx = mxf;
        double sum = 0.0;
        for (int e = 0; e < E; e++) sum += exp((double)x[e] - mx);
        const double lse = mx + log(sum);
        zrow[n] = lse * lse;
        const double g = zc * 2.0 * lse / sum;
        for (int e = 0; e < E; e++) dx[e] += (float)(g * exp((double)x[e] - mx));
    }
    if (do_aux) {
        const int *c = cnt + (size_t)((row0 + n) / rows_per_seq) * E;
        double S = 0.0, dot = 0.0, term = 0.0;
        for (int e = 0; e < E; e++) S += s[e];
        for (int e = 0; e < E; e++) {
            const double dp = ac * c[e];
            term += dp * s[e];
            dot += dp * (s[e] / S);
        }
        arow[n] = term / S;
        /* ds_e = (dp_e - dot) / S, then through the scores as scores_backward does */
        double sdot = 0.0;
        if (!r.sigmoid)
            for (int e = 0; e < E; e++) sdot += (double)s[e] * ((ac * c[e] - dot) / S);
        for (int e = 0; e < E; e++) {
            const double ds = (ac * c[e] - dot) / S;
            const float g =
                r.sigmoid ? (float)(ds * s[e] * (1.0 - s[e])) : (float)(s[e] * (ds - sdot));
            dx[e] += g;
        }
    }
}

/* *z_loss += zc * sum zrow, *aux_loss += sum arow: one block, fixed order. */
static __global__ void aux_sum_kernel(float *z_loss, float *aux_loss, const double *zrow,
                                      const double *arow, int N, bool do_z, bool do_aux, double zc)
{
    double z = 0.0, a = 0.0;
    for (int n = threadIdx.x; n < N; n += blockDim.x) z += zrow[n], a += arow[n];
    z = block_sum(z);
    a = block_sum(a);
    if (threadIdx.x == 0) {
        if (do_z) *z_loss += (float)(zc * z);
        if (do_aux) *aux_loss += (float)a;
    }
}

static __global__ void count_kernel(int *counts, const int *topk_idx, size_t NK)
{
    const size_t a = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (a < NK && topk_idx[a] != TS_MOE_DROPPED) atomicAdd(&counts[topk_idx[a]], 1);
}

/* A dropped assignment's row: none (row_of_kernel gives the kept ones theirs). */
static __global__ void dropped_rows_kernel(int *row_of, const int *topk_idx, size_t NK)
{
    const size_t a = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (a < NK && topk_idx[a] == TS_MOE_DROPPED) row_of[a] = TS_MOE_DROPPED;
}

/* Thread e gives expert e's assignments their rows, in assignment order. */
static __global__ void row_of_kernel(int *row_of, const int *topk_idx, const int *offsets,
                                     size_t NK, int E)
{
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= E) return;
    int next = offsets[e];
    for (size_t a = 0; a < NK; a++)
        if (topk_idx[a] == e) row_of[a] = next++;
}

template <typename A>
static __global__ void permute_copy_kernel(A *xp, const int *row_of, const A *x, size_t NK, int K,
                                           int C)
{
    const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= NK * C) return;
    const size_t a = t / C, c = t % C;
    if (row_of[a] == TS_MOE_DROPPED) return;
    xp[(size_t)row_of[a] * C + c] = x[(a / K) * C + c];
}

/* out[n, c] = sum_k w[n,k] src[row_of[n*K+k], c] (w NULL: 1) over the kept k, fp32, one
 * rounding; the first kept term stored as it is (none kept: 0). */
template <typename A>
static __global__ void weighted_sum_kernel(A *out, const A *src, const float *w, const int *row_of,
                                           int N, int K, int C)
{
    const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (size_t)N * C) return;
    const size_t n = t / C, c = t % C;
    float o = 0.0f;
    bool first = true;
    for (int k = 0; k < K; k++) {
        const size_t a = n * K + k;
        if (row_of[a] == TS_MOE_DROPPED) continue;
        const float y = ts_act_load(src, (size_t)row_of[a] * C + c);
        const float p = w ? w[a] * y : y;
        o = first ? p : o + p;
        first = false;
    }
    ts_act_store(out, t, o);
}

template <typename A>
static __global__ void combine_dyp_kernel(A *dyp, const A *dout, const float *topk_w,
                                          const int *row_of, size_t NK, int K, int C)
{
    const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= NK * C) return;
    const size_t a = t / C, c = t % C;
    if (row_of[a] == TS_MOE_DROPPED) return;
    ts_act_store(dyp, (size_t)row_of[a] * C + c, topk_w[a] * ts_act_load(dout, (a / K) * C + c));
}

template <typename A>
static __global__ void combine_dw_kernel(float *dtopk_w, const A *dout, const A *yp,
                                         const int *row_of, int K, int C)
{
    const size_t a = blockIdx.x;
    if (row_of[a] == TS_MOE_DROPPED) { /* the whole block: no row, no gradient */
        if (threadIdx.x == 0) dtopk_w[a] = 0.0f;
        return;
    }
    const A *d = dout + (a / K) * C, *y = yp + (size_t)row_of[a] * C;
    double part = 0.0;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        part += (double)ts_act_load(d, c) * ts_act_load(y, c);
    part = block_sum(part);
    if (threadIdx.x == 0) dtopk_w[a] = (float)part;
}

/* The CPU's key (kernels/cpu/moe_capacity.c): the weight's bits in numeric order above
 * the position reversed; larger is kept first. */
static __device__ __forceinline__ unsigned long long capacity_key(float w, int t)
{
    unsigned u = __float_as_uint(w);
    u = (u & 0x80000000u) ? ~u : u | 0x80000000u;
    return (unsigned long long)u << 32 | (unsigned)(0xFFFFFFFFu - (unsigned)t);
}

/* One block per sequence q (T rows, K choices each): total[e] its assignments to e; for
 * each e over `capacity`, thresh[e] = the largest key with at least `capacity` keys at or
 * above it (the capacity-th largest: keys differ within an expert), built bit by bit
 * from the top; then keep[a] = e where e is not over, or the key is at or above. */
static __global__ void capacity_kernel(int *keep, const int *topk_idx, const float *topk_w,
                                       int K, int E, int T, int capacity)
{
    __shared__ int total[TS_MOE_CUDA_MAX_E], count[TS_MOE_CUDA_MAX_E];
    __shared__ unsigned long long thresh[TS_MOE_CUDA_MAX_E];
    __shared__ int any_over;
    const size_t TK = (size_t)T * K, a0 = (size_t)blockIdx.x * TK;
    const int *idx = topk_idx + a0;
    const float *w = topk_w + a0;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        total[e] = 0;
        thresh[e] = 0;
    }
    if (threadIdx.x == 0) any_over = 0;
    __syncthreads();
    for (size_t i = threadIdx.x; i < TK; i += blockDim.x) atomicAdd(&total[idx[i]], 1);
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        if (total[e] > capacity) any_over = 1;
    __syncthreads();
    for (int bit = 63; any_over && capacity > 0 && bit >= 0; bit--) {
        const unsigned long long b = 1ull << bit;
        for (int e = threadIdx.x; e < E; e += blockDim.x) count[e] = 0;
        __syncthreads();
        for (size_t i = threadIdx.x; i < TK; i += blockDim.x) {
            const int e = idx[i];
            if (total[e] > capacity && capacity_key(w[i], (int)(i / K)) >= (thresh[e] | b))
                atomicAdd(&count[e], 1);
        }
        __syncthreads();
        for (int e = threadIdx.x; e < E; e += blockDim.x)
            if (total[e] > capacity && count[e] >= capacity) thresh[e] |= b;
        __syncthreads();
    }
    for (size_t i = threadIdx.x; i < TK; i += blockDim.x) {
        const int e = idx[i];
        const bool kept = total[e] <= capacity ||
                          (capacity > 0 && capacity_key(w[i], (int)(i / K)) >= thresh[e]);
        keep[a0 + i] = kept ? e : TS_MOE_DROPPED;
    }
}

/* ---- host side ---------------------------------------------------------------- */

static void route_forward(const ts_moe_routing *r, float *scores, int *topk_idx, float *topk_w,
                          const float *logits, const float *bias, int N)
{
    check_routing(r, "moe_route_forward");
    if (N <= 0) return;
    route_forward_kernel<<<ts_cuda_blocks((size_t)N, TS_MOE_ROW_THREADS), TS_MOE_ROW_THREADS, 0,
                           ts_cuda_stream()>>>(*r, scores, topk_idx, topk_w, logits, bias, N);
    TS_CUDA_LAUNCHED();
}

static void route_backward(const ts_moe_routing *r, float *dlogits, const float *dtopk_w,
                           const float *scores, const int *topk_idx, int N)
{
    check_routing(r, "moe_route_backward");
    if (N <= 0) return;
    route_backward_kernel<<<ts_cuda_blocks((size_t)N, TS_MOE_ROW_THREADS), TS_MOE_ROW_THREADS, 0,
                            ts_cuda_stream()>>>(*r, dlogits, dtopk_w, scores, topk_idx, N);
    TS_CUDA_LAUNCHED();
}

static void aux_forward_backward(const ts_moe_routing *r, float *z_loss, float *aux_loss,
                                 float *dlogits, const float *logits, const float *scores,
                                 const int *topk_idx, int N, int T, float cz, float ca,
                                 float z_scale, float aux_scale)
{
    check_routing(r, "moe_aux_forward_backward");
    const bool do_z = cz != 0.0f, do_aux = ca != 0.0f;
    if ((!do_z && !do_aux) || N <= 0) return;
    if (T < 1 || N % T != 0)
        ts_cuda_fail(__FILE__, __LINE__, "moe_aux_forward_backward",
                     "the rows are not whole sequences (N % T != 0)");
    const int nseq = N / T, E = r->E;
    cudaStream_t st = ts_cuda_stream();
    const size_t cnt_bytes = ((size_t)nseq * E * sizeof(int) + 255) / 256 * 256;
    void *scratch = NULL;
    TS_CUDA_CHECK(cudaMallocAsync(&scratch, cnt_bytes + 2 * (size_t)N * sizeof(double), st));
    int *cnt = (int *)scratch;
    double *zrow = (double *)((char *)scratch + cnt_bytes), *arow = zrow + N;
    if (do_aux) {
        sequence_counts_kernel<<<ts_cuda_blocks((size_t)nseq * E, TS_MOE_EW_THREADS),
                                 TS_MOE_EW_THREADS, 0, st>>>(cnt, topk_idx, nseq, T, r->K, E);
        TS_CUDA_LAUNCHED();
    }
    const double zc = (double)cz * z_scale;
    const double ac = (double)ca * aux_scale * E / ((double)r->K * T * T);
    aux_rows_kernel<<<ts_cuda_blocks((size_t)N, TS_MOE_ROW_THREADS), TS_MOE_ROW_THREADS, 0, st>>>(
        *r, zrow, arow, dlogits, logits, scores, cnt, N, 0, T, do_z, do_aux, zc, ac);
    TS_CUDA_LAUNCHED();
    aux_sum_kernel<<<1, TS_MOE_SUM_THREADS, 0, st>>>(z_loss, aux_loss, zrow, arow, N, do_z, do_aux,
                                                     zc);
    TS_CUDA_LAUNCHED();
    TS_CUDA_CHECK(cudaFreeAsync(scratch, st));
}

/* The rows' balance terms from the caller's whole-sequence counts (kernels.h): the same row
 * kernel without the z-loss (its zrow slots alias arow, unused), then the same fixed-order
 * sum. */
static void balance_forward_backward(const ts_moe_routing *r, float *aux_loss, float *dlogits,
                                     const float *scores, const int *seq_counts, int N, int row0,
                                     int rows_per_seq, int T, float ca, float aux_scale)
{
    check_routing(r, "moe_balance_forward_backward");
    if (ca == 0.0f || N <= 0) return;
    if (row0 < 0 || rows_per_seq < 1 || T < rows_per_seq)
        ts_cuda_fail(__FILE__, __LINE__, "moe_balance_forward_backward",
                     "a row's sequence is not given (row0 < 0, rows_per_seq < 1 or > T)");
    cudaStream_t st = ts_cuda_stream();
    double *arow = NULL;
    TS_CUDA_CHECK(cudaMallocAsync((void **)&arow, (size_t)N * sizeof(double), st));
    const double ac = (double)ca * aux_scale * r->E / ((double)r->K * T * T);
    aux_rows_kernel<<<ts_cuda_blocks((size_t)N, TS_MOE_ROW_THREADS), TS_MOE_ROW_THREADS, 0, st>>>(
        *r, arow, arow, dlogits, scores, scores, seq_counts, N, row0, rows_per_seq, false, true,
        0.0, ac);
    TS_CUDA_LAUNCHED();
    aux_sum_kernel<<<1, TS_MOE_SUM_THREADS, 0, st>>>(NULL, aux_loss, arow, arow, N, false, true,
                                                     0.0);
    TS_CUDA_LAUNCHED();
    TS_CUDA_CHECK(cudaFreeAsync(arow, st));
}

static void count(int *counts, const int *topk_idx, int N, int K, int E)
{
    (void)E;
    const size_t NK = (size_t)N * K;
    if (!NK) return;
    count_kernel<<<ts_cuda_blocks(NK, TS_MOE_EW_THREADS), TS_MOE_EW_THREADS, 0, ts_cuda_stream()>>>(
        counts, topk_idx, NK);
    TS_CUDA_LAUNCHED();
}

template <typename A>
static void permute(void *xp, int *row_of, const void *x, const int *topk_idx, const int *offsets,
                    int N, int K, int C, int E)
{
    const size_t NK = (size_t)N * K;
    if (!NK || C <= 0) return;
    cudaStream_t st = ts_cuda_stream();
    row_of_kernel<<<ts_cuda_blocks((size_t)E, 64), 64, 0, st>>>(row_of, topk_idx, offsets, NK, E);
    TS_CUDA_LAUNCHED();
    dropped_rows_kernel<<<ts_cuda_blocks(NK, TS_MOE_EW_THREADS), TS_MOE_EW_THREADS, 0, st>>>(
        row_of, topk_idx, NK);
    TS_CUDA_LAUNCHED();
    permute_copy_kernel<A><<<ts_cuda_blocks(NK * C, TS_MOE_EW_THREADS), TS_MOE_EW_THREADS, 0, st>>>(
        (A *)xp, row_of, (const A *)x, NK, K, C);
    TS_CUDA_LAUNCHED();
}

template <typename A>
static void weighted_sum(void *out, const void *src, const float *w, const int *row_of, int N,
                         int K, int C)
{
    const size_t n = (size_t)N * C;
    if (!n || K <= 0) return;
    weighted_sum_kernel<A>
        <<<ts_cuda_blocks(n, TS_MOE_EW_THREADS), TS_MOE_EW_THREADS, 0, ts_cuda_stream()>>>(
            (A *)out, (const A *)src, w, row_of, N, K, C);
    TS_CUDA_LAUNCHED();
}

template <typename A>
static void combine_backward(void *dyp, float *dtopk_w, const void *dout, const void *yp,
                             const float *topk_w, const int *row_of, int N, int K, int C)
{
    const size_t NK = (size_t)N * K;
    if (!NK || C <= 0) return;
    cudaStream_t st = ts_cuda_stream();
    combine_dyp_kernel<A><<<ts_cuda_blocks(NK * C, TS_MOE_EW_THREADS), TS_MOE_EW_THREADS, 0, st>>>(
        (A *)dyp, (const A *)dout, topk_w, row_of, NK, K, C);
    TS_CUDA_LAUNCHED();
    combine_dw_kernel<A><<<(unsigned)NK, TS_MOE_SUM_THREADS, 0, st>>>(dtopk_w, (const A *)dout,
                                                                      (const A *)yp, row_of, K, C);
    TS_CUDA_LAUNCHED();
}

extern "C" void ts_cuda_moe_route_forward(const ts_moe_routing *r, float *scores, int *topk_idx,
                                          float *topk_w, const float *logits, const float *bias,
                                          int N)
{
    route_forward(r, scores, topk_idx, topk_w, logits, bias, N);
}

extern "C" void ts_cuda_moe_route_backward(const ts_moe_routing *r, float *dlogits,
                                           const float *dtopk_w, const float *scores,
                                           const int *topk_idx, int N)
{
    route_backward(r, dlogits, dtopk_w, scores, topk_idx, N);
}

extern "C" void ts_cuda_moe_aux_forward_backward(const ts_moe_routing *r, float *z_loss,
                                                 float *aux_loss, float *dlogits,
                                                 const float *logits, const float *scores,
                                                 const int *topk_idx, int N, int T, float cz,
                                                 float ca, float z_scale, float aux_scale)
{
    aux_forward_backward(r, z_loss, aux_loss, dlogits, logits, scores, topk_idx, N, T, cz, ca,
                         z_scale, aux_scale);
}

extern "C" void ts_cuda_moe_balance_forward_backward(const ts_moe_routing *r, float *aux_loss,
                                                     float *dlogits, const float *scores,
                                                     const int *seq_counts, int N, int row0,
                                                     int rows_per_seq, int T, float ca,
                                                     float aux_scale)
{
    balance_forward_backward(r, aux_loss, dlogits, scores, seq_counts, N, row0, rows_per_seq, T,
                             ca, aux_scale);
}

extern "C" void ts_cuda_moe_count(int *counts, const int *topk_idx, int N, int K, int E)
{
    count(counts, topk_idx, N, K, E);
}

extern "C" void ts_cuda_moe_capacity(int *keep, const int *topk_idx, const float *topk_w, int N,
                                     int K, int E, int T, int capacity)
{
    if (E < 1 || E > TS_MOE_CUDA_MAX_E || K < 1 || T < 1 || N % T != 0 || capacity < 0)
        ts_cuda_fail(__FILE__, __LINE__, "moe_capacity",
                     "the rows must be whole sequences of T, E at most 256, capacity >= 0");
    if (N == 0) return;
    capacity_kernel<<<(unsigned)(N / T), TS_MOE_SUM_THREADS, 0, ts_cuda_stream()>>>(
        keep, topk_idx, topk_w, K, E, T, capacity);
    TS_CUDA_LAUNCHED();
}

#define TS_MOE_DISPATCH_SLOTS(p, A)                                                                \
    extern "C" void p##moe_permute(void *xp, int *row_of, const void *x, const int *topk_idx,      \
                                   const int *offsets, int N, int K, int C, int E)                 \
    {                                                                                              \
        permute<A>(xp, row_of, x, topk_idx, offsets, N, K, C, E);                                  \
    }                                                                                              \
    extern "C" void p##moe_combine(void *out, const void *yp, const float *topk_w,                 \
                                   const int *row_of, int N, int K, int C)                         \
    {                                                                                              \
        weighted_sum<A>(out, yp, topk_w, row_of, N, K, C);                                         \
    }                                                                                              \
    extern "C" void p##moe_combine_backward(void *dyp, float *dtopk_w, const void *dout,           \
                                            const void *yp, const float *topk_w,                   \
                                            const int *row_of, int N, int K, int C)                \
    {                                                                                              \
        combine_backward<A>(dyp, dtopk_w, dout, yp, topk_w, row_of, N, K, C);                      \
    }                                                                                              \
    extern "C" void p##moe_permute_backward(void *dx, const void *dxp, const int *row_of, int N,   \
                                            int K, int C)                                          \
    {                                                                                              \
        weighted_sum<A>(dx, dxp, NULL, row_of, N, K, C);                                           \
    }

TS_MOE_DISPATCH_SLOTS(ts_cuda_, float)
TS_MOE_DISPATCH_SLOTS(ts_cuda_bf16_, bf16)
#undef TS_MOE_DISPATCH_SLOTS
