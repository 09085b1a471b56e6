/* The `tessera data` pipeline (see corpus.h). Three kinds of threads share a ring of
 * Q batch slots: the calling thread reads documents into batch s (slot s mod Q) while
 * fewer than Q batches are unwritten; `threads` encoders each take the next unencoded
 * batch; one writer takes the batches in order s = 0, 1, ... and appends their ids to
 * the shards. Output order is input order whatever the encoders' timing, so the shards
 * are identical for any thread count; at most Q batches exist at once. */
#include "dataset/corpus.h"

#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dataset/corpus_inputs.h"
#include "dataset/corpus_read.h"
#include "dataset/shard_writer.h"
#include "tokenizer/tokenizer.h"

#define BATCH_BYTES (1u << 20) /* text per batch: large enough to keep an encoder busy */
#define BATCH_DOCS 4096

/* SIGINT, SIGTERM or SIGHUP received during a build, or 0. The run stops at the next
 * batch and removes its temporary shards: without this, ^C would leave them behind. */
static volatile sig_atomic_t g_stop;

static void on_stop(int sig)
{
    g_stop = sig;
}

static const int k_stop_signals[] = {SIGINT, SIGTERM, SIGHUP};
#define N_STOP_SIGNALS 3

static void catch_stops(struct sigaction *old)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_RESETHAND; /* a second ^C ends the process at once */
    g_stop = 0;
    for (int i = 0; i < N_STOP_SIGNALS; i++) sigaction(k_stop_signals[i], &sa, &old[i]);
}

static void restore_stops(const struct sigaction *old)
{
    for (int i = 0; i < N_STOP_SIGNALS; i++) sigaction(k_stop_signals[i], &old[i], NULL);
}

static const char *stop_name(void)
{
    int sig = g_stop;
    return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP";
}

static ts_status stopped(void)
{
    return ts_fail("stopped by %s: no shard written (the partial ones are removed)", stop_name());
}

/* The stop seen by an encoder inside a document: where, so that a stop that had to wait
 * for a whole large document would show (probe D5). */
static ts_status stopped_in_document(size_t at, size_t len)
{
    return ts_fail("stopped by %s at byte %zu of a document of %zu bytes: no shard written "
                   "(the partial ones are removed)", stop_name(), at, len);
}

typedef struct {
    ts_corpus_batch *b; /* NULL: free slot */
    int encoded;
} slot;

typedef struct pipeline {
    const ts_corpus_options *o;
    const ts_tokenizer *tok;
    int64_t doc_token;
    uint64_t total_bytes;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* every change of state; few threads, so one condition */
    slot *slots;
    int q;
    uint64_t pushed, claimed, written;
    int eof, failed;
    char err[TS_ERROR_MAX]; /* the first failure's message (ts_error_message is per thread) */
    /* The writer's state. */
    ts_shard_sink sink;
    int in_val;
    uint64_t val_left;
    ts_corpus_summary *sum;
    struct timespec t0, last_progress;
} pipeline;

typedef struct {
    pipeline *p;
    ts_tok_encoder *enc;
} worker_arg;

static double since(const struct timespec *a)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - a->tv_sec) + 1e-9 * (double)(now.tv_nsec - a->tv_nsec);
}

/* Record this thread's error as the pipeline's (the first one wins) and stop everyone.
 * Called with mu held. */
static void fail_locked(pipeline *p)
{
    if (!p->failed) snprintf(p->err, sizeof p->err, "%s", ts_error_message());
    p->failed = 1;
    pthread_cond_broadcast(&p->cv);
}

static void fail_now(pipeline *p)
{
    pthread_mutex_lock(&p->mu);
    fail_locked(p);
    pthread_mutex_unlock(&p->mu);
}

/* Each document: the encoding's document token (none for bytes), then its ids. */
static ts_status encode_batch(pipeline *p, ts_tok_encoder *enc, ts_corpus_batch *b)
{
    const size_t ends = (b->n_docs ? b->n_docs : 1) * sizeof *b->doc_tok_end;
    b->doc_tok_end = realloc(b->doc_tok_end, ends);
    if (!b->doc_tok_end) ts_out_of_memory(ends, "the token ends of a batch of documents");
    b->ids.n = 0;
    b->n_invalid = 0;
    for (size_t d = 0; d < b->n_docs; d++) {
        if (p->doc_token >= 0) {
            b->ids.ids = ts_grow(b->ids.ids, &b->ids.cap, b->ids.n, sizeof *b->ids.ids);
            b->ids.ids[b->ids.n++] = (uint32_t)p->doc_token;
        }
        if (g_stop) return stopped();
        uint64_t invalid = 0;
        size_t off = b->doc_off[d], len = b->doc_off[d + 1] - off;
        if (ts_tok_encode(enc, b->text + off, len, &b->ids, &invalid) != TS_OK) {
            if (g_stop) return stopped_in_document(ts_tok_encoder_stopped_at(enc), len);
            return ts_error_prefix("encoding a document: ");
        }
        b->n_invalid += invalid;
        b->doc_tok_end[d] = b->ids.n;
    }
    return TS_OK;
}

static void *encoder_main(void *arg)
{
    worker_arg *w = arg;
    pipeline *p = w->p;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->failed && p->claimed == p->pushed && !p->eof) pthread_cond_wait(&p->cv, &p->mu);
        if (p->failed || p->claimed == p->pushed) break; /* done, or stopped */
        slot *s = &p->slots[p->claimed % (uint64_t)p->q];
        p->claimed++;
        pthread_mutex_unlock(&p->mu);
        ts_status st = encode_batch(p, w->enc, s->b);
        pthread_mutex_lock(&p->mu);
        if (st != TS_OK) {
            fail_locked(p);
            break;
        }
        s->encoded = 1;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void print_progress(pipeline *p, int final)
{
    double t = since(&p->t0);
    double done = (double)p->sum->bytes, total = (double)p->total_bytes;
    double bps = t > 0 ? done / t : 0, tps = t > 0 ? (double)p->sum->tokens / t : 0;
    double eta = bps > 0 ? (total - done) / bps : 0;
    fprintf(stderr, "%sdata: %.1f of %.1f MB read (%.0f%%), %.2f MB/s, %.0f tokens/s, ETA %.0f s%s",
            p->o->progress ? "\r" : "", done / 1e6, total / 1e6,
            total > 0 ? 100.0 * done / total : 100.0, bps / 1e6, tps, eta,
            p->o->progress && !final ? "" : "\n");
    fflush(stderr);
}

/* A batch's documents into the shards: validation first (documents marked val, or the
 * stream's first val_tokens tokens), then training. */
static ts_status write_batch(pipeline *p, const ts_corpus_batch *b)
{
    size_t start = 0;
    for (size_t d = 0; d < b->n_docs; d++) {
        const uint32_t *ids = b->ids.ids + start;
        size_t n = b->doc_tok_end[d] - start;
        start = b->doc_tok_end[d];
        if (p->in_val && p->o->val_tokens > 0) {
            size_t k = n < p->val_left ? n : (size_t)p->val_left;
            if (ts_shard_sink_write(&p->sink, ids, k) != TS_OK) return TS_ERR;
            p->sum->val_tokens += k;
            p->val_left -= k;
            ids += k;
            n -= k;
            if (p->val_left == 0) {
                p->in_val = 0;
                if (ts_shard_sink_split(&p->sink, "train") != TS_OK) return TS_ERR;
            }
        } else if (p->in_val && !b->doc_val[d]) {
            p->in_val = 0;
            if (ts_shard_sink_split(&p->sink, "train") != TS_OK) return TS_ERR;
        }
        if (n > 0 && ts_shard_sink_write(&p->sink, ids, n) != TS_OK) return TS_ERR;
        if (p->in_val) p->sum->val_tokens += n;
        else p->sum->train_tokens += n;
    }
    p->sum->documents += b->n_docs;
    p->sum->bytes += b->in_bytes;
    p->sum->tokens += b->ids.n;
    p->sum->invalid_utf8_bytes += b->n_invalid;
    double every = p->o->progress ? 1.0 : 30.0;
    if (since(&p->last_progress) >= every) {
        print_progress(p, 0);
        clock_gettime(CLOCK_MONOTONIC, &p->last_progress);
    }
    return TS_OK;
}

static void *writer_main(void *arg)
{
    pipeline *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        slot *s = &p->slots[p->written % (uint64_t)p->q];
        while (!p->failed && !(p->written < p->pushed && s->encoded) &&
               !(p->eof && p->written == p->pushed))
            pthread_cond_wait(&p->cv, &p->mu);
        if (p->failed || p->written == p->pushed) break;
        ts_corpus_batch *b = s->b;
        pthread_mutex_unlock(&p->mu);
        ts_status st = write_batch(p, b);
        ts_corpus_batch_free(b);
        free(b);
        pthread_mutex_lock(&p->mu);
        s->b = NULL;
        s->encoded = 0;
        p->written++;
        if (st != TS_OK) {
            fail_locked(p);
            break;
        }
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* The calling thread's part: read batches into free slots until the input ends. */
static void read_all(pipeline *p, ts_corpus_reader *r)
{
    for (;;) {
        if (g_stop) {
            stopped();
            fail_now(p);
            return;
        }
        ts_corpus_batch *b = ts_calloc(1, sizeof *b);
        if (ts_corpus_reader_next(r, b, BATCH_BYTES, BATCH_DOCS) != TS_OK) {
            if (g_stop) stopped(); /* the reader saw it inside a large input */
            ts_corpus_batch_free(b);
            free(b);
            fail_now(p);
            return;
        }
        pthread_mutex_lock(&p->mu);
        if (b->n_docs == 0) {
            p->eof = 1;
            pthread_cond_broadcast(&p->cv);
            pthread_mutex_unlock(&p->mu);
            ts_corpus_batch_free(b);
            free(b);
            return;
        }
        while (!p->failed && p->pushed - p->written >= (uint64_t)p->q)
            pthread_cond_wait(&p->cv, &p->mu);
        if (p->failed) {
            pthread_mutex_unlock(&p->mu);
            ts_corpus_batch_free(b);
            free(b);
            return;
        }
        slot *s = &p->slots[p->pushed % (uint64_t)p->q];
        s->b = b;
        s->encoded = 0;
        p->pushed++;
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
}

/* The tokenizer, and the shard width its vocabulary and o->format allow. */
static ts_status open_tokenizer(const ts_corpus_options *o, ts_tokenizer **tok, int *width)
{
    char path[4096];
    const char *ranks = o->ranks;
    if (strcmp(o->encoding, "bytes") != 0 && !ranks) {
        if (ts_tokenizer_default_path(o->encoding, path, sizeof path) != TS_OK) return TS_ERR;
        if (access(path, R_OK) != 0)
            return ts_fail("the %s ranks file %s is not there: run scripts/fetch_tokenizers.sh "
                           "to fetch it, or give its path with --ranks FILE", o->encoding, path);
        ranks = path;
    }
    if (ts_tokenizer_open(tok, o->encoding, ranks) != TS_OK) return TS_ERR;
    uint32_t vocab = ts_tokenizer_vocab_size(*tok);
    ts_shard_format fmt = o->format;
    if (fmt == TS_SHARD_AUTO) fmt = vocab > 65536 ? TS_SHARD_LLAMA3 : TS_SHARD_GPT2;
    if (fmt == TS_SHARD_GPT2 && vocab > 65536) {
        ts_tokenizer_free(*tok);
        *tok = NULL;
        return ts_fail("--format gpt2 stores ids in 16 bits, but the %s vocabulary has %" PRIu32
                       " ids: use --format llama3 (uint32 ids) or leave --format out",
                       o->encoding, vocab);
    }
    *width = fmt == TS_SHARD_LLAMA3 ? 4 : 2;
    return TS_OK;
}

static ts_status run_pipeline(pipeline *p, ts_corpus_reader *r, ts_tok_encoder **encs)
{
    int nt = p->o->threads;
    pthread_t *th = ts_calloc((size_t)nt + 1, sizeof *th);
    worker_arg *args = ts_calloc((size_t)nt, sizeof *args);
    int started = 0;
    ts_status st = TS_OK;
    if (pthread_create(&th[0], NULL, writer_main, p) != 0) {
        free(th);
        free(args);
        return ts_fail("cannot start the shard-writing thread");
    }
    for (int i = 0; i < nt; i++) {
        args[i].p = p;
        args[i].enc = encs[i];
        if (pthread_create(&th[1 + i], NULL, encoder_main, &args[i]) != 0) {
            ts_fail("cannot start encoding thread %d of %d: give fewer --threads", i + 1, nt);
            fail_now(p);
            break;
        }
        started++;
    }
    if (!p->failed) read_all(p, r);
    for (int i = 0; i < started; i++) pthread_join(th[1 + i], NULL);
    pthread_join(th[0], NULL);
    if (p->failed) st = ts_fail("%s", p->err);
    /* Batches left in the ring after a failure. */
    for (int i = 0; i < p->q; i++) {
        if (p->slots[i].b) {
            ts_corpus_batch_free(p->slots[i].b);
            free(p->slots[i].b);
            p->slots[i].b = NULL;
        }
    }
    free(th);
    free(args);
    return st;
}

/* What must hold of the whole stream, found once it is written (before the renames). */
static ts_status check_stream(const ts_corpus_options *o, const ts_corpus_summary *s)
{
    if (s->documents == 0)
        return ts_fail("the inputs hold no document (%s): nothing to write",
                       s->bad_lines ? "every JSONL line was blank or skipped as bad"
                                    : "every JSONL file is blank");
    if (s->tokens == 0) return ts_fail("the inputs' %" PRIu64 " documents are all empty: nothing to write",
                                       s->documents);
    if ((o->val_tokens > 0 || o->val_fraction > 0) && s->train_tokens == 0)
        return ts_fail("all %" PRIu64 " tokens went to validation (%s), none is left for "
                       "training: give a smaller --val-tokens or --val-fraction", s->tokens,
                       o->val_tokens > 0 ? "--val-tokens" : "--val-fraction");
    if ((o->val_tokens > 0 || o->val_fraction > 0) && s->val_tokens == 0)
        return ts_fail("no token went to validation (the first documents are empty): give "
                       "a larger --val-fraction");
    return TS_OK;
}

static ts_status build(const ts_corpus_options *o, ts_corpus_summary *sum);

ts_status ts_corpus_build(const ts_corpus_options *o, ts_corpus_summary *sum)
{
    memset(sum, 0, sizeof *sum);
    TS_ASSERT(o->threads >= 1 && !(o->val_tokens > 0 && o->val_fraction > 0));
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    struct sigaction old[N_STOP_SIGNALS];
    catch_stops(old);
    ts_status st = build(o, sum);
    restore_stops(old);
    sum->seconds = since(&t0);
    return st;
}

static ts_status build(const ts_corpus_options *o, ts_corpus_summary *sum)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    /* Every refusal that needs no reading comes first: outputs, inputs, tokenizer. The
     * claim (PREFIX.lock) is held to the end, so no other run writes PREFIX meanwhile. */
    ts_shard_claim claim;
    if (ts_shard_outputs_claim(&claim, o->out_prefix, o->overwrite) != TS_OK) return TS_ERR;
    if (claim.n_removed > 0)
        fprintf(stderr, "data: removed %d temporary file%s of an earlier run on --out %s "
                "that did not end (killed)\n", claim.n_removed, claim.n_removed == 1 ? "" : "s",
                o->out_prefix);
    ts_corpus_files files;
    if (ts_corpus_files_collect(&files, o->inputs, o->n_inputs, o->force_jsonl, o->out_prefix) != TS_OK) {
        ts_shard_claim_release(&claim);
        return TS_ERR;
    }
    ts_status st = TS_OK;
    if (files.total_bytes == 0)
        st = ts_fail("the inputs (%d file%s) are all empty: nothing to write", files.n,
                     files.n == 1 ? "" : "s");
    ts_tokenizer *tok = NULL;
    int width = 2;
    if (st == TS_OK) st = open_tokenizer(o, &tok, &width);
    ts_tok_encoder **encs = ts_calloc((size_t)o->threads, sizeof *encs);
    for (int i = 0; st == TS_OK && i < o->threads; i++) {
        st = ts_tok_encoder_new(tok, &encs[i]);
        if (st == TS_OK) ts_tok_encoder_set_stop(encs[i], &g_stop); /* a large document */
    }
    pipeline p;
    memset(&p, 0, sizeof p);
    ts_corpus_reader r;
    ts_corpus_reader_init(&r, &files, o->text_field, o->skip_bad_lines,
                          o->val_fraction * (double)files.total_bytes);
    r.stop = &g_stop;
    if (st == TS_OK) {
        p.o = o;
        p.tok = tok;
        p.doc_token = ts_tokenizer_doc_token(tok);
        p.total_bytes = files.total_bytes;
        p.q = 2 * o->threads + 2;
        p.slots = ts_calloc((size_t)p.q, sizeof *p.slots);
        p.sum = sum;
        p.t0 = p.last_progress = t0;
        p.in_val = o->val_tokens > 0 || o->val_fraction > 0;
        p.val_left = o->val_tokens;
        pthread_mutex_init(&p.mu, NULL);
        pthread_cond_init(&p.cv, NULL);
        ts_shard_sink_init(&p.sink, o->out_prefix, width, o->shard_tokens, p.in_val ? "val" : "train");
        st = run_pipeline(&p, &r, encs);
        sum->bad_lines = r.bad_lines;
        if (st == TS_OK && g_stop) st = stopped();
        if (st == TS_OK) st = check_stream(o, sum);
        if (st == TS_OK) st = ts_shard_sink_commit(&p.sink, claim.existing);
        if (st == TS_OK) {
            sum->vocab_size = ts_tokenizer_vocab_size(tok);
            sum->width = width;
            sum->val_shards = p.sink.n_val;
            sum->train_shards = p.sink.n_train;
            sum->n_shards = p.sink.n_shards;
            sum->shards = p.sink.final; /* moved out of the sink */
            sum->shard_counts = p.sink.counts;
            p.sink.final = NULL;
            p.sink.counts = NULL;
            p.sink.n_shards = 0;
            if (o->progress) print_progress(&p, 1);
        }
        ts_shard_sink_free(&p.sink); /* removes the temporary files of a failed run */
        pthread_mutex_destroy(&p.mu);
        pthread_cond_destroy(&p.cv);
        free(p.slots);
    }
    ts_corpus_reader_free(&r);
    for (int i = 0; i < o->threads; i++)
        if (encs[i]) ts_tok_encoder_free(encs[i]);
    free(encs);
    if (tok) ts_tokenizer_free(tok);
    ts_corpus_files_free(&files);
    ts_shard_claim_release(&claim); /* last: the temporary shards are gone by now */
    return st;
}

void ts_corpus_summary_free(ts_corpus_summary *sum)
{
    for (int i = 0; i < sum->n_shards; i++) free(sum->shards[i]);
    free(sum->shards);
    free(sum->shard_counts);
    memset(sum, 0, sizeof *sum);
}
