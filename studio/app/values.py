"""Values between forms and components, without gradio: form fields as the engine takes them, and the engine's
results as components show them."""

from __future__ import annotations

import html
import io
import math

import numpy as np
from PIL import Image

from studio.measure.quality import split_batch
from studio.report.fmt import batch_caption
from studio.report.images import enlarge


def png(render) -> np.ndarray:
    buf = io.BytesIO()
    render(buf)
    buf.seek(0)
    return np.asarray(Image.open(buf).convert("RGB"))


def tile_at(db: float | None, yx) -> list[int] | None:
    """Where the map's frame goes: the worst tile, where there is one (none for an identical picture)."""
    return yx if db is not None and math.isfinite(db) else None


def notes_md(notes: str) -> str:
    """A profile's notes as Markdown text: `<colour>` in a grammar is text, not an HTML tag."""
    return html.escape(notes or "")


def json_safe(value):
    """JSON has no Infinity: an identical picture's PSNR (inf) is sent as the string "inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "inf" if value > 0 else ("-inf" if value < 0 else "nan")
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def batch_pictures(res) -> list:
    """A batch's pictures for the gallery, captioned with seed and PSNR; [] for one picture."""
    if not res.metrics.quality.batch:
        return []
    pics = split_batch(res.image, len(res.metrics.quality.batch))
    return [(enlarge(p, 192), batch_caption(b)) for p, b in zip(pics, res.metrics.quality.batch, strict=True)]


def cfg_scale(value) -> float | None:
    """The true-CFG field: empty follows the model's profile; 0 (a browser's empty number) is 1, true CFG off."""
    if value in (None, ""):
        return None
    return max(1.0, float(value))


# The numbers an API caller gets with each picture (the `/images` endpoint, the OpenAI endpoint's `studio` object):
# the run's record's keys, by name (measure.record.RunMetrics; docs/api.md lists them).
RUN_KEYS = (
    "model",
    "preset",
    "tag",
    "requested_tag",
    "label_changes",
    "device",
    "dtype",
    "denoise_s",
    "mean_step_ms",
    "full_steps",
    "cached_steps",
    "speedup",
    "speedup_lo",
    "speedup_hi",
    "timed_pairs",
    "speedup_note",
    "timing",
    "psnr_db",
    "ssim",
    "quality",
    "peak_memory",
)


def image_numbers(metrics: dict) -> list[dict]:
    """One record per picture of a run (`metrics`: RunMetrics.as_dict()): the run's RUN_KEYS with the picture's own
    seed and, in a batch, its own PSNR, SSIM and verdict."""
    run = {k: metrics.get(k) for k in RUN_KEYS}
    seed = (metrics.get("request") or {}).get("seed")
    each = metrics.get("batch") or [{"seed": seed}]
    return [json_safe({**run, "index": i, **pic}) for i, pic in enumerate(each)]


def table_frame(mat):
    """A report.table.Matrix as a DataFrame (the headers travel with the data), with the optional columns some row
    fills."""
    import pandas as pd

    opt = mat.optional()
    return pd.DataFrame([r.cells(opt) for r in mat.rows], columns=list(mat.columns()))


MAX_PUBLIC_PROMPTS = 3  # prompts one Tune or Matrix request may take on a public studio (each multiplies its runs)
