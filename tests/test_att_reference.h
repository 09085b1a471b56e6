/* Naive references in double for the attention and RoPE kernels' general heads
 * (kernels.h ts_att_heads: q/k heads of HS channels, v and output heads of HSV, any
 * softmax scale; RoPE on the last RD channels of each q and k head, in halves or in
 * adjacent pairs), written from the formulas, not from the kernels, so the CPU fp32,
 * bf16 and CUDA tests judge every table against the same thing. Header-only (static
 * inline); it defines:
 *
 *   ts_ref_attention(...)  causal attention of Tq queries (the last Tq of Tk positions)
 *                          and, given dout, its gradients dq, dk, dv
 *   ts_ref_rope(...)       RoPE (forward or its inverse) on a qkv buffer, into another
 *   ts_ref_to_floats(...)  a double array rounded to floats (malloc'd), for the
 *                          tests' float comparisons */
#ifndef TS_TEST_ATT_REFERENCE_H
#define TS_TEST_ATT_REFERENCE_H

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

/* Queries: q0 row (b, i) at q0 + (b*Tq + i)*ldq, head n at column n*HS; keys and values:
 * row (b, j) of k0 and v0 at (b*Tk + j)*ldkv, k head g at column g*HS of k0's row, v head
 * g at g*HSV of v0's; query i at key position i + Tk - Tq attends keys 0..i + Tk - Tq;
 * query head n reads kv head n / (NH/NKV). Writes out [B,Tq,NH*HSV] and att
 * [B,NH,Tq,Tk] (0 where masked); with dout [B,Tq,NH*HSV] (else NULL) also dq
 * [B,Tq,NH*HS], dk [B,Tk,NKV*HS], dv [B,Tk,NKV*HSV] (overwritten: a kv head's sums over
 * its query heads). */
static inline void ts_ref_attention(const float *q0, size_t ldq, const float *k0,
                                    const float *v0, size_t ldkv, const float *dout, int B,
                                    int Tq, int Tk, ts_att_heads h, double *out, double *att,
                                    double *dq, double *dk, double *dv)
{
    const int NH = h.NH, NKV = h.NKV, HS = h.HS, HSV = h.HSV, group = NH / NKV;
    const int off = Tk - Tq;
    const size_t ow = (size_t)NH * HSV;
    double *dp = malloc((size_t)Tk * sizeof(double));
    if (dout) {
        memset(dq, 0, (size_t)B * Tq * NH * HS * sizeof(double));
        memset(dk, 0, (size_t)B * Tk * NKV * HS * sizeof(double));
        memset(dv, 0, (size_t)B * Tk * NKV * HSV * sizeof(double));
    }
    for (int b = 0; b < B; b++)
        for (int n = 0; n < NH; n++) {
            const int g = n / group;
            for (int i = 0; i < Tq; i++) {
                const float *q = q0 + ((size_t)b * Tq + i) * ldq + (size_t)n * HS;
                double *p = att + (((size_t)b * NH + n) * Tq + i) * Tk;
                const int last = i + off;
                double mx = -INFINITY, sum = 0.0;
                for (int j = 0; j < Tk; j++) {
                    p[j] = 0.0;
                    if (j > last) continue;
                    const float *k = k0 + ((size_t)b * Tk + j) * ldkv + (size_t)g * HS;
                    double s = 0.0;
                    for (int d = 0; d < HS; d++) s += (double)q[d] * k[d];
                    p[j] = s * h.scale;
                    if (p[j] > mx) mx = p[j];
                }
                for (int j = 0; j <= last; j++) sum += (p[j] = exp(p[j] - mx));
                for (int j = 0; j <= last; j++) p[j] /= sum;
                double *o = out + ((size_t)b * Tq + i) * ow + (size_t)n * HSV;
                for (int d = 0; d < HSV; d++) {
                    double acc = 0.0;
                    for (int j = 0; j <= last; j++)
                        acc += p[j] * v0[((size_t)b * Tk + j) * ldkv + (size_t)g * HSV + d];
                    o[d] = acc;
                }
                if (!dout) continue;
                /* dP = dO V^T, dS = P (dP - sum P dP), dQ = scale dS K, dK += scale dS^T Q,
                 * dV += P^T dO */
                const float *go = dout + ((size_t)b * Tq + i) * ow + (size_t)n * HSV;
                double dot = 0.0;
                for (int j = 0; j <= last; j++) {
                    const float *v = v0 + ((size_t)b * Tk + j) * ldkv + (size_t)g * HSV;
                    double s = 0.0;
                    for (int d = 0; d < HSV; d++) s += (double)go[d] * v[d];
                    dp[j] = s;
                    dot += p[j] * s;
                }
                double *gq = dq + ((size_t)b * Tq + i) * NH * HS + (size_t)n * HS;
                for (int j = 0; j <= last; j++) {
                    const double ds = p[j] * (dp[j] - dot) * h.scale;
                    const float *k = k0 + ((size_t)b * Tk + j) * ldkv + (size_t)g * HS;
                    double *gk = dk + ((size_t)b * Tk + j) * NKV * HS + (size_t)g * HS;
                    double *gv = dv + ((size_t)b * Tk + j) * NKV * HSV + (size_t)g * HSV;
                    for (int d = 0; d < HS; d++) {
                        gq[d] += ds * k[d];
                        gk[d] += ds * q[d];
                    }
                    for (int d = 0; d < HSV; d++) gv[d] += p[j] * go[d];
                }
            }
        }
    free(dp);
}

/* out = RoPE of in (sign +1) or its inverse (sign -1), both qkv [B,T,ts_att_qkv_width(h)]:
 * on the last RD channels of each of the NH + NKV q and k heads, pair i < RD/2 of the
 * rotated part x (channels (i, i + RD/2), or (2i, 2i + 1) when interleaved) at position t
 * = row % T turned by the angle of cos[t*RD/2 + i], sin[t*RD/2 + i]; every other channel
 * copied. */
static inline void ts_ref_rope(float *out, const float *in, const float *cos_t,
                               const float *sin_t, int B, int T, ts_att_heads h, int RD,
                               bool interleaved, double sign)
{
    const size_t row = ts_att_qkv_width(h), n = (size_t)B * T * row;
    memcpy(out, in, n * sizeof(float));
    for (size_t r = 0; r < (size_t)B * T; r++) {
        const int t = (int)(r % (size_t)T);
        for (int hd = 0; hd < h.NH + h.NKV; hd++) {
            const size_t x = r * row + (size_t)hd * h.HS + (size_t)(h.HS - RD);
            for (int i = 0; i < RD / 2; i++) {
                const size_t a = x + (interleaved ? 2 * i : i);
                const size_t b = x + (interleaved ? 2 * i + 1 : i + RD / 2);
                const double c = cos_t[(size_t)t * (RD / 2) + i];
                const double s = sign * sin_t[(size_t)t * (RD / 2) + i];
                out[a] = (float)(in[a] * c - in[b] * s);
                out[b] = (float)(in[b] * c + in[a] * s);
            }
        }
    }
}

static inline float *ts_ref_to_floats(const double *x, size_t n)
{
    float *y = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) y[i] = (float)x[i];
    return y;
}

#endif
