"""worker: the supervised process that owns the device off ZeroGPU (the app's and the CLI's contained runs), or the
same calls in-process on ZeroGPU. Importing this package, `client` or `protocol` loads no torch; `server` and
`service` load the engine."""

from __future__ import annotations

import atexit
import logging

from studio.spec.devices import zerogpu_torch_note
from studio.spec.errors import ModelLoadError
from studio.worker.client import WorkerClient
from studio.worker.protocol import Device, WorkerConfig, WorkerCrashed

__all__ = ["Device", "WorkerClient", "WorkerConfig", "WorkerCrashed", "start_device"]


def _load_at_import(runner) -> None:
    """ZeroGPU: load the pipeline in the main process, which each GPU call's fork inherits, so no call's reserved
    seconds go on reading weights. A model that cannot load is said by the first request instead."""
    try:
        runner.manager.ensure(runner.model)
    except ModelLoadError as e:
        logging.getLogger("studio").warning("loading %s at import failed: %s", runner.model, e)


def _say_torch() -> None:
    """Log a torch release that ZeroGPU's documentation does not list."""
    import torch

    note = zerogpu_torch_note(torch.__version__)
    if note:
        logging.getLogger("studio").warning("%s", note)


def start_device(config: WorkerConfig, *, warm: list[str] | tuple[str, ...] = ()) -> Device:
    """The app's device: the engine in this process on ZeroGPU (`spaces` already forks each event's handler), a
    supervised worker elsewhere. `warm`: the presets a restarted worker warms up again."""
    if config.settings is not None and config.settings.zerogpu:
        from studio.worker.service import InProcess, runner_for  # (torch: on ZeroGPU only; elsewhere none loads)

        runner = runner_for(config)
        _say_torch()
        device = InProcess(runner)
        _load_at_import(runner)
        atexit.register(device.close)  # parallel workers and a Ray runtime started for them end with the app
        return device
    return WorkerClient(config, warm=warm or ("base",))
