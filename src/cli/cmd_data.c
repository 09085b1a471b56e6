#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/fsutil.h"
#include "dataset/corpus.h"
#include "dataset/loader.h"
#include "tokenizer/tokenizer.h"

static const char *k_help =
    "usage: tessera data [options] INPUT... --out PREFIX\n"
    "       tessera data TEXT_FILE OUT.bin [--format gpt2|llama3]\n"
    "\n"
    "Tokenize a corpus into llm.c token shards. INPUT: text files (one document each),\n"
    "JSONL files (one document per line, its --text-field string; by the name *.jsonl or\n"
    "*.json-lines, or every input with --jsonl) and directories (every file under them,\n"
    "in sorted path order; names starting with '.' skipped). Each document starts with\n"
    "the encoding's document token (gpt2 50256 <|endoftext|>, llama3 128000\n"
    "<|begin_of_text|>; bytes none), as llm.c's data scripts do.\n"
    "\n"
    "  --out PREFIX        shards PREFIX_val_000000.bin (validation, when asked for), then\n"
    "                      PREFIX_train_NNNNNN.bin; NNNNNN counts the shards of the stream\n"
    "  --encoding NAME     bytes (vocab 256, default), gpt2 or llama3\n"
    "  --ranks FILE        the ranks file (default: $TS_TOKENIZER_DIR/NAME.tiktoken, else\n"
    "                      ~/.cache/tessera/tokenizers/NAME.tiktoken; scripts/fetch_tokenizers.sh)\n"
    "  --jsonl             read every input as JSONL\n"
    "  --text-field NAME   a JSONL line's document (default \"text\"); a line without that\n"
    "                      string field is an error naming FILE:LINE; blank lines are skipped\n"
    "  --skip-bad-lines    count such lines, skip them and report the count instead\n"
    "  --shard-tokens N    tokens per shard, 1 to 2147483647 (default 100000000); documents\n"
    "                      run on across shards\n"
    "  --val-tokens N      the stream's first N tokens are validation (the document at the\n"
    "                      boundary is cut: its rest starts the training shards)\n"
    "  --val-fraction F    0 < F < 1: the documents that start in the first F of the input\n"
    "                      bytes are validation (whole documents). Default: no validation\n"
    "  --format NAME       gpt2: uint16 ids, magic 20240520; llama3: uint32 ids, magic\n"
    "                      20240801 (default: gpt2's up to 65536 ids, else llama3's)\n"
    "  --threads N         encoding threads (default: the cores this process may use);\n"
    "                      the shards are the same for any N\n"
    "  --overwrite         replace PREFIX's existing shards (and remove those of them this\n"
    "                      run does not write again)\n"
    "\n"
    "Each shard is a 256 x int32 header [magic, version, count] and count ids; file size\n"
    "1024 + width * count. Shards are written to temporary names and renamed only when the\n"
    "whole corpus is done, all or none: a failed run leaves none (and under --overwrite\n"
    "the old ones as they were). The run holds PREFIX.lock (removed at its end): a second\n"
    "run on PREFIX meanwhile is refused, naming the first one's pid; the temporaries of a\n"
    "killed run (PREFIX_*.bin.tmp.PID, .old.PID) are removed by the next run on PREFIX.\n"
    "Refused before writing: PREFIX's\n"
    "directory missing, PREFIX's shards existing (without --overwrite), an input that is\n"
    "a token shard or named as an output, an input that is not text (gzip, a NUL byte\n"
    "in its first 4 KiB), an unreadable input, an empty corpus, a vocabulary above\n"
    "65536 ids with --format gpt2. Progress goes to stderr (every second on a terminal,\n"
    "else every 30 s); the summary to stdout. SIGINT, SIGTERM or SIGHUP stop the run at\n"
    "once (inside a large document too), leaving no shard.\n"
    "\n"
    "The second form (two names and no option but --format, no --out) writes the bytes\n"
    "of TEXT_FILE (vocab 256, no document tokens) into one shard OUT.bin; --format as\n"
    "above (default gpt2). Refused before anything is written: an OUT.bin that exists\n"
    "and is not a regular file, or is TEXT_FILE itself; a TEXT_FILE that already is a\n"
    "token shard.\n";

static int usage(const char *what, const char *arg)
{
    fprintf(stderr, "tessera: error: data: %s%s%s%s\n\n%s", what, arg ? " '" : "",
            arg ? arg : "", arg ? "'" : "", k_help);
    return 2;
}

static int fail_exit(void)
{
    fprintf(stderr, "tessera: error: %s\n", ts_error_message());
    return 1;
}

/* A whole decimal number in [lo, hi]: digits only (strtoull alone would take leading
 * blanks and a sign, which `tessera sample` refuses too). */
static int parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    if (*s < '0' || *s > '9') return 0;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static int default_threads(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set) > 0 ? CPU_COUNT(&set) : 1;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* The old form: TEXT_FILE's bytes into one shard. */
static int run_single(const char *text, const char *out, ts_shard_format fmt)
{
    if (ts_data_write_text_shard(text, out, fmt) != 0) return fail_exit();
    ts_dataset ds;
    if (ts_data_open(&ds, &out, 1, 256) != 0) return fail_exit();
    printf("wrote %s: %llu tokens\n", out, (unsigned long long)ds.n_tokens);
    ts_data_close(&ds);
    if (ts_stdout_check() != TS_OK) return fail_exit(); /* the report is part of the result */
    return 0;
}

static int run_corpus(const ts_corpus_options *o)
{
    ts_corpus_summary s;
    if (ts_corpus_build(o, &s) != TS_OK) return fail_exit();
    for (int i = 0; i < s.n_shards; i++)
        printf("wrote %s: %" PRIu64 " tokens\n", s.shards[i], s.shard_counts[i]);
    printf("data: %" PRIu64 " documents, %" PRIu64 " bytes, %" PRIu64 " tokens (val %" PRIu64
           ", train %" PRIu64 "), %d shards (val %d, train %d, uint%d ids, vocab %" PRIu32 "), %" PRIu64
           " invalid UTF-8 bytes, %" PRIu64 " bad lines skipped, %.2f s, %.0f tokens/s\n",
           s.documents, s.bytes, s.tokens, s.val_tokens, s.train_tokens, s.n_shards,
           s.val_shards, s.train_shards, 8 * s.width, s.vocab_size, s.invalid_utf8_bytes,
           s.bad_lines, s.seconds, s.seconds > 0 ? (double)s.tokens / s.seconds : 0.0);
    ts_corpus_summary_free(&s);
    if (ts_stdout_check() != TS_OK) return fail_exit();
    return 0;
}

int ts_cmd_data(int argc, char **argv)
{
    if (argc == 3 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h"))) {
        fputs(k_help, stdout);
        return 0;
    }
    ts_corpus_options o = {.encoding = "bytes", .text_field = "text",
                           .shard_tokens = 100000000, .format = TS_SHARD_AUTO};
    const char **pos = calloc((size_t)argc, sizeof *pos);
    if (!pos) return fail_exit();
    int n_pos = 0, rc = 0, have_fmt = 0, n_new = 0; /* n_new: options of the corpus form */
    int have_threads = 0, have_enc = 0, have_field = 0, have_shard = 0;
    for (int i = 2; i < argc && !rc; i++) {
        const char *a = argv[i], *v;
        int missing = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(k_help, stdout);
            free(pos);
            return 0;
        } else if ((v = ts_cli_opt_value(argc, argv, &i, "--format", &missing))) {
            if (have_fmt++) rc = usage("--format given twice", NULL);
            else if (!ts_shard_format_parse(v, &o.format))
                rc = usage("--format must be gpt2 or llama3, not", v);
        } else if ((v = ts_cli_opt_value(argc, argv, &i, "--out", &missing))) {
            if (o.out_prefix) rc = usage("--out given twice", NULL);
            o.out_prefix = v;
            n_new++;
        } else if ((v = ts_cli_opt_value(argc, argv, &i, "--encoding", &missing))) {
            ts_encoding_kind k;
            if (have_enc++) rc = usage("--encoding given twice", NULL);
            else if (ts_encoding_parse(v, &k) != 0)
                rc = usage("--encoding must be bytes, gpt2 or llama3, not", v);
            o.encoding = v;
            n_new++;
        } else if ((v = ts_cli_opt_value(argc, argv, &i, "--ranks", &missing))) {
            if (o.ranks) rc = usage("--ranks given twice", NULL);
            o.ranks = v;
            n_new++;
        } else if ((v = ts_cli_opt_value(argc, argv, &i, "--text-field", &missing))) {
            if (have_field++) rc = usage("--text-field given twice", NULL);
            else if (!*v) rc = usage("--text-field needs a field name", NULL);
            o.text_field = v;
            n_new++;
        } else if ((v = ts_cli_opt_value(argc, argv, &i, "--shard-tokens", &missing))) {
            if (have_shard++) rc = usage("--shard-tokens given twice", NULL);
            else if (!parse_u64(v, 1, INT32_MAX, &o.shard_tokens))
                rc = usage("--shard-tokens must be a whole number from 1 to 2147483647, not", v);
            n_new++;
        } else if ((v = ts_cli_opt_value(argc, argv, &i, "--val-tokens", &missing))) {
            if (o.val_tokens) rc = usage("--val-tokens given twice", NULL);
            else if (!parse_u64(v, 1, INT64_MAX, &o.val_tokens))
                rc = usage("--val-tokens must be a whole number of at least 1, not", v);
            n_new++;
        } else if ((v = ts_cli_opt_value(argc, argv, &i, "--val-fraction", &missing))) {
            char *end;
            errno = 0;
            double f = strtod(v, &end);
            if (o.val_fraction > 0) rc = usage("--val-fraction given twice", NULL);
            else if (errno || end == v || *end || !isfinite(f) || f <= 0 || f >= 1)
                rc = usage("--val-fraction must be a number between 0 and 1 (exclusive), not", v);
            o.val_fraction = f;
            n_new++;
        } else if ((v = ts_cli_opt_value(argc, argv, &i, "--threads", &missing))) {
            uint64_t t;
            if (have_threads++) rc = usage("--threads given twice", NULL);
            else if (!parse_u64(v, 1, 1024, &t))
                rc = usage("--threads must be a whole number from 1 to 1024, not", v);
            else o.threads = (int)t;
            n_new++;
        } else if (!strcmp(a, "--jsonl")) {
            o.force_jsonl = 1;
            n_new++;
        } else if (!strcmp(a, "--skip-bad-lines")) {
            o.skip_bad_lines = 1;
            n_new++;
        } else if (!strcmp(a, "--overwrite")) {
            o.overwrite = 1;
            n_new++;
        } else if (missing) {
            rc = usage("this option needs a value:", a);
        } else if (a[0] == '-' && a[1] != '\0') {
            rc = usage("unknown option", a);
        } else {
            pos[n_pos++] = a;
        }
    }
    if (!rc && !o.out_prefix) {
        /* The old form: exactly TEXT_FILE OUT.bin, with --format at most. Two names and
         * nothing else stay that form whatever OUT is called, so that its refusals (an
         * OUT that is a directory, a FIFO, the text itself) keep their messages. */
        if (n_pos == 2 && n_new == 0) {
            rc = run_single(pos[0], pos[1], o.format);
        } else if (n_pos == 2 && ends_with(pos[1], ".bin")) {
            rc = usage("the form TEXT_FILE OUT.bin takes --format only; for the corpus "
                       "options write the shards with --out PREFIX", NULL);
        } else {
            rc = usage(n_pos == 0 ? "data needs INPUT... --out PREFIX (or TEXT_FILE OUT.bin)"
                                  : "data needs --out PREFIX for its shards", NULL);
        }
        free(pos);
        return rc;
    }
    if (!rc && n_pos == 0) rc = usage("data needs at least one INPUT before --out PREFIX", NULL);
    if (!rc && o.val_tokens && o.val_fraction > 0)
        rc = usage("--val-tokens and --val-fraction are two ways to say one thing: give one", NULL);
    if (!rc && o.ranks && !strcmp(o.encoding, "bytes"))
        rc = usage("--ranks is for the gpt2 and llama3 encodings; the bytes encoding has "
                   "no ranks file (give --encoding)", NULL);
    if (rc) {
        free(pos);
        return rc;
    }
    if (!have_threads) o.threads = default_threads();
    o.progress = isatty(STDERR_FILENO);
    o.inputs = pos;
    o.n_inputs = n_pos;
    rc = run_corpus(&o);
    free(pos);
    return rc;
}
