# Slurm for real: bring up a private one-node cluster (munged, slurmctld, slurmd from
# Debian's packages; tests/slurm/cluster.sh), launch a two-rank data-parallel
# `tessera train` with srun --mpi=pmix, and through configs/sbatch/gpt2-124m.sbatch
# (with the tiny config), and check both give the mpirun run's losses bit for bit;
# sbatch --test-only accepts configs/sbatch/train_requeue.sbatch.
# Skips (exit 77) with the reason where the machine cannot run the daemons; fails when
# the cluster came up but a launch or a comparison is wrong. Stops what it started.
source "$(dirname "$0")/lib.sh"
source "$SRC/tests/slurm/cluster.sh"

for cmd in slurmctld slurmd srun sbatch sinfo scancel munged munge unmunge; do
  command -v "$cmd" >/dev/null || skip_test "$cmd not installed (scripts/setup.sh installs Slurm and munge)"
done
[ "$(id -u)" -eq 0 ] || skip_test "slurmd has to run as root to launch job steps"

TESSERA="$(readlink -f "$TESSERA")"   # jobs run in $TMP
D="$TMP/slurm"
at_exit 'slurm_cluster_down "$D"'
trap 'exit 143' TERM
trap 'exit 130' INT

# The mpirun reference first: it needs no cluster.
make_corpus "$TMP/train.bin"
common=(train "$SRC/configs/tiny.cfg" --set parallel.dp=2 --set train.steps=5
        --set "data.train=\"$TMP/train.bin\"" --set 'data.val=""' --set data.eval_every=0
        --set train.threads=1)
if run_np 2 "${common[@]}" --set "log.metrics=\"$TMP/mpirun.jsonl\""; then pass; else
  fail "mpirun reference run"; cat "$TMP/err" >&2; finish; exit; fi
[ "$(losses "$TMP/mpirun.jsonl" | wc -l)" -eq 5 ] && pass || fail "mpirun run: expected 5 step lines"

start=$SECONDS
slurm_cluster_up "$D" || skip_test "cannot bring up a one-node Slurm cluster here: $SLURM_CLUSTER_ERROR"
echo "cluster up in $((SECONDS - start)) s (SLURM_CONF=$SLURM_CONF)"

timeout 10 srun --mpi=list >"$TMP/mpilist" 2>&1
grep -qw pmix "$TMP/mpilist" && pass || { fail "Slurm has no PMIx plugin:"; cat "$TMP/mpilist" >&2; }

# The tasks really are Slurm's: ranks 0 and 1 of a two-task step, PMIx ranks to match.
timeout 60 srun --mpi=pmix -N 1 -n 2 bash -c 'echo "$SLURM_PROCID/$SLURM_NTASKS/${PMIX_RANK:-none}"' \
  >"$TMP/ids" 2>"$TMP/ids.err"
if [ "$(sort "$TMP/ids" | tr '\n' ' ')" = "0/2/0 1/2/1 " ]; then pass; else
  fail "srun --mpi=pmix -n 2: expected SLURM_PROCID/SLURM_NTASKS/PMIX_RANK 0/2/0 and 1/2/1, got: $(tr '\n' ' ' < "$TMP/ids")"
  cat "$TMP/ids.err" >&2
fi

# tessera train under srun: the same losses as mpirun's. (A rank that missed the
# PMIx wire-up would be a singleton, and tessera refuses dp=2 on one rank.)
if timeout 60 srun --mpi=pmix -N 1 -n 2 --export=ALL,OMP_NUM_THREADS=1 "$TESSERA" "${common[@]}" \
     --set "log.metrics=\"$TMP/srun.jsonl\"" >"$TMP/srun.out" 2>"$TMP/srun.err"; then
  pass
  [ "$(losses "$TMP/srun.jsonl" | wc -l)" -eq 5 ] && pass || fail "srun run: expected 5 step lines"
  if cmp -s <(losses "$TMP/mpirun.jsonl") <(losses "$TMP/srun.jsonl"); then pass; else
    fail "srun and mpirun losses differ"; paste <(losses "$TMP/mpirun.jsonl") <(losses "$TMP/srun.jsonl") >&2
  fi
else
  fail "srun --mpi=pmix -n 2 tessera train (exit $?)"; tail -20 "$TMP/srun.err" >&2
fi

# The shipped sbatch script, scaled down to this node: 1 node x 2 ranks x 1 core, the
# tiny config, micro-batches of 4 and 2 of them per step = the reference's batch.
if TESSERA="$TESSERA" TESSERA_CONFIG="$SRC/configs/tiny.cfg" MICRO_BATCH=4 GRAD_ACCUM=2 \
   timeout 90 sbatch --wait --quiet -N 1 --ntasks-per-node=2 --cpus-per-task=1 --time=5 \
     --chdir="$TMP" --output="$TMP/sbatch.out" "$SRC/configs/sbatch/gpt2-124m.sbatch" \
     --set train.steps=5 --set "data.train=\"$TMP/train.bin\"" --set 'data.val=""' \
     --set data.eval_every=0 --set "log.metrics=\"$TMP/sbatch.jsonl\"" >"$TMP/sbatch.err" 2>&1; then
  pass
  if cmp -s <(losses "$TMP/mpirun.jsonl") <(losses "$TMP/sbatch.jsonl"); then pass; else
    fail "sbatch and mpirun losses differ"; paste <(losses "$TMP/mpirun.jsonl") <(losses "$TMP/sbatch.jsonl") >&2
  fi
else
  fail "sbatch --wait configs/sbatch/gpt2-124m.sbatch (exit $?)"
  cat "$TMP/sbatch.err" >&2; tail -20 "$TMP/sbatch.out" >&2 2>/dev/null
fi

# The requeueing job script: bash parses it, and sbatch accepts its #SBATCH lines
# (--signal, --requeue, --open-mode) on this node (--test-only submits nothing).
rq="$SRC/configs/sbatch/train_requeue.sbatch"
if bash -n "$rq" && timeout 20 sbatch --test-only -N 1 --ntasks-per-node=2 --cpus-per-task=1 \
     "$rq" >"$TMP/test-only.out" 2>&1; then pass; else
  fail "sbatch --test-only configs/sbatch/train_requeue.sbatch"; cat "$TMP/test-only.out" >&2
fi

finish
