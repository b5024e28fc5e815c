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


@dataclass
class StepRecord:
    transformer_calls: int
    last_block_runs: int

    @property
    def cached(self) -> bool:
        return self.last_block_runs < self.transformer_calls


@dataclass
class StepProbe:
    """Attach to a pipeline for one run; pass `probe` as callback_on_step_end (it chains `on_step`)."""

    transformer: torch.nn.Module
    device: torch.device
    on_step: object | None = None  # callable(step_index, total, record) for progress reporting
    total_steps: int = 0
    steps: list[StepRecord] = field(default_factory=list)

    def __post_init__(self):
        self._clock = _Clock(self.device)
        self._calls = 0
        self._runs = 0
        self._handles = []

    def __enter__(self) -> "StepProbe":
        self._handles.append(self.transformer.register_forward_pre_hook(self._pre_call))
        target = last_block_probe_target(self.transformer)
        if target is not None:
            self._handles.append(target.register_forward_hook(self._block_ran))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _pre_call(self, module, args):
        if not self._clock.marks:
            _sync(self.device)
            self._clock.mark()
        self._calls += 1

    def _block_ran(self, module, args, output):
        self._runs += 1

    def __call__(self, pipe, step_index, timestep, callback_kwargs):
        self._clock.mark()
        self.steps.append(StepRecord(self._calls, self._runs))
        self._calls = self._runs = 0
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
