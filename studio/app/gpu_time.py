"""How long a device event may hold a ZeroGPU GPU (`@spaces.GPU(duration=...)`), from its Ask: ZeroGPU cuts the call
at that time and charges the visitor's quota for all of it, so a small Generate reserves little, a Matrix up to MAX_S.
The estimate: the event's runs at the profile's `gpu_step_s` scaled by pixels, warm-ups, and compiles (on ZeroGPU an
ahead-of-time build at a shape not built yet), with a margin."""

from __future__ import annotations

import math

import gradio as gr

from studio.app.admit import Asks
from studio.spec.ask import Ask
from studio.spec.checks import ConfigError
from studio.spec.hosting import ahead_of_time_applies, aot_built, aot_dir, aot_marker_key
from studio.spec.profiles import ModelProfile
from studio.spec.settings import current

MIN_S = 15  # a call that needs less still gets this (the fork and the move to the GPU)
MAX_S = 600  # what one call may reserve at most
MARGIN = 1.5  # the estimate is a guess: reserve half as much again
OTHER_S = 3.0  # per run, outside the transformer: text encoders, VAE decode, the move of the picture off the GPU
COMPILE_S = 90.0  # one stack's torch.compile (or AoT) warm-up at a new shape
# runs a Generate makes at most: pairs (+4 extra; `on`: and base at fewer steps for a cached run's card), or one
PAIRS = {"on": 2 * (3 + 4) + 1, "auto": 2 * 3, "off": 1}
TUNE_RUNS = 40  # the quick search's screening and timed runs, about
FEWER_RUNS = 5  # base at fewer steps beside the tuned stack, per prompt: its ladder (2.8 base runs) and its search
TUNER_COMPILED = "compile"  # the preset whose compiled blocks the tuner's compiled option runs


def run_seconds(profile: ModelProfile, steps: int, width: int, height: int, cfg_calls: int = 1) -> float:
    """One run's estimated seconds at this size."""
    pixels = (width * height) / (profile.width * profile.height)
    return steps * cfg_calls * profile.gpu_step_s * pixels + OTHER_S


def reserve(run_s: float, runs: int, warmups: int, compiles: int) -> int:
    """Seconds to reserve for `runs` timed runs, `warmups` untimed ones and `compiles` compile warm-ups."""
    need = (runs + warmups) * run_s + compiles * COMPILE_S
    return int(min(MAX_S, max(MIN_S, math.ceil(need * MARGIN))))


def generate_s(run_s: float, compare: str, compiles: int) -> int:
    return reserve(run_s, PAIRS[compare], warmups=2, compiles=compiles)


def matrix_s(run_s: float, presets: int, repeats: int, compiles: int, prompts: int = 1) -> int:
    """(presets + 1) x repeats timed runs per prompt (`presets` counts base; then base again), a warm-up per stack and
    the settle run, and per stack and prompt at most one base run at fewer steps."""
    return reserve(
        run_s, (presets + 1) * repeats * prompts + presets * prompts, warmups=presets + 1, compiles=compiles
    )


def tune_s(run_s: float, prompts: int, compiles: int = 0) -> int:
    """The search's runs; `compiles`: its compiled option's build (its compiled cache stacks run the same blocks)."""
    return reserve(run_s, (TUNE_RUNS + FEWER_RUNS) * prompts, warmups=4, compiles=compiles)


class Durations:
    """The `duration` callables of the four device events, called with the event's arguments (its Ask among them); a
    form that cannot be read reserves MIN_S (the event refuses it before any GPU call)."""

    def __init__(self, studio):
        self.studio = studio
        self.asks = Asks(studio)

    def _run_s(self, ask: Ask) -> float:
        r = ask.request
        cfg = 2 if r.true_cfg_scale and r.true_cfg_scale > 1 else 1
        return run_seconds(ask.profile, r.steps, r.width, r.height, cfg_calls=cfg * r.num_images_per_prompt)

    def _compiles(self, ask: Ask, stacks) -> int:
        """Compile warm-ups the event makes; on ZeroGPU only ahead-of-time stacks (none with a LoRA) at a shape not
        built yet."""
        compiled = [p for p in stacks if p.compile.enabled]
        if not current().zerogpu:
            return len(compiled)
        if ask.request.loras:
            return 0
        shape = ask.request.graph_shape
        return sum(
            1
            for p in compiled
            if ahead_of_time_applies(p)  # (auto may choose none: reserved)
            and not aot_built(aot_dir(current().aot_dir), ask.model, aot_marker_key(p), p.dtype, shape)
        )

    def _safe(self, event: str, args, values: dict, estimate) -> int:
        try:
            ask = self.asks.of(event, args[0] if args else values.pop("request", None), values)
            return estimate(ask)
        except (ValueError, TypeError, KeyError, ConfigError, gr.Error):  # a bad form: refused before the GPU call
            return MIN_S

    def generate(self, *args, **v) -> int:
        return self._safe(
            "generate", args, v, lambda a: generate_s(self._run_s(a), a.compare, self._compiles(a, a.stacks))
        )

    def compare(self, *args, **v) -> int:
        return self._safe(
            "compare", args, v, lambda a: 2 * generate_s(self._run_s(a), "on", self._compiles(a, a.stacks))
        )

    def matrix(self, *args, **v) -> int:
        def need(a: Ask) -> int:  # (a.stacks: base first, the rows of a round but `base (again)`)
            return matrix_s(self._run_s(a), len(a.stacks), a.repeats, self._compiles(a, a.stacks), len(a.prompts))

        return self._safe("matrix", args, v, need)

    def tune(self, *args, **v) -> int:
        def need(a: Ask) -> int:
            compiled = self.studio.presets.get(TUNER_COMPILED)  # the tuner's compiled option's build
            return tune_s(self._run_s(a), len(a.prompts), self._compiles(a, [compiled]))

        return self._safe("tune", args, v, need)
