"""Documented or it fails: kinds, fields, metrics, CLI options, views and tables."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from bedside.app.cli import build_parser
from bedside.collectors.format import (
    ACTION_STATUSES,
    CHECKPOINT_EVENTS,
    CHECKPOINT_METRICS,
    RANK_STEP_METRICS,
    RUN_END_STATUSES,
    STEP_METRICS,
    Kind,
    schema,
)
from bedside.collectors.store import Store, sql

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def doc(name: str) -> str:
    return (DOCS / name).read_text()


def schema_fields() -> set[str]:
    """Every property name the JSON Schema defines, envelope and per kind."""
    spec = schema()
    names = set(spec["properties"])
    for definition in spec["$defs"].values():
        names.update(definition.get("properties", {}))
        names.update(definition.get("properties", {}).get("metrics", {}).get("properties", {}))
    return names


@pytest.mark.parametrize("kind", [k.value for k in Kind])
def test_every_kind_is_documented_and_in_the_schema(kind: str) -> None:
    assert f"`{kind}`" in doc("telemetry-format.md")
    assert kind == "heartbeat" or kind in schema()["$defs"]


@pytest.mark.parametrize("field", sorted(schema_fields()))
def test_every_schema_field_is_documented(field: str) -> None:
    assert f"`{field}`" in doc("telemetry-format.md")


@pytest.mark.parametrize("metric", STEP_METRICS + RANK_STEP_METRICS + CHECKPOINT_METRICS)
def test_every_canonical_metric_is_documented(metric: str) -> None:
    assert f"| `{metric}` |" in doc("telemetry-format.md")


ENUMS = [
    ("checkpoint", "event", CHECKPOINT_EVENTS),
    ("action", "status", ACTION_STATUSES),
    ("run_end", "status", RUN_END_STATUSES),
]


@pytest.mark.parametrize(("kind", "field", "values"), ENUMS, ids=[f"{k}.{f}" for k, f, _ in ENUMS])
def test_schema_enums_are_the_format_constants_and_documented(kind: str, field: str, values: tuple[str, ...]) -> None:
    assert schema()["$defs"][kind]["properties"][field]["enum"] == list(values)
    assert all(f"`{value}`" in doc("telemetry-format.md") for value in values)


@pytest.mark.parametrize(
    ("kind", "metrics"), [("step", STEP_METRICS), ("rank_step", RANK_STEP_METRICS), ("checkpoint", CHECKPOINT_METRICS)]
)
def test_the_canonical_metrics_are_the_schemas(kind: str, metrics: tuple[str, ...]) -> None:
    assert list(schema()["$defs"][kind]["properties"]["metrics"]["properties"]) == list(metrics)


def test_the_collector_takes_enums_and_canonical_metrics_from_format_py() -> None:
    """stage_lines.sql gets them as parameters: no value of theirs is spelled out as an SQL string."""
    text = sql("stage_lines")
    values = (
        CHECKPOINT_EVENTS + ACTION_STATUSES + RUN_END_STATUSES + STEP_METRICS + RANK_STEP_METRICS + CHECKPOINT_METRICS
    )
    assert [value for value in values if f"'{value}'" in text] == []


def cli_options(parser: argparse.ArgumentParser | None = None, prefix: str = "") -> list[tuple[str, str]]:
    """(command, option or positional) for every sub-command of the CLI, nested ones as "alert test"."""
    found = []
    subparsers = next(a for a in (parser or build_parser())._actions if isinstance(a, argparse._SubParsersAction))
    for command, sub in subparsers.choices.items():
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                found += cli_options(sub, f"{prefix}{command} ")
            elif not isinstance(action, argparse._HelpAction):
                found.append((prefix + command, action.option_strings[0] if action.option_strings else action.dest))
    return found


@pytest.mark.parametrize(
    "option",
    [
        a.option_strings[0]
        for a in build_parser()._actions
        if a.option_strings and not isinstance(a, argparse._HelpAction)
    ],
)
def test_every_option_of_bedside_itself_is_documented(option: str) -> None:
    assert f"`bedside {option}`" in doc("cli.md").split("\n## ")[0], f"bedside {option} is not in docs/cli.md"


@pytest.mark.parametrize(("command", "option"), cli_options())
def test_every_cli_option_is_documented(command: str, option: str) -> None:
    text = doc("cli.md")
    section = text.split(f"## `bedside {command}")[1].split("\n## ")[0]
    assert f"`{option}" in section, f"bedside {command} {option} is not in docs/cli.md"


def store_objects(kind: str) -> list[str]:
    with Store.open(None) as store:
        query = f"SELECT {kind}_name FROM duckdb_{kind}s() WHERE NOT internal AND schema_name = 'main'"
        return sorted(r[0] for r in store.cursor().execute(query).fetchall())


@pytest.mark.parametrize("view", store_objects("view"))
def test_every_view_is_documented(view: str) -> None:
    assert f"| `{view}` |" in doc("schema.md")


@pytest.mark.parametrize("table", store_objects("table"))
def test_every_table_is_documented(table: str) -> None:
    assert f"| `{table}` |" in doc("schema.md")


def test_readme_starts_with_the_two_setup_commands_that_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    first_block = re.search(r"```sh\n(.*?)```", readme, re.S).group(1).strip().splitlines()
    assert len(first_block) == 2
    assert "bedside demo" in first_block[0]
    assert first_block[1] in (ROOT / ".ci" / "run").read_text()
