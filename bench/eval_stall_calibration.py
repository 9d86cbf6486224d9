"""The eval-stall detector's calibration: false stalls on stall-free eval curves next to recall on stalled ones.

Run:  OMP_NUM_THREADS=1 python bench/eval_stall_calibration.py [--runs 300] [--seed 0] [--band-z 3.0] [--no-lr]

``--runs`` stall-free curves and as many stalled ones, each drawn from its own seed (``tests/eval_curves.py``:
power law, exponential saturation, warmup, cosine decay, LR drop; normal, Student-t(3) and AR(1) noise of 0.2-2%;
10-60 evals), go through ``EvalStallDetector`` with the training loss between the evals and the LR of the curve's
schedule (``--no-lr``: none, as a run that logs no LR). Printed: the share
of stall-free runs with any finding (target <= 2%) and, over the stalls the clean curve makes detectable
(it would have fallen by 6 noise sigmas within 3 evals), the share found within 3 eval intervals of the onset
(target >= 0.9); then the false stalls per shape and recall over every stall.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from eval_curves import DETECTABLE_SIGMA, calibrate  # the generator lives with the tests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300, help="stall-free curves, and as many stalled ones")
    parser.add_argument("--seed", type=int, default=0, help="the first curve's seed")
    parser.add_argument("--band-z", type=float, default=None, help="the detector's band_z (default: its own)")
    parser.add_argument("--no-lr", action="store_true", help="the runs report no learning rate (compute only)")
    args = parser.parse_args()
    settings = {} if args.band_z is None else {"band_z": args.band_z}
    started = time.perf_counter()
    cal = calibrate(args.runs, first_seed=args.seed, report_lr=not args.no_lr, **settings)
    print("| false stalls (stall-free runs) | recall within 3 evals (detectable stalls) |")
    print("|---|---|")
    print(
        f"| {cal.false_stall_rate:.1%} ({cal.false_stalls}/{cal.clean_runs}) | "
        f"{cal.recall_within_3:.2f} ({cal.found_within_3}/{cal.detectable}) |"
    )
    print()
    print("| shape | false stalls |")
    print("|---|---|")
    for shape, (false, runs) in cal.false_by_shape.items():
        print(f"| {shape} | {false}/{runs} |")
    print()
    print(f"detectable: the clean curve falls by >= {DETECTABLE_SIGMA:g} noise sigmas within 3 evals of the onset")
    print(
        f"every stall: found within 3 evals {cal.found_within_3_all}/{cal.stalled_runs}, "
        f"found at all {cal.found_ever}/{cal.stalled_runs}"
    )
    print(f"{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
