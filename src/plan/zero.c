/* ZeRO's per-step data-parallel traffic (zero.h). */
#include "plan/zero.h"

#include <string.h>

#include "core/error.h"

double ts_zero_chunk_bytes(int zero, int dp, const ts_residency *res, int c, double floats,
                           int gather_elem_bytes)
{
    if (dp <= 1) return 0.0;
    const double ring = (dp - 1.0) / dp, bytes = 4.0 * floats;
    switch (zero) {
    case 0: return 2.0 * ring * bytes;
    case 3: return (res->gathers[c] * (double)gather_elem_bytes * floats + bytes) * ring;
    default: return 2.0 * ring * bytes; /* reduce-scatter, and the all-gather after the step */
    }
}

void ts_zero_traffic_of(int zero, int dp, const ts_schedule *s, int q, const ts_residency *res,
                        const double *chunk_floats, int gather_elem_bytes, ts_zero_traffic *t)
{
    memset(t, 0, sizeof *t);
    TS_ASSERT(zero >= 0 && zero <= 3 && (zero != 3 || dp <= 1 || res));
    if (dp <= 1) return;
    const double ring = (dp - 1.0) / dp;
    for (int c = 0; c < s->n_chunks; c++) {
        if (ts_chunk_rank(s, c) != q) continue;
        const double bytes = 4.0 * chunk_floats[c];
        t->reductions++;
        if (zero == 0) {
            t->reduce_bytes += 2.0 * ring * bytes;
        } else {
            t->reduce_bytes += ring * bytes;
            if (zero == 3) {
                t->gathers += res->gathers[c];
                t->gather_bytes += res->gathers[c] * ring * gather_elem_bytes * chunk_floats[c];
            } else {
                t->allgather_bytes += ring * bytes;
            }
        }
    }
    t->bytes = t->gather_bytes + t->reduce_bytes + t->allgather_bytes;
}

double ts_zero_muon_bytes(int zero, int dp, double muon_floats)
{
    if (zero != 0 || dp <= 1) return 0.0;
    return (dp - 1.0) / dp * 4.0 * muon_floats;
}

void ts_zero_add_muon(ts_zero_traffic *t, int zero, int dp, double muon_floats)
{
    const double b = ts_zero_muon_bytes(zero, dp, muon_floats);
    t->allgather_bytes += b;
    t->bytes += b;
}
