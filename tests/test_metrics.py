"""PSNR, SSIM and the quality guard on arrays whose answers can be worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from studio.measure.quality import Verdict, judge, noise_energy, psnr, ssim

BROKEN, DIFFERENT, GOOD, IDENTICAL, LOSSY = (
    Verdict.BROKEN,
    Verdict.DIFFERENT,
    Verdict.GOOD,
    Verdict.IDENTICAL,
    Verdict.LOSSY,
)


def test_psnr_known_answers():
    a = np.full((8, 8, 3), 100, np.uint8)
    assert psnr(a, a) == math.inf
    b = a + 1  # every pixel off by one: MSE 1 -> 10 log10(255^2) dB
    assert psnr(a, b) == pytest.approx(20 * math.log10(255), abs=1e-12)
    assert psnr(np.zeros((4, 4), np.uint8), np.full((4, 4), 255, np.uint8)) == pytest.approx(0.0, abs=1e-12)
    # floats in [0, 1] are the same image as uint8 * 255
    assert psnr(a / 255.0, b / 255.0) == pytest.approx(psnr(a, b))
    with pytest.raises(ValueError, match="shapes differ"):
        psnr(a, a[:4])


def test_ssim_known_answers():
    a = np.full((16, 16), 100, np.uint8)  # uint8 is 0..255; floats are read as 0..1
    b = np.full((16, 16), 110, np.uint8)
    c1 = (0.01 * 255) ** 2
    # Flat images: only the luminance term remains.
    assert ssim(a, b) == pytest.approx((2 * 100 * 110 + c1) / (100**2 + 110**2 + c1), rel=1e-12)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (32, 32, 3)).astype(np.uint8)
    assert ssim(x, x) == pytest.approx(1.0, abs=1e-12)
    assert ssim(x, 255 - x) < 0  # an inverted image anti-correlates


def test_noise_energy_ignores_edges_and_counts_speckle():
    img = np.full((8, 8, 1), 50, np.uint8)
    img[:, 4:] = 200  # a sharp edge: the 3x3 median keeps it
    assert noise_energy(img) == 0.0
    img[2, 1] = 90  # one speckle of +40 on the flat side: only that pixel differs from its median
    assert noise_energy(img) == pytest.approx(40.0**2 / 64)


def _scene(cx, colour=(220, 30, 30), size=64):
    img = np.zeros((size, size, 3), np.uint8)
    img[:] = (30, 60, 220)
    yy, xx = np.mgrid[:size, :size]
    img[(yy - size // 2) ** 2 + (xx - cx) ** 2 < 100] = colour
    return img


def test_guard_tells_noise_from_a_different_clean_picture():
    base = _scene(32)
    assert judge(base, base).verdict == IDENTICAL
    rng = np.random.default_rng(0)
    slight = np.clip(base.astype(int) + rng.integers(-2, 3, base.shape), 0, 255).astype(np.uint8)
    assert judge(slight, base).verdict == GOOD
    noisy = rng.integers(0, 256, base.shape).astype(np.uint8)  # what a mis-wired cache gives
    q = judge(noisy, base)
    assert q.psnr_db < 12 and q.hf_ratio > 2 and q.verdict == BROKEN and q.broken
    moved = _scene(12, colour=(240, 220, 40))  # a clean picture, composed differently
    q = judge(moved, base)
    assert q.psnr_db < 20 and q.verdict == DIFFERENT and not q.broken
    blurred = base.copy()
    blurred[:, 1:] = (base[:, 1:].astype(int) + base[:, :-1]) // 2
    assert judge(blurred, base).verdict in (LOSSY, GOOD)
