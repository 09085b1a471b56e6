/* Trace events and the Chrome trace JSON format (jansson). */
#include "core/trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/fsutil.h"

/* Copy a string into a fixed-size field, truncated and always terminated. */
static void set_str(char *dst, size_t size, const char *src)
{
    size_t n = strlen(src);
    if (n >= size) n = size - 1;
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

/* ------------------------------------------------------------------ write -- */

static json_t *metadata(const char *what, int tid, json_t *args)
{
    return json_pack("{s:s, s:s, s:i, s:i, s:o}", "name", what, "ph", "M", "pid", 0, "tid", tid,
                     "args", args);
}

ts_status ts_trace_write_chrome(const char *path, const ts_trace_event *events, int n,
                                int n_ranks, const char *title)
{
    json_t *list = json_array();
    json_array_append_new(list, metadata("process_name", 0,
                                         json_pack("{s:s}", "name", title ? title : "tessera")));
    for (int r = 0; r < n_ranks; r++) {
        char name[48];
        snprintf(name, sizeof name, "pipeline rank %d", r);
        json_array_append_new(list, metadata("thread_name", r, json_pack("{s:s}", "name", name)));
        json_array_append_new(list,
                              metadata("thread_sort_index", r, json_pack("{s:i}", "sort_index", r)));
    }
    for (int i = 0; i < n; i++) {
        const ts_trace_event *e = &events[i];
        char name[sizeof e->name + 1], cat[sizeof e->cat + 1];
        /* Fixed-size fields may arrive without a terminator (gathered as bytes). */
        memcpy(name, e->name, sizeof e->name);
        name[sizeof e->name] = '\0';
        memcpy(cat, e->cat, sizeof e->cat);
        cat[sizeof e->cat] = '\0';
        json_array_append_new(
            list, json_pack("{s:s, s:s, s:s, s:i, s:i, s:f, s:f, s:{s:i, s:i}}", "name", name,
                            "cat", cat, "ph", "X", "pid", 0, "tid", e->rank, "ts", e->start_us,
                            "dur", e->dur_us, "args", "chunk", e->chunk, "mb", e->mb));
    }
    json_t *root = json_pack("{s:o, s:s, s:{s:s}}", "traceEvents", list, "displayTimeUnit", "ms",
                             "otherData", "title", title ? title : "tessera");
    if (!root) return ts_fail("trace %s: could not build the JSON document", path);
    if (ts_mkdir_parent(path) != TS_OK) {
        json_decref(root);
        return ts_error_prefix("trace %s: ", path);
    }
    int rc = json_dump_file(root, path, JSON_COMPACT | JSON_REAL_PRECISION(17));
    json_decref(root);
    if (rc != 0) return ts_fail("trace %s: cannot write the file (check the directory)", path);
    return TS_OK;
}

/* ------------------------------------------------------------------- read -- */

static void copy_str(char *dst, size_t size, json_t *s)
{
    set_str(dst, size, json_is_string(s) ? json_string_value(s) : "");
}

static int int_or(json_t *v, int dflt)
{
    return json_is_integer(v) ? (int)json_integer_value(v) : json_is_number(v) ? (int)json_number_value(v) : dflt;
}

ts_status ts_trace_read_chrome(const char *path, ts_trace_event **events, int *n, int *n_ranks)
{
    *events = NULL;
    *n = *n_ranks = 0;
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    if (!root)
        return ts_fail("trace %s: not valid JSON (line %d: %s)", path, err.line, err.text);
    json_t *list = json_is_array(root) ? root : json_object_get(root, "traceEvents");
    if (!json_is_array(list)) {
        json_decref(root);
        return ts_fail("trace %s: no \"traceEvents\" array; is it a Chrome trace file?", path);
    }
    ts_trace t;
    ts_trace_init(&t);
    int ranks = 0;
    size_t i;
    json_t *ev;
    json_array_foreach(list, i, ev)
    {
        const char *ph = json_string_value(json_object_get(ev, "ph"));
        int tid = int_or(json_object_get(ev, "tid"), 0);
        if (!ph) continue;
        if (!strcmp(ph, "M")) {
            const char *what = json_string_value(json_object_get(ev, "name"));
            if (what && !strcmp(what, "thread_name") && tid + 1 > ranks) ranks = tid + 1;
            continue;
        }
        if (strcmp(ph, "X") != 0) continue;
        json_t *ts = json_object_get(ev, "ts"), *dur = json_object_get(ev, "dur");
        if (!json_is_number(ts) || !json_is_number(dur)) {
            ts_trace_free(&t);
            json_decref(root);
            return ts_fail("trace %s: event %zu has no numeric \"ts\"/\"dur\"", path, i);
        }
        ts_trace_event e;
        memset(&e, 0, sizeof e);
        copy_str(e.name, sizeof e.name, json_object_get(ev, "name"));
        copy_str(e.cat, sizeof e.cat, json_object_get(ev, "cat"));
        if (!e.cat[0]) set_str(e.cat, sizeof e.cat, e.name);
        e.rank = tid;
        json_t *args = json_object_get(ev, "args");
        e.chunk = int_or(json_object_get(args, "chunk"), -1);
        e.mb = int_or(json_object_get(args, "mb"), -1);
        e.start_us = json_number_value(ts);
        e.dur_us = json_number_value(dur);
        if (tid < 0) {
            ts_trace_free(&t);
            json_decref(root);
            return ts_fail("trace %s: event %zu has a negative tid %d", path, i, tid);
        }
        if (tid + 1 > ranks) ranks = tid + 1;
        ts_trace_add(&t, &e);
    }
    json_decref(root);
    *events = t.events;
    *n = t.n;
    *n_ranks = ranks;
    return TS_OK;
}
