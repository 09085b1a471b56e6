#include "core/fsutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "core/log.h"

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

static const char *node_kind(mode_t mode)
{
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISFIFO(mode)) return "a pipe";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a regular file";
}

ts_status ts_check_output_path(const char *path, const char *what)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno == ENOENT) return TS_OK; /* created fresh */
        return ts_fail("%s: cannot write %s: %s", what, path, strerror(errno));
    }
    if (!S_ISREG(st.st_mode))
        return ts_fail("%s: %s exists and is %s, not a regular file; give the path of a "
                       "file to write",
                       what, path, node_kind(st.st_mode));
    return TS_OK;
}

ts_status ts_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ts_fail("cannot open directory %s: %s", dir, strerror(errno));
    int rc = fsync(fd);
    int err = errno;
    close(fd);
    /* Some file systems cannot sync a directory (EINVAL): nothing more to do there. */
    if (rc != 0 && err != EINVAL) return ts_fail("fsync of %s failed: %s", dir, strerror(err));
    return TS_OK;
}

ts_status ts_fsync_parent_dir(const char *path)
{
    char dir[4096];
    if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir)
        return ts_fail("path too long: %s", path);
    char *slash = strrchr(dir, '/');
    if (slash == dir)
        slash[1] = '\0';
    else if (slash)
        *slash = '\0';
    else
        snprintf(dir, sizeof dir, ".");
    return ts_fsync_dir(dir);
}

void ts_lock_file_holder(int fd, char *buf, size_t cap)
{
    ssize_t n = pread(fd, buf, cap - 1, 0);
    buf[n > 0 ? n : 0] = '\0';
    buf[strcspn(buf, "\n")] = '\0';
    if (!buf[0]) snprintf(buf, cap, "unknown");
}

ts_status ts_remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? TS_OK : ts_fail("cannot open %s: %s", dir, strerror(errno));
    struct dirent *e;
    char file[4096];
    ts_status st = TS_OK;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (snprintf(file, sizeof file, "%s/%s", dir, e->d_name) >= (int)sizeof file) {
            if (st == TS_OK) st = ts_fail("path too long: %s/%s", dir, e->d_name);
            continue;
        }
        if (unlink(file) != 0 && st == TS_OK)
            st = ts_fail("cannot remove %s: %s", file, strerror(errno));
    }
    closedir(d);
    if (st == TS_OK && rmdir(dir) != 0) st = ts_fail("cannot remove %s: %s", dir, strerror(errno));
    return st;
}

ts_status ts_atomic_open(ts_atomic_file *af, const char *path, const char *what)
{
    memset(af, 0, sizeof *af);
    af->what = what;
    if (ts_check_output_path(path, what) != TS_OK) return TS_ERR;
    if (ts_mkdir_parent(path) != TS_OK) return ts_error_prefix("%s: ", what);
    size_t n = strlen(path) + 32;
    af->path = ts_malloc(n);
    af->tmp = ts_malloc(n);
    snprintf(af->path, n, "%s", path);
    snprintf(af->tmp, n, "%s.tmp.%ld", path, (long)getpid());
    af->f = fopen(af->tmp, "w");
    if (!af->f) {
        ts_status st = ts_fail("%s: cannot create %s: %s", what, af->tmp, strerror(errno));
        free(af->path);
        free(af->tmp);
        memset(af, 0, sizeof *af);
        return st;
    }
    return TS_OK;
}

void ts_atomic_abort(ts_atomic_file *af)
{
    if (af->f) fclose(af->f);
    if (af->tmp) unlink(af->tmp);
    free(af->path);
    free(af->tmp);
    memset(af, 0, sizeof *af);
}

ts_status ts_atomic_commit(ts_atomic_file *af)
{
    /* A full disk can show at any write, the flush, the fsync or the close. */
    int err = 0;
    if (fflush(af->f) != 0)
        err = errno;
    else if (ferror(af->f))
        err = EIO; /* an earlier write failed and its errno is gone */
    if (!err && fsync(fileno(af->f)) != 0 && errno != EINVAL) err = errno;
    int rc = fclose(af->f);
    af->f = NULL;
    if (!err && rc != 0) err = errno;
    if (!err && rename(af->tmp, af->path) != 0) err = errno;
    if (err) {
        ts_status st = ts_fail("%s: writing %s failed: %s (nothing was written there)",
                               af->what, af->path, strerror(err));
        ts_atomic_abort(af);
        return st;
    }
    /* The new file is in place and complete: a directory that cannot be synced only
     * leaves the rename exposed to a crash, which the user should hear of. */
    if (ts_fsync_parent_dir(af->path) != TS_OK)
        ts_log_warn("%s: %s is written, but its directory could not be synced (%s): a crash "
                    "now may lose it",
                    af->what, af->path, ts_error_message());
    free(af->path);
    free(af->tmp);
    memset(af, 0, sizeof *af);
    return TS_OK;
}

ts_status ts_stdout_check(void)
{
    int err = 0;
    if (fflush(stdout) != 0)
        err = errno;
    else if (ferror(stdout))
        err = EIO;
    if (err) return ts_fail("writing standard output failed: %s", strerror(err));
    return TS_OK;
}

int ts_open_input(const char *path)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return -1;
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        int err = errno;
        close(fd);
        errno = err;
        return -1;
    }
    return fd;
}

FILE *ts_fopen_input(const char *path)
{
    int fd = ts_open_input(path);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, "r");
    if (!f) {
        int err = errno;
        close(fd);
        errno = err;
    }
    return f;
}

const char *ts_file_kind(unsigned int mode)
{
    const mode_t m = (mode_t)mode;
    return S_ISDIR(m)    ? "a directory"
           : S_ISFIFO(m) ? "a named pipe (FIFO)"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISSOCK(m) ? "a socket"
           : S_ISLNK(m)  ? "a symbolic link"
                         : "not a file";
}

ts_status ts_check_input(int fd, const char *path, const char *what, const char *give,
                         unsigned long long max_bytes)
{
    struct stat st;
    if (fstat(fd, &st) != 0) return ts_fail("%s %s: %s", what, path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return ts_fail("%s %s is not a regular file (it is %s); give %s", what, path,
                       ts_file_kind(st.st_mode), give);
    if (max_bytes > 0 && (unsigned long long)st.st_size > max_bytes)
        return ts_fail("%s %s is %llu bytes, more than the %llu this input may be; give %s",
                       what, path, (unsigned long long)st.st_size, max_bytes, give);
    return TS_OK;
}

int ts_is_anonymous_pipe(int fd)
{
    struct stat st;
    struct statfs fs;
    /* Anonymous pipes live on pipefs; named FIFOs on the file system that holds them. */
    return fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode) && fstatfs(fd, &fs) == 0 &&
           fs.f_type == 0x50495045 /* PIPEFS_MAGIC */;
}
