# The OpenBLAS kernel at start-up: when OpenBLAS falls back to a generic core on a CPU
# that runs a better one, tessera re-executes itself with OPENBLAS_CORETYPE set (no user
# action), says which kernel it runs, and writes it to the metrics' first line; a user's
# OPENBLAS_CORETYPE is respected with a warning. TS_FAKE_BLAS_CORE pretends OpenBLAS
# chose a core, as on a CPU it misdetects (Sapphire Rapids -> Prescott).
source "$(dirname "$0")/lib.sh"

if ! grep -qw avx2 /proc/cpuinfo || ! grep -qw fma /proc/cpuinfo; then
  skip_test "this CPU has no AVX2/FMA, so no OpenBLAS core beats the generic one"
fi
want=Haswell
grep -qw avx512f /proc/cpuinfo && grep -qw avx512bw /proc/cpuinfo && grep -qw avx512vl /proc/cpuinfo &&
  grep -qw avx512dq /proc/cpuinfo && want=SkylakeX

# The cases below are about what tessera does when the user has not chosen a core; the
# environment that runs the suite may have (CI exports OPENBLAS_CORETYPE=Haswell), so each
# case sets the variable itself.
unset OPENBLAS_CORETYPE

make_corpus "$TMP/train.bin"
args=(train "$SRC/configs/tiny.cfg" --set "data.train=\"$TMP/train.bin\"" --set 'data.val=""'
      --set train.steps=1 --set train.threads=1 --set "log.metrics=\"$TMP/m.jsonl\"")

# A misdetected CPU: re-executed with the best core, on one rank and under mpirun.
for np in 1 2; do
  extra=()
  [ "$np" -eq 2 ] && extra=(--set parallel.dp=2 --set parallel.micro_batch=2)
  if TS_FAKE_BLAS_CORE=Prescott timeout 120 mpirun --oversubscribe -np "$np" -x TS_FAKE_BLAS_CORE \
       "$TESSERA" "${args[@]}" "${extra[@]}" >"$TMP/out" 2>"$TMP/err" &&
     grep -q "blas: OpenBLAS core $want (chosen by Tessera: OpenBLAS picked Prescott" "$TMP/err" &&
     head -1 "$TMP/m.jsonl" | grep_q "\"blas_core\":\"$want\"" &&
     head -1 "$TMP/m.jsonl" | grep_q -E '"blas_gflops":\[[0-9.]+(,[0-9.]+){'"$((np - 1))"'}\]'; then
    pass
  else
    fail "re-execution with $want on $np rank(s)"; sed 's/^/    /' "$TMP/err" >&2; head -1 "$TMP/m.jsonl" >&2
  fi
done

# The user's choice stands, with one warning saying what to do.
if OPENBLAS_CORETYPE=Prescott timeout 120 "$TESSERA" "${args[@]}" >"$TMP/out" 2>"$TMP/err" &&
   grep -q "blas: OpenBLAS core Prescott (set by OPENBLAS_CORETYPE)" "$TMP/err" &&
   [ "$(grep -c "warning: OPENBLAS_CORETYPE=Prescott runs OpenBLAS's Prescott kernel.*unset OPENBLAS_CORETYPE" "$TMP/err")" -eq 1 ]; then
  pass
else
  fail "user's OPENBLAS_CORETYPE"; sed 's/^/    /' "$TMP/err" >&2
fi

# A user's AVX2 core on an AVX-512 CPU is not a generic fallback: kept, no warning, no
# re-execution (the environment CI runs the suite in sets exactly this).
if [ "$want" = SkylakeX ]; then
  if OPENBLAS_CORETYPE=Haswell timeout 120 "$TESSERA" "${args[@]}" >"$TMP/out" 2>"$TMP/err" &&
     grep -q "blas: OpenBLAS core Haswell (set by OPENBLAS_CORETYPE)" "$TMP/err" &&
     ! grep -q "warning: OPENBLAS_CORETYPE" "$TMP/err"; then
    pass
  else
    fail "user's AVX2 core on an AVX-512 CPU"; sed 's/^/    /' "$TMP/err" >&2
  fi
fi

# A core OpenBLAS detected for real is kept as it is.
if timeout 120 "$TESSERA" "${args[@]}" >"$TMP/out" 2>"$TMP/err" &&
   grep -q "(OpenBLAS's choice)" "$TMP/err" && ! grep -q "chosen by Tessera" "$TMP/err"; then
  pass
else
  fail "OpenBLAS's own choice"; sed 's/^/    /' "$TMP/err" >&2
fi
finish
