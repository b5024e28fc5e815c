"""The device calls over one Runner, served by the worker process or run in the app's own on ZeroGPU (`InProcess`).
Arguments and results are plain data and progress comes through keyword callbacks, so a call can cross a pipe."""

from __future__ import annotations

import os
from pathlib import Path

from studio.bench.bench import BenchReport, run_bench
from studio.bench.doctor import DoctorRow, check_family, family_instance
from studio.bench.matrix import run_matrix
from studio.bench.records import TuneResult
from studio.bench.tune import QUICK, tune
from studio.engine import BASE, ModelManager, Runner, RunResult
from studio.engine.plan import make_plan
from studio.engine.quantize import exported_quant
from studio.engine.resolve import resolved
from studio.engine.thread import DEVICE_THREAD
from studio.report.fmt import on_this_machine
from studio.report.plan import plan_text
from studio.report.table import Matrix
from studio.spec.cachedit import step_mask
from studio.spec.devices import named
from studio.spec.export import cache_dit_yaml
from studio.spec.preset import CacheSpec, Preset
from studio.spec.request import GenerationRequest
from studio.worker.protocol import OPS, Device, WorkerConfig, crossing


class DeviceService:
    """The studio's device work, named calls over one Runner."""

    OPS = OPS

    def __init__(self, runner: Runner):
        self.runner = runner

    # time_limit_s: the request's time limit (Runner.time_limit), None: none.
    def generate(self, request: GenerationRequest, preset=BASE, *, time_limit_s=None, **kwargs) -> RunResult:
        """Runner.generate: one measured generation compared with its base."""
        with self.runner.time_limit(time_limit_s):
            return self.runner.generate(request, preset, **kwargs)

    def matrix(self, request: GenerationRequest, presets: list, *, time_limit_s=None, **kwargs) -> Matrix:
        with self.runner.time_limit(time_limit_s):
            return run_matrix(self.runner, request, presets, **kwargs)

    def tune(
        self,
        requests: list[GenerationRequest],
        floor_db: float,
        *,
        model=None,
        progress=None,
        quick=True,
        time_limit_s=None,
        max_flip=None,
    ) -> TuneResult:
        """studio.bench.tune; `quick`: the UI's small search space; `max_flip`: FLIP's ceiling (None: PSNR alone)."""
        space = QUICK if quick else None
        with self.runner.time_limit(time_limit_s):
            return tune(
                self.runner, requests, floor_db, model=model, progress=progress, space=space, max_flip=max_flip
            )

    def bench(self, requests: list[GenerationRequest], presets: list | None = None, **kwargs) -> BenchReport:
        """studio.bench.run_bench (the CLI's bench; `exclude`: the stacks that crashed a worker before)."""
        return run_bench(self.runner, requests, presets, **kwargs)

    def doctor_family(
        self, family: str, folder: str, presets: list[str], *, on_status=None, on_row=None
    ) -> list[DoctorRow]:
        """The doctor's presets on one family's tiny instance in `folder`, each row sent when done (`on_row`) so a
        crash loses none."""
        instance = family_instance(family, Path(folder), on_status)
        return check_family(family, instance, presets, self.runner, on_status, on_row)

    def export(self, preset: Preset, steps: int | None = None) -> str:
        """The preset as the YAML cache_dit.load_configs reads (built with cache-dit's config objects: torch)."""
        profile = self.runner.manager.profile
        here = on_this_machine(resolved(preset, profile, self.runner.manager.settings.dtype))
        return cache_dit_yaml(preset, steps, exported_quant(preset, profile), here)

    def step_mask(self, spec: CacheSpec, steps: int) -> list[int] | None:
        """The spec's step mask sized to `steps` (cache-dit builds it: torch); None without one."""
        return step_mask(spec, steps)

    def resolved(self, preset: Preset) -> str:
        """What the preset's device-dependent parts (dtype, 8-bit form, attention) become on this device, in words."""
        manager = self.runner.manager
        return on_this_machine(resolved(preset, manager.profile, manager.settings.dtype))

    def plan(self, preset: Preset, device: str, model: str | None = None) -> str:
        """What `preset` would run on `device` (`here` or a named profile) for `model`, with reasons and its memory
        plan, in words."""
        manager = self.runner.manager
        profile = manager.profile if device == "here" else named(device)
        plan = make_plan(profile, model or self.runner.model, preset, None, manager.settings.device_memory_gb)
        return plan_text(plan)

    def warm_up(self, request: GenerationRequest, presets: list[str], model: str | None = None) -> list[float]:
        """Runner.warm_up of the presets this runner knows (unknown names skipped)."""
        known = self.runner.presets.names()
        return self.runner.warm_up(request, [n for n in presets if n in known], model)

    def info(self) -> dict:
        """Where the device stands: its process, the loaded model, the kept bases, the threads that ran torch."""
        cur = self.runner.manager.current
        return {
            "pid": os.getpid(),
            "device": str(self.runner.manager.device),
            "model": cur.source if cur is not None else None,
            "bases": len(self.runner.bases),
            "bases_size": self.runner.bases.size,
            "device_thread": DEVICE_THREAD._ident,
        }


def runner_for(config: WorkerConfig, cls=Runner) -> Runner:
    """The engine a WorkerConfig describes (`cls`: the worker's WatchedRunner)."""
    allowed = list(config.allowed) if config.allowed is not None else None
    manager = ModelManager(config.device, allowed=allowed, settings=config.settings)
    runner = cls(manager, config.presets, model=config.model, max_steps=config.max_steps, max_side=config.max_side)
    runner.pairing = config.pairing or runner.pairing
    return runner


def _on_device_thread(op: str):
    def call(self, *args, **kwargs):
        try:
            return DEVICE_THREAD.call(getattr(self.service, op), *args, **kwargs)
        except Exception as e:  # the worker's boundary: a user error as it is, anything else logged and said as a bug
            said = crossing(e, op)
            if said is e:
                raise
            raise said from e

    call.__name__ = op
    call.__doc__ = f"DeviceService.{op}, on this process's device thread (studio.engine.thread)."
    return call


class InProcess(Device):
    """The device in the app's own process, every call on its device thread: on ZeroGPU (a worker inside `spaces`'
    own process would hold a second copy of the model) and in tests over a Runner."""

    def __init__(self, runner: Runner):
        super().__init__(runner.model, runner.presets)
        self.runner = runner
        self.service = DeviceService(runner)
        self._closed = False

    @property
    def caps(self) -> tuple[int | None, int | None, int | None]:
        return (self.runner.max_steps, self.runner.max_side, self.runner.manager.settings.max_prompt_chars)

    def kept(self):
        return DEVICE_THREAD.call(self.runner.kept)

    def keep(self, kept) -> None:
        DEVICE_THREAD.call(self.runner.keep, kept)

    def close(self) -> None:
        """Unload the model, once (parallel workers and a Ray runtime started for them end with it)."""
        if self._closed:
            return
        self._closed = True
        try:
            done = DEVICE_THREAD.submit(self.runner.manager.unload)
        except RuntimeError:  # at exit the device thread's pool takes no more work, and nothing else runs torch now
            self.runner.manager.unload()
            return
        done.result()


for _op in OPS:
    setattr(InProcess, _op, _on_device_thread(_op))
