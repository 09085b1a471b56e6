/* TensorBoard event files: TFRecord framing around protobuf-c's serialised Events
 * (core/tfevents.h). A record is uint64 length, uint32 masked CRC-32C of those 8 bytes,
 * the data, uint32 masked CRC-32C of the data, all little-endian (TensorFlow's
 * record_writer, TensorBoard's tensorboard/summary/writer/record_writer.py). The CRC-32C
 * is Intel ISA-L's crc32_iscsi (the iSCSI polynomial is Castagnoli's), a well-kept
 * library with hardware paths; zlib and OpenSSL offer only CRC-32. */
#include "core/tfevents.h"

#include <errno.h>
#include <fcntl.h>
#include <isa-l/crc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/fsutil.h"
#include "core/tensorboard.pb-c.h"

uint32_t ts_crc32c(const void *data, size_t n)
{
    /* ISA-L leaves the initial and final inversion to the caller; its length is an int. */
    uint32_t crc = 0xFFFFFFFFu;
    const unsigned char *p = data;
    while (n > 0) {
        const int chunk = n > (1u << 30) ? (1 << 30) : (int)n;
        crc = crc32_iscsi((unsigned char *)p, chunk, crc);
        p += chunk;
        n -= (size_t)chunk;
    }
    return ~crc;
}

uint32_t ts_crc32c_masked(uint32_t crc)
{
    return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

static double wall_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void put_le(unsigned char *out, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++) out[i] = (unsigned char)(v >> (8 * i));
}

/* One record of `n` bytes (its frame around data), written with write(2) straight to
 * the file, so nothing lingers in a buffer to be written after a failure; on failure
 * the file is cut back to its last complete record and closed. */
static ts_status write_record(ts_tfevents *w, unsigned char *frame, size_t n, const char *what)
{
    unsigned char *head = frame, *tail = frame + 12 + n;
    put_le(head, (uint64_t)n, 8);
    put_le(head + 8, ts_crc32c_masked(ts_crc32c(head, 8)), 4);
    put_le(tail, ts_crc32c_masked(ts_crc32c(frame + 12, n)), 4);
    const size_t total = n + 16;
    size_t done = 0;
    int err = 0;
    while (done < total) {
        const ssize_t k = write(w->fd, frame + done, total - done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            err = k < 0 ? errno : ENOSPC;
            break;
        }
        done += (size_t)k;
    }
    if (!err) {
        w->end += (long)total;
        return TS_OK;
    }
    if (ftruncate(w->fd, w->end) != 0) { /* best effort: a reader stops at a torn record */
    }
    close(w->fd);
    w->fd = -1;
    return ts_fail("%s: writing %s failed: %s; the run stops here (the file ends at its last "
                   "complete record)",
                   what, w->path, strerror(err));
}

static ts_status write_event(ts_tfevents *w, const Tensorboard__Event *ev, const char *what)
{
    const size_t n = tensorboard__event__get_packed_size(ev);
    unsigned char *frame = ts_try_malloc(n + 16);
    if (!frame) return ts_fail("%s: out of memory for an event of %zu bytes", what, n);
    tensorboard__event__pack(ev, frame + 12);
    const ts_status st = write_record(w, frame, n, what);
    free(frame);
    return st;
}

ts_status ts_tfevents_open(ts_tfevents *w, const char *dir, const char *what)
{
    memset(w, 0, sizeof *w);
    w->fd = -1;
    if (ts_mkdir_p(dir) != TS_OK) return ts_error_prefix("%s: ", what);
    char host[256] = "localhost";
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = '\0';
    /* TensorBoard's own name, events.out.tfevents.<%010d seconds>.<host>.<pid>: "tfevents"
     * is what its readers look for; host and pid keep two runs' files apart. */
    const size_t cap = strlen(dir) + strlen(host) + 96;
    w->path = ts_malloc(cap);
    snprintf(w->path, cap, "%s/events.out.tfevents.%010lld.%s.%ld", dir, (long long)time(NULL),
             host, (long)getpid());
    /* O_EXCL: never another file's records under ours. */
    w->fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        const int err = errno;
        ts_status st = ts_fail("%s: cannot create %s: %s (log.tensorboard must name a directory "
                               "this rank can write)",
                               what, w->path, strerror(err));
        free(w->path);
        w->path = NULL;
        return st;
    }
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.wall_time = wall_seconds();
    ev.what_case = TENSORBOARD__EVENT__WHAT_FILE_VERSION;
    ev.file_version = "brain.Event:2";
    if (write_event(w, &ev, what) != TS_OK) {
        ts_tfevents_close(w);
        return TS_ERR;
    }
    return TS_OK;
}

ts_status ts_tfevents_scalars(ts_tfevents *w, int64_t step, const ts_tfevents_scalar *v, size_t n,
                              const char *what)
{
    if (w->fd < 0) return ts_fail("%s: the event file is closed (an earlier write failed)", what);
    if (n == 0) return TS_OK;
    Tensorboard__Summary__Value *values = ts_malloc(n * sizeof *values);
    Tensorboard__Summary__Value **ptrs = ts_malloc(n * sizeof *ptrs);
    for (size_t i = 0; i < n; i++) {
        tensorboard__summary__value__init(&values[i]);
        values[i].tag = (char *)v[i].tag;
        values[i].value_case = TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
        values[i].simple_value = v[i].value;
        ptrs[i] = &values[i];
    }
    Tensorboard__Summary summary = TENSORBOARD__SUMMARY__INIT;
    summary.n_value = n;
    summary.value = ptrs;
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.wall_time = wall_seconds();
    ev.step = step;
    ev.what_case = TENSORBOARD__EVENT__WHAT_SUMMARY;
    ev.summary = &summary;
    const ts_status st = write_event(w, &ev, what);
    free(ptrs);
    free(values);
    return st;
}

void ts_tfevents_close(ts_tfevents *w)
{
    if (w->path && w->fd >= 0) close(w->fd);
    free(w->path);
    memset(w, 0, sizeof *w);
    w->fd = -1;
}

bool ts_tfevents_is_open(const ts_tfevents *w)
{
    return w->path && w->fd >= 0;
}
