/* HellaSwag's items read, preprocessed and encoded as lm-evaluation-harness does, and
 * scored from the rows' losses (hellaswag.h). The text functions are plain code: the
 * harness's one regular expression, \[.*?\], is a scan for the nearest ']' on the line. */
#include "dataset/hellaswag.h"

#include <errno.h>
#include <jansson.h>
#include <locale.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wctype.h>

/* ---- UTF-8 (jansson hands over valid UTF-8 only) */

/* The code point at s (valid UTF-8), its byte count in *n. */
static uint32_t utf8_get(const unsigned char *s, int *n)
{
    if (s[0] < 0x80) { *n = 1; return s[0]; }
    if ((s[0] & 0xE0) == 0xC0) { *n = 2; return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F); }
    if ((s[0] & 0xF0) == 0xE0) {
        *n = 3;
        return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    }
    *n = 4;
    return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
           ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
}

static int utf8_put(uint32_t c, char *out)
{
    if (c < 0x80) { out[0] = (char)c; return 1; }
    if (c < 0x800) { out[0] = (char)(0xC0 | (c >> 6)); out[1] = (char)(0x80 | (c & 0x3F)); return 2; }
    if (c < 0x10000) {
        out[0] = (char)(0xE0 | (c >> 12));
        out[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        out[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (c >> 18));
    out[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((c >> 6) & 0x3F));
    out[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

static int utf8_chars(const char *s)
{
    int n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) n += (*p & 0xC0) != 0x80;
    return n;
}

/* Python's str.isspace() set, which str.strip() and rstrip() remove (Unicode White_Space
 * plus the separators \x1c-\x1f; glibc's iswspace differs: it leaves out U+00A0). */
static bool py_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Bytes of s's trailing Python whitespace. */
static size_t trailing_space(const char *s, size_t len)
{
    size_t end = len;
    while (end > 0) {
        size_t b = end - 1;
        while (b > 0 && ((unsigned char)s[b] & 0xC0) == 0x80) b--;
        int n;
        if (!py_space(utf8_get((const unsigned char *)s + b, &n))) break;
        end = b;
    }
    return len - end;
}

/* glibc's C.UTF-8 case tables (a well-kept library's Unicode simple case mapping; Python
 * uses the full mapping, which differs only for a few characters such as U+0130 and
 * U+00DF: none are in HellaSwag's English text). */
static locale_t utf8_locale(void)
{
    static locale_t loc = (locale_t)0;
    if (!loc) loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
    return loc;
}

char *ts_hellaswag_capitalize(const char *s)
{
    const size_t len = strlen(s);
    char *out = ts_malloc(len * 2 + 8); /* a case change can lengthen a character's UTF-8 */
    const locale_t loc = utf8_locale();
    size_t o = 0;
    bool first = true;
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        int n;
        uint32_t c = utf8_get(p, &n);
        if (loc) c = (uint32_t)(first ? towupper_l((wint_t)c, loc) : towlower_l((wint_t)c, loc));
        else if (c < 0x80) c = first ? (uint32_t)(c >= 'a' && c <= 'z' ? c - 32 : c)
                                     : (uint32_t)(c >= 'A' && c <= 'Z' ? c + 32 : c);
        o += (size_t)utf8_put(c, out + o);
        p += n;
        first = false;
    }
    out[o] = '\0';
    return out;
}

char *ts_hellaswag_preprocess(const char *text)
{
    /* text.strip() */
    const unsigned char *u = (const unsigned char *)text;
    size_t len = strlen(text), b = 0;
    while (b < len) {
        int n;
        if (!py_space(utf8_get(u + b, &n))) break;
        b += (size_t)n;
    }
    len -= trailing_space(text + b, len - b);
    const char *s = text + b;
    len -= b;
    /* text.replace(" [title]", ". ") */
    char *a = ts_malloc(len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        if (len - i >= 8 && !memcmp(s + i, " [title]", 8)) {
            memcpy(a + n, ". ", 2);
            n += 2;
            i += 8;
        } else {
            a[n++] = s[i++];
        }
    }
    /* re.sub("\\[.*?\\]", "", text): at each '[', the nearest ']' with no newline between
     * ('.' does not match one) is removed with it; else the '[' stays. */
    char *c = ts_malloc(n + 1);
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        if (a[i] == '[') {
            size_t j = i + 1;
            while (j < n && a[j] != ']' && a[j] != '\n') j++;
            if (j < n && a[j] == ']') {
                i = j + 1;
                continue;
            }
        }
        c[m++] = a[i++];
    }
    /* text.replace("  ", " "): one pass, left to right, non-overlapping. */
    char *d = a; /* a is free to reuse: m <= n */
    size_t k = 0;
    for (size_t i = 0; i < m;) {
        if (c[i] == ' ' && i + 1 < m && c[i + 1] == ' ') {
            d[k++] = ' ';
            i += 2;
        } else {
            d[k++] = c[i++];
        }
    }
    d[k] = '\0';
    free(c);
    return d;
}

/* ---- reading the file */

typedef struct {
    int *v;
    size_t n, cap;
} int_vec;

static void vec_push(int_vec *v, const uint32_t *ids, size_t n)
{
    if (n == 0) return;
    v->v = ts_grow(v->v, &v->cap, v->n + n - 1, sizeof *v->v);
    for (size_t i = 0; i < n; i++) v->v[v->n + i] = (int)ids[i];
    v->n += n;
}

static ts_status encode(ts_tok_encoder *enc, const char *s, size_t len, ts_tok_ids *out)
{
    out->n = 0;
    return ts_tok_encode(enc, s, len, out, NULL);
}

static const char *field_str(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* One line's item into h's rows (item index it). */
static ts_status add_item(ts_hellaswag *h, const char *path, long line, json_t *o, int it,
                          ts_tok_encoder *enc, int_vec *seq, ts_tok_ids *ctx_ids,
                          ts_tok_ids *whole_ids)
{
    static const char *const k_fields[] = {"activity_label", "ctx_a", "ctx_b"};
    const char *f[3];
    for (int i = 0; i < 3; i++)
        if (!(f[i] = field_str(o, k_fields[i])))
            return ts_fail("%s:%ld: \"%s\" is missing or not a string (a HellaSwag item has "
                           "activity_label, ctx_a, ctx_b, endings and label)",
                           path, line, k_fields[i]);
    json_t *ends = json_object_get(o, "endings");
    if (!json_is_array(ends) || json_array_size(ends) != TS_HS_ENDINGS)
        return ts_fail("%s:%ld: \"endings\" is missing or not an array of %d strings", path, line,
                       TS_HS_ENDINGS);
    json_t *lab = json_object_get(o, "label");
    long label = -1;
    if (json_is_integer(lab)) label = (long)json_integer_value(lab);
    else if (json_is_string(lab) && strlen(json_string_value(lab)) == 1 &&
             json_string_value(lab)[0] >= '0' && json_string_value(lab)[0] <= '9')
        label = json_string_value(lab)[0] - '0'; /* the Hugging Face copy's "0".."3" */
    if (label < 0 || label >= TS_HS_ENDINGS)
        return ts_fail("%s:%ld: \"label\" is missing or not one of 0, 1, 2, 3 (a number or a "
                       "one-digit string)",
                       path, line);
    h->label[it] = (int)label;

    /* query = preprocess(activity_label + ": " + ctx_a + " " + ctx_b.capitalize()) */
    char *cap = ts_hellaswag_capitalize(f[2]);
    size_t qlen = strlen(f[0]) + strlen(f[1]) + strlen(cap) + 4;
    char *raw = ts_malloc(qlen);
    snprintf(raw, qlen, "%s: %s %s", f[0], f[1], cap);
    free(cap);
    char *ctx = ts_hellaswag_preprocess(raw);
    free(raw);
    /* _encode_pair: the context's trailing whitespace moves to the continuation. */
    const size_t clen_all = strlen(ctx), sp = trailing_space(ctx, clen_all),
                 clen = clen_all - sp;
    ts_status st = TS_OK;
    if (clen == 0) st = ts_fail("%s:%ld: the context is empty after preprocessing", path, line);
    if (st == TS_OK && encode(enc, ctx, clen, ctx_ids) != TS_OK) st = TS_ERR;
    for (int j = 0; st == TS_OK && j < TS_HS_ENDINGS; j++) {
        json_t *e = json_array_get(ends, (size_t)j);
        if (!json_is_string(e)) {
            st = ts_fail("%s:%ld: endings[%d] is not a string", path, line, j);
            break;
        }
        char *choice = ts_hellaswag_preprocess(json_string_value(e));
        const int r = it * TS_HS_ENDINGS + j;
        h->cont_chars[r] = utf8_chars(choice);
        if (h->cont_chars[r] == 0) {
            free(choice);
            st = ts_fail("%s:%ld: endings[%d] is empty after preprocessing (acc_norm divides "
                         "by its length)",
                         path, line, j);
            break;
        }
        /* whole = encode(context + trailing spaces + " " + choice) */
        const size_t wlen = clen_all + 1 + strlen(choice);
        char *whole = ts_malloc(wlen + 1);
        snprintf(whole, wlen + 1, "%s %s", ctx, choice);
        free(choice);
        st = encode(enc, whole, wlen, whole_ids);
        free(whole);
        if (st != TS_OK) break;
        const size_t nc = ctx_ids->n;
        if (whole_ids->n <= nc) {
            st = ts_fail("%s:%ld: endings[%d] adds no token past the context's (the harness "
                         "asserts a non-empty continuation)",
                         path, line, j);
            break;
        }
        const size_t ncont = whole_ids->n - nc;
        if (ncont > (size_t)h->seq_len) {
            st = ts_fail("%s:%ld: endings[%d] is %zu tokens, more than model.seq_len = %d (the "
                         "harness refuses a continuation longer than the window)",
                         path, line, j, ncont, h->seq_len);
            break;
        }
        /* context_enc + continuation_enc, its last seq_len + 1 tokens */
        size_t total = nc + ncont, skip = 0;
        if (total > (size_t)h->seq_len + 1) {
            skip = total - ((size_t)h->seq_len + 1);
            h->truncated++;
        }
        h->seq_off[r] = seq->n;
        h->seq_len_of[r] = (int)(total - skip);
        h->cont_tokens[r] = (int)ncont;
        /* skip < nc: ncont <= seq_len (refused above) leaves at least one context token. */
        vec_push(seq, ctx_ids->ids + skip, nc - skip);
        vec_push(seq, whole_ids->ids + nc, ncont);
    }
    free(ctx);
    return st;
}

ts_status ts_hellaswag_load(ts_hellaswag *h, const char *path, const ts_tokenizer *tok,
                            int seq_len, int max_items)
{
    memset(h, 0, sizeof *h);
    h->seq_len = seq_len;
    FILE *f = fopen(path, "r");
    if (!f) return ts_fail("HellaSwag file %s cannot be read: %s", path, strerror(errno));
    ts_tok_encoder *enc = NULL;
    if (ts_tok_encoder_new(tok, &enc) != TS_OK) {
        fclose(f);
        return TS_ERR;
    }
    size_t cap[5] = {0};
    int_vec seq = {0};
    ts_tok_ids ctx_ids = {0}, whole_ids = {0};
    char *line = NULL;
    size_t line_cap = 0;
    long lineno = 0;
    ssize_t got;
    ts_status st = TS_OK;
    while (st == TS_OK && (max_items == 0 || h->n_items < max_items) &&
           (got = getline(&line, &line_cap, f)) >= 0) {
        lineno++;
        size_t k = 0;
        while (k < (size_t)got && (line[k] == ' ' || line[k] == '\t' || line[k] == '\n' ||
                                   line[k] == '\r'))
            k++;
        if (k == (size_t)got) continue; /* a blank line */
        json_error_t jerr;
        json_t *o = json_loadb(line, (size_t)got, 0, &jerr); /* one object, nothing after it */
        if (!o || !json_is_object(o)) {
            st = ts_fail("%s:%ld: not a JSON object%s%s", path, lineno, o ? "" : ": ",
                         o ? "" : jerr.text);
            json_decref(o);
            break;
        }
        const size_t r_last = (size_t)h->n_items * TS_HS_ENDINGS + TS_HS_ENDINGS - 1;
        h->label = ts_grow(h->label, &cap[0], (size_t)h->n_items, sizeof *h->label);
        h->seq_off = ts_grow(h->seq_off, &cap[1], r_last, sizeof *h->seq_off);
        h->seq_len_of = ts_grow(h->seq_len_of, &cap[2], r_last, sizeof *h->seq_len_of);
        h->cont_tokens = ts_grow(h->cont_tokens, &cap[3], r_last, sizeof *h->cont_tokens);
        h->cont_chars = ts_grow(h->cont_chars, &cap[4], r_last, sizeof *h->cont_chars);
        st = add_item(h, path, lineno, o, h->n_items, enc, &seq, &ctx_ids, &whole_ids);
        json_decref(o);
        if (st == TS_OK) h->n_items++;
    }
    if (st == TS_OK && ferror(f)) st = ts_fail("reading %s failed: %s", path, strerror(errno));
    if (st == TS_OK && h->n_items == 0)
        st = ts_fail("HellaSwag file %s holds no items (one JSON object a line)", path);
    free(line);
    free(ctx_ids.ids);
    free(whole_ids.ids);
    ts_tok_encoder_free(enc);
    fclose(f);
    h->seq = seq.v;
    h->n_rows = h->n_items * TS_HS_ENDINGS;
    if (st != TS_OK) ts_hellaswag_free(h);
    return st;
}

void ts_hellaswag_free(ts_hellaswag *h)
{
    free(h->label);
    free(h->seq);
    free(h->seq_off);
    free(h->seq_len_of);
    free(h->cont_tokens);
    free(h->cont_chars);
    memset(h, 0, sizeof *h);
}

void ts_hellaswag_row(const ts_hellaswag *h, int r, int *tokens, int *targets, int *from,
                      int *to)
{
    const int *s = h->seq + h->seq_off[r];
    const int L = h->seq_len_of[r] - 1; /* input positions */
    for (int t = 0; t < h->seq_len; t++) {
        tokens[t] = t < L ? s[t] : 0;
        targets[t] = t < L ? s[t + 1] : 0;
    }
    *from = L - h->cont_tokens[r];
    *to = L;
}

void ts_hellaswag_score_rows(const ts_hellaswag *h, const double *row_loss,
                             ts_hellaswag_score *out)
{
    memset(out, 0, sizeof *out);
    out->n = h->n_items;
    for (int i = 0; i < h->n_items; i++) {
        const double *l = row_loss + (size_t)i * TS_HS_ENDINGS;
        const int *ch = h->cont_chars + (size_t)i * TS_HS_ENDINGS;
        const int *nt = h->cont_tokens + (size_t)i * TS_HS_ENDINGS;
        int best = 0, best_norm = 0, best_tok = 0;
        for (int j = 1; j < TS_HS_ENDINGS; j++) {
            /* log-likelihood = -loss; the first of equals wins (numpy's argmax) */
            if (-l[j] > -l[best]) best = j;
            if (-l[j] / ch[j] > -l[best_norm] / ch[best_norm]) best_norm = j;
            if (l[j] / nt[j] < l[best_tok] / nt[best_tok]) best_tok = j;
        }
        out->acc += best == h->label[i];
        out->acc_norm += best_norm == h->label[i];
        out->acc_norm_tokens += best_tok == h->label[i];
    }
}
