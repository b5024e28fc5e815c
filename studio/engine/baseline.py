"""How a speed-up is taken: the base run each stack is divided by, and when a kept base may stand in for it.

The method (the numbers are the product):
- the base of a request is the `base` preset on the same model, dtype, prompt, seed, size, steps and guidance;
  its picture never changes, so it is kept (a bounded LRU, `BaseStore`); its timing does (machine load);
- every run is warm (engine.run: the first run of a stack at a shape is an untimed warm-up);
- SIDE BY SIDE, the default: while a base run is cheap (denoise under `retime_under_s`, 5 s), base and the stack are
  timed alternately `cheap_pairs` times (B S B S B S), each speaking by its median, since load changes within
  seconds (measured on 2 cores while a browser draws the page: single timings moved by 1.7x). An expensive base is
  timed once beside the stack, or a kept base timing younger than `max_age_s` (60 s) is reused;
- CALLER_TIMES_BASE: a caller that times base itself in its own rotation (the bench, the matrix) asks for no
  pairing: a kept base is used as it is, and only a missing one (another dtype, say) is computed, once;
- a `base` run is itself compared with the kept base picture: bitwise equal, it refreshes the kept timing (median
  of its repeats while cheap); different, it is news, shown against the kept picture.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace

import numpy as np


@dataclass(frozen=True)
class BaseEntry:
    image: np.ndarray
    denoise_s: float
    step_ms: list[float]
    timed_at: float = field(default_factory=time.monotonic)  # when the timed run ended (time.monotonic)

    def age(self, now: float | None = None) -> float:
        return (time.monotonic() if now is None else now) - self.timed_at


def entry_of(run) -> BaseEntry:
    """A base entry from a measured run (engine.run.Measured)."""
    return BaseEntry(run.image, run.denoise_s, run.step_ms, run.ended)


class BaseStore:
    """The kept base of each request key, least recently used dropped past `size`."""

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


@dataclass(frozen=True)
class Pairing:
    """When base is timed beside a stack (module doc)."""

    retime_under_s: float = 5.0  # a base cheaper than this is timed again beside every run, `cheap_pairs` times
    max_age_s: float = 60.0  # an expensive base's kept timing is reused while younger than this
    cheap_pairs: int = 3
    caller_times_base: bool = False  # the caller times base in its own rotation: use the kept base as it is

    def reusable(self, entry: BaseEntry, now: float | None = None) -> bool:
        """Whether a kept base timing may divide a new run's without timing base again."""
        if self.caller_times_base:
            return True
        return entry.denoise_s >= self.retime_under_s and entry.age(now) <= self.max_age_s

    def cheap(self, denoise_s: float) -> bool:
        return not self.caller_times_base and denoise_s < self.retime_under_s


CALLER_TIMES_BASE = Pairing(caller_times_base=True)


@dataclass(frozen=True)
class Paired:
    """A stack's timed run with the base it is divided by."""

    base: BaseEntry
    run: object  # engine.run.Measured: the median of `runs`
    runs: int  # timed runs of the stack
    base_now: bool  # the base timing was taken in this call


def median_run(runs: list):
    """The median run by denoise time (an odd count gives a real run, whose step times add up to it); a load and the
    warm-up (or compile) came before the first run: they belong to it."""
    mid = sorted(runs, key=lambda r: r.denoise_s)[len(runs) // 2]
    return replace(mid, warmup_s=runs[0].warmup_s, reloaded=runs[0].reloaded)


def _median_entry(entries: list[BaseEntry]) -> BaseEntry:
    return sorted(entries, key=lambda e: e.denoise_s)[len(entries) // 2]


def side_by_side(pairing: Pairing, store: BaseStore, key: tuple, time_base, time_stack, on_status=None) -> Paired:
    """The stack's run and its base, as the pairing says (module doc).

    Args:
        time_base, time_stack: callables running one measured run of base / of the stack.
    """
    kept = store.get(key)
    if kept is not None and pairing.reusable(kept):
        return Paired(kept, time_stack(), 1, base_now=False)
    pairs = 1 if pairing.caller_times_base else pairing.cheap_pairs
    bases, runs = [], []
    for i in range(pairs):
        if on_status:
            first = kept is None and i == 0
            on_status("computing the base image for comparison" if first else "timing the base image for comparison")
        bases.append(entry_of(time_base()))
        runs.append(time_stack())
        if not pairing.cheap(bases[-1].denoise_s):
            break
    return Paired(store.put(key, _median_entry(bases)), median_run(runs), len(runs), base_now=True)


def base_itself(pairing: Pairing, store: BaseStore, key: tuple, time_base) -> Paired:
    """A `base` run: repeated like the base beside any stack while cheap (so an A/B of base against a stack shows the
    same base time in both rows, within the noise), then checked against the kept picture (module doc)."""
    runs = [time_base()]
    if pairing.cheap(runs[0].denoise_s):
        runs += [time_base() for _ in range(pairing.cheap_pairs - 1)]
    run = median_run(runs)
    kept = store.get(key)
    if kept is None or np.array_equal(kept.image, run.image):
        kept = store.put(key, entry_of(run))
    return Paired(kept, run, len(runs), base_now=False)
