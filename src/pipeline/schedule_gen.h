/* Internal to src/pipeline: what the schedule generators share (schedule.c holds the
 * helpers and the classic schedules), and the generators kept in their own files:
 * schedule_zb.c (interleaved-zb, zb-h2) and schedule_v.c (zb-v, dualpipe-v). Each
 * generator checks the shape it needs (naming the rule and the fix with ts_fail) and
 * fills an empty *s; ts_schedule_build validates what it returns. */
#ifndef TS_SCHEDULE_GEN_H
#define TS_SCHEDULE_GEN_H

#include "pipeline/schedule.h"

/* ts_schedule_init, then pp lists with room for `cap` actions each. */
void ts_sched_alloc(ts_schedule *s, const char *name, int pp, int v, int m, int cap);
/* Append an action to rank r's list (within the room ts_sched_alloc gave). */
void ts_sched_push(ts_schedule *s, int r, ts_action_kind kind, int chunk, int mb);
/* Mark rank r's last action as the first of an overlapped pair with the next one. */
void ts_sched_mark_overlap(ts_schedule *s, int r);
/* Drop every action on micro-batches >= m and set s->m = m: a schedule generated for
 * more micro-batches than the step has, cut down (torch's ZB-V pads and prunes the
 * same way). Still complete and deadlock-free: the dependencies join actions of one
 * micro-batch only, so the kept ones run in the same relative order. */
void ts_sched_keep_first(ts_schedule *s, int m);

ts_status ts_sched_gen_interleaved_zb(ts_schedule *s, const char *name, int pp, int v, int m);
ts_status ts_sched_gen_zb_h2(ts_schedule *s, const char *name, int pp, int m);
ts_status ts_sched_gen_zb_v(ts_schedule *s, const char *name, int pp, int m);
ts_status ts_sched_gen_dualpipe_v(ts_schedule *s, const char *name, int pp, int m);

#endif
