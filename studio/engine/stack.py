"""The speed stack, applied in one fixed order.

    quantize -> step cache -> attention backend -> torch.compile

Why this order: quantization swaps Linear weights, so everything that wraps modules (cache hooks, compiled
graphs) must see the final weights; the cache wraps block calls and must exist before compile traces them;
the attention backend is a dispatcher setting read at trace time; compile comes last and uses
fullgraph=False whenever a step cache is engaged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from studio.engine.attention import apply_attention
from studio.engine.cache import apply_cache
from studio.engine.compile import apply_compile, uncompile
from studio.engine.quantize import apply_quant
from studio.engine.state import Engaged, stack_state
from studio.spec.preset import MIN_CACHE_STEPS, CacheSpec, Preset

STACK_ORDER = ("quantize", "cache", "attention", "compile")


def cache_key(spec: CacheSpec, quantized: bool, steps: int | None, separate_cfg: bool = False) -> tuple:
    """What decides the cache's wiring: its spec, the threshold default's input, whether the run is too short,
    and how many transformer calls a step makes."""
    return (spec, quantized, steps is not None and steps < MIN_CACHE_STEPS, separate_cfg)


@dataclass
class AppliedStack:
    """What is on the pipeline now, step by step, and what each step reported."""

    preset: Preset | None = None
    cache: tuple | None = None
    attention: str | None = None
    engaged: dict[str, Engaged] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # the steps (re)applied by the last call, in order
    signature: tuple = ()  # what runs: identifies a stack for warm-up bookkeeping

    def lines(self) -> list[str]:
        """What runs, step by step in stack order (steps that fell back are in `fallbacks`)."""
        return [str(self.engaged[k]) for k in STACK_ORDER if k in self.engaged and not self.engaged[k].fell_back]

    def fallbacks(self) -> list[str]:
        """The steps that did not engage as asked, with the reason."""
        return [str(self.engaged[k]) for k in STACK_ORDER if k in self.engaged and self.engaged[k].fell_back]

    def is_engaged(self, feature: str) -> bool:
        e = self.engaged.get(feature)
        return e is not None and e.engaged


def apply_preset(
    pipe,
    preset: Preset,
    *,
    steps: int | None = None,
    separate_cfg: bool = False,
    applied: AppliedStack | None = None,
) -> AppliedStack:
    """Apply `preset` to `pipe` in STACK_ORDER.

    Args:
        steps: the coming run's step count (a run too short to gain runs uncached; step masks are sized by it).
        separate_cfg: the coming run calls the transformer twice per step (true CFG); the cache is wired for it.
        applied: the stack already on this same transformer; only steps whose settings changed are re-applied.
            Quantization never changes in place: the model manager hands over a transformer with the right weights.
    """
    prev = applied or AppliedStack()
    out = AppliedStack(preset=preset, engaged=dict(prev.engaged))
    out.engaged["quantize"] = apply_quant(pipe, preset.quantize_config)
    if applied is None:
        out.order.append("quantize")
    state = stack_state(pipe.transformer)
    quantized = state.quant != "none"
    key = cache_key(preset.cache_config, quantized, steps, separate_cfg)
    changed = applied is None or key != prev.cache or preset.attention_backend != prev.attention
    if changed or preset.compile != prev.preset.compile:
        uncompile(pipe.transformer)  # hooks and backends change on eager modules; compile is re-activated last
    if applied is None or key != prev.cache:
        out.engaged["cache"] = apply_cache(
            pipe, preset.cache_config, quantized=quantized, steps=steps, separate_cfg=separate_cfg
        )
        out.order.append("cache")
    out.cache = key
    if applied is None or preset.attention_backend != prev.attention:
        out.engaged["attention"] = apply_attention(pipe, preset.attention_backend)
        out.order.append("attention")
    out.attention = preset.attention_backend
    if state.compiled is None:
        out.engaged["compile"] = apply_compile(pipe, preset.compile, cache_engaged=state.cache != "none")
        out.order.append("compile")
    compiled = state.compiled.key if state.compiled is not None else None
    out.signature = (state.quant, key, preset.attention_backend, compiled)
    return out
