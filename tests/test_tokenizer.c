/* The BPE tokenizer against tiktoken's own ids (tests/fixtures/bpe, written by
 * tests/make_bpe_fixture.py): a small ranks file under both encodings' patterns always,
 * the real gpt2 and llama3 files when they are installed (skipped with a message
 * otherwise); decode(encode(x)) == x for every text and random bytes; the heap merge
 * against tiktoken's linear scan; every malformed ranks file's error. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "test_util.h"
#include "support/tok_decode.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    unsigned char *b;
    size_t n;
} text;

static char g_dir[4096]; /* tests/fixtures/bpe */

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = ts_malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    buf[got] = 0;
    if (len) *len = got;
    return buf;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

static text *load_texts(size_t *count)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/texts.hex", g_dir);
    char *s = slurp(path, NULL);
    if (!s) {
        fprintf(stderr, "cannot read %s\n", path);
        exit(1);
    }
    size_t cap = 0, n = 0;
    text *t = NULL;
    for (char *line = strtok(s, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] != 'x') continue;
        size_t hl = strlen(line + 1);
        if (n == cap) t = ts_grow(t, &cap, n, sizeof *t);
        t[n].n = hl / 2;
        t[n].b = ts_malloc(hl / 2 + 1);
        for (size_t i = 0; i < hl / 2; i++)
            t[n].b[i] = (unsigned char)(hexval(line[1 + 2 * i]) << 4 | hexval(line[2 + 2 * i]));
        n++;
    }
    free(s);
    *count = n;
    return t;
}

static void free_texts(text *t, size_t n)
{
    for (size_t i = 0; i < n; i++) free(t[i].b);
    free(t);
}

/* Parse "o 1 2 3" into ids; returns the count. */
static size_t parse_ids(const char *s, uint32_t **ids)
{
    size_t cap = 0, n = 0;
    *ids = NULL;
    while (*s) {
        while (*s == ' ') s++;
        if (!*s) break;
        char *end;
        unsigned long v = strtoul(s, &end, 10);
        if (n == cap) *ids = ts_grow(*ids, &cap, n, sizeof **ids);
        (*ids)[n++] = (uint32_t)v;
        s = end;
    }
    return n;
}

static int same_ids(const ts_tok_ids *got, const uint32_t *want, size_t n)
{
    return got->n == n && (n == 0 || memcmp(got->ids, want, n * sizeof *want) == 0);
}

static void print_mismatch(const char *what, size_t ti, const ts_tok_ids *got, const uint32_t *want,
                           size_t n)
{
    fprintf(stderr, "  %s text %zu: got %zu ids, want %zu;", what, ti, got->n, n);
    size_t m = got->n < n ? got->n : n, i = 0;
    while (i < m && got->ids[i] == want[i]) i++;
    fprintf(stderr, " first difference at %zu (got %u, want %u)\n", i,
            i < got->n ? got->ids[i] : 0, i < n ? want[i] : 0);
}

/* Every text's encode and encode_special against the expected file; returns mismatches. */
static int check_expected(const ts_tokenizer *tok, const char *file, const text *t, size_t nt)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", g_dir, file);
    char *s = slurp(path, NULL);
    CHECKF(s != NULL, "cannot read %s", path);
    if (!s) return 1;
    ts_tok_encoder *enc;
    CHECK(ts_tok_encoder_new(tok, &enc) == TS_OK);
    int bad = 0;
    size_t ti = 0;
    uint32_t *ord = NULL;
    size_t n_ord = 0;
    char *save;
    for (char *line = strtok_r(s, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#') continue;
        if (ti >= nt) {
            bad++;
            break;
        }
        ts_tok_ids got = {0};
        uint32_t *want;
        size_t n;
        if (line[0] == 'o') {
            free(ord);
            n_ord = parse_ids(line + 1, &ord);
            ts_tok_encode(enc, (const char *)t[ti].b, t[ti].n, &got, NULL) == TS_OK ? 0 : bad++;
            if (!same_ids(&got, ord, n_ord)) {
                print_mismatch(file, ti, &got, ord, n_ord);
                bad++;
            }
        } else {
            int eq = strcmp(line, "s =") == 0;
            n = eq ? n_ord : parse_ids(line + 1, &want);
            if (eq) want = ord;
            ts_tok_encode_special(enc, (const char *)t[ti].b, t[ti].n, &got, NULL) == TS_OK ? 0
                                                                                           : bad++;
            if (!same_ids(&got, want, n)) {
                print_mismatch(file, ti, &got, want, n);
                bad++;
            }
            if (!eq) free(want);
            ti++;
        }
        free(got.ids);
    }
    free(ord);
    CHECKF(ti == nt, "%s has expectations for %zu texts, texts.hex has %zu", file, ti, nt);
    ts_tok_encoder_free(enc);
    free(s);
    return bad;
}

static void roundtrip(const ts_tokenizer *tok, const unsigned char *b, size_t n, int *bad)
{
    ts_tok_encoder *enc;
    if (ts_tok_encoder_new(tok, &enc) != TS_OK) {
        (*bad)++;
        return;
    }
    for (int special = 0; special < 2; special++) {
        ts_tok_ids ids = {0};
        ts_status st = special ? ts_tok_encode_special(enc, (const char *)b, n, &ids, NULL)
                               : ts_tok_encode(enc, (const char *)b, n, &ids, NULL);
        unsigned char *dec = NULL;
        size_t dn = 0;
        if (st != TS_OK || ts_tok_decode(tok, ids.ids, ids.n, &dec, &dn) != TS_OK || dn != n ||
            (n && memcmp(dec, b, n) != 0))
            (*bad)++;
        free(dec);
        free(ids.ids);
    }
    ts_tok_encoder_free(enc);
}

static void test_roundtrips(const ts_tokenizer *tok, const text *t, size_t nt)
{
    int bad = 0;
    for (size_t i = 0; i < nt; i++) roundtrip(tok, t[i].b, t[i].n, &bad);
    unsigned char buf[300];
    for (int r = 0; r < 300; r++) {
        size_t n = ts_test_next_u64() % sizeof buf;
        for (size_t i = 0; i < n; i++) {
            uint64_t x = ts_test_next_u64();
            /* mostly ASCII, some high bytes: valid and invalid UTF-8 mixed */
            buf[i] = (x & 3) ? (unsigned char)(' ' + (x >> 8) % 95) : (unsigned char)(x >> 16);
        }
        roundtrip(tok, buf, n, &bad);
    }
    CHECKF(bad == 0, "%d round trips of %s differ", bad, ts_encoding_name(ts_tokenizer_kind(tok)));
}

/* The heap merge picks the same pairs as tiktoken's linear scan. */
static void test_merge_agree(const ts_tokenizer *tok)
{
    ts_tok_merge_scratch s = {0};
    int bad = 0;
    unsigned char buf[400];
    const char *alpha = "eeettthhhaaannssrrdd  ";
    for (int r = 0; r < 500; r++) {
        size_t n = 2 + ts_test_next_u64() % (sizeof buf - 2);
        for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)alpha[ts_test_next_u64() % 22];
        ts_tok_ids a = {0}, b = {0};
        ts_tok_merge_linear(&tok->ranks, buf, n, &s, &a);
        ts_tok_merge_heap(&tok->ranks, buf, n, &s, &b);
        if (a.n != b.n || memcmp(a.ids, b.ids, a.n * sizeof *a.ids) != 0) bad++;
        free(a.ids);
        free(b.ids);
    }
    ts_tok_merge_scratch_free(&s);
    CHECKF(bad == 0, "%d of 500 random pieces merge differently with the heap", bad);
}

/* A stop flag (tessera data's SIGTERM) ends an encode before its next piece, and a
 * long piece's heap merge by itself (a 100 MB piece takes seconds to merge); a clear
 * flag changes nothing. */
static void test_stop(const ts_tokenizer *tok)
{
    size_t n = 1 << 20;
    char *s = malloc(n);
    CHECK(s != NULL);
    if (!s) return;
    s[0] = ' ';
    for (size_t i = 1; i < n; i++) s[i] = (i & 1) ? 'i' : 'n'; /* one 1 MiB piece " inin..." */
    ts_tok_encoder *enc;
    CHECK(ts_tok_encoder_new(tok, &enc) == TS_OK);
    volatile sig_atomic_t stop = 0;
    ts_tok_encoder_set_stop(enc, &stop);
    ts_tok_ids ids = {0};
    CHECK(ts_tok_encode(enc, s, n, &ids, NULL) == TS_OK && ids.n > 0);
    stop = SIGTERM;
    ids.n = 0;
    CHECK(ts_tok_encode(enc, s, n, &ids, NULL) == TS_ERR && ts_tok_encoder_stopped_at(enc) == 0);
    CHECKF(strstr(ts_error_message(), "stopped at byte 0 of 1048576") != NULL, "%s",
           ts_error_message());
    ts_tok_merge_scratch sc = {0};
    sc.stop = &stop;
    CHECK(ts_tok_merge_heap(&tok->ranks, (const unsigned char *)s + 1, n - 1, &sc, &ids) == TS_ERR);
    ts_tok_merge_scratch_free(&sc);
    free(ids.ids);
    ts_tok_encoder_free(enc);
    free(s);
}

static void test_small(const text *t, size_t nt)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/small.tiktoken", g_dir);
    setenv("TS_TEST_TOKENIZER_ANY_SIZE", "1", 1);
    const char *names[2] = {"gpt2", "llama3"};
    const char *files[2] = {"expected_small_gpt2.txt", "expected_small_llama3.txt"};
    for (int e = 0; e < 2; e++) {
        ts_tokenizer *tok = NULL;
        ts_status st = ts_tokenizer_open(&tok, names[e], path);
        CHECKF(st == TS_OK, "%s", ts_error_message());
        if (st != TS_OK) continue;
        CHECK(ts_tokenizer_vocab_size(tok) == 3000 + (e ? 256 : 1));
        CHECK(ts_tokenizer_doc_token(tok) == 3000);
        CHECK(strlen(ts_tokenizer_sha256(tok)) == 64);
        if (e == 1) {
            CHECK(ts_tokenizer_special_id(tok, "<|eot_id|>") == 3009);
            CHECK(ts_tokenizer_special_id(tok, "<|reserved_special_token_245|>") == 3255);
        } else {
            CHECK(ts_tokenizer_special_id(tok, "<|endoftext|>") == 3000);
        }
        CHECK(ts_tokenizer_special_id(tok, "<|nope|>") == -1);
        int bad = check_expected(tok, files[e], t, nt);
        CHECKF(bad == 0, "%d mismatches against tiktoken in %s", bad, files[e]);
        test_roundtrips(tok, t, nt);
        test_merge_agree(tok);
        test_stop(tok);
        ts_tok_encoder *enc;
        CHECK(ts_tok_encoder_new(tok, &enc) == TS_OK);
        ts_tok_ids ids = {0};
        uint64_t inval = 99;
        const char *mixed = "ok\xffok <|endoftext|>\xed\xa0\x80 \xc3";
        CHECK(ts_tok_encode(enc, mixed, strlen(mixed), &ids, &inval) == TS_OK && inval == 5);
        inval = 99;
        CHECK(ts_tok_encode_special(enc, mixed, strlen(mixed), &ids, &inval) == TS_OK &&
              inval == 5);
        free(ids.ids);
        ts_tok_encoder_free(enc);
        size_t len;
        const unsigned char *b = ts_tok_token_bytes(tok, 3000, &len);
        CHECK(b && len == (e ? 17u : 13u));
        CHECK(ts_tok_token_bytes(tok, ts_tokenizer_vocab_size(tok), &len) == NULL);
        uint32_t badid[2] = {65, ts_tokenizer_vocab_size(tok)};
        unsigned char *dec;
        size_t dn;
        CHECK(ts_tok_decode(tok, badid, 2, &dec, &dn) == TS_ERR);
        CHECK(strstr(ts_error_message(), "token 1") != NULL);
        ts_tokenizer_free(tok);
    }
    /* without the test switch the small file is the wrong size for a named encoding */
    unsetenv("TS_TEST_TOKENIZER_ANY_SIZE");
    ts_tokenizer *tok = NULL;
    CHECK(ts_tokenizer_open(&tok, "gpt2", path) == TS_ERR && tok == NULL);
    CHECKF(strstr(ts_error_message(), "wrong size for --encoding gpt2") != NULL, "%s",
           ts_error_message());
    CHECK(ts_tokenizer_open(&tok, "auto", path) == TS_ERR);
    CHECK(strstr(ts_error_message(), "name the encoding") != NULL);
}

static void test_real(const text *t, size_t nt)
{
    const char *names[2] = {"gpt2", "llama3"};
    const char *sha[2] = {"306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930",
                          "82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55"};
    const char *files[2] = {"expected_gpt2.txt", "expected_llama3.txt"};
    for (int e = 0; e < 2; e++) {
        char path[4096];
        struct stat st;
        if (ts_tokenizer_default_path(names[e], path, sizeof path) != TS_OK ||
            stat(path, &st) != 0) {
            printf("skipped: the real %s ranks (%s) are not installed: "
                   "scripts/fetch_tokenizers.sh gets them\n",
                   names[e], path);
            continue;
        }
        ts_tokenizer *tok = NULL;
        ts_status s = ts_tokenizer_open(&tok, names[e], NULL);
        CHECKF(s == TS_OK, "%s", ts_error_message());
        if (s != TS_OK) continue;
        if (strcmp(ts_tokenizer_sha256(tok), sha[e]) != 0) {
            printf("skipped: %s is not the pinned %s ranks file (sha256 %s)\n", path, names[e],
                   ts_tokenizer_sha256(tok));
            ts_tokenizer_free(tok);
            continue;
        }
        CHECK(ts_tokenizer_vocab_size(tok) == (e ? 128256u : 50257u));
        CHECK(ts_tokenizer_doc_token(tok) == (e ? 128000 : 50256));
        if (e) CHECK(ts_tokenizer_special_id(tok, "<|eot_id|>") == 128009);
        ts_tokenizer *autotok = NULL;
        CHECK(ts_tokenizer_open(&autotok, "auto", path) == TS_OK &&
              ts_tokenizer_kind(autotok) == (e ? TS_ENC_LLAMA3 : TS_ENC_GPT2));
        ts_tokenizer_free(autotok);
        int bad = check_expected(tok, files[e], t, nt);
        CHECKF(bad == 0, "%d mismatches against tiktoken in %s", bad, files[e]);
        test_roundtrips(tok, t, nt);
        printf("checked the real %s ranks against tiktoken (%zu texts)\n", names[e], nt);
        ts_tokenizer_free(tok);
    }
}

/* A malformed ranks file: the error says what and where. */
static void expect_bad(const char *dir, const char *name, const char *content, const char *want)
{
    const char *p = ts_test_write_file(dir, name, content);
    char path[512];
    snprintf(path, sizeof path, "%s", p);
    ts_tokenizer *tok = NULL;
    ts_status st = ts_tokenizer_open(&tok, "gpt2", path);
    CHECKF(st == TS_ERR && tok == NULL, "%s: accepted", name);
    CHECKF(strstr(ts_error_message(), want) != NULL, "%s: message '%s' lacks '%s'", name,
           ts_error_message(), want);
}

/* The 256 single bytes as ranks 0..255, then `extra` verbatim. */
static char *byte_ranks(const char *extra)
{
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t cap = 256 * 16 + strlen(extra) + 1, o = 0;
    char *s = ts_malloc(cap);
    for (unsigned b = 0; b < 256; b++)
        o += (size_t)snprintf(s + o, cap - o, "%c%c== %u\n", b64[b >> 2], b64[(b & 3) << 4], b);
    snprintf(s + o, cap - o, "%s", extra);
    return s;
}

static void test_bad_files(void)
{
    char dir[256];
    ts_test_make_dir(dir, sizeof dir, "ts_tok");
    setenv("TS_TEST_TOKENIZER_ANY_SIZE", "1", 1);
    char *s;
    s = byte_ranks("aGk= 256\n");
    expect_bad(dir, "empty", "", "at least the 256");
    ts_tokenizer *tok = NULL;
    const char *p = ts_test_write_file(dir, "good", s);
    CHECKF(ts_tokenizer_open(&tok, "gpt2", p) == TS_OK, "%s", ts_error_message());
    if (tok) CHECK(ts_tokenizer_vocab_size(tok) == 258);
    ts_tokenizer_free(tok);
    free(s);
    s = byte_ranks("aG!= 256\n");
    expect_bad(dir, "bad_b64", s, ":257: bad base64");
    free(s);
    s = byte_ranks("aGk 256\n");
    expect_bad(dir, "bad_b64_len", s, ":257: bad base64");
    free(s);
    s = byte_ranks("aGl= 256\n"); /* non-canonical: unused bits set */
    expect_bad(dir, "bad_b64_bits", s, ":257: bad base64");
    free(s);
    s = byte_ranks(" 256\n");
    expect_bad(dir, "empty_token", s, ":257: bad base64");
    free(s);
    s = byte_ranks("aGk= 25x\n");
    expect_bad(dir, "bad_rank", s, ":257: the rank '25x' is not a number");
    free(s);
    s = byte_ranks("aGk= -1\n");
    expect_bad(dir, "neg_rank", s, ":257: the rank '-1' is not a number");
    free(s);
    s = byte_ranks("aGk=\n");
    expect_bad(dir, "no_rank", s, ":257: no space");
    free(s);
    s = byte_ranks("aGk= 256\n\naGo= 257\n");
    expect_bad(dir, "empty_line", s, ":258: an empty line");
    free(s);
    s = byte_ranks("aGk= 256\naGo= 256\n");
    expect_bad(dir, "dup_rank", s, ":258: rank 256 again (first at line 257)");
    free(s);
    s = byte_ranks("aGk= 256\naGk= 257\n");
    expect_bad(dir, "dup_bytes", s, ":258: the bytes of rank 257 are those of rank 256 (line 257)");
    free(s);
    s = byte_ranks("aGk= 257\n");
    expect_bad(dir, "gap", s, ":257: rank 257 leaves a gap");
    free(s);
    s = byte_ranks("aGk= 256\r\n");
    expect_bad(dir, "crlf", s, ":257: the line ends in a carriage return");
    free(s);
    /* byte 0x41 ('A' = QQ==) replaced by a two-byte token */
    s = byte_ranks("");
    char *q = strstr(s, "QQ== 65\n");
    memcpy(q, "QUE=", 4);
    expect_bad(dir, "missing_byte", s, "no rank for the single byte 0x41");
    free(s);
    ts_status st = ts_tokenizer_open(&tok, "gpt2", "/nonexistent/ranks.tiktoken");
    CHECK(st == TS_ERR && strstr(ts_error_message(), "cannot open the ranks file") != NULL);
    CHECK(ts_tokenizer_open(&tok, "gpt3", NULL) == TS_ERR &&
          strstr(ts_error_message(), "unknown encoding 'gpt3'") != NULL);
    CHECK(ts_tokenizer_open(&tok, "auto", NULL) == TS_ERR);
    unsetenv("TS_TEST_TOKENIZER_ANY_SIZE");
    s = byte_ranks("aGk= 256\n");
    p = ts_test_write_file(dir, "small", s);
    CHECK(ts_tokenizer_open(&tok, "llama3", p) == TS_ERR &&
          strstr(ts_error_message(), "257 ranks is the wrong size for --encoding llama3") != NULL);
    free(s);
    ts_test_remove_dir(dir);
}

static void test_bytes_and_names(void)
{
    ts_encoding_kind k;
    CHECK(ts_encoding_parse("gpt2", &k) == 0 && k == TS_ENC_GPT2);
    CHECK(ts_encoding_parse("llama3", &k) == 0 && k == TS_ENC_LLAMA3);
    CHECK(ts_encoding_parse("bytes", &k) == 0 && k == TS_ENC_BYTES);
    CHECK(ts_encoding_parse("GPT2", &k) == -1);
    CHECK(strcmp(ts_encoding_name(TS_ENC_LLAMA3), "llama3") == 0);
    char buf[4096], old[4096] = "";
    const char *was = getenv("TS_TOKENIZER_DIR");
    if (was) snprintf(old, sizeof old, "%s", was);
    setenv("TS_TOKENIZER_DIR", "/some/dir", 1);
    CHECK(ts_tokenizer_default_path("gpt2", buf, sizeof buf) == TS_OK &&
          strcmp(buf, "/some/dir/gpt2.tiktoken") == 0);
    if (was) setenv("TS_TOKENIZER_DIR", old, 1);
    else unsetenv("TS_TOKENIZER_DIR");
    ts_tokenizer *tok = NULL;
    CHECK(ts_tokenizer_open(&tok, "bytes", NULL) == TS_OK);
    if (!tok) return;
    CHECK(ts_tokenizer_vocab_size(tok) == 256 && ts_tokenizer_doc_token(tok) == -1);
    CHECK(strcmp(ts_tokenizer_sha256(tok), "") == 0 && strcmp(ts_tokenizer_path(tok), "") == 0);
    ts_tok_encoder *enc;
    CHECK(ts_tok_encoder_new(tok, &enc) == TS_OK);
    ts_tok_ids ids = {0};
    uint64_t inval = 99;
    CHECK(ts_tok_encode(enc, "a\xff\xc3\xa9", 4, &ids, &inval) == TS_OK);
    CHECK(ids.n == 4 && ids.ids[0] == 'a' && ids.ids[1] == 0xFF && inval == 1);
    free(ids.ids);
    ts_tok_encoder_free(enc);
    ts_tokenizer_free(tok);
}

/* test_tokenizer --encode ENCODING RANKS: hex lines on stdin, their ids (encode_ordinary)
 * one line each on stdout; tests/make_bpe_fixture.py --exhaustive compares every code
 * point in context against tiktoken with it (too large a fixture to commit). */
static int encode_tool(const char *encoding, const char *ranks)
{
    ts_tokenizer *tok;
    ts_tok_encoder *enc;
    if (ts_tokenizer_open(&tok, encoding, ranks) != TS_OK || ts_tok_encoder_new(tok, &enc) != TS_OK) {
        fprintf(stderr, "%s\n", ts_error_message());
        return 1;
    }
    size_t cap = 1 << 16;
    char *line = ts_malloc(cap);
    unsigned char *buf = ts_malloc(cap);
    size_t n = 0;
    int c;
    while ((c = getchar()) != EOF) {
        if (c != '\n') {
            if (n + 1 >= cap) {
                cap *= 2;
                line = realloc(line, cap);
                buf = realloc(buf, cap);
                if (!line || !buf) return 1;
            }
            line[n++] = (char)c;
            continue;
        }
        for (size_t i = 0; i + 1 < n; i += 2)
            buf[i / 2] = (unsigned char)(hexval(line[i]) << 4 | hexval(line[i + 1]));
        ts_tok_ids ids = {0};
        if (ts_tok_encode(enc, (const char *)buf, n / 2, &ids, NULL) != TS_OK) return 1;
        for (size_t i = 0; i < ids.n; i++) printf(i ? " %u" : "%u", ids.ids[i]);
        putchar('\n');
        free(ids.ids);
        n = 0;
    }
    free(line);
    free(buf);
    ts_tok_encoder_free(enc);
    ts_tokenizer_free(tok);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--encode") == 0) return encode_tool(argv[2], argv[3]);
    const char *src = getenv("TS_SOURCE_DIR");
    snprintf(g_dir, sizeof g_dir, "%s/tests/fixtures/bpe", src ? src : ".");
    size_t nt;
    text *t = load_texts(&nt);
    CHECK(nt > 400);
    test_bytes_and_names();
    test_small(t, nt);
    test_bad_files();
    test_real(t, nt);
    free_texts(t, nt);
    return ts_test_report();
}
