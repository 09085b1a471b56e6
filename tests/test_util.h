/* A minimal test harness: CHECK records a failure and goes on; main returns
 * ts_test_report(), which prints "N passed, N failed" and the exit code. */
#ifndef TS_TEST_UTIL_H
#define TS_TEST_UTIL_H

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int ts_test_passed = 0;
static int ts_test_failed = 0;

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (cond) {                                                                   \
            ts_test_passed++;                                                         \
        } else {                                                                      \
            ts_test_failed++;                                                         \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);           \
        }                                                                             \
    } while (0)

#define CHECKF(cond, ...)                                                             \
    do {                                                                              \
        if (cond) {                                                                   \
            ts_test_passed++;                                                         \
        } else {                                                                      \
            ts_test_failed++;                                                         \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);           \
            fprintf(stderr, __VA_ARGS__);                                             \
            fputc('\n', stderr);                                                      \
        }                                                                             \
    } while (0)

static inline int ts_test_report(void)
{
    printf("%d passed, %d failed\n", ts_test_passed, ts_test_failed);
    return ts_test_failed == 0 ? 0 : 1;
}

/* Relative error |a-b| / max(|b|, floor). */
static inline double ts_rel_err(double a, double b, double floor_)
{
    double d = fabs(b) > floor_ ? fabs(b) : floor_;
    return fabs(a - b) / d;
}

/* A fresh scratch directory ($TMPDIR or /tmp) named PREFIX_XXXXXX, into buf; exits
 * the test on failure. */
static inline void ts_test_make_dir(char *buf, size_t size, const char *prefix)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(buf, size, "%s/%s_XXXXXX", tmp && *tmp ? tmp : "/tmp", prefix);
    if (!mkdtemp(buf)) {
        perror("mkdtemp");
        exit(2);
    }
}

/* Write `text` to DIR/NAME and return the path (in a static buffer: the next call
 * reuses it); exits the test on failure. */
static inline const char *ts_test_write_file(const char *dir, const char *name, const char *text)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        exit(2);
    }
    fputs(text, f);
    fclose(f);
    return path;
}

/* Remove a scratch directory and the files in it (one level). */
static inline void ts_test_remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    char p[1024];
    while ((de = readdir(d))) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

#endif
