#ifndef TS_FSUTIL_H
#define TS_FSUTIL_H

#include "core/error.h"

/* mkdir -p of the directory part of `path` (no-op for a bare file name). */
ts_status ts_mkdir_parent(const char *path);
/* mkdir -p of `dir`. */
ts_status ts_mkdir_p(const char *dir);

#endif
