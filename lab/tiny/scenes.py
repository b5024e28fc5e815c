"""The tiny model's world: a prompt grammar, a scene renderer, and a pixel-level judge.

Prompts follow `a <colour> <shape> <where>[ and a <colour> <shape> <where>], <colour> background`.
The same module draws training images (PIL, on the fly) and judges generated ones, so what the model is
trained on and what the evaluation checks can never drift apart.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from studio.tiny.grammar import COLOURS, PLACES, SHAPES, VOCAB  # noqa: F401  (the lab reads them from here)

SINGLE_RADIUS = 0.19  # object half-size as a fraction of the side
PAIR_RADIUS = 0.11
# Styles a scene can be drawn in (the example LoRAs' training targets, lab.tiny.lora). "outline": every object
# ringed in the palette's black, OUTLINE_WIDTH of the side wide, drawn outside the object (its fill keeps its size).
# Thin lines do not survive the embedded model's VAE (stripes of 8 px came back as one flat colour, 14.6 dB); a
# 3 px ring comes back as a dark halo.
STYLES = ("outline",)
OUTLINE_WIDTH = 0.047
OUTLINE_COLOUR = "black"


@dataclass(frozen=True)
class Obj:
    colour: str
    shape: str
    place: str

    def phrase(self) -> str:
        article = "an" if self.colour[0] in "aeiou" else "a"
        return f"{article} {self.colour} {self.shape} {self.place}"


@dataclass(frozen=True)
class Scene:
    objects: tuple[Obj, ...]
    background: str

    @property
    def prompt(self) -> str:
        return " and ".join(o.phrase() for o in self.objects) + f", {self.background} background"

    @property
    def key(self) -> str:
        return self.prompt


_OBJ = r"an? (\w+) (\w+) (on the left|on the right|at the top|at the bottom|in the center)"
_PROMPT = re.compile(rf"^\s*{_OBJ}(?: and {_OBJ})?\s*,\s*(\w+) background\s*$", re.IGNORECASE)


def parse_prompt(prompt: str) -> Scene:
    """Parse a prompt of the grammar into a Scene; raises ValueError naming what is wrong."""
    m = _PROMPT.match(prompt.strip().rstrip("."))
    if not m:
        raise ValueError(
            f"prompt {prompt!r} does not follow 'a <colour> <shape> <where>[ and a <colour> <shape> <where>], "
            f"<colour> background'"
        )
    g = [x.lower() if x else x for x in m.groups()]
    objs = [Obj(g[0], g[1], g[2])]
    if g[3]:
        objs.append(Obj(g[3], g[4], g[5]))
    for o in objs:
        if o.colour not in COLOURS:
            raise ValueError(f"colour {o.colour!r} is not one of {sorted(COLOURS)}")
        if o.shape not in SHAPES:
            raise ValueError(f"shape {o.shape!r} is not one of {list(SHAPES)}")
    if g[6] not in COLOURS:
        raise ValueError(f"background colour {g[6]!r} is not one of {sorted(COLOURS)}")
    return Scene(tuple(objs), g[6])


def _held_out(key: str, fraction: float) -> bool:
    h = int(hashlib.sha1(key.encode()).hexdigest()[:8], 16)
    return (h % 1000) < fraction * 1000


def all_single_scenes() -> list[Scene]:
    return [Scene((Obj(c, s, p),), bg) for c in COLOURS for s in SHAPES for p in PLACES for bg in COLOURS if bg != c]


HELD_OUT_FRACTION = 0.1


def is_held_out(scene: Scene) -> bool:
    """A fixed ~10% of exact combinations never appear in training (decided by a hash of the prompt)."""
    return _held_out(scene.key, HELD_OUT_FRACTION)


def sample_scene(rng: random.Random, two_objects: bool, held_out: bool = False) -> Scene:
    """Draw a random scene, from the training split (default) or from the held-out split."""
    cols = list(COLOURS)
    while True:
        bg = rng.choice(cols)
        n = 2 if two_objects else 1
        places = rng.sample(list(PLACES), n)
        objs = []
        for p in places:
            objs.append(Obj(rng.choice([c for c in cols if c != bg]), rng.choice(SHAPES), p))
        scene = Scene(tuple(objs), bg)
        if is_held_out(scene) == held_out:
            return scene


def _draw_object(draw: ImageDraw.ImageDraw, shape: str, box: tuple, fill, grow: float = 0.0):
    """One object at `box` (cx, cy, rx, ry: its centre and half-sizes), every edge moved `grow` pixels outwards (an
    outline's ring)."""
    cx, cy, rx, ry = box
    if shape == "circle":
        rx, ry = rx + grow, ry + grow
        draw.ellipse([cx - rx, cy - ry, cx + rx, cy + ry], fill=fill)
    elif shape == "square":
        sx, sy = rx * 0.9 + grow, ry * 0.9 + grow
        draw.rectangle([cx - sx, cy - sy, cx + sx, cy + sy], fill=fill)
    else:
        pts = np.array([(cx, cy - ry), (cx + rx, cy + ry * 0.8), (cx - rx, cy + ry * 0.8)])
        if grow:  # about the incentre: each edge moves out by `grow`
            side = np.linalg.norm(np.roll(pts, -1, axis=0) - np.roll(pts, 1, axis=0), axis=1)  # opposite each corner
            centre = (side[:, None] * pts).sum(0) / side.sum()
            inradius = 1.8 * rx * ry / (side.sum() / 2)  # area / semi-perimeter (area: base 2rx, height 1.8ry, halved)
            pts = centre + (pts - centre) * (inradius + grow) / inradius
        draw.polygon([tuple(p) for p in pts], fill=fill)


def _render_flat(scene: Scene, size: int, rng: random.Random | None, supersample: int, style: str | None):
    """The committed model's scenes: flat colours, `rng` a small jitter of position (±3%) and size (±10%)."""
    big = size * supersample
    img = Image.new("RGB", (big, big), COLOURS[scene.background])
    draw = ImageDraw.Draw(img)
    radius = SINGLE_RADIUS if len(scene.objects) == 1 else PAIR_RADIUS
    for o in scene.objects:
        cx, cy = PLACES[o.place]
        r = radius
        if rng is not None:
            cx += rng.uniform(-0.03, 0.03)
            cy += rng.uniform(-0.03, 0.03)
            r *= rng.uniform(0.9, 1.1)
        cx, cy, r = cx * big, cy * big, r * big
        if style == "outline":
            _draw_object(draw, o.shape, (cx, cy, r, r), COLOURS[OUTLINE_COLOUR], grow=OUTLINE_WIDTH * big)
        _draw_object(draw, o.shape, (cx, cy, r, r), COLOURS[o.colour])
    return img.resize((size, size), Image.Resampling.LANCZOS)


# What a prompt leaves open (drawn at random for training, so the model's picture is not fixed by its prompt and its
# flow curves as a real model's does: fewer steps change the picture). Each bound keeps the judge's reading of the
# prompt (colour, shape, place). Texture alone cannot make a model need its steps: a smooth random field is a
# Gaussian part of the picture, which Euler at half the steps only shrinks by a few per cent of its amplitude (the
# first varied model: 40.7 dB at half the steps, docs/tiny-model.md). What does: SPECKS, small discs of any palette
# colour at random spots the prompt does not name, which the flow decides on midway, as a real model decides on the
# details a caption leaves out. They keep off the judge's windows around the named places and off the corners.
JITTER = {1: 0.04, 2: 0.03}  # the centre's move, a fraction of the side, by object count
SIZE = (0.9, 1.1)  # the half-size's factor
SHADE = 0.08  # an object's brightness ramps by up to this share across it, in a random direction
BACKDROP = 0.1  # the background's brightness ramps by up to this share across the picture
GRAIN = 10.0  # the background's grain: levels (0-255) of a smooth random field, GRAIN_CELLS across
GRAIN_CELLS = 8
SPECKS = (1, 4)  # how many specks, at least and at most
SPECK_RADIUS = (0.03, 0.05)  # a speck's radius, a fraction of the side
SPECK_MARGIN = 0.14  # a speck's centre stays this far inside every edge (the judge reads the corners)
SPECK_GAP = 0.04  # and its edge this far outside the judge's window (its anti-aliased rim reads as object colour)


def _ramp(size: int, rng: random.Random, amount: float) -> np.ndarray:
    """[size, size] brightness factors: 1 +- `amount` along a random direction."""
    a = rng.uniform(0, 2 * np.pi)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / (size - 1) - 0.5
    return 1.0 + rng.uniform(-amount, amount) * 2 * (xx * np.cos(a) + yy * np.sin(a))


def _grain(size: int, rng: random.Random) -> np.ndarray:
    """[size, size] levels: a smooth random field (GRAIN_CELLS cells across, bicubic), standard deviation ~GRAIN."""
    cells = np.asarray([rng.gauss(0.0, 1.0) for _ in range(GRAIN_CELLS * GRAIN_CELLS)], np.float32)
    field = Image.fromarray(cells.reshape(GRAIN_CELLS, GRAIN_CELLS), mode="F").resize(
        (size, size), Image.Resampling.BICUBIC
    )
    return np.asarray(field, np.float32) * GRAIN


def _mask(shape: str, box: tuple, big: int, size: int, grow: float = 0.0):
    """[size, size] coverage in [0, 1] of one object at `box` (_draw_object's, at `big`), area-averaged down."""
    img = Image.new("L", (big, big), 0)
    _draw_object(ImageDraw.Draw(img), shape, box, 255, grow)
    return np.asarray(img.resize((size, size), Image.Resampling.BOX), np.float32) / 255.0


def render(
    scene: Scene,
    size: int = 64,
    rng: random.Random | None = None,
    supersample: int = 4,
    style: str | None = None,
    varied: bool = False,
) -> Image.Image:
    """Draw a scene; `rng` jitters it (training), None draws it exactly; `style`: one of STYLES, or None (the embedded
    model's own training pictures). `varied`: `rng` draws what the prompt leaves open (place within its region, size,
    shading, the background's ramp and grain, specks: JITTER .. SPECK_GAP; `python -m lab train --varied`); else the
    committed model's flat scenes (a small jitter of place and size)."""
    if style is not None and style not in STYLES:
        raise ValueError(f"style {style!r} is not one of {list(STYLES)}")
    if not varied:
        return _render_flat(scene, size, rng, supersample, style)
    big = size * supersample
    img = np.empty((size, size, 3), np.float32)
    img[:] = COLOURS[scene.background]
    if rng is not None:
        img *= _ramp(size, rng, BACKDROP)[..., None]
        img += _grain(size, rng)[..., None]
        img = _specks(img, scene, rng, big)
    radius = SINGLE_RADIUS if len(scene.objects) == 1 else PAIR_RADIUS
    for o in scene.objects:
        cx, cy = PLACES[o.place]
        r = radius
        colour = np.empty((size, size, 3), np.float32)
        colour[:] = COLOURS[o.colour]
        if rng is not None:
            j = JITTER[len(scene.objects)]
            cx, cy, r = cx + rng.uniform(-j, j), cy + rng.uniform(-j, j), radius * rng.uniform(*SIZE)
            colour *= _ramp(size, rng, SHADE)[..., None]
        args = (o.shape, (cx * big, cy * big, r * big, r * big), big, size)
        if style == "outline":
            ring = _mask(*args, grow=OUTLINE_WIDTH * big)[..., None]
            img = img * (1 - ring) + np.asarray(COLOURS[OUTLINE_COLOUR], np.float32) * ring
        cover = _mask(*args)[..., None]
        img = img * (1 - cover) + colour * cover
    return Image.fromarray(np.clip(np.rint(img), 0, 255).astype(np.uint8))


def _specks(img: np.ndarray, scene: Scene, rng: random.Random, big: int) -> np.ndarray:
    """SPECKS discs of random palette colours (never the background's) at random spots off the judge's windows."""
    size = img.shape[0]
    radius = SINGLE_RADIUS if len(scene.objects) == 1 else PAIR_RADIUS
    keep_off = [(PLACES[o.place], radius * 1.6) for o in scene.objects]  # judge_object's windows
    for _ in range(rng.randint(*SPECKS)):
        r = rng.uniform(*SPECK_RADIUS)
        for _try in range(50):
            x, y = rng.uniform(SPECK_MARGIN, 1 - SPECK_MARGIN), rng.uniform(SPECK_MARGIN, 1 - SPECK_MARGIN)
            if all(max(abs(x - px), abs(y - py)) > win + r + SPECK_GAP for (px, py), win in keep_off):
                break
        else:
            continue  # no free spot (a crowded scene): one speck fewer
        colour = COLOURS[rng.choice([c for c in COLOURS if c != scene.background])]
        cover = _mask("circle", (x * big, y * big, r * big, r * big), big, size)[..., None]
        img = img * (1 - cover) + np.asarray(colour, np.float32) * cover
    return img


# ----------------------------------------------------------------------------------------------------------------
# Judging generated pixels


def nearest_colour(rgb: np.ndarray) -> str:
    names = list(COLOURS)
    pal = np.array([COLOURS[n] for n in names], dtype=np.float32)
    d = ((pal - rgb.astype(np.float32)[None]) ** 2).sum(-1)
    return names[int(d.argmin())]


def _label_map(arr: np.ndarray) -> np.ndarray:
    names = list(COLOURS)
    pal = np.array([COLOURS[n] for n in names], dtype=np.float32)
    d = ((arr.astype(np.float32)[:, :, None, :] - pal[None, None]) ** 2).sum(-1)
    return d.argmin(-1)


@dataclass
class ObjectJudgement:
    colour: str | None
    shape: str | None
    fill_ratio: float


def judge_background(arr: np.ndarray) -> str:
    """Background colour from a 3-pixel border (objects never reach the corners)."""
    h, w, _ = arr.shape
    k = max(2, h // 20)
    corners = np.concatenate(
        [
            arr[:k, :k].reshape(-1, 3),
            arr[:k, -k:].reshape(-1, 3),
            arr[-k:, :k].reshape(-1, 3),
            arr[-k:, -k:].reshape(-1, 3),
        ]
    )
    return nearest_colour(np.median(corners, axis=0))


def judge_object(arr: np.ndarray, place: str, background: str, n_objects: int) -> ObjectJudgement:
    """Colour and shape of whatever is drawn at `place`, judged only from the pixels.

    Colour: the most common non-background palette colour near the expected centre. Shape: how much of its
    bounding box the object fills (drawn: square 0.90-1.0, circle 0.72-0.81, triangle 0.49-0.55).
    """
    h, w, _ = arr.shape
    cx, cy = PLACES[place]
    radius = SINGLE_RADIUS if n_objects == 1 else PAIR_RADIUS
    win = radius * 1.6
    x0, x1 = int(max(0, (cx - win) * w)), int(min(w, (cx + win) * w))
    y0, y1 = int(max(0, (cy - win) * h)), int(min(h, (cy + win) * h))
    labels = _label_map(arr[y0:y1, x0:x1])
    names = list(COLOURS)
    bg_idx = names.index(background)
    # The core: the central half of the expected extent decides the colour.
    core = labels[
        int((cy - radius * 0.5) * h) - y0 : int((cy + radius * 0.5) * h) - y0,
        int((cx - radius * 0.5) * w) - x0 : int((cx + radius * 0.5) * w) - x0,
    ].ravel()
    core = core[core != bg_idx]
    if core.size < 4:
        return ObjectJudgement(None, None, 0.0)
    colour_idx = int(np.bincount(core, minlength=len(names)).argmax())
    # Shape from soft coverage: each pixel's position on the line from the background colour to the object
    # colour (anti-aliased edges count by fraction); the bounding box from pixels at least half covered.
    win_px = arr[y0:y1, x0:x1].astype(np.float32)
    obj_c = np.array(COLOURS[names[colour_idx]], np.float32)
    bg_c = np.array(COLOURS[background], np.float32)
    axis = obj_c - bg_c
    t = np.clip(((win_px - bg_c) @ axis) / float(axis @ axis), 0.0, 1.0)
    off_line = np.linalg.norm(win_px - bg_c - t[..., None] * axis, axis=-1)
    t = np.where(off_line < 80.0, t, 0.0)  # pixels of some third colour are not this object
    ys, xs = np.nonzero(t >= 0.5)
    if ys.size == 0:
        return ObjectJudgement(names[colour_idx], None, 0.0)
    y_lo, y_hi, x_lo, x_hi = ys.min(), ys.max(), xs.min(), xs.max()
    bbox_area = (y_hi - y_lo + 1) * (x_hi - x_lo + 1)
    fill = float(t[y_lo : y_hi + 1, x_lo : x_hi + 1].sum() / bbox_area)
    if fill > 0.86:
        shape = "square"
    elif fill > 0.635:
        shape = "circle"
    else:
        shape = "triangle"
    return ObjectJudgement(names[colour_idx], shape, fill)


def outline_ring(scene: Scene, size: int = 64) -> np.ndarray:
    """[size, size] bool: where the "outline" style draws its ring around the scene's objects (drawn exactly)."""
    plain = np.asarray(render(scene, size), np.float32)
    ringed = np.asarray(render(scene, size, style="outline"), np.float32)
    return np.abs(ringed - plain).max(-1) > 64.0


def ring_luminance(arr: np.ndarray, scene: Scene) -> float:
    """Mean luminance (0-255) of a picture over the "outline" style's ring around `scene`'s objects: the style's
    mark, read from the pixels (drawn outlined: the palette's black, 20; drawn plain: the background or the object)."""
    ring = outline_ring(scene, arr.shape[0])
    lum = arr.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)
    return float(lum[ring].mean())
