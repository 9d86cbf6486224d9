"""Importers: foreign CSV and JSONL files become runs that the real collector ingests."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import jsonschema
import numpy as np
import pandas as pd
import pytest

from bedside.collectors import format as fmt
from bedside.collectors.errors import BedsideError, ImportFormatError
from bedside.collectors.importers import import_csv, import_jsonl, read_topology
from bedside.collectors.ingest import Collector
from bedside.collectors.layout import RunLayout
from bedside.collectors.store import Store

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_runs" / "foreign-csv"
TOPOLOGY = SAMPLES / "topology.json"
VALIDATOR = jsonschema.Draft202012Validator(fmt.schema())


def ingest(out: Path) -> Store:
    """The run's store after the real collector has ingested everything."""
    store = Store.open(out / "bedside.duckdb")
    result = Collector(out, store).ingest_available()
    assert result.rejected == 0 and not result.incidents
    return store


def frame(store: Store, query: str) -> pd.DataFrame:
    """The rows of an ad-hoc verification query."""
    return store.cursor().execute(query).df()


def written_lines(out: Path) -> list[dict]:
    """Every record of the run, each checked against the schema and its seq."""
    records = []
    for path in RunLayout(out).source_files():
        for seq, line in enumerate(path.read_text().splitlines()):
            record = json.loads(line)
            VALIDATOR.validate(record)
            assert record["seq"] == seq
            records.append(record)
    return records


def sample_values(name: str) -> list[float]:
    """A metric of the long sample, by step (the reference both CSV shapes must reproduce)."""
    with open(SAMPLES / "long.csv", newline="") as fh:
        return [float(r["value"]) for r in csv.DictReader(fh) if r["name"] == name]


@pytest.fixture(scope="module", params=["long", "wide"])
def sample_run(request, tmp_path_factory) -> tuple[str, Path, Store]:
    out = tmp_path_factory.mktemp(request.param) / "run"
    summary = import_csv(SAMPLES / f"{request.param}.csv", out, topology=TOPOLOGY)
    assert summary.records == {"rank_info": 2, "step": 20, "rank_step": 40, "eval": 4}
    assert (summary.ranks, summary.steps, summary.skipped) == (2, 20, 0)
    store = ingest(out)
    yield request.param, out, store
    store.close()


def test_sample_step_metrics(sample_run):
    _, _, store = sample_run
    df = frame(store, "SELECT step, rank, loss, lr, tokens, extra FROM step_metrics ORDER BY step")
    assert df["step"].tolist() == list(range(1, 21))
    assert set(df["rank"]) == {0}
    assert df["loss"].tolist() == pytest.approx(sample_values("loss"))
    assert df["loss"].iloc[-1] < df["loss"].iloc[0] - 4
    assert df["tokens"].tolist() == [65536.0] * 20


def test_sample_rank_steps_and_topology(sample_run):
    _, _, store = sample_run
    df = frame(store, "SELECT step, rank, host, dp, step_time, comm_time FROM rank_step_metrics ORDER BY step, rank")
    assert len(df) == 40
    assert df[df["rank"] == 1]["host"].unique().tolist() == ["node-b"]
    assert df[df["rank"] == 1]["dp"].unique().tolist() == [1]
    assert df["step_time"].tolist() == pytest.approx(sample_values("step_time"))
    ranks = frame(store, "SELECT rank, host, declared_by FROM ranks ORDER BY rank")
    assert ranks.values.tolist() == [[0, "node-a", "run.json"], [1, "node-b", "run.json"]]


def test_sample_evals_and_user_metric(sample_run):
    _, _, store = sample_run
    evals = frame(store, "SELECT step, name, value, cum_tokens, split FROM eval_scores ORDER BY step")
    assert evals["step"].tolist() == [5, 10, 15, 20]
    assert set(evals["name"]) == {"val_loss"} and set(evals["split"]) == {"heldout"}
    assert evals["value"].tolist() == pytest.approx(sample_values("eval/val_loss"))
    assert evals["cum_tokens"].tolist() == [65536.0 * s for s in (5, 10, 15, 20)]
    aux = frame(store, "SELECT kind, value FROM metrics WHERE name = 'aux_loss' ORDER BY step")
    assert set(aux["kind"]) == {"step"}
    assert aux["value"].tolist() == pytest.approx(sample_values("aux_loss"))


def test_sample_times(sample_run):
    """long.csv has times; wide.csv has none, so its clock is 0, 1, 2... seconds per step."""
    shape, _, store = sample_run
    times = frame(store, "SELECT time FROM step_metrics ORDER BY step")["time"].tolist()
    if shape == "wide":
        assert times == [float(i) for i in range(20)]
    else:
        assert times == pytest.approx([1717000000.0 + 1.2 * s for s in range(1, 21)])


def test_sample_lines_validate(sample_run):
    _, out, _ = sample_run
    records = written_lines(out)
    assert len(records) == 66
    for path in RunLayout(out).source_files():
        first = json.loads(path.read_text().splitlines()[0])
        assert first["kind"] == "rank_info" and first["host"] in ("node-a", "node-b")
        keys = [(r["timeline"], r["step"]) for r in map(json.loads, path.read_text().splitlines())]
        assert keys == sorted(keys)


JSONL = """\
{"step": 1, "loss": 2.5, "grad_norm": 1.0, "shard": 7, "custom": 3}
{"step": 1, "rank": 0, "step_time": 0.5, "param_checksum": "ab12", "tok_per_s": 1000}
{"step": 1, "rank": 1, "step_time": 0.6, "param_checksum": "ab12", "local_grad_norm": null}

{"step": 2, "loss": "NaN", "grad_norm": Infinity, "eval/val_loss": 2.7, "eval/cum_flops": 1e15}
{"step": 2, "rank": -1, "lr": 0.001}
{"step": 2, "rank": 1, "step_time": "-Infinity"}
{"kind": "log", "time": 5.0, "rank": 1, "step": 2, "timeline": 0, "seq": 41, "level": "warning", "message": "nan loss"}
{"kind": "fault_injected", "time": 5.0, "rank": 1, "step": 2, "timeline": 0, "seq": 3, "fault": "nan_grad"}
{"step": 1, "timeline": 1, "loss": 2.4}
"""


@pytest.fixture(scope="module")
def jsonl_run(tmp_path_factory) -> tuple[Path, Store]:
    src = tmp_path_factory.mktemp("jsonl") / "metrics.jsonl"
    src.write_text(JSONL)
    out = src.parent / "run"
    summary = import_jsonl(src, out, name="foreign")
    assert summary.records == {"rank_info": 2, "step": 3, "rank_step": 3, "eval": 1, "log": 1, "fault_injected": 1}
    assert (summary.ranks, summary.steps, summary.rows, summary.skipped) == (2, 3, 9, 1)
    store = ingest(out)
    yield out, store
    store.close()


def test_jsonl_non_finite_and_fields(jsonl_run):
    _, store = jsonl_run
    df = frame(
        store, "SELECT timeline, step, loss, grad_norm, lr, shards, extra FROM step_metrics ORDER BY timeline, step"
    )
    assert math.isnan(df["loss"][1]) and df["grad_norm"][1] == math.inf and df["lr"][1] == 0.001
    assert df["loss"][2] == 2.4 and df["timeline"][2] == 1
    assert json.loads(df["shards"][0]) == [7]
    ranks = frame(store, "SELECT step, rank, step_time, param_checksum FROM rank_step_metrics ORDER BY step, rank")
    assert ranks["param_checksum"].tolist()[:2] == ["ab12", "ab12"]
    assert ranks["step_time"].tolist()[2] == -math.inf
    evals = frame(store, "SELECT step, name, value, cum_flops FROM eval_scores")
    assert evals.values.tolist() == [[2, "val_loss", 2.7, 1e15]]


def test_jsonl_user_metrics_and_copied_records(jsonl_run):
    out, store = jsonl_run
    user = frame(
        store, "SELECT kind, rank, name, value FROM metrics WHERE name IN ('custom', 'tok_per_s') ORDER BY name"
    )
    assert user.values.tolist() == [["step", 0, "custom", 3.0], ["rank_step", 0, "tok_per_s", 1000.0]]
    log = frame(store, "SELECT rank, level, message FROM event_log WHERE kind = 'log'")
    assert log.values.tolist() == [[1, "warning", "nan loss"]]
    assert frame(store, "SELECT fault FROM fault_labels")["fault"].tolist() == ["nan_grad"]
    assert frame(store, "SELECT host FROM ranks ORDER BY rank")["host"].tolist() == ["unknown", "unknown"]
    assert (out / "ground_truth" / "rank-00001.jsonl").is_file()
    assert frame(store, "SELECT name, world_size FROM run").values.tolist() == [["foreign", 2]]


def test_jsonl_lines_validate_and_synthetic_clock(jsonl_run):
    out, _ = jsonl_run
    records = written_lines(out)
    steps = [r for r in records if r["kind"] == "step"]
    assert [(r["timeline"], r["step"], r["time"]) for r in steps] == [(0, 1, 0.0), (0, 2, 1.0), (1, 1, 2.0)]


def test_topology_applied_from_bare_list(tmp_path):
    topology = tmp_path / "topology.json"
    topology.write_text(
        json.dumps(
            [
                {"rank": 0, "host": "gpu-1", "local_rank": 0, "tp": 0},
                {"rank": 1, "host": "gpu-1", "local_rank": 1, "tp": 1},
            ]
        )
    )
    src = tmp_path / "m.csv"
    src.write_text("step,rank,step_time\n1,0,0.5\n1,1,0.6\n")
    import_csv(src, tmp_path / "run", topology=topology)
    with ingest(tmp_path / "run") as store:
        df = frame(store, "SELECT rank, host, local_rank, tp FROM ranks ORDER BY rank")
    assert df.values.tolist() == [[0, "gpu-1", 0, 0], [1, "gpu-1", 1, 1]]
    assert read_topology(topology)[1].tp == 1


BAD_CSV = [
    ("step,name,value\n1,loss,2\n", "line 1: missing column rank"),
    ("rank,loss\n0,2\n", "line 1: missing column step"),
    ("step,rank,name,value,host\n1,,loss,2,a\n", "line 1: unexpected column host"),
    ("step,loss,loss\n1,2,3\n", "line 1: duplicate column loss"),
    ("step,rank,name,value\n1,,loss,2\n2,,loss,abc\n", "line 3: loss must be a number, got 'abc'"),
    ("step,loss\n1,2.5\n2.5,2.4\n", "line 3: step must be an integer >= 0, got '2.5'"),
    ("step,rank,name,value\n1,,step_time,0.5\n", "line 2: step_time is a per-rank metric"),
    ("step,rank,loss\n1,0,2.5\n", "line 2: loss is a job-level metric"),
    ("step,rank,name,value\n1,0,eval/acc,0.5\n", "line 2: eval/acc is a job-level metric"),
    ("step,rank,name,value\n1,,loss,2\n1,,loss,3\n", "line 3: loss given twice for timeline 0 step 1"),
    ("step,time,loss\n1,10.0,2.5\n2,,2.4\n", "line 3: time is empty"),
    ("step,loss\n1,2.5,7\n", "line 2: 3 cells, but the header has 2"),
    ("step,rank,name,value\n1,,loss,\n", "line 2: value is empty"),
    ("step,rank,name,value\n1,,eval/cum_tokens,100\n", "line 2: eval/cum_tokens without any eval score"),
    ("step,rank,loss\n1,-2,2.5\n", "line 2: rank must be an integer >= -1"),
]


BAD_JSONL = [
    ('{"step": 1, "loss": 2}\n{"step": 2, "loss": \n', "line 2: not valid JSON"),
    ("[1, 2]\n", "line 1: expected a JSON object, got list"),
    ('{"step": 1, "loss": "low"}\n', "line 1: loss must be a number, got 'low'"),
    ('{"step": 1, "loss": true}\n', "line 1: loss must be a number, got True"),
    ('{"loss": 2}\n', "line 1: step is missing"),
    ('{"step": 1, "comm_time": 0.1}\n', "line 1: comm_time is a per-rank metric"),
    ('{"kind": "log", "rank": 0, "step": 1, "timeline": 0, "message": "x"}\n', "line 1: time is missing"),
]


BAD_INPUTS = [(import_csv, "bad.csv", *case) for case in BAD_CSV] + [
    (import_jsonl, "bad.jsonl", *case) for case in BAD_JSONL
]


@pytest.mark.parametrize("importer, name, text, message", BAD_INPUTS, ids=[m for *_, m in BAD_INPUTS])
def test_bad_input_is_refused_and_nothing_is_written(tmp_path, importer, name, text, message):
    src = tmp_path / name
    src.write_text(text)
    with pytest.raises(ImportFormatError, match=re.escape(f"{src}, {message}")):
        importer(src, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_refuses_out_dir_with_telemetry(tmp_path):
    out = tmp_path / "run"
    import_csv(SAMPLES / "wide.csv", out)
    with pytest.raises(ImportFormatError, match="already holds a run"):
        import_csv(SAMPLES / "long.csv", out)
    (out / "run.json").unlink()
    with pytest.raises(ImportFormatError, match="already holds a run"):
        import_csv(SAMPLES / "long.csv", out)


RESTARTED = [
    # a long CSV a requeued job appended to: killed after step 5, resumed from the checkpoint of step 3
    (
        import_csv,
        "long.csv",
        "step,rank,name,value\n" + "".join(f"{s},,loss,{9 - s}\n" for s in [1, 2, 3, 4, 5, 4, 5, 6]),
    ),
    (import_csv, "wide.csv", "step,loss,grad_norm\n" + "".join(f"{s},{9 - s},1\n" for s in [1, 2, 3, 4, 5, 4, 5, 6])),
    (import_jsonl, "rows.jsonl", "".join(f'{{"step": {s}, "loss": {9 - s}}}\n' for s in [1, 2, 3, 4, 5, 4, 5, 6])),
    # the same restart in a long CSV grouped by metric (as pandas' melt writes it): each metric's second run
    (
        import_csv,
        "melted.csv",
        "step,rank,name,value\n"
        + "".join(
            f"{s},,{n},{9 - s if n == 'loss' else 0.1}\n" for n in ("loss", "lr") for s in [1, 2, 3, 4, 5, 4, 5, 6]
        ),
    ),
]


@pytest.mark.parametrize("importer, name, text", RESTARTED, ids=[name for _, name, _ in RESTARTED])
def test_a_step_that_goes_back_starts_a_new_timeline_and_is_counted(tmp_path, importer, name, text):
    (tmp_path / name).write_text(text)
    summary = importer(tmp_path / name, tmp_path / "run")
    assert [w for w in summary.warnings if "restart" in w] == [
        f"1 restart(s) from an earlier step, each the start of a new timeline: {tmp_path / name}, line "
        f"{7 if name.endswith('.csv') else 6} (step 4 after 5)"
    ]
    steps = frame(ingest(tmp_path / "run"), "SELECT timeline, step, loss, lr FROM step_metrics ORDER BY timeline, step")
    assert [row[:3] for row in steps.itertuples(index=False, name=None)] == [
        *((0, s, 9.0 - s) for s in range(1, 6)),
        *((1, s, 9.0 - s) for s in range(4, 7)),
    ]
    if name == "melted.csv":
        assert steps["lr"].tolist() == [0.1] * 8  # lr's second run is on timeline 1 too


def test_a_long_csv_sorted_by_metric_has_no_restart_and_a_timeline_column_is_kept(tmp_path):
    by_metric = "step,rank,name,value\n" + "".join(f"{s},,{n},{s}\n" for n in ("loss", "grad_norm") for s in (1, 2, 3))
    (tmp_path / "sorted.csv").write_text(by_metric)
    summary = import_csv(tmp_path / "sorted.csv", tmp_path / "run")
    assert not [w for w in summary.warnings if "restart" in w]
    assert len(frame(ingest(tmp_path / "run"), "SELECT * FROM step_metrics WHERE timeline = 0")) == 3
    (tmp_path / "placed.csv").write_text("step,timeline,loss\n1,0,3\n2,0,2\n1,0,1\n")
    with pytest.raises(ImportFormatError, match="line 4: loss given twice for timeline 0 step 1"):
        import_csv(tmp_path / "placed.csv", tmp_path / "placed")


BAD_TOPOLOGY = [
    ('{"ranks": [{"rank": 0, "host": "a"}, {"rank": 0, "host": "b"}]}', "rank 0 is placed more than once"),
    ('[{"rank": 0}]', "ranks[0]: host must be a non-empty string"),
    ('[{"rank": 0, "host": "a", "gpu": 3}]', "ranks[0]: unknown field gpu"),
    ('[{"rank": 0, "host": "a", "dp": -1}]', "ranks[0]: dp must be an integer >= 0"),
    ('[{"host": "a"}]', "ranks[0]: rank is missing"),
    ('{"ranks": [{"rank": 0, "host": "a"}', "not valid JSON"),
    ('{"hosts": []}', 'expected {"ranks": [...]} or a list'),
    ("[]", "lists no ranks"),
    ('[{"rank": 0, "host": "a"}]', "no placement for rank 1"),
]


@pytest.mark.parametrize("text, message", BAD_TOPOLOGY, ids=[m for _, m in BAD_TOPOLOGY])
def test_bad_topology_is_refused(tmp_path, text, message):
    topology = tmp_path / "topology.json"
    topology.write_text(text)
    with pytest.raises(BedsideError, match=re.escape(message)):  # ImportFormatError, or bad JSON's BoundedInputError
        import_csv(SAMPLES / "wide.csv", tmp_path / "run", topology=topology)
    assert not (tmp_path / "run").exists()


def doc_blocks(language: str) -> list[str]:
    text = (ROOT / "docs" / "import.md").read_text()
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


@pytest.mark.parametrize("language, importer", [("csv", import_csv), ("jsonl", import_jsonl)])
def test_documented_examples_import(tmp_path, language, importer):
    (topology,) = doc_blocks("json")
    (tmp_path / "topology.json").write_text(topology)
    assert doc_blocks(language)
    for i, block in enumerate(doc_blocks(language)):
        src = tmp_path / f"example{i}.{language}"
        src.write_text(block)
        importer(src, tmp_path / f"run{i}", topology=tmp_path / "topology.json")
        written_lines(tmp_path / f"run{i}")
        with ingest(tmp_path / f"run{i}"):
            pass


# -- the CLI: conversion all or nothing, copied records checked by the collector --------------

BAD_COPIED_RECORDS = """\
{"step": 1, "loss": 2.5}
{"kind": "step", "time": 1.0, "rank": 0, "step": 2, "timeline": 0, "metrics": {"loss": "low"}}
{"kind": "rank_step", "time": 1.0, "rank": 0, "step": 2, "timeline": 0, "metrics": 7}
"""


def test_cli_import_fails_and_leaves_nothing_when_the_collector_rejects_copied_records(tmp_path, bedside):
    """The run was moved into place, then its bad lines rejected: the import left a run it had refused."""
    src = tmp_path / "m.jsonl"
    src.write_text(BAD_COPIED_RECORDS)
    out = tmp_path / "run"
    done = bedside("import", "jsonl", src, "--out", out, "--quiet")
    errors = [line for line in done.stderr.splitlines() if line.startswith("bedside: error: ")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr
    said = (
        f"bedside: error: {out}: 2 imported lines were rejected by the collector, so nothing was imported: "
        r"telemetry/rank-00000\.jsonl at byte \d+: metrics\.loss must be a number, got \"low\" \(line '\{.*\}'\); "
        r"telemetry/rank-00000\.jsonl at byte \d+: field metrics must be an object \(line '\{.*\}'\)"
    )
    assert re.fullmatch(said, errors[0]), errors[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.jsonl"]


def test_cli_import_of_a_clean_file_exits_0(tmp_path, bedside):
    done = bedside("import", "csv", SAMPLES / "long.csv", "--out", tmp_path / "run", "--topology", TOPOLOGY)
    assert (done.returncode, done.stdout) == (0, ""), done.stderr
    assert "done: 66 lines" in done.stderr and "0 rejected" in done.stderr


# -- sparse ranks and runs without a topology, through ingestion and detection --------------

SPARSE = (0, 4, 8, 12)
SLOW, CORRUPT = 8, 4


def sparse_rows(steps: int = 400, seed: int = 0) -> list[dict]:
    """A 4-rank trace numbered 0, 4, 8, 12 (as a sampled 16-rank job's): rank 8 is 60% slower from step 200,
    rank 4's local gradient norm is a thousand times its peers' at steps 300 and 330."""
    rng = np.random.default_rng(seed)
    rows, time = [], 1_717_000_000.0
    for step in range(1, steps + 1):
        took = {
            r: float(np.exp(0.03 * rng.standard_normal())) * (1.6 if r == SLOW and step > 200 else 1.0) for r in SPARSE
        }
        time += max(took.values())
        loss = 3.0 * step**-0.1 * float(np.exp(0.01 * rng.standard_normal()))
        rows.append({"step": step, "time": round(time, 3), "loss": loss, "tokens": 4096})
        for rank in SPARSE:
            norm = float(np.exp(0.05 * rng.standard_normal())) * (
                1000.0 if rank == CORRUPT and step in (300, 330) else 1.0
            )
            rows.append(
                {"step": step, "rank": rank, "time": round(time, 3), "step_time": took[rank], "local_grad_norm": norm}
            )
    return rows


def write_sparse(path: Path, rows: list[dict]) -> None:
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        return
    columns = ["step", "rank", "time", "loss", "tokens", "step_time", "local_grad_norm"]
    lines = [",".join(columns)] + [",".join(str(row.get(c, "")) for c in columns) for row in rows]
    path.write_text("\n".join(lines) + "\n")


def detect_imported(tmp_path: Path, importer, suffix: str, topology: Path | None = None):
    from bedside.app.service.detection import detect_run

    src = tmp_path / f"trace{suffix}"
    write_sparse(src, sparse_rows())
    summary = importer(src, tmp_path / "run", topology=topology)
    assert (summary.ranks, summary.world_size) == (4, 13)
    assert sorted(p.name for p in RunLayout(tmp_path / "run").source_files()) == [f"rank-{r:05d}.jsonl" for r in SPARSE]
    return detect_run(tmp_path / "run")


@pytest.mark.parametrize("importer, suffix", [(import_csv, ".csv"), (import_jsonl, ".jsonl")])
def test_a_sparse_run_without_topology_names_its_ranks_and_no_host(tmp_path, importer, suffix):
    findings = detect_imported(tmp_path, importer, suffix)
    named = {(f.kind, f.ranks) for f in findings}
    assert ("straggler", (SLOW,)) in named and ("sdc", (CORRUPT,)) in named, named
    assert {r for f in findings for r in f.ranks} <= set(SPARSE)  # no rank of the gaps, hung or otherwise
    for f in findings:
        said = " ".join([f.summary, f.suggested_action.why, json.dumps(f.suggested_action.args)])
        assert "host" not in f.suggested_action.args and "unknown" not in said, said
        assert "place" not in f.evidence or "host" not in f.evidence["place"]


def test_a_sparse_topology_is_accepted_and_its_hosts_named(tmp_path):
    topology = tmp_path / "topology.json"
    topology.write_text(json.dumps([{"rank": r, "host": f"node-{r // 8}", "dp": i} for i, r in enumerate(SPARSE)]))
    findings = detect_imported(tmp_path, import_csv, ".csv", topology)
    [straggler] = [f for f in findings if f.kind == "straggler"]
    [sdc] = [f for f in findings if f.kind == "sdc"]
    assert straggler.ranks == (SLOW,) and straggler.suggested_action.args.get("host") == "node-1"
    assert sdc.ranks == (CORRUPT,) and "node-0" in sdc.summary
    with Store.open(tmp_path / "run" / "bedside.duckdb") as store:
        placed = frame(store, "SELECT rank, host FROM ranks ORDER BY rank")
    assert placed.values.tolist() == [[r, f"node-{r // 8}"] for r in SPARSE]


def test_a_topology_must_still_place_every_rank_of_the_data(tmp_path):
    topology = tmp_path / "topology.json"
    topology.write_text(json.dumps([{"rank": r, "host": "a"} for r in (0, 4, 12)]))
    src = tmp_path / "trace.csv"
    write_sparse(src, sparse_rows(steps=3))
    with pytest.raises(ImportFormatError, match=re.escape("no placement for rank 8 (the data has ranks 0, 4, 8, 12)")):
        import_csv(src, tmp_path / "run", topology=topology)
