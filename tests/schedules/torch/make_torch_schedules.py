#!/usr/bin/env python3
"""Dump torch.distributed.pipelining's seven schedules as compute-only CSV fixtures.

Made with PyTorch 2.15.0 (2.15.0+cu132 from PyPI) by

    /tmp/tv/bin/python tests/schedules/torch/make_torch_schedules.py

from the repository root (any venv with torch >= 2.15 will do; no GPU, no process
group: the schedules are built on mock stage objects, as torch's own tests do). CI
never runs this script; the CSVs next to it are committed, and rerunning it with the
same torch gives byte-identical files.

Writes tests/schedules/torch/<name>_pp<P>_v<V>_m<M>.csv for pp in {2, 4}, m in {4, 8},
v = 2 for the multi-stage schedules and v = 1 for GPipe and 1F1B, where <name> is the
class name without "Schedule", lower-cased: gpipe, 1f1b, interleaved1f1b, loopedbfs,
interleavedzerobubble, zbvzerobubble, dualpipev. torch refuses DualPipeV with fewer
micro-batches than stages (pp = 4, m = 4: 8 stages); that one is not written.

How each order is obtained:
  * The five multi-stage schedules (_PipelineScheduleRuntime subclasses): the class is
    constructed on mock stages of rank 0 (every rank computes the whole pipeline_order)
    and written by its own _dump_csv(path, format="compute_only").
  * GPipe and 1F1B (PipelineScheduleSingle) have no _dump_csv. Their
    _get_pipeline_order IR is not what they run: it carries REDUCE_GRAD and
    WAIT_REDUCE_GRAD cells (not compute actions: torch's own compute-only loader refuses
    them), and for 1F1B it is wrong on the last rank (torch 2.15 lists F1..Fm there,
    never F0, so micro-batch m does not exist; tessera refuses such a file). So the
    order written is the one torch *executes*: each rank's _step_microbatches is run on
    a mock stage that records every forward_one_chunk / backward_one_chunk call (no
    tensors, no communication), one row per rank, written with csv.writer exactly as
    _dump_csv writes its rows. The script prints where that differs from the IR.
Every file is then loaded back by torch's own _PipelineScheduleRuntime._load_csv
(compute-only: its validation infers the stage -> rank map and lowers the schedule to
sends and receives) to prove it is a CSV torch itself accepts.
"""
import csv
import os
import sys

import torch
from torch.distributed.pipelining import schedules as S
from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping

OUT = os.path.dirname(os.path.abspath(__file__))

MULTI = [
    S.ScheduleInterleaved1F1B,
    S.ScheduleLoopedBFS,
    S.ScheduleInterleavedZeroBubble,
    S.ScheduleZBVZeroBubble,
    S.ScheduleDualPipeV,
]
SINGLE = [S.ScheduleGPipe, S.Schedule1F1B]
V_STYLE = (S.ScheduleZBVZeroBubble, S.ScheduleDualPipeV)


class MockStage:
    """The attributes the schedule constructors read (num_stages, group_size, group_rank,
    stage_index, submod, ...), like torch's tests' MockPipelineStage; for the
    single-stage schedules also the calls _step_microbatches makes, recorded."""

    def __init__(self, stage_index, num_stages, group_size, group_rank):
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.group_size = group_size
        self.group_rank = group_rank
        self.group = None
        self.submod = None
        self.is_first = stage_index == 0
        self.is_last = stage_index == num_stages - 1
        self.stage_index_to_group_rank = {}
        self.has_backward = True
        self.log = []

    # _step_microbatches of GPipe and 1F1B: no communication, record the compute.
    def get_fwd_recv_ops(self, mb):
        return []

    def get_fwd_send_ops(self, mb):
        return []

    def get_bwd_recv_ops(self, mb):
        return []

    def get_bwd_send_ops(self, mb):
        return []

    def release_fwd_send_outputs(self, mb):
        pass

    def perform_reduce_grad(self, grad_scale_factor):
        pass

    def forward_one_chunk(self, mb, args, kwargs, save_forward_output=True):
        self.log.append(S._Action(self.stage_index, S.FORWARD, mb))
        return None

    def backward_one_chunk(self, mb, loss=None, last_backward=False):
        self.log.append(S._Action(self.stage_index, S.FULL_BACKWARD, mb))


def fixture_name(cls, pp, v, m):
    name = cls.__name__.removeprefix("Schedule").lower()
    return f"{name}_pp{pp}_v{v}_m{m}.csv"


def write_rows(path, rows):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        for row in rows:
            writer.writerow(row)


def dump_multi(cls, pp, m, path):
    v = 2
    n = pp * v
    style = "v" if cls in V_STYLE else "loop"
    stage_rank = generate_stage_to_rank_mapping(pp, n, style=style)
    stages = [MockStage(s, n, pp, 0) for s in range(n) if stage_rank[s] == 0]
    sched = cls(stages, m)
    sched._dump_csv(path, format="compute_only")


def executed_order(cls, pp, m):
    """Each rank's compute actions in the order torch's _step_microbatches runs them."""
    rows = []
    for r in range(pp):
        stage = MockStage(r, pp, pp, r)
        sched = cls(stage, m)
        sched._initialize_stage = lambda *a, **k: None  # no process group, no shapes
        sched._step_microbatches()
        rows.append(stage.log)
    ir = sched.pipeline_order  # the same for every rank
    ir_rows = [[a for a in ir[r] if a is not None and a.computation_type in (S.F, S.B)]
               for r in range(pp)]
    for r in range(pp):
        if ir_rows[r] != rows[r]:
            print(f"  note: {cls.__name__} pp={pp} m={m} rank {r}: _get_pipeline_order says "
                  f"{','.join(map(str, ir_rows[r]))} but it runs {','.join(map(str, rows[r]))}")
    return rows


def check_loads_in_torch(path, pp, v, m):
    """torch's own compute-only loader accepts the file (validation + lowering)."""
    n = pp * v
    stages = [MockStage(s, n, pp, 0) for s in range(0, n, pp)]
    runtime = S._PipelineScheduleRuntime(stages, m)
    runtime._load_csv(path, format="compute_only")


def main():
    print(f"torch {torch.__version__}")
    written = []
    for pp in (2, 4):
        for m in (4, 8):
            for cls in SINGLE + MULTI:
                v = 1 if cls in SINGLE else 2
                path = os.path.join(OUT, fixture_name(cls, pp, v, m))
                try:
                    if cls in SINGLE:
                        write_rows(path, executed_order(cls, pp, m))
                    else:
                        dump_multi(cls, pp, m, path)
                except ValueError as e:  # torch refuses this (pp, m)
                    print(f"  skipped {os.path.basename(path)}: torch says: {e}")
                    continue
                check_loads_in_torch(path, pp, v, m)
                written.append(os.path.basename(path))
    print(f"wrote {len(written)} fixtures to {OUT}:")
    for name in written:
        print(f"  {name}")
    return 0


if __name__ == "__main__":
    sys.dont_write_bytecode = True
    sys.exit(main())
