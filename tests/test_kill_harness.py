"""The fault harness: owners and trainer ranks killed with SIGKILL at random moments lose and repeat nothing.

``bedside watch`` and ``bedside serve`` own a faulty run while its telemetry lands in pieces, with a
signed webhook on a real receiver; each is killed again and again at a random moment, then a last
watch finishes the run. The store must then hold what one clean ``bedside collect`` of the same files
holds (tables, row counts, committed offsets), the incidents a clean detection finds (hangs aside), and every alert
message must have been answered 2xx exactly once. ``KILLS`` is sized for CI; ``bench/harness.py --long``
runs the same with many more kills (docs/reliability.md).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from receiver import Receiver, free_port
from test_alerts_watch import ENVIRON, assert_each_message_delivered_once, write_config

from bedside.app.service.schema import SCHEMAS
from bedside.collectors.layout import RunLayout
from bedside.collectors.store import Store

pytestmark = pytest.mark.slow(reason="SIGKILLs watch, serve and a trainer rank at random and restarts them")

KILLS = int(os.environ.get("BEDSIDE_HARNESS_KILLS", "3"))
SEED = int(os.environ.get("BEDSIDE_HARNESS_SEED", "20261201"))
OWNER_START_S, FINISH_S = 90.0, 180.0
DATA_TABLES = (
    "sources",
    "run_info",
    "rank_topology",
    "steps",
    "rank_steps",
    "evals",
    "checkpoints",
    "actions",
    "events",
    "faults",
    "rejected_lines",
)


def cli(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "bedside.app.cli", *map(str, args)]


def pieces(run: Path, count: int) -> list[dict[Path, bytes]]:
    """Cut every rank file to its first 1/(count+1) of records; the rest as ``count`` pieces to append in turn."""
    rest: list[dict[Path, bytes]] = [{} for _ in range(count)]
    for path in sorted(RunLayout(run).telemetry.glob("rank-*.jsonl")):
        lines = path.read_bytes().splitlines(keepends=True)
        bounds = [len(lines) * i // (count + 1) for i in range(count + 2)]
        path.write_bytes(b"".join(lines[: bounds[1]]))
        for i in range(count):
            rest[i][path] = b"".join(lines[bounds[i + 1] : bounds[i + 2]])
    return rest


def append(piece: dict[Path, bytes]) -> None:
    for path, data in piece.items():
        with open(path, "ab") as fh:
            fh.write(data)


def start_owner(kind: str, run: Path, config: Path, port: int) -> subprocess.Popen:
    """``bedside watch`` or ``bedside serve`` of ``run`` in a process group of its own."""
    extra = ["--rescan-every", "0.2"] if kind == "watch" else ["--port", str(port), "--refresh", "1"]
    return subprocess.Popen(
        cli(kind, run, "--config", config, *extra),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, **ENVIRON, "OMP_NUM_THREADS": "1"},
    )


def kill_at_random(owner: subprocess.Popen, run: Path, rng: random.Random) -> None:
    """SIGKILL the owner's whole group a random moment after its store exists."""
    deadline = time.monotonic() + OWNER_START_S
    while time.monotonic() < deadline and owner.poll() is None and not RunLayout(run).store.exists():
        time.sleep(0.05)
    assert owner.poll() is None, f"the owner exited with {owner.returncode} before it was killed"
    time.sleep(rng.uniform(0.2, 3.0))
    os.killpg(owner.pid, signal.SIGKILL)
    owner.wait()


def facts(run: Path) -> dict[str, object]:
    """Tables, row counts, committed offsets and the incidents of a store.

    Hangs are left out: while the files stop growing between pieces, a live owner rightly sees
    ranks that stopped writing long after their records' times, which a replay cannot see.
    """
    with Store.open(RunLayout(run).store, read_only=True, schemas=SCHEMAS) as store:
        cur = store.cursor()
        counts = {t: cur.execute(f'SELECT count(*) FROM "{t}"').fetchall()[0][0] for t in DATA_TABLES}
        offsets = cur.execute("SELECT path, committed_offset, state FROM sources ORDER BY path").fetchall()
        incidents = cur.execute(
            "SELECT incident_id, kinds, severity, status, start_step FROM incidents "
            "WHERE NOT list_contains(kinds, 'hang') ORDER BY 1"
        ).fetchall()
    return {"counts": counts, "offsets": offsets, "incidents": incidents}


@pytest.mark.parametrize("kind", ["watch", "serve"])
def test_an_owner_killed_at_random_loses_and_repeats_no_row_and_no_alert(
    kind: str, tiny_faults: Path, tmp_path: Path, receiver: Receiver
) -> None:
    reference = tmp_path / "reference"
    subprocess.run(["cp", "-r", str(tiny_faults), str(reference)], check=True)
    rng = random.Random(f"{SEED}-{kind}")
    config = write_config(tmp_path, receiver)
    rest = pieces(tiny_faults, KILLS)
    for kill in range(KILLS):
        owner = start_owner(kind, tiny_faults, config, port=free_port())
        try:
            kill_at_random(owner, tiny_faults, rng)
        finally:
            if owner.poll() is None:
                os.killpg(owner.pid, signal.SIGKILL)
                owner.wait()
        append(rest[kill])
    final = subprocess.run(
        cli("watch", tiny_faults, "--config", config, "--until-finished", "--drain", "30", "--quiet"),
        capture_output=True,
        text=True,
        timeout=FINISH_S,
        env={**os.environ, **ENVIRON},
    )
    assert final.returncode == 0, final.stderr
    assert subprocess.run(cli("detect", reference), capture_output=True, timeout=FINISH_S).returncode == 0
    assert facts(tiny_faults) == facts(reference)
    assert_each_message_delivered_once(tiny_faults, receiver, kills=KILLS)


# -- a trainer rank killed ------------------------------------------------------------------------------------

TRAIN_STEPS, CHECKPOINT_EVERY = 40, 4
TRAINER_KILLS = int(os.environ.get("BEDSIDE_HARNESS_TRAINER_KILLS", "2"))


def train_command(run: Path, *extra: str) -> list[str]:
    return cli(
        "train",
        "--nproc",
        "2",
        "--steps",
        str(TRAIN_STEPS),
        "--checkpoint-every",
        str(CHECKPOINT_EVERY),
        "--keep-checkpoints",
        "100",
        "--out",
        run,
        *extra,
    )


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def rank_process(trainer: subprocess.Popen, run: Path, rank: int) -> int | None:
    """The pid of ``trainer``'s process of ``rank``, if it runs: the one that the rank's newest ``rank_info``
    record names (each launch writes one), among the trainer's descendants."""
    lines = RunLayout(run).rank_file(rank).read_bytes().splitlines()
    infos = [json.loads(line) for line in lines if line.startswith(b'{"kind":"rank_info"') and line.endswith(b"}")]
    return infos[-1]["pid"] if infos and infos[-1]["pid"] in descendants(trainer.pid) else None


def last_step(run: Path, rank: int) -> int:
    path = RunLayout(run).rank_file(rank)
    steps = (
        [
            json.loads(line).get("step", -1)
            for line in path.read_bytes().splitlines()[-50:]
            if line.startswith(b'{"kind":"rank_step"')
        ]
        if path.exists()
        else []
    )
    return max(steps, default=-1)


def kill_rank_at_random(run: Path, resume: bool, rng: random.Random) -> int:
    """Train (or resume) until rank 1 passes a random step, SIGKILL that rank; the step it had passed."""
    start = last_step(run, 1) if resume else 0
    target = min(start + rng.randint(3, 12), TRAIN_STEPS - 2)
    trainer = subprocess.Popen(
        train_command(run, *(["--resume"] if resume else [])),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        deadline = time.monotonic() + FINISH_S
        while last_step(run, 1) < target and trainer.poll() is None:
            assert time.monotonic() < deadline, "rank 1 did not reach its step"
            time.sleep(0.02)
        victim = rank_process(trainer, run, 1)
        assert trainer.poll() is None and victim, "the run ended before rank 1 could be killed"
        os.kill(victim, signal.SIGKILL)
        assert trainer.wait(FINISH_S) != 0
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
            trainer.wait()
    return target


def test_a_trainer_rank_killed_at_random_resumes_with_each_step_recorded_once_per_timeline(tmp_path: Path) -> None:
    run = tmp_path / "run"
    rng = random.Random(f"{SEED}-trainer")
    for kill in range(TRAINER_KILLS):
        kill_rank_at_random(run, resume=kill > 0, rng=rng)
    done = subprocess.run(
        train_command(run, "--resume"),
        capture_output=True,
        text=True,
        timeout=FINISH_S * 2,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert subprocess.run(cli("collect", run, "--quiet"), timeout=FINISH_S).returncode == 0
    with Store.open(RunLayout(run).store, read_only=True, schemas=SCHEMAS) as store:
        cur = store.cursor()
        [[twice]] = cur.execute(
            "SELECT count(*) FROM (SELECT rank, timeline, step FROM rank_steps GROUP BY ALL HAVING count(*) > 1)"
        ).fetchall()
        [[steps_twice]] = cur.execute(
            "SELECT count(*) FROM (SELECT timeline, step FROM steps GROUP BY ALL HAVING count(*) > 1)"
        ).fetchall()
        timelines = cur.execute("SELECT timeline, min(step), max(step) FROM steps GROUP BY 1 ORDER BY 1").fetchall()
        [[status]] = cur.execute("SELECT status FROM run").fetchall()
        [[rejected]] = cur.execute("SELECT count(*) FROM rejected").fetchall()
    assert (twice, steps_twice, status) == (0, 0, "finished")
    assert [t for t, _, _ in timelines] == list(range(TRAINER_KILLS + 1)), timelines  # one timeline per resume
    assert timelines[-1][2] == TRAIN_STEPS, timelines
    assert all(later[1] <= earlier[2] + 1 for earlier, later in itertools.pairwise(timelines))  # no step lost
    assert rejected <= TRAINER_KILLS * 2  # at most a torn last line per killed rank
