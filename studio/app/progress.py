"""The engine's progress callbacks as a gr.Progress: step updates at most once a second, status lines at once."""

from __future__ import annotations

import time

PROGRESS_EVERY_S = 1.0


def progress_hooks(progress, every_s: float = PROGRESS_EVERY_S):
    """(on_step, on_status) callbacks that drive a gr.Progress from the engine. Step updates go out at most once every
    `every_s` seconds: each costs the server several ms and a browser redraw, which slows the timed run."""
    cached = []
    started = [None]

    def on_step(i, total, rec):
        if rec.cached:
            cached.append(i)
        now = time.monotonic()
        if started[0] is None or i == 0:
            started[0] = now
        if now - started[0] < every_s:
            return
        started[0] = now
        desc = f"denoising step {i + 1}/{total}" + (" — served from cache" if rec.cached else "")
        if cached:
            desc += f" (cached so far: {len(cached)})"
        progress((i + 1, total), desc=desc, unit="steps")

    def on_status(msg):
        cached.clear()
        progress(0, desc=msg)

    return on_step, on_status
