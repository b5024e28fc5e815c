"""Timing and step accounting inside a parallel worker (a Ray actor running the whole pipeline), with the one-process
clock and counts (studio.measure.timing); the engine installs them on every worker and reads rank 0's record.
Module-level state: one pipeline per worker process."""

from __future__ import annotations

_STATE: dict = {}  # "counter": the worker transformer's StepCounter, "device": where it runs, "probe": this run's


def install(actor) -> dict:
    """The step counter on the worker's transformer (once). Returns where this worker runs."""
    import os
    import socket

    from studio.measure.timing import StepCounter

    tr = actor.pipe.transformer
    if "counter" not in _STATE:
        _STATE["counter"] = StepCounter().install(tr)
        _STATE["device"] = next(tr.parameters()).device
    return {"rank": actor.rank, "device": str(actor.device), "host": socket.gethostname(), "pid": os.getpid()}


def start_run(actor) -> None:
    """A fresh probe for the coming run: its clock starts at the transformer's first call."""
    from studio.measure.timing import StepProbe

    _STATE["probe"] = StepProbe(_STATE["counter"], _STATE["device"]).__enter__()


def step_end(pipe, step_index, timestep, callback_kwargs):
    """callback_on_step_end inside the worker: the probe marks the end of the step and its calls / full runs."""
    return _STATE["probe"](pipe, step_index, timestep, callback_kwargs)


def _cache_dit_lists(pipe) -> dict:
    """cache-dit's own record of the run; an unreadable one is said, never read as "no cache"."""
    from studio.spec.cachedit import read_summary

    try:
        rec = read_summary(pipe)
    except (AttributeError, KeyError, TypeError, ValueError) as e:  # a summary whose shape this reader does not know
        return {
            "cached_steps": None,
            "cfg_cached_steps": None,
            "residual_diffs": {},
            "summary_error": f"{type(e).__name__}: {e}",
        }
    return {
        "cached_steps": rec.cached_steps,
        "cfg_cached_steps": rec.cfg_cached_steps,
        "residual_diffs": rec.residual_diffs,
        "summary_error": None,
    }


def read(actor) -> dict:
    """This worker's record of the last run (then cleared): denoise seconds, per-step seconds, the StepRecords, and
    cache-dit's own lists."""
    probe = _STATE.pop("probe", None)
    rec = {"denoise_s": 0.0, "step_s": [], "steps": []}
    if probe is not None:
        probe.__exit__(None, None, None)
        rec.update(denoise_s=probe.denoise_seconds(), step_s=probe.step_seconds(), steps=list(probe.steps))
    rec.update(_cache_dit_lists(actor.pipe))
    return rec
