"""The error map the person picks (studio.app.maps): the x8 difference or FLIP's map, drawn from the kept pair."""

from __future__ import annotations

import numpy as np
import pytest

from studio.app.maps import AB_MAP_WHERE, DIFFERENCE, FLIP, GEN_MAP_WHERE, compared, show_map
from studio.measure.quality import flip, worst_tile
from studio.report import fmt
from studio.report.images import FLIP_FRAME_RGB, FRAME_RGB

quick = pytest.mark.quick


def _pair():
    """A 16x16 noise picture and a copy with its bottom-right 8x8 tile black: both maps' worst tile is (8, 8)."""
    base = np.random.default_rng(3).integers(0, 256, (16, 16, 3)).astype(np.uint8)
    image = base.copy()
    image[8:16, 8:16] = 0
    return image, base


@quick
def test_each_kind_of_map_is_drawn_from_the_kept_pair_with_its_own_frame_and_caption():
    image, base = _pair()
    tile_db, tile_yx = worst_tile(image, base)
    f = flip(image, base)
    assert tuple(tile_yx) == (8, 8) and tuple(f.worst_tile_yx) == (8, 8)
    kept = compared(image, base, tuple(tile_yx), f.worst_tile_yx, GEN_MAP_WHERE)
    diff, diff_note = show_map(DIFFERENCE, kept, GEN_MAP_WHERE)
    flipped, flip_note = show_map(FLIP, kept, GEN_MAP_WHERE)
    assert diff.shape == flipped.shape == (384, 384, 3)  # enlarged x24, like the pictures
    at = (8 * 24, 8 * 24 + 20)  # on the top edge of tile (8, 8)'s frame
    assert tuple(diff[at]) == FRAME_RGB and tuple(flipped[at]) == FLIP_FRAME_RGB
    # inside the black tile: the x8 map saturates (white); FLIP's shows a visible difference (not magma's black)
    assert tuple(diff[12 * 24, 12 * 24]) == (255, 255, 255) and flipped[12 * 24, 12 * 24].sum() > 3 * 100
    # far from it, near black (FLIP's filters carry a little of the tile's error a few pixels out)
    assert flipped[0, 0].sum() < flipped[12 * 24, 12 * 24].sum() / 10
    assert diff_note == fmt.error_map_note(8, "Above") and flip_note == fmt.flip_map_note("Above")


@quick
def test_the_ab_map_finds_flips_worst_tile_itself_and_names_b_against_a():
    image, base = _pair()
    kept = compared(image, base, (8, 8), None, AB_MAP_WHERE, ("B", "A"), fmt.AB_TILE_NOTE)
    pic, note = show_map(FLIP, kept, AB_MAP_WHERE, fmt.AB_TILE_NOTE)
    assert tuple(pic[8 * 24, 8 * 24 + 20]) == FLIP_FRAME_RGB  # FLIP's worst tile, measured when drawn
    assert note.startswith("Beside the slider: FLIP's error map of B against A") and note.endswith(fmt.AB_TILE_NOTE)
    same = compared(base, base, None, None, AB_MAP_WHERE, ("B", "A"))
    pic, _ = show_map(FLIP, same, AB_MAP_WHERE)
    assert (pic == np.array([0, 0, 4], np.uint8)).all()  # identical: no difference anywhere, and no frame


@quick
def test_without_a_base_there_is_no_map_and_a_wrong_kind_is_named():
    image, _ = _pair()
    assert compared(image, None, None, None, GEN_MAP_WHERE) is None  # compare `off`
    for kind in (DIFFERENCE, FLIP):
        pic, note = show_map(kind, None, GEN_MAP_WHERE)
        assert pic is None and note.startswith("Above: ")
    with pytest.raises(ValueError, match="'flip' is not one of ×8 difference, FLIP"):
        show_map("flip", None, GEN_MAP_WHERE)
