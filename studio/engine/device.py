"""The device and the dtype that fits it. `dtype: auto` is the device's best exact dtype: bfloat16 on CUDA and on
CPUs with native bf16, float32 on other CPUs (emulated bf16 is 2-4x slower). The `dtype` setting (STUDIO_DTYPE)
replaces what `auto` picks."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import lru_cache

import torch

from studio.measure.pace import cpu_name
from studio.spec.devices import DeviceProfile, dtype_for, named

DTYPE_ENV = "STUDIO_DTYPE"
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def cpu_threads(device) -> int | None:
    """The threads this process computes on when `device` is the CPU (what crowding watches); None off the CPU."""
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


def profile_here(device: torch.device | str | None = None, zerogpu: str | None = None) -> DeviceProfile:
    """The profile of the machine the studio runs on, from torch and /proc/cpuinfo. On ZeroGPU (`zerogpu`: the
    slice) torch reports the whole card, so the slice's named profile is used."""
    if zerogpu:
        return named("zerogpu" if zerogpu == "large" else "zerogpu-xlarge")
    device = torch.device(device) if device is not None else default_device()
    if device.type != "cuda":
        flags = cpu_flags()
        return DeviceProfile("here", "cpu", cpu_name() or "cpu", flags=flags)
    props = torch.cuda.get_device_properties(device)
    cap = (props.major, props.minor)
    triton = cap >= (8, 0) and importlib.util.find_spec("triton") is not None
    return DeviceProfile("here", "cuda", props.name, cap, int(props.total_memory), triton=triton)


def resolve_dtype(asked: str, profile: DeviceProfile, *, forced: str | None = None) -> DtypeChoice:
    """The dtype to run in for a preset's `dtype` on `profile`; `forced`: what `auto` becomes instead (validated
    where it was read)."""
    return DtypeChoice(*dtype_for(asked, profile, forced))
