"""diffusers' cache hooks as step caches (First-Block-Cache, MagCache, TaylorSeer, FasterCache, PAB, SeaCache), each
engaged through `transformer.enable_cache(<its config>)` with the preset's knobs under the library's own names, or
refused with the reason."""

from __future__ import annotations

import inspect
import logging

from studio.engine.state import Engaged, stack_state
from studio.spec.methods import METHOD_NAMES, knobs_of, transformer_fingerprint
from studio.spec.preset import CacheSpec

log = logging.getLogger(__name__)

# diffusers' registry names of the hooks whose state the counter reads (diffusers/hooks/*.py)
_LEADER_HOOK = {"fbcache": "fbc_leader_block_hook", "magcache": "mag_cache_leader_block_hook"}
_TAYLORSEER_HOOK = "taylorseer_cache"
NEEDS_TIMESTEP = ("fastercache", "pab")  # they read the pipeline's current timestep


def fingerprint(transformer) -> str:
    """What a MagCache calibration belongs to (spec.methods.transformer_fingerprint)."""
    return transformer_fingerprint(type(transformer).__name__, dict(transformer.config))


def _refused(spec: CacheSpec, why: str) -> Engaged:
    return Engaged(
        "cache", spec.backend, False, f"cache: {METHOD_NAMES[spec.backend]} not engaged: {why}; running uncached"
    )


def hook_config(pipe, spec: CacheSpec, *, threshold: float, steps: int | None, calibrate: bool):
    """The diffusers config for `spec` on `pipe`, or a sentence saying why it cannot engage (returned as a str)."""
    from diffusers.hooks import (
        FasterCacheConfig,
        FirstBlockCacheConfig,
        MagCacheConfig,
        PyramidAttentionBroadcastConfig,
        TaylorSeerCacheConfig,
    )

    k = knobs_of(spec.backend, spec.options)
    if spec.backend in NEEDS_TIMESTEP and not _has_timestep(pipe):
        return "it reads the pipeline's current timestep, and a transformer run without its pipeline has none"
    if spec.backend == "fbcache":
        return FirstBlockCacheConfig(threshold=threshold)
    if spec.backend == "magcache":
        return _magcache(pipe, k, steps, calibrate, MagCacheConfig)
    # (the knobs are named as the configs' fields: spec.methods.METHOD_KNOBS)
    if spec.backend == "taylorseer":
        return TaylorSeerCacheConfig(**k, taylor_factors_dtype=pipe.transformer.dtype)
    if spec.backend == "pab":
        return PyramidAttentionBroadcastConfig(**k, current_timestep_callback=lambda: _timestep(pipe))
    if spec.backend == "fastercache":
        return FasterCacheConfig(
            **k,
            current_timestep_callback=lambda: _timestep(pipe),
            # Attention reuse only: its unconditional-branch reuse splits each batch in halves, right only where this
            # request batches CFG's branches, which is not known when the stack is wired; a wrong guess mixes two
            # pictures silently. FLUX calls its branches apart anyway (D24).
            is_guidance_distilled=True,
            tensor_format="BCHW",
        )
    if spec.backend == "seacache":
        return _seacache(pipe, k)
    raise ValueError(f"no diffusers hook for backend {spec.backend}")


def _has_timestep(pipe) -> bool:
    return hasattr(type(pipe), "current_timestep")


def _timestep(pipe) -> float:
    t = pipe.current_timestep
    return -1.0 if t is None else float(t.flatten()[0]) if hasattr(t, "flatten") else float(t)


def _magcache(pipe, k: dict, steps: int | None, calibrate: bool, MagCacheConfig):
    here = fingerprint(pipe.transformer)
    if calibrate:
        # counted past the run's end, so the hook never wraps (and clears its ratios) before they are read
        return MagCacheConfig(num_inference_steps=(steps or 28) + 1, calibrate=True)
    how = "`python -m studio calibrate --preset <this preset>` measures them and writes them into the preset"
    if k["mag_ratios"] is None:
        return f"MagCache needs its per-step magnitude ratios for this model, and this preset has none: {how}"
    if k["calibrated_for"] != here:
        return f"its ratios were calibrated for {k['calibrated_for']}, and this transformer is {here}: {how}"
    return MagCacheConfig(
        threshold=k["threshold"],
        max_skip_steps=k["max_skip_steps"],
        retention_ratio=k["retention_ratio"],
        num_inference_steps=steps or len(k["mag_ratios"]),
        mag_ratios=list(k["mag_ratios"]),
    )


def _seacache(pipe, k: dict):
    """SeaCache's config, or why not: it decides from the step and sigma the pipeline passes in its cache_context, and
    without them silently computes every step."""
    from diffusers.hooks.sea_cache import SeaCacheConfig

    try:
        source = inspect.getsource(type(pipe).__call__)
    except (OSError, TypeError):  # no source to read (a compiled or built-in class): cannot tell, so say so
        return f"cannot read whether {type(pipe).__name__} passes the scheduler's step and sigma to its cache context"
    if not _passes_sigma(source):
        return (
            f"{type(pipe).__name__} does not pass the scheduler's step and sigma to its cache context, which SeaCache "
            "decides from (it would compute every step)"
        )
    return SeaCacheConfig(**k)


def _passes_sigma(source: str) -> bool:
    """Whether some `cache_context(...)` call in a pipeline's source passes both `step_index=` and `sigma=`."""
    at = source.find("cache_context(")
    while at >= 0:
        depth, end = 0, at + len("cache_context")
        while end < len(source):  # to the call's closing parenthesis
            depth += {"(": 1, ")": -1}.get(source[end], 0)
            if depth == 0:
                break
            end += 1
        call = source[at : end + 1]
        if "step_index=" in call and "sigma=" in call:
            return True
        at = source.find("cache_context(", end)
    return False


def apply_hook(
    pipe, spec: CacheSpec, *, threshold: float, src: str, steps: int | None, calibrate: bool = False
) -> Engaged:
    """Engage `spec`'s diffusers cache hook on `pipe.transformer` (engine.cache removed any before, and records what
    engaged)."""
    tr = pipe.transformer
    _unpatch_cache_dit(tr)
    cfg = hook_config(pipe, spec, threshold=threshold, steps=steps, calibrate=calibrate)
    if isinstance(cfg, str):
        return _refused(spec, cfg)
    try:
        tr.enable_cache(cfg)
    except (ValueError, TypeError, AttributeError, KeyError, NotImplementedError) as e:
        # a transformer without the block metadata or attention layers the hook looks for (diffusers' errors vary
        # by hook): the run goes on uncached and the card says why
        log.warning("%s could not engage: %s", METHOD_NAMES[spec.backend], e)
        remove_hook(tr)
        return _refused(spec, f"{type(tr).__name__} does not have what it hooks ({type(e).__name__}: {e})")
    return Engaged(
        "cache", spec.backend, True, _detail(spec, threshold, src, calibrate), _ran(spec, threshold, calibrate)
    )


def _ran(spec: CacheSpec, threshold: float, calibrate: bool) -> str:
    if calibrate:
        return "MagCache_calibrating"
    return spec.label(threshold)


def _detail(spec: CacheSpec, threshold: float, src: str, calibrate: bool) -> str:
    name = METHOD_NAMES[spec.backend]
    if calibrate:
        return f"cache: {name} calibrating (every step computed, its magnitude ratios recorded)"
    if spec.backend == "fbcache":
        return f"cache: diffusers First-Block-Cache R{threshold:g} ({src})"
    detail = f"cache: diffusers {name} {_ran(spec, threshold, calibrate)}"
    if spec.backend == "fastercache":
        detail += " (attention reuse only: its unconditional-branch reuse is not wired)"
    return detail


def state_reader(transformer, backend: str, ratios: dict | None = None):
    """A callable telling whether the hook computed in full on the last call, from its own state (None: it keeps none):
    the library's count beside the studio's. `ratios`: MagCache calibrating, where its ratios are copied by branch
    after every call (the hook clears its own when the pipeline ends)."""
    if backend in _LEADER_HOOK:
        head = _find_hook(transformer, _LEADER_HOOK[backend])
        if head is None:
            return None

        def computed() -> bool:
            s = head.state_manager.get_state()
            if ratios is not None:
                ratios[head.state_manager.context.name] = list(s.calibration_ratios)
            return bool(s.should_compute)

        return computed
    if backend == "taylorseer":
        hook = _find_hook(transformer, _TAYLORSEER_HOOK, last=True)
        if hook is None:
            return None

        def updated() -> bool:
            s = hook.state_manager.get_state()
            return s.last_update_step == s.current_step

        return updated
    return None


def _find_hook(transformer, name: str, last: bool = False):
    found = None
    for m in transformer.modules():
        registry = getattr(m, "_diffusers_hook", None)
        if registry is not None and registry.get_hook(name) is not None:
            found = registry.get_hook(name)
            if not last:
                return found
    return found


def _unpatch_cache_dit(transformer) -> None:
    """Undo what cache-dit leaves after `disable_cache` (docs/library-behaviour.md C17): its re-registered block lists
    (diffusers' hooks would take the wrong first block as the head) go back to the loaded order, and its patched
    instance forwards are removed (cache-dit patches again on its next `enable_cache`)."""
    loaded = stack_state(transformer).step_cache.children
    if loaded and tuple(transformer._modules) != loaded:
        mods = transformer._modules  # a plain dict in torch 2.13: re-inserted in the loaded order
        order = [k for k in loaded if k in mods] + [k for k in mods if k not in loaded]
        children = [(k, mods.pop(k)) for k in order]
        mods.update(children)
    if getattr(transformer, "_is_patched", False):
        for m in transformer.modules():
            if _is_cache_dit_forward(vars(m).get("forward")):
                del m.forward  # only cache-dit's: another library's instance forward (accelerate's offload) stays
        transformer._is_patched = False


def _is_cache_dit_forward(forward) -> bool:
    fn = getattr(forward, "__func__", forward)
    return forward is not None and getattr(fn, "__module__", "").startswith("cache_dit.")


def remove_hook(transformer) -> None:
    """Take a hook off the transformer (after a failed enable, or before another cache)."""
    try:
        transformer.disable_cache()
    except (ValueError, AttributeError) as e:  # nothing was enabled: nothing to take off
        log.debug("disable_cache: %s", e)
