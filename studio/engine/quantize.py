"""INT8 quantization of the transformer with torchao (weight-only or dynamic activation + weight)."""

from __future__ import annotations

import torch

from studio.engine.state import Engaged, stack_state
from studio.spec.preset import QuantSpec


def _torchao_config(mode: str):
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig

    return {"int8_weight_only": Int8WeightOnlyConfig, "int8_dynamic": Int8DynamicActivationInt8WeightConfig}[mode]()


def quantized_mode(transformer) -> str:
    return stack_state(transformer).quant


def apply_quant(pipe, spec: QuantSpec) -> Engaged:
    """Quantize `pipe.transformer`'s Linear layers in place, skipping names containing any of `spec.exclude`.

    A transformer that is already quantized is never quantized again: the model manager reloads weights when
    the mode changes, so reaching here with a different mark is a wiring bug and raises.
    """
    tr = pipe.transformer
    current = quantized_mode(tr)
    if not spec.enabled:
        if current != "none":
            raise RuntimeError(f"transformer is quantized ({current}); reload its weights before running unquantized")
        return Engaged("quantize", "none", False, "quantize: off (full-precision weights)")
    if current == spec.quant_type:
        return Engaged("quantize", spec.quant_type, True, f"quantize: torchao {spec.quant_type} (already applied)")
    if current != "none":
        raise RuntimeError(f"transformer is already quantized ({current}); reload before applying {spec.quant_type}")
    try:
        from torchao.quantization import quantize_
    except Exception as e:  # torchao missing or broken: run in full precision, say so
        return Engaged(
            "quantize", spec.quant_type, False, f"quantize: torchao unavailable ({e}), using full precision"
        )

    names = [
        n
        for n, m in tr.named_modules()
        if isinstance(m, torch.nn.Linear) and not any(x in n for x in spec.exclude_layers)
    ]
    chosen = set(names)
    quantize_(tr, _torchao_config(spec.quant_type), filter_fn=lambda m, fqn: fqn in chosen)
    stack_state(tr).quant = spec.quant_type
    total = sum(isinstance(m, torch.nn.Linear) for m in tr.modules())
    return Engaged(
        "quantize",
        spec.quant_type,
        True,
        f"quantize: torchao {spec.quant_type} on {len(names)} of {total} Linear layers",
    )
