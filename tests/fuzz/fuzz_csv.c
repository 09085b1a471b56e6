/* Fuzz the CSV schedule reader (parallel.schedule = "x.csv"): 3 header bytes give the
 * config's shape, the rest is the file.
 *   byte 0  pp = 1 + b % 8     byte 1  virtual_stages = 1 + b % 4
 *   byte 2  micro-batches m = 1 + b % 16
 * A schedule that reads back is validated with a report, written as CSV and read again:
 * the round trip must give the same action lists. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "pipeline/schedule.h"

static const char *csv_path, *out_path;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_init_dir();
    csv_path = fuzz_path("in.csv");
    out_path = fuzz_path("out.csv");
    return 0;
}

static int same_actions(const ts_schedule *a, const ts_schedule *b)
{
    if (a->pp != b->pp) return 0;
    for (int r = 0; r < a->pp; r++) {
        if (a->n_actions[r] != b->n_actions[r]) return 0;
        for (int j = 0; j < a->n_actions[r]; j++) {
            ts_action x = a->actions[r][j], y = b->actions[r][j];
            if (x.kind != y.kind || x.chunk != y.chunk || x.mb != y.mb) return 0;
        }
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3) return 0;
    int pp = 1 + data[0] % 8, v = 1 + data[1] % 4, m = 1 + data[2] % 16;
    fuzz_write(csv_path, data + 3, size - 3);
    ts_schedule s;
    if (ts_schedule_read_csv(&s, csv_path, pp, v, m) != TS_OK) return 0;
    ts_schedule_report rep;
    if (ts_schedule_validate(&s, &rep) != TS_OK) abort(); /* read_csv validated it */
    ts_schedule_report_free(&rep);
    if (ts_schedule_write_csv(&s, out_path) != TS_OK) abort();
    ts_schedule back;
    if (ts_schedule_read_csv(&back, out_path, pp, v, m) != TS_OK) abort();
    if (!same_actions(&s, &back)) abort();
    ts_schedule_free(&back);
    ts_schedule_free(&s);
    return 0;
}
