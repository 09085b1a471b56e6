/* train.batch_rampup in the trainer (internal.h "rampup.c"): Megatron-LM's step batch-size
 * schedule (config/batch_rampup.h). A step's batch is the one in force after the samples
 * consumed before it; its micro-batch count m = batch / (dp * micro_batch) changes at the
 * thresholds, so the pipeline schedule (every built-in one: gpipe to DualPipe-V) is built
 * for the new m between steps and the engine that runs it with it. The partition, the
 * model, the reducer and the ZeRO chunks are m's no matter (built once, for
 * train.global_batch, the largest batch); ZeRO-2/3's residency, by action index, is
 * rebuilt. The data position is the sequences consumed, so the run reads the same
 * sequence of samples as without a ramp-up, cut into other steps. */
#include <stdio.h>
#include <string.h>

#include "core/log.h"
#include "train/internal.h"

static int micro_batches(const ts_trainer *t, int batch)
{
    return batch / (t->cfg.parallel.dp * t->cfg.parallel.micro_batch);
}

ts_status ts_trainer_rampup_init(ts_trainer *t)
{
    const ts_config *c = &t->cfg;
    t->rampup_step0 = 0;
    t->rampup_seq0 = 0;
    if (ts_batch_rampup_parse(c->train.batch_rampup, c->model.seq_len, &t->rampup) != TS_OK)
        return TS_ERR; /* validated already: not reached */
    for (int i = 0; i < t->rampup.n; i++) {
        const int m = micro_batches(t, t->rampup.batch[i]);
        ts_schedule s;
        if (ts_schedule_build(&s, c->parallel.schedule, c->parallel.pp, c->parallel.virtual_stages,
                              m) != TS_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", ts_error_message());
            return ts_fail("train.batch_rampup: entry \"%s\" (a batch of %d: %d micro-batch%s "
                           "per replica) cannot run parallel.schedule = \"%s\": %s",
                           t->rampup.text[i], t->rampup.batch[i], m, m == 1 ? "" : "es",
                           c->parallel.schedule, why);
        }
        ts_schedule_free(&s);
    }
    if (t->rampup.n > 0 && t->groups->world.rank == 0) {
        char d[1024];
        const int64_t total = ts_batch_rampup_consumed(&t->rampup, c->train.global_batch, 0, 0,
                                                       c->train.steps);
        ts_log_info("batch ramp-up (train.batch_rampup, thresholds in %s): %s; train.steps = %d "
                    "steps consume %lld sequences (%.4g steps of train.global_batch = %d, the "
                    "learning-rate schedule's unit)",
                    t->rampup.tokens ? "tokens" : "samples",
                    ts_batch_rampup_describe(&t->rampup, d, sizeof d), c->train.steps,
                    (long long)total, (double)total / c->train.global_batch,
                    c->train.global_batch);
    }
    return TS_OK;
}

int64_t ts_trainer_rampup_consumed(const ts_trainer *t, int step)
{
    return ts_batch_rampup_consumed(&t->rampup, t->cfg.train.global_batch, t->rampup_step0,
                                    t->rampup_seq0, step);
}

/* The schedule for m micro-batches, in place (the engine and ZeRO hold it by pointer),
 * and a new engine over it with the hooks the reducer, ZeRO and the trace installed. */
static ts_status reschedule(ts_trainer *t, int m)
{
    const ts_config *c = &t->cfg;
    ts_engine *e = &t->engine;
    const ts_engine hooks = *e; /* the fields other parts installed, copied back below */
    ts_engine_free(e);
    ts_schedule_free(&t->sched);
    ts_status st = ts_schedule_build(&t->sched, c->parallel.schedule, c->parallel.pp,
                                     c->parallel.virtual_stages, m);
    if (st == TS_OK)
        st = ts_engine_init(e, &t->cfg, &t->model, &t->sched, &t->part, &t->train_data,
                            &t->groups->pp, t->topo->coords.dp, t->recompute_keep);
    if (st != TS_OK)
        return ts_error_prefix("train.batch_rampup: rebuilding the pipeline for %d "
                               "micro-batches: ",
                               m);
    e->chunk_done = hooks.chunk_done;
    e->chunk_done_ctx = hooks.chunk_done_ctx;
    e->before_action = hooks.before_action;
    e->after_action = hooks.after_action;
    e->action_ctx = hooks.action_ctx;
    e->trace = hooks.trace;
    e->trace_t0_ms = hooks.trace_t0_ms;
    ts_zero_reschedule(&t->zero);
    return TS_OK;
}

ts_status ts_trainer_rampup_step(ts_trainer *t, int step)
{
    const ts_config *c = &t->cfg;
    t->step_seq0 = ts_trainer_rampup_consumed(t, step);
    t->step_batch = ts_batch_rampup_batch(&t->rampup, t->step_seq0, c->train.global_batch);
    const int m = micro_batches(t, t->step_batch);
    if (m == t->sched.m) return TS_OK;
    const int was = t->sched.m;
    ts_status st = ts_comm_agree(&t->groups->world, reschedule(t, m));
    if (st == TS_OK && t->groups->world.rank == 0)
        ts_log_info("batch ramp-up: step %d (after %lld sequences) runs a global batch of %d: "
                    "%d micro-batch%s per replica (was %d)",
                    step, (long long)t->step_seq0, t->step_batch, m, m == 1 ? "" : "es", was);
    return st;
}

/* Always by samples: without a ramp-up consumed(step) = step x global_batch and the
 * division gives the whole step exactly, the step's own bits; a run resumed without
 * the ramp-up its checkpoint ran keeps counting from the recorded position. */
double ts_trainer_rampup_lr(const ts_trainer *t, const ts_lr_schedule *s, int step)
{
    const double pos = (double)ts_trainer_rampup_consumed(t, step) / t->cfg.train.global_batch;
    return ts_lr_schedule_at_pos(s, pos);
}

int ts_trainer_rampup_lr_diverges(const ts_trainer *t, const ts_lr_schedule *a,
                                  const ts_lr_schedule *b, int from, int to)
{
    for (int s = from; s < to; s++)
        if (ts_trainer_rampup_lr(t, a, s) != ts_trainer_rampup_lr(t, b, s)) return s;
    return -1;
}

ts_status ts_trainer_rampup_resume(ts_trainer *t, const char *was_spec, int64_t was_consumed)
{
    const ts_config *c = &t->cfg;
    ts_batch_rampup was;
    if (ts_batch_rampup_parse(was_spec, c->model.seq_len, &was) != TS_OK)
        return ts_error_prefix("checkpoint.load: %s's state.json records a train.batch_rampup "
                               "that does not parse: ",
                               t->loaded_from);
    /* The batch of each step this run takes, under the recorded ramp-up and this one,
     * both from the recorded data position. */
    const int B = c->train.global_batch;
    int64_t ca = was_consumed, cb = was_consumed;
    int at = -1, ba = 0, bb = 0;
    for (int s = t->start_step; !ts_batch_rampup_same(&was, &t->rampup) && s < c->train.steps;
         s++) {
        ba = ts_batch_rampup_batch(&was, ca, B);
        bb = ts_batch_rampup_batch(&t->rampup, cb, B);
        if (ba != bb) {
            at = s;
            break;
        }
        ca += ba;
        cb += bb;
    }
    t->rampup_step0 = t->start_step;
    t->rampup_seq0 = was_consumed;
    if (at < 0) return TS_OK;
    if (!c->train.allow_schedule_change)
        return ts_fail("checkpoint.load: %s ran train.batch_rampup = \"%s\", but this run has "
                       "\"%s\": resuming would change the global batch from step %d on (%d "
                       "instead of %d); keep train.batch_rampup, or set "
                       "train.allow_schedule_change = true (the data continues from sequence "
                       "%lld either way)",
                       t->loaded_from, was_spec, c->train.batch_rampup, at, bb, ba,
                       (long long)was_consumed);
    if (t->groups->world.rank == 0)
        ts_log_warn("checkpoint: train.batch_rampup changes on resuming (train."
                    "allow_schedule_change): was \"%s\", now \"%s\"; step %d runs a batch of %d "
                    "instead of %d, the data continuing from sequence %lld",
                    was_spec, c->train.batch_rampup, at, bb, ba, (long long)was_consumed);
    return TS_OK;
}
