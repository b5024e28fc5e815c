"""8-bit quantization of the transformer with torchao, in the forms cache-dit names: float8_per_row (sm89+ GPUs),
int8_per_row (int8 activations and weights) and int8_weight_only (half the weight bytes; eager, a memory option, not
a speed one). `auto` takes the fastest measured for the device (spec.devices.quant_form); eagerly, weight-only, as
dynamic-activation forms run eager are slower than full precision."""

from __future__ import annotations

import torch

from studio.engine.compile import compiles
from studio.engine.state import Engaged, stack_state
from studio.spec.devices import DeviceProfile, float8_reason, quant_form
from studio.spec.errors import Invariant
from studio.spec.preset import QUANT_SHORT, QuantSpec


def _torchao_config(form: str):
    from torchao.quantization import (
        Float8DynamicActivationFloat8WeightConfig,
        Int8DynamicActivationInt8WeightConfig,
        Int8WeightOnlyConfig,
        PerRow,
    )

    if form == "float8_per_row":
        return Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())
    if form == "int8_per_row":
        return Int8DynamicActivationInt8WeightConfig(granularity=PerRow())
    return Int8WeightOnlyConfig()


def preset_form(preset, profile: DeviceProfile, repeated: bool = True) -> tuple[str, str]:
    """(the 8-bit form `preset` runs on `profile`, why), compiled or not as its stack is there (`repeated`: the
    transformer names repeated blocks); the model manager keys weights by it."""
    return quant_form(preset.quant, profile, compiles(preset, profile, repeated))


def exported_quant(preset, profile: DeviceProfile) -> str | None:
    """The form `preset` runs on `profile` (what an exported cache-dit config should name), None when unquantized."""
    return preset_form(preset, profile)[0] if preset.quant.enabled else None


def quantized_mode(transformer) -> str:
    return stack_state(transformer).quantize.mode


def apply_quant(
    pipe, spec: QuantSpec, profile: DeviceProfile, device: torch.device, compiled: bool = False
) -> Engaged:
    """Quantize `pipe.transformer`'s Linear layers in place, in the form `profile` decides; `device`: where it
    computes (under offload the weights' own device says nothing). Never quantizes twice: the model manager reloads
    weights when the form changes, so a different mark here is a wiring bug and raises."""
    tr = pipe.transformer
    current = quantized_mode(tr)
    if not spec.enabled:
        if current != "none":
            raise Invariant(f"transformer is quantized ({current}); reload its weights before running unquantized")
        return Engaged("quantize", "none", False, "quantize: off (full-precision weights)")
    form, why = quant_form(spec, profile, compiled)
    if current == form:
        detail = f"quantize: torchao {form} (already applied; {why})"
        return Engaged("quantize", spec.quant_type, True, detail, QUANT_SHORT[form])
    if current != "none":
        raise Invariant(f"transformer is already quantized ({current}); reload before applying {form}")
    if form == "float8_per_row" and (float8_reason(profile) or device.type != "cuda"):
        why = float8_reason(profile) or f"{profile.name} decides float8, but this run computes on {device.type}"
        return Engaged("quantize", spec.quant_type, False, f"quantize: {form}: {why}, using full precision")
    try:
        from torchao.quantization import quantize_
    except ImportError as e:  # torchao missing or broken: run in full precision, say so
        why = f"quantize: torchao unavailable ({e}), using full precision"
        return Engaged("quantize", spec.quant_type, False, why)

    names = [
        n
        for n, m in tr.named_modules()
        if isinstance(m, torch.nn.Linear) and not any(x in n for x in spec.exclude_layers)
    ]
    chosen = set(names)
    quantize_(tr, _torchao_config(form), filter_fn=lambda m, fqn: fqn in chosen)
    stack_state(tr).quantize.mode = form
    total = sum(isinstance(m, torch.nn.Linear) for m in tr.modules())
    detail = f"quantize: torchao {form} on {len(names)} of {total} Linear layers ({why})"
    return Engaged("quantize", spec.quant_type, True, detail, QUANT_SHORT[form])
