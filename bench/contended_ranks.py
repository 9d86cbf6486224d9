"""Small data-parallel jobs on a busy machine: is a slow rank found, and does the load alone page anyone?

Run:  OMP_NUM_THREADS=1 python bench/contended_ranks.py [--ranks 2 3 4] [--repeats 3] [--steps 200]

Beside one CPU-bound process per CPU (started here), each job of ``--ranks`` gloo ranks (spawned here)
trains a small MLP under DDP with the kit's ``Monitor``, which records each step's wait for a CPU
(``cpu_wait_time``). From step ``SLOW_FROM`` for ``SLOW_STEPS`` steps rank 1 sleeps, inside its compute,
the median CPU time its compute took so far: its own work doubles, as on a device half as fast. The run
is ingested and the detectors run over it in batch; per job the report gives the straggler finding on
rank 1 nearest the fault (onset, severity), every other warning of the performance family (what the load
alone made of the job), and each rank's median compute and wait before the fault.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from bedside.collectors.ingest import Collector
from bedside.collectors.kit import Monitor
from bedside.collectors.store import Store
from bedside.detectors import detect
from bedside.detectors.incidents import family_of
from bedside.detectors.kinds import Family

WIDTH, BATCH = 512, 128
SLOW_FROM, SLOW_STEPS = 130, 30


def rank_main(rank: int, world: int, run: str, port: int, steps: int) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world)
    )
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    layers = [nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 1)]
    model = DistributedDataParallel(nn.Sequential(*layers))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    monitor = Monitor(run, model, optimizer)
    batches = torch.Generator().manual_seed(rank + 1)
    own: list[float] = []
    for step in range(1, steps + 1):
        with monitor.step(step) as s:
            x = torch.randn(BATCH, WIDTH, generator=batches)
            s.compute()
            cpu = time.thread_time()
            loss = F.mse_loss(model(x), x[:, :1])
            if rank == 1 and SLOW_FROM <= step < SLOW_FROM + SLOW_STEPS:
                time.sleep(statistics.median(own))
            s.backward(loss)
            own.append(time.thread_time() - cpu)
            optimizer.step()
            optimizer.zero_grad()
    monitor.close()
    dist.destroy_process_group()


def one_job(ranks: int, steps: int, port: int) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        mp.spawn(rank_main, args=(ranks, str(run), port, steps), nprocs=ranks)
        store = Store.open(run / "bedside.duckdb")
        try:
            Collector(run, store).ingest_available()
            rank_steps = store.cursor().execute("SELECT * FROM rank_step_metrics").df()
        finally:
            store.close()
    findings = detect(rank_steps=rank_steps).findings
    near = [f for f in findings if f.kind == "straggler" and f.ranks == (1,) and f.start_step <= SLOW_FROM + 10]
    hit = [f for f in near if f.end_step >= SLOW_FROM + SLOW_STEPS - 1]
    found = f"onset {hit[-1].start_step} ({hit[-1].severity.value})" if hit else "missed"
    others = [
        f"{f.kind} {list(f.ranks)} from {f.start_step}"
        for f in findings
        if family_of(f.kind) == Family.PERFORMANCE and f.severity.value != "info" and f not in hit
    ]
    before = rank_steps[rank_steps["step"] < SLOW_FROM].groupby("rank")[["compute_time", "cpu_wait_time"]].median()
    times = ", ".join(
        f"r{r} {row.compute_time * 1e3:.1f}/{row.cpu_wait_time * 1e3:.1f} ms" for r, row in before.iterrows()
    )
    return f"{ranks} ranks: slow rank {found}; other warnings: {'; '.join(others) or 'none'}; compute/wait {times}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        port = 29700
        for ranks in args.ranks:
            for _ in range(args.repeats):
                port += 1
                print(one_job(ranks, args.steps, port), flush=True)
    finally:
        for spinner in spinners:
            spinner.kill()


if __name__ == "__main__":
    main()
