"""A plain training loop (not bedside's trainer) that takes control requests through the kit's ControlClient.

``python -m torch.distributed.run --nproc-per-node 2 tests/kit_control_loop.py RUN OUT [--restart]``: every rank
reads batches of four sample ids from a SkippingSampler over a BatchSampler of 0..9999, one batch a step,
and calls ``client.at_step_boundary(step)`` before each step; a rewind request calls ``load_checkpoint``,
which sets the loop's step back. The loop runs until a stop request (first run) or for five steps (with
``--restart``: after restoring the client's and the sampler's state from the first run's checkpoint).
Each rank writes ``OUT/rank-N.json``: the steps at which its rewinds were applied, the batches it trained.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch.distributed as dist
from torch.utils.data import BatchSampler, SequentialSampler

from bedside.collectors.kit import Action, ControlClient, SkippingSampler
from bedside.collectors.writer import RunLogger
from bedside.trainer.train import exit_without_teardown

MAX_STEPS = 3000


def main(run: Path, out: Path, restart: bool) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    log = RunLogger(run, name="kit-loop", resume=restart)
    step, rewinds, trained = 0, [], []

    def load_checkpoint(action: Action) -> str:
        nonlocal step
        rewinds.append({"at": step, "to": action.args["to_step"]})
        action.step = step = action.args["to_step"]
        return f"loaded the checkpoint of step {step}"

    client = ControlClient(log, on_rewind=load_checkpoint)
    sampler = SkippingSampler(BatchSampler(SequentialSampler(range(10_000)), batch_size=4, drop_last=True), client)
    checkpoint = out / f"checkpoint-{rank}.json"
    if restart:
        saved = json.loads(checkpoint.read_text())
        step = saved["step"]
        sampler.load_state_dict(saved["sampler"])
        client.load_state_dict(saved["control"], step)
    batches = iter(sampler)
    last = step + 5 if restart else MAX_STEPS
    while step < last and client.at_step_boundary(step):
        trained.append(next(batches))
        step += 1
        log.rank_step(step, step_time=0.01)
        time.sleep(0.01)
    checkpoint.write_text(json.dumps({"step": step, "sampler": sampler.state_dict(), "control": client.state_dict()}))
    client.close(step)
    log.close()
    (out / f"rank-{rank}{'-restart' if restart else ''}.json").write_text(
        json.dumps({"rewinds": rewinds, "trained": trained, "pid": os.getpid()})
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), "--restart" in sys.argv[3:])
    exit_without_teardown()  # torch's teardown has aborted a finished rank (terminate called without ...)
