"""A generation request: what picture to make (prompt, seed, size, steps, guidance), validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass

from studio.spec.checks import ConfigError, Record, check_int, fail

MAX_BATCH = 4  # pictures per request (num_images_per_prompt)
MAX_PROMPT_CHARS = 2000  # far past any DiT's text window (FLUX: 512 T5 tokens); refuses junk before model work
# What each scale may be, and what its lowest value means. A negative or non-finite scale is refused, never dropped:
# a caller that sends guidance=-5 to a model without guidance is told so (check_scale), not answered silently.
SCALES = {"guidance": (0.0, 50.0, "0: no guidance"), "true_cfg_scale": (1.0, 50.0, "1: no true CFG")}


def check_scale(name: str, value) -> None:
    """guidance or true_cfg_scale: None, or a finite number in SCALES' range; ConfigError with a sentence otherwise.

    The one rule, used by GenerationRequest and by a caller that validates a scale the model then ignores."""
    if value is None:
        return
    lo, hi, meaning = SCALES[name]
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if not ok or not lo <= value <= hi:
        fail("request", name, value, f"{name} is a finite number from {lo:g} to {hi:g} ({meaning}), or unset")


# How a run is compared with base (studio.engine.baseline): `on` times base beside the run and computes the same
# request's base picture (PSNR, SSIM, error map); `auto` divides by a kept base timing of the same shape (a DiT's
# denoise time does not depend on the prompt), timed when absent or stale, and uses the same request's base picture
# only where it is kept; `off` runs the stack alone.
COMPARE_MODES = ("on", "auto", "off")


def compare_mode(value) -> str:
    """A compare setting as one of COMPARE_MODES (True: on, False: off); ConfigError with a sentence otherwise."""
    if value is True or value is False:
        return "on" if value else "off"
    if isinstance(value, str) and value.strip().lower() in COMPARE_MODES:
        return value.strip().lower()
    fail("request", "compare", value, "one of on, auto, off")


@dataclass(frozen=True)
class GenerationRequest(Record):
    prompt: str
    seed: int = 0
    steps: int = 28
    width: int = 64
    height: int = 64
    guidance: float | None = None
    true_cfg_scale: float | None = None
    negative_prompt: str = ""
    max_sequence_length: int | None = None
    num_images_per_prompt: int = 1  # a batch: picture i is seed + i's (engine.call), stacked top to bottom

    def __post_init__(self):
        o = "request"
        if not isinstance(self.prompt, str) or not self.prompt.strip():
            fail(o, "prompt", self.prompt, "write a prompt (it is empty)")
        if len(self.prompt) > MAX_PROMPT_CHARS:  # the message does not echo a huge prompt back
            raise ConfigError(
                f"request.prompt is {len(self.prompt)} characters long: at most {MAX_PROMPT_CHARS} are allowed"
            )
        for name in ("negative_prompt",):
            v = getattr(self, name)
            if not isinstance(v, str) or len(v) > MAX_PROMPT_CHARS:
                fail(o, name, v if isinstance(v, str) and len(v) < 80 else type(v).__name__,
                     f"a string of at most {MAX_PROMPT_CHARS} characters")  # fmt: skip
        check_int(o, "seed", self.seed, 0, 2**63 - 1)
        check_int(o, "steps", self.steps, 1, 200)
        check_int(o, "width", self.width, 16, 4096)
        check_int(o, "height", self.height, 16, 4096)
        check_scale("guidance", self.guidance)
        check_scale("true_cfg_scale", self.true_cfg_scale)
        if self.max_sequence_length is not None:
            check_int(o, "max_sequence_length", self.max_sequence_length, 1, 4096)
        check_int(o, "num_images_per_prompt", self.num_images_per_prompt, 1, MAX_BATCH)

    def key(self, model: str, dtype: str = "") -> tuple:
        """Identity of the picture, for matching a run with its base image (same model, dtype and request)."""
        return (model, dtype) + tuple(self.as_dict().values())

    @property
    def shape(self) -> tuple[int, int]:
        return (self.width, self.height)
