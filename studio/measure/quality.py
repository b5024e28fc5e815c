"""Image quality against the base image (PSNR, SSIM, FLIP, the worst tile, an error map) and the guard's verdict. Low
PSNR alone is not broken (a cache can flip a composition into another clean picture); a mis-wired stack's colour noise
has far more fine-scale energy than the base's: 2.9x, where other clean compositions keep 0.8-1.2x (embedded model)."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace

import numpy as np


class Verdict(str, enum.Enum):
    """How a run's image compares with the base image; the value is the word the UI shows."""

    IDENTICAL = "identical"
    GOOD = "good"
    LOSSY = "lossy"
    DIFFERENT = "different picture (clean)"
    BROKEN = "likely broken, not lossy"
    NOT_COMPARED = "not compared"

    def __str__(self) -> str:
        return self.value


GOOD_DB = 30.0
LOSSY_DB = 20.0
NOISE_HF_RATIO = 2.0  # fine-scale (noise) energy this many times the base's means noise, not a new picture
ERROR_SCALE = 8  # the error map's amplification: an error of 32 of 255 levels (or more) shows white
TILE = 8  # the worst tile's side in pixels


def _as_float(img) -> np.ndarray:
    arr = np.asarray(img)
    if arr.dtype == np.uint8:
        return arr.astype(np.float64)
    return np.clip(arr.astype(np.float64), 0.0, 1.0) * 255.0


def psnr(a, b, data_range: float = 255.0) -> float:
    """Peak signal-to-noise ratio in dB of two images (uint8 or [0, 1] floats); inf when equal."""
    x, y = _as_float(a), _as_float(b)
    if x.shape != y.shape:
        raise ValueError(f"psnr: shapes differ, {x.shape} vs {y.shape}")
    mse = float(np.mean((x - y) ** 2))
    if mse == 0.0:
        return math.inf
    return 10.0 * math.log10(data_range**2 / mse)


def error_map(a, b, scale: int = ERROR_SCALE) -> np.ndarray:
    """|a - b| per pixel as a grey HxWx3 uint8 picture: the largest channel error in 0..255 levels times `scale`,
    saturating at 255 (scale 8: an error of 1 level shows as 8, one of 32 or more as white)."""
    x, y = _as_float(a), _as_float(b)
    if x.shape != y.shape:
        raise ValueError(f"error_map: shapes differ, {x.shape} vs {y.shape}")
    if not scale > 0:
        raise ValueError(f"error_map: scale={scale!r} must be positive")
    d = np.abs(x - y)
    if d.ndim == 3:
        d = d.max(axis=2)
    grey = np.clip(np.rint(d * scale), 0, 255).astype(np.uint8)
    return np.repeat(grey[..., None], 3, axis=2)


def highest_tile(values: np.ndarray, tile: int = TILE) -> tuple[float, tuple[int, int]]:
    """The highest mean of an HxW map over a `tile` x `tile` tile (edge tiles smaller) and its top-left pixel (y, x);
    of equal ones the first in reading order, so an all-zero map gives (0.0, (0, 0))."""
    h, w = values.shape
    pad = ((0, -h % tile), (0, -w % tile))
    rows, cols = (h + pad[0][1]) // tile, (w + pad[1][1]) // tile

    def per_tile(v):
        return np.pad(v, pad).reshape(rows, tile, cols, tile).sum(axis=(1, 3))

    mean = per_tile(values) / per_tile(np.ones_like(values))
    i = int(np.argmax(mean))
    return float(mean.flat[i]), ((i // cols) * tile, (i % cols) * tile)


def worst_tile(a, b, tile: int = TILE) -> tuple[float, tuple[int, int]]:
    """The PSNR (dB) of the worst `tile` x `tile` tile (highest_tile's, by mean squared error over channels) and its
    top-left pixel (y, x); an identical pair gives (inf, (0, 0))."""
    x, y = _as_float(a), _as_float(b)
    if x.shape != y.shape:
        raise ValueError(f"worst_tile: shapes differ, {x.shape} vs {y.shape}")
    sq = (x - y) ** 2
    if sq.ndim == 3:
        sq = sq.mean(axis=2)
    worst, at = highest_tile(sq, tile)
    return (math.inf if worst == 0.0 else 10.0 * math.log10(255.0**2 / worst)), at


def difference(image, base, scale: int = ERROR_SCALE) -> dict:
    """The numbers that go with an error map (as data): PSNR, the worst tile's PSNR and place, the map's scale."""
    db, yx = worst_tile(image, base)
    return {"psnr_db": psnr(image, base), "worst_tile_psnr_db": db, "worst_tile_yx": list(yx), "map_scale": scale}


def _gaussian_kernel(size: int = 11, sigma: float = 1.5) -> np.ndarray:
    ax = np.arange(size) - (size - 1) / 2.0
    k = np.exp(-(ax**2) / (2 * sigma**2))
    return k / k.sum()


def _filter(img: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Separable 'valid' filtering along the first two axes."""
    n = len(k)
    h, w = img.shape[:2]
    tmp = sum(k[i] * img[i : h - n + 1 + i] for i in range(n))
    return sum(k[i] * tmp[:, i : w - n + 1 + i] for i in range(n))


def ssim(a, b, data_range: float = 255.0) -> float:
    """Mean structural similarity (Wang et al. 2004; 11x11 Gaussian window, sigma 1.5), averaged over channels."""
    x, y = _as_float(a), _as_float(b)
    if x.shape != y.shape:
        raise ValueError(f"ssim: shapes differ, {x.shape} vs {y.shape}")
    if x.ndim == 2:
        x, y = x[..., None], y[..., None]
    size = min(11, x.shape[0], x.shape[1])
    if size % 2 == 0:
        size -= 1
    k = _gaussian_kernel(size, 1.5 * size / 11)
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    mx, my = _filter(x, k), _filter(y, k)
    sxx = _filter(x * x, k) - mx * mx
    syy = _filter(y * y, k) - my * my
    sxy = _filter(x * y, k) - mx * my
    s = ((2 * mx * my + c1) * (2 * sxy + c2)) / ((mx * mx + my * my + c1) * (sxx + syy + c2))
    return float(s.mean())


@dataclass(frozen=True)
class Quality:
    psnr_db: float
    ssim: float
    hf_ratio: float
    verdict: Verdict
    worst_tile_psnr_db: float = math.inf  # the worst TILE x TILE tile's PSNR
    worst_tile_yx: tuple[int, int] = (0, 0)  # its top-left pixel
    flip: float | None = (
        None  # FLIP's mean error against base (measure.quality; 0: no visible difference); None: not taken
    )
    flip_worst_tile: float | None = None  # the highest mean FLIP of a TILE x TILE tile
    flip_worst_tile_yx: tuple[int, int] | None = None  # its top-left pixel

    @property
    def broken(self) -> bool:
        return self.verdict is Verdict.BROKEN


def noise_energy(img) -> float:
    """Mean squared difference from the 3x3 median: noise scores high, a clean picture of any composition low (a
    median keeps edges; Laplacian energy counts every edge, so more objects would look noisier)."""
    x = _as_float(img)
    if x.ndim == 2:
        x = x[..., None]
    h, w = x.shape[:2]
    p = np.pad(x, ((1, 1), (1, 1), (0, 0)), mode="edge")
    med = np.median(np.stack([p[i : i + h, j : j + w] for i in range(3) for j in range(3)]), axis=0)
    return float(np.mean((x - med) ** 2))


SEVERITY = (Verdict.IDENTICAL, Verdict.GOOD, Verdict.LOSSY, Verdict.DIFFERENT, Verdict.BROKEN)  # mildest first


def split_batch(strip: np.ndarray, n: int) -> list[np.ndarray]:
    """A batch's pictures from its strip (the engine stacks a batch's n images top to bottom)."""
    return list(np.split(strip, n, axis=0)) if n > 1 else [strip]


def judge_batch(strip, base_strip, n: int) -> tuple[Quality, list[Quality]]:
    """A batch of n pictures against the same batch's base pictures: one Quality per picture, and the batch's own
    (PSNR and SSIM over all of it, the worst tile among all, and the worst picture's verdict: one broken picture of
    four makes the batch broken, where over the whole strip its noise would be diluted)."""
    each = [judge(a, b) for a, b in zip(split_batch(strip, n), split_batch(base_strip, n), strict=True)]
    whole = judge(strip, base_strip, with_flip=False)
    worst = max(each, key=lambda q: SEVERITY.index(q.verdict))
    f = flip_of_batch([Flip(q.flip, q.flip_worst_tile, q.flip_worst_tile_yx) for q in each], strip.shape[0] // n)
    return replace(
        whole, verdict=worst.verdict, flip=f.mean, flip_worst_tile=f.worst_tile, flip_worst_tile_yx=f.worst_tile_yx
    ), each


def judge(image, base, with_flip: bool = True) -> Quality:
    """Compare a run's image with the base image of the same request and give a verdict (`with_flip`: FLIP's mean
    and worst tile too, measure.quality; a batch takes its pictures' instead)."""
    p = psnr(image, base)
    s = ssim(image, base)
    tile_db, tile_at = worst_tile(image, base)
    # +1 (in 0..255 units squared) keeps flat base images from dividing by ~0.
    ratio = (noise_energy(image) + 1.0) / (noise_energy(base) + 1.0)
    if math.isinf(p):
        verdict = Verdict.IDENTICAL
    elif ratio > NOISE_HF_RATIO and p < GOOD_DB:
        verdict = Verdict.BROKEN
    elif p >= GOOD_DB:
        verdict = Verdict.GOOD
    elif p >= LOSSY_DB:
        verdict = Verdict.LOSSY
    else:
        verdict = Verdict.DIFFERENT
    f = flip(image, base) if with_flip else None
    return Quality(
        p,
        s,
        ratio,
        verdict,
        tile_db,
        tile_at,
        f.mean if f else None,
        f.worst_tile if f else None,
        f.worst_tile_yx if f else None,
    )


# FLIP ---------------------------------------------------------------------------------------------------------------
# FLIP against the base image (NVIDIA's perceptual difference, `flip-evaluator`): 0 is no visible difference, 1 the
# largest; unlike PSNR it weighs a shifted edge or a colour change as the eye does, a tiny error in flat colour little.
# The library's input rules (docs/library-behaviour.md, F1-F4): float32 HxWx3 in [0, 1]. It reads a uint8 array as
# 0..255 floats and clips them (an error reads 9x too small) and a 4-channel array as 3-channel memory, so every
# picture passes through `_as_rgb01` first. Viewing conditions: the library's default, 67 pixels per degree.

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


@dataclass(frozen=True)
class Flip:
    """FLIP of a run's picture against its base: the mean error and the worst tile (value, top-left [y, x])."""

    mean: float
    worst_tile: float
    worst_tile_yx: tuple[int, int]


def flip(image, base) -> Flip:
    """The mean FLIP error of `image` against `base` and its worst TILE x TILE tile, from one evaluation."""
    err = flip_error(image, base)
    worst, at = highest_tile(err)  # the same tiles as worst_tile's
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
