# Training from the command line on the tiny config: the loss at initialisation is
# ln(vocab) within 5%, 50 steps lower it, and the same run twice is bit-identical; the
# metrics and progress lines carry MFU, the start-up lines the model, grid and ZeRO
# level (and a warning when ZeRO has no replicas to shard over); TensorBoard's events
# read back, and a planted straggler named (rank 2 of 3). Under the sanitizers
# and in the strict copy (TS_TEST_SWEEP_STEPS set, tests/CMakeLists.txt) the runs train
# 12 steps with validation every 6, every case but the loss's fall (the default copy's):
# they look for memory errors and host touches of device memory, which 12 steps meet.
source "$(dirname "$0")/lib.sh"

make_corpus "$TMP/train.bin"
head -c 20000 /usr/share/games/fortunes/science > "$TMP/val.txt"
"$TESSERA" data "$TMP/val.txt" "$TMP/val.bin" >/dev/null

steps=50
[ -n "${TS_TEST_SWEEP_STEPS:-}" ] && steps=12
common=(train "$SRC/configs/tiny.cfg" --set "train.steps=$steps" --set "data.train=\"$TMP/train.bin\""
        --set "data.val=\"$TMP/val.bin\"" --set "data.eval_every=$((steps / 2))" --set train.threads=1)

if run_np 1 "${common[@]}" --set "log.metrics=\"$TMP/run1.jsonl\""; then pass; else fail "train run 1"; cat "$TMP/err" >&2; fi
# The rerun writes TensorBoard events and straggler reports too, which change no number.
if run_np 1 "${common[@]}" --set "log.metrics=\"$TMP/run2.jsonl\"" --set "log.tensorboard=\"$TMP/tb\"" \
     --set "log.straggler_every=$((steps / 2))"; then pass; else fail "train run 2"; cat "$TMP/err" >&2; fi

n=$(losses "$TMP/run1.jsonl" | wc -l)
[ "$n" -eq "$steps" ] && pass || fail "expected $steps step lines, got $n"
first=$(losses "$TMP/run1.jsonl" | head -1)
last=$(losses "$TMP/run1.jsonl" | tail -5 | awk '{s += $1} END {print s / NR}')
awk -v l="$first" 'BEGIN { e = log(256); exit !(l > 0.95 * e && l < 1.05 * e) }' \
  && pass || fail "initial loss $first not within 5% of ln(256)"
if [ "$steps" -eq 50 ]; then
  awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 1.0) }' \
    && pass || fail "50 steps did not lower the loss enough: $first -> $last"
else
  skip_case "the loss's fall over 50 steps (the default copy in the release build checks it)"
fi
if cmp -s <(losses "$TMP/run1.jsonl") <(losses "$TMP/run2.jsonl"); then pass; else fail "two identical runs differ"; fi
grep -q '"val_loss"' "$TMP/run1.jsonl" && pass || fail "no validation loss line"
for key in step loss lr grad_norm tokens step_ms tokens_per_s bubble dp_overlap; do
  grep -m1 '^{"step":' "$TMP/run1.jsonl" | grep_q "\"$key\":" && pass || fail "metrics line lacks $key"
done
grep -q "ETA" "$TMP/err" && pass || fail "no progress with ETA on stderr"
# log.tensorboard: one event file whose records (CRCs, file_version, every number of
# every metrics line under its tag and step, validation's included) check_tfevents.py
# reads back; log.straggler_every: a report every steps/2 steps (one rank: none).
tb=("$TMP"/tb/events.out.tfevents.*)
[ "${#tb[@]}" -eq 1 ] && [ -f "${tb[0]}" ] && python3 "$SRC/tests/check_tfevents.py" "$TMP/run2.jsonl" "${tb[@]}" \
  && pass || fail "the TensorBoard events do not match run2.jsonl (${tb[*]})"
[ "$(grep -c "^stragglers, steps [0-9]*-[0-9]*: no stragglers" "$TMP/err")" -eq 2 ] && pass \
  || fail "expected 2 straggler reports: $(grep straggler "$TMP/err")"
# MFU: every step line has one, and the run's median lies in (0, 1.5) (measured against
# the start-up sgemm rate; a loaded machine moves it, hence the median and the margin).
# The first line records the ZeRO level that ran and the rates MFU is measured against.
n_mfu=$(grep -c '^{"step":[0-9]*,"loss".*"mfu":[0-9.]*,' "$TMP/run1.jsonl")
[ "$n_mfu" -eq "$steps" ] && pass || fail "$n_mfu of $steps step lines have mfu"
mfu=$(grep -o '"mfu":[0-9.e+-]*' "$TMP/run1.jsonl" | cut -d: -f2 | sort -g | sed -n "$((steps / 2))p")
awk -v m="$mfu" 'BEGIN { exit !(m > 0 && m < 1.5) }' && pass || fail "median mfu '$mfu' not in (0, 1.5)"
head -1 "$TMP/run1.jsonl" | grep_q '"zero":0,"gemm_dtype":"fp32","gemm_gflops":\[[0-9.]*\]' && pass \
  || fail "first metrics line lacks zero/gemm_dtype/gemm_gflops: $(head -1 "$TMP/run1.jsonl")"
grep -q "| MFU [0-9.]*% |" "$TMP/err" && pass || fail "no MFU on the progress lines"
grep -q "^tessera: gpt2 4 layers, 4 heads, 128 embd, vocab 256" "$TMP/err" && pass \
  || fail "model line: $(grep -m1 'layers' "$TMP/err")"
grep -q "^tessera: grid pp=1 dp=1 cp=1 tp=1 (1 rank, tp-cp-dp-pp), ZeRO-0," "$TMP/err" && pass \
  || fail "grid line: $(grep -m1 'grid' "$TMP/err")"

# Llama's line names its architecture, kv heads and ffn width; parallel.zero with one
# replica (tp 2, dp 1) runs as ZeRO-0 and rank 0 says so once.
if run_np 2 train "$SRC/configs/llama-tiny.cfg" --set train.steps=1 --set model.n_layer=1 \
     --set "data.train=\"$TMP/train.bin\"" --set 'data.val=""' --set 'log.metrics=""' \
     --set parallel.tp=2 --set parallel.zero=1; then
  grep -q "^tessera: llama 1 layers, 4 heads (2 kv), 128 embd, ffn 384, vocab 256" "$TMP/err" \
    && pass || fail "llama model line: $(grep -m1 'layers' "$TMP/err")"
  grep -q "grid pp=1 dp=1 cp=1 tp=2 (2 ranks, tp-cp-dp-pp), ZeRO-0," "$TMP/err" && pass \
    || fail "llama grid line: $(grep -m1 'grid' "$TMP/err")"
  [ "$(grep -c 'warning: parallel.zero = 1 runs as ZeRO-0: .*dp\*cp = 1\*1 = 1' "$TMP/err")" -eq 1 ] \
    && pass || fail "expected one ZeRO-0 warning: $(grep -c warning "$TMP/err") warnings"
else
  fail "llama tp 2 run"; cat "$TMP/err" >&2
fi

# A planted straggler: rank 2 of 3 (dp 3) sleeps after each of its sgemm calls
# (tests/slow_sgemm.c, preloaded into that rank alone): every straggler report names it,
# and the metrics make it the slowest rank of most steps (not all: a loaded machine may
# stall another rank once); its events read back too. A property of timings: the
# release build's (run 2 above takes the same code under the sanitizers and strict).
SLOW="$(dirname "$TESSERA")/tests/libts_slow_sgemm.so"
slow=(train "$SRC/configs/tiny.cfg" --set train.steps=4 --set "data.train=\"$TMP/train.bin\""
      --set 'data.val=""' --set train.threads=1 --set log.progress=false --set train.global_batch=12
      --set "log.metrics=\"$TMP/slow.jsonl\"" --set "log.tensorboard=\"$TMP/tb_slow\""
      --set log.straggler_every=2 "${DEVICE_SETS[@]}")
if release_only "the planted straggler"; then
  :
elif timeout 120 mpirun --oversubscribe -np 2 "$TESSERA" "${slow[@]}" : -np 1 env TS_TEST_SGEMM_SLEEP_US=500 \
     LD_PRELOAD="${LD_PRELOAD:+$LD_PRELOAD:}$SLOW" "$TESSERA" "${slow[@]}" >"$TMP/out" 2>"$TMP/err"; then
  [ "$(grep -c "warning: stragglers, steps [0-9]*-[0-9]*: rank 2 score 0\.[0-6][0-9] " "$TMP/err")" -eq 2 ] \
    && pass || fail "the straggler reports do not name rank 2: $(grep straggler "$TMP/err")"
  n=$(grep -c '"rank_slowest":2,"rank_fastest":[01],' "$TMP/slow.jsonl")
  [ "$n" -ge 3 ] && pass || fail "rank 2 is the slowest of $n of 4 steps: $(grep -o '"rank_slowest[^}]*' "$TMP/slow.jsonl")"
  python3 "$SRC/tests/check_tfevents.py" "$TMP/slow.jsonl" "$TMP"/tb_slow/events.out.tfevents.* \
    && pass || fail "the planted straggler's events do not match its metrics"
else
  fail "the planted straggler's run"; cat "$TMP/err" >&2
fi

# model.init: training starts from a safetensors file of nanoGPT-named weights
# (the fixture's tiny model has vocab 96: upper-case text keeps bytes below 96).
fixture="$SRC/tests/fixtures/gpt2_tiny_weights.safetensors"
tr 'a-z' 'A-Z' < "$TMP/corpus.txt" | tr -d '\140-\377' > "$TMP/upper.txt"
"$TESSERA" data "$TMP/upper.txt" "$TMP/upper.bin" >/dev/null
if run_np 1 train "$SRC/configs/tiny.cfg" --set train.steps=3 --set "data.train=\"$TMP/upper.bin\"" \
     --set data.eval_every=0 --set model.n_layer=2 --set model.n_head=2 --set model.n_embd=32 \
     --set model.vocab_size=96 --set model.seq_len=16 --set "model.init=\"$fixture\"" \
     --set 'data.val=""' --set "log.metrics=\"$TMP/init.jsonl\""; then
  [ "$(losses "$TMP/init.jsonl" | wc -l)" -eq 3 ] && pass || fail "model.init run wrote no metrics"
else
  fail "training from model.init failed"; cat "$TMP/err" >&2
fi
finish
