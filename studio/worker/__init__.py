"""worker: the supervised process that owns the device, off ZeroGPU; the app's Studio facade is its client.

The app's side (client), the worker process (server), the device calls over a Runner and the same calls in-process
on ZeroGPU (service), the messages and the one error boundary (protocol), the CLI's reruns after a crash (reruns),
library chatter (quiet): docs/architecture.md's table. The worker supervises every contained run (the app's clicks,
the CLI's bench and doctor); bench/raw.py's plain pipelines and bench/busy.py's load are no contained runs.

Importing this package, `client` or `protocol` loads no torch; `server` and `service` load the engine.
"""

from __future__ import annotations

import atexit
import logging

from studio.spec.devices import zerogpu_torch_note
from studio.spec.errors import ModelLoadError
from studio.worker.client import WorkerClient
from studio.worker.protocol import Device, WorkerConfig, WorkerCrashed

__all__ = ["Device", "WorkerClient", "WorkerConfig", "WorkerCrashed", "start_device"]


def _load_at_import(runner) -> None:
    """ZeroGPU: the pipeline loads at import, in the main process (`spaces` defers its move to the GPU into each call's
    forked process, which inherits the loaded weights), not lazily inside the first GPU call, whose reserved
    seconds would then go on reading weights. A model that cannot load is said by the first request instead."""
    try:
        runner.manager.ensure(runner.model)
    except ModelLoadError as e:
        logging.getLogger("studio").warning("loading %s at import failed: %s", runner.model, e)


def _say_torch() -> None:
    """On ZeroGPU: a torch release its documentation does not list is said in the Space's log at start."""
    import torch

    note = zerogpu_torch_note(torch.__version__)
    if note:
        logging.getLogger("studio").warning("%s", note)


def start_device(config: WorkerConfig, *, warm: list[str] | tuple[str, ...] = ()) -> Device:
    """The app's device: the engine in this process on ZeroGPU (where each device event's handler already runs in a
    process `spaces` forks), a supervised worker process everywhere else.

    Args:
        warm: the presets a restarted worker warms up again on the current model (the app's pre-warm list).
    """
    if config.settings is not None and config.settings.zerogpu:
        from studio.worker.service import InProcess, runner_for  # (torch: on ZeroGPU only; elsewhere none loads)

        runner = runner_for(config)
        _say_torch()
        device = InProcess(runner)
        _load_at_import(runner)
        atexit.register(device.close)  # parallel workers and a Ray runtime started for them end with the app
        return device
    return WorkerClient(config, warm=warm or ("base",))
