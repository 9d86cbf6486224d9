"""``bedside simulate``: write a synthetic run with labeled faults and realistic nuisances."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bedside.collectors.errors import BedsideError
from bedside.detectors.datasets import defaults

from .options import integer_in

MAX_RANKS = 65536


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``bedside simulate``."""
    p = commands.add_parser(
        "simulate",
        help="write a synthetic run at any scale, with labeled faults",
        description="Write synthetic telemetry (format v1) of a synchronous data x pipeline "
        "parallel job into RUN, with injected faults labeled in RUN/ground_truth/ "
        "and nuisances that must not alarm (docs/simulate.md).",
    )
    p.add_argument("--ranks", type=integer_in(1, MAX_RANKS), required=True, metavar="N", help="world size")
    p.add_argument("--steps", type=integer_in(1), required=True, metavar="M", help="optimizer steps")
    p.add_argument("--out", type=Path, required=True, metavar="RUN", help="run directory to create (new or empty)")
    p.add_argument(
        "--inject",
        action="append",
        default=[],
        metavar="SPEC",
        help="inject a fault, e.g. straggler:rank=3,factor=1.5,from=100; repeatable",
    )
    for flag, low, default, metavar, text in (
        ("--seed", 0, defaults.SEED, "S", "random seed"),
        ("--ranks-per-host", 1, defaults.RANKS_PER_HOST, "K", "ranks per host"),
        ("--pp", 1, defaults.PIPELINE_STAGES, "P", "pipeline stages; must divide --ranks"),
        ("--eval-every", 0, defaults.EVAL_EVERY, "N", "held-out eval every N steps, 0 for none"),
        ("--checkpoint-every", 0, defaults.CHECKPOINT_EVERY, "N", "checkpoint every N steps, 0 for none"),
        ("--checksum-every", 1, defaults.CHECKSUM_EVERY, "N", "parameter checksum every N steps"),
    ):
        p.add_argument(
            flag, type=integer_in(low), default=default, metavar=metavar, help=f"{text} (default %(default)s)"
        )
    p.add_argument(
        "--noise",
        choices=defaults.NOISE_FAMILIES,
        default=defaults.NOISE,
        help="noise family of step times, losses and norms (default %(default)s)",
    )
    p.add_argument(
        "--no-nuisances",
        dest="nuisances",
        action="store_false",
        help="a clean run: no LR schedule, stalls, slowdowns, jitter, mixture switch or resume",
    )
    p.set_defaults(handler=cmd_simulate)


def cmd_simulate(args: argparse.Namespace) -> int:
    """Build the config (one error line when it is wrong), write the run, say what was written."""
    from .simulation import SimulationConfig, SimulationError, simulate_run

    started = time.perf_counter()
    try:
        config = SimulationConfig(
            ranks=args.ranks,
            steps=args.steps,
            seed=args.seed,
            ranks_per_host=args.ranks_per_host,
            pp=args.pp,
            eval_every=args.eval_every,
            checkpoint_every=args.checkpoint_every,
            checksum_every=args.checksum_every,
            noise=args.noise,
            nuisances=args.nuisances,
            inject=tuple(args.inject),
        )
        simulate_run(config, args.out)
    except SimulationError as exc:
        raise BedsideError(str(exc)) from None
    faults = f"{len(config.faults)} fault" + ("" if len(config.faults) == 1 else "s")
    print(
        f"simulated {config.ranks} ranks x {config.last_step} steps with {faults} into {args.out} "
        f"in {time.perf_counter() - started:.1f} s; next: bedside collect {args.out}",
        file=sys.stderr,
    )
    return 0
