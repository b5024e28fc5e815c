"""Pictures as shown: small native sizes enlarged, and the error maps (the x8 difference, FLIP's) with their worst
tile framed."""

from __future__ import annotations

import math

import numpy as np

from studio.measure.quality import ERROR_SCALE, TILE, error_map, flip_map

FRAME_RGB = (230, 40, 40)  # the worst tile's frame: red on a grey map
FLIP_FRAME_RGB = (40, 220, 230)  # cyan on FLIP's magma, which runs through red and orange


def enlarge(img: np.ndarray | None, min_side: int = 384) -> np.ndarray | None:
    """Small native sizes shown enlarged (nearest neighbour: pixels stay honest)."""
    if img is None:
        return None
    h, w = img.shape[:2]
    k = max(1, math.ceil(min_side / max(h, w)))
    return img if k == 1 else np.kron(img, np.ones((k, k, 1), dtype=img.dtype))


def _framed(small: np.ndarray, worst_yx, rgb) -> np.ndarray:
    """`small` enlarged, framed in `rgb` on the TILE x TILE tile whose top-left pixel is `worst_yx` (None: none)."""
    big = enlarge(small)
    if worst_yx is None:
        return big
    k = big.shape[0] // small.shape[0]
    y0, x0 = worst_yx[0] * k, worst_yx[1] * k
    y1, x1 = min(y0 + TILE * k, big.shape[0]), min(x0 + TILE * k, big.shape[1])
    t = max(1, k // 3)  # the frame lies inside the tile, so the tile's own pixels around it stay visible
    for sl in ((slice(y0, y0 + t), slice(x0, x1)), (slice(y1 - t, y1), slice(x0, x1))):
        big[sl] = rgb
    for sl in ((slice(y0, y1), slice(x0, x0 + t)), (slice(y0, y1), slice(x1 - t, x1))):
        big[sl] = rgb
    return big


def error_picture(image: np.ndarray, base: np.ndarray | None, worst_yx=None, *, scale: int = ERROR_SCALE):
    """The error map of `image` against `base` (x `scale`), enlarged, worst tile framed red; None without a base."""
    if base is None:
        return None
    return _framed(error_map(image, base, scale), worst_yx, FRAME_RGB)


def flip_picture(image: np.ndarray, base: np.ndarray | None, worst_yx=None):
    """FLIP's error map of `image` against `base`, enlarged, worst FLIP tile framed cyan; None without a base."""
    if base is None:
        return None

    return _framed(flip_map(image, base), worst_yx, FLIP_FRAME_RGB)


THUMB_SIDE = 128
THUMB_QUALITY = 90  # JPEG: a 128-pixel thumbnail in 2-6 kB, where its pixels take 48 kB


def thumbnail_jpeg(img: np.ndarray, side: int = THUMB_SIDE) -> bytes:
    """A history thumbnail (`thumbnail`) as JPEG bytes: what a session keeps per picture."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(thumbnail(img, side)).save(buf, format="JPEG", quality=THUMB_QUALITY)
    return buf.getvalue()


def from_jpeg(data: bytes):
    """A kept thumbnail back as a picture (PIL), for the gallery."""
    import io

    from PIL import Image

    return Image.open(io.BytesIO(data))


def thumbnail(img: np.ndarray, side: int = THUMB_SIDE) -> np.ndarray:
    """A history thumbnail, its longer side `side` pixels (enlarged by whole pixels, or reduced with a box filter)."""
    from PIL import Image

    h, w = img.shape[:2]
    if max(h, w) <= side:
        return enlarge(img, side)
    k = side / max(h, w)
    size = (max(1, round(w * k)), max(1, round(h * k)))
    return np.asarray(Image.fromarray(img).resize(size, Image.Resampling.BOX))
