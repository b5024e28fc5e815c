"""The Ask: one event's request (a click, an API call, a CLI command), read once where it comes in; every part of the
event reads it, never the form: the request, its stacks resolved and switched once, the compare mode, the prompts.
Not gradio and not torch, so the app's process and the CLI build the same record (tests/test_ask.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from studio.spec.checks import ConfigError, fail, parse_switch
from studio.spec.preset import Preset
from studio.spec.presets import BASE, PresetLibrary
from studio.spec.profiles import ModelProfile
from studio.spec.request import GenerationRequest, compare_mode

EVENTS = ("generate", "compare", "matrix", "tune", "bench", "sweep", "methods", "calibrate")


@dataclass(frozen=True)
class Switches:
    """The per-request switches: True/False force the step cache or torch.compile on or off, None follows the
    preset; `threshold` (None: the preset's) goes to a stack whose cache runs, and only there (on a stack without one
    it would rename the stack and change nothing that runs)."""

    cache: bool | None = None
    threshold: float | None = None
    compile: bool | None = None

    def __post_init__(self):
        if self.threshold is not None and not (isinstance(self.threshold, (int, float)) and self.threshold > 0):
            fail("switches", "threshold", self.threshold, "a number above 0, or None to follow the preset")

    @classmethod
    def read(cls, cache=None, threshold=None, compile=None) -> Switches:
        """The switches as a form or the command line gives them: 'true'/'false'/'unset' (or booleans), and a
        threshold where 0 or empty (a browser's empty number field) follows the preset."""
        t = None if threshold in (None, "") or float(threshold) <= 0 else float(threshold)
        return cls(parse_switch(cache, "cache switch"), t, parse_switch(compile, "compile switch"))

    def apply(self, p: Preset) -> Preset:
        """`p` under these switches (the same preset object when they change nothing)."""
        cached = p.with_overrides(self.cache).cache_config.enabled
        return p.with_overrides(self.cache, self.threshold if cached else None, self.compile)


def prompt_lines(text: str | None) -> list[str]:
    """The one rule for a box or file of prompts: one per line, stripped; blanks, # lines and repeats dropped."""
    lines = (x.strip() for x in str(text or "").splitlines())
    return list(dict.fromkeys(x for x in lines if x and not x.startswith("#")))


def read_prompts(path: str | None) -> list[str] | None:
    """The prompts of a file (prompt_lines); None without a path; ValueError when it holds none."""
    if not path:
        return None
    prompts = prompt_lines(Path(path).read_text(encoding="utf-8"))
    if not prompts:
        raise ValueError(f"--prompts {path}: no prompts in the file (one per line)")
    return prompts


def fan_out(first: str, more: list[str], cap: int | None = None, replace_first: bool = False) -> tuple[str, ...]:
    """An event's prompts: `first` (the request's), then `more` without it; with `replace_first`, `more` alone where it
    has any (the tuner's box replaces the request's prompt). At most `cap` (a public studio's; None: no cap)."""
    out = list(more) if replace_first and more else [first] + [p for p in more if p != first]
    return tuple(out if cap is None else out[: max(1, cap)])


@dataclass(frozen=True)
class Ask:
    """One event's request, read once. `model`: as asked (the studio's first where the form left it empty); `stacks`:
    generate one, compare A and B, matrix base first (unswitched: the reference row), tune none (the tuner builds its
    own; the command line's bench, sweep, methods and calibrate name theirs to the search); `builtin`: per stack,
    whether built in (the public limits treat a visitor's own apart); `switches`: already applied to `stacks`;
    `request`: the first prompt's; `seeds`: each prompt's (none: the request's); `repeats`: a matrix's or a bench's
    rounds."""

    event: str
    model: str
    profile: ModelProfile
    request: GenerationRequest
    stacks: tuple[Preset, ...] = ()
    builtin: tuple[bool, ...] = ()
    switches: Switches = Switches()
    compare: str = "on"
    prompts: tuple[str, ...] = ()
    seeds: tuple[int, ...] = ()
    repeats: int = 1

    def __post_init__(self):
        if self.event not in EVENTS:
            fail("ask", "event", self.event, f"one of {', '.join(EVENTS)}")
        if len(self.builtin) != len(self.stacks):
            fail("ask", "builtin", len(self.builtin), f"one flag per stack ({len(self.stacks)})")
        object.__setattr__(self, "compare", compare_mode(self.compare))
        if not isinstance(self.repeats, int) or not 1 <= self.repeats <= 100:
            fail("ask", "repeats", self.repeats, "a whole number from 1 to 100")
        if not self.prompts:
            object.__setattr__(self, "prompts", (self.request.prompt,))

    @property
    def requests(self) -> tuple[GenerationRequest, ...]:
        """The request with each prompt, in order, at each seed."""
        r = self.request
        pairs = ((p, s) for p in self.prompts for s in self.seeds or (r.seed,))
        return tuple(r if (p, s) == (r.prompt, r.seed) else replace(r, prompt=p, seed=s) for p, s in pairs)


def resolve_stacks(
    event: str, names: list[str], library: PresetLibrary, switches: Switches
) -> tuple[tuple[Preset, ...], tuple[bool, ...]]:
    """The named stacks, each parsed once from the library and switched once; a matrix has base first, unswitched
    (the reference row), whether or not it was named."""
    if event == "matrix":
        names = [BASE] + [n for n in names if n != BASE]
    if any(not n for n in names):
        raise ConfigError("choose a preset: the preset name is empty")
    stacks = []
    for i, name in enumerate(names):
        p = library.get(name)
        stacks.append(p if event == "matrix" and i == 0 else switches.apply(p))
    return tuple(stacks), tuple(library.is_builtin(n) for n in names)
