"""Silent data corruption: replicas whose parameter checksums disagree, and one rank's gradient far above its peers'.

Both signals come from complete steps (a ``StepAssembler``), walked in step order:

* at a step with checksums, each group of data-parallel replicas (same ``tp`` and ``pp``;
  all ranks when the topology is unknown) votes; a rank that differs from a strict
  majority is named. Without a strict majority (two replicas, or FSDP shards that
  never agree) nothing is said.
* every step, ``d = log2(local_grad_norm) - median over ranks`` is compared with the
  tail of the same deviations pooled over the run's history (``PooledTail``): a rank
  whose ``d`` lies where clean data would put one rank in ``1 / false_alarms_per_step``
  steps is an outlier.

Evidence against one rank on one timeline is one finding (both signals together),
active while its checksum still disagrees or within ``gap`` steps of its last outlier.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from .crossrank import CrossRankDetector, StepMatrix
from .finding import Finding, Severity, SuggestedAction
from .kinds import Family, FindingKind
from .limits import COUNT, FRACTION, NON_NEGATIVE, OPTIONAL_COUNT, POSITIVE, ranges
from .robust import MAD_TO_SIGMA, row_median
from .telemetry import TelemetryBatch

LOWEST, PER_DECADE = -6.0, 100
EDGES = 10.0 ** (LOWEST + np.arange(9 * PER_DECADE + 1) / PER_DECADE)
"""Histogram bins of deviations: 100 per decade (2.3 % wide) from 1e-6 (and below) to 1e3 (and above)."""
CENTRES = np.sqrt(EDGES[:-1] * EDGES[1:])
TAIL_FRACTION = 0.001
"""The tail model starts at the pooled deviations' upper 0.1 % quantile ..."""
TAIL_MIN = 50.0
"""... or lower, so that at least 50 (decayed) samples lie above it."""
PRIOR_GAMMA, PRIOR_WEIGHT = 1 / 3, 50.0
"""Hill's tail index is shrunk towards a Student-t(3) tail, as if 50 such exceedances had been seen."""
SCORE_CAP = 10.0
"""One outlier adds its excess over the threshold (ratio of log2 deviations) to the score, at most this."""
HIT_STEPS = 16
"""The evidence lists this many of the newest outlier steps."""
OWN_STEPS, OWN_MIN = 32, 8
"""A rank's own recent level: the median of its last 32 log2 norms (8 at least) of two-rank steps."""
PEER_SHARE = 0.5
"""A lone jump: the peer's own change is at most this share of the rank's (the jump is the rank's, not a drop of
its peer's nor a job-wide move)."""


class PooledTail:
    """Decaying histograms of cross-rank deviations (log2 units): their robust scale and upper tail.

    The upper tail is modelled in the relative excess ``x = 2**d - 1``: beyond the
    ``TAIL_FRACTION`` quantile ``u``, ``P(x > t) = p_u (t / u) ** (-1 / gamma)`` (a Pareto
    tail, as Student-t noise on the norm gives), with ``gamma`` Hill's estimate shrunk
    towards ``PRIOR_GAMMA``. A sample's weight halves every ``half_life`` steps.
    """

    def __init__(self, half_life: float) -> None:
        self.growth = 2.0 ** (1.0 / half_life)
        self.weight = 1.0
        self.spread = np.zeros(len(CENTRES))
        self.upper = np.zeros(len(CENTRES))

    @property
    def samples(self) -> float:
        """Effective number of samples held (decayed)."""
        return float(self.spread.sum()) / self.weight

    def add(self, d: np.ndarray) -> None:
        """One step's deviations (finite, log2 units)."""
        self.weight *= self.growth
        if self.weight > 1e100:
            self.spread, self.upper, self.weight = self.spread / self.weight, self.upper / self.weight, 1.0
        self.spread += np.bincount(_bins(np.abs(d)), minlength=len(CENTRES)) * self.weight
        self.upper += np.bincount(_bins(np.expm1(d[d > 0] * math.log(2))), minlength=len(CENTRES)) * self.weight

    def scale(self) -> float:
        """Robust sigma of the deviations: 1.4826 x their pooled median absolute value."""
        cumulative = np.cumsum(self.spread)
        return MAD_TO_SIGMA * float(CENTRES[np.searchsorted(cumulative, cumulative[-1] / 2)])

    def threshold(self, rate: float) -> float:
        """The deviation (log2) that a sample exceeds with probability ``rate`` under the tail model."""
        total = self.spread.sum()
        above = np.cumsum(self.upper[::-1])[::-1]
        enough = np.flatnonzero(above >= max(TAIL_FRACTION * total, TAIL_MIN * self.weight))
        if not len(enough):
            return 0.0
        b = enough[-1]
        u, tail = EDGES[b], above[b]
        hill = float((self.upper[b:] * np.log(CENTRES[b:] / u)).sum() / tail)
        seen = tail / self.weight
        gamma = (seen * hill + PRIOR_WEIGHT * PRIOR_GAMMA) / (seen + PRIOR_WEIGHT)
        return math.log2(1.0 + u * (tail / total / rate) ** gamma)


def _bins(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        position = np.floor((np.log10(x) - LOWEST) * PER_DECADE)
    return np.clip(position, 0, len(CENTRES) - 1).astype(np.int64)


@dataclass(frozen=True)
class Vote:
    """One check: per rank, its checksum's id and its group's strict-majority id (-1: none)."""

    own: np.ndarray
    majority: np.ndarray
    votes: np.ndarray
    voters: np.ndarray
    names: np.ndarray


def majority_vote(checksums: np.ndarray, groups: np.ndarray) -> Vote:
    """Each group of replicas votes on its checksum; only a strict majority wins."""
    present = ~pd.isna(checksums)
    own = np.full(len(checksums), -1)
    codes, names = pd.factorize(checksums[present])
    own[present] = codes
    width = max(len(names), 1)
    keys, counts = np.unique(groups[present] * width + codes, return_counts=True)
    voters = np.bincount(groups[present], minlength=groups.max() + 1)
    strict = counts * 2 > voters[keys // width]
    winner, votes = np.full(len(voters), -1), np.zeros(len(voters), dtype=int)
    winner[keys[strict] // width], votes[keys[strict] // width] = keys[strict] % width, counts[strict]
    majority = np.where(present, winner[groups], -1)
    return Vote(own, majority, votes[groups], voters[groups], np.asarray(names, dtype=object))


def replica_groups(topology: pd.DataFrame, ranks: np.ndarray) -> np.ndarray:
    """A group id per rank: data-parallel replicas share (tp, pp); ranks of unknown place share one group."""
    if topology.empty:
        return np.zeros(len(ranks), dtype=int)
    coords = topology.drop_duplicates("rank", keep="last").set_index("rank")[["tp", "pp"]].reindex(ranks)
    return coords.fillna(-1).groupby(["tp", "pp"]).ngroup().to_numpy()


@dataclass
class _Case:
    """The evidence against one rank on one timeline."""

    timeline: int
    rank: int
    start: int
    end: int
    checksum: dict | None = None
    gradient: dict | None = None
    disagreeing: bool = False
    last_hit: int | None = None
    score: float = 0.0
    active: bool = True

    @property
    def hits(self) -> int:
        return self.gradient["hits"] if self.gradient else 0


class SdcDetector(CrossRankDetector):
    """Silent data corruption: replica checksum mismatches and one-rank local gradient norm outliers."""

    name = "sdc"
    rank_metrics = ("local_grad_norm",)
    checksums = True
    kinds = (
        FindingKind(
            "sdc",
            Family.TRAINING,
            tolerance=10,
            cause="hardware-suspect: silent data corruption on rank {ranks}",
            precedence=10,
        ),
    )
    limits = ranges(
        false_alarms_per_step=FRACTION,
        suspect_false_alarms_per_step=FRACTION,
        half_life=POSITIVE,
        warmup=OPTIONAL_COUNT,
        min_ratio_log2=NON_NEGATIVE,
        gap=OPTIONAL_COUNT,
        lag=COUNT,
    )

    def __init__(
        self,
        *,
        false_alarms_per_step: float = 1e-5,
        suspect_false_alarms_per_step: float = 1e-4,
        half_life: int = 1000,
        warmup: int = 400,
        min_ratio_log2: float = 1.0,
        gap: int = 100,
        lag: int = 20,
    ) -> None:
        super().__init__()
        self.false_alarms_per_step = false_alarms_per_step
        self.suspect_false_alarms_per_step = suspect_false_alarms_per_step
        self.half_life = half_life
        self.warmup = warmup
        self.min_ratio_log2 = min_ratio_log2
        self.gap = gap
        self.lag = lag
        self._tail = PooledTail(half_life)
        self._cases: dict[int, _Case] = {}
        self._agreed: dict[int, int] = {}
        self._timeline: int | None = None
        self._groups: tuple[tuple, np.ndarray] = ((), np.zeros(0, dtype=int))
        self._unanimous: set[int] = set()
        self._splits: dict[int, Finding] = {}
        self._own: dict[int, deque[float]] = {}

    def take(self, batch: TelemetryBatch, matrix: StepMatrix | None) -> list[Finding]:
        return self._released(matrix)

    def _released(self, matrix: StepMatrix | None) -> list[Finding]:
        if matrix is None:
            return []
        norms = matrix.values["local_grad_norm"]
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.log2(np.where(norms > 0, norms, np.nan))
        medians = row_median(np.where(np.isfinite(logs), logs, np.nan))[:, 0]  # over ranks with a finite norm
        deviations = logs - medians[:, None]
        changed: dict[str, Finding] = {}
        checked = np.zeros(len(matrix), bool) if matrix.checksums is None else ~pd.isna(matrix.checksums).all(axis=1)
        for i in range(len(matrix)):
            timeline, step = int(matrix.timelines[i]), int(matrix.steps[i])
            if timeline != self._timeline:
                changed.update((f.finding_id, f) for f in self._end_splits())
            touched = self._new_timeline(timeline)
            if matrix.checksums is not None and checked[i]:
                vote = majority_vote(matrix.checksums[i], self._replica_groups(matrix.ranks))
                touched += self._check(timeline, step, matrix.ranks, vote)
                changed.update((f.finding_id, f) for f in self._split_check(timeline, step, matrix.ranks, vote))
            touched += self._gradients(timeline, step, matrix.ranks, norms[i], deviations[i], medians[i])
            touched += self._expire(step)
            changed.update((f.finding_id, f) for f in map(self._finding, touched))
        return list(changed.values())

    # -- checksums -----------------------------------------------------------------
    def _check(self, timeline: int, step: int, ranks: np.ndarray, vote: Vote) -> list[_Case]:
        agreeing = set(ranks[(vote.own >= 0) & (vote.own == vote.majority)].tolist())
        self._agreed.update(dict.fromkeys(agreeing, step))
        touched = [case for case in self._cases.values() if case.disagreeing and case.rank in agreeing]
        for case in touched:
            assert case.checksum is not None  # only a checksum mismatch makes a case disagree
            case.disagreeing, case.checksum["agrees_again_at"] = False, step
        for j in np.flatnonzero((vote.majority >= 0) & (vote.own >= 0) & (vote.own != vote.majority)):
            touched.append(self._mismatch(timeline, step, int(ranks[j]), vote, int(j)))
        return touched

    def _mismatch(self, timeline: int, step: int, rank: int, vote: Vote, j: int) -> _Case:
        case = self._case(timeline, rank, step)
        before = case.checksum or {"first_step": step, "mismatched_checks": 0}
        case.checksum = {
            **before,
            "step": step,
            "mismatched_checks": before["mismatched_checks"] + 1,
            "checksum": vote.names[vote.own[j]],
            "majority_checksum": vote.names[vote.majority[j]],
            "majority": int(vote.votes[j]),
            "replicas": int(vote.voters[j]),
            "last_agreeing_check": self._agreed.get(rank),
            "agrees_again_at": None,
        }
        case.disagreeing, case.end, case.score = True, max(case.end, step), case.score + 1.0
        return case

    def _split_check(self, timeline: int, step: int, ranks: np.ndarray, vote: Vote) -> list[Finding]:
        """Replicas that all agreed at their last check and now split with no majority (two replicas, or a
        tie): corruption is certain, the culprit is not. One finding names the whole group."""
        groups = self._replica_groups(ranks)
        changed = []
        for group in np.unique(groups):
            members = (groups == group) & (vote.own >= 0)
            if members.sum() < 2:
                continue
            unanimous = len(np.unique(vote.own[members])) == 1
            if unanimous:
                self._unanimous.add(int(group))
                if group in self._splits and self._splits[group].active:
                    found = self._splits.pop(int(group))
                    changed.append(replace(found, active=False, evidence={**found.evidence, "agree_again_at": step}))
            elif group in self._unanimous and (vote.majority[members] < 0).all():
                self._unanimous.discard(int(group))
                self._splits[int(group)] = self._split_finding(timeline, step, ranks[members], vote, members)
                changed.append(self._splits[int(group)])
        return changed

    def _split_finding(self, timeline: int, step: int, ranks: np.ndarray, vote: Vote, members: np.ndarray) -> Finding:
        to_step = self.run.checkpoint_before(timeline, step)
        action = (
            SuggestedAction(
                "rewind",
                {"to_step": to_step},
                f"step {to_step} is the newest good checkpoint "
                "before the replicas split; no majority tells which rank is corrupt",
            )
            if to_step is not None
            else SuggestedAction("investigate", {"ranks": ranks.tolist()}, "no majority tells which rank is corrupt")
        )
        checksums = {int(r): vote.names[o] for r, o in zip(ranks, vote.own[members])}
        return Finding(
            "sdc",
            Severity.CRITICAL,
            timeline,
            step,
            step,
            tuple(int(r) for r in ranks),
            1.0,
            f"replicas {', '.join(map(str, ranks))} agreed at their last check and disagree at step {step}, "
            "with no majority to name the corrupt one",
            {"checksums": checksums, "hardware_suspect": True, "majority": None},
            action,
            True,
            self.name,
        )

    def _end_splits(self) -> list[Finding]:
        """A rewind started a new timeline: the splits on the old one are over."""
        ended = [replace(f, active=False) for f in self._splits.values()]
        self._splits, self._unanimous = {}, set()
        return ended

    def _replica_groups(self, ranks: np.ndarray) -> np.ndarray:
        topology = self.run.topology
        key = (id(topology), len(topology), ranks.tobytes())
        if self._groups[0] != key:
            self._groups = (key, replica_groups(topology, ranks))
        return self._groups[1]

    # -- gradient norms ------------------------------------------------------------
    def _gradients(
        self, timeline: int, step: int, ranks: np.ndarray, norms: np.ndarray, deviations: np.ndarray, median_log2: float
    ) -> list[_Case]:
        compared = ~np.isnan(deviations)
        if compared.sum() < 2:
            return []
        jumps: dict[int, dict] = {}
        if compared.sum() == 2 and np.isfinite(deviations[compared]).all():
            threshold = self._threshold(2, self.suspect_false_alarms_per_step)
            jumps = self._lone_jumps(ranks, norms, deviations, threshold)
            flagged = np.isin(np.arange(len(ranks)), list(jumps))
        else:
            threshold = self._threshold(int(compared.sum()), self.false_alarms_per_step)
            flagged = compared & ((deviations > threshold) | np.isposinf(deviations))
        sigma = self._tail.scale() if flagged.any() else 0.0
        self._tail.add(deviations[compared & ~flagged & np.isfinite(deviations)])
        return [
            self._outlier(
                timeline,
                step,
                int(ranks[j]),
                {
                    "local_grad_norm": float(norms[j]),
                    "median_local_grad_norm": float(2.0**median_log2),
                    "ratio_log2": float(deviations[j]),
                    "robust_z": float(deviations[j] / max(sigma, 1e-12)),
                    "threshold_z": threshold / max(sigma, 1e-12),
                    "threshold_log2": threshold,
                    "scale_log2": sigma,
                    "ranks_compared": int(compared.sum()),
                    "lone_jump": jumps.get(int(j)),
                },
            )
            for j in np.flatnonzero(flagged)
        ]

    def _lone_jumps(
        self, ranks: np.ndarray, norms: np.ndarray, deviations: np.ndarray, threshold: float
    ) -> dict[int, dict]:
        """Two ranks compared: ``d`` is half their log ratio, the same for both but its sign, so it cannot tell a
        jump of one from a drop of the other. The rank named is the one whose norm rose above its own recent
        median while its peer's stayed (moved at most ``PEER_SHARE`` of that), when ``d`` passes the bar of the
        looser ``suspect_false_alarms_per_step``: column -> its jump."""
        columns = np.flatnonzero(~np.isnan(deviations))
        logs = np.log2(norms[columns])
        history = [self._own.setdefault(int(ranks[j]), deque(maxlen=OWN_STEPS)) for j in columns]
        changes = [log - float(np.median(h)) if len(h) >= OWN_MIN else math.nan for log, h in zip(logs, history)]
        jumps = {}
        for k, j in enumerate(columns):
            own, peer = changes[k], changes[1 - k]
            if deviations[j] > threshold and own > 0 and abs(peer) <= PEER_SHARE * own:
                jumps[int(j)] = {"own_change_log2": own, "peer_change_log2": peer, "own_steps": OWN_STEPS}
        for j, log, h in zip(columns, logs, history):
            if int(j) not in jumps:  # a rank's own level learns from its clean steps only
                h.append(float(log))
        return jumps

    def _threshold(self, ranks: int, false_alarms_per_step: float) -> float:
        """The log2 deviation above which one of ``ranks`` is an outlier at ``false_alarms_per_step`` (infinite
        while warming up: then only an infinite norm among finite peers is one)."""
        if self._tail.samples < self.warmup:
            return math.inf
        return max(self._tail.threshold(false_alarms_per_step / ranks), self.min_ratio_log2)

    def _outlier(self, timeline: int, step: int, rank: int, seen: dict) -> _Case:
        case = self._case(timeline, rank, step)
        before = case.gradient or {"first_step": step, "hits": 0, "hit_steps": [], "max_ratio_log2": -math.inf}
        case.gradient = {
            **before,
            "step": step,
            **seen,
            "hits": before["hits"] + 1,
            "hit_steps": (before["hit_steps"] + [step])[-HIT_STEPS:],
            "max_ratio_log2": max(before["max_ratio_log2"], seen["ratio_log2"]),
        }
        case.last_hit, case.end = step, max(case.end, step)
        excess = seen["ratio_log2"] / seen["threshold_log2"] if math.isfinite(seen["threshold_log2"]) else SCORE_CAP
        case.score += min(excess, SCORE_CAP)
        return case

    # -- cases ---------------------------------------------------------------------
    def _case(self, timeline: int, rank: int, step: int) -> _Case:
        case = self._cases.get(rank)
        if case is None:
            case = self._cases[rank] = _Case(timeline, rank, step, step)
        return case

    def _new_timeline(self, timeline: int) -> list[_Case]:
        """A rewind started ``timeline``: what was open on the old one is over."""
        if timeline == self._timeline:
            return []
        self._timeline, self._agreed, self._own = timeline, {}, {}
        closed = list(self._cases.values())
        for case in closed:
            case.active = False
        self._cases = {}
        return closed

    def _expire(self, step: int) -> list[_Case]:
        """Close the cases whose checksum agrees (again) and that had no outlier within ``gap`` steps."""
        closed = [
            case
            for case in self._cases.values()
            if not case.disagreeing and (case.last_hit is None or step > case.last_hit + self.gap)
        ]
        for case in closed:
            case.active = False
            del self._cases[case.rank]
        return closed

    def _finding(self, case: _Case) -> Finding:
        critical = case.checksum is not None or case.hits >= 2
        place = self.run.place_of(case.rank)
        host = f" ({place['host']})" if "host" in place else ""
        what = "; ".join(part for part in (_checksum_summary(case.checksum), _gradient_summary(case.gradient)) if part)
        evidence = {
            "rank": case.rank,
            "place": place,
            "hardware_suspect": True,
            "checksum": case.checksum,
            "gradient": case.gradient,
        }
        return Finding(
            "sdc",
            Severity.CRITICAL if critical else Severity.WARNING,
            case.timeline,
            case.start,
            case.end,
            (case.rank,),
            case.score,
            f"rank {case.rank}{host}: {what}",
            evidence,
            self._action(case, place.get("host")),
            case.active,
            self.name,
        )

    def _action(self, case: _Case, host: str | None) -> SuggestedAction:
        machine = f"host {host}" if host else f"rank {case.rank}'s host"
        if case.checksum is not None:
            agreed = case.checksum["last_agreeing_check"]
            to_step = self.run.checkpoint_before(case.timeline, case.start if agreed is None else agreed + 1)
            if to_step is not None:
                return SuggestedAction(
                    "rewind",
                    {"to_step": to_step},
                    f"replica {case.rank} diverged from its peers; step {to_step} is the newest "
                    f"good checkpoint before it did; evict {machine} if it happens again",
                )
        elif case.hits < 2:
            return SuggestedAction(
                "investigate",
                {"rank": case.rank},
                f"one corrupted gradient from rank {case.rank} entered the all-reduce at step "
                f"{case.start}; evict {machine} if it happens again",
            )
        why = "its parameters differ from its replicas'" if case.checksum else f"{case.hits} corrupted gradients"
        return SuggestedAction(
            "evict",
            {"rank": case.rank, **({"host": host} if host else {})},
            f"rank {case.rank}: {why}; take {machine} out of the job",
        )


def _checksum_summary(checksum: dict | None) -> str:
    if checksum is None:
        return ""
    state = "agreed again" if checksum["agrees_again_at"] is not None else "still differs"
    return (
        f"parameter checksum differs from the one {checksum['majority']} of the {checksum['replicas']} "
        f"replicas share, at {checksum['mismatched_checks']} check(s) from step {checksum['first_step']} ({state})"
    )


def _gradient_summary(gradient: dict | None) -> str:
    if gradient is None:
        return ""
    repeated = f", {gradient['hits']} times since step {gradient['first_step']}" if gradient["hits"] > 1 else ""
    ranks, step = gradient["ranks_compared"], gradient["step"]
    if not math.isfinite(gradient["ratio_log2"]):
        return f"infinite local gradient norm among {ranks} ranks at step {step}{repeated}"
    if jump := gradient.get("lone_jump"):
        return (
            f"local gradient norm 2^{2 * gradient['ratio_log2']:.1f} x its only peer's at step {step}, "
            f"2^{jump['own_change_log2']:.1f} x its own median of its last {jump['own_steps']} steps while the "
            f"peer's moved 2^{jump['peer_change_log2']:.1f} (a suspect: two ranks hold no majority){repeated}"
        )
    return (
        f"local gradient norm 2^{gradient['ratio_log2']:.1f} x the median of {ranks} ranks at step {step} "
        f"(robust z {gradient['robust_z']:.1f} > {gradient['threshold_z']:.1f}){repeated}"
    )
