"""Step caches: cache-dit DBCache (calibrators, step masks) or diffusers First-Block-Cache.

Best-effort by design: a pipeline cache-dit does not recognise runs uncached, it never fails to load.
cache-dit patches the pipeline CLASS, so the model manager keeps one pipeline per class and toggles here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from studio.engine.state import Engaged, stack_state
from studio.spec.preset import MIN_CACHE_STEPS, CacheSpec

log = logging.getLogger(__name__)

_FBC_LEADER_HOOK = "fbc_leader_block_hook"  # diffusers first_block_cache._FBC_LEADER_BLOCK_HOOK


@dataclass
class CacheReport:
    """What the backend says about the last run (empty, never None, when nothing was cached)."""

    backend: str = "none"
    cached_steps: list[int] = field(default_factory=list)
    residual_diffs: dict[int, float] = field(default_factory=dict)
    threshold: float | None = None
    cfg_cached_steps: list[int] | None = None  # the unconditional branch's, where it is cached apart

    def listed(self) -> list[int] | None:
        """cache-dit's own list of cached steps, for the cross-check (None for a backend that keeps none). With true
        CFG a step is cached when either branch was served."""
        if self.backend != "cache-dit":
            return None
        return sorted(set(self.cached_steps) | set(self.cfg_cached_steps or []))


def _dbcache_configs(spec: CacheSpec, threshold: float, steps: int | None, separate_cfg: bool = False):
    import cache_dit
    from cache_dit import DBCacheConfig, DMDCalibratorConfig, TaylorSeerCalibratorConfig

    mask = None
    if spec.has_mask:
        if steps is None:
            raise ValueError("a step mask needs the number of steps")
        if spec.compute_bins is not None:
            mask = cache_dit.steps_mask(
                compute_bins=list(spec.compute_bins), cache_bins=list(spec.cache_bins), total_steps=steps
            )
        else:
            mask = cache_dit.steps_mask(mask_policy=spec.steps_computation_mask, total_steps=steps)
        mask = list(mask)[:steps]
    cfg = DBCacheConfig(
        Fn_compute_blocks=spec.Fn_compute_blocks,
        Bn_compute_blocks=spec.Bn_compute_blocks,
        max_warmup_steps=spec.max_warmup_steps,
        residual_diff_threshold=threshold,
        max_continuous_cached_steps=spec.max_continuous_cached_steps,
        max_cached_steps=spec.max_cached_steps,
        num_inference_steps=steps if mask is not None else None,
        steps_computation_mask=mask,
        steps_computation_policy=spec.steps_computation_policy,
        # How the run really calls the transformer: two calls per step (cond, uncond) only with true CFG. cache-dit's
        # Qwen-Image adapter assumes two by default; on a one-call run it then counts in pairs, caches 6 steps in a
        # row under "3" and compares each residual with the wrong branch (measured: [4, 5, 6, 8, 9] by its list
        # against [8..13, 16..19] by the block hooks).
        enable_separate_cfg=separate_cfg,
    )
    cal = None
    if spec.enable_taylorseer:
        cal = TaylorSeerCalibratorConfig(taylorseer_order=spec.taylorseer_order)
    elif spec.enable_dmd:
        cal = DMDCalibratorConfig(dmd_history=spec.dmd_history, dmd_rank=spec.dmd_rank)
    return cfg, cal


def remove_cache(pipe) -> None:
    """Turn off whatever step cache is engaged; afterwards the pipeline computes every block again."""
    state = stack_state(pipe.transformer)
    if state.cache == "cache-dit":
        import cache_dit

        cache_dit.disable_cache(pipe)
    elif state.cache == "fbcache":
        pipe.transformer.disable_cache()
    state.cache = "none"
    state.counter.state_reader = None


def apply_cache(
    pipe, spec: CacheSpec, *, quantized: bool = False, steps: int | None = None, separate_cfg: bool = False
) -> Engaged:
    """Engage the preset's step cache on `pipe` (after any previous one is removed).

    Args:
        quantized: the transformer is INT8; an unset threshold then takes the backend's raised default.
        steps: number of inference steps of the coming run (needed for step masks; refreshed per run).
        separate_cfg: the run calls the transformer twice per step (true CFG: conditional, then unconditional).
    """
    remove_cache(pipe)
    if not spec.enabled:
        return Engaged("cache", "none", False, "cache: off (every step computed)")
    if steps is not None and steps < MIN_CACHE_STEPS:
        return Engaged(
            "cache",
            spec.backend,
            False,
            f"cache: skipped, {steps} steps is too few to gain (needs >= {MIN_CACHE_STEPS}); running uncached",
        )
    threshold = spec.effective_threshold(quantized)
    src = "set" if spec.residual_diff_threshold is not None else ("default for INT8" if quantized else "default")
    if spec.backend == "fbcache":
        return _apply_fbcache(pipe, threshold, src)
    try:
        import cache_dit

        cfg, cal = _dbcache_configs(spec, threshold, steps, separate_cfg)
        cache_dit.enable_cache(pipe, cache_config=cfg, calibrator_config=cal)
    except Exception as e:  # not a registered pipeline / blocks not recognised
        log.warning("cache-dit could not engage: %s", e)
        try:
            import cache_dit

            cache_dit.disable_cache(pipe)
        except Exception:
            pass
        return Engaged(
            "cache",
            spec.backend,
            False,
            f"cache: transformer blocks not recognised by cache-dit ({type(e).__name__}), running uncached",
        )
    stack_state(pipe.transformer).cache = "cache-dit"
    extra = f", {spec.calibrator}" if spec.calibrator != "none" else ""
    mask = spec.steps_computation_mask if spec.steps_computation_mask != "none" else "bins"
    extra += f", mask {mask}" if spec.has_mask else ""
    return Engaged(
        "cache",
        spec.backend,
        True,
        f"cache: cache-dit DBCache F{spec.Fn_compute_blocks}B{spec.Bn_compute_blocks} W{spec.max_warmup_steps} "
        f"R{threshold:g} ({src}) MC{spec.max_continuous_cached_steps}{extra}"
        + (", CFG branches cached apart" if separate_cfg else ""),
    )


def _apply_fbcache(pipe, threshold: float, src: str) -> Engaged:
    tr = pipe.transformer
    try:
        from diffusers.hooks import FirstBlockCacheConfig

        tr.enable_cache(FirstBlockCacheConfig(threshold=threshold))
    except Exception as e:
        log.warning("First-Block-Cache could not engage: %s", e)
        return Engaged(
            "cache",
            "fbcache",
            False,
            f"cache: First-Block-Cache not supported by {type(tr).__name__} ({e}), running uncached",
        )
    state = stack_state(tr)
    state.cache = "fbcache"
    state.counter.state_reader = _fbcache_reader(tr)
    return Engaged("cache", "fbcache", True, f"cache: diffusers First-Block-Cache R{threshold:g} ({src})")


def _fbcache_reader(transformer):
    """A callable telling whether First-Block-Cache ran the remaining blocks on the last transformer call, read from
    its own shared state (written by an eager, compiler-disabled decision, so right under compile too)."""
    head = None
    for m in transformer.modules():
        registry = getattr(m, "_diffusers_hook", None)
        if registry is not None and registry.get_hook(_FBC_LEADER_HOOK) is not None:
            head = registry.get_hook(_FBC_LEADER_HOOK)
            break
    if head is None:
        return None
    return lambda: bool(head.state_manager.get_state().should_compute)


def prepare_run(pipe, spec: CacheSpec, *, quantized: bool, steps: int, separate_cfg: bool = False) -> None:
    """Per-run refresh: a step mask is sized to this run's step count."""
    if stack_state(pipe.transformer).cache == "cache-dit" and spec.has_mask:
        import cache_dit

        cfg, cal = _dbcache_configs(spec, spec.effective_threshold(quantized), steps, separate_cfg)
        cache_dit.refresh_context(pipe.transformer, cache_config=cfg, calibrator_config=cal)


def read_report(pipe, spec: CacheSpec, quantized: bool) -> CacheReport:
    """Read the cache backend's own account of the last run."""
    backend = stack_state(pipe.transformer).cache
    if backend == "none":
        return CacheReport()
    threshold = spec.effective_threshold(quantized)
    if backend == "fbcache":
        return CacheReport(backend, threshold=threshold)
    import cache_dit

    stats = cache_dit.summary(pipe, logging=False)
    if not stats:
        return CacheReport(backend, threshold=threshold)
    s = stats[-1]
    diffs = {}
    for k, v in (s.residual_diffs or {}).items():
        try:
            k, v = int(k), float(v)
        except (TypeError, ValueError):
            continue
        if v >= 0:  # cache-dit writes -1 where it skipped computing the diff
            diffs[k] = v
    cfg = sorted(int(x) for x in (s.cfg_cached_steps or []))
    return CacheReport(backend, sorted(int(x) for x in s.cached_steps), diffs, threshold, cfg or None)
