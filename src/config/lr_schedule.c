/* The learning-rate schedule a config's train keys describe (config.h ts_lr_schedule).
 * Resolved here, beside the keys, so validation, the optimizer (optim.h ts_lr_at) and
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

bool ts_lr_schedule_same(const ts_lr_schedule *a, const ts_lr_schedule *b)
{
    return !strcmp(a->name, b->name) && a->lr == b->lr && a->min_lr == b->min_lr &&
           a->warmup == b->warmup && a->length == b->length && a->decay == b->decay;
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
