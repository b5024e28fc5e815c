"""MagCache's calibration: this model's per-step residual magnitude ratios, measured by diffusers' MagCache hook in
calibration mode and written into a preset with the transformer they belong to (`calibrated_for`): diffusers ships
ratios for FLUX.1-dev alone, and another model's ratios skip the wrong steps while the timings look fine."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from studio.engine.cache import hook_calibrating, remove_cache
from studio.engine.call import call_pipe, true_cfg
from studio.engine.hooks import fingerprint
from studio.engine.state import stack_state
from studio.spec.checks import fail
from studio.spec.errors import Invariant
from studio.spec.preset import CacheSpec, CompileSpec, Preset
from studio.spec.request import GenerationRequest


@dataclass(frozen=True)
class Calibration:
    """MagCache's ratios for one model at one step count: the mean over the prompts, step by step."""

    ratios: tuple[float, ...]
    calibrated_for: str  # engine.hooks.fingerprint of the transformer
    steps: int
    prompts: int
    spread: float  # the largest difference between two prompts' ratios at one step

    def preset(self, preset: Preset, description: str) -> Preset:
        """`preset` with these ratios written into its MagCache options."""
        opts = dict(preset.cache_config.options)
        opts.update(mag_ratios=tuple(round(r, 4) for r in self.ratios), calibrated_for=self.calibrated_for)
        cache = replace(preset.cache_config, options=tuple(sorted(opts.items())))
        return replace(preset, cache_config=cache, description=description)

    def as_dict(self) -> dict:
        return {
            "ratios": list(self.ratios),
            "calibrated_for": self.calibrated_for,
            "steps": self.steps,
            "prompts": self.prompts,
            "spread": self.spread,
        }


def calibrate_magcache(runner, requests: list[GenerationRequest], preset: Preset, model=None) -> Calibration:
    """MagCache's ratios over `requests` (one step count), calibrating on `preset`'s stack with compile off."""
    if preset.cache_config.backend != "magcache":
        fail("calibrate", "preset", preset.name, "give a preset whose cache_config.backend is magcache")
    steps = {r.executed_steps for r in requests}
    if len(steps) != 1:
        fail("calibrate", "steps", sorted(steps), "calibrate at one step count (MagCache's ratios are per step)")
    plain = replace(preset, name=f"{preset.name}.calibrating", cache_config=CacheSpec(), compile=CompileSpec())
    per_prompt = []
    with runner.manager.lock:
        for req in requests:
            sep = true_cfg(runner.manager.ensure(model or runner.model).pipe, req)
            pipe, _, _ = runner.manager.pipeline(
                model or runner.model, plain, steps=req.executed_steps, separate_cfg=sep
            )
            try:
                hook_calibrating(pipe, preset.cache_config, req.executed_steps)
                call_pipe(pipe, req)
                ratios = dict(stack_state(pipe.transformer).step_cache.ratios or {})
            finally:
                remove_cache(pipe)
            cond = ratios.get("cond") or ratios.get("inference") or []
            if len(cond) != req.executed_steps:
                raise Invariant(f"MagCache recorded {len(cond)} ratios over {req.executed_steps} steps")
            per_prompt.append(cond)
        here = fingerprint(pipe.transformer)
    mean = tuple(statistics.fmean(col) for col in zip(*per_prompt))
    spread = max(max(col) - min(col) for col in zip(*per_prompt))
    return Calibration(mean, here, steps.pop(), len(requests), spread)
