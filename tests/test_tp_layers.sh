# Layer-level tensor-parallel tests on 2, 3 and 4 ranks (tests/mpi_tp_layers.c): the
# vocabulary splits unevenly on each.
source "$(dirname "$0")/lib.sh"
prog="$(dirname "$TESSERA")/tests/mpi_tp_layers"
for np in 2 3 4; do
  if timeout 120 mpirun --oversubscribe -np "$np" "$prog" >"$TMP/out" 2>"$TMP/err"; then
    pass; cat "$TMP/out"
  else
    fail "tensor-parallel layers on $np ranks"; cat "$TMP/out" "$TMP/err" >&2
  fi
done
finish
