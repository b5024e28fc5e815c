"""What a cached step should cost, measured from a clock around every transformer block: were the cache's decision
free, the full step less the blocks it skips (share = (full - calls x skipped blocks' medians) / full; ideal speed-up
= steps / (full + cached x share)). A compiled block cannot be wrapped (the wrapper would be traced into the graph): a
compiled stack takes the shares of an eager run of its model and shape."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from studio.measure.estimate import Estimate

# torch is imported where blocks are timed: the records below cross to the app's process, which loads no torch


def block_names(transformer) -> list[str]:
    """The names of every block one full call runs, in order (FLUX: double-stream, then single-stream: cache-dit's
    order too), as `transformer.get_submodule` takes them."""
    import torch

    return [
        f"{name}.{i}"
        for name, m in transformer.named_children()
        if isinstance(m, torch.nn.ModuleList)
        for i in range(len(m))
    ]


def block_list(transformer) -> list:
    return [transformer.get_submodule(n) for n in block_names(transformer)]


class BlockClock:
    """Every block's calls timed for one run (eager blocks only): each block's median over the full calls, those the
    StepCounter saw run the whole stack (a cache may still call a block it skips, and return at once). It wraps each
    block's `forward` (restored by `remove`) rather than hooking it: hooks take torch's slow call path, 1-2% of a run.
    `clock`: a test's callable returning seconds (else perf_counter off CUDA); without `counter` every call counts."""

    def __init__(self, device, clock=None, counter=None):
        self.cuda = device.type == "cuda" and clock is None
        self._now = clock or time.perf_counter
        self._counter = counter
        self._runs0 = counter.runs if counter is not None else 0
        self._spans: dict[int, list] = {}  # block index -> [(start, end, transformer call, full calls so far)]
        self._wrapped: list = []  # (block, its own `forward` attribute before, or None)

    def install(self, transformer) -> BlockClock:
        for i, block in enumerate(block_list(transformer)):
            self._spans[i] = []
            self._wrapped.append((block, block.__dict__.get("forward")))  # a library's own wrapper, kept under ours
            block.forward = self._timed(block.forward, self._spans[i])
        return self

    def remove(self) -> None:
        for block, before in self._wrapped:
            if before is None:
                del block.forward
            else:
                block.forward = before
        self._wrapped = []

    def _timed(self, forward, spans: list):
        mark, counter = self._mark, self._counter

        def timed_forward(*args, **kwargs):
            start = mark()
            out = forward(*args, **kwargs)
            spans.append((start, mark(), *((counter.calls, counter.runs) if counter is not None else (0, 0))))
            return out

        return timed_forward

    def _mark(self):
        if self.cuda:
            import torch

            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return self._now()

    def full_calls(self) -> set[int] | None:
        """The transformer calls that ran the whole stack (None: no counter, every call counts): a call whose last
        span ended with more full runs counted than the call before it had."""
        if self._counter is None:
            return None
        last: dict[int, int] = {}  # call -> full runs counted at its last span's end
        for spans in self._spans.values():
            for *_, call, runs in spans:
                last[call] = max(last.get(call, runs), runs)
        full, before = set(), self._runs0
        for call in sorted(last):
            if last[call] > before:
                full.add(call)
            before = last[call]
        return full

    def block_ms(self) -> list[float | None]:
        """The median time of each block over the full calls it ran in (None: it ran in none)."""
        if self.cuda:
            import torch

            torch.cuda.synchronize()
        full = self.full_calls()
        out = []
        for i in sorted(self._spans):
            spans = [(a, b) for a, b, call, _ in self._spans[i] if full is None or call in full]
            if not spans:
                out.append(None)
            elif self.cuda:
                out.append(statistics.median(a.elapsed_time(b) for a, b in spans))
            else:
                out.append(statistics.median((b - a) * 1e3 for a, b in spans))
        return out


@dataclass(frozen=True)
class CachedStepPrice:
    """The measured price of a cached step, as a share of a full one (module doc)."""

    share: float  # ideal cached step / full step, in (0, 1]
    full_step_ms: float  # the median full step it was priced against
    skipped_ms: float  # per step: calls x the skipped blocks' median times
    source: str  # where the block times came from, in words
    block_ms: tuple = ()  # each block's median time per call
    computed: tuple = ()  # the block indices a cached step runs
    calls: int = 1  # transformer calls per step

    def as_dict(self) -> dict:
        return {
            "share": self.share,
            "full_step_ms": self.full_step_ms,
            "skipped_ms": self.skipped_ms,
            "source": self.source,
            "block_ms": list(self.block_ms),
            "computed": list(self.computed),
            "calls": self.calls,
        }

    def ideal_speedup(self, full: int, cached: int) -> float | None:
        steps = full + cached
        if steps == 0:
            return None
        return steps / (full + cached * self.share)


def price_cached_step(
    block_ms: list[float | None], full_step_ms: float, calls: int, computed: set[int], source: str
) -> CachedStepPrice | None:
    """The ideal cached step of a cache that computes the blocks `computed` (indices), or None when a skipped block's
    time is unknown (it never ran) or the full step cannot be priced."""
    skipped = [t for i, t in enumerate(block_ms) if i not in computed]
    if full_step_ms <= 0 or any(t is None for t in skipped):
        return None
    skipped_ms = calls * sum(skipped)
    share = max(0.0, full_step_ms - skipped_ms) / full_step_ms
    return CachedStepPrice(share, full_step_ms, skipped_ms, source, tuple(block_ms), tuple(sorted(computed)), calls)


def computed_blocks(n_blocks: int, first: int, last: int) -> set[int]:
    """The block indices a cached step still runs: the first `first` and the last `last`."""
    return set(range(min(first, n_blocks))) | set(range(max(0, n_blocks - last), n_blocks))


IMPOSSIBLE = 1.05  # a speed-up whose whole interval lies over 1.05x its ideal is a measurement error, not a result


@dataclass(frozen=True)
class IdealCheck:
    """A cached run's speed-up over the same stack without its cache, against the ideal its counts allow."""

    ideal: float  # steps / (full + cached x share)
    measured: Estimate | None  # the run's speed-up over `against` (studio.measure.estimate); None: no reading
    against: str  # the non-cache reference: "base", or "its own full steps" (a compiled / quantized stack)
    price: CachedStepPrice

    @property
    def of_ideal(self) -> float | None:
        """Measured over ideal: what the cache's decision and bookkeeping cost (1.0: nothing). None with no reading,
        or with its point over IMPOSSIBLE x the ideal: an ideal the run beats is not shown as a result."""
        if self.measured is None or self.measured.point > IMPOSSIBLE * self.ideal:
            return None
        return self.measured.point / self.ideal

    @property
    def of_ideal_range(self) -> tuple[float, float] | None:
        """The measured interval over the ideal."""
        if self.of_ideal is None:
            return None
        return self.measured.lo / self.ideal, self.measured.hi / self.ideal

    @property
    def impossible(self) -> bool:
        """The whole interval over IMPOSSIBLE x the ideal: the counts cannot give that; a measurement error."""
        return self.measured is not None and self.measured.lo > IMPOSSIBLE * self.ideal

    def why_not_shown(self) -> str | None:
        """Why `of_ideal` is not shown where there is a reading: the whole interval over the ideal (`why_impossible`),
        or its point: a ratio over 1 would read as a cache beating its own skipped work. None: shown or no reading."""
        if self.measured is None or self.of_ideal is not None:
            return None
        if self.impossible:
            return self.why_impossible()
        m = self.measured
        return (
            f"not shown: {m.point:.2f}x ({m.lo:.2f}-{m.hi:.2f}) over {self.against} is over the ideal its counts "
            f"allow ({self.ideal:.2f}x, a cached step priced at {self.price.share:.2f} of a full one, "
            f"{self.price.source}); the ideal is no bound for this run, so no share of it is read"
        )

    def why_impossible(self) -> str | None:
        if not self.impossible:
            return None
        m = self.measured
        return (
            f"measurement error: {m.point:.2f}x ({m.lo:.2f}-{m.hi:.2f}) over {self.against} is more than this run's "
            f"counts can give (ideal {self.ideal:.2f}x, a cached step priced at {self.price.share:.2f} of a full one, "
            f"{self.price.source}); not shown"
        )
