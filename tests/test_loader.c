/* Token data: shard and text files, windows across file boundaries, the batch rule
 * (grid-independent), and every open-time error. */
#include <dirent.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dataset/blend.h"
#include "dataset/files.h"
#include "dataset/loader.h"
#include "dataset/permutation.h"
#include "dataset/sampler.h"
#include "test_util.h"

static char g_dir[256];

/* tokens as a GPT-2 shard (uint16 ids), through the writer `tessera data` uses. */
static ts_status write_gpt2_shard(const char *path, const uint16_t *tokens, uint64_t count)
{
    uint32_t *wide = malloc((size_t)(count ? count : 1) * sizeof *wide);
    if (!wide) return ts_fail("out of memory");
    for (uint64_t i = 0; i < count; i++) wide[i] = tokens[i];
    ts_status st = ts_data_write_tokens(path, wide, count, 65536, TS_SHARD_GPT2);
    free(wide);
    return st;
}

static const char *path_in(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", g_dir, name);
    return buf;
}

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *fp = fopen(path, "wb");
    if (!fp) abort();
    if (n && fwrite(p, 1, n, fp) != n) abort();
    fclose(fp);
}

/* A raw shard with the given header fields and `ntok` tokens 0, 1, 2, ... */
static void write_raw_shard(const char *path, int32_t magic, int32_t version, int32_t count,
                            size_t ntok)
{
    size_t n = 1024 + 2 * ntok;
    unsigned char *buf = calloc(1, n);
    memcpy(buf, &magic, 4);
    memcpy(buf + 4, &version, 4);
    memcpy(buf + 8, &count, 4);
    for (size_t i = 0; i < ntok; i++) {
        uint16_t t = (uint16_t)i;
        memcpy(buf + 1024 + 2 * i, &t, 2);
    }
    write_bytes(path, buf, n);
    free(buf);
}

static int contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

/* Open one file expecting failure with a message containing the path and `what`. */
static void expect_reject(const char *path, int vocab, const char *what)
{
    ts_dataset ds;
    ts_error_clear();
    ts_status s = ts_data_open(&ds, &path, 1, vocab);
    const char *msg = ts_error_message();
    CHECKF(s == TS_ERR, "%s: accepted", path);
    CHECKF(contains(msg, path), "message lacks the path: %s", msg);
    CHECKF(contains(msg, what), "message lacks '%s': %s", what, msg);
    CHECK(ds.n_shards == 0 && ds.shards == NULL);
    ts_data_close(&ds);
}

static void test_loader_write_and_read_shard(void)
{
    enum { N = 1000 };
    uint16_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (uint16_t)((i * 7919) % 50257);
    char path[512];
    path_in(path, sizeof path, "a.bin");
    CHECK(write_gpt2_shard(path, tok, N) == TS_OK);

    /* Header and size exactly as llm.c writes them. */
    FILE *fp = fopen(path, "rb");
    int32_t hdr[256];
    CHECK(fp && fread(hdr, 4, 256, fp) == 256);
    CHECK(hdr[0] == 20240520 && hdr[1] == 1 && hdr[2] == N);
    int zeros = 1;
    for (int i = 3; i < 256; i++) zeros &= hdr[i] == 0;
    CHECK(zeros);
    fseek(fp, 0, SEEK_END);
    CHECK(ftell(fp) == 1024 + 2 * N);
    fclose(fp);

    const char *paths[] = {path};
    ts_dataset ds;
    CHECKF(ts_data_open(&ds, paths, 1, 50257) == TS_OK, "%s", ts_error_message());
    CHECK(ds.n_shards == 1 && ds.n_tokens == N && !ds.shards[0].is_text);
    int T = 16;
    CHECK(ts_data_num_windows(&ds, T) == (N - 1) / 16);
    int in[16], tg[16];
    ts_data_window(&ds, 5, T, in, tg);
    int good = 1;
    for (int j = 0; j < T; j++) good &= in[j] == tok[5 * T + j] && tg[j] == tok[5 * T + j + 1];
    CHECK(good);
    /* The last window uses the last token as its last target. */
    uint64_t S = ts_data_num_windows(&ds, T);
    ts_data_window(&ds, S - 1, T, in, tg);
    CHECK(tg[T - 1] == tok[(S - 1) * T + T]);
    ts_data_close(&ds);
    CHECK(ds.shards == NULL && ds.n_tokens == 0);

    /* An empty shard is valid (it contributes no tokens). */
    path_in(path, sizeof path, "zero.bin");
    CHECK(write_gpt2_shard(path, NULL, 0) == TS_OK);
    CHECK(ts_data_open(&ds, paths, 1, 256) == TS_OK && ds.n_tokens == 0);
    CHECK(ts_data_num_windows(&ds, 1) == 0);
    ts_data_close(&ds);

    /* No temp files left behind. */
    DIR *d = opendir(g_dir);
    struct dirent *de;
    int tmp_left = 0;
    while ((de = readdir(d))) tmp_left |= contains(de->d_name, ".tmp.");
    closedir(d);
    CHECK(!tmp_left);
}

static void test_loader_text(void)
{
    const char *text = "hello, tessera!\nbytes are tokens \xe2\x9c\x93\n";
    size_t n = strlen(text);
    char tpath[512], spath[512];
    path_in(tpath, sizeof tpath, "t.txt");
    path_in(spath, sizeof spath, "t.bin");
    write_bytes(tpath, text, n);

    /* The text file itself is a data file (vocab 256)... */
    const char *p1[] = {tpath};
    ts_dataset ds;
    CHECKF(ts_data_open(&ds, p1, 1, 256) == TS_OK, "%s", ts_error_message());
    CHECK(ds.shards[0].is_text && ds.n_tokens == n);
    int in[4], tg[4];
    ts_data_window(&ds, 1, 4, in, tg);
    CHECK(in[0] == 'o' && in[1] == ',' && in[3] == 't' && tg[3] == 'e');
    ts_data_close(&ds);

    /* ... and `tessera data` turns it into the same tokens as a shard. */
    CHECK(ts_data_write_text_shard(tpath, spath, TS_SHARD_AUTO) == TS_OK);
    const char *p2[] = {spath};
    CHECK(ts_data_open(&ds, p2, 1, 256) == TS_OK);
    CHECK(!ds.shards[0].is_text && ds.n_tokens == n);
    int T = 5, good = 1;
    for (uint64_t k = 0; k < ts_data_num_windows(&ds, T); k++) {
        int a[5], b[5];
        ts_data_window(&ds, k, T, a, b);
        for (int j = 0; j < T; j++)
            good &= a[j] == (unsigned char)text[k * T + j] &&
                    b[j] == (unsigned char)text[k * T + j + 1];
    }
    CHECK(good);
    ts_data_close(&ds);

    /* Text tokens above a small vocab are rejected with the position. */
    expect_reject(tpath, 110, "token 111 at position 4 is >= vocab_size 110");

    char e[512];
    path_in(e, sizeof e, "empty.txt");
    write_bytes(e, "", 0);
    CHECK(ts_data_write_text_shard(e, spath, TS_SHARD_AUTO) == TS_ERR && contains(ts_error_message(), "empty"));
    path_in(e, sizeof e, "missing.txt");
    CHECK(ts_data_write_text_shard(e, spath, TS_SHARD_AUTO) == TS_ERR &&
          contains(ts_error_message(), "No such file"));
}

/* Reference stream: A = 10 tokens, an empty shard, B = 13 tokens, C = a 5-byte text. */
static void test_loader_multi_file_stream(void)
{
    uint16_t a[10], b[13];
    int ref[28];
    for (int i = 0; i < 10; i++) ref[i] = a[i] = (uint16_t)(100 + i);
    for (int i = 0; i < 13; i++) ref[10 + i] = b[i] = (uint16_t)(200 + i);
    const char *c = "vwxyz";
    for (int i = 0; i < 5; i++) ref[23 + i] = c[i];
    char pa[512], pe[512], pb[512], pc[512];
    path_in(pa, sizeof pa, "m_a.bin");
    path_in(pe, sizeof pe, "m_e.bin");
    path_in(pb, sizeof pb, "m_b.bin");
    path_in(pc, sizeof pc, "m_c.txt");
    CHECK(write_gpt2_shard(pa, a, 10) == TS_OK);
    CHECK(write_gpt2_shard(pe, NULL, 0) == TS_OK);
    CHECK(write_gpt2_shard(pb, b, 13) == TS_OK);
    write_bytes(pc, c, 5);
    const char *paths[] = {pa, pe, pb, pc};
    ts_dataset ds;
    CHECKF(ts_data_open(&ds, paths, 4, 256) == TS_OK, "%s", ts_error_message());
    CHECK(ds.n_shards == 4 && ds.n_tokens == 28);
    CHECK(ds.shards[0].first_token == 0 && ds.shards[1].first_token == 10 &&
          ds.shards[2].first_token == 10 && ds.shards[3].first_token == 23);
    for (int T = 1; T <= 27; T++) {
        uint64_t S = ts_data_num_windows(&ds, T);
        CHECK(S == (uint64_t)(27 / T));
        int good = 1;
        int in[32], tg[32];
        for (uint64_t k = 0; k < S; k++) {
            ts_data_window(&ds, k, T, in, tg);
            for (int j = 0; j < T; j++)
                good &= in[j] == ref[k * T + j] && tg[j] == ref[k * T + j + 1];
        }
        CHECKF(good, "T=%d", T);
    }
    CHECK(ts_data_num_windows(&ds, 28) == 0);
    /* T = 4: window 2 is tokens 8..12, crossing from A (and the empty shard) into B. */
    int in[4], tg[4];
    ts_data_window(&ds, 2, 4, in, tg);
    CHECK(in[0] == 108 && in[1] == 109 && in[2] == 200 && in[3] == 201 && tg[3] == 202);
    ts_data_close(&ds);
}

/* A sampler over `n` patterns of dataset set_of[i] (NULL: one dataset). */
static ts_status open_sampler(ts_sampler *s, const char *const *patterns, int n, const int *set_of,
                              int n_sets, const double *weights, bool shuffle, uint64_t seed,
                              int vocab, int T)
{
    const ts_sampler_spec spec = {.key = "data.train", .patterns = patterns, .n_patterns = n,
                                  .set_of = set_of, .n_sets = n_sets, .weights = weights,
                                  .shuffle = shuffle, .seed = seed, .vocab_size = vocab,
                                  .seq_len = T};
    return ts_sampler_open(s, &spec);
}

/* The union over dp ranks and micro-batches of a step is the dp=1 batch, in order, for
 * every (shuffle, blend); unshuffled, sequence g takes window g mod S. */
static void check_batch_rule(ts_sampler *ds, int T, int B, int plain, uint64_t S)
{
    enum { MAXB = 12, MAXT = 8 };
    TS_ASSERT(B <= MAXB && T <= MAXT);
    static int want_in[MAXB * MAXT], want_tg[MAXB * MAXT], got_in[MAXB * MAXT], got_tg[MAXB * MAXT];
    const int dps[] = {1, 2, 3, 4, 6, 12};
    int all_good = 1, ref_good = 1;
    const size_t bytes = (size_t)B * T * sizeof(int);
    for (int64_t step = 0; step < 25; step++) {
        ts_data_microbatch(ds, step * B, B, 1, 0, B, 0, T, want_in, want_tg);
        for (int i = 0; plain && i < B; i++) {
            uint64_t w = ((uint64_t)step * B + (uint64_t)i) % S;
            for (int j = 0; j < T; j++)
                ref_good &= want_in[i * T + j] == (int)(w * T + j) &&
                            want_tg[i * T + j] == (int)(w * T + j + 1);
        }
        for (size_t di = 0; di < sizeof dps / sizeof dps[0]; di++) {
            int dp = dps[di], per = B / dp;
            if (B % dp) continue;
            for (int micro = 1; micro <= per; micro++) {
                if (per % micro) continue;
                int at = 0;
                /* Out of order, as a pipeline schedule loads: last rank first. */
                for (int r = dp - 1; r >= 0; r--)
                    for (int mb = per / micro - 1; mb >= 0; mb--) {
                        at = r * per + mb * micro;
                        ts_data_microbatch(ds, step * B, B, dp, r, micro, mb, T, got_in + at * T,
                                           got_tg + at * T);
                    }
                int same = memcmp(got_in, want_in, bytes) == 0 && memcmp(got_tg, want_tg, bytes) == 0;
                if (!same) fprintf(stderr, "step %ld dp %d micro %d differs\n", (long)step, dp, micro);
                all_good &= same;
            }
        }
    }
    CHECK(ref_good);
    CHECK(all_good);
}

static void test_loader_batch_rule(void)
{
    enum { N = 1000, T = 8, B = 12 };
    uint16_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (uint16_t)i;
    char path[512];
    path_in(path, sizeof path, "batch.bin");
    CHECK(write_gpt2_shard(path, tok, N) == TS_OK);
    const char *paths[] = {path};
    ts_sampler ds;
    CHECK(open_sampler(&ds, paths, 1, NULL, 1, NULL, false, 0, 1024, T) == TS_OK);
    uint64_t S = ds.windows[0];
    CHECK(S == (N - 1) / T); /* 124 windows: steps wrap after ~10 steps */
    check_batch_rule(&ds, T, B, 1, S);
    /* Wrap-around explicitly: step 10 sequence 4 is g = 124, window 0. */
    int in[T], tg[T];
    ts_data_microbatch(&ds, 10 * B, B, 2, 0, 1, 4, T, in, tg);
    CHECK(in[0] == 0 && tg[0] == 1);
    ts_sampler_close(&ds);

    /* Shuffled: still grid-independent; every window once per epoch (124 windows =
     * steps 0..9 and 4 sequences of step 10), and not in file order. */
    CHECK(open_sampler(&ds, paths, 1, NULL, 1, NULL, true, 7, 1024, T) == TS_OK);
    check_batch_rule(&ds, T, B, 0, S);
    static int seen[(N - 1) / T];
    memset(seen, 0, sizeof seen);
    int in_order = 0;
    for (uint64_t g = 0; g < S; g++) {
        ts_data_microbatch(&ds, (int64_t)(g / B * B), B, B, (int)(g % B), 1, 0, T, in, tg);
        CHECK(in[0] % T == 0 && in[0] / T < (int)S);
        seen[in[0] / T]++;
        in_order += in[0] / T == (int)g;
    }
    int once = 1;
    for (uint64_t w = 0; w < S; w++) once &= seen[w] == 1;
    CHECK(once);
    CHECK(in_order < 10);
    ts_sampler_close(&ds);
}

/* The epoch permutation: a bijection of [0, n) for many n, keyed by seed and epoch, far
 * from the identity. */
static void test_loader_permutation(void)
{
    const uint64_t sizes[] = {1, 2, 3, 5, 1000, 4096, 4097, (1u << 20) + 7};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        const uint64_t n = sizes[k];
        unsigned char *hit = calloc((size_t)n, 1);
        ts_perm p;
        ts_perm_init(&p, n, 1234, 0, 0);
        int ok = 1;
        uint64_t fixed = 0;
        for (uint64_t x = 0; x < n; x++) {
            const uint64_t y = ts_perm_apply(&p, x);
            ok &= y < n && !hit[y];
            if (y < n) hit[y] = 1;
            fixed += y == x;
        }
        CHECKF(ok, "n = %llu: not a bijection", (unsigned long long)n);
        if (n >= 1000) CHECKF(fixed < 10, "n = %llu: %llu fixed points", (unsigned long long)n,
                              (unsigned long long)fixed);
        free(hit);
    }
    /* Another epoch, seed or dataset: another order. */
    enum { n = 1000 };
    ts_perm a, b, c, d;
    ts_perm_init(&a, n, 1234, 0, 0);
    ts_perm_init(&b, n, 1234, 0, 1);
    ts_perm_init(&c, n, 1235, 0, 0);
    ts_perm_init(&d, n, 1234, 1, 0);
    int ab = 0, ac = 0, ad = 0;
    for (uint64_t x = 0; x < n; x++) {
        const uint64_t y = ts_perm_apply(&a, x);
        ab += y == ts_perm_apply(&b, x);
        ac += y == ts_perm_apply(&c, x);
        ad += y == ts_perm_apply(&d, x);
    }
    CHECKF(ab < 10 && ac < 10 && ad < 10, "agreements %d %d %d", ab, ac, ad);
    /* Deterministic: the same key, the same values. */
    ts_perm a2;
    ts_perm_init(&a2, n, 1234, 0, 0);
    CHECK(ts_perm_apply(&a2, 17) == ts_perm_apply(&a, 17));
}

/* Megatron's rule (helpers.cpp build_blending_indices), the values its loop gives. */
static void test_loader_blend(void)
{
    ts_blend b;
    const double w3[] = {0.5, 0.3, 0.2};
    ts_blend_init(&b, 3, w3);
    const int want_d[] = {0, 1, 2, 0, 1, 0, 2, 0, 1, 0, 0, 1};
    const uint64_t want_j[] = {0, 0, 0, 1, 1, 2, 1, 3, 2, 4, 5, 3};
    int ok = 1;
    for (int g = 0; g < 12; g++) {
        int d;
        uint64_t j;
        ts_blend_next(&b, &d, &j);
        ok &= d == want_d[g] && j == want_j[g];
    }
    CHECK(ok);
    CHECK(b.count[0] == 6 && b.count[1] == 4 && b.count[2] == 2);
    /* Unnormalised weights are normalised; shares converge (within a sample). */
    const double w2[] = {7, 3};
    ts_blend_init(&b, 2, w2);
    ts_blend_seek(&b, 100000);
    CHECK(b.count[0] == 70000 && b.count[1] == 30000);
    /* Seeking back replays: the same assignment. */
    ts_blend_seek(&b, 3);
    int d;
    uint64_t j;
    ts_blend_next(&b, &d, &j);
    CHECK(d == 0 && j == 2); /* g = 3 of [0.7, 0.3]: 0, 1, 0, 0 */
}

/* The replay the cursor replaces at a resume, kept here as the oracle: Megatron's rule
 * from sequence 0 to g, one sequence at a time. */
static void blend_replay(ts_blend *b, uint64_t g)
{
    int d;
    uint64_t j;
    while (b->g < g) ts_blend_next(b, &d, &j);
}

/* splitmix64, for reproducible random weights and positions. */
static uint64_t mix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A resume restores the blend's cursor (ts_blend_restore) instead of replaying it: for
 * random weight sets (2 to 16 datasets, some very skewed) and positions up to ~1e6 the
 * restored cursor makes the replay's next choices, and counts this rule could not have
 * reached are refused (probe: the replay took 8 s at 3.2e8 sequences). */
static void test_loader_blend_restore(void)
{
    uint64_t x = 42;
    int ok = 1, accepted = 1, refused = 1;
    for (int trial = 0; trial < 40; trial++) {
        const int n = 2 + (int)(mix(&x) % (TS_MAX_DATASETS - 1));
        double w[TS_MAX_DATASETS];
        for (int d = 0; d < n; d++) {
            const double u = (double)(mix(&x) >> 11) / 9007199254740992.0 + 1e-3;
            w[d] = trial % 3 == 0 ? u * u * u * u : u; /* every third: skewed */
        }
        ts_blend oracle, fast;
        ts_blend_init(&oracle, n, w);
        /* Several positions along one replay, the last near 1e6. */
        for (int k = 0; k < 4; k++) {
            const uint64_t g = oracle.g + 1 + mix(&x) % (trial < 4 ? 300000u : 30000u);
            blend_replay(&oracle, g);
            ts_blend_init(&fast, n, w);
            accepted &= ts_blend_restore(&fast, g, oracle.count);
            ts_blend probe = oracle;
            for (int i = 0; i < 64; i++) {
                int d1, d2;
                uint64_t j1, j2;
                ts_blend_next(&probe, &d1, &j1);
                ts_blend_next(&fast, &d2, &j2);
                ok &= d1 == d2 && j1 == j2;
            }
            for (int d = 0; d < n; d++) ok &= probe.count[d] == fast.count[d];
            /* Forged: one sequence moved between datasets far from their share, or a
             * sum that is not g. */
            uint64_t bad[TS_MAX_DATASETS];
            memcpy(bad, oracle.count, sizeof bad);
            const uint64_t shift = (uint64_t)n + 2 < bad[0] ? (uint64_t)n + 2 : bad[0];
            bad[0] -= shift;
            bad[1] += shift;
            ts_blend_init(&fast, n, w);
            refused &= shift < (uint64_t)n + 2 || !ts_blend_restore(&fast, g, bad);
            bad[1] += 1;
            refused &= !ts_blend_restore(&fast, g, bad) && fast.g == 0;
        }
    }
    CHECK(ok);
    CHECK(accepted);
    CHECK(refused);
    /* Counts that would wrap a 64-bit sum are refused, not accepted modulo 2^64. */
    const double w2[] = {1, 1};
    ts_blend b;
    ts_blend_init(&b, 2, w2);
    const uint64_t wrap[] = {UINT64_MAX, 9};
    CHECK(!ts_blend_restore(&b, 8, wrap));
}

/* Weights are normalised as Megatron does (weight / sum, bit for bit), and a sum past
 * DBL_MAX by the largest weight first (probe D10: 1.7e308 + 1.0e308 gave zeros, and the
 * rule then fell back to round robin). */
static void test_loader_blend_weights(void)
{
    const double huge[] = {1.7e308, 1.0e308};
    double out[2];
    ts_blend_normalise(2, huge, out);
    CHECKF(fabs(out[0] - 1.7 / 2.7) < 1e-15 && fabs(out[1] - 1.0 / 2.7) < 1e-15, "%g %g",
           out[0], out[1]);
    ts_blend b;
    ts_blend_init(&b, 2, huge);
    ts_blend_seek(&b, 2700);
    CHECKF(b.count[0] == 1700 && b.count[1] == 1000, "%llu %llu",
           (unsigned long long)b.count[0], (unsigned long long)b.count[1]);
    uint64_t x = 7;
    int same = 1;
    for (int trial = 0; trial < 200; trial++) {
        double w[5], sum = 0.0;
        for (int d = 0; d < 5; d++) sum += w[d] = (double)(mix(&x) >> 11) * 1e-10 + 1e-300;
        double o5[5];
        ts_blend_normalise(5, w, o5);
        for (int d = 0; d < 5; d++) same &= o5[d] == w[d] / sum;
    }
    CHECK(same);
}

/* A two-dataset blend through the sampler: grid-independent, each dataset's windows. */
static void test_loader_blend_sampler(void)
{
    enum { T = 4, B = 12 };
    char pa[512], pb[512];
    uint16_t ta[400], tb[200];
    for (int i = 0; i < 400; i++) ta[i] = (uint16_t)(i % 300);
    for (int i = 0; i < 200; i++) tb[i] = (uint16_t)(500 + i);
    CHECK(write_gpt2_shard(path_in(pa, sizeof pa, "blend_a.bin"), ta, 400) == TS_OK);
    CHECK(write_gpt2_shard(path_in(pb, sizeof pb, "blend_b.bin"), tb, 200) == TS_OK);
    const char *paths[] = {pa, pb};
    const int set_of[] = {0, 1};
    const double w[] = {0.75, 0.25};
    ts_sampler s;
    CHECKF(open_sampler(&s, paths, 2, set_of, 2, w, true, 3, 1024, T) == TS_OK, "%s",
           ts_error_message());
    check_batch_rule(&s, T, B, 0, 0);
    int in[B * T], tg[B * T], from_b = 0;
    ts_data_microbatch(&s, 4 * B, B, 1, 0, B, 0, T, in, tg);
    for (int i = 0; i < B; i++) from_b += in[i * T] >= 500;
    CHECK(from_b == 3);
    ts_sampler_prepare(&s, 9 * B, B);
    uint64_t counts[2];
    ts_sampler_counts(&s, counts);
    CHECK(counts[0] == 90 && counts[1] == 30);
    ts_sampler_close(&s);
}

/* Globs: sorted matches, a pattern matching nothing named, literal paths as they are. */
static void test_loader_globs(void)
{
    char p[512], pat[512];
    uint16_t tok[40];
    for (int i = 0; i < 40; i++) tok[i] = (uint16_t)i;
    const char *names[] = {"g_10.bin", "g_2.bin", "g_1.bin"};
    for (int i = 0; i < 3; i++) CHECK(write_gpt2_shard(path_in(p, sizeof p, names[i]), tok, 40) == TS_OK);
    const char *pats[] = {path_in(pat, sizeof pat, "g_*.bin")};
    char **out = NULL;
    int n = 0;
    CHECK(ts_data_expand("data.train", pats, 1, &out, &n) == TS_OK && n == 3);
    CHECK(n == 3 && contains(out[0], "/g_1.bin") && contains(out[1], "/g_10.bin") &&
          contains(out[2], "/g_2.bin"));
    ts_data_free_paths(out, n);
    char none[512];
    const char *bad[] = {path_in(none, sizeof none, "nothing_*.bin")};
    CHECK(ts_data_expand("data.val", bad, 1, &out, &n) == TS_ERR);
    CHECK(contains(ts_error_message(), "data.val: the pattern") &&
          contains(ts_error_message(), "nothing_*.bin\" matches no file"));
    ts_dataset ds;
    CHECK(ts_data_open_patterns(&ds, "data.train", pats, 1, 256) == TS_OK && ds.n_shards == 3 &&
          ds.n_tokens == 120);
    ts_data_close(&ds);
    /* A literal path keeps its own error. */
    char lit[512];
    const char *missing[] = {path_in(lit, sizeof lit, "absent.bin")};
    CHECK(ts_data_open_patterns(&ds, "data.train", missing, 1, 256) == TS_ERR &&
          contains(ts_error_message(), "No such file or directory"));
}

/* Validation windows spread over the stream: floor(i S / n). */
static void test_loader_val_windows(void)
{
    CHECK(ts_data_val_window(0, 4, 100) == 0 && ts_data_val_window(1, 4, 100) == 25 &&
          ts_data_val_window(3, 4, 100) == 75);
    CHECK(ts_data_val_window(2, 3, 10) == 6);               /* floor(20/3) */
    CHECK(ts_data_val_window(4, 5, 2) == 1);                /* more windows than S: repeats */
    const uint64_t big = 1ull << 40;                         /* no overflow of i*S */
    CHECK(ts_data_val_window(999999, 1000000, big) == (uint64_t)((long double)999999 * big / 1000000));
}

static void test_loader_errors(void)
{
    char p[512];
    ts_dataset ds;

    /* Missing file: says how to fix it. */
    path_in(p, sizeof p, "nope.bin");
    expect_reject(p, 256, "No such file or directory (set data.train or create it with "
                          "`tessera data TEXT OUT.bin`)");
    /* A directory. */
    expect_reject(g_dir, 256, "not a regular file");
    /* Empty file. */
    path_in(p, sizeof p, "empty.bin");
    write_bytes(p, "", 0);
    expect_reject(p, 256, "is empty");
    /* Wrong version. */
    path_in(p, sizeof p, "v2.bin");
    write_raw_shard(p, 20240520, 2, 10, 10);
    expect_reject(p, 256, "shard version 2, expected 1");
    /* Magic in the wrong byte order; Llama-3 magic. */
    path_in(p, sizeof p, "be.bin");
    write_raw_shard(p, (int32_t)__builtin_bswap32(20240520), 1, 10, 10);
    expect_reject(p, 256, "big-endian");
    path_in(p, sizeof p, "llama3be.bin");
    write_raw_shard(p, (int32_t)__builtin_bswap32(20240801), 7, 10, 10);
    expect_reject(p, 256, "magic 20240801 in big-endian");
    /* A Llama-3 header over uint16 tokens is the wrong size; a GPT-2 version is wrong. */
    path_in(p, sizeof p, "llama3.bin");
    write_raw_shard(p, 20240801, 7, 10, 10);
    expect_reject(p, 256, "is truncated: header says 10 tokens (1064 bytes) but the file has "
                          "1044 bytes");
    write_raw_shard(p, 20240801, 1, 10, 20);
    expect_reject(p, 256, "shard version 1, expected 7 (an llm.c Llama-3 shard with uint32 "
                          "tokens");
    /* Size mismatch both ways. */
    path_in(p, sizeof p, "trunc.bin");
    write_raw_shard(p, 20240520, 1, 100, 90);
    expect_reject(p, 256, "is truncated: header says 100 tokens (1224 bytes) but the file has "
                          "1204 bytes");
    path_in(p, sizeof p, "long.bin");
    write_raw_shard(p, 20240520, 1, 90, 100);
    expect_reject(p, 256, "header says 90 tokens (1204 bytes) but the file has 1224 bytes");
    path_in(p, sizeof p, "neg.bin");
    write_raw_shard(p, 20240520, 1, -5, 0);
    expect_reject(p, 256, "negative token count");
    /* Magic, then less than a header. */
    path_in(p, sizeof p, "short.bin");
    int32_t h[3] = {20240520, 1, 0};
    write_bytes(p, h, sizeof h);
    expect_reject(p, 256, "less than the 1024-byte header");
    /* Token >= vocab_size, with its position. */
    path_in(p, sizeof p, "vocab.bin");
    uint16_t tok[10] = {1, 2, 3, 4, 5, 6, 7, 600, 9, 10};
    CHECK(write_gpt2_shard(p, tok, 10) == TS_OK);
    expect_reject(p, 500, "token 600 at position 7 is >= vocab_size 500 (is model.vocab_size "
                          "right for this data?)");
    const char *one[] = {p};
    CHECK(ts_data_open(&ds, one, 1, 601) == TS_OK);
    ts_data_close(&ds);

    /* A failure in the second file releases the first. */
    char good[512], bad[512];
    path_in(good, sizeof good, "good.bin");
    path_in(bad, sizeof bad, "nope2.bin");
    CHECK(write_gpt2_shard(good, tok, 10) == TS_OK);
    const char *two[] = {good, bad};
    CHECK(ts_data_open(&ds, two, 2, 1024) == TS_ERR && ds.shards == NULL);
    CHECK(contains(ts_error_message(), bad));
    CHECK(ts_data_open(&ds, two, 0, 1024) == TS_ERR);

    /* Too short for one window: N = T gives none, N = T + 1 gives one. */
    path_in(p, sizeof p, "short.txt");
    write_bytes(p, "abcdefgh", 8);
    const char *sp[] = {p};
    CHECK(ts_data_open(&ds, sp, 1, 256) == TS_OK);
    CHECK(ts_data_num_windows(&ds, 8) == 0);
    CHECK(ts_data_num_windows(&ds, 7) == 1);
    CHECK(ts_data_num_windows(&ds, 100) == 0);
    ts_data_close(&ds);

    /* Writer errors. */
    CHECK(write_gpt2_shard("/nonexistent_dir_ts/x.bin", tok, 10) == TS_ERR);
    CHECK(contains(ts_error_message(), "/nonexistent_dir_ts/x.bin"));
}

/* Shard or text: a file without the shard magic is text only if it looks like text (no
 * NUL byte in its first 4 KiB, not named *.bin); a damaged shard is an error that shows
 * its header, never silently trained on as bytes. */
static void test_loader_text_or_shard(void)
{
    char p[512];
    ts_dataset ds;

    /* The review's D_magic: one bit of the magic flipped (20240521). */
    path_in(p, sizeof p, "magic.bin");
    write_raw_shard(p, 20240521, 1, 600, 600);
    expect_reject(p, 256, "magic 20240521 (expected 20240520), version 1, token count 600");
    expect_reject(p, 256, "the file size fits that count");
    expect_reject(p, 256, "tessera data TEXT OUT.bin");
    /* The same bytes under another name: still not text (NUL bytes). */
    path_in(p, sizeof p, "magic.dat");
    write_raw_shard(p, 20240521, 1, 600, 600);
    expect_reject(p, 256, "NUL byte at offset 5");
    /* A damaged magic and a damaged count: the header is shown as it is. */
    path_in(p, sizeof p, "garbled.bin");
    write_raw_shard(p, 0x7fffffff, 3, -1, 600);
    expect_reject(p, 256, "magic 2147483647 (expected 20240520), version 3, token count -1;");
    /* UTF-16 text has NUL bytes too. */
    path_in(p, sizeof p, "utf16.txt");
    {
        unsigned char u16[2048];
        for (int i = 0; i < 1024; i++) {
            u16[2 * i] = (unsigned char)('a' + i % 26);
            u16[2 * i + 1] = 0;
        }
        write_bytes(p, u16, sizeof u16);
    }
    expect_reject(p, 256, "NUL byte at offset 1");
    /* Text named *.bin is not taken for text. */
    path_in(p, sizeof p, "text.bin");
    write_bytes(p, "plain text under a shard's name\n", 32);
    expect_reject(p, 256, "is named *.bin");

    /* Valid text keeps working: UTF-8 longer than the 4 KiB looked at, any name. */
    static char text[10000];
    const char *line = "caf\xc3\xa9 na\xc3\xafve \xe2\x9c\x93 \xf0\x9f\x98\x80 plain ASCII too\n";
    size_t n = 0, len = strlen(line);
    while (n + len < sizeof text) memcpy(text + n, line, len), n += len;
    const char *names[] = {"utf8.txt", "utf8", "utf8.bin.txt", "UTF8.TXT"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        path_in(p, sizeof p, names[i]);
        write_bytes(p, text, n);
        const char *one[] = {p};
        CHECKF(ts_data_open(&ds, one, 1, 256) == TS_OK, "%s", ts_error_message());
        CHECK(ds.n_shards == 1 && ds.shards[0].is_text && ds.n_tokens == n);
        ts_data_close(&ds);
    }
    /* A file shorter than a shard header cannot be a damaged shard: read as bytes. */
    path_in(p, sizeof p, "tiny.txt");
    write_bytes(p, "\x01\x00\x00\x00", 4);
    const char *tiny[] = {p};
    CHECKF(ts_data_open(&ds, tiny, 1, 256) == TS_OK, "%s", ts_error_message());
    CHECK(ds.n_tokens == 4 && ds.shards[0].is_text);
    ts_data_close(&ds);

    /* The hint for a missing file names the key it came from. */
    path_in(p, sizeof p, "no_val.bin");
    const char *val[] = {p};
    CHECK(ts_data_open_key(&ds, "data.val", val, 1, 256) == TS_ERR);
    CHECKF(contains(ts_error_message(), "(set data.val or create it"), "%s", ts_error_message());
    CHECK(!contains(ts_error_message(), "data.train"));
}

/* No temp file "NAME.tmp.PID" left in the scratch directory. */
static int no_temp_files(void)
{
    DIR *d = opendir(g_dir);
    struct dirent *de;
    int left = 0;
    while ((de = readdir(d))) left |= contains(de->d_name, ".tmp.");
    closedir(d);
    return !left;
}

/* `tessera data` refuses, before writing anything, outputs it would destroy and inputs
 * that are not text (the review's T12, T13, T15, T16). */
static void test_loader_write_refusals(void)
{
    char text[512], out[512], p[600], q[640];
    path_in(text, sizeof text, "w.txt");
    const char *body = "some text to tokenize\n";
    write_bytes(text, body, strlen(body));
    uint16_t tok[4] = {1, 2, 3, 4};

    /* T15: an output that exists and is not a regular file stays what it is. */
    path_in(p, sizeof p, "fifo");
    CHECK(mkfifo(p, 0600) == 0);
    CHECK(ts_data_write_text_shard(text, p, TS_SHARD_AUTO) == TS_ERR);
    CHECKF(contains(ts_error_message(), "is a pipe, not a regular file"), "%s", ts_error_message());
    CHECK(write_gpt2_shard(p, tok, 4) == TS_ERR);
    struct stat sb;
    CHECK(stat(p, &sb) == 0 && S_ISFIFO(sb.st_mode));
    unlink(p);
    path_in(p, sizeof p, "adir");
    CHECK(mkdir(p, 0700) == 0);
    CHECK(ts_data_write_text_shard(text, p, TS_SHARD_AUTO) == TS_ERR);
    CHECKF(contains(ts_error_message(), "is a directory, not a regular file"), "%s",
           ts_error_message());

    /* T16: a directory given with a trailing slash; a path through a file. */
    snprintf(q, sizeof q, "%s/", p);
    CHECK(ts_data_write_text_shard(text, q, TS_SHARD_AUTO) == TS_ERR);
    CHECKF(contains(ts_error_message(), "ends in '/'"), "%s", ts_error_message());
    rmdir(p);
    snprintf(q, sizeof q, "%s/x.bin", text);
    CHECK(ts_data_write_text_shard(text, q, TS_SHARD_AUTO) == TS_ERR);
    snprintf(p, sizeof p, "%s is a file, not a directory", text);
    CHECKF(contains(ts_error_message(), p), "%s", ts_error_message());
    path_in(q, sizeof q, "no_such_dir/sub/x.bin");
    CHECK(ts_data_write_text_shard(text, q, TS_SHARD_AUTO) == TS_ERR);
    path_in(p, sizeof p, "no_such_dir");
    CHECKF(contains(ts_error_message(), p) && contains(ts_error_message(), "does not exist"),
           "%s", ts_error_message());
    CHECK(access(p, F_OK) != 0); /* nothing created */

    /* T13: the output is the input (same path, or another name for the same inode). */
    CHECK(ts_data_write_text_shard(text, text, TS_SHARD_AUTO) == TS_ERR);
    CHECKF(contains(ts_error_message(), "same file"), "%s", ts_error_message());
    path_in(p, sizeof p, "w_link.txt");
    CHECK(link(text, p) == 0);
    CHECK(ts_data_write_text_shard(text, p, TS_SHARD_AUTO) == TS_ERR);
    CHECKF(contains(ts_error_message(), "same file"), "%s", ts_error_message());
    unlink(p);
    path_in(p, sizeof p, "w_sym.txt");
    CHECK(symlink(text, p) == 0);
    CHECK(ts_data_write_text_shard(text, p, TS_SHARD_AUTO) == TS_ERR);
    unlink(p);
    {
        char back[64] = {0};
        FILE *f = fopen(text, "rb");
        CHECK(f && fread(back, 1, sizeof back - 1, f) == strlen(body));
        if (f) fclose(f);
        CHECK(strcmp(back, body) == 0); /* the text is untouched */
    }

    /* T12: a shard given as the text. */
    path_in(p, sizeof p, "already.bin");
    CHECK(write_gpt2_shard(p, tok, 4) == TS_OK);
    path_in(out, sizeof out, "again.bin");
    CHECK(ts_data_write_text_shard(p, out, TS_SHARD_AUTO) == TS_ERR);
    CHECKF(contains(ts_error_message(), "already an llm.c token shard (magic 20240520, 4 tokens)"),
           "%s", ts_error_message());
    CHECK(access(out, F_OK) != 0);

    /* A regular output is replaced whole, and every refusal left no temp file. */
    write_bytes(out, "old", 3);
    CHECKF(ts_data_write_text_shard(text, out, TS_SHARD_AUTO) == TS_OK, "%s", ts_error_message());
    CHECK(stat(out, &sb) == 0 && (size_t)sb.st_size == 1024 + 2 * strlen(body));
    CHECK(no_temp_files());
}

/* A raw Llama-3 shard: header [20240801, 7, count], then the given uint32 ids. */
static void write_raw_shard32(const char *path, const uint32_t *tok, size_t ntok)
{
    size_t n = 1024 + 4 * ntok;
    unsigned char *buf = calloc(1, n);
    const int32_t hdr[3] = {20240801, 7, (int32_t)ntok};
    memcpy(buf, hdr, sizeof hdr);
    if (ntok) memcpy(buf + 1024, tok, 4 * ntok);
    write_bytes(path, buf, n);
    free(buf);
}

/* Llama 3's shards: uint32 ids beyond 65535 written (automatic above a 65536-token
 * vocabulary, or asked for) and read back exactly, also in one stream with a GPT-2
 * shard; every id is held to the vocabulary on writing and on reading. */
static void test_loader_uint32_shards(void)
{
    enum { N = 1000, V = 128256 };
    uint32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (uint32_t)(((uint64_t)i * 104729u + 65530u) % V);
    tok[3] = V - 1;
    tok[4] = 65536;
    char path[512], g2[512];
    path_in(path, sizeof path, "l3.bin");
    CHECKF(ts_data_write_tokens(path, tok, N, V, TS_SHARD_AUTO) == TS_OK, "%s", ts_error_message());

    /* Header and size as llm.c's Llama 3 writer makes them. */
    FILE *fp = fopen(path, "rb");
    int32_t hdr[256];
    CHECK(fp && fread(hdr, 4, 256, fp) == 256);
    CHECK(hdr[0] == 20240801 && hdr[1] == 7 && hdr[2] == N);
    uint32_t first[5];
    CHECK(fread(first, 4, 5, fp) == 5 && first[3] == V - 1 && first[4] == 65536);
    fseek(fp, 0, SEEK_END);
    CHECK(ftell(fp) == 1024 + 4 * N);
    fclose(fp);

    ts_dataset ds;
    const char *one[] = {path};
    CHECKF(ts_data_open(&ds, one, 1, V) == TS_OK, "%s", ts_error_message());
    CHECK(ds.n_tokens == N && ds.shards[0].token_bytes == 4 && !ds.shards[0].is_text);
    int in[16], tg[16], good = 1, wide = 0;
    for (uint64_t k = 0; k < ts_data_num_windows(&ds, 16); k++) {
        ts_data_window(&ds, k, 16, in, tg);
        for (int j = 0; j < 16; j++) {
            good &= in[j] == (int)tok[k * 16 + j] && tg[j] == (int)tok[k * 16 + j + 1];
            wide += in[j] >= 65536;
        }
    }
    CHECK(good);
    CHECKF(wide > 100, "only %d ids >= 65536 read", wide); /* the test reads wide ids */
    ts_data_close(&ds);

    /* A GPT-2 shard then the Llama-3 one: one stream across the two widths. */
    uint16_t small[10];
    for (int i = 0; i < 10; i++) small[i] = (uint16_t)(60000 + i);
    path_in(g2, sizeof g2, "g2.bin");
    CHECK(write_gpt2_shard(g2, small, 10) == TS_OK);
    const char *two[] = {g2, path};
    CHECKF(ts_data_open(&ds, two, 2, V) == TS_OK, "%s", ts_error_message());
    CHECK(ds.n_tokens == 10 + N);
    ts_data_window(&ds, 0, 16, in, tg);
    CHECK(in[9] == 60009 && in[10] == (int)tok[0] && tg[9] == (int)tok[0] && in[13] == V - 1);
    ts_data_close(&ds);

    /* Reading with a smaller vocabulary: the first id too large, by file and position. */
    expect_reject(path, 100000, "token 128255 at position 3 is >= vocab_size 100000");
    /* An id no vocabulary has (the top bit set: no int holds it). */
    uint32_t bad[4] = {1, 2, 0xffffffffu, 3};
    path_in(path, sizeof path, "l3bad.bin");
    write_raw_shard32(path, bad, 4);
    expect_reject(path, V, "token 4294967295 at position 2 is >= vocab_size 128256");
    /* A Llama-3 header over too few bytes. */
    {
        unsigned char buf[1024 + 8] = {0};
        const int32_t h[3] = {20240801, 7, 4};
        memcpy(buf, h, sizeof h);
        write_bytes(path, buf, sizeof buf);
        expect_reject(path, V, "is truncated: header says 4 tokens (1040 bytes) but the file "
                               "has 1032 bytes");
    }

    /* Writing: an id >= vocab_size is refused by position, nothing is written. */
    path_in(path, sizeof path, "l3refused.bin");
    tok[7] = V;
    ts_error_clear();
    CHECK(ts_data_write_tokens(path, tok, N, V, TS_SHARD_AUTO) == TS_ERR);
    CHECKF(contains(ts_error_message(), "token 128256 at position 7 is >= vocab_size 128256"),
           "%s", ts_error_message());
    tok[7] = 5;
    /* GPT-2's format cannot hold an id >= 65536. */
    ts_error_clear();
    CHECK(ts_data_write_tokens(path, tok, N, V, TS_SHARD_GPT2) == TS_ERR);
    CHECKF(contains(ts_error_message(), "token 128255 at position 3 does not fit a GPT-2 "
                                        "shard's uint16 ids"),
           "%s", ts_error_message());
    CHECK(access(path, F_OK) != 0);
    /* AUTO with a vocabulary that fits 16 bits writes GPT-2's format. */
    uint32_t few[3] = {1, 65535, 7};
    CHECK(ts_data_write_tokens(path, few, 3, 65536, TS_SHARD_AUTO) == TS_OK);
    struct stat sb;
    CHECK(stat(path, &sb) == 0 && sb.st_size == 1024 + 2 * 3);
    CHECK(ts_data_write_tokens(path, few, 3, 65536, TS_SHARD_LLAMA3) == TS_OK);
    CHECK(stat(path, &sb) == 0 && sb.st_size == 1024 + 4 * 3);

    /* `tessera data --format llama3`: a text's bytes as uint32 ids. */
    char text[512];
    path_in(text, sizeof text, "l3.txt");
    write_bytes(text, "hello, llama", 12);
    path_in(path, sizeof path, "l3text.bin");
    CHECKF(ts_data_write_text_shard(text, path, TS_SHARD_LLAMA3) == TS_OK, "%s", ts_error_message());
    CHECK(stat(path, &sb) == 0 && sb.st_size == 1024 + 4 * 12);
    one[0] = path;
    CHECKF(ts_data_open(&ds, one, 1, 256) == TS_OK, "%s", ts_error_message());
    ts_data_window(&ds, 0, 11, in, tg);
    CHECK(in[0] == 'h' && in[7] == 'l' && tg[10] == 'a');
    ts_data_close(&ds);
    /* ... and such a shard is no text to tokenize again. */
    path_in(g2, sizeof g2, "l3again.bin");
    CHECK(ts_data_write_text_shard(path, g2, TS_SHARD_AUTO) == TS_ERR);
    CHECKF(contains(ts_error_message(), "already an llm.c token shard (magic 20240801, 12 tokens)"),
           "%s", ts_error_message());
    ts_shard_format f;
    CHECK(ts_shard_format_parse("llama3", &f) && f == TS_SHARD_LLAMA3);
    CHECK(ts_shard_format_parse("gpt2", &f) && f == TS_SHARD_GPT2);
    CHECK(!ts_shard_format_parse("uint32", &f));
}

int main(void)
{
    ts_test_make_dir(g_dir, sizeof g_dir, "ts_data");
    test_loader_write_and_read_shard();
    test_loader_text();
    test_loader_multi_file_stream();
    test_loader_batch_rule();
    test_loader_permutation();
    test_loader_blend();
    test_loader_blend_restore();
    test_loader_blend_weights();
    test_loader_blend_sampler();
    test_loader_globs();
    test_loader_val_windows();
    test_loader_errors();
    test_loader_text_or_shard();
    test_loader_write_refusals();
    test_loader_uint32_shards();
    ts_test_remove_dir(g_dir);
    return ts_test_report();
}
