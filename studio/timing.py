"""Denoise timing and step accounting, measured from the pipeline itself.

The denoise time runs from the first transformer call to the end of the last scheduler step (the pipeline's
`callback_on_step_end`), so text encoding and VAE decoding are outside it. On CUDA, events are recorded on
the stream and read after one synchronize at the end; elsewhere `perf_counter` is read directly.

Which steps were really computed is counted independently of any cache backend: a forward hook on the last
Linear of the transformer's last block fires only when that block actually runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def last_block_probe_target(transformer) -> torch.nn.Module | None:
    """The last Linear inside the transformer's last block: it runs only when the full stack runs."""
    lists = [m for _, m in transformer.named_children() if isinstance(m, torch.nn.ModuleList) and len(m) > 0]
    if not lists:
        return None
    last_block = lists[-1][-1]
    linears = [m for m in last_block.modules() if isinstance(m, torch.nn.Linear)]
    return linears[-1] if linears else last_block


class _Clock:
    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.marks: list = []

    def mark(self) -> None:
        if self.cuda:
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
            torch.cuda.synchronize(self.device)
            return [self.marks[0].elapsed_time(m) / 1000.0 for m in self.marks[1:]]
        return [m - self.marks[0] for m in self.marks[1:]]


COUNTER_ATTR = "_studio_counter"
# Set on a transformer by optimize.compile (which imports it from here: timing must not import optimize).
COMPILE_MARK = "_studio_compiled"


class StepCounter:
    """Persistent hooks on a transformer, installed once BEFORE torch.compile (a hook added to a compiled block
    never fires): how many times the transformer was called and its last block really ran."""

    def __init__(self, before_compile: bool):
        self.calls = 0
        self.runs = 0
        self.on_first_call = None  # set by a probe to mark the start of the denoising loop
        self.before_compile = before_compile

    def _on_call(self, module, args):
        self.calls += 1
        if self.on_first_call is not None:
            fn, self.on_first_call = self.on_first_call, None
            fn()

    def _on_run(self, module, args, output):
        self.runs += 1


def install_counter(transformer) -> StepCounter:
    """The transformer's StepCounter, installing it on first use."""
    counter = getattr(transformer, COUNTER_ATTR, None)
    if counter is None:
        counter = StepCounter(before_compile=getattr(transformer, COMPILE_MARK, None) is None)
        transformer.register_forward_pre_hook(counter._on_call)
        target = last_block_probe_target(transformer)
        if target is not None:
            target.register_forward_hook(counter._on_run)
        setattr(transformer, COUNTER_ATTR, counter)
    return counter


@dataclass
class StepRecord:
    transformer_calls: int
    last_block_runs: int

    @property
    def cached(self) -> bool:
        return self.last_block_runs < self.transformer_calls


@dataclass
class StepProbe:
    """Measures one run; pass it as callback_on_step_end (it chains `on_step` for progress reporting)."""

    transformer: torch.nn.Module
    device: torch.device
    on_step: object | None = None  # callable(step_index, total, record)
    total_steps: int = 0
    steps: list[StepRecord] = field(default_factory=list)

    def __post_init__(self):
        self._clock = _Clock(self.device)
        compiled = getattr(self.transformer, COMPILE_MARK, None) or ""
        self._counter = install_counter(self.transformer)
        # Block hooks inside a compiled region count only if installed before compile, and not at all under
        # fullgraph=True (which is only used when no cache can skip a block, so every step is full).
        self.reliable = self._counter.before_compile and "fullgraph=True" not in compiled
        # Under whole-model compile the transformer's own pre-hook is compiled too: start at the pipeline call.
        self.starts_at_call = "whole transformer" in compiled
        self._last = (0, 0)

    def __enter__(self) -> "StepProbe":
        self._last = (self._counter.calls, self._counter.runs)
        if self.starts_at_call:
            _sync(self.device)
            self._clock.mark()
        else:
            self._counter.on_first_call = self._start
        return self

    def __exit__(self, *exc) -> None:
        self._counter.on_first_call = None

    def _start(self):
        _sync(self.device)
        self._clock.mark()

    def __call__(self, pipe, step_index, timestep, callback_kwargs):
        self._clock.mark()
        calls, runs = self._counter.calls, self._counter.runs
        d_calls, d_runs = calls - self._last[0], runs - self._last[1]
        self._last = (calls, runs)
        if not self.reliable:
            d_runs = d_calls
        self.steps.append(StepRecord(d_calls, d_runs))
        if self.on_step is not None:
            self.on_step(step_index, self.total_steps, self.steps[-1])
        return callback_kwargs

    # results -----------------------------------------------------------------------------------------------
    def step_seconds(self) -> list[float]:
        ends = self._clock.seconds()
        return [b - a for a, b in zip([0.0] + ends[:-1], ends)]

    def denoise_seconds(self) -> float:
        _sync(self.device)
        ends = self._clock.seconds()
        return ends[-1] if ends else 0.0

    @property
    def cached_indices(self) -> list[int]:
        return [i for i, s in enumerate(self.steps) if s.cached]
