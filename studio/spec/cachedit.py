"""The studio's one way into cache-dit: its config objects built from a `CacheSpec`, and its own record of a run.
At the lowest floor so that the engine, the parallel workers and the YAML export all mean the same by a knob."""

from __future__ import annotations

from dataclasses import dataclass, field

from studio.spec.methods import knobs_of
from studio.spec.preset import CacheSpec


@dataclass(frozen=True)
class CacheDitConfigs:
    """What `cache_dit.enable_cache` takes for one spec: the DBCache config and its calibrator (or None)."""

    cache: object  # cache_dit.DBCacheConfig
    calibrator: object | None  # TaylorSeer-, DMD- or FoCaCalibratorConfig, or None
    threshold: float  # the residual diff threshold it applies (the spec's, or the default for its weights)


def step_mask(spec: CacheSpec, steps: int | None) -> list[int] | None:
    """The spec's step mask sized to `steps` (1: compute, 0: may cache), or None when it has none."""
    if not spec.has_mask:
        return None
    if steps is None:
        raise ValueError("a step mask needs the number of steps")
    import cache_dit

    if spec.compute_bins is not None:
        mask = cache_dit.steps_mask(
            compute_bins=list(spec.compute_bins), cache_bins=list(spec.cache_bins), total_steps=steps
        )
    else:
        mask = cache_dit.steps_mask(mask_policy=spec.steps_computation_mask, total_steps=steps)
    return [int(x) for x in list(mask)[:steps]]


def cache_dit_configs(
    spec: CacheSpec, *, quant: str = "none", steps: int | None, separate_cfg: bool = False
) -> CacheDitConfigs:
    """cache-dit's DBCache (or DBPrune) and calibrator configs for `spec`. `quant`: the form that runs (an unset
    threshold takes its default); `separate_cfg`: the run calls the transformer twice per step (true CFG)."""
    from cache_dit import (
        DBCacheConfig,
        DBPruneConfig,
        DMDCalibratorConfig,
        FoCaCalibratorConfig,
        TaylorSeerCalibratorConfig,
    )

    mask = step_mask(spec, steps)
    threshold = spec.effective_threshold(quant)
    prune = {}
    if spec.backend == "dbprune":  # DBPrune: DBCache's keys plus its own (spec.methods), on cache-dit's DBPruneConfig
        prune = dict(knobs_of("dbprune", spec.options))
        prune["non_prune_block_ids"] = list(prune["non_prune_block_ids"])
    cfg = (DBPruneConfig if spec.backend == "dbprune" else DBCacheConfig)(
        **prune,
        Fn_compute_blocks=spec.Fn_compute_blocks,
        Bn_compute_blocks=spec.Bn_compute_blocks,
        max_warmup_steps=spec.max_warmup_steps,
        residual_diff_threshold=threshold,
        max_continuous_cached_steps=spec.max_continuous_cached_steps,
        max_cached_steps=spec.max_cached_steps,
        num_inference_steps=steps if mask is not None else None,
        steps_computation_mask=mask,
        steps_computation_policy=spec.steps_computation_policy,
        # Two transformer calls per step (cond, uncond) only with true CFG. cache-dit's Qwen-Image adapter assumes two
        # by default; on a one-call run it then counts in pairs, caches 6 steps in a row under "3" and compares each
        # residual with the wrong branch.
        enable_separate_cfg=separate_cfg,
    )
    cal = None
    if spec.enable_taylorseer:
        cal = TaylorSeerCalibratorConfig(taylorseer_order=spec.taylorseer_order)
    elif spec.enable_dmd:
        cal = DMDCalibratorConfig(dmd_history=spec.dmd_history, dmd_rank=spec.dmd_rank)
    elif spec.enable_foca:
        cal = FoCaCalibratorConfig()
    return CacheDitConfigs(cfg, cal, threshold)


@dataclass(frozen=True)
class CacheDitRecord:
    """cache-dit's own account of the last run of a cached transformer (its `summary`, the transformer's entry)."""

    cached_steps: list[int] = field(default_factory=list)
    residual_diffs: dict[int, float] = field(default_factory=dict)
    cfg_cached_steps: list[int] | None = None  # the unconditional branch's, where CFG is cached apart
    pruned_blocks: int | None = None  # DBPrune: block calls it pruned over the run (None: not a pruning cache)
    block_calls: int | None = None  # DBPrune: the block calls the run made, pruned or not


def read_summary(pipe) -> CacheDitRecord:
    """Read `cache_dit.summary(pipe)`: an uncached pipeline gives an empty record (cache-dit's own empty stats)."""
    import cache_dit

    stats = cache_dit.summary(pipe, logging=False)
    if not stats:
        return CacheDitRecord()
    s = stats[-1]  # the transformer-level entry comes last
    diffs = {}
    for k, v in (s.residual_diffs or {}).items():
        if isinstance(v, (list, tuple)):  # DBPrune: one diff per block of the step
            continue
        k, v = int(k), float(v)
        if v >= 0:  # cache-dit writes -1 where it skipped computing the diff
            diffs[k] = v
    cfg = sorted(int(x) for x in (s.cfg_cached_steps or []))
    pruned, calls = None, None
    if s.pruned_ratio is not None:  # DBPrune: its per-step counts of pruned blocks and of the blocks it ran
        pruned = int(sum(s.pruned_blocks or [])) + int(sum(s.cfg_pruned_blocks or []))
        calls = int(sum(s.actual_blocks or [])) + int(sum(s.cfg_actual_blocks or []))
    return CacheDitRecord(sorted(int(x) for x in (s.cached_steps or [])), diffs, cfg or None, pruned, calls)
