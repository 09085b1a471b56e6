# tessera sample: text from a trained checkpoint on one process. The same seed gives
# the same text and another seed another; greedy decoding ignores the seed; the output
# is the prompt and then exactly --tokens new tokens; a prompt longer than seq_len is
# cropped; a model with another vocabulary reads and prints token ids; every bad input
# is one message and its exit code (2 usage, 1 checkpoint).
source "$(dirname "$0")/lib.sh"

make_corpus "$TMP/train.bin"
# A small byte-level model (seq_len 32), trained a few steps into a checkpoint.
small=(--set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32 --set train.threads=1
       --set 'data.val=""' --set data.eval_every=0 --set "log.metrics=\"$TMP/m.jsonl\"")
if run_np 1 train "$SRC/configs/tiny.cfg" "${small[@]}" --set train.steps=10 \
     --set "data.train=\"$TMP/train.bin\"" --set "checkpoint.dir=\"$TMP/ck\""; then
  pass
else
  fail "training into a checkpoint"; sed 's/^/    /' "$TMP/err" >&2
fi
CK="$TMP/ck"

# sample NAME ARGS...: tessera sample ARGS into $TMP/NAME (stdout), $TMP/NAME.err.
sample() {
  local name="$1"; shift
  local device=()
  if [ -n "${TS_TEST_DEVICE:-}" ]; then device=(--device "$TS_TEST_DEVICE"); fi
  OMP_NUM_THREADS=1 timeout 60 "$TESSERA" sample "${device[@]}" "$@" >"$TMP/$name" 2>"$TMP/$name.err"
}
# ok NAME ARGS...: the run succeeds.
ok() {
  local name="$1"
  if sample "$@"; then pass; else fail "tessera sample ${*:2}"; sed 's/^/    /' "$TMP/$name.err" >&2; fi
}
same() { if cmp -s "$TMP/$1" "$TMP/$2"; then pass; else fail "$3"; fi; }
differ() { if cmp -s "$TMP/$1" "$TMP/$2"; then fail "$3"; else pass; fi; }

prompt="The "
ok s7a "$CK" --prompt "$prompt" --tokens 60 --seed 7
ok s7b "$CK" --prompt "$prompt" --tokens 60 --seed 7
ok s8 "$CK" --prompt "$prompt" --tokens 60 --seed 8
same s7a s7b "the same seed gave different text"
differ s7a s8 "seeds 7 and 8 gave the same 60 tokens at temperature 1"
# The prompt's bytes, then exactly 60 more, raw (stdout is not a terminal: no newline).
[ "$(head -c ${#prompt} "$TMP/s7a")" = "$prompt" ] && pass || fail "the output does not start with the prompt"
[ "$(wc -c < "$TMP/s7a")" -eq $((${#prompt} + 60)) ] && pass || fail "expected ${#prompt} + 60 bytes, got $(wc -c < "$TMP/s7a")"
grep -q "sampled 60 tokens" "$TMP/s7a.err" && pass || fail "no summary line on stderr"
# The default is 200 tokens; the step directory itself is the same checkpoint as `latest`.
step_dir="$CK/$(cat "$CK/latest")"
[ -d "$step_dir" ] || step_dir="$(cat "$CK/latest")"
ok def "$step_dir" --prompt "$prompt" --seed 7
[ "$(wc -c < "$TMP/def")" -eq $((${#prompt} + 200)) ] && pass || fail "--tokens does not default to 200"
[ "$(head -c $((${#prompt} + 60)) "$TMP/def")" = "$(cat "$TMP/s7a")" ] && pass \
  || fail "the step directory and the root's latest sample differently"

# Greedy: top-k 1 and temperature 0 take the argmax whatever the seed.
ok g1 "$CK" --prompt "$prompt" --tokens 40 --top-k 1 --seed 1
ok g2 "$CK" --prompt "$prompt" --tokens 40 --top-k 1 --seed 2
ok g3 "$CK" --prompt "$prompt" --tokens 40 --temperature 0 --seed 3
same g1 g2 "greedy (--top-k 1) depends on the seed"
same g1 g3 "--temperature 0 and --top-k 1 differ"
# Top-k and temperature are accepted in both option forms.
ok k5 "$CK" --prompt "$prompt" --tokens 20 --top-k=5 --temperature=0.8 --seed=3
ok k5b "$CK" --prompt "$prompt" --tokens 20 --top-k 5 --temperature 0.8 --seed 3
same k5 k5b "--opt=value and --opt value differ"

# A prompt longer than seq_len (32): the context is cropped to its last 32 bytes.
long="It was the best of times, it was the worst of times, it was the age of wisdom, it was"
ok long "$CK" --prompt "$long" --tokens 30 --seed 5
[ "$(head -c ${#long} "$TMP/long")" = "$long" ] && [ "$(wc -c < "$TMP/long")" -eq $((${#long} + 30)) ] \
  && pass || fail "a prompt longer than seq_len"
# Cropping: with greedy decoding, only the last 32 bytes of the prompt matter.
ok crop1 "$CK" --prompt "$long" --tokens 30 --top-k 1
ok crop2 "$CK" --prompt "${long: -32}" --tokens 30 --top-k 1
[ "$(tail -c 30 "$TMP/crop1")" = "$(tail -c 30 "$TMP/crop2")" ] && pass \
  || fail "the context is not cropped to the last seq_len tokens"

# A model of another vocabulary (96, the fixture's weights, saved with 0 steps) reads
# and prints token ids.
tr 'a-z' 'A-Z' < "$TMP/corpus.txt" | tr -d '\140-\377' | head -c 200000 > "$TMP/upper.txt"
"$TESSERA" data "$TMP/upper.txt" "$TMP/upper.bin" >/dev/null
if run_np 1 train "$SRC/configs/tiny.cfg" --set train.steps=0 --set "data.train=\"$TMP/upper.bin\"" \
     --set model.n_layer=2 --set model.n_head=2 --set model.n_embd=32 --set model.vocab_size=96 \
     --set model.seq_len=16 --set "model.init=\"$SRC/tests/fixtures/gpt2_tiny_weights.safetensors\"" \
     --set 'data.val=""' --set train.threads=1 --set "checkpoint.dir=\"$TMP/ck96\""; then
  pass
else
  fail "saving the fixture's weights"; sed 's/^/    /' "$TMP/err" >&2
fi
ok ids "$TMP/ck96" --prompt "5, 17 95 0" --tokens 25 --seed 4
if awk 'NR == 1 && NF == 29 && $1 == 5 && $2 == 17 && $3 == 95 && $4 == 0 {
          for (i = 1; i <= NF; i++) if ($i !~ /^[0-9]+$/ || $i + 0 > 95) exit 1
          ok = 1 }
        END { exit !(ok && NR == 1) }' "$TMP/ids"; then
  pass
else
  fail "token-id output: $(head -c 300 "$TMP/ids")"
fi
ok ids2 "$TMP/ck96" --prompt "5 17 95 0" --tokens 25 --seed 4
same ids ids2 "comma and space separated prompts differ"

# Bad input: one message, the exit code, no crash.
# expect_sample_error CODE PATTERN ARGS...: tessera sample ARGS (one process, the
# device as sample's) exits CODE with "tessera: error: ...PATTERN" as the only line on
# stderr (lib.sh's expect_error).
expect_sample_error() {
  local code="$1" pattern="$2"; shift 2
  local device=()
  if [ -n "${TS_TEST_DEVICE:-}" ]; then device=(--device "$TS_TEST_DEVICE"); fi
  OMP_NUM_THREADS=1 expect_error --rc "$code" --only-line 0 "tessera: error: .*($pattern)" \
    sample "${device[@]}" "$@"
}
expect_sample_error 2 "checkpoint directory" --prompt hi
expect_sample_error 1 "no-such-dir" "$TMP/no-such-dir" --prompt hi
expect_sample_error 2 "--prompt" "$CK"
expect_sample_error 2 "--prompt needs a value" "$CK" --prompt
expect_sample_error 2 "--prompt is empty" "$CK" --prompt ""
expect_sample_error 2 "'96' is not a token id" "$TMP/ck96" --prompt "1 96"
expect_sample_error 2 "'x' is not a token id" "$TMP/ck96" --prompt "1 x 2"
expect_sample_error 2 "no token ids" "$TMP/ck96" --prompt " , "
expect_sample_error 2 "--tokens '0'" "$CK" --prompt hi --tokens 0
expect_sample_error 2 "--tokens '1000001'" "$CK" --prompt hi --tokens 1000001
expect_sample_error 2 "--tokens 'many'" "$CK" --prompt hi --tokens many
expect_sample_error 2 "--temperature '-1'" "$CK" --prompt hi --temperature -1
expect_sample_error 2 "--temperature 'hot'" "$CK" --prompt hi --temperature hot
expect_sample_error 2 "--top-k '-3'" "$CK" --prompt hi --top-k -3
expect_sample_error 2 "--seed '1.5'" "$CK" --prompt hi --seed 1.5
expect_sample_error 2 "unknown option '--bogus'" "$CK" --prompt hi --bogus
expect_sample_error 2 "--device 'tpu' is not a device" "$CK" --prompt hi --device tpu
expect_sample_error 2 "one checkpoint directory" "$CK" "$CK" --prompt hi
# A checkpoint with a flipped weight byte fails its checksum (exit 1).
cp -r "$step_dir" "$TMP/flipped"
f="$TMP/flipped/model.safetensors"
size=$(wc -c < "$f")
printf '\x55' | dd of="$f" bs=1 seek=$((size - 5)) conv=notrunc 2>/dev/null
expect_sample_error 1 "checksum|crc|corrupt" "$TMP/flipped" --prompt hi
rm -f "$TMP/flipped/state.json"
expect_sample_error 1 "state.json" "$TMP/flipped" --prompt hi

# --help describes every option.
if "$TESSERA" sample --help >"$TMP/help" 2>&1; then pass; else fail "sample --help"; fi
for opt in DIR --prompt --tokens --temperature --top-k --seed; do
  grep -q -- "$opt" "$TMP/help" && pass || fail "sample --help does not mention $opt"
done
"$TESSERA" --help | grep_q "sample DIR" && pass || fail "tessera --help does not list sample"

finish
