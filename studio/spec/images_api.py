"""The OpenAI images API's request (`POST /v1/images/generations`), read and checked; pure: no gradio, no torch.
Beside `images.generate`'s body: diffusion serving engines' fields (`seed`, ...) and the studio's `preset` (or
`model:preset`) and `compare`. Ignored OpenAI fields are listed back; any other is refused (a typo must not run)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from studio.spec.checks import ConfigError
from studio.spec.request import COMPARE_MODES

RESPONSE_FORMATS = ("b64_json", "url")
IGNORED = ("quality", "style", "user", "background", "moderation", "output_format", "output_compression")
EXTRA = ("seed", "num_inference_steps", "negative_prompt", "guidance_scale", "true_cfg_scale", "preset", "compare")
READ = ("prompt", "model", "n", "size", "response_format") + EXTRA
KNOWN = READ + IGNORED
MAX_N = 4  # the studio's batch limit (spec.request: num_images_per_prompt 1-4)
_SIZE = re.compile(r"^\s*(\d{1,5})\s*[xX]\s*(\d{1,5})\s*$")


class UnknownModel(ConfigError):
    """`model` names no model this studio serves: the endpoint answers 404."""


@dataclass(frozen=True)
class Served:
    """What the endpoint may run: the studio's models (the picker's; in public mode the only ones that load) and
    the preset names a visitor of it sees."""

    models: tuple
    presets: tuple
    default_preset: str
    compare: str = "auto"  # the studio's default compare mode (app.ui's `compare`)

    def model_and_preset(self, model: str | None, preset: str | None) -> tuple[str, str]:
        """(model, preset) from the body's `model` (maybe `model:preset`) and `preset` fields."""
        name = (model or self.models[0]).strip()
        head, colon, tail = name.rpartition(":")
        if colon and tail in self.presets:
            name, preset = head, preset or tail
        if name not in self.models:
            raise UnknownModel(
                f"model {name!r} is not served here: the models are {', '.join(self.models)} (GET /v1/models); name "
                f"one, with a preset after a colon if you like ({self.models[0]}:{self.default_preset})"
            )
        preset = preset or self.default_preset
        if preset not in self.presets:
            raise ConfigError(
                f"preset {preset!r} is not one of this studio's presets: use one of {list(self.presets)}"
            )
        return name, preset


def parse_size(text, sides: tuple[int, int, int], usual: list[str]) -> tuple[int, int] | None:
    """(width, height) of a "WxH" `size`, or None for the model's own (absent or `auto`). `sides` is the model's
    (multiple, smallest, largest) side; `usual` its usual sizes, named in the refusal."""
    if text is None or str(text).strip().lower() in ("", "auto"):
        return None
    m, lo, hi = sides
    got = _SIZE.match(str(text))
    w, h = (int(got.group(1)), int(got.group(2))) if got else (0, 0)
    if not got or any(v % m or not lo <= v <= hi for v in (w, h)):
        raise ConfigError(
            f"size {text!r} is not a size this model takes: width x height, each side a multiple of {m} from {lo} to "
            f"{hi}, e.g. {', '.join(usual[:4])}"
        )
    return w, h


def _int(body: dict, name: str, lo: int, hi: int) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or int(v) != v or not lo <= int(v) <= hi:
        raise ConfigError(f"{name}={v!r} is not valid: use a whole number from {lo} to {hi}")
    return int(v)


def _number(body: dict, name: str) -> float | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 100:
        raise ConfigError(f"{name}={v!r} is not valid: use a number from 0 to 100")
    return float(v)


@dataclass(frozen=True)
class ImagesRequest:
    """One checked `images.generate` body (`read`), in the studio's terms."""

    prompt: str
    model: str
    preset: str
    n: int = 1
    size: tuple[int, int] | None = None  # None: the model's own
    response_format: str = "b64_json"
    seed: int | None = None  # None: 0, as the studio's forms default
    steps: int | None = None  # None: the model's
    negative_prompt: str = ""
    guidance: float | None = None
    true_cfg_scale: float | None = None
    compare: str = "auto"
    ignored: tuple = field(default=())

    @classmethod
    def read(cls, body, served: Served, size_rule) -> ImagesRequest:
        """The request in `body` (the parsed JSON); `size_rule(model)` gives the model's ((multiple, smallest,
        largest), usual sizes) for the size check."""
        if not isinstance(body, dict):
            raise ConfigError('the request body must be a JSON object with at least a prompt: {"prompt": "..."}')
        unknown = sorted(set(body) - set(KNOWN))
        if unknown:
            raise ConfigError(f"field {unknown[0]!r} is not one this endpoint reads: it reads {', '.join(READ)}")
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise ConfigError("prompt is empty: write what the picture should show in `prompt`")
        model, preset = served.model_and_preset(body.get("model"), body.get("preset"))
        fmt = body.get("response_format") or "b64_json"
        if fmt not in RESPONSE_FORMATS:
            raise ConfigError(f"response_format={fmt!r} is not valid: use b64_json or url")
        compare = body.get("compare") or served.compare
        if compare not in COMPARE_MODES:
            raise ConfigError(f"compare={compare!r} is not valid: use one of {list(COMPARE_MODES)}")
        return cls(
            prompt=prompt,
            model=model,
            preset=preset,
            n=_int(body, "n", 1, MAX_N) or 1,
            size=parse_size(body.get("size"), *size_rule(model)),
            response_format=fmt,
            seed=_int(body, "seed", 0, 2**32 - 1),
            steps=_int(body, "num_inference_steps", 1, 1000),
            negative_prompt=str(body.get("negative_prompt") or ""),
            guidance=_number(body, "guidance_scale"),
            true_cfg_scale=_number(body, "true_cfg_scale"),
            compare=compare,
            ignored=tuple(k for k in IGNORED if k in body),
        )
