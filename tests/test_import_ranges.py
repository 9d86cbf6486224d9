"""An import holds every record to the ranges the collector accepts, and leaves nothing when the collector would
reject a line of it.

An importer accepted any finite time, the collector only unix seconds below ``MAX_TIME``: a Megatron line stamped
``[9999-12-31 23:59:59]`` or a TensorBoard event of wall time -1e18 was imported, moved into place, then every line
of it rejected, and the refused run stayed on disk. The same held for a rank whose world size the store cannot hold,
a topology coordinate past ``MAX_RANK`` and a metric name with a lone surrogate. Each is now named at its input line
or record; a line the collector still rejects (a bedside record copied from JSONL) fails the import before its run
is moved into place.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from bedside.collectors import format as fmt
from bedside.collectors.bounded import BoundedInputError
from bedside.collectors.errors import ImportFormatError
from bedside.collectors.format import MAX_RANK, MAX_TIME
from bedside.collectors.importers import import_csv, import_jsonl, import_tensorboard, import_wandb

TIMES = [0.0, 1.7e9, math.nextafter(MAX_TIME, 0), MAX_TIME, -5e-324, -1.0, 253402300799.0, -1e18, 1.7e18]


def left_nothing(folder: Path, *sources: str) -> None:
    """``folder`` holds only the ``sources`` the test wrote: no run, no staging folder."""
    assert sorted(p.name for p in folder.iterdir()) == sorted(sources)


def test_the_importers_and_the_collector_accept_the_same_times(tmp_path, run_dir, write_lines, ingest, record):
    """MAX_TIME is the one bound: the collector's SQL check, the importers' and the format's JSON Schema agree on
    each side of it."""
    write_lines([record("step", time=t, step=i, seq=i, metrics={"loss": 1.0}) for i, t in enumerate(TIMES)])
    store = ingest(run_dir)
    collected = {TIMES[step] for (step,) in store.cursor().execute("SELECT step FROM step_metrics").fetchall()}
    imported = set()
    for i, time in enumerate(TIMES):
        (tmp_path / "m.jsonl").write_text(json.dumps({"step": 0, "loss": 1.0, "time": time}) + "\n")
        try:
            import_jsonl(tmp_path / "m.jsonl", tmp_path / f"out-{i}")
            imported.add(time)
        except ImportFormatError as error:
            assert re.fullmatch(
                r".*m\.jsonl, line 1: time must be unix seconds from 0 to below 1e11, got .*", str(error)
            )
    assert collected == imported == {t for t in TIMES if 0 <= t < MAX_TIME}
    described = fmt.schema()["properties"]["time"]
    assert (described["minimum"], described["exclusiveMaximum"]) == (0, MAX_TIME)


TIME_SOURCES = {  # importer, file name, header, a row at time T
    "csv": (import_csv, "m.csv", "step,time,loss\n", "0,T,2.5\n"),
    "jsonl row": (import_jsonl, "m.jsonl", "", '{"step": 0, "time": T, "loss": 2.5}\n'),
    "jsonl record": (
        import_jsonl,
        "m.jsonl",
        "",
        '{"kind": "log", "time": T, "rank": 0, "step": 0, "timeline": 0, "message": "x"}\n',
    ),
    "wandb jsonl": (import_wandb, "h.jsonl", "", '{"_step": 0, "_timestamp": T, "loss": 2.5}\n'),
}


@pytest.mark.parametrize("time", ["-1", "1e11", "253402300799"])
@pytest.mark.parametrize("kind", TIME_SOURCES)
def test_a_time_out_of_unix_seconds_is_named_with_its_line(tmp_path, kind, time):
    importer, name, header, row = TIME_SOURCES[kind]
    (tmp_path / name).write_text(header + row.replace("T", "1700000000") + row.replace("T", time))
    line = 3 if header else 2
    with pytest.raises(ImportFormatError, match=rf"{re.escape(name)}, line {line}: time must be unix seconds .*{time}"):
        importer(tmp_path / name, tmp_path / "run")
    left_nothing(tmp_path, name)


def test_a_megatron_line_stamped_past_unix_seconds_is_named_and_leaves_nothing(tmp_path, bedside):
    (tmp_path / "megatron.log").write_text(" [9999-12-31 23:59:59] iteration 1/ 10 | lm loss: 2.0 |\n")
    done = bedside("import", "megatron", tmp_path / "megatron.log", "--out", tmp_path / "run", env={"TZ": "UTC"})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    said = "megatron.log, line 1: time must be unix seconds from 0 to below 1e11, got 253402300799.0"
    assert said in done.stderr
    left_nothing(tmp_path, "megatron.log")


def test_a_tensorboard_wall_time_out_of_unix_seconds_is_named_at_its_record(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(tmp_path / "logs")) as writer:
        writer.add_scalar("loss", 2.0, 0, walltime=1.7e9)
        writer.add_scalar("loss", 1.0, 1, walltime=-1e18)
    with pytest.raises(ImportFormatError, match=r"tfevents[^,]*, record 2: time must be unix seconds .* got -1e\+18"):
        import_tensorboard(tmp_path / "logs", tmp_path / "run")
    left_nothing(tmp_path, "logs")


def test_ranks_and_placements_the_store_cannot_hold_are_named(tmp_path):
    """Rank 2^31 - 1 made a world size of 2^31, past what a rank_info may say; a dp of 3e9 past MAX_RANK."""
    (tmp_path / "m.csv").write_text(f"step,rank,step_time\n0,0,0.5\n0,{MAX_RANK},0.5\n")
    with pytest.raises(BoundedInputError, match=rf"m\.csv, line 3: rank must be at most {MAX_RANK - 1}"):
        import_csv(tmp_path / "m.csv", tmp_path / "run")
    (tmp_path / "m.csv").write_text("step,loss\n0,2.5\n")
    for placement, said in (({"rank": MAX_RANK}, f"rank must be at most {MAX_RANK - 1}"), ({"dp": 3e9}, "dp must")):
        (tmp_path / "topology.json").write_text(json.dumps([{"rank": 0, "host": "a", **placement}]))
        with pytest.raises(BoundedInputError, match=rf"topology\.json, ranks\[0\]: {said}"):
            import_csv(tmp_path / "m.csv", tmp_path / "run", topology=tmp_path / "topology.json")
    left_nothing(tmp_path, "m.csv", "topology.json")


def test_a_metric_name_with_a_lone_surrogate_is_named(tmp_path):
    """Written out as "?", two such names became one name given twice, which the collector rejects."""
    (tmp_path / "m.jsonl").write_text('{"step": 0, "loss": 1.0, "a\\ud800": 1, "a\\udc00": 2}\n')
    with pytest.raises(ImportFormatError, match=r"m\.jsonl, line 1: a metric name holds '\\ud800', a lone surrogate"):
        import_jsonl(tmp_path / "m.jsonl", tmp_path / "run")
    left_nothing(tmp_path, "m.jsonl")


def test_a_copied_record_the_collector_rejects_fails_the_import_with_its_reason(tmp_path):
    (tmp_path / "m.jsonl").write_text(
        '{"step": 0, "loss": 2.5}\n'
        '{"kind": "checkpoint", "time": 1.0, "rank": 0, "step": 0, "timeline": 0, "event": "bogus"}\n'
    )
    with pytest.raises(ImportFormatError) as raised:
        import_jsonl(tmp_path / "m.jsonl", tmp_path / "runs" / "run")
    assert str(raised.value).startswith(
        f"{tmp_path / 'runs' / 'run'}: 1 imported line was rejected by the collector, so nothing was imported: "
        "telemetry/rank-00000.jsonl at byte "
    )
    assert ": unknown checkpoint event bogus (line '{" in str(raised.value)
    left_nothing(tmp_path, "m.jsonl")


def test_a_run_that_cannot_land_leaves_no_other_run_of_the_import_in_place(tmp_path):
    """The runs moved one by one: the first landed before the second's destination was found to clash."""
    (tmp_path / "export.csv").write_text("Step,a - loss,b - loss\n0,2.5,2.6\n1,2.4,2.5\n")
    (tmp_path / "runs" / "b" / "telemetry").mkdir(parents=True)  # no telemetry file in it: not a run
    with pytest.raises(ImportFormatError, match=r"runs/b: already holds telemetry; import into a new directory"):
        import_wandb(tmp_path / "export.csv", tmp_path / "runs")
    assert sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / "runs").rglob("*")) == [
        "runs/b",
        "runs/b/telemetry",
    ]
