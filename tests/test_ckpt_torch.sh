# Tessera's weights against PyTorch: nanoGPT's GPT (tests/torch_gpt2.py, with the classes
# of tests/make_fixture.py) gives Tessera's loss for the same weights and batch.
#  a. Random nanoGPT weights written by torch, loaded with model.init: the step-0 loss on
#     1 rank, tp = 2 and pp = 2, and every loss of 6 steps on dp = 2 with lr 1e-30 (the
#     weights stay as loaded; the batches wrap around a 40-window text file), equal
#     torch's loss of that step's batch (batch rule) within relative 1e-5.
#  b. 3 steps from those weights on pp = 2 x dp = 2 with ZeRO-1 and checkpoint.dir write
#     step_00000003 and latest. Torch loads its model.safetensors (load_state_dict strict,
#     lm_head tied); optimizer.safetensors holds exp_avg.<name> and exp_avg_sq.<name> of
#     every parameter in its shape, equal (relative L2 1e-4 per tensor) to
#     torch.optim.AdamW's state after replaying the 3 steps from the same weights (whose
#     losses match the run's). Resuming with train.steps = 4, from "latest" on tp = 2 x
#     dp = 2 (ZeRO-1) and from the step directory on the writing grid, runs only step 3,
#     whose loss is torch's loss of step 3's batch from the checkpoint within relative 1e-5.
# Skipped (77) when /usr/bin/python3 cannot import torch.
source "$(dirname "$0")/lib.sh"

require_torch
REF="$SRC/tests/torch_gpt2.py"

make_corpus "$TMP/train.bin"
L=2 H=2 C=64 V=256 T=32 B=16
model=(--n-layer "$L" --n-head "$H" --n-embd "$C" --vocab "$V" --seq-len "$T")
common=(train "$SRC/configs/tiny.cfg" --set "data.train=\"$TMP/train.bin\"" --set 'data.val=""'
        --set data.shuffle=false  # torch_*.py reads the batch rule's unshuffled stream order
        --set train.threads=1 --set log.progress=false --set "train.global_batch=$B"
        --set "model.n_layer=$L" --set "model.n_head=$H" --set "model.n_embd=$C"
        --set "model.vocab_size=$V" --set "model.seq_len=$T")

# ---- a. torch's weights through model.init ----------------------------------------------
# A text file of 1300 bytes (read as byte tokens) has S = 40 windows of T + 1 = 33, so
# with B = 16 step 2 wraps around (windows 32..39, 0..7) and step 5 repeats step 0.
head -c 1300 "$TMP/corpus.txt" >"$TMP/small.txt"
steps_a=(--step 0 --step 1 --step 2 --step 3 --step 4 --step 5)
# init and loss in one python process (tests/torch_common.py run_commands: importing torch
# takes seconds of CPU); either one failing fails the call.
if "$PY" "$REF" --out "$TMP/init.out" init "$TMP/w.safetensors" "${model[@]}" --seed 7 :: \
     --out "$TMP/torch_a.out" loss "$TMP/w.safetensors" "${model[@]}" --data "$TMP/small.txt" \
     --batch "$B" "${steps_a[@]}" >"$TMP/torch_cmds.out" 2>&1; then
  pass
  # run_a NAME NP STEPS SETS...: a model.init run of STEPS steps on one grid against
  # torch's loss of every step
  run_a() {
    local name="$1" np="$2" steps="$3" s m; shift 3
    m="$TMP/a_${name//[^a-z0-9]/_}.jsonl"
    if run_np "$np" "${common[@]}" --set "data.train=\"$TMP/small.txt\"" \
        --set "model.init=\"$TMP/w.safetensors\"" --set train.steps="$steps" \
        --set "log.metrics=\"$m\"" "$@"; then
      pass
      if [ "$(losses "$m" | wc -l)" -ne "$steps" ]; then fail "$name: expected $steps steps in $m"; fi
      for s in $(grep -o '"step":[0-9]*,"loss"' "$m" | tr -dc '0-9\n'); do
        close_to_torch "model.init, $name, step $s" "$(loss_at "$m" "$s")" "$(torch_loss "$TMP/torch_a.out" "$s")"
      done
    else
      fail "model.init run, $name"; sed 's/^/    /' "$TMP/err" >&2
    fi
  }
  run_a "1 rank" 1 1
  run_a "tp=2" 2 1 --set parallel.tp=2
  run_a "pp=2" 2 1 --set parallel.pp=2
  # lr 1e-30 and no weight decay leave the weights as loaded (every parameter of the
  # file is far from 0), so every step's loss is torch's loss of that step's batch.
  run_a "dp=2, lr 1e-30" 2 6 --set parallel.dp=2 --set train.lr=1e-30 --set train.min_lr=0 \
    --set train.weight_decay=0
else
  fail "torch_gpt2.py init/loss"; sed 's/^/    /' "$TMP/torch_cmds.out" "$TMP/init.out" "$TMP/torch_a.out" >&2
fi

# ---- b. a distributed checkpoint into torch ---------------------------------------------
# Starts from torch's weights so that torch can replay the 3 AdamW steps and check the
# saved moments (and the 3 losses) too.
ck="$TMP/ck"
hp=(--set train.lr=1e-3 --set train.min_lr=1e-4 --set train.warmup=20 --set train.weight_decay=0.1
    --set train.beta1=0.9 --set train.beta2=0.95 --set train.eps=1e-8 --set train.grad_clip=1.0)
hp_torch=(--lr 1e-3 --min-lr 1e-4 --warmup 20 --weight-decay 0.1 --beta1 0.9 --beta2 0.95
          --eps 1e-8 --grad-clip 1.0)
if run_np 4 "${common[@]}" "${hp[@]}" --set parallel.pp=2 --set parallel.dp=2 --set parallel.zero=1 \
    --set parallel.micro_batch=4 --set "model.init=\"$TMP/w.safetensors\"" \
    --set "checkpoint.dir=\"$ck\"" --set train.steps=3 --set "log.metrics=\"$TMP/b_write.jsonl\""; then
  pass
  step_dir="$ck/step_00000003"
  if [ -f "$ck/latest" ]; then
    named=$(tr -d '[:space:]' <"$ck/latest")
    case "$named" in /*) ;; *) named="$ck/$named" ;; esac
    if [ "$(cd "$named" 2>/dev/null && pwd -P)" = "$(cd "$step_dir" 2>/dev/null && pwd -P)" ]; then pass
    else fail "$ck/latest names '$(cat "$ck/latest")', expected step_00000003"; fi
  else
    fail "no $ck/latest after 3 steps"
  fi
  expect_step_files "$step_dir"

  # torch: load model.safetensors (strict, tied), check optimizer.safetensors's names and
  # shapes, replay the 3 steps with torch.optim.AdamW from the same weights and compare the
  # moments, and compute step 3's loss
  torch_replay_ckpt "pp=2 x dp=2 zero=1" "$step_dir" "$TMP/w.safetensors" 3 "$TMP/b_write.jsonl" \
    "${model[@]}" --data "$TMP/train.bin" --batch "$B" --step 3 --train-steps 3 "${hp_torch[@]}"
  want=$(torch_loss "$TMP/torch_b.out" 3)

  # resume_b NAME SETS...: resume and compare step 3's loss with torch's (one step more,
  # on the saved run's schedule: its hyperparameters, and its 3-step decay kept)
  resume_b() {
    local name="$1"; shift
    if run_np 4 "${common[@]}" "${hp[@]}" --set train.lr_decay_steps=3 --set parallel.dp=2 \
        --set parallel.zero=1 --set parallel.micro_batch=4 \
        --set train.steps=4 --set "log.metrics=\"$TMP/b_$name.jsonl\"" "$@"; then
      pass
      if [ -n "$(loss_at "$TMP/b_$name.jsonl" 2)" ]; then fail "$name: the resumed run reran step 2"; fi
      close_to_torch "$name" "$(loss_at "$TMP/b_$name.jsonl" 3)" "$want"
    else
      fail "$name"; sed 's/^/    /' "$TMP/err" >&2
    fi
  }
  # from latest on another grid (this run saves step_00000004 next to step_00000003,
  # keep = 2), then from the step directory itself on the writing grid
  resume_b "resume from latest on tp=2 x dp=2" --set parallel.tp=2 \
    --set "checkpoint.dir=\"$ck\"" --set 'checkpoint.load="latest"'
  resume_b "resume from step_00000003 on pp=2 x dp=2" --set parallel.pp=2 \
    --set "checkpoint.load=\"$step_dir\""
else
  fail "train 3 steps with checkpoint.dir on pp=2 x dp=2, zero=1"; sed 's/^/    /' "$TMP/err" >&2
fi
finish
