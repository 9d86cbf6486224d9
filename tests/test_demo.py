"""``bedside demo`` as a user runs it: the real trainer under torchrun, a live follower, the summary."""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from receiver import Receiver, free_port

from bedside.app.fault_plan import DemoFaults

pytestmark = pytest.mark.slow(
    reason="the demo as a user runs it: torchrun training, collection, detection, a served dashboard"
)

DEMO_TIMEOUT_S = 300
STEPS = 60


def sections(out: str) -> dict[str, list[str]]:
    """The demo's printed sections: title -> its lines."""
    found: dict[str, list[str]] = {}
    for block in out.split("\n== ")[1:]:
        title, *lines = block.strip().splitlines()
        found[title] = [line for line in lines if line and not line.startswith("explore:")]
    return found


SECRET = "demo-signing-secret"


@pytest.fixture(scope="module")
def hook() -> Iterator[Receiver]:
    """The webhook receiver the demo's bedside.toml points at."""
    server = Receiver()
    yield server
    server.close()


@pytest.fixture(scope="module")
def demo_output(tmp_path_factory, bedside, hook: Receiver) -> str:
    """The demo's output, run beside the other tests as on any busy machine: its straggler's delay follows the
    rank's own work less its wait for a CPU (docs/faults.md), so the store shows it beside five CPU-bound
    processes on two cores (it once read 1.36x for 2x beside other tests, when its delay was fixed)."""
    out = tmp_path_factory.mktemp("demo")
    (out / "bedside.toml").write_text(f'''
[notifiers.hook]
type = "webhook"
url = "{hook.url}/alerts"
secret = "${{DEMO_SECRET}}"
min_severity = "info"
''')
    done = bedside("demo", "--out", out, "--steps", STEPS, timeout=DEMO_TIMEOUT_S, env={"DEMO_SECRET": SECRET})
    assert done.returncode == 0, done.stderr
    return done.stdout


def section(out: str, prefix: str) -> list[str]:
    [lines] = [lines for title, lines in sections(out).items() if title.startswith(prefix)]
    return lines


def test_the_demo_trains_to_the_end_and_evaluates_against_the_entropy_floor(demo_output: str) -> None:
    assert section(demo_output, "run")[1].split()[1:] == ["2", str(STEPS), "finished"]
    evals = [line.split() for line in section(demo_output, "held-out loss")[1:]]
    assert len(evals) >= 2 and all(float(above) > 0 for *_, above in evals)
    assert re.search(r'explore: .* query .*run-\d+-\d+ "SELECT', demo_output)


def test_the_demo_shows_each_injected_fault_in_the_store(demo_output: str) -> None:
    faults = DemoFaults(STEPS)
    spike = {int(line.split()[0]): float(line.split()[1]) for line in section(demo_output, "bad data shard")[1:]}
    assert spike[faults.bad_shard_step] > 1.1 * spike[faults.bad_shard_step - 1]
    times = {int(line.split()[0]): line.split() for line in section(demo_output, "straggler")[1:]}
    before, own = 4, 5  # rank, host, compute, cpu wait, own (less the wait) before and in, comm
    slowed = {rank: float(columns[own]) / float(columns[before]) for rank, columns in times.items()}
    # factor 2 is against the work the rank does now, and on a shared machine that moves as the peer idles in the
    # all-reduce and other processes come and go (1.40 measured with six test workers beside it), so against the
    # steps before the window the slowdown reads well under 2x
    assert slowed[1] > 1.25 and slowed[1] > 1.2 * slowed[0]
    # Who waits for whom in the all-reduce is a matter of wall time, which on a shared machine the other processes
    # decide as much as the fault does (a peer kept from a CPU reaches it last): test_trainer_faults checks that
    # relation step by step; ten steps' medians here only show it where the machine has cores to spare.
    norms = {int(line.split()[1]): line.split()[2] for line in section(demo_output, "bit flip in rank 1")[1:]}
    assert norms[1] == "inf" and norms[0] != "inf"
    checksums = [line.split() for line in section(demo_output, "bit flip in rank 0")[1:]]
    assert checksums[-1][1] == "2"
    assert any("update skipped" in line for line in section(demo_output, "updates the trainer skipped"))
    truth = [line.split()[1] for line in section(demo_output, "ground truth")[1:]]
    assert truth == ["bad_shard", "straggler", "grad_bitflip", "param_bitflip", "nan"]


def test_the_demo_detects_while_it_follows_and_scores_itself(demo_output: str) -> None:
    """60 steps are too few for the trend-based detectors; the NaN and the replica split are found at once."""
    found = {line.split()[1]: line.split()[3:] for line in section(demo_output, "each injected fault")[1:]}
    assert found["nan"] == ["nonfinite", "0"]
    assert found["param_bitflip"][0] == "sdc" and 0 <= int(found["param_bitflip"][1]) <= 10  # at the next checksum
    assert any("critical" in line for line in section(demo_output, "incidents the detectors opened"))


def test_a_demo_whose_training_crashes_fails_in_one_line(tmp_path: Path, bedside) -> None:
    done = bedside("demo", "--out", tmp_path, "--steps", 40, "--crash-rank", 1, timeout=DEMO_TIMEOUT_S)
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.startswith("bedside: error:")]
    assert len(errors) == 1 and "training exited with code" in errors[0]


@pytest.mark.parametrize(
    "args",
    [("--steps", "10"), ("--nproc", "1"), ("--crash-rank", "-1"), ("--crash-rank", "2")],
    ids=["too few steps", "one rank", "negative crash rank", "crash rank not in the run"],
)
def test_demo_options_out_of_range_are_refused_before_anything_runs(tmp_path: Path, bedside, args: tuple) -> None:
    done = bedside("demo", "--out", tmp_path / "demo", *args)
    assert done.returncode == 2 and not (tmp_path / "demo").exists()


def test_the_fault_plan_refuses_a_run_too_short_for_it() -> None:
    with pytest.raises(ValueError, match="at least 40 steps"):
        DemoFaults(20)


def test_the_demo_posts_each_incident_to_the_configured_webhook_once(demo_output: str, hook: Receiver) -> None:
    incidents = section(demo_output, "incidents the detectors opened")[1:]
    delivered = hook.delivered("/alerts")
    opened = [r.json()["incident"]["id"] for r in delivered if r.json()["event"] == "opened"]
    assert sorted(opened) == sorted(set(opened)) and len(opened) == len(incidents) >= 1
    assert Counter(r.key for r in delivered).most_common(1)[0][1] == 1
    for request in delivered:
        expected = "sha256=" + hmac.new(SECRET.encode(), request.body, hashlib.sha256).hexdigest()
        assert request.headers["X-Bedside-Signature-256"] == expected
    sent = section(demo_output, "alert messages and their delivery")[1:]
    assert len(sent) == len(delivered) and all("delivered" in line for line in sent)


def test_the_demo_can_serve_the_dashboard_on_its_live_run_and_alert(tmp_path: Path, start_bedside) -> None:
    port = free_port()
    (tmp_path / "bedside.toml").write_text(f'[notifiers.journal]\ntype = "log"\npath = "{tmp_path / "alerts.log"}"\n')
    demo = start_bedside(
        "demo",
        "--serve",
        "--out",
        tmp_path,
        "--steps",
        400,
        "--port",
        port,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "BEDSIDE_OPERATOR_TOKEN": "t0ken"},
        start_new_session=True,
    )
    deadline = time.monotonic() + DEMO_TIMEOUT_S
    while time.monotonic() < deadline and not _healthy(port):
        assert demo.poll() is None, demo.stderr.read()
        time.sleep(0.5)
    [run] = list(tmp_path.glob("run-*"))
    while time.monotonic() < deadline and not (run / "bedside.duckdb").exists():
        time.sleep(0.5)
    assert (run / "bedside.duckdb").exists(), "serve did not take over the demo's run"
    alerts = tmp_path / "alerts.log"  # the bedside.toml in --out configures the served run's alerts
    while time.monotonic() < deadline and "New incident" not in (alerts.read_text() if alerts.exists() else ""):
        time.sleep(0.5)
    assert "New incident" in alerts.read_text()
    os.killpg(demo.pid, signal.SIGINT)
    assert demo.wait(60) == 0
    said = demo.stderr.read()
    assert f"http://127.0.0.1:{port}  (operator token for actions: t0ken)" in said


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as response:
            return response.read() == b"ok"
    except OSError:
        return False
