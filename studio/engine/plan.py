"""What a preset would run on a device, part by part with the reason, and its memory plan: `python -m studio plan`.
Every part comes from the rules a run applies, fed the device profile; sizes come from the model's shipped configs
on the meta device, so a plan reads no weights and needs no network."""

from __future__ import annotations

import importlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from studio.engine.device import profile_here, resolve_dtype
from studio.engine.offload import QUANT_UNDER_GROUP
from studio.engine.placement import (
    BY_USE_WHERE,
    CUDA_SLACK,
    FALLBACK_MARGIN,
    Free,
    activation_bytes,
    decide,
    free_on,
    gib,
    is_text_encoder,
    unavailable,
)
from studio.engine.resolve import resolved
from studio.engine.sizes import ModelSizes, sizes_from_configs
from studio.engine.streams import STREAMING
from studio.spec.checks import ConfigError
from studio.spec.devices import DeviceProfile, float8_reason, named
from studio.spec.hosting import aot_refusal
from studio.spec.offload import AUTO_CANDIDATES, regime_name
from studio.spec.preset import Preset
from studio.spec.profiles import EMBEDDED_DIR, HUB_PROFILES, profile_for, resolve_model

CONFIGS = Path(__file__).resolve().parent.parent / "models" / "configs"


@dataclass
class DevicePlan:
    """A preset on a device: each part that would run (`reasons`: part -> why), and the memory plan."""

    device: str  # the profile's name and what it is
    model: str
    preset: str
    size: tuple[int, int]
    dtype: str
    quantize: str  # the 8-bit form that would run, or none
    attention: str
    compile: str  # off | regional | whole | ahead-of-time
    offload: str  # the regime; none when resident
    peak_bytes: int  # the estimate the regime is chosen by: weights kept on the device + activations
    fits: bool
    reasons: dict = field(default_factory=dict)
    components: dict = field(default_factory=dict)  # name -> {"bytes": ..., "where": ...}
    activation_bytes: int = 0
    free: str = ""  # what the plan was placed against, in words
    refusal: str | None = None  # the sentence when it does not fit: what it needs, and what would

    def as_dict(self) -> dict:
        return asdict(self)


def model_folder(model: str | None) -> Path:
    """The folder whose configs describe `model`: a local folder, or a named family's shipped configs."""
    return _source(model)[0]


def _source(model: str | None) -> tuple[Path, str]:
    """(model_folder's folder, the model as the plan names it: its Hub id, or its folder)."""
    source = resolve_model(model)
    if Path(source).expanduser().is_dir():
        return Path(source).expanduser(), source
    hub = next((h for h, p in HUB_PROFILES.items() if source in (h, p.name)), source)
    folder = CONFIGS / hub.replace("/", "--")
    if not (folder / "model_index.json").is_file():
        shipped = ", ".join(sorted(p.name.replace("--", "/") for p in CONFIGS.iterdir() if p.is_dir()))
        raise ConfigError(f"plan: no configs for model {model!r}: use a local folder, `tiny`, or one of {shipped}")
    return folder, hub


def profile_of(device: str, settings) -> DeviceProfile:
    """`here` (this machine, as the model manager reads it) or a named profile."""
    if device == "here":
        return profile_here(zerogpu=settings.zerogpu_slice)
    return named(device)


def make_plan(
    profile: DeviceProfile,
    model: str | None,
    preset: Preset,
    size: tuple[int, int] | None = None,
    budget: float | None = None,
    forced_dtype: str | None = None,
) -> DevicePlan:
    """What `preset` would run on `profile` for `model` at `size` (default: the model's), under `budget` GiB (None:
    the profile's memory)."""
    folder, hub = _source(model)
    mprof = profile_for(hub)
    w, h = size or (mprof.width, mprof.height)
    head_dim = _head_dim(folder)
    parts = resolved(preset, profile, forced_dtype, head_dim)
    dtype = resolve_dtype(preset.dtype, profile, forced=forced_dtype)
    q = parts.get("quantize", ("none", "quantize: off (full-precision weights)"))
    if q[0] == "float8_per_row" and float8_reason(profile):  # as engine.quantize.apply_quant falls back
        q = ("none", f"float8_per_row: {float8_reason(profile)}, so the run keeps full precision")
    eight = preset.quant.exclude_layers if q[0] != "none" else None  # the weights counted as they will be stored
    sizes = sizes_from_configs(folder, dtype.torch, eight)
    device = torch.device(profile.kind)
    act = activation_bytes(sizes.configs, w, h, mprof.max_sequence_length or 512, dtype.torch.itemsize)
    how = f"activations ~{gib(act)} at {w}x{h}" if act is not None else ""
    if act is None:  # a VAE config the estimate cannot read (Qwen-Image's): the loader's fallback, said
        act, how = FALLBACK_MARGIN, f"activations ~{gib(FALLBACK_MARGIN)} (no VAE config to estimate from)"
    margin = (act + (CUDA_SLACK if profile.gpu else 0), how)
    free = free_on(profile, device, budget=budget)
    place = decide(sizes, preset.offload_config, device, free, margin)
    compile_form, compile_why = compile_plan(preset, profile, place.policy, preset.quant.enabled, folder)
    name = f"{'the embedded model' if folder == EMBEDDED_DIR else hub} in {dtype.name} under preset {preset.name!r}"
    plan = DevicePlan(
        device=f"{profile.name}: {profile.describe()}",
        model=hub if folder != EMBEDDED_DIR else "tiny",
        preset=preset.name,
        size=(w, h),
        dtype=dtype.name,
        quantize=q[0],
        attention=parts.get("attention", ("sdpa", ""))[0],
        compile=compile_form,
        offload=place.regime,
        peak_bytes=place.need,
        fits=place.fits,
        activation_bytes=act,
        free=f"{gib(free.bytes)} ({free.source})" if free.bytes is not None else free.source,
        components=_where(sizes, place.policy, place.encoders_by_use),
    )
    plan.reasons = {
        "dtype": dtype.note or f"{dtype.name} as the preset asks",
        "quantize": q[1],
        "attention": parts.get("attention", ("sdpa", "PyTorch's scaled_dot_product_attention"))[1],
        "compile": compile_why,
        "offload": place.why + (f" ({place.cannot})" if place.cannot else ""),
    }
    if preset.wants_workers:
        n = preset.parallelism_config.world_size
        one = profile.gpu and profile.name != "here"  # a named profile is one card; a cluster: STUDIO_RAY_ADDRESS
        plan.reasons["parallel"] = (
            f"{n} workers need {n} GPUs, a {profile.name} is one (a Ray cluster of them: RAY_ADDRESS); one process"
            if one
            else f"{n} workers (cache-dit on Ray), each placed as above (engine.parallel decides at run time)"
        )
    if not place.fits:
        plan.refusal = f"{place.refusal(name)}; {_what_fits(place.needs, device, free)}"
    return plan


def _what_fits(needs: dict, device: torch.device, free: Free) -> str:
    """What would fit `free`: the regimes that do, or how much the least hungry one needs."""
    runnable = [regime_name(p, u) for p, u in AUTO_CANDIDATES if unavailable(p, device) is None]
    ok = [p for p in runnable if needs[p] <= free.bytes]
    if ok:
        return "these would fit: " + ", ".join(f"{p} (~{gib(needs[p])})" for p in ok)
    least = min(runnable, key=needs.get)
    return f"no regime fits: the least, {least}, needs ~{gib(needs[least])}"


def _where(sizes: ModelSizes, regime: str, by_use: bool = False) -> dict:
    """Each component's bytes and where it stays between uses under `regime` (`by_use`: the text encoders wait on the
    host), and when it is on the device."""
    out = {}
    for name, b in sizes.components.items():
        if by_use and is_text_encoder(name):
            where = BY_USE_WHERE
        elif regime == "none":
            where = "device"
        elif regime == "model_cpu_offload":
            where = "host, moved to the device for its turn"
        elif name == "transformer":
            where = f"host, its blocks streamed ({regime})"
        else:
            where = "device"
        out[name] = {"bytes": b, "where": where}
    return out


def compile_plan(preset: Preset, profile: DeviceProfile, regime: str, quantized: bool, folder: Path) -> tuple:
    """(the compile form, why) by engine.compile's and engine.offload's rules, for the regime the plan chose."""
    spec = preset.compile
    if not spec.enabled:
        return "off", "eager, as the preset asks"
    repeated = _repeated_blocks(folder)
    if profile.zerogpu:
        refused = aot_refusal(preset, repeated) or (
            f"not under {regime} (the weights move between calls; a package reads them in place)"
            if regime != "none"
            else None
        )
        if refused:
            return "off", f"ZeroGPU has no JIT and ahead-of-time compile is {refused}: the stack runs eagerly"
        weights = " (their 8-bit weights quantized before the export, as ZeroGPU's recipe does)" if quantized else ""
        return (
            "ahead-of-time",
            f"ZeroGPU has no JIT: the repeated blocks are exported{weights} and compiled ahead of time",
        )
    regional = spec.regional and repeated
    if regime in STREAMING and not regional:
        return "off", f"a whole-transformer graph would hold {regime}'s weight moves; set compile.regional: true"
    if regime == "group_offload" and quantized:
        return "off", QUANT_UNDER_GROUP
    if not regional and preset.cache.enabled:
        return "off", "a whole-transformer graph bypasses the step cache; set compile.regional: true"
    full = spec.effective_fullgraph(preset.cache.enabled) and regime not in STREAMING
    what = "the repeated blocks" if regional else "the whole transformer"
    return ("regional" if regional else "whole"), f"torch.compile (JIT) of {what}, fullgraph={full}"


def _repeated_blocks(folder: Path) -> bool:
    """Whether the model's transformer class names repeated blocks (regional compile compiles those)."""
    index = json.loads((folder / "model_index.json").read_text())
    library, cls = index.get("transformer", [None, None])
    if library is None:
        return False
    return bool(getattr(getattr(importlib.import_module(library), cls, None), "_repeated_blocks", None))


def _head_dim(folder: Path) -> int | None:
    """The transformer's attention head size from its config (None: not said): Sage's kernels take 64, 96, 128."""
    try:
        cfg = json.loads((folder / "transformer" / "config.json").read_text())
    except (OSError, ValueError):
        return None
    hd = cfg.get("attention_head_dim")
    return hd if isinstance(hd, int) else None
