"""Base images: the `base` preset's picture and timing for each request, computed once and kept (bounded LRU).

The picture of a request never changes (same model, dtype, prompt, seed, size, steps, guidance), so it is kept;
its timing does (machine load), so a speed-up is only divided by a base timing taken close to the run it is
compared with: older than `max_age_s`, the base is timed again in the same call (see engine.session).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np


@dataclass
class BaseEntry:
    image: np.ndarray
    denoise_s: float
    step_ms: list[float]
    timed_at: float = field(default_factory=time.monotonic)  # when the timed run ended (time.monotonic)

    def age(self, now: float | None = None) -> float:
        return (time.monotonic() if now is None else now) - self.timed_at


class BaseStore:
    def __init__(self, size: int = 16):
        self.size = size
        self._entries: OrderedDict[tuple, BaseEntry] = OrderedDict()

    def get(self, key: tuple) -> BaseEntry | None:
        return self._entries.get(key)

    def put(self, key: tuple, entry: BaseEntry) -> BaseEntry:
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
        return entry

    def __len__(self) -> int:
        return len(self._entries)
