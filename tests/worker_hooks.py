"""Instrumentation the tests put into a real device worker (the `worker_hook` setting, STUDIO_WORKER_HOOK: the worker
calls `module:function` with its runner and service once built; studio.worker.server.run_hook). It lives here, not
in the studio: production code carries no test-only crash.

    hook("crash_on", preset="cache")                   every run of `cache` dies by SIGSEGV at its third step
    hook("crash_on", preset="cache", once="/tmp/f")    ... only while the file does not exist (it is made first)
    hook("probe_threads")                              info() also says which OS threads called a transformer
"""

from __future__ import annotations

import json
import os
import resource
import signal
import threading
from dataclasses import replace

from studio.spec.settings import current

CRASH_AT_STEP = 2  # the denoising step (0-based) at which crash_on kills the worker


def hook(name: str, **kwargs) -> str:
    """The worker_hook setting's value for the hook `name` of this module with `kwargs`."""
    return f"tests.worker_hooks:{name}" + (f":{json.dumps(kwargs)}" if kwargs else "")


def hooked(name: str, **kwargs):
    """The settings a worker is started with (WorkerConfig.settings) to run the hook `name` of this module."""
    return replace(current(), worker_hook=hook(name, **kwargs))


def _fires(once: str | None) -> bool:
    if once is None:
        return True
    if os.path.exists(once):
        return False
    open(once, "w").close()
    return True


def crash_on(runner, service, preset: str, once: str | None = None) -> None:
    """The worker dies by SIGSEGV in the middle of every run of `preset`, as it would when a kernel segfaults, after
    its first steps have reached the app (`once`: only while that file does not exist, as a transient crash would).
    The worker's runner has already told the app which stack runs (the crash blame) when the step comes."""
    real = runner.generate

    def generate(request, stack="base", *, progress=None, **kw):
        name = stack if isinstance(stack, str) else stack.name
        if name.removesuffix(".override") == preset and _fires(once):  # (a stack switched per request: its own)

            def on_step(i, total, rec, inner=progress):
                if inner is not None:
                    inner(i, total, rec)
                if i == CRASH_AT_STEP:
                    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file from a crash made on purpose
                    os.kill(os.getpid(), signal.SIGSEGV)

            progress = on_step
        return real(request, stack, progress=progress, **kw)

    runner.generate = generate


def probe_threads(runner, service) -> None:
    """The OS thread of every transformer call, added to the worker's info() as `torch_threads`."""
    import torch

    seen: set[int] = set()

    def saw(module, args):
        if type(module).__name__.endswith("Transformer2DModel"):
            seen.add(threading.get_ident())

    torch.nn.modules.module.register_module_forward_pre_hook(saw)
    real = service.info
    service.info = lambda: {**real(), "torch_threads": sorted(seen)}
