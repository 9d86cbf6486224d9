"""The hang detector: silent or stopped ranks named, pauses allowed for, silent jobs seen by ``tick``."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
import telemetry_frames as tf

from bedside.detectors.errors import DetectorConfigError
from bedside.detectors.finding import Finding
from bedside.detectors.hang import HangDetector
from bedside.detectors.registry import build_detectors
from bedside.detectors.telemetry import RunState, TelemetryBatch

RANKS = 8


def run_state(ranks: int = RANKS) -> RunState:
    return RunState(world_size=ranks, topology=tf.topology(ranks, per_host=4))


def replay(batch: TelemetryBatch, *, parts: int = 1, detector: HangDetector | None = None) -> list[Finding]:
    """Latest findings, fed in ``parts`` pieces cut at the same times in every frame (a live feed)."""
    found = tf.replay(detector or HangDetector(), batch, parts=parts, by_time=True, run=run_state())
    return sorted(found.values(), key=lambda f: (f.start_step, f.ranks))


def sync_hang(
    kind: str = "gaussian",
    base: float = 0.3,
    *,
    culprit: int = 3,
    stop: int = 120,
    heartbeat_s: float | None = 5.0,
    silent_s: float = 600.0,
) -> tuple[TelemetryBatch, float]:
    """A synchronous job whose ``culprit`` hangs after step ``stop``: nobody steps again, the peers heartbeat.

    A checkpoint of step 100 was saved. Returns the batch and the time of the last step.
    """
    timing = tf.synchronous(tf.work(np.random.default_rng(0), stop, RANKS, base, kind=kind, scale=0.1))
    last = float(timing["end"][-1])
    beats = (
        []
        if heartbeat_s is None
        else [
            b for r in range(RANKS) if r != culprit for b in tf.heartbeats(r, last, last + silent_s, heartbeat_s, stop)
        ]
    )
    saved = float(timing["end"][99])
    checkpoints = tf.checkpoint_frame([(0, saved, 100, "save_started"), (0, saved + 0.01, 100, "saved")])
    return TelemetryBatch(
        rank_steps=tf.rank_step_frame(timing), events=tf.in_time_order(tf.event_frame(beats)), checkpoints=checkpoints
    ), last


@pytest.mark.parametrize(("kind", "base"), [("gaussian", 0.3), ("student_t3", 20.0), ("lognormal", 2.0)])
def test_the_rank_that_went_silent_is_the_culprit(kind: str, base: float) -> None:
    batch, _ = sync_hang(kind, base)
    [found] = replay(batch)
    assert found.ranks == (3,) and found.severity.value == "critical" and found.active
    assert found.start_step == found.end_step == 120
    ev = found.evidence
    assert ev["how"] == "silent while other ranks still write" and ev["place"]["host"] == "node-000"
    assert ev["threshold_s"] <= ev["silent_s"] <= ev["threshold_s"] + 5.0
    assert max(60.0, 5 * base) <= ev["threshold_s"] <= max(60.0, 15 * base)  # learned from the step intervals
    action = found.suggested_action
    assert action.action == "investigate" and action.args["host"] == "node-000"
    assert action.args["restart_from_step"] == 100 and "step 100" in action.why


def stalled(
    rank: int,
    before_step: int,
    stall_s: float,
    *,
    base: float = 0.5,
    steps: int = 400,
    kind: str = "gaussian",
    seed: int = 1,
) -> TelemetryBatch:
    """Ranks that do not wait for each other; ``rank`` stalls before ``before_step``; all end with run_end."""
    compute = tf.work(np.random.default_rng(seed), steps, RANKS, base, kind=kind)
    pause = np.zeros_like(compute)
    pause[before_step - 1, rank] = stall_s
    frame = tf.rank_step_frame(tf.asynchronous(compute, pause_s=pause))
    return TelemetryBatch(rank_steps=frame, events=tf.event_frame(sorted(tf.run_ends(frame), key=lambda e: e[1])))


def test_a_rank_that_stops_while_others_step_is_found_and_clears_when_it_steps_again() -> None:
    [found] = replay(stalled(5, 201, 300.0))  # the others go on
    assert found.ranks == (5,) and not found.active and (found.start_step, found.end_step) == (200, 201)
    assert found.evidence["how"] == "no step while other ranks step"
    assert found.evidence["cleared"] == "it stepped again (step 201)"


@pytest.mark.parametrize(("base", "gap_s", "hangs"), [(0.2, 90.0, True), (20.0, 90.0, False), (20.0, 400.0, True)])
def test_the_threshold_is_learned_from_the_step_intervals(base: float, gap_s: float, hangs: bool) -> None:
    found = replay(stalled(2, 101, gap_s, base=base, steps=600, kind="lognormal", seed=2))
    assert [f.ranks for f in found] == ([(2,)] if hangs else [])


def pauses(save_s: float, eval_s: float, *, hung_save: bool = False) -> TelemetryBatch:
    """16 ranks, 1 s steps; a checkpoint every 200 steps (rank 0 saves, silent; the others heartbeat) and an
    eval every 100 steps (every rank heartbeats). With ``hung_save`` the save of step 600 never ends."""
    ranks, steps = 16, 800
    pause = np.zeros(steps)
    pause[100::100] += eval_s
    pause[200::200] += save_s
    timing = tf.synchronous(tf.work(np.random.default_rng(3), steps, ranks, 1.0), pause_s=pause)
    end = timing["end"]
    rows, beats, evals = [], [], []
    for step in range(100, steps, 100):
        start = end[step - 1]
        busy = eval_s + (save_s if step % 200 == 0 else 0.0)
        if step % 200 == 0:
            rows += [(0, start, step, "save_started"), (0, start + save_s, step, "saved")]
        evals.append((start + busy, step))
        beats += [
            b
            for r in range(int(step % 200 == 0), ranks)  # the saving rank 0 is busy
            for b in tf.heartbeats(r, start, start + busy, 10.0, step)
        ]
    rank_steps = tf.rank_step_frame(timing)
    if hung_save:
        rank_steps = rank_steps[rank_steps["step"] <= 600]
        rows = [r for r in rows if r[2] < 600 or r[3] == "save_started"]
        evals = [e for e in evals if e[1] < 600]
        start = end[599]
        beats = [b for b in beats if b[1] <= start] + [
            b for r in range(1, ranks) for b in tf.heartbeats(r, start, start + 3000, 10.0, 600)
        ]
    return TelemetryBatch(
        rank_steps=rank_steps,
        checkpoints=tf.checkpoint_frame(rows),
        evals=tf.eval_frame(evals),
        events=tf.in_time_order(tf.event_frame(beats)),
    )


def test_checkpoint_saves_and_evals_are_allowed_for() -> None:
    assert replay(pauses(save_s=90.0, eval_s=70.0)) == []


def test_a_save_that_never_ends_is_a_hang_of_the_saving_rank() -> None:
    [found] = replay(pauses(save_s=90.0, eval_s=70.0, hung_save=True))
    assert found.ranks == (0,) and found.start_step == 600 and found.active
    longest_save = 90.0 + 70.0  # the interval after a checkpoint step also held an eval
    assert found.evidence["threshold_s"] >= 60.0 + 2 * longest_save
    assert found.evidence["silent_s"] < found.evidence["threshold_s"] + 11.0


def test_a_rank_that_wrote_run_end_is_finished_not_hung() -> None:
    compute = tf.work(np.random.default_rng(4), 300, 4, 1.0)
    frame = tf.rank_step_frame(tf.asynchronous(compute))
    frame = frame[(frame["rank"] != 2) | (frame["step"] <= 100)]
    ended = float(frame.loc[frame["rank"] == 2, "time"].max()) + 0.1
    ends = [(2, ended, 100, "run_end")] + [(r, float(frame["time"].max()) + 1, 300, "run_end") for r in (0, 1, 3)]
    detector = HangDetector()
    assert replay(TelemetryBatch(rank_steps=frame, events=tf.event_frame(ends)), detector=detector) == []
    assert detector.tick(float(frame["time"].max()) + 10_000) == []


def test_tick_sees_a_job_where_every_rank_went_silent_and_names_who_stopped_first() -> None:
    batch, last = sync_hang(heartbeat_s=None)
    batch.rank_steps = batch.rank_steps[(batch.rank_steps["rank"] != 6) | (batch.rank_steps["step"] < 120)]
    detector = HangDetector()
    assert replay(batch, detector=detector) == []
    assert detector.tick(last + 30) == []
    [found] = detector.tick(last + 1000)
    assert found.ranks == () and found.active and found.start_step == 119
    assert found.evidence["stopped_first"] == [6] and "rank(s) 6 stopped a step earlier" in found.summary
    resumed = tf.rank_step_frame(tf.synchronous(np.full((1, RANKS), 0.3)), first_step=121)
    resumed["time"] += last + 1000
    [cleared] = detector.update(TelemetryBatch(rank_steps=resumed))
    assert cleared.finding_id == found.finding_id and not cleared.active and cleared.end_step == 121


def test_tick_waits_through_an_eval_at_the_eval_cadence() -> None:
    batch = pauses(save_s=30.0, eval_s=120.0)
    steps = batch.rank_steps
    quiet = float(steps.loc[steps["step"] == 700, "time"].max())  # the eval of step 700 starts: no heartbeats
    detector = HangDetector()
    replay(
        TelemetryBatch(*(frame[frame["time"] <= quiet] for frame in batch.frames())),
        detector=detector,
    )
    assert detector.tick(quiet + 250) == []
    [found] = detector.tick(quiet + 1000)
    assert found.start_step == 700 and found.evidence["threshold_s"] >= 60.0 + 2 * 120.0


def test_one_batch_or_many_give_the_same_findings() -> None:
    """Pieces cut at the same times in every frame, as a live feed reads; ``TelemetryBatch.split`` cuts each
    frame at its own row counts, which feeds one frame's rows long before another's (a feed lagging by far
    more than the threshold), so it is not used here."""
    sync, _ = sync_hang()
    other = stalled(1, 151, 200.0, seed=5)
    for frame in (other.rank_steps, other.events):
        frame["time"] += 10_000
        frame["timeline"] = 1
    batch = TelemetryBatch(
        rank_steps=tf.in_time_order(pd.concat([sync.rank_steps, other.rank_steps])),
        events=tf.in_time_order(pd.concat([sync.events, other.events])),
        checkpoints=sync.checkpoints,
    )
    whole = replay(batch)
    assert [f.ranks for f in whole] == [(3,), (1,)]
    for parts in (7, 40):
        assert tf.as_json({f.finding_id: f for f in replay(batch, parts=parts)}) == tf.as_json(
            {f.finding_id: f for f in whole}
        )


@pytest.mark.parametrize("settings", [{"min_seconds": 0}, {"quantile": 1.0}, {"factor": -1}, {"bogus": 1}])
def test_bad_settings_are_refused(settings: dict) -> None:
    with pytest.raises(DetectorConfigError):
        build_detectors({"hang": settings}, only=["hang"])


def test_a_rank_whose_file_is_read_behind_the_others_is_not_taken_for_hung() -> None:
    """A backlog: rank 7's file is read to step 100 while the others' are read to the end."""
    timing = tf.synchronous(tf.work(np.random.default_rng(2), 400, RANKS, 0.5, kind="gaussian", scale=0.1))
    frame = tf.rank_step_frame(timing)
    behind = (frame["rank"] == 7) & (frame["step"] > 100)
    first, rest = TelemetryBatch(rank_steps=frame[~behind]), TelemetryBatch(rank_steps=frame[behind])

    def fed(caught_up_first: bool) -> list[Finding]:
        detector, run = HangDetector(), run_state()
        detector.bind(run)
        run.caught_up = caught_up_first
        found = detector.update(first)
        run.caught_up = True
        return found + detector.update(rest)

    assert fed(caught_up_first=False) == []
    assert [f.ranks for f in fed(caught_up_first=True)][:1] == [(7,)]  # what a backlog looked like before


def test_a_rank_read_behind_that_really_stalled_is_found_as_in_one_batch() -> None:
    """Rank 7 stalls 300 s after step 100 while the others step; its file is first read only to step 50."""
    timing = tf.synchronous(tf.work(np.random.default_rng(4), 400, RANKS, 0.5, kind="gaussian", scale=0.1))
    frame = tf.rank_step_frame(timing)
    frame.loc[(frame["rank"] == 7) & (frame["step"] > 100), "time"] += 300.0
    frame = frame[frame["time"] <= frame.loc[frame["rank"] != 7, "time"].max()].sort_values("time", kind="stable")
    behind = (frame["rank"] == 7) & (frame["step"] > 50)

    def fed(parts: list[pd.DataFrame], caught_up: list[bool]) -> list[dict]:
        detector, run = HangDetector(), run_state()
        detector.bind(run)
        latest = {}
        for part, level in zip(parts, caught_up):
            run.caught_up = level
            latest.update({f.finding_id: f for f in detector.update(TelemetryBatch(rank_steps=part))})
        return [f.to_json() for f in latest.values()]

    whole = fed([frame], [True])
    assert [f["ranks"] for f in whole] == [[7]]
    assert fed([frame[~behind], frame[behind]], [False, True]) == whole


RANK_HANG = re.compile(
    r"rank (\d+)(?: \(host ([\w-]+)\))? (hangs|hung) after step (\d+): ([a-z ]+) for ([0-9.]+) s "
    r"\(threshold ([0-9.]+) s\)(?:; cleared: (.+))?$"
)


@pytest.mark.parametrize("case", ["silent", "stepped again"])
def test_the_summary_states_the_evidence_and_whether_the_hang_is_over(case: str) -> None:
    batch = sync_hang()[0] if case == "silent" else stalled(5, 201, 300.0)
    [found] = replay(batch)
    match = RANK_HANG.match(found.summary)
    assert match, found.summary
    rank, host, verb, step, how, silent, threshold, cleared = match.groups()
    ev = found.evidence
    assert (int(rank), int(step), how) == (found.ranks[0], found.start_step, ev["how"])
    assert host == ev["place"].get("host") and float(silent) == ev["silent_s"] == found.score
    assert float(threshold) == ev["threshold_s"]
    assert (verb, cleared) == (("hangs", None) if found.active else ("hung", ev["cleared"]))
    assert found.active == (case == "silent")
