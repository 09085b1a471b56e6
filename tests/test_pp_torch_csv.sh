# torch.distributed.pipelining's seven schedules, as its _dump_csv writes them
# (tests/schedules/torch/, torch 2.15), train: every one at pp = 2 with m = 4
# micro-batches, and ZB-V, DualPipeV, interleaved 1F1B and looped BFS at pp = 4 with
# m = 8, give the one-rank losses and gradient norms within relative 1e-4
# (test_pp_invariance's tolerance) for 6 steps of the tiny config (4 under the
# sanitizers: TS_TEST_SWEEP_STEPS). The
# V-placed ones (ZB-V, DualPipeV) keep the LM head on rank 0 with the embedding, and
# DualPipeV's overlapped F/B pairs run in turn.
source "$(dirname "$0")/lib.sh"

make_corpus "$TMP/train.bin"
common=(train "$SRC/configs/tiny.cfg" --set "train.steps=${TS_TEST_SWEEP_STEPS:-6}" --set "data.train=\"$TMP/train.bin\""
        --set 'data.val=""' --set train.threads=1 --set log.progress=false)
fixtures="$SRC/tests/schedules/torch"

# run_csv NAME NP REF SETS...: "${common[@]}" SETS on NP ranks, metrics to $TMP/NAME.jsonl,
# the losses and gradient norms within relative 1e-4 of $TMP/REF.jsonl's (REF "-": the
# run is a reference itself).
run_csv() {
  local name="$1" np="$2" ref="$3" out; shift 3
  if run_np "$np" "${common[@]}" --set "log.metrics=\"$TMP/$name.jsonl\"" "$@"; then
    pass
    [ "$ref" = - ] && return
    if out=$(same_losses "$TMP/$name.jsonl" "$TMP/$ref.jsonl" 1e-4); then pass; else fail "$name vs one rank: $out"; fi
  else
    fail "run $name: $*"; sed 's/^/    /' "$TMP/err" >&2
  fi
}

# torch_csv SCHEDULE PP V M REF [SETS...]: the fixture SCHEDULE_ppPP_vV_mM.csv on PP
# ranks, m micro-batches of the tiny config's global batch of 16 (micro_batch 16 / M).
torch_csv() {
  local sched="$1" pp="$2" v="$3" m="$4" ref="$5"; shift 5
  run_csv "${sched}_pp${pp}_m${m}" "$pp" "$ref" --set parallel.pp="$pp" --set parallel.virtual_stages="$v" \
    --set parallel.micro_batch=$((16 / m)) --set "parallel.schedule=\"$fixtures/${sched}_pp${pp}_v${v}_m${m}.csv\"" "$@"
}

check ref 1
# All seven at m = 4 (each run costs about 2.5 s here). The orders are tessera's
# built-ins of the same names action for action (test_schedule_torch), so the other
# micro-batch counts, partitions and recompute modes are test_pp_invariance's and
# test_pp_schedules' (which also reruns DualPipe-V bit for bit).
for sched in gpipe 1f1b; do
  torch_csv "$sched" 2 1 4 ref
done
for sched in interleaved1f1b loopedbfs interleavedzerobubble zbvzerobubble dualpipev; do
  torch_csv "$sched" 2 2 4 ref
done

# pp = 4 with v = 2 is 8 chunks: 6 blocks + embedding + head, one layer each.
run_csv ref6 1 - --set model.n_layer=6
for sched in zbvzerobubble dualpipev interleaved1f1b loopedbfs; do
  torch_csv "$sched" 4 2 8 ref6 --set model.n_layer=6
done

finish
