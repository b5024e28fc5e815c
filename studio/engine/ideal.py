"""A cached run against its ideal: what its counts would give were the cache's own work free (studio.measure.blocks),
and what it measured against its non-cache reference (base when that is its twin, else its own full steps)."""

from __future__ import annotations

from dataclasses import replace

from studio.engine.baseline import Paired, same_regime
from studio.measure.blocks import IdealCheck, computed_blocks, price_cached_step
from studio.measure.estimate import full_steps, speedup
from studio.spec.preset import CacheSpec, Preset


def ideal_check(p: Preset, paired: Paired, base: Preset) -> IdealCheck | None:
    """The cached run of `p` against its ideal; None when nothing is cached or the blocks' times are unknown
    (compiled blocks, no eager base)."""
    run, kept = paired.run, paired.base
    in_workers = run.stack.workers is not None and p.cache_config.backend == "cache-dit"
    if not (run.stack.is_engaged("cache") or in_workers) or not run.counts.full or p.step_share is not None:
        return None  # (a share of the steps: base ran more steps than the counts hold, no ideal from them)
    c = p.cache_config
    blocks_kept = cached_blocks(c)
    if blocks_kept is None:
        return None
    first, last = blocks_kept
    if run.block_ms is not None and run.full_ms is not None:
        blocks, full_ms, source = run.block_ms, run.full_ms, "from this run's block times"
    elif kept is not None and kept.block_ms is not None:
        blocks, full_ms, source = kept.block_ms, kept.full_ms, "from the eager base's block times"
    else:
        return None
    price = price_cached_step(
        list(blocks), full_ms, run.calls_per_step, computed_blocks(len(blocks), first, last), source
    )
    if price is None:
        return None
    ideal = price.ideal_speedup(run.counts.full, run.counts.cached)
    shown = paired.ratio is not None and not paired.ratio.useless  # a busy machine: no reading at all
    if twin_is_base(p, base):
        return IdealCheck(ideal, paired.ratio if shown else None, "base", price)
    # compiled / quantized / other attention: its non-cache twin is not base; its own full steps stand in (the
    # same estimator: every step priced as its fastest full step, over the run's floor)
    stack = paired.stack_runs or (run.timed,)
    fulls = tuple(full_steps(t) for t in stack)
    steps = (len(run.step_ms), 0)  # every step at the price of a full one: the run without its cache
    crowded = paired.ratio.crowded if paired.ratio is not None else ""  # programs on the cores move this one too
    measured = speedup(fulls, stack, base_counts=steps)
    return IdealCheck(ideal, None if crowded else measured, "its own full steps", price)


def cached_blocks(c: CacheSpec) -> tuple[int, int] | None:
    """The blocks a cached step of `c` still runs, as (first, last); None where a cached step is not a block count
    (DBPrune, and the attention-reuse methods), so no ideal bounds it."""
    if c.backend == "cache-dit":
        return c.Fn_compute_blocks, c.Bn_compute_blocks
    if c.backend == "fbcache":
        return 1, 0
    if c.backend in ("magcache", "seacache"):  # the whole stack: its input plus the kept residual
        return 0, 0
    return None


def twin_is_base(p: Preset, base: Preset) -> bool:
    """Whether `p` without its step cache is `base` (then base, timed beside it, is its non-cache reference)."""
    plain = replace(p, cache_config=CacheSpec())
    return plain.stack[1:] == same_regime(base, p).stack[1:]
