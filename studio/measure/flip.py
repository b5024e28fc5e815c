"""FLIP against the base image (NVIDIA's perceptual difference, `flip-evaluator`): its mean error, its worst tile,
and its error map as a picture in FLIP's own colour map (magma).

FLIP is built to compare a test image with a reference as a person flipping between them would see it: 0 is no
visible difference, 1 the largest (black against white reads 0.97). Unlike PSNR it weighs a shifted edge or a colour
change as the eye does, and a tiny error in flat colour little.

The library's input rules (docs/library-behaviour.md, F1-F4): float32 HxWx3 in [0, 1] ("LDR": sRGB). It reads a
uint8 array without complaint as 0..255 floats and clips them, so an error reads 9x too small; a 4-channel array is
read as 3-channel memory (the alpha channel counts as colour); a 2-D array is a TypeError; sizes that differ are a
RuntimeError. So every picture passes through `_as_rgb01` first. Viewing conditions: the library's default, 67
pixels per degree (a 0.7 m wide 4K monitor at 0.7 m), for every size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from studio.measure.quality import TILE, highest_tile  # the same tiles as the worst PSNR tile's

RANGE = "LDR"  # 8-bit sRGB pictures


def _as_rgb01(img, what: str) -> np.ndarray:
    """A picture as FLIP reads it: float32, C order, HxWx3 in [0, 1] (uint8 divided by 255; grey repeated)."""
    arr = np.asarray(img)
    if arr.ndim == 2:
        arr = arr[..., None]
    if arr.ndim != 3 or arr.shape[2] not in (1, 3):
        raise ValueError(f"flip: {what} has shape {arr.shape}; give an HxW or HxWx3 picture (drop an alpha channel)")
    x = arr.astype(np.float32) / 255.0 if arr.dtype == np.uint8 else np.clip(arr.astype(np.float32), 0.0, 1.0)
    if x.shape[2] == 1:
        x = np.repeat(x, 3, axis=2)
    return np.ascontiguousarray(x)


def _pair(image, base) -> tuple[np.ndarray, np.ndarray]:
    x, y = _as_rgb01(image, "image"), _as_rgb01(base, "base")
    if x.shape != y.shape:
        raise ValueError(f"flip: shapes differ, {x.shape} vs {y.shape}")
    return x, y


def flip_error(image, base) -> np.ndarray:
    """FLIP's per-pixel error of `image` against `base` (the reference), HxW floats in [0, 1]."""
    import flip_evaluator

    x, y = _pair(image, base)
    err, _, _ = flip_evaluator.evaluate(y, x, RANGE, applyMagma=False, computeMeanError=False)
    return np.asarray(err, dtype=np.float64)[..., 0]


def worst_flip_tile(err: np.ndarray, tile: int = TILE) -> tuple[float, tuple[int, int]]:
    """The highest mean FLIP error of a `tile` x `tile` tile of the error map, and its top-left pixel (y, x): the
    same tiles as measure.quality.worst_tile's (`highest_tile`); an identical pair gives (0.0, (0, 0))."""
    return highest_tile(err, tile)


@dataclass(frozen=True)
class Flip:
    """FLIP of a run's picture against its base: the mean error and the worst tile (value, top-left [y, x])."""

    mean: float
    worst_tile: float
    worst_tile_yx: tuple[int, int]


def flip(image, base) -> Flip:
    """The mean FLIP error of `image` against `base` and its worst TILE x TILE tile, from one evaluation."""
    err = flip_error(image, base)
    worst, at = worst_flip_tile(err)
    return Flip(float(err.mean()), worst, at)


def flip_of_batch(each: list[Flip], height: int) -> Flip:
    """A batch's FLIP from its pictures' (each `height` pixels tall, stacked top to bottom): the mean of their means
    (the mean over all the batch's pixels) and the worst of their tiles, placed in the strip. FLIP over the strip
    itself would filter across the seams between pictures."""
    k = max(range(len(each)), key=lambda i: each[i].worst_tile)
    yx = (each[k].worst_tile_yx[0] + k * height, each[k].worst_tile_yx[1])
    return Flip(float(np.mean([f.mean for f in each])), each[k].worst_tile, yx)


def flip_map(image, base) -> np.ndarray:
    """FLIP's error map of `image` against `base` as a picture in its own colour map (magma: black is no visible
    difference, through purple and orange to pale yellow at 1), HxWx3 uint8."""
    import flip_evaluator

    x, y = _pair(image, base)
    rgb, _, _ = flip_evaluator.evaluate(y, x, RANGE, applyMagma=True, computeMeanError=False)
    return np.clip(np.rint(np.asarray(rgb) * 255.0), 0, 255).astype(np.uint8)
