"""What crosses between the app's process and the device worker, as plain data, and the sentences a crash ends with.

Messages, each a tuple whose first item is its kind:

    app -> worker   ("call", id, op, kwargs, callbacks, refused)   run `op` of studio.worker.service.DeviceService
                                                                   with `kwargs`; `callbacks` names the arguments that
                                                                   are the app's functions (progress, on_status);
                                                                   `refused`: {stack key: sentence} of crashed stacks
                    ("stop",)                                      unload and exit
    worker -> app   ("ready", pid)                                 the worker is up (no model loaded yet)
                    ("running", id, name, tag, model)              call `id` starts a stack: what a crash is blamed on
                    ("callback", id, name, args)                   call the app's function `name` with `args`
                    ("done", id, value)                            the result: a RunResult, a Matrix, a TuneResult or
                                                                   a dict (numpy arrays, dataclasses of plain values)
                    ("error", id, kind, message)                   one of ERRORS by name, with its one sentence
                                                                   (any other exception: StudioBug, its traceback
                                                                   in the worker's log)

The pipeline, the model and torch never cross; this module and the records it names import none of them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from studio.spec.errors import (
    USER_ERRORS,
    OverTime,
    RunError,
    StudioBug,
    bug_sentence,
    how_it_died,  # noqa: F401  (the worker's end in words, for the client)
)
from studio.spec.headroom import Headroom, headroom
from studio.spec.preset import Preset
from studio.spec.presets import PresetLibrary
from studio.spec.profiles import ModelProfile, profile_for, resolve_model
from studio.spec.request import GenerationRequest, check_caps
from studio.spec.settings import Settings, current

log = logging.getLogger("studio.worker")

# The errors a call may end with, by name: the app raises the same class with the same sentence (app.errors turns
# each into a gr.Error, the CLI prints it). They are spec.errors.USER_ERRORS, and StudioBug for anything else.
ERRORS = {cls.__name__: cls for cls in (*USER_ERRORS, OverTime, StudioBug)}


class WorkerCrashed(RunError):
    """The device worker died during a call (a signal, the OOM killer, an abort in a kernel); it has been restarted.

    Attributes:
        how: how it died (spec.errors.how_it_died: "SIGSEGV", "SIGKILL: out of memory, or killed", ...).
        running: (preset name, model) of the stack it was running, None when it had started none.
        forgiven: the stack's first crash in a row: it is not refused (a generate call is tried once more at once).
    """

    def __init__(self, sentence: str, how: str = "", running: tuple[str, str] | None = None, forgiven: bool = False):
        super().__init__(sentence)
        self.how, self.running, self.forgiven = how, running, forgiven

    def __reduce__(self):  # pickled whole (the attributes too), as any exception that crosses a process may be
        return type(self), (str(self), self.how, self.running, self.forgiven)


@dataclass(frozen=True)
class WorkerConfig:
    """How the worker builds its engine, and the app-side limits on it.

    Args:
        model: the model a request without one uses (and the one reloaded after a restart until another is used).
        device, allowed: ModelManager's (allowed: the public mode's list of models that may load).
        max_steps, max_side: the operator's caps (Runner's).
        presets: the library preset names resolve in when a call names none (a visitor's own comes with each call).
        max_rss_gb: restart the worker between requests once its resident memory is over this (None: no limit).
        pairing: when base is timed beside a stack (engine.baseline.Pairing; None: the Runner's default, 3 pairs for
            a cheap base). Fewer pairs make a click cheaper and its spread wider.
        quiet: library chatter below errors and no progress bars in the worker (the CLI's: stderr is its bar's).
        settings: the settings record (spec.settings) the worker installs: its process reads no environment. Its
            `worker_hook` (STUDIO_WORKER_HOOK) is called with the worker's runner once built: instrumentation such as
            the tests' crash at a denoising step (tests/worker_hooks.py) lives outside the studio.
    """

    model: str = "tiny"
    device: str | None = None
    allowed: tuple[str, ...] | None = None
    max_steps: int | None = None
    max_side: int | None = None
    presets: PresetLibrary | None = None
    max_rss_gb: float | None = None
    pairing: object | None = None  # engine.baseline.Pairing (not imported here: the app's process loads no torch)
    quiet: bool = False
    settings: Settings = field(default_factory=current)  # the starting process's record, installed in the worker


def crossing(e: Exception, op: str) -> Exception:
    """The one error boundary of a device call (the worker's and the in-process device's): a user error as it is;
    anything else logged here with its traceback, and said as a StudioBug."""
    if isinstance(e, USER_ERRORS):
        return e
    log.error("device call %s failed: a bug in the studio", op, exc_info=e)
    return StudioBug(bug_sentence(e))


def error_message(e: Exception) -> tuple[str, str]:
    """(kind, message) of an exception that has crossed (`crossing`): the nearest class of ERRORS by name."""
    kind = next(cls.__name__ for cls in type(e).__mro__ if ERRORS.get(cls.__name__) is cls)
    return kind, str(e)


def error_from(kind: str, message: str) -> Exception:
    return ERRORS.get(kind, RunError)(message)


def stack_key(model: str | None, tag: str) -> tuple[str, str]:
    """What is remembered of a stack that crashed the worker: the model (resolved) and the stack's derived tag."""
    return (resolve_model(model), tag)


def crash_sentence(how: str, running: tuple[str, str] | None, op: str, reloading: bool = True) -> str:
    """The one sentence a request ends with when the worker died under it. running: (preset name, model) it had
    started, if any; reloading: whether the new worker is loading the model again already."""
    doing = f"running {running[0]} on {running[1]}" if running else f"answering the app's {op} call"
    then = " and the model is loading again" if reloading else ""
    return f"the device worker crashed ({how}) while {doing}; it has been restarted{then}"


def refusal_sentence(hows: list[str], name: str, model: str) -> str:
    """Why a stack that crashed the worker twice in a row is not run again, and how to clear it."""
    return (
        f"{name} on {model} is refused: it crashed the device worker twice in a row ({', '.join(hows)}) in this "
        "app's run, and every request in flight would be lost if it did again; choose another preset (restart the "
        "app to clear this)"
    )


def retry_sentence(crash: str, name: str) -> str:
    """The status line of a generate call whose stack crashed the worker once: it runs again on the new worker."""
    return f"{crash}; running {name} once more (a second crash in a row refuses it)"


# The device calls, each a method of studio.worker.service.DeviceService; the Device subclasses serve each by name.
OPS = (
    "generate",
    "matrix",
    "tune",
    "warm_up",
    "export",
    "resolved",
    "plan",
    "info",
    "bench",
    "doctor_family",
    "step_mask",
)
RESTARTING = "the device worker is starting again (after a crash, or over its memory limit): this request waits for it"


class Device:
    """What the app's Studio facade holds: the torch-free part both the worker's client and the in-process device
    share (profiles and requests are spec, read from files). The device calls (generate, matrix, tune, warm_up,
    export, info, bench, doctor_family, close) are the subclass's."""

    def __init__(self, model: str = "tiny", presets: PresetLibrary | None = None):
        self.model = model
        self.presets = presets or PresetLibrary()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def profile(self, model: str | None = None) -> ModelProfile:
        return profile_for(resolve_model(model or self.model))

    @property
    def caps(self) -> tuple[int | None, int | None, int | None]:
        """The operator's caps (max steps, max side, max prompt characters) the device refuses a request over; none
        unless a subclass has."""
        return (None, None, None)

    def kept(self):
        """What the engine keeps between requests (engine.baseline.Kept), for a caller that carries it across processes
        (app.zerogpu); None where the device's own process keeps it (the worker outlives every call)."""
        return None

    def keep(self, kept) -> None:
        """Take `kept` (from kept()) as what the engine keeps; nothing to do where kept() is None."""

    def check_caps(self, request: GenerationRequest) -> None:
        """ConfigError with the sentence the device would end the request with, without a device call (app.admit)."""
        check_caps(request, *self.caps)

    def headroom(self, preset: Preset, steps: int) -> Headroom | None:
        """The most steps `preset`'s cache can skip in a run of `steps` (spec.headroom), said before the run; None
        without a step cache. Here, without a device call, unless the preset has a step mask (cache-dit builds it:
        the device's `step_mask`)."""
        c = preset.cache_config
        return headroom(c, steps, self.step_mask(c, steps) if c.enabled and c.has_mask else None)

    def request(self, prompt: str, model: str | None = None, **overrides) -> GenerationRequest:
        """A request with the model profile's defaults for whatever is not given."""
        return self.profile(model).request(prompt, **overrides)
