"""The fault harness: owners and trainer ranks killed with SIGKILL at random moments lose and repeat nothing.

``bedside watch`` and ``bedside serve`` own a faulty run while its telemetry lands in pieces, with a
signed webhook on a real receiver; each is killed again and again at a random moment, then a last
watch finishes the run. The store must then hold what one clean ``bedside collect`` of the same files
holds (tables, row counts, committed offsets), the incidents a clean detection finds (hangs aside), and every alert
message must have been answered 2xx exactly once. ``KILLS`` is sized for CI; ``bench/harness.py --long``
runs the same with many more kills (docs/reliability.md).
"""
from __future__ import annotations

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

from bedside.collectors.layout import RunLayout
from bedside.collectors.store import Store

KILLS = int(os.environ.get("BEDSIDE_HARNESS_KILLS", "3"))
SEED = int(os.environ.get("BEDSIDE_HARNESS_SEED", "20261201"))
OWNER_START_S, FINISH_S = 90.0, 180.0
DATA_TABLES = ("sources", "run_info", "rank_topology", "steps", "rank_steps", "evals", "checkpoints", "actions",
               "events", "faults", "rejected_lines")


def cli(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "bedside.app.cli", *map(str, args)]


def pieces(run: Path, count: int) -> list[dict[Path, bytes]]:
    """Cut every rank file to its first 1/(count+1) of records; the rest as ``count`` pieces to append in turn."""
    rest: list[dict[Path, bytes]] = [{} for _ in range(count)]
    for path in sorted(RunLayout(run).telemetry.glob("rank-*.jsonl")):
        lines = path.read_bytes().splitlines(keepends=True)
        bounds = [len(lines) * i // (count + 1) for i in range(count + 2)]
        path.write_bytes(b"".join(lines[:bounds[1]]))
        for i in range(count):
            rest[i][path] = b"".join(lines[bounds[i + 1]:bounds[i + 2]])
    return rest


def append(piece: dict[Path, bytes]) -> None:
    for path, data in piece.items():
        with open(path, "ab") as fh:
            fh.write(data)


def start_owner(kind: str, run: Path, config: Path, port: int) -> subprocess.Popen:
    """``bedside watch`` or ``bedside serve`` of ``run`` in a process group of its own."""
    extra = ["--rescan-every", "0.2"] if kind == "watch" else ["--port", str(port), "--refresh", "1"]
    return subprocess.Popen(cli(kind, run, "--config", config, *extra), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, **ENVIRON, "OMP_NUM_THREADS": "1"})


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
    with Store.open(RunLayout(run).store, read_only=True) as store:
        cur = store.cursor()
        counts = {t: cur.execute(f'SELECT count(*) FROM "{t}"').fetchall()[0][0] for t in DATA_TABLES}
        offsets = cur.execute("SELECT path, committed_offset, state FROM sources ORDER BY path").fetchall()
        incidents = cur.execute("SELECT incident_id, kinds, severity, status, start_step FROM incidents "
                                "WHERE NOT list_contains(kinds, 'hang') ORDER BY 1").fetchall()
    return {"counts": counts, "offsets": offsets, "incidents": incidents}


@pytest.mark.parametrize("kind", ["watch", "serve"])
def test_an_owner_killed_at_random_loses_and_repeats_no_row_and_no_alert(
        kind: str, tiny_faults: Path, tmp_path: Path, receiver: Receiver) -> None:
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
    final = subprocess.run(cli("watch", tiny_faults, "--config", config, "--until-finished", "--drain", "30",
                               "--quiet"), capture_output=True, text=True, timeout=FINISH_S,
                           env={**os.environ, **ENVIRON})
    assert final.returncode == 0, final.stderr
    assert subprocess.run(cli("detect", reference), capture_output=True, timeout=FINISH_S).returncode == 0
    assert facts(tiny_faults) == facts(reference)
    assert_each_message_delivered_once(tiny_faults, receiver)
