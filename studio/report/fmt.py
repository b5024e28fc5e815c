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


def speedup_pm(v: float | None, spread: float | None, digits: int = 2) -> str:
    """A speed-up with its spread, as `1.70x ±0.03` (the spread from the runs it came from); none is shown for a
    ratio that is exact by construction (base against itself: spread 0)."""
    if v is None or not spread:
        return speedup(v, digits)
    return f"{v:.{digits}f}x ±{spread:.{digits}f}"


def of_ideal(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def ideal_line(m) -> str:
    """What a cached run got of what its counts allow (`m` a RunMetrics with an ideal)."""
    got = "n/a" if m.of_ideal is None else of_ideal(m.of_ideal)
    head = f"{got} of the ideal {m.ideal_speedup:.2f}x"
    return (
        f"{head}: a cached step priced at {m.cached_share:.2f} of a full one ({m.ideal_source}), "
        f"measured against {m.of_ideal_against}"
    )


def seconds(v: float | None, digits: int = 3) -> str:
    return "n/a" if v is None else f"{v:.{digits}f} s"


def ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f} ms"


def steps(cached: int, full: int) -> str:
    return f"{cached} cached / {full} full"


def verdict_level(v: Verdict | str) -> str:
    """ok | warn | broken: how loudly a verdict is shown."""
    v = Verdict(v)
    if v is Verdict.BROKEN:
        return "broken"
    return "ok" if v in (Verdict.IDENTICAL, Verdict.GOOD) else "warn"


def summary_line(m) -> str:
    """One line for a run (the CLI's text output)."""
    vs = m.speedup_note or speedup_pm(m.speedup, m.speedup_spread) + " vs base"
    return (
        f"{m.preset} [{m.tag}] denoise {seconds(m.denoise_s)} ({m.mean_step_ms:.1f} ms/step), "
        f"{steps(m.cached_steps, m.full_steps)}, {vs}, PSNR {psnr(m.psnr_db)}, SSIM {ssim(m.ssim)} [{m.quality}]"
    )
