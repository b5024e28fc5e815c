"""The speed stack, in one fixed order: quantize -> offload -> step cache -> attention -> compile -> (parallel).
Quantization swaps weights, so every wrapper sees the final ones; the cache wraps the regime and must exist before
compile traces; the attention backend is read at trace time. A parallel preset hands the whole pipeline to
cache-dit's workers, which apply its cache and attention themselves; the main process runs none of its own stack."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import NamedTuple

from studio.engine.attention import apply_attention
from studio.engine.cache import apply_cache, remove_cache
from studio.engine.compile import compiles, uncompile
from studio.engine.device import profile_here
from studio.engine.offload import apply_offload, compile_under_offload, offload_changed, rewraps_with_cache, run_device
from studio.engine.parallel import apply_parallel, remove_parallel, unavailable_reason, wanted, workers
from studio.engine.quantize import apply_quant
from studio.engine.state import Engaged, ParallelState, stack_state
from studio.spec.devices import DeviceProfile
from studio.spec.hosting import aot_dir
from studio.spec.preset import MIN_CACHE_STEPS, CacheSpec, ParallelSpec, Preset
from studio.spec.settings import Settings

STACK_ORDER = ("quantize", "offload", "cache", "attention", "compile", "parallel")


def cache_key(spec: CacheSpec, quant: str, steps: int | None, separate_cfg: bool = False) -> tuple:
    """What decides the cache's wiring: its spec, the quantization (the threshold default's input), a too-short run,
    the transformer calls a step makes, and the steps (for MagCache's schedule)."""
    sized = steps if spec.backend == "magcache" else None
    return (spec, quant, steps is not None and steps < MIN_CACHE_STEPS, separate_cfg, sized)


class Signature(NamedTuple):
    """What runs in this process: two stacks with the same signature share their warm-up."""

    quant: str
    cache: tuple  # cache_key(...)
    attention: str
    compiled: tuple | None  # the compiled variant's key, None when eager
    offload: tuple = ()  # (the regime that runs, its OffloadSpec): another regime is another warm-up


@dataclass
class AppliedStack:
    """What is on the pipeline now, step by step, and what each step reported."""

    preset: Preset | None = None
    cache: tuple | None = None
    attention: str | None = None
    engaged: dict[str, Engaged] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # the steps (re)applied by the last call, in order
    signature: tuple = ()  # what runs: identifies a stack for warm-up bookkeeping (Signature, or a parallel tuple)
    workers: ParallelState | None = None  # the parallel workers this stack's runs go to, None: this process

    def ran_eagerly(self, engaged: Engaged) -> None:
        """Its compile fell back at run time: what runs now is the eager stack."""
        self.engaged["compile"] = engaged
        if isinstance(self.signature, Signature):
            self.signature = self.signature._replace(compiled=None)

    def lines(self) -> list[str]:
        """What runs, in stack order (steps that fell back are in `fallbacks`)."""
        return [str(self.engaged[k]) for k in STACK_ORDER if k in self.engaged and not self.engaged[k].fell_back]

    def fallbacks(self) -> list[str]:
        """The steps that did not engage as asked, with the reason."""
        return [str(self.engaged[k]) for k in STACK_ORDER if k in self.engaged and self.engaged[k].fell_back]

    def label_parts(self) -> dict[str, str]:
        """What ran, one label token per part, from the engaged records, never the preset (parallel workers': from
        what they were started with)."""
        parts = {k: e.ran for k, e in self.engaged.items()}
        if self.workers is not None:
            cache, asked = self.workers.runs[1], self.workers.runs[2]
            parts["cache"] = cache.label() if cache.enabled else ""
            parts["attention"] = "sdpa" if self.workers.info.get("attention") == "native" else asked
        return parts

    def fell_back_parts(self) -> set[str]:
        """The parts that did not run as asked (a parallel run's attention included)."""
        out = {k for k, e in self.engaged.items() if e.fell_back}
        if self.workers is not None and self.workers.info.get("attention") == "native":
            out |= {"attention"} if self.workers.runs[2] not in ("sdpa", "native") else set()
        return out

    def is_engaged(self, feature: str) -> bool:
        e = self.engaged.get(feature)
        return e is not None and e.engaged


def _parallel(pipe, preset: Preset, steps, separate_cfg, source, settings: Settings) -> AppliedStack | None:
    """A parallel preset's stack (its workers started, or kept when they run the same thing); None: not parallel.
    One that cannot run here comes back without a preset, with the reason."""
    par = preset.parallelism_config
    if par.enabled and par.ray_address is None and settings.ray_address:
        preset = replace(preset, parallelism_config=replace(par, ray_address=settings.ray_address))
    want = wanted(preset, steps, separate_cfg)
    running = workers(pipe)
    if running is not None:
        plain = not (preset.quant.enabled or preset.cache.enabled or preset.compile.enabled)
        if want is None and not (plain and preset.attention_backend == "sdpa"):
            remove_parallel(pipe)  # switching to another stack stops the workers...
        elif want is not None and running.runs != want:
            remove_parallel(pipe)  # ...as do other parallel settings
        # (a plain base run, the comparison beside each parallel run, leaves them up)
    if want is None:
        return None
    par = preset.parallelism_config
    device = run_device(pipe)  # where it computes: after an offload preset the weights wait on the host
    reason = unavailable_reason(par, pipe, device, settings.parallel)
    reason = reason or (None if source else "no model source to load workers from")
    if reason is not None:
        return AppliedStack(
            engaged={
                "parallel": Engaged("parallel", par.label(), False, f"parallel: {reason}; running in one process")
            }
        )
    out = AppliedStack(preset=preset)
    if workers(pipe) is None:
        apply_parallel(pipe, preset, source=source, steps=steps, separate_cfg=separate_cfg, device=device)
        out.order.append("parallel")
    out.workers = workers(pipe)
    out.engaged = {"parallel": out.workers.engaged}
    if preset.compile.enabled:
        out.engaged["compile"] = Engaged(
            "compile", "on", False, "compile: not carried into the parallel workers here, they run eagerly"
        )
    out.signature = ("parallel", out.workers.generation) + out.workers.runs
    return out


def apply_preset(
    pipe,
    preset: Preset,
    *,
    steps: int | None = None,
    separate_cfg: bool = False,
    applied: AppliedStack | None = None,
    source: str | None = None,
    settings: Settings | None = None,
    profile: DeviceProfile | None = None,
    size: tuple[int, int] | None = None,
) -> AppliedStack:
    """Apply `preset` to `pipe` in STACK_ORDER, every device decision from `profile` (None: this machine's).
    Given `applied` (the stack on this same transformer), only steps whose settings changed are re-applied; the
    quantization never changes in place (the model manager hands over the right weights). `separate_cfg`: true CFG,
    two transformer calls a step; `source`: where parallel workers load the model from."""
    settings = settings or Settings()
    profile = profile or profile_here(run_device(pipe))
    par = _parallel(pipe, preset, steps, separate_cfg, source, settings)
    if par is not None and par.preset is not None:
        return par
    if par is not None:  # a parallel preset that cannot run here: its stack in one process, with the reason
        out = apply_preset(
            pipe,
            replace(preset, parallelism_config=ParallelSpec()),
            steps=steps,
            separate_cfg=separate_cfg,
            applied=applied,
            settings=settings,
            profile=profile,
        )
        out.preset = preset
        out.engaged["parallel"] = par.engaged["parallel"]
        return out
    prev = applied or AppliedStack()
    out = AppliedStack(preset=preset, engaged={k: v for k, v in prev.engaged.items() if k != "parallel"})
    repeated = bool(getattr(pipe.transformer, "_repeated_blocks", None))
    compiled = compiles(preset, profile, repeated)  # the 8-bit form follows it
    device = run_device(pipe)
    out.engaged["quantize"] = apply_quant(pipe, preset.quantize_config, profile, device, compiled=compiled)
    if applied is None:
        out.order.append("quantize")
    state = stack_state(pipe.transformer)
    key = cache_key(preset.cache_config, state.quantize.mode, steps, separate_cfg)
    recache = applied is None or key != prev.cache
    # (under accelerate's model offload cache-dit's disable_cache drops accelerate's hook: the regime goes on again)
    budget = settings.device_memory_gb
    regime = recache and rewraps_with_cache(pipe) or offload_changed(pipe, preset.offload_config, device, budget, size)
    changed = regime or recache or preset.attention_backend != prev.attention
    if changed or preset.compile != prev.preset.compile:
        uncompile(pipe.transformer)  # hooks and backends change on eager modules; compile is re-activated last
    if regime or applied is None:
        remove_cache(pipe)  # the cache wraps the regime's forward: off before the regime under it changes
        out.engaged["offload"] = apply_offload(pipe, preset.offload_config, device, budget, size)
        out.order.append("offload")
    if recache or regime:
        out.engaged["cache"] = apply_cache(
            pipe, preset.cache_config, quant=state.quantize.mode, steps=steps, separate_cfg=separate_cfg
        )
        out.order.append("cache")
    out.cache = key
    if applied is None or preset.attention_backend != prev.attention:
        out.engaged["attention"] = apply_attention(pipe, preset.attention_backend, device)
        out.order.append("attention")
    out.attention = preset.attention_backend
    if state.compile.running is None:
        cached = state.step_cache.backend != "none"
        aot = aot_dir(settings.aot_dir) if profile.zerogpu is not None else None  # (its packages' folder)
        out.engaged["compile"] = compile_under_offload(pipe, preset.compile, cache_engaged=cached, ahead_of_time=aot)
        out.order.append("compile")
    compiled = state.compile.running.key if state.compile.running is not None else None
    out.signature = Signature(
        state.quantize.mode, key, preset.attention_backend, compiled, (state.offloading.regime, preset.offload_config)
    )
    return out
