/* tessera sample: generate text from a checkpoint on one process (no MPI), as nanoGPT's
 * sample.py does: the whole forward over the last seq_len tokens for every new token,
 * the last position's logits / temperature, optional top-k, softmax, one draw. */
#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint/checkpoint.h"
#include "cli/cli.h"
#include "config/config.h"
#include "core/fsutil.h"
#include "core/timer.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "model/sample.h"
#include "model/tokenizer_open.h"

static const char *k_help =
    "usage: tessera sample DIR --prompt TEXT [--ids] [--tokens N] [--temperature X]\n"
    "                      [--top-k K] [--seed S] [--tokenizer-file FILE] [--device D]\n"
    "                      [--threads N]\n"
    "\n"
    "Generate text from a checkpoint, in one process (no mpirun): the prompt, then N new\n"
    "tokens, each drawn from the model's distribution for the next token given the last\n"
    "model.seq_len tokens (a longer context is cropped to them, as nanoGPT's generate does).\n"
    "\n"
    "  DIR               a checkpoint: a step directory (DIR/step_NNNNNNNN) or the\n"
    "                    checkpoint.dir of a run, whose `latest` names the newest step\n"
    "  --prompt TEXT     what the text starts with. A model trained with a tokenizer\n"
    "                    (model.tokenizer \"gpt2\" or \"llama3\") encodes TEXT with it, a\n"
    "                    special token's text (\"<|endoftext|>\") being that token; an\n"
    "                    empty TEXT starts from the document token (gpt2: <|endoftext|>,\n"
    "                    llama3: <|begin_of_text|>). A byte-level model (vocab_size 256,\n"
    "                    no tokenizer) reads TEXT's bytes as its tokens (not empty); any\n"
    "                    other model reads token ids as --ids does\n"
    "  --ids             TEXT is a list of token ids separated by spaces or commas\n"
    "                    (\"464 3290, 318\"), each below vocab_size, and the output is ids;\n"
    "                    no tokenizer is opened\n"
    "  --tokens N        new tokens to generate, 1 to 1000000 (default 200)\n"
    "  --temperature X   divide the logits by X before the softmax, a number >= 0\n"
    "                    (default 1): below 1 sharper, above 1 flatter; 0 = greedy\n"
    "  --top-k K         draw only among the K largest logits, 0 to 2147483647\n"
    "                    (default 0 = all; 1 = greedy; K >= vocab_size = all)\n"
    "  --seed S          seed of the draws, 0 to 18446744073709551615 (default 1): the\n"
    "                    same checkpoint, prompt, options and seed give the same text\n"
    "  --tokenizer-file FILE  the ranks file of the checkpoint's tokenizer (default: its\n"
    "                    model.tokenizer_file, else the encoding's default path under\n"
    "                    $TS_TOKENIZER_DIR or ~/.cache/tessera/tokenizers); its sha256\n"
    "                    must be the one the checkpoint recorded (not with --ids, nor\n"
    "                    for a checkpoint without a tokenizer)\n"
    "  --device D        the compute backend, as train.device (default \"cpu\")\n"
    "  --threads N       CPU threads, 1 to 4096 (default 1, or OMP_NUM_THREADS): each new\n"
    "                    token is a short chain of small kernels, where more threads\n"
    "                    mostly wait for each other (and spin, 15-40x slower, on a\n"
    "                    busy machine); raise it for a large model on idle cores\n"
    "\n"
    "Output on stdout: with a tokenizer, the prompt and then each new token's bytes as it\n"
    "comes (a token may hold part of a UTF-8 character: the bytes concatenate to the\n"
    "text; a special token prints as its text; an id the model's padded vocabulary has\n"
    "but the tokenizer lacks prints as <|id:N|>); for a byte-level model the prompt's\n"
    "bytes and then the new bytes, raw (with either, a newline is added at the end only\n"
    "when stdout is a terminal); otherwise, and with --ids, the prompt's ids and the new\n"
    "ids separated by spaces, and a newline. Greedy decoding takes the first of the\n"
    "largest logits. A summary line (tokens, time) goes to stderr.\n"
    "\n"
    "Exit code 0 on success; 2 for a usage error (an unknown option, a bad value, an\n"
    "empty prompt without a tokenizer, a token id out of range); 1 when the checkpoint\n"
    "cannot be read (a missing directory, a bad state.json, a missing or corrupt weight\n"
    "file), its tokenizer's ranks file is missing, unreadable or not the one it was\n"
    "trained with (another sha256), the model's logits are not finite, or stdout cannot\n"
    "be written. One message on stderr.\n";

typedef struct {
    const char *dir, *prompt;
    const char *tokenizer_file; /* --tokenizer-file; NULL = the checkpoint's rule */
    bool ids;                   /* --ids */
    const ts_kernels *k; /* --device */
    int tokens, top_k;
    int threads;         /* --threads; 0 = OMP_NUM_THREADS or 1 */
    double temperature;
    uint64_t seed;
} sample_args;

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("tessera: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs(" (see tessera sample --help)\n", stderr);
    return -1;
}

/* A whole number of decimal digits (no sign, no spaces) into *out, at most `hi`;
 * -1 when it is not one (errno-free: ERANGE is "too large"). */
static int parse_u64(const char *s, uint64_t hi, uint64_t *out)
{
    if (!isdigit((unsigned char)s[0])) return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v > hi) return -1;
    *out = (uint64_t)v;
    return 0;
}

static int parse_whole(const char *flag, const char *s, int lo, int hi, int *out)
{
    uint64_t v;
    if (parse_u64(s, (uint64_t)hi, &v) != 0 || v < (uint64_t)lo)
        return usage_error("%s '%.40s%s' is not a whole number from %d to %d", flag, s,
                           strlen(s) > 40 ? "..." : "", lo, hi);
    *out = (int)v;
    return 0;
}

static int parse_args(int argc, char **argv, sample_args *a)
{
    memset(a, 0, sizeof *a);
    a->tokens = 200;
    a->temperature = 1.0;
    a->top_k = 0;
    a->seed = 1;
    a->k = &ts_kernels_cpu;
    for (int i = 2; i < argc; i++) {
        const char *v;
        int missing = 0, rc = 0;
        if ((v = ts_cli_opt_value(argc, argv, &i, "--prompt", &missing))) {
            a->prompt = v;
        } else if (!strcmp(argv[i], "--ids")) {
            a->ids = true;
        } else if ((v = ts_cli_opt_value(argc, argv, &i, "--tokenizer-file", &missing))) {
            if (!v[0]) rc = usage_error("--tokenizer-file is empty: give the ranks file's path");
            a->tokenizer_file = v;
        } else if ((v = ts_cli_opt_value(argc, argv, &i, "--tokens", &missing))) {
            rc = parse_whole("--tokens", v, 1, 1000000, &a->tokens);
        } else if ((v = ts_cli_opt_value(argc, argv, &i, "--top-k", &missing))) {
            rc = parse_whole("--top-k", v, 0, 2147483647, &a->top_k);
        } else if ((v = ts_cli_opt_value(argc, argv, &i, "--threads", &missing))) {
            rc = parse_whole("--threads", v, 1, 4096, &a->threads);
        } else if ((v = ts_cli_opt_value(argc, argv, &i, "--temperature", &missing))) {
            char *end;
            errno = 0;
            a->temperature = strtod(v, &end);
            /* A subnormal (4.9e-324) is a number too: strtod's ERANGE there is underflow,
             * not an error (the sampler divides by it safely: effectively greedy). */
            const bool underflow = errno == ERANGE && fabs(a->temperature) <= DBL_MIN;
            if ((errno && !underflow) || end == v || *end || !isfinite(a->temperature) ||
                a->temperature < 0)
                rc = usage_error("--temperature '%.40s%s' is not a number >= 0 (0 = greedy)", v,
                                 strlen(v) > 40 ? "..." : "");
        } else if ((v = ts_cli_opt_value(argc, argv, &i, "--seed", &missing))) {
            if (parse_u64(v, UINT64_MAX, &a->seed) != 0)
                rc = usage_error("--seed '%.40s%s' is not a whole number from 0 to "
                                 "18446744073709551615",
                                 v, strlen(v) > 40 ? "..." : "");
        } else if ((v = ts_cli_opt_value(argc, argv, &i, "--device", &missing))) {
            if (!(a->k = ts_kernels_for(v, "fp32", "gemm"))) /* a device, not a table name */
                rc = usage_error("--device '%.40s%s' is not a device of this build; choose "
                                 "\"cpu\" (or \"cpu-strict\", the test mode)",
                                 v, strlen(v) > 40 ? "..." : "");
        } else if (missing) {
            rc = usage_error("%s needs a value", argv[i]);
        } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
            rc = usage_error("unknown option '%s'", argv[i]);
        } else if (a->dir) {
            rc = usage_error("one checkpoint directory, not '%s' and '%s'", a->dir, argv[i]);
        } else {
            a->dir = argv[i];
        }
        if (rc) return rc;
    }
    if (!a->dir) return usage_error("sample needs a checkpoint directory DIR");
    if (!a->prompt) return usage_error("sample needs --prompt TEXT (what the text starts with)");
    /* An empty prompt is refused once the checkpoint says whether there is a tokenizer
     * (with one, it means the document token). */
    return 0;
}

/* --help anywhere but as an option's value is a request for help. */
static int wants_help(int argc, char **argv)
{
    static const char *const k_valued[] = {"--prompt", "--tokens",  "--temperature",
                                           "--top-k",  "--seed",    "--device",
                                           "--threads", "--tokenizer-file"};
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
        for (size_t j = 0; j < sizeof k_valued / sizeof *k_valued; j++)
            if (!strcmp(argv[i], k_valued[j])) {
                i++; /* skip its value */
                break;
            }
    }
    return 0;
}

/* How the prompt is read and the tokens written: the checkpoint's tokenizer (text),
 * bytes (a vocab-256 model without one), or token ids (--ids, or any other model). */
typedef enum { MODE_TEXT, MODE_BYTES, MODE_IDS } sample_mode;

/* The prompt as ids separated by spaces or commas into t (room for strlen + 1), each
 * below vocab; the count, or -1 with the message. */
static int parse_ids(const char *prompt, int vocab, int *t)
{
    int count = 0;
    const char *p = prompt;
    for (;;) {
        while (*p == ',' || isspace((unsigned char)*p)) p++;
        if (!*p) break;
        size_t w = 0;
        while (p[w] && p[w] != ',' && !isspace((unsigned char)p[w])) w++;
        char word[32];
        uint64_t id = 0;
        int ok = w < sizeof word;
        if (ok) {
            memcpy(word, p, w);
            word[w] = '\0';
            ok = parse_u64(word, UINT64_MAX, &id) == 0;
        }
        if (!ok || id >= (uint64_t)vocab) {
            usage_error("--prompt: '%.*s%s' is not a token id from 0 to %d (this model's "
                        "vocab_size is %d, so the prompt is a list of ids separated by "
                        "spaces or commas)",
                        (int)(w > 40 ? 40 : w), p, w > 40 ? "..." : "", vocab - 1, vocab);
            return -1;
        }
        t[count++] = (int)id;
        p += w;
    }
    if (count == 0) {
        usage_error("--prompt holds no token ids: give ids below %d separated by spaces or "
                    "commas",
                    vocab);
        return -1;
    }
    return count;
}

/* The prompt as tokens into *out (allocated, *n of them). Returns 0, 2 for a usage
 * error, 1 for a failure of the tokenizer (with its message printed). */
static int prompt_tokens(const char *prompt, int vocab, sample_mode mode, const ts_tokenizer *tok,
                         int **out, int *n)
{
    const size_t len = strlen(prompt);
    int count = 0;
    if (mode == MODE_TEXT) {
        ts_tok_ids ids = {0};
        ts_tok_encoder *enc = NULL;
        ts_status st = ts_tok_encoder_new(tok, &enc);
        if (st == TS_OK && len) st = ts_tok_encode_special(enc, prompt, len, &ids, NULL);
        if (enc) ts_tok_encoder_free(enc);
        if (st != TS_OK) {
            free(ids.ids);
            fprintf(stderr, "tessera: error: --prompt: %s\n", ts_error_message());
            return 1;
        }
        int *t = ts_malloc((ids.n + 1) * sizeof *t);
        /* Nothing to continue from: the document token, as every document of the
         * training data began (`tessera data`). */
        if (ids.n == 0) t[count++] = (int)ts_tokenizer_doc_token(tok);
        for (size_t i = 0; i < ids.n; i++) t[count++] = (int)ids.ids[i];
        free(ids.ids);
        *out = t;
        *n = count;
        return 0;
    }
    if (!len) {
        usage_error("--prompt is empty: give the %s to start from (only a model trained with "
                    "a tokenizer starts from its document token)",
                    mode == MODE_BYTES ? "text" : "token ids");
        return 2;
    }
    int *t = ts_malloc((len + 1) * sizeof *t);
    if (mode == MODE_BYTES) {
        for (size_t i = 0; i < len; i++) t[count++] = (unsigned char)prompt[i];
    } else if ((count = parse_ids(prompt, vocab, t)) < 0) {
        free(t);
        return 2;
    }
    *out = t;
    *n = count;
    return 0;
}

/* One token on stdout in the mode's form. An id of a padded vocabulary beyond the
 * tokenizer's (gpt2's 50257 in llm.c's 50304) has no text; it is shown by number. */
static void emit_token(int token, sample_mode mode, const ts_tokenizer *tok, int first)
{
    if (mode == MODE_BYTES) {
        putchar(token);
    } else if (mode == MODE_IDS) {
        printf(first ? "%d" : " %d", token);
    } else {
        size_t len;
        const unsigned char *b = ts_tok_token_bytes(tok, (uint32_t)token, &len);
        if (b)
            fwrite(b, 1, len, stdout);
        else
            printf("<|id:%d|>", token);
    }
}

/* Generate sa->tokens tokens after the prompt's n_prompt in tokens[] (room for both),
 * printing each as it comes. Returns 0, or 1 (with its message) when the logits are not
 * finite or stdout cannot be written. */
static int generate(const ts_model *m, const sample_args *sa, sample_mode mode,
                    const ts_tokenizer *tok, int *tokens, int n_prompt)
{
    const int V = m->vocab_size;
    ts_sampler s;
    ts_sampler_init(&s, V, sa->temperature, sa->top_k, sa->seed);
    /* The kernels write the logits on the device; the sampler reads a host copy. */
    float *logits = ts_alloc_floats((size_t)V);
    float *logits_dev = m->k->dev_alloc((size_t)V * sizeof(float));
    ts_acts a;
    /* Multi-head latent attention assembles q|k|v in a scratch region (model.h). */
    ts_scratch sc = {0};
    int cur_T = 0, rc = 0;
    for (int i = 0; i < sa->tokens; i++) {
        /* The context: the last seq_len tokens (nanoGPT's idx[:, -block_size:]). */
        const int len = n_prompt + i;
        const int T = len < m->max_seq_len ? len : m->max_seq_len;
        if (T != cur_T) { /* the activations' layout depends on T: grows to seq_len */
            if (cur_T) ts_acts_free(&a);
            ts_scratch_free(&sc);
            ts_acts_init(&a, m, 0, m->n_layers, 1, T);
            if (m->mla_kv_rank > 0) {
                ts_scratch_init(&sc, m, 1, T);
                a.mla_work = ts_scratch_mla_work(&sc, m, 1, T);
            }
            cur_T = T;
        }
        m->k->memcpy_h2d(a.tokens, tokens + (len - T), (size_t)T * sizeof *tokens);
        ts_model_forward_logits(m, &a, logits_dev);
        m->k->memcpy_d2h(logits, logits_dev, (size_t)V * sizeof(float));
        const int next = ts_sampler_next(&s, logits);
        if (next < 0) {
            fflush(stdout);
            fprintf(stderr,
                    "tessera: error: the model's logits are not finite after %d tokens (a "
                    "diverged checkpoint?): nothing can be drawn\n",
                    len);
            rc = 1;
            break;
        }
        tokens[len] = next;
        emit_token(next, mode, tok, 0);
        if (fflush(stdout) != 0) { /* a full disk or a closed pipe: stop here */
            fprintf(stderr, "tessera: error: writing standard output failed: %s\n",
                    strerror(errno));
            rc = 1;
            break;
        }
    }
    if (cur_T) ts_acts_free(&a);
    ts_scratch_free(&sc);
    m->k->dev_free(logits_dev);
    free(logits);
    ts_sampler_free(&s);
    return rc;
}

int ts_cmd_sample(int argc, char **argv)
{
    if (wants_help(argc, argv)) {
        fputs(k_help, stdout);
        return 0;
    }
    sample_args sa;
    if (parse_args(argc, argv, &sa) != 0) return 2;
    /* One thread unless asked (--threads, OMP_NUM_THREADS): see --help. */
    const char *omp = getenv("OMP_NUM_THREADS");
    ts_cpu_set_threads(sa.threads > 0 ? sa.threads : omp && atoi(omp) > 0 ? atoi(omp) : 1);

    char step_dir[TS_PATH_MAX];
    ts_model_config mc;
    int step = 0;
    if (ts_ckpt_resolve(sa.dir, step_dir, sizeof step_dir) != TS_OK ||
        ts_ckpt_read_model_config(step_dir, &mc, &step) != TS_OK) {
        fprintf(stderr, "tessera: error: %s\n", ts_error_message());
        return 1;
    }
    /* The model keys' ranges and relations were checked when state.json was read
     * (checkpoint/reader.c), as a config file's are. */
    const sample_mode mode = sa.ids || (!mc.tokenizer[0] && mc.vocab_size != 256) ? MODE_IDS
                             : mc.tokenizer[0]                                  ? MODE_TEXT
                                                                                : MODE_BYTES;
    if (sa.tokenizer_file && mode != MODE_TEXT) { /* an option is never ignored */
        usage_error("--tokenizer-file '%s': %s", sa.tokenizer_file,
                    sa.ids ? "--ids reads and prints token ids and opens no tokenizer"
                           : "this checkpoint was trained without a tokenizer (no "
                             "model.tokenizer), so there is none to open");
        return 2;
    }
    ts_tokenizer *tok = NULL;
    if (mode == MODE_TEXT) {
        if (ts_model_tokenizer_open(&mc, sa.tokenizer_file, &tok) != TS_OK) {
            fprintf(stderr, "tessera: error: %s (checkpoint %s)\n", ts_error_message(), step_dir);
            return 1;
        }
        /* Other ranks would turn the ids into other text, silently. */
        if (strcmp(ts_tokenizer_sha256(tok), mc.tokenizer_sha256) != 0) {
            fprintf(stderr,
                    "tessera: error: the ranks file %s has sha256 %s, but checkpoint %s was "
                    "trained with model.tokenizer = \"%s\" whose ranks file had sha256 %s: "
                    "its ids would decode to other text; give that file with "
                    "--tokenizer-file FILE\n",
                    ts_tokenizer_path(tok), ts_tokenizer_sha256(tok), step_dir, mc.tokenizer,
                    mc.tokenizer_sha256);
            ts_tokenizer_free(tok);
            return 1;
        }
    }
    int *tokens = NULL, n_prompt = 0;
    int prc = prompt_tokens(sa.prompt, mc.vocab_size, mode, tok, &tokens, &n_prompt);
    if (prc != 0) {
        if (tok) ts_tokenizer_free(tok);
        return prc;
    }
    /* Room for the prompt and every new token (n_prompt is bounded by the argument size). */
    int *all = ts_malloc(((size_t)n_prompt + (size_t)sa.tokens) * sizeof *all);
    memcpy(all, tokens, (size_t)n_prompt * sizeof *all);
    free(tokens);

    ts_model m;
    ts_model_build(&m, &(ts_model_spec){.arch = &mc, .k = sa.k});
    if (ts_ckpt_load_weights(&m, step_dir) != TS_OK) {
        fprintf(stderr, "tessera: error: %s\n", ts_error_message());
        ts_model_free(&m);
        if (tok) ts_tokenizer_free(tok);
        free(all);
        return 1;
    }

    const double t0 = ts_now_ms();
    /* The prompt as given: decode(encode(x)) is x, byte for byte. */
    if (mode != MODE_IDS)
        fwrite(sa.prompt, 1, strlen(sa.prompt), stdout);
    else
        for (int i = 0; i < n_prompt; i++) emit_token(all[i], mode, tok, i == 0);
    int rc = generate(&m, &sa, mode, tok, all, n_prompt);
    if (mode == MODE_IDS || isatty(STDOUT_FILENO)) putchar('\n');
    if (rc == 0 && ts_stdout_check() != TS_OK) {
        fprintf(stderr, "tessera: error: %s\n", ts_error_message());
        rc = 1;
    }
    if (rc == 0) {
        const double s = (ts_now_ms() - t0) / 1e3;
        fprintf(stderr, "sampled %d tokens from %s (step %d) in %.2f s (%.0f tokens/s)\n",
                sa.tokens, step_dir, step, s, s > 0 ? sa.tokens / s : 0.0);
    }
    if (tok) ts_tokenizer_free(tok);
    ts_model_free(&m);
    free(all);
    return rc;
}
