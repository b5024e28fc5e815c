"""Where the embedded model lives and the profile it ships with."""

from __future__ import annotations

import json
from pathlib import Path

from studio.models.profiles import PROFILE_FILE, ModelProfile

DEFAULT_DIR = Path(__file__).resolve().parent / "pipeline"

EXAMPLE_PROMPTS = (
    "a red circle in the center, blue background",
    "an orange triangle on the left, black background",
    "a yellow square at the top, purple background",
    "a white circle on the left and a green square on the right, black background",
    "a blue triangle at the top and a red circle at the bottom, yellow background",
)


def tiny_profile(cfg) -> ModelProfile:
    return ModelProfile(
        name="tiny-flux (embedded)",
        width=cfg.size,
        height=cfg.size,
        steps=28,
        guidance=None,
        max_sequence_length=cfg.text_len,
        size_multiple=cfg.vae_scale * 2,
        min_size=cfg.size // 2,
        max_size=cfg.size * 2,
        example_prompts=EXAMPLE_PROMPTS,
        notes="trained by the project on drawn scenes: 'a <colour> <shape> <where>[ and ...], <colour> background'",
    )


def write_profile(folder: Path, cfg) -> None:
    (Path(folder) / PROFILE_FILE).write_text(json.dumps(tiny_profile(cfg).as_dict(), indent=1))
