"""The transformer-call clock: each call between two device syncs (as gpt-fast's `generate.py`), so a reading is the
call's own time, the work queued before it excluded; the one clock of every bench that calls a transformer itself.
torch is imported where used: the app's process imports studio.measure and never loads torch."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


def sync(device) -> None:
    """Wait for the work queued on `device` (a torch.device); off CUDA a call returns done: nothing to wait for."""
    if getattr(device, "type", None) == "cuda":
        import torch

        torch.cuda.synchronize(device)


@dataclass
class CallClock:
    """Times calls one by one: `clock.call(fn, *args, **kwargs)` returns fn's result and appends its time to `ms`;
    `device` (a torch.device) is synced before and after each call."""

    device: object
    ms: list[float] = field(default_factory=list)  # one reading per call, in milliseconds, in call order

    def call(self, fn, /, *args, **kwargs):
        sync(self.device)
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        sync(self.device)
        self.ms.append((time.perf_counter() - t0) * 1e3)
        return out


def time_calls(fn, calls: int, device, /, **kwargs) -> list[float]:
    """`calls` calls of `fn(**kwargs)`, the same inputs each time; ms per call."""
    clock = CallClock(device)
    for _ in range(calls):
        clock.call(fn, **kwargs)
    return clock.ms
