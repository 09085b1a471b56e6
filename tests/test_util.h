/* A minimal test harness: CHECK records a failure and goes on; main returns
 * ts_test_report(), which prints "N passed, N failed" and the exit code (a failure when
 * no check ran at all). Also random inputs that repeat from run to run, scratch
 * directories, and llama configs built in code. */
#ifndef TS_TEST_UTIL_H
#define TS_TEST_UTIL_H

#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/config.h"
#include "core/error.h"

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

/* A test in which no CHECK ran fails: it would pass having tested nothing. (A test
 * that cannot run here returns 77 instead, which CTest reports as skipped.) */
static inline int ts_test_report(void)
{
    printf("%d passed, %d failed\n", ts_test_passed, ts_test_failed);
    if (ts_test_passed + ts_test_failed == 0) {
        fprintf(stderr, "FAIL: no checks ran\n");
        return 1;
    }
    return ts_test_failed == 0 ? 0 : 1;
}

/* Every order of the grid's four axes ("tp-cp-dp-pp" style, fastest first), Megatron's
 * "tp-cp-dp-pp" first: fills orders[24] and returns 24. */
static inline int ts_test_grid_orders(char orders[24][12])
{
    static const char *const names[4] = { "tp", "cp", "dp", "pp" };
    int n = 0;
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++)
            for (int c = 0; c < 4; c++)
                for (int d = 0; d < 4; d++) {
                    if (a == b || a == c || a == d || b == c || b == d || c == d) continue;
                    snprintf(orders[n++], 12, "%s-%s-%s-%s", names[a], names[b], names[c],
                             names[d]);
                }
    return n;
}

/* Relative error |a-b| / max(|b|, floor). */
static inline double ts_rel_err(double a, double b, double floor_)
{
    double d = fabs(b) > floor_ ? fabs(b) : floor_;
    return fabs(a - b) / d;
}

/* Random inputs: xorshift64, so every run (and machine) draws the same values. One
 * state per test program; a test may seed it (assign ts_test_rng) before its first draw. */
static uint64_t ts_test_rng = 0x9E3779B97F4A7C15ull;

static inline uint64_t ts_test_next_u64(void)
{
    ts_test_rng ^= ts_test_rng << 13;
    ts_test_rng ^= ts_test_rng >> 7;
    ts_test_rng ^= ts_test_rng << 17;
    return ts_test_rng;
}

/* Uniform in [-1, 1). */
static inline float ts_test_frand(void)
{
    return (float)((double)(ts_test_next_u64() >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* n floats uniform in [-scale, scale) (ts_alloc_floats: free them with free). */
static inline float *ts_test_rand_floats(size_t n, float scale)
{
    float *x = ts_alloc_floats(n);
    for (size_t i = 0; i < n; i++) x[i] = scale * ts_test_frand();
    return x;
}

/* Whether a[0..n) and b[0..n) are the same bits. */
static inline int ts_test_same_bits(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof(float)) == 0;
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

/* A llama config as a config file with model.arch = "llama" gives it: the defaults, then
 * the architecture's (RoPE theta 500000, RMSNorm eps 1e-5, untied head). */
/* Read fd to its end (a forked child's stderr) into buf, NUL-terminated, at most
 * size - 1 bytes; then close it. */
static inline void ts_test_read_all(int fd, char *buf, size_t size)
{
    size_t got = 0;
    ssize_t n;
    while (got < size - 1 && (n = read(fd, buf + got, size - 1 - got)) > 0) got += (size_t)n;
    buf[got] = '\0';
    close(fd);
}

static inline void ts_test_llama_config(ts_config *c)
{
    ts_config_defaults(c);
    snprintf(c->model.arch, sizeof c->model.arch, "llama");
    ts_config_arch_defaults(&c->model, "llama");
}

/* The tests' tiny grouped-query llama: 2 layers, C 32, 4 query heads sharing 2 key/value
 * heads, SwiGLU width 48, of the given vocabulary and sequence length (not yet resolved:
 * a test may change more first, then calls ts_config_resolve_model). */
static inline void ts_test_tiny_llama(ts_config *c, int vocab_size, int seq_len)
{
    ts_test_llama_config(c);
    c->model.n_layer = 2;
    c->model.n_head = 4;
    c->model.n_kv_head = 2;
    c->model.n_embd = 32;
    c->model.ffn_hidden = 48;
    c->model.vocab_size = vocab_size;
    c->model.seq_len = seq_len;
}

#endif
