# Shared helpers for the command-line tests (sourced). Each test is run by CTest as
#   bash tests/test_X.sh TESSERA_BINARY SOURCE_DIR
set -uo pipefail
TESSERA="$1"
SRC="$2"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
PASSED=0
FAILED=0

pass() { PASSED=$((PASSED + 1)); }
fail() { FAILED=$((FAILED + 1)); echo "FAIL: $*" >&2; }

# The strict device mode (CTest label "strict"): TS_TEST_DEVICE names the compute
# backend every training run of the test uses (train.device), e.g. "cpu-strict", whose
# device memory faults when host code touches it. Empty: the config's own ("cpu").
DEVICE_SETS=()
if [ -n "${TS_TEST_DEVICE:-}" ]; then DEVICE_SETS=(--set "train.device=\"$TS_TEST_DEVICE\""); fi

# run_np N ARGS...: tessera under mpirun with N ranks (oversubscribed, one BLAS thread
# per rank unless the test says otherwise). Output goes to $TMP/out, $TMP/err. A
# training run (ARGS start with "train") gets DEVICE_SETS last.
run_np() {
  local np="$1"; shift
  local extra=()
  if [ "${1:-}" = train ]; then extra=("${DEVICE_SETS[@]}"); fi
  timeout 120 mpirun --oversubscribe -np "$np" "$TESSERA" "$@" "${extra[@]}" >"$TMP/out" 2>"$TMP/err"
}

# expect_error NP PATTERN ARGS...: the run fails on every rank (non-zero exit), prints
# PATTERN (a grep -E regex) exactly once, and does not crash.
expect_error() {
  local np="$1" pattern="$2"; shift 2
  if run_np "$np" "$@"; then
    fail "expected failure ($pattern): tessera $*"
    return
  fi
  local rc=$?
  if [ "$rc" -eq 124 ]; then fail "timed out (hang?): tessera $*"; return; fi
  local count
  count=$(grep -cE -- "$pattern" "$TMP/err" || true)
  if [ "$count" -ne 1 ]; then
    fail "expected '$pattern' once in stderr, found $count times: tessera $*"
    sed 's/^/    /' "$TMP/err" >&2
    return
  fi
  if grep -qE "Segmentation|Aborted|core dumped|AddressSanitizer|runtime error" "$TMP/err"; then
    fail "crashed: tessera $*"
    sed 's/^/    /' "$TMP/err" >&2
    return
  fi
  pass
}

# A small byte-level corpus for tests: Debian's fortunes texts (installed by setup).
make_corpus() {
  local out="$1"
  cat /usr/share/games/fortunes/fortunes /usr/share/games/fortunes/literature > "$TMP/corpus.txt"
  "$TESSERA" data "$TMP/corpus.txt" "$out" >/dev/null
}

# losses FILE: the "loss" of every step line of a metrics file, one per line.
losses() {
  grep -o '"loss":[^,]*' "$1" | cut -d: -f2
}

finish() {
  echo "$PASSED passed, $FAILED failed"
  [ "$FAILED" -eq 0 ]
}

# norms FILE: the "grad_norm" of every step line of a metrics file, one per line.
norms() {
  grep -o '"grad_norm":[^,]*' "$1" | cut -d: -f2
}

# same_losses A B TOL: every step's loss and gradient norm in metrics file A are within
# relative TOL of B's (and both have the same number of steps).
same_losses() {
  local a="$1" b="$2" tol="$3"
  paste <(losses "$a") <(losses "$b") <(norms "$a") <(norms "$b") | awk -v tol="$tol" '
    NF != 4 { bad = 1; next }
    function rel(x, y,   d) { d = x - y; if (d < 0) d = -d; return d / (y < 0 ? -y : y) }
    { r = rel($1, $2); if (r > worst) worst = r; r = rel($3, $4); if (r > worst) worst = r; n++ }
    END { if (bad || n == 0 || worst > tol) { printf "worst relative difference (loss or grad_norm) %g over %d steps\n", worst, n; exit 1 } }'
}

# check NAME NP SETS...: run "${common[@]}" (the caller's array) on NP ranks with
# metrics to $TMP/NAME.jsonl; unless NAME is "ref", compare with $TMP/ref.jsonl
# (the one-rank run) to relative 1e-4.
check() {
  local name="$1" np="$2"; shift 2
  if run_np "$np" "${common[@]}" --set "log.metrics=\"$TMP/$name.jsonl\"" "$@"; then
    pass
    if [ "$name" != ref ]; then
      if out=$(same_losses "$TMP/$name.jsonl" "$TMP/ref.jsonl" 1e-4); then pass; else fail "$name vs one rank: $out"; fi
    fi
  else
    fail "run $name: $*"; sed 's/^/    /' "$TMP/err" >&2
  fi
}
