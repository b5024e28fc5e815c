"""torch.compile, last in the stack: regional (the repeated blocks) where the model has them. fullgraph is off under
a step cache (it branches on run-time values and calls torch.compiler.disable()d code). A variant is switched off and
on in place, so base runs the same weights eagerly and the next compiled run finds its graphs again."""

from __future__ import annotations

from pathlib import Path

from studio.engine import aot
from studio.engine.state import CompiledVariant, Engaged, stack_state
from studio.spec.devices import DeviceProfile
from studio.spec.errors import OverTime, is_run_failure
from studio.spec.hosting import ahead_of_time_applies
from studio.spec.preset import CompileSpec

_UNSET = object()  # "forward" was not an instance attribute before compile
# Why a compiled preset runs eagerly on ZeroGPU when its ahead-of-time form cannot serve it (tests/test_space.py)
ZEROGPU_COMPILE = (
    "compile: skipped on ZeroGPU: torch.compile at run time does not survive ZeroGPU's per-call processes, and "
    "ahead-of-time compile is {why}; running eager"
)


def _set(module, attr: str, value) -> None:
    if value is _UNSET:
        module.__dict__.pop(attr, None)
    else:
        setattr(module, attr, value)


def _compile_impls(tr, spec: CompileSpec, kwargs: dict) -> tuple[list, bool]:
    """[(module, attribute, compiled value, eager value)] for the modules that compile, and whether it is whole."""
    import torch

    blocks = getattr(tr, "_repeated_blocks", None) or ()
    if spec.regional and blocks:
        impls = []
        for m in tr.modules():
            if type(m).__name__ in blocks:
                m.compile(**kwargs)  # lazy: the first call traces and compiles (the stack's warm-up run)
                impls.append((m, "_compiled_call_impl", m._compiled_call_impl, None))
        return impls, False
    # Whole model: compile `forward` rather than the module call, so the step counter's hooks (run by the module
    # call) stay outside the graph and keep counting calls and marking the start of the loop.
    eager = tr.__dict__.get("forward", _UNSET)
    return [(tr, "forward", torch.compile(tr.forward, **kwargs), eager)], True


def variant_key(tr, spec: CompileSpec, fullgraph: bool) -> tuple:
    """What identifies a compiled variant; a whole-model one also by the cache (which may patch what it traced)."""
    whole = not (spec.regional and getattr(tr, "_repeated_blocks", None))
    key = (spec.mode, fullgraph, spec.dynamic, spec.regional)
    return key + (stack_state(tr).step_cache.backend,) if whole else key


def first_run_or_eager(tr, stack, run):
    """`run()`, the warm-up of `stack`; when it fails compiled, the same run eagerly decides whose failure it was.
    Eager passes: compile's, so the variant is dropped for this process and `stack` says it runs eagerly. Eager
    fails too: not compile's, so the variant is switched back on and the first error raised."""
    try:
        return run()
    except OverTime:  # the request's time limit, between two steps: not compile's failure
        raise
    except Exception as error:  # re-raised below unless the eager run shows it was compile's
        state = stack_state(tr)
        variant = state.compile.running
        if variant is None or not is_run_failure(error):  # a bug of the studio's (a KeyError in aot) is not compile's
            raise
        uncompile(tr)
        try:
            out = run()
        except Exception:
            _switch_on(tr, variant)
            raise error from None
        reason = f"{type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}"
        state.compile.failed[variant.key] = reason
        state.compile.variants.pop(variant.key, None)
        stack.ran_eagerly(failed_to_compile(reason))
        return out


def failed_to_compile(reason: str) -> Engaged:
    return Engaged("compile", "on", False, f"compile: failed on its first run ({reason}), running eager")


def uncompile(tr) -> None:
    """Run eagerly from now on; the compiled variant stays saved for the next time it is asked for."""
    state = stack_state(tr)
    if state.compile.running is not None:
        for module, attr, _, eager in state.compile.running.impls:
            _set(module, attr, eager)
        state.compile.running = None
    state.counter.see_blocks(True)


# Every block instance, variant, shape and reload is one more Dynamo cache entry for the same code object; past the
# default limit (8) Dynamo silently runs eagerly (or fails under fullgraph). Room for a studio, but a graph that
# recompiles on every call is still cut off in time.
RECOMPILE_LIMIT = 64


def int8pack_risks(tr) -> list[str]:
    """The INT8 Linear layers whose matmul Inductor would hand to the CPU kernel that crashes on them."""
    if stack_state(tr).quantize.mode != "int8_weight_only":  # dynamic-activation forms go to _int_mm, not int8pack
        return []

    from studio.engine.int8pack import at_risk_layers  # (heavy: it imports torch._inductor, +1.5 s at start)

    return at_risk_layers(tr)


def _guard_note(risky: list[str]) -> str:
    if not risky:
        return ""
    return (
        f"; {len(risky)} INT8 Linear layers with in_features not a multiple of 16 (e.g. {risky[0]}) lowered "
        "without aten._weight_int8pack_mm, whose CPU kernel crashes on them (docs/known-crashes.md)"
    )


def _activate(tr, spec: CompileSpec, fullgraph: bool, guard: bool) -> CompiledVariant:
    import torch._dynamo.config as dynamo_config

    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, RECOMPILE_LIMIT)
    dynamo_config.accumulated_recompile_limit = max(dynamo_config.accumulated_recompile_limit, 4 * RECOMPILE_LIMIT)
    state = stack_state(tr)
    state.counter.see_blocks(False)  # before any graph is traced or switched back on
    key = variant_key(tr, spec, fullgraph)
    variant = state.compile.variants.get(key)
    if variant is None:
        kwargs = {
            "fullgraph": fullgraph,
            "mode": None if spec.mode == "default" else spec.mode,
            "dynamic": spec.dynamic,
        }
        if guard:  # the pass goes in as a compile option (torch.compile takes a mode or options, not both)
            from studio.engine.int8pack import compile_options  # (heavy: torch._inductor)

            kwargs.update(mode=None, options=compile_options(spec.mode))
        impls, whole = _compile_impls(tr, spec, kwargs)
        how = "whole transformer" if whole else f"regional ({', '.join(tr._repeated_blocks)})"
        variant = CompiledVariant(key, fullgraph, whole, how, impls)
        state.compile.variants[variant.key] = variant
    _switch_on(tr, variant)  # (a new regional variant already is)
    return variant


def _ahead_of_time(tr, spec: CompileSpec, folder: Path) -> Engaged:
    """The stack's compile where run-time graphs do not survive (ZeroGPU): its ahead-of-time form (engine.aot)."""
    why = aot.refusal(tr, spec)
    if why is not None:
        return Engaged("compile", "on", False, ZEROGPU_COMPILE.format(why=why))
    state, key = stack_state(tr), aot.variant_key(tr, spec)
    if key in state.compile.failed:
        return failed_to_compile(state.compile.failed[key])
    variant = state.compile.variants.get(key)
    if variant is None:
        variant = state.compile.variants[key] = aot.aot_variant(tr, spec, folder)
    _switch_on(tr, variant)
    return aot.engaged(variant)


def after_loras(tr, stack) -> None:
    """Under a request's LoRAs (loaded after the stack) an ahead-of-time variant cannot serve: run eagerly, say why."""
    state = stack_state(tr)
    if isinstance(state.compile.running, aot.AotVariant) and (state.lora.slots or state.lora.fused):
        uncompile(tr)
        stack.ran_eagerly(Engaged("compile", "on", False, ZEROGPU_COMPILE.format(why=aot.NO_LORA)))


def finish_first_run(tr) -> None:
    """After a stack's warm-up run: build what its compiled form builds from it (engine.aot), inside that run so
    first_run_or_eager catches a failure."""
    state = stack_state(tr)
    if state.compile.running is not None:
        state.compile.running.finish()


def _switch_on(tr, variant: CompiledVariant) -> None:
    for module, attr, compiled, _ in variant.impls:
        _set(module, attr, compiled)
    variant.switched_on()
    state = stack_state(tr)
    state.counter.see_blocks(False)
    state.compile.running = variant  # counts now come from the cache backend's own record


def compiles(preset, profile: DeviceProfile, repeated: bool = True) -> bool:
    """Whether `preset`'s stack runs compiled on `profile` (its 8-bit form follows: a dynamic-activation form run
    eagerly is slower than full precision): on ZeroGPU ahead of time where nothing refuses it (spec.hosting.
    aot_refusal); elsewhere not under group offload (QUANT_UNDER_GROUP), nor as one whole-transformer graph under a
    step cache (apply_compile skips that). `repeated`: the transformer names repeated blocks."""
    spec = preset.compile
    if profile.zerogpu is not None:
        return ahead_of_time_applies(preset, repeated)
    if preset.cache.enabled and not (spec.regional and repeated):
        return False
    return spec.enabled and getattr(preset.offload_config, "policy", "none") != "group_offload"


def apply_compile(pipe, spec: CompileSpec, *, cache_engaged: bool, ahead_of_time: Path | None = None) -> Engaged:
    """Compile (or switch back on) the transformer as `spec` asks, or off. `ahead_of_time`: the packages' folder where
    compile is ahead of time (ZeroGPU); None: at run time."""
    tr = pipe.transformer
    uncompile(tr)
    if not spec.enabled:
        return Engaged("compile", "off", False, "compile: off (eager)")
    if ahead_of_time is not None:
        return _ahead_of_time(tr, spec, ahead_of_time)
    whole = not (spec.regional and getattr(tr, "_repeated_blocks", None))
    if whole and cache_engaged:
        # cache-dit under a whole-transformer graph caches nothing (0 of 28 steps, measured) while its config says
        # DBCache: only regional compile keeps the cache's decisions outside the graphs.
        why = (
            "set compile.regional: true"
            if not spec.regional
            else f"{type(tr).__name__} has no _repeated_blocks for regional compile"
        )
        return Engaged(
            "compile",
            "on",
            False,
            f"compile: skipped, a whole-transformer graph bypasses the step cache (measured: nothing cached); {why}; "
            "running eager",
        )
    fullgraph = spec.effective_fullgraph(cache_engaged)
    failed = stack_state(tr).compile.failed.get(variant_key(tr, spec, fullgraph))
    if failed:
        return failed_to_compile(failed)
    note = " (fullgraph off: a step cache is engaged)" if cache_engaged and spec.fullgraph is not False else ""
    risky = int8pack_risks(tr)
    variant = _activate(tr, spec, fullgraph, guard=bool(risky))
    how = f"compile: {variant.how}, fullgraph={fullgraph}, mode={spec.mode}{note}{_guard_note(risky)}"
    return Engaged("compile", "on", True, how, "compile")
