"""A robust baseline that follows a falling training curve, for one series per timeline.

The baseline is a line through the last ``window`` accepted points, log value against
log step (training curves are close to power laws in the step, so the line bends with
the fast early fall as well as the slow late one): its slope is the difference of the medians of the window's two halves over their distance,
its level the median of the detrended points. The spread is the robust sigma (MAD) of
the one-step-ahead residuals of the last ``memory`` accepted points: the error of the
forecast itself, trend error included, learned over a longer span than the line. Only
admitted points teach the line and the spread: an outlier (and every point of an episode)
is scored against the baseline without moving it. The tail factor learns from the admitted
points' z-scores and, for a point that opened an episode, from the bar it passed (not its
z), so a spike cannot raise the bar for the next one, and noise whose tail is heavier than
the bar cannot lower the bar by leaving its largest values out. The tail factor is capped
at ``MAX_TAIL``. A rewind starts a new timeline from the parent's points before the branch step. A young baseline (``learns_young``) learns from the newer half
of what it admitted, the line and the spread alike, until it holds ``window`` and ``memory`` of them:
a run's fast early fall bends flat within tens of steps, and forecasts from before the bend are not noise.

``lookahead`` scores a block of upcoming points at once, with numpy over sliding windows:
each point exactly as ``score`` would score it once every point before it is admitted.
A detector admits the quiet points of the block in bulk and goes point by point only from
the first it does not accept, so batch detection is vectorised and streaming, which
scores one point at a time, finds the same.
"""

from __future__ import annotations

import functools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import special

from .robust import MAD_TO_SIGMA, RollingQuantile, dense_row_median, mad_sigma, median, windows

GAUSSIAN_UPPER_Q995 = 2.5758
"""The 99.5th percentile of normal data in sigmas: the yardstick for the tail factor."""
TAIL_SLACK = 1.1
FIRST_TAIL_ZS = 100
MIN_TAIL_ZS = 800
EARLY_TAIL = 2.0
LIGHT_TAIL_ZS = 200
"""From this many z-scores on, a tail that holds no more large z-scores than normal data would (``light_tail``)
is taken as measured, before ``MIN_TAIL_ZS``."""
EXCEEDANCE_Z = 3.0
LIGHT_TAIL_CONFIDENCE = 0.99
"""The share of normal runs whose z-scores over ``EXCEEDANCE_Z`` stay within the allowance (``light_tail``)."""
TAIL_BAR_Z = 4.0
"""The rate-based factor widens the bar that normal data passes beyond this many sigma to the bar that the noise,
read as Student-t from its rate of z-scores over ``EXCEEDANCE_Z``, passes as rarely."""
RATE_PRIOR = 1.0
"""Exceedances at normal data's rate that the rate-based factor starts from: one count alone moves it little."""
MAX_TAIL = 4.0
"""The tail factor's cap: a bar of at most 16 sigma at ``z_alarm`` 4, whatever the recent z-scores held."""
MIN_FORECAST_ERRORS = 40
"""Forecast errors seen before a score counts: early curvature must have had its say in sigma."""
DENSE_MEDIAN_VALUES = 1 << 17
"""Up to this many window values, rolling medians take one partition of every window (faster than pandas'
skip list, and no more memory than a megabyte)."""


@dataclass(frozen=True)
class Line:
    """The baseline: log value = ``level`` + ``slope`` * log(1 + step)."""

    level: float
    slope: float

    def at(self, step: int) -> float:
        return self.level + self.slope * math.log1p(step)


@dataclass(frozen=True)
class Score:
    """One point against its baseline: the line, its forecast, robust z and the threshold's tail factor."""

    line: Line
    predicted: float
    sigma: float
    z: float
    tail: float
    ready: bool = True


Point = tuple[int, float, float]
"""An admitted point: its step, log(1 + step) and log value."""


class RobustTrend:
    """Rolling robust linear trend of log values, with the spread and tails of its forecast errors."""

    def __init__(
        self,
        *,
        window: int = 100,
        min_points: int = 30,
        sigma_floor: float = 1e-4,
        memory: int = 200,
        tail_memory: int = 2000,
        tail_power: float = 2.5,
        learns_young: bool = True,
    ) -> None:
        self.window, self.min_points, self.sigma_floor, self.tail_power = window, min_points, sigma_floor, tail_power
        self.learns_young = learns_young
        self.memory = memory
        self._points: dict[int | None, deque[Point]] = {}  # None: points seen before any timeline
        self._residuals: deque[float] = deque(maxlen=memory)
        self._zs = RollingQuantile(tail_memory)
        self._bars: deque[int] = deque()  # which of the tail's values over EXCEEDANCE_Z are bars (``exceeded``)
        self._timeline: int | None = None
        self.admitted = 0
        """Points admitted so far (``Lookahead`` checks that its points are admitted in order)."""

    def on_timeline(self, timeline: int, step: int) -> None:
        """Switch to ``timeline``; a new one starts from the current one's points before ``step``."""
        if timeline == self._timeline:
            return
        if timeline not in self._points:
            parent = self._points.get(self._timeline, deque())
            self._points[timeline] = deque((p for p in parent if p[0] < step), maxlen=self.window)
        self._timeline = timeline

    def score(self, step: int, y: float, *, min_points: int | None = None) -> Score | None:
        """``y`` (a log value) against the baseline at ``step``; None while fewer than ``min_points`` points
        (the trend's own by default).

        Not ``ready`` until ``MIN_FORECAST_ERRORS`` forecasts have been checked against
        what came: until then sigma is the line's own spread, too hopeful early in a run.
        Scoring learns nothing: ``admit`` does, for the points the caller accepts.
        """
        points = self._points.get(self._timeline)
        if points is None or len(points) < (self.min_points if min_points is None else min_points):
            return None
        recent = np.array(list(points)[-self._young(self.window, self.min_points) :], float)
        steps, ys = recent[:, 1], recent[:, 2]
        half = len(ys) // 2
        run = median(steps[half:]) - median(steps[:half])
        slope = (median(ys[half:]) - median(ys[:half])) / run if run > 0 else 0.0
        detrended = ys - slope * steps
        line = Line(median(detrended), float(slope))
        predicted = line.at(step)
        ready = len(self._residuals) >= MIN_FORECAST_ERRORS
        errors = list(self._residuals)[-self._young(self.memory, MIN_FORECAST_ERRORS) :]
        spread = np.fromiter(errors, float) if ready else detrended - line.level
        sigma = float(mad_sigma(spread, floor=self.sigma_floor))
        return Score(line, predicted, sigma, (y - predicted) / sigma, self.tail(), ready)

    def recent_score(self, step: int, y: float, *, points: int, span: int = 30) -> Score | None:
        """Early in a run, ``y`` against the median of the last three admitted points, with the sigma of the
        successive differences of the last ``span`` (robust, over root 2); None before ``points`` points.

        Before the forecast errors are known, the line's own spread takes a steep fall's curvature for noise,
        and the line forecasts the fall past its bend: differences move with the noise, not with a smooth
        fall, and the last points, brought on by their median step, follow the bend."""
        known = self._points.get(self._timeline)
        if known is None or len(known) < points:
            return None
        ys = np.fromiter((v for _, _, v in list(known)[-span:]), float)
        moves = np.diff(ys)
        reference = median(ys[-3:]) + 2 * median(moves)  # the last three's median, brought two steps on
        sigma = max(float(mad_sigma(moves)) / math.sqrt(2), self.sigma_floor)
        return Score(Line(reference, 0.0), reference, sigma, (y - reference) / sigma, self.tail(), ready=False)

    def _young(self, full: int, least: int) -> int:
        """How many of the latest points (or forecast errors) a young baseline learns from: the newer half of
        what it has admitted, at least ``least``, at most ``full``. A curve's dynamics change on a time scale
        of its age (its fast early fall bends flat within a few tens of steps), so what came before the
        newer half no longer says where it goes or how far it strays."""
        return min(full, max(least, (self.admitted + 1) // 2)) if self.learns_young else full

    def tail(self) -> float:
        """(upper q99.5 of recent z / the normal 2.576 / slack) ** tail_power, at least 1.

        The upper tail only, since spikes are upward and noise may be skewed; from
        z-scores each taken against the sigma of its day, of admitted points and, for a
        point that opened an episode, the bar it passed (``exceeded``: an alarm's own z
        never raises the next bar past its own). ``TAIL_SLACK`` absorbs the sampling error
        of the quantile. A few hundred z-scores show a tail only roughly, and heavy tails
        least of all: until ``MIN_TAIL_ZS`` are seen the factor is at least ``EARLY_TAIL``,
        unless ``LIGHT_TAIL_ZS`` or more hold no more z-scores over ``EXCEEDANCE_Z`` than
        normal data would (``light_tail``): a count of rare exceedances tells a heavy tail
        from a light one sooner than the quantile it shapes. The same count, as a rate, sets
        a floor under the factor (``rate_tail``): a steadier reading of a heavy tail than the
        quantile, which a handful of z-scores decide.
        At most ``MAX_TAIL``: the power amplifies a quantile's error, and a handful of
        large accepted points must not lift the bar out of reach.
        """
        n = len(self._zs)
        if n < FIRST_TAIL_ZS:
            return EARLY_TAIL
        upper = self._zs.quantile(0.995)
        measured = min(max(1.0, upper / GAUSSIAN_UPPER_Q995 / TAIL_SLACK) ** self.tail_power, MAX_TAIL)
        over = self._admitted_over()
        if self.tail_power:  # 0 switches the factor off, the rate's reading with it
            measured = max(measured, rate_tail(over, n))
        if n >= MIN_TAIL_ZS or (n >= LIGHT_TAIL_ZS and over <= light_tail(n)):
            return measured
        return max(measured, EARLY_TAIL)

    def admit(self, step: int, y: float, score: Score | None) -> None:
        """Add an accepted point to the baseline; when it was scored, its forecast error to the
        spread and, once scores are ``ready``, its z to the tail."""
        self._points.setdefault(self._timeline, deque(maxlen=self.window)).append((step, math.log1p(step), y))
        self.admitted += 1
        if score is not None:
            self._residuals.append(y - score.predicted)
            if score.ready:
                self._zs.add(score.z)

    def exceeded(self, score: Score, bar: float) -> None:
        """A point that passed ``bar`` and opened an episode: not admitted, but its z joins the tail at the bar.
        The tail learns that the bar was passed, never by how much. Left out, every point over the bar would
        thin the tail the bar is set from, and heavy-tailed noise would lower its own bar step by step."""
        if score.ready:
            at = min(score.z, bar)
            self._zs.add(at)
            if at > EXCEEDANCE_Z:
                self._bars.append(self._zs.added)

    def _admitted_over(self) -> int:
        """The tail's admitted z-scores over ``EXCEEDANCE_Z``: the bars that episodes passed do not count, so a spike
        cannot raise the next one's bar by its count either."""
        while self._bars and self._bars[0] <= self._zs.added - len(self._zs):
            self._bars.popleft()
        return self._zs.above(EXCEEDANCE_Z) - len(self._bars)

    def restart(self) -> None:
        """Forget the current timeline's points (after a level shift that did not recover)."""
        self._points[self._timeline] = deque(maxlen=self.window)

    def lookahead(self, steps: Sequence[int], ys: Sequence[float]) -> Lookahead | None:
        """The upcoming points ``steps``/``ys`` of the current timeline scored at once; None until the
        baseline is full and grown (``window`` points, ``memory`` forecast errors, and no longer young:
        it has admitted twice as many), when ``score`` must do."""
        points = self._points.get(self._timeline)
        young = self._young(max(self.window, self.memory), 0) < max(self.window, self.memory)
        if points is None or young or len(points) < self.window or len(self._residuals) < self.memory or not len(steps):
            return None
        return Lookahead(self, points, steps, ys)


class Lookahead:
    """Scores of a block of upcoming points, each as ``RobustTrend.score`` gives it once every point
    before it has been admitted: the line through the ``window`` points before it (the baseline's and
    the block's own), the MAD of the ``memory`` forecast errors before it. The block's points are
    admitted in order with ``admit_until``; ``score`` adds the tail factor of that moment."""

    def __init__(self, trend: RobustTrend, points: deque[Point], steps: Sequence[int], ys: Sequence[float]) -> None:
        self.trend, self.steps, self.ys = trend, steps, np.asarray(ys, float)
        self.xs = [math.log1p(step) for step in steps]
        n, window = len(steps), trend.window
        x = np.concatenate([[p[1] for p in points], self.xs])
        y = np.concatenate([[p[2] for p in points], self.ys])
        run = _halves_apart(x, n, window)
        self.slopes = np.where(run > 0, _halves_apart(y, n, window) / np.where(run > 0, run, 1.0), 0.0)
        wx, wy = windows(x, window)[:n], windows(y, window)[:n]
        self.levels = dense_row_median(wy - self.slopes[:, None] * wx)
        self.predicted = self.levels + self.slopes * np.asarray(self.xs)
        self.errors = self.ys - self.predicted
        errors = np.concatenate([np.fromiter(trend._residuals, float, len(trend._residuals)), self.errors])
        spread = windows(errors, trend.memory)[:n]
        center = _window_medians(errors, trend.memory, trend.memory - 1, len(errors) - trend.memory)
        self.sigmas = np.maximum(MAD_TO_SIGMA * dense_row_median(np.abs(spread - center[:, None])), trend.sigma_floor)
        self.z = self.errors / self.sigmas
        self._base = trend.admitted
        self.done = 0
        """Points of the block admitted so far."""

    def score(self, i: int) -> Score:
        """Point ``i``'s score; every point before it must have been admitted."""
        self._check(i)
        line = Line(float(self.levels[i]), float(self.slopes[i]))
        return Score(line, float(self.predicted[i]), float(self.sigmas[i]), float(self.z[i]), self.trend.tail())

    def admit_until(self, stop: int) -> None:
        """Admit the block's points up to ``stop`` (exclusive)."""
        self._check(self.done)
        trend, start = self.trend, self.done
        ys = self.ys[start:stop].tolist()
        trend._points[trend._timeline].extend(zip(self.steps[start:stop], self.xs[start:stop], ys))
        trend._residuals.extend(self.errors[start:stop].tolist())
        for z in self.z[start:stop].tolist():
            trend._zs.add(z)
        trend.admitted += stop - start
        self.done = max(start, stop)

    def _check(self, i: int) -> None:
        if self.trend.admitted != self._base + i or self.done != i:
            raise RuntimeError(f"lookahead point {i}: the points before it were not admitted in order")


_NORMAL_RATE = float(special.ndtr(-EXCEEDANCE_Z))
"""The share of normal data's z-scores over ``EXCEEDANCE_Z``."""


@functools.cache
def light_tail(n: int) -> int:
    """The most of ``n`` z-scores of normal data that exceed ``EXCEEDANCE_Z``, in ``LIGHT_TAIL_CONFIDENCE`` of runs
    (the Poisson quantile). Student-t(3) noise scaled to the same MAD exceeds it about 15 times as often: of its
    runs, 20% pass at 200 scores, 5% at 300 and 0.1% at 600."""
    k = 0
    while special.pdtr(k, n * _NORMAL_RATE) < LIGHT_TAIL_CONFIDENCE:
        k += 1
    return k


def _student_family() -> tuple[np.ndarray, np.ndarray]:
    """Student-t noise of 2 to 1,000 degrees of freedom, its MAD taken as sigma: the log of its rate of z-scores over
    ``EXCEEDANCE_Z`` (rising), and the factor by which its bar (passed as rarely as normal data passes
    ``TAIL_BAR_Z``) is wider than normal data's."""
    dof = np.geomspace(1000.0, 2.0, 64)
    scale = MAD_TO_SIGMA * special.stdtrit(dof, 0.75)
    rate = special.stdtr(dof, -EXCEEDANCE_Z * scale)
    bar = special.stdtrit(dof, special.ndtr(TAIL_BAR_Z)) / scale / TAIL_BAR_Z
    return np.log(rate), bar


_LOG_RATES, _BARS = _student_family()


def rate_tail(over: int, n: int) -> float:
    """The tail factor that ``over`` of ``n`` z-scores over ``EXCEEDANCE_Z`` call for: the Student-t noise with that
    rate (shrunk toward normal data's by ``RATE_PRIOR`` counts) needs a bar this many times ``TAIL_BAR_Z`` to pass
    it as rarely as normal data passes ``TAIL_BAR_Z``. At most ``MAX_TAIL``. A stabler reading of a heavy tail than
    the q99.5 of a few thousand z-scores, which a handful of them decide."""
    rate = (over + RATE_PRIOR) / (n + RATE_PRIOR / _NORMAL_RATE)
    return min(max(1.0, float(np.interp(math.log(rate), _LOG_RATES, _BARS))), MAX_TAIL)


def _window_medians(values: np.ndarray, width: int, first: int, count: int) -> np.ndarray:
    """The median of each of ``count`` windows of ``width`` consecutive ``values``, the first window ending at
    index ``first``. Few windows (a live follow scores a step or two per update): one partition of them all
    (``dense_row_median``); many, or any NaN: pandas' rolling skip list. The same numbers either way."""
    span = values[first - width + 1 : first + count]
    if count * width <= DENSE_MEDIAN_VALUES and not np.isnan(span).any():
        return dense_row_median(windows(span, width))
    return pd.Series(span).rolling(width).median().to_numpy()[width - 1 :]


def _halves_apart(values: np.ndarray, n: int, window: int) -> np.ndarray:
    """For the ``window`` values before each of the last ``n`` of ``values``: the median of the later half
    less that of the earlier half (``window // 2`` values; the later half takes the odd one)."""
    half = window // 2
    earlier = _window_medians(values, half, half - 1, n)
    later = _window_medians(values, window - half, window - 1, n)
    return later - earlier
