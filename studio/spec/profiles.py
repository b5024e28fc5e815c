"""Model profiles: the defaults (size, steps, guidance, text length, example prompts) a model is good at, from a
folder's `studio_profile.json`, the Hub table below or its own config; and the model and LoRA names a user types."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from studio.spec.checks import ConfigError
from studio.spec.lora import LORA_FILE, NAME, LoraSpec
from studio.spec.request import GenerationRequest, check_scale

PROFILE_FILE = "studio_profile.json"
# The embedded tiny FLUX-architecture model (weights only; the tools that build it live in studio.tiny).
EMBEDDED_DIR = Path(__file__).resolve().parent.parent / "models" / "tiny" / "pipeline"
EMBEDDED_ALIASES = ("tiny", "embedded", "tiny-flux")


def resolve_model(model: str | None) -> str:
    """'tiny' (or None) -> the embedded model's folder; anything else is a local folder or a Hub id."""
    if model is None or model in EMBEDDED_ALIASES:
        return str(EMBEDDED_DIR)
    return model


@dataclass(frozen=True)
class ModelProfile:
    name: str
    width: int = 1024
    height: int = 1024
    steps: int = 28
    guidance: float | None = 3.5  # None: the model takes no guidance input
    true_cfg_scale: float | None = None  # true CFG (with a negative prompt), where the model wants it
    max_sequence_length: int | None = None
    size_multiple: int = 16  # width/height must be multiples of this
    min_size: int = 256
    max_size: int = 2048
    example_prompts: tuple[str, ...] = ()
    notes: str = ""  # shown under the model picker
    # An edit model (FLUX.1 Kontext, Qwen-Image-Edit): a request's picture is a reference and the whole schedule runs
    # (engine.tasks), so no strength is read: the form and the CLI send 1.
    edits: bool = False
    # What to reserve on ZeroGPU per transformer call at this profile's size, in seconds (studio.app.gpu_time): an
    # estimate for the reservation only, never shown as a measurement; bf16 on an H200 slice, rounded up
    gpu_step_s: float = 0.15
    # The preset a plain Generate runs on this model where the operator names none (STUDIO_PRESET): its searched best
    # that beats base at fewer steps (docs/tiny-model.md); None: the studio's own default (`cache`)
    default_preset: str | None = None

    def __post_init__(self):
        for f in ("width", "height", "steps", "size_multiple", "min_size", "max_size"):
            v = getattr(self, f)
            if not isinstance(v, int) or v <= 0:
                raise ConfigError(f"ModelProfile.{f}={v!r}: must be a positive integer")
        object.__setattr__(self, "example_prompts", tuple(self.example_prompts))

    @property
    def first_prompt(self) -> str:
        """The prompt a request starts from when none is given: the first example, or a generic one."""
        return self.example_prompts[0] if self.example_prompts else "a photo of a cat"

    def aspect_sizes(self) -> list[tuple[str, int, int]]:
        """(label, width, height) for the common aspect ratios at about this profile's pixel count, each side a
        multiple of `size_multiple` within [min_size, max_size]: sizes the model takes as they are."""
        area, m, out = self.width * self.height, self.size_multiple, []
        for w_r, h_r in ((1, 1), (4, 3), (3, 4), (3, 2), (2, 3), (16, 9), (9, 16)):
            w = (area * w_r / h_r) ** 0.5
            sides = [min(self.max_size, max(self.min_size, max(m, round(x / m) * m))) for x in (w, w * h_r / w_r)]
            out.append((f"{w_r}:{h_r} ({sides[0]}x{sides[1]})", sides[0], sides[1]))
        return out

    def request(self, prompt: str, **overrides) -> GenerationRequest:
        """A request with this profile's defaults for whatever is not given (None: the default)."""
        kw = dict(
            steps=self.steps,
            width=self.width,
            height=self.height,
            guidance=self.guidance,
            true_cfg_scale=self.true_cfg_scale,
            max_sequence_length=self.max_sequence_length,
        )
        kw.update({k: v for k, v in overrides.items() if v is not None})
        if self.guidance is None and kw["guidance"] is not None:  # a model that takes no guidance: dropped, but a
            check_scale("guidance", kw["guidance"])  # bad value is refused all the same (the form's and the CLI's)
            kw["guidance"] = None
        return GenerationRequest(prompt=prompt, **kw)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelProfile":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"model profile: unknown keys {sorted(unknown)}; allowed: {sorted(known)}")
        return cls(**d)


_FLUX_PROMPTS = (
    "a tiny astronaut hatching from an egg on the moon, cinematic light",
    "a red fox in a snowy forest at dawn, photograph",
    "a bowl of ramen on a wooden table, studio lighting",
)
HUB_PROFILES: dict[str, ModelProfile] = {
    "black-forest-labs/FLUX.1-dev": ModelProfile(
        "FLUX.1-dev",
        steps=28,
        guidance=3.5,
        max_sequence_length=512,
        example_prompts=_FLUX_PROMPTS,
        gpu_step_s=0.2,  # measured 175 ms a call at 1024x1024 on a whole H200 (docs/bench/gpu/gpu-check-2026-11-29.md)
    ),
    "black-forest-labs/FLUX.1-schnell": ModelProfile(
        "FLUX.1-schnell", steps=4, guidance=0.0, max_sequence_length=256, example_prompts=_FLUX_PROMPTS
    ),
    "Qwen/Qwen-Image": ModelProfile(
        "Qwen-Image",
        width=1328,
        height=1328,
        steps=50,
        guidance=None,
        true_cfg_scale=4.0,
        gpu_step_s=0.35,  # a 20B DiT at 1328x1328
        example_prompts=('a coffee shop sign that reads "Speed Studio", warm evening light',) + _FLUX_PROMPTS[:2],
    ),
    "black-forest-labs/FLUX.1-Kontext-dev": ModelProfile(
        "FLUX.1-Kontext-dev",
        steps=28,
        guidance=2.5,
        max_sequence_length=512,
        edits=True,
        gpu_step_s=0.3,
        example_prompts=("make it a watercolour painting", "change the sky to a sunset"),
        notes="an edit model: upload a picture (Image input) and say what to change; without one it draws from text",
    ),
    "Qwen/Qwen-Image-Edit": ModelProfile(
        "Qwen-Image-Edit",
        width=1024,
        height=1024,
        steps=50,
        guidance=None,
        true_cfg_scale=4.0,
        edits=True,
        gpu_step_s=0.7,
        example_prompts=("make it a watercolour painting", 'add a sign that reads "Open"'),
        notes="an edit model: upload a picture (Image input) and say what to change",
    ),
    "Tongyi-MAI/Z-Image-Turbo": ModelProfile(
        "Z-Image-Turbo", steps=9, guidance=0.0, example_prompts=_FLUX_PROMPTS, gpu_step_s=0.1
    ),
    "stabilityai/stable-diffusion-3.5-large": ModelProfile(
        "SD3.5-large", steps=28, guidance=3.5, size_multiple=16, example_prompts=_FLUX_PROMPTS
    ),
    "stabilityai/stable-diffusion-3.5-medium": ModelProfile(
        "SD3.5-medium", steps=40, guidance=4.5, size_multiple=16, example_prompts=_FLUX_PROMPTS
    ),
}


# A pipeline folder without a studio_profile.json behaves like the Hub model of its class.
_CLASS_PROFILES = {
    "QwenImagePipeline": "Qwen/Qwen-Image",
    "FluxKontextPipeline": "black-forest-labs/FLUX.1-Kontext-dev",
    "QwenImageEditPipeline": "Qwen/Qwen-Image-Edit",
    "ZImagePipeline": "Tongyi-MAI/Z-Image-Turbo",
    "StableDiffusion3Pipeline": "stabilityai/stable-diffusion-3.5-large",
}


def _config(folder: Path, name: str) -> dict:
    path = folder / name
    return json.loads(path.read_text()) if path.is_file() else {}


def _vae_scale(vae: dict) -> int | None:
    if "temperal_downsample" in vae:  # AutoencoderKLQwenImage / Wan: one 2x per stage
        return 2 ** len(vae["temperal_downsample"])
    if "block_out_channels" in vae:  # AutoencoderKL
        return 2 ** (len(vae["block_out_channels"]) - 1)
    return None


def profile_from_folder(folder: Path) -> ModelProfile | None:
    """A profile from a diffusers folder's own config: its pipeline class picks the family's defaults (CFG mode,
    guidance, steps, size), its VAE and patch size the size multiple. None when the folder holds no pipeline."""
    index = _config(folder, "model_index.json")
    cls = index.get("_class_name")
    if not cls:
        return None
    if cls == "FluxPipeline":
        distilled = not _config(folder, "transformer/config.json").get("guidance_embeds", True)
        hub = "black-forest-labs/FLUX.1-schnell" if distilled else "black-forest-labs/FLUX.1-dev"
    else:
        hub = _CLASS_PROFILES.get(cls)
    base = HUB_PROFILES[hub] if hub else ModelProfile(name=cls)
    scale = _vae_scale(_config(folder, "vae/config.json"))
    patch = _config(folder, "transformer/config.json").get("patch_size", 2)
    # FLUX's config says patch 1 but its pipeline packs 2x2 latents: every family needs at least 2 latent pixels.
    patch = max(patch, 2) if isinstance(patch, int) else 2
    multiple = scale * patch if scale else base.size_multiple
    return replace(base, name=f"{folder.name} ({cls})", size_multiple=multiple)


def profile_for(model: str) -> ModelProfile:
    """A folder's studio_profile.json, else a known Hub id's, else one from the folder's own config, else defaults."""
    path = Path(model)
    if (path / PROFILE_FILE).is_file():
        return ModelProfile.from_dict(json.loads((path / PROFILE_FILE).read_text()))
    if model in HUB_PROFILES:
        return HUB_PROFILES[model]
    if path.is_dir():
        derived = profile_from_folder(path)
        if derived is not None:
            return derived
    return ModelProfile(name=path.name or model)


# the LoRAs a model ships -------------------------------------------------------------------------------------------
def shipped_dir(model: str | None) -> Path | None:
    """The embedded model's `loras/` beside its pipeline; None for any other model (none ship LoRAs)."""
    if Path(resolve_model(model)).resolve() == EMBEDDED_DIR.resolve():
        return EMBEDDED_DIR.parent / "loras"
    return None


def shipped_loras(model: str | None) -> dict[str, Path]:
    """name -> weights file of each LoRA shipped with `model` (a folder of its loras/ holding LORA_FILE)."""
    root = shipped_dir(model)
    if root is None or not root.is_dir():
        return {}
    found = {d.name: d / LORA_FILE for d in sorted(root.iterdir()) if NAME.fullmatch(d.name)}
    return {name: f for name, f in found.items() if f.is_file()}


def resolve_lora(lora: LoraSpec, model: str | None) -> str:
    """What diffusers loads for `lora` on `model`: a shipped name's weights file, a path or Hub id as given; a name
    the model does not ship is refused with the names it does."""
    if not lora.is_name:
        return lora.path
    shipped = shipped_loras(model)
    if lora.path in shipped:
        return str(shipped[lora.path])
    if shipped:
        has = f"the LoRAs shipped with it are {', '.join(shipped)}"
    else:
        theirs = ", ".join(shipped_loras(None))
        has = "it ships no LoRAs" + (f" (the embedded model 'tiny' ships {theirs})" if theirs else "")
    raise ConfigError(
        f"request.loras: {lora.path!r} is not a LoRA shipped with the model {_model_label(model)}: {has}; a file or "
        f"folder of your own is a path (./{lora.path}, or a .safetensors file)"
    )


def _model_label(model: str | None) -> str:
    path = resolve_model(model)
    return "'tiny' (the embedded one)" if Path(path).resolve() == EMBEDDED_DIR.resolve() else repr(path)
