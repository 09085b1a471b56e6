# The one-rank step benchmarks against a Hugging Face peer (bench/moe.sh, bench/deepseek.sh;
# sourced after bench/lib_parallel.sh, not run): Tessera's runs and PyTorch's, each measured
# on a quiet machine next to the GEMM ceilings of the same round, and their table rows.
#
# The caller sets: build, threads, tmp (bench_setup), B, T, STEPS, WARMUP, QUIET_S, tokens
# (B x T), peer_py (the PyTorch python; "" without peer rows), run_fp32 and run_bf16 (0|1),
# peer_script (bench/torch_*.py) and peer_args (an array: its shape options), runs (an
# array of run names) and run NAME (starts one); optionally tessera_run_sets (an array:
# --set options every Tessera step run adds). Results go to $tmp/NAME.*: .r ("MEDIAN BEST"
# ms a round), .o (the CPU share others took), .fail (why a run has no row), .metrics.jsonl,
# .time (/usr/bin/time -v), .out/.err (Tessera), .json/.err/.first (PyTorch).

# 1 where the CPU has bf16 instructions oneDNN uses (AVX512_BF16, AMX-BF16), else 0:
# elsewhere Tessera refuses bf16 (bench/bf16.sh)
has_bf16=0
if grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then has_bf16=1; fi
no_bf16="this CPU has neither AVX512_BF16 nor AMX-BF16: Tessera refuses bf16 here"
tessera_run_sets=()

# ceiling NAME: best GFLOP/s of a GEMM benchmark's --json line, appended to $tmp/NAME.c
# (sgemm: bench_sgemm; bf16: bench_gemm_bf16, n/a without bf16 instructions or the binary)
ceiling() {
  local bin=bench_sgemm key=sgemm_gflops
  if [ "$1" = bf16 ]; then bin=bench_gemm_bf16 key=bf16_gflops; fi
  if [ -x "$build/bench/$bin" ] && { [ "$1" = sgemm ] || [ "$has_bf16" = 1 ]; }; then
    "$build/bench/$bin" "$threads" --json | grep -o "\"$key\": *[0-9.]*" | grep -o '[0-9.]*$'
  else
    echo "n/a"
  fi >> "$tmp/$1.c"
}

# tessera_run NAME PRECISION CONFIG SETS...: STEPS + 1 steps under /usr/bin/time -v;
# "MEDIAN BEST" step_ms over steps 1.. into $tmp/NAME.last; the metrics in
# $tmp/NAME.metrics.jsonl, the time report in $tmp/NAME.time, stdout in $tmp/NAME.out,
# stderr (the model's banner) in $tmp/NAME.err
tessera_run() {
  local name="$1" precision="$2" m="$tmp/$1.metrics.jsonl"; shift 2
  rm -f "$m"
  mpirun -np 1 --bind-to none /usr/bin/time -o "$tmp/$name.time" -v "$build/tessera" train "$@" \
    --set parallel.micro_batch="$B" --set train.global_batch="$B" \
    --set 'data.train="data/fortunes_train.bin"' --set 'data.val=""' \
    --set "train.precision=\"$precision\"" --set train.steps=$((STEPS + 1)) \
    --set train.threads="$threads" --set data.eval_every=0 "${tessera_run_sets[@]}" \
    --set "log.metrics=\"$m\"" > "$tmp/$name.out" 2> "$tmp/$name.err" || return 1
  echo "$(med step_ms "$m" 1) $(metric step_ms "$m" 1 | sort -g | head -1)" > "$tmp/$name.last"
}

# torch_run NAME PRECISION ARGS...: $peer_script with $peer_args and ARGS, WARMUP untimed
# steps, STEPS timed; "MEDIAN BEST" ms into $tmp/NAME.last, the JSON line in
# $tmp/NAME.json (its peak_rss_mb, active_params), the first step's seconds appended to
# $tmp/NAME.first
torch_run() {
  local name="$1" precision="$2"; shift 2
  "$peer_py" "$peer_script" "${peer_args[@]}" --seq_len "$T" --batch "$B" --threads "$threads" \
    --steps "$STEPS" --warmup_steps "$WARMUP" --precision "$precision" "$@" \
    > "$tmp/$name.json" 2> "$tmp/$name.err" || return 1
  "$peer_py" -c 'import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(d["median_step_ms"], d["min_step_ms"])
print(d["first_step_s"], file=sys.stderr)' "$tmp/$name.json" > "$tmp/$name.last" 2>> "$tmp/$name.first"
}

# one NAME FUNCTION ARGS...: a measured run after waiting for a quiet machine; appends
# "MEDIAN BEST" to $tmp/NAME.r and the CPU share others took to $tmp/NAME.o; a failed run
# (a refusal: bf16 without the instructions) leaves its first error line in $tmp/NAME.fail
one() {
  local name="$1"; shift
  echo "  $name ..." >&2
  wait_quiet "$QUIET_S" > /dev/null
  if measured "$@"; then
    cat "$tmp/$name.last" >> "$tmp/$name.r"
    echo "$OTHERS" >> "$tmp/$name.o"
  else
    grep -m1 -i 'error' "$tmp/$name.err" > "$tmp/$name.fail" || tail -1 "$tmp/$name.err" > "$tmp/$name.fail"
  fi
}

# hf_runs_plan: the peer's runs into hf_runs (fp32 and bf16 autocast, eager and
# torch.compile, and eager with grouped_mm experts unless PEER_GROUPED=0), with a .fail
# note for each one left out; RUN_PEER=0 (the caller's run_peer) leaves them all out
hf_runs_plan() {
  local n
  hf_runs=()
  if [ "${run_peer:-1}" = 0 ]; then
    for n in hf_fp32 hf_fp32_compile hf_fp32_grouped hf_bf16 hf_bf16_compile hf_bf16_grouped; do echo "skipped (PEER=0)" > "$tmp/$n.fail"; done
    return
  fi
  # PyTorch's bf16 without the instructions is oneDNN's emulation, several times its fp32
  # time, and nothing of Tessera's to set it against: skipped there unless PEER_BF16=1
  peer_bf16="${PEER_BF16:-$run_bf16}"
  if [ "$run_fp32" != 0 ]; then hf_runs+=(hf_fp32 hf_fp32_compile); fi
  if [ "$peer_bf16" = 1 ]; then hf_runs+=(hf_bf16 hf_bf16_compile); fi
  if [ "${PEER_GROUPED:-1}" != 0 ]; then
    if [ "$run_fp32" != 0 ]; then hf_runs+=(hf_fp32_grouped); fi
    if [ "$peer_bf16" = 1 ]; then hf_runs+=(hf_bf16_grouped); fi
  fi
  if [ "$peer_bf16" != 1 ]; then
    for n in hf_bf16 hf_bf16_compile hf_bf16_grouped; do
      echo "skipped: no bf16 instructions on this CPU, PyTorch would emulate them (PEER_BF16=1 runs it)" > "$tmp/$n.fail"
    done
  fi
}

# hf_run NAME: one of hf_runs_plan's runs
hf_run() {
  case "$1" in
    hf_fp32) one "$1" torch_run "$1" fp32 ;;
    hf_fp32_compile) one "$1" torch_run "$1" fp32 --compile ;;
    hf_bf16) one "$1" torch_run "$1" bf16 ;;
    hf_bf16_compile) one "$1" torch_run "$1" bf16 --compile ;;
    hf_fp32_grouped) one "$1" torch_run "$1" fp32 --experts_impl grouped_mm ;;
    hf_bf16_grouped) one "$1" torch_run "$1" bf16 --experts_impl grouped_mm ;;
  esac
}

# rounds_run ROUNDS: every run of $runs a round, between the GEMM ceilings; then sgemm and
# bf16 hold the best ceilings. The VM's speed drifts for tens of seconds at a time: a
# round alternates its order
rounds_run() {
  local r i n order
  for r in $(seq "$1"); do
    echo "round $r/$1 ..." >&2
    wait_quiet "$QUIET_S" > /dev/null
    ceiling sgemm; ceiling bf16
    if [ $((r % 2)) -eq 1 ]; then order=("${runs[@]}"); else
      order=(); for ((i = ${#runs[@]} - 1; i >= 0; i--)); do order+=("${runs[i]}"); done; fi
    for n in "${order[@]}"; do run "$n"; done
  done
  wait_quiet "$QUIET_S" > /dev/null
  ceiling sgemm; ceiling bf16
  sgemm=$(best_of sgemm); bf16=$(best_of bf16)
  sgemm=${sgemm:-n/a}; bf16=${bf16:-n/a}
}

best_of() { { grep -v 'n/a' "$tmp/$1.c" || true; } | sort -g | tail -1; }
# ms/step of a run name: the median of its runs' medians ("" if it never ran)
ms() { [ -s "$tmp/$1.r" ] && cut -d' ' -f1 "$tmp/$1.r" | median || true; }
# the fastest of the named runs: "MS NAME" ("" if none ran)
fastest() { local n; for n in "$@"; do [ -n "$(ms "$n")" ] && echo "$(ms "$n") $n"; done | sort -g | head -1 || true; }
ratio() { # A B: "A / B" to 2 decimals, or n/a
  awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "") print "n/a"; else printf "%.2fx", a / b }'
}
against() { [ -n "$1" ] && [ -n "$2" ] && echo " (against ${1#* })" || true; }

# rss NAME: the run's peak resident set in MiB: /usr/bin/time's for Tessera (the last
# run's), the JSON's ru_maxrss for PyTorch
rss() {
  if [ -s "$tmp/$1.time" ]; then
    sed -n 's/.*Maximum resident set size (kbytes): *//p' "$tmp/$1.time" | awk '{ printf "%.0f", $1 / 1024 }'
  elif [ -s "$tmp/$1.json" ]; then
    grep -o '"peak_rss_mb": *[0-9.]*' "$tmp/$1.json" | grep -o '[0-9.]*$' | awk '{ printf "%.0f", $1 }'
  fi
}

row() { # label name flops_per_token ceiling-name ceiling
  local a
  a=$(ms "$2")
  if [ -z "$a" ]; then
    printf '| %s | n/a (%s) | | | | | | | | |\n' "$1" "$(cut -c1-160 "$tmp/$2.fail" 2> /dev/null | tr '|' '/')"
    return
  fi
  awk -v n="$1" -v a="$a" -v b="$(cut -d' ' -f2 "$tmp/$2.r" | sort -g | head -1)" \
      -v tok="$tokens" -v f="$3" -v cn="$4" -v c="$5" -v m="$(rss "$2")" \
      -v o="$(sort -g "$tmp/$2.o" | tail -1)" -v k="$(wc -l < "$tmp/$2.r")" 'BEGIN {
    gf = f * tok / (a * 1e-3) / 1e9
    share = (c == "n/a") ? "n/a" : sprintf("%.0f%%", 100 * gf / c)
    printf "| %s | %.0f | %.0f | %.0f | %.1f | %s %s | %s | %s | %d | %s%% |\n",
      n, a, b, tok / (a * 1e-3), gf, cn, c, share, m, k, o }'
}

# step_table_header SHAPE: the step table's two header lines, SHAPE in its first column
step_table_header() {
  echo "| $1 | ms/step median | best step | tok/s | active GFLOP/s | ceiling GFLOP/s | MFU (active, of ceiling) | peak RSS MiB | runs | CPU used by others (max) |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
}

# hf_rows MODEL FLOPS_PER_TOKEN: the peer's rows ("HF MODEL eager fp32", ...)
hf_rows() {
  row "HF $1 eager fp32" hf_fp32 "$2" sgemm "$sgemm"
  row "HF $1 torch.compile fp32" hf_fp32_compile "$2" sgemm "$sgemm"
  row "HF $1 eager bf16 autocast" hf_bf16 "$2" bf16 "$bf16"
  row "HF $1 torch.compile bf16 autocast" hf_bf16_compile "$2" bf16 "$bf16"
  if [ "${PEER_GROUPED:-1}" != 0 ]; then
    row "HF $1 eager fp32, grouped_mm experts" hf_fp32_grouped "$2" sgemm "$sgemm"
    row "HF $1 eager bf16 autocast, grouped_mm experts" hf_bf16_grouped "$2" bf16 "$bf16"
  fi
}

# speed_vs_peer WHAT BF16_RUN FP32_RUN: Tessera's speed over the peer's fastest, bf16 and
# fp32, and the note that the bf16 goal cannot be measured on a CPU without bf16
speed_vs_peer() {
  local hf32 hf16
  hf32=$(fastest hf_fp32 hf_fp32_compile hf_fp32_grouped)
  hf16=$(fastest hf_bf16 hf_bf16_compile hf_bf16_grouped)
  echo "Tessera $1 speed / Hugging Face's best (goal >= 2x in bf16): bf16" \
       "$(ratio "${hf16%% *}" "$(ms "$2")")$(against "$hf16" "$(ms "$2")"), fp32" \
       "$(ratio "${hf32%% *}" "$(ms "$3")")$(against "$hf32" "$(ms "$3")")"
}
no_bf16_note() {
  [ "$has_bf16" = 1 ] || echo "bf16: $no_bf16, so the bf16 goal is not measurable on this machine (PyTorch's bf16 rows, if run with PEER_BF16=1, are oneDNN's emulation)."
}

# memory NAME CONFIG SETS...: the trainer's estimate (metrics' estimate_mb), its own peak
# report (peak_rss_mb), `tessera plan`'s memory_bytes (the cost model, no measuring), the
# true peak (/usr/bin/time), and estimate / true
memory() {
  local name="$1" m="$tmp/$1.metrics.jsonl" est peak plan truth; shift
  [ -s "$tmp/$name.time" ] && [ -s "$m" ] || { echo "| $name | n/a (did not run) | | | | |"; return; }
  est=$(mem_field "$m" estimate_mb); peak=$(mem_field "$m" peak_rss_mb); truth=$(rss "$name")
  plan=$("$build/tessera" plan "$@" --set parallel.micro_batch="$B" --set train.global_batch="$B" \
         --cost model --json 2> /dev/null | grep -o '"memory_bytes": *[0-9]*' | head -1 | grep -o '[0-9]*$' || true)
  awk -v n="$name" -v e="$est" -v p="$peak" -v q="$plan" -v t="$truth" 'BEGIN {
    printf "| %s | %.0f | %.0f | %s | %.0f | %.3f (%+.1f%%) |\n", n, e, p,
      (q == "") ? "n/a" : sprintf("%.0f", q / 1048576), t, e / t, 100 * (e / t - 1) }'
}
memory_table_header() {
  echo "Memory of the Tessera runs (MiB; goal: estimate within 5% of the true peak):"
  echo
  echo "| run | trainer's estimate (estimate_mb) | trainer's peak_rss_mb | tessera plan (memory_bytes) | true peak (/usr/bin/time) | estimate / true |"
  echo "|---|---|---|---|---|---|"
}

# machine_header: the date, commit, CPU and its bf16 instructions
machine_header() {
  local commit
  commit="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . 2> /dev/null || echo '+dirty')"
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit: $commit"
  echo "machine: $(lscpu | sed -n 's/^Model name: *//p') (family $(lscpu | sed -n 's/^CPU family: *//p')), $(nproc) CPUs, bf16 instructions: $([ "$has_bf16" = 1 ] && echo yes || echo 'none (no AVX512_BF16, no AMX-BF16)'); $threads threads per run, one process at a time"
  echo "lscpu flags: $(lscpu | sed -n 's/^Flags: *//p' | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_bf16|amx_bf16|amx_tile)$' | paste -sd' ')"
}

# peer_header: the peer's versions and Tessera's build, the ceilings measured
peer_header() {
  local desc="none (PEER=0)"
  if [ -n "$peer_py" ]; then
    desc="$("$peer_py" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)') ($peer_py), SDPA attention"
  fi
  echo "peer: $desc; Tessera: $build"
  echo "ceilings (GFLOP/s, best 2-thread GEMM), before each round and after: sgemm (bench_sgemm)" \
       "$(paste -sd' ' "$tmp/sgemm.c"); oneDNN bf16 GEMM (bench_gemm_bf16) $(paste -sd' ' "$tmp/bf16.c");" \
       "the table uses the best of each"
}

# compile_first_note: torch.compile's first step (its compilation), each try's
compile_first_note() {
  echo "fp32 $(paste -sd' ' "$tmp/hf_fp32_compile.first" 2> /dev/null || echo n/a) s," \
       "bf16 $(paste -sd' ' "$tmp/hf_bf16_compile.first" 2> /dev/null || echo n/a) s"
}
