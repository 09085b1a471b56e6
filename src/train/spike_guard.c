/* The spike guard (spike_guard.h): llm.c's z-score window over the loss and the gradient
 * norm, the skip decision, its report and its record in checkpoints. */
#include "train/spike_guard.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"

void ts_spike_guard_init(ts_spike_guard *g, double z, int window)
{
    memset(g, 0, sizeof *g);
    g->z = z;
    g->window = window;
    if (z <= 0.0) return;
    TS_ASSERT(window >= 2);
    g->loss = ts_calloc((size_t)window, sizeof(double));
    g->norm = ts_calloc((size_t)window, sizeof(double));
}

void ts_spike_guard_free(ts_spike_guard *g)
{
    free(g->loss);
    free(g->norm);
    memset(g, 0, sizeof *g);
}

double ts_spike_push(double *w, int *count, int cap, double x)
{
    TS_ASSERT(cap >= 1 && *count >= 0 && *count <= cap);
    /* llm.c: while the window fills, the value goes in and there is no z-score. */
    if (*count < cap) {
        w[(*count)++] = x;
        return NAN;
    }
    /* Full: the oldest out, the new value in (kept oldest first: a plain array moved
     * by one, W doubles a step, so the sums below run in the values' own order). */
    memmove(w, w + 1, (size_t)(cap - 1) * sizeof *w);
    w[cap - 1] = x;
    double sum = 0.0;
    for (int i = 0; i < cap; i++) sum += w[i];
    const double mean = sum / cap;
    double ss = 0.0;
    for (int i = 0; i < cap; i++) ss += (w[i] - mean) * (w[i] - mean);
    const double sd = sqrt(ss / cap); /* the population's, as llm.c's */
    if (sd == 0.0) return 0.0;
    return (x - mean) / sd;
}

ts_spike_verdict ts_spike_guard_step(ts_spike_guard *g, int step,
                                     bool finite, double loss, double norm)
{
    ts_spike_verdict v = {.on = g->z > 0.0, .loss_z = NAN, .norm_z = NAN};
    if (!v.on) return v;
    if (finite) {
        int n = g->count;
        v.loss_z = ts_spike_push(g->loss, &n, g->window, loss);
        v.norm_z = ts_spike_push(g->norm, &g->count, g->window, norm);
        /* NaN compares false: a filling window never skips. */
        v.skip = v.loss_z > g->z || v.norm_z > g->z;
    }
    g->skipped += v.skip;
    v.skipped = g->skipped;
    if (v.skip)
        ts_log_warn("step %d: spike: loss %.6g (z %+.2f), gradient norm %.6g (z %+.2f) over the "
                    "last %d steps, beyond train.skip_spikes = %g: its update was not applied, "
                    "its batch consumed (%lld skipped so far)",
                    step, loss, v.loss_z, norm, v.norm_z, g->window, g->z, v.skipped);
    return v;
}

/* A z-score for JSON: null when there is none. */
static void z_json(char *buf, size_t cap, double z)
{
    if (isfinite(z))
        snprintf(buf, cap, "%.6g", z);
    else
        snprintf(buf, cap, "null");
}

void ts_spike_verdict_json(const ts_spike_verdict *v, char *buf, size_t cap)
{
    buf[0] = '\0';
    if (!v->on) return;
    char lz[32], nz[32];
    z_json(lz, sizeof lz, v->loss_z);
    z_json(nz, sizeof nz, v->norm_z);
    snprintf(buf, cap, ",\"spike_skipped\":%d,\"spikes_skipped\":%lld,\"loss_z\":%s,"
             "\"grad_norm_z\":%s",
             v->skip ? 1 : 0, v->skipped, lz, nz);
}

json_t *ts_spike_guard_state(const ts_spike_guard *g)
{
    if (g->z <= 0.0) return NULL;
    json_t *loss = json_array(), *norm = json_array();
    /* Reals: jansson writes them with 17 significant digits, which read back to the same
     * double, so a resume holds the very values. */
    for (int i = 0; i < g->count; i++) {
        json_array_append_new(loss, json_real(g->loss[i]));
        json_array_append_new(norm, json_real(g->norm[i]));
    }
    json_t *s = json_pack("{s:i, s:o, s:o, s:I, s:s}", "window", g->window, "loss", loss,
                          "grad_norm", norm, "skipped", (json_int_t)g->skipped, "note",
                          "the last steps' global loss and gradient norm, oldest first "
                          "(train.spike_window of them once full)");
    TS_ASSERT(s != NULL);
    return s;
}

/* A json array of n finite reals into out (the last `keep` of them). */
static bool read_values(const json_t *a, size_t n, size_t keep, double *out)
{
    if (!json_is_array(a) || json_array_size(a) != n) return false;
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(a, i);
        if (!json_is_number(e) || !isfinite(json_number_value(e))) return false;
        if (i >= n - keep) out[i - (n - keep)] = json_number_value(e);
    }
    return true;
}

ts_status ts_spike_guard_restore(ts_spike_guard *g, const json_t *state, const char *dir)
{
    if (g->z <= 0.0) return TS_OK;
    g->count = 0;
    g->skipped = 0;
    if (!state) {
        ts_log_info("spike guard: %s holds no window (saved without train.skip_spikes); it "
                    "fills over the next %d steps",
                    dir, g->window);
        return TS_OK;
    }
    const json_t *loss = json_object_get(state, "loss"), *norm = json_object_get(state, "grad_norm");
    const json_t *jw = json_object_get(state, "window"), *js = json_object_get(state, "skipped");
    const size_t n = json_is_array(loss) ? json_array_size(loss) : 0;
    const size_t keep = n < (size_t)g->window ? n : (size_t)g->window;
    bool ok = json_is_integer(jw) && json_integer_value(jw) >= 2 &&
              (json_int_t)n <= json_integer_value(jw) && json_is_integer(js) &&
              json_integer_value(js) >= 0 && read_values(loss, n, keep, g->loss) &&
              read_values(norm, n, keep, g->norm);
    if (!ok) {
        g->count = 0;
        return ts_fail("checkpoint.load: %s's state.json records a spike_guard that is no "
                       "window (a \"window\" >= 2, at most that many finite \"loss\" and "
                       "\"grad_norm\" values, a \"skipped\" count): the file is damaged or was "
                       "edited; load another checkpoint",
                       dir);
    }
    g->count = (int)keep;
    g->skipped = (long long)json_integer_value(js);
    if (json_integer_value(jw) != g->window)
        ts_log_info("spike guard: %s kept a window of %lld steps, this run's is %d: the newest "
                    "%zu values carried over",
                    dir, (long long)json_integer_value(jw), g->window, keep);
    return TS_OK;
}
