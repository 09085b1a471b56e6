# Downstream evaluation (HellaSwag, docs/CONTRACT.md "tessera eval"): a tiny gpt2 model
# with the fixture ranks (tests/fixtures/bpe/small.tiktoken) trained 12 steps, as
# tests/make_hellaswag_fixture.py trains it, then the fixture's 21 items
# (tests/fixtures/hellaswag/items.jsonl: "[title]"/"[header]" brackets, capitalisation,
# an empty ctx_b, accents, a label given as a string, contexts truncated to seq_len)
# scored by `tessera eval --json` on 1 rank, dp 2 and pp 2: every completion's token and
# character counts equal the PyTorch reference's (the harness's text handling), the
# three scores' counts identical (tests/fixtures/hellaswag/expected.json), each
# log-likelihood within 1e-4 of torch's on this run's checkpoint (the fixture's rows,
# tests/make_hellaswag_fixture.py --score, with /usr/bin/python3's torch; without torch
# within 1e-3 of the committed ones: another build's 12 training steps move the weights,
# and them by ~1e-4); data.hellaswag in the same training writes
# the same scores into the last step's metrics line. Then the errors: a bad line named
# FILE:LINE, a missing file, a checkpoint without a tokenizer, data.hellaswag without
# eval_every or a tokenizer, an inert
# data.hellaswag_items, an eval key eval would ignore.
source "$(dirname "$0")/lib.sh"

RANKS="$SRC/tests/fixtures/bpe/small.tiktoken"
HS="$SRC/tests/fixtures/hellaswag/items.jsonl"
EXPECT="$SRC/tests/fixtures/hellaswag/expected.json"
export TS_TEST_TOKENIZER_ANY_SIZE=1 TS_TOKENIZER_DIR="$TMP/no-tokenizers"
cp /usr/share/games/fortunes/fortunes "$TMP/small.txt"
"$TESSERA" data --encoding gpt2 --ranks "$RANKS" --val-tokens 2000 "$TMP/small.txt" \
  --out "$TMP/bpe" >"$TMP/data.out" 2>&1 && pass || { fail "tessera data"; cat "$TMP/data.out" >&2; }
# tests/make_hellaswag_fixture.py's TRAIN: keep the two identical.
train=(train "$SRC/configs/tiny.cfg" --set model.n_layer=2 --set model.n_head=2
       --set model.n_embd=32 --set model.seq_len=64 --set model.vocab_size=3008
       --set model.tokenizer=gpt2 --set train.threads=1 --set train.steps=12
       --set train.lr=1e-2 --set train.warmup=0 --set 'data.val=""'
       --set "model.tokenizer_file=\"$RANKS\"" --set "data.train=\"$TMP/bpe_train_*.bin\"")
if run_np 1 "${train[@]}" --set "checkpoint.dir=\"$TMP/ck\"" --set "log.metrics=\"$TMP/m.jsonl\"" \
     --set "data.hellaswag=\"$HS\"" --set data.eval_every=12; then
  pass
else
  fail "training with data.hellaswag"; sed 's/^/    /' "$TMP/err" >&2
fi
grep_q '| hellaswag acc ' "$TMP/err" && pass || fail "no hellaswag in the progress line"

# Torch's log-likelihoods of the fixture's rows on this run's weights.
PY="${TS_TEST_TORCH_PYTHON:-/usr/bin/python3}"
export HS_REF=""
if [ -x "$PY" ] && "$PY" -c 'import torch' >/dev/null 2>&1; then
  if "$PY" "$SRC/tests/make_hellaswag_fixture.py" --score "$TMP/ck/step_00000012/model.safetensors" \
       >"$TMP/ref.json" 2>"$TMP/ref.err"; then
    pass; HS_REF="$TMP/ref.json"
  else
    fail "the torch reference on the checkpoint"; sed 's/^/    /' "$TMP/ref.err" >&2
  fi
else
  skip_case "torch's log-likelihoods on this checkpoint ($PY cannot import torch): the committed ones, within 1e-3"
fi

# compare NAME FILE: a --json result (or, with --metrics, the metrics file's last
# hellaswag line) against the fixture.
compare() {
  python3 - "$EXPECT" "$@" <<'PY' && pass || fail "$1 differs from the PyTorch reference"
import json, os, sys
exp = json.load(open(sys.argv[1]))
name, path = sys.argv[2], sys.argv[3]
n = exp["items"]
if len(sys.argv) > 4:  # the metrics line
    line = [json.loads(l) for l in open(path) if '"hellaswag_acc"' in l][-1]
    got = {k: line["hellaswag_" + k] for k in ("acc", "acc_norm", "acc_norm_tokens")}
    ok = line["hellaswag_items"] == n and all(
        abs(got[k] - exp[k + "_count"] / n) < 1e-9 for k in got)
    if not ok: print(f"{name}: {line} against {exp['acc_count']}, {exp['acc_norm_count']}, "
                     f"{exp['acc_norm_tokens_count']} of {n}", file=sys.stderr)
    sys.exit(0 if ok else 1)
got = json.load(open(path))
ref, tol = exp["per_item"], 1e-3
if os.environ.get("HS_REF"):
    ref, tol = [{"loglik": l} for l in json.load(open(os.environ["HS_REF"]))["loglik"]], 1e-4
bad = [k for k in ("items", "acc_count", "acc_norm_count", "acc_norm_tokens_count", "truncated")
       if got[k] != exp[k]]
if not (len(got["per_item"]) == len(exp["per_item"]) == len(ref) == exp["items"] and
        all(len(g["loglik"]) == 4 for g in got["per_item"])):
    bad.append(f"per_item: {len(got['per_item'])} items, {len(ref)} expected")
worst = 0.0
for i, (g, e, r) in enumerate(zip(got["per_item"], exp["per_item"], ref)):
    for k in ("label", "tokens", "chars"):
        if g[k] != e[k]: bad.append(f"item {i} {k} {g[k]} != {e[k]}")
    worst = max([worst] + [abs(a - b) for a, b in zip(g["loglik"], r["loglik"])])
if worst > tol: bad.append(f"log-likelihood off by {worst:.3g} (tolerance {tol:g})")
for b in bad: print(f"{name}: {b}", file=sys.stderr)
sys.exit(1 if bad else 0)
PY
}
compare "data.hellaswag in training" "$TMP/m.jsonl" --metrics

ev=(eval "$TMP/ck" --hellaswag "$HS" --json --set train.threads=1)
for g in "1" "2" "2 --set parallel.pp=2"; do
  read -r np sets <<<"$g"
  # shellcheck disable=SC2086
  if run_np "$np" "${ev[@]}" $sets; then
    cp "$TMP/out" "$TMP/eval_$np.json"
    compare "tessera eval on $np rank(s) $sets" "$TMP/eval_$np.json"
  else
    fail "tessera eval on $np rank(s) $sets"; sed 's/^/    /' "$TMP/err" >&2
  fi
done
# The text line.
if run_one eval "$TMP/ck" --hellaswag "$HS" --set train.threads=1 --items 3; then
  grep_q "^hellaswag .*: 3 items, acc [0-9.]* ([0-9]), acc_norm [0-9.]* ([0-9]), acc_norm_tokens" \
    "$TMP/out" && pass || fail "eval's text line: $(cat "$TMP/out")"
else
  fail "tessera eval --items 3"; sed 's/^/    /' "$TMP/err" >&2
fi

# Errors, each named once.
printf '%s\n' "$(head -1 "$HS")" '{"activity_label": "x", "ctx_a": "y"' >"$TMP/bad1.jsonl"
expect_error --rc 1 --one-error 0 "bad1.jsonl:2: not a JSON object" "${ev[@]/$HS/$TMP/bad1.jsonl}"
printf '%s\n' '' "$(head -1 "$HS" | sed 's/"label": 3/"label": 7/')" >"$TMP/bad2.jsonl"
expect_error --rc 1 --one-error 0 "bad2.jsonl:2: \"label\" is missing or not one of 0, 1, 2, 3" \
  "${ev[@]/$HS/$TMP/bad2.jsonl}"
head -1 "$HS" | sed 's/"ctx_b"/"ctx_c"/' >"$TMP/bad3.jsonl"
expect_error --rc 1 --one-error 0 "bad3.jsonl:1: \"ctx_b\" is missing or not a string" \
  "${ev[@]/$HS/$TMP/bad3.jsonl}"
expect_error --rc 1 --one-error 0 "HellaSwag file .*/none.jsonl cannot be read" \
  "${ev[@]/$HS/$TMP/none.jsonl}"
expect_error --rc 2 --one-error 0 "--set model.n_layer=3: eval takes parallel" \
  "${ev[@]}" --set model.n_layer=3
# A checkpoint without a tokenizer (a byte-level model): nothing to encode the text with.
if run_one train "$SRC/configs/tiny.cfg" --set model.n_layer=1 --set model.n_embd=16 \
     --set model.n_head=1 --set model.seq_len=16 --set train.steps=1 --set train.threads=1 \
     --set 'data.val=""' --set "data.train=\"$TMP/small.txt\"" --set "checkpoint.dir=\"$TMP/bytes\"" \
     --set 'log.metrics=""' --set log.progress=false; then
  expect_error --rc 1 --one-error 0 "checkpoint .* was trained without a tokenizer" \
    eval "$TMP/bytes" --hellaswag "$HS"
else
  fail "training the byte-level checkpoint"; sed 's/^/    /' "$TMP/err" >&2
fi
expect_error --rc 1 --one-error 1 "data.hellaswag = .* data.eval_every = 0: set it > 0" \
  "${train[@]}" --set "data.hellaswag=\"$HS\"" --set data.eval_every=0
expect_error --rc 1 --one-error 1 "data.hellaswag = .* needs model.tokenizer" \
  "${train[@]}" --set "data.hellaswag=\"$HS\"" --set data.eval_every=1 --set 'model.tokenizer=""' \
  --set 'model.tokenizer_file=""'
expect_error --rc 1 --one-error 1 "data.hellaswag_items' = 5 is HellaSwag's item count; it matters only with data.hellaswag set" \
  "${train[@]}" --set data.hellaswag_items=5
finish
