"""A generation request: what picture to make (prompt, seed, size, steps, guidance), validated on construction."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

import numpy as np

from studio.spec.checks import ConfigError, Record, check_int, fail
from studio.spec.lora import MAX_LORAS, LoraSpec, parse_loras  # noqa: F401  (re-exported: the request's own)

MAX_BATCH = 4  # pictures per request (num_images_per_prompt)
PROMPT_CHARS_CEILING = 1_000_000  # what any request may hold (STUDIO_MAX_PROMPT_CHARS' own top); the operator's: caps
# What each scale may be, and what its lowest value means. A negative or non-finite scale is refused, never dropped:
# a caller that sends guidance=-5 to a model without guidance is told so (check_scale), not answered silently.
SCALES = {"guidance": (0.0, 50.0, "0: no guidance"), "true_cfg_scale": (1.0, 50.0, "1: no true CFG")}


def check_scale(name: str, value) -> None:
    """guidance or true_cfg_scale: None, or a finite number in SCALES' range; ConfigError with a sentence otherwise."""
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
    # Image inputs: an input picture (HxWx3 uint8) makes it img2img, with a mask (HxW uint8, white: paint
    # here) inpaint; `strength` (0-1] is how much of the schedule runs: `executed_steps` of `steps`. Compared by their
    # digest (`as_dict`), never by value.
    image: np.ndarray | None = field(default=None, compare=False, repr=False)
    mask_image: np.ndarray | None = field(default=None, compare=False, repr=False)
    strength: float = 1.0
    loras: tuple = ()  # LoraSpec, at most MAX_LORAS: the base picture of a request with LoRAs has the same LoRAs

    def __post_init__(self):
        o = "request"
        if not isinstance(self.prompt, str) or not self.prompt.strip():
            fail(o, "prompt", self.prompt, "write a prompt (it is empty)")
        most = PROMPT_CHARS_CEILING  # (an operator's lower bound: check_caps)
        if len(self.prompt) > most:  # the message does not echo a huge prompt back
            raise ConfigError(
                f"request.prompt is {len(self.prompt)} characters long: at most {most} are allowed in any request"
            )
        for name in ("negative_prompt",):
            v = getattr(self, name)
            if not isinstance(v, str) or len(v) > most:
                fail(
                    o,
                    name,
                    v if isinstance(v, str) and len(v) < 80 else type(v).__name__,
                    f"a string of at most {most} characters",
                )
        check_int(o, "seed", self.seed, 0, 2**63 - 1)
        check_int(o, "steps", self.steps, 1, 200)
        check_int(o, "width", self.width, 16, 4096)
        check_int(o, "height", self.height, 16, 4096)
        check_scale("guidance", self.guidance)
        check_scale("true_cfg_scale", self.true_cfg_scale)
        if self.max_sequence_length is not None:
            check_int(o, "max_sequence_length", self.max_sequence_length, 1, 4096)
        check_int(o, "num_images_per_prompt", self.num_images_per_prompt, 1, MAX_BATCH)
        _check_inputs(self)
        if not isinstance(self.loras, tuple) or len(self.loras) > MAX_LORAS:
            fail(o, "loras", type(self.loras).__name__, f"a tuple of at most {MAX_LORAS} LoraSpec")
        if not all(isinstance(lo, LoraSpec) for lo in self.loras):
            fail(o, "loras", [type(lo).__name__ for lo in self.loras], "LoraSpec(path, scale) each")

    @property
    def task(self) -> str:
        """text2img, img2img (an input picture) or inpaint (and a mask)."""
        return "inpaint" if self.mask_image is not None else "img2img" if self.image is not None else "text2img"

    @property
    def graph_shape(self) -> tuple:
        """What a compiled stack's graphs (or packages) are built for; a warm-up is per graph shape."""
        return graph_shape_of(self.width, self.height, self.num_images_per_prompt, self.image)

    @property
    def executed_steps(self) -> int:
        """The denoising steps that really run: all of them for text2img; under img2img/inpaint the last
        `strength` of the schedule (diffusers' get_timesteps: steps - int(steps - min(steps * strength, steps)))."""
        if self.task == "text2img":
            return self.steps
        return self.steps - int(max(self.steps - min(self.steps * self.strength, self.steps), 0))

    def as_dict(self) -> dict:
        d = super().as_dict()
        for name in ("image", "mask_image"):
            d[name] = digest(getattr(self, name))
        d["loras"] = ";".join(lo.label() for lo in self.loras)  # a string: the request's key stays hashable
        return d

    def key(self, model: str, dtype: str = "") -> tuple:
        """Identity of the picture, for matching a run with its base image (same model, dtype and request)."""
        return (model, dtype) + tuple(self.as_dict().values())

    @property
    def size(self) -> tuple[int, int]:
        return (self.width, self.height)


def graph_shape_of(width: int, height: int, batch: int, image) -> tuple:
    """The size, the batch and an input picture's size (a reference picture joins the transformer's sequence): what
    a compiled stack's graphs or ahead-of-time packages are built for."""
    return (width, height, batch, tuple(image.shape[:2]) if image is not None else None)


def digest(picture: np.ndarray | None) -> str | None:
    """A picture as the request's record names it: its size and the first 12 hex digits of its SHA-1."""
    if picture is None:
        return None
    h = hashlib.sha1(np.ascontiguousarray(picture).tobytes()).hexdigest()[:12]
    return f"{picture.shape[1]}x{picture.shape[0]} sha1:{h}"


def _check_inputs(r: GenerationRequest) -> None:
    o = "request"
    if r.image is not None:
        ok = isinstance(r.image, np.ndarray) and r.image.dtype == np.uint8 and r.image.ndim == 3
        if not ok or r.image.shape[2] != 3 or min(r.image.shape[:2]) < 16 or max(r.image.shape[:2]) > 4096:
            fail(
                o,
                "image",
                getattr(r.image, "shape", type(r.image).__name__),
                "an RGB picture (HxWx3 uint8), 16-4096 px",
            )
    if r.mask_image is not None:
        if r.image is None:
            fail(o, "mask_image", "a mask", "a mask needs an input picture (image) to paint into")
        m = r.mask_image
        if not (
            isinstance(m, np.ndarray) and m.dtype == np.uint8 and m.shape[:2] == r.image.shape[:2] and m.ndim == 2
        ):
            fail(o, "mask_image", getattr(m, "shape", type(m).__name__), "a grey mask (HxW uint8) of the image's size")
    ok = not isinstance(r.strength, bool) and isinstance(r.strength, (int, float)) and 0 < r.strength <= 1
    if not ok:
        fail(o, "strength", r.strength, "a number in (0, 1]: how much of the schedule runs on the input picture")
    if r.image is None and r.strength != 1.0:
        fail(o, "strength", r.strength, "strength is read with an input picture (image); without one leave it at 1")
    if r.image is not None and r.executed_steps < 1:
        fail(o, "strength", r.strength, f"at {r.steps} steps, strength {r.strength:g} runs no step: raise either")


def image_inputs(image, mask, strength) -> dict:
    """The UI's uploads or the CLI's files as the request takes them: an RGB picture, a grey mask resized (nearest) to
    its size, and the strength; {} without a picture (text-to-image)."""
    if image is None:
        return {}
    from PIL import Image

    pic = np.asarray(Image.fromarray(np.asarray(image)).convert("RGB"))
    out = {"image": pic, "strength": float(strength if strength is not None else 1.0)}
    if mask is not None:
        m = Image.fromarray(np.asarray(mask)).convert("L")
        if m.size != (pic.shape[1], pic.shape[0]):
            m = m.resize((pic.shape[1], pic.shape[0]), Image.Resampling.NEAREST)
        out["mask_image"] = np.asarray(m)
    return out


def check_caps(
    request: GenerationRequest, max_steps: int | None, max_side: int | None, max_prompt_chars: int | None = None
) -> None:
    """ConfigError with a sentence when the request is over an operator's caps (steps, sides, the prompts' length)."""
    for name in ("prompt", "negative_prompt"):
        n = len(getattr(request, name))
        if max_prompt_chars is not None and n > max_prompt_chars:  # the message does not echo a long prompt back
            raise ConfigError(
                f"request.{name} is {n} characters long: at most {max_prompt_chars} are allowed "
                "(STUDIO_MAX_PROMPT_CHARS)"
            )
    if max_steps is not None and request.steps > max_steps:
        raise ConfigError(f"steps {request.steps} is over this studio's limit of {max_steps}")
    for name in ("width", "height"):
        v = getattr(request, name)
        if max_side is not None and v > max_side:
            raise ConfigError(f"{name} {v} is over this studio's limit of {max_side}")
