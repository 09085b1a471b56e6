/* The encodings' fixed facts: names, rank counts, pre-tokenizer patterns and special
 * tokens, and where their ranks files live by default. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

/* tiktoken's patterns are fancy-regex (Rust); PCRE2 reads the same text differently in
 * four places, so the patterns below are spelled out instead of copied:
 * - \s is Rust's Unicode White_Space; PCRE2's \s (even with UCP) lacks U+0085 (NEL).
 *   WS below is the White_Space list, so \s -> [WS], \S -> [^WS].
 * - `$` in PCRE2 also matches before a final newline; Rust's is the end of the text: \z.
 * - Llama 3's (?i:'s|...) folds by Unicode simple case folding, where s also matches
 *   U+017F (long s); written as explicit classes so no PCRE2 caseless rule can differ.
 * - \p{L} and \p{N}: PCRE2 10.42 (Debian 12) has Unicode 14's tables, tiktoken 0.14's
 *   regex-syntax Unicode 16's. Every code point was tried in both engines: tiktoken's
 *   sets are PCRE2's plus the letters (LX) and digits (NX) assigned in Unicode 15 and 16,
 *   and nothing is in PCRE2's alone; so \p{L} -> [\p{L}LX], \p{N} -> [\p{N}NX] (harmless
 *   once PCRE2 has them itself). The White_Space sets were identical. */
#define WS "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
#define LX \
    "\\x{1C89}-\\x{1C8A}\\x{A7CB}-\\x{A7CD}\\x{A7DA}-\\x{A7DC}" \
    "\\x{105C0}-\\x{105F3}\\x{10D4A}-\\x{10D65}\\x{10D6F}-\\x{10D85}" \
    "\\x{10EC2}-\\x{10EC4}\\x{1123F}-\\x{11240}\\x{11380}-\\x{11389}\\x{1138B}" \
    "\\x{1138E}\\x{11390}-\\x{113B5}\\x{113B7}\\x{113D1}\\x{113D3}" \
    "\\x{11BC0}-\\x{11BE0}\\x{11F02}\\x{11F04}-\\x{11F10}\\x{11F12}-\\x{11F33}" \
    "\\x{1342F}\\x{13441}-\\x{13446}\\x{13460}-\\x{143FA}\\x{16100}-\\x{1611D}" \
    "\\x{16D40}-\\x{16D6C}\\x{18CFF}\\x{1B132}\\x{1B155}\\x{1DF25}-\\x{1DF2A}" \
    "\\x{1E030}-\\x{1E06D}\\x{1E4D0}-\\x{1E4EB}\\x{1E5D0}-\\x{1E5ED}\\x{1E5F0}" \
    "\\x{2B739}\\x{2EBF0}-\\x{2EE5D}\\x{31350}-\\x{323AF}"
#define NX \
    "\\x{10D40}-\\x{10D49}\\x{116D0}-\\x{116E3}\\x{11BF0}-\\x{11BF9}" \
    "\\x{11F50}-\\x{11F59}\\x{16130}-\\x{16139}\\x{16D70}-\\x{16D79}" \
    "\\x{1CCF0}-\\x{1CCF9}\\x{1D2C0}-\\x{1D2D3}\\x{1E4F0}-\\x{1E4F9}" \
    "\\x{1E5F1}-\\x{1E5FA}"
#define L "[\\p{L}" LX "]"
#define N "[\\p{N}" NX "]"
#define NOT_WS_L_N "[^" WS "\\p{L}" LX "\\p{N}" NX "]"

/* tiktoken's r50k_base pattern (its current, possessive form):
 * '(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s */
static const char k_gpt2_pattern[] = "'(?:[sdmt]|ll|ve|re)| ?" L "++| ?" N "++| ?" NOT_WS_L_N
                                     "++|[" WS "]++\\z|[" WS "]+(?![^" WS "])|[" WS "]";

/* llama_models/llama3/tokenizer.py's pat_str:
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 * \s*[\r\n]+|\s+(?!\S)|\s+ */
static const char k_llama3_pattern[] =
    "'(?:[sS\\x{17F}]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD])|[^\\r\\n\\p{L}" LX "\\p{N}" NX
    "]?" L "+|" N "{1,3}| ?" NOT_WS_L_N "+[\\r\\n]*|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS
    "])|[" WS "]+";

static const char *const k_gpt2_specials[] = {"<|endoftext|>"};

/* llama-models 0.3.0's list (llama_models/llama3/tokenizer.py, the file
 * scripts/fetch_tokenizers.sh takes the ranks from): 12 named, then
 * <|reserved_special_token_2|> .. <|reserved_special_token_245|>, 256 in all. */
#define TS_LLAMA3_SPECIALS 256
static const char *k_llama3_specials[TS_LLAMA3_SPECIALS];
static char k_llama3_reserved[TS_LLAMA3_SPECIALS][40];
static const char *const k_llama3_named[] = {
    "<|begin_of_text|>",  "<|end_of_text|>",      "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
    "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>",
    "<|eot_id|>",         "<|python_tag|>",       "<|image|>",
};

static ts_tok_encoding k_encodings[] = {
    {TS_ENC_BYTES, "bytes", 256, NULL, NULL, 0, 0},
    {TS_ENC_GPT2, "gpt2", 50256, k_gpt2_pattern, k_gpt2_specials, 1, 0},
    {TS_ENC_LLAMA3, "llama3", 128000, k_llama3_pattern, k_llama3_specials, TS_LLAMA3_SPECIALS, 0},
};

static void llama3_specials_init(void)
{
    size_t named = sizeof k_llama3_named / sizeof k_llama3_named[0];
    for (size_t i = 0; i < TS_LLAMA3_SPECIALS; i++) {
        if (i < named) {
            k_llama3_specials[i] = k_llama3_named[i];
        } else {
            snprintf(k_llama3_reserved[i], sizeof k_llama3_reserved[i],
                     "<|reserved_special_token_%zu|>", 2 + i - named);
            k_llama3_specials[i] = k_llama3_reserved[i];
        }
    }
}

const ts_tok_encoding *ts_tok_encoding_get(ts_encoding_kind kind)
{
    /* The reserved names are built once; pthread_once makes that safe from any thread. */
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, llama3_specials_init);
    for (size_t i = 0; i < sizeof k_encodings / sizeof k_encodings[0]; i++)
        if (k_encodings[i].kind == kind) return &k_encodings[i];
    return NULL;
}

int ts_encoding_parse(const char *name, ts_encoding_kind *kind)
{
    for (size_t i = 0; i < sizeof k_encodings / sizeof k_encodings[0]; i++) {
        if (name && strcmp(name, k_encodings[i].name) == 0) {
            *kind = k_encodings[i].kind;
            return 0;
        }
    }
    return -1;
}

const char *ts_encoding_name(ts_encoding_kind kind)
{
    for (size_t i = 0; i < sizeof k_encodings / sizeof k_encodings[0]; i++)
        if (k_encodings[i].kind == kind) return k_encodings[i].name;
    return "unknown";
}

ts_status ts_tokenizer_default_path(const char *encoding, char *buf, size_t cap)
{
    const char *dir = getenv("TS_TOKENIZER_DIR");
    int n;
    if (dir && dir[0]) {
        n = snprintf(buf, cap, "%s/%s.tiktoken", dir, encoding);
    } else {
        const char *home = getenv("HOME");
        if (!home || !home[0])
            return ts_fail("no ranks file for encoding %s: neither TS_TOKENIZER_DIR nor HOME "
                           "is set; set TS_TOKENIZER_DIR to the folder "
                           "scripts/fetch_tokenizers.sh filled",
                           encoding);
        n = snprintf(buf, cap, "%s/.cache/tessera/tokenizers/%s.tiktoken", home, encoding);
    }
    if (n < 0 || (size_t)n >= cap)
        return ts_fail("the default ranks path for encoding %s is longer than %zu bytes; "
                       "use a shorter TS_TOKENIZER_DIR",
                       encoding, cap);
    return TS_OK;
}
