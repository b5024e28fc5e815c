"""A device event as ZeroGPU runs it: admitted here, then its handler in the process `spaces` forks for the GPU.

`spaces` (0.51.3, zero/wrappers.py) runs a `@spaces.GPU` handler in a forked worker process: the event's arguments
are pickled into it and the handler's result pickled back; the worker is reused only while its GPU is idle and is
otherwise forked afresh from this process. Two things follow, and this module does both:

- the result must pickle. A handler returns {component: value}, and a gradio component does not pickle (it holds
  its Blocks, with weak references and locks): the handler's result crosses as {component id: value} and is turned
  back into components here (gradio matches an output by its `_id`);
- what the engine keeps between requests (engine.baseline.Kept: the kept base pictures and timings, the timings by
  shape that let compare `auto` cost one run) would live in the forked process and be lost with it. It lives in this
  process instead and crosses each call: in as an argument, out beside the result. Device events run one at a time
  (their concurrency id is "device"), so what comes back replaces what went in.

The public limits are checked before the GPU call (`admit`, app.admit), so a refused request reserves nothing.
Off ZeroGPU `spaces.GPU` hands the handler back as it is and nothing here wraps it.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util

from gradio.blocks import Block

from studio.app.admit import ASK

KEPT = "_studio_kept"  # the keyword the kept state crosses a GPU call under (not one of the API's parameters)


def components(ui) -> dict[int, Block]:
    """Every component of a laid-out UI (app.forms.UI: a record of tab records), by its gradio id."""
    found = {}
    for tab in dataclasses.fields(ui):
        record = getattr(ui, tab.name)
        for f in dataclasses.fields(record):
            value = getattr(record, f.name)
            if isinstance(value, Block):
                found[value._id] = value
    return found


def _plain(result):
    """A handler's result as something that pickles: {component: value} as {component id: value}."""
    if isinstance(result, dict) and result and all(isinstance(k, Block) for k in result):
        return {"by_id": {k._id: v for k, v in result.items()}}
    return {"as_is": result}


def _blocks(plain: dict, by_id: dict[int, Block]):
    if "as_is" in plain:
        return plain["as_is"]
    return {by_id[i]: v for i, v in plain["by_id"].items()}


def device_event(fn, duration=None, admit=None, ask=None, *, device=None, by_id=None, pictures=None, size="large"):
    """`fn` (a device event's handler) as the event runs it: its Ask built once from the event's arguments (`ask`,
    app.admit.Asks), the public limits on it (`admit`, in this process), then `fn` under @spaces.GPU for `duration`
    (a callable of the event's arguments, app.gpu_time) where `spaces` wraps it, the Ask crossing in with the
    arguments (under app.admit.ASK), the result and the engine's kept state crossing back (module doc), then its
    pictures written as files here (`pictures`, app.pictures.PictureFiles).

    Args:
        device: the studio's device (studio.worker.Device): its kept() state crosses each GPU call.
        by_id: the laid-out components by id (components(ui)), to turn a crossed result back into components.
        size: the ZeroGPU slice each call asks for (the `zerogpu_size` setting, STUDIO_ZEROGPU_SIZE).
    """
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
    """The duration callable, which `spaces` calls with the GPU call's own arguments (the kept state among them)."""
    if not callable(duration):
        return duration

    @functools.wraps(duration)
    def seconds(*args, **kwargs):
        kwargs.pop(KEPT, None)
        return duration(*args, **kwargs)

    return seconds


def _in_gpu_process(fn, device):
    """What runs in the GPU process: the kept state taken in, the handler, its result and the kept state out."""

    @functools.wraps(fn)
    def on_gpu(*args, **kwargs):
        kept = kwargs.pop(KEPT, None)
        if kept is not None and device is not None:
            device.keep(kept)
        result = fn(*args, **kwargs)
        return _plain(result), device.kept() if device is not None else None

    return on_gpu


def _crossing(fn, wrapped, device, by_id: dict[int, Block]):
    """What runs here around the GPU call: the kept state sent with the arguments, the one that comes back kept."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        kept = device.kept() if device is not None else None
        plain, kept_after = wrapped(*args, **{**kwargs, KEPT: kept})
        if kept_after is not None and device is not None:
            device.keep(kept_after)
        return _blocks(plain, by_id)

    return call
