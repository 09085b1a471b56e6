/* The attention kernels' document masks (kernels.h ts_att_heads.doc_start) on every CPU
 * table (fp32, bf16 where the CPU runs it, and their strict twins): attention over a
 * row of packed documents equals the same kernel run on each document alone (its rows
 * as a sequence of their own), forward (output) and backward (dq, dk, dv), in the
 * square form (attention_forward/backward) and the context-parallel prefix form (a chunk
 * of queries against a longer key prefix, documents cut by the chunk's start and the
 * prefix's); the saved probabilities are exactly 0 on every masked key, and a doc_start
 * of zeros is the causal kernel's bits. Documents cross the kernels' row and key blocks
 * (32 fp32, 64 bf16), start at a query chunk's first row and leave keys no query sees. */
#include <math.h>
#include <string.h>

#include "kernels/kernels.h"
#include "test_device_util.h"
#include "test_util.h"

enum { B = 2, T = 150, NH = 4, NKV = 2, HS = 16 };

/* Document starts of each row (then T): crossing blocks, one of 1 position. */
static const int STARTS[B][8] = {{0, 23, 24, 70, 131, T}, {0, 64, 65, 100, T}};

static const ts_kernels *K;

/* Host floats <-> the table's device buffers of its act_dtype. */
static void *to_dev(const float *x, size_t n)
{
    const size_t ab = ts_dtype_bytes(K->act_dtype);
    void *d = K->dev_alloc(n * ab);
    if (ab == sizeof(float)) {
        K->memcpy_h2d(d, x, n * sizeof(float));
        return d;
    }
    float *f = K->dev_alloc(n * sizeof(float));
    K->memcpy_h2d(f, x, n * sizeof(float));
    K->convert(d, K->act_dtype, f, TS_DTYPE_F32, n);
    K->dev_free(f);
    return d;
}
static float *to_host(const void *d, size_t n)
{
    float *x = ts_alloc_floats(n);
    if (ts_dtype_bytes(K->act_dtype) == sizeof(float)) {
        K->memcpy_d2h(x, d, n * sizeof(float));
        return x;
    }
    float *f = K->dev_alloc(n * sizeof(float));
    K->convert(f, TS_DTYPE_F32, d, K->act_dtype, n);
    K->memcpy_d2h(x, f, n * sizeof(float));
    K->dev_free(f);
    return x;
}
static int *ints_to_dev(const int *x, size_t n)
{
    int *d = K->dev_alloc(n * sizeof(int));
    K->memcpy_h2d(d, x, n * sizeof(int));
    return d;
}
/* The probabilities, saved in act_dtype (the CPU tables). */
static float *att_to_host(const void *att, size_t n) { return to_host(att, n); }

static int doc_of(int b, int p)
{
    int i = 0;
    while (STARTS[b][i + 1] <= p) i++;
    return i;
}

/* The worst |got - want| over n, relative to max |want|. */
static double rel_diff(const float *got, const float *want, size_t n)
{
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)got[i] - want[i]));
        m = fmax(m, fabs((double)want[i]));
        if (isnan(got[i])) d = INFINITY;
    }
    return d / fmax(m, 1e-30);
}

/* attention_forward/backward with doc_start against each document alone. */
static void test_square(double tol)
{
    const ts_att_heads h0 = ts_att_heads_gqa(NH, NKV, HS);
    const size_t C3 = ts_att_qkv_width(h0), CO = ts_att_out_width(h0), N = (size_t)B * T;
    float *qkv = ts_test_rand_floats(N * C3, 1.5f), *dout = ts_test_rand_floats(N * CO, 1.0f);
    int ds[B * T];
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) ds[b * T + t] = STARTS[b][doc_of(b, t)];
    void *dq = to_dev(qkv, N * C3), *ddo = to_dev(dout, N * CO);
    int *dds = ints_to_dev(ds, N);
    ts_att_heads h = h0;
    h.doc_start = dds;
    void *out = K->dev_alloc(N * CO * 4), *att = K->dev_alloc(K->attention_saved_bytes(B, T, h));
    void *dqkv = K->dev_alloc(N * C3 * 4), *scr = K->dev_alloc(K->attention_scratch_bytes(B, T, h));
    K->attention_forward(out, att, dq, B, T, h);
    K->attention_backward(dqkv, scr, ddo, dq, att, B, T, h);
    float *got_out = to_host(out, N * CO), *got_d = to_host(dqkv, N * C3);
    float *p = att_to_host(att, (size_t)B * NH * T * T);
    /* Exactly 0 on every masked key; each visible row sums to 1. */
    long masked_nonzero = 0;
    double worst_sum = 0;
    for (int b = 0; b < B; b++)
        for (int n = 0; n < NH; n++)
            for (int i = 0; i < T; i++) {
                const float *row = p + (((size_t)b * NH + n) * T + i) * T;
                double sum = 0;
                for (int j = 0; j < T; j++) {
                    if (j < ds[b * T + i] || j > i)
                        masked_nonzero += row[j] != 0.0f;
                    else
                        sum += row[j];
                }
                worst_sum = fmax(worst_sum, fabs(sum - 1.0));
            }
    CHECKF(masked_nonzero == 0, "%s: %ld masked probabilities are not 0", K->name, masked_nonzero);
    CHECKF(worst_sum < 1e-2, "%s: a row's probabilities sum to 1 +- %g", K->name, worst_sum);

    /* Each document alone: its rows as a sequence of their own. */
    float *want_out = ts_alloc_floats(N * CO), *want_d = ts_alloc_floats(N * C3);
    for (int b = 0; b < B; b++)
        for (int i = 0; STARTS[b][i] < T; i++) {
            const int s = STARTS[b][i], L = STARTS[b][i + 1] - s;
            const size_t r0 = (size_t)b * T + s;
            void *q1 = to_dev(qkv + r0 * C3, (size_t)L * C3), *g1 = to_dev(dout + r0 * CO, (size_t)L * CO);
            void *o1 = K->dev_alloc((size_t)L * CO * 4), *a1 = K->dev_alloc(K->attention_saved_bytes(1, L, h0));
            void *d1 = K->dev_alloc((size_t)L * C3 * 4);
            void *s1 = K->dev_alloc(K->attention_scratch_bytes(1, L, h0));
            K->attention_forward(o1, a1, q1, 1, L, h0);
            K->attention_backward(d1, s1, g1, q1, a1, 1, L, h0);
            float *ho = to_host(o1, (size_t)L * CO), *hd = to_host(d1, (size_t)L * C3);
            memcpy(want_out + r0 * CO, ho, (size_t)L * CO * sizeof(float));
            memcpy(want_d + r0 * C3, hd, (size_t)L * C3 * sizeof(float));
            free(ho), free(hd);
            K->dev_free(q1), K->dev_free(g1), K->dev_free(o1), K->dev_free(a1), K->dev_free(d1);
            K->dev_free(s1);
        }
    const double eo = rel_diff(got_out, want_out, N * CO), ed = rel_diff(got_d, want_d, N * C3);
    printf("%s: masked attention vs each document alone: out %.2e, dqkv %.2e\n", K->name, eo, ed);
    CHECKF(eo < tol, "%s: masked forward differs from each document alone by %g", K->name, eo);
    CHECKF(ed < tol, "%s: masked backward differs from each document alone by %g", K->name, ed);

    /* A doc_start of zeros is the causal kernel, bit for bit. */
    int zeros[B * T] = {0};
    int *dz = ints_to_dev(zeros, N);
    ts_att_heads hz = h0;
    hz.doc_start = dz;
    void *out0 = K->dev_alloc(N * CO * 4), *outz = K->dev_alloc(N * CO * 4);
    void *d0 = K->dev_alloc(N * C3 * 4), *dz2 = K->dev_alloc(N * C3 * 4);
    K->attention_forward(out0, att, dq, B, T, h0);
    K->attention_backward(d0, scr, ddo, dq, att, B, T, h0);
    K->attention_forward(outz, att, dq, B, T, hz);
    K->attention_backward(dz2, scr, ddo, dq, att, B, T, hz);
    float *a0 = to_host(out0, N * CO), *az = to_host(outz, N * CO);
    float *b0 = to_host(d0, N * C3), *bz = to_host(dz2, N * C3);
    CHECKF(ts_test_same_bits(a0, az, N * CO) && ts_test_same_bits(b0, bz, N * C3),
           "%s: doc_start of zeros is not the causal kernel's bits", K->name);
    free(a0), free(az), free(b0), free(bz);
    K->dev_free(out0), K->dev_free(outz), K->dev_free(d0), K->dev_free(dz2), K->dev_free(dz);
    free(qkv), free(dout), free(got_out), free(got_d), free(p), free(want_out), free(want_d);
    K->dev_free(dq), K->dev_free(ddo), K->dev_free(dds), K->dev_free(out), K->dev_free(att);
    K->dev_free(dqkv), K->dev_free(scr);
}

/* attention_prefix_forward/backward: the Tq queries at key positions [T - Tq, T) of row b
 * against keys [0, T), masked, against each document's queries alone (the prefix form
 * on the document's keys up to its last query). dkv accumulates onto a non-zero buffer. */
static void test_prefix(int Tq, double tol)
{
    const ts_att_heads h0 = ts_att_heads_gqa(NH, NKV, HS);
    const int off = T - Tq;
    const size_t C3 = ts_att_qkv_width(h0), CO = ts_att_out_width(h0), KW = ts_att_kv_width(h0);
    const size_t Nq = (size_t)B * Tq, Nk = (size_t)B * T;
    float *qkv = ts_test_rand_floats(Nq * C3, 1.5f), *kv = ts_test_rand_floats(Nk * KW, 1.5f);
    float *dout = ts_test_rand_floats(Nq * CO, 1.0f), *dkv0 = ts_test_rand_floats(Nk * KW, 0.5f);
    int ds[B * T];
    for (int b = 0; b < B; b++)
        for (int t = 0; t < Tq; t++) ds[b * Tq + t] = STARTS[b][doc_of(b, t + off)];
    void *dq = to_dev(qkv, Nq * C3), *dkv_in = to_dev(kv, Nk * KW), *ddo = to_dev(dout, Nq * CO);
    int *dds = ints_to_dev(ds, Nq);
    ts_att_heads h = h0;
    h.doc_start = dds;
    void *out = K->dev_alloc(Nq * CO * 4);
    void *att = K->dev_alloc(K->attention_prefix_saved_bytes(B, Tq, T, h));
    void *scr = K->dev_alloc(K->attention_prefix_scratch_bytes(B, Tq, T, h));
    void *dqkv = to_dev(qkv, Nq * C3), *dkv = to_dev(dkv0, Nk * KW);
    K->attention_prefix_forward(out, att, dq, dkv_in, B, Tq, T, h);
    K->attention_prefix_backward(dqkv, dkv, scr, ddo, dq, dkv_in, att, B, Tq, T, h);
    float *got_out = to_host(out, Nq * CO), *got_dq = to_host(dqkv, Nq * C3);
    float *got_dkv = to_host(dkv, Nk * KW);
    float *p = att_to_host(att, (size_t)B * NH * Tq * T);
    long masked_nonzero = 0;
    for (int b = 0; b < B; b++)
        for (int n = 0; n < NH; n++)
            for (int i = 0; i < Tq; i++)
                for (int j = 0; j < T; j++)
                    if (j < ds[b * Tq + i] || j > i + off)
                        masked_nonzero += p[(((size_t)b * NH + n) * Tq + i) * T + j] != 0.0f;
    CHECKF(masked_nonzero == 0, "%s prefix: %ld masked probabilities are not 0", K->name,
           masked_nonzero);

    float *want_out = ts_alloc_floats(Nq * CO), *want_dq = ts_alloc_floats(Nq * C3);
    void *wdkv = to_dev(dkv0, Nk * KW); /* each document's call adds into its rows */
    for (int b = 0; b < B; b++)
        for (int i = 0; STARTS[b][i] < T; i++) {
            const int s = STARTS[b][i], e = STARTS[b][i + 1];
            const int q0 = s > off ? s : off; /* the document's first query position */
            if (q0 >= e) continue;            /* no query of this chunk in it */
            const int nq = e - q0, nk = e - s;
            const size_t qr = (size_t)b * Tq + (q0 - off), kr = (size_t)b * T + s;
            void *q1 = to_dev(qkv + qr * C3, (size_t)nq * C3);
            void *k1 = to_dev(kv + kr * KW, (size_t)nk * KW);
            void *g1 = to_dev(dout + qr * CO, (size_t)nq * CO);
            void *o1 = K->dev_alloc((size_t)nq * CO * 4);
            void *a1 = K->dev_alloc(K->attention_prefix_saved_bytes(1, nq, nk, h0));
            void *s1 = K->dev_alloc(K->attention_prefix_scratch_bytes(1, nq, nk, h0));
            void *d1 = K->dev_alloc((size_t)nq * C3 * 4);
            const size_t ab = ts_dtype_bytes(K->act_dtype);
            K->attention_prefix_forward(o1, a1, q1, k1, 1, nq, nk, h0);
            K->attention_prefix_backward(d1, (unsigned char *)wdkv + kr * KW * ab, s1, g1, q1,
                                         k1, a1, 1, nq, nk, h0);
            float *ho = to_host(o1, (size_t)nq * CO), *hd = to_host(d1, (size_t)nq * C3);
            memcpy(want_out + qr * CO, ho, (size_t)nq * CO * sizeof(float));
            memcpy(want_dq + qr * C3, hd, (size_t)nq * C3 * sizeof(float));
            free(ho), free(hd);
            K->dev_free(q1), K->dev_free(k1), K->dev_free(g1), K->dev_free(o1);
            K->dev_free(a1), K->dev_free(s1), K->dev_free(d1);
        }
    float *want_dkv = to_host(wdkv, Nk * KW);
    /* Only the q columns of dqkv are the backward's. */
    double edq = 0;
    const size_t QW = (size_t)NH * HS;
    for (size_t r = 0; r < Nq; r++) edq = fmax(edq, rel_diff(got_dq + r * C3, want_dq + r * C3, QW));
    const double eo = rel_diff(got_out, want_out, Nq * CO), ek = rel_diff(got_dkv, want_dkv, Nk * KW);
    printf("%s: prefix (Tq %d of %d) vs each document alone: out %.2e, dq %.2e, dkv (+=) %.2e\n",
           K->name, Tq, T, eo, edq, ek);
    CHECKF(eo < tol && edq < 4 * tol && ek < tol, "%s: masked prefix attention differs (%g %g %g)",
           K->name, eo, edq, ek);
    free(qkv), free(kv), free(dout), free(dkv0), free(got_out), free(got_dq), free(got_dkv);
    free(p), free(want_out), free(want_dq), free(want_dkv);
    K->dev_free(dq), K->dev_free(dkv_in), K->dev_free(ddo), K->dev_free(dds), K->dev_free(out);
    K->dev_free(att), K->dev_free(scr), K->dev_free(dqkv), K->dev_free(dkv), K->dev_free(wdkv);
}

int main(void)
{
    ts_cpu_set_threads(2);
    const ts_kernels *tables[] = {&ts_kernels_cpu, &ts_kernels_cpu_strict, &ts_kernels_cpu_bf16,
                                  &ts_kernels_cpu_strict_bf16};
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++) {
        K = tables[i];
        const bool bf16 = K->act_dtype == TS_DTYPE_BF16;
        if (bf16 && !ts_cpu_bf16_supported()) {
            printf("%s: this CPU lacks AVX512_BF16/AMX: not run\n", K->name);
            continue;
        }
        /* fp32: the same kernel on the same values, in other blocks: rounding only. bf16:
         * the probabilities and dS are rounded to bf16 in both, at other places. */
        const double tol = bf16 ? 3e-2 : 1e-5;
        test_square(tol);
        test_prefix(75, tol);  /* a chunk whose first query sits inside a document */
        test_prefix(50, tol);
    }
    return ts_test_report();
}
