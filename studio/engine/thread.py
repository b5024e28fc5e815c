"""One OS thread for all of a process's torch work: libgomp keeps an OpenMP team per OS thread that ran torch, and
more threads than cores make every kernel wait on a futex (the app ran 1.5-1.8x slower than the CLI). `call` runs on
it directly when already there (no deadlock), with the caller's context variables; a forked child starts its own."""

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
