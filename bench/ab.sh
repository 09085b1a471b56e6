#!/usr/bin/env bash
# No-regression A/B of Tessera's single-rank training speed between two versions of this
# repository: A (default bd70714, the commit before the "device-ready core" work) against
# B (default: the working tree as it is, uncommitted changes included). A is checked out
# with `git worktree add` into a temporary folder and built there; B is built into
# build-ab/ (or, for a commit, in its own worktree), so build/ and the other build
# folders are left alone. Both run the shapes of bench/throughput.sh's Tessera side, with
# each version's own config file, on the same data (scripts/prepare_data.sh):
#   tiny  configs/tiny.cfg, 60 steps, a run's time is its median step_ms over steps 5..59
#   124m  configs/gpt2-124m.cfg at seq 256, batch 4 (micro_batch 4), 6 steps, steps 1..5
#         (step 0 page-faults ~2 GB)
# one rank (mpirun -np 1 --bind-to none), train.threads=THREADS, no evaluation. A round
# runs, for each shape, A B B A (ABBA: a linear drift of the machine's speed hits both
# sides alike; the tiny block is repeated AB_TINY_BLOCKS times, its runs being short and
# noisy). Every run waits for a quiet machine first and is repeated once if other
# processes took more than 10% of the CPUs (bench/lib_parallel.sh). Prints a markdown
# table: each side's median over its runs, B/A, and the median (and range) of the
# per-round ratios, median(B runs of the round) / median(A runs of the round).
#
# Usage: bench/ab.sh [ROUNDS] [A_COMMIT] [B_REF]     (run from anywhere)
#   ROUNDS    measurement rounds (default 3)
#   A_COMMIT  the baseline, any commit-ish (default bd70714)
#   B_REF     "worktree" (default): the current checkout, uncommitted changes included,
#             built into build-ab/ as it is when the script starts; or any commit-ish
#   AB_SHAPES       shapes to run, of "tiny 124m" (default both); AB_SHAPES=tiny skips 124M
#   AB_TINY_BLOCKS  ABBA blocks of the tiny shape per round (default 2)
#   THREADS         threads per run (default 2, as bench/throughput.sh)
#   KEEP=DIR        keep every run's metrics and log in DIR
# Takes about 13 minutes with 3 rounds on a quiet 2-core machine: a round is ~3.5
# minutes (four 124M runs of ~35 s, eight tiny runs of ~5 s, a ~4 s quiet-machine check
# before each), plus ~1.5 minutes to build A from scratch and B (incrementally after the
# first time). AB_SHAPES=tiny with one round: under 3 minutes, half of it the builds.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
rounds="${1:-3}"
a_ref="${2:-bd70714}"
b_ref="${3:-worktree}"
threads="${THREADS:-2}"
shapes="${AB_SHAPES:-tiny 124m}"
tiny_blocks="${AB_TINY_BLOCKS:-2}"
command="bench/ab.sh $*"
case "$rounds" in ''|*[!0-9]*|0) echo "ab.sh: ROUNDS must be a positive integer, not '$rounds'" >&2; exit 2;; esac
for s in $shapes; do
  case "$s" in tiny|124m) ;; *) echo "ab.sh: unknown shape '$s' in AB_SHAPES (tiny, 124m)" >&2; exit 2;; esac
done
source "$root/bench/lib_parallel.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

a_sha=$(git rev-parse --verify --quiet "$a_ref^{commit}") \
  || { echo "ab.sh: A_COMMIT '$a_ref' is not a commit" >&2; exit 2; }
if [ "$b_ref" != worktree ]; then
  b_sha=$(git rev-parse --verify --quiet "$b_ref^{commit}") \
    || { echo "ab.sh: B_REF '$b_ref' is not a commit (or \"worktree\")" >&2; exit 2; }
fi

work="$(mktemp -d)"
worktrees=()
cleanup() {
  local w
  for w in "${worktrees[@]}"; do git worktree remove --force "$w" >/dev/null 2>&1 || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
if [ -n "${KEEP:-}" ]; then runs="$KEEP"; mkdir -p "$runs"; else runs="$work/runs"; mkdir -p "$runs"; fi

# the two sides: source tree (configs) and build folder
echo "building A ($a_ref) ..." >&2
git worktree add --detach "$work/a" "$a_sha" >"$work/git.log" 2>&1 \
  || { cat "$work/git.log" >&2; exit 1; }
worktrees+=("$work/a")
a_src="$work/a"; a_build="$work/build-a"
"$a_src/scripts/build.sh" "$a_build" -DCMAKE_BUILD_TYPE=Release >/dev/null
a_label="$(git rev-parse --short "$a_sha")"
if [ "$b_ref" = worktree ]; then
  b_src="$root"; b_build="$root/build-ab"
  # --no-optional-locks: look, do not refresh the index
  changed=$(git --no-optional-locks status --porcelain | wc -l)
  b_label="$(git rev-parse --short HEAD)"
  if [ "$changed" -gt 0 ]; then b_label="$b_label+changes (working tree, $changed paths differ from HEAD)"; fi
else
  git worktree add --detach "$work/b" "$b_sha" >"$work/git.log" 2>&1 \
  || { cat "$work/git.log" >&2; exit 1; }
  worktrees+=("$work/b")
  b_src="$work/b"; b_build="$work/build-b"
  b_label="$(git rev-parse --short "$b_sha")"
fi
echo "building B ($b_ref) ..." >&2
"$b_src/scripts/build.sh" "$b_build" -DCMAKE_BUILD_TYPE=Release >/dev/null
scripts/prepare_data.sh "$b_build/tessera" data >/dev/null

sgemm_rate() {
  "$b_build/bench/bench_sgemm" "$threads" --json | grep -o '"sgemm_gflops":[0-9.]*' | cut -d: -f2
}

# tessera_run SIDE OUT STEPS SKIP CONFIG ARGS...: one training run of side A or B (run
# from the repository root, so data/ is the same for both); the median step_ms over
# steps >= SKIP into file OUT
n_run=0
tessera_run() {
  local side="$1" out="$2" steps="$3" skip="$4" cfg="$5" src build; shift 5
  if [ "$side" = A ]; then src="$a_src" build="$a_build"; else src="$b_src" build="$b_build"; fi
  n_run=$((n_run + 1))
  local m="$runs/$n_run.$side.metrics.jsonl" log="$runs/$n_run.$side.log"
  if ! mpirun -np 1 --bind-to none "$build/tessera" train "$src/$cfg" "$@" \
      --set train.steps="$steps" --set train.threads="$threads" --set data.eval_every=0 \
      --set log.progress=false --set "log.metrics=\"$m\"" >"$log" 2>&1; then
    echo "ab.sh: run $n_run ($side) failed:" >&2; tail -20 "$log" >&2; return 1
  fi
  med step_ms "$m" "$skip" > "$out"
  cp "$m" "$runs/last.$side.jsonl"
}

big_args=(--set model.seq_len=256 --set parallel.micro_batch=4 --set train.global_batch=4
          --set 'data.train="data/fortunes_train.bin"' --set 'data.val=""')

# one SHAPE SIDE ROUND: a measured run after waiting for a quiet machine; appends
# "SHAPE SIDE ROUND MS OTHERS%" to $runs/results
one() {
  local shape="$1" side="$2" r="$3"
  wait_quiet 60 >/dev/null
  case "$shape" in
    tiny) measured tessera_run "$side" "$work/last" 60 5 configs/tiny.cfg ;;
    124m) measured tessera_run "$side" "$work/last" 6 1 configs/gpt2-124m.cfg "${big_args[@]}" ;;
  esac
  echo "$shape $side $r $(cat "$work/last") $OTHERS" >> "$runs/results"
  echo "  round $r $shape $side: $(cat "$work/last") ms/step (others $OTHERS%)" >&2
}
abba() { one "$1" A "$2"; one "$1" B "$2"; one "$1" B "$2"; one "$1" A "$2"; }

wait_quiet 60 >/dev/null
sgemm0=$(sgemm_rate)
: > "$runs/results"
for r in $(seq "$rounds"); do
  echo "round $r/$rounds ..." >&2
  for s in $shapes; do
    if [ "$s" = tiny ]; then
      for _ in $(seq "$tiny_blocks"); do abba tiny "$r"; done
    else
      abba "$s" "$r"
    fi
  done
done
wait_quiet 60 >/dev/null
sgemm1=$(sgemm_rate)
sgemm=$(printf '%s\n%s\n' "$sgemm0" "$sgemm1" | sort -g | tail -1)

# vals SHAPE SIDE [ROUND]: the runs' ms/step
vals() { awk -v s="$1" -v d="$2" -v r="${3:-}" '$1 == s && $2 == d && (r == "" || $3 == r) {print $4}' "$runs/results"; }
round_ratios() { # SHAPE: median(B of the round) / median(A of the round), one per round
  local r
  for r in $(seq "$rounds"); do
    awk -v a="$(vals "$1" A "$r" | median)" -v b="$(vals "$1" B "$r" | median)" \
      'BEGIN {printf "%.4f\n", b / a}'
  done
}
row() { # LABEL SHAPE
  local a b rr
  a=$(vals "$2" A | median); b=$(vals "$2" B | median)
  rr=$(round_ratios "$2" | sort -g)
  awk -v n="$1" -v a="$a" -v b="$b" -v q="$(echo "$rr" | median)" \
      -v lo="$(echo "$rr" | head -1)" -v hi="$(echo "$rr" | tail -1)" \
      -v k="$(vals "$2" A | wc -l)" \
      -v o="$(awk -v s="$2" '$1 == s {print $5}' "$runs/results" | sort -g | tail -1)" 'BEGIN {
    printf "| %s | %.1f | %.1f | %.3f | **%.3f** (%.3f-%.3f) | %d + %d | %s%% |\n",
      n, a, b, b / a, q, lo, hi, k, k, o }'
}
core() { local c; c=$(grep -o '"blas_core_note":"[^"]*"' "$runs/last.$1.jsonl" | head -1 | cut -d'"' -f4); echo "${c:-unknown}"; }

echo "A: $a_label ($(git log -1 --format=%s "$a_sha" | cut -c1-72))"
echo "B: $b_label"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; $threads threads per run"
echo "OpenBLAS core: A $(core A); B $(core B)${OPENBLAS_CORETYPE:+ (OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE)}"
echo "sgemm ceiling (B's bench_sgemm, $threads threads), before and after: $sgemm0, $sgemm1 GFLOP/s (best $sgemm)"
echo
echo "| shape | A ms/step | B ms/step | B / A | B / A, median of per-round ratios (range) | runs A + B | CPU used by others (max) |"
echo "|---|---|---|---|---|---|---|"
for s in $shapes; do
  case "$s" in
    tiny) row "tiny.cfg (4L 128d, T64; 4 micro-batches of 4)" tiny ;;
    124m) row "GPT-2 124M (T256, B4)" 124m ;;
  esac
done
echo
echo "A run's ms/step is its median step_ms over steady steps (tiny 5..59, 124M 1..5); a" \
     "side's ms/step is the median of its runs; B / A below 1 means B is faster."
echo
echo "runs, ms/step in ABBA order [CPU share other processes took]:"
for s in $shapes; do
  echo "- $s: $(awk -v s="$s" '$1 == s {printf("%s%s %.1f", (n++ ? ", " : ""), $2, $4); if ($5 > 0) printf(" [%s%%]", $5)}' "$runs/results")"
done
echo
echo "command: ${AB_SHAPES:+AB_SHAPES=\"$AB_SHAPES\" }$command  (rounds $rounds, shapes: $shapes, threads $threads)"
