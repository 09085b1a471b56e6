#!/usr/bin/env bash
# HellaSwag evaluation speed: `tessera eval` (items per second, the scoring only: the
# forwards and the sums, after the items are read and encoded) against a PyTorch peer
# doing the same scoring on the same weights and rows in the same invocation
# (bench/hellaswag_peer.py: nanoGPT fp32, one item's 4 rows a forward padded to seq_len,
# as Tessera's micro_batch 4), with the same thread count, and the physical ceiling: the
# forward's FLOPs per item over the machine's sgemm rate (the metrics' gemm_gflops of the
# training run that makes the checkpoint, measured at its start).
# The model: GPT-2 L=4, H=4, C=256, seq_len 128, vocab 3008 (the fixture ranks
# tests/fixtures/bpe/small.tiktoken), trained 2 steps on Debian's fortunes; the items: the
# fixture's 21 synthetic items repeated REPEAT times (the real HellaSwag is the user's).
#
# Usage: bench/hellaswag.sh [THREADS] [REPEAT] [REPS]   (default 2 threads, 10, 3 passes)
#   TS_BENCH_BUILD   build dir with tessera (default build/)
#   TS_BENCH_PYTHON  python with torch 2 and tiktoken (default the peer venv)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
threads="${1:-2}" repeat="${2:-10}" reps="${3:-3}"
build="${TS_BENCH_BUILD:-$root/build}"
py="${TS_BENCH_PYTHON:-$HOME/.cache/tessera/peer-venv/bin/python}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TS_TEST_TOKENIZER_ANY_SIZE=1
export TS_TOKENIZER_DIR="$tmp/none"
ranks="$root/tests/fixtures/bpe/small.tiktoken"
L=4 H=4 C=256 V=3008 T=128
for _ in $(seq "$repeat"); do cat tests/fixtures/hellaswag/items.jsonl; done >"$tmp/items.jsonl"
cp /usr/share/games/fortunes/fortunes "$tmp/f.txt"
"$build/tessera" data --encoding gpt2 --ranks "$ranks" --val-tokens 2000 "$tmp/f.txt" --out "$tmp/d" >/dev/null
"$build/tessera" train configs/tiny.cfg --set model.n_layer=$L --set model.n_head=$H \
  --set model.n_embd=$C --set model.seq_len=$T --set model.vocab_size=$V \
  --set model.tokenizer=gpt2 --set "model.tokenizer_file=\"$ranks\"" --set train.steps=2 \
  --set 'data.val=""' --set "data.train=\"$tmp/d_train_*.bin\"" --set "train.threads=$threads" \
  --set "checkpoint.dir=\"$tmp/ck\"" --set "log.metrics=\"$tmp/m.jsonl\"" --set log.progress=false
gflops="$(head -1 "$tmp/m.jsonl" | python3 -c 'import json,sys; print(sum(json.load(sys.stdin)["gemm_gflops"]))')"
best=""
for _ in $(seq "$reps"); do
  "$build/tessera" eval "$tmp/ck" --hellaswag "$tmp/items.jsonl" --json --set "train.threads=$threads" >"$tmp/e.json"
  s="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["seconds"])' "$tmp/e.json")"
  best="$(python3 -c "print(min(float('$s'), float('${best:-1e30}')))")"
done
peer="$("$py" bench/hellaswag_peer.py "$tmp/ck/step_00000002/model.safetensors" "$tmp/items.jsonl" \
  $L $H $C $V $T "$threads" "$reps" --tessera-json "$tmp/e.json")"
python3 - "$tmp/e.json" "$best" "$gflops" "$threads" "$peer" $L $C $V $T <<'PY'
import json, sys
e = json.load(open(sys.argv[1])); best = float(sys.argv[2]); gf = float(sys.argv[3])
threads = sys.argv[4]; peer = json.loads(sys.argv[5]); L, C, V, T = map(int, sys.argv[6:10])
# forward FLOPs of one row: 2 * (the blocks' 12 C^2 + the head's C V) per position, plus
# attention's QK^T and PV (2 * 2 * T * C per position per layer, causal half counted whole)
row = T * (2 * (12 * L * C * C + C * V) + 4 * L * T * C)
item = 4 * row
n = e["items"]
print(f"| side | threads | items | seconds (best of passes) | items/s | GFLOP/s | of sgemm peak ({gf:.1f} GFLOP/s) |")
print("|---|---|---|---|---|---|---|")
for name, s in (("tessera eval", best), (f"PyTorch {peer['torch']}", peer["seconds"])):
    print(f"| {name} | {threads} | {n} | {s:.3f} | {n / s:.1f} | {item * n / s / 1e9:.1f} | {item * n / s / 1e9 / gf:.0%} |")
print(f"\nceiling: {gf * 1e9 / item:.1f} items/s at the sgemm rate ({item / 1e6:.1f} MFLOP per item); "
      f"tessera / PyTorch = {peer['seconds'] / best:.2f}x; same counts: {peer['same_counts']}, "
      f"largest |loglik difference| {peer['max_abs_diff']:.2e}")
PY
