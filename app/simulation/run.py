"""``simulate_run``: a synthetic run in telemetry format v1, with labeled faults and realistic nuisances."""
from __future__ import annotations

from pathlib import Path

from .checksums import Checksums
from .config import SimulationConfig
from .effects import apply_fault
from .errors import SimulationError
from .models import build_traces
from .nuisances import apply_nuisances, draw_nuisances
from .records import eval_fields, labels, nonfinite_logs, run_info, step_fields
from .schedule import build_schedule
from .traces import compose_timing
from .write import RunFiles, write_run


def simulate_run(config: SimulationConfig, out: Path) -> None:
    """Write the run ``config`` describes into ``out``, which must not exist or be empty.

    The same config (seed included) writes the same files, byte for byte.
    """
    out = Path(out)
    _require_empty(out)
    nuisances = draw_nuisances(config)
    traces = build_traces(config, nuisances.warmup, nuisances.anneal)
    apply_nuisances(nuisances, traces, config)
    for fault in config.faults:
        apply_fault(fault, traces, config)
    timing = compose_timing(traces)
    schedule = build_schedule(config, nuisances, timing.step_time, eval_fields(config, traces, nuisances),
                              nonfinite_logs(traces))
    step_start = schedule.step_end - timing.step_time[:config.last_step]
    write_run(out, RunFiles(info=run_info(config, nuisances, out), topology=config.topology, timing=timing,
                            local_grad=traces.local_grad, checksums=Checksums(config, traces.corruptions),
                            schedule=schedule, steps=step_fields(config, traces),
                            labels=labels(config, step_start, schedule.idle_from),
                            hung=frozenset(config.hang.ranks if config.hang else ())))


def _require_empty(out: Path) -> None:
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        raise SimulationError(f"{out} already exists and is not empty: give a new --out directory")
