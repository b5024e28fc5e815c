"""How long a device event may hold a ZeroGPU GPU: `@spaces.GPU(duration=...)` computed per call from the request.

ZeroGPU reserves a GPU for `duration` seconds per call (60 s unless said) and cuts the call at that time; a visitor's
quota is charged for the reservation. So the duration is what this request needs, not a constant: the denoising
work (steps x transformer calls x an estimated time per call at this size, from the model profile's `gpu_step_s`
scaled by pixels), times the runs the event makes (the compare mode's pairs, a Matrix's presets and repeats, the
tuner's search), plus a warm-up for each stack and a compile where one is asked for (on ZeroGPU only an ahead-of-time
build, engine.aot, at a shape not built yet), with a margin. A small
Generate reserves little; a Matrix of every preset reserves what it needs, up to `MAX_S`.

Not gradio and not torch: the handlers' forms in, seconds out (the callable ZeroGPU calls with the event's own
arguments is built in app.ui).
"""

from __future__ import annotations

import math

from studio.app.values import MAX_PUBLIC_PROMPTS, more_prompts, prompt_lines
from studio.spec.checks import ConfigError
from studio.spec.hosting import aot_built, aot_marker_key
from studio.spec.profiles import ModelProfile
from studio.spec.request import graph_shape_of
from studio.spec.settings import current

MIN_S = 15  # a call that needs less still gets this (the fork and the move to the GPU)
MAX_S = 600  # what one call may reserve at most
MARGIN = 1.5  # the estimate is a guess: reserve half as much again
OTHER_S = 3.0  # per run, outside the transformer: text encoders, VAE decode, the move of the picture off the GPU
COMPILE_S = 90.0  # one stack's torch.compile (or AoT) warm-up at a new shape
PAIRS = {"on": 2 * (3 + 4), "auto": 2 * 3, "off": 1}  # runs a Generate makes at most: pairs (+4 extra), or one
TUNE_RUNS = 40  # the quick search's screening and timed runs, about


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
    """(presets + 1) x repeats timed runs (base again in each round) per prompt, a warm-up of each stack and the
    settle run."""
    return reserve(run_s, (presets + 1) * repeats * prompts, warmups=presets + 1, compiles=compiles)


def tune_s(run_s: float, prompts: int, compiles: int = 0) -> int:
    """The search's runs; `compiles`: its compiled option's build (its compiled cache stacks run the same blocks)."""
    return reserve(run_s, TUNE_RUNS * prompts, warmups=4, compiles=compiles)


class Durations:
    """The `duration` callables of the four device events, over the studio's profiles and presets. ZeroGPU calls
    each with the event's own arguments (the form's values by name); a value that cannot be read reserves MIN_S
    (the handler then refuses the request at once)."""

    def __init__(self, studio):
        self.studio = studio

    def _run_s(self, v: dict) -> float:
        prof = self.studio.device.profile(v.get("model") or self.studio.models[0])
        scale = v.get("true_cfg_scale")
        scale = prof.true_cfg_scale if scale in (None, "") else float(scale)
        cfg = 2 if scale and scale > 1 else 1
        size = [int(v.get(k) or getattr(prof, k)) for k in ("steps", "width", "height")]
        return run_seconds(prof, *size, cfg_calls=cfg * int(v.get("num_images_per_prompt") or 1))

    def _compiles(self, v: dict, names: list[str]) -> int:
        """Compile warm-ups the event makes. On ZeroGPU only the stacks that compile ahead of time (engine.aot: not
        quantized, not offloaded, no LoRA) and only at a shape whose packages are not built yet."""
        lib = self.studio.presets
        forced = str(v.get("compile", "unset")).lower() == "true"
        compiled = [lib.get(n) for n in names if n in lib.names() and (forced or lib.get(n).compile.enabled)]
        if not current().zerogpu:
            return len(names) if forced else len(compiled)
        if v.get("loras"):
            return 0
        model = v.get("model") or self.studio.models[0]
        image = v.get("image")
        sizes = (int(v.get(k) or 0) for k in ("width", "height"))
        shape = graph_shape_of(
            *sizes, int(v.get("num_images_per_prompt") or 1), image if hasattr(image, "shape") else None
        )
        return sum(
            1
            for p in compiled
            if not p.quantize_config.enabled
            and p.offload_config.policy in ("none", "auto")  # auto may choose none: reserve
            and not aot_built(model, aot_marker_key(p), p.dtype, shape)
        )

    def _safe(self, estimate) -> int:
        try:
            return estimate()
        except (ValueError, TypeError, KeyError, ConfigError):  # a bad form: the handler refuses it in no time
            return MIN_S

    def generate(self, *args, **v) -> int:
        mode = str(v.get("compare", "on")).lower()
        return self._safe(lambda: generate_s(self._run_s(v), mode, self._compiles(v, [v.get("preset")])))

    def compare(self, *args, **v) -> int:
        names = [v.get("preset_a"), v.get("preset_b")]
        return self._safe(lambda: 2 * generate_s(self._run_s(v), "on", self._compiles(v, names)))

    def matrix(self, *args, **v) -> int:
        names = list(v.get("presets") or [])
        cap = MAX_PUBLIC_PROMPTS if self.studio.public else None
        prompts = 1 + len(more_prompts(v.get("prompts_text"), str(v.get("prompt") or ""), cap))
        return self._safe(
            lambda: matrix_s(self._run_s(v), len(names), int(v.get("repeats") or 1), self._compiles(v, names), prompts)
        )

    def tune(self, *args, **v) -> int:
        prompts = prompt_lines(v.get("prompts_text")) or [""]
        return self._safe(lambda: tune_s(self._run_s(v), len(prompts), self._compiles(v, ["compile"])))
