"""The device and the dtype that fits it.

`dtype: auto` means the device's best exact dtype: bfloat16 on CUDA (float16 where the GPU has no bf16) and on
CPUs with native bf16 (AVX512-BF16 or AMX), float32 on other CPUs, where bf16 is emulated and measured 2-4x
slower (the embedded model's denoise: 2.14 s in bf16 vs 0.91 s in float32 on an AVX2-only CPU).
The `dtype` setting (STUDIO_DTYPE, or the CLI's --dtype: spec.settings) replaces what `auto` picks, for a machine
where the rule is wrong and for benchmarks that compare dtypes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

DTYPE_ENV = "STUDIO_DTYPE"
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def cpu_threads(device) -> int | None:
    """The threads this process computes on when `device` is the CPU (what studio.measure.crowding watches); None off
    the CPU, where a timing is the accelerator's."""
    return torch.get_num_threads() if torch.device(device).type == "cpu" else None


@lru_cache(maxsize=1)
def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags (empty where /proc/cpuinfo is not there)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@dataclass(frozen=True)
class DtypeChoice:
    name: str  # bfloat16 | float16 | float32
    note: str | None  # why it differs from what the preset asked for, or how `auto` chose

    @property
    def torch(self) -> torch.dtype:
        return DTYPES[self.name]


def resolve_dtype(
    asked: str,
    device: torch.device,
    *,
    forced: str | None = None,
    flags: frozenset[str] | None = None,
    cuda_bf16: bool | None = None,
) -> DtypeChoice:
    """The dtype to run in for a preset's `dtype` on `device`.

    Args:
        forced: what `auto` becomes instead (the `dtype` setting, STUDIO_DTYPE; validated where it was read).
        flags: CPU feature flags (read from /proc/cpuinfo when not given; tests inject them).
        cuda_bf16: whether the GPU supports bf16 (asked of torch when not given).
    """
    if asked == "auto" and forced:
        return DtypeChoice(forced, f"auto: {forced} ({DTYPE_ENV})")
    if device.type == "cuda":
        bf16 = torch.cuda.is_bf16_supported() if cuda_bf16 is None else cuda_bf16
        if asked in ("auto", "bfloat16") and not bf16:
            return DtypeChoice("float16", "bfloat16 not supported by this GPU, using float16")
        return DtypeChoice("bfloat16" if asked == "auto" else asked, None)
    if asked != "auto":
        return DtypeChoice(asked, None)
    flags = cpu_flags() if flags is None else flags
    native = [f for f in NATIVE_BF16_FLAGS if f in flags]
    if device.type == "cpu" and native:
        return DtypeChoice("bfloat16", f"auto: bfloat16 (CPU has native bf16: {', '.join(native)})")
    return DtypeChoice("float32", f"auto: float32 (no native bf16 on this {device.type}: bf16 would be emulated)")
