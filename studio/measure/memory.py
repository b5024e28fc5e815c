"""Peak memory of one denoise loop, on its device: CUDA's max allocated and reserved, peaks reset as the loop starts;
a CPU's peak resident set (Linux's VmHWM, reset through /proc/self/clear_refs: the whole process's, weights included).
Where neither can be read the record says so instead of a number."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

import torch

_STATUS = "/proc/self/status"
_CLEAR = "/proc/self/clear_refs"


@dataclass(frozen=True)
class PeakMemory:
    kind: str  # "cuda allocated" | "cpu peak RSS" | "unknown"
    peak_bytes: int | None  # allocated (CUDA) or resident (CPU) at the loop's peak
    reserved_bytes: int | None = None  # CUDA: what the caching allocator held at its peak
    note: str | None = None  # why there is no number

    def as_dict(self) -> dict:
        return asdict(self)


def _hwm_bytes() -> int | None:
    try:
        with open(_STATUS) as f:
            m = re.search(r"VmHWM:\s+(\d+) kB", f.read())
    except OSError:
        return None
    return int(m.group(1)) * 1024 if m else None


class MemoryProbe:
    """`with MemoryProbe(device) as mp: ...` then `mp.result`: the peak of what ran inside."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.result: PeakMemory | None = None
        self._reset_note: str | None = None

    def __enter__(self) -> "MemoryProbe":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.device.type == "cpu":
            try:
                with open(_CLEAR, "w") as f:
                    f.write("5")  # reset the peak RSS to the current RSS (Linux, a process's own)
            except OSError as e:
                self._reset_note = f"peak RSS not reset ({e.strerror}): the process's peak so far"
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.result = PeakMemory(
                "cuda allocated",
                int(torch.cuda.max_memory_allocated(self.device)),
                int(torch.cuda.max_memory_reserved(self.device)),
            )
        elif self.device.type == "cpu":
            peak = _hwm_bytes()
            note = self._reset_note if peak is not None else "no /proc/self/status here"
            self.result = PeakMemory("cpu peak RSS", peak, None, note)
        else:
            self.result = PeakMemory("unknown", None, None, f"no peak-memory reading for {self.device.type}")
