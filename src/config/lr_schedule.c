/* The learning-rate schedule a config's train keys describe (config.h ts_lr_schedule).
 * Resolved here, beside the keys, so validation, the trainer (each step's rate) and
 * the checkpoints (which record it) read one definition. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "config/config.h"

void ts_lr_schedule_of(const ts_train_config *t, ts_lr_schedule *s)
{
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", t->lr_schedule);
    s->lr = t->lr;
    s->min_lr = t->min_lr;
    s->warmup = t->warmup;
    s->length = t->lr_decay_steps > 0 ? t->lr_decay_steps : t->steps;
    if (!strcmp(t->lr_schedule, "wsd"))
        s->decay = t->decay_steps > 0 ? t->decay_steps
                                      : (int)llround(t->decay_fraction * (double)s->length);
}

double ts_lr_schedule_at(const ts_lr_schedule *s, int step)
{
    return ts_lr_schedule_at_pos(s, (double)step);
}

/* A whole pos is exactly the step's arithmetic (integers below 2^53 are exact in a
 * double), so a run without a batch ramp-up gets the same bits either way. */
double ts_lr_schedule_at_pos(const ts_lr_schedule *s, double pos)
{
    /* The warm-up's (step + 1) / warmup, held at 1 for a fractional position past
     * warmup - 1 (a whole one never gets there). */
    if (pos < (double)s->warmup) return s->lr * fmin(pos + 1.0, (double)s->warmup) / (double)s->warmup;
    if (!strcmp(s->name, "constant")) return s->lr;
    /* r: how far the decay has gone, 0 at its first step, 1 from one step past its end
     * (held there past the schedule's length). */
    int start = s->warmup, span = s->length - s->warmup;
    if (!strcmp(s->name, "wsd")) {
        start = s->length - s->decay;
        span = s->decay;
        if (pos < (double)start) return s->lr;
    }
    double r = span > 0 ? (pos - (double)start) / (double)span : 1.0;
    if (r > 1.0) r = 1.0;
    if (!strcmp(s->name, "cosine"))
        return s->min_lr + 0.5 * (1.0 + cos(M_PI * r)) * (s->lr - s->min_lr);
    return s->lr - r * (s->lr - s->min_lr); /* linear, and wsd's decay */
}

int ts_lr_schedule_diverges(const ts_lr_schedule *a, const ts_lr_schedule *b, int from, int to)
{
    for (int s = from; s < to; s++)
        if (ts_lr_schedule_at(a, s) != ts_lr_schedule_at(b, s)) return s;
    return -1;
}

const char *ts_lr_schedule_describe(const ts_lr_schedule *s, char *buf, size_t size)
{
    if (!strcmp(s->name, "constant"))
        snprintf(buf, size, "constant %g after %d warm-up steps", s->lr, s->warmup);
    else if (!strcmp(s->name, "wsd"))
        snprintf(buf, size, "wsd: %g until step %d, then linear to %g by step %d (%d of warm-up)",
                 s->lr, s->length - s->decay, s->min_lr, s->length, s->warmup);
    else
        snprintf(buf, size, "%s from %g to %g over %d steps (%d of warm-up)", s->name, s->lr,
                 s->min_lr, s->length, s->warmup);
    return buf;
}
