/* tiktoken's ranks format: one `base64(bytes) rank` line per token, ranks 0..n-1 in any
 * order. Parsed strictly, because a damaged file would otherwise tokenize silently
 * differently: every error names path:line and says what is wrong. */
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

/* 1 for base64's 64 alphabet characters. */
static int b64_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Strict base64: whole quads, the alphabet only, '=' only as the last one or two
 * characters, and the bits padding leaves unused zero (the one canonical spelling).
 * Decodes with OpenSSL; returns the decoded length or -1. */
static long b64_decode_strict(const unsigned char *s, size_t n, unsigned char *out)
{
    if (n == 0 || n % 4 != 0) return -1;
    size_t pad = 0;
    if (s[n - 1] == '=') pad = (s[n - 2] == '=') ? 2 : 1;
    for (size_t i = 0; i < n - pad; i++)
        if (b64_value(s[i]) < 0) return -1;
    if (pad == 2 && (b64_value(s[n - 3]) & 0x0F)) return -1;
    if (pad == 1 && (b64_value(s[n - 2]) & 0x03)) return -1;
    int got = EVP_DecodeBlock(out, s, (int)n);
    if (got < 0 || (size_t)got != n / 4 * 3) return -1;
    return (long)(got - (long)pad);
}

typedef struct {
    uint64_t off; /* into the decoded scratch */
    uint32_t len;
    uint32_t rank;
} line_entry;

static ts_status parse_lines(const unsigned char *data, size_t len, const char *path,
                             line_entry **lines_out, size_t *n_out, unsigned char **dec_out)
{
    size_t n_lines = 0;
    for (size_t i = 0; i < len; i++) n_lines += data[i] == '\n';
    if (len && data[len - 1] != '\n') n_lines++;
    line_entry *lines = ts_malloc((n_lines ? n_lines : 1) * sizeof *lines);
    unsigned char *dec = ts_malloc(len / 4 * 3 + 4);
    size_t pos = 0, n = 0;
    uint64_t dec_len = 0;
    while (pos < len) {
        const unsigned char *line = data + pos;
        const unsigned char *nl = memchr(line, '\n', len - pos);
        size_t ll = nl ? (size_t)(nl - line) : len - pos;
        size_t lineno = n + 1;
        pos += ll + (nl != NULL);
        const unsigned char *sp = memchr(line, ' ', ll);
        if (ll == 0 || !sp) {
            free(lines);
            free(dec);
            return ts_fail("%s:%zu: %s: a ranks line is `base64(bytes) rank` (tiktoken's "
                           "format); is this a tiktoken ranks file?",
                           path, lineno, ll == 0 ? "an empty line" : "no space in the line");
        }
        size_t b64n = (size_t)(sp - line);
        long got = b64_decode_strict(line, b64n, dec + dec_len);
        if (got <= 0) {
            free(lines);
            free(dec);
            return ts_fail("%s:%zu: bad base64 token '%.*s' (standard alphabet, padded, "
                           "non-empty); the file is damaged: fetch it again "
                           "(scripts/fetch_tokenizers.sh)",
                           path, lineno, (int)(b64n < 60 ? b64n : 60), (const char *)line);
        }
        const unsigned char *num = sp + 1;
        size_t numn = ll - b64n - 1;
        uint64_t rank = 0;
        int ok = numn > 0 && numn <= 10;
        for (size_t i = 0; ok && i < numn; i++) {
            if (num[i] < '0' || num[i] > '9') ok = 0;
            else rank = rank * 10 + (uint64_t)(num[i] - '0');
        }
        if (numn && num[numn - 1] == '\r') {
            free(lines);
            free(dec);
            return ts_fail("%s:%zu: the line ends in a carriage return: ranks files have "
                           "LF line ends (convert it, e.g. with dos2unix, or fetch it again)",
                           path, lineno);
        }
        if (!ok || rank >= TS_TOK_NO_RANK) {
            free(lines);
            free(dec);
            return ts_fail("%s:%zu: the rank '%.*s' is not a number (decimal digits, below "
                           "2^32-1); the file is damaged: fetch it again",
                           path, lineno, (int)(numn < 30 ? numn : 30), (const char *)num);
        }
        lines[n].off = dec_len;
        lines[n].len = (uint32_t)got;
        lines[n].rank = (uint32_t)rank;
        dec_len += (uint64_t)got;
        n++;
    }
    *lines_out = lines;
    *n_out = n;
    *dec_out = dec;
    return TS_OK;
}

void ts_tok_ranks_free(ts_tok_ranks *r)
{
    free(r->bytes);
    free(r->offset);
    free(r->slots);
    memset(r, 0, sizeof *r);
}

ts_status ts_tok_ranks_parse(ts_tok_ranks *r, const unsigned char *data, size_t len,
                             const char *path)
{
    memset(r, 0, sizeof *r);
    line_entry *lines = NULL;
    unsigned char *dec = NULL;
    size_t n = 0;
    if (parse_lines(data, len, path, &lines, &n, &dec) != TS_OK) return TS_ERR;
    ts_status st = TS_ERR;
    uint32_t *line_of = NULL; /* rank -> line index + 1 */
    if (n < 256 || n >= TS_TOK_NO_RANK) {
        ts_fail("%s: %zu ranks; a byte-level BPE file has at least the 256 single bytes",
                path, n);
        goto done;
    }
    line_of = ts_calloc(n, sizeof *line_of);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t k = lines[i].rank;
        if (k >= n) {
            ts_fail("%s:%zu: rank %u leaves a gap: a file of %zu ranks numbers them 0..%zu "
                    "without gaps",
                    path, i + 1, k, n, n - 1);
            goto done;
        }
        if (line_of[k]) {
            ts_fail("%s:%zu: rank %u again (first at line %u): duplicate ranks", path, i + 1,
                    k, line_of[k]);
            goto done;
        }
        line_of[k] = (uint32_t)(i + 1);
        total += lines[i].len;
    }
    /* Every rank 0..n-1 now has exactly one line (n distinct values below n). */
    r->n = (uint32_t)n;
    r->bytes = ts_malloc(total ? total : 1);
    r->offset = ts_malloc((n + 1) * sizeof *r->offset);
    uint64_t off = 0;
    for (size_t k = 0; k < n; k++) {
        const line_entry *e = &lines[line_of[k] - 1];
        r->offset[k] = off;
        memcpy(r->bytes + off, dec + e->off, e->len);
        off += e->len;
    }
    r->offset[n] = off;
    uint64_t size = 1;
    while (size < 2 * (uint64_t)n) size <<= 1;
    r->mask = size - 1;
    r->slots = ts_calloc(size, sizeof *r->slots);
    for (uint32_t k = 0; k < n; k++) {
        const unsigned char *p = r->bytes + r->offset[k];
        size_t kl = r->offset[k + 1] - r->offset[k];
        uint32_t dup = ts_tok_rank_of(r, p, kl);
        if (dup != TS_TOK_NO_RANK) {
            ts_fail("%s:%u: the bytes of rank %u are those of rank %u (line %u) too: "
                    "duplicate byte strings",
                    path, line_of[k], k, dup, line_of[dup]);
            goto done;
        }
        uint64_t h = ts_tok_hash(p, kl), i = h & r->mask;
        while (r->slots[i]) i = (i + 1) & r->mask;
        r->slots[i] = (h >> 32) << 32 | (uint64_t)(k + 1);
    }
    for (unsigned b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        if (ts_tok_rank_of(r, &c, 1) == TS_TOK_NO_RANK) {
            ts_fail("%s: no rank for the single byte 0x%02X: byte-level BPE needs all 256 "
                    "bytes as tokens (every input must encode)",
                    path, b);
            goto done;
        }
    }
    st = TS_OK;
done:
    if (st != TS_OK) ts_tok_ranks_free(r);
    free(line_of);
    free(lines);
    free(dec);
    return st;
}
