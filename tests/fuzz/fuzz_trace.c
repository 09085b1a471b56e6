/* Fuzz the Chrome trace reader and what `tessera plan --from-trace T --svg F` does with
 * its result: the input is the trace file; the events that read back are drawn as SVG.
 * The SVG has one row per rank, so it is drawn only for traces of at most MAX_RANKS
 * ranks (a tid of 10^9 makes a file of gigabytes, by design of the drawing). */
#include <stdint.h>
#include <stdlib.h>

#include "core/trace.h"
#include "fuzz_util.h"

#define MAX_RANKS 64

static const char *trace_path, *svg_path;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_init_dir();
    trace_path = fuzz_path("trace.json");
    svg_path = fuzz_path("trace.svg");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_write(trace_path, data, size);
    ts_trace_event *ev = NULL;
    int n = 0, ranks = 0;
    if (ts_trace_read_chrome(trace_path, &ev, &n, &ranks) != TS_OK) {
        if (ev) abort(); /* nothing to free on error */
        return 0;
    }
    if (n < 0 || ranks < 0 || (n > 0) != (ev != NULL)) abort();
    for (int i = 0; i < n; i++)
        if (ev[i].rank < 0 || ev[i].rank >= ranks) abort(); /* ranks = 1 + largest tid */
    if (ranks <= MAX_RANKS) (void)ts_trace_write_svg(svg_path, ev, n, ranks, "fuzz");
    free(ev);
    return 0;
}
