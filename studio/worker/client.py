"""The app's side of the device worker (no torch): starts it as a process of its own, sends it one call at a time,
and streams its progress back to the caller's functions. Crashes, restarts and the memory limit follow
docs/architecture.md's "Faults and crashes"; a caller that stops waiting leaves the call to finish, result dropped."""

from __future__ import annotations

import atexit
import itertools
import logging
import multiprocessing
import subprocess
import sys
import threading

from studio.spec.errors import USER_ERRORS, RunError
from studio.spec.presets import BASE
from studio.worker.protocol import (
    OPS,
    RESTARTING,
    Device,
    WorkerConfig,
    WorkerCrashed,
    crash_sentence,
    error_from,
    how_it_died,
    refusal_sentence,
    retry_sentence,
    stack_key,
)

log = logging.getLogger("studio.worker")

POLL_S = 0.5  # how often a waiting call looks whether the worker is still alive
RETRIED = ("generate",)  # calls run once more on the new worker after their stack's first crash
STOP_WAIT_S = 10.0  # how long a worker asked to stop may take to unload before it is terminated


def rss_bytes(pid: int) -> int | None:
    """A process's resident memory (Linux /proc); None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _remote(op: str):
    def call(self, *args, **kwargs):
        return self._call(op, args, kwargs)

    call.__name__ = op
    call.__doc__ = f"DeviceService.{op}, in the device worker; function-valued keywords (progress, ...) stream back."
    return call


class WorkerClient(Device):
    """The device in a supervised worker process; `warm`: the presets a new worker warms up after a restart."""

    def __init__(self, config: WorkerConfig | None = None, *, warm: list[str] | tuple[str, ...] = (BASE,)):
        config = config or WorkerConfig()
        super().__init__(config.model, config.presets)
        self.config = config
        self.warm = list(warm)
        self.refused: dict[tuple[str, str], str] = {}  # stack key -> why it is refused
        self.crashes: dict[tuple[str, str], list[str]] = {}  # stack key -> how it crashed, in a row (no run between)
        self._restarting = threading.Event()  # a new worker is loading the model again after a crash
        self.restarts = 0  # how many times a worker was replaced (crashed or over its memory limit)
        self._lock = threading.Lock()  # one call at a time on the pipe
        self._ids = itertools.count(1)
        self._model = config.model  # the model the last call that went through used: reloaded after a restart
        self._running: tuple[str, str, str] | None = None
        self._ran: set[tuple[str, str]] = set()  # the stacks the call in flight started (their keys)
        self._closed = False
        self._start()
        atexit.register(self.close)

    @property
    def caps(self) -> tuple[int | None, int | None, int | None]:
        s = self.config.settings
        return (self.config.max_steps, self.config.max_side, s.max_prompt_chars if s is not None else None)

    @property
    def pid(self) -> int:
        return self._proc.pid

    # the worker's life ---------------------------------------------------------------------------------------------
    def _start(self) -> None:
        ours, theirs = multiprocessing.Pipe()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "studio.worker.server", str(theirs.fileno())], pass_fds=[theirs.fileno()]
        )
        theirs.close()  # only the worker holds its end now: its death reads as the end of the pipe here
        self._conn = ours
        ours.send(self.config)

    def _stop(self) -> int | None:
        """Ask the worker to exit, then terminate, then kill it; its exit code."""
        try:
            self._conn.send(("stop",))
        except OSError:  # BrokenPipeError among them: it is gone already
            pass
        for end in (None, self._proc.terminate, self._proc.kill):
            if end is not None:
                end()
            try:
                return self._proc.wait(STOP_WAIT_S if end is None else 5.0)
            except subprocess.TimeoutExpired:
                continue
        return self._proc.poll()

    def _reload(self) -> None:
        """Warm the current model up again in a new worker, in the background (the next call waits for it)."""
        model = self._model
        if not self.warm:
            return

        def run():
            try:
                self.warm_up(self.request(self.profile(model).first_prompt, model=model, seed=42), self.warm, model)
            except USER_ERRORS as e:  # the next request loads it instead
                log.warning("loading %s again after a restart failed: %s", model, e)
            finally:
                self._restarting.clear()

        self._restarting.set()

        threading.Thread(target=run, name="studio-worker-reload", daemon=True).start()

    def close(self) -> None:
        """Stop the worker; no call can start after this. Does not wait for a call in flight (it may be hung)."""
        if self._closed:
            return
        self._closed = True
        self._stop()
        self._conn.close()

    # one call ----------------------------------------------------------------------------------------------------
    def _call(self, op: str, args: tuple, kwargs: dict):
        """One call; a generate whose stack crashed the worker for the first time in a row runs once more on the new
        worker (a transient crash costs a wait, not the request)."""
        try:
            return self._call_once(op, args, kwargs)
        except WorkerCrashed as e:
            if op not in RETRIED or not e.forgiven:
                raise
            say = kwargs.get("on_status")
            if callable(say):
                say(retry_sentence(str(e), e.running[0]))
            return self._call_once(op, args, kwargs)

    def _call_once(self, op: str, args: tuple, kwargs: dict):
        callbacks = {k: v for k, v in kwargs.items() if callable(v)}
        plain = {k: v for k, v in kwargs.items() if k not in callbacks}
        if not self._lock.acquire(blocking=False):  # another call, or the reload after a crash, holds the worker
            if self._restarting.is_set() and callable(kwargs.get("on_status")):
                kwargs["on_status"](RESTARTING)
            self._lock.acquire()
        try:
            if self._closed:
                raise RunError("the device worker has been stopped: the app is shutting down")
            call_id, self._running, self._ran = next(self._ids), None, set()
            try:
                self._conn.send(("call", call_id, op, args, plain, list(callbacks), dict(self.refused)))
            except OSError:  # its end is closed: it died between calls
                self._died(op)
            result = self._wait(call_id, op, callbacks)
            for key in self._ran:  # they ran to the end: a crash before is no longer "in a row"
                self.crashes.pop(key, None)
            if plain.get("model"):
                self._model = plain["model"]
            self._check_memory()
            return result
        finally:
            self._lock.release()

    def _wait(self, call_id: int, op: str, callbacks: dict):
        failed = None  # an exception from one of the caller's functions: raised once the worker is done with the call
        while True:
            msg = self._next(op)
            if msg[0] == "ready" or msg[1] != call_id:
                continue  # the worker's greeting, or a message of a call whose caller stopped waiting
            kind = msg[0]
            if kind == "running":
                self._running = msg[2:]
                self._ran.add(stack_key(msg[4], msg[3]))
            elif kind == "callback":
                try:
                    callbacks[msg[2]](*msg[3])
                except Exception as e:  # raised below, after the call: the worker must not be left mid-call
                    failed = failed or e
            elif failed is not None:
                raise failed
            elif kind == "done":
                return msg[2]
            elif kind == "error":
                raise error_from(msg[2], msg[3])

    def _next(self, op: str) -> tuple:
        while True:
            try:
                if self._conn.poll(POLL_S):
                    return self._conn.recv()
            except (EOFError, OSError):  # its end closed (it died), or ours did (close() from another thread)
                break
            if self._proc.poll() is not None:
                break
        self._died(op)

    def _died(self, op: str) -> None:
        """The worker died under call `op`: blame its stack, start a new worker, raise WorkerCrashed."""
        try:
            code = self._proc.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:  # it closed its pipe but lives on: no use to anyone
            code = self._stop()
        how = how_it_died(code)
        self._conn.close()
        if self._closed:  # stopped by close() under this call (the app is exiting): no new worker
            raise RunError(f"the device worker was stopped ({how}) during a {op} call: the app is shutting down")
        running, forgiven = None, False
        if self._running is not None:
            name, tag, model = self._running
            running, key = (name, model), stack_key(model, tag)
            hows = self.crashes.setdefault(key, [])
            hows.append(how)
            forgiven = len(hows) < 2  # forgiven once; a second crash in a row refuses the stack
            if not forgiven:
                self.refused[key] = refusal_sentence(hows, *running)
        reloading = bool(self.warm) and op != "warm_up"  # a warm-up that crashed is not tried again at once
        sentence = crash_sentence(how, running, op, reloading)
        if running is not None and not forgiven:
            sentence += f"; {running[0]} is refused from now on (its second crash in a row)"
        log.error("%s", sentence)
        self.restarts += 1
        self._start()
        if reloading:
            self._reload()
        raise WorkerCrashed(sentence, how, running, forgiven)

    def _check_memory(self) -> None:
        limit = self.config.max_rss_gb
        rss = rss_bytes(self._proc.pid) if limit and not self._closed else None
        if rss is None or rss <= limit * 2**30:
            return
        log.warning("the device worker holds %.2f GB, over its limit of %g GB: restarting it", rss / 2**30, limit)
        self._stop()
        self._conn.close()
        self.restarts += 1
        self._start()
        self._reload()


for _op in OPS:
    setattr(WorkerClient, _op, _remote(_op))
