"""Timings one stall cannot move, and how much a ratio of them can be trusted.

A busy machine (another process's OpenMP threads spinning on the same cores) stalls a run for a few steps or for
all of them: one base run of the embedded model took 7.9 s against 0.30 s quiet, and a single wall-clock sum turned
that into "19x". Two defences, both from the runs' own numbers:

- within a run, steps of one kind do the same work (every full step runs every block, every cached step the same
  few), so a run's time is priced by the MEDIAN step of each kind times its count (`Steady.robust_s`); a stall of
  a few steps moves the wall-clock sum, not that. The run's `stall` is its wall time over that price;
- across runs, a ratio comes from pairs (base and the stack timed one after the other). Pairs AGREE when most of
  them (all of 2 or 3, two thirds of more) lie within +-10% of their median; then the ratio is the median of those
  and its spread half their range, and a pair a stall spoilt for its whole length is left out, and counted. Pairs
  that do not agree give the median and half the range of all of them; a spread over a quarter of the ratio means
  the machine was busy for whole runs, and the ratio is not shown (`Ratio.why_not` says so in words).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

STALL_BOUND = 1.15  # a run whose wall time is over 1.15x its step-median price was stalled within itself
AGREE_BOUND = 0.10  # pair ratios within +-10% of their median agree: no more pairs needed
UNRELIABLE_SPREAD = 0.25  # a ratio whose spread is over 25% of itself is not shown
DRIFT_BOUND = 0.15  # a run over a kept base timing: its full steps within +-15% of the same stack's steps back then


@dataclass(frozen=True)
class Steady:
    """One timed run priced by its median steps."""

    wall_s: float  # the wall-clock denoise time
    robust_s: float  # full steps x the median full step + cached steps x the median cached step
    full_ms: float | None  # the median full step
    cached_ms: float | None  # the median cached step

    @property
    def stall(self) -> float:
        """Wall time over the step-median price: 1.0 quiet, above STALL_BOUND a stall hit some of its steps."""
        return self.wall_s / self.robust_s if self.robust_s > 0 else 1.0

    @property
    def steady(self) -> bool:
        return self.stall <= STALL_BOUND


def steady(wall_s: float, step_ms: list[float], cached_indices: list[int]) -> Steady:
    """Price a run by its median full and cached steps (module doc)."""
    cached = set(cached_indices)
    full = [t for i, t in enumerate(step_ms) if i not in cached]
    hit = [t for i, t in enumerate(step_ms) if i in cached]
    full_ms = statistics.median(full) if full else None
    cached_ms = statistics.median(hit) if hit else None
    robust = (len(full) * (full_ms or 0.0) + len(hit) * (cached_ms or 0.0)) / 1e3
    return Steady(wall_s, robust if robust > 0 else wall_s, full_ms, cached_ms)


@dataclass(frozen=True)
class Ratio:
    """A speed-up from paired runs: base over stack, each pair priced by its steps."""

    value: float  # the median of the (agreeing) per-pair ratios
    spread: float  # half the range of the (agreeing) per-pair ratios; one pair: how far its stalls could move it
    pairs: int
    base_range: float  # slowest base run over the fastest (1.0: they agree)
    left_out: int = 0  # pairs left out as spoilt by a stall (the rest agreed)
    lo: float | None = None  # the lowest and highest pair ratio behind it
    hi: float | None = None
    # over a kept base timing of the shape (compare auto): this run's median full step over the same stack's when
    # that base timing was taken beside it; beyond DRIFT_BOUND the machine's speed changed since, so the old base
    # timing cannot divide this run
    drift: float | None = None

    @property
    def drifted(self) -> bool:
        return self.drift is not None and abs(self.drift - 1.0) > DRIFT_BOUND

    @property
    def reliable(self) -> bool:
        return self.spread <= UNRELIABLE_SPREAD * self.value and not self.drifted

    def why_not(self) -> str | None:
        """Why the ratio is not shown, in words, or None when it is."""
        if self.reliable:
            return None
        if self.drifted:
            return (
                f"timing unreliable: this run's full steps took {self.drift:.2f}x what the same stack's took when the "
                "kept base timing was taken (the machine's load changed since); speed-up not shown (compare on times "
                "base beside it)"
            )
        return (
            f"timing unreliable: the machine was busy (base runs differed by {self.base_range:.1f}x, pair ratios "
            f"{self.lo if self.lo is not None else self.value - self.spread:.2f}x.."
            f"{self.hi if self.hi is not None else self.value + self.spread:.2f}x over {self.pairs} pairs); "
            "speed-up not shown"
        )


def agreeing(per_pair: list[float]) -> list[float]:
    """The pair ratios within AGREE_BOUND of their median."""
    mid = statistics.median(per_pair)
    return [x for x in per_pair if abs(x - mid) <= AGREE_BOUND * mid]


def agree(per_pair: list[float]) -> bool:
    """Whether the pairs agree (module doc): more pairs would not change the answer."""
    n = len(per_pair)
    return n >= 2 and len(agreeing(per_pair)) >= max(min(n, 3), math.ceil(2 * n / 3))


def ratio(bases: list[Steady], runs: list[Steady]) -> Ratio:
    """Base over stack from paired runs (same length, pair i ran together)."""
    per_pair = [b.robust_s / r.robust_s for b, r in zip(bases, runs) if r.robust_s > 0]
    fastest = min(b.robust_s for b in bases)
    base_range = max(b.robust_s for b in bases) / fastest if fastest > 0 else 1.0
    if len(per_pair) == 1:
        value = per_pair[0]
        return Ratio(value, _one_pair_spread(bases[0], runs[0], value), 1, base_range)
    used = agreeing(per_pair) if agree(per_pair) else per_pair
    spread = (max(used) - min(used)) / 2
    return Ratio(
        statistics.median(used), spread, len(per_pair), base_range, len(per_pair) - len(used), min(used), max(used)
    )


def _one_pair_spread(base: Steady, run: Steady, value: float) -> float:
    """One pair: how far a stall within either run could move the ratio (its wall time against its step price)."""
    return value * max(base.stall - 1.0, run.stall - 1.0, 0.0)
