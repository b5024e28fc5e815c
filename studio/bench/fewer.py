"""Base at fewer steps: the cheapest rival of every step cache (HOUSE 18; the papers' "60% / 34% of the steps" rows).
Base at k of N steps is judged against base's N-step picture, as a cache is; its speed-up is N / k (the call's fixed
cost only flatters fewer steps, and the step count at a stack's speed is rounded up), so a cache is judged strictly.
Text-to-image requests only: an image input runs a share of the schedule."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from studio.measure.estimate import CLEAR_DB, margin_db, steps_at_speed
from studio.measure.quality import judge
from studio.spec.presets import BASE

LADDER = (0.75, 0.6, 0.5, 0.4, 0.34, 0.25)  # shares of the steps drawn as the curve (the papers' rows among them)


@dataclass(frozen=True)
class StepsPoint:
    """Base at `steps` of `full` steps over the prompts, against each prompt's full-step base picture."""

    steps: int
    full: int
    worst_db: float
    mean_db: float
    worst_flip: float | None  # None: FLIP not measured
    prompts: int  # prompts judged (all of them unless one fell under the floor while searching)

    @property
    def speedup(self) -> float:
        """By step count: base's steps cost the same, so k steps of N take k / N of its denoise time."""
        return self.full / self.steps

    def as_dict(self) -> dict:
        return {**self.__dict__, "speedup": self.speedup}


@dataclass
class FewerSteps:
    """The fewer-steps reference over some requests (all with the same step count N)."""

    full: int
    floor_db: float
    points: dict[int, StepsPoint] = field(default_factory=dict)  # by step count
    fewest: StepsPoint | None = None  # the fewest steps whose worst PSNR keeps the floor (None: none below N does)
    prompts: int = 0  # how many prompts a whole point has

    def curve(self) -> list[StepsPoint]:
        """Every point judged on all the prompts, most steps first."""
        return sorted((p for p in self.points.values() if p.prompts == self.prompts), key=lambda p: -p.steps)

    def steps_at(self, speedup: float) -> int:
        """The step count whose speed-up by count is nearest `speedup` (at least 1, below N)."""
        return steps_at_speed(self.full, speedup)

    def as_dict(self) -> dict:
        return {
            "full_steps": self.full,
            "floor_db": self.floor_db,
            "prompts": self.prompts,
            "fewest": self.fewest.as_dict() if self.fewest else None,
            "points": [p.as_dict() for p in self.curve()],
        }


@dataclass(frozen=True)
class Versus:
    """A method read against base at the step count of its speed."""

    at: StepsPoint
    margin_db: float  # the method's worst PSNR minus fewer steps' (positive: the method keeps more)

    @property
    def beats(self) -> bool:
        return self.margin_db >= CLEAR_DB

    def as_dict(self) -> dict:
        return {
            "steps": self.at.steps,
            "speedup": self.at.speedup,
            "worst_psnr_db": self.at.worst_db,
            "worst_flip": self.at.worst_flip,
            "margin_db": self.margin_db,
            "beats": self.beats,
        }


class FewerStepsJudge:
    """Runs base at fewer steps on `requests` through the runner (its kept base pictures are reused)."""

    def __init__(self, runner, requests, model=None, *, floor_db: float, progress=None):
        steps = {r.executed_steps for r in requests}
        if not applies(requests):
            raise ValueError(
                f"fewer steps: the requests run {sorted(steps)} steps ({[r.task for r in requests]}); the reference "
                "is made over text-to-image requests of one step count"
            )
        self.runner, self.requests, self.model = runner, list(requests), model
        self.progress = progress or (lambda msg: None)
        self.result = FewerSteps(steps.pop(), floor_db)
        self.result.prompts = len(self.requests)
        self._full: dict[int, object] = {}  # request index -> its full-step base picture

    def _base_image(self, req):
        """Base's picture of `req`, untimed: the kept one where a bench or a click ran it."""
        return self.runner.base_picture(req, self.runner.resolve_preset(BASE), self.model)

    def point(self, steps: int, *, stop_under_floor: bool = False) -> StepsPoint:
        """Base at `steps` over the prompts (every prompt, or up to the first under the floor)."""
        have = self.result.points.get(steps)
        if have is not None and (have.prompts == self.result.prompts or stop_under_floor):
            return have
        self.progress(f"fewer steps: base at {steps} of {self.result.full}")
        dbs, flips = [], []
        for i, req in enumerate(self.requests):
            if i not in self._full:
                self._full[i] = self._base_image(req)
            q = judge(self._base_image(replace(req, steps=steps)), self._full[i])
            dbs.append(q.psnr_db)
            if q.flip is not None:
                flips.append(q.flip)
            if stop_under_floor and q.psnr_db < self.result.floor_db:
                break
        p = StepsPoint(steps, self.result.full, min(dbs), _mean_db(dbs), max(flips) if flips else None, len(dbs))
        self.result.points[steps] = p
        return p

    def fewest(self) -> StepsPoint | None:
        """The fewest steps whose worst PSNR keeps the floor (binary search), its answer judged on every prompt."""
        lo, hi, best = 1, self.result.full - 1, None
        while lo <= hi:
            mid = (lo + hi) // 2
            if self.point(mid, stop_under_floor=True).worst_db >= self.result.floor_db:
                best, hi = mid, mid - 1
            else:
                lo = mid + 1
        self.result.fewest = None if best is None else self.point(best)
        return self.result.fewest

    def curve(self, shares=LADDER) -> list[StepsPoint]:
        """The ladder's points (shares of N), judged on every prompt."""
        for k in sorted({max(1, round(self.result.full * s)) for s in shares} - {self.result.full}, reverse=True):
            self.point(k)
        return self.result.curve()

    def versus(self, speedup: float | None, worst_db: float | None) -> Versus | None:
        """A method at `speedup` keeping `worst_db`, against base at that speed's step count (None: no speed-up)."""
        if speedup is None or worst_db is None or speedup <= 1.0:
            return None
        p = self.point(self.result.steps_at(speedup))
        return Versus(p, margin_db(worst_db, p.worst_db))


def _mean_db(dbs: list[float]) -> float:
    """The mean over the prompts whose picture differs (inf: every one was identical)."""
    finite = [d for d in dbs if math.isfinite(d)]
    return sum(finite) / len(finite) if finite else math.inf


def applies(requests) -> bool:
    """Whether base at fewer steps is a reference for `requests`: text-to-image, one step count."""
    return all(r.task == "text2img" for r in requests) and len({r.steps for r in requests}) == 1


def fewer_steps_reference(runner, requests, model=None, *, floor_db: float, progress=None) -> FewerStepsJudge | None:
    """The fewest steps above the floor and the ladder's curve, judged (None where not `applies`)."""
    if not applies(requests):
        return None
    j = FewerStepsJudge(runner, requests, model, floor_db=floor_db, progress=progress)
    j.curve()
    j.fewest()
    return j


def read_rows(judge: FewerStepsJudge, rows) -> None:
    """Sets `vs_fewer` on each row that cached steps with a speed-up above 1."""
    for r in rows:
        if r.cached_steps > 0 and r.speedup is not None and r.speedup > 1.0:
            r.vs_fewer = judge.versus(r.speedup, r.floor_db)
