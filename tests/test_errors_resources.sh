# Errors the environment causes are messages and exit 1, never a signal: `tessera sample`
# into a closed pipe (no SIGPIPE death), a BPE merge that cannot get its memory under
# ulimit -v (no SIGABRT), a ranks path of 5000 bytes (the message keeps its cause); and
# raw text given to a model with a BPE model.tokenizer is refused for data.train and
# data.val, pointing at `tessera data --encoding`.
source "$(dirname "$0")/lib.sh"

export TS_TEST_TOKENIZER_ANY_SIZE=1 # the 3000-rank fixture serves as "gpt2"
export TS_TOKENIZER_DIR="$TMP/no-tokenizers"
RANKS="$SRC/tests/fixtures/bpe/small.tiktoken"
make_corpus "$TMP/train.bin"

# A closed pipe: sample's write fails with EPIPE, reported once, exit 1.
if run_one train "$SRC/configs/tiny.cfg" --set model.n_layer=1 --set model.n_embd=32 --set train.steps=1 \
     --set "data.train=\"$TMP/train.bin\"" --set 'data.val=""' --set "checkpoint.dir=\"$TMP/ck\"" \
     --set 'log.metrics=""' --set log.progress=false --set train.threads=1; then pass
else fail "training the checkpoint to sample"; sed 's/^/    /' "$TMP/err" >&2; fi
OMP_NUM_THREADS=1 timeout 60 "$TESSERA" sample "$TMP/ck" --prompt hi --tokens 100000 2>"$TMP/err" | head -c 5 >/dev/null
judge_error --rc 1 --one-error "tessera sample | head -c 5" "${PIPESTATUS[0]}" "writing standard output failed: Broken pipe"

# A single 40 MB pre-token piece needs about 1 GiB of merge scratch: under an address-space
# limit of the binary's shared libraries (mapped whole: 90 MB in a CPU build, 870 MB with
# CUDA's and NCCL's) plus 700 MB, that is an error naming the piece and the way out.
# AddressSanitizer reserves terabytes of address space, so the case cannot run under it.
if asan_build; then
  skip_case "the ulimit -v case: AddressSanitizer cannot run under an address-space limit"
else
  python3 -c "import sys; sys.stdout.write('ab' * 20000000)" > "$TMP/piece.txt"
  mkdir -p "$TMP/oom"
  libs_kb="$(ldd "$TESSERA" | awk '/=>/ {print $3}' | xargs -r stat -L -c %s |
             awk '{s += $1} END {printf "%d", s / 1024}')"
  limit_kb=$((libs_kb + 700000))
  (ulimit -v "$limit_kb"; exec timeout 60 "$TESSERA" data "$TMP/piece.txt" --encoding gpt2 --ranks "$RANKS" \
     --threads 1 --out "$TMP/oom/x") >"$TMP/out" 2>"$TMP/err"
  judge_error --rc 1 --one-error "tessera data of a 40 MB piece under ulimit -v $limit_kb" $? \
    "out of memory merging a single pre-token piece of 40000000 bytes: .* split the text"
  if ls "$TMP"/oom/x* >/dev/null 2>&1; then fail "the failed tessera data left files: $(ls "$TMP"/oom)"; else pass; fi
  rm -f "$TMP/piece.txt"
fi

# A ranks path of 5000 bytes: the message ends with the cause, not cut before it.
long="/x/$(printf 'x%.0s' $(seq 5000))"
mkdir -p "$TMP/e"
expect_error --rc 1 --one-error 0 "cannot open the ranks file /x/x{5000}: File name too long" \
  data "$TMP/corpus.txt" --encoding gpt2 --ranks "$long" --out "$TMP/e/x"

# Raw text for a BPE model: refused in data.train and data.val (once each), not trained
# as byte ids 0-255 of another encoding.
mkdir -p "$TMP/g"
if "$TESSERA" data "$TMP/corpus.txt" --encoding gpt2 --ranks "$RANKS" --out "$TMP/g/c" >/dev/null 2>"$TMP/err"; then pass
else fail "tessera data --encoding gpt2"; sed 's/^/    /' "$TMP/err" >&2; fi
bpe=(train "$SRC/configs/tiny.cfg" --set train.steps=1 --set 'model.tokenizer="gpt2"'
     --set "model.tokenizer_file=\"$RANKS\"" --set model.vocab_size=3008 --set log.progress=false
     --set 'log.metrics=""' --set train.threads=1)
expect_error --rc 1 --one-error 1 "data.train: .*corpus.txt is a text file .* model.tokenizer = \"gpt2\" .*tessera data .* --encoding gpt2" \
  "${bpe[@]}" --set "data.train=\"$TMP/corpus.txt\"" --set 'data.val=""' --set data.eval_every=0
expect_error --rc 1 --one-error 1 "data.val: .*corpus.txt is a text file .* --encoding gpt2" \
  "${bpe[@]}" --set "data.train=\"$TMP/g/c_train_000000.bin\"" --set "data.val=\"$TMP/corpus.txt\"" --set data.eval_every=1
# The shards themselves train (the check refuses text, not BPE data).
if run_np 1 "${bpe[@]}" --set "data.train=\"$TMP/g/c_train_000000.bin\"" --set 'data.val=""' --set data.eval_every=0; then pass
else fail "training on the gpt2 shards"; sed 's/^/    /' "$TMP/err" >&2; fi

finish
