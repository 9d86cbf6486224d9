"""End-to-end alert latency of ``bedside watch``: a loss spike appended to a live run until the webhook gets it.

Run:  python bench/alert_latency.py [--trials 50] [--ranks 2] [--history 1000] [--rescan-every S]

A run of RANKS ranks is written with HISTORY steps of a smooth, noisy falling loss
(format v1: ``rank_info``, then per step one ``rank_step`` record on every rank and the
job-level ``step`` record on rank 0, the only rank that carries the loss, as the
trainer and ``bedside simulate`` do). ``bedside watch`` is started on it as a
subprocess (``python -m bedside.app.cli watch``) with a bedside.toml whose one
notifier is a ``webhook`` to a recording HTTP server on 127.0.0.1, rate-limited far
above what the benchmark sends, and the default rescan interval unless
``--rescan-every`` is given.

Each trial appends the records of one step whose loss is SPIKE_RATIO x the trend
(about 40 robust sigma: far above any bar of the loss_spike detector) with a
wall-clock timestamp taken just before the first write, and waits for the POST whose
payload is the ``opened`` message of the incident starting at that step; latency =
arrival - append. Then GAP normal steps are appended: the spike recovers (the
``resolved`` POST of its incident says they were processed), and the next spike is far
past the incident grouping gap (25 steps) and rare enough that the spikes do not
inflate the detector's tail factor (the 99.5th percentile of the last 2,000 z-scores).
A randomised pause of 0.2 s plus up to one rescan interval (at least 1 s) follows, so
spikes land at every phase of the follower's rescan and the sender's idle poll. A trial with no POST within --timeout is
a miss.

A first, uncounted spike right after watch starts proves that the history was
ingested and detected (the detectors process rows in order) and that the detector is
past its early raised bar; its latency includes start-up and catch-up.

Breakdown (same clock, one machine): the payload's ``created_at`` is the router's
time, taken after the detectors returned the finding (append -> routed: file event,
ingest pass, feed, detectors); watch's stderr finding line is printed after the
findings, incidents and outbox rows are committed and the sender is woken
(routed -> logged: the store write); logged -> POST is the sender's wake-up, outbox
read and the HTTP request (it can come out slightly negative: the sender is woken just
before the line is printed, and this process reads watch's stderr through a pipe).

``--no-file-events`` runs watch as on a filesystem that sends no inotify events (NFS):
the follower then keeps to its rescans (watch is started through a ``-c`` wrapper that
makes the follower's event set-up fail the way an inotify limit does).

Target (the issue): p95 <= 2 s.
"""

from __future__ import annotations

import argparse
import calendar
import http.server
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bedside.collectors.follow import DEFAULT_RESCAN_EVERY_S
from bedside.collectors.format import encode_line
from bedside.collectors.layout import RunLayout
from bedside.collectors.runinfo import RankPlacement, RunInfo, write_run_info

TARGET_P95_S = 2.0
SPIKE_RATIO = 1.6
LOSS_SIGMA = 0.012  # log-scale noise of the loss, as bedside simulate's default
STEP_S = 0.9  # data time between the history's steps
WARMUP_TIMEOUT_S = 180.0
RESOLVED_TIMEOUT_S = 15.0
NO_FILE_EVENTS = """\
import sys
from bedside.collectors import follow
def _start_events(self):
    self._events_unavailable(OSError("disabled by bench/alert_latency.py --no-file-events"))
follow.Follower._start_events = _start_events
from bedside.app.cli import main
sys.exit(main(sys.argv[1:]))
"""
"""``bedside watch`` as on a filesystem without inotify (NFS): the follower keeps to its rescans."""
FINDING_LINE = re.compile(r"\] loss_spike \(open\): loss spiked from step (\d+):")


# -- the receiver -----------------------------------------------------------
@dataclass
class Arrival:
    at: float  # time.time() when the request was read
    path: str
    payload: dict[str, Any]


class Receiver:
    """A webhook endpoint on 127.0.0.1 that records each POST's arrival time and JSON body."""

    def __init__(self) -> None:
        self.arrivals: list[Arrival] = []
        self.changed = threading.Condition()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                at = time.time()
                try:
                    payload = json.loads(body)
                except ValueError:
                    payload = {}
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")
                with receiver.changed:
                    receiver.arrivals.append(Arrival(at, self.path, payload))
                    receiver.changed.notify_all()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/alerts"

    def wait_for(self, match: Callable[[dict[str, Any]], bool], timeout_s: float) -> Arrival | None:
        """The first arrival whose payload matches, waiting up to ``timeout_s``; None on timeout."""
        deadline = time.monotonic() + timeout_s
        with self.changed:
            while True:
                for arrival in self.arrivals:
                    if match(arrival.payload):
                        return arrival
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.changed.wait(left)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def opened_spike(step: int) -> Callable[[dict[str, Any]], bool]:
    def match(payload: dict[str, Any]) -> bool:
        incident = payload.get("incident") or {}
        return (
            payload.get("event") == "opened"
            and "loss_spike" in incident.get("kinds", ())
            and incident.get("start_step") == step
        )

    return match


def resolved(incident_id: str) -> Callable[[dict[str, Any]], bool]:
    def match(payload: dict[str, Any]) -> bool:
        return payload.get("event") == "resolved" and (payload.get("incident") or {}).get("id") == incident_id

    return match


def created_at(payload: dict[str, Any]) -> float:
    """The payload's ``created_at`` (``YYYY-mm-ddTHH:MM:SS.mmmZ``, UTC) as unix seconds."""
    text = payload["created_at"]
    whole, millis = text.rstrip("Z").split(".")
    return calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + int(millis) / 1000


# -- the run ----------------------------------------------------------------
class RunWriter:
    """Appends whole steps to the rank files, one ``write`` per file (O_APPEND), as a trainer's ranks would."""

    def __init__(self, run: Path, ranks: int, seed: int) -> None:
        self.layout = RunLayout(run)
        self.ranks = ranks
        self.rng = np.random.default_rng(seed)
        self.layout.telemetry.mkdir(parents=True)
        topology = tuple(RankPlacement(rank=r, host=f"node{r // 8:03d}", local_rank=r % 8, dp=r) for r in range(ranks))
        write_run_info(self.layout, RunInfo(name="bench-alert-latency", world_size=ranks, topology=topology))
        self.fds = [
            os.open(self.layout.rank_file(r), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) for r in range(ranks)
        ]
        self.seq = [0] * ranks
        self.bytes = 0
        self.lines = 0

    @staticmethod
    def trend(step: int) -> float:
        """A saturating power law, like the simulator's loss model."""
        return 1.9 + 8.6 * (1 + step / 10) ** -0.5

    def _line(self, rank: int, record: dict[str, Any]) -> str:
        line = encode_line({**record, "rank": rank, "timeline": 0, "seq": self.seq[rank]})
        self.seq[rank] += 1
        return line

    def rank_info(self, now: float) -> None:
        self._write(
            {
                r: self._line(
                    r,
                    {
                        "kind": "rank_info",
                        "time": now,
                        "step": 0,
                        "host": f"node{r // 8:03d}",
                        "local_rank": r % 8,
                        "world_size": self.ranks,
                        "pid": 1000 + r,
                        "mesh": {"dp": r, "tp": 0, "pp": 0},
                    },
                )
                for r in range(self.ranks)
            }
        )

    def step_text(self, step: int, now: float, spike: bool) -> dict[int, str]:
        """Every rank's ``rank_step`` record of ``step``, and rank 0's ``step`` record (the loss) after it."""
        texts = {}
        compute = 0.75 * np.exp(0.015 * self.rng.standard_normal(self.ranks))
        data = 0.02 * np.exp(0.25 * self.rng.standard_normal(self.ranks))
        optimizer = 0.04 * np.exp(0.03 * self.rng.standard_normal(self.ranks))
        step_time = float((compute + data + optimizer).max()) + 0.12
        grad = 0.3 + 0.4 / math.sqrt(1 + step / 50)
        for r in range(self.ranks):
            comm = step_time - float(compute[r] + data[r] + optimizer[r])
            texts[r] = self._line(
                r,
                {
                    "kind": "rank_step",
                    "time": now,
                    "step": step,
                    "metrics": {
                        "step_time": step_time,
                        "data_time": float(data[r]),
                        "compute_time": float(compute[r]),
                        "comm_time": comm,
                        "optimizer_time": float(optimizer[r]),
                        "local_grad_norm": grad * 1.4 * math.exp(0.08 * self.rng.standard_normal()),
                    },
                },
            )
        loss = self.trend(step) * math.exp(LOSS_SIGMA * self.rng.standard_normal()) * (SPIKE_RATIO if spike else 1.0)
        texts[0] += self._line(
            0,
            {
                "kind": "step",
                "time": now,
                "step": step,
                "metrics": {
                    "loss": loss,
                    "grad_norm": grad * math.exp(0.06 * self.rng.standard_normal()),
                    "lr": 3e-4,
                    "tokens": 16384 * self.ranks,
                    "flops": 6 * 7e9 * 16384 * self.ranks,
                },
            },
        )
        return texts

    def append(
        self, steps: range, *, spike_at: int | None = None, times: Callable[[int], float] | None = None
    ) -> float:
        """Append ``steps``; the wall-clock time taken just before the first write."""
        now = time.time()
        texts: dict[int, list[str]] = {r: [] for r in range(self.ranks)}
        for step in steps:
            for r, text in self.step_text(step, times(step) if times else now, step == spike_at).items():
                texts[r].append(text)
        return self._write({r: "".join(t) for r, t in texts.items()})

    def _write(self, texts: dict[int, str]) -> float:
        encoded = {r: t.encode() for r, t in texts.items()}
        started = time.time()
        for r in sorted(encoded):  # rank 0 first: it carries the loss
            os.write(self.fds[r], encoded[r])
        self.bytes += sum(len(b) for b in encoded.values())
        self.lines += sum(t.count("\n") for t in texts.values())
        return started

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)


# -- watch --------------------------------------------------------------------
class Watch:
    """``bedside watch`` as a subprocess; its stderr lines are timestamped as they arrive and kept in a log."""

    def __init__(
        self, run: Path, config: Path, rescan_every: float | None, log: Path, *, file_events: bool = True
    ) -> None:
        entry = ["-m", "bedside.app.cli"] if file_events else ["-c", NO_FILE_EVENTS]
        self.argv = [sys.executable, *entry, "watch", str(run), "--config", str(config), "--drain", "2"]
        if rescan_every is not None:
            self.argv += ["--rescan-every", f"{rescan_every:g}"]
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        self.proc = subprocess.Popen(
            self.argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env, text=True, bufsize=1
        )
        self.log = log.open("w")
        self.found_at: dict[int, float] = {}  # spike step -> when watch printed its finding line
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            at = time.time()
            self.log.write(f"{at:.3f} {line}")
            self.lines.append(line.rstrip("\n"))
            match = FINDING_LINE.search(line)
            if match:
                self.found_at.setdefault(int(match.group(1)), at)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> int:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)
        self.log.close()
        return self.proc.returncode


def write_config(path: Path, url: str, per_minute: int, burst: int) -> None:
    path.write_text(f'''[notifiers.bench]
type = "webhook"
url = "{url}"
min_severity = "warning"
per_minute = {per_minute}
burst = {burst}
timeout_s = 5
''')


# -- trials -------------------------------------------------------------------
@dataclass
class Trial:
    step: int
    appended: float
    arrival: Arrival | None = None
    found: float | None = None
    resolved: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def latency(self) -> float | None:
        return None if self.arrival is None else self.arrival.at - self.appended

    @property
    def routed(self) -> float | None:
        return None if self.arrival is None else created_at(self.arrival.payload)


def spike_trial(writer: RunWriter, receiver: Receiver, watch: Watch, step: int, gap: int, timeout_s: float) -> Trial:
    """Append one spike step, wait for its ``opened`` POST, then the recovery steps and their ``resolved`` POST."""
    trial = Trial(step, writer.append(range(step, step + 1), spike_at=step))
    trial.arrival = receiver.wait_for(opened_spike(step), timeout_s)
    writer.append(range(step + 1, step + 1 + gap))
    if trial.arrival is not None:
        incident = trial.arrival.payload["incident"]
        trial.extra = {
            "threshold_z": incident["evidence"].get("threshold_z"),
            "peak_z": incident["evidence"].get("peak_z"),
            "severity": incident["severity"],
        }
        trial.resolved = receiver.wait_for(resolved(incident["id"]), RESOLVED_TIMEOUT_S) is not None
    else:
        time.sleep(1.0)
    trial.found = watch.found_at.get(step)
    return trial


def percentiles(values: list[float]) -> str:
    if not values:
        return "n/a"
    a = np.array(values)
    p50, p95 = np.percentile(a, [50, 95])
    return f"p50 {p50 * 1000:7.1f} ms   p95 {p95 * 1000:7.1f} ms   max {a.max() * 1000:7.1f} ms"


def report(trials: list[Trial], receiver: Receiver, args: argparse.Namespace, warmup: Trial) -> None:
    got = [t for t in trials if t.latency is not None]
    latencies = [t.latency for t in got]
    missed = len(trials) - len(got)
    if args.verbose:
        print(f"{'trial':>5} {'step':>6} {'latency':>9} {'detect':>8} {'commit':>8} {'send':>8} {'bar z':>6} {'z':>6}")
        for i, t in enumerate(trials, 1):
            if t.latency is None:
                print(f"{i:5d} {t.step:6d}    missed")
                continue
            commit = f"{(t.found - t.routed) * 1000:6.1f}ms" if t.found else "     n/a"
            send = f"{(t.arrival.at - t.found) * 1000:6.1f}ms" if t.found else "     n/a"
            print(
                f"{i:5d} {t.step:6d} {t.latency * 1000:7.1f}ms {(t.routed - t.appended) * 1000:6.1f}ms {commit} "
                f"{send} {t.extra['threshold_z']:6.2f} {t.extra['peak_z']:6.1f}"
            )
    print(
        f"\nalert latency, append -> webhook POST received: {len(trials)} trials, {len(got)} received, "
        f"{missed} missed (no POST within {args.timeout:g} s)"
    )
    logged = [t for t in got if t.found is not None]
    for name, values in (
        ("total", latencies),
        ("append -> routed (event, ingest, detect)", [t.routed - t.appended for t in got]),
        ("routed -> logged (store commit)", [t.found - t.routed for t in logged]),
        ("logged -> POST (sender wake, HTTP)", [t.arrival.at - t.found for t in logged]),
    ):
        print(f"  {name:<42} {percentiles(values)}")
    if got:
        bars = [t.extra["threshold_z"] for t in got]
        print(
            f"  loss_spike bar at the trials: threshold z {min(bars):.2f}-{max(bars):.2f} (4 x tail factor; "
            f"8+ while the detector is young); spike peak z {np.median([t.extra['peak_z'] for t in got]):.0f} "
            f"(median); {sum(t.resolved for t in got)} of {len(got)} incidents resolved"
        )
    late = [t for t in trials if t.latency is None and receiver.wait_for(opened_spike(t.step), 0)]
    if late:
        print(f"  {len(late)} missed trial(s) got their POST late")
    spikes = {t.step for t in [warmup, *trials]}
    other = [
        a.payload
        for a in receiver.arrivals
        if not (
            a.payload.get("event") in ("opened", "resolved")
            and "loss_spike" in (a.payload.get("incident") or {}).get("kinds", ())
            and (a.payload.get("incident") or {}).get("start_step") in spikes
        )
    ]
    if other:
        described = sorted(
            {f"{p.get('event')} {','.join((p.get('incident') or {}).get('kinds', ())) or 'digest'}" for p in other}
        )
        print(f"  other messages received: {len(other)} ({'; '.join(described)})")
    if latencies:
        p95 = float(np.percentile(latencies, 95))
        print(
            f"target: p95 <= {TARGET_P95_S:g} s: {'met' if p95 <= TARGET_P95_S and not missed else 'MISSED'} "
            f"(p95 {p95:.3f} s, {missed} missed)"
        )
    else:
        print(f"target: p95 <= {TARGET_P95_S:g} s: MISSED (no alert received)")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=50, help="spikes timed (after one uncounted warm-up spike)")
    parser.add_argument("--ranks", type=int, default=2, help="ranks of the run")
    parser.add_argument("--history", type=int, default=1000, help="normal steps written before watch starts")
    parser.add_argument(
        "--gap",
        type=int,
        default=300,
        help="normal steps appended after each spike (> 25, the incident grouping gap; rare spikes "
        "keep the detector's tail factor at its normal level)",
    )
    parser.add_argument(
        "--rescan-every",
        type=float,
        default=None,
        metavar="S",
        help=f"passed to bedside watch (default: watch's own, {DEFAULT_RESCAN_EVERY_S:g} s)",
    )
    parser.add_argument(
        "--no-file-events", action="store_true", help="run watch as on a filesystem without inotify (NFS): rescans only"
    )
    parser.add_argument("--timeout", type=float, default=15.0, help="seconds before a trial counts as missed")
    parser.add_argument("--per-minute", type=int, default=6000, help="the notifier's rate limit")
    parser.add_argument("--burst", type=int, default=500, help="the notifier's burst")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where to write the run (default: a temporary directory, removed afterwards)",
    )
    parser.add_argument("--verbose", action="store_true", help="print every trial")
    args = parser.parse_args()
    if args.gap <= 25 or args.trials < 1 or args.ranks < 1 or args.history < 100:
        parser.error("need --gap > 25, --trials >= 1, --ranks >= 1, --history >= 100")
    return args


def main() -> int:
    args = parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bedside-bench-alerts-"))
    run = workdir / "run"
    shutil.rmtree(run, ignore_errors=True)
    receiver = Receiver()
    writer = RunWriter(run, args.ranks, args.seed)
    start = time.time() - (args.history + 1) * STEP_S
    writer.rank_info(start)
    writer.append(range(1, args.history + 1), times=lambda s: start + s * STEP_S)
    config = workdir / "bedside.toml"
    write_config(config, receiver.url, args.per_minute, args.burst)
    rescan = args.rescan_every if args.rescan_every is not None else DEFAULT_RESCAN_EVERY_S
    print(
        f"run: {args.ranks} ranks, {args.history} steps of history ({writer.lines:,} lines, "
        f"{writer.bytes / 1e6:.2f} MB); spike = loss x{SPIKE_RATIO} on rank 0's step record "
        f"(~{math.log(SPIKE_RATIO) / LOSS_SIGMA:.0f} sigma), then {args.gap} normal steps"
    )
    print(
        f"watch: rescan every {rescan:g} s ({'given' if args.rescan_every is not None else 'default'}); "
        f"{'file events OFF (rescans only); ' if args.no_file_events else ''}"
        f"webhook on 127.0.0.1:{receiver.port}, per_minute {args.per_minute}, burst {args.burst}; "
        f"{os.cpu_count()} CPUs"
    )
    watch = Watch(run, config, args.rescan_every, workdir / "watch.log", file_events=not args.no_file_events)
    rng = random.Random(args.seed)
    trials: list[Trial] = []
    try:
        step = args.history + 1
        warmup = spike_trial(writer, receiver, watch, step, args.gap, WARMUP_TIMEOUT_S)
        if warmup.latency is None:
            print(
                f"warm-up spike got no alert within {WARMUP_TIMEOUT_S:g} s (watch "
                f"{'running' if watch.alive() else f'exited {watch.proc.returncode}'}); its stderr:"
            )
            print("\n".join(watch.lines[-20:]))
            return 1
        print(
            f"warm-up spike (step {step}; includes watch start-up and the history's catch-up): alert after "
            f"{warmup.latency:.2f} s, not counted"
        )
        for _ in range(args.trials):
            time.sleep(0.2 + rng.uniform(0.0, max(1.0, rescan)))
            step += args.gap + 1
            trials.append(spike_trial(writer, receiver, watch, step, args.gap, args.timeout))
            if not watch.alive():
                print(f"watch exited with {watch.proc.returncode}")
                break
    finally:
        code = watch.stop()
        writer.close()
        receiver.close()
    report(trials, receiver, args, warmup)
    print(
        f"watch exited with {code}; its log: {workdir / 'watch.log'}" if args.workdir else f"watch exited with {code}"
    )
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
