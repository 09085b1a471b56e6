/* The documents of `tessera data` read in input order into batches: one per text file,
 * one per JSONL line (its text field). Used by corpus.c's reading thread. */
#ifndef TS_CORPUS_READ_H
#define TS_CORPUS_READ_H

#include <signal.h>
#include <stdint.h>
#include <stdio.h>

#include "core/error.h"
#include "dataset/corpus_inputs.h"
#include "tokenizer/tokenizer.h"

/* A batch of documents: their texts end to end, and after encoding, their ids. */
typedef struct {
    char *text;
    size_t len, cap;
    size_t *doc_off;          /* document d is text[doc_off[d] .. doc_off[d+1]) */
    unsigned char *doc_val;   /* 1: document d belongs to the validation split */
    size_t n_docs, docs_cap;
    uint64_t in_bytes;        /* input bytes this batch consumed (for progress) */
    /* Filled by the encoder: */
    ts_tok_ids ids;
    size_t *doc_tok_end;      /* document d's ids end at ids[doc_tok_end[d]] */
    uint64_t n_invalid;       /* bytes that were not valid UTF-8 */
} ts_corpus_batch;

void ts_corpus_batch_free(ts_corpus_batch *b);

typedef struct {
    const ts_corpus_files *files;
    const char *field;        /* JSONL text field */
    int skip_bad;             /* count bad JSONL lines instead of failing */
    double val_limit;         /* documents starting before this input byte are val */
    int fi;                   /* the file being read */
    uint64_t file_base;       /* its first byte's offset in the whole input */
    FILE *f;                  /* the open JSONL file */
    uint64_t pos, line;       /* in it: bytes read, lines read */
    char *line_buf;
    size_t line_cap;
    uint64_t bad_lines;
    /* Polled while reading (NULL: never): non-zero makes ts_corpus_reader_next fail at
     * once, so that a stop signal need not wait for a large input to be read. */
    const volatile sig_atomic_t *stop;
} ts_corpus_reader;

void ts_corpus_reader_init(ts_corpus_reader *r, const ts_corpus_files *files, const char *field,
                           int skip_bad, double val_limit);
/* Fill b (emptied first) with the next documents, up to about max_bytes of text (one
 * document at least); b->n_docs == 0 when the input is done. */
ts_status ts_corpus_reader_next(ts_corpus_reader *r, ts_corpus_batch *b, size_t max_bytes,
                                size_t max_docs);
void ts_corpus_reader_free(ts_corpus_reader *r);

#endif
