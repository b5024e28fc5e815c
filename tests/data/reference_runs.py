"""Reference runs for a change that must not change behaviour (a house step): presets x prompts through the Runner,
the sha256 of each picture and of its base picture, the counts and the record's non-timing fields, as JSON.

    STUDIO_DTYPE=float32 PYTHONPATH=. .venv/bin/python tests/data/reference_runs.py > before.json   # the old tree
    STUDIO_DTYPE=float32 PYTHONPATH=. .venv/bin/python tests/data/reference_runs.py > after.json    # the new one
    diff before.json after.json                                                          # empty: bitwise the same

Pictures are bitwise reproducible in one process kind on one machine (float32; bf16 on a CPU with AMX too).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import replace

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("CACHE_DIT_LOG_LEVEL", "error")

from studio.engine import ModelManager, Runner  # noqa: E402
from studio.spec import PresetLibrary  # noqa: E402
from studio.spec.settings import Settings, install  # noqa: E402

PRESETS = ("base", "cache", "int8", "int8-weight-only", "sage", "cache-int8", "cache-int8-sage", "compile")
PROMPTS = ("a red cube on a blue floor", "two yellow spheres under a green sky")
# the record's fields that read no clock (everything a timing or a machine's pace moves is left out)
KEPT = (
    "model",
    "preset",
    "tag",
    "requested_tag",
    "label_changes",
    "dtype",
    "request",
    "full_steps",
    "cached_steps",
    "transformer_calls",
    "cached_step_indices",
    "count_source",
    "count_check",
    "residual_diffs",
    "cache_threshold",
    "backend_cached_steps",
    "backend_cfg_cached_steps",
    "psnr_db",
    "ssim",
    "hf_ratio",
    "quality",
    "engaged",
    "fallbacks",
    "blocks",
    "worst_tile_psnr_db",
    "worst_tile_yx",
    "flip",
    "flip_worst_tile",
    "flip_worst_tile_yx",
    "batch",
    "cache_skippable",
    "cache_headroom",
    "cache_idle",
    "placement",
)


def sha(picture) -> str | None:
    return hashlib.sha256(picture.tobytes()).hexdigest()[:16] if picture is not None else None


def main() -> int:
    settings = install(Settings.from_env(os.environ))
    runner = Runner(ModelManager("cpu", settings=settings), PresetLibrary(), model="tiny")
    runner.pairing = replace(runner.pairing, cheap_pairs=1, max_extra_pairs=0)
    out = []
    for name in PRESETS:
        for i, prompt in enumerate(PROMPTS):
            res = runner.generate(runner.request(prompt, seed=7 + i), name, compare="on")
            d = res.metrics.as_dict()
            out.append({"image": sha(res.image), "base": sha(res.base_image), **{k: d.get(k) for k in KEPT}})
    runner.manager.unload()
    json.dump(out, sys.stdout, indent=1, sort_keys=True, default=str)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
