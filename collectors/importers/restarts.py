"""Restarts in an input that gives no timelines: a job requeued from a checkpoint that appended to the same log.

A series (one metric of one rank, or of the job) whose step goes back is a job that restarted from an earlier
checkpoint: from that row on, the series is on its next timeline, as the TensorBoard importer does for a tag. Each
series counts its own restarts, so a file grouped by metric (every ``loss`` row, then every ``lr`` row) puts each
metric's second run on timeline 1; a row of several series takes the highest count among them, and a row with
none (or only metrics that follow another row: Megatron's evaluations) the timeline of the row before it. In a
Megatron log an iteration logged again is a restart too (a run logs each iteration once); in a CSV or JSONL file
a value given twice at one step stays an error, since nothing says which one counts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the readers import this module
    from .jsonl_import import Parsed

SHOWN = 5
"""Restarts named in the warning; the rest are counted."""


def split_restarts(
    parsed: Parsed, *, repeats_restart: bool = False, led: Callable[[str], bool] = lambda name: False
) -> None:
    """Put each row of ``parsed`` on the timeline its series reached, and name each restart in one warning.

    ``repeats_restart``: a step logged again for the same series is a restart. ``led(name)``: a metric logged
    after the row it belongs to (Megatron's evaluations follow their iteration), which takes that row's
    timeline and restarts nothing."""
    last: dict[tuple[int | None, str], int] = {}
    count: dict[tuple[int | None, str], int] = {}
    starts: list[str] = []  # where timeline k + 1 began
    timeline = 0
    for i, row in enumerate(parsed.rows):
        own = [(row.rank, name) for name in row.values if not led(name)]
        for key in own:
            if key in last and (row.step < last[key] or (repeats_restart and row.step == last[key])):
                count[key] = count.get(key, 0) + 1
                if count[key] > len(starts):
                    starts.append(f"{row.where} (step {row.step} after {last[key]})")
            last[key] = row.step
        if own:
            timeline = max(count.get(key, 0) for key in own)
        if timeline:
            parsed.rows[i] = replace(row, timeline=timeline)
    if starts:
        more = f", and {len(starts) - SHOWN} more" if len(starts) > SHOWN else ""
        parsed.warnings.append(
            f"{len(starts)} restart(s) from an earlier step, each the start of a new timeline: "
            f"{', '.join(starts[:SHOWN])}{more}"
        )
