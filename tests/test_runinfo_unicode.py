"""run.json text that JSON can escape but UTF-8 cannot encode: a lone surrogate ("\\ud800") in the run's name, a
host or the config, as an importer writes for a folder whose name is not UTF-8. Each such field is left out and
named in run_info.problems, while ``bedside collect`` ingests every step, ``bedside watch`` settles the run and
``bedside runs`` lists it. Real files, the real CLI in new processes, the real store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bedside.collectors.layout import RunLayout
from bedside.collectors.runinfo import read_run_info
from bedside.collectors.store import Store

NOT_UNICODE = "holds a lone surrogate (an escape such as \\ud800 that is no character): it cannot be stored or shown"


@pytest.fixture
def surrogate_run(tiny_faults: Path) -> Path:
    """tiny_faults with a lone surrogate in its name, rank 0's host and a config key (escaped, as JSON writes it)."""
    path = RunLayout(tiny_faults).run_info
    info = json.loads(path.read_text())
    info["name"] = "run-\ud800"
    info["topology"][0]["host"] = "node-\udcff"
    info["config"]["note-\udc80"] = 1
    path.write_text(json.dumps(info))
    assert "\\ud800" in path.read_text()
    return tiny_faults


def stored(run: Path, sql: str) -> list[tuple]:
    with Store.open(RunLayout(run).store, read_only=True) as store:
        return store.cursor().execute(sql).fetchall()


def test_collect_ingests_every_step_and_names_each_field_left_out(surrogate_run: Path, bedside) -> None:
    done = bedside("collect", surrogate_run)
    assert done.returncode == 0, done.stderr
    assert f'run.json: name {NOT_UNICODE}, got "run-\\ud800": ignored' in done.stderr
    assert stored(surrogate_run, "SELECT count(*) FROM rank_steps") == [(400,)]
    [(name, config, problems)] = stored(surrogate_run, "SELECT name, config, problems FROM run_info")
    assert name == surrogate_run.name and json.loads(config) == {}
    assert problems == [
        f'name {NOT_UNICODE}, got "run-\\ud800": ignored',
        f"config {NOT_UNICODE} in a key or a value: ignored",
        f'topology[0].host {NOT_UNICODE}, got "node-\\udcff": the placement of this entry is ignored',
    ]
    assert [rank for (rank,) in stored(surrogate_run, "SELECT rank FROM rank_topology")] == [1]
    again = bedside("collect", surrogate_run)  # every later pass goes on too
    assert again.returncode == 0, again.stderr


def test_watch_settles_the_run_and_runs_lists_it(surrogate_run: Path, bedside) -> None:
    done = bedside("watch", surrogate_run, "--until-finished", "--quiet", timeout=180)
    assert done.returncode == 0, done.stderr
    assert "starting again" not in done.stderr
    assert stored(surrogate_run, "SELECT count(*) FROM rank_steps") == [(400,)]
    listed = bedside("runs", surrogate_run.parent)
    assert listed.returncode == 0, listed.stderr
    assert surrogate_run.name in listed.stdout and "finished" in listed.stdout


def test_a_folder_name_that_is_not_utf8_stands_in_readably(tmp_path: Path) -> None:
    run = tmp_path / "tb-\udcff"  # the bytes b"tb-\xff" as Python names them
    run.mkdir()
    (run / "run.json").write_text('{"world_size": 1, "name": "\\udcff"}')
    info = read_run_info(RunLayout(run))
    assert info is not None and info.name == "tb-\ufffd"
    assert info.problems == (f'name {NOT_UNICODE}, got "\\udcff": ignored',)


def test_a_run_json_that_is_not_utf8_is_one_named_error(tmp_path: Path, bedside) -> None:
    run = tmp_path / "run"
    (run / "telemetry").mkdir(parents=True)
    (run / "run.json").write_bytes(b'{"world_size": 1, "name": "\xff"}')
    done = bedside("collect", run)
    assert done.returncode == 0, done.stderr
    assert "run.json ignored:" in done.stderr and "not UTF-8 (byte 27)" in done.stderr
