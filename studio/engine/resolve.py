"""What a preset's `auto` choices and asked kernels become on a device, before it runs, by the engine's resolvers."""

from __future__ import annotations

import torch

from studio.engine.attention import refusal, resolve
from studio.engine.device import resolve_dtype
from studio.engine.quantize import preset_form
from studio.spec.devices import DeviceProfile, attention_for
from studio.spec.preset import ATTENTION_BACKENDS, Preset


def resolved(
    preset: Preset, profile: DeviceProfile, forced_dtype: str | None = None, head_dim: int | None = None
) -> dict[str, tuple[str, str]]:
    """{part: (what runs, why)} for dtype, 8-bit form and attention. Attention is probed as a run probes it on this
    machine, judged by its published requirements on a named profile (`head_dim`: the model's, where known: a
    kernel that refuses it falls back as a run does)."""
    dtype = resolve_dtype(preset.dtype, profile, forced=forced_dtype)
    out = {"dtype": (dtype.name, dtype.note or "")}  # a note names the dtype and says why; none: as the preset asks
    if preset.quant.enabled:
        out["quantize"] = preset_form(preset, profile)
    name = ATTENTION_BACKENDS[preset.attention_backend]
    if name == "native":
        return out
    if profile.name != "here":
        form, why = attention_for(preset.attention_backend, profile, head_dim)
        out["attention"] = (form, "usable there" if form == preset.attention_backend and profile.gpu else why)
        return out
    device = torch.device(profile.kind)
    form, tried = resolve(name, device, dtype.torch, head_dim)
    out["attention"] = (
        (preset.attention_backend, "usable here")
        if form == name
        else ((form, f"{preset.attention_backend} as {form}") if form else ("sdpa", refusal(name, tried, device)))
    )
    return out
