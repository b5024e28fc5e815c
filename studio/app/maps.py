"""The error map beside a picture, as picked: the x8 difference (drawn with every run) or FLIP's map (drawn only when
picked, outside any GPU call: FLIP takes ~2 s a megapixel on a CPU)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from studio.measure.quality import ERROR_SCALE, flip
from studio.report import fmt
from studio.report.images import error_picture, flip_picture

DIFFERENCE, FLIP = "×8 difference", "FLIP"
MAP_KINDS = (DIFFERENCE, FLIP)
GEN_MAP_WHERE, AB_MAP_WHERE = "Above", "Beside the slider"  # where each tab's map sits, for its caption
MAP_INFO = "FLIP: what a viewer would notice (NVIDIA FLIP); ×8 difference: every changed pixel, amplified"


@dataclass(frozen=True)
class Compared:
    """A picture and the one it is measured against, at their own size, with each map's worst tile (None: not known
    yet) and how the caption names them."""

    image: np.ndarray
    base: np.ndarray
    tile_yx: tuple | None
    flip_yx: tuple | None
    where: str  # where the map sits, as the UI lays it out ("Above", "Beside the slider")
    names: tuple[str, str] = ("image", "base")
    also: str = ""  # a sentence after the caption


def compared(image, base, tile_yx, flip_yx, where: str, names=("image", "base"), also: str = "") -> Compared | None:
    """The record a map is drawn from, or None without a base picture (compare `off`)."""
    if base is None or image is None:
        return None
    return Compared(image, base, tile_yx, tuple(flip_yx) if flip_yx is not None else None, where, names, also)


def show_map(kind: str, c: Compared | None, where: str, also: str = "") -> tuple[np.ndarray | None, str]:
    """The map of `kind` for the kept pair `c` and its caption (`where`/`also` serve when there is no pair yet)."""
    if kind not in MAP_KINDS:
        raise ValueError(f"map kind: {kind!r} is not one of {', '.join(MAP_KINDS)}")
    where, names, also = (c.where, c.names, c.also) if c is not None else (where, ("image", "base"), also)
    if kind == FLIP:
        caption = fmt.flip_map_note(where, *names)
        if c is None:
            return None, _joined(caption, also)
        yx = c.flip_yx
        if yx is None:  # not measured with the run (A/B's B against A): found from the map's own numbers
            f = flip(c.image, c.base)
            yx = f.worst_tile_yx if f.worst_tile > 0 else None  # identical: no tile to frame
        return flip_picture(c.image, c.base, yx), _joined(caption, also)
    caption = fmt.error_map_note(ERROR_SCALE, where, *names)
    return (error_picture(c.image, c.base, c.tile_yx) if c is not None else None), _joined(caption, also)


def _joined(caption: str, also: str) -> str:
    return f"{caption} {also}" if also else caption
