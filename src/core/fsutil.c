#include "core/fsutil.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

ts_status ts_mkdir_p(const char *dir)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf)
        return ts_fail("path too long: %s", dir);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return ts_fail("cannot create directory %s: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST)
        return ts_fail("cannot create directory %s: %s", buf, strerror(errno));
    return TS_OK;
}

ts_status ts_mkdir_parent(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash || slash == path) return TS_OK;
    char buf[4096];
    size_t n = (size_t)(slash - path);
    if (n >= sizeof buf) return ts_fail("path too long: %s", path);
    memcpy(buf, path, n);
    buf[n] = '\0';
    return ts_mkdir_p(buf);
}
