"""``simulate_run``: a simulated run (detectors/datasets) written in telemetry format v1."""

from __future__ import annotations

from pathlib import Path

from bedside.detectors.datasets import SimulationConfig, SimulationError, simulate

from .records import labels, run_info, step_fields
from .write import ChecksumFields, RunFiles, write_run


def simulate_run(config: SimulationConfig, out: Path) -> None:
    """Write the run ``config`` describes into ``out``, which must not exist or be empty.

    The same config (seed included) writes the same files, byte for byte.
    """
    out = Path(out)
    _require_empty(out)
    run = simulate(config)
    write_run(
        out,
        RunFiles(
            info=run_info(config, run.nuisances, out),
            topology=config.topology,
            timing=run.timing,
            local_grad=run.traces.local_grad,
            checksums=ChecksumFields(run.checksums, config.steps),
            schedule=run.schedule,
            steps=step_fields(config, run.traces),
            labels=labels(run),
            hung=frozenset(config.hang.ranks if config.hang else ()),
        ),
    )


def _require_empty(out: Path) -> None:
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        raise SimulationError(f"{out} already exists and is not empty: give a new --out directory")
