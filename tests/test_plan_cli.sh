# tessera plan: textbook bubbles with --cost uniform, JSON shape, trace and SVG files,
# drawing a trace file, and clear errors for impossible configs. No python: grep/awk.
source "$(dirname "$0")/lib.sh"

cfg="$SRC/configs/tiny.cfg"
# pp=4, m = global_batch / (dp * micro_batch) = 32 / 4 = 8.
p4=(--set parallel.pp=4 --set train.global_batch=32 --set parallel.micro_batch=4)

plan() { timeout 120 "$TESSERA" plan "$@" >"$TMP/out" 2>"$TMP/err"; }

# json_num KEY: the first numeric value of "KEY" in $TMP/out (the overall one for "bubble").
json_num() { grep -o "\"$1\": *[-0-9.eE+]*" "$TMP/out" | head -1 | sed 's/.*: *//'; }

# close A B: |A - B| < 1e-6
close() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d < 1e-6) }'; }

check_bubble() { # NAME EXPECTED ARGS...
  local name="$1" want="$2"; shift 2
  if ! plan "$@"; then fail "$name: exit code $?: $(cat "$TMP/err")"; return; fi
  local b; b=$(json_num bubble)
  if close "$b" "$want"; then pass; else fail "$name: bubble $b, expected $want"; fi
}

# Textbook bubbles: (p-1)/(m+p-1) = 3/11, interleaved (p-1)/(v*m+p-1) = 3/19.
check_bubble "gpipe" "$(awk 'BEGIN { print 3/11 }')" "$cfg" "${p4[@]}" --set parallel.schedule=gpipe --json --cost uniform
check_bubble "1f1b" "$(awk 'BEGIN { print 3/11 }')" "$cfg" "${p4[@]}" --set parallel.schedule=1f1b --json --cost uniform
check_bubble "interleaved v=2" "$(awk 'BEGIN { print 3/19 }')" "$cfg" "${p4[@]}" --set model.n_layer=6 \
  --set parallel.schedule=interleaved-1f1b --set parallel.virtual_stages=2 --json --cost uniform
# ZB-H1: (p-1)/(3m+p-1) = 3/27, below 1F1B's.
check_bubble "zb-h1" "$(awk 'BEGIN { print 3/27 }')" "$cfg" "${p4[@]}" --set parallel.schedule=zb-h1 --json --cost uniform
zb=$(json_num bubble)
if awk -v z="$zb" 'BEGIN { exit !(z != "" && z < 3/11) }'; then pass; else fail "zb-h1 bubble $zb not below 1f1b's"; fi

# The JSON object: one line, every contract key, one entry per pipeline rank.
if plan "$cfg" "${p4[@]}" --json --cost uniform; then
  lines=$(wc -l < "$TMP/out")
  [ "$lines" -eq 1 ] && pass || fail "--json printed $lines lines"
  for key in world pp dp tp v schedule microbatches partition step_ms bubble ranks pp_rank \
             peak_activation_bytes; do
    grep -q "\"$key\":" "$TMP/out" && pass || fail "--json lacks \"$key\": $(cat "$TMP/out")"
  done
  [ "$(grep -o '"pp_rank"' "$TMP/out" | wc -l)" -eq 4 ] && pass || fail "--json: not 4 ranks"
  close "$(json_num microbatches)" 8 && pass || fail "microbatches != 8"
  close "$(json_num step_ms)" 33 && pass || fail "uniform 1f1b step_ms != 33: $(cat "$TMP/out")"
  grep -q '"partition": *\[[0-9]*, *[0-9]*, *[0-9]*, *[0-9]*\]' "$TMP/out" && pass ||
    fail "partition is not 4 layer counts"
else
  fail "plan --json failed: $(cat "$TMP/err")"
fi

# An explicit partition is used as given.
if plan "$cfg" "${p4[@]}" --set 'parallel.partition=[3,1,1,1]' --json --no-measure; then
  grep -q '"partition": *\[3, *1, *1, *1\]' "$TMP/out" && pass || fail "explicit partition: $(cat "$TMP/out")"
else
  fail "explicit partition failed: $(cat "$TMP/err")"
fi

# The human-readable report (measured costs, the default).
if plan "$cfg" --set parallel.pp=2; then
  for what in "partition: balanced" "chunk 1" "simulated step:" "bubble:" "peak activations"; do
    grep -q "$what" "$TMP/out" && pass || fail "report lacks '$what': $(cat "$TMP/out")"
  done
else
  fail "plan (measured) failed: $(cat "$TMP/err")"
fi

# Communication makes the step slower than free communication would.
plan "$cfg" "${p4[@]}" --json --no-measure --latency-us 0 --bandwidth-gbs 1e9 && fast=$(json_num step_ms)
plan "$cfg" "${p4[@]}" --json --no-measure --latency-us 5000 && slow=$(json_num step_ms)
awk -v f="${fast:-}" -v s="${slow:-}" 'BEGIN { exit !(f != "" && s != "" && s > f + 30) }' && pass ||
  fail "latency does not slow the step: $fast vs $slow"

# Trace and SVG files; then draw the trace file back.
if plan "$cfg" "${p4[@]}" --cost uniform --trace "$TMP/t/plan.json" --svg "$TMP/t/plan.svg"; then
  head -c 1 "$TMP/t/plan.json" | grep_q '{' && tail -c 2 "$TMP/t/plan.json" | grep_q '}' &&
    grep -q '"traceEvents"' "$TMP/t/plan.json" && pass || fail "--trace is not a Chrome trace"
  opens=$(tr -cd '{' < "$TMP/t/plan.json" | wc -c); closes=$(tr -cd '}' < "$TMP/t/plan.json" | wc -c)
  [ "$opens" -eq "$closes" ] && pass || fail "--trace: unbalanced braces"
  [ "$(grep -o '"ph":"X"' "$TMP/t/plan.json" | grep -c .)" -ge 64 ] && pass || fail "--trace: too few events"
  head -c 4 "$TMP/t/plan.svg" | grep_q '<svg' && pass || fail "--svg does not start with <svg"
  [ "$(grep -o 'class="ev"' "$TMP/t/plan.svg" | wc -l)" -eq 64 ] && pass ||
    fail "--svg: expected 64 blocks (4 ranks x 8 micro-batches x F,B)"
  if plan --from-trace "$TMP/t/plan.json" --svg "$TMP/t/again.svg"; then
    cmp -s <(grep -c 'class="ev"' "$TMP/t/plan.svg") <(grep -c 'class="ev"' "$TMP/t/again.svg") &&
      pass || fail "--from-trace drew a different number of blocks"
  else
    fail "--from-trace failed: $(cat "$TMP/err")"
  fi
else
  fail "plan --trace/--svg failed: $(cat "$TMP/err")"
fi

# The data-parallel reduction. pp=2 with m = 4 micro-batches: dp=1 (batch 16) against
# dp=2 (batch 32), modelled costs. A reduction the step waits for lengthens it by
# exactly dp_exposed_ms; dp=1 has none; a faster dp link exposes less.
dp1=(--set parallel.pp=2 --set parallel.micro_batch=4 --set train.global_batch=16 --no-measure)
dp2=(--set parallel.pp=2 --set parallel.micro_batch=4 --set parallel.dp=2 --set train.global_batch=32 --no-measure)
last_num() { grep -o "\"$1\": *[-0-9.eE+]*" "$TMP/out" | tail -1 | sed 's/.*: *//'; }
if plan "$cfg" "${dp1[@]}" --json; then
  base=$(json_num step_ms)
  close "$(json_num dp_exposed_ms)" 0 && close "$(last_num dp_reduction_ms)" 0 && pass ||
    fail "dp=1 has a dp reduction: $(cat "$TMP/out")"
else
  fail "plan dp=1 failed: $(cat "$TMP/err")"
fi
if plan "$cfg" "${dp2[@]}" --json --dp-bandwidth-gbs 0.05 --dp-latency-us 100; then
  slow=$(json_num step_ms); exposed=$(json_num dp_exposed_ms); reduction=$(last_num dp_reduction_ms)
  for key in dp_exposed_ms dp_reduction_ms dp_wait_ms; do
    grep -q "\"$key\":" "$TMP/out" && pass || fail "--json lacks \"$key\""
  done
  awk -v e="$exposed" -v r="$reduction" 'BEGIN { exit !(e > 0 && r >= e) }' && pass ||
    fail "slow dp link: exposed $exposed, reduction $reduction"
  close "$(awk -v s="$slow" -v b="$base" 'BEGIN { printf "%.10f", s - b }')" "$exposed" && pass ||
    fail "step $slow - dp=1 step $base != dp_exposed_ms $exposed"
  # Gradient bytes / bandwidth: the reduction costs about what the model's gradients need
  # (tiny: 0.83M parameters = 3.3 MB over 2 ranks, at 0.05 GB/s about 33 ms per rank).
  awk -v r="$reduction" 'BEGIN { exit !(r > 25 && r < 45) }' && pass ||
    fail "dp_reduction_ms $reduction is not about 3.3 MB / 2 / 0.05 GB/s"
  plan "$cfg" "${dp2[@]}" --json --dp-bandwidth-gbs 1000 --dp-latency-us 0 && fast=$(json_num dp_exposed_ms)
  awk -v f="${fast:-}" -v e="$exposed" 'BEGIN { exit !(f != "" && f < e / 10) }' && pass ||
    fail "a faster dp link exposes $fast ms, the slow one $exposed ms"
else
  fail "plan dp=2 failed: $(cat "$TMP/err")"
fi
if plan "$cfg" "${dp2[@]}" --dp-bandwidth-gbs 0.05 --trace "$TMP/t/dp.json"; then
  grep -q "^dp reduction: 2 replicas" "$TMP/out" && grep -q "exposed [0-9.]* ms" "$TMP/out" &&
    grep -q "dp_wait_ms" "$TMP/out" && pass || fail "report lacks the dp reduction: $(cat "$TMP/out")"
  [ "$(grep -o '"cat":"dpreduce","ph":"X","pid":1' "$TMP/t/dp.json" | wc -l)" -eq 2 ] && pass ||
    fail "--trace: expected 2 dp reductions (one per chunk) on the dp track (pid 1)"
else
  fail "plan dp=2 text failed: $(cat "$TMP/err")"
fi
plan "$cfg" "${dp2[@]}" --cost uniform && grep -q "not modelled with --cost uniform" "$TMP/out" && pass ||
  fail "--cost uniform with dp=2: $(cat "$TMP/out" "$TMP/err")"
plan "$cfg" "${dp1[@]}" && grep -q "dp reduction: none (dp = 1)" "$TMP/out" && pass ||
  fail "dp=1 report: $(cat "$TMP/out")"

# --write-csv: the planned schedule as a CSV (pp = 2, the config's micro-batches), which
# planned again as parallel.schedule gives the same simulated step and bubbles as the name.
for sched in gpipe 1f1b interleaved-1f1b zb-h1; do
  sets=(--set parallel.pp=2 --set parallel.schedule="$sched" --no-measure)
  [ "$sched" = interleaved-1f1b ] && sets+=(--set parallel.virtual_stages=2)
  csv="$TMP/t/written_$sched.csv"
  if plan "$cfg" "${sets[@]}" --write-csv "$csv"; then
    grep -q "^plan: wrote schedule $sched (pp=2 .*) to $csv\$" "$TMP/err" && [ -s "$csv" ] && pass ||
      fail "--write-csv $sched: $(cat "$TMP/err")"
    grep -E '^(simulated step|bubble|  [0-9]+  )' "$TMP/out" > "$TMP/by_name"
    if plan "$cfg" "${sets[@]}" --set "parallel.schedule=\"$csv\""; then
      grep -E '^(simulated step|bubble|  [0-9]+  )' "$TMP/out" > "$TMP/by_csv"
      [ -s "$TMP/by_name" ] && cmp -s "$TMP/by_name" "$TMP/by_csv" && pass ||
        fail "--write-csv $sched: the CSV plans differently: $(diff "$TMP/by_name" "$TMP/by_csv")"
    else
      fail "plan with the written $sched CSV: $(cat "$TMP/err")"
    fi
  else
    fail "plan --write-csv $sched: $(cat "$TMP/err")"
  fi
done
expect_error --quiet 0 "--write-csv needs a value" plan "$cfg" --write-csv
expect_error --quiet 0 "--from-trace takes only --svg" plan --from-trace "$TMP/t/plan.json" --svg "$TMP/x.svg" --write-csv "$TMP/x.csv"

# Impossible configs and bad options: tessera plan as one process fails, PATTERN once on
# stderr, nothing on stdout (--quiet), no crash, no hang (lib.sh's expect_error).
expect_error --quiet 0 "more pipeline chunks than layers" plan "$cfg" --set parallel.pp=7 --set train.global_batch=28
expect_error --quiet 0 "partition sums to 7 layers" plan "$cfg" "${p4[@]}" --set 'parallel.partition=[2,2,2,1]'
expect_error --quiet 0 "chunk 3 has 0 layers" plan "$cfg" "${p4[@]}" --set 'parallel.partition=[3,2,1,0]' --json
expect_error --quiet 0 "interleaved-1f1b.*micro-batches" plan "$cfg" --set parallel.pp=2 --set model.n_layer=6 \
  --set parallel.schedule=interleaved-1f1b --set parallel.virtual_stages=2 --set train.global_batch=4
expect_error --quiet 0 "global_batch" plan "$cfg" --set train.global_batch=15
expect_error --quiet 0 "No such file|cannot read|not found" plan "$TMP/absent.cfg"
expect_error --quiet 0 "not a Chrome trace|traceEvents|not valid JSON" plan --from-trace "$cfg" --svg "$TMP/x.svg"
expect_error --quiet 0 "--cost" plan "$cfg" --cost free
expect_error --quiet 0 "needs a CONFIG" plan --json
expect_error --quiet 0 "--dp-bandwidth-gbs '0' is not a number from 0.001" plan "$cfg" --dp-bandwidth-gbs 0
expect_error --quiet 0 "--dp-latency-us 'x' is not a number" plan "$cfg" --dp-latency-us x

# --help documents every option.
if "$TESSERA" plan --help >"$TMP/out"; then
  for opt in --json --cost uniform --no-measure --trace --svg --from-trace --latency-us \
             --bandwidth-gbs --dp-latency-us --dp-bandwidth-gbs dp_exposed_ms --set --write-csv; do
    grep -q -- "$opt" "$TMP/out" && pass || fail "--help does not mention $opt"
  done
else
  fail "plan --help exit code"
fi

# A GPU run plans in every build (ts_config_load_plan: train.device = "cuda" without the
# CUDA backend too), sized by the CUDA table's layout (configs/llama3-405b.cfg names it;
# the --set says so here too, and the CPU's layout is asked for): on the Llama 3 405B grid of 8,192
# GPUs (full recompute) the flash kernel's one fp32 log-sum-exp per row in place of the
# bf16 [16, 8192, 8192] probabilities of 8 layers makes 89.78 GB into 70.46 GB, the same
# numbers in a CPU-only and a CUDA build.
llama=("$SRC/configs/llama3-405b.cfg" --cluster "$SRC/configs/clusters/dgx-h100.cfg" --set parallel.dp=64)
gpu=(--set 'train.device="cuda"' --set 'train.attention="flash"')
if plan "${llama[@]}" "${gpu[@]}"; then
  grep -q "memory per device: 70.46 GB on pipeline rank 1 (fits)" "$TMP/out" && pass ||
    fail "405B dp 64 on cuda-flash: $(grep 'memory per device' "$TMP/out")"
else
  fail "plan with train.device = \"cuda\": $(cat "$TMP/err")"
fi
if plan "${llama[@]}" --set 'train.device="cpu"' --set 'train.attention="gemm"'; then
  grep -q "memory per device: 89.78 GB on pipeline rank 1 (DOES NOT FIT)" "$TMP/out" && pass ||
    fail "405B dp 64 on cpu: $(grep 'memory per device' "$TMP/out")"
else
  fail "plan 405B dp 64: $(cat "$TMP/err")"
fi
plan "$cfg" --cost model "${gpu[@]}" && pass || fail "plan --cost model on cuda: $(cat "$TMP/err")"

# train.precision = "bf16" on a CPU cluster file (compute_dtype "fp32", with a bf16 peak)
# plans bf16 GEMMs at that peak, so faster steps than fp32's; a file without a bf16 peak
# refuses it, naming the key.
here=("$SRC/configs/gpt2-124m.cfg" --cluster "$SRC/configs/clusters/this-machine.cfg"
      --set parallel.dp=2)
if plan "${here[@]}"; then
  grep -q "GEMMs in fp32" "$TMP/out" && pass || fail "fp32 plan: $(grep GEMMs "$TMP/out")"
  fp32_tps=$(sed -n 's/.*tokens\/s: \([0-9.e+]*\);.*/\1/p' "$TMP/out")
else
  fail "plan on this-machine.cfg: $(cat "$TMP/err")"
fi
if plan "${here[@]}" --set 'train.precision="bf16"'; then
  grep -q "GEMMs in bf16 (peak 0.2 TFLOP/s" "$TMP/out" && pass || fail "bf16 plan: $(grep GEMMs "$TMP/out")"
  bf16_tps=$(sed -n 's/.*tokens\/s: \([0-9.e+]*\);.*/\1/p' "$TMP/out")
  awk -v a="${fp32_tps:-0}" -v b="${bf16_tps:-0}" 'BEGIN { exit !(a > 0 && b > 1.2 * a) }' && pass \
    || fail "bf16 plans $bf16_tps tokens/s, not well above fp32's $fp32_tps"
else
  fail "bf16 plan on this-machine.cfg: $(cat "$TMP/err")"
fi
# Muon (train.optimizer = "muon"): the Newton-Schulz FLOPs of llama-tiny's 28 block
# matrices (2,369,781,760 a step, test_plan_model's hand count) in the report and --json.
muon=(configs/llama-tiny.cfg --cluster "$SRC/tests/fixtures/plan_cluster_cpu.cfg"
      --set 'train.optimizer="muon"' --set parallel.dp=1)
muon[0]="$SRC/${muon[0]}"
if plan "${muon[@]}" && grep -q "^muon: Newton-Schulz 2.37 GFLOP per step on the busiest owner of 1 " "$TMP/out" &&
   plan "${muon[@]}" --json && [ "$(json_num muon_ns_flops)" = 2369781760.0 ]; then pass
else fail "Muon's plan: $(cat "$TMP/out" "$TMP/err")"; fi
# Packed documents (--doc-len; test_plan_model's test_documents checks the FLOPs and the
# CPU tables' time exactly): on a CUDA config (batched-GEMM attention, the whole square
# either way) the step does not move and MFU falls (its attention term counts the two
# documents' 2 x 512 x 513 / 2 pairs per 1024-token window, not 1024^2); a bad length
# and the flag without --cluster are usage errors.
docs=("$SRC/configs/gpt2-124m.cfg" --cluster "$SRC/tests/fixtures/plan_cluster_h100.cfg"
      --set 'train.device="cuda"' --json)
if plan "${docs[@]}"; then
  step0=$(json_num step_ms) mfu0=$(json_num mfu)
  if plan "${docs[@]}" --set data.document_mask=true --doc-len 512; then
    step1=$(json_num step_ms) mfu1=$(json_num mfu)
    [ -n "$step0" ] && [ "$step0" = "$step1" ] && pass || fail "--doc-len 512 moved the CUDA step: $step0 -> $step1 ms"
    awk -v a="${mfu0:-0}" -v b="${mfu1:-0}" 'BEGIN { exit !(b > 0 && b < a) }' && pass ||
      fail "--doc-len 512: MFU $mfu1, not below $mfu0"
  else
    fail "plan --doc-len 512: $(cat "$TMP/err")"
  fi
else
  fail "plan gpt2-124m on the H100 fixture: $(cat "$TMP/err")"
fi
if plan "${docs[@]}" --doc-len 512; then fail "--doc-len without document masks was accepted"; else
  grep -q -- "set data.document_mask = true" "$TMP/err" && pass || fail "--doc-len unmasked: $(cat "$TMP/err")"; fi
if plan "${docs[@]}" --doc-len 0; then fail "--doc-len 0 was accepted"; else
  grep -q -- "--doc-len" "$TMP/err" && pass || fail "--doc-len 0: $(cat "$TMP/err")"; fi
if plan "$cfg" --doc-len 512; then fail "--doc-len without --cluster was accepted"; else
  grep -q -- "--doc-len plans on a cluster" "$TMP/err" && pass || fail "--doc-len alone: $(cat "$TMP/err")"; fi

sed 's/ bf16 = [0-9.]*;//' "$SRC/configs/clusters/this-machine.cfg" >"$TMP/no_bf16.cfg"
if plan "$SRC/configs/gpt2-124m.cfg" --cluster "$TMP/no_bf16.cfg" --set parallel.dp=2 \
     --set 'train.precision="bf16"'; then
  fail "bf16 on a cluster file without a bf16 peak was accepted"
else
  grep -q 'train.precision = "bf16", but cluster file .*no_bf16.cfg gives no bf16 peak: add cluster.device.peak_tflops.bf16' \
    "$TMP/err" && pass || fail "bf16 without a peak: $(cat "$TMP/err")"
fi

finish
