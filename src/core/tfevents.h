/* TensorBoard event files (log.tensorboard; docs/CONTRACT.md "TensorBoard"): a file
 * DIR/events.out.tfevents.<unix seconds>.<host>.<pid> of TFRecords, each a serialised
 * tensorboard.Event (src/core/tensorboard.proto, through protobuf-c): first
 * {wall_time, file_version = "brain.Event:2"}, then one {wall_time, step, summary} per
 * call of ts_tfevents_scalars. Every record is written through as it comes, so TensorBoard
 * (or `wandb sync`) sees a live run, and a failed write is reported at once. */
#ifndef TS_TFEVENTS_H
#define TS_TFEVENTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

typedef struct {
    int fd;     /* with path set: -1 once closed (a failed write) */
    char *path; /* owned; NULL: never opened */
    long end;   /* bytes of complete records: a failed write cuts the file back here */
} ts_tfevents;

typedef struct {
    const char *tag;
    float value;
} ts_tfevents_scalar;

/* Make `dir` (mkdir -p) and a new event file in it, named as TensorBoard names its own
 * (the host name and pid make it unique beside other runs' files), and write the
 * file_version record. Errors name `what` (the config key) and the path. */
ts_status ts_tfevents_open(ts_tfevents *w, const char *dir, const char *what);
/* One Event of n scalars at `step`, its wall_time now. On a failed write the file is cut
 * back to its last complete record, closed, and TS_ERR returned (nothing more is
 * written). n == 0 writes nothing. */
ts_status ts_tfevents_scalars(ts_tfevents *w, int64_t step, const ts_tfevents_scalar *v, size_t n,
                              const char *what);
void ts_tfevents_close(ts_tfevents *w);
/* Whether records may be written (opened, and no write failed). A zeroed ts_tfevents
 * is not open. */
bool ts_tfevents_is_open(const ts_tfevents *w);

/* CRC-32C (Castagnoli) of n bytes, and TFRecord's masked form of a CRC:
 * ((crc >> 15) | (crc << 17)) + 0xa282ead8. */
uint32_t ts_crc32c(const void *data, size_t n);
uint32_t ts_crc32c_masked(uint32_t crc);

#endif
