# model.tokenizer end to end on the small fixture ranks (tests/fixtures/bpe/small.tiktoken,
# 3000 ranks; TS_TEST_TOKENIZER_ANY_SIZE=1 lets it serve "gpt2", whose <|endoftext|> is
# then id 3000, so the vocabulary is 3001): training records the tokenizer in state.json,
# `ckpt info` shows it, `tessera sample` encodes the prompt and prints the new tokens'
# bytes (exactly the ranks' bytes of the ids --ids prints), an empty prompt or
# "<|endoftext|>" starts from the document token, an id of a padded vocabulary beyond
# the tokenizer's prints as <|id:N|>; and every mismatch is refused: another ranks file
# (sha256), a missing one, an id out of range, a vocabulary too small, a resume under
# another tokenizer.
source "$(dirname "$0")/lib.sh"

RANKS="$SRC/tests/fixtures/bpe/small.tiktoken"
export TS_TEST_TOKENIZER_ANY_SIZE=1
# No ranks file at the default path: every run names its file, or fails saying so.
export TS_TOKENIZER_DIR="$TMP/no-tokenizers"
# The corpus encoded by the fixture's ranks, as scripts/train.sh --text encodes text
# (`tessera data --encoding gpt2`), its shards read through a glob.
head -c 300000 /usr/share/games/fortunes/fortunes > "$TMP/small.txt"
if "$TESSERA" data --encoding gpt2 --ranks "$RANKS" --val-tokens 2000 "$TMP/small.txt" \
     --out "$TMP/bpe" > "$TMP/data.out" 2>&1 && [ -s "$TMP/bpe_train_000001.bin" ]; then
  pass
else
  fail "tessera data --encoding gpt2 with the fixture ranks"; sed 's/^/    /' "$TMP/data.out" >&2
fi
model=(--set model.n_layer=2 --set model.n_head=2 --set model.n_embd=32 --set model.seq_len=16
       --set model.tokenizer=gpt2 --set "model.tokenizer_file=\"$RANKS\""
       --set "data.val=\"$TMP/bpe_val_000000.bin\"" --set data.eval_every=2 --set train.threads=1
       --set "data.train=\"$TMP/bpe_train_*.bin\"")
if run_np 1 train "$SRC/configs/tiny.cfg" "${model[@]}" --set model.vocab_size=3001 \
     --set train.steps=4 --set "checkpoint.dir=\"$TMP/ck\"" --set "log.metrics=\"$TMP/m.jsonl\""; then
  pass
else
  fail "training with model.tokenizer"; sed 's/^/    /' "$TMP/err" >&2
fi
CK="$TMP/ck"
SHA="$(sha256sum "$RANKS" | cut -d' ' -f1)"
state="$CK/$(cat "$CK/latest")/state.json"
tr -d ' \n' < "$state" | grep_q "\"tokenizer\":{\"encoding\":\"gpt2\",\"sha256\":\"$SHA\"}" && pass \
  || fail "state.json does not record the tokenizer and its sha256"
"$TESSERA" ckpt info "$CK" > "$TMP/info" 2>&1
grep -q "^tokenizer   gpt2, ranks sha256 $SHA" "$TMP/info" && pass || fail "ckpt info: $(cat "$TMP/info")"
"$TESSERA" ckpt verify "$CK" > "$TMP/verify" 2>&1 && pass || fail "ckpt verify: $(cat "$TMP/verify")"

sample() {
  local name="$1"; shift
  OMP_NUM_THREADS=1 timeout 60 "$TESSERA" sample "$@" >"$TMP/$name" 2>"$TMP/$name.err"
}
ok() {
  local name="$1"
  if sample "$@"; then pass; else fail "tessera sample ${*:2}"; sed 's/^/    /' "$TMP/$name.err" >&2; fi
}
same() { if cmp -s "$TMP/$1" "$TMP/$2"; then pass; else fail "$3"; fi; }

# decode IDS_FILE OUT: the text of the ids (one line of ids) by the fixture's ranks
# (base64 of each token's bytes), specials by their text, other ids as <|id:N|>. One
# python3 process (a base64 process per token took 8 s for the 1500 ids below).
decode() {
  python3 - "$RANKS" "$1" "$2" <<'PY' || fail "decode $1"
import base64, sys
ranks = {}
for line in open(sys.argv[1], "rb"):
    b, r = line.split()
    ranks[int(r)] = base64.b64decode(b, validate=True)
with open(sys.argv[3], "wb") as out:
    for tok in open(sys.argv[2]).read().split():
        i = int(tok)
        out.write(ranks[i] if i in ranks else b"<|endoftext|>" if i == 3000 else b"<|id:%d|>" % i)
PY
}

# Text: the prompt, then new tokens' bytes (no newline: stdout is no terminal).
prompt="The cat "
ok t1 "$CK" --prompt "$prompt" --tokens 30 --temperature 0
[ "$(head -c ${#prompt} "$TMP/t1")" = "$prompt" ] && [ "$(wc -c < "$TMP/t1")" -gt ${#prompt} ] \
  && pass || fail "the text does not start with the prompt: $(head -c 200 "$TMP/t1")"
grep -q "sampled 30 tokens" "$TMP/t1.err" && pass || fail "no summary line"
# An empty prompt starts from <|endoftext|> (3000), as does the prompt "<|endoftext|>"
# (the special token, not its 13 characters); --ids from 3000 draws the same ids, whose
# ranks' bytes are exactly the text.
ok e1 "$CK" --prompt "" --tokens 40 --seed 3
ok e2 "$CK" --prompt "<|endoftext|>" --tokens 40 --seed 3
ok e3 "$CK" --prompt "3000" --ids --tokens 40 --seed 3
[ "$(head -c 13 "$TMP/e2")" = "<|endoftext|>" ] && pass || fail "the prompt is not printed as given"
tail -c +14 "$TMP/e2" > "$TMP/e2.new"
same e1 e2.new "an empty prompt and \"<|endoftext|>\" start differently"
awk 'NF == 41 && $1 == 3000 { for (i = 2; i <= NF; i++) printf "%s ", $i; ok = 1 }
     END { exit !ok }' "$TMP/e3" > "$TMP/e3.new" && pass || fail "--ids output: $(cat "$TMP/e3")"
decode "$TMP/e3.new" "$TMP/e3.text"
same e1 e3.text "the text is not the bytes of the ids --ids prints"
# --tokenizer-file: the same file by another path is the same tokenizer.
cp "$RANKS" "$TMP/copy.tiktoken"
ok e4 "$CK" --prompt "" --tokens 40 --seed 3 --tokenizer-file "$TMP/copy.tiktoken"
same e1 e4 "--tokenizer-file with the same ranks changed the text"

# A padded vocabulary (3008 > 3001, as llm.c pads gpt2's 50257 to 50304): an untrained
# model draws some of ids 3001..3007, which print as <|id:N|>.
if run_np 1 train "$SRC/configs/tiny.cfg" "${model[@]}" --set model.vocab_size=3008 \
     --set train.steps=0 --set "checkpoint.dir=\"$TMP/ckpad\""; then
  pass
else
  fail "saving a padded-vocabulary model"; sed 's/^/    /' "$TMP/err" >&2
fi
ok p1 "$TMP/ckpad" --prompt "" --tokens 1500 --seed 11
ok p2 "$TMP/ckpad" --prompt "3000" --ids --tokens 1500 --seed 11
tr ' ' '\n' < "$TMP/p2" | awk '$1 > 3000 { n++ } END { exit !n }' && pass \
  || fail "the untrained model drew no id above 3000 (choose another seed)"
cut -d' ' -f2- "$TMP/p2" > "$TMP/p2.new"
decode "$TMP/p2.new" "$TMP/p2.text"
same p1 p2.text "padded ids are not printed as <|id:N|>"

# Errors: one message each, the exit code.
expect_sample_error() {
  local code="$1" pattern="$2"; shift 2
  OMP_NUM_THREADS=1 expect_error --rc "$code" --only-line 0 "tessera: error: .*($pattern)" sample "$@"
}
# Another ranks file of the same size (two ranks swapped): its sha256 differs.
n=$(wc -l < "$RANKS")
head -n $((n - 2)) "$RANKS" > "$TMP/other.tiktoken"
tail -n 1 "$RANKS" | awk '{ print $1, $2 - 1 }' >> "$TMP/other.tiktoken"
tail -n 2 "$RANKS" | head -n 1 | awk '{ print $1, $2 + 1 }' >> "$TMP/other.tiktoken"
expect_sample_error 1 "has sha256 [0-9a-f]{64}, but checkpoint .* had sha256 $SHA" \
  "$CK" --prompt hi --tokenizer-file "$TMP/other.tiktoken"
expect_sample_error 1 "nope.tiktoken .*does not exist; run scripts/fetch_tokenizers.sh" \
  "$CK" --prompt hi --tokenizer-file "$TMP/nope.tiktoken"
expect_sample_error 2 "'3001' is not a token id from 0 to 3000" "$CK" --ids --prompt "3000 3001"
expect_sample_error 2 "--prompt is empty: give the token ids" "$CK" --ids --prompt ""
expect_sample_error 2 "--tokenizer-file needs a value" "$CK" --prompt hi --tokenizer-file
# --tokenizer-file is never ignored: not with --ids (which opens no tokenizer), nor for
# a checkpoint without one.
expect_sample_error 2 "--tokenizer-file .*--ids reads and prints token ids" \
  "$CK" --ids --prompt "3000 5" --tokenizer-file "$RANKS"
if run_np 1 train "$SRC/configs/tiny.cfg" "${model[@]}" --set 'model.tokenizer=""' \
     --set 'model.tokenizer_file=""' --set model.vocab_size=3001 --set train.steps=0 \
     --set "checkpoint.dir=\"$TMP/cknone\""; then
  pass
else
  fail "saving a model without a tokenizer"; sed 's/^/    /' "$TMP/err" >&2
fi
expect_sample_error 2 "--tokenizer-file .*trained without a tokenizer" \
  "$TMP/cknone" --prompt "5" --tokenizer-file "$RANKS"

# Training: the tokenizer's vocabulary must fit; a byte-level model takes none; the
# default path, when missing, is named with the fix; a resume under another tokenizer
# (another ranks file, or none) is refused by key.
base=("$SRC/configs/tiny.cfg" "${model[@]}" --set train.steps=6)
expect_error --rc 1 1 "model.vocab_size = 3000 is smaller than model.tokenizer = \"gpt2\"'s 3001 ids" \
  train "${base[@]}" --set model.vocab_size=3000
expect_error --rc 1 1 "model.tokenizer = \"gpt2\" with model.vocab_size = 256" \
  train "${base[@]}" --set model.vocab_size=256
expect_error --rc 1 1 "no-tokenizers/gpt2.tiktoken \(the default path\) does not exist; run scripts/fetch_tokenizers.sh" \
  train "${base[@]}" --set model.vocab_size=3001 --set 'model.tokenizer_file=""'
expect_error --rc 1 1 "model.tokenizer_file = .* is set, but model.tokenizer is not" \
  train "${base[@]}" --set model.vocab_size=3001 --set 'model.tokenizer=""'
expect_error --rc 1 1 "'model.tokenizer' = \"gpt3\" .*is not an encoding" \
  train "${base[@]}" --set model.vocab_size=3001 --set model.tokenizer=gpt3
expect_error --rc 1 1 "saved with model.tokenizer = \"gpt2\" whose ranks file has sha256 $SHA, but the ranks file this run opened .* has sha256" \
  train "${base[@]}" --set model.vocab_size=3001 --set "model.tokenizer_file=\"$TMP/other.tiktoken\"" \
  --set "checkpoint.load=\"$CK\"" --set "checkpoint.dir=\"$CK\""
expect_error --rc 1 1 "saved with model.tokenizer = \"gpt2\", but the config says \"\"" \
  train "${base[@]}" --set model.vocab_size=3001 --set 'model.tokenizer=""' --set 'model.tokenizer_file=""' \
  --set "checkpoint.load=\"$CK\"" --set "checkpoint.dir=\"$CK\""
# Ranks that open different ranks files (here: each its own TS_TOKENIZER_DIR) are
# refused before training, once, every rank exiting non-zero.
mkdir -p "$TMP/tokA" "$TMP/tokB"
cp "$RANKS" "$TMP/tokA/gpt2.tiktoken"
cp "$TMP/other.tiktoken" "$TMP/tokB/gpt2.tiktoken"
two=(train "${base[@]}" --set model.vocab_size=3001 --set 'model.tokenizer_file=""')
FAIL_FAST timeout 120 mpirun --oversubscribe -np 1 -x TS_TOKENIZER_DIR="$TMP/tokA" "$TESSERA" "${two[@]}" : \
  -np 1 -x TS_TOKENIZER_DIR="$TMP/tokB" "$TESSERA" "${two[@]}" >"$TMP/out" 2>"$TMP/err"
rc=$?
if [ $rc -ne 0 ] && [ "$(grep -c 'the ranks read different ranks files for gpt2' "$TMP/err")" = 1 ] &&
   ! grep -Eq "$CRASH_RE" "$TMP/err"; then
  pass
else
  fail "ranks with different ranks files (rc $rc)"; sed 's/^/    /' "$TMP/err" >&2
fi
# The same ranks under another path resume.
if run_np 1 train "${base[@]}" --set model.vocab_size=3001 \
     --set "model.tokenizer_file=\"$TMP/copy.tiktoken\"" --set "checkpoint.load=\"$CK\"" \
     --set "checkpoint.dir=\"$CK\""; then
  pass
else
  fail "resuming with the same ranks under another path"; sed 's/^/    /' "$TMP/err" >&2
fi

finish
