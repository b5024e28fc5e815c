"""The speed stack, applied in one fixed order.

    quantize -> step cache -> attention backend -> torch.compile

Why this order: quantization swaps Linear weights, so everything that wraps modules (cache hooks, compiled
graphs) must see the final weights; the cache wraps block calls and must exist before compile traces them;
the attention backend is a dispatcher setting read at trace time; compile comes last and uses
fullgraph=False whenever a step cache is engaged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from studio.config import MIN_CACHE_STEPS, CacheSpec, Preset
from studio.optimize.attention import apply_attention
from studio.optimize.cache import apply_cache, engaged_backend, prepare_run, read_report, remove_cache
from studio.optimize.compile import apply_compile, effective_fullgraph
from studio.optimize.engaged import Engaged
from studio.optimize.quantize import apply_quant, quantized_mode
from studio.timing import install_counter

STACK_ORDER = ("quantize", "cache", "attention", "compile")

__all__ = [
    "STACK_ORDER",
    "AppliedStack",
    "Engaged",
    "apply_preset",
    "reload_key",
    "cache_key",
    "apply_attention",
    "apply_cache",
    "apply_compile",
    "apply_quant",
    "remove_cache",
    "prepare_run",
    "read_report",
    "engaged_backend",
    "quantized_mode",
]


def cache_key(spec: CacheSpec, quantized: bool, steps: int | None) -> tuple:
    """What decides the cache's wiring: its spec, the threshold default's input, and whether the run is too short."""
    return (spec, quantized, steps is not None and steps < MIN_CACHE_STEPS)


def reload_key(preset: Preset) -> tuple:
    """What can only change by reloading transformer weights: dtype, quantization, and the compiled graph
    (whose fullgraph depends on whether a cache may be engaged)."""
    c = preset.compile
    compiled = (c, effective_fullgraph(c, preset.cache.enabled)) if c.enabled else None
    return (preset.dtype, preset.quant, compiled)


@dataclass
class AppliedStack:
    """What is on the pipeline now, step by step, and what each step reported."""

    preset: Preset | None = None
    cache: tuple | None = None
    attention: object | None = None
    engaged: dict[str, Engaged] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # the order steps were applied in, last application

    def lines(self) -> list[str]:
        return [str(self.engaged[k]) for k in STACK_ORDER if k in self.engaged]

    def fallbacks(self) -> list[str]:
        return [str(e) for k, e in self.engaged.items() if e.fell_back]


def apply_preset(
    pipe, preset: Preset, *, steps: int | None = None, applied: AppliedStack | None = None
) -> AppliedStack:
    """Apply `preset` to `pipe` in STACK_ORDER. With `applied` (the stack already on this same transformer),
    only steps whose settings changed are re-applied; quantize and compile never change in place (the model
    manager reloads weights for those, then calls this with applied=None)."""
    fresh = applied is None
    prev = applied or AppliedStack()
    out = AppliedStack(preset=preset, engaged=dict(prev.engaged))
    if fresh:
        out.engaged["quantize"] = apply_quant(pipe, preset.quant)
        out.order.append("quantize")
    quantized = quantized_mode(pipe.transformer) != "none"
    key = cache_key(preset.cache, quantized, steps)
    if fresh or key != prev.cache:
        out.engaged["cache"] = apply_cache(pipe, preset.cache, quantized=quantized, steps=steps)
        out.order.append("cache")
    out.cache = key
    if fresh or preset.attention != prev.attention:
        out.engaged["attention"] = apply_attention(pipe, preset.attention)
        out.order.append("attention")
    out.attention = preset.attention
    if fresh:
        install_counter(pipe.transformer)  # step-accounting hooks must exist before compile traces the blocks
        out.engaged["compile"] = apply_compile(
            pipe, preset.compile, cache_engaged=preset.cache.enabled or engaged_backend(pipe) is not None
        )
        out.order.append("compile")
    return out
