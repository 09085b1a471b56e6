# Expert parallelism's token exchange (src/tensor/expert_dispatch.c, tests/mpi_expert_dispatch.c)
# on 1-4 ranks, oversubscribed: the rows each rank's experts receive, in expert order,
# and every result back at its row after the combine; E = ep, 2ep and 3ep, f32 and
# bf16, zero counts and a rank that routes nothing; host memory (mpi) and the strict
# backend's device memory through host bounce copies (mpi-staged). Seconds.
source "$(dirname "$0")/lib.sh"
prog="$(dirname "$TESSERA")/tests/mpi_expert_dispatch"
for backend in mpi mpi-staged; do
  for np in 1 2 3 4; do
    if timeout 60 mpirun --oversubscribe -np "$np" "$prog" "$backend" >"$TMP/out" 2>"$TMP/err"; then
      pass
    else
      fail "expert dispatch ($backend) on $np ranks"; cat "$TMP/out" "$TMP/err" >&2
    fi
  done
done
# Expert tensor parallelism's gather and sum (src/tensor/expert_tp.c, tests/mpi_expert_tp.c):
# 3 ranks (a rank with no rows, one with more than the mean) in host memory, 2 through
# the staged copies.
prog="$(dirname "$TESSERA")/tests/mpi_expert_tp"
for run in "mpi 3" "mpi-staged 2"; do
  read -r backend np <<< "$run"
  if timeout 60 mpirun --oversubscribe -np "$np" "$prog" "$backend" >"$TMP/out" 2>"$TMP/err"; then
    pass
  else
    fail "expert tensor-parallel exchange ($backend) on $np ranks"; cat "$TMP/out" "$TMP/err" >&2
  fi
done
finish
