/* ZeRO's data-parallel traffic of one pipeline rank per step, by level, as `tessera
 * plan` prints it and the predictor prices it (ring collectives over dp ranks, bytes
 * each rank sends; N = the rank's parameter floats, F_c = its chunk c's; gradients and
 * ZeRO-1/2's parameter gather in fp32, ZeRO-3's weight gathers in the compute dtype,
 * e bytes an element: 4 fp32, 2 bf16):
 *   zero 0: an all-reduce of the gradients, 2 (dp-1)/dp 4N;
 *   zero 1, 2: a reduce-scatter of the gradients, (dp-1)/dp 4N, and the all-gather of
 *     the updated parameters after the optimizer, (dp-1)/dp 4N;
 *   zero 3: per chunk, gathers[c] weight all-gathers (pipeline/residency.h: what the
 *     schedule implies, two per chunk with looped-bfs but the last, one with 1F1B) and
 *     one gradient reduce-scatter, (gathers[c] e + 4) F_c (dp-1)/dp; no all-gather
 *     after the optimizer (the next step gathers).
 * With dp = 1 there is none. Under Muon (plan/muon_cost.h) ZeRO-0 adds the all-gather of
 * the Muon matrices the owners updated, (dp-1)/dp 4M for the rank's M floats of them
 * (ts_zero_muon_bytes, counted in allgather_bytes); the other levels move them already.
 * (Routed experts' matrices are counted over dp here too; the optimizer's time prices
 * their gather as a ring over edp: predict.c muon_s.) */
#ifndef TS_PLAN_ZERO_H
#define TS_PLAN_ZERO_H

#include "pipeline/residency.h"
#include "pipeline/schedule.h"

typedef struct {
    int gathers;           /* weight all-gathers per step (zero 3), all chunks */
    int reductions;        /* gradient reductions per step: one per chunk */
    double gather_bytes;   /* what the gathers send */
    double reduce_bytes;   /* what the gradient reductions send */
    double allgather_bytes;/* zero 1, 2: the parameter all-gather after the optimizer;
                              zero 0 under Muon: its matrices' (ts_zero_muon_bytes) */
    double bytes;          /* the sum */
} ts_zero_traffic;

/* Rank q of schedule s under `zero` (0..3) with dp replicas; res (zero 3: q's
 * residency, else may be NULL) and chunk_floats ([n_chunks], q's chunks read). */
void ts_zero_traffic_of(int zero, int dp, const ts_schedule *s, int q, const ts_residency *res,
                        const double *chunk_floats, int gather_elem_bytes, ts_zero_traffic *t);

/* One chunk's share: its gathers (zero 3, else 0) and the bytes its gathers and its
 * reduction send. */
double ts_zero_chunk_bytes(int zero, int dp, const ts_residency *res, int c, double floats,
                           int gather_elem_bytes);

/* Muon under ZeRO-0 with dp > 1: the bytes of the all-gather of muon_floats updated
 * Muon matrices, (dp-1)/dp 4 muon_floats; 0 otherwise. */
double ts_zero_muon_bytes(int zero, int dp, double muon_floats);
/* The same added to t's allgather_bytes and bytes (a chunk's to its bytes by the caller). */
void ts_zero_add_muon(ts_zero_traffic *t, int zero, int dp, double muon_floats);

#endif
