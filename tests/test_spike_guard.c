/* The spike guard's window (train/spike_guard.h): llm.c's z-scores, the skip decision,
 * what enters the window, and its record in state.json read back exactly. */
#include <jansson.h>

#include "test_util.h"
#include "train/spike_guard.h"

/* llm.c's OutlierDetector (llmc/outlier_detector.h at karpathy/llm.c f1e2ace) as it is:
 * running sums, E[x^2] - mean^2. The reference the window's z-scores must match. */
typedef struct {
    double buffer[256];
    int count, index, window;
    double sum, sum_sq;
} llmc_detector;

static double llmc_update(llmc_detector *d, double x)
{
    if (d->count < d->window) {
        d->buffer[d->count++] = x;
        d->sum += x;
        d->sum_sq += x * x;
        return NAN;
    }
    double old = d->buffer[d->index];
    d->sum -= old;
    d->sum_sq -= old * old;
    d->buffer[d->index] = x;
    d->sum += x;
    d->sum_sq += x * x;
    d->index = (d->index + 1) % d->window;
    double mean = d->sum / d->window;
    double sd = sqrt(d->sum_sq / d->window - mean * mean);
    if (sd == 0.0) return 0.0;
    return (x - mean) / sd;
}

/* The same z-scores as llm.c's detector, value for value (NaN while it fills), on a
 * loss-like series: drifting down, noisy, with spikes. */
static void test_spike_push_matches_llmc(void)
{
    const int windows[] = {2, 8, 128};
    for (size_t wi = 0; wi < sizeof windows / sizeof windows[0]; wi++) {
        const int W = windows[wi];
        llmc_detector d = {.window = W};
        double *w = calloc((size_t)W, sizeof(double));
        int count = 0, compared = 0;
        double worst = 0.0;
        uint64_t rng = 42;
        for (int i = 0; i < 600; i++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            double x = 5.0 * exp(-i / 200.0) + 0.05 * ((double)(rng % 1000) / 1000.0 - 0.5);
            if (i % 97 == 50) x += 3.0;
            double want = llmc_update(&d, x), got = ts_spike_push(w, &count, W, x);
            CHECKF(isnan(want) == isnan(got), "W %d value %d: llm.c %g, here %g", W, i, want,
                   got);
            if (W == 2 && !isnan(got))
                CHECKF(fabs(fabs(got) - 1.0) < 1e-10 || got == 0.0, "W 2: z %.17g", got);
            if (!isnan(want)) {
                compared++;
                const double e = fabs(got - want) / fmax(1.0, fabs(want));
                worst = e > worst ? e : worst;
            }
        }
        /* llm.c's running sums (E[x^2] - mean^2, carried over 600 steps) lose digits that
         * the two passes keep: close, not equal. With W = 2 every z-score is +-1 (or 0):
         * the two passes give it within 1e-10, the sums miss it by ~1e-5. */
        printf("W %3d: worst relative difference from llm.c's z-scores %.3g\n", W, worst);
        CHECKF(worst < 1e-4, "W %d: z-scores differ from llm.c's by %g", W, worst);
        CHECKF(compared == 600 - W, "W %d: %d z-scores, expected %d", W, compared, 600 - W);
        CHECK(count == W && w[W - 1] == d.buffer[(d.index + W - 1) % W]);
        free(w);
    }
}

/* The bound: one value among W - 1 equal ones scores sqrt(W - 1), the most any can (so
 * the config refuses a threshold there or above); a window of equal values scores 0. */
static void test_spike_push_bounds(void)
{
    double w[8];
    int count = 0;
    for (int i = 0; i < 8; i++) CHECK(isnan(ts_spike_push(w, &count, 8, 3.0)));
    CHECK(ts_spike_push(w, &count, 8, 3.0) == 0.0);
    const double z = ts_spike_push(w, &count, 8, 100.0);
    CHECKF(fabs(z - sqrt(7.0)) < 1e-12, "z %.17g, sqrt(7) %.17g", z, sqrt(7.0));
    /* Downward never counts as a spike: a low value's z is negative. */
    count = 0;
    for (int i = 0; i < 8; i++) ts_spike_push(w, &count, 8, 3.0 + 0.01 * i);
    CHECK(ts_spike_push(w, &count, 8, -50.0) < 0.0);
}

/* The guard over a run: no decision while the window fills, a spike in the loss or in the
 * norm skipped, its values kept in the window (llm.c), a non-finite step entering
 * nothing, the count kept. */
static void test_spike_guard_steps(void)
{
    ts_spike_guard g;
    ts_spike_guard_init(&g, 2.0, 8);
    ts_spike_verdict v;
    for (int s = 0; s < 8; s++) {
        v = ts_spike_guard_step(&g, s, true, 4.0 - 0.01 * s, 1.0 + 0.001 * s);
        CHECK(v.on && !v.skip && isnan(v.loss_z) && isnan(v.norm_z));
    }
    /* The window full: an ordinary step scores, and is applied. */
    v = ts_spike_guard_step(&g, 8, true, 3.9, 1.0);
    CHECK(!v.skip && isfinite(v.loss_z) && v.loss_z < 2.0);
    v = ts_spike_guard_step(&g, 9, true, 40.0, 1.0);
    CHECKF(v.skip && v.loss_z > 2.0 && v.norm_z < 2.0 && v.skipped == 1, "loss z %g", v.loss_z);
    CHECK(g.count == 8 && g.loss[7] == 40.0); /* the spike stays in the window */
    v = ts_spike_guard_step(&g, 10, true, 3.9, 50.0);
    CHECKF(v.skip && v.norm_z > 2.0 && v.loss_z < 0.0 && v.skipped == 2, "norm z %g", v.norm_z);
    /* A non-finite step: nothing enters, nothing decided, the count kept. */
    double before[8];
    memcpy(before, g.loss, sizeof before);
    v = ts_spike_guard_step(&g, 11, false, NAN, INFINITY);
    CHECK(!v.skip && isnan(v.loss_z) && isnan(v.norm_z) && v.skipped == 2);
    CHECK(g.count == 8 && memcmp(before, g.loss, sizeof before) == 0);
    char js[200];
    ts_spike_verdict_json(&v, js, sizeof js);
    CHECKF(!strcmp(js, ",\"spike_skipped\":0,\"spikes_skipped\":2,\"loss_z\":null,"
                       "\"grad_norm_z\":null"),
           "%s", js);
    v = ts_spike_guard_step(&g, 12, true, 3.9, 1.0);
    ts_spike_verdict_json(&v, js, sizeof js);
    CHECKF(strstr(js, "\"loss_z\":-") && strstr(js, "\"spikes_skipped\":2"), "%s", js);
    ts_spike_guard_free(&g);

    /* While the window fills nothing is decided, however far a value is (llm.c). */
    ts_spike_guard_init(&g, 1.0, 4);
    ts_spike_guard_step(&g, 0, true, 1.0, 1.0);
    v = ts_spike_guard_step(&g, 1, true, 1e6, 1e6);
    CHECK(!v.skip && isnan(v.loss_z) && v.skipped == 0);
    ts_spike_guard_free(&g);

    /* Off: no verdict, no metrics, no record. */
    ts_spike_guard_init(&g, 0.0, 128);
    v = ts_spike_guard_step(&g, 0, true, 1e9, 1e9);
    ts_spike_verdict_json(&v, js, sizeof js);
    CHECK(!v.on && !v.skip && js[0] == '\0' && ts_spike_guard_state(&g) == NULL);
    CHECK(ts_spike_guard_restore(&g, NULL, "ckpt") == TS_OK);
    ts_spike_guard_free(&g);
}

/* state.json's record through text (as a checkpoint writes and reads it) restores a guard
 * that decides bit for bit as the original goes on deciding; another window keeps the
 * newest values; damaged records are refused. */
static void test_spike_guard_state(void)
{
    ts_spike_guard a, b;
    ts_spike_guard_init(&a, 2.5, 16);
    uint64_t rng = 7;
    double xs[80];
    for (int i = 0; i < 80; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        xs[i] = 3.0 + (double)(rng % 100000) / 7919.0 + (i == 30 ? 40.0 : 0.0);
    }
    for (int i = 0; i < 40; i++) ts_spike_guard_step(&a, i, true, xs[i], xs[i] / 3.0);
    json_t *st = ts_spike_guard_state(&a);
    char *text = json_dumps(st, JSON_INDENT(1)); /* save.c's flags */
    json_decref(st);
    json_t *back = json_loads(text, 0, NULL);
    free(text);
    CHECK(back != NULL);
    ts_spike_guard_init(&b, 2.5, 16);
    CHECK(ts_spike_guard_restore(&b, back, "ckpt") == TS_OK);
    CHECK(b.count == 16 && b.skipped == a.skipped && a.skipped == 1);
    bool same = true;
    for (int i = 40; i < 80; i++) {
        ts_spike_verdict va = ts_spike_guard_step(&a, i, true, xs[i], xs[i] / 3.0);
        ts_spike_verdict vb = ts_spike_guard_step(&b, i, true, xs[i], xs[i] / 3.0);
        same &= memcmp(&va.loss_z, &vb.loss_z, sizeof(double)) == 0 &&
                memcmp(&va.norm_z, &vb.norm_z, sizeof(double)) == 0 && va.skip == vb.skip;
    }
    CHECK(same);
    ts_spike_guard_free(&b);

    /* A smaller window: the newest values. */
    ts_spike_guard_init(&b, 1.5, 4);
    CHECK(ts_spike_guard_restore(&b, back, "ckpt") == TS_OK);
    const json_t *jl = json_object_get(back, "loss");
    CHECK(b.count == 4 && b.loss[3] == json_real_value(json_array_get(jl, 15)) &&
          b.loss[0] == json_real_value(json_array_get(jl, 12)));
    ts_spike_guard_free(&b);

    /* Damaged: a non-finite value, more values than the window, a missing count. */
    const char *bad[] = {
        "{\"window\": 4, \"loss\": [1, 2, \"x\"], \"grad_norm\": [1, 2, 3], \"skipped\": 0}",
        "{\"window\": 2, \"loss\": [1, 2, 3], \"grad_norm\": [1, 2, 3], \"skipped\": 0}",
        "{\"window\": 4, \"loss\": [1, 2], \"grad_norm\": [1, 2, 3], \"skipped\": 0}",
        "{\"window\": 4, \"loss\": [1, 2], \"grad_norm\": [1, 2]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *j = json_loads(bad[i], 0, NULL);
        ts_spike_guard_init(&b, 1.5, 4);
        ts_error_clear();
        CHECKF(j && ts_spike_guard_restore(&b, j, "ckpt") == TS_ERR &&
                   strstr(ts_error_message(), "spike_guard that is no window") && b.count == 0,
               "record %zu: %s", i, ts_error_message());
        ts_spike_guard_free(&b);
        json_decref(j);
    }
    json_decref(back);
    ts_spike_guard_free(&a);
}

int main(void)
{
    test_spike_push_matches_llmc();
    test_spike_push_bounds();
    test_spike_guard_steps();
    test_spike_guard_state();
    return ts_test_report();
}
