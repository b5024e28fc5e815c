"""Numbers and verdicts as people read them: one place for every format the card, tables and CLI print."""

from __future__ import annotations

import math

from studio.measure.quality import Verdict


def psnr(v: float | None, unit: str = " dB") -> str:
    if v is None:
        return "n/a"
    return "inf" if math.isinf(v) else f"{v:.2f}{unit}"


def ssim(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4f}"


def speedup(v: float | None, digits: int = 2) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}x"


def seconds(v: float | None, digits: int = 3) -> str:
    return "n/a" if v is None else f"{v:.{digits}f} s"


def ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f} ms"


def steps(cached: int, full: int) -> str:
    return f"{cached} cached / {full} full"


def tile(db: float | None, yx) -> str:
    """The worst tile's PSNR and where it is: "36.55 dB at (y 0, x 40)"; just "inf" for an identical picture."""
    if db is None or yx is None or math.isinf(db):
        return psnr(db)
    return f"{psnr(db)} at (y {yx[0]}, x {yx[1]})"


def error_map_label(scale: int, image: str = "image", base: str = "base") -> str:
    """What an error map shows, with its scale: the caption under the picture."""
    return f"error map |{image} − {base}| ×{scale} (white: off by {math.ceil(255 / scale)}+ of 255 levels)"


def verdict_level(v: Verdict | str) -> str:
    """ok | warn | broken: how loudly a verdict is shown."""
    v = Verdict(v)
    if v is Verdict.BROKEN:
        return "broken"
    return "ok" if v in (Verdict.IDENTICAL, Verdict.GOOD) else "warn"


def summary_line(m) -> str:
    """One line for a run (the CLI's text output)."""
    return (
        f"{m.preset} [{m.tag}] denoise {seconds(m.denoise_s)} ({m.mean_step_ms:.1f} ms/step), "
        f"{steps(m.cached_steps, m.full_steps)}, {speedup(m.speedup)} vs base, PSNR {psnr(m.psnr_db)}, "
        f"SSIM {ssim(m.ssim)} [{m.quality}]"
    )
