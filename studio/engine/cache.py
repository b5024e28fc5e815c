"""Step caches: cache-dit DBCache and DBPrune here, diffusers' cache hooks in engine.hooks. Best-effort: a pipeline
cache-dit does not recognise runs uncached, never fails. cache-dit patches the pipeline CLASS, so the model manager
keeps one pipeline per class."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from studio.engine.hooks import apply_hook, remove_hook, state_reader
from studio.engine.state import Engaged, stack_state
from studio.measure.timing import StepCounts, count_steps
from studio.spec.cachedit import cache_dit_configs, read_summary
from studio.spec.errors import RunError
from studio.spec.methods import HOOK_BACKENDS
from studio.spec.preset import MIN_CACHE_STEPS, CacheSpec

log = logging.getLogger(__name__)
CACHE_DIT = ("cache-dit", "dbprune")  # the backends cache-dit runs


@dataclass(frozen=True)
class BareTransformer:
    """A transformer passed where the engine takes a pipeline, for a caller that runs the denoising loop itself."""

    transformer: object  # a diffusers transformer (torch.nn.Module)

    @property
    def components(self) -> dict:
        return {"transformer": self.transformer}


def _cache_dit_target(pipe):
    """What cache-dit is enabled on: the pipeline (a fresh context per call), or a bare transformer (one context
    across calls: refreshed per run)."""
    return pipe.transformer if isinstance(pipe, BareTransformer) else pipe


@dataclass
class CacheReport:
    """What the backend says about the last run (empty, never None, when nothing was cached)."""

    backend: str = "none"
    cached_steps: list[int] = field(default_factory=list)
    residual_diffs: dict[int, float] = field(default_factory=dict)
    threshold: float | None = None
    cfg_cached_steps: list[int] | None = None  # the unconditional branch's, where it is cached apart
    pruned_blocks: int | None = None  # DBPrune: the block calls it pruned, of `block_calls` (cache-dit's count)
    block_calls: int | None = None

    def listed(self) -> list[int] | None:
        """cache-dit's own list of cached steps (None: the backend keeps none); under true CFG: either branch."""
        if self.backend not in CACHE_DIT:
            return None
        return sorted(set(self.cached_steps) | set(self.cfg_cached_steps or []))


def remove_cache(pipe) -> None:
    """Turn off whatever step cache is engaged. Run before any cache is engaged: it first keeps the transformer's
    child order, before cache-dit can change it."""
    state = stack_state(pipe.transformer)
    if not state.step_cache.children:
        state.step_cache.children = tuple(pipe.transformer._modules)
    if state.step_cache.backend in CACHE_DIT:
        import cache_dit

        cache_dit.disable_cache(_cache_dit_target(pipe))
    elif state.step_cache.backend in HOOK_BACKENDS:
        remove_hook(pipe.transformer)
    state.step_cache.reset()
    state.counter.state_reader = None


def _hooked(pipe, spec: CacheSpec, *, threshold: float, src: str, steps: int | None, calibrate=False) -> Engaged:
    """A diffusers cache hook (engine.hooks), recorded here when it engaged; `calibrate`: MagCache recording ratios."""
    engaged = apply_hook(pipe, spec, threshold=threshold, src=src, steps=steps, calibrate=calibrate)
    if engaged.engaged:
        state = stack_state(pipe.transformer)
        state.step_cache.backend = spec.backend
        state.step_cache.ratios = {} if calibrate else None
        state.counter.state_reader = state_reader(pipe.transformer, spec.backend, state.step_cache.ratios)
    return engaged


def hook_calibrating(pipe, spec: CacheSpec, steps: int) -> None:
    """MagCache's hook in calibration over `pipe` (uncached now): the next call records its ratios in
    step_cache.ratios. RunError with the hook's reason where it cannot engage."""
    engaged = _hooked(pipe, spec, threshold=0.0, src="", steps=steps, calibrate=True)
    if not engaged.engaged:
        raise RunError(engaged.detail)


def apply_cache(
    pipe, spec: CacheSpec, *, quant: str = "none", steps: int | None = None, separate_cfg: bool = False
) -> Engaged:
    """Engage the preset's step cache on `pipe`, replacing any previous one. `quant` picks an unset threshold's
    default; `steps` sizes step masks; `separate_cfg`: true CFG, two transformer calls a step."""
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
    threshold = spec.effective_threshold(quant)
    src = "default" + (f" for {quant}" if quant != "none" else "")
    src = "set" if spec.residual_diff_threshold is not None else src
    if spec.backend in HOOK_BACKENDS:
        return _hooked(pipe, spec, threshold=threshold, src=src, steps=steps)
    import cache_dit

    cfgs = cache_dit_configs(spec, quant=quant, steps=steps, separate_cfg=separate_cfg)  # the studio's own: not caught
    try:
        cache_dit.enable_cache(_cache_dit_target(pipe), cache_config=cfgs.cache, calibrator_config=cfgs.calibrator)
    except Exception as e:  # a pipeline cache-dit has no adapter for, blocks it does not recognise (its errors vary
        # by adapter): handled here, the run goes on uncached and the card says why
        log.warning("cache-dit could not engage", exc_info=e)
        _undo_cache_dit(_cache_dit_target(pipe))
        return Engaged(
            "cache",
            spec.backend,
            False,
            f"cache: transformer blocks not recognised by cache-dit ({type(e).__name__}), running uncached",
        )
    stack_state(pipe.transformer).step_cache.backend = spec.backend
    return Engaged(
        "cache",
        spec.backend,
        True,
        f"cache: cache-dit {spec.label(threshold)} ({src})" + (", CFG branches cached apart" if separate_cfg else ""),
        spec.label(threshold),
    )


def _undo_cache_dit(target) -> None:
    import cache_dit

    try:
        cache_dit.disable_cache(target)
    except Exception as e:  # it may have patched nothing: what is left is only logged, the next apply removes it
        log.warning("undoing a failed cache-dit enable_cache: %s: %s", type(e).__name__, e)


def prepare_run(pipe, spec: CacheSpec, *, quant: str, steps: int, separate_cfg: bool = False) -> None:
    """Per-run refresh: a step mask sized to this run's steps; a bare transformer's context afresh (else counts and
    residuals carry over from the last run)."""
    bare = isinstance(pipe, BareTransformer)
    if stack_state(pipe.transformer).step_cache.backend in CACHE_DIT and (spec.has_mask or bare):
        import cache_dit

        cfgs = cache_dit_configs(spec, quant=quant, steps=steps, separate_cfg=separate_cfg)
        cache_dit.refresh_context(pipe.transformer, cache_config=cfgs.cache, calibrator_config=cfgs.calibrator)


def step_counts(steps: list, report: CacheReport) -> StepCounts:
    """The run's cached/full counts. DBPrune skips blocks inside a step, which the block hooks cannot see: its own
    list of steps with a pruned block is the one source."""
    if report.backend == "dbprune":
        source = "dbprune (steps with a pruned block)"
        return StepCounts(len(steps), sorted(report.listed() or []), source)
    return count_steps(steps, report.backend, report.listed())


def read_report(pipe, spec: CacheSpec, quant: str) -> CacheReport:
    """The cache backend's own account of the last run."""
    backend = stack_state(pipe.transformer).step_cache.backend
    if backend == "none":
        return CacheReport()
    threshold = spec.effective_threshold(quant)
    if backend in HOOK_BACKENDS:
        return CacheReport(backend, threshold=threshold if backend == "fbcache" else None)
    rec = read_summary(_cache_dit_target(pipe))
    return CacheReport(
        backend,
        rec.cached_steps,
        rec.residual_diffs,
        threshold,
        rec.cfg_cached_steps,
        rec.pruned_blocks,
        rec.block_calls,
    )
