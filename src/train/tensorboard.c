/* log.tensorboard (docs/CONTRACT.md "TensorBoard"): rank 0 writes every number of every
 * metrics line as a TensorBoard scalar, through core/tfevents.h. The line's text is
 * parsed back and walked generically, so a metric added to any line (the step's, the
 * validation's, an evaluation's) reaches TensorBoard without this file naming it. */
#include "train/internal.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint/claim.h"
#include "core/fsutil.h"

#define WHAT "log.tensorboard"

ts_status ts_trainer_open_tensorboard(ts_trainer *t)
{
    const char *dir = t->cfg.log.tensorboard;
    t->report_step = t->start_step; /* the step of a line without one (the BLAS line) */
    if (t->groups->world.rank != 0 || !dir[0]) return TS_OK;
    if (ts_ckpt_check_output(dir, WHAT, t->cfg.checkpoint.dir, t->loaded_from) != TS_OK)
        return TS_ERR;
    struct stat st;
    if (stat(dir, &st) == 0 && !S_ISDIR(st.st_mode))
        return ts_fail(WHAT " = %s is %s, not a directory: it names the directory the event "
                            "files go to",
                       dir, S_ISREG(st.st_mode) ? "a file" : ts_file_kind(st.st_mode));
    return ts_tfevents_open(&t->tboard, dir, WHAT);
}

/* The scalars of one line, their tags owned. */
typedef struct {
    ts_tfevents_scalar *v;
    size_t n, cap;
} scalars;

static void add(scalars *s, const char *tag, double value)
{
    s->v = ts_grow(s->v, &s->cap, s->n, sizeof *s->v);
    const size_t len = strlen(tag) + 1;
    char *copy = ts_malloc(len);
    memcpy(copy, tag, len);
    s->v[s->n].tag = copy;
    s->v[s->n].value = (float)value;
    s->n++;
}

/* What an array's index means, for its tags "KEY/<label><index>": the per-rank lists
 * of the start-up and memory lines, multi-token prediction's depths (from 1), the
 * datasets of a blend. An array not named here gets "KEY/<index>". */
static const struct {
    const char *key, *label;
    int base;
} ARRAYS[] = {
    {"blas_gflops", "rank", 0},   {"gemm_gflops", "rank", 0},      {"peak_rss_mb", "rank", 0},
    {"activation_mb", "rank", 0}, {"optimizer_mb", "rank", 0},     {"step_peak_rss_mb", "rank", 0},
    {"state_mb", "rank", 0},      {"zero_buffers_mb", "rank", 0},  {"estimate_mb", "rank", 0},
    {"mtp_loss", "depth", 1},     {"val_mtp_loss", "depth", 1},    {"data_shares", "dataset", 0},
    {"data_epochs", "dataset", 0},
};

/* The numbers under `tag`: a number itself; true/false as 1/0; null (JSON's stand-in
 * for a value that was not finite) as NaN; an array's elements as tag/<label><i>, an
 * object's members as tag/name; strings are not scalars and are left out. */
static void walk(scalars *s, const char *tag, json_t *v, const char *label, int base)
{
    char child[512];
    switch (json_typeof(v)) {
    case JSON_INTEGER:
    case JSON_REAL: add(s, tag, json_number_value(v)); break;
    case JSON_TRUE: add(s, tag, 1.0); break;
    case JSON_FALSE: add(s, tag, 0.0); break;
    case JSON_NULL: add(s, tag, NAN); break;
    case JSON_ARRAY:
        for (size_t i = 0; i < json_array_size(v); i++) {
            snprintf(child, sizeof child, "%s/%s%zu", tag, label, i + (size_t)base);
            walk(s, child, json_array_get(v, i), "", 0);
        }
        break;
    case JSON_OBJECT: {
        const char *k;
        json_t *m;
        json_object_foreach(v, k, m) {
            snprintf(child, sizeof child, "%s/%s", tag, k);
            walk(s, child, m, "", 0);
        }
        break;
    }
    default: break; /* a string */
    }
}

/* A key's tag: the validation's keys under "val/" and HellaSwag's under "hellaswag/"
 * (TensorBoard groups its charts by the tag's first part); every other key as it is. */
static void tag_of(const char *key, char *tag, size_t cap)
{
    static const struct {
        const char *prefix, *group;
    } GROUPS[] = {{"val_", "val/"}, {"hellaswag_", "hellaswag/"}};
    for (size_t g = 0; g < sizeof GROUPS / sizeof GROUPS[0]; g++) {
        const size_t n = strlen(GROUPS[g].prefix);
        if (!strncmp(key, GROUPS[g].prefix, n) && key[n]) {
            snprintf(tag, cap, "%s%s", GROUPS[g].group, key + n);
            return;
        }
    }
    snprintf(tag, cap, "%s", key);
}

/* log.moe_every's line: moe_tokens[i][e] is block moe_layers[i]'s expert e, tagged
 * "moe/block<L>/expert<e>" (moe_layers itself only labels them). */
static void walk_moe_tokens(scalars *s, json_t *line)
{
    json_t *layers = json_object_get(line, "moe_layers"), *tokens = json_object_get(line, "moe_tokens");
    char tag[128];
    for (size_t i = 0; i < json_array_size(tokens); i++) {
        json_t *row = json_array_get(tokens, i), *l = json_array_get(layers, i);
        for (size_t e = 0; e < json_array_size(row); e++) {
            if (json_is_integer(l))
                snprintf(tag, sizeof tag, "moe/block%lld/expert%zu", (long long)json_integer_value(l), e);
            else
                snprintf(tag, sizeof tag, "moe_tokens/%zu/%zu", i, e);
            walk(s, tag, json_array_get(row, e), "", 0);
        }
    }
}

ts_status ts_trainer_tensorboard_line(ts_trainer *t, const char *text)
{
    if (!ts_tfevents_is_open(&t->tboard)) return TS_OK;
    json_error_t jerr;
    json_t *line = json_loads(text, 0, &jerr);
    if (!json_is_object(line)) { /* the trainer wrote it: a bug, said plainly */
        json_decref(line);
        return ts_fail(WHAT ": a metrics line is not a JSON object (%s): %.200s", jerr.text, text);
    }
    json_t *step = json_object_get(line, "step");
    const long long at = json_is_integer(step) ? (long long)json_integer_value(step) : t->report_step;
    scalars s = {0};
    const char *key;
    json_t *v;
    char tag[256];
    json_object_foreach(line, key, v) {
        if (!strcmp(key, "step") || !strcmp(key, "moe_layers")) continue;
        if (!strcmp(key, "moe_tokens")) {
            walk_moe_tokens(&s, line);
            continue;
        }
        const char *label = "";
        int base = 0;
        for (size_t a = 0; a < sizeof ARRAYS / sizeof ARRAYS[0]; a++)
            if (!strcmp(key, ARRAYS[a].key)) {
                label = ARRAYS[a].label;
                base = ARRAYS[a].base;
            }
        tag_of(key, tag, sizeof tag);
        walk(&s, tag, v, label, base);
    }
    const ts_status st = ts_tfevents_scalars(&t->tboard, at, s.v, s.n, WHAT);
    for (size_t i = 0; i < s.n; i++) free((char *)s.v[i].tag);
    free(s.v);
    json_decref(line);
    return st;
}
