/* The per-thread encoder: cut the text into valid UTF-8 runs and invalid bytes, split
 * each run with the encoding's pattern (PCRE2 JIT, match data reused), and turn each
 * piece into ids: the piece's own rank if it is a token, else byte-pair merges. */
#define _GNU_SOURCE /* memmem */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

/* A cache of merged pieces: text repeats its words, and a piece that is not itself a
 * token costs a merge each time (most of the encoder's time on English text without
 * it). Direct-mapped, a newer piece replaces an older one in its slot; the ids are a
 * pure function of the piece's bytes, so a hit gives exactly what the merge would. */
#define TS_TOK_CACHE_SLOTS 4096
#define TS_TOK_CACHE_KEY 30
#define TS_TOK_CACHE_IDS 14
typedef struct {
    uint64_t hash;
    uint8_t len; /* 0 = empty */
    uint8_t n_ids;
    unsigned char key[TS_TOK_CACHE_KEY];
    uint32_t ids[TS_TOK_CACHE_IDS];
} piece_cache_entry;

struct ts_tok_encoder {
    const ts_tokenizer *tok;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
    ts_tok_merge_scratch scratch;
    piece_cache_entry *cache;
    const volatile sig_atomic_t *stop; /* ts_tok_encoder_set_stop's flag, or NULL */
    const unsigned char *text;         /* the text being encoded, for stopped_at */
    size_t text_len, stopped_at;
};

void ts_tok_encoder_set_stop(ts_tok_encoder *e, const volatile sig_atomic_t *stop)
{
    e->stop = stop;
}

size_t ts_tok_encoder_stopped_at(const ts_tok_encoder *e)
{
    return e->stopped_at;
}

/* Whether the stop flag is set; if so, the failure that says where (at: the first byte
 * not encoded). */
static int stop_seen(ts_tok_encoder *e, const unsigned char *at)
{
    if (!e->stop || !*e->stop) return 0;
    e->stopped_at = (size_t)(at - e->text);
    ts_fail("stopped at byte %zu of %zu", e->stopped_at, e->text_len);
    return 1;
}

ts_status ts_tok_encoder_new(const ts_tokenizer *tok, ts_tok_encoder **out)
{
    ts_tok_encoder *e = ts_calloc(1, sizeof *e);
    e->tok = tok;
    e->cache = ts_calloc(TS_TOK_CACHE_SLOTS, sizeof *e->cache);
    if (tok->re) {
        e->md = pcre2_match_data_create_from_pattern(tok->re, NULL);
        e->mctx = pcre2_match_context_create(NULL);
        if (!e->md || !e->mctx) {
            ts_tok_encoder_free(e);
            return ts_fail("out of memory creating a PCRE2 match context");
        }
        if (tok->jit) {
            /* The patterns need little stack, but a private one means no thread ever
             * depends on the size of its machine stack. */
            e->jit_stack = pcre2_jit_stack_create(32 * 1024, 1024 * 1024, NULL);
            if (!e->jit_stack) {
                ts_tok_encoder_free(e);
                return ts_fail("out of memory creating a PCRE2 JIT stack");
            }
            pcre2_jit_stack_assign(e->mctx, NULL, e->jit_stack);
        }
    }
    *out = e;
    return TS_OK;
}

void ts_tok_encoder_free(ts_tok_encoder *e)
{
    if (!e) return;
    pcre2_match_data_free(e->md);
    pcre2_match_context_free(e->mctx);
    pcre2_jit_stack_free(e->jit_stack);
    ts_tok_merge_scratch_free(&e->scratch);
    free(e->cache);
    free(e);
}

static ts_status encode_piece(ts_tok_encoder *e, const unsigned char *p, size_t len,
                              ts_tok_ids *out)
{
    const ts_tok_ranks *r = &e->tok->ranks;
    uint64_t h = ts_tok_hash(p, len);
    uint32_t k = ts_tok_rank_of_h(r, p, len, h);
    if (k != TS_TOK_NO_RANK) {
        ts_tok_push(out, k);
        return TS_OK;
    }
    e->scratch.stop = e->stop; /* set each time: freeing the scratch clears it */
    if (len > TS_TOK_CACHE_KEY) return ts_tok_merge(r, p, len, &e->scratch, out);
    piece_cache_entry *c = &e->cache[(h >> 20) & (TS_TOK_CACHE_SLOTS - 1)];
    if (c->hash == h && c->len == len && memcmp(c->key, p, len) == 0) {
        for (unsigned i = 0; i < c->n_ids; i++) ts_tok_push(out, c->ids[i]);
        return TS_OK;
    }
    size_t first = out->n;
    if (ts_tok_merge(r, p, len, &e->scratch, out) != TS_OK) return TS_ERR;
    size_t n = out->n - first;
    if (n <= TS_TOK_CACHE_IDS) {
        c->hash = h;
        c->len = (uint8_t)len;
        c->n_ids = (uint8_t)n;
        memcpy(c->key, p, len);
        memcpy(c->ids, out->ids + first, n * sizeof *c->ids);
    }
    return TS_OK;
}

/* One valid UTF-8 run, as tiktoken's encode_ordinary encodes it as a whole string. */
static ts_status encode_run(ts_tok_encoder *e, const unsigned char *p, size_t len, ts_tok_ids *out)
{
    const ts_tokenizer *t = e->tok;
    size_t off = 0;
    while (off < len) {
        if (stop_seen(e, p + off)) return TS_ERR;
        int rc = t->jit ? pcre2_jit_match(t->re, p, len, off, PCRE2_NO_UTF_CHECK, e->md, e->mctx)
                        : pcre2_match(t->re, p, len, off, PCRE2_NO_UTF_CHECK, e->md, e->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break; /* as tiktoken: unmatched text yields nothing */
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return ts_fail("pre-tokenizing %zu bytes of text failed at byte %zu: PCRE2: %s",
                           len, off, (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        /* The patterns match every character and never the empty string. */
        TS_ASSERT(ov[1] > ov[0] && ov[1] <= len);
        if (ov[1] - ov[0] >= UINT32_MAX) /* the merge indexes bytes with 32 bits */
            return ts_fail("a single pre-token piece of %zu bytes (a 4 GiB run of letters, "
                           "digits or symbols) is too long to merge; split the document",
                           (size_t)(ov[1] - ov[0]));
        if (encode_piece(e, p + ov[0], ov[1] - ov[0], out) != TS_OK) {
            stop_seen(e, p + ov[0]); /* a long piece's merge stopped: say where */
            return TS_ERR;
        }
        off = ov[1];
    }
    return TS_OK;
}

static size_t valid_prefix(const unsigned char *p, size_t len)
{
    size_t i = 0;
    while (i < len) {
        /* ASCII eight bytes at a time: most text is mostly ASCII */
        while (i + 8 <= len) {
            uint64_t w;
            memcpy(&w, p + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= len) break;
        size_t n = ts_tok_utf8_len(p + i, len - i);
        if (n == 0) break;
        i += n;
    }
    return i;
}

static ts_status encode_ordinary(ts_tok_encoder *e, const unsigned char *p, size_t len,
                                 ts_tok_ids *out, uint64_t *n_invalid)
{
    size_t i = 0;
    while (i < len) {
        size_t v = valid_prefix(p + i, len - i);
        if (v && encode_run(e, p + i, v, out) != TS_OK) return TS_ERR;
        i += v;
        if (i < len) {
            /* an invalid byte: its single-byte token (all 256 have ranks) */
            ts_tok_push(out, ts_tok_rank_of(&e->tok->ranks, p + i, 1));
            if (n_invalid) (*n_invalid)++;
            i++;
        }
    }
    return TS_OK;
}

ts_status ts_tok_encode(ts_tok_encoder *e, const char *text, size_t len, ts_tok_ids *out,
                        uint64_t *n_invalid)
{
    const unsigned char *p = (const unsigned char *)text;
    if (n_invalid) *n_invalid = 0;
    e->text = p;
    e->text_len = len;
    if (e->tok->enc->kind == TS_ENC_BYTES) {
        for (size_t i = 0; i < len; i++) {
            if ((i & 0xfffff) == 0 && stop_seen(e, p + i)) return TS_ERR;
            ts_tok_push(out, p[i]);
        }
        if (n_invalid) {
            for (size_t i = 0; i < len;) {
                size_t v = valid_prefix(p + i, len - i);
                i += v;
                if (i < len) {
                    (*n_invalid)++;
                    i++;
                }
            }
        }
        return TS_OK;
    }
    return encode_ordinary(e, p, len, out, n_invalid);
}

/* The special token whose text is p[0..len), or -1. */
static int64_t special_at(const ts_tokenizer *t, const unsigned char *p, size_t len)
{
    for (uint32_t i = 0; i < t->enc->n_specials; i++) {
        const char *s = t->enc->specials[i];
        if (strlen(s) == len && memcmp(s, p, len) == 0) return (int64_t)t->ranks.n + i;
    }
    return -1;
}

ts_status ts_tok_encode_special(ts_tok_encoder *e, const char *text, size_t len,
                                ts_tok_ids *out, uint64_t *n_invalid)
{
    const ts_tokenizer *t = e->tok;
    if (t->enc->kind == TS_ENC_BYTES) return ts_tok_encode(e, text, len, out, n_invalid);
    const unsigned char *p = (const unsigned char *)text;
    if (n_invalid) *n_invalid = 0;
    e->text = p;
    e->text_len = len;
    /* Every special is "<|" name "|>" with no "|>" inside, so a special can only be the
     * span from a "<|" to the first "|>" after it; the text between specials is
     * encoded as separate strings, as tiktoken does. */
    size_t seg = 0, i = 0;
    while (i + 1 < len) {
        const unsigned char *lt = memmem(p + i, len - i, "<|", 2);
        if (!lt) break;
        size_t a = (size_t)(lt - p);
        const unsigned char *gt = memmem(p + a + 2, len - a - 2, "|>", 2);
        if (!gt) break;
        size_t b = (size_t)(gt - p) + 2;
        int64_t id = special_at(t, p + a, b - a);
        if (id < 0) {
            i = a + 1;
            continue;
        }
        if (encode_ordinary(e, p + seg, a - seg, out, n_invalid) != TS_OK) return TS_ERR;
        ts_tok_push(out, (uint32_t)id);
        seg = i = b;
    }
    return encode_ordinary(e, p + seg, len - seg, out, n_invalid);
}
