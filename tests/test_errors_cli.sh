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

# The grid must match the ranks launched: message once, every rank exits non-zero (an
# explicit dp: tiny.cfg's "auto" would take both ranks).
expect_error 2 "pp\*dp\*cp\*tp = 1\*1\*1\*1" "${base[@]}" --set parallel.dp=1

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
# parallel.zero takes 0 to 3 (ZeRO-1, -2, -3); there is no level 4.
expect_error 1 "parallel.zero.*must be in \[0, 3\]" "${base[@]}" --set parallel.zero=4
# Checkpoint keys that need each other, and a checkpoint that is not there.
expect_error 1 "checkpoint.every = 2 needs checkpoint.dir" "${base[@]}" --set checkpoint.every=2
expect_error 1 "checkpoint.load.*no-such-dir" "${base[@]}" --set "checkpoint.load=\"$TMP/no-such-dir\""

# Values: not finite, beyond 64 bits (was clamped), bounded sizes, and the batch
# message suggests only values in the key's range.
expect_error 1 "train.lr.*not a finite number" "${base[@]}" --set train.lr=1e309
expect_error 1 "does not fit in 64 bits" "${base[@]}" --set train.seed=99999999999999999999
expect_error 1 "data.val_windows" "${base[@]}" --set data.val_windows=2147483647
expect_error 1 "use global_batch = 2147483644," "${base[@]}" --set train.global_batch=2147483647
expect_error 1 "is a directory" train "$TMP"

# A config read from a pipe is read once: its keys count (it used to train the defaults).
printf 'model = { n_layer = 2; };\ntrain = { steps = 3; global_batch = 4; };\nparallel = { micro_batch = 2; };\n' \
  > "$TMP/pipe.cfg"
if "$TESSERA" train /dev/stdin --set "data.train=\"$TMP/train.bin\"" --set 'data.val=""' \
     --set train.threads=1 --set "log.metrics=\"$TMP/pipe.jsonl\"" < "$TMP/pipe.cfg" 2>"$TMP/err" &&
   [ "$(grep -c '"loss"' "$TMP/pipe.jsonl")" -eq 3 ] && grep -q "2 layers" "$TMP/err"; then
  pass
else
  fail "config from a pipe"; sed 's/^/    /' "$TMP/err" >&2
fi

# Sizes that pass validation but cannot fit are refused with the numbers, before
# anything is allocated (they were an abort and a kernel OOM kill).
expect_error 1 "not enough memory: pipeline rank 0 needs .* GiB \(parameters" "${base[@]}" \
  --set model.vocab_size=16777216
expect_error 1 "not enough memory" "${base[@]}" --set model.n_layer=60000
expect_error 1 "is more than the [0-9]+ CPUs" "${base[@]}" --set train.threads=$(($(nproc) + 1))
# Under an address-space limit OpenBLAS's buffer allocation used to retry forever: now
# the threads' buffers are checked first. The process's own size differs by machine, so
# the limit comes down until the check speaks; no limit may hang or crash the run. It
# starts high and steps finely: a CUDA build maps ~0.9 GB of libraries before MPI_Init,
# and a limit just above that lets Open MPI's own MPI_Init fail to map a component and
# crash (seen at 1.4 GB), below the ~1.65 GB where the check speaks for 2 threads.
# (AddressSanitizer reserves terabytes of address space: it cannot run under ulimit -v.)
if [ "$(nproc)" -ge 2 ] && ! asan_build; then
  seen=0
  for kb in 2400000 2000000 1800000 1700000 1600000 1500000 1100000 900000 750000 650000; do
    (ulimit -v "$kb"; timeout 60 "$TESSERA" "${base[@]}" --set train.threads=2 >/dev/null 2>"$TMP/err")
    rc=$?
    if [ "$rc" -eq 124 ]; then fail "hang under ulimit -v $kb"; break; fi
    if [ "$rc" -ge 125 ] || grep -qE -- "$CRASH_RE" "$TMP/err"; then
      fail "crash under ulimit -v $kb (exit status $rc)"; sed 's/^/    /' "$TMP/err" >&2; break
    fi
    if grep -q "BLAS threads need .* of address space" "$TMP/err"; then
      seen=1; judge_error "tessera under ulimit -v $kb" "$rc" "BLAS threads need .* of address space"; break
    fi
  done
  [ "$seen" -eq 1 ] || fail "no address-space message for 2 BLAS threads under ulimit -v"
else
  skip_case "the address-space limit (ulimit -v) case: it needs 2 CPUs and a build without AddressSanitizer"
fi

# Outputs: a path that is not a regular file is refused up front (a write to /dev/full
# used to exit 0), an unwritable trace fails before the first step.
expect_error 1 "log.metrics: /dev/full exists and is a character device" "${base[@]}" \
  --set 'log.metrics="/dev/full"'
expect_error 2 "log.metrics: /dev/full exists and is a character device" "${base[@]}" \
  --set 'log.metrics="/dev/full"' --set parallel.dp=2 --set parallel.micro_batch=2
rm -f "$TMP/m.jsonl"
expect_error 1 "log.trace: cannot create (directory )?/proc/no-such-dir" "${base[@]}" \
  --set 'log.trace="/proc/no-such-dir/t.json"' --set train.steps=3
[ ! -s "$TMP/m.jsonl" ] && pass || fail "an unwritable log.trace was found only after training"

# A disk that fills up: the run stops with an error, the metrics file keeps whole lines
# (and the TensorBoard event file whole records).
mkdir -p "$TMP/small"
if mount -t tmpfs -o size=8k tmpfs "$TMP/small" 2>/dev/null; then
  at_exit 'umount "$TMP/small" 2>/dev/null'
  # (A 1-layer, 32-wide model: the ~20 steps that fill 8 KiB of metrics cost less; the
  # lines are the same fields.)
  expect_error 1 "log.metrics: writing .*No space left on device" "${base[@]}" --set train.steps=60 \
    --set model.n_layer=1 --set model.n_embd=32 --set "log.metrics=\"$TMP/small/m.jsonl\""
  # Whole lines: each one a complete object, and the file ends with a newline.
  if [ -s "$TMP/small/m.jsonl" ] && [ "$(tail -c 1 "$TMP/small/m.jsonl" | od -An -c | tr -d ' ')" = '\n' ] &&
     awk '!/^\{.*\}$/ { bad = 1 } END { exit bad }' "$TMP/small/m.jsonl"; then
    pass
  else
    fail "metrics file on a full disk is not whole JSON lines"
  fi
  # log.tensorboard's event file on the full disk: the same stop, the file cut back to
  # its last whole record, which check_tfevents.py reads (a prefix of the metrics lines).
  rm -f "$TMP/small/m.jsonl"
  expect_error 1 "log.tensorboard: writing .*No space left on device" "${base[@]}" --set train.steps=60 \
    --set model.n_layer=1 --set model.n_embd=32 --set "log.tensorboard=\"$TMP/small/tb\""
  python3 "$SRC/tests/check_tfevents.py" "$TMP/m.jsonl" "$TMP"/small/tb/events.out.tfevents.* --partial \
    && pass || fail "the event file on a full disk is not whole records"
  umount "$TMP/small"
else
  skip_case "the full-disk case (mounting a tmpfs is not permitted here)"
fi
finish
