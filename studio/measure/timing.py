"""Denoise timing (first transformer call to the last scheduler step's end: no text encoding, no VAE decoding) and step
accounting: computed steps are counted by a hook on the last block's last Linear, else by the cache backend's own
record where compiled blocks hide it; `count_steps` cross-checks. torch is imported where used: the app's process
reads `StepCounts` and `StepRecord` and never loads torch."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from studio.measure.blocks import block_list
from studio.measure.clock import sync

if TYPE_CHECKING:
    import torch


def last_block_probe_target(transformer) -> torch.nn.Module | None:
    """The last Linear inside the transformer's last block: it runs only when the full stack runs."""
    import torch

    lists = [m for _, m in transformer.named_children() if isinstance(m, torch.nn.ModuleList) and len(m) > 0]
    if not lists:
        return None
    last_block = lists[-1][-1]
    linears = [m for m in last_block.modules() if isinstance(m, torch.nn.Linear)]
    return linears[-1] if linears else last_block


def block_count(transformer) -> int:
    """How many transformer blocks one full call runs: every block of every block list (FLUX: double + single)."""

    return len(block_list(transformer))


class _Clock:
    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.marks: list = []

    def mark(self) -> None:
        if self.cuda:
            import torch

            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append(ev)
        else:
            self.marks.append(time.perf_counter())

    def seconds(self) -> list[float]:
        """Seconds of each mark after the first, relative to the first."""
        if len(self.marks) < 2:
            return []
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)
            return [self.marks[0].elapsed_time(m) / 1000.0 for m in self.marks[1:]]
        return [m - self.marks[0] for m in self.marks[1:]]


class StepCounter:
    """Persistent hooks on a transformer, installed once, before any torch.compile: a pre-hook counts calls and marks
    the loop's start; a hook on the last block's last Linear counts full runs (it does not fire inside a compiled
    block: trusted only while `hooks_see_blocks`); `state_reader`, where set, says from the cache backend's per-call
    state whether a call ran the full stack (First-Block-Cache's is written outside the graph: right under compile)."""

    def __init__(self):
        self.calls = 0
        self.runs = 0
        self.state_runs = 0
        self.on_first_call = None  # set by a probe to mark the start of the denoising loop
        self.state_reader = None  # callable() -> bool, or None
        self.hooks_see_blocks = True

    def _on_call(self, module, args):
        self.calls += 1
        if self.on_first_call is not None:
            fn, self.on_first_call = self.on_first_call, None
            fn()

    def _on_run(self, module, args, output):
        self.runs += 1

    def _after_call(self, module, args, output):
        if self.state_reader is not None and self.state_reader():
            self.state_runs += 1

    def install(self, transformer) -> "StepCounter":
        transformer.register_forward_pre_hook(self._on_call)
        transformer.register_forward_hook(self._after_call)
        self._target = last_block_probe_target(transformer)
        self._handle = None
        self.see_blocks(True)
        return self

    def see_blocks(self, on: bool) -> None:
        """Attach the last-block hook (eager blocks) or take it off (before the blocks are compiled: inside a graph
        it cannot count, and Dynamo would guard on the counter's value and recompile on every call)."""
        if on and self._handle is None and self._target is not None:
            self._handle = self._target.register_forward_hook(self._on_run)
        elif not on and self._handle is not None:
            self._handle.remove()
            self._handle = None
        self.hooks_see_blocks = self._handle is not None

    def snapshot(self) -> tuple[int, int, int]:
        return (self.calls, self.runs, self.state_runs)


@dataclass
class StepRecord:
    """One denoising step: transformer calls, and how many of them ran the full stack by each source."""

    transformer_calls: int
    hook_runs: int | None  # None: the block hooks cannot see this step (compiled blocks)
    state_runs: int | None  # None: no backend state to read

    @property
    def cached(self) -> bool | None:
        runs = self.hook_runs if self.hook_runs is not None else self.state_runs
        return None if runs is None else runs < self.transformer_calls


@dataclass
class StepProbe:
    """Measures one run; pass it as callback_on_step_end (it chains `on_step` for progress reporting).
    `starts_at_call`: start the clock on entering, not at the first call (whole-model compile drops the pre-hook)."""

    counter: StepCounter
    device: torch.device
    on_step: object | None = None  # callable(step_index, total, record)
    total_steps: int = 0
    starts_at_call: bool = False
    clock: object | None = None  # injectable for tests: an object with mark() and seconds()
    steps: list[StepRecord] = field(default_factory=list)

    def __post_init__(self):
        self._clock = self.clock or _Clock(self.device)
        self._clock_is_async = getattr(self._clock, "cuda", False)
        self._excluded: list[tuple[int, float]] = []  # (marks taken before it, seconds of progress reporting)
        self._last = (0, 0, 0)

    def __enter__(self) -> "StepProbe":
        self._last = self.counter.snapshot()
        if self.starts_at_call:
            self._start()
        else:
            self.counter.on_first_call = self._start
        return self

    def __exit__(self, *exc) -> None:
        self.counter.on_first_call = None

    def _start(self):
        sync(self.device)
        self._clock.mark()

    def __call__(self, pipe, step_index, timestep, callback_kwargs):
        self._clock.mark()
        now = self.counter.snapshot()
        calls, runs, state = (b - a for a, b in zip(self._last, now))
        self._last = now
        rec = StepRecord(
            calls,
            runs if self.counter.hooks_see_blocks else None,
            state if self.counter.state_reader is not None else None,
        )
        self.steps.append(rec)
        if self.on_step is not None:
            t0 = time.perf_counter()
            self.on_step(step_index, self.total_steps, rec)
            if not self._clock_is_async:
                # Progress reporting is not denoising: keep its host time out of the next step's time. (A CUDA
                # clock runs on the stream, where host-side callbacks overlap queued work: nothing to take out.)
                self._excluded.append((len(self._clock.marks), time.perf_counter() - t0))
        return callback_kwargs

    # results -----------------------------------------------------------------------------------------------
    def _ends(self) -> list[float]:
        """End of each step relative to the start, less the progress reporting that ran before it."""
        ends = self._clock.seconds()
        return [e - sum(x for n, x in self._excluded if n <= i + 1) for i, e in enumerate(ends)]

    def step_seconds(self) -> list[float]:
        ends = self._ends()
        return [b - a for a, b in zip([0.0] + ends[:-1], ends)]

    def denoise_seconds(self) -> float:
        sync(self.device)
        ends = self._ends()
        return ends[-1] if ends else 0.0


@dataclass(frozen=True)
class StepCounts:
    """Which steps were served from the cache, where that count came from, and whether two sources agree."""

    total: int
    cached_indices: list[int]
    source: str
    check: str | None = None  # "agrees with ..." or "DISAGREES: ..."; None when only one source exists

    @property
    def cached(self) -> int:
        return len(self.cached_indices)

    @property
    def full(self) -> int:
        return self.total - len(self.cached_indices)

    @property
    def disagree(self) -> bool:
        return bool(self.check) and self.check.startswith("DISAGREES")


def count_steps(steps: list[StepRecord], backend: str, backend_cached: list[int] | None) -> StepCounts:
    """Cached/full counts from the most direct source this run has, cross-checked with the others; `backend_cached`:
    the cache backend's own list of cached step indices (cache-dit keeps one), else None."""
    n = len(steps)
    by_hooks = [i for i, s in enumerate(steps) if s.hook_runs is not None and s.hook_runs < s.transformer_calls]
    hooks_ok = all(s.hook_runs is not None for s in steps)
    by_state = [i for i, s in enumerate(steps) if s.state_runs is not None and s.state_runs < s.transformer_calls]
    state_ok = n > 0 and all(s.state_runs is not None for s in steps)
    candidates = []  # (name, indices), most direct first
    if hooks_ok:
        candidates.append(("block hooks", by_hooks))
    if backend_cached is not None:
        candidates.append((backend, sorted(backend_cached)))
    if state_ok:
        candidates.append((f"{backend} state", by_state))
    if not candidates:
        if backend != "none":
            return StepCounts(n, [], "unknown", f"DISAGREES: no source can see cached steps of {backend} here")
        return StepCounts(n, [], "no step cache engaged: every step computed")
    (name, idx), others = candidates[0], candidates[1:]
    check = None
    if others:
        bad = [(o, i) for o, i in others if i != idx]
        if bad:
            check = "DISAGREES: " + "; ".join(f"{o} says {i}" for o, i in bad) + f"; {name} say {idx}"
        else:
            check = "agrees with " + ", ".join(o for o, _ in others)
    return StepCounts(n, idx, name, check)
