"""Restarts in an input that gives no timelines: a job requeued from a checkpoint that appended to the same log.

A series (one metric of one rank, or of the job) whose step goes back is a job that restarted from an earlier
checkpoint: that row and every row after it go on the next timeline, as the TensorBoard importer does for a tag.
In a Megatron log an iteration logged again is a restart too (a run logs each iteration once); in a CSV or JSONL
file a value given twice at one step stays an error, since nothing says which one counts.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the readers import this module
    from .jsonl_import import Parsed

SHOWN = 5
"""Restarts named in the warning; the rest are counted."""


def split_restarts(parsed: Parsed, *, repeat_restarts: bool = False) -> None:
    """Move the rows of ``parsed`` from each restart on to the next timeline, and say so in one warning.

    ``repeat_restarts``: a step logged again for the same series is a restart (Megatron's iterations)."""
    last: dict[tuple[int | None, str], int] = {}
    timeline, restarts = 0, []
    for i, row in enumerate(parsed.rows):
        series = [(row.rank, name) for name in row.values]
        earlier = [last[key] for key in series if key in last]
        if any(row.step < step or (repeat_restarts and row.step == step) for step in earlier):
            timeline, last = timeline + 1, {}
            restarts.append(f"{row.where} (step {row.step} after {max(earlier)})")
        last.update(dict.fromkeys(series, row.step))
        if timeline:
            parsed.rows[i] = replace(row, timeline=timeline)
    if restarts:
        more = f", and {len(restarts) - SHOWN} more" if len(restarts) > SHOWN else ""
        parsed.warnings.append(
            f"{len(restarts)} restart(s) from an earlier step, each the start of a new timeline: "
            f"{', '.join(restarts[:SHOWN])}{more}"
        )
