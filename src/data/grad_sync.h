/* Data-parallel gradient synchronisation. The gradient buffer is cut into buckets:
 * contiguous slices of about parallel.bucket_mb MiB, built from the end of the buffer
 * (the last layers' gradients are final first). As soon as every layer a bucket covers
 * has its final gradients (its chunk's last backward of the step), its non-blocking
 * all-reduce starts; later compute makes progress on it; the optimizer waits for all.
 * Every rank's micro-batches weigh 1/(global batch tokens), so the sum over the dp group
 * is the gradient of the global mean loss: the all-reduce sums, nothing divides. */
#ifndef TS_GRAD_SYNC_H
#define TS_GRAD_SYNC_H

#include <stdbool.h>

#include "comm/comm.h"
#include "model/model.h"

/* Steps synchronised without overlap first; the last of them times the reference. */
#define TS_GRAD_SYNC_REFERENCE_STEPS 2

typedef struct {
    size_t begin, end;  /* float offsets into the gradient buffer */
    int min_layer, max_layer; /* final once every layer in [min, max] is final */
    bool launched;
    ts_request req;
} ts_bucket;

typedef struct {
    ts_comm dp;
    float *grads;
    size_t n_floats;      /* the whole gradient buffer */
    int n_buckets;
    ts_bucket *buckets;
    bool *layer_final;    /* [n_layers]: the layer's gradients are final this step */
    int n_layers;
    bool overlap;
    /* timing for the dp_overlap metric */
    double wait_ms;       /* time blocked in ts_grad_sync_finish this step */
    double reference_ms;  /* a step's all-reduce time with nothing to hide behind */
    int steps;            /* steps finished */
} ts_grad_sync;

void ts_grad_sync_init(ts_grad_sync *g, const ts_model *m, const ts_comm *dp, size_t bucket_bytes,
                       bool overlap);
void ts_grad_sync_free(ts_grad_sync *g);

/* Start of a step: no bucket launched. */
void ts_grad_sync_begin(ts_grad_sync *g);
/* The gradients of layers [first, end) are final for this step: launch the buckets that
 * are now complete (when overlapping) and make progress on the running ones. */
void ts_grad_sync_layers_done(ts_grad_sync *g, int first, int end);
/* Launch what is left and wait for everything. */
void ts_grad_sync_finish(ts_grad_sync *g);
/* Fraction of this step's all-reduce time hidden behind compute (0 when dp == 1). */
double ts_grad_sync_overlap(const ts_grad_sync *g);

#endif
