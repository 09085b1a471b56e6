/* Schedules as CSV, in torch.distributed.pipelining's compute-only format: one line per
 * pipeline rank (rank 0 first), comma-separated cells "<stage><F|B|I|W><micro-batch>"
 * ("0F1", "1B0", "0I2", "0W2"), or an overlapped forward/backward pair
 * "(<action>;<action>)OVERLAP_F_B" (DualPipeV's); empty cells and spaces around cells
 * are ignored. A stage is our global chunk. The placement is read from the file: a
 * stage belongs to the rank whose line lists it, and one stage on two lines is refused
 * (loop, v or any other map; schedule.h). */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config/config.h" /* TS_MAX_CHUNKS */
#include "core/fsutil.h"
#include "pipeline/schedule.h"

/* The largest schedule CSV read: a few bytes per action, so 64 MiB is millions of
 * micro-batches; it bounds the file (and so every line) read into memory. */
#define TS_SCHEDULE_CSV_MAX_BYTES (64ull << 20)

ts_status ts_schedule_write_csv(const ts_schedule *s, const char *path)
{
    /* Whole or not at all: a temporary file renamed into place once every write,
     * the flush and the fsync succeeded (ts_atomic_commit checks them all). */
    ts_atomic_file af;
    if (ts_atomic_open(&af, path, "schedule CSV") != TS_OK) return TS_ERR;
    char cell[32], second[32];
    for (int r = 0; r < s->pp; r++) {
        for (int j = 0; j < s->n_actions[r]; j++) {
            const ts_action *a = &s->actions[r][j];
            ts_action_cell(cell, sizeof cell, *a);
            if (a->overlap && j + 1 < s->n_actions[r]) { /* the pair is one cell */
                ts_action_cell(second, sizeof second, s->actions[r][j + 1]);
                fprintf(af.f, "%s(%s;%s)OVERLAP_F_B", j ? "," : "", cell, second);
                j++;
            } else
                fprintf(af.f, "%s%s", j ? "," : "", cell);
        }
        fputc('\n', af.f);
    }
    return ts_atomic_commit(&af);
}

/* A cell for a message: at most 40 bytes of it, non-printable bytes as \xNN (a binary
 * file must not send raw bytes to the terminal). */
static const char *printable(const char *cell, char *buf, size_t size)
{
    enum { MAX_SHOWN = 40 };
    size_t o = 0, i = 0;
    for (; cell[i] && i < MAX_SHOWN && o + 5 < size; i++) {
        unsigned char c = (unsigned char)cell[i];
        if (c >= 0x20 && c < 0x7f && c != '\\')
            buf[o++] = (char)c;
        else
            o += (size_t)snprintf(buf + o, size - o, "\\x%02x", c);
    }
    if (cell[i] && o + 4 < size) o += (size_t)snprintf(buf + o, size - o, "...");
    buf[o] = '\0';
    return buf;
}

/* A growing action list for one row. */
typedef struct {
    ts_action *a;
    int n, cap;
} row_list;

static void row_push(row_list *row, ts_action a)
{
    if (row->n == row->cap) {
        row->cap = row->cap ? 2 * row->cap : 64;
        ts_action *grown = realloc(row->a, (size_t)row->cap * sizeof *grown);
        if (!grown) ts_out_of_memory((size_t)row->cap * sizeof *grown, "a schedule CSV's row");
        row->a = grown;
    }
    row->a[row->n++] = a;
}

/* Parse a decimal number of at most 7 digits at *p; -1 if there is none or it is too long. */
static int parse_num(const char **p)
{
    const char *q = *p;
    long v = 0;
    while (isdigit((unsigned char)*q) && q - *p < 8) v = v * 10 + (*q++ - '0');
    if (q == *p || isdigit((unsigned char)*q) || q - *p > 7) return -1;
    *p = q;
    return (int)v;
}

/* One action "<stage><F|B|I|W><mb>" (raw, NUL-terminated) of cell `cell` (as shown). */
static ts_status parse_action(const char *path, int line, const char *cell, const char *raw,
                              int m, ts_action *out)
{
    const char *p = raw;
    int stage = parse_num(&p);
    const char *kinds = "FBIW", *k = *p ? strchr(kinds, *p) : NULL;
    if (stage < 0 || !k || !isdigit((unsigned char)p[1])) {
        if (stage >= 0 && isupper((unsigned char)p[0]) && isupper((unsigned char)p[1]))
            return ts_fail("%s:%d: cell '%s': only compute actions (F, B, I, W and "
                           "OVERLAP_F_B pairs) are supported; write a compute-only schedule "
                           "(the engine adds the sends and receives)",
                           path, line, cell);
        return ts_fail("%s:%d: cell '%s': expected <stage><F|B|I|W><micro-batch>, e.g. '0F1', "
                       "or (<action>;<action>)OVERLAP_F_B",
                       path, line, cell);
    }
    p++;
    int mb = parse_num(&p);
    if (mb < 0 || *p)
        return ts_fail("%s:%d: cell '%s': expected <stage><F|B|I|W><micro-batch>, e.g. '0F1', "
                       "or (<action>;<action>)OVERLAP_F_B",
                       path, line, cell);
    if (mb >= m)
        return ts_fail("%s:%d: cell '%s': micro-batch %d, but the config gives %d "
                       "micro-batches per step (0..%d; train.global_batch / (dp * "
                       "micro_batch))",
                       path, line, cell, mb, m, m - 1);
    *out = (ts_action){ .kind = (ts_action_kind)(k - kinds), .chunk = stage, .mb = mb };
    return TS_OK;
}

/* One trimmed, non-empty cell of line `line`: one action, or an overlapped pair
 * "(a;b)OVERLAP_F_B" (two actions, the first marked overlap). Returns how many in *n. */
static ts_status parse_cell(const char *path, int line, char *raw, int m, ts_action out[2],
                            int *n)
{
    char cell[4 * 40 + 8]; /* the cell as messages show it */
    printable(raw, cell, sizeof cell);
    static const char suffix[] = ")OVERLAP_F_B";
    const size_t len = strlen(raw), k = sizeof suffix - 1;
    if (raw[0] != '(') {
        *n = 1;
        return parse_action(path, line, cell, raw, m, &out[0]);
    }
    char *semi = strchr(raw, ';');
    if (len <= k + 1 || strcmp(raw + len - k, suffix) != 0 || !semi || semi > raw + len - k ||
        strchr(semi + 1, ';'))
        return ts_fail("%s:%d: cell '%s': a pair cell is (<action>;<action>)OVERLAP_F_B, e.g. "
                       "'(1F3;0B1)OVERLAP_F_B'",
                       path, line, cell);
    raw[len - k] = '\0';
    *semi = '\0';
    *n = 2;
    if (parse_action(path, line, cell, raw + 1, m, &out[0]) != TS_OK ||
        parse_action(path, line, cell, semi + 1, m, &out[1]) != TS_OK)
        return TS_ERR;
    out[0].overlap = true;
    return TS_OK;
}

/* Where each stage was first seen: its line (rank) and line number, grown as stages come. */
typedef struct {
    int *rank, *line; /* [cap], -1 = not seen */
    int cap, max_stage;
} stage_map;

static ts_status place_stage(stage_map *sm, const char *path, int line, int row, ts_action a)
{
    if (a.chunk >= TS_MAX_CHUNKS) {
        char cell[32];
        return ts_fail("%s:%d: cell '%s': stage %d, but at most %d chunks are supported", path,
                       line, ts_action_cell(cell, sizeof cell, a), a.chunk, TS_MAX_CHUNKS);
    }
    if (a.chunk >= sm->cap) {
        int cap = sm->cap ? sm->cap : 16;
        while (cap <= a.chunk) cap *= 2;
        sm->rank = realloc(sm->rank, (size_t)cap * sizeof(int));
        sm->line = realloc(sm->line, (size_t)cap * sizeof(int));
        if (!sm->rank || !sm->line)
            ts_out_of_memory((size_t)cap * 2 * sizeof(int), "a schedule CSV's chunk placement");
        for (int c = sm->cap; c < cap; c++) sm->rank[c] = sm->line[c] = -1;
        sm->cap = cap;
    }
    if (sm->rank[a.chunk] < 0) {
        sm->rank[a.chunk] = row;
        sm->line[a.chunk] = line;
    } else if (sm->rank[a.chunk] != row) {
        char cell[32];
        return ts_fail("%s:%d: cell '%s': stage %d is on line %d (pipeline rank %d) too; a "
                       "stage lives on one rank, so all its actions go on that rank's line",
                       path, line, ts_action_cell(cell, sizeof cell, a), a.chunk,
                       sm->line[a.chunk], sm->rank[a.chunk]);
    }
    if (a.chunk > sm->max_stage) sm->max_stage = a.chunk;
    return TS_OK;
}

/* Split `text` (one line, no newline) at commas and append its cells to `row`. */
static ts_status parse_line(const char *path, int line, int row, char *text, int m,
                            row_list *list, stage_map *sm)
{
    for (char *cell = text;;) {
        char *comma = strchr(cell, ',');
        if (comma) *comma = '\0';
        while (isspace((unsigned char)*cell)) cell++;
        char *end = cell + strlen(cell);
        while (end > cell && isspace((unsigned char)end[-1])) *--end = '\0';
        if (*cell) {
            ts_action a[2] = { { TS_ACT_F, 0, 0, false }, { TS_ACT_F, 0, 0, false } };
            int n = 0;
            if (parse_cell(path, line, cell, m, a, &n) != TS_OK) return TS_ERR;
            for (int i = 0; i < n; i++) {
                if (place_stage(sm, path, line, row, a[i]) != TS_OK) return TS_ERR;
                row_push(list, a[i]);
            }
        }
        if (!comma) return TS_OK;
        cell = comma + 1;
    }
}

static bool blank(const char *s)
{
    for (; *s; s++)
        if (!isspace((unsigned char)*s) && *s != ',') return false;
    return true;
}

/* Read the rows of `f` into lists[0..pp-1]; *n_rows = lines up to the last non-blank. */
static ts_status read_rows(FILE *f, const char *path, int pp, int m, row_list *lists,
                           int *n_rows, stage_map *sm)
{
    char *text = NULL;
    size_t cap = 0;
    ts_status st = TS_OK;
    *n_rows = 0;
    int line = 0;
    /* Lines end in \n, \r\n or a lone \r (old Mac files): each \n-terminated read is
     * split at its \r's, a \r just before the \n ending nothing (probe Q4: a CR-only
     * file read as one line). */
    while (st == TS_OK && getline(&text, &cap, f) >= 0) {
        text[strcspn(text, "\n")] = '\0';
        const size_t len = strlen(text);
        if (len > 0 && text[len - 1] == '\r') text[len - 1] = '\0';
        for (char *row = text, *next; row && st == TS_OK; row = next) {
            next = strchr(row, '\r');
            if (next) *next++ = '\0';
            line++;
            if (blank(row)) continue; /* a blank row is an empty rank: validation says so */
            if (line > pp) {
                st = ts_fail("%s:%d: the file has more lines than pipeline ranks (pp = %d): "
                             "one line per rank, rank 0 first",
                             path, line, pp);
                break;
            }
            *n_rows = line;
            st = parse_line(path, line, line - 1, row, m, &lists[line - 1], sm);
        }
    }
    free(text);
    if (st == TS_OK && ferror(f))
        st = ts_fail("cannot read schedule CSV '%s': %s", path, strerror(errno));
    return st;
}

ts_status ts_schedule_read_csv(ts_schedule *s, const char *path, int pp, int v, int m)
{
    memset(s, 0, sizeof *s);
    if (pp < 1 || v < 1 || m < 1)
        return ts_fail("schedule CSV '%s': pp = %d, virtual_stages = %d and the number of "
                       "micro-batches %d must all be >= 1",
                       path, pp, v, m);
    FILE *f = ts_fopen_input(path); /* cannot block: core/fsutil.h */
    if (!f)
        return ts_fail("cannot open schedule CSV '%s' (parallel.schedule): %s", path,
                       strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) { /* fopen opens directories */
        fclose(f);
        return ts_fail("schedule CSV '%s' (parallel.schedule) is a directory; give the CSV "
                       "file",
                       path);
    }
    /* A regular file of a bounded size: a symlink to /dev/zero would grow without end. */
    if (ts_check_input(fileno(f), path, "schedule CSV (parallel.schedule)", "the CSV file",
                       TS_SCHEDULE_CSV_MAX_BYTES) != TS_OK) {
        fclose(f);
        return TS_ERR;
    }
    row_list *lists = ts_calloc((size_t)pp, sizeof *lists);
    int n_rows = 0;
    stage_map sm = { NULL, NULL, 0, -1 };
    ts_status st = read_rows(f, path, pp, m, lists, &n_rows, &sm);
    const int max_stage = sm.max_stage;
    fclose(f);
    if (st == TS_OK && n_rows < pp)
        st = ts_fail("%s: %d line(s) of actions but pp = %d pipeline ranks: the CSV needs one "
                     "line per rank, rank 0 first",
                     path, n_rows, pp);
    if (st == TS_OK && max_stage + 1 != pp * v) {
        int n = max_stage + 1;
        if (n % pp == 0)
            st = ts_fail("%s: found %d stages (0..%d), i.e. %d per rank, but the config has "
                         "pp = %d x virtual_stages = %d = %d chunks: set "
                         "parallel.virtual_stages = %d or fix the CSV",
                         path, n, n - 1, n / pp, pp, v, pp * v, n / pp);
        else
            st = ts_fail("%s: found %d stages (0..%d), but the config has pp = %d x "
                         "virtual_stages = %d = %d chunks (and %d is not a multiple of pp)",
                         path, n, n - 1, pp, v, pp * v, n);
    }
    for (int c = 0; st == TS_OK && c <= max_stage; c++)
        if (sm.rank[c] < 0)
            st = ts_fail("%s: stage %d appears on no line, but the file has stages 0..%d: every "
                         "stage needs its forward and backward on one rank's line",
                         path, c, max_stage);
    if (st != TS_OK) {
        for (int r = 0; r < pp; r++) free(lists[r].a);
        free(lists);
        free(sm.rank);
        free(sm.line);
        return st;
    }
    size_t len = strlen(path), room = sizeof s->name - 1; /* a long path keeps its end */
    ts_schedule_init(s, path, pp, v, m);
    if (len > room) snprintf(s->name, sizeof s->name, "...%s", path + len - (room - 3));
    for (int r = 0; r < pp; r++) {
        s->n_actions[r] = lists[r].n;
        s->actions[r] = lists[r].a; /* ownership moves to s */
    }
    free(lists);
    memcpy(s->chunk_rank, sm.rank, (size_t)s->n_chunks * sizeof(int));
    s->placement = ts_placement_of(s->chunk_rank, s->n_chunks, pp);
    free(sm.rank);
    free(sm.line);
    if (ts_schedule_validate(s, NULL) != TS_OK) {
        ts_error_prefix("%s: ", path);
        ts_schedule_free(s);
        return TS_ERR;
    }
    return TS_OK;
}
