"""LoRA adapters on a request, through diffusers' own `load_lora_weights` / `set_adapters` (peft).

Where they go in the stack: on the weights of the run, after the model manager has put the transformer for the
preset's dtype and quantization in place and applied the preset (quantize, cache, attention, compile), before the
call. Each adapter is loaded once per set of transformer weights and kept (engine.state.StackState.loras), so
switching between LoRAs, scales or none never reloads the base weights: `set_adapters` picks the request's, and a
request without one runs with the adapters disabled (the base weights exactly: tests/test_engine.py).

What is refused, with the reason, rather than run wrong:
- LoRA on quantized weights: an unfused LoRA beside INT8 weights is not what a fused-then-quantized model computes,
  and fusing would change the kept weights for every later request;
- LoRA under torch.compile: switching adapters or scales changes values the compiled graphs guard on (a recompile
  per switch) and diffusers' hot-swap (enable_lora_hotswap before compile) is not wired here yet;
- LoRA on parallel workers (they load the model's own weights).
A step cache composes: the adapters live inside the blocks' Linear layers, which the cache runs or skips whole.
"""

from __future__ import annotations

from studio.engine.state import stack_state
from studio.spec.checks import ConfigError


def check_loras(request, preset) -> None:
    """Refuse a request's LoRAs on a stack they cannot run on, before any model work."""
    if not request.loras:
        return
    why = None
    if preset.quantize_config.enabled:
        why = (
            "quantized weights (an unfused LoRA beside INT8 weights is not the fused model): use a preset without "
            "quantize_config"
        )
    elif preset.compile.enabled:
        why = "torch.compile (each adapter switch would recompile; LoRA hot-swap is not wired yet): set compile off"
    elif preset.wants_workers:
        why = "parallel workers (they load the model's own weights): use a one-process preset"
    if why:
        raise ConfigError(f"request.loras: preset {preset.name!r} runs on {why}")


def apply_loras(pipe, request) -> None:
    """Make `request.loras` the adapters of this run, loading each once per set of weights (the card's lines come
    from `lora_lines`)."""
    loaded = stack_state(pipe.transformer).loras
    for lora in request.loras:
        if lora.path not in loaded:
            name = f"lora{len(loaded)}"
            try:
                pipe.load_lora_weights(lora.path, adapter_name=name)
            except (OSError, ValueError, KeyError, RuntimeError) as e:  # not a LoRA of this model: the request's fault
                first = str(e).splitlines()[0][:200] if str(e) else ""
                raise ConfigError(
                    f"request.loras: {lora.path!r} could not be loaded as a LoRA of {type(pipe.transformer).__name__}"
                    f" ({type(e).__name__}: {first})"
                ) from None
            loaded[lora.path] = name
    if not loaded:
        return
    if not request.loras:
        pipe.disable_lora()
        return
    pipe.enable_lora()
    pipe.set_adapters([loaded[lo.path] for lo in request.loras], adapter_weights=[lo.scale for lo in request.loras])


def lora_lines(request) -> list[str]:
    """The request's adapters, in words (the card's `engaged`)."""
    return [f"lora: {lo.path} at {lo.scale:g} (diffusers load_lora_weights, peft)" for lo in request.loras]
