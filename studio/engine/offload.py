"""The memory regime of a preset (`offload_config`): where the weights live between uses. Second in the stack: after
quantization, so the final weights move; before the step cache, which must wrap the regime, not the other way round
(a regime change takes the cache off first and puts it back after: engine.stack)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from studio.engine.compile import apply_compile, uncompile
from studio.engine.placement import (
    HOST,
    decide,
    device_bytes,
    free_memory,
    is_text_encoder,
    margin_bytes,
    pin_reason,
    place,
)
from studio.engine.sizes import sizes_of_pipe
from studio.engine.state import Engaged, stack_state
from studio.engine.streams import STREAMING, module_bytes, new_log, tally_block, tally_group, tally_prefetch
from studio.measure.blocks import block_names
from studio.spec.offload import OffloadSpec, regime_name
from studio.spec.preset import CompileSpec

# diffusers hooks/group_offloading.py: _GROUP_OFFLOADING, _LAYER_EXECUTION_TRACKER, _LAZY_PREFETCH_GROUP_OFFLOADING
GROUP_HOOKS = ("group_offloading", "layer_execution_tracker", "lazy_prefetch_group_offloading")


def _model_offloaded(pipe) -> bool:
    return any(isinstance(c, torch.nn.Module) and hasattr(c, "_hf_hook") for c in pipe.components.values())


def _groups(tr) -> list:
    """diffusers' ModuleGroups on `tr` (the unmatched rest of the transformer first, then the block groups)."""
    out = {}
    for m in tr.modules():
        registry = getattr(m, "_diffusers_hook", None)
        hook = registry.get_hook(GROUP_HOOKS[0]) if registry is not None else None
        if hook is not None:
            out.setdefault(id(hook.group), hook.group)
    return list(out.values())


def placed_for(transformer, device) -> None:
    """Record that `transformer`'s pipeline computes on `device`, wherever its weights wait."""
    stack_state(transformer).offloading.run_device = str(device)


def run_device(pipe) -> torch.device:
    """The device the pipeline computes on: the one it was placed for, else where its weights say."""
    state = stack_state(pipe.transformer)
    if state.offloading.run_device is not None:
        return torch.device(state.offloading.run_device)
    if state.offloading.key is not None and state.offloading.regime != "none":
        return torch.device(state.offloading.key[1])
    offloaded_to = getattr(pipe, "_offload_device", None)  # accelerate's model offload (a task pipe shares hooks)
    if offloaded_to is not None and _model_offloaded(pipe):
        return torch.device(offloaded_to)
    return next(pipe.transformer.parameters()).device


def remove_offload(pipe, device) -> None:
    """Take off whatever regime is on and leave the weights it moved on `device` (the host, when the next regime
    streams). The step cache must be off already."""
    from cache_dit.offload import get_layerwise_offload_handles, remove_layerwise_offload
    from diffusers.hooks import HookRegistry

    tr = pipe.transformer
    state = stack_state(tr)
    if state.offloading.stream is not None:
        for h in state.offloading.stream.handles:
            h.remove()
    moved = False
    if _groups(tr):
        registry = HookRegistry.check_if_exists_or_initialize(tr)
        for name in GROUP_HOOKS:
            registry.remove_hook(name, recurse=True)
        moved = True
    if get_layerwise_offload_handles(tr):
        remove_layerwise_offload(tr, offload=False)
        moved = True
    if moved:
        tr.to(device)  # (diffusers' ModelMixin.to is a no-op while group hooks are on: they are off now)
    if _model_offloaded(pipe):
        pipe.remove_all_hooks()
        pipe.to(device)
    for h in state.offloading.encoder_hooks:
        h.remove()
    encoders = _encoders(pipe).values()
    hooked = [_unhook(enc) for enc in encoders]  # whichever transformer's regime set them (another weight set's too)
    if state.offloading.encoders_by_use or any(hooked):
        for enc in encoders:
            enc.to(device)
    state.offloading.reset()  # (the stream's counting hooks are off above; the loader's run device stays)


def offload_changed(pipe, spec: OffloadSpec, device, budget: float | None = None, size=None) -> bool:
    """Whether `spec` must be (re)applied: another spec or device, `auto` deciding another regime for the request's
    `size` (a larger picture's activations), or a pipeline setting (the VAE's, accelerate's hooks) that another
    transformer variant's stack changed since."""
    state = stack_state(pipe.transformer)
    if state.offloading.key is None or state.offloading.key[:2] != (spec, str(device)):
        return True
    if spec.policy == "auto" and size is not None:
        policy, by_use, _ = _auto(pipe, spec, device, budget, size)
        if regime_name(policy, by_use) != state.offloading.key[2]:
            return True
    vae = getattr(pipe, "vae", None)
    if vae is not None and _vae_flags(vae, spec) != (
        getattr(vae, "use_tiling", False),
        getattr(vae, "use_slicing", False),
    ):
        return True
    return (state.offloading.regime == "model_cpu_offload") != _model_offloaded(pipe)


def rewraps_with_cache(pipe) -> bool:
    """Whether a change of the step cache must re-apply the regime too: cache-dit's disable_cache puts back the
    forward it wrapped, which under accelerate's model offload is the one without accelerate's hook."""
    return stack_state(pipe.transformer).offloading.regime == "model_cpu_offload"


def _vae_flags(vae, spec: OffloadSpec) -> tuple[bool, bool]:
    return (spec.vae_tiling and hasattr(vae, "use_tiling"), spec.vae_slicing and hasattr(vae, "use_slicing"))


def _apply_vae(pipe, spec: OffloadSpec) -> tuple[bool, list[str]]:
    """diffusers' VAE switches, on or off as `spec` says; (every asked switch engaged, lines)."""
    vae = getattr(pipe, "vae", None)
    ok, notes = True, []
    for name, on in (("tiling", spec.vae_tiling), ("slicing", spec.vae_slicing)):
        if vae is None or not hasattr(vae, f"use_{name}"):
            ok = ok and not on
            if on:
                notes.append(f"vae_{name}: {type(vae).__name__} has no {name}, decoding whole")
            continue
        getattr(vae, f"enable_{name}" if on else f"disable_{name}")()
        if on and name == "tiling":
            notes.append(f"vae: tiled decode (only images over {vae.tile_sample_min_size} px a side are tiled)")
        elif on:
            notes.append("vae: sliced decode (a batch decodes one picture at a time; one picture decodes whole)")
    return ok, notes


def _root_hooks_at_call(tr) -> list:
    """Run diffusers' hooks on the transformer itself from the module call, not its `forward`: cache-dit's FLUX
    adapter replaces that forward with its own copy, dropping them (the rest was never onloaded). The handles."""
    registry = getattr(tr, "_diffusers_hook", None)
    if registry is None or not registry._hook_order:
        return []
    first = registry._fn_refs[0].forward  # the forward diffusers wrapped
    if getattr(first, "__func__", None) is type(tr).forward:
        tr.__dict__.pop("forward", None)
    else:
        tr.forward = first

    def pre(module, args, kwargs):
        for name in reversed(list(registry._hook_order)):  # the last registered is the outermost
            args, kwargs = registry.hooks[name].pre_forward(module, *args, **kwargs)
        return tuple(args), kwargs

    def post(module, args, kwargs, output):
        fwd = module.__dict__.get("forward")
        for name in list(registry._hook_order):
            output = registry.hooks[name].post_forward(module, output)
        # the stream tracer removes itself after the first call, and its remove_hook puts back the forward it
        # wrapped, over whatever forward runs now (cache-dit's): keep the one that ran
        module.__dict__.pop("forward", None)
        if fwd is not None:
            module.forward = fwd
        return output

    return [
        tr.register_forward_pre_hook(pre, with_kwargs=True, prepend=True),
        tr.register_forward_hook(post, with_kwargs=True, always_call=True),
    ]


def _group(pipe, spec: OffloadSpec, device: torch.device) -> tuple[bool, str]:
    from diffusers.hooks import apply_group_offloading

    tr, cuda = pipe.transformer, device.type == "cuda"
    stream = spec.use_stream and cuda
    apply_group_offloading(
        tr,
        onload_device=device,
        offload_device=torch.device("cpu"),
        offload_type="block_level",
        num_blocks_per_group=spec.num_blocks_per_group,
        use_stream=stream,
    )
    at_call = _root_hooks_at_call(tr)
    groups = _groups(tr)
    # (the rest's group lists its modules and, again, their parameters: diffusers moves each once for real)
    log = new_log(tr, {id(g): module_bytes(*g.modules, extra=g.parameters + g.buffers) for g in groups})
    stack_state(tr).offloading.stream = log
    log.handles += at_call
    for g in groups:
        tally_group(log, g)
    per = 1 if stream else spec.num_blocks_per_group  # diffusers: "streams are only supported for 1 block a group"
    n = sum(g.offload_leader is not tr for g in groups)  # (the rest of the transformer is the group led by tr)
    notes = [f"{n} groups of {per} block(s) + the rest of the transformer, cpu <-> {device}"]
    if stream:
        notes.append("prefetch on a CUDA stream (the order traced on the first call)")
        if spec.num_blocks_per_group != 1:
            notes.append(f"num_blocks_per_group {spec.num_blocks_per_group} -> 1: diffusers' streams take one")
    elif spec.use_stream:
        notes.append(f"use_stream off: CUDA streams only, on {device.type} each group onloads when it runs")
    return True, _engaged_text("group_offload (diffusers block_level", notes, device)


def _engaged_text(head: str, notes: list[str], device: torch.device) -> str:
    if device.type == "cpu":
        notes = notes + [
            "onload and offload device are both the cpu: nothing crosses a bus (the hooks run as on a GPU)"
        ]
    return f"{head}: " + "; ".join(notes) + ")"


def _layerwise(pipe, spec: OffloadSpec, device: torch.device) -> tuple[bool, str]:
    from cache_dit.offload import layerwise_offload

    why = pin_reason()
    if why is not None:
        return False, f"layerwise_offload: needs pinned host memory, which needs an accelerator ({why})"
    tr = pipe.transformer
    names = block_names(tr)
    blocks = [tr.get_submodule(n) for n in names]
    asyncly = spec.async_transfer and device.type == "cuda"
    # Without a budget cache-dit's async prefetch fills its window with every later block (prefetch_limit off: no
    # target cap): transfer_buckets blocks' bytes is the window the spec means.
    budget = spec.transfer_buckets * max(module_bytes(b) for b in blocks) if asyncly else None
    handle = layerwise_offload(
        tr,
        module_names=names,
        onload_device=device,
        offload_device="cpu",
        async_transfer=asyncly,
        transfer_buckets=spec.transfer_buckets,
        max_inflight_prefetch_bytes=budget,
    )
    log = new_log(tr, {id(b): module_bytes(b) for b in blocks})
    stack_state(tr).offloading.stream = log
    for b in blocks:
        tally_block(log, b)
    if asyncly:
        tally_prefetch(log, handle)
    notes = [f"{len(blocks)} blocks, cpu <-> {device}, the rest of the transformer resident"]
    if asyncly:
        notes.append(f"{spec.transfer_buckets} block(s) prefetched ahead on copy streams")
    elif spec.async_transfer:
        notes.append(f"async_transfer off: copy streams are CUDA only, on {device.type} each block onloads as it runs")
    return True, _engaged_text("layerwise_offload (cache-dit", notes, device)


def _model_offload(pipe, spec: OffloadSpec, device: torch.device) -> tuple[bool, str]:
    if device.type != "cuda":
        return False, f"model_cpu_offload: needs a CUDA device (this run is on {device.type})"
    pipe.enable_model_cpu_offload(device=device)
    return (
        True,
        f"model_cpu_offload (diffusers: each component moves to {device} for its turn, {pipe.model_cpu_offload_seq})",
    )


def _margin(pipe, device: torch.device | None, size=None, sizes=None) -> tuple[int, str]:
    elem = next(pipe.transformer.parameters()).element_size()
    where = device or torch.device("cuda")
    return margin_bytes(sizes or sizes_of_pipe(pipe), getattr(pipe, "name_or_path", None), elem, where, size)


def _auto(pipe, spec: OffloadSpec, device: torch.device, budget: float | None, size=None) -> tuple[str, bool, str]:
    """`auto`'s policy, whether the text encoders wait on the host, and why (engine.placement.decide) for a request
    of `size` (None: the model's default), the pipeline's own device bytes counted free: it is the one being placed.
    Nothing fitting: the least hungry, saying so."""
    free = free_memory(device, 0, device_bytes(pipe, device), budget)
    sizes = sizes_of_pipe(pipe)
    plan = decide(sizes, spec, device, free, _margin(pipe, device, size, sizes))
    return plan.policy, plan.encoders_by_use, (plan.why if plan.fits else f"{plan.why}, may not fit")


def _encoders(pipe) -> dict:
    return {n: c for n, c in pipe.components.items() if is_text_encoder(n) and isinstance(c, torch.nn.Module)}


BY_USE_HOOK = "_studio_by_use"  # an encoder's own attribute holding its by-use hook (the encoders outlive weight sets)


def _unhook(enc) -> bool:
    """Remove `enc`'s by-use hook (one an encoder, whichever weight set's regime set it); whether it had one."""
    old = enc.__dict__.pop(BY_USE_HOOK, None)
    if old is not None:
        old.remove()
    return old is not None


def encoders_by_use(pipe, device: torch.device) -> str:
    """The text encoders on the host, each coming to `device` when it is called (the prompt) and all leaving when
    the transformer is first called (the denoising): torch hooks, not accelerate's (whose `_hf_hook` would read as
    model offload). The pipeline makes the prompt's tokens on its execution device (its VAE's, resident): the
    encoders meet them there."""
    state = stack_state(pipe.transformer).offloading
    named = _encoders(pipe)
    encoders = list(named.values())

    def onload(module, args):
        state.encoder_turns += 1
        if next(module.parameters()).device != device:
            module.to(device)

    def offload(module, args):
        for enc in encoders:
            if next(enc.parameters()).device != HOST:
                enc.to(HOST)

    for enc in encoders:
        enc.to(HOST)
        _unhook(enc)
        enc.__dict__[BY_USE_HOOK] = enc.register_forward_pre_hook(onload)
    state.encoder_hooks.append(pipe.transformer.register_forward_pre_hook(offload))
    state.encoders_by_use = True
    return f"{', '.join(named)} on the host, on {device} only while they encode the prompt (by use)"


_POLICIES = {"group_offload": _group, "layerwise_offload": _layerwise, "model_cpu_offload": _model_offload}


def apply_offload(pipe, spec: OffloadSpec, device, budget: float | None = None, size=None) -> Engaged:
    """Put `pipe` under the memory regime `spec` on `device`, the step cache off. Weights leaving the device go to the
    host first: a model bigger than the card never passes through a resident state. `budget`: GiB, and `size`: the
    request's, for `auto`."""
    device = torch.device(device)
    auto = _auto(pipe, spec, device, budget, size) if spec.policy == "auto" else None
    policy, by_use, why = auto or (spec.policy, spec.encoders_by_use, "")
    remove_offload(pipe, device if policy == "none" else HOST)
    ok, text = _POLICIES[policy](pipe, spec, device) if policy != "none" else (True, f"none (resident on {device})")
    if policy == "none" and spec.policy == "auto":
        text = "none"
    ran_policy = policy if ok else "none"
    place(pipe, ran_policy, device, by_use)
    if by_use:
        text += "; " + encoders_by_use(pipe, device)
    vae_ok, vae_notes = _apply_vae(pipe, spec)
    state = stack_state(pipe.transformer)
    decided = regime_name(policy, by_use)  # (as decided: offload_changed compares a new size's decision with it)
    state.offloading.regime, state.offloading.key = ran_policy, (spec, str(device), decided)
    head = f"auto: {text} ({why})" if spec.policy == "auto" else text
    if not ok:
        head += "; weights resident"
    if ran_policy in STREAMING:
        others = [n for n, c in pipe.components.items() if isinstance(c, torch.nn.Module) and n != "transformer"]
        head += f"; {', '.join(others)} resident on {device}"
    requested = spec.label() or "none"
    engaged = ok and vae_ok and spec.enabled
    vae = {"vae_tiling": spec.vae_tiling and vae_ok, "vae_slicing": spec.vae_slicing and vae_ok}
    ran = replace(spec, policy=ran_policy, **vae).label()
    return Engaged("offload", requested, engaged, "; ".join(["offload: " + head] + vae_notes), ran)


# torchao int8 weights under group offload with regional compile fail on the first compiled call ("Couldn't swap
# Linear.weight ... weakref", when the group moves back to the CPU); eager, they run.
QUANT_UNDER_GROUP = (
    "torchao's quantized weights under group_offload fail to compile (measured: group offload cannot swap a "
    "Linear.weight that compile holds a weakref to)"
)


def compile_under_offload(
    pipe, spec: CompileSpec, *, cache_engaged: bool, ahead_of_time: Path | None = None
) -> Engaged:
    """apply_compile under the regime on `pipe`: a streaming regime's weight moves are torch.compiler.disable'd, so
    only regional graphs with fullgraph off around them (fullgraph=True fails), never a whole-transformer graph."""
    state = stack_state(pipe.transformer)
    if state.offloading.regime not in STREAMING or not spec.enabled:
        return apply_compile(pipe, spec, cache_engaged=cache_engaged, ahead_of_time=ahead_of_time)
    if not (spec.regional and getattr(pipe.transformer, "_repeated_blocks", None)):
        uncompile(pipe.transformer)
        return Engaged(
            "compile",
            "on",
            False,
            f"compile: skipped, a whole-transformer graph would hold {state.offloading.regime}'s weight moves, which "
            "both libraries keep out of graphs (torch.compiler.disable); set compile.regional: true on a model with "
            "repeated blocks; running eager",
        )
    if state.offloading.regime == "group_offload" and state.quantize.mode != "none":
        uncompile(pipe.transformer)
        return Engaged("compile", "on", False, f"compile: skipped, {QUANT_UNDER_GROUP}; running eager")
    out = apply_compile(pipe, replace(spec, fullgraph=False), cache_engaged=cache_engaged, ahead_of_time=ahead_of_time)
    if out.engaged and spec.fullgraph is not False and not cache_engaged:
        out = replace(
            out, detail=f"{out.detail} (fullgraph off: {state.offloading.regime} moves weights between graphs)"
        )
    return out
