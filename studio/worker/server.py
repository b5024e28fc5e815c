"""The device worker: a process of its own that owns the engine, so that a native crash in a kernel ends one request
instead of the whole app. Run as `python -m studio.worker.server FD` (its end of a socket pair); serves one call at a
time until ("stop",) or the app's end closes, then unloads the model."""

from __future__ import annotations

import faulthandler
import importlib
import json
import logging
import os
import pickle
import signal
import sys
from contextlib import contextmanager
from multiprocessing.connection import Connection

from studio.engine import BASE, Runner
from studio.engine.thread import DEVICE_THREAD
from studio.spec.checks import ConfigError
from studio.spec.errors import RunError
from studio.spec.settings import install
from studio.worker.protocol import WorkerConfig, crossing, error_message, stack_key
from studio.worker.quiet import quiet_libraries
from studio.worker.service import DeviceService, runner_for

log = logging.getLogger("studio.worker")

GONE = (BrokenPipeError, ConnectionResetError, EOFError)  # the app's end of the pipe is closed


class Call:
    """The call being served: its id, the pipe, and the stacks the app refuses (they crashed a worker before)."""

    def __init__(self, conn: Connection, call_id: int, refused: dict):
        self.conn, self.id, self.refused = conn, call_id, refused

    def send(self, kind: str, *rest) -> None:
        self.conn.send((kind, self.id) + rest)

    def callback(self, name: str):
        """The app's function `name`, called by message."""

        def call(*args):
            self.send("callback", name, args)

        return call


class WatchedRunner(Runner):
    """The worker's Runner: tells the app which stack runs (what a crash is blamed on; a stack's base run inside
    `generate` is the stack's) and refuses a stack that crashed a worker before."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.call: Call | None = None
        self._running: list[tuple[str, str, str]] = []  # (preset name, tag, model): nested (screen runs base first)

    def _stack(self, preset, model) -> tuple[str, str, str]:
        """What a crash is blamed on: the stack as it runs."""
        p = self.resolve_preset(preset)
        return p.name, p.tag(self.manager.resolve_dtype(p.dtype).name), model or self.model

    def _refusal(self, stack: tuple[str, str, str]) -> str | None:
        return (self.call.refused if self.call else {}).get(stack_key(stack[2], stack[1]))

    @contextmanager
    def _runs(self, stack: tuple[str, str, str]):
        reason = self._refusal(stack)
        if reason:
            raise RunError(reason)
        self._running.append(stack)
        if self.call:
            self.call.send("running", *stack)
        try:
            yield
        finally:
            self._running.pop()
            if self._running and self.call:  # back to the stack that ran this one
                self.call.send("running", *self._running[-1])

    def generate(self, request, preset=BASE, *, model=None, **kwargs):
        p = self.resolve_preset(preset)  # once: Runner.generate takes the stack as it is
        with self._runs(self._stack(p, model)):
            return super().generate(request, p, model=model, **kwargs)

    def screen(self, request, preset, model=None):
        with self._runs(self._stack(preset, model)):
            return super().screen(request, preset, model)

    def settle(self, request, preset, model=None) -> float:
        with self._runs(self._stack(preset, model)):  # (the bench's untimed first run of a rotation)
            return super().settle(request, preset, model)

    def warm_up(self, request, presets, model=None) -> list[float]:
        """Runner.warm_up one preset at a time, so a crash is blamed on the right one; a refused stack gets 0.0."""
        out = []
        for name in presets:
            stack = self._stack(name, model)
            if self._refusal(stack):
                out.append(0.0)
                continue
            with self._runs(stack):
                out += super().warm_up(request, [name], model)
        return out


def _serve_call(service: DeviceService, conn: Connection, msg: tuple) -> tuple:
    """One call, on the device thread: its result or its error as a message (the worker keeps serving)."""
    _, call_id, op, args, kwargs, callbacks, refused = msg
    call = Call(conn, call_id, refused)
    service.runner.call = call
    try:
        if op not in DeviceService.OPS:
            raise RunError(f"the device worker has no call {op!r}; it serves {', '.join(DeviceService.OPS)}")
        kwargs = dict(kwargs, **{name: call.callback(name) for name in callbacks})
        return ("done", call_id, getattr(service, op)(*args, **kwargs))
    except GONE:
        raise  # the app is gone: nobody to answer
    except Exception as e:  # every other failure goes back as its sentence (a bug: logged), the worker keeps serving
        return ("error", call_id, *error_message(crossing(e, op)))
    finally:
        service.runner.call = None


def run_hook(spec: str, runner: Runner, service: DeviceService) -> None:
    """Call STUDIO_WORKER_HOOK ("module:function[:{json}]") with the runner, the service and the JSON's keywords; one
    that cannot be found or read fails the worker's start."""
    module, _, rest = spec.partition(":")
    name, _, args = rest.partition(":")
    try:
        hook = getattr(importlib.import_module(module), name)
        kwargs = json.loads(args) if args else {}
    except (ImportError, AttributeError, json.JSONDecodeError) as e:
        raise ConfigError(f"STUDIO_WORKER_HOOK={spec!r}: {type(e).__name__}: {e} (module:function[:json])") from e
    hook(runner, service, **kwargs)


def serve(conn: Connection, config: WorkerConfig) -> None:
    """The worker's loop: one call at a time until ("stop",) or the app's end closes."""
    install(config.settings)
    runner = runner_for(config, WatchedRunner)
    service = DeviceService(runner)
    if config.settings.worker_hook:
        run_hook(config.settings.worker_hook, runner, service)
    try:
        conn.send(("ready", os.getpid()))
        while True:
            msg = conn.recv()
            if msg[0] == "stop":
                break
            reply = DEVICE_THREAD.call(_serve_call, service, conn, msg)
            try:
                conn.send(reply)
            except (pickle.PicklingError, TypeError, AttributeError) as e:  # a result that cannot cross: a bug, said
                conn.send(("error", reply[1], *error_message(crossing(e, msg[2]))))
    except GONE:
        log.warning("the app's end of the pipe closed: the device worker stops")
    finally:
        DEVICE_THREAD.call(runner.manager.unload)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    # A native crash prints the Python stack of every thread to stderr before the worker dies (the app then says
    # which stack it was running).
    faulthandler.enable()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in the terminal is the app's: the app stops the worker
    logging.basicConfig(level=logging.WARNING, format="[device worker %(process)d] %(levelname)s: %(message)s")
    # Everything the worker says goes through its pipe: what libraries print (cache-dit, a kernel's own printf) goes
    # to stderr, never into the stdout of the app or of the CLI (whose --json is read from it).
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    fd = int(argv[0])
    os.set_inheritable(fd, False)  # processes this worker starts (Ray, compile workers) do not hold the app's pipe
    conn = Connection(fd)
    config = conn.recv()
    if config.quiet:
        quiet_libraries()
    serve(conn, config)


if __name__ == "__main__":
    main()
