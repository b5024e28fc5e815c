"""Image quality against the base image (PSNR, SSIM) and the quality guard's verdict.

The guard tells a stack that is lossy from one that is broken. Low PSNR alone is not proof: a cache can flip a
composition into a different clean picture (about 12 dB on a two-object scene). A mis-wired stack makes
colour noise, whose fine-scale energy (what a 3x3 median filter removes) is far above the base image's; a
different clean picture keeps about the same (measured on the embedded model: 0.8-1.2x for other clean
compositions, 2.9x for a mis-wired cache, ~2000x for pure noise).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

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

    @property
    def broken(self) -> bool:
        return self.verdict is Verdict.BROKEN


def noise_energy(img) -> float:
    """Mean squared difference from the 3x3 median: the fine-scale energy a median filter removes.

    Noise is removed by a median filter; edges and flat regions are kept, so a clean picture of any
    composition scores low and colour noise scores high (unlike plain Laplacian energy, which also counts
    every edge, so that a picture with more objects would look noisier)."""
    x = _as_float(img)
    if x.ndim == 2:
        x = x[..., None]
    h, w = x.shape[:2]
    p = np.pad(x, ((1, 1), (1, 1), (0, 0)), mode="edge")
    med = np.median(np.stack([p[i : i + h, j : j + w] for i in range(3) for j in range(3)]), axis=0)
    return float(np.mean((x - med) ** 2))


def judge(image, base) -> Quality:
    """Compare a run's image with the base image of the same request and give a verdict."""
    p = psnr(image, base)
    s = ssim(image, base)
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
    return Quality(p, s, ratio, verdict)
