"""``bedside serve`` keeps no secret in its environment: started with the control key and the operator token in
it, it starts itself again without them (``/proc/PID/environ`` holds a process's starting environment, which
deleting from ``os.environ`` does not change) and still has both."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from receiver import answers, free_port

from bedside.app.serve_secrets import FD_ENV, take_secrets
from bedside.collectors import controlkey
from bedside.collectors.controlkey import KEY_ENV, hold_control_key, read_control_key
from bedside.collectors.layout import RunLayout

KEY, TOKEN = "a marker key that must not leak 0123", "a marker operator token 4567"
START_S = 120.0  # a liveness bound: Streamlit's start on a loaded machine


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")
def test_serve_started_with_secrets_in_its_environment_holds_them_without_them(tmp_path: Path) -> None:
    port, log = free_port(), tmp_path / "serve.log"
    env = {**os.environ, KEY_ENV: KEY, "BEDSIDE_OPERATOR_TOKEN": TOKEN, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "bedside.app.cli", "serve", str(tmp_path), "--port", str(port)]
    with log.open("w") as out:
        served = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + START_S
        while not answers(f"http://127.0.0.1:{port}/_stcore/health"):
            assert served.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        environ = Path(f"/proc/{served.pid}/environ").read_bytes()  # the same process, its second image
        assert KEY.encode() not in environ and TOKEN.encode() not in environ
        assert f"{FD_ENV}=".encode() in environ  # it was started again, handed its secrets through a pipe
        assert "(actions unlocked by the operator token)" in log.read_text()
    finally:
        os.killpg(served.pid, signal.SIGTERM)
        served.wait(timeout=60)


def test_called_from_python_the_secrets_leave_the_environment_without_a_restart(monkeypatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.delenv("BEDSIDE_OPERATOR_TOKEN", raising=False)
    assert take_secrets(start_again=False) == {KEY_ENV: KEY}
    assert KEY_ENV not in os.environ


def test_a_held_key_signs_as_the_environment_s_did(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.setattr(controlkey, "_held", None)
    hold_control_key(KEY)
    assert read_control_key(RunLayout(tmp_path)) == KEY.encode()
