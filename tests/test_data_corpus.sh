# `tessera data INPUT... --out PREFIX`: a directory and a JSONL file into llm.c shards
# with the bytes encoding (exact content, headers, sizes, the val/train split, the shard
# cut, 1 vs 2 threads byte-identical), the small BPE fixture's document tokens, Llama
# 3's uint32 format read by the trainer, and every refusal: one message, no file left.
source "$(dirname "$0")/lib.sh"

fixture="$SRC/tests/fixtures/bpe/small.tiktoken"
mkdir -p "$TMP/in/sub" "$TMP/in/.git" "$TMP/o1" "$TMP/o2" "$TMP/o"
printf 'alpha beta\n' > "$TMP/in/b.txt"
printf 'first file ' > "$TMP/in/a.txt"
printf 'caf\xc3\xa9 \xff bad byte' > "$TMP/in/sub/c.txt"
printf 'skipped' > "$TMP/in/.hidden"
printf 'skipped too' > "$TMP/in/.git/x"
printf '{"text": "json one", "id": 1}\n\n{"id": 2, "text": "tw\\u00f6"}\n' > "$TMP/d.jsonl"
# The stream: the directory's files in sorted path order, then the JSONL lines' texts.
{ cat "$TMP/in/a.txt" "$TMP/in/b.txt" "$TMP/in/sub/c.txt"; printf 'json one'; printf 'tw\xc3\xb6'; } > "$TMP/expect"
n_expect=$(stat -c %s "$TMP/expect")

# ids FILE...: a shard's ids, one per line (uint16 or uint32 by its magic).
ids() {
  local f magic
  for f in "$@"; do
    magic=$(od -An -t d4 -N 4 "$f" | tr -d ' ')
    if [ "$magic" = 20240801 ]; then tail -c +1025 "$f" | od -An -v -t u4 -w4; else tail -c +1025 "$f" | od -An -v -t u2 -w2; fi
  done | tr -d ' '
}
# header FILE: "magic version count".
header() { od -An -t d4 -N 12 "$1" | tr -s ' ' | sed 's/^ //'; }

# Bytes: val = the first 5 tokens, then train shards of at most 16 tokens.
for t in 1 2; do
  if run_one data "$TMP/in" "$TMP/d.jsonl" --out "$TMP/o$t/c" --shard-tokens 16 --val-tokens 5 --threads $t; then pass; else fail "bytes, $t threads"; cat "$TMP/err" >&2; fi
  cp "$TMP/out" "$TMP/out$t"
done
n_train=$((n_expect - 5))
names=$(cd "$TMP/o1" && ls | tr '\n' ' ')
want="c_train_000001.bin c_train_000002.bin c_train_000003.bin c_val_000000.bin "
if [ $(( (n_train + 15) / 16 )) -eq 3 ] && [ "$names" = "$want" ]; then pass; else fail "shard names: '$names' for $n_train train tokens"; fi
if ids "$TMP/o1/c_val_000000.bin" "$TMP/o1"/c_train_*.bin | cmp -s - <(od -An -v -t u1 -w1 "$TMP/expect" | tr -d ' '); then pass; else fail "the shards' ids are not the input's bytes"; fi
ok=1
for f in "$TMP/o1"/*.bin; do
  set -- $(header "$f")
  [ "$1" = 20240520 ] && [ "$2" = 1 ] && [ "$(stat -c %s "$f")" -eq $((1024 + 2 * $3)) ] || { ok=0; echo "bad shard $f: $(header "$f")" >&2; }
done
if [ "$ok" = 1 ]; then pass; else fail "shard headers or sizes"; fi
if [ "$(header "$TMP/o1/c_val_000000.bin")" = "20240520 1 5" ] && [ "$(header "$TMP/o1/c_train_000001.bin")" = "20240520 1 16" ] \
   && [ "$(header "$TMP/o1/c_train_000003.bin")" = "20240520 1 $((n_train - 32))" ]; then pass; else fail "val 5 / train 16 16 rest"; fi
same=1
for f in "$TMP/o1"/*.bin; do cmp -s "$f" "$TMP/o2/$(basename "$f")" || same=0; done
if [ "$same" = 1 ] && [ "$(ls "$TMP/o2" | wc -l)" -eq 4 ]; then pass; else fail "1 and 2 threads wrote different shards"; fi
if grep -q "^data: 5 documents, $(( $(stat -c %s "$TMP/in/a.txt") + $(stat -c %s "$TMP/in/b.txt") + $(stat -c %s "$TMP/in/sub/c.txt") + $(stat -c %s "$TMP/d.jsonl") )) bytes, $n_expect tokens (val 5, train $n_train), 4 shards (val 1, train 3, uint16 ids, vocab 256), 1 invalid UTF-8 bytes, 0 bad lines skipped" "$TMP/out1"; then pass; else fail "summary: $(cat "$TMP/out1")"; fi
if [ ! -s "$TMP/err" ]; then pass; else fail "a short run printed on stderr: $(cat "$TMP/err")"; fi

# --val-fraction: the documents starting in the first 40% of the input bytes (offsets
# 0 and 10 of 30 are before 12) are validation, whole.
mkdir -p "$TMP/frac"
for x in 1 2 3; do printf '%010d' "$x" > "$TMP/frac/$x.txt"; done
if run_one data "$TMP/frac" --out "$TMP/o/f" --val-fraction 0.4 && [ "$(header "$TMP/o/f_val_000000.bin")" = "20240520 1 20" ] \
   && [ "$(header "$TMP/o/f_train_000001.bin")" = "20240520 1 10" ]; then pass; else fail "--val-fraction 0.4"; cat "$TMP/err" >&2; fi
# No validation asked for: train shards only, numbered from 0.
if run_one data "$TMP/frac/1.txt" "$TMP/frac/2.txt" --out "$TMP/o/n" && [ "$(cd "$TMP/o" && ls n_*)" = n_train_000000.bin ]; then pass; else fail "no val split"; fi

# BPE with the small fixture ranks file (3000 ranks: <|endoftext|> = 3000): the document
# token starts each of the 5 documents; 1 and 2 threads agree.
export TS_TEST_TOKENIZER_ANY_SIZE=1
for t in 1 2; do
  if run_one data "$TMP/in" "$TMP/d.jsonl" --out "$TMP/o/g$t" --encoding gpt2 --ranks "$fixture" --threads $t; then pass; else fail "gpt2, $t threads"; cat "$TMP/err" >&2; fi
done
ids "$TMP/o/g1_train_000000.bin" > "$TMP/gids"
if [ "$(head -n 1 "$TMP/gids")" = 3000 ] && [ "$(grep -cx 3000 "$TMP/gids")" -eq 5 ] && ! grep -qvx '[0-9]*' "$TMP/gids" \
   && [ "$(sort -n "$TMP/gids" | tail -n 1)" -le 3000 ]; then pass; else fail "gpt2: doc tokens: $(tr '\n' ' ' < "$TMP/gids")"; fi
if cmp -s "$TMP/o/g1_train_000000.bin" "$TMP/o/g2_train_000000.bin"; then pass; else fail "gpt2: 1 and 2 threads differ"; fi
if grep -q "1 invalid UTF-8 bytes" "$TMP/out"; then pass; else fail "gpt2: invalid byte count: $(cat "$TMP/out")"; fi
unset TS_TEST_TOKENIZER_ANY_SIZE

# Llama 3's format: uint32 ids, 1024 + 4 * count bytes, read by the trainer.
cat /usr/share/games/fortunes/fortunes > "$TMP/fortunes.txt"
if run_one data "$TMP/fortunes.txt" --out "$TMP/o/l" --format llama3; then pass; else fail "--format llama3"; cat "$TMP/err" >&2; fi
n=$(stat -c %s "$TMP/fortunes.txt")
if [ "$(header "$TMP/o/l_train_000000.bin")" = "20240801 7 $n" ] && [ "$(stat -c %s "$TMP/o/l_train_000000.bin")" -eq $((1024 + 4 * n)) ]; then pass; else fail "llama3 shard: $(header "$TMP/o/l_train_000000.bin")"; fi
if run_np 1 train "$SRC/configs/tiny.cfg" --set 'data.val=""' --set train.steps=1 --set train.threads=1 --set log.progress=false \
   --set "log.metrics=\"$TMP/m.jsonl\"" --set "data.train=\"$TMP/o/l_train_000000.bin\"" && grep -q '"loss"' "$TMP/m.jsonl"; then pass; else fail "training on the llama3 shard"; cat "$TMP/err" >&2; fi

# JSONL: a line without the field is an error naming FILE:LINE, after text files whose
# shards were already full (--shard-tokens 4): no shard, no temporary file is left.
printf '{"text": "ok"}\n{"body": "no text"}\n' > "$TMP/bad.jsonl"
mkdir -p "$TMP/e"
expect_error --rc 1 --one-error 0 'bad.jsonl:2: no string field "text" \(it has no such field\)' data "$TMP/in" "$TMP/bad.jsonl" --out "$TMP/e/x" --shard-tokens 4
expect_error --rc 1 0 'bad.jsonl:1: no string field "body" \(it has no such field\)' data "$TMP/bad.jsonl" --out "$TMP/e/x" --text-field body
printf '{"text": 5}\nnot json\n' > "$TMP/bad2.jsonl"
expect_error --rc 1 0 'bad2.jsonl:1: no string field "text" \(the field is not a string\)' data "$TMP/bad2.jsonl" --out "$TMP/e/x"
if [ -z "$(ls "$TMP/e")" ]; then pass; else fail "a failed run left files: $(ls "$TMP/e")"; fi
if run_one data "$TMP/bad.jsonl" "$TMP/bad2.jsonl" --out "$TMP/e/s" --skip-bad-lines && grep -q "1 documents, .* 3 bad lines skipped" "$TMP/out"; then pass; else fail "--skip-bad-lines: $(cat "$TMP/out" "$TMP/err")"; fi
rm -f "$TMP/e"/*
# --jsonl reads a file of another name as JSONL.
cp "$TMP/d.jsonl" "$TMP/d.txt"
if run_one data "$TMP/d.txt" --jsonl --out "$TMP/e/j" && [ "$(header "$TMP/e/j_train_000000.bin")" = "20240520 1 12" ]; then pass; else fail "--jsonl"; fi
rm -f "$TMP/e"/*

# Refusals before anything is written.
expect_error --rc 1 0 "directory .*/nodir does not exist: create it first" data "$TMP/in" --out "$TMP/nodir/x"
expect_error --rc 1 0 "names a directory, not a prefix" data "$TMP/in" --out "$TMP/e/"
expect_error --rc 1 0 "output shards of --out .*/o1/c exist already: .*c_train_000001.bin \.\.\. .*c_val_000000.bin \(4 in all\); pass --overwrite" data "$TMP/in" --out "$TMP/o1/c"
expect_error --rc 1 0 "input .*c_val_000000.bin is named as one of this run's output shards" data "$TMP/o1/c_val_000000.bin" --out "$TMP/o1/c" --overwrite
expect_error --rc 1 0 "input .*l_train_000000.bin is an llm.c token shard \(magic 20240801\)" data "$TMP/o/l_train_000000.bin" --out "$TMP/e/x"
: > "$TMP/empty.txt"
expect_error --rc 1 0 "the inputs \(1 file\) are all empty: nothing to write" data "$TMP/empty.txt" --out "$TMP/e/x"
printf '\n\n' > "$TMP/blank.jsonl"
expect_error --rc 1 0 "the inputs hold no document" data "$TMP/blank.jsonl" --out "$TMP/e/x"
expect_error --rc 1 0 "input .*/missing.txt: No such file or directory" data "$TMP/missing.txt" --out "$TMP/e/x"
printf 'text\0binary' > "$TMP/nul.txt"
expect_error --rc 1 0 "input .*/nul.txt is not text: it has a NUL byte at offset 4" data "$TMP/nul.txt" --out "$TMP/e/x"
printf 'gz text' | gzip > "$TMP/t.jsonl.gz"
expect_error --rc 1 0 "input .*/t.jsonl.gz is gzip-compressed: decompress it first" data "$TMP/t.jsonl.gz" --out "$TMP/e/x"
mkfifo "$TMP/fifo"
expect_error --rc 1 0 "fifo is not a regular file" data "$TMP/fifo" --out "$TMP/e/x"
expect_error --rc 1 0 "the ranks file .*fifo is not a regular file \(it is a named pipe \(FIFO\)\)" data "$TMP/in" --encoding gpt2 --ranks "$TMP/fifo" --out "$TMP/e/x"
mkdir "$TMP/emptydir"
expect_error --rc 1 0 "input directory .*/emptydir holds no file" data "$TMP/emptydir" --out "$TMP/e/x"
expect_error --rc 1 0 "all 30 tokens went to validation" data "$TMP/frac" --out "$TMP/e/x" --val-tokens 30
export TS_TOKENIZER_DIR="$TMP/none"
expect_error --rc 1 0 "ranks file .*/none/gpt2.tiktoken is not there: run scripts/fetch_tokenizers.sh to fetch it, or give its path with --ranks FILE" \
  data "$TMP/in" --out "$TMP/e/x" --encoding gpt2
unset TS_TOKENIZER_DIR
if [ -z "$(ls "$TMP/e")" ]; then pass; else fail "a refused run left files: $(ls "$TMP/e")"; fi
llama=/tmp/fetch/l/llama_models/llama3/tokenizer.model
if [ -r "$llama" ]; then
  expect_error --rc 1 0 "--format gpt2 stores ids in 16 bits, but the llama3 vocabulary has 128256 ids" \
    data "$TMP/in" --out "$TMP/e/x" --encoding llama3 --ranks "$llama" --format gpt2
  # The real vocabulary (128256 ids) picks Llama 3's uint32 shards; <|begin_of_text|> first.
  if run_one data "$TMP/in" --out "$TMP/o/r3" --encoding llama3 --ranks "$llama" && [ "$(header "$TMP/o/r3_train_000000.bin" | cut -d' ' -f1-2)" = "20240801 7" ] \
     && [ "$(ids "$TMP/o/r3_train_000000.bin" | head -n 1)" = 128000 ] && [ "$(ids "$TMP/o/r3_train_000000.bin" | grep -cx 128000)" -eq 3 ]; then pass; else fail "real llama3 ranks"; cat "$TMP/err" >&2; fi
else
  skip_case "no real Llama 3 ranks file here ($llama)"
fi
# --overwrite replaces the prefix's shards and removes the ones it does not write again.
if run_one data "$TMP/in" --out "$TMP/o1/c" --overwrite && [ "$(cd "$TMP/o1" && ls)" = c_train_000000.bin ]; then pass; else fail "--overwrite: $(ls "$TMP/o1")"; fi

# SIGINT mid-run (once the first temporary shard exists): the run stops at its next
# batch, says so once, and leaves no shard and no temporary file.
yes '{"text": "the quick brown fox jumps over the lazy dog 0123456789"}' | head -n 500000 > "$TMP/big.jsonl"
mkdir "$TMP/s"
TS_TEST_TOKENIZER_ANY_SIZE=1 "$TESSERA" data "$TMP/big.jsonl" --out "$TMP/s/b" --encoding gpt2 --ranks "$fixture" \
  --threads 1 --shard-tokens 10000 > "$TMP/sout" 2> "$TMP/serr" &
pid=$!
for _ in $(seq 600); do
  if ls "$TMP/s" | grep_q '\.tmp\.' || ! kill -0 "$pid" 2>/dev/null; then break; fi
  sleep 0.05
done
if ls "$TMP/s" | grep_q '\.tmp\.' && kill -INT "$pid" 2>/dev/null; then
  wait "$pid"; rc=$?
  judge_error --stderr "$TMP/serr" "SIGINT during tessera data" "$rc" "stopped by SIGINT( at byte [0-9]+ of a document of [0-9]+ bytes)?: no shard written"
  if [ -z "$(ls "$TMP/s")" ]; then pass; else fail "SIGINT left files: $(ls "$TMP/s" | head -n 3)"; fi
else
  wait "$pid"
  skip_case "the run finished before it could be signalled"
fi
rm -f "$TMP/big.jsonl"

# Usage errors: exit 2, the message once.
expect_error --rc 2 0 "--val-tokens and --val-fraction are two ways" data "$TMP/in" --out "$TMP/e/x" --val-tokens 3 --val-fraction 0.1
expect_error --rc 2 0 "--val-fraction must be a number between 0 and 1" data "$TMP/in" --out "$TMP/e/x" --val-fraction 1
expect_error --rc 2 0 "--val-tokens must be a whole number of at least 1, not '0'" data "$TMP/in" --out "$TMP/e/x" --val-tokens 0
expect_error --rc 2 0 "--shard-tokens must be a whole number from 1 to 2147483647, not '2147483648'" data "$TMP/in" --out "$TMP/e/x" --shard-tokens 2147483648
expect_error --rc 2 0 "--encoding must be bytes, gpt2 or llama3, not 'r50k'" data "$TMP/in" --out "$TMP/e/x" --encoding r50k
expect_error --rc 2 0 "--threads must be a whole number from 1 to 1024, not '0'" data "$TMP/in" --out "$TMP/e/x" --threads 0
expect_error --rc 2 0 "data needs --out PREFIX for its shards" data "$TMP/in" "$TMP/d.jsonl" "$TMP/x"
expect_error --rc 2 0 "the form TEXT_FILE OUT.bin takes --format only" data "$TMP/in/a.txt" "$TMP/e/x.bin" --encoding gpt2
expect_error --rc 2 0 "this option needs a value: '--out'" data "$TMP/in" --out
expect_error --rc 2 0 "--ranks is for the gpt2 and llama3 encodings" data "$TMP/in" --out "$TMP/e/x" --ranks "$fixture"
if [ -z "$(ls "$TMP/e")" ]; then pass; else fail "a usage error left files: $(ls "$TMP/e")"; fi
if ls -R "$TMP" | grep_q '\.tmp\.'; then fail "temporary files left"; else pass; fi
if "$TESSERA" data --help | grep_q -- "--val-fraction F"; then pass; else fail "--help"; fi
finish
