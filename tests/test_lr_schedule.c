/* The learning-rate schedules (config.h ts_lr_schedule; ts_lr_at, tests/support): the warm-up
 * ramp, cosine exactly as before (the default keeps every run's losses), linear,
 * constant and warmup-stable-decay, each at its boundaries; the schedule's length
 * (train.lr_decay_steps) apart from train.steps; what validation refuses; and the
 * description a refused resume prints. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "config/config.h"
#include "optim/optim.h"
#include "support/optim_oneshot.h"
#include "test_util.h"

static ts_train_config base(const char *schedule)
{
    ts_config c;
    ts_config_defaults(&c);
    ts_train_config t = c.train;
    t.lr = 1e-3;
    t.min_lr = 1e-4;
    t.warmup = 10;
    t.steps = 110;
    snprintf(t.lr_schedule, sizeof t.lr_schedule, "%s", schedule);
    return t;
}

static bool near(double a, double b) { return fabs(a - b) <= 1e-15 + 1e-12 * fabs(b); }

/* The cosine as it was before train.lr_schedule existed. */
static double old_cosine(const ts_train_config *tc, int step)
{
    if (step < tc->warmup) return tc->lr * (double)(step + 1) / (double)tc->warmup;
    int span = tc->steps - tc->warmup;
    double r = span > 0 ? (double)(step - tc->warmup) / (double)span : 1.0;
    if (r > 1.0) r = 1.0;
    return tc->min_lr + 0.5 * (1.0 + cos(M_PI * r)) * (tc->lr - tc->min_lr);
}

static void test_cosine_unchanged(void)
{
    ts_train_config t = base("cosine");
    for (int s = 0; s < 130; s++) CHECKF(ts_lr_at(&t, s) == old_cosine(&t, s), "step %d", s);
    t.warmup = 0;
    t.steps = 1;
    for (int s = 0; s < 3; s++) CHECK(ts_lr_at(&t, s) == old_cosine(&t, s));
    /* lr_decay_steps sets the length apart from train.steps: a run extended to 220
     * steps with lr_decay_steps = 110 follows the 110-step cosine, then holds min_lr. */
    ts_train_config longer = base("cosine");
    longer.steps = 220;
    longer.lr_decay_steps = 110;
    ts_train_config orig = base("cosine");
    for (int s = 0; s < 110; s++) CHECK(ts_lr_at(&longer, s) == ts_lr_at(&orig, s));
    CHECK(near(ts_lr_at(&longer, 150), 1e-4) && near(ts_lr_at(&longer, 219), 1e-4));
}

static void test_shapes(void)
{
    ts_train_config t = base("linear");
    CHECK(near(ts_lr_at(&t, 0), 1e-4) && near(ts_lr_at(&t, 9), 1e-3)); /* the warm-up */
    CHECK(near(ts_lr_at(&t, 10), 1e-3));
    CHECK(near(ts_lr_at(&t, 60), 1e-3 - 0.5 * 9e-4));
    CHECK(near(ts_lr_at(&t, 110), 1e-4) && near(ts_lr_at(&t, 500), 1e-4));
    t = base("constant");
    CHECK(near(ts_lr_at(&t, 4), 5e-4) && ts_lr_at(&t, 10) == 1e-3 && ts_lr_at(&t, 1000) == 1e-3);
    /* wsd with a 20-step decay: lr until step 90, then linear to min_lr at 110. */
    t = base("wsd");
    t.decay_steps = 20;
    CHECK(near(ts_lr_at(&t, 5), 6e-4) && ts_lr_at(&t, 10) == 1e-3 && ts_lr_at(&t, 89) == 1e-3);
    CHECK(near(ts_lr_at(&t, 90), 1e-3) && near(ts_lr_at(&t, 100), 1e-3 - 0.5 * 9e-4));
    CHECK(near(ts_lr_at(&t, 110), 1e-4) && near(ts_lr_at(&t, 200), 1e-4));
    for (int s = 90; s < 110; s++) CHECK(ts_lr_at(&t, s + 1) < ts_lr_at(&t, s));
    /* decay_fraction: 0.2 of the 110-step schedule is 22 steps. */
    t.decay_steps = 0;
    t.decay_fraction = 0.2;
    ts_lr_schedule s;
    ts_lr_schedule_of(&t, &s);
    CHECK(s.decay == 22 && s.length == 110 && !strcmp(s.name, "wsd"));
    CHECK(ts_lr_at(&t, 87) == 1e-3 && ts_lr_at(&t, 89) < 1e-3);
}

static void test_same_and_describe(void)
{
    ts_train_config a = base("cosine"), b = base("cosine");
    ts_lr_schedule sa, sb;
    ts_lr_schedule_of(&a, &sa);
    b.steps = 220; /* stretched: a different schedule */
    ts_lr_schedule_of(&b, &sb);
    CHECK(ts_lr_schedule_diverges(&sa, &sb, 0, 220) == 11); /* the first decayed step */
    CHECK(ts_lr_schedule_diverges(&sa, &sb, 0, 11) == -1);  /* the warm-up agrees */
    b.lr_decay_steps = 110; /* the old length kept */
    ts_lr_schedule_of(&b, &sb);
    CHECK(ts_lr_schedule_diverges(&sa, &sb, 0, 220) == -1);
    /* A constant rate (min_lr = lr) is the same rate over any length. */
    a.min_lr = a.lr;
    b.min_lr = b.lr;
    b.lr_decay_steps = 0;
    ts_lr_schedule_of(&a, &sa);
    ts_lr_schedule_of(&b, &sb);
    CHECK(ts_lr_schedule_diverges(&sa, &sb, 0, 220) == -1);
    CHECK(ts_lr_schedule_at(&sa, 50) == 1e-3 && ts_lr_schedule_at(&sb, 219) == 1e-3);
    char text[160];
    a = base("cosine");
    ts_lr_schedule_of(&a, &sa);
    ts_lr_schedule_describe(&sa, text, sizeof text);
    CHECKF(!strcmp(text, "cosine from 0.001 to 0.0001 over 110 steps (10 of warm-up)"), "%s", text);
    ts_train_config w = base("wsd");
    w.decay_steps = 20;
    ts_lr_schedule sw;
    ts_lr_schedule_of(&w, &sw);
    ts_lr_schedule_describe(&sw, text, sizeof text);
    CHECKF(strstr(text, "until step 90") && strstr(text, "by step 110"), "%s", text);
}

/* Validation: wsd needs one decay key; the decay keys only with wsd; the decay fits. */
static void test_validation(void)
{
    ts_config c;
    ts_config_defaults(&c);
    c.train.steps = 100;
    c.train.warmup = 10;
    CHECK(ts_config_validate(&c, 0) == TS_OK);
    struct {
        const char *schedule;
        int decay_steps;
        double fraction;
        int lr_decay_steps;
        const char *want; /* NULL: accepted */
    } cases[] = {
        {"wsd", 20, 0, 0, NULL},
        {"wsd", 0, 0.1, 0, NULL},
        {"wsd", 0, 0, 0, "needs the length of its decay"},
        {"wsd", 20, 0.1, 0, "not both"},
        {"cosine", 20, 0, 0, "train.decay_steps is set"},
        {"linear", 0, 0.5, 0, "train.decay_fraction is set"},
        {"wsd", 95, 0, 0, "does not fit"},
        {"wsd", 95, 0, 200, NULL},
        {"constant", 0, 0, 0, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ts_config d = c;
        snprintf(d.train.lr_schedule, sizeof d.train.lr_schedule, "%s", cases[i].schedule);
        d.train.decay_steps = cases[i].decay_steps;
        d.train.decay_fraction = cases[i].fraction;
        d.train.lr_decay_steps = cases[i].lr_decay_steps;
        ts_error_clear();
        ts_status st = ts_config_validate(&d, 0);
        if (!cases[i].want)
            CHECKF(st == TS_OK, "case %zu: %s", i, ts_error_message());
        else
            CHECKF(st == TS_ERR && strstr(ts_error_message(), cases[i].want), "case %zu: %s", i,
                   ts_error_message());
    }
    ts_config d = c;
    snprintf(d.train.lr_schedule, sizeof d.train.lr_schedule, "%s", "step");
    ts_error_clear();
    CHECK(ts_config_validate(&d, 0) == TS_ERR && strstr(ts_error_message(), "not a schedule"));
}

int main(void)
{
    test_cosine_unchanged();
    test_shapes();
    test_same_and_describe();
    test_validation();
    return ts_test_report();
}
