/* What grad_sync.c and zero.c (ZeRO-2/3's chunk buffers) share; not for other modules. */
#ifndef TS_GRAD_SYNC_INTERNAL_H
#define TS_GRAD_SYNC_INTERNAL_H

#include "data/grad_sync.h"

/* Bucket b's gradients: in the full-size buffer, or (ZeRO-2/3) in its chunk's buffer. */
float *ts_bucket_grads(const ts_grad_sync *g, const ts_bucket *b);
/* Start bucket b's reduction (directly, or queued for the communication thread). */
void ts_grad_sync_launch(ts_grad_sync *g, ts_bucket *b);
/* Wait until bucket b's reduction completed. */
void ts_grad_sync_wait_bucket(ts_grad_sync *g, ts_bucket *b);

/* Thread mode: wait for every queued bucket, then report their spans to the trace. */
void ts_grad_sync_wait_thread(ts_grad_sync *g);
/* The group sums (tied embedding, replicated key/value weights), blocking; returns
 * their time. */
double ts_grad_sync_sum_groups(ts_grad_sync *g);

/* zero.c */
void ts_zero_init_chunks(ts_grad_sync *g, const ts_zero_layout *zl);
void ts_zero_init_buckets(ts_grad_sync *g, const ts_zero_layout *zl);
void ts_zero_free(ts_grad_sync *g);
void ts_zero_progress(ts_grad_sync *g);
/* The end of the step: reduce what is left (the group sums first), free every gradient
 * buffer. Returns the time the group sums took. */
double ts_zero_finish(ts_grad_sync *g);

#endif
