"""How a speed-up is taken: the base run each stack is divided by, and when a kept base may stand in for it.

The method (the numbers are the product):
- the base of a request is the `base` preset on the same model, dtype, prompt, seed, size, steps and guidance;
  its picture never changes, so it is kept (a bounded LRU, `BaseStore`); its timing does (machine load);
- every run is warm (engine.run: the first run of a stack at a shape is an untimed warm-up), and priced by its
  median full and cached steps (studio.measure.steady): a stall of a few steps moves its wall time, not its price;
- SIDE BY SIDE, the default: while a base run is cheap (denoise under `retime_under_s`, 5 s), base and the stack are
  timed alternately `cheap_pairs` times (B S B S B S), since load changes within seconds (measured on 2 cores while
  a browser draws the page: single timings moved by 1.7x); an expensive base is timed once beside the stack. Then,
  while the pair ratios disagree (beyond +-10% of their median; for one pair: a run stalled within itself), more
  pairs, at most `max_extra_pairs` and `max_extra_s` seconds of them. The speed-up is the median pair ratio, its
  spread half their range; a spread over a quarter of the ratio is not a number (the card says the machine was
  busy). A kept base timing is one whose repeats agreed (or, timed once, whose steps did), and it is reused for
  an expensive base while younger than `max_age_s` (60 s);
- CALLER_TIMES_BASE: a caller that times base itself in its own rotation (the bench, the matrix) asks for no
  pairing: a kept base is used as it is, and only a missing one (another dtype, say) is computed, once;
- a `base` run is itself compared with the kept base picture: bitwise equal, it refreshes the kept timing (median
  of its repeats while cheap); different, it is news, shown against the kept picture;
- BY SHAPE (compare `auto`, a public studio's default: a click costs about one image): a DiT's denoise time depends
  on the shape of a request (model, dtype, size, steps, text length, guidance, true CFG), not on its prompt or seed,
  so a kept base timing of the same shape whose repeats agreed, younger than `shape_max_age_s`, and taken beside
  this same stack, divides the run; the stack runs once. The stack's price beside that base timing is kept with it:
  a run whose full steps moved beyond DRIFT_BOUND (15%) of it means the machine's speed changed since (a browser
  drawing the last result, another process), and its ratio is not shown. Absent or stale, the run is paired side by
  side as above, which keeps a new one. The same request's base picture is used where it is kept; otherwise PSNR
  is not computed (the caller asks for it);
- SAME REGIME: a stack with a memory regime (`offload_config`) is compared with `base` under that regime
  (`same_regime`), kept under its own key (`regime_key`): its speed-up and PSNR are those of its other features at the
  same weight traffic; a resident base would fold the offload's cost into the speed-up.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace

import numpy as np

from studio.measure.steady import Ratio, Steady, agree, ratio, steady
from studio.spec.preset import Preset


def same_regime(base: Preset, preset: Preset) -> Preset:
    """The base `preset` is compared with: `base` under `preset`'s memory regime (module doc)."""
    if not preset.offload_config.enabled:
        return base
    return replace(base, offload_config=preset.offload_config)


def regime_key(key: tuple, preset: Preset) -> tuple:
    """A base key (request or shape) under `preset`'s regime: another regime's base is another timing."""
    return key + (preset.offload_config,) if preset.offload_config.enabled else key


@dataclass(frozen=True)
class BaseEntry:
    image: np.ndarray
    denoise_s: float
    step_ms: list[float]
    timed_at: float = field(default_factory=time.monotonic)  # when the timed run ended (time.monotonic)
    agreed: bool = True  # its repeats agreed (or, timed once, its steps did): a timing that may be kept
    block_ms: tuple | None = None  # its blocks' median times (eager): what a compiled stack's ideal is priced by

    @property
    def price(self) -> Steady:
        """Its step-median price (every base step is a full one)."""
        return steady(self.denoise_s, self.step_ms, [])

    def age(self, now: float | None = None) -> float:
        return (time.monotonic() if now is None else now) - self.timed_at


def entry_of(run, agreed: bool | None = None) -> BaseEntry:
    """A base entry from a measured run (engine.run.Measured); `agreed` None: as steady as its own steps."""
    return BaseEntry(
        run.image,
        run.denoise_s,
        run.step_ms,
        run.ended,
        agreed=run.priced.steady if agreed is None else agreed,
        block_ms=run.block_ms,
    )


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
    max_extra_pairs: int = 4  # pairs timed beyond the first ones while their ratios disagree...
    max_extra_s: float = 20.0  # ...and for at most this long
    shape_max_age_s: float = 120.0  # compare `auto`: a kept timing of the shape divides runs while younger than this

    def reusable(self, entry: BaseEntry, now: float | None = None) -> bool:
        """Whether a kept base timing may divide a new run's without timing base again: only one whose repeats
        agreed, for an expensive base, while recent (or always, for a caller that times base itself)."""
        if self.caller_times_base:
            return True
        return entry.agreed and entry.denoise_s >= self.retime_under_s and entry.age(now) <= self.max_age_s

    def cheap(self, denoise_s: float) -> bool:
        return not self.caller_times_base and denoise_s < self.retime_under_s


CALLER_TIMES_BASE = Pairing(caller_times_base=True)


@dataclass(frozen=True)
class Paired:
    """A stack's timed run with the base it is divided by."""

    base: BaseEntry | None
    run: object  # engine.run.Measured: the median of `runs`
    runs: int  # timed runs of the stack
    base_now: bool  # the base timing was taken in this call
    ratio: Ratio | None = None  # base over the stack, from the pairs (None: not compared)
    by_shape: bool = False  # the base timing is a kept one of the same shape, maybe of another prompt (compare auto)


def median_run(runs: list):
    """The median run by denoise time (an odd count gives a real run, whose step times add up to it); a load and the
    warm-up (or compile) came before the first run: they belong to it."""
    mid = sorted(runs, key=lambda r: r.denoise_s)[len(runs) // 2]
    return replace(mid, warmup_s=runs[0].warmup_s, reloaded=runs[0].reloaded)


def _median_entry(entries: list[BaseEntry]) -> BaseEntry:
    return sorted(entries, key=lambda e: e.denoise_s)[len(entries) // 2]


def _settled(bases: list, runs: list) -> bool:
    """Whether more pairs would not change the answer: the pair ratios agree, or one pair whose runs were steady."""
    if len(runs) == 1:
        return bases[0].priced.steady and runs[0].priced.steady
    return agree([b.priced.robust_s / r.priced.robust_s for b, r in zip(bases, runs)])  # (measure.steady)


def side_by_side(pairing: Pairing, store: BaseStore, key: tuple, time_base, time_stack, on_status=None) -> Paired:
    """The stack's run and its base, as the pairing says (module doc).

    Args:
        time_base, time_stack: callables running one measured run (engine.run.Measured) of base / of the stack.
    """
    kept = store.get(key)
    if kept is not None and pairing.reusable(kept):
        run = time_stack()
        return Paired(kept, run, 1, base_now=False, ratio=ratio([kept.price], [run.priced]))
    bases, runs, extra_since = [], [], None
    while True:
        if on_status:
            new = kept is None and not bases
            on_status("computing the base image for comparison" if new else "timing the base image for comparison")
        bases.append(time_base())
        runs.append(time_stack())
        if pairing.caller_times_base:
            break
        first = pairing.cheap_pairs if pairing.cheap(bases[0].denoise_s) else 1  # pairs always timed
        if len(runs) < first:
            continue
        extra_since = extra_since or time.monotonic()
        spent = time.monotonic() - extra_since
        if _settled(bases, runs) or len(runs) >= first + pairing.max_extra_pairs or spent > pairing.max_extra_s:
            break
    agreed = _settled(bases, runs) if len(bases) > 1 else bases[0].priced.steady
    base = store.put(key, replace(_median_entry([entry_of(b) for b in bases]), agreed=agreed))
    r = ratio([b.priced for b in bases], [x.priced for x in runs])
    return Paired(base, median_run(runs), len(runs), base_now=True, ratio=r)


def shape_timing(pairing: Pairing, shapes: BaseStore, shape: tuple, now: float | None = None) -> BaseEntry | None:
    """A kept base timing of this shape that may divide a run of any prompt of it: one whose repeats agreed, while
    younger than `pairing.shape_max_age_s` (module doc); None: time base beside the run."""
    kept = shapes.get(shape)
    if kept is None or not kept.agreed or kept.age(now) > pairing.shape_max_age_s:
        return None
    return kept


def by_shape(shaped: BaseEntry, then: Steady, same_request: BaseEntry | None, time_stack) -> Paired:
    """The stack timed once, divided by the shape's kept base timing; `then`: the same stack's price when that base
    timing was taken beside it (a run whose full steps moved beyond DRIFT_BOUND of it is not divided: the machine's
    speed changed). The base picture is the same request's where it is kept (PSNR), else none."""
    run = time_stack()
    base = replace(shaped, image=same_request.image if same_request is not None else None)
    r = ratio([shaped.price], [run.priced])
    if then.full_ms and run.priced.full_ms:
        r = replace(r, drift=run.priced.full_ms / then.full_ms)
    return Paired(base, run, 1, base_now=False, ratio=r, by_shape=True)


def base_itself(pairing: Pairing, store: BaseStore, key: tuple, time_base) -> Paired:
    """A `base` run: repeated like the base beside any stack while cheap (so an A/B of base against a stack shows the
    same base time in both rows, within the noise), then checked against the kept picture (module doc)."""
    runs = [time_base()]
    if pairing.cheap(runs[0].denoise_s):
        runs += [time_base() for _ in range(pairing.cheap_pairs - 1)]
    run = median_run(runs)
    kept = store.get(key)
    prices = [r.priced.robust_s for r in runs]
    if kept is None or np.array_equal(kept.image, run.image):
        kept = store.put(key, entry_of(run, agree(prices) if len(runs) > 1 else run.priced.steady))
        # base against itself, the same run: 1.00x by construction, not a measurement with a spread
        itself = Ratio(1.0, 0.0, len(runs), max(prices) / min(prices))
        return Paired(kept, run, len(runs), base_now=False, ratio=itself)
    return Paired(kept, run, len(runs), base_now=False, ratio=ratio([kept.price], [run.priced]))
