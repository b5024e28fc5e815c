"""Timing and step accounting inside a parallel worker (a Ray actor running the whole pipeline).

The engine installs these on every worker (`install`, through the actor's `__ray_call__`) and passes `step_end` as
the pipeline's `callback_on_step_end`; after the call it reads rank 0's record (`read`). The clock is the same as
in one process: it starts at the transformer's first call of the run and marks the end of each step, after a CUDA
synchronize on a GPU; a forward hook on the last block's last Linear counts the calls that ran the whole stack.
Module-level state: one pipeline per worker process.
"""

from __future__ import annotations

import time

_REC: dict = {}


def _sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _on_call(module, args):
    if _REC.get("start") is None:
        _sync()
        _REC["start"] = time.perf_counter()
    _REC["calls"] += 1


def _on_run(module, args, output):
    _REC["runs"] += 1


def reset() -> None:
    _REC.update(start=None, ends=[], calls=0, runs=0, per_step=[], last=(0, 0))


def install(actor) -> dict:
    """Hooks on the worker's transformer (once). Returns where this worker runs."""
    import os
    import socket

    from studio.measure.timing import last_block_probe_target

    tr = actor.pipe.transformer
    if not getattr(tr, "_studio_remote_hooks", False):
        tr.register_forward_pre_hook(_on_call)
        target = last_block_probe_target(tr)
        if target is not None:
            target.register_forward_hook(_on_run)
        tr._studio_remote_hooks = True
    reset()
    return {"rank": actor.rank, "device": str(actor.device), "host": socket.gethostname(), "pid": os.getpid()}


def step_end(pipe, step_index, timestep, callback_kwargs):
    """callback_on_step_end inside the worker: the end of a step and its transformer calls / full runs."""
    _sync()
    _REC["ends"].append(time.perf_counter())
    calls, runs = _REC["calls"], _REC["runs"]
    lc, lr = _REC["last"]
    _REC["per_step"].append((calls - lc, runs - lr))
    _REC["last"] = (calls, runs)
    return callback_kwargs


def read(actor) -> dict:
    """This worker's record of the last run (then cleared), with cache-dit's own list of cached steps."""
    import cache_dit

    rec = dict(_REC)
    start = rec.get("start")
    rec["ends"] = [e - start for e in rec.get("ends", [])] if start is not None else []
    cached, cfg_cached = None, None
    try:
        stats = cache_dit.summary(actor.pipe, logging=False)
        if stats:
            cached = sorted(int(x) for x in (stats[-1].cached_steps or []))
            diffs = {}
            for k, v in (getattr(stats[-1], "residual_diffs", None) or {}).items():
                try:
                    if float(v) >= 0:  # cache-dit writes -1 where it skipped computing the diff
                        diffs[int(k)] = float(v)
                except (TypeError, ValueError):
                    continue
            rec["residual_diffs"] = diffs
            cfg = getattr(stats[-1], "cfg_cached_steps", None)
            cfg_cached = sorted(int(x) for x in cfg) if cfg else None
    except Exception:  # no cache on this stack
        pass
    rec["cached_steps"], rec["cfg_cached_steps"] = cached, cfg_cached
    reset()
    return rec


def start_run(actor) -> None:
    reset()
