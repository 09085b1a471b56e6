/* Trace: the buffer, Chrome JSON round trip, and the SVG drawing's structure; the
 * reader's checks of every number in a hostile trace, the SVG writer's bounds, and the
 * three file writers (trace JSON, SVG, schedule CSV) leaving no half-written file. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/trace.h"
#include "pipeline/schedule.h"
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

    /* The dp track: pid 1, named, read back as the dp track of its rank. */
    ts_trace_init(&t);
    ts_trace_event fwd = ts_trace_event_make("F", 2, 2, 0, 0, 10);
    ts_trace_event red = ts_trace_event_make("dpreduce", 2, -1, -1, 5, 20);
    snprintf(red.name, sizeof red.name, "all-reduce");
    red.track = TS_TRACE_TRACK_DP;
    ts_trace_add(&t, &fwd);
    ts_trace_add(&t, &red);
    snprintf(path, sizeof path, "%s/dp.json", dir);
    CHECKF(ts_trace_write_chrome(path, t.events, t.n, 3, "dp") == TS_OK, "%s", ts_error_message());
    text = slurp(path);
    CHECK(text && strstr(text, "\"data-parallel reduction\"") && strstr(text, "\"rank 2 dp\"") &&
          strstr(text, "\"name\":\"all-reduce\",\"cat\":\"dpreduce\",\"ph\":\"X\",\"pid\":1,\"tid\":2"));
    free(text);
    CHECKF(ts_trace_read_chrome(path, &back, &n, &ranks) == TS_OK, "%s", ts_error_message());
    CHECK(n == 2 && ranks == 3 && back[0].track == TS_TRACE_TRACK_MAIN &&
          back[1].track == TS_TRACE_TRACK_DP && back[1].rank == 2 && !strcmp(back[1].name, "all-reduce"));
    free(back);
    t.events[1].track = 7;
    CHECK(ts_trace_write_chrome(path, t.events, t.n, 3, "dp") == TS_ERR &&
          strstr(ts_error_message(), "track 7 is out of range"));
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
        ts_trace_event red = ts_trace_event_make("dpreduce", r, -1, -1, at - 250, 240);
        red.track = TS_TRACE_TRACK_DP; /* drawn in the rank's dp lane */
        ts_trace_add(&t, &red);
        compute++;
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
    CHECK(svg && strstr(svg, "rank 1") && strstr(svg, "forward") && strstr(svg, "time (") &&
          strstr(svg, "dp reduction"));
    CHECK(svg && count(svg, "<svg") == 1 && count(svg, "<text") == count(svg, "</text>"));
    free(svg);
    ts_trace_free(&t);

    /* Empty traces still draw. */
    CHECK(ts_trace_write_svg(path, NULL, 0, 3, "empty") == TS_OK);
}

/* Read a trace made of `events` (the inside of the traceEvents array); TS_OK or the
 * message in ts_error_message(). */
static ts_status read_events(const char *dir, const char *events, int *n, int *ranks)
{
    char text[4096];
    snprintf(text, sizeof text, "{\"traceEvents\": [%s]}", events);
    const char *path = ts_test_write_file(dir, "hostile.json", text);
    ts_trace_event *ev = NULL;
    ts_status st = ts_trace_read_chrome(path, &ev, n, ranks);
    free(ev);
    return st;
}

#define GOOD_EVENT "{\"name\":\"F0\",\"cat\":\"F\",\"ph\":\"X\",\"tid\":0,\"ts\":0,\"dur\":1}"

/* Every number of a trace is checked before it is converted: the message names the
 * event's index, the field and the value (review rows TR_*: UBSan overflows on tid
 * 2^31-1, (int)1e30, ts 1e308 drawing forever, tid 1e8 drawing 2 GB). */
static void test_read_rejects_bad_numbers(const char *dir)
{
    static const struct {
        const char *event, *message;
    } bad[] = {
        {"{\"name\":\"thread_name\",\"ph\":\"M\",\"tid\":2147483647}",
         "event 1: \"tid\" 2147483647 is out of range"},
        {"{\"ph\":\"X\",\"tid\":2147483647,\"ts\":0,\"dur\":1}", "event 1: \"tid\" 2147483647 is out of range"},
        {"{\"ph\":\"X\",\"tid\":1e30,\"ts\":0,\"dur\":1}", "event 1: \"tid\" 1e+30 is out of range"},
        {"{\"ph\":\"X\",\"tid\":100000000,\"ts\":0,\"dur\":1}", "event 1: \"tid\" 100000000 is out of range"},
        {"{\"ph\":\"X\",\"tid\":65536,\"ts\":0,\"dur\":1}", "event 1: \"tid\" 65536 is out of range"},
        {"{\"ph\":\"X\",\"tid\":-1,\"ts\":0,\"dur\":1}", "event 1: \"tid\" -1 is out of range"},
        {"{\"ph\":\"X\",\"tid\":2.5,\"ts\":0,\"dur\":1}", "event 1: \"tid\" 2.5 is not a whole number"},
        {"{\"ph\":\"X\",\"tid\":\"1\",\"ts\":0,\"dur\":1}", "event 1: \"tid\" must be a whole number, but is a string"},
        {"{\"ph\":\"X\",\"tid\":0,\"ts\":1e308,\"dur\":1e308}", "event 1: \"ts\" 1e+308 is out of range"},
        {"{\"ph\":\"X\",\"tid\":0,\"ts\":0,\"dur\":-5}", "event 1: \"dur\" -5 is out of range"},
        {"{\"ph\":\"X\",\"tid\":0,\"ts\":-1,\"dur\":5}", "event 1: \"ts\" -1 is out of range"},
        {"{\"ph\":\"X\",\"tid\":0,\"ts\":9007199254740992,\"dur\":0}", "event 1: \"ts\" 9007199254740992 is out of range"},
        {"{\"ph\":\"X\",\"tid\":0,\"ts\":\"0\",\"dur\":5}", "event 1: \"ts\" must be a number of microseconds, but is a string"},
        {"{\"ph\":\"X\",\"tid\":0,\"ts\":0}", "event 1: \"dur\" must be a number of microseconds, but is missing"},
        {"{\"ph\":\"X\",\"tid\":0,\"ts\":0,\"dur\":1,\"args\":{\"chunk\":2147483647}}",
         "event 1: \"args.chunk\" 2147483647 is out of range"},
        {"{\"ph\":\"X\",\"tid\":0,\"ts\":0,\"dur\":1,\"args\":{\"chunk\":-2}}", "event 1: \"args.chunk\" -2 is out of range"},
        {"{\"ph\":\"X\",\"tid\":0,\"ts\":0,\"dur\":1,\"args\":{\"mb\":1e20}}", "event 1: \"args.mb\" 1e+20 is out of range"},
        {"{\"ph\":\"X\",\"tid\":0,\"ts\":0,\"dur\":1,\"args\":{\"mb\":true}}", "event 1: \"args.mb\" must be a whole number, but is a boolean"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char events[1024];
        snprintf(events, sizeof events, GOOD_EVENT ", %s", bad[k].event);
        int n = -1, ranks = -1;
        ts_status st = read_events(dir, events, &n, &ranks);
        CHECKF(st == TS_ERR && strstr(ts_error_message(), bad[k].message) &&
                   strstr(ts_error_message(), "hostile.json"),
               "%s: got %s", bad[k].event, st == TS_OK ? "TS_OK" : ts_error_message());
    }

    /* The edges of the ranges are accepted; a whole number may be written as a real. */
    int n = 0, ranks = 0;
    CHECKF(read_events(dir,
                       GOOD_EVENT ", {\"ph\":\"X\",\"tid\":65535.0,\"ts\":9007199254740991,"
                                  "\"dur\":0,\"args\":{\"chunk\":65535,\"mb\":2147483646}}",
                       &n, &ranks) == TS_OK,
           "%s", ts_error_message());
    CHECK(n == 2 && ranks == 65536);
    CHECKF(read_events(dir, "{\"name\":\"thread_name\",\"ph\":\"M\",\"tid\":7}", &n, &ranks) ==
               TS_OK,
           "%s", ts_error_message());
    CHECK(n == 0 && ranks == 8);
    /* Other phases' fields are not read, so not checked. */
    CHECK(read_events(dir, "{\"ph\":\"i\",\"tid\":1e30,\"ts\":\"x\"}", &n, &ranks) == TS_OK &&
          n == 0);
}

/* A name cut to fit its field never ends inside a UTF-8 sequence. */
static void test_read_long_utf8_name(const char *dir)
{
    ts_trace_event *ev = NULL;
    int n = 0, ranks = 0;
    const char *path = ts_test_write_file(
        dir, "utf8.json",
        "[{\"name\":\"abcdefghijklmn\u00e9\",\"ph\":\"X\",\"tid\":0,\"ts\":0,\"dur\":1}]");
    CHECKF(ts_trace_read_chrome(path, &ev, &n, &ranks) == TS_OK, "%s", ts_error_message());
    CHECK(n == 1 && ev && !strcmp(ev[0].name, "abcdefghijklmn"));
    free(ev);
}

static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* The SVG writer checks what it draws, so no input makes it loop or write without
 * bound: a rank beyond the limit, a non-finite or negative time are refused, and the
 * time axis of the shortest and the longest spans has a few ticks. */
static void test_svg_bounded(const char *dir)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/bounded.svg", dir);
    ts_trace_event e = ts_trace_event_make("F", 0, 0, 0, 0.0, 1.0);

    e.rank = TS_TRACE_MAX_RANKS; /* would be 65537 rows */
    CHECK(ts_trace_write_svg(path, &e, 1, 1, "t") == TS_ERR &&
          strstr(ts_error_message(), "rank 65536 is out of range"));
    CHECK(file_size(path) < 0);
    CHECK(ts_trace_write_svg(path, NULL, 0, TS_TRACE_MAX_RANKS + 1, "t") == TS_ERR);
    e.rank = 0;
    e.dur_us = 1e308;
    CHECK(ts_trace_write_svg(path, &e, 1, 1, "t") == TS_ERR &&
          strstr(ts_error_message(), "event 0: duration 1e+308 is out of range"));
    e.dur_us = -1.0;
    CHECK(ts_trace_write_svg(path, &e, 1, 1, "t") == TS_ERR);
    e.dur_us = 1.0;
    e.start_us = NAN;
    CHECK(ts_trace_write_svg(path, &e, 1, 1, "t") == TS_ERR &&
          strstr(ts_error_message(), "start nan"));

    /* Spans from the smallest positive double to 2^53 us: a finished, small drawing
     * with a handful of ticks (the tick loop used to spin on a zero step). */
    const double spans[] = {4.9e-324, 1e-9, 1e-3, 1.0, 8e15};
    for (size_t k = 0; k < sizeof spans / sizeof spans[0]; k++) {
        ts_trace_event two[2] = {ts_trace_event_make("F", 0, 0, 0, 0.0, 0.0),
                                 ts_trace_event_make("B", 1, 1, 0, 0.0, spans[k])};
        CHECKF(ts_trace_write_svg(path, two, 2, 2, "span") == TS_OK, "span %g: %s", spans[k],
               ts_error_message());
        char *svg = slurp(path);
        int ticks = svg ? count(svg, "stroke=\"#333\"/><text") : -1;
        CHECKF(ticks >= 1 && ticks <= 41 && file_size(path) < 16384, "span %g: %d ticks, %ld bytes",
               spans[k], ticks, file_size(path));
        free(svg);
    }
    /* Control bytes in a name (possible in a trace file) are not copied into the XML. */
    ts_trace_event odd = ts_trace_event_make("F", 0, 0, 0, 0.0, 1.0);
    memcpy(odd.name, "F\001\033[2J", 7);
    CHECK(ts_trace_write_svg(path, &odd, 1, 1, "t") == TS_OK);
    char *svg = slurp(path);
    CHECK(svg && !strchr(svg, '\001') && !strchr(svg, '\033'));
    free(svg);
}

/* Names of the files in `dir` that contain ".tmp." (leftover temporary files). */
static int leftover_temps(const char *dir)
{
    int n = 0;
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d)))
        if (strstr(de->d_name, ".tmp.")) {
            fprintf(stderr, "leftover temporary file %s/%s\n", dir, de->d_name);
            n++;
        }
    if (d) closedir(d);
    return n;
}

typedef ts_status (*writer_fn)(const char *path, void *ctx);

static ts_status write_trace_json(const char *path, void *ctx)
{
    const ts_trace *t = ctx;
    return ts_trace_write_chrome(path, t->events, t->n, 4, "atomic");
}

static ts_status write_trace_svg(const char *path, void *ctx)
{
    const ts_trace *t = ctx;
    return ts_trace_write_svg(path, t->events, t->n, 4, "atomic");
}

static ts_status write_schedule_csv(const char *path, void *ctx)
{
    return ts_schedule_write_csv((const ts_schedule *)ctx, path);
}

/* One writer against a device, a failing write and a normal one. `what` is the
 * output's name in messages. */
static void check_writer(const char *dir, const char *name, const char *what, writer_fn write,
                         void *ctx)
{
    /* An existing path that is not a regular file is refused, and left alone (as root,
     * a rename over /dev/full would replace the device node). */
    struct stat before;
    if (stat("/dev/full", &before) == 0 && S_ISCHR(before.st_mode)) {
        CHECKF(write("/dev/full", ctx) == TS_ERR &&
                   strstr(ts_error_message(), "is a character device") &&
                   strstr(ts_error_message(), what),
               "%s to /dev/full: %s", name, ts_error_message());
        struct stat after;
        CHECK(stat("/dev/full", &after) == 0 && S_ISCHR(after.st_mode));
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    CHECKF(write(path, ctx) == TS_ERR && strstr(ts_error_message(), "is a directory"),
           "%s to a directory: %s", name, ts_error_message());

    /* A write that fails half-way (here the file-size limit, EFBIG; a full disk the
     * same way): an error with the reason, the old file untouched, no temporary left. */
    snprintf(path, sizeof path, "%s/%s.out", dir, name);
    ts_test_write_file(dir, strrchr(path, '/') + 1, "old contents\n");
    struct rlimit old_limit, small;
    getrlimit(RLIMIT_FSIZE, &old_limit);
    small = old_limit;
    small.rlim_cur = 1024;
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &small);
    ts_status st = write(path, ctx);
    int err = errno;
    setrlimit(RLIMIT_FSIZE, &old_limit);
    signal(SIGXFSZ, old_handler);
    (void)err;
    CHECKF(st == TS_ERR && strstr(ts_error_message(), strerror(EFBIG)) &&
               strstr(ts_error_message(), what) && strstr(ts_error_message(), path),
           "%s over the size limit: %s", name, st == TS_OK ? "TS_OK" : ts_error_message());
    char *text = slurp(path);
    CHECKF(text && !strcmp(text, "old contents\n"), "%s: the old file was changed", name);
    free(text);
    CHECK(leftover_temps(dir) == 0);

    /* And the same write without the limit replaces the file whole. */
    CHECKF(write(path, ctx) == TS_OK, "%s: %s", name, ts_error_message());
    CHECK(file_size(path) > 1024 && leftover_temps(dir) == 0);
}

static void test_writers_atomic(const char *dir)
{
    char sub[1024];
    snprintf(sub, sizeof sub, "%s/out", dir);
    mkdir(sub, 0777);
    char d[1100];
    for (int k = 0; k < 3; k++) { /* a directory where each output should go */
        const char *names[] = {"trace.json", "plan.svg", "schedule.csv"};
        snprintf(d, sizeof d, "%s/%s", sub, names[k]);
        mkdir(d, 0777);
    }
    ts_trace t;
    ts_trace_init(&t);
    for (int i = 0; i < 200; i++) {
        ts_trace_event e = ts_trace_event_make(i % 2 ? "B" : "F", i % 4, i % 4, i / 8, 10.0 * i, 9.0);
        ts_trace_add(&t, &e);
    }
    check_writer(sub, "trace.json", "trace", write_trace_json, &t);
    check_writer(sub, "plan.svg", "svg", write_trace_svg, &t);
    ts_trace_free(&t);

    ts_schedule s;
    CHECKF(ts_schedule_build(&s, "1f1b", 4, 1, 64) == TS_OK, "%s", ts_error_message());
    check_writer(sub, "schedule.csv", "schedule CSV", write_schedule_csv, &s);
    ts_schedule_free(&s);
}

/* The share of the a2a spans hidden: covered by the same rank's compute (F/B/I/W on the
 * main track, overlapping spans merged), less their a2await parts; other ranks' compute,
 * the dp track and other categories do not count. */
static void test_hidden_share(void)
{
    ts_trace_event ev[9];
    int n = 0;
    ev[n++] = ts_trace_event_make("F", 0, 0, 0, 0, 100);    /* rank 0 computes 0..100 */
    ev[n++] = ts_trace_event_make("B", 0, 0, 1, 50, 100);   /* and 50..150 (a pair's) */
    ev[n++] = ts_trace_event_make("a2a", 0, 0, 0, 80, 100); /* 80..180: 70 covered */
    ev[n - 1].track = TS_TRACE_TRACK_DP;
    ev[n++] = ts_trace_event_make("a2await", 0, 0, 0, 130, 10); /* 10 of them blocked */
    ev[n++] = ts_trace_event_make("a2a", 1, 0, 0, 0, 100);  /* rank 1: no compute of its */
    ev[n - 1].track = TS_TRACE_TRACK_DP;
    ev[n++] = ts_trace_event_make("dpreduce", 1, -1, -1, 0, 100); /* not compute */
    ev[n - 1].track = TS_TRACE_TRACK_DP;
    double total = 0;
    double share = ts_trace_hidden_share(ev, n, "a2a", "a2await", &total);
    CHECKF(total == 200 && share == 60.0 / 200.0, "total %g, share %g (want 200, 0.3)", total,
           share);
    /* No a2a spans: 0 of 0. */
    share = ts_trace_hidden_share(ev, 2, "a2a", "a2await", &total);
    CHECK(total == 0 && share == 0);
}

int main(void)
{
    char dir[] = "/tmp/ts_test_trace_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    test_buffer();
    test_hidden_share();
    test_round_trip(dir);
    test_svg(dir);
    test_read_rejects_bad_numbers(dir);
    test_read_long_utf8_name(dir);
    test_svg_bounded(dir);
    test_writers_atomic(dir);
    char cmd[1100];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return ts_test_report();
}
