/* Drawing a trace as SVG: one row per rank, time to the right, a coloured block per
 * forward / backward / input-gradient / weight-gradient pass labelled with its
 * micro-batch, as in the GPipe, Megatron and Zero Bubble papers. */
#include <float.h>
#include <stdbool.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fsutil.h"
#include "core/trace.h"

typedef struct {
    const char *cat, *label;
    unsigned rgb;
} style;

static const style k_styles[] = {
    {"F", "forward", 0x4e79a7},
    {"B", "backward", 0x59a14f},
    {"I", "input grad", 0x3fa7a0},
    {"W", "weight grad", 0xf28e2b},
    {"optim", "optimizer", 0x9d9d9d},
    {"dpsync", "dp sync wait", 0xb07aa1},
    {"dpreduce", "dp reduction", 0xff9da7},
    {"tpcomm", "tp collective", 0xb07aa1},
    {"cpcomm", "cp K/V exchange", 0x76b7b2},
    {"a2a", "ep all-to-all", 0xedc948},
};
#define N_STYLES ((int)(sizeof k_styles / sizeof k_styles[0]))

static int style_of(const char *cat)
{
    for (int s = 0; s < N_STYLES; s++)
        if (!strcmp(cat, k_styles[s].cat)) return s;
    return -1; /* "wait" and unknown categories are not drawn */
}

/* The colour mixed with white by `amount` in [0, 1], as "#rrggbb". */
static void shade(unsigned rgb, double amount, char out[8])
{
    unsigned c[3] = {(rgb >> 16) & 255, (rgb >> 8) & 255, rgb & 255};
    for (int i = 0; i < 3; i++) c[i] = (unsigned)lround(c[i] + (255.0 - c[i]) * amount);
    snprintf(out, 8, "#%02x%02x%02x", c[0] & 255, c[1] & 255, c[2] & 255);
}

static double luminance(unsigned rgb, double amount)
{
    double c[3] = {(rgb >> 16) & 255, (rgb >> 8) & 255, rgb & 255};
    for (int i = 0; i < 3; i++) c[i] += (255.0 - c[i]) * amount;
    return (0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2]) / 255.0;
}

/* Text as XML character data: markup escaped, control bytes (not allowed in XML 1.0,
 * but possible in a trace's names) as '?'. */
static void put_escaped(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc((unsigned char)*s < 0x20 && *s != '\t' ? '?' : *s, f);
        }
    }
}

/* A tick step of 1, 2 or 5 times a power of ten giving about `want` ticks over span. */
static double nice_step(double span, int want)
{
    double raw = span / want, p = pow(10.0, floor(log10(raw))), m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

/* The most ticks the time axis draws (nice_step aims at about 10). */
#define MAX_TICKS 40

ts_status ts_trace_write_svg(const char *path, const ts_trace_event *events, int n,
                             int n_ranks, const char *title)
{
    /* The checked ranges bound everything below: rows, coordinates and the axis. */
    if (n < 0 || n > TS_TRACE_MAX_EVENTS || n_ranks > TS_TRACE_MAX_RANKS)
        return ts_fail("svg %s: %d events on %d ranks; a drawing holds at most %d events on "
                       "%d ranks",
                       path, n, n_ranks, TS_TRACE_MAX_EVENTS, TS_TRACE_MAX_RANKS);
    if (n_ranks < 1) n_ranks = 1;
    double t0 = DBL_MAX, t1 = -DBL_MAX;
    bool used[N_STYLES] = {false}, has_dp = false;
    for (int i = 0; i < n; i++) {
        if (ts_trace_event_check(&events[i], i) != TS_OK) return ts_error_prefix("svg %s: ", path);
        int s = style_of(events[i].cat);
        if (s < 0) continue;
        used[s] = true;
        has_dp = has_dp || events[i].track == TS_TRACE_TRACK_DP;
        if (events[i].start_us < t0) t0 = events[i].start_us;
        if (events[i].start_us + events[i].dur_us > t1) t1 = events[i].start_us + events[i].dur_us;
        if (events[i].rank + 1 > n_ranks) n_ranks = events[i].rank + 1;
    }
    if (t0 > t1) t0 = 0, t1 = 1;
    /* At least a nanosecond, so that the scale and the tick step stay finite. */
    double span = t1 - t0 >= 1e-3 ? t1 - t0 : t1 > t0 ? 1e-3 : 1.0;

    const double width = 1200, left = 96, right = 24, plot_w = width - left - right;
    /* A row per rank: its actions, then (with dp-track events) a thin dp lane. */
    const double top = 64, row_h = 34, lane = has_dp ? 9 : 0, gap = 6, pitch = row_h + lane + gap;
    const double rows_h = n_ranks * pitch - gap;
    const double height = top + rows_h + 46;
#define X(t) (left + ((t) - t0) / span * plot_w)

    ts_atomic_file af;
    if (ts_atomic_open(&af, path, "svg") != TS_OK) return TS_ERR;
    FILE *f = af.f;

    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
            "viewBox=\"0 0 %.0f %.0f\" font-family=\"Helvetica, Arial, sans-serif\">\n",
            width, height, width, height);
    fprintf(f, "<rect class=\"bg\" x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n",
            width, height);
    fputs("<text x=\"12\" y=\"22\" font-size=\"15\" font-weight=\"bold\">", f);
    put_escaped(f, title ? title : "pipeline schedule");
    fputs("</text>\n", f);

    /* Legend: the categories that occur. */
    double lx = left;
    for (int s = 0; s < N_STYLES; s++) {
        if (!used[s]) continue;
        char col[8];
        shade(k_styles[s].rgb, 0.0, col);
        fprintf(f,
                "<rect class=\"legend\" x=\"%.1f\" y=\"33\" width=\"14\" height=\"14\" "
                "fill=\"%s\"/><text x=\"%.1f\" y=\"45\" font-size=\"12\">%s</text>\n",
                lx, col, lx + 18, k_styles[s].label);
        lx += 30 + 7.0 * (double)strlen(k_styles[s].label);
    }
    bool virtual_stages = false;
    for (int i = 0; i < n; i++) virtual_stages = virtual_stages || events[i].chunk >= n_ranks;
    fprintf(f,
            "<text x=\"%.1f\" y=\"45\" font-size=\"11\" fill=\"#666\">label = micro-batch; "
            "%sblank = idle</text>\n",
            lx + 8, virtual_stages ? "lighter = later virtual stage; " : "");

    /* Rows. */
    for (int r = 0; r < n_ranks; r++) {
        double y = top + r * pitch;
        fprintf(f,
                "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"end\">rank %d</text>\n"
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n",
                left - 8, y + row_h / 2 + 4, r, left, y + row_h + lane, left + plot_w,
                y + row_h + lane);
    }

    /* Events. */
    for (int i = 0; i < n; i++) {
        const ts_trace_event *e = &events[i];
        int s = style_of(e->cat);
        if (s < 0) continue;
        double y = top + e->rank * pitch, h = row_h;
        bool strip = !strcmp(e->cat, "dpsync") || e->track == TS_TRACE_TRACK_DP;
        if (e->track == TS_TRACE_TRACK_DP)
            y += row_h + 1, h = lane - 2;
        else if (strip)
            y += row_h - 5, h = 5;
        int vstage = e->chunk >= 0 ? e->chunk / n_ranks : 0;
        double amount = vstage > 0 ? fmin(0.6, 0.38 * vstage) : 0.0;
        char col[8];
        shade(k_styles[s].rgb, amount, col);
        double x = X(e->start_us), w = fmax(0.5, e->dur_us / span * plot_w);
        fprintf(f,
                "<rect class=\"ev\" x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" "
                "fill=\"%s\" stroke=\"white\" stroke-width=\"0.6\"><title>",
                x, y, w, h, col);
        put_escaped(f, e->name);
        fprintf(f, " chunk %d mb %d: %.1f us at %.1f us</title></rect>\n", e->chunk, e->mb,
                e->dur_us, e->start_us - t0);
        if (strip || e->mb < 0) continue;
        char label[16];
        int digits = snprintf(label, sizeof label, "%d", e->mb);
        double font = fmin(row_h * 0.45, (w - 2) / (0.62 * digits));
        if (font < 5.0) continue;
        fprintf(f,
                "<text x=\"%.2f\" y=\"%.2f\" font-size=\"%.1f\" text-anchor=\"middle\" "
                "fill=\"%s\">%s</text>\n",
                x + w / 2, y + h / 2 + font * 0.36, font,
                luminance(k_styles[s].rgb, amount) > 0.6 ? "#222" : "white", label);
    }

    /* Time axis, in ms when the span is long enough. */
    const bool ms = span >= 2000.0;
    const double unit = ms ? 1000.0 : 1.0;
    double ay = top + rows_h + 8, step = nice_step(span / unit, 10);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", left,
            ay, left + plot_w, ay);
    for (int k = 0; k <= MAX_TICKS; k++) {
        double tv = k * step;
        if (tv * unit > span * (1 + 1e-9)) break;
        double x = X(t0 + tv * unit);
        fprintf(f,
                "<line x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\" stroke=\"#333\"/>"
                "<text x=\"%.2f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\">%g</text>\n",
                x, ay, x, ay + 5, x, ay + 18, tv);
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">time (%s)</text>\n",
            left + plot_w, ay + 34, ms ? "ms" : "us");
    fputs("</svg>\n", f);
#undef X
    return ts_atomic_commit(&af);
}
