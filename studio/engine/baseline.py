"""How a speed-up is taken: the base run each stack is divided by, and when a kept base may stand in for it. The
base (the `base` preset on the same request) keeps its picture, so it is kept (`BaseStore`), but not its timing
(machine load), so base and the stack are timed alternately, in the same moments. The ratio comes from
studio.measure.estimate (each side priced by its floor, with a bootstrap interval)."""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace

import numpy as np

from studio.measure.crowding import CoreWatch, Crowding
from studio.measure.estimate import TIGHT, Estimate, Run, alike, exact_one, price_ms, speedup, stalled
from studio.measure.estimate import by_shape as estimate_by_shape
from studio.spec.preset import Preset


def same_regime(base: Preset, preset: Preset) -> Preset:
    """`base` under `preset`'s memory regime: a resident base would fold the offload's cost into the speed-up."""
    if not preset.offload_config.enabled:
        return base
    return replace(base, offload_config=preset.offload_config)


def regime_key(key: tuple, preset: Preset) -> tuple:
    """A base key (request or shape) under `preset`'s regime: another regime's base is another timing."""
    return key + (preset.offload_config,) if preset.offload_config.enabled else key


TIGHT_PCT = round(TIGHT * 100)
TIGHT_STOP = f"the interval is within ±{TIGHT_PCT}% of its point"
CROWDED_PAIRS = "other programs hold the cores (more pairs would not show a number)"


@dataclass(frozen=True)
class BaseEntry:
    image: np.ndarray
    denoise_s: float
    step_ms: list[float]
    timed_at: float = field(default_factory=time.monotonic)  # when the timed run ended (time.monotonic)
    runs: tuple[Run, ...] = ()  # the timed runs of its last pairing, as the estimator reads them
    block_ms: tuple | None = None  # its blocks' median times (eager): what a compiled stack's ideal is priced by
    crowded: bool = False  # other programs held the cores while it was timed (`watched`): its picture stays, its time
    # divides nothing later

    @property
    def agreed(self) -> bool:
        """A timing that may be kept alone: timed more than once, or once without a stall, on uncrowded cores."""
        if self.crowded:
            return False
        return len(self.runs) > 1 or (len(self.runs) == 1 and not stalled(self.runs))

    @property
    def full_ms(self) -> float:
        """Its median step (every base step is a full one): what the ideal's block times are priced against."""
        return float(np.median(self.step_ms))

    def age(self, now: float | None = None) -> float:
        return (time.monotonic() if now is None else now) - self.timed_at


def entry_of(run) -> BaseEntry:
    """A base entry from a measured run (engine.run.Measured)."""
    return BaseEntry(run.image, run.denoise_s, run.step_ms, run.ended, (run.timed,), run.block_ms)


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


@dataclass
class Kept:
    """What a Runner keeps between requests, as plain data that pickles: on ZeroGPU it crosses each device call, whose
    process may be fresh (app.zerogpu). Warm-ups do not cross: they are facts about one process."""

    bases: BaseStore
    shapes: BaseStore
    stack_prices: BaseStore


@dataclass(frozen=True)
class Pairing:
    """When base is timed beside a stack, alternately (B S B S): a cheap base `cheap_pairs` times (one pair's steps
    cannot see a whole run slowed), an expensive one once; then more pairs while the interval is wider than ±5%, within
    the caps. The budget counts pairs, not stack runs, so a fast stack is not cut short. Base runs kept from earlier
    calls never join a new pairing: a floor over more runs is lower."""

    retime_under_s: float = 5.0  # a base cheaper than this is timed again beside every run, `cheap_pairs` times
    max_age_s: float = 60.0  # an expensive base's kept timing is reused while younger than this
    cheap_pairs: int = 3
    caller_times_base: bool = False  # the caller times base in its own rotation: use the kept base as it is
    max_extra_pairs: int = 4  # pairs timed beyond the first ones while the interval is not tight...
    budget_pairs: float = 7.0  # ...and while the pairs so far and the next fit in this many of the fastest pair
    shape_max_age_s: float = 120.0  # compare `auto`: a kept timing of the shape divides runs while younger than this

    def reusable(self, entry: BaseEntry, now: float | None = None) -> bool:
        """Whether a kept base timing may divide a new run without timing base again: an agreed, expensive, recent
        one (any, for a caller that times base itself)."""
        if self.caller_times_base:
            return True
        return entry.agreed and entry.denoise_s >= self.retime_under_s and entry.age(now) <= self.max_age_s

    def cheap(self, denoise_s: float) -> bool:
        return not self.caller_times_base and denoise_s < self.retime_under_s

    def stop(self, est: Estimate, pairs: int, first: int, spent_s: float, pair_s: float) -> str | None:
        """Why the pairing stops after `pairs` pairs (None: time another); `pair_s`: what the fastest pair took."""
        if pairs < first:
            return None
        if est.tight:
            return TIGHT_STOP
        if pairs >= first + self.max_extra_pairs:
            cap = first + self.max_extra_pairs
            return f"at most {cap} pair{'s' if cap != 1 else ''}"
        if spent_s + pair_s > self.budget_pairs * pair_s:
            return f"another pair would pass the time budget ({self.budget_pairs:g}x the fastest pair)"
        return None


CALLER_TIMES_BASE = Pairing(caller_times_base=True)


@dataclass(frozen=True)
class Paired:
    """A stack's timed run with the base it is divided by."""

    base: BaseEntry | None
    run: object  # engine.run.Measured: the median of `runs`
    runs: int  # timed runs of the stack
    base_now: bool  # the base timing was taken in this call
    ratio: Estimate | None = None  # base over the stack (studio.measure.estimate); None: not compared
    by_shape: bool = False  # the base timing is a kept one of the same shape, maybe of another prompt (compare auto)
    stack_runs: tuple[Run, ...] = ()  # the stack's timed runs beside this base (kept for compare auto's drift)
    crowding: Crowding | None = None  # what other programs took of the cores while it was timed (None: not watched)
    grouped: bool = False  # base's runs after the stack's, each weight set loaded once (side_by_side's `one_set`)

    def priced_s(self) -> dict:
        """The stack's and base's floor prices in seconds and what other programs took of the cores, as RunMetrics
        fields; None where not timed (not watched)."""
        base_runs, stack_runs = self.base.runs if self.base is not None else (), self.stack_runs
        if base_runs and stack_runs:  # as the speed-up divides them (DBPrune's, step by step on both sides)
            base_runs, stack_runs = alike(base_runs, stack_runs)
        return {
            "denoise_priced_s": price_ms(stack_runs) / 1e3 if stack_runs else None,
            "base_priced_s": price_ms(base_runs) / 1e3 if base_runs else None,
            "cores_taken": self.crowding.taken if self.crowding is not None else None,
            "cores_host": self.crowding.host if self.crowding is not None else None,
        }


def median_run(runs: list):
    """The median run by denoise time (the faster middle one for an even count: a real run), carrying the first run's
    load and warm-up."""
    mid = sorted(runs, key=lambda r: r.denoise_s)[(len(runs) - 1) // 2]
    return replace(mid, warmup_s=runs[0].warmup_s, reloaded=runs[0].reloaded)


def _timed(fn) -> tuple[object, float]:
    t0 = time.monotonic()
    out = fn()
    return out, time.monotonic() - t0


ONE_SET = "the device holds one weight set at a time: another pair would load both again"


def side_by_side(
    pairing: Pairing,
    store: BaseStore,
    key: tuple,
    time_base,
    time_stack,
    *,
    on_status=None,
    crowded=None,
    one_set: bool = False,
) -> Paired:
    """The stack's run and its base, as the pairing says; `time_base`/`time_stack` each run one measured run.
    `crowded()` true stops the pairs: the number will be withheld whatever they add. `one_set`: base and the stack
    run on weight sets the device cannot hold together (grouped: each set loads once)."""
    kept = store.get(key)
    if kept is not None and pairing.reusable(kept):
        run = time_stack()
        return Paired(kept, run, 1, False, speedup(kept.runs, [run.timed]), stack_runs=(run.timed,))
    if one_set and not pairing.caller_times_base:
        return _grouped(pairing, store, key, time_base, time_stack, on_status, crowded)
    bases, runs, spent, fastest, why = [], [], 0.0, float("inf"), ""
    while True:
        if on_status:
            new = kept is None and not bases
            on_status("computing the base image for comparison" if new else "timing the base image for comparison")
        (b, tb), (r, ts) = _timed(time_base), _timed(time_stack)
        bases.append(b)
        runs.append(r)
        spent, fastest = spent + tb + ts, min(fastest, tb + ts)
        if pairing.caller_times_base:
            break
        # pairs always timed: an expensive base (by its floor, which a stall cannot lift) is timed once
        first = pairing.cheap_pairs if pairing.cheap(price_ms([bases[0].timed]) / 1e3) else 1
        est = speedup([x.timed for x in bases], [x.timed for x in runs])
        # the crowding first: an interval that looks tight while other programs hold the cores shows no number
        if crowded is not None and crowded():
            why = CROWDED_PAIRS
        else:
            why = pairing.stop(est, len(runs), first, spent, fastest)
        if why:
            break
    return _timed_now(store, key, bases, runs, why)


def _timed_now(store: BaseStore, key: tuple, bases: list, runs: list, why: str, grouped: bool = False) -> Paired:
    """A pairing timed in this call: base's median run kept under `key` with every run's timing, the ratio over the
    pairs with why they stopped."""
    base = store.put(key, replace(entry_of(median_run(bases)), runs=tuple(x.timed for x in bases)))
    stack = tuple(x.timed for x in runs)
    r = replace(speedup(base.runs, stack), stop=why)
    return Paired(base, median_run(runs), len(runs), base_now=True, ratio=r, stack_runs=stack, grouped=grouped)


def _grouped(pairing: Pairing, store: BaseStore, key: tuple, time_base, time_stack, on_status, crowded) -> Paired:
    """side_by_side where alternating would load a weight set at every run: the stack's runs (its weights are in
    use), then as many of base's, paired in order; no pairs beyond them (each would load both sets again)."""
    runs = [time_stack()]
    first = pairing.cheap_pairs if pairing.cheap(price_ms([runs[0].timed]) / 1e3) else 1
    runs += [time_stack() for _ in range(first - 1)]
    if on_status:
        on_status("timing the base image for comparison (its weights load once)")
    bases = [time_base() for _ in runs]
    if crowded is not None and crowded():
        why = CROWDED_PAIRS
    else:
        why = TIGHT_STOP if speedup([x.timed for x in bases], [x.timed for x in runs]).tight else ONE_SET
    return _timed_now(store, key, bases, runs, why, grouped=True)


def watched(time_it, threads: int | None, store: BaseStore, key: tuple) -> Paired:
    """`time_it(crowded)`'s pairing, the cores watched when `threads` is given (a CPU timing): other programs holding
    them move the speed-up itself, so it is withheld, and a base timed meanwhile is kept for its picture only."""
    if threads is None:
        return time_it(None)
    with CoreWatch(threads) as watch:
        paired = time_it(lambda: watch.peek().crowded)
    c = watch.result
    if not c.crowded:
        return replace(paired, crowding=c)
    base = paired.base
    if paired.base_now and base is not None:
        base = store.put(key, replace(base, crowded=True))
    ratio = replace(paired.ratio, crowded=c.words()) if paired.ratio is not None else None
    return replace(paired, base=base, ratio=ratio, crowding=c)


def shape_timing(pairing: Pairing, shapes: BaseStore, shape: tuple, now: float | None = None) -> BaseEntry | None:
    """A kept, recent base timing of this shape (denoise time depends on the shape, not the prompt or seed) that may
    divide a run (compare `auto`); None: time base beside the run."""
    kept = shapes.get(shape)
    if kept is None or not kept.agreed or kept.age(now) > pairing.shape_max_age_s:
        return None
    return kept


def by_shape(shaped: BaseEntry, then: tuple[Run, ...], same_request: BaseEntry | None, time_stack) -> Paired:
    """The stack timed once, divided by the shape's kept base timing; `then` (the stack's runs beside that base)
    corrects for how the machine's speed moved since. The base picture: the same request's where kept, else none."""
    run = time_stack()
    base = replace(shaped, image=same_request.image if same_request is not None else None)
    r = estimate_by_shape(shaped.runs, then, run.timed)
    return Paired(base, run, 1, base_now=False, ratio=r, by_shape=True, stack_runs=(run.timed,))


def base_itself(pairing: Pairing, store: BaseStore, key: tuple, time_base) -> Paired:
    """A `base` run, repeated while cheap like a base beside any stack; bitwise equal to the kept picture, it refreshes
    the kept timing; different, it is news, shown against the kept one."""
    runs = [time_base()]
    if pairing.cheap(runs[0].denoise_s):
        runs += [time_base() for _ in range(pairing.cheap_pairs - 1)]
    run = median_run(runs)
    kept = store.get(key)
    timed = tuple(r.timed for r in runs)
    if kept is None or np.array_equal(kept.image, run.image):
        kept = store.put(key, replace(entry_of(run), runs=timed))
        # base against itself, the same runs: 1.00x by construction, not a measurement with an interval
        return Paired(kept, run, len(runs), base_now=False, ratio=exact_one(len(runs)))
    return Paired(kept, run, len(runs), base_now=False, ratio=speedup(kept.runs, timed))
