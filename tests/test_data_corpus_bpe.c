/* `tessera data`'s pipeline (ts_corpus_build) with BPE: the small fixture ranks file
 * (tests/fixtures/bpe/small.tiktoken, 3000 ranks, under TS_TEST_TOKENIZER_ANY_SIZE) as
 * gpt2 and as llama3. Over text files (one with bytes that are not UTF-8) and a JSONL
 * file of 6000 lines (more than one batch), with validation and small shards: every
 * document is preceded by the document token, decodes back to its text exactly, and 1
 * and 3 threads write byte-identical shards. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dataset/corpus.h"
#include "support/tok_decode.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

#define N_LINES 6000

static const char *k_texts[] = {
    "Hello, world! It's 2026; we're testing.  Double  spaces\n\nand\ttabs.",
    "caf\xc3\xa9 na\xc3\xafve \xe2\x9c\x93 \xf0\x9f\x98\x80 \xce\xb1\xce\xb2\xce\xb3 123456789",
    "bytes that are not UTF-8: \xff\xfe \xc3 end",
    "<|endoftext|> is plain text here, as in encode_ordinary",
};

/* The documents in stream order (text files a0 .. a3, then the JSONL lines). */
static char *g_docs[4 + N_LINES];
static size_t g_lens[4 + N_LINES];

static void make_corpus(const char *dir)
{
    char path[600];
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/in/a%d.txt", dir, i);
        FILE *f = fopen(path, "wb");
        fwrite(k_texts[i], 1, strlen(k_texts[i]), f);
        fclose(f);
        g_docs[i] = strdup(k_texts[i]);
        g_lens[i] = strlen(k_texts[i]);
    }
    snprintf(path, sizeof path, "%s/in/z.jsonl", dir);
    FILE *f = fopen(path, "wb");
    static const char *words[] = {"the", " quick", " brown", " fox", " \xc3\xa9t\xc3\xa9", "'s",
                                  " 42", "\n", " jumps", "!!"};
    for (int i = 0; i < N_LINES; i++) {
        char doc[256] = "";
        int n = 1 + (int)(ts_test_next_u64() % 12);
        for (int k = 0; k < n; k++) strcat(doc, words[ts_test_next_u64() % 10]);
        /* JSON: the newline escaped; the rest is valid UTF-8 and needs no escape. */
        fputs("{\"text\": \"", f);
        for (const char *c = doc; *c; c++) {
            if (*c == '\n') fputs("\\n", f);
            else fputc(*c, f);
        }
        fprintf(f, "\", \"n\": %d}\n", i);
        g_docs[4 + i] = strdup(doc);
        g_lens[4 + i] = strlen(doc);
    }
    fclose(f);
}

/* Every shard of PREFIX in stream order, as one id array. */
static uint32_t *read_stream(const ts_corpus_summary *s, size_t *n)
{
    size_t total = 0;
    for (int i = 0; i < s->n_shards; i++) total += s->shard_counts[i];
    uint32_t *ids = malloc((total ? total : 1) * sizeof *ids);
    size_t at = 0;
    for (int i = 0; i < s->n_shards; i++) {
        FILE *f = fopen(s->shards[i], "rb");
        int32_t h[256] = {0};
        CHECKF(f && fread(h, 4, 256, f) == 256, "cannot read %s's header", s->shards[i]);
        if (!f) continue;
        CHECK((uint64_t)h[2] == s->shard_counts[i]);
        CHECK(h[0] == (s->width == 4 ? 20240801 : 20240520));
        size_t got = 0;
        for (uint64_t k = 0; k < s->shard_counts[i]; k++) {
            uint32_t v = 0;
            uint16_t w = 0;
            if (s->width == 4 ? fread(&v, 4, 1, f) == 1 : fread(&w, 2, 1, f) == 1) got++;
            ids[at++] = s->width == 4 ? v : w;
        }
        CHECKF(got == s->shard_counts[i] && fgetc(f) == EOF, /* 1024 + width * count */
               "%s holds %zu ids, its header says %" PRIu64, s->shards[i], got, s->shard_counts[i]);
        fclose(f);
    }
    *n = at;
    return ids;
}

static void check_docs(const char *encoding, const uint32_t *ids, size_t n, int64_t doc_tok,
                       const char *ranks)
{
    ts_tokenizer *tok;
    CHECK(ts_tokenizer_open(&tok, encoding, ranks) == TS_OK);
    CHECK(n > 0 && ids[0] == (uint32_t)doc_tok);
    size_t d = 0, i = 0, bad = 0;
    while (i < n && d < 4 + N_LINES) {
        size_t j = i + 1;
        while (j < n && ids[j] != (uint32_t)doc_tok) j++;
        unsigned char *text = NULL;
        size_t len = 0;
        if (ts_tok_decode(tok, ids + i + 1, j - i - 1, &text, &len) != TS_OK ||
            len != g_lens[d] || memcmp(text, g_docs[d], len) != 0) {
            if (bad++ < 3) fprintf(stderr, "%s: document %zu does not decode to its text\n", encoding, d);
        }
        free(text);
        d++;
        i = j;
    }
    CHECKF(bad == 0, "%s: %zu documents differ", encoding, bad);
    CHECKF(d == 4 + N_LINES && i == n, "%s: %zu documents in the stream", encoding, d);
    ts_tokenizer_free(tok);
}

static int same_file(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb;
    while (same) {
        int ca = fgetc(fa), cb = fgetc(fb);
        if (ca != cb) same = 0;
        if (ca == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

static void run(const char *dir, const char *encoding, const char *ranks, int threads,
                const char *name, ts_corpus_summary *s)
{
    char in[600], prefix[600];
    snprintf(in, sizeof in, "%s/in", dir);
    snprintf(prefix, sizeof prefix, "%s/out/%s", dir, name);
    const char *inputs[] = {in};
    ts_corpus_options o = {.inputs = inputs, .n_inputs = 1, .out_prefix = prefix,
                           .encoding = encoding, .ranks = ranks, .text_field = "text",
                           .shard_tokens = 5000, .val_tokens = 7777,
                           .format = TS_SHARD_AUTO, .threads = threads};
    ts_status st = ts_corpus_build(&o, s);
    CHECKF(st == TS_OK, "%s: %s", name, ts_error_message());
}

int main(void)
{
    const char *src = getenv("TS_SOURCE_DIR");
    char ranks[600];
    snprintf(ranks, sizeof ranks, "%s/tests/fixtures/bpe/small.tiktoken", src ? src : ".");
    struct stat sb;
    if (stat(ranks, &sb) != 0) {
        printf("SKIP: no fixture ranks file %s\n", ranks);
        return 77;
    }
    setenv("TS_TEST_TOKENIZER_ANY_SIZE", "1", 1);
    char dir[512], sub[600];
    ts_test_make_dir(dir, sizeof dir, "data_corpus_bpe");
    snprintf(sub, sizeof sub, "%s/in", dir);
    mkdir(sub, 0755);
    snprintf(sub, sizeof sub, "%s/out", dir);
    mkdir(sub, 0755);
    make_corpus(dir);

    const char *encodings[] = {"gpt2", "llama3"};
    for (int e = 0; e < 2; e++) {
        ts_corpus_summary s1, s3;
        char n1[32], n3[32];
        snprintf(n1, sizeof n1, "%s_t1", encodings[e]);
        snprintf(n3, sizeof n3, "%s_t3", encodings[e]);
        run(dir, encodings[e], ranks, 1, n1, &s1);
        run(dir, encodings[e], ranks, 3, n3, &s3);
        /* Fixture ids fit in 16 bits: GPT-2's shard format for both. */
        CHECK(s1.width == 2 && s1.vocab_size == (e == 0 ? 3001u : 3256u));
        CHECK(s1.documents == 4 + N_LINES && s1.val_tokens == 7777 && s1.val_shards == 2);
        CHECK(s1.train_tokens + s1.val_tokens == s1.tokens && s1.train_shards >= 2);
        CHECK(s1.invalid_utf8_bytes == 3); /* \xff \xfe and the lone \xc3 */
        CHECK(s1.n_shards == s3.n_shards);
        for (int i = 0; i < s1.n_shards && i < s3.n_shards; i++)
            CHECKF(same_file(s1.shards[i], s3.shards[i]), "%s: 1 and 3 threads differ", s1.shards[i]);
        size_t n;
        uint32_t *ids = read_stream(&s1, &n);
        CHECK(n == s1.tokens);
        check_docs(encodings[e], ids, n, 3000, ranks);
        free(ids);
        for (int i = 0; i < s1.n_shards; i++) unlink(s1.shards[i]);
        for (int i = 0; i < s3.n_shards; i++) unlink(s3.shards[i]);
        ts_corpus_summary_free(&s1);
        ts_corpus_summary_free(&s3);
    }
    for (int i = 0; i < 4 + N_LINES; i++) free(g_docs[i]);
    ts_test_remove_dir(sub);
    snprintf(sub, sizeof sub, "%s/in", dir);
    ts_test_remove_dir(sub);
    ts_test_remove_dir(dir);
    return ts_test_report();
}
