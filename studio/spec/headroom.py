"""How many steps a step cache can skip at all, before a run: the room its warm-up, run caps and step mask leave;
few-step models (FLUX.1-schnell's 4 steps) leave little, and the card says so before anyone reads a speed-up. The bound
mirrors cache-dit 1.5.3's `can_cache` step by step (`_dbcache_steps`): caching every step its rules allow is the most
a run can skip. The sentences live here, beside the numbers, because the record's JSON carries them and the engine
that builds it sits below studio.report."""

from __future__ import annotations

from dataclasses import dataclass

from studio.spec.methods import knobs_of
from studio.spec.preset import CacheSpec


@dataclass(frozen=True)
class Headroom:
    """The most steps a cache can skip in a run of `steps` steps, and what bounds it (the spec's own knobs)."""

    backend: str  # a spec.preset.CACHE_BACKENDS name (those with a step bound: not dbprune, pab, fastercache)
    steps: int  # the steps that run (a request's executed steps: img2img's strength shortens them)
    skippable: int  # the most steps the cache can skip
    first: int  # the first step that may be cached (== steps: none may be)
    warmup: int = 0  # max_warmup_steps
    run_cap: int = -1  # max_continuous_cached_steps (-1: none)
    total_cap: int = -1  # max_cached_steps (-1: none)
    mask: str | None = None  # the step mask: a policy name, "bins", or None
    static: bool = True  # the mask's policy is static (it alone decides)
    mask_computes: int = 0  # steps the mask computes

    @property
    def tight(self) -> bool:
        """Worth saying before the run: the cache can skip nothing, or under half the steps (no 2x even were cached
        steps free) while the steps before its first cacheable one are a quarter or more of the run (the request's
        few steps hold it down, not a run cap alone). The shipped `cache` is tight at 9 steps or fewer, not from 10."""
        return self.skippable == 0 or (2 * self.skippable < self.steps and 4 * self.first >= self.steps)

    def sentence(self) -> str:
        """'at 8 steps with 4 warm-up steps and at most 3 cached in a row, this cache can skip at most 3 of 8 steps'"""
        n, s = self.skippable, self.steps
        can = f"can skip at most {n} of {s} {_steps(s)}" if n else f"can skip none of the {s} {_steps(s)}"
        if self.backend == "fbcache":
            return f"at {s} {_steps(s)} First-Block-Cache computes the first (no residual to compare yet), so it {can}"
        clauses = []
        if self.mask is not None:
            kind = "static" if self.static else "dynamic"
            clauses.append(f"the {kind} step mask {self.mask} computing {self.mask_computes} of them")
        else:
            clauses.append(f"{self.warmup} warm-up {_steps(self.warmup)}")
        if self.mask is None or not self.static:
            if self.run_cap >= 0:
                clauses.append(f"at most {self.run_cap} cached in a row")
            if self.total_cap >= 0:
                clauses.append(f"at most {self.total_cap} cached in all")
        with_ = clauses[0] if len(clauses) == 1 else ", ".join(clauses[:-1]) + " and " + clauses[-1]
        return f"at {s} {_steps(s)} with {with_}, this cache {can}"

    @property
    def at_most(self) -> float:
        """The most this cache can speed the run up were every cached step free: steps over the steps it computes."""
        return self.steps / max(1, self.steps - self.skippable)

    def before_run(self, model_steps: int | None = None) -> str:
        """What to expect, said before the run (worth saying when `tight`). `model_steps`: the model's own schedule
        length, named when it is a few-step (distilled) model's."""
        few = ""
        if model_steps is not None and model_steps <= FEW_STEPS:
            few = f" (this model is a few-step one: its schedule is {model_steps} {_steps(model_steps)})"
        if self.skippable == 0:
            return f"this cache will cache nothing here{few}: {self.sentence()}; more steps would give it room"
        return (
            f"little room for this cache{few}: {self.sentence()}, so the run is at most {self.at_most:.2f}x faster "
            "than the same stack without it, even were a cached step free"
        )

    def as_dict(self, model_steps: int | None = None) -> dict:
        """What the API says before a run: the bound, whether it is tight, and the sentences."""
        return {
            "backend": self.backend,
            "steps": self.steps,
            "skippable": self.skippable,
            "first_cacheable": self.first,
            "at_most": self.at_most,
            "tight": self.tight,
            "sentence": self.sentence(),
            "warning": self.before_run(model_steps) if self.tight else None,
        }


FEW_STEPS = 10  # a model whose own schedule is this short is a few-step (distilled) one: schnell 4, Z-Image-Turbo 9


def _steps(n: int) -> str:
    return "step" if n == 1 else "steps"


def headroom(spec: CacheSpec, steps: int, mask: list[int] | None = None) -> Headroom | None:
    """The most steps `spec`'s cache can skip in a run of `steps` steps; None when it asks for no cache. `mask`: the
    spec's step mask sized to `steps` (1 computes), needed where it has one (building it takes cache-dit, not here)."""
    if not spec.enabled:
        return None
    if spec.backend == "fbcache":
        return Headroom("fbcache", steps, max(0, steps - 1), min(1, steps))
    if spec.backend in ("magcache", "seacache", "taylorseer"):
        return _hook_headroom(spec, steps)
    if spec.backend != "cache-dit":
        return None  # DBPrune prunes blocks, not steps; PAB and FasterCache follow the scheduler's timesteps
    if spec.has_mask and mask is None:
        raise ValueError("a step mask's headroom needs the mask (spec.cachedit.step_mask)")
    static = spec.steps_computation_policy == "static"
    cacheable = _dbcache_steps(
        steps, spec.max_warmup_steps, spec.max_continuous_cached_steps, spec.max_cached_steps, mask, static
    )
    return Headroom(
        "cache-dit",
        steps,
        len(cacheable),
        cacheable[0] if cacheable else steps,
        spec.max_warmup_steps,
        spec.max_continuous_cached_steps,
        spec.max_cached_steps,
        _mask_name(spec) if mask is not None else None,
        static,
        sum(1 for m in (mask or [])[:steps] if m == 1),
    )


def _hook_headroom(spec: CacheSpec, steps: int) -> Headroom:
    """The most steps MagCache, SeaCache or diffusers' TaylorSeer can skip, by their rules (diffusers 0.42.1): MagCache
    computes its first round(retention_ratio x steps) (at least one: no residual yet), then skips at most
    `max_skip_steps` in a row; SeaCache computes its first `retention_steps` (at least one) and last `cache_end_steps`,
    at most `max_consecutive_cached` cached in a row (0: no limit); TaylorSeer's skips are set by its knobs alone."""
    k = knobs_of(spec.backend, spec.options)
    if spec.backend == "taylorseer":
        w, every, after = k["disable_cache_before_step"], k["cache_interval"], k["disable_cache_after_step"]
        cached = [s for s in range(w, steps if after is None else min(after, steps)) if (s - w - 1) % every != 0]
        return Headroom("taylorseer", steps, len(cached), cached[0] if cached else steps, w, every - 1)
    if spec.backend == "magcache":
        first, run_cap, end = max(1, int(k["retention_ratio"] * steps + 0.5)), k["max_skip_steps"], 0
    else:
        first, run_cap, end = max(1, k["retention_steps"]), k["max_consecutive_cached"] or -1, k["cache_end_steps"]
    cached = _dbcache_steps(max(0, steps - end), first, run_cap, -1, None, True)
    return Headroom(spec.backend, steps, len(cached), cached[0] if cached else steps, first, run_cap)


def _mask_name(spec: CacheSpec) -> str:
    return spec.steps_computation_mask if spec.steps_computation_mask != "none" else "bins"


def _dbcache_steps(steps: int, warmup: int, run_cap: int, total_cap: int, mask, static: bool) -> list[int]:
    """The steps cache-dit caches when every residual check passes: its `can_cache`, in its order."""
    if mask is not None:  # cache_context.warmup_steps: cut to the mask's leading compute steps
        lead = next((i for i, m in enumerate(mask) if m != 1), len(mask))
        warmup = min(warmup, lead)
    cached, streak, residual = [], 0, False
    for i in range(steps):
        if i < warmup or (mask is not None and i < len(mask) and mask[i] == 1):
            can = False
        elif mask is not None and static:
            can = True  # a static mask's cache step: cached before any cap or residual check
        elif 0 <= total_cap <= len(cached) or 0 <= run_cap <= streak:
            can = False
        else:
            can = residual  # a residual from a computed step to compare with
        if can:
            cached.append(i)
            streak += 1
        else:
            streak, residual = 0, True
    return cached


def idle_sentence(room: Headroom | None, diffs: dict, threshold: float | None) -> str:
    """Why a run whose cache engaged cached nothing: no room (the headroom sentence), or every residual difference
    ({step: diff}, as the cache recorded them) at or above the run's `threshold` (the smallest against it)."""
    if room is not None and room.skippable == 0:
        return f"cached nothing: {room.sentence()}"
    t = "" if threshold is None else f" {threshold:g}"
    if not diffs:
        return f"cached nothing, and the cache recorded no residual difference to set against the threshold{t}"
    low = min(diffs.values())
    if threshold is not None and low < threshold:
        return (
            f"cached nothing, although the smallest residual difference seen, {_beside(low, threshold)}, is under "
            f"the threshold{t}: the cache's counts and its differences disagree"
        )
    where = "above" if threshold is None or low > threshold else "at"
    return (
        f"cached nothing: the smallest residual difference seen was {_beside(low, threshold)}, {where} the "
        f"threshold{t} (raise residual_diff_threshold to cache)"
    )


def _beside(x: float, threshold: float | None) -> str:
    """`x` to two significant digits, or as many more as it takes to fall on its side of `threshold`."""
    for digits in range(2, 10):
        s = f"{x:.{digits}g}"
        v = float(s)
        if threshold is None or x == threshold or (v != threshold and (v < threshold) == (x < threshold)):
            return s
    return repr(x)


@dataclass(frozen=True)
class CacheRoom:
    """A run's record of its step cache's room (the JSON's fields): the most steps it could skip at these steps,
    wherever a cache was asked for; the sentence when that is tight; why an engaged cache cached nothing."""

    cache_skippable: int | None = None
    cache_headroom: str | None = None
    cache_idle: str | None = None


def run_room(room: Headroom | None, *, engaged: bool, cached: int, diffs: dict, threshold: float | None) -> CacheRoom:
    """The record of `room` for a run that cached `cached` steps with these residual differences."""
    return CacheRoom(
        cache_skippable=room.skippable if room is not None else None,
        cache_headroom=room.sentence() if room is not None and room.tight else None,
        cache_idle=idle_sentence(room, diffs, threshold) if engaged and cached == 0 else None,
    )
