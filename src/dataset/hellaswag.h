/* HellaSwag scored as lm-evaluation-harness scores it (lm_eval/tasks/hellaswag/utils.py,
 * lm_eval/api/model.py _encode_pair, models/huggingface.py _loglikelihood_tokens,
 * api/task.py process_results), plus llm.c's token-normalised score
 * (dev/data/hellaswag.py). docs/ARCHITECTURE.md "Downstream evaluation".
 *
 * An item's context is preprocess(activity_label + ": " + ctx_a + " " +
 * capitalize(ctx_b)), each ending preprocess(ending) scored as the continuation " " +
 * ending. Each (context, continuation) pair is one row of seq_len positions: the
 * harness's tokens context_enc + continuation_enc (continuation_enc = encode(context +
 * continuation) past encode(context)'s length), the last seq_len + 1 of them kept when
 * longer (left truncation), the input all but the last, the continuation's tokens
 * scored at the row's last positions. */
#ifndef TS_DATASET_HELLASWAG_H
#define TS_DATASET_HELLASWAG_H

#include <stddef.h>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

#define TS_HS_ENDINGS 4 /* HellaSwag's endings per item: an item's rows are 4 in a row */

typedef struct {
    int n_items, n_rows; /* n_rows = n_items * TS_HS_ENDINGS; row r = item r/4, ending r%4 */
    int seq_len;
    int *label;          /* [n_items] the gold ending */
    int *seq;            /* every row's tokens (input + the last target), one after another */
    size_t *seq_off;     /* [n_rows] where row r's starts in seq */
    int *seq_len_of;     /* [n_rows] its length L + 1 (L <= seq_len input positions) */
    int *cont_tokens;    /* [n_rows] continuation tokens, scored at input positions
                            [L - cont_tokens, L) */
    int *cont_chars;     /* [n_rows] the ending's length in characters (Unicode code
                            points, Python's len: acc_norm's divisor) */
    int truncated;       /* rows left-truncated to seq_len + 1 tokens */
} ts_hellaswag;

/* Read HellaSwag's JSONL (one item per line: activity_label, ctx_a, ctx_b strings,
 * endings an array of 4 strings, label 0..3 as a number or a string; blank lines are
 * skipped), the first max_items items (0 = all), encoded by tok for rows of seq_len.
 * Errors name FILE:LINE and the field. */
ts_status ts_hellaswag_load(ts_hellaswag *h, const char *path, const ts_tokenizer *tok,
                            int seq_len, int max_items);
void ts_hellaswag_free(ts_hellaswag *h);

/* Row r's seq_len input tokens and targets (positions past the row: token 0, target 0,
 * not scored) and its scored positions [*from, *to). */
void ts_hellaswag_row(const ts_hellaswag *h, int r, int *tokens, int *targets, int *from,
                      int *to);

typedef struct {
    int n;               /* items scored */
    int acc;             /* argmax of the summed log-likelihood is the label */
    int acc_norm;        /* argmax of log-likelihood / characters of the ending */
    int acc_norm_tokens; /* argmin of the mean token loss of the ending (llm.c) */
} ts_hellaswag_score;

/* The scores from each row's summed loss (-log-likelihood of its continuation, row_loss
 * [n_rows]); ties go to the first ending, as numpy's argmax. */
void ts_hellaswag_score_rows(const ts_hellaswag *h, const double *row_loss,
                             ts_hellaswag_score *out);

/* The harness's text functions, exposed for the unit test: Python's str.capitalize
 * (first character title-cased, the rest lowered, by glibc's C.UTF-8 tables) and
 * utils.py's preprocess; each returns a new string (free it). */
char *ts_hellaswag_capitalize(const char *s);
char *ts_hellaswag_preprocess(const char *s);

#endif
