"""The embedded model's words: colours (with their palette), shapes, places, and the tokenizers' vocabulary. The scenes
are drawn and judged by the lab (lab/tiny/scenes.py)."""

from __future__ import annotations

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (215, 35, 35),
    "green": (35, 165, 60),
    "blue": (35, 70, 215),
    "yellow": (240, 215, 40),
    "white": (245, 245, 245),
    "black": (20, 20, 20),
    "purple": (135, 45, 170),
    "orange": (245, 140, 25),
}
SHAPES = ("circle", "square", "triangle")
# Centre of each place as a fraction of the image side (x, y).
PLACES: dict[str, tuple[float, float]] = {
    "on the left": (0.25, 0.5),
    "on the right": (0.75, 0.5),
    "at the top": (0.5, 0.25),
    "at the bottom": (0.5, 0.75),
    "in the center": (0.5, 0.5),
}
# Every word the grammar uses; the tokenizers are built from this list.
VOCAB = sorted(
    {"a", "an", "and", "background", ","} | set(COLOURS) | set(SHAPES) | {w for place in PLACES for w in place.split()}
)
