"""What crosses between the app's process and the device worker as plain data (never the pipeline, the model or
torch: this module imports none of them), and the sentences a crash ends with. Messages are tuples, kind first:

    app -> worker   ("call", id, op, kwargs, callbacks, refused), ("stop",)
                    `callbacks`: the kwargs that are the app's functions; `refused`: {stack key: sentence}
    worker -> app   ("ready", pid), ("callback", id, name, args), ("done", id, value)
                    ("running", id, name, tag, model)             a stack starts: what a crash is blamed on
                    ("error", id, kind, message)                  one of ERRORS by name, with its one sentence
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
    """The device worker died during a call; it has been restarted. `how` it died (spec.errors.how_it_died),
    `running`: (preset name, model) or None; `forgiven`: the stack's first crash in a row (a generate is retried)."""

    def __init__(self, sentence: str, how: str = "", running: tuple[str, str] | None = None, forgiven: bool = False):
        super().__init__(sentence)
        self.how, self.running, self.forgiven = how, running, forgiven

    def __reduce__(self):  # pickled whole (the attributes too), as any exception that crosses a process may be
        return type(self), (str(self), self.how, self.running, self.forgiven)


@dataclass(frozen=True)
class WorkerConfig:
    """How the worker builds its engine (ModelManager's and Runner's arguments), and the app-side limits on it."""

    model: str = "tiny"  # a request without one uses it; reloaded after a restart until another is used
    device: str | None = None
    allowed: tuple[str, ...] | None = None  # the public mode's models that may load
    max_steps: int | None = None
    max_side: int | None = None
    presets: PresetLibrary | None = None  # when a call names no library (a visitor's own comes with each call)
    max_rss_gb: float | None = None  # restart the worker between requests over this resident memory
    pairing: object | None = None  # engine.baseline.Pairing, None: the Runner's (not imported: no torch here)
    quiet: bool = False  # studio.worker.quiet in the worker (the CLI's: its stderr is its progress bar's)
    # The starting process's record, installed in the worker (which reads no environment); its `worker_hook` is
    # called with the worker's runner once built (tests/worker_hooks.py).
    settings: Settings = field(default_factory=current)


def crossing(e: Exception, op: str) -> Exception:
    """The one error boundary of a device call: a user error as it is; anything else logged with its traceback and
    said as a StudioBug."""
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
    """The sentence a request ends with when the worker died under it (`reloading`: the new worker is loading the
    model already)."""
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
    """What the app's Studio facade holds: the torch-free part the worker's client and the in-process device share;
    the device calls (OPS, close) are the subclass's."""

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
        """The operator's caps (max steps, max side, max prompt characters) the device refuses a request over."""
        return (None, None, None)

    def kept(self):
        """What the engine keeps between requests (engine.baseline.Kept), for app.zerogpu to carry across processes;
        None where the device's own process keeps it."""
        return None

    def keep(self, kept) -> None:
        """Take `kept` (from kept()) as what the engine keeps; nothing to do where kept() is None."""

    def check_caps(self, request: GenerationRequest) -> None:
        """ConfigError with the sentence the device would end the request with, without a device call."""
        check_caps(request, *self.caps)

    def headroom(self, preset: Preset, steps: int) -> Headroom | None:
        """The most steps `preset`'s cache can skip in a run of `steps` (None without a step cache); a device call
        only for a step mask (cache-dit builds it)."""
        c = preset.cache_config
        return headroom(c, steps, self.step_mask(c, steps) if c.enabled and c.has_mask else None)

    def request(self, prompt: str, model: str | None = None, **overrides) -> GenerationRequest:
        """A request with the model profile's defaults for whatever is not given."""
        return self.profile(model).request(prompt, **overrides)
