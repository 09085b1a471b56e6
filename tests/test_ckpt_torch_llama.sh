# Tessera's llama against PyTorch: Hugging Face's LlamaForCausalLM written out in plain
# torch (tests/torch_llama.py; tests/check_llama_hf.py checks it against transformers)
# gives Tessera's loss for the same weights and batch. A grouped-query shape: 4 query
# heads sharing 2 key/value heads, SwiGLU width 96, lm_head untied.
#  a. Random llama weights written by torch (HF names), loaded with model.init: the step-0
#     loss on 1 rank, tp = 2 (a key/value head per rank), tp = 4 (each key/value head on
#     two ranks) and pp = 2, equals torch's loss of that batch (batch rule) within
#     relative 1e-5; so do tied embeddings (tie_embeddings, no lm_head.weight in the file)
#     on 1 rank and tp = 2, and Llama 3.1's rope scaling on 1 rank.
#  b. 3 steps from those weights on pp = 2 x tp = 2 with checkpoint.dir write
#     step_00000003. Torch loads its model.safetensors with load_state_dict strict (HF
#     names); optimizer.safetensors holds exp_avg.<name> and exp_avg_sq.<name> of every
#     parameter in its shape, equal (relative L2 1e-4) to torch.optim.AdamW's state after
#     replaying the 3 steps from the same weights (whose losses match the run's).
#     Resuming from it on 1 rank runs only step 3, whose loss is torch's loss of step 3's
#     batch from the checkpoint within relative 1e-5.
# Skipped (77) when /usr/bin/python3 cannot import torch.
source "$(dirname "$0")/lib.sh"

require_torch
REF="$SRC/tests/torch_llama.py"

make_corpus "$TMP/train.bin"
L=2 H=4 KV=2 C=64 F=96 V=256 T=32 B=16 THETA=10000
model=(--n-layer "$L" --n-head "$H" --n-kv-head "$KV" --n-embd "$C" --ffn-hidden "$F"
       --vocab "$V" --seq-len "$T" --rope-theta "$THETA")
common=(train "$SRC/configs/tiny.cfg" --set "data.train=\"$TMP/train.bin\"" --set 'data.val=""'
        --set data.shuffle=false  # torch_*.py reads the batch rule's unshuffled stream order
        --set train.threads=1 --set log.progress=false --set "train.global_batch=$B"
        --set 'model.arch="llama"' --set "model.n_layer=$L" --set "model.n_head=$H"
        --set "model.n_kv_head=$KV" --set "model.n_embd=$C" --set "model.ffn_hidden=$F"
        --set "model.vocab_size=$V" --set "model.seq_len=$T" --set "model.rope_theta=$THETA")

# ---- a. torch's weights through model.init ----------------------------------------------
# torch_case TAG TORCH_FLAGS...: torch is to write random weights $TMP/w_TAG.safetensors
# and print step 0's loss into $TMP/torch_TAG.out. The cases run together, in one python
# process (tests/torch_common.py run_commands: its import of torch takes seconds of CPU,
# each case a fraction of one); init_case TAG then passes if that case's weights and loss
# are there, or fails with its output and returns non-zero.
# q_proj and k_proj are drawn at std 0.3, not 0.02, so that the attention is peaked and
# the rotary embedding matters: here Llama 3.1's scaling moves the loss by 7e-4 and
# rope_theta 1e6 instead of 1e4 by 3e-4 (relative), far above the 1e-5 tolerance.
torch_cmds=()
torch_case() {
  local tag="$1"; shift
  torch_cmds+=(--out "$TMP/init_$tag.out" init "$TMP/w_$tag.safetensors" "${model[@]}" --seed 7
               --qk-std 0.3 "$@" ::
               --out "$TMP/torch_$tag.out" loss "$TMP/w_$tag.safetensors" "${model[@]}" "$@"
               --data "$TMP/train.bin" --batch "$B" --step 0 ::)
}
torch_case untied
torch_case tied --tie
# Llama 3.1's scaling with an original context of 32: at head dimension 16 and theta
# 10000 the three frequency bands (kept, interpolated, divided by 8) all occur
torch_case scaled --rope-scaling 8 --rope-original-context 32
"$PY" "$REF" "${torch_cmds[@]}" >"$TMP/torch_cases.out" 2>&1 && pass ||
  { fail "torch_llama.py: a case failed"; sed 's/^/    /' "$TMP/torch_cases.out" >&2; }
init_case() {
  local tag="$1"
  if [ -s "$TMP/w_$tag.safetensors" ] && grep -q '^step 0 loss_f32 ' "$TMP/torch_$tag.out"; then
    pass
  else
    fail "torch_llama.py init/loss ($tag)"
    sed 's/^/    /' "$TMP/init_$tag.out" "$TMP/torch_$tag.out" >&2 2>/dev/null
    return 1
  fi
}

# run_a TAG NAME NP SETS...: a one-step model.init run of weights TAG on one grid against
# torch's step-0 loss
run_a() {
  local tag="$1" name="$2" np="$3" m; shift 3
  m="$TMP/a_${tag}_${name//[^a-z0-9]/_}.jsonl"
  if run_np "$np" "${common[@]}" --set "model.init=\"$TMP/w_$tag.safetensors\"" \
      --set train.steps=1 --set "log.metrics=\"$m\"" "$@"; then
    pass
    close_to_torch "model.init, $tag, $name" "$(loss_at "$m" 0)" "$(torch_loss "$TMP/torch_$tag.out" 0)"
  else
    fail "model.init run, $tag, $name"; sed 's/^/    /' "$TMP/err" >&2
  fi
}

if init_case untied; then
  run_a untied "1 rank" 1
  run_a untied "tp=2" 2 --set parallel.tp=2
  run_a untied "tp=4 (kv heads replicated)" 4 --set parallel.tp=4
  run_a untied "pp=2" 2 --set parallel.pp=2
fi
if init_case tied; then
  run_a tied "1 rank" 1 --set model.tie_embeddings=true
  run_a tied "tp=2" 2 --set model.tie_embeddings=true --set parallel.tp=2
fi
if init_case scaled; then
  run_a scaled "1 rank" 1 --set model.rope_scaling=8 --set model.rope_original_context=32
fi

# ---- b. a distributed checkpoint into torch ---------------------------------------------
ck="$TMP/ck"
hp=(--set train.lr=1e-3 --set train.min_lr=1e-4 --set train.warmup=20 --set train.weight_decay=0.1
    --set train.beta1=0.9 --set train.beta2=0.95 --set train.eps=1e-8 --set train.grad_clip=1.0
    --set train.lr_decay_steps=100)
hp_torch=(--lr 1e-3 --min-lr 1e-4 --warmup 20 --train-steps 100 --weight-decay 0.1 --beta1 0.9
          --beta2 0.95 --eps 1e-8 --grad-clip 1.0)
if [ -f "$TMP/w_untied.safetensors" ] &&
   run_np 4 "${common[@]}" "${hp[@]}" --set parallel.pp=2 --set parallel.tp=2 \
    --set parallel.micro_batch=4 --set "model.init=\"$TMP/w_untied.safetensors\"" \
    --set "checkpoint.dir=\"$ck\"" --set train.steps=3 --set "log.metrics=\"$TMP/b_write.jsonl\""; then
  pass
  step_dir="$ck/step_00000003"
  expect_step_files "$step_dir"
  # torch: load model.safetensors strict, check optimizer.safetensors's names and shapes,
  # replay the 3 steps with torch.optim.AdamW from the same weights and compare the
  # moments, and compute step 3's loss
  torch_replay_ckpt "pp=2 x tp=2" "$step_dir" "$TMP/w_untied.safetensors" 3 "$TMP/b_write.jsonl" \
    "${model[@]}" --data "$TMP/train.bin" --batch "$B" --step 3 "${hp_torch[@]}"
  if run_np 1 "${common[@]}" "${hp[@]}" --set parallel.micro_batch=4 --set train.steps=4 \
      --set "checkpoint.load=\"$step_dir\"" --set "log.metrics=\"$TMP/b_resume.jsonl\""; then
    pass
    if [ -n "$(loss_at "$TMP/b_resume.jsonl" 2)" ]; then fail "the resumed run reran step 2"; fi
    close_to_torch "resume from step_00000003 on 1 rank, step 3" "$(loss_at "$TMP/b_resume.jsonl" 3)" \
      "$(torch_loss "$TMP/torch_b.out" 3)"
  else
    fail "resume from $step_dir on 1 rank"; sed 's/^/    /' "$TMP/err" >&2
  fi
else
  fail "train 3 steps with checkpoint.dir on pp=2 x tp=2"; sed 's/^/    /' "$TMP/err" >&2
fi
finish
