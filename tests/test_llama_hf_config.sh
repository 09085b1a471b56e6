# model.init reads the Hugging Face config.json beside the weights (a Llama's): a model
# key the config sets must agree with it (the error names the config key and the HF key
# with both values), and a model key the config leaves unset takes config.json's value,
# so a config naming only model.init trains exactly as the one repeating every shape.
# The weights: a step directory Tessera saved for a Llama of 8 heads of 16 (4 key/value
# heads), rope_theta 500000 and rms_norm_eps 1e-2, whose tensors have the same shapes as
# llama-tiny.cfg's 4 heads of 32 (2 key/value heads): only config.json tells them apart.
source "$(dirname "$0")/lib.sh"

make_corpus "$TMP/train.bin"
C="$SRC/configs/llama-tiny.cfg"
q=(--set "data.train=\"$TMP/train.bin\"" --set 'data.val=""' --set data.eval_every=0
   --set log.progress=false --set train.threads=1)
shape=(--set model.n_layer=2 --set model.n_head=8 --set model.n_kv_head=4 --set model.ffn_hidden=256
       --set model.rope_theta=500000.0 --set model.norm_eps=1e-2)
HF="$TMP/ck/step_00000000"
if run_one train "$C" "${q[@]}" "${shape[@]}" --set train.steps=0 --set "checkpoint.dir=\"$TMP/ck\"" \
     --set 'log.metrics=""' && [ -s "$HF/config.json" ]; then pass
else fail "saving the Llama whose config.json the cases read"; sed 's/^/    /' "$TMP/err" >&2; fi
init=(--set "model.init=\"$HF\"")
# A config that gives no model key but model.init (and seq_len).
cat > "$TMP/bare.cfg" <<EOF
model = { init = "$HF"; seq_len = 64; };
parallel = { micro_batch = 4; };
train = { global_batch = 16; steps = 3; lr = 1e-3; warmup = 1; };
EOF

# Disagreements, each naming both keys and both values.
expect_error --rc 1 --one-error 0 "config.json gives num_attention_heads = 8, but the config sets model.n_head = 4" \
  train "$C" "${q[@]}" --set model.n_layer=2 --set model.ffn_hidden=256 "${init[@]}"
expect_error --rc 1 --one-error 0 "gives rope_theta = 500000, but the config sets model.rope_theta = 10000" \
  train "$C" "${q[@]}" "${shape[@]}" --set model.rope_theta=10000.0 "${init[@]}"
expect_error --rc 1 --one-error 0 "gives rms_norm_eps = 0.01, but the config sets model.norm_eps = 1e-05" \
  train "$C" "${q[@]}" "${shape[@]}" --set model.norm_eps=1e-5 "${init[@]}"
expect_error --rc 1 --one-error 0 "gives tie_word_embeddings = false, but the config sets model.tie_embeddings = true" \
  train "$C" "${q[@]}" "${shape[@]}" --set model.tie_embeddings=true "${init[@]}"
expect_error --rc 1 --one-error 0 "gives model_type = \"llama\", but the config sets model.arch = \"gpt2\"" \
  train "$SRC/configs/tiny.cfg" "${q[@]}" "${init[@]}"

# A hand-edited config.json (beside the weights file this time): a head_dim that is not
# hidden_size / num_attention_heads (model.head_dim takes it, and the weights, saved with
# heads of 16, then have the wrong shapes; a config setting head_dim otherwise disagrees),
# and a rope scaling Tessera does not implement.
edit() { # edit DIR PYTHON: DIR/ = the weights and config.json with PYTHON applied to c
  mkdir -p "$1" && ln -sf "$HF/model.safetensors" "$1/model.safetensors"
  python3 -c "import json,sys; c=json.load(open(sys.argv[1])); $2; json.dump(c, open(sys.argv[2],'w'))" \
    "$HF/config.json" "$1/config.json"
}
edit "$TMP/hd" 'c["head_dim"] = 32'
expect_error --rc 1 --one-error 0 "self_attn.q_proj.weight" \
  train "$TMP/bare.cfg" "${q[@]}" --set "model.init=\"$TMP/hd/model.safetensors\""
expect_error --rc 1 --one-error 0 "config.json gives head_dim = 32, but the config sets model.head_dim = 16" \
  train "$TMP/bare.cfg" "${q[@]}" --set model.head_dim=16 --set "model.init=\"$TMP/hd/model.safetensors\""
edit "$TMP/yarn" 'c["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}'
expect_error --rc 1 --one-error 0 "rope_scaling type \"yarn\" is not one Tessera implements" \
  train "$TMP/bare.cfg" "${q[@]}" --set "model.init=\"$TMP/yarn\""

# Filled: the bare config trains as the run that sets every key, loss for loss. Also from transformers 5's layout, whose
# rope_theta moved into rope_parameters.
edit "$TMP/v5" 'c["rope_parameters"] = {"rope_type": "default", "rope_theta": c.pop("rope_theta")}; c.pop("rope_scaling")'
run3() { # run3 NAME ARGS...: 3 steps, metrics in $TMP/NAME.jsonl
  local name="$1"; shift
  if run_one train "$@" "${q[@]}" --set train.steps=3 --set train.lr=1e-3 --set train.warmup=1 \
       --set "log.metrics=\"$TMP/$name.jsonl\""; then pass
  else fail "training $name"; sed 's/^/    /' "$TMP/err" >&2; fi
}
run3 explicit "$C" "${shape[@]}" "${init[@]}"
run3 filled "$TMP/bare.cfg"
run3 filled_v5 "$TMP/bare.cfg" --set "model.init=\"$TMP/v5\""
for name in filled filled_v5; do
  if [ -n "$(losses "$TMP/explicit.jsonl")" ] && [ "$(losses "$TMP/$name.jsonl")" = "$(losses "$TMP/explicit.jsonl")" ]; then pass
  else fail "$name: losses $(losses "$TMP/$name.jsonl" | tr '\n' ' ')differ from the explicit run's $(losses "$TMP/explicit.jsonl" | tr '\n' ' ')"; fi
done
# Without model.init's config.json the defaults hold (random init; nothing read).
run3 plain "$C"

# DeepSeek-V3 (tests/fixtures/deepseek_tiny: transformers' save_pretrained of a
# DeepseekV3ForCausalLM with MLA, YaRN and DeepSeekMoE with non-zero biases) as model.init
# from a config naming nothing else of the model. The checkpoint Tessera writes holds
# DeepseekV3ForCausalLM's config.json and the MoE biases as e_score_correction_bias
# tensors, so model.init of the step directory continues with the very weights and
# biases a resume has: the same loss, bit for bit, on a corpus of 4 windows (every
# step's batch the same).
printf 'THE QUICK BROWN FOX 0123456789 JUMPS OVER THE LAZY DOG 98765432 AB' > "$TMP/ds.txt"
cat > "$TMP/ds.cfg" <<EOF
model = { init = "$SRC/tests/fixtures/deepseek_tiny"; seq_len = 16; };
data = { train = "$TMP/ds.txt"; val = ""; eval_every = 0; shuffle = false; };
train = { global_batch = 4; lr = 1e-2; warmup = 1; lr_decay_steps = 4; moe_bias_rate = 0.01; };
log = { progress = false; };
EOF
DS="$TMP/dsck/step_00000002"
if run_one train "$TMP/ds.cfg" --set train.steps=2 --set "checkpoint.dir=\"$TMP/dsck\"" \
     --set 'log.metrics=""' && grep -q '"model_type": "deepseek_v3"' "$DS/config.json"; then pass
else fail "training and saving the DeepSeek fixture"; sed 's/^/    /' "$TMP/err" >&2; fi
if run_one ckpt verify "$DS" && grep -q "every checksum matches" "$TMP/out" && run_one ckpt info "$DS" &&
   [ "$(grep -c 'mlp.gate.e_score_correction_bias  *F32 \[8\]' "$TMP/out")" = 2 ]; then pass
else fail "the DeepSeek checkpoint: verify, or its 2 bias tensors"; cat "$TMP/out" "$TMP/err" | sed 's/^/    /' >&2; fi
run_one train "$TMP/ds.cfg" --set train.steps=3 --set "checkpoint.load=\"$DS\"" \
  --set "log.metrics=\"$TMP/ds_resume.jsonl\"" || { fail "resuming the DeepSeek checkpoint"; sed 's/^/    /' "$TMP/err" >&2; }
run_one train "$TMP/ds.cfg" --set "model.init=\"$DS\"" --set train.steps=1 \
  --set "log.metrics=\"$TMP/ds_init.jsonl\"" || { fail "model.init of the DeepSeek checkpoint"; sed 's/^/    /' "$TMP/err" >&2; }
resumed="$(loss_at "$TMP/ds_resume.jsonl" 2)" inited="$(loss_at "$TMP/ds_init.jsonl" 0)"
if [ -n "$resumed" ] && [ "$resumed" = "$inited" ]; then pass
else fail "the DeepSeek checkpoint as model.init: step 0 loss $inited, the resume's step 2 $resumed"; fi

finish
