# torch.distributed.pipelining's seven schedules, as its _dump_csv writes them
# (tests/schedules/torch/, torch 2.15), train: every one at pp = 2 with m = 4
# micro-batches (and m = 8 for GPipe, 1F1B and interleaved zero bubble), and ZB-V,
# DualPipeV, interleaved 1F1B and looped BFS at pp = 4 with m = 8, give the one-rank
# losses and gradient norms within relative 1e-4 (test_pp_invariance's tolerance) for 6
# steps of the tiny config (TS_TEST_SWEEP_STEPS), and a rerun is bit-identical. The
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
# All seven at m = 4; m = 8 for the three that have no pp = 4 run below (each run costs
# about 2.5 s here: the test stays near a minute).
for sched in gpipe 1f1b; do
  torch_csv "$sched" 2 1 4 ref
  torch_csv "$sched" 2 1 8 ref
done
for sched in interleaved1f1b loopedbfs interleavedzerobubble zbvzerobubble dualpipev; do
  torch_csv "$sched" 2 2 4 ref
done
torch_csv interleavedzerobubble 2 2 8 ref

# pp = 4 with v = 2 is 8 chunks: 6 blocks + embedding + head, one layer each.
run_csv ref6 1 - --set model.n_layer=6
for sched in zbvzerobubble dualpipev interleaved1f1b loopedbfs; do
  torch_csv "$sched" 4 2 8 ref6 --set model.n_layer=6
done

# The same run twice is bit-identical (DualPipeV: V placement and overlapped pairs).
run_csv dualpipev_again 2 ref --set parallel.pp=2 --set parallel.virtual_stages=2 --set parallel.micro_batch=4 \
  --set "parallel.schedule=\"$fixtures/dualpipev_pp2_v2_m4.csv\""
if [ -s "$TMP/dualpipev_again.jsonl" ] &&
   cmp -s <(losses "$TMP/dualpipev_pp2_m4.jsonl"; norms "$TMP/dualpipev_pp2_m4.jsonl") \
          <(losses "$TMP/dualpipev_again.jsonl"; norms "$TMP/dualpipev_again.jsonl"); then pass
else fail "dualpipev pp=2 m=4 run twice is not bit-identical"; fi
finish
