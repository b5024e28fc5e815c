"""What a visitor of a public studio may ask of its device: every rule checked in the app's process from
the form and the preset alone, before any model work or load, and refused with a sentence that says the limit.

- compile and its mode are the operator's: a visitor's per-request `compile=true`, and a visitor's own preset that
  compiles (saved, uploaded or tuned), are refused; the operator's built-in presets compile as they say;
- compiled stacks meet a bounded number of distinct shapes per process (each new one is a compile of minutes on a
  real model, and torch.compile's recompile limit is 8 per frame);
- a Matrix is at most `max_matrix_runs` timed runs (presets + 1 for `base (again)`, times repeats);
- each session may start at most `requests_per_minute` device events in any 60 s;
- a request (one Generate, A/B, Matrix or tuner's search) stops between two denoising steps once it has run
  `request_s` seconds, with a sentence (engine.run.Deadline: the only limit that is checked while it runs).

Not gradio: the handlers call these and turn a refusal into the page's error.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

from studio.spec.checks import ConfigError, check_int
from studio.spec.preset import Preset


class Refused(ConfigError):
    """A public studio's limit, in a sentence (a ConfigError: the handlers show it as they show a bad request)."""


@dataclass(frozen=True)
class PublicLimits:
    """A public studio's limits (README: Public mode)."""

    max_matrix_runs: int = 24  # (presets + 1) x repeats
    max_repeats: int = 3
    requests_per_minute: int = 12  # device events per session, in any 60 s
    compiled_shapes: int = 4  # distinct (model, width, height, steps) a compiled stack may meet per process
    request_s: int = 300  # seconds one request may run on the device (STUDIO_MAX_REQUEST_S)

    def __post_init__(self):
        for name, lo in (
            ("max_matrix_runs", 2),
            ("max_repeats", 1),
            ("requests_per_minute", 1),
            ("compiled_shapes", 1),
            ("request_s", 1),
        ):
            check_int("limits", name, getattr(self, name), lo, 100_000)


@dataclass
class PublicGuard:
    """The limits and what they count: the sessions' recent events and the shapes compiled stacks have met."""

    limits: PublicLimits = field(default_factory=PublicLimits)
    _events: dict = field(default_factory=dict)  # session -> deque of event start times (monotonic)
    _shapes: set = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def rate(self, session: str | None, now: float | None = None) -> None:
        """Count one device event of `session`; Refused when it would be over the per-minute limit."""
        now = time.monotonic() if now is None else now
        n = self.limits.requests_per_minute
        with self._lock:
            seen = self._events.setdefault(session or "anonymous", deque())
            while seen and now - seen[0] >= 60.0:
                seen.popleft()
            if len(seen) >= n:
                wait = 60.0 - (now - seen[0])
                raise Refused(
                    f"this public studio runs at most {n} requests a minute per visitor: try again in {wait:.0f} s"
                )
            seen.append(now)
            if len(self._events) > 10_000:  # sessions that left: the oldest go first
                self._events.pop(next(iter(self._events)))

    def event(self, session: str | None, switch: bool | None, presets: list, model: str, request) -> None:
        """One device event: the session's rate, the compile switch, and each (preset, built in?) it runs."""
        self.rate(session)
        self.compile_switch(switch)
        own = [lo.path for lo in getattr(request, "loras", ()) if not lo.is_name]  # a shipped name reads no path
        if own:
            raise Refused(
                f"LoRA adapters are not taken from visitors of this public studio ({own[0]!r}: a path would read a "
                "file on its machine, a Hub id download one): the LoRAs shipped with the model, by name, are; run "
                "the studio yourself to use your own"
            )
        for p, builtin in presets:
            self.preset(p, builtin)
            self.shape(p, model, request, p.compile.enabled if switch is None else switch)

    def compile_switch(self, switch: bool | None) -> None:
        if switch:
            raise Refused(
                "compile is this public studio's operator's choice: a per-request compile=true is refused here "
                "(a compile costs minutes of GPU); the presets that compile are the built-in ones"
            )

    def preset(self, p: Preset, builtin: bool) -> None:
        """A visitor's own preset may not compile (nor choose a compile mode), nor name LoRA files: the operator's
        may. A shipped LoRA's name is not a file (spec.lora.NAME): a visitor's preset may name it."""
        if any(not lo.is_name for lo in p.loras) and not builtin:
            raise Refused(
                f"preset {p.name!r} names LoRA adapters: on this public studio only the operator's presets do (a "
                "path would read a file on its machine, a Hub id download one); save it without them (the LoRAs "
                "shipped with the model, by name, are allowed)"
            )
        if p.compile.enabled and not builtin:
            raise Refused(
                f"preset {p.name!r} compiles (mode {p.compile.mode}): on this public studio only the built-in "
                "presets compile; save it with compile: {enabled: false}"
            )

    def shape(self, p: Preset, model: str, request, compiled: bool) -> None:
        """A compiled stack at a shape it has not met: Refused once `compiled_shapes` distinct ones were met."""
        if not compiled:
            return
        key = (model, request.width, request.height, request.steps)
        with self._lock:
            if key in self._shapes:
                return
            if len(self._shapes) >= self.limits.compiled_shapes:
                raise Refused(
                    f"{p.name} is compiled, and compiled stacks here have met {len(self._shapes)} shapes already "
                    f"(the limit of this public studio): use one of {sorted(self._shapes)[:4]} (model, width, "
                    "height, steps), or an uncompiled preset"
                )
            self._shapes.add(key)

    def matrix(self, presets: int, repeats: int) -> None:
        lim = self.limits
        if repeats > lim.max_repeats:
            raise Refused(f"repeats {repeats} is over this public studio's limit of {lim.max_repeats}")
        runs = (presets + 1) * repeats
        if runs > lim.max_matrix_runs:
            raise Refused(
                f"a matrix of {presets} presets x {repeats} repeats is {runs} timed runs: this public studio runs "
                f"at most {lim.max_matrix_runs} (fewer presets or repeats)"
            )
