/* Tokenizer throughput: encode a corpus of documents (one file each, read into memory
 * before timing) with N threads, each with its own encoder, documents handed out in
 * order from a shared counter. Prints one line for bench/tokenize.sh: documents, bytes,
 * tokens, the best of R timed passes, the ranks file's load time, and the sha256 of all
 * ids in document order as little-endian uint32 (what bench/tokenize_tiktoken.py prints
 * for tiktoken's ids).
 * Usage: bench_tokenize --list FILE [--encoding gpt2|llama3] [--ranks PATH] [--threads N]
 *        [--reps R]   (FILE: one document path per line) */
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/timer.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    char *b;
    size_t n;
    ts_tok_ids ids;
} doc;

typedef struct {
    const ts_tokenizer *tok;
    doc *docs;
    size_t n_docs;
    atomic_size_t next;
    atomic_int failed;
} job;

static void *worker(void *arg)
{
    job *j = arg;
    ts_tok_encoder *enc;
    if (ts_tok_encoder_new(j->tok, &enc) != TS_OK) {
        atomic_store(&j->failed, 1);
        return NULL;
    }
    /* Encode into this thread's own list, then hand it to the document: appending to
     * the documents' lists directly would write their counts, which share cache lines
     * with other threads' documents, on every token. */
    ts_tok_ids mine = {0};
    for (;;) {
        size_t i = atomic_fetch_add(&j->next, 1);
        if (i >= j->n_docs) break;
        mine.n = 0;
        if (ts_tok_encode(enc, j->docs[i].b, j->docs[i].n, &mine, NULL) != TS_OK) {
            fprintf(stderr, "bench_tokenize: %s\n", ts_error_message());
            atomic_store(&j->failed, 1);
        }
        free(j->docs[i].ids.ids);
        j->docs[i].ids = mine;
        mine = (ts_tok_ids){0};
    }
    ts_tok_encoder_free(enc);
    return NULL;
}

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    for (;;) {
        if (n == cap) b = realloc(b, cap *= 2);
        size_t got = fread(b + n, 1, cap - n, f);
        if (!got) break;
        n += got;
    }
    fclose(f);
    *len = n;
    return b;
}

static int usage(void)
{
    fprintf(stderr, "usage: bench_tokenize --list FILE [--encoding gpt2|llama3] [--ranks PATH] "
                    "[--threads N >= 1] [--reps R >= 1]\n");
    return 2;
}

int main(int argc, char **argv)
{
    const char *list = NULL, *encoding = "gpt2", *ranks = NULL;
    int threads = 1, reps = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--list") && i + 1 < argc) list = argv[++i];
        else if (!strcmp(argv[i], "--encoding") && i + 1 < argc) encoding = argv[++i];
        else if (!strcmp(argv[i], "--ranks") && i + 1 < argc) ranks = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else return usage();
    }
    if (!list || threads < 1 || threads > 256 || reps < 1) return usage();
    double t0 = ts_now_ms();
    ts_tokenizer *tok;
    if (ts_tokenizer_open(&tok, encoding, ranks) != TS_OK) {
        fprintf(stderr, "bench_tokenize: %s\n", ts_error_message());
        return 1;
    }
    double load_ms = ts_now_ms() - t0;
    FILE *lf = fopen(list, "r");
    if (!lf) {
        fprintf(stderr, "bench_tokenize: cannot read the list %s\n", list);
        return 1;
    }
    doc *docs = NULL;
    size_t n_docs = 0, cap = 0, bytes = 0;
    char line[8192];
    while (fgets(line, sizeof line, lf)) {
        line[strcspn(line, "\n")] = 0;
        if (!line[0]) continue;
        if (n_docs == cap) docs = ts_grow(docs, &cap, n_docs, sizeof *docs);
        memset(&docs[n_docs], 0, sizeof *docs);
        docs[n_docs].b = read_all(line, &docs[n_docs].n);
        if (!docs[n_docs].b) {
            fprintf(stderr, "bench_tokenize: cannot read %s\n", line);
            return 1;
        }
        bytes += docs[n_docs].n;
        n_docs++;
    }
    fclose(lf);
    double best = 1e300;
    for (int r = 0; r < reps; r++) {
        job j = {.tok = tok, .docs = docs, .n_docs = n_docs};
        atomic_init(&j.next, 0);
        atomic_init(&j.failed, 0);
        pthread_t th[256];
        double s = ts_now_ms();
        for (int t = 0; t < threads; t++) pthread_create(&th[t], NULL, worker, &j);
        for (int t = 0; t < threads; t++) pthread_join(th[t], NULL);
        double e = ts_now_ms() - s;
        if (atomic_load(&j.failed)) return 1;
        if (e < best) best = e;
    }
    size_t tokens = 0;
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    EVP_DigestInit_ex(md, EVP_sha256(), NULL);
    for (size_t i = 0; i < n_docs; i++) {
        tokens += docs[i].ids.n;
        for (size_t k = 0; k < docs[i].ids.n; k++) {
            uint32_t v = docs[i].ids.ids[k];
            unsigned char le[4] = {(unsigned char)v, (unsigned char)(v >> 8),
                                   (unsigned char)(v >> 16), (unsigned char)(v >> 24)};
            EVP_DigestUpdate(md, le, 4);
        }
        free(docs[i].ids.ids);
        free(docs[i].b);
    }
    unsigned char h[32];
    unsigned hn;
    EVP_DigestFinal_ex(md, h, &hn);
    EVP_MD_CTX_free(md);
    char hex[65];
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", h[i]);
    printf("docs=%zu bytes=%zu tokens=%zu seconds=%.4f load_ms=%.1f sha256=%s\n", n_docs, bytes,
           tokens, best / 1e3, load_ms, hex);
    free(docs);
    ts_tokenizer_free(tok);
    return 0;
}
