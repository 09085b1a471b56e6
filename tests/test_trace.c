/* Trace: the buffer, Chrome JSON round trip, and the SVG drawing's structure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/trace.h"
#include "test_util.h"

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    size_t got = fread(s, 1, (size_t)n, f);
    s[got] = '\0';
    fclose(f);
    return s;
}

static int count(const char *s, const char *what)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, what)) != NULL; p += strlen(what)) n++;
    return n;
}

static void test_buffer(void)
{
    ts_trace t;
    ts_trace_init(&t);
    for (int i = 0; i < 1000; i++) {
        ts_trace_event e = ts_trace_event_make("F", i % 3, i % 3, i, i * 10.0, 5.0);
        ts_trace_add(&t, &e);
    }
    CHECK(t.n == 1000 && t.events[999].mb == 999 && !strcmp(t.events[7].name, "F7"));
    ts_trace_event w = ts_trace_event_make("wait", 0, 1, 2, 0, 1);
    CHECK(!strcmp(w.name, "wait") && !strcmp(w.cat, "wait"));
    ts_trace_event long_cat = ts_trace_event_make("a_very_long_category", 0, -1, -1, 0, 1);
    CHECK(strlen(long_cat.cat) == sizeof long_cat.cat - 1);
    ts_trace_free(&t);
    CHECK(t.n == 0 && t.events == NULL);
}

static void test_round_trip(const char *dir)
{
    const char *cats[] = {"F", "B", "I", "W", "wait", "optim", "dpsync"};
    ts_trace t;
    ts_trace_init(&t);
    for (int i = 0; i < 70; i++) {
        ts_trace_event e = ts_trace_event_make(cats[i % 7], i % 4, i % 7 < 4 ? i % 8 : -1,
                                               i % 7 < 5 ? i / 7 : -1, 1234.5678901234 * i / 3.0,
                                               0.1 + i / 7.0);
        ts_trace_add(&t, &e);
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/sub/trace.json", dir);
    CHECKF(ts_trace_write_chrome(path, t.events, t.n, 4, "round \"trip\"") == TS_OK, "%s",
           ts_error_message());
    char *text = slurp(path);
    CHECK(text && text[0] == '{' && strstr(text, "\"traceEvents\"") &&
          strstr(text, "\"displayTimeUnit\"") && strstr(text, "pipeline rank 3") &&
          strstr(text, "\"ph\":\"X\""));
    free(text);

    ts_trace_event *back = NULL;
    int n = 0, ranks = 0;
    CHECKF(ts_trace_read_chrome(path, &back, &n, &ranks) == TS_OK, "%s", ts_error_message());
    CHECK(n == t.n && ranks == 4);
    int same = n == t.n;
    for (int i = 0; same && i < n; i++) {
        const ts_trace_event *a = &t.events[i], *b = &back[i];
        same = !strcmp(a->name, b->name) && !strcmp(a->cat, b->cat) && a->rank == b->rank &&
               a->chunk == b->chunk && a->mb == b->mb && a->start_us == b->start_us &&
               a->dur_us == b->dur_us;
        if (!same) fprintf(stderr, "event %d differs: %s/%s vs %s/%s\n", i, a->name, a->cat, b->name, b->cat);
    }
    CHECK(same);
    free(back);
    ts_trace_free(&t);

    /* Not a trace. */
    snprintf(path, sizeof path, "%s/bad.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"foo\": 1}", f);
    fclose(f);
    CHECK(ts_trace_read_chrome(path, &back, &n, &ranks) == TS_ERR);
    CHECK(strstr(ts_error_message(), "traceEvents") != NULL);
    snprintf(path, sizeof path, "%s/missing.json", dir);
    CHECK(ts_trace_read_chrome(path, &back, &n, &ranks) == TS_ERR);
}

static void test_svg(const char *dir)
{
    /* A 1F1B-like picture on 2 ranks with waits, an optimizer step and a dp sync. */
    ts_trace t;
    ts_trace_init(&t);
    int compute = 0;
    const char *order[2][6] = {{"F", "F", "B", "F", "B", "B"}, {"F", "B", "F", "B", "F", "B"}};
    for (int r = 0; r < 2; r++) {
        double at = r * 100.0;
        int fi = 0, bi = 0;
        for (int k = 0; k < 6; k++) {
            const char *c = order[r][k];
            int mb = c[0] == 'F' ? fi++ : bi++;
            ts_trace_event e = ts_trace_event_make(c, r, r + (k == 5 ? 2 : 0), mb, at,
                                                   c[0] == 'F' ? 100 : 200);
            ts_trace_add(&t, &e);
            compute++;
            at += e.dur_us;
        }
        ts_trace_event w = ts_trace_event_make("wait", r, -1, -1, at, 30);
        ts_trace_event o = ts_trace_event_make("optim", r, -1, -1, at + 30, 50);
        ts_trace_event d = ts_trace_event_make("dpsync", r, -1, -1, at - 200, 150);
        ts_trace_add(&t, &w);
        ts_trace_add(&t, &o);
        ts_trace_add(&t, &d);
        compute += 2; /* optim and dpsync are drawn; wait is not */
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/pipe.svg", dir);
    CHECKF(ts_trace_write_svg(path, t.events, t.n, 2, "1F1B <test> & more") == TS_OK, "%s",
           ts_error_message());
    char *svg = slurp(path);
    CHECK(svg && !strncmp(svg, "<svg", 4));
    CHECK(svg && strstr(svg, "</svg>") != NULL);
    CHECKF(svg && count(svg, "class=\"ev\"") == compute, "%d rects for %d events",
           svg ? count(svg, "class=\"ev\"") : -1, compute);
    CHECK(svg && count(svg, "<rect") == count(svg, "class=\"ev\"") + count(svg, "class=\"legend\"") +
                                              count(svg, "class=\"bg\""));
    CHECK(svg && strstr(svg, "&lt;test&gt; &amp; more") != NULL);
    CHECK(svg && strstr(svg, "rank 1") && strstr(svg, "forward") && strstr(svg, "time ("));
    CHECK(svg && count(svg, "<svg") == 1 && count(svg, "<text") == count(svg, "</text>"));
    free(svg);
    ts_trace_free(&t);

    /* Empty traces still draw. */
    CHECK(ts_trace_write_svg(path, NULL, 0, 3, "empty") == TS_OK);
}

int main(void)
{
    char dir[] = "/tmp/ts_test_trace_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    test_buffer();
    test_round_trip(dir);
    test_svg(dir);
    char cmd[1100];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return ts_test_report();
}
