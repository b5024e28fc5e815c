"""LoRA adapters as records: one adapter (a file, folder or Hub id, or the name of one the model ships, and a scale),
read from the form or a preset.

A request's `loras` and a preset's `loras` are tuples of LoraSpec; engine.lora loads them (diffusers
load_lora_weights, a shipped name resolved here against the model that runs), engine.loader fuses a quantized preset's
own before quantizing.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from studio.spec.checks import ConfigError, Record, fail

MAX_LORAS = 4
# A bare word (no path separator, no dot): the name of a LoRA the model ships, never a file (a folder of that name in
# the working directory is written ./name). So a name reads only the model's own `loras/` folder: public mode takes it.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
LORA_FILE = "pytorch_lora_weights.safetensors"  # diffusers' save_lora_weights names it so


@dataclass(frozen=True)
class LoraSpec(Record):
    """One LoRA adapter on a request: a local .safetensors file or folder (or a Hub id where the Hub is reachable), or
    the name of one the model ships (a bare word: `outline`), loaded with diffusers' own `load_lora_weights`, at
    `scale`."""

    path: str
    scale: float = 1.0

    def __post_init__(self):
        if not isinstance(self.path, str) or not self.path.strip() or len(self.path) > 500:
            fail("lora", "path", self.path, "a LoRA file, folder or Hub id (at most 500 characters)")
        ok = not isinstance(self.scale, bool) and isinstance(self.scale, (int, float)) and math.isfinite(self.scale)
        if not ok or not -4 <= self.scale <= 4:
            fail("lora", "scale", self.scale, "a finite number from -4 to 4 (1: as trained, 0: off)")

    def label(self) -> str:
        return f"{self.path}@{self.scale:g}"

    @property
    def is_name(self) -> bool:
        """A shipped LoRA's name (NAME), resolved against the model that runs (resolve_lora), not a path."""
        return bool(NAME.fullmatch(self.path))


def shipped_dir(model: str | None) -> Path | None:
    """The folder of the LoRAs shipped with `model`: the embedded model's `loras/` beside its pipeline; None for any
    other model (none ship LoRAs)."""
    from studio.spec.profiles import EMBEDDED_DIR, resolve_model  # here: profiles imports request, which imports us

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
    from studio.spec.profiles import EMBEDDED_DIR, resolve_model

    path = resolve_model(model)
    return "'tiny' (the embedded one)" if Path(path).resolve() == EMBEDDED_DIR.resolve() else repr(path)


def parse_loras(text) -> tuple:
    """LoRA adapters from the form, one per line: `path` or `path@scale` (a scale is a number after the last @); a
    bare word is a shipped LoRA's name (LoraSpec.is_name)."""
    out = []
    for line in str(text or "").splitlines():
        line = line.strip()
        if not line:
            continue
        path, _, scale = line.rpartition("@")
        try:
            value = float(scale) if path else 1.0
        except ValueError:  # the "@" belongs to the path: no number after it
            path, value = line, 1.0
        out.append(LoraSpec(path or line, value))  # a scale out of range is refused here, with the field's name
    return tuple(out)


def lora_from_yaml(item, where: str = "preset.loras") -> LoraSpec:
    """One entry of a preset's `loras`: `{path: ..., scale: ...}` or the form's `path@scale` text."""
    if isinstance(item, str):
        found = parse_loras(item)
        if len(found) != 1:
            fail(where, "path", item, "one LoRA file, folder or Hub id (path or path@scale) per entry")
        return found[0]
    if not isinstance(item, dict) or set(item) - {"path", "scale"} or "path" not in item:
        fail(where, "entry", item, "a mapping {path: ..., scale: ...} (scale optional, 1 by default)")
    return LoraSpec(item["path"], item.get("scale", 1.0))


def merge_loras(preset_loras: tuple, request_loras: tuple) -> tuple:
    """A request's adapters on a preset that names its own: the preset's first, then the request's others (one the
    preset names runs at the preset's scale); at most MAX_LORAS."""
    own = {lo.path for lo in preset_loras}
    out = tuple(preset_loras) + tuple(lo for lo in request_loras if lo.path not in own)
    if len(out) > MAX_LORAS:
        fail("request", "loras", len(out), f"at most {MAX_LORAS} LoRAs with the preset's own")
    return out
