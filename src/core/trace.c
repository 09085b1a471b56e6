/* Trace events and the Chrome trace JSON format (jansson). */
#include "core/trace.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/fsutil.h"

/* Copy a string into a fixed-size field, truncated (never inside a UTF-8 sequence) and
 * always terminated. */
static void set_str(char *dst, size_t size, const char *src)
{
    size_t n = strlen(src);
    if (n >= size) {
        n = size - 1;
        while (n > 0 && ((unsigned char)src[n] & 0xC0) == 0x80) n--; /* a continuation byte */
    }
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static int is_compute(const char *cat)
{
    return cat[0] && !cat[1] && strchr("FBIW", cat[0]) != NULL;
}

ts_trace_event ts_trace_event_make(const char *cat, int rank, int chunk, int mb,
                                   double start_us, double dur_us)
{
    ts_trace_event e;
    memset(&e, 0, sizeof e);
    set_str(e.cat, sizeof e.cat, cat);
    char name[32];
    if (is_compute(e.cat) && mb >= 0)
        snprintf(name, sizeof name, "%s%d", e.cat, mb);
    else
        snprintf(name, sizeof name, "%s", e.cat);
    set_str(e.name, sizeof e.name, name);
    e.rank = rank;
    e.chunk = chunk;
    e.mb = mb;
    e.start_us = start_us;
    e.dur_us = dur_us;
    return e;
}

static _Thread_local int tl_chunk = -1, tl_mb = -1;

void ts_trace_set_action(int chunk, int mb)
{
    tl_chunk = chunk;
    tl_mb = mb;
}

void ts_trace_current_action(int *chunk, int *mb)
{
    *chunk = tl_chunk;
    *mb = tl_mb;
}

void ts_trace_init(ts_trace *t)
{
    t->events = NULL;
    t->n = t->cap = 0;
}

void ts_trace_add(ts_trace *t, const ts_trace_event *e)
{
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 256;
        ts_trace_event *grown = ts_malloc((size_t)cap * sizeof *grown);
        if (t->n) memcpy(grown, t->events, (size_t)t->n * sizeof *grown);
        free(t->events);
        t->events = grown;
        t->cap = cap;
    }
    t->events[t->n++] = *e;
}

void ts_trace_free(ts_trace *t)
{
    free(t->events);
    ts_trace_init(t);
}

/* A number for messages: whole numbers in full, others as %g. */
static void format_num(double v, char *buf, size_t size)
{
    if (isfinite(v) && v == floor(v) && fabs(v) < 1e17)
        snprintf(buf, size, "%.0f", v);
    else
        snprintf(buf, size, "%g", v);
}

#define RANK_RANGE "a track is a rank, 0..65535"
#define CHUNK_RANGE "a chunk is -1 (none) or 0..65535"
#define MB_RANGE "a micro-batch is -1 (none) or 0..2147483646"
#define TIME_RANGE "times are microseconds, 0 <= x < 2^53 = 9007199254740992"

ts_status ts_trace_event_check(const ts_trace_event *e, long long index)
{
    char num[64];
    if (e->rank < 0 || e->rank >= TS_TRACE_MAX_RANKS)
        return ts_fail("event %lld: rank %d is out of range: " RANK_RANGE, index, e->rank);
    if (e->track != TS_TRACE_TRACK_MAIN && e->track != TS_TRACE_TRACK_DP)
        return ts_fail("event %lld: track %d is out of range: a track is %d (main) or %d "
                       "(data-parallel reduction)",
                       index, e->track, TS_TRACE_TRACK_MAIN, TS_TRACE_TRACK_DP);
    if (e->chunk < -1 || e->chunk >= TS_TRACE_MAX_CHUNKS)
        return ts_fail("event %lld: chunk %d is out of range: " CHUNK_RANGE, index, e->chunk);
    if (e->mb < -1 || e->mb > TS_TRACE_MAX_MB)
        return ts_fail("event %lld: micro-batch %d is out of range: " MB_RANGE, index, e->mb);
    if (!(e->start_us >= 0.0 && e->start_us < TS_TRACE_MAX_US)) {
        format_num(e->start_us, num, sizeof num);
        return ts_fail("event %lld: start %s is out of range: " TIME_RANGE, index, num);
    }
    if (!(e->dur_us >= 0.0 && e->dur_us < TS_TRACE_MAX_US)) {
        format_num(e->dur_us, num, sizeof num);
        return ts_fail("event %lld: duration %s is out of range: " TIME_RANGE, index, num);
    }
    return TS_OK;
}

/* ------------------------------------------------------------------ write -- */

static json_t *metadata(const char *what, int pid, int tid, json_t *args)
{
    return json_pack("{s:s, s:s, s:i, s:i, s:o}", "name", what, "ph", "M", "pid", pid, "tid",
                     tid, "args", args);
}

ts_status ts_trace_write_chrome(const char *path, const ts_trace_event *events, int n,
                                int n_ranks, const char *title)
{
    if (n < 0 || n > TS_TRACE_MAX_EVENTS || n_ranks < 0 || n_ranks > TS_TRACE_MAX_RANKS)
        return ts_fail("trace %s: %d events on %d ranks; a trace holds at most %d events on "
                       "%d ranks",
                       path, n, n_ranks, TS_TRACE_MAX_EVENTS, TS_TRACE_MAX_RANKS);
    for (int i = 0; i < n; i++)
        if (ts_trace_event_check(&events[i], i) != TS_OK) return ts_error_prefix("trace %s: ", path);
    /* json_array_append_new fails (returns -1) on a NULL element, e.g. a name that is
     * not UTF-8: count failures instead of dropping events silently. */
    int bad = 0;
    json_t *list = json_array();
    bad |= json_array_append_new(list, metadata("process_name", 0, 0,
                                                json_pack("{s:s}", "name", title ? title : "tessera")));
    for (int r = 0; r < n_ranks; r++) {
        char name[48];
        snprintf(name, sizeof name, "pipeline rank %d", r);
        bad |= json_array_append_new(list, metadata("thread_name", 0, r, json_pack("{s:s}", "name", name)));
        bad |= json_array_append_new(
            list, metadata("thread_sort_index", 0, r, json_pack("{s:i}", "sort_index", r)));
    }
    /* The dp tracks: process 1, a thread per rank that has dp events (each named once). */
    bool *dp_named = NULL;
    for (int i = 0; i < n; i++) {
        const int r = events[i].rank;
        if (events[i].track != TS_TRACE_TRACK_DP) continue;
        if (!dp_named) {
            dp_named = ts_calloc(TS_TRACE_MAX_RANKS, sizeof(bool));
            bad |= json_array_append_new(
                list, metadata("process_name", TS_TRACE_TRACK_DP, 0,
                               json_pack("{s:s}", "name", "data-parallel reduction")));
            bad |= json_array_append_new(
                list, metadata("process_sort_index", TS_TRACE_TRACK_DP, 0,
                               json_pack("{s:i}", "sort_index", 1)));
        }
        if (dp_named[r]) continue;
        dp_named[r] = true;
        char name[48];
        snprintf(name, sizeof name, "rank %d dp", r);
        bad |= json_array_append_new(
            list, metadata("thread_name", TS_TRACE_TRACK_DP, r, json_pack("{s:s}", "name", name)));
        bad |= json_array_append_new(list, metadata("thread_sort_index", TS_TRACE_TRACK_DP, r,
                                                    json_pack("{s:i}", "sort_index", r)));
    }
    free(dp_named);
    for (int i = 0; i < n; i++) {
        const ts_trace_event *e = &events[i];
        char name[sizeof e->name + 1], cat[sizeof e->cat + 1];
        /* Fixed-size fields may arrive without a terminator (gathered as bytes). */
        memcpy(name, e->name, sizeof e->name);
        name[sizeof e->name] = '\0';
        memcpy(cat, e->cat, sizeof e->cat);
        cat[sizeof e->cat] = '\0';
        bad |= json_array_append_new(
            list, json_pack("{s:s, s:s, s:s, s:i, s:i, s:f, s:f, s:{s:i, s:i}}", "name", name,
                            "cat", cat, "ph", "X", "pid", e->track, "tid", e->rank, "ts", e->start_us,
                            "dur", e->dur_us, "args", "chunk", e->chunk, "mb", e->mb));
    }
    json_t *root = json_pack("{s:o, s:s, s:{s:s}}", "traceEvents", list, "displayTimeUnit", "ms",
                             "otherData", "title", title ? title : "tessera");
    if (!root || bad) {
        json_decref(root);
        return ts_fail("trace %s: could not build the JSON document (a name or the title that "
                       "is not UTF-8?)",
                       path);
    }
    ts_atomic_file af;
    if (ts_atomic_open(&af, path, "trace") != TS_OK) {
        json_decref(root);
        return TS_ERR;
    }
    errno = 0;
    int rc = json_dumpf(root, af.f, JSON_COMPACT | JSON_REAL_PRECISION(17));
    int err = errno;
    json_decref(root);
    if (rc != 0) {
        ts_atomic_abort(&af);
        return ts_fail("trace: writing %s failed: %s (nothing was written there)", path,
                       err ? strerror(err) : "the JSON writer failed");
    }
    return ts_atomic_commit(&af);
}

/* ------------------------------------------------------------------- read -- */

static void copy_str(char *dst, size_t size, json_t *s)
{
    set_str(dst, size, json_is_string(s) ? json_string_value(s) : "");
}

static const char *json_kind(const json_t *v)
{
    switch (v ? json_typeof(v) : JSON_NULL) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return v ? "null" : "missing";
    default: return "a number";
    }
}

/* A whole-number field of event `index` in [lo, hi], checked before it is converted;
 * absent (NULL) gives `dflt`. `range` says what the range means, for the message. */
static ts_status whole_field(const json_t *v, const char *field, size_t index, long long lo,
                             long long hi, const char *range, int dflt, int *out)
{
    char num[64];
    if (!v) {
        *out = dflt;
        return TS_OK;
    }
    if (json_is_integer(v)) {
        long long x = json_integer_value(v);
        if (x >= lo && x <= hi) {
            *out = (int)x;
            return TS_OK;
        }
        snprintf(num, sizeof num, "%lld", x);
    } else if (json_is_real(v)) {
        double d = json_real_value(v);
        format_num(d, num, sizeof num);
        if (!isfinite(d) || d != floor(d))
            return ts_fail("event %zu: \"%s\" %s is not a whole number", index, field, num);
        if (d >= (double)lo && d <= (double)hi) {
            *out = (int)d;
            return TS_OK;
        }
    } else {
        return ts_fail("event %zu: \"%s\" must be a whole number, but is %s", index, field,
                       json_kind(v));
    }
    return ts_fail("event %zu: \"%s\" %s is out of range: %s", index, field, num, range);
}

/* A time field ("ts", "dur") of event `index`: a finite number in [0, 2^53) us. */
static ts_status time_field(const json_t *v, const char *field, size_t index, double *out)
{
    if (!json_is_number(v))
        return ts_fail("event %zu: \"%s\" must be a number of microseconds, but is %s", index,
                       field, json_kind(v));
    double d = json_number_value(v);
    if (!(d >= 0.0 && d < TS_TRACE_MAX_US)) {
        char num[64];
        format_num(d, num, sizeof num);
        return ts_fail("event %zu: \"%s\" %s is out of range: " TIME_RANGE, index, field, num);
    }
    *out = d;
    return TS_OK;
}

/* One complete ("X") event, every number checked. */
static ts_status read_event(const json_t *ev, size_t index, ts_trace_event *e)
{
    memset(e, 0, sizeof *e);
    copy_str(e->name, sizeof e->name, json_object_get(ev, "name"));
    copy_str(e->cat, sizeof e->cat, json_object_get(ev, "cat"));
    if (!e->cat[0]) set_str(e->cat, sizeof e->cat, e->name);
    const json_t *args = json_object_get(ev, "args"), *pid = json_object_get(ev, "pid");
    /* Our dp tracks are process 1; any other process is read as the main track. */
    e->track = json_is_integer(pid) && json_integer_value(pid) == TS_TRACE_TRACK_DP
                   ? TS_TRACE_TRACK_DP
                   : TS_TRACE_TRACK_MAIN;
    if (whole_field(json_object_get(ev, "tid"), "tid", index, 0, TS_TRACE_MAX_RANKS - 1,
                    RANK_RANGE, 0, &e->rank) != TS_OK ||
        whole_field(json_object_get(args, "chunk"), "args.chunk", index, -1,
                    TS_TRACE_MAX_CHUNKS - 1, CHUNK_RANGE, -1, &e->chunk) != TS_OK ||
        whole_field(json_object_get(args, "mb"), "args.mb", index, -1, TS_TRACE_MAX_MB, MB_RANGE,
                    -1, &e->mb) != TS_OK ||
        time_field(json_object_get(ev, "ts"), "ts", index, &e->start_us) != TS_OK ||
        time_field(json_object_get(ev, "dur"), "dur", index, &e->dur_us) != TS_OK)
        return TS_ERR;
    return TS_OK;
}

ts_status ts_trace_read_chrome(const char *path, ts_trace_event **events, int *n, int *n_ranks)
{
    *events = NULL;
    *n = *n_ranks = 0;
    json_error_t err;
    FILE *f = ts_fopen_input(path); /* cannot block */
    if (!f) return ts_fail("trace %s: %s", path, strerror(errno));
    if (ts_check_input(fileno(f), path, "trace", "a Chrome trace JSON file", 4ull << 30) !=
        TS_OK) {
        fclose(f);
        return TS_ERR;
    }
    json_t *root = json_loadf(f, 0, &err);
    fclose(f);
    if (!root)
        return ts_fail("trace %s: not valid JSON (line %d: %s)", path, err.line, err.text);
    json_t *list = json_is_array(root) ? root : json_object_get(root, "traceEvents");
    if (!json_is_array(list)) {
        json_decref(root);
        return ts_fail("trace %s: no \"traceEvents\" array; is it a Chrome trace file?", path);
    }
    if (json_array_size(list) > TS_TRACE_MAX_EVENTS) {
        size_t total = json_array_size(list);
        json_decref(root);
        return ts_fail("trace %s: %zu events; at most %d are read", path, total,
                       TS_TRACE_MAX_EVENTS);
    }
    ts_trace t;
    ts_trace_init(&t);
    int ranks = 0;
    ts_status st = TS_OK;
    size_t i;
    json_t *ev;
    json_array_foreach(list, i, ev)
    {
        const char *ph = json_string_value(json_object_get(ev, "ph"));
        if (!ph) continue;
        if (!strcmp(ph, "M")) {
            /* thread_name metadata names a track, even one without events. */
            const char *what = json_string_value(json_object_get(ev, "name"));
            int tid = 0;
            if (!what || strcmp(what, "thread_name") != 0) continue;
            st = whole_field(json_object_get(ev, "tid"), "tid", i, 0, TS_TRACE_MAX_RANKS - 1,
                             RANK_RANGE, 0, &tid);
            if (st != TS_OK) break;
            if (tid + 1 > ranks) ranks = tid + 1;
            continue;
        }
        if (strcmp(ph, "X") != 0) continue;
        ts_trace_event e;
        if ((st = read_event(ev, i, &e)) != TS_OK) break;
        if (e.rank + 1 > ranks) ranks = e.rank + 1;
        ts_trace_add(&t, &e);
    }
    json_decref(root);
    if (st != TS_OK) {
        ts_trace_free(&t);
        return ts_error_prefix("trace %s: ", path);
    }
    *events = t.events;
    *n = t.n;
    *n_ranks = ranks;
    return TS_OK;
}
