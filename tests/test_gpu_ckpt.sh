# Checkpoints between the GPU and the CPU (CTest label "gpu"; skipped, 77, without a
# CUDA device), the tiny config, 20 steps (tests/lib.sh gpu_common), a checkpoint at step 10:
# - GPU -> CPU: the GPU run's step-10 checkpoint passes `tessera ckpt verify`, and the
#   CPU resumes it for steps 10-19;
# - CPU -> GPU: the CPU run's step-10 checkpoint resumed on the GPU;
# both, steps 0-9 from the run that saved and 10-19 from the one that resumed, match the
# uninterrupted 20-step CPU run: loss within relative 1e-4, gradient norm within 1e-3 (the
# GPU's bound against the CPU, test_gpu_train). Each saving run goes on to step 20 (its
# learning-rate schedule is the 20-step one; a 10-step run would decay it differently),
# and each resuming run must start at step 10 (its metrics file holds steps 10-19 only).
# TS_GPU_TEST_DEVICE=cpu-strict: a dry run on the CPU; nothing here needs a real GPU.
# CTest's _dry copy trains 4 steps with the checkpoint at step 2 (gpu_common's GPU_STEPS):
# the same saves, loads and comparisons.
source "$(dirname "$0")/lib.sh"
gpu_setup

gpu_common
common+=(--set 'train.precision="fp32"')
half=$((GPU_STEPS / 2))
half_dir=$(printf 'step_%08d' "$half")

# resumed NAME SAVED_BY: $TMP/NAME.jsonl (steps 10-19, from a run that loaded the step-10
# checkpoint; $half.. in general) after the first 10 steps of SAVED_BY's run, compared
# with the CPU's 20.
resumed() {
  local name="$1" saved_by="$2" first
  first=$(grep -o '"step":[0-9]*,"loss"' "$TMP/$name.jsonl" | head -1 | tr -dc '0-9')
  if [ "$(losses "$TMP/$name.jsonl" | wc -l)" = $((GPU_STEPS - half)) ] && [ "$first" = "$half" ]; then pass
  else fail "$name: expected steps $half-$((GPU_STEPS - 1)) after loading step $half, got $(losses "$TMP/$name.jsonl" | wc -l) from step $first"; fi
  awk -v h="$half" -F'"step":' 'NF > 1 && $2 + 0 < h && /"loss"/' "$TMP/$saved_by.jsonl" > "$TMP/${name}_all.jsonl"
  grep '"step":[0-9]*,"loss"' "$TMP/$name.jsonl" >> "$TMP/${name}_all.jsonl"
  compare_runs "$name: $half + $((GPU_STEPS - half)) steps vs $GPU_STEPS on cpu" "$TMP/${name}_all.jsonl" \
    "$TMP/cpu.jsonl" 1e-4 1e-3
}

train_on cpu 1 cpu --set checkpoint.every=$half --set "checkpoint.dir=\"$TMP/cpu_ckpt\""
train_on gpu 1 "$GPU_DEVICE" --set checkpoint.every=$half --set "checkpoint.dir=\"$TMP/gpu_ckpt\"" &&
  compare_runs "$GPU_STEPS steps saving on $GPU_DEVICE vs cpu" "$TMP/gpu.jsonl" "$TMP/cpu.jsonl" 1e-4 1e-3
if "$TESSERA" ckpt verify "$TMP/gpu_ckpt/$half_dir" >"$TMP/out" 2>&1; then pass
else fail "ckpt verify of the checkpoint written on $GPU_DEVICE"; sed 's/^/    /' "$TMP/out" >&2; fi

train_on gpu_to_cpu 1 cpu --set "checkpoint.load=\"$TMP/gpu_ckpt/$half_dir\"" &&
  resumed gpu_to_cpu gpu
train_on cpu_to_gpu 1 "$GPU_DEVICE" --set "checkpoint.load=\"$TMP/cpu_ckpt/$half_dir\"" &&
  resumed cpu_to_gpu cpu
finish
