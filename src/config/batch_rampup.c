/* train.batch_rampup's parser and arithmetic (batch_rampup.h). Megatron-LM parses the
 * same strings in Python (num_microbatches_calculator.py: _parse_numeric_value,
 * _parse_schedule, _validate_schedule); this follows it rule for rule, with C's strtod
 * where it calls float(). */
#include "config/batch_rampup.h"
#include "config/pipeline_names.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One value: a number with an optional K/M/B/T suffix, truncated toward zero as
 * int(float(v) * multiplier). Refused: empty, not a number, negative, not finite, or
 * past 2^62 (no run consumes more). */
static ts_status parse_value(const char *s, size_t len, const char *entry, const char *what,
                             int64_t *out)
{
    char buf[40];
    if (len == 0 || len >= sizeof buf)
        return ts_fail("train.batch_rampup: entry \"%s\" has %s %s; expected "
                       "\"THRESHOLD:BATCH\" with numbers such as 0, 1.5K or 250B",
                       entry, len == 0 ? "no" : "an overlong", what);
    memcpy(buf, s, len);
    buf[len] = '\0';
    double mult = 1.0;
    const char last = (char)toupper((unsigned char)buf[len - 1]);
    const char *suffixes = "KMBT";
    const char *at = strchr(suffixes, last);
    if (last != '\0' && at) {
        mult = pow(1000.0, (double)(at - suffixes + 1));
        buf[--len] = '\0';
    }
    char *end = NULL;
    errno = 0;
    const double v = len > 0 && !isspace((unsigned char)buf[0]) ? strtod(buf, &end) : NAN;
    /* strtod would take "inf", "nan" and hex; Python's float takes the first two, but
     * int() of them fails, as it does here. */
    const bool hex = strchr(buf, 'x') || strchr(buf, 'X');
    if (!end || *end != '\0' || errno != 0 || !isfinite(v) || hex)
        return ts_fail("train.batch_rampup: entry \"%s\": %s \"%.*s\" is not a number "
                       "(digits with an optional K, M, B or T suffix)",
                       entry, what, (int)strlen(s) < 40 ? (int)strlen(s) : 39, s);
    const double x = trunc(v * mult);
    if (x < 0 || x > 4.6e18)
        return ts_fail("train.batch_rampup: entry \"%s\": %s %g is out of range (0 .. 4.6e18)",
                       entry, what, x);
    *out = (int64_t)x;
    return TS_OK;
}

ts_status ts_batch_rampup_parse(const char *spec, int seq_len, ts_batch_rampup *r)
{
    memset(r, 0, sizeof *r);
    r->tokens = true;
    const char *p = spec;
    bool first_word = true;
    while (*p) {
        while (*p && (isspace((unsigned char)*p) || *p == ',')) p++;
        if (!*p) break;
        const char *e = p;
        while (*e && !isspace((unsigned char)*e) && *e != ',') e++;
        const size_t len = (size_t)(e - p);
        char entry[40];
        snprintf(entry, sizeof entry, "%.*s", (int)(len < sizeof entry ? len : sizeof entry - 1),
                 p);
        if (first_word && (!strcmp(entry, "samples") || !strcmp(entry, "tokens"))) {
            r->tokens = !strcmp(entry, "tokens");
            first_word = false;
            p = e;
            continue;
        }
        first_word = false;
        const char *colon = memchr(p, ':', len);
        if (!colon)
            return ts_fail("train.batch_rampup: invalid entry \"%s\"; expected "
                           "\"THRESHOLD:BATCH\" (e.g. \"0:8 1M:16 2M:32\")",
                           entry);
        if (r->n == TS_RAMPUP_MAX)
            return ts_fail("train.batch_rampup: more than %d entries", TS_RAMPUP_MAX);
        int64_t th, b;
        if (parse_value(p, (size_t)(colon - p), entry, "threshold", &th) != TS_OK ||
            parse_value(colon + 1, (size_t)(e - colon - 1), entry, "batch", &b) != TS_OK)
            return TS_ERR;
        if (b <= 0 || b > (1 << 30))
            return ts_fail("train.batch_rampup: entry \"%s\": the batch must be a positive "
                           "number of sequences (at most 2^30), got %lld",
                           entry, (long long)b);
        r->at[r->n] = th; /* converted below, once the unit word is known */
        r->batch[r->n] = (int)b;
        snprintf(r->text[r->n], sizeof r->text[r->n], "%s", entry);
        r->n++;
        p = e;
    }
    if (r->n == 0) {
        if (!first_word)
            return ts_fail("train.batch_rampup: \"%s\" has a unit but no \"THRESHOLD:BATCH\" "
                           "entry",
                           spec);
        return TS_OK; /* "" or blanks: off */
    }
    /* Tokens to samples by floor division (Megatron: threshold // seq_length), then
     * sorted by threshold, stable (insertion sort: a few entries). */
    for (int i = 0; r->tokens && i < r->n; i++) r->at[i] /= seq_len;
    for (int i = 1; i < r->n; i++) {
        for (int j = i; j > 0 && r->at[j - 1] > r->at[j]; j--) {
            int64_t a = r->at[j];
            r->at[j] = r->at[j - 1];
            r->at[j - 1] = a;
            int b = r->batch[j];
            r->batch[j] = r->batch[j - 1];
            r->batch[j - 1] = b;
            char t[40];
            memcpy(t, r->text[j], sizeof t);
            memcpy(r->text[j], r->text[j - 1], sizeof t);
            memcpy(r->text[j - 1], t, sizeof t);
        }
    }
    const char *unit = r->tokens ? " tokens" : " samples";
    if (r->at[0] != 0)
        return ts_fail("train.batch_rampup: the first entry (\"%s\", at %lld samples) must have "
                       "threshold 0: the batch before it would be undefined (Megatron's rule); "
                       "add \"0:BATCH\"",
                       r->text[0], (long long)r->at[0]);
    for (int i = 1; i < r->n; i++)
        if (r->at[i] == r->at[i - 1])
            return ts_fail("train.batch_rampup: entries \"%s\" and \"%s\" start at the same "
                           "sample (%lld%s)%s; thresholds must be strictly increasing",
                           r->text[i - 1], r->text[i], (long long)r->at[i],
                           r->tokens ? "" : unit,
                           r->tokens ? " once converted from tokens at model.seq_len" : "");
    return TS_OK;
}

bool ts_batch_rampup_same(const ts_batch_rampup *a, const ts_batch_rampup *b)
{
    if (a->n != b->n) return false;
    for (int i = 0; i < a->n; i++)
        if (a->at[i] != b->at[i] || a->batch[i] != b->batch[i]) return false;
    return true;
}

int ts_batch_rampup_entry(const ts_batch_rampup *r, int64_t consumed)
{
    int k = r->n > 0 ? 0 : -1;
    for (int i = 1; i < r->n && r->at[i] <= consumed; i++) k = i;
    return k;
}

int ts_batch_rampup_batch(const ts_batch_rampup *r, int64_t consumed, int global_batch)
{
    const int k = ts_batch_rampup_entry(r, consumed);
    return k < 0 ? global_batch : r->batch[k];
}

int64_t ts_batch_rampup_consumed(const ts_batch_rampup *r, int global_batch, int step0,
                                 int64_t consumed0, int step)
{
    int64_t c = consumed0;
    int64_t left = (int64_t)step - step0;
    while (left > 0) {
        const int k = ts_batch_rampup_entry(r, c);
        const int64_t b = k < 0 ? global_batch : r->batch[k];
        /* Steps at this batch before the next threshold: ceil((at[k+1] - c) / b). */
        int64_t n = left;
        if (k >= 0 && k + 1 < r->n) {
            const int64_t need = (r->at[k + 1] - c + b - 1) / b;
            if (need < n) n = need;
        }
        c += n * b;
        left -= n;
    }
    return c;
}

const char *ts_batch_rampup_describe(const ts_batch_rampup *r, char *buf, size_t size)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < r->n && at < size; i++)
        at += (size_t)snprintf(buf + at, size - at, "%s%lld samples: %d", i ? ", " : "",
                               (long long)r->at[i], r->batch[i]);
    return buf;
}

ts_status ts_config_check_batch_rampup(const ts_config *cfg)
{
    const ts_train_config *t = &cfg->train;
    ts_batch_rampup r;
    if (ts_batch_rampup_parse(t->batch_rampup, cfg->model.seq_len, &r) != TS_OK) return TS_ERR;
    if (r.n == 0) return TS_OK;
    if (ts_schedule_kind_from_name(cfg->parallel.schedule) < 0)
        return ts_fail("train.batch_rampup cannot ramp parallel.schedule = \"%s\": a CSV schedule "
                       "lists a fixed number of micro-batches per step, and a ramp-up changes it "
                       "at every threshold; use a built-in schedule (%s, ...)",
                       cfg->parallel.schedule, ts_schedule_names[TS_SCHEDULE_1F1B]);
    const int last = r.n - 1;
    if (r.batch[last] != t->global_batch)
        return ts_fail("train.batch_rampup: the last entry \"%s\" ramps to a batch of %d, but "
                       "train.global_batch = %d; the ramp-up must end at train.global_batch "
                       "(the batch the run settles at: its memory check, plan, LR schedule and "
                       "checkpoints are counted in it)",
                       r.text[last], r.batch[last], t->global_batch);
    const long long unit = (long long)cfg->parallel.dp * cfg->parallel.micro_batch;
    for (int i = 0; i < r.n; i++) {
        if (r.batch[i] > t->global_batch)
            return ts_fail("train.batch_rampup: entry \"%s\" has a batch of %d, above "
                           "train.global_batch = %d (the last entry's, which the memory "
                           "check is made for); a ramp-up only ramps up to it",
                           r.text[i], r.batch[i], t->global_batch);
        if (r.batch[i] % unit != 0)
            return ts_fail("train.batch_rampup: entry \"%s\" has a batch of %d, not a whole "
                           "number of micro-batches: every batch must be a multiple of "
                           "parallel.dp * parallel.micro_batch = %d * %d = %lld (the batch "
                           "rule); use %lld or %lld",
                           r.text[i], r.batch[i], cfg->parallel.dp, cfg->parallel.micro_batch,
                           unit, r.batch[i] / unit * unit > 0 ? r.batch[i] / unit * unit : unit,
                           (r.batch[i] / unit + 1) * unit);
    }
    return TS_OK;
}
