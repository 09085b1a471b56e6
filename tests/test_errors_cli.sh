# Bad input gets one clear message from rank 0 and a non-zero exit on every rank,
# never a crash: config keys, types, ranges, grid size, data files, model.init.
source "$(dirname "$0")/lib.sh"

make_corpus "$TMP/train.bin"
cfg="$SRC/configs/tiny.cfg"
base=(train "$cfg" --set "data.train=\"$TMP/train.bin\"" --set 'data.val=""'
      --set train.steps=1 --set train.threads=1 --set "log.metrics=\"$TMP/m.jsonl\"")

# Config keys.
expect_error 1 "unknown config key 'train.lr_max'" "${base[@]}" --set train.lr_max=3
expect_error 1 "model.n_layer" "${base[@]}" --set model.n_layer=four
expect_error 1 "train.steps" "${base[@]}" --set train.steps=1.5
expect_error 1 "train.lr" "${base[@]}" --set train.lr=-1
expect_error 1 "parallel.schedule" "${base[@]}" --set parallel.schedule=round-robin
expect_error 1 "global_batch" "${base[@]}" --set train.global_batch=15
printf 'model = { n_layer = 4 \n' > "$TMP/broken.cfg"
expect_error 1 "broken.cfg:[0-9]+: syntax error" train "$TMP/broken.cfg"
expect_error 1 "No such file|cannot read|not found" train "$TMP/absent.cfg"

# The grid must match the ranks launched: message once, every rank exits non-zero.
expect_error 2 "pp\*dp\*tp" "${base[@]}"

# An error on one rank only (rank 0 alone opens the metrics file): every rank still
# exits non-zero, promptly (run_np has a timeout), with one message.
expect_error 2 "log.metrics" "${base[@]}" --set parallel.dp=2 --set parallel.micro_batch=2 \
  --set 'log.metrics="/proc/no-such-dir/metrics.jsonl"'
expect_error 2 "log.metrics" "${base[@]}" --set parallel.pp=2 \
  --set 'log.metrics="/proc/no-such-dir/metrics.jsonl"'

# Data files.
expect_error 1 "No such file" train "$cfg" --set "data.train=\"$TMP/missing.bin\"" --set 'data.val=""'
head -c 3000 "$TMP/train.bin" > "$TMP/truncated.bin"
expect_error 1 "truncated" train "$cfg" --set "data.train=\"$TMP/truncated.bin\"" --set 'data.val=""'
expect_error 1 "vocab_size" "${base[@]}" --set model.vocab_size=64
printf '\x01\x00\x00\x00' > "$TMP/tiny.txt"
expect_error 1 "fewer than one window" train "$cfg" --set "data.train=\"$TMP/tiny.txt\"" --set 'data.val=""'

# model.init: a missing file and a file for another model.
expect_error 1 "model.init" "${base[@]}" --set "model.init=\"$TMP/none.safetensors\""
expect_error 1 "transformer\.wte\.weight.*shape|shape.*transformer\.wte\.weight" "${base[@]}" \
  --set "model.init=\"$SRC/tests/fixtures/gpt2_tiny_weights.safetensors\"" --set model.n_layer=2
finish
