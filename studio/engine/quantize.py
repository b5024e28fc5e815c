"""8-bit quantization of the transformer with torchao, in the forms cache-dit names.

float8_per_row    float8 activations and weights, scaled per row (GPUs with float8 matmuls: sm89+)
int8_per_row      int8 activations and weights, per row (torch._int_mm)
int8_weight_only  int8 weights dequantized per call: half the weight bytes; eager a memory option, not a speed one
auto              the fastest of these for the device, as measured (quant_form):
                  - GPU sm89+: float8_per_row; other GPUs: int8_per_row (compiled FLUX on an H100, public numbers:
                    weight-only 5.25 s, int8 dynamic 3.66 s, float8 per-row 3.47 s);
                  - CPU with AMX-INT8: int8_per_row (embedded model, bf16: 1.44x compiled; with the cache 2.28x
                    against cache-compile's 2.14x);
                  - other CPUs: int8_weight_only (Ice Lake, AVX512-VNNI, fp32, `python -m studio bench`: compiled
                    weight-only 1.49x against dynamic's 1.32x; with the cache 2.48x against 2.26x, cache-compile
                    2.31x);
                  - where the stack runs eagerly, weight-only: dynamic-activation forms eager are slower than full
                    precision (each call quantizes its activations in separate kernels; 0.42x on the AMX CPU).
"""

from __future__ import annotations

import torch

from studio.engine.compile import compiles
from studio.engine.device import cpu_flags
from studio.engine.state import Engaged, stack_state
from studio.spec.preset import DYNAMIC_FORMS, QUANT_SHORT, QuantSpec

EAGER_NOTE = "dynamic-activation quantization is slower than bf16 without compile"


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


def float8_reason(device: torch.device) -> str | None:
    """Why float8 matmuls cannot run on `device`, or None when they can (torchao: CUDA sm89+)."""
    if device.type != "cuda":
        return f"float8 matmuls need a CUDA GPU of sm89 or newer; this is {device.type}"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        return f"float8 matmuls need sm89 or newer; this GPU is sm{major}{minor}"
    return None


def _int8_hardware(device: torch.device, flags: frozenset[str] | None) -> str:
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"sm{major}{minor}, int8 tensor cores"
    flags = cpu_flags() if flags is None else flags
    for flag, name in (("amx_int8", "AMX-INT8"), ("avx512_vnni", "AVX512-VNNI"), ("avx_vnni", "AVX-VNNI")):
        if flag in flags:
            return f"{device.type} with {name}"
    return f"{device.type} without VNNI/AMX: int8 matmuls run at fp32 speed at best"


def quant_form(
    spec: QuantSpec, device: torch.device, compiled: bool, flags: frozenset[str] | None = None
) -> tuple[str, str]:
    """(the form that runs, why) for `spec` on `device`. Deterministic, so the model manager keys weights by it.

    Args:
        compiled: the stack is compiled here (a dynamic-activation form pays only then).
        flags: CPU feature flags (read from /proc/cpuinfo when not given; tests inject them).
    """
    q = spec.quant_type
    if q != "auto":
        why = f"{q} as the preset names it"
        if q in DYNAMIC_FORMS and not compiled:
            why += f"; eager: {EAGER_NOTE}"
        return q, why
    if not compiled:
        return "int8_weight_only", f"auto, eager: {EAGER_NOTE}, so weight-only (a memory option: half the weights)"
    if float8_reason(device) is None:
        return "float8_per_row", f"auto: {_int8_hardware(device, flags).split(',')[0]} has float8 matmuls, compiled"
    hw = _int8_hardware(device, flags)
    if device.type == "cpu" and "AMX-INT8" not in hw:
        return "int8_weight_only", f"auto: {hw}, no AMX: compiled weight-only is the faster form here (measured)"
    return "int8_per_row", f"auto: {hw}, compiled"


def exported_quant(preset, device: torch.device) -> str | None:
    """The form `preset` runs on `device` (what an exported cache-dit config should name), None when unquantized."""
    if not preset.quant.enabled:
        return None
    return quant_form(preset.quant, device, compiles(preset.compile, preset.offload_config))[0]


def quantized_mode(transformer) -> str:
    return stack_state(transformer).quantize.mode


def apply_quant(pipe, spec: QuantSpec, compiled: bool = False) -> Engaged:
    """Quantize `pipe.transformer`'s Linear layers in place, skipping names containing any of `spec.exclude`.

    A transformer that is already quantized is never quantized again: the model manager reloads weights when
    the form changes (it keys them by quant_form), so reaching here with a different mark is a wiring bug and raises.
    """
    tr = pipe.transformer
    current = quantized_mode(tr)
    if not spec.enabled:
        if current != "none":
            raise RuntimeError(f"transformer is quantized ({current}); reload its weights before running unquantized")
        return Engaged("quantize", "none", False, "quantize: off (full-precision weights)")
    device = next(tr.parameters()).device
    form, why = quant_form(spec, device, compiled)
    if current == form:
        detail = f"quantize: torchao {form} (already applied; {why})"
        return Engaged("quantize", spec.quant_type, True, detail, QUANT_SHORT[form])
    if current != "none":
        raise RuntimeError(f"transformer is already quantized ({current}); reload before applying {form}")
    if form == "float8_per_row" and float8_reason(device) is not None:
        reason = f"quantize: {form}: {float8_reason(device)}, using full precision"
        return Engaged("quantize", spec.quant_type, False, reason)
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
