"""worker: the supervised process that owns the device, off ZeroGPU; the app's Studio facade is its client.

    client.WorkerClient   the app's side: starts the worker, one call at a time, progress streamed back, a crash
                          ended with one sentence, the crashed stack refused, the worker restarted and reloaded
    server                the worker process: the Runner, the loaded model and the device thread
    service               the device calls over a Runner (`DeviceService`), and `InProcess`, the same calls in the
                          app's own process (ZeroGPU, where `spaces` runs handlers in a process of its own already)
    protocol              the messages, the config, the one error boundary (`crossing`: user errors as they are,
                          anything else logged and said as a bug in the studio), the facade's base `Device`
    reruns                the CLI's bench and doctor over the worker: run again without a stack that crashed it
    quiet                 library chatter below errors (the CLI's process and the worker it starts)

The worker is the one supervisor of every contained run: the app's clicks, the CLI's bench and doctor. The other
processes the studio starts are no contained runs: bench/raw.py's plain-diffusers pipelines (`bench --vs-raw`, started
by the bench inside the worker; they import nothing of the studio, and a death there is a row's note) and
bench/busy.py's CPU-bound load (the other program of `python -m studio busy`).

Importing this package, `client` or `protocol` loads no torch; `server` and `service` load the engine.
"""

from __future__ import annotations

import atexit

from studio.spec.errors import ModelLoadError
from studio.spec.hosting import on_zerogpu
from studio.worker.client import WorkerClient
from studio.worker.protocol import Device, WorkerConfig, WorkerCrashed

__all__ = ["Device", "WorkerClient", "WorkerConfig", "WorkerCrashed", "start_device"]


def _load_at_import(runner) -> None:
    """ZeroGPU: the pipeline loads at import, in the main process (`spaces` defers its move to the GPU into each call's
    forked process, which inherits the loaded weights), not lazily inside the first GPU call, whose reserved
    seconds would then go on reading weights. A model that cannot load is said by the first request instead."""
    import logging

    try:
        runner.manager.ensure(runner.model)
    except ModelLoadError as e:
        logging.getLogger("studio").warning("loading %s at import failed: %s", runner.model, e)


def start_device(config: WorkerConfig, *, warm: list[str] | tuple[str, ...] = ()) -> Device:
    """The app's device: the engine in this process on ZeroGPU (where each device event's handler already runs in a
    process `spaces` forks), a supervised worker process everywhere else.

    Args:
        warm: the presets a restarted worker warms up again on the current model (the app's pre-warm list).
    """
    if on_zerogpu():
        from studio.engine import ModelManager, Runner  # (torch: on ZeroGPU only; elsewhere the app loads none)
        from studio.worker.service import InProcess

        allowed = list(config.allowed) if config.allowed is not None else None
        runner = Runner(
            ModelManager(config.device, allowed=allowed, settings=config.settings),
            config.presets,
            model=config.model,
            max_steps=config.max_steps,
            max_side=config.max_side,
        )
        runner.pairing = config.pairing or runner.pairing
        device = InProcess(runner)
        _load_at_import(runner)
        atexit.register(device.close)  # parallel workers and a Ray runtime started for them end with the app
        return device
    return WorkerClient(config, warm=warm or ("base",))
