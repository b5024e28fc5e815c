"""What a preset's `auto` choices and asked kernels become on a device, from the resolvers the engine itself runs.

A preset's description says what it asks for; this says what it runs here, before it runs: the presets list, the
Presets tab and the cache-dit export header show it (report.text.on_this_machine words it).
"""

from __future__ import annotations

import torch

from studio.engine.attention import refusal, resolve
from studio.engine.device import resolve_dtype
from studio.engine.quantize import preset_form
from studio.spec.devices import DeviceProfile, attention_for
from studio.spec.preset import ATTENTION_BACKENDS, Preset


def resolved(preset: Preset, profile: DeviceProfile, forced_dtype: str | None = None) -> dict[str, tuple[str, str]]:
    """{part: (what runs, why)} for the parts whose choice depends on the device: dtype (`forced_dtype`: the `dtype`
    setting, STUDIO_DTYPE), 8-bit form, attention. On this machine (`here`) the attention kernels are probed as a run
    probes them; on a named profile they are judged by their published requirements (spec.devices.attention_for)."""
    dtype = resolve_dtype(preset.dtype, profile, forced=forced_dtype)
    out = {"dtype": (dtype.name, dtype.note or "")}  # a note names the dtype and says why; none: as the preset asks
    if preset.quant.enabled:
        out["quantize"] = preset_form(preset, profile)
    name = ATTENTION_BACKENDS[preset.attention_backend]
    if name == "native":
        return out
    if profile.name != "here":
        form, why = attention_for(preset.attention_backend, profile)
        out["attention"] = (form, "usable there" if form == preset.attention_backend and profile.gpu else why)
        return out
    device = torch.device(profile.kind)
    form, tried = resolve(name, device, dtype.torch)
    out["attention"] = (
        (preset.attention_backend, "usable here")
        if form == name
        else ((form, f"{preset.attention_backend} as {form}") if form else ("sdpa", refusal(name, tried, device)))
    )
    return out
