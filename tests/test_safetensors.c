/* safetensors: round trip of every dtype (0-d and empty tensors, metadata), partial
 * reads, rejection of broken files with a clear message, and a light fuzz; model.init
 * from Hugging Face llama weights (BF16 and F16 widened exactly, every name, shape and
 * dtype checked, tied and untied heads, save_pretrained directories, sharded or not). */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <math.h>
#include <sys/stat.h>

#include "checkpoint/load.h"
#include "checkpoint/safetensors.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "support/st_write.h"
#include "test_util.h"

static char g_dir[256];

static void path_in(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", g_dir, name);
}

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *fp = fopen(path, "wb");
    if (!fp) abort();
    if (n && fwrite(p, 1, n, fp) != n) abort();
    fclose(fp);
}

static unsigned char *read_bytes(const char *path, size_t *n)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) abort();
    fseek(fp, 0, SEEK_END);
    long sz = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *p = malloc((size_t)sz + 1);
    if (fread(p, 1, (size_t)sz, fp) != (size_t)sz) abort();
    fclose(fp);
    *n = (size_t)sz;
    return p;
}

/* A raw file: u64 header length `hlen` (or strlen(json) if hlen == UINT64_MAX), the json
 * text, then `data_len` bytes of data. */
static void write_raw(const char *path, const char *json, uint64_t hlen, size_t data_len)
{
    size_t jl = strlen(json);
    if (hlen == UINT64_MAX) hlen = jl;
    size_t n = 8 + jl + data_len;
    unsigned char *buf = calloc(1, n);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(buf + 8, json, jl);
    for (size_t i = 0; i < data_len; i++) buf[8 + jl + i] = (unsigned char)i;
    write_bytes(path, buf, n);
    free(buf);
}

static int contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

static int is_zeroed(const ts_st_file *f)
{
    return !f->path && !f->fp && !f->tensors && !f->meta_keys && f->n_tensors == 0;
}

/* Expect ts_st_open to fail with a message containing the path and `what`. */
static void expect_reject(const char *name, const char *json, uint64_t hlen, size_t data_len,
                          const char *what)
{
    char path[512];
    path_in(path, sizeof path, name);
    write_raw(path, json, hlen, data_len);
    ts_st_file f;
    ts_error_clear();
    ts_status s = ts_st_open(&f, path);
    const char *msg = ts_error_message();
    CHECKF(s == TS_ERR, "%s: accepted", name);
    CHECKF(contains(msg, path), "%s: message lacks the path: %s", name, msg);
    CHECKF(contains(msg, what), "%s: message lacks '%s': %s", name, what, msg);
    CHECK(is_zeroed(&f));
    ts_st_close(&f); /* safe after a failed open */
}

static void test_safetensors_round_trip(void)
{
    float f32[6] = {1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, -7.0f};
    double f64[4] = {1.0, -1e300, 3.14159, 0.0};
    uint16_t f16[3] = {0x3c00, 0xc000, 0x7bff};
    uint16_t bf16[4] = {0x3f80, 0x4000, 0xbf80, 0x0000};
    int64_t i64[1] = {-1234567890123LL}; /* 0-d */
    int32_t i32[5] = {1, -2, 3, -4, 5};
    int16_t i16[2] = {-300, 300};
    int8_t i8[3] = {-128, 0, 127};
    uint8_t u8[7] = {0, 1, 2, 3, 4, 5, 255};
    uint16_t u16[2] = {65535, 1};
    uint8_t bools[3] = {1, 0, 1};
    ts_st_entry e[] = {
        {"transformer.wte.weight", TS_DT_F32, 2, {2, 3}, f32},
        {"f64", TS_DT_F64, 1, {4}, f64},
        {"empty", TS_DT_F32, 2, {0, 5}, NULL},
        {"f16", TS_DT_F16, 2, {3, 1}, f16},
        {"bf16", TS_DT_BF16, 3, {1, 2, 2}, bf16},
        {"scalar", TS_DT_I64, 0, {0}, i64},
        {"i32", TS_DT_I32, 1, {5}, i32},
        {"i16", TS_DT_I16, 1, {2}, i16},
        {"i8", TS_DT_I8, 1, {3}, i8},
        {"u8", TS_DT_U8, 1, {7}, u8},
        {"u16", TS_DT_U16, 1, {2}, u16},
        {"empty2", TS_DT_BF16, 1, {0}, NULL},
        {"bool", TS_DT_BOOL, 1, {3}, bools},
    };
    int n = (int)(sizeof e / sizeof e[0]);
    const char *mk[] = {"format", "step", "note"};
    const char *mv[] = {"pt", "12", "quotes \" and \\ and unicode \xc3\xa9"};
    char path[512];
    path_in(path, sizeof path, "rt.safetensors");
    CHECK(ts_st_write(path, e, n, mk, mv, 3) == TS_OK);

    ts_st_file f;
    CHECKF(ts_st_open(&f, path) == TS_OK, "%s", ts_error_message());
    CHECK(f.n_tensors == n);
    CHECK(f.n_meta == 3);
    CHECK((f.data_start - 8) % 8 == 0);
    CHECK(ts_st_meta(&f, "step") && strcmp(ts_st_meta(&f, "step"), "12") == 0);
    CHECK(ts_st_meta(&f, "note") && strcmp(ts_st_meta(&f, "note"), mv[2]) == 0);
    CHECK(ts_st_meta(&f, "absent") == NULL);
    CHECK(ts_st_find(&f, "absent") == NULL);
    for (int i = 1; i < f.n_tensors; i++) CHECK(f.tensors[i - 1].begin <= f.tensors[i].begin);
    for (int i = 0; i < n; i++) {
        const ts_st_tensor *t = ts_st_find(&f, e[i].name);
        CHECKF(t != NULL, "missing %s", e[i].name);
        if (!t) continue;
        CHECK(t->dtype == e[i].dtype && t->ndim == e[i].ndim);
        size_t bytes = ts_st_dtype_size(e[i].dtype);
        for (int d = 0; d < e[i].ndim; d++) {
            CHECK(t->shape[d] == e[i].shape[d]);
            bytes *= (size_t)e[i].shape[d];
        }
        CHECK(t->end - t->begin == bytes);
        unsigned char buf[64];
        CHECK(ts_st_read(&f, t, 0, buf, bytes) == TS_OK);
        CHECKF(bytes == 0 || memcmp(buf, e[i].data, bytes) == 0, "data of %s", e[i].name);
    }
    /* Offsets follow the given order. */
    const ts_st_tensor *a = ts_st_find(&f, "transformer.wte.weight");
    const ts_st_tensor *b = ts_st_find(&f, "f64");
    CHECK(a && b && a->begin == 0 && b->begin == a->end);
    ts_st_close(&f);
    CHECK(is_zeroed(&f));

    /* Header keys in the given order, metadata first, padded with spaces. */
    size_t len;
    unsigned char *raw = read_bytes(path, &len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | raw[i];
    CHECK(hlen % 8 == 0 && 8 + hlen <= len);
    char *hdr = calloc(1, hlen + 1);
    memcpy(hdr, raw + 8, hlen);
    CHECK(strncmp(hdr, "{\"__metadata__\":", 16) == 0);
    const char *prev = hdr;
    for (int i = 0; i < n; i++) {
        char key[80];
        snprintf(key, sizeof key, "\"%s\":{", e[i].name);
        const char *at = strstr(hdr, key);
        CHECKF(at && at > prev, "key %s out of order", e[i].name);
        if (at) prev = at;
    }
    CHECK(strchr(hdr, '\n') == NULL);
    free(hdr);
    free(raw);

    /* No tensors, no metadata: still a valid file. */
    path_in(path, sizeof path, "empty.safetensors");
    CHECK(ts_st_write(path, NULL, 0, NULL, NULL, 0) == TS_OK);
    CHECK(ts_st_open(&f, path) == TS_OK && f.n_tensors == 0 && f.n_meta == 0);
    ts_st_close(&f);
}

static void test_safetensors_partial_reads(void)
{
    float w[100];
    for (int i = 0; i < 100; i++) w[i] = (float)i * 0.5f;
    int32_t pad[3] = {7, 8, 9};
    ts_st_entry e[] = {{"pad", TS_DT_I32, 1, {3}, pad}, {"w", TS_DT_F32, 2, {10, 10}, w}};
    char path[512];
    path_in(path, sizeof path, "partial.safetensors");
    CHECK(ts_st_write(path, e, 2, NULL, NULL, 0) == TS_OK);
    ts_st_file f;
    CHECK(ts_st_open(&f, path) == TS_OK);
    const ts_st_tensor *t = ts_st_find(&f, "w");
    CHECK(t != NULL);
    if (t) {
        float row[10];
        for (int r = 0; r < 10; r++) { /* each row at its byte offset */
            CHECK(ts_st_read(&f, t, (uint64_t)r * 40, row, 40) == TS_OK);
            CHECK(memcmp(row, w + r * 10, 40) == 0);
        }
        float x[7];
        CHECK(ts_st_read(&f, t, 4 * 33, x, sizeof x) == TS_OK && memcmp(x, w + 33, sizeof x) == 0);
        CHECK(ts_st_read(&f, t, 400, x, 0) == TS_OK);
        ts_error_clear();
        CHECK(ts_st_read(&f, t, 396, x, 8) == TS_ERR);
        CHECK(contains(ts_error_message(), "outside tensor 'w'"));
        CHECK(ts_st_read(&f, t, 401, x, 0) == TS_ERR);
        CHECK(ts_st_read(&f, t, UINT64_MAX, x, 4) == TS_ERR);
        CHECK(ts_st_read(&f, t, 4, x, UINT64_MAX) == TS_ERR);
    }
    ts_st_close(&f);
}

static void test_safetensors_expect_f32(void)
{
    ts_st_tensor t = {.name = "transformer.h.0.attn.c_attn.weight", .dtype = TS_DT_F32,
                      .ndim = 2, .shape = {384, 128}};
    int64_t want[2] = {96, 32};
    int64_t same[2] = {384, 128};
    CHECK(ts_st_expect_f32(&t, 2, same) == TS_OK);
    CHECK(ts_st_expect_f32(&t, 2, want) == TS_ERR);
    CHECKF(strcmp(ts_error_message(), "tensor 'transformer.h.0.attn.c_attn.weight' has shape "
                                      "[384,128] F32, expected [96,32] F32") == 0,
           "%s", ts_error_message());
    CHECK(ts_st_expect_f32(&t, 1, same) == TS_ERR);
    t.dtype = TS_DT_BF16;
    CHECK(ts_st_expect_f32(&t, 2, same) == TS_ERR);
    CHECK(contains(ts_error_message(), "[384,128] BF16, expected [384,128] F32"));
    ts_st_tensor s = {.name = "s", .dtype = TS_DT_F32, .ndim = 0};
    CHECK(ts_st_expect_f32(&s, 0, NULL) == TS_OK);

    /* Shapes as messages print them (model.init's "expected shape" uses it too). */
    char buf[32];
    const int64_t one[1] = {128};
    CHECK(strcmp(ts_st_shape_str(buf, sizeof buf, 1, one), "[128]") == 0);
    CHECK(strcmp(ts_st_shape_str(buf, sizeof buf, 2, same), "[384,128]") == 0);
    CHECK(strcmp(ts_st_shape_str(buf, sizeof buf, 0, NULL), "[]") == 0);
    CHECK(strcmp(ts_st_shape_str(buf, 5, 2, same), "[384") == 0); /* truncated, terminated */
}

static void test_safetensors_rejects(void)
{
    const uint64_t L = UINT64_MAX; /* header length = the JSON's length */
    const char *ok = "{\"a\":{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[0,48]}}";
    char path[512];

    /* A valid raw file first, so the cases below fail for the reason they name. */
    path_in(path, sizeof path, "raw_ok.safetensors");
    write_raw(path, ok, L, 48);
    ts_st_file f;
    CHECKF(ts_st_open(&f, path) == TS_OK, "%s", ts_error_message());
    ts_st_close(&f);
    /* Header padded with spaces (not a multiple of 8 here) is fine too. */
    write_raw(path, "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}   ", L, 2);
    CHECKF(ts_st_open(&f, path) == TS_OK, "%s", ts_error_message());
    ts_st_close(&f);

    expect_reject("truncated", ok, L, 40, "is truncated: header says 48 bytes of data, file has 40");
    expect_reject("trailing", ok, L, 50, "2 bytes of trailing data");
    expect_reject("hlen_big", ok, strlen(ok) + 100, 48, "header length says");
    expect_reject("hlen_huge", ok, (uint64_t)1 << 62, 48, "exceeds");
    expect_reject("hlen_zero", ok, 0, 48, "too short");
    expect_reject("bad_json", "{\"a\":{\"dtype\":\"F32\",\"shape\":[3,4],", L, 48, "not valid JSON");
    expect_reject("not_object", "[1,2,3]", L, 0, "does not start with '{'");
    expect_reject("unknown_dtype",
                  "{\"a\":{\"dtype\":\"F8_E4M3\",\"shape\":[3,4],\"data_offsets\":[0,12]}}", L,
                  12, "unknown dtype 'F8_E4M3'");
    expect_reject("size_mismatch",
                  "{\"a\":{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[0,40]}}", L, 40,
                  "tensor 'a' has dtype F32 and shape [3,4] = 48 bytes but data_offsets span 40");
    expect_reject("hole",
                  "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                  "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[6,10]}}",
                  L, 10, "hole");
    expect_reject("hole_at_start",
                  "{\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}", L, 6, "hole");
    expect_reject("overlap",
                  "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                  "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}",
                  L, 6, "overlap");
    expect_reject("same_range",
                  "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                  "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}",
                  L, 4, "overlap");
    expect_reject("duplicate",
                  "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                  "\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]}}",
                  L, 8, "duplicate");
    expect_reject("neg_shape", "{\"a\":{\"dtype\":\"U8\",\"shape\":[-4],\"data_offsets\":[0,4]}}",
                  L, 4, "shape entry");
    expect_reject("float_shape",
                  "{\"a\":{\"dtype\":\"U8\",\"shape\":[4.0],\"data_offsets\":[0,4]}}", L, 4,
                  "shape entry");
    expect_reject("no_shape", "{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,4]}}", L, 4,
                  "no shape");
    expect_reject("no_dtype", "{\"a\":{\"shape\":[4],\"data_offsets\":[0,4]}}", L, 4, "no dtype");
    expect_reject("offsets3",
                  "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4,8]}}", L, 4,
                  "data_offsets");
    expect_reject("end_before_begin",
                  "{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,0]}}", L, 4,
                  "end before begin");
    expect_reject("too_many_dims",
                  "{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                  "\"data_offsets\":[0,1]}}", L, 1, "9 dimensions");
    expect_reject("overflow",
                  "{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296],"
                  "\"data_offsets\":[0,8]}}", L, 8, "overflows");
    expect_reject("meta_not_string",
                  "{\"__metadata__\":{\"k\":1},"
                  "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
                  L, 1, "metadata value for 'k'");
    expect_reject("entry_not_object", "{\"a\":[1]}", L, 0, "not a JSON object");

    /* Shorter than the length field; missing file. */
    path_in(path, sizeof path, "tiny");
    write_bytes(path, "abc", 3);
    ts_error_clear();
    CHECK(ts_st_open(&f, path) == TS_ERR && contains(ts_error_message(), "truncated"));
    path_in(path, sizeof path, "does_not_exist.safetensors");
    CHECK(ts_st_open(&f, path) == TS_ERR && contains(ts_error_message(), "No such file"));
    CHECK(ts_st_open(&f, g_dir) == TS_ERR && contains(ts_error_message(), "regular file"));
}

static void test_safetensors_writer_rejects(void)
{
    uint8_t d[4] = {0};
    char path[512];
    path_in(path, sizeof path, "w.safetensors");
    ts_st_entry dup[] = {{"a", TS_DT_U8, 1, {4}, d}, {"a", TS_DT_U8, 1, {4}, d}};
    CHECK(ts_st_write(path, dup, 2, NULL, NULL, 0) == TS_ERR);
    CHECK(contains(ts_error_message(), "repeated"));
    ts_st_entry meta[] = {{"__metadata__", TS_DT_U8, 1, {4}, d}};
    CHECK(ts_st_write(path, meta, 1, NULL, NULL, 0) == TS_ERR);
    ts_st_entry neg[] = {{"a", TS_DT_U8, 1, {-4}, d}};
    CHECK(ts_st_write(path, neg, 1, NULL, NULL, 0) == TS_ERR);
    ts_st_entry nodata[] = {{"a", TS_DT_U8, 1, {4}, NULL}};
    CHECK(ts_st_write(path, nodata, 1, NULL, NULL, 0) == TS_ERR);
    ts_st_entry badutf[] = {{"a\xff", TS_DT_U8, 1, {4}, d}};
    CHECK(ts_st_write(path, badutf, 1, NULL, NULL, 0) == TS_ERR);
    CHECK(ts_st_write("/nonexistent_dir_ts/x.safetensors", dup, 1, NULL, NULL, 0) == TS_ERR);
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ULL;
static uint32_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 16);
}

/* Random byte flips and truncations of a valid file: TS_OK or TS_ERR, never a crash. */
static void test_safetensors_fuzz(void)
{
    float w[12];
    for (int i = 0; i < 12; i++) w[i] = (float)i;
    int64_t s = 42;
    uint8_t e8[1];
    ts_st_entry e[] = {{"w", TS_DT_F32, 2, {3, 4}, w},
                       {"s", TS_DT_I64, 0, {0}, &s},
                       {"e", TS_DT_U8, 1, {0}, e8},
                       {"b", TS_DT_BF16, 1, {2}, w}};
    const char *mk[] = {"format"}, *mv[] = {"pt"};
    char path[512];
    path_in(path, sizeof path, "fuzz_src.safetensors");
    CHECK(ts_st_write(path, e, 4, mk, mv, 1) == TS_OK);
    size_t len;
    unsigned char *orig = read_bytes(path, &len);
    unsigned char *buf = malloc(len);
    path_in(path, sizeof path, "fuzz.safetensors");
    int n_ok = 0, n_err = 0, n_bad = 0;
    for (int it = 0; it < 2000; it++) {
        memcpy(buf, orig, len);
        size_t n = len;
        int flips = 1 + (int)(rnd() % 4);
        for (int k = 0; k < flips; k++) {
            /* Mostly the length field and the header, where the parsing is. */
            size_t at = rnd() % 4 ? rnd() % (n < 200 ? n : 200) : rnd() % n;
            switch (rnd() % 4) {
            case 0: buf[at] ^= (unsigned char)(1u << (rnd() % 8)); break;
            case 1: buf[at] = (unsigned char)rnd(); break;
            case 2: buf[at] = "0123456789{}[],\":-"[rnd() % 18]; break;
            default: buf[at] = ' '; break;
            }
        }
        if (rnd() % 8 == 0) n = rnd() % (len + 1);
        write_bytes(path, buf, n);
        ts_st_file f;
        ts_status st = ts_st_open(&f, path);
        if (st == TS_OK) {
            n_ok++;
            for (int i = 0; i < f.n_tensors; i++) {
                const ts_st_tensor *t = &f.tensors[i];
                uint64_t sz = t->end - t->begin;
                unsigned char *dst = malloc(sz ? sz : 1);
                if (ts_st_read(&f, t, 0, dst, sz) != TS_OK) n_bad++;
                free(dst);
            }
            ts_st_close(&f);
        } else if (st == TS_ERR) {
            n_err++;
            if (ts_error_message()[0] == '\0') n_bad++;
        } else {
            n_bad++;
        }
        ts_error_clear();
    }
    printf("fuzz: %d accepted, %d rejected\n", n_ok, n_err);
    CHECK(n_ok + n_err == 2000 && n_bad == 0);
    CHECK(n_err > 0);
    free(buf);
    free(orig);
}

/* ------------------------------------------------------------ model.init -- */

/* A small llama: grouped-query attention (4 query, 2 key/value heads), untied head
 * unless `tie`. */
static ts_model_config llama_tiny(int tie)
{
    ts_config c;
    ts_test_tiny_llama(&c, 70, 8);
    c.model.tie_embeddings = tie;
    ts_config_resolve_model(&c.model);
    CHECKF(ts_config_validate(&c, 0) == TS_OK, "%s", ts_error_message());
    return c.model;
}

static int param_of(const ts_model *m, const char *name)
{
    for (int p = 0; p < m->n_params; p++)
        if (!strcmp(m->params[p].shard.name, name)) return p;
    return -1;
}

/* m's tensors as file entries of dtype dt into e (the data in bufs[p], malloc'ed): F32
 * as they are, BF16 their top halves, F16 random finite halves. `drop` is left out;
 * `rename` (old=new) renames one. Returns the count. */
static int entries_of(const ts_model *m, ts_st_dtype dt, ts_st_entry *e, void **bufs,
                      const char *drop)
{
    int n = 0;
    uint32_t seed = 12345;
    for (int p = 0; p < m->n_params; p++) {
        const ts_param *P = &m->params[p];
        bufs[p] = NULL;
        if (drop && !strcmp(P->shard.name, drop)) continue;
        const float *w = ts_param_data(m, p);
        ts_st_entry *x = &e[n++];
        *x = (ts_st_entry){P->shard.name, dt, P->shard.ndim, {0}, w};
        for (int d = 0; d < P->shard.ndim; d++) x->shape[d] = P->shard.shape[d];
        if (dt == TS_DT_F32) continue;
        uint16_t *h = malloc(P->numel * 2);
        for (size_t i = 0; i < P->numel; i++) {
            uint32_t u;
            memcpy(&u, &w[i], 4);
            if (dt == TS_DT_BF16) {
                h[i] = (uint16_t)(u >> 16);
            } else {
                seed = seed * 1664525u + 1013904223u;
                h[i] = (uint16_t)(seed >> 16);
                if (((h[i] >> 10) & 0x1f) == 0x1f) h[i] &= 0xbfff; /* no Inf or NaN */
            }
        }
        bufs[p] = h;
        x->data = h;
    }
    return n;
}

static void free_bufs(const ts_model *m, void **bufs)
{
    for (int p = 0; p < m->n_params; p++) free(bufs[p]);
}

/* What half h is, computed another way than the loader does. */
static float half_value(uint16_t h)
{
    const int e = (h >> 10) & 0x1f, mant = h & 0x3ff;
    const double v = e ? ldexp(1.0 + mant / 1024.0, e - 15) : ldexp(mant, -24);
    return (float)((h & 0x8000) ? -v : v);
}

static ts_status write_entries(const char *path, const ts_st_entry *e, int n)
{
    const char *k[] = {"format"}, *v[] = {"pt"};
    return ts_st_write(path, e, n, k, v, 1);
}

static const char *expect_init_error(ts_model *m, const char *path, const char *what)
{
    ts_error_clear();
    ts_status st = ts_ckpt_load_model_init(m, path);
    const char *msg = ts_error_message();
    CHECKF(st == TS_ERR && contains(msg, what) && !strncmp(msg, "model.init: ", 12),
           "want '%s': %s", what, st == TS_OK ? "(loaded)" : msg);
    return msg;
}

/* BF16 and F16 weights are widened to fp32 exactly: every element equals the fp32
 * whose top half the BF16 is, or the half's value. */
static void test_model_init_bf16_f16(void)
{
    ts_model_config mc = llama_tiny(0);
    ts_model src, dst;
    ts_model_build(&src, &(ts_model_spec){.arch = &mc, .k = &ts_kernels_cpu});
    ts_model_init_random(&src, 7);
    ts_model_build(&dst, &(ts_model_spec){.arch = &mc, .k = &ts_kernels_cpu});
    ts_st_entry e[64];
    void *bufs[64];
    char path[512];
    path_in(path, sizeof path, "llama_bf16.safetensors");
    CHECK(src.n_params == 2 + 2 * TS_L_NPARAMS + 1 && src.n_params <= 64);
    int n = entries_of(&src, TS_DT_BF16, e, bufs, NULL);
    CHECK(write_entries(path, e, n) == TS_OK);
    CHECKF(ts_ckpt_load_model_init(&dst, path) == TS_OK, "%s", ts_error_message());
    size_t bad = 0, nonzero_low = 0;
    for (int p = 0; p < src.n_params; p++) {
        const float *got = ts_param_data(&dst, p), *orig = ts_param_data(&src, p);
        const uint16_t *h = bufs[p];
        for (size_t i = 0; i < src.params[p].numel; i++) {
            uint32_t u = (uint32_t)h[i] << 16, g, o;
            memcpy(&g, &got[i], 4);
            memcpy(&o, &orig[i], 4);
            bad += g != u;
            nonzero_low += (o & 0xffffu) != 0; /* the file really lost bits */
        }
    }
    CHECKF(bad == 0, "%zu elements not the BF16's exact widening", bad);
    CHECK(nonzero_low > 1000);
    free_bufs(&src, bufs);

    path_in(path, sizeof path, "llama_f16.safetensors");
    n = entries_of(&src, TS_DT_F16, e, bufs, NULL);
    CHECK(write_entries(path, e, n) == TS_OK);
    CHECKF(ts_ckpt_load_model_init(&dst, path) == TS_OK, "%s", ts_error_message());
    bad = 0;
    size_t subnormal = 0;
    for (int p = 0; p < src.n_params; p++) {
        const float *got = ts_param_data(&dst, p);
        const uint16_t *h = bufs[p];
        for (size_t i = 0; i < src.params[p].numel; i++) {
            bad += got[i] != half_value(h[i]);
            subnormal += ((h[i] >> 10) & 0x1f) == 0;
        }
    }
    CHECKF(bad == 0, "%zu elements not the F16's value", bad);
    CHECK(subnormal > 0);
    free_bufs(&src, bufs);
    ts_model_free(&src);
    ts_model_free(&dst);
}

/* Every name, shape and dtype against the llama model, with the tensor and what was
 * expected named; missing and unexpected tensors refused; tied and untied heads. */
static void test_model_init_llama_checks(void)
{
    ts_model_config mc = llama_tiny(0);
    ts_model src, dst;
    ts_model_build(&src, &(ts_model_spec){.arch = &mc, .k = &ts_kernels_cpu});
    ts_model_init_random(&src, 7);
    ts_model_build(&dst, &(ts_model_spec){.arch = &mc, .k = &ts_kernels_cpu});
    CHECK(!dst.tied && param_of(&dst, "lm_head.weight") >= 0 &&
          param_of(&dst, "model.layers.1.self_attn.k_proj.weight") >= 0);
    ts_st_entry e[66];
    void *bufs[64];
    char path[512];
    path_in(path, sizeof path, "llama.safetensors");
    int n = entries_of(&src, TS_DT_F32, e, bufs, NULL);
    CHECK(write_entries(path, e, n) == TS_OK);
    CHECKF(ts_ckpt_load_model_init(&dst, path) == TS_OK, "%s", ts_error_message());
    CHECK(!memcmp(src.param_mem, dst.param_mem, src.num_floats * sizeof(float)));

    /* A missing tensor: named, with its shape. */
    n = entries_of(&src, TS_DT_F32, e, bufs, "model.layers.1.mlp.up_proj.weight");
    CHECK(write_entries(path, e, n) == TS_OK);
    expect_init_error(&dst, path, "has no tensor 'model.layers.1.mlp.up_proj.weight' (expected "
                                  "shape [48,32] F32");
    /* k_proj of multi-head attention ([NH*HS, C]) where the model has 2 key/value heads. */
    n = entries_of(&src, TS_DT_F32, e, bufs, NULL);
    const int q = param_of(&src, "model.layers.0.self_attn.q_proj.weight");
    const int k = param_of(&src, "model.layers.0.self_attn.k_proj.weight");
    CHECK(src.params[k].shard.shape[0] == 16 && src.params[q].shard.shape[0] == 32);
    e[k].shape[0] = 32;
    e[k].data = ts_param_data(&src, q);
    CHECK(write_entries(path, e, n) == TS_OK);
    expect_init_error(&dst, path, "tensor 'model.layers.0.self_attn.k_proj.weight' has shape "
                                  "[32,32] F32, expected [16,32]");
    /* A dtype fp32 does not hold exactly (F64), and one that is no float (I32). */
    n = entries_of(&src, TS_DT_F32, e, bufs, NULL);
    const int norm = param_of(&src, "model.norm.weight");
    double wide[32] = {0};
    e[norm].dtype = TS_DT_F64;
    e[norm].data = wide;
    CHECK(write_entries(path, e, n) == TS_OK);
    expect_init_error(&dst, path, "tensor 'model.norm.weight' [32] is F64, expected F32 (or "
                                  "BF16 or F16");
    e[norm].dtype = TS_DT_I32;
    CHECK(write_entries(path, e, n) == TS_OK);
    expect_init_error(&dst, path, "tensor 'model.norm.weight' [32] is I32, expected F32");
    /* Unexpected tensors: a block the model lacks, a gpt2 name, a bias llama has none of. */
    const char *foreign[] = {"model.layers.2.self_attn.q_proj.weight", "transformer.wte.weight",
                             "model.layers.0.self_attn.q_proj.bias"};
    for (int i = 0; i < 3; i++) {
        n = entries_of(&src, TS_DT_F32, e, bufs, NULL);
        e[n] = e[norm];
        e[n++].name = foreign[i];
        CHECK(write_entries(path, e, n) == TS_OK);
        char want[160];
        snprintf(want, sizeof want, "holds tensor '%s', which is not a parameter of this llama "
                 "config (n_layer=2)", foreign[i]);
        expect_init_error(&dst, path, want);
    }

    /* A tied Hugging Face file has no lm_head.weight: the untied model says how to load
     * it, the tied model loads it (its embedding serves as the head). */
    n = entries_of(&src, TS_DT_F32, e, bufs, "lm_head.weight");
    CHECK(write_entries(path, e, n) == TS_OK);
    expect_init_error(&dst, path, "has no tensor 'lm_head.weight' (expected shape [70,32] F32, "
                                  "or BF16 or F16, for this config); the weights of a model "
                                  "whose head is tied to the embedding have none: set "
                                  "model.tie_embeddings = true");
    ts_model_config tc = llama_tiny(1);
    ts_model tied;
    ts_model_build(&tied, &(ts_model_spec){.arch = &tc, .k = &ts_kernels_cpu});
    CHECK(tied.tied && param_of(&tied, "lm_head.weight") < 0);
    CHECKF(ts_ckpt_load_model_init(&tied, path) == TS_OK, "%s", ts_error_message());
    const int emb = param_of(&src, "model.embed_tokens.weight");
    CHECK(!memcmp(ts_param_data(&tied, param_of(&tied, "model.embed_tokens.weight")),
                  ts_param_data(&src, emb), src.params[emb].numel * sizeof(float)));
    /* ... and an lm_head.weight beside a tied head must be the embedding. */
    n = entries_of(&src, TS_DT_F32, e, bufs, NULL);
    CHECK(write_entries(path, e, n) == TS_OK);
    expect_init_error(&tied, path, "lm_head.weight differs from model.embed_tokens.weight, but "
                                   "this model ties its head to the embedding");
    const int head = param_of(&src, "lm_head.weight");
    e[head].data = ts_param_data(&src, emb);
    CHECK(write_entries(path, e, n) == TS_OK);
    CHECKF(ts_ckpt_load_model_init(&tied, path) == TS_OK, "%s", ts_error_message());
    ts_model_free(&tied);

    /* A pipeline stage without the head and block 1 skips their names, and checks its
     * own: a bad k_proj of block 0 is still refused there. */
    bool owned[4] = {true, true, false, false};
    ts_model stage;
    ts_model_build(&stage, &(ts_model_spec){.arch = &mc, .k = &ts_kernels_cpu, .owned = owned});
    n = entries_of(&src, TS_DT_F32, e, bufs, NULL);
    CHECK(write_entries(path, e, n) == TS_OK);
    CHECKF(ts_ckpt_load_model_init(&stage, path) == TS_OK, "%s", ts_error_message());
    e[k].shape[0] = 32;
    e[k].data = ts_param_data(&src, q);
    CHECK(write_entries(path, e, n) == TS_OK);
    expect_init_error(&stage, path, "k_proj.weight' has shape [32,32] F32, expected [16,32]");
    ts_model_free(&stage);
    ts_model_free(&src);
    ts_model_free(&dst);
}

/* save_pretrained's directories: model.safetensors, or shards with an index that must
 * agree with them exactly. */
static void test_model_init_hf_dirs(void)
{
    ts_model_config mc = llama_tiny(0);
    ts_model src, dst;
    ts_model_build(&src, &(ts_model_spec){.arch = &mc, .k = &ts_kernels_cpu});
    ts_model_init_random(&src, 9);
    ts_model_build(&dst, &(ts_model_spec){.arch = &mc, .k = &ts_kernels_cpu});
    ts_st_entry e[64];
    void *bufs[64];
    char dir[512], path[600], index[600];
    path_in(dir, sizeof dir, "hf");
    CHECK(mkdir(dir, 0777) == 0);
    expect_init_error(&dst, dir, "is a directory with neither model.safetensors nor "
                                 "model.safetensors.index.json");
    const int n = entries_of(&src, TS_DT_BF16, e, bufs, NULL);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK(write_entries(path, e, n) == TS_OK);
    CHECKF(ts_ckpt_load_model_init(&dst, dir) == TS_OK, "%s", ts_error_message());
    const int emb = param_of(&src, "model.embed_tokens.weight");
    CHECK(ts_param_data(&dst, emb)[3] != 0 &&
          fabsf(ts_param_data(&dst, emb)[3] - ts_param_data(&src, emb)[3]) < 1e-3f);
    unlink(path);

    /* Two shards: the first half of the tensors, then the rest. */
    const int half = n / 2;
    char shard[2][600];
    for (int i = 0; i < 2; i++) {
        snprintf(shard[i], sizeof shard[i], "%s/model-%05d-of-00002.safetensors", dir, i + 1);
        CHECK(write_entries(shard[i], e + (i ? half : 0), i ? n - half : half) == TS_OK);
    }
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
    json_t *map = json_object();
    for (int t = 0; t < n; t++)
        json_object_set_new(map, e[t].name,
                            json_string(t < half ? "model-00001-of-00002.safetensors"
                                                 : "model-00002-of-00002.safetensors"));
    json_t *root = json_pack("{s:{s:I}, s:O}", "metadata", "total_size", (json_int_t)0,
                             "weight_map", map);
    CHECK(json_dump_file(root, index, 0) == 0);
    memset(dst.param_mem, 0, dst.num_floats * sizeof(float));
    CHECKF(ts_ckpt_load_model_init(&dst, dir) == TS_OK, "%s", ts_error_message());
    size_t bad = 0;
    for (int p = 0; p < src.n_params; p++) {
        const uint16_t *h = bufs[p];
        for (size_t i = 0; i < src.params[p].numel; i++) {
            uint32_t u = (uint32_t)h[i] << 16, g;
            memcpy(&g, &ts_param_data(&dst, p)[i], 4);
            bad += g != u;
        }
    }
    CHECKF(bad == 0, "%zu elements differ after the sharded load", bad);
    CHECKF(ts_ckpt_load_model_init(&dst, index) == TS_OK, "%s", ts_error_message());
    /* The index naming the wrong file for a tensor, and a shard's tensor it omits. */
    json_object_set_new(map, e[0].name, json_string("model-00002-of-00002.safetensors"));
    CHECK(json_dump_file(root, index, 0) == 0);
    char want[200];
    snprintf(want, sizeof want, "maps tensor '%s' to model-00002-of-00002.safetensors, which "
             "does not hold it", e[0].name);
    expect_init_error(&dst, dir, want);
    json_object_del(map, e[0].name);
    CHECK(json_dump_file(root, index, 0) == 0);
    snprintf(want, sizeof want, "holds tensor '%s', which", e[0].name);
    expect_init_error(&dst, dir, want);
    json_object_set_new(map, e[0].name, json_string("../model-00001-of-00002.safetensors"));
    CHECK(json_dump_file(root, index, 0) == 0);
    expect_init_error(&dst, dir, "is not the name of a file beside the index");
    json_decref(root);
    json_decref(map);
    free_bufs(&src, bufs);
    ts_model_free(&src);
    ts_model_free(&dst);
}

/* A tiny llama MoE of E experts (block 1 and 0 both MoE), validated. */
static ts_model_config moe_tiny(int experts)
{
    ts_config c;
    ts_test_tiny_llama(&c, 70, 8);
    c.model.moe_experts = experts;
    c.model.moe_top_k = 2;
    c.model.moe_ffn_hidden = 8;
    ts_config_resolve_model(&c.model);
    CHECKF(ts_config_validate(&c, 0) == TS_OK, "%s", ts_error_message());
    return c.model;
}

/* m built as ep rank `rank` of 2 (the group only sized: model.init moves nothing over it). */
static void build_ep_rank(ts_model *m, const ts_model_config *mc, ts_comm *ep, int rank)
{
    memset(ep, 0, sizeof *ep);
    ep->size = 2;
    ep->rank = rank;
    ep->name = "ep";
    ts_model_build(m, &(ts_model_spec){.arch = mc, .k = &ts_kernels_cpu, .ep = ep});
}

/* m built as (ep, etp) rank (ep_rank of ep_size, etp_rank of 2), the groups only sized. */
static void build_etp_rank(ts_model *m, const ts_model_config *mc, ts_comm g[2], int ep_size,
                           int ep_rank, int etp_rank)
{
    g[0] = (ts_comm){.size = ep_size, .rank = ep_rank, .name = "ep"};
    g[1] = (ts_comm){.size = 2, .rank = etp_rank, .name = "etp"};
    ts_model_build(m, &(ts_model_spec){.arch = mc, .k = &ts_kernels_cpu, .ep = &g[0],
                                       .etp = &g[1]});
}

/* Whether every local element of dst is its logical element in src (a whole model:
 * unsharded), each rounded to BF16 first when `bf16`; names one difference into why. */
static bool same_as_slices(const ts_model *src, const ts_model *dst, bool bf16, char *why,
                           size_t cap)
{
    for (int p = 0; p < dst->n_params; p++) {
        const ts_shard_spec *s = &dst->params[p].shard;
        const int q = param_of(src, s->name);
        if (q < 0) return snprintf(why, cap, "'%s' is not the source's", s->name), false;
        const float *w = ts_param_data(src, q), *got = ts_param_data(dst, p);
        ts_shard_run r;
        for (ts_shard_iter it = ts_shard_iter_begin(s, 0, dst->params[p].numel);
             ts_shard_next(&it, &r);)
            for (size_t i = 0; i < r.len; i++) {
                uint32_t u;
                memcpy(&u, &w[r.logical + i], 4);
                if (bf16) u &= 0xffff0000u;
                float want;
                memcpy(&want, &u, 4);
                if (got[r.local + i] != want)
                    return snprintf(why, cap, "'%s' local %zu (logical %zu)", s->name,
                                    r.local + i, r.logical + i),
                           false;
            }
    }
    return true;
}

/* Whether m holds a tensor of global expert j (any block, any of its three). */
static bool holds_expert(const ts_model *m, int j)
{
    char want[32];
    snprintf(want, sizeof want, ".experts.%d.", j);
    for (int p = 0; p < m->n_params; p++)
        if (strstr(m->params[p].shard.name, want)) return true;
    return false;
}

/* Expert parallelism: each ep rank holds only its experts (their global ids in the
 * names) and model.init reads just those from weights holding every expert, F32 or
 * BF16. Weights whose expert count is not model.moe_experts are refused naming the key
 * on every rank alike: ep rank 0 of 4 experts holds experts 0 and 1, which 2-expert
 * weights have too (it alone would load them). */
static void test_model_init_expert_parallel(void)
{
    ts_model_config mc = moe_tiny(4);
    ts_model src;
    ts_model_build(&src, &(ts_model_spec){.arch = &mc, .k = &ts_kernels_cpu});
    ts_model_init_random(&src, 11);
    ts_st_entry *e = malloc((size_t)src.n_params * 2 * sizeof *e);
    void **bufs = malloc((size_t)src.n_params * 2 * sizeof *bufs);
    char path[512];
    path_in(path, sizeof path, "moe.safetensors");
    const ts_st_dtype dts[2] = {TS_DT_F32, TS_DT_BF16};
    for (int d = 0; d < 2; d++) {
        const int n = entries_of(&src, dts[d], e, bufs, NULL);
        CHECK(write_entries(path, e, n) == TS_OK);
        for (int r = 0; r < 2; r++) {
            ts_model dst;
            ts_comm ep;
            build_ep_rank(&dst, &mc, &ep, r);
            CHECK(dst.moe_local_experts == 2 && holds_expert(&dst, 2 * r + 1) &&
                  !holds_expert(&dst, 2 * (1 - r)));
            ts_error_clear();
            CHECKF(ts_ckpt_load_model_init(&dst, path) == TS_OK, "ep rank %d: %s", r,
                   ts_error_message());
            int same = 1;
            for (int p = 0; p < dst.n_params; p++) {
                const int q = param_of(&src, dst.params[p].shard.name);
                const float *w = ts_param_data(&src, q), *got = ts_param_data(&dst, p);
                for (size_t i = 0; q >= 0 && i < dst.params[p].numel; i++) {
                    uint32_t u;
                    memcpy(&u, &w[i], 4);
                    if (dts[d] == TS_DT_BF16) u &= 0xffff0000u;
                    float want;
                    memcpy(&want, &u, 4);
                    same &= got[i] == want;
                }
                same &= q >= 0;
            }
            CHECKF(same, "ep rank %d (%s): the local experts differ from the file's", r,
                   d ? "BF16" : "F32");
            ts_model_free(&dst);
        }
        /* Expert tensor parallelism, alone and with ep 2: each rank reads its F/2 slice
         * of its experts (gate and up rows, down columns), its two halves tiling them. */
        for (int ep = 1; ep <= 2; ep++)
            for (int r = 0; r < 2 * ep; r++) {
                ts_model dst;
                ts_comm g[2];
                build_etp_rank(&dst, &mc, g, ep, r / 2, r % 2);
                CHECK(dst.moe_etp == 2 && dst.moe_local_ffn == 4 &&
                      dst.moe_local_experts == 4 / ep);
                ts_error_clear();
                CHECKF(ts_ckpt_load_model_init(&dst, path) == TS_OK, "ep %d etp rank %d: %s", ep,
                       r, ts_error_message());
                char why[160] = "";
                CHECKF(same_as_slices(&src, &dst, dts[d] == TS_DT_BF16, why, sizeof why),
                       "ep %d x etp 2 rank %d (%s): %s differs from the file's", ep, r,
                       d ? "BF16" : "F32", why);
                ts_model_free(&dst);
            }
        for (int p = 0; p < src.n_params; p++) free(bufs[p]);
    }

    ts_model dst;
    ts_comm ep;
    build_ep_rank(&dst, &mc, &ep, 0);
    const int counts[2] = {2, 8};
    for (int i = 0; i < 2; i++) {
        ts_model_config other = moe_tiny(counts[i]);
        ts_model o;
        ts_model_build(&o, &(ts_model_spec){.arch = &other, .k = &ts_kernels_cpu});
        ts_model_init_random(&o, 12);
        ts_st_entry *oe = malloc((size_t)o.n_params * sizeof *oe);
        void **ob = malloc((size_t)o.n_params * sizeof *ob);
        CHECK(write_entries(path, oe, entries_of(&o, TS_DT_F32, oe, ob, NULL)) == TS_OK);
        char what[64];
        snprintf(what, sizeof what, "holds %d routed experts per MoE block", counts[i]);
        const char *msg = expect_init_error(&dst, path, what);
        CHECKF(contains(msg, "but model.moe_experts = 4") && contains(msg, "experts.") &&
                   contains(msg, path),
               "%s", msg);
        free(oe);
        free(ob);
        ts_model_free(&o);
    }
    /* A dense model's weights, and MoE weights into a dense model: named as such. */
    ts_model_config dense = llama_tiny(0);
    ts_model o;
    ts_model_build(&o, &(ts_model_spec){.arch = &dense, .k = &ts_kernels_cpu});
    CHECK(write_entries(path, e, entries_of(&o, TS_DT_F32, e, bufs, NULL)) == TS_OK);
    const char *msg = expect_init_error(&dst, path, "holds no routed experts' tensors");
    CHECKF(contains(msg, "model.moe_experts = 4"), "%s", msg);
    CHECK(write_entries(path, e, entries_of(&src, TS_DT_F32, e, bufs, NULL)) == TS_OK);
    msg = expect_init_error(&o, path, "holds 4 routed experts per MoE block");
    CHECKF(contains(msg, "model.moe_experts = 0"), "%s", msg);
    ts_model_free(&o);
    ts_model_free(&dst);
    free(e);
    free(bufs);
    ts_model_free(&src);
}

/* model.init_upcycle's MoE (2 blocks, the first dense with moe_first_dense, experts as
 * wide as the dense MLP; Mixtral's names, or Qwen3-MoE's with the dense first block). */
static ts_model_config upcycle_tiny(bool first_dense)
{
    ts_config c;
    ts_test_tiny_llama(&c, 70, 8);
    c.model.moe_experts = 4;
    c.model.moe_top_k = 2;
    c.model.moe_ffn_hidden = c.model.ffn_hidden;
    c.model.moe_norm_topk = true;
    c.model.moe_first_dense = first_dense ? 1 : 0;
    c.model.init_upcycle = true;
    snprintf(c.model.init, sizeof c.model.init, "dense");
    ts_config_resolve_model(&c.model);
    CHECKF(ts_config_validate(&c, 0) == TS_OK, "%s", ts_error_message());
    CHECK(ts_model_moe_mixtral(&c.model) == !first_dense);
    return c.model;
}

/* Where upcycled parameter `name` must come from in the dense model (its MLP's tensor
 * for an expert's, by Mixtral's or Qwen3-MoE's name), or NULL for a router. */
static const char *upcycle_origin(const char *name, char *buf, size_t cap)
{
    static const char *const roles[][2] = {
        {"gate_proj", "gate_proj"}, {"up_proj", "up_proj"}, {"down_proj", "down_proj"},
        {"w1", "gate_proj"}, {"w3", "up_proj"}, {"w2", "down_proj"}};
    int b = -1, j = -1, used = 0;
    char role[16] = "";
    if (strstr(name, ".gate.weight")) return NULL;
    if ((sscanf(name, "model.layers.%d.block_sparse_moe.experts.%d.%15[a-z_0-9]%n", &b, &j, role,
                &used) == 3 ||
         sscanf(name, "model.layers.%d.mlp.experts.%d.%15[a-z_0-9]%n", &b, &j, role, &used) == 3) &&
        used > 0)
        for (size_t r = 0; r < sizeof roles / sizeof roles[0]; r++)
            if (!strcmp(role, roles[r][0])) {
                snprintf(buf, cap, "model.layers.%d.mlp.%s.weight", b, roles[r][1]);
                return buf;
            }
    return name;
}

/* Whether dst's local elements of parameter p are src's parameter q's logical ones. */
static bool same_slices_of(const ts_model *src, int q, const ts_model *dst, int p)
{
    const float *w = ts_param_data(src, q), *got = ts_param_data(dst, p);
    ts_shard_run r;
    for (ts_shard_iter it = ts_shard_iter_begin(&dst->params[p].shard, 0, dst->params[p].numel);
         ts_shard_next(&it, &r);)
        if (memcmp(got + r.local, w + r.logical, r.len * sizeof(float)) != 0) return false;
    return true;
}

/* model.init_upcycle: every routed expert of every ep and etp rank is its slice of the
 * dense MLP (gate and up rows, down columns under etp), bit for bit; every router is
 * the one a random init from the seed draws (a fresh MoE's, by index); every other
 * tensor the dense model's by name, the dense first block's MLP included. MoE weights
 * and a dense MLP of another width are refused, naming the key. */
static void test_model_init_upcycle(void)
{
    char path[512], buf[128];
    path_in(path, sizeof path, "dense.safetensors");
    for (int first_dense = 0; first_dense <= 1; first_dense++) {
        const ts_model_config mc = upcycle_tiny(first_dense);
        ts_model_config dc = mc;
        dc.moe_experts = 0;
        ts_model dense, fresh;
        ts_model_build(&dense, &(ts_model_spec){.arch = &dc, .k = &ts_kernels_cpu});
        ts_model_init_random(&dense, 21);
        ts_model_build(&fresh, &(ts_model_spec){.arch = &mc, .k = &ts_kernels_cpu});
        ts_model_init_random(&fresh, 5);
        ts_st_entry e[64];
        void *bufs[64];
        CHECK(dense.n_params <= 64);
        CHECK(write_entries(path, e, entries_of(&dense, TS_DT_F32, e, bufs, NULL)) == TS_OK);
        const int grids[][2] = {{1, 1}, {2, 2}}; /* ep, etp: each rank its experts' halves */
        for (int g = 0; g < 2; g++)
            for (int r = 0; r < grids[g][0] * grids[g][1]; r++) {
                const int ep = grids[g][0], etp = grids[g][1];
                ts_comm gr[2] = {{.size = ep, .rank = r / etp, .name = "ep"},
                                 {.size = etp, .rank = r % etp, .name = "etp"}};
                ts_model dst;
                ts_model_build(&dst, &(ts_model_spec){.arch = &mc, .k = &ts_kernels_cpu,
                                                      .ep = &gr[0], .etp = &gr[1]});
                ts_error_clear();
                CHECKF(ts_ckpt_load_model_upcycle(&dst, path, 5) == TS_OK,
                       "ep %d etp %d rank %d: %s", ep, etp, r, ts_error_message());
                int experts = 0, routers = 0;
                for (int p = 0; p < dst.n_params; p++) {
                    const char *name = dst.params[p].shard.name;
                    const char *from = upcycle_origin(name, buf, sizeof buf);
                    const ts_model *src = from ? &dense : &fresh;
                    const int q = param_of(src, from ? from : name);
                    experts += from && from != name;
                    routers += !from;
                    CHECKF(q >= 0 && same_slices_of(src, q, &dst, p),
                           "ep %d etp %d rank %d: '%s' is not %s '%s'", ep, etp, r, name,
                           from ? "the dense" : "a fresh MoE's", from ? from : name);
                }
                /* Each MoE block's router, and 3 tensors of each of its local experts. */
                const int moe_blocks = 2 - first_dense;
                CHECKF(routers == moe_blocks && experts == moe_blocks * 3 * 4 / ep,
                       "ep %d rank %d: %d routers, %d expert tensors", ep, r, routers, experts);
                ts_model_free(&dst);
            }
        free_bufs(&dense, bufs);
        /* An MoE's own weights are no dense model's. */
        ts_model moe;
        ts_model_build(&moe, &(ts_model_spec){.arch = &mc, .k = &ts_kernels_cpu});
        CHECK(write_entries(path, e, entries_of(&fresh, TS_DT_F32, e, bufs, NULL)) == TS_OK);
        ts_error_clear();
        CHECK(ts_ckpt_load_model_upcycle(&moe, path, 5) == TS_ERR);
        CHECKF(contains(ts_error_message(), "holds routed experts' tensors") &&
                   contains(ts_error_message(), "model.init_upcycle"),
               "%s", ts_error_message());
        /* A dense MLP of another width than the experts' (with a dense first block,
         * that block's is refused first, as model.init refuses any wrong shape). */
        ts_model_config wide = dc;
        wide.ffn_hidden = 2 * dc.ffn_hidden;
        ts_model w;
        ts_model_build(&w, &(ts_model_spec){.arch = &wide, .k = &ts_kernels_cpu});
        CHECK(write_entries(path, e, entries_of(&w, TS_DT_F32, e, bufs, NULL)) == TS_OK);
        ts_error_clear();
        CHECK(ts_ckpt_load_model_upcycle(&moe, path, 5) == TS_ERR);
        CHECKF(contains(ts_error_message(), "model.layers.0.mlp.gate_proj.weight' has shape "
                                            "[96,32]") &&
                   (first_dense || contains(ts_error_message(), "model.moe_ffn_hidden = 48")),
               "%s", ts_error_message());
        ts_model_free(&w);
        ts_model_free(&moe);
        ts_model_free(&fresh);
        ts_model_free(&dense);
    }
}

int main(void)
{
    ts_test_make_dir(g_dir, sizeof g_dir, "ts_st");
    test_safetensors_round_trip();
    test_safetensors_partial_reads();
    test_safetensors_expect_f32();
    test_safetensors_rejects();
    test_safetensors_writer_rejects();
    test_safetensors_fuzz();
    test_model_init_bf16_f16();
    test_model_init_llama_checks();
    test_model_init_hf_dirs();
    test_model_init_expert_parallel();
    test_model_init_upcycle();
    ts_test_remove_dir(g_dir);
    return ts_test_report();
}
