"""LoRA adapters as records (a file, folder or Hub id, or the name of one the model ships, and a scale), read from the
form or a preset; engine.lora loads them, engine.loader fuses a quantized preset's own before quantizing."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from studio.spec.checks import Record, fail

MAX_LORAS = 4
# A bare word (no path separator, no dot): the name of a LoRA the model ships, never a file (a folder of that name in
# the working directory is written ./name). So a name reads only the model's own `loras/` folder: public mode takes it.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
LORA_FILE = "pytorch_lora_weights.safetensors"  # diffusers' save_lora_weights names it so


@dataclass(frozen=True)
class LoraSpec(Record):
    """One LoRA adapter: a local .safetensors file or folder (or a Hub id where the Hub is reachable), or the name of
    one the model ships (a bare word: `outline`), at `scale`."""

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
        """A shipped LoRA's name (NAME), resolved against the model that runs, not a path."""
        return bool(NAME.fullmatch(self.path))


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
