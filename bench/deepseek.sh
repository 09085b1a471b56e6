#!/usr/bin/env bash
# DeepSeek-V3 on one rank (issue 41, "Speed and memory"). Three parts:
# 1. MLA's KV memory per token against GQA's and MHA's at the same heads, on paper: per
#    layer and token MLA caches kv_lora_rank + qk_rope_head_dim values (the latent and the
#    shared rope key), MHA 2 n_head head_dim, GQA 2 n_kv_head head_dim; DeepSeek-V3's shapes
#    (128 heads, 512 + 64 against heads of 128: DeepSeek-V2's comparison) and this model's.
# 2. The activation bytes training keeps, measured: the engine's allocated activation sets
#    (the metrics' activation_mb, from the same layout the memory estimate sizes) at
#    2 x L layers less those at L, over L: one MoE block's bytes (the embedding, the dense
#    first block and the head cancel), per token, for the MLA model
#    (configs/deepseek-4l.cfg) and its twins with the same 8 query heads of 64 and the same
#    MoE (configs/deepseek-4l-gqa.cfg: 2 key/value heads; and 8: MHA), recompute none and
#    selective; and each L-layer run's pre-flight estimate (estimate_mb) against its true
#    peak resident set (/usr/bin/time -v).
# 3. The step: Tessera's MLA model (fp32; bf16 where the CPU has AVX512_BF16 or AMX-BF16;
#    with MTP=1 also model.mtp_layers = 1) and its GQA twin, against Hugging Face's own
#    DeepseekV3ForCausalLM at the same shape (bench/torch_deepseek.py, transformers and
#    PyTorch 2 from scripts/peer_venv.sh) in fp32 and bf16 autocast, eager and
#    torch.compile, and eager with transformers' grouped_mm experts. One process at a
#    time, next to the GEMM ceilings measured in the same run (OpenBLAS sgemm for fp32
#    rows, oneDNN's bf16 GEMM for bf16 rows): ms/step, tok/s, MFU on active FLOPs, peak
#    RSS; then each Tessera run's estimate and `tessera plan`'s against its true peak.
# The shape (configs/deepseek-4l.cfg): 4 layers, 512 wide, 8 heads, q_lora 192, kv_lora 64,
# qk 32 + 32 (rope), v 64; block 0 a dense SwiGLU of 1536, blocks 1-3 a sigmoid router over
# 8 experts of 512 in 2 groups (the best 1 group), top-2 x 2.5, one shared expert;
# vocabulary 32000, untied head; T 512, B 2, 2 threads. Neither side balances the routing
# (no aux loss, the bias not updated), so both do the same work.
#
# Usage: bench/deepseek.sh [ROUNDS]      (run from anywhere; ROUNDS default 1)
#   BUILD=DIR       Tessera build folder (default build/; scripts/build.sh runs in it)
#   PEER_PY=PATH    the PyTorch 2 python with transformers (default: scripts/peer_venv.sh's)
#   PEER=0          no Hugging Face rows; PEER_GROUPED=0 no grouped_mm rows
#   BF16=0|1        Tessera's bf16 rows (default: where the CPU has AVX512_BF16 or AMX-BF16;
#                   elsewhere tessera refuses bf16, and the rows say so)
#   PEER_BF16=0|1   PyTorch's bf16 rows (default: BF16's value)
#   FP32=0          skip the fp32 rows (Tessera's and PyTorch's)
#   MTP=1           also Tessera's MLA model with model.mtp_layers = 1 (HF's model has no MTP)
#   ACT=0           skip part 2 (the activation runs); ONLY_ACT=1: parts 1 and 2 only
#   KEEP=DIR        keep the runs' metrics, JSON and /usr/bin/time reports there
#   L= C= H= QL= KVL= NOPE= ROPE= VD= E= K= FE= S= G= TG= FD= V= T= B=   the shape (default
#                   4 512 8 192 64 32 32 64 8 2 512 1 2 1 1536 32000 512 2); KV= the GQA
#                   twin's key/value heads (default 2)
#   STEPS=, WARMUP= timed steps (default 3) and PyTorch's untimed warm-up steps (default 2)
#   QUIET_S=        seconds to wait for a quiet machine before each run (default 60)
#
# A run's ms/step is its median over the timed steps: Tessera runs STEPS + 1 steps and
# times steps 1.. (step 0 page-faults its buffers); PyTorch runs WARMUP untimed steps
# (torch.compile compiles in the first) and times STEPS. Each run waits for a quiet machine
# and is repeated once if other processes took more than 10% of the CPUs
# (bench/lib_parallel.sh); the share they took is in the table.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
rounds="${1:-1}"
threads=2
command="bench/deepseek.sh $*"
build="${BUILD:-$root/build}"
source "$root/bench/lib_parallel.sh"
source "$root/bench/lib_step.sh"
bench_setup
only_act="${ONLY_ACT:-0}"
run_peer="${PEER:-1}"
[ "$only_act" = 1 ] && run_peer=0
peer_py=""
[ "$run_peer" = 0 ] || peer_py="${PEER_PY:-$(scripts/peer_venv.sh)}"
command -v /usr/bin/time > /dev/null || { echo "bench/deepseek.sh: needs /usr/bin/time (apt-get install time)" >&2; exit 2; }

L="${L:-4}" C="${C:-512}" H="${H:-8}" QL="${QL:-192}" KVL="${KVL:-64}" NOPE="${NOPE:-32}"
ROPE="${ROPE:-32}" VD="${VD:-64}" E="${E:-8}" K="${K:-2}" FE="${FE:-512}" S="${S:-1}"
G="${G:-2}" TG="${TG:-1}" FD="${FD:-1536}" V="${V:-32000}" T="${T:-512}" B="${B:-2}"
KV="${KV:-2}"
STEPS="${STEPS:-3}" WARMUP="${WARMUP:-2}" QUIET_S="${QUIET_S:-60}"
tokens=$((B * T))
HS=$((C / H))   # the twins' head size (MLA's q/k head: NOPE + ROPE, its v head: VD)
run_bf16="${BF16:-$has_bf16}"
run_fp32="${FP32:-1}"
run_mtp="${MTP:-0}"

# ---- FLOPs --------------------------------------------------------------------------
# active_flops_per_token ATT_PARAMS ATT_QKV: bench/moe.sh's count (6 per parameter in a
# matmul, the untied head's GEMM counts, the embedding lookup does not; the norms' weights
# as moe.sh counts them) with a block's attention parameters ATT_PARAMS and its attention
# FLOPs 6 x T x H x (qk head + v head) per layer and token (QK^T and PV over the full T,
# forward and backward: bench/lib_parallel.sh's 12 L T C when both heads are C / H wide);
# ATT_QKV = H x (qk head + v head). MLP: block 0..FIRST-1 the dense SwiGLU's 3 x FD x C,
# the others the router's E x C and the K routed and S shared experts' 3 x FE x C each.
# MTP_LAYERS > 0 (third argument): each module's eh_proj (2C x C), its two norms, one MoE
# block and the shared head's norm and GEMM again (DeepSeek-V3 sec. 2.2).
active_flops_per_token() {
  awk -v L="$L" -v C="$C" -v V="$V" -v T="$T" -v FD="$FD" -v E="$E" -v K="$K" -v FE="$FE" \
      -v S="$S" -v att="$1" -v qkv="$2" -v D="${3:-0}" 'BEGIN {
    moe = E * C + (K + S) * 3 * FE * C
    blk_att = att + 2 * C
    p = blk_att + 3 * FD * C + (L - 1) * (blk_att + moe) + C + V * C
    p += D * (2 * C * C + 2 * C + blk_att + moe + C + V * C)
    printf "%.0f", 6 * p + 6 * T * qkv * (L + D) }'
}
# MLA's attention parameters a block: q_a (C x QL) + its norm + q_b (QL x H (NOPE+ROPE)),
# or q (C x H (NOPE+ROPE)) when QL = 0; kv_a (C x (KVL+ROPE)) + its norm + kv_b
# (KVL x H (NOPE+VD)); o (H VD x C)
mla_att=$(awk -v C="$C" -v H="$H" -v QL="$QL" -v KVL="$KVL" -v N="$NOPE" -v R="$ROPE" -v VD="$VD" 'BEGIN {
  q = (QL > 0) ? C * QL + QL + QL * H * (N + R) : C * H * (N + R)
  printf "%.0f", q + C * (KVL + R) + KVL + KVL * H * (N + VD) + H * VD * C }')
gqa_att() { echo $((C * H * HS + 2 * C * $1 * HS + H * HS * C)); }
mla_f=$(active_flops_per_token "$mla_att" $((H * (NOPE + ROPE + VD))))
mtp_f=$(active_flops_per_token "$mla_att" $((H * (NOPE + ROPE + VD))) 1)
gqa_f=$(active_flops_per_token "$(gqa_att "$KV")" $((H * 2 * HS)))

shape_sets=(--set model.n_layer="$L" --set model.n_embd="$C" --set model.n_head="$H"
            --set model.vocab_size="$V" --set model.seq_len="$T" --set model.ffn_hidden="$FD"
            --set model.moe_experts="$E" --set model.moe_top_k="$K" --set model.moe_ffn_hidden="$FE"
            --set model.moe_shared_experts="$S" --set model.moe_groups="$G"
            --set model.moe_topk_groups="$TG")
mla_sets=(configs/deepseek-4l.cfg "${shape_sets[@]}" --set model.q_lora_rank="$QL"
          --set model.kv_lora_rank="$KVL" --set model.qk_nope_head_dim="$NOPE"
          --set model.qk_rope_head_dim="$ROPE" --set model.v_head_dim="$VD")
gqa_sets=(configs/deepseek-4l-gqa.cfg "${shape_sets[@]}" --set model.n_kv_head="$KV")
mha_sets=(configs/deepseek-4l-gqa.cfg "${shape_sets[@]}" --set model.n_kv_head="$H")

# The step runs (bench/lib_step.sh); the peer is transformers' DeepseekV3ForCausalLM at
# the same shape
peer_script=bench/torch_deepseek.py
peer_args=(--n_layer "$L" --n_embd "$C" --n_head "$H" --q_lora_rank "$QL" --kv_lora_rank "$KVL"
           --qk_nope_head_dim "$NOPE" --qk_rope_head_dim "$ROPE" --v_head_dim "$VD"
           --experts "$E" --top_k "$K" --moe_ffn_hidden "$FE" --shared_experts "$S"
           --groups "$G" --topk_groups "$TG" --route_scale 2.5 --first_dense 1
           --ffn_hidden "$FD" --vocab_size "$V")

machine_header
echo

# ---- 1. KV memory per token, on paper ---------------------------------------------------
# kv_row LABEL LAYERS H HEAD KVH KVL ROPE BYTES: values a layer keeps per token for MLA
# (KVL + ROPE), GQA with KVH key/value heads (2 KVH HEAD) and MHA (2 H HEAD), and the
# whole model's bytes per token at BYTES an element
kv_row() {
  awk -v n="$1" -v l="$2" -v h="$3" -v hd="$4" -v g="$5" -v c="$6" -v r="$7" -v by="$8" 'BEGIN {
    mla = c + r; gqa = 2 * g * hd; mha = 2 * h * hd
    printf "| %s | %d | %d | %d (%.1fx MLA) | %d (%.1fx MLA) | %.1f / %.1f / %.1f KiB |\n",
      n, l, mla, gqa, gqa / mla, mha, mha / mla, l * mla * by / 1024, l * gqa * by / 1024, l * mha * by / 1024 }'
}
echo "### 1. KV memory per token (what an inference cache keeps; values per layer and token)"
echo
echo "| model | layers | MLA: kv_lora_rank + qk_rope_head_dim | GQA: 2 x n_kv_head x head_dim | MHA: 2 x n_head x head_dim | whole model per token, MLA / GQA / MHA |"
echo "|---|---|---|---|---|---|"
kv_row "DeepSeek-V3 (128 heads; MLA 512 + 64; GQA 8 groups, heads of 128; bf16)" 61 128 128 8 512 64 2
kv_row "Kimi K2 (64 heads; MLA 512 + 64; GQA 8 groups, heads of 128; bf16)" 61 64 128 8 512 64 2
kv_row "this model (8 heads; MLA $KVL + $ROPE; GQA $KV groups, heads of $HS; fp32)" "$L" "$H" "$HS" "$KV" "$KVL" "$ROPE" 4
echo
echo "MLA's cache holds the normalised latent and the rope key once per token (transformers' DeepseekV3Attention caches exactly these, \"while latent KV is still compressed\"); each head's k_nope and v are kv_b_proj of it, absorbed into the query and output projections at inference. DeepSeek-V2 (arXiv 2405.04434, its table comparing the KV cache per token) sets MLA's (d_c + d_h^R) = 9/2 d_h per layer against MHA's 2 n_h d_h, GQA's 2 n_g d_h and MQA's 2 d_h, \"equal to GQA with only 2.25 groups\": at n_h = 128, d_h = 128 (V2's and V3's heads), 576 against MHA's 32768 (57x) and 8-group GQA's 2048 (3.6x)."
echo

# ---- 2. Activation bytes training keeps, measured ---------------------------------------
# act_run NAME LAYERS SETS...: one step (STEPS=0 is not a step); the metrics'
# activation_mb and estimate_mb, /usr/bin/time's true peak
act_run() {
  local name="$1" layers="$2" m="$tmp/$1.metrics.jsonl"; shift 2
  rm -f "$m"
  mpirun -np 1 --bind-to none /usr/bin/time -o "$tmp/$name.time" -v "$build/tessera" train "$@" \
    --set model.n_layer="$layers" \
    --set parallel.micro_batch="$B" --set train.global_batch="$B" \
    --set 'data.train="data/fortunes_train.bin"' --set 'data.val=""' \
    --set train.steps=2 --set train.threads="$threads" --set data.eval_every=0 \
    --set "log.metrics=\"$m\"" > "$tmp/$name.out" 2> "$tmp/$name.err"
}
act_section() {
  local v r name sets rec
  local -a vs=(mla gqa mha)
  echo "### 2. Activation bytes a block keeps in training, measured (fp32, T $T, B $B)" >&2
  for v in "${vs[@]}"; do
    for rec in none selective; do
      case "$v" in mla) sets=("${mla_sets[@]}") ;; gqa) sets=("${gqa_sets[@]}") ;; mha) sets=("${mha_sets[@]}") ;; esac
      for r in "$L" $((2 * L)); do
        name="act_${v}_${rec}_$r"
        echo "  $name ..." >&2
        act_run "$name" "$r" "${sets[@]}" --set "parallel.recompute=\"$rec\"" ||
          { grep -m1 -i error "$tmp/$name.err" > "$tmp/$name.fail" || tail -1 "$tmp/$name.err" > "$tmp/$name.fail"; }
      done
    done
  done
  echo "### 2. Activation bytes a block keeps in training, measured (fp32, T $T, B $B: $tokens tokens)"
  echo
  echo "| attention | recompute | one MoE block (MiB): ${L} -> $((2 * L)) layers' activation_mb, / $L | per token (KiB) | vs MLA | its attention phase by the layout (KiB a token) | the rest: measured less the layout's attention (KiB a token) | whole run ($L layers): estimate_mb | true peak MiB (/usr/bin/time) | estimate / true |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  local label a1 a2 e t
  for rec in none selective; do
    for v in "${vs[@]}"; do
      case "$v" in mla) label="MLA (q_lora $QL, kv_lora $KVL, qk $NOPE+$ROPE, v $VD)" ;;
                   gqa) label="GQA ($H heads of $HS, $KV kv heads)" ;;
                   mha) label="MHA ($H heads of $HS)" ;; esac
      local n1="act_${v}_${rec}_$L" n2="act_${v}_${rec}_$((2 * L))"
      if [ ! -s "$tmp/$n1.metrics.jsonl" ] || [ ! -s "$tmp/$n2.metrics.jsonl" ] ||
         [ -s "$tmp/$n1.fail" ] || [ -s "$tmp/$n2.fail" ]; then
        printf '| %s | %s | n/a (%s) | | | | | | | |\n' "$label" "$rec" \
          "$(cat "$tmp/$n1.fail" "$tmp/$n2.fail" 2> /dev/null | head -1 | cut -c1-160 | tr '|' '/')"
        continue
      fi
      a1=$(mem_field "$tmp/$n1.metrics.jsonl" activation_mb); a2=$(mem_field "$tmp/$n2.metrics.jsonl" activation_mb)
      e=$(mem_field "$tmp/$n1.metrics.jsonl" estimate_mb); t=$(rss "$n1")
      echo "$a1 $a2" > "$tmp/act_${v}_${rec}.blk"
      awk -v n="$label" -v v="$v" -v rec="$rec" -v a1="$a1" -v a2="$a2" -v L="$L" -v tok="$tokens" \
          -v e="$e" -v t="$t" -v C="$C" -v H="$H" -v HS="$HS" -v KV="$KV" -v T="$T" -v QL="$QL" \
          -v KVL="$KVL" -v R="$ROPE" -v N="$NOPE" -v VD="$VD" \
          -v ref="$(cat "$tmp/act_mla_${rec}.blk" 2> /dev/null || true)" 'BEGIN {
        blk = (a2 - a1) / L; vs = ""
        if (ref != "") { split(ref, r, " "); rb = (r[2] - r[1]) / L; if (rb > 0) vs = sprintf("%.2fx", blk / rb) }
        # the attention phase a block keeps per token, in 4-byte elements (act_layout.h
        # BLOCK_ACTS and MLA_ACTS): the first norm and its rstd, the heads (GQA/MHA: q|k|v
        # after RoPE, also under selective; MLA: both latents before and after their
        # norms with their rstd, the rope key, and the assembled q|k|v, or under
        # selective only the q heads), the output before o_proj, the CPU softmax
        # [H, T] a token unless selective, the residual
        sel = (rec == "selective"); kvh = (v == "mha") ? H : KV
        a = C + 1 + ((v == "mla") ? H * VD : H * HS) + C + (sel ? 0 : H * T)
        if (v == "mla") {
          hs = N + R
          a += ((QL > 0) ? 2 * QL + 1 : 0) + 2 * KVL + 1 + R + (sel ? H * hs : H * (2 * hs + VD))
        } else a += (H + 2 * kvh) * HS
        att = a * 4 / 1024; per = blk * 1024 / tok
        printf "| %s | %s | %.2f | %.2f | %s | %.2f | %.2f | %.0f | %.0f | %.3f (%+.1f%%) |\n", n, rec, blk,
          per, vs, att, per - att, e, t, e / t, 100 * (e / t - 1) }'
    done
  done
  echo
  for v in "${vs[@]}"; do
    local b
    b=$(sed -n 's/^tessera: \(.*parameters.*\)$/\1/p' "$tmp/act_${v}_none_$L.err" 2> /dev/null | head -1)
    [ -z "$b" ] || echo "Tessera's $v model ($L layers): $b  "
  done
  echo
  echo "One block's bytes: the engine's allocated activation sets (activation_mb, rounded to 0.1 MiB: the block column is good to 0.03 MiB) at $((2 * L)) layers less those at $L, over $L (blocks 1.. are MoE blocks: the dense first block, the embedding and the head cancel). The layout's attention phase: src/model/act_layout.h's BLOCK_ACTS and MLA_ACTS lists for the attention (the first norm and its rstd; GQA/MHA q|k|v after RoPE, kept under selective too; MLA both latents before and after their norms with their rstd, the rope key, and the assembled per-head q|k|v, or under selective only the q heads, k and v rebuilt from the latent; the output before o_proj; the CPU softmax, $H x $T x 4 bytes = $((H * T * 4 / 1024)) KiB a token, unless selective; the residual), in 4-byte elements. The rest is the MoE block's MLP phase and output: the same in every row when the layout holds."
  echo
}

if [ "${ACT:-1}" != 0 ]; then act_section; fi
if [ "$only_act" = 1 ]; then echo "command: $command"; exit 0; fi

# ---- 3. The step against Hugging Face ----------------------------------------------------
no_fp32="skipped (FP32=0)"
runs=()
if [ "$run_fp32" != 0 ]; then
  runs+=(tessera_mla tessera_gqa)
  [ "$run_mtp" = 1 ] && runs+=(tessera_mla_mtp)
else
  for n in tessera_mla tessera_gqa tessera_mla_mtp hf_fp32 hf_fp32_compile hf_fp32_grouped; do echo "$no_fp32" > "$tmp/$n.fail"; done
fi
if [ "$run_bf16" = 1 ]; then
  runs+=(tessera_mla_bf16 tessera_gqa_bf16)
  [ "$run_mtp" = 1 ] && runs+=(tessera_mla_mtp_bf16)
else
  for n in tessera_mla_bf16 tessera_gqa_bf16 tessera_mla_mtp_bf16; do echo "$no_bf16" > "$tmp/$n.fail"; done
fi
hf_runs_plan
[ "$run_mtp" = 1 ] || for n in tessera_mla_mtp tessera_mla_mtp_bf16; do echo "skipped (MTP=1 runs it)" > "$tmp/$n.fail"; done
runs+=("${hf_runs[@]}")
mtp_sets=(--set model.mtp_layers=1)
run() {
  case "$1" in
    tessera_mla) one "$1" tessera_run "$1" fp32 "${mla_sets[@]}" ;;
    tessera_gqa) one "$1" tessera_run "$1" fp32 "${gqa_sets[@]}" ;;
    tessera_mla_mtp) one "$1" tessera_run "$1" fp32 "${mla_sets[@]}" "${mtp_sets[@]}" ;;
    tessera_mla_bf16) one "$1" tessera_run "$1" bf16 "${mla_sets[@]}" ;;
    tessera_gqa_bf16) one "$1" tessera_run "$1" bf16 "${gqa_sets[@]}" ;;
    tessera_mla_mtp_bf16) one "$1" tessera_run "$1" bf16 "${mla_sets[@]}" "${mtp_sets[@]}" ;;
    hf_*) hf_run "$1" ;;
  esac
}

rounds_run "$rounds"

echo "### 3. The step against Hugging Face's DeepseekV3ForCausalLM"
echo
peer_header
echo
step_table_header "L$L C$C H$H MLA q$QL kv$KVL qk$NOPE+$ROPE v$VD, E$E top-$K FE$FE S$S G$G/$TG FD$FD V$V, T$T B$B"
row "**Tessera MLA fp32**" tessera_mla "$mla_f" sgemm "$sgemm"
row "**Tessera MLA bf16**" tessera_mla_bf16 "$mla_f" bf16 "$bf16"
row "Tessera MLA + MTP 1 fp32" tessera_mla_mtp "$mtp_f" sgemm "$sgemm"
row "Tessera MLA + MTP 1 bf16" tessera_mla_mtp_bf16 "$mtp_f" bf16 "$bf16"
row "Tessera GQA twin fp32 ($H heads of $HS, $KV kv heads)" tessera_gqa "$gqa_f" sgemm "$sgemm"
row "Tessera GQA twin bf16" tessera_gqa_bf16 "$gqa_f" bf16 "$bf16"
hf_rows DeepseekV3 "$mla_f"
echo
speed_vs_peer MLA tessera_mla_bf16 tessera_mla
echo "MLA step / its GQA twin's: fp32 $(ratio "$(ms tessera_mla)" "$(ms tessera_gqa)"), bf16 $(ratio "$(ms tessera_mla_bf16)" "$(ms tessera_gqa_bf16)")"
no_bf16_note
# the FLOP count's check: the peer's active parameters less its embedding lookup are the
# parameters this script's count multiplies (the same shape on both sides)
j=""
if ls "$tmp"/hf_*.json > /dev/null 2>&1; then
  j=$(ls "$tmp"/hf_*.json | head -1)
  awk -v f="$mla_f" -v T="$T" -v L="$L" -v q=$((H * (NOPE + ROPE + VD))) -v V="$V" -v C="$C" \
      -v a="$(grep -o '"active_params": *[0-9]*' "$j" | grep -o '[0-9]*$')" 'BEGIN {
    p = (f - 6 * T * q * L) / 6; h = a - V * C
    printf "FLOP count check: HF'"'"'s active parameters less the embedding %d, this script'"'"'s %d%s\n",
      h, p, (h == p) ? " (equal)" : " (DIFFER: the count is wrong)" }'
fi
# the model each side built: Tessera's banner (its layers, heads, parameters) against the
# peer's parameter count, so that a key Tessera ignored would show
banner() { sed -n 's/^tessera: \(.*parameters.*\)$/\1/p' "$tmp/$1.err" 2> /dev/null | head -1; }
for n in tessera_mla tessera_mla_mtp tessera_gqa; do
  [ -n "$(banner "$n")" ] && echo "Tessera's $n: $(banner "$n")"
done
if [ -n "${j:-}" ]; then
  echo "HF's DeepseekV3ForCausalLM: $(grep -o '"params": *[0-9]*' "$j" | grep -o '[0-9]*$' | awk '{ printf "%.2fM parameters", $1 / 1e6 }'), $(grep -o '"active_params": *[0-9]*' "$j" | grep -o '[0-9]*$' | awk '{ printf "%.2fM active", $1 / 1e6 }')"
fi
echo "Routing (Tessera's moe_max_load: the worst block's busiest expert over the mean, E/K = $((E / K)).0 when every token picks one expert; random init, no balancing on either side), median over the timed steps:" \
     "MLA fp32 $(med moe_max_load "$tmp/tessera_mla.metrics.jsonl" 1 2> /dev/null || echo n/a), GQA fp32 $(med moe_max_load "$tmp/tessera_gqa.metrics.jsonl" 1 2> /dev/null || echo n/a)"
echo
memory_table_header
if [ "$run_fp32" != 0 ]; then
  memory tessera_mla "${mla_sets[@]}"
  [ "$run_mtp" = 1 ] && memory tessera_mla_mtp "${mla_sets[@]}" "${mtp_sets[@]}"
  memory tessera_gqa "${gqa_sets[@]}"
fi
if [ "$run_bf16" = 1 ]; then
  memory tessera_mla_bf16 "${mla_sets[@]}" --set 'train.precision="bf16"'
  memory tessera_gqa_bf16 "${gqa_sets[@]}" --set 'train.precision="bf16"'
fi
echo
echo "active GFLOP/s = active FLOP per token x tokens / step time: 6 x the parameters a token" \
     "uses in matmuls (MLA's five projections q_a, q_b, kv_a, kv_b, o and its latent norms, or" \
     "the twin's q, k, v, o; block 0's dense SwiGLU 3 x FD x C; each MoE block's router E x C and" \
     "its K routed and S shared experts' 3 x FE x C; the untied head; not the embedding lookup)" \
     "+ 6 x T x H x (qk head + v head) a layer for QK^T and PV over the full T (12 x T x C when" \
     "both heads are C / H): MLA $mla_f, MLA + MTP 1 $mtp_f, GQA twin $gqa_f FLOP per token, $tokens" \
     "tokens per step. MFU sets it against the same run's best GEMM (sgemm for fp32, oneDNN bf16" \
     "for bf16). torch.compile's first step (compilation; each try's): $(compile_first_note). Peak RSS:" \
     "Tessera's from /usr/bin/time -v, PyTorch's from ru_maxrss (its libraries included)."
echo
echo "command: $command  ($rounds round(s), steps $STEPS, warm-up $WARMUP, QUIET_S=$QUIET_S, RETRIES=${RETRIES:-1}${BUILD:+, BUILD=$BUILD}${BF16:+, BF16=$BF16}${FP32:+, FP32=$FP32}${PEER_GROUPED:+, PEER_GROUPED=$PEER_GROUPED}${PEER_BF16:+, PEER_BF16=$PEER_BF16}${MTP:+, MTP=$MTP})"
