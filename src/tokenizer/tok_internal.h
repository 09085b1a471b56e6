/* What the tokenizer's files share and nobody else sees: the loaded ranks (token bytes
 * and the byte-string -> rank hash), the encodings' patterns and special tokens, and the
 * merge step. The public API is tokenizer.h. */
#ifndef TS_TOK_INTERNAL_H
#define TS_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <signal.h> /* sig_atomic_t */
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tokenizer.h"

#define TS_TOK_NO_RANK UINT32_MAX

/* Byte strings of ranks 0..n-1 in one buffer, and an open-addressing hash table of
 * them (linear probing; the table is at least twice n, a power of 2). A slot holds the
 * key's hash's top 32 bits above rank + 1 (0 = empty), so a probe that meets another
 * key almost never compares bytes. */
typedef struct {
    uint32_t n;
    unsigned char *bytes; /* all tokens' bytes back to back */
    uint64_t *offset;     /* token r is bytes[offset[r] .. offset[r+1]) */
    uint64_t *slots;
    uint64_t mask;
} ts_tok_ranks;

/* Parse a ranks file's bytes (tiktoken's format) into ranks; errors name path:line. */
ts_status ts_tok_ranks_parse(ts_tok_ranks *r, const unsigned char *data, size_t len,
                             const char *path);
void ts_tok_ranks_free(ts_tok_ranks *r);

/* A 64-bit hash of a byte string: 8-byte words mixed by multiply and xor-shift. */
static inline uint64_t ts_tok_hash(const unsigned char *p, size_t len)
{
    const uint64_t m = 0x9E3779B97F4A7C15ull;
    uint64_t h = (uint64_t)len * m;
    while (len >= 8) {
        uint64_t w;
        __builtin_memcpy(&w, p, 8);
        h = (h ^ w) * m;
        h ^= h >> 29;
        p += 8;
        len -= 8;
    }
    if (len) {
        uint64_t w = 0;
        __builtin_memcpy(&w, p, len);
        h = (h ^ w ^ ((uint64_t)len << 59)) * m;
        h ^= h >> 29;
    }
    h *= 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 32);
}

/* The rank of a byte string whose ts_tok_hash is h, or TS_TOK_NO_RANK. */
static inline uint32_t ts_tok_rank_of_h(const ts_tok_ranks *r, const unsigned char *p, size_t len,
                                        uint64_t h)
{
    uint64_t i = h & r->mask;
    uint32_t tag = (uint32_t)(h >> 32);
    for (;;) {
        uint64_t s = r->slots[i];
        if (s == 0) return TS_TOK_NO_RANK;
        if ((uint32_t)(s >> 32) == tag) {
            uint32_t k = (uint32_t)s - 1;
            uint64_t o = r->offset[k];
            if (r->offset[k + 1] - o == len && __builtin_memcmp(r->bytes + o, p, len) == 0)
                return k;
        }
        i = (i + 1) & r->mask;
    }
}

/* The rank of a byte string, or TS_TOK_NO_RANK. */
static inline uint32_t ts_tok_rank_of(const ts_tok_ranks *r, const unsigned char *p, size_t len)
{
    return ts_tok_rank_of_h(r, p, len, ts_tok_hash(p, len));
}

/* One encoding's fixed facts. */
typedef struct {
    ts_encoding_kind kind;
    const char *name;
    uint32_t n_ranks;        /* the real file's rank count */
    const char *pattern;     /* PCRE2 form, exact to tiktoken's fancy-regex pattern */
    const char *const *specials; /* texts, numbered from the rank count */
    uint32_t n_specials;
    uint32_t doc_special;    /* index into specials of the document token */
} ts_tok_encoding;

const ts_tok_encoding *ts_tok_encoding_get(ts_encoding_kind kind);

struct ts_tokenizer {
    const ts_tok_encoding *enc;
    ts_tok_ranks ranks;
    pcre2_code *re;
    int jit; /* pcre2_jit_compile succeeded */
    char sha256[65];
    char *path;
};

/* Scratch the merge step reuses between pieces (one per encoder). */
typedef struct {
    uint32_t *start, *rank, *prev, *next;
    uint64_t *heap;
    size_t cap, heap_cap;
    const volatile sig_atomic_t *stop; /* polled by the heap merge of a long piece, which
                                          can take seconds (NULL: never); TS_ERR once set */
} ts_tok_merge_scratch;

/* tiktoken's byte_pair_encode of a piece not itself a token (len >= 2): appends the
 * ids. Short pieces by tiktoken's linear scan, long ones with a heap (same result).
 * TS_ERR when the scratch for the piece cannot be allocated (about 24 bytes per byte of
 * the piece: a 100 MB piece needs gigabytes), with a message naming the piece's size. */
ts_status ts_tok_merge(const ts_tok_ranks *r, const unsigned char *p, size_t len,
                       ts_tok_merge_scratch *s, ts_tok_ids *out);
/* The two algorithms separately, for tests that they agree. */
ts_status ts_tok_merge_linear(const ts_tok_ranks *r, const unsigned char *p, size_t len,
                              ts_tok_merge_scratch *s, ts_tok_ids *out);
ts_status ts_tok_merge_heap(const ts_tok_ranks *r, const unsigned char *p, size_t len,
                            ts_tok_merge_scratch *s, ts_tok_ids *out);
void ts_tok_merge_scratch_free(ts_tok_merge_scratch *s);

static inline void ts_tok_push(ts_tok_ids *out, uint32_t id)
{
    if (out->n == out->cap) out->ids = ts_grow(out->ids, &out->cap, out->n, sizeof *out->ids);
    out->ids[out->n++] = id;
}

/* Length of the valid UTF-8 sequence at p (1..4), or 0 if the byte at p starts none
 * (strict: no overlongs, no surrogates, nothing above U+10FFFF, no truncation). */
size_t ts_tok_utf8_len(const unsigned char *p, size_t avail);

#endif
