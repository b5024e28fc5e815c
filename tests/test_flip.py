"""FLIP against base (studio.measure.quality, the real flip-evaluator 1.7): pictures whose answers can be checked."""

from __future__ import annotations

import math

import numpy as np
import pytest

from studio.measure.quality import Flip, flip, flip_error, flip_map, flip_of_batch, highest_tile, judge, judge_batch
from tests.switched import stack

quick = pytest.mark.quick  # the one-minute loop: no model loaded (pytest -m quick)


def _noise(side=32, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (side, side, 3)).astype(np.uint8)


@quick
def test_flip_of_a_picture_against_itself_is_zero():
    img = _noise()
    f = flip(img, img)
    assert f == Flip(0.0, 0.0, (0, 0))
    assert float(flip_error(img, img).max()) == 0.0
    # the same picture as floats in [0, 1] is the same picture
    assert flip(img, img.astype(np.float64) / 255.0).mean == 0.0
    # the map of no difference is magma's first colour everywhere: (0, 0, 4) after rounding
    assert (flip_map(img, img) == np.array([0, 0, 4], np.uint8)).all()


@quick
def test_flip_grows_with_a_known_perturbation():
    """A flat grey shifted by d levels: every pixel errs alike (no edges), so the mean is every pixel's error and
    the worst tile's; it grows with d, and black against white is FLIP's near-maximum."""
    grey = np.full((16, 16, 3), 128, np.uint8)
    means = []
    for d in (1, 4, 16, 64):
        err = flip_error(grey + d, grey)
        assert float(err.max() - err.min()) == 0.0
        f = flip(grey + d, grey)
        assert f.mean == pytest.approx(float(err[0, 0]), abs=1e-12) and f.worst_tile == pytest.approx(f.mean)
        means.append(f.mean)
    assert means == sorted(means) and means[0] > 0
    # the values flip-evaluator 1.7 gives (docs/library-behaviour.md F5): concave, a 1-level shift already 0.030
    assert means == pytest.approx([0.02986, 0.07869, 0.20649, 0.53416], abs=1e-4)
    black, white = np.zeros((8, 8, 3), np.uint8), np.full((8, 8, 3), 255, np.uint8)
    assert flip(black, white).mean == pytest.approx(0.96739, abs=1e-4) == flip(white, black).mean


@quick
def test_the_worst_flip_tile_is_where_the_picture_changed():
    img = _noise()
    changed = img.copy()
    changed[16:24, 8:16] = 255 - changed[16:24, 8:16]  # one 8x8 tile inverted
    f = flip(changed, img)
    assert f.worst_tile_yx == (16, 8)
    assert f.worst_tile > 0.4 > 0.1 > f.mean > 0  # the damage is local: the mean dilutes it, the tile does not
    # tiles by hand: a map with one hot pixel
    err = np.zeros((20, 20))
    err[17, 3] = 0.64
    assert highest_tile(err) == (pytest.approx(0.64 / 32), (16, 0))  # the edge tile is 4 rows x 8 columns


@quick
def test_flip_refuses_what_it_would_misread():
    img = _noise(8)
    with pytest.raises(ValueError, match=r"shapes differ, \(8, 8, 3\) vs \(4, 8, 3\)"):
        flip(img, img[:4])
    rgba = np.dstack([img, np.full((8, 8, 1), 255, np.uint8)])
    with pytest.raises(ValueError, match=r"image has shape \(8, 8, 4\); give an HxW or HxWx3 picture"):
        flip(rgba, rgba)
    assert flip(img[..., 0], img[..., 0]).mean == 0.0  # grey is read as grey RGB


@quick
def test_judge_carries_flip_and_a_batch_takes_its_pictures():
    a, b = _noise(16, 1), _noise(16, 2)
    q = judge(a, a)
    assert (q.flip, q.flip_worst_tile, q.flip_worst_tile_yx) == (0.0, 0.0, (0, 0)) and math.isinf(q.psnr_db)
    changed = a.copy()
    changed[8:16, 0:8] = 255 - changed[8:16, 0:8]
    strip, base_strip = np.concatenate([a, changed]), np.concatenate([a, a])
    whole, each = judge_batch(strip, base_strip, 2)
    assert each[0].flip == 0.0 and each[1].flip == pytest.approx(flip(changed, a).mean)
    assert whole.flip == pytest.approx(each[1].flip / 2)  # the mean over all the batch's pixels
    assert whole.flip_worst_tile_yx == (16 + 8, 0)  # picture 2's worst tile, placed in the strip
    assert flip_of_batch([Flip(0.1, 0.3, (0, 8)), Flip(0.3, 0.2, (8, 0))], 16) == Flip(0.2, 0.3, (0, 8))
    assert judge(a, b, with_flip=False).flip is None


@quick
def test_flip_on_the_card_the_tables_and_its_picture():
    from studio.measure.record import RunQuality
    from studio.report import fmt
    from studio.report.card import metrics_card
    from studio.report.images import FLIP_FRAME_RGB, flip_picture
    from studio.report.table import AB_COLUMNS, Matrix, MatrixRow
    from tests.test_units import make_metrics

    m = make_metrics(flip=0.01234, flip_worst_tile=0.0851, flip_worst_tile_yx=[8, 16])
    assert (
        "<td>FLIP</td><td>0.0123 &nbsp; <small>(0: no visible difference; worst 8x8 tile 0.0851 at (y 8, x 16))"
        in (metrics_card(m))
    )
    assert "<td>FLIP</td>" not in metrics_card(make_metrics())  # not compared by FLIP: no row
    assert RunQuality.__dataclass_fields__["flip"].default is None and m.as_dict()["flip_worst_tile_yx"] == [8, 16]
    row = MatrixRow.from_metrics(m)
    assert dict(zip(AB_COLUMNS, row.ab_cells()))["FLIP"] == "0.0123"
    mat = Matrix(None, "m", [row], {}, 1)
    assert "FLIP" in mat.columns() and "worst FLIP" not in mat.columns()  # the worst over prompts: several only
    assert dict(zip(mat.columns(), row.cells(mat.optional())))["FLIP"] == "0.0123"
    assert fmt.flip_tile(0.0, [0, 0]) == "0.0000" and fmt.flip(None) == "n/a"
    img = _noise(16)
    changed = img.copy()
    changed[8:16, 8:16] = 0
    pic = flip_picture(changed, img, flip(changed, img).worst_tile_yx)
    assert pic.shape == (384, 384, 3)  # enlarged x24 like the pictures
    assert tuple(pic[8 * 24, 8 * 24 + 20]) == FLIP_FRAME_RGB  # the frame's top edge on tile (8, 8)
    assert flip_picture(img, None) is None


def test_flip_of_the_embedded_model_cache_against_base(tiny_runner):
    """On the embedded model: `cache` is off base by a measured FLIP, the card and JSON carry it; with the cache
    switched off the picture is bitwise base's, and FLIP says 0."""
    req = tiny_runner.request("a red circle in the center, blue background", seed=42)
    res = tiny_runner.generate(req, "cache")
    m = res.metrics
    assert m.cache.cached_steps > 0 and 0.0 < m.quality.flip < m.quality.flip_worst_tile < 1.0
    assert m.quality.flip == pytest.approx(flip(res.image, res.base_image).mean, abs=1e-12)
    assert m.as_dict()["flip"] == m.quality.flip and len(m.quality.flip_worst_tile_yx) == 2
    off = tiny_runner.generate(req, stack(tiny_runner, "cache", cache=False)).metrics
    assert math.isinf(off.quality.psnr_db) and (
        off.quality.flip,
        off.quality.flip_worst_tile,
        off.quality.flip_worst_tile_yx,
    ) == (0.0, 0.0, [0, 0])
