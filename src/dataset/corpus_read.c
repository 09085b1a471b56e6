/* Reading documents for `tessera data` (see corpus_read.h). */
#include "dataset/corpus_read.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fsutil.h"

void ts_corpus_batch_free(ts_corpus_batch *b)
{
    free(b->text);
    free(b->doc_off);
    free(b->doc_val);
    free(b->ids.ids);
    free(b->doc_tok_end);
    memset(b, 0, sizeof *b);
}

static void reserve_text(ts_corpus_batch *b, size_t more)
{
    if (b->len + more <= b->cap) return;
    size_t cap = b->cap ? b->cap : 1 << 16;
    while (cap < b->len + more) cap *= 2;
    char *t = realloc(b->text, cap);
    if (!t) ts_out_of_memory(cap, "the text of a batch of documents (one document is read whole)");
    b->text = t;
    b->cap = cap;
}

/* Start document n_docs at the current end of the text. */
static void begin_doc(ts_corpus_batch *b, int val)
{
    if (b->n_docs + 2 > b->docs_cap) {
        b->docs_cap = b->docs_cap ? 2 * b->docs_cap : 256;
        b->doc_off = realloc(b->doc_off, b->docs_cap * sizeof *b->doc_off);
        b->doc_val = realloc(b->doc_val, b->docs_cap);
        if (!b->doc_off || !b->doc_val)
            ts_out_of_memory(b->docs_cap * (sizeof *b->doc_off + 1), "a batch's document offsets");
    }
    b->doc_off[b->n_docs] = b->len;
    b->doc_val[b->n_docs] = (unsigned char)val;
}

static void end_doc(ts_corpus_batch *b)
{
    b->n_docs++;
    b->doc_off[b->n_docs] = b->len;
}

void ts_corpus_reader_init(ts_corpus_reader *r, const ts_corpus_files *files, const char *field,
                           int skip_bad, double val_limit)
{
    memset(r, 0, sizeof *r);
    r->files = files;
    r->field = field;
    r->skip_bad = skip_bad;
    r->val_limit = val_limit;
}

void ts_corpus_reader_free(ts_corpus_reader *r)
{
    if (r->f) fclose(r->f);
    free(r->line_buf);
    memset(r, 0, sizeof *r);
}

static ts_status changed(const ts_corpus_file *cf, uint64_t got)
{
    return ts_fail("input %s changed while it was read (%" PRIu64 " bytes at the start, %" PRIu64
                   " now): run `tessera data` again when nothing writes to it",
                   cf->path, cf->size, got);
}

/* A text file is one document, read whole. */
static ts_status read_text_file(ts_corpus_reader *r, ts_corpus_batch *b)
{
    const ts_corpus_file *cf = &r->files->files[r->fi];
    int fd = ts_open_input(cf->path);
    if (fd < 0) return ts_fail("input %s: %s", cf->path, strerror(errno));
    begin_doc(b, (double)r->file_base < r->val_limit);
    uint64_t got = 0;
    for (;;) {
        if (r->stop && *r->stop) {
            close(fd);
            return ts_fail("stopped while reading %s", cf->path);
        }
        reserve_text(b, 1 << 16);
        ssize_t n = read(fd, b->text + b->len, b->cap - b->len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            int err = errno;
            close(fd);
            return ts_fail("reading input %s: %s", cf->path, strerror(err));
        }
        if (n == 0) break;
        b->len += (size_t)n;
        got += (uint64_t)n;
        if (got > cf->size) break;
    }
    close(fd);
    if (got != cf->size) return changed(cf, got);
    end_doc(b);
    b->in_bytes += got;
    return TS_OK;
}

static int blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return 0;
    return 1;
}

/* The length of the JSON number at s (at most n bytes), by JSON's grammar
 * -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?, or 0 when s does not start with one. */
static size_t json_number_len(const char *s, size_t n)
{
    size_t i = 0;
    if (i < n && s[i] == '-') i++;
    if (i >= n || s[i] < '0' || s[i] > '9') return 0;
    if (s[i] == '0') i++;
    else
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    if (i < n && s[i] == '.') {
        size_t d = ++i;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
        if (i == d) return 0;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) i++;
        size_t d = i;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
        if (i == d) return 0;
    }
    return i;
}

/* Overwrite every JSON number outside strings with "0" and blanks, in place: jansson
 * refuses a whole line for one number it cannot hold (an integer beyond int64, such as
 * a uint64 hash id; a real beyond double, 1e999), while only the text field matters
 * here (probe D14). Numbers are ASCII and blanks are JSON whitespace, so the line keeps
 * its length, its strings and its structure: a line that is not JSON stays not JSON
 * (a token that is not a whole number by the grammar is left for jansson to refuse).
 * Returns whether anything changed. */
static int zero_numbers(char *s, size_t n)
{
    int changed = 0;
    for (size_t i = 0; i < n;) {
        if (s[i] == '"') { /* skip the string, its escapes included */
            for (i++; i < n && s[i] != '"'; i++)
                if (s[i] == '\\') i++;
            i++;
            continue;
        }
        size_t k = (s[i] == '-' || (s[i] >= '0' && s[i] <= '9')) ? json_number_len(s + i, n - i) : 0;
        if (k == 0) {
            i++;
            continue;
        }
        s[i] = '0';
        memset(s + i + 1, ' ', k - 1);
        changed = 1;
        i += k;
    }
    return changed;
}

/* One JSONL line: a document, a blank line (skipped), or a bad line (an error, or
 * counted with skip_bad). Returns 1 when a document was added, 0 when not, -1 on error. */
static int read_jsonl_line(ts_corpus_reader *r, ts_corpus_batch *b, char *line, size_t n,
                           uint64_t start)
{
    const ts_corpus_file *cf = &r->files->files[r->fi];
    if (blank(line, n)) return 0;
    json_error_t jerr;
    json_t *v = json_loadb(line, n, JSON_ALLOW_NUL, &jerr);
    if (!v && json_error_code(&jerr) == json_error_numeric_overflow && zero_numbers(line, n))
        v = json_loadb(line, n, JSON_ALLOW_NUL, &jerr);
    const char *why = NULL;
    json_t *s = NULL;
    if (!v) why = jerr.text;
    else if (!json_is_object(v)) why = "the line is not a JSON object";
    else if (!(s = json_object_get(v, r->field))) why = "it has no such field";
    else if (!json_is_string(s)) why = "the field is not a string";
    if (why) {
        char msg[400];
        snprintf(msg, sizeof msg, "%s", why);
        json_decref(v);
        if (r->skip_bad) {
            r->bad_lines++;
            return 0;
        }
        ts_fail("%s:%" PRIu64 ": no string field \"%s\" (%s): fix the line, give the field's "
                "name with --text-field, or pass --skip-bad-lines to count and skip such lines",
                cf->path, r->line, r->field, msg);
        return -1;
    }
    size_t len = json_string_length(s);
    begin_doc(b, (double)(r->file_base + start) < r->val_limit);
    reserve_text(b, len);
    if (len > 0) memcpy(b->text + b->len, json_string_value(s), len); /* text NULL if empty */
    b->len += len;
    end_doc(b);
    json_decref(v);
    return 1;
}

ts_status ts_corpus_reader_next(ts_corpus_reader *r, ts_corpus_batch *b, size_t max_bytes,
                                size_t max_docs)
{
    b->len = 0;
    b->n_docs = 0;
    b->in_bytes = 0;
    b->ids.n = 0;
    b->n_invalid = 0;
    while (r->fi < r->files->n && (b->n_docs == 0 || (b->len < max_bytes && b->n_docs < max_docs))) {
        const ts_corpus_file *cf = &r->files->files[r->fi];
        if (!cf->jsonl) {
            if (read_text_file(r, b) != TS_OK) return TS_ERR;
            r->file_base += cf->size;
            r->fi++;
            continue;
        }
        if (!r->f) {
            r->f = ts_fopen_input(cf->path);
            if (!r->f) return ts_fail("input %s: %s", cf->path, strerror(errno));
            r->pos = 0;
            r->line = 0;
        }
        if (r->stop && *r->stop) return ts_fail("stopped while reading %s", cf->path);
        errno = 0;
        ssize_t n = getline(&r->line_buf, &r->line_cap, r->f);
        if (n < 0) {
            int err = ferror(r->f) ? errno : 0;
            fclose(r->f);
            r->f = NULL;
            if (err) return ts_fail("reading input %s: %s", cf->path, strerror(err));
            if (r->pos != cf->size) return changed(cf, r->pos);
            r->file_base += cf->size;
            r->fi++;
            continue;
        }
        uint64_t start = r->pos;
        r->pos += (uint64_t)n;
        r->line++;
        b->in_bytes += (uint64_t)n;
        if (r->pos > cf->size) return changed(cf, r->pos);
        if (read_jsonl_line(r, b, r->line_buf, (size_t)n, start) < 0) return TS_ERR;
    }
    return TS_OK;
}
