"""Where a pipeline's components live, decided from their sizes against the device's free memory BEFORE anything is
placed (or, from its files, loaded). One decision on every device: on a CPU with a budget (STUDIO_DEVICE_MEMORY_GB)
the accounting is logical, so the same `decide` places the model as on a card that size (testable on a CPU).
The loader, `auto` and the refusals all read `needs`, so a refusal before loading and a choice after agree."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from studio.engine.sizes import ModelSizes
from studio.engine.streams import tensor_bytes
from studio.measure.blocks import block_names
from studio.spec.devices import DeviceProfile
from studio.spec.offload import AUTO_CANDIDATES, BY_USE, OffloadSpec, regime_name
from studio.spec.profiles import profile_for

GIB = 2**30
HOST = torch.device("cpu")
BUDGET_ENV = "STUDIO_DEVICE_MEMORY_GB"
# Where the model's configs cannot be read: the peak over the weights of a FLUX-size pipeline at 1024x1024 (its VAE
# decode: 128-512-channel feature maps at full resolution, two or three alive in one conv) plus the CUDA allocator's
# slack (engine.offload keeps the name: ACTIVATION_MARGIN).
FALLBACK_MARGIN = 4 * GIB
# What the CUDA caching allocator and cuDNN's conv workspaces hold beyond the tensors alive (an estimate; the
# measured peak on the card, studio.measure.memory, is the way to tighten it). Nothing of it on a CPU budget.
CUDA_SLACK = GIB
# What a process's CUDA context takes of a card before any tensor (lazy module loading: about 0.3-0.5 GiB): a run's
# `auto` reads torch.cuda.mem_get_info, which has it taken already, so a named profile's plan takes it too.
CUDA_CONTEXT = GIB // 2
VAE_ALIVE = 5  # feature maps of the largest size alive at the VAE decode's peak (activation_bytes)
FIX_NONE = f"use offload_config policy auto or layerwise_offload (or group_offload), or raise {BUDGET_ENV}"


def gib(n: int | None) -> str:
    return "unbounded" if n is None else f"{n / GIB:.3g} GiB"


def activation_bytes(configs: dict, width: int, height: int, text_tokens: int, elem: int) -> int | None:
    """The largest activation peak of one run, in bytes (None: the configs do not say enough): the larger of the VAE
    decode (VAE_ALIVE maps of its largest level; a FLUX VAE at 1024x1024 in bf16: 2.5 GiB, 4.1 maps measured) and
    the transformer (tokens x width x 12 alive: hidden states, q/k/v, attention out, 4x MLP): they never overlap."""
    chans = (configs.get("vae") or {}).get("block_out_channels")
    if not chans:
        return None
    area = width * height
    vae = max(c * area // 4 ** max(0, i - 1) for i, c in enumerate(chans)) * VAE_ALIVE * elem
    tr = configs.get("transformer") or {}
    heads, dim = tr.get("num_attention_heads"), tr.get("attention_head_dim")
    tokens = area // (2 ** (len(chans) - 1) * 2) ** 2 + text_tokens  # VAE scale x 2x2 latent patches
    return max(vae, tokens * heads * dim * 12 * elem if heads and dim else 0)


def margin_bytes(
    sizes: ModelSizes, source: str | None, elem: int, device: torch.device, size: tuple[int, int] | None = None
) -> tuple[int, str]:
    """What `needs` adds to the weights: the activation estimate at the request's `size` (None: the model's default
    size), and how it was made."""
    prof = profile_for(source) if source else None
    w, h = size or ((prof.width, prof.height) if prof else (1024, 1024))
    act = activation_bytes(sizes.configs, w, h, (prof.max_sequence_length if prof else None) or 512, elem)
    slack = CUDA_SLACK if device.type == "cuda" else 0
    if act is None:
        return FALLBACK_MARGIN, f"activations ~{gib(FALLBACK_MARGIN)} (no VAE config to estimate from)"
    return act + slack, f"activations ~{gib(act)} at {w}x{h}" + (f" + {gib(slack)} allocator slack" if slack else "")


def needs(sizes: ModelSizes, spec: OffloadSpec, margin: int, device: torch.device | None = None) -> dict[str, int]:
    """Device bytes each policy holds at its peak (weights it keeps there + `margin`). A prefetching regime holds the
    next unit beside the running one only on CUDA (`device` None: CUDA); elsewhere each onloads as it runs."""
    cuda = device is None or device.type == "cuda"
    largest = sizes.largest_block
    resident = sizes.total - sizes.block_total  # the encoders, the VAE and the transformer's non-block weights
    ahead = spec.transfer_buckets if spec.async_transfer and cuda else 0
    group = (2 if spec.use_stream and cuda else spec.num_blocks_per_group) * largest
    out = {
        "none": sizes.total + margin,
        "layerwise_offload": resident + (1 + ahead) * largest + margin,
        "group_offload": resident + group + margin,
        "model_cpu_offload": max(sizes.components.values(), default=0) + margin,
    }
    # the text encoders by use: on the device while they encode (the denoising's activations not yet there), on the
    # host while it runs: the peak holds the larger of the two (the allocator's slack is there throughout)
    act = margin - (CUDA_SLACK if cuda and margin > CUDA_SLACK else 0)
    enc = encoder_bytes(sizes)
    out.update({regime_name(p, True): out[p] - min(enc, act) for p in BY_USE})
    return out


def is_text_encoder(name: str) -> bool:
    """A pipeline component placement by use keeps on the host between prompts (`text_encoder`, `_2`, `_3`)."""
    return name.startswith("text_encoder")


BY_USE_WHERE = "host; on the device while it encodes the prompt, back before the denoising (by use)"


def encoder_bytes(sizes: ModelSizes) -> int:
    """The text encoders' bytes (what placement by use keeps on the host between prompts)."""
    return sum(b for n, b in sizes.components.items() if is_text_encoder(n))


def pin_reason() -> str | None:
    """Why host memory cannot be pinned here (cache-dit's layerwise offload pins its CPU copy of every block)."""
    try:
        torch.empty(1).pin_memory()
    except RuntimeError as e:
        return str(e).splitlines()[0]
    return None


def unavailable(policy: str, device: torch.device) -> str | None:
    """Why `policy` cannot run on `device` (None: it can). A CUDA device is an accelerator: pinning works there."""
    if policy == "model_cpu_offload" and device.type != "cuda":
        return f"model_cpu_offload needs a CUDA device (this run is on {device.type})"
    if policy == "layerwise_offload" and device.type != "cuda":
        why = pin_reason()
        return f"layerwise_offload needs pinned host memory, which needs an accelerator ({why})" if why else None
    return None


@dataclass(frozen=True)
class Free:
    bytes: int | None  # None: unbounded (a CPU without a budget)
    source: str  # where the number comes from, in words


def free_memory(device: torch.device, held: int = 0, releasable: int = 0, budget: float | None = None) -> Free:
    """The device memory the studio may still fill: the least of `budget` (GiB; None: none) less `held`, and CUDA's
    free memory plus `releasable` (the pipeline about to be replaced). On a CPU without a budget: unbounded."""
    parts = []
    if budget is not None:
        less = f" less {gib(held)} held by the loaded model" if held else ""
        parts.append((int(budget * GIB) - held, f"{BUDGET_ENV}={budget:g}{less}"))
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        back = f" + {gib(releasable)} of the pipeline being replaced" if releasable else ""
        parts.append((free + releasable, f"free on {device} (torch.cuda.mem_get_info){back}"))
    if not parts:
        return Free(None, f"{device.type}: no device-memory budget ({BUDGET_ENV} unset)")
    return Free(*min(parts))


def free_on(profile: DeviceProfile, device, held: int = 0, releasable: int = 0, budget: float | None = None) -> Free:
    """The device memory the studio may fill on `profile`: this machine's, or a named profile's (a ZeroGPU slice,
    whose whole card torch reports, or a simulated card)."""
    if profile.name != "here":
        return profile_free(profile, held, budget)
    return free_memory(device, held, releasable, budget)


def profile_free(profile: DeviceProfile, held: int = 0, budget: float | None = None) -> Free:
    """A named profile's memory less its CUDA context and `held`, under the budget (GiB): a fresh card of that kind,
    as a process on it sees its free memory."""
    parts = []
    if profile.memory_bytes is not None:
        ctx = CUDA_CONTEXT if profile.gpu else 0
        less = f" less {gib(ctx)} for the CUDA context" if ctx else ""
        parts.append(
            (profile.memory_bytes - ctx - held, f"the {profile.name} profile's {gib(profile.memory_bytes)}{less}")
        )
    if budget is not None:
        parts.append((int(budget * GIB) - held, f"{BUDGET_ENV}={budget:g}"))
    return Free(*min(parts)) if parts else Free(None, f"{profile.name}: no device-memory budget ({BUDGET_ENV} unset)")


@dataclass(frozen=True)
class Plan:
    """Which regime runs and whether it fits: what the loader and `auto` act on."""

    asked: str  # the preset's policy (`auto` unresolved)
    policy: str  # the regime that will run (a policy that cannot run here falls back to none)
    needs: dict
    free: Free
    fits: bool
    why: str  # how it was chosen, in words
    margin: tuple = (0, "")  # (bytes, how estimated): engine.placement.margin_bytes
    cannot: str | None = None  # why the asked policy cannot run here (it would run resident)
    encoders_by_use: bool = False  # the text encoders wait on the host, on the device only to encode

    @property
    def regime(self) -> str:
        """The policy, and `+encoders` where the text encoders wait on the host (spec.offload.regime_name)."""
        return regime_name(self.policy, self.encoders_by_use)

    @property
    def need(self) -> int:
        return self.needs[self.regime]

    @property
    def resident(self) -> bool:
        return self.policy == "none"

    def refusal(self, model: str) -> str:
        """The sentence a refusal says: what the regime needs (weights, activations), what is free, and the fix."""
        what = (
            f"{self.regime} needs ~{gib(self.need)} ({gib(self.need - self.margin[0])} of weights on the device + "
            f"{self.margin[1]})"
        )
        if self.asked == "auto":
            what = f"offload_config auto: the least of the regimes that run here, {what}"
        elif self.cannot:
            what += f" ({self.cannot}, so it would run resident)"
        head = f"{model} does not fit the device: {what}, and {self.free.source} leaves {gib(self.free.bytes)}"
        if self.policy == "none":
            return f"{head}; {FIX_NONE}"
        return f"{head}; raise {BUDGET_ENV}, free device memory, or load a smaller dtype or quantization"


def decide(sizes: ModelSizes, spec: OffloadSpec, device: torch.device, free: Free, margin: tuple[int, str]) -> Plan:
    """The regime for `spec` on `device`: `auto` takes the first of AUTO_CANDIDATES that runs here and fits (each
    regime with the text encoders resident, then by use); an explicit policy that cannot run here falls back to
    resident, and must then fit resident."""
    need = needs(sizes, spec, margin[0], device)
    if spec.policy == "auto":
        if free.bytes is None:
            return Plan("auto", "none", need, free, True, f"{device.type}: the weights are already in host memory")
        runnable = [(p, u) for p, u in AUTO_CANDIDATES if unavailable(p, device) is None]
        for p, u in runnable:
            if need[regime_name(p, u)] <= free.bytes:
                why = f"needs ~{gib(need[regime_name(p, u)])} of {gib(free.bytes)} free"
                return Plan("auto", p, need, free, True, why, margin, encoders_by_use=u)
        least = min(runnable, key=lambda c: need[regime_name(*c)])
        key = regime_name(*least)
        why = f"nothing fits {gib(free.bytes)} free; the least, {key}, needs ~{gib(need[key])}"
        return Plan("auto", least[0], need, free, False, why, margin, encoders_by_use=least[1])
    cannot = unavailable(spec.policy, device) if spec.policy != "none" else None
    policy = "none" if cannot else spec.policy
    key = regime_name(policy, spec.encoders_by_use)
    fits = free.bytes is None or need[key] <= free.bytes
    return Plan(
        spec.policy, policy, need, free, fits, f"{key} needs ~{gib(need[key])}", margin, cannot, spec.encoders_by_use
    )


# placing ---------------------------------------------------------------------------------------------------------
def modules(pipe) -> dict:
    return {n: c for n, c in pipe.components.items() if isinstance(c, torch.nn.Module)}


def device_bytes(pipe, device: torch.device) -> int:
    """Bytes of the pipeline's tensors on `device` now (a CUDA device: what replacing this pipeline gives back)."""
    return sum(
        tensor_bytes(t)
        for c in modules(pipe).values()
        for t in list(c.parameters()) + list(c.buffers())
        if t.device.type == device.type and device.index in (None, t.device.index)
    )


def place(pipe, policy: str, device: torch.device, encoders_by_use: bool = False) -> None:
    """Move what `policy` keeps on the device there, after its hooks went on: layerwise keeps back the transformer's
    blocks, group offload the whole transformer (diffusers onloads its groups), model offload everything, and the
    text encoders by use themselves (engine.offload: they come for the prompt)."""
    if policy == "model_cpu_offload":
        return
    for name, comp in modules(pipe).items():
        if encoders_by_use and is_text_encoder(name):
            comp.to(HOST)
        elif name != "transformer":
            comp.to(device)
        elif policy == "none":
            comp.to(device)
        elif policy == "layerwise_offload":
            blocks = {b.split(".")[0] for b in block_names(comp)}
            for child, m in comp.named_children():  # (a transformer's own parameters sit in its children)
                if child not in blocks:
                    m.to(device)


def describe(
    pipe, policy: str, spec: OffloadSpec, device: torch.device, sizes: ModelSizes, plan: Plan | None, by_use=False
) -> dict:
    """Where each component lives (the card's and the JSON's `placement`), and the device bytes it holds at rest;
    `by_use`: the text encoders wait on the host and come to the device to encode the prompt."""
    where = {}
    vae = getattr(pipe, "vae", None)
    n = len(sizes.blocks)
    for name in modules(pipe):
        if policy == "host":
            where[name] = "host (loaded there for an offload regime; placed when a preset's regime applies)"
        elif policy == "model_cpu_offload":
            where[name] = "host, onloaded for its turn (model_cpu_offload)"
        elif name == "transformer" and policy == "layerwise_offload":
            ahead = spec.transfer_buckets if spec.async_transfer and device.type == "cuda" else 0
            where[name] = f"{n} blocks streamed from the host, {ahead} ahead (layerwise); the rest on the device"
        elif name == "transformer" and policy == "group_offload":
            where[name] = f"{n} blocks streamed from the host, {spec.num_blocks_per_group} a group (group_offload)"
        elif by_use and is_text_encoder(name):
            where[name] = BY_USE_WHERE
        else:
            where[name] = "device"
        if name == "vae" and getattr(vae, "use_tiling", False):
            where[name] += ", tiled decode"
    held = {
        "none": sizes.total,
        "layerwise_offload": sizes.total - sizes.block_total,
        "group_offload": sizes.total - sizes.components.get("transformer", 0),
        "model_cpu_offload": 0,
        "host": 0,
    }[policy] - (encoder_bytes(sizes) if by_use else 0)
    out = {
        "device": str(device),
        "regime": regime_name(policy, by_use),
        "components": where,
        "device_bytes": held,  # weights kept on the device between uses
        "host_bytes": sizes.total - held,
        "logical": device.type != "cuda",  # the same memory: the accounting is the studio's, nothing crosses a bus
    }
    if plan is not None:
        out.update(peak_estimate_bytes=plan.need, free_bytes=plan.free.bytes, free_source=plan.free.source)
        out.update(activation_bytes=plan.margin[0], activations=plan.margin[1])
    return out
