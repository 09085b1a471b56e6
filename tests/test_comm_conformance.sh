# The comm backends' conformance tests (tests/mpi_comm_conformance.c) on 2, 3 and 4
# ranks (2 and 3 under the sanitizers), oversubscribed: every data-plane call, on the
# world and split and duplicated sub-groups, with exact expected values; the control
# plane's reductions, broadcast, gathers and agreement. Both MPI backends every time: mpi
# (host memory) and mpi-staged (device memory through host bounce buffers). TS_COMM_BACKEND names others instead.
source "$(dirname "$0")/lib.sh"
prog="$(dirname "$TESSERA")/tests/mpi_comm_conformance"
# Under the sanitizers 2 and 3 ranks (an even and an odd group, uneven splits), each
# 2-3x slower there; the release build adds 4 (docs/CI.md: CI time).
ranks="2 3 4"
[ "${TS_TEST_SANITIZERS:-0}" = 1 ] && ranks="2 3"
for backend in ${TS_COMM_BACKEND:-mpi mpi-staged}; do
  for np in $ranks; do
    start=$(date +%s%N)
    if timeout 60 mpirun --oversubscribe -np "$np" "$prog" "$backend" >"$TMP/out" 2>"$TMP/err"; then
      pass
      echo "$np ranks ($backend): $(( ($(date +%s%N) - start) / 1000000 )) ms"
      cat "$TMP/out"
    else
      fail "comm conformance ($backend) on $np ranks"; cat "$TMP/out" "$TMP/err" >&2
    fi
  done
done

# mpi-staged used before ts_comm_staged_set_copies: an abort that says why.
if timeout 60 mpirun --oversubscribe -np 2 "$prog" --no-copies >"$TMP/out" 2>"$TMP/err"; then
  fail "mpi-staged without its copies did not abort"; cat "$TMP/out" "$TMP/err" >&2
elif ! grep -q "used before ts_comm_staged_set_copies" "$TMP/err"; then
  fail "mpi-staged without its copies: no message naming ts_comm_staged_set_copies"
  cat "$TMP/out" "$TMP/err" >&2
else
  pass
fi
finish
