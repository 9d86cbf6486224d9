"""Named scalars of foreign loggers (TensorBoard, W&B) become import rows: renamed, placed at job or rank level.

A *source* is what one writer logged: a whole run (``rank`` None), or one rank's directory. Where a scalar
goes depends on its bedside name (``NameMap``) and its source:

- a per-rank canonical metric (``step_time``, ...) goes to the source's rank (rank 0 for a whole run);
- a job-level canonical metric (``loss``, ``lr``, ``eval/...``, ...) goes to the job-level ``step`` from the
  source that speaks for the job (the run's top directory, or rank 0 when there is none); from any other rank
  it is kept on that rank as ``local_<name>`` (Lightning's convention for a rank's own loss);
- any other name is a user metric: job level from a whole run, per rank from a rank's directory.

Two names that become one at the same step are an error naming both (pick one with ``--map``); one name
logged again at a step it already has keeps the later value (counted in a warning).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..bounded import short
from ..errors import ImportFormatError
from .jsonl_import import EVAL_PREFIX, JOB_ONLY, RANK_ONLY, Parsed, cell_text, make_row, time_value
from .names import NameMap

LOCAL_PREFIX = "local_"


@dataclass(frozen=True)
class Scalar:
    """One logged value: its foreign name, step, raw value and where it was read."""

    name: str
    step: int
    value: Any
    where: str
    time: float | None = None
    timeline: int = 0


@dataclass
class Source:
    """The scalars one writer logged; ``job``: its job-level names reach the job-level ``step``."""

    rank: int | None
    job: bool
    scalars: list[Scalar] = field(default_factory=list)


@dataclass
class _Slot:
    name: str
    where: str


def add_rows(parsed: Parsed, sources: list[Source], names: NameMap) -> None:
    """Append to ``parsed`` one row per (timeline, step, rank) of ``sources``; left-out names are counted."""
    groups: dict[tuple[int, int, int | None], dict[str, Any]] = {}
    slots: dict[tuple[int, int, int | None, str], _Slot] = {}
    times: dict[tuple[int, int, int | None], float] = {}
    left_out: set[str] = set()
    again = 0
    for source in sources:
        for scalar in source.scalars:
            target = names.target(cell_text(scalar.name, scalar.where))
            if target is None:
                left_out.add(scalar.name)
                continue
            rank, final = _placed(target, source)
            key = (scalar.timeline, scalar.step, rank)
            again += _claim(slots, (*key, final), scalar)
            groups.setdefault(key, {})[final] = _checked(scalar)
            if (time := time_value(scalar.time, scalar.where)) is not None:  # named at the record that logged it
                times[key] = max(times.get(key, time), time)
    for (timeline, step, rank), values in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], _order(kv[0][2]))):
        where = slots[timeline, step, rank, next(iter(values))].where
        place = {"step": step, "rank": rank, "time": times.get((timeline, step, rank)), "timeline": timeline}
        parsed.rows.append(make_row(place, values, where))
    if left_out:
        parsed.warnings.append(f"left out as mapped: {', '.join(sorted(left_out))}")
    if again:
        parsed.warnings.append(f"{again} values were logged again at a step that already had them; the later kept")


def _placed(target: str, source: Source) -> tuple[int | None, str]:
    """The rank (None: job level) and name a scalar named ``target`` by ``source`` is recorded under."""
    if target in RANK_ONLY:
        return (0 if source.rank is None else source.rank), target
    if target in JOB_ONLY or target.startswith(EVAL_PREFIX):
        return (None, target) if source.job else (source.rank, LOCAL_PREFIX + target)
    return source.rank, target


def _claim(
    slots: dict[tuple[int, int, int | None, str], _Slot], key: tuple[int, int, int | None, str], s: Scalar
) -> bool:
    """Take the name ``key[-1]`` at its (timeline, step, rank): True when ``s`` logs it again there; another
    foreign name there is an error naming both."""
    first = slots.get(key)
    if first is None:
        slots[key] = _Slot(s.name, s.where)
        return False
    if first.name == s.name:
        return True
    raise ImportFormatError(
        f"{s.where}: {s.name} and {first.name} (at {first.where}) both become {key[-1]} at step {s.step}; "
        f"keep one with --map '{s.name}=' or rename the other with --map"
    )


def _checked(scalar: Scalar) -> Any:
    """The value if it is a number (or text holding one, ``NaN`` included); an error naming the metric otherwise."""
    value = scalar.value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and _spells_number(value):
        return value
    raise ImportFormatError(
        f"{scalar.where}: {scalar.name} at step {scalar.step} is {short(value, 100)}, not a number; "
        f"leave it out with --map '{scalar.name}='"
    )


def _spells_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _order(rank: int | None) -> int:
    return -1 if rank is None else rank
