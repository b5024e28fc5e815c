"""One OS thread for all of a process's torch work (the device worker's, or the web app's on ZeroGPU; the CLI is one
thread already).

Why: PyTorch's CPU kernels run on OpenMP, and libgomp keeps a team of worker threads for every OS thread that ever
ran a parallel region. A web server runs each request on whichever pool thread is free (and the app warmed up on a
thread of its own), so the process soon holds more OpenMP threads than cores. libgomp then stops spinning between
parallel regions (its "throttled" wait), and every kernel waits on a futex to wake its workers. Measured on a
2-core CPU: a 256x256 matmul 235 us from one thread, 331 us once a second thread had run torch; the embedded
model's `base` run 0.30 s from one thread, 0.46 s from a second one; in the app every preset ran 1.5-1.8x slower
than in the CLI (20 ms per step against 11.6 ms). With every engine call on one thread there is one team, and the
app runs at the CLI's speed.

`DEVICE_THREAD.call(fn, ...)` runs `fn` on that thread (directly when already on it, so nesting cannot deadlock)
with the caller's context variables (gradio's progress and request context travel with the call). A forked child
(ZeroGPU runs handlers in one) starts a thread of its own on first use.
"""

from __future__ import annotations

import contextvars
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor


class DeviceThread:
    def __init__(self, name: str = "studio-device"):
        self.name = name
        self._reset()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._lock = threading.Lock()  # a fork may copy it held by a thread that does not exist in the child
        self._pool: ThreadPoolExecutor | None = None
        self._ident: int | None = None

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix=self.name)
                self._ident = self._pool.submit(threading.get_ident).result()
            return self._pool

    def on_it(self) -> bool:
        """Whether the caller is the device thread."""
        return self._ident is not None and threading.get_ident() == self._ident

    def submit(self, fn, *args, **kwargs) -> Future:
        """Queue `fn` on the device thread (after whatever is queued there) and return its future."""
        ctx = contextvars.copy_context()
        return self._executor().submit(ctx.run, fn, *args, **kwargs)

    def call(self, fn, *args, **kwargs):
        """Run `fn` on the device thread and return its result (or raise its exception)."""
        if self.on_it():
            return fn(*args, **kwargs)
        return self.submit(fn, *args, **kwargs).result()


DEVICE_THREAD = DeviceThread()
