"""One setting screened over the prompts against a quality floor, untimed: the step both searches (tune, methods)
make. The first prompt under the floor (or over the FLIP ceiling) ends the setting; an unmeasured FLIP fails a
ceiling (nothing shows the picture within it) and is left out of the worst."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Screened:
    """What the screening saw, over the prompts it ran (all of them, unless one failed or the cache was refused)."""

    worst_db: float | None = None
    worst_flip: float | None = None  # None: no FLIP measured
    cached: list[int] = field(default_factory=list)  # cached steps per prompt run
    pruned: list[float] = field(default_factory=list)  # DBPrune: the pruned share of block calls per prompt run
    predicted: list[float] = field(default_factory=list)  # the engine's ideal speed-up per prompt run (1.0: none)
    failed: int | None = None  # the index of the request that failed the floor or the ceiling
    refused: str | None = None  # the engine's line saying the step cache could not engage
    runs: int = 0

    @property
    def passed(self) -> bool:
        return self.runs > 0 and self.failed is None and self.refused is None


def flip_ok(flip: float | None, max_flip: float | None, share: float = 1.0) -> bool:
    """Within `share` of the FLIP ceiling (always, without one; never, unmeasured under one)."""
    return max_flip is None or (flip is not None and flip <= max_flip * share)


def screen_prompts(runner, requests, preset, model=None, *, floor_db: float, max_flip=None, order=None) -> Screened:
    """Screen `preset` over `requests` (in `order`: indices, default as given) against `floor_db` and `max_flip`."""
    out = Screened()
    for i in range(len(requests)) if order is None else order:
        m = runner.screen(requests[i], preset, model)
        out.runs += 1
        refused = [line for line in m.labels.fallbacks if line.startswith("cache:")]
        if refused and preset.cache_config.enabled:
            out.refused = refused[0]
            return out
        db = m.quality.psnr_db if m.quality.psnr_db is not None else float("inf")
        flip = m.quality.flip
        out.worst_db = db if out.worst_db is None else min(out.worst_db, db)
        if flip is not None:
            out.worst_flip = flip if out.worst_flip is None else max(out.worst_flip, flip)
        out.cached.append(m.cache.cached_steps)
        if m.cache.pruned_blocks is not None and m.cache.block_calls:
            out.pruned.append(m.cache.pruned_blocks / m.cache.block_calls)
        out.predicted.append(m.ideal.ideal_speedup or 1.0)  # cached steps costing only what they ran
        if db < floor_db or not flip_ok(flip, max_flip):
            out.failed = i
            return out
    return out
