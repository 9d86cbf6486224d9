"""``bedside demo`` as a user runs it: real rank processes, a real follower, the printed summary."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from bedside.app.simulate import CRASH_EXIT_CODE, Scenario

DEMO_TIMEOUT_S = 120


def sections(out: str) -> dict[str, list[str]]:
    """The demo's printed sections: title -> its lines."""
    found: dict[str, list[str]] = {}
    for block in out.split("\n== ")[1:]:
        title, *lines = block.strip().splitlines()
        found[title] = [line for line in lines if line and not line.startswith("explore:")]
    return found


def test_demo_runs_end_to_end_and_shows_each_fault(tmp_path: Path, bedside) -> None:
    done = bedside("demo", "--out", tmp_path, "--steps", 30, "--ranks", 3, timeout=DEMO_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    shown = sections(done.stdout)
    assert list(shown) == ["run", "loss around the bad shard at step 20",
                           "per-rank median times from step 15 (rank 2 straggles)", "non-finite values",
                           "held-out evals"]
    assert shown["run"][1].split() == ["demo", "3", "30", "finished"]
    spike = shown["loss around the bad shard at step 20"]
    assert [line.split()[0] for line in spike[1:]] == ["18", "19", "20", "21", "22"]
    assert "[99]" in spike[3]
    compute_ms = {int(line.split()[0]): float(line.split()[2]) for line in shown[
        "per-rank median times from step 15 (rank 2 straggles)"][1:]}
    assert compute_ms[2] > 1.2 * max(compute_ms[0], compute_ms[1])
    assert shown["non-finite values"][1].split() == ["1", "25", "NaN"]
    assert len(shown["held-out evals"]) == 1 + 2 * 6
    assert re.search(r'explore: .* query .*run-\d+-\d+ "SELECT', done.stdout)


def test_demo_with_a_dead_rank_fails_naming_it_instead_of_hanging(tmp_path: Path, bedside) -> None:
    done = bedside("demo", "--out", tmp_path, "--steps", 30, "--ranks", 3, "--crash-rank", 1, timeout=DEMO_TIMEOUT_S)
    errors = [line for line in done.stderr.splitlines() if line.startswith("bedside: error: ")]
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert len(errors) == 1 and errors[0].startswith(f"bedside: error: rank 1 exited with code {CRASH_EXIT_CODE};")
    (run,) = tmp_path.iterdir()
    assert f'query {run} "SELECT * FROM run"' in errors[0]


@pytest.mark.parametrize(("options", "message"), [
    ({"ranks": 2}, "at least 3 ranks and 20 steps"),
    ({"steps": 19}, "at least 3 ranks and 20 steps"),
    ({"crash_rank": 1}, "crash_rank and crash_step go together"),
    ({"crash_rank": 4, "crash_step": 10}, "crash at rank 4, step 10: outside ranks 0..3"),
    ({"crash_rank": 0, "crash_step": 301}, "outside ranks 0..3 or steps 1..300"),
], ids=["ranks", "steps", "crash-step-missing", "crash-rank-outside", "crash-step-outside"])
def test_scenario_refuses_what_the_simulation_cannot_do(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Scenario(**options)


@pytest.mark.parametrize(("args", "message"), [
    (("--steps", "19"), "argument --steps: expected an integer >= 20, got 19"),
    (("--ranks", "2"), "argument --ranks: expected an integer >= 3, got 2"),
    (("--ranks", "three"), "argument --ranks: expected an integer >= 3, got 'three'"),
    (("--crash-rank", "4"), "crash at rank 4, step 150: outside ranks 0..3"),
], ids=["steps", "ranks", "ranks-not-a-number", "crash-rank"])
def test_demo_options_out_of_range_are_refused_before_anything_runs(tmp_path: Path, bedside, args: tuple,
                                                                    message: str) -> None:
    done = bedside("demo", "--out", tmp_path / "demo", *args)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (tmp_path / "demo").exists()
