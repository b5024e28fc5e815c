"""LoRA adapters on a request, through diffusers' own `load_lora_weights` (peft), hot-swapped into fixed slots
`lora0`, `lora1`, ... padded to one rank with tensor scales, so switching never reloads the base weights and a
compiled block never recompiles. What cannot run right (on quantized weights, on parallel workers, over the slots'
rank, with text-encoder weights) is refused with the reason."""

from __future__ import annotations

import os

from studio.engine.state import stack_state
from studio.spec.checks import ConfigError
from studio.spec.profiles import resolve_lora

RANK_ENV = "STUDIO_LORA_RANK"

_LOAD_ERRORS = (OSError, ValueError, KeyError, RuntimeError, TypeError)


def check_loras(request, preset) -> None:
    """Refuse a request's LoRAs on a stack they cannot run on, before any model work: an unfused LoRA beside INT8
    weights is not what a fused-then-quantized model computes."""
    own = {lo.path for lo in preset.loras}
    if all(lo.path in own for lo in request.loras):  # only the preset's own (fused where the preset quantizes)
        return
    why = None
    if preset.quantize_config.enabled:
        why = (
            "quantized weights (an unfused LoRA beside INT8 weights is not the fused model): name it in the "
            "preset's `loras` (fused before quantization), or use a preset without quantize_config"
        )
    elif preset.wants_workers:
        why = "parallel workers (they load the model's own weights): use a one-process preset"
    if why:
        raise ConfigError(f"request.loras: preset {preset.name!r} runs on {why}")


def _lora_layers(tr):
    from peft.tuners.lora import LoraLayer

    return [m for m in tr.modules() if isinstance(m, LoraLayer)]


def _load(pipe, slot: str, path: str, hotswap: bool, rank: int) -> None:
    try:
        pipe.load_lora_weights(path, adapter_name=slot, hotswap=hotswap)
    except _LOAD_ERRORS as e:  # not a LoRA of this model, or not one a slot can take: the request's fault
        first = str(e).splitlines()[0][:240] if str(e) else ""
        into = f", hot-swapped into slot {slot} (slots have rank {rank}: {RANK_ENV})" if hotswap else ""
        raise ConfigError(
            f"request.loras: {path!r} could not be loaded as a LoRA of {type(pipe.transformer).__name__}{into}"
            f" ({type(e).__name__}: {first})"
        ) from None


def _note_unit_scales(tr, slot: str, units: dict) -> None:
    """Each layer's scale of `slot` as just loaded (scale 1), kept: later scales are multiples of it."""
    for m in _lora_layers(tr):
        if slot in m.scaling:
            units[(id(m), slot)] = float(m.scaling[slot])


def _set_scales(tr, scales: dict, units: dict) -> None:
    """Each slot's scale, written into its tensors in place (a compiled graph reads them, no recompile); not peft's
    set_scale, which keeps the first adapter's alpha/rank and writes a float."""
    import torch

    for m in _lora_layers(tr):
        for slot, scale in scales.items():
            if slot not in m.scaling:
                continue
            value = scale * units[(id(m), slot)]
            cur = m.scaling[slot]
            if isinstance(cur, torch.Tensor):
                cur.fill_(value)
            else:
                m.scaling[slot] = torch.tensor(value, device=m.weight.device)


def _check_file(path: str, rank: int) -> None:
    """Refuse, before any load, a local LoRA file a slot cannot take: text-encoder weights (diffusers hot-swaps the
    transformer only), or a rank over the slots' (peft would grow the slot's tensors; a compiled graph recompile)."""
    if not (path.endswith(".safetensors") and os.path.isfile(path)):
        return
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        keys = list(f.keys())
        ranks = [f.get_slice(k).get_shape()[0] for k in keys if "lora_A" in k or "lora_down" in k]
    te = [k for k in keys if k.startswith(("text_encoder", "lora_te"))]
    if te:
        raise ConfigError(
            f"request.loras: {path!r} has text-encoder weights ({te[0]}, ...): only transformer LoRAs run here"
        )
    if ranks and max(ranks) > rank:
        raise ConfigError(
            f"request.loras: {path!r} has rank {max(ranks)}, over the LoRA slots' {rank}: set {RANK_ENV} to at "
            "least that before the first LoRA (the studio's restart)"
        )


def _file(pipe, lora) -> str:
    """What diffusers loads for `lora`: a shipped name resolved against the pipeline's model (refused when the model
    does not ship it); a path or Hub id as given."""
    return resolve_lora(lora, getattr(pipe, "name_or_path", None))


def _reset(pipe, state) -> None:
    """After a failed load (diffusers deletes a slot whose swap failed): every adapter off, the slots start again;
    the modules changed, so the next run warms up again."""
    pipe.unload_lora_weights()
    state.lora.reset()


def _fill(pipe, tr, state, wanted, rank: int) -> bool:
    """Put the i-th wanted LoRA in slot i, hot-swapped where it holds another; True when a slot was added."""
    slots, added = state.lora.slots, False
    for i, lora in enumerate(wanted):
        slot = f"lora{i}"
        if i < len(slots) and slots[i] == lora.path:
            continue
        path = _file(pipe, lora)  # a name the model does not ship: refused here, before any slot changes
        _check_file(path, rank)
        swap = i < len(slots)
        if not slots:  # before the first adapter: pads it to the slots' rank and makes its scales tensors
            pipe.enable_lora_hotswap(target_rank=rank, check_compiled="ignore")
        elif not swap:  # a slot after the first: padded and made tensors too (after prep, new adapters are not)
            tr.enable_lora_hotswap(target_rank=rank, check_compiled="ignore")
        try:
            _load(pipe, slot, path, swap, rank)
        except ConfigError:
            _reset(pipe, state)
            raise
        if swap:
            slots[i] = lora.path
        else:
            slots.append(lora.path)
            added = True
            state.lora.modules += 1
        _note_unit_scales(tr, slot, state.lora.units)
    return added


def apply_loras(pipe, request, rank: int) -> None:
    """Make `request.loras` the adapters of this run; `rank`: every slot's (STUDIO_LORA_RANK). Unused slots sit at
    scale 0 under compile (the same graph); an eager run without LoRA disables them (the base weights exactly)."""
    tr = pipe.transformer
    state = stack_state(tr)
    fused = {lo.path for lo in state.lora.fused}
    wanted = [lo for lo in request.loras if lo.path not in fused]
    if not state.lora.slots and not wanted:
        return
    added = _fill(pipe, tr, state, wanted, rank)
    names = [f"lora{i}" for i in range(len(state.lora.slots))]
    if added:
        pipe.set_adapters(names)  # every slot active, always: the same active list for every graph
    if not wanted and state.compile.running is None:
        pipe.disable_lora()  # eager and no LoRA: the base weights exactly, without the adapters' matmuls
        return
    pipe.enable_lora()
    scales = {n: 0.0 for n in names}
    scales.update({f"lora{i}": lo.scale for i, lo in enumerate(wanted)})
    _set_scales(tr, scales, state.lora.units)


def fuse_loras(pipe, loras: tuple) -> None:
    """Fuse a quantized preset's own `loras` into freshly loaded full-precision weights, before they are quantized."""
    if not loras:
        return
    names = [f"fuse{i}" for i in range(len(loras))]
    for name, lora in zip(names, loras):
        _load(pipe, name, _file(pipe, lora), False, 0)
    pipe.set_adapters(names, adapter_weights=[lo.scale for lo in loras])
    pipe.fuse_lora(adapter_names=names)
    pipe.unload_lora_weights()
    stack_state(pipe.transformer).lora.fused = tuple(loras)


def lora_lines(request, state) -> list[str]:
    """The run's adapters, in words (the card's `engaged`); `state`: the StackState of the transformer that ran."""
    fused = {lo.path for lo in state.lora.fused}
    out = []
    for lo in request.loras:
        how = "fused into the weights before quantization" if lo.path in fused else "hot-swap slot, peft"
        shipped = "shipped with the model; " if lo.is_name else ""
        out.append(f"lora: {lo.path} at {lo.scale:g} ({shipped}diffusers load_lora_weights, {how})")
    idle = len(state.lora.slots) - len([lo for lo in request.loras if lo.path not in fused])
    if idle > 0 and state.compile.running is not None:
        out.append(f"lora: {idle} hot-swap slot(s) held at scale 0 (the compiled graphs keep them: no recompile)")
    return out
