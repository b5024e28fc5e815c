"""A device event as ZeroGPU runs it: admitted here, then its handler in the process `spaces` forks for the GPU
(docs/library-behaviour.md S1, S3). The result crosses back as {component id: value} (a component does not pickle);
the engine's kept state (engine.baseline.Kept) lives here and crosses each call in and out, since a fork's is lost
(device events run one at a time: what comes back replaces what went in)."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util

from gradio.blocks import Block

from studio.app.admit import ASK

KEPT = "_studio_kept"  # the keyword the kept state crosses a GPU call under (not one of the API's parameters)


def components(ui) -> dict[int, Block]:
    """Every component of a laid-out app.forms.UI, by its gradio id."""
    found = {}
    for tab in dataclasses.fields(ui):
        record = getattr(ui, tab.name)
        for f in dataclasses.fields(record):
            value = getattr(record, f.name)
            if isinstance(value, Block):
                found[value._id] = value
    return found


def _plain(result):
    if isinstance(result, dict) and result and all(isinstance(k, Block) for k in result):
        return {"by_id": {k._id: v for k, v in result.items()}}
    return {"as_is": result}


def _blocks(plain: dict, by_id: dict[int, Block]):
    if "as_is" in plain:
        return plain["as_is"]
    return {by_id[i]: v for i, v in plain["by_id"].items()}


def device_event(fn, duration=None, admit=None, ask=None, *, device=None, by_id=None, pictures=None, size="large"):
    """Device event handler `fn` as the event runs it: its Ask built once (`ask`), the public limits on it (`admit`),
    then `fn` under @spaces.GPU for `duration` on slice `size`, then its pictures written as files (`pictures`).
    `by_id`: components(ui), to turn a crossed result back into components."""
    run = fn
    if importlib.util.find_spec("spaces") is not None:
        import spaces  # noqa: PLC0415  (optional: installed on a Space)

        on_gpu = _in_gpu_process(fn, device)
        wrapped = spaces.GPU(on_gpu, duration=_without_kept(duration), size=size)
        if wrapped is not on_gpu:  # a GPU call in another process: the result and the kept state cross it
            run = _crossing(fn, wrapped, device, by_id or {})
    if admit is None and pictures is None and ask is None:
        return run

    @functools.wraps(fn)  # gradio reads the handler's signature (its gr.Request, gr.Progress, names) through it
    def event(*args, **kwargs):
        if ask is not None:
            kwargs[ASK] = ask(*args, **kwargs)
        if admit is not None:  # (it reads the Ask: an event that has limits has an Ask)
            admit(kwargs[ASK], args[0] if args else kwargs.get("request"))
        result = run(*args, **kwargs)
        return pictures.result(result) if pictures is not None else result

    return event


def _without_kept(duration):
    """`duration` without the kept state, which `spaces` passes it with the GPU call's own arguments."""
    if not callable(duration):
        return duration

    @functools.wraps(duration)
    def seconds(*args, **kwargs):
        kwargs.pop(KEPT, None)
        return duration(*args, **kwargs)

    return seconds


def _in_gpu_process(fn, device):
    """What runs in the GPU process: the kept state in, the handler, its result and the kept state out."""

    @functools.wraps(fn)
    def on_gpu(*args, **kwargs):
        kept = kwargs.pop(KEPT, None)
        if kept is not None and device is not None:
            device.keep(kept)
        result = fn(*args, **kwargs)
        return _plain(result), device.kept() if device is not None else None

    return on_gpu


def _crossing(fn, wrapped, device, by_id: dict[int, Block]):
    """What runs here around the GPU call: the kept state sent with the arguments, the returned one kept."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        kept = device.kept() if device is not None else None
        plain, kept_after = wrapped(*args, **{**kwargs, KEPT: kept})
        if kept_after is not None and device is not None:
            device.keep(kept_after)
        return _blocks(plain, by_id)

    return call
