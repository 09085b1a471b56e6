/* core/tfevents.h: CRC-32C's check value and TFRecord's mask; an event file's records
 * framed as TensorFlow frames them (length, masked CRC-32C of the length, data, masked
 * CRC-32C of the data) and decoded by protobuf-c's own unpacker (file_version first,
 * then the scalars with their tags, values and step, 0.0 and NaN included); a directory
 * that cannot be made refused with the key's name. tests/check_tfevents.py checks the
 * trainer's files from outside (another decoder) in the command-line tests. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/tensorboard.pb-c.h"
#include "core/tfevents.h"
#include "test_util.h"

static uint64_t le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static void test_crc(void)
{
    CHECK(ts_crc32c("123456789", 9) == 0xE3069283u); /* CRC-32C's check value */
    CHECK(ts_crc32c("", 0) == 0u);
    const uint32_t c = 0xE3069283u;
    CHECK(ts_crc32c_masked(c) == (uint32_t)(((c >> 15) | (c << 17)) + 0xA282EAD8u));
}

/* The records of a file (each frame's CRCs checked), events unpacked into ev[]. */
static int read_events(const char *path, Tensorboard__Event **ev, int cap)
{
    FILE *f = fopen(path, "rb");
    CHECKF(f != NULL, "cannot open %s", path);
    if (!f) return 0;
    static unsigned char buf[1 << 16];
    const size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    size_t at = 0;
    int k = 0;
    while (at + 12 <= n && k < cap) {
        const uint64_t len = le(buf + at, 8);
        CHECK(le(buf + at + 8, 4) == ts_crc32c_masked(ts_crc32c(buf + at, 8)));
        CHECK(at + 16 + len <= n);
        if (at + 16 + len > n) break;
        CHECK(le(buf + at + 12 + len, 4) == ts_crc32c_masked(ts_crc32c(buf + at + 12, len)));
        ev[k] = tensorboard__event__unpack(NULL, len, buf + at + 12);
        CHECK(ev[k] != NULL);
        if (!ev[k]) break;
        k++;
        at += 16 + len;
    }
    CHECK(at == n); /* nothing after the last whole record */
    return k;
}

static void test_round_trip(const char *dir)
{
    ts_tfevents w;
    CHECKF(ts_tfevents_open(&w, dir, "log.tensorboard") == TS_OK, "%s", ts_error_message());
    CHECK(ts_tfevents_is_open(&w));
    CHECK(strstr(w.path, "/events.out.tfevents.") != NULL);
    const ts_tfevents_scalar a[] = {{"loss", 5.25f}, {"val/loss", 0.0f}, {"moe/block3/expert5", NAN}};
    const ts_tfevents_scalar b[] = {{"lr", 1e-3f}};
    CHECK(ts_tfevents_scalars(&w, 7, a, 3, "log.tensorboard") == TS_OK);
    CHECK(ts_tfevents_scalars(&w, 1LL << 40, b, 1, "log.tensorboard") == TS_OK);
    CHECK(ts_tfevents_scalars(&w, 9, b, 0, "log.tensorboard") == TS_OK); /* nothing */
    char path[1024];
    snprintf(path, sizeof path, "%s", w.path);
    ts_tfevents_close(&w);
    CHECK(!ts_tfevents_is_open(&w));

    Tensorboard__Event *ev[4] = {0};
    const int n = read_events(path, ev, 4);
    CHECKF(n == 3, "%d records", n);
    if (n == 3) {
        CHECK(ev[0]->what_case == TENSORBOARD__EVENT__WHAT_FILE_VERSION &&
              !strcmp(ev[0]->file_version, "brain.Event:2") && ev[0]->wall_time > 1.6e9);
        CHECK(ev[1]->what_case == TENSORBOARD__EVENT__WHAT_SUMMARY && ev[1]->step == 7 &&
              ev[1]->wall_time >= ev[0]->wall_time);
        const Tensorboard__Summary *s = ev[1]->summary;
        CHECK(s->n_value == 3);
        if (s->n_value == 3) {
            CHECK(!strcmp(s->value[0]->tag, "loss") && s->value[0]->simple_value == 5.25f);
            /* 0.0 is written (a oneof has presence), not dropped as proto3's default */
            CHECK(!strcmp(s->value[1]->tag, "val/loss") &&
                  s->value[1]->value_case == TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE &&
                  s->value[1]->simple_value == 0.0f);
            CHECK(!strcmp(s->value[2]->tag, "moe/block3/expert5") && isnan(s->value[2]->simple_value));
        }
        CHECK(ev[2]->step == (1LL << 40) && ev[2]->summary->n_value == 1 &&
              ev[2]->summary->value[0]->simple_value == 1e-3f);
    }
    for (int i = 0; i < n; i++) tensorboard__event__free_unpacked(ev[i], NULL);
    remove(path);
}

static void test_unwritable(const char *dir)
{
    const char *file = ts_test_write_file(dir, "afile", "x");
    char sub[1024];
    snprintf(sub, sizeof sub, "%s/tb", file);
    ts_tfevents w;
    ts_error_clear();
    CHECK(ts_tfevents_open(&w, sub, "log.tensorboard") == TS_ERR);
    CHECKF(strstr(ts_error_message(), "log.tensorboard: cannot create directory") != NULL, "%s",
           ts_error_message());
    CHECK(!ts_tfevents_is_open(&w));
    ts_tfevents_close(&w); /* a never-opened writer closes harmlessly */
    remove(file);
}

int main(void)
{
    char dir[256];
    ts_test_make_dir(dir, sizeof dir, "ts_test_tfevents");
    test_crc();
    test_round_trip(dir);
    test_unwritable(dir);
    ts_test_remove_dir(dir);
    return ts_test_report();
}
