"""PSNR, SSIM and the quality guard on arrays whose answers can be worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from studio.measure.quality import Verdict, difference, error_map, judge, noise_energy, psnr, ssim, worst_tile

pytestmark = pytest.mark.quick  # the one-minute loop: no model is loaded here (pytest -m quick)

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


# ------------------------------------------------------------------------------------- where: map and worst tile
PEAK_DB = 20 * math.log10(255)  # 48.13 dB: the PSNR of an MSE of 1


def test_worst_tile_known_answers():
    a = np.zeros((16, 16, 3), np.uint8)
    assert worst_tile(a, a) == (math.inf, (0, 0))  # identical: no worst tile
    b = a.copy()
    b[8:16, 0:8] = 10  # the lower-left 8x8 tile off by 10 in every channel: its MSE is 100
    db, at = worst_tile(b, a)
    assert at == (8, 0) and db == pytest.approx(PEAK_DB - 20, abs=1e-12)  # 28.13 dB
    assert psnr(b, a) == pytest.approx(PEAK_DB - 10 * math.log10(25), abs=1e-12)  # 1 tile of 4: MSE 25, 34.15 dB
    q = judge(b, a)  # the verdict's record carries the same tile
    assert (q.worst_tile_psnr_db, q.worst_tile_yx) == (db, (8, 0)) and q.psnr_db == psnr(b, a)
    assert difference(b, a) == {
        "psnr_db": q.psnr_db,
        "worst_tile_psnr_db": db,
        "worst_tile_yx": [8, 0],
        "map_scale": 8,
    }
    c = a.copy()
    c[3, 13, 0] = 16  # one pixel, one channel, off by 16: tile (0, 8) has MSE 16^2 / (64 * 3) = 4/3
    assert worst_tile(c, a) == (pytest.approx(PEAK_DB - 10 * math.log10(4 / 3), abs=1e-12), (0, 8))  # 46.88 dB
    d = np.zeros((10, 10), np.uint8)  # 10 px: the edge tiles are 8x2, 2x8 and 2x2 pixels
    d[0, 0], d[9, 9] = 4, 2  # MSE 16/64 in tile (0, 0), 4/4 in the 2x2 corner tile (8, 8): the corner is worse
    assert worst_tile(d, np.zeros_like(d)) == (pytest.approx(PEAK_DB, abs=1e-12), (8, 8))
    e = np.zeros((16, 16), np.uint8)
    e[0, 9], e[9, 0] = 8, 8  # two tiles alike: the first in reading order, (0, 8), not (8, 0)
    assert worst_tile(e, np.zeros_like(e))[1] == (0, 8)
    with pytest.raises(ValueError, match="shapes differ"):
        worst_tile(a, a[:8])


def test_error_map_known_answers():
    a = np.full((4, 4, 3), 100, np.uint8)
    assert error_map(a, a).shape == (4, 4, 3) and not error_map(a, a).any()  # identical: all zero
    b = a.copy()
    b[1, 2] = (103, 100, 98)  # channel errors 3, 0, 2: the largest, 3, times 8
    b[3, 0, 1] = 140  # an error of 40 levels x 8 = 320: saturates at 255
    m = error_map(b, a)
    assert m[1, 2].tolist() == [24, 24, 24] and m[3, 0].tolist() == [255, 255, 255]
    assert int(m.sum()) == 3 * (24 + 255)  # nothing else lights up
    assert error_map(b, a, scale=1)[1, 2, 0] == 3 and error_map(a / 255.0, b / 255.0)[1, 2, 0] == 24  # floats: 0..1
    with pytest.raises(ValueError, match="scale"):
        error_map(a, b, scale=0)


def test_error_map_of_noise_lights_up_every_tile():
    base = _scene(32)
    noisy = np.random.default_rng(0).integers(0, 256, base.shape).astype(np.uint8)  # what a mis-wired cache gives
    tiles = error_map(noisy, base)[..., 0].reshape(8, 8, 8, 8).mean(axis=(1, 3))
    assert tiles.min() > 200  # x8: most pixels of every tile are off by 32 levels or more
    slight = np.clip(base.astype(int) + np.random.default_rng(1).integers(-2, 3, base.shape), 0, 255).astype(np.uint8)
    assert error_map(slight, base).max() == 16  # +-2 levels at most: 16 of 255, dark
