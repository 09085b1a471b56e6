/* Loading a tokenizer (ranks file, sha256, pattern), its accessors, and decoding. */
#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/env.h"
#include "core/fsutil.h"
#include "tokenizer/tok_internal.h"

/* The whole ranks file (llama3's is 2.2 MB). Opened so that it cannot block and checked
 * to be a regular file (core/fsutil.h), as every input is: a FIFO given as --ranks would
 * otherwise wait for a writer forever. */
#define TS_RANKS_MAX_BYTES (256ull << 20)
static ts_status read_file(const char *path, unsigned char **data, size_t *len)
{
    FILE *f = ts_fopen_input(path);
    if (!f)
        return ts_fail("cannot open the ranks file %s: %s; get the tokenizers with "
                       "scripts/fetch_tokenizers.sh (or set TS_TOKENIZER_DIR)",
                       path, strerror(errno));
    if (ts_check_input(fileno(f), path, "the ranks file", "a tiktoken ranks file",
                       TS_RANKS_MAX_BYTES) != TS_OK) {
        fclose(f);
        return TS_ERR;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        fclose(f);
        return ts_fail("the ranks file %s: %s", path, strerror(errno));
    }
    size_t n = (size_t)st.st_size;
    unsigned char *buf = ts_malloc(n + 1);
    size_t got = fread(buf, 1, n, f);
    int bad = ferror(f) || got != n;
    fclose(f);
    if (bad) {
        free(buf);
        return ts_fail("cannot read the ranks file %s (%zu of %zu bytes): %s", path, got, n,
                       strerror(errno));
    }
    *data = buf;
    *len = n;
    return TS_OK;
}

static ts_status sha256_hex(const unsigned char *data, size_t len, char hex[65])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdn = 0;
    if (EVP_Digest(data, len, md, &mdn, EVP_sha256(), NULL) != 1 || mdn != 32)
        return ts_fail("OpenSSL could not compute a sha256");
    for (unsigned i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
    return TS_OK;
}

/* The byte-level "encoding": token = byte, no file. */
static void bytes_ranks(ts_tok_ranks *r)
{
    memset(r, 0, sizeof *r);
    r->n = 256;
    r->bytes = ts_malloc(256);
    r->offset = ts_malloc(257 * sizeof *r->offset);
    for (unsigned i = 0; i <= 256; i++) {
        if (i < 256) r->bytes[i] = (unsigned char)i;
        r->offset[i] = i;
    }
}

static ts_status compile_pattern(ts_tokenizer *t)
{
    int err;
    PCRE2_SIZE erroff;
    t->re = pcre2_compile((PCRE2_SPTR)t->enc->pattern, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP, &err, &erroff, NULL);
    if (!t->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return ts_fail("PCRE2 rejected the %s pattern at offset %zu: %s (is libpcre2-8 "
                       "built with Unicode support?)",
                       t->enc->name, (size_t)erroff, (const char *)msg);
    }
    /* Without a JIT (a platform PCRE2 has none for) pcre2_match interprets: slower,
     * same results. */
    t->jit = pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE) == 0;
    return TS_OK;
}

static int any_size_allowed(void)
{
    const char *v = ts_env(TS_ENV_TEST_TOKENIZER_ANY_SIZE);
    return v && strcmp(v, "1") == 0;
}

static ts_status pick_encoding(ts_tokenizer *t, const char *encoding, uint32_t n_ranks)
{
    if (!encoding || strcmp(encoding, "auto") == 0) {
        if (n_ranks == 50256) t->enc = ts_tok_encoding_get(TS_ENC_GPT2);
        else if (n_ranks == 128000) t->enc = ts_tok_encoding_get(TS_ENC_LLAMA3);
        else
            return ts_fail("%s: %u ranks is neither gpt2's 50256 nor llama3's 128000; name "
                           "the encoding (gpt2 or llama3)",
                           t->path, n_ranks);
        return TS_OK;
    }
    if (t->enc->n_ranks != n_ranks && !any_size_allowed())
        return ts_fail("%s: %u ranks is the wrong size for --encoding %s (which has %u): "
                       "wrong file for the encoding? fetch it with "
                       "scripts/fetch_tokenizers.sh",
                       t->path, n_ranks, t->enc->name, t->enc->n_ranks);
    return TS_OK;
}

ts_status ts_tokenizer_open(ts_tokenizer **out, const char *encoding, const char *ranks_path)
{
    *out = NULL;
    int automatic = !encoding || strcmp(encoding, "auto") == 0;
    ts_encoding_kind kind = TS_ENC_GPT2;
    if (!automatic && ts_encoding_parse(encoding, &kind) != 0)
        return ts_fail("unknown encoding '%s': use gpt2, llama3 or bytes", encoding);
    ts_tokenizer *t = ts_calloc(1, sizeof *t);
    t->enc = ts_tok_encoding_get(kind);
    if (kind == TS_ENC_BYTES) {
        bytes_ranks(&t->ranks);
        t->path = ts_calloc(1, 1);
        *out = t;
        return TS_OK;
    }
    char defpath[4096];
    if (!ranks_path) {
        if (automatic) {
            free(t);
            return ts_fail("encoding auto needs a ranks file (it is chosen by the file's "
                           "number of ranks); name the encoding or the file");
        }
        if (ts_tokenizer_default_path(encoding, defpath, sizeof defpath) != TS_OK) {
            free(t);
            return TS_ERR;
        }
        ranks_path = defpath;
    }
    t->path = ts_malloc(strlen(ranks_path) + 1);
    strcpy(t->path, ranks_path);
    unsigned char *data = NULL;
    size_t len = 0;
    ts_status st = read_file(t->path, &data, &len);
    if (st == TS_OK) st = sha256_hex(data, len, t->sha256);
    if (st == TS_OK) st = ts_tok_ranks_parse(&t->ranks, data, len, t->path);
    free(data);
    if (st == TS_OK) st = pick_encoding(t, encoding, t->ranks.n);
    if (st == TS_OK) st = compile_pattern(t);
    if (st != TS_OK) {
        ts_tokenizer_free(t);
        return TS_ERR;
    }
    *out = t;
    return TS_OK;
}

void ts_tokenizer_free(ts_tokenizer *t)
{
    if (!t) return;
    ts_tok_ranks_free(&t->ranks);
    pcre2_code_free(t->re);
    free(t->path);
    free(t);
}

ts_encoding_kind ts_tokenizer_kind(const ts_tokenizer *t) { return t->enc->kind; }
const char *ts_tokenizer_sha256(const ts_tokenizer *t) { return t->sha256; }
const char *ts_tokenizer_path(const ts_tokenizer *t) { return t->path; }

uint32_t ts_tokenizer_vocab_size(const ts_tokenizer *t)
{
    return t->ranks.n + t->enc->n_specials;
}

int64_t ts_tokenizer_doc_token(const ts_tokenizer *t)
{
    if (t->enc->n_specials == 0) return -1;
    return (int64_t)t->ranks.n + t->enc->doc_special;
}

int64_t ts_tokenizer_special_id(const ts_tokenizer *t, const char *text)
{
    for (uint32_t i = 0; i < t->enc->n_specials; i++)
        if (strcmp(t->enc->specials[i], text) == 0) return (int64_t)t->ranks.n + i;
    return -1;
}

const unsigned char *ts_tok_token_bytes(const ts_tokenizer *t, uint32_t id, size_t *len)
{
    if (id < t->ranks.n) {
        *len = t->ranks.offset[id + 1] - t->ranks.offset[id];
        return t->ranks.bytes + t->ranks.offset[id];
    }
    if (id - t->ranks.n < t->enc->n_specials) {
        const char *s = t->enc->specials[id - t->ranks.n];
        *len = strlen(s);
        return (const unsigned char *)s;
    }
    *len = 0;
    return NULL;
}
