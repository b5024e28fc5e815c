"""Plots: speed-up vs PSNR for a set of runs, and per-step time with the residual diff against the threshold."""

from __future__ import annotations

import math

from studio.measure.quality import Verdict
from studio.measure.record import RunMetrics
from studio.report.table import MatrixRow


def plot_tradeoff(rows: list[MatrixRow], path_or_buf, title: str = "speed-up vs PSNR against base", fewer=None):
    """Speed-up (x) against PSNR (y), a labelled point per preset, broken ones red; `fewer` (FewerSteps) as a curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    finite = [r.psnr_db for r in rows if r.psnr_db is not None and math.isfinite(r.psnr_db)]
    top = (max(finite) if finite else 40.0) + 6
    placed: list[tuple[float, float, int]] = []  # (x, y, label row)
    xspan = max((r.speedup or 0) for r in rows) - min((r.speedup or 0) for r in rows) or 1.0
    for r in rows:
        x = r.speedup or 0
        y = top if r.psnr_db is None or math.isinf(r.psnr_db) else r.psnr_db
        colour = "#d62728" if r.quality == Verdict.BROKEN.value else "#1f77b4"
        ax.scatter([x], [y], s=60, color=colour, zorder=3)
        if r.speedup_lo is not None and r.speedup_hi is not None:  # the speed-up's interval (measure.estimate)
            ax.errorbar([x], [y], xerr=[[x - r.speedup_lo], [r.speedup_hi - x]], color=colour, capsize=3, lw=1)
        # Labels run right of their point: a point whose label would cross a nearby one's takes the next free row.
        used = {row for px, py, row in placed if abs(x - px) < 0.3 * xspan and abs(y - py) < 1.5}
        row = min(set(range(len(used) + 1)) - used)
        placed.append((x, y, row))
        ax.annotate(r.preset, (x, y), textcoords="offset points", xytext=(6, 4 - 11 * row), fontsize=8)
    _fewer_points(ax, fewer, top)
    ax.axhline(30, color="#2ca02c", lw=0.8, ls="--", label="30 dB (good)")
    ax.axhline(20, color="#ff7f0e", lw=0.8, ls="--", label="20 dB (lossy)")
    ax.axvline(1.0, color="#888", lw=0.8)
    ax.set_xlabel("speed-up vs base (denoise time)")
    _finish_psnr_plot(fig, ax, top, title, path_or_buf)


def _fewer_points(ax, fewer, top: float) -> None:
    """Base at the step counts measured (worst PSNR over the prompts), as a curve."""
    pts = sorted(fewer.points.values(), key=lambda p: p.speedup) if fewer else []
    if not pts:
        return
    ys = [top if math.isinf(p.worst_db) else p.worst_db for p in pts]
    ax.plot(
        [p.speedup for p in pts],
        ys,
        color="#9467bd",
        lw=1.2,
        ls=":",
        marker="s",
        ms=4,
        label=f"base at fewer steps (of {fewer.full})",
    )
    for p, y in zip(pts, ys, strict=True):
        ax.annotate(
            f"{p.steps} steps",
            (p.speedup, y),
            textcoords="offset points",
            xytext=(4, -10),
            fontsize=6,
            color="#9467bd",
        )


def _finish_psnr_plot(fig, ax, top: float, title: str, path_or_buf) -> None:
    import matplotlib.pyplot as plt

    ax.set_ylabel(f"PSNR vs base, dB (identical plotted at {top:.0f})")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path_or_buf, format="png")
    plt.close(fig)


def plot_steps(metrics, path_or_buf):
    """Per-step time and residual diff against the threshold, cached steps marked; `metrics`: RunMetrics or dict."""
    if isinstance(metrics, dict):
        metrics = RunMetrics.from_dict(metrics)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=110)
    steps = list(range(len(metrics.timing.step_ms)))
    cached = set(metrics.cache.cached_step_indices)
    colours = ["#ff7f0e" if i in cached else "#1f77b4" for i in steps]
    ax.bar(steps, metrics.timing.step_ms, color=colours)
    ax.set_xlabel("step (orange: served from cache)")
    ax.set_ylabel("step time, ms")
    if metrics.cache.residual_diffs:
        ax2 = ax.twinx()
        xs = sorted(metrics.cache.residual_diffs)
        ax2.plot(xs, [metrics.cache.residual_diffs[i] for i in xs], "k.-", lw=1, label="residual diff")
        if metrics.cache.cache_threshold is not None:
            ax2.axhline(metrics.cache.cache_threshold, color="#d62728", ls="--", lw=1, label="threshold")
        ax2.set_ylabel("residual diff")
        ax2.legend(fontsize=7, loc="upper right")
    ax.set_title(
        f"{metrics.preset}: {metrics.cache.cached_steps} cached / {metrics.cache.full_steps} full", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path_or_buf, format="png")
    plt.close(fig)


def plot_sweep(
    knob: str,
    values: list,
    speedups: list,
    worst_db: list,
    cliff_value,
    path_or_buf,
    *,
    floor_db=None,
    speed_label: str = "speed-up (median over prompts)",
):
    """Speed-up and worst PSNR over prompts against one knob's values; the cliff (steepest PSNR drop) marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = list(range(len(values)))
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
    top = max([min(v, 100.0) for v in worst_db if v is not None and math.isfinite(v)] or [40.0]) + 6
    ys = [None if v is None else (top if math.isinf(v) else v) for v in worst_db]
    ax.plot(xs, ys, "o-", color="#1f77b4", label="worst PSNR over prompts (dB)")
    ax.set_ylabel(f"worst PSNR vs base, dB (identical at {top:.0f})", color="#1f77b4")
    ax2 = ax.twinx()
    ax2.plot(xs, [s or 0 for s in speedups], "s--", color="#ff7f0e", label=speed_label)
    ax2.set_ylabel("speed-up vs base", color="#ff7f0e")
    if cliff_value is not None and cliff_value in values:
        i = values.index(cliff_value)
        ax.axvline(i, color="#d62728", lw=1.2, ls=":")
        ax.annotate(
            "cliff",
            (i, ys[i] if ys[i] is not None else 0),
            color="#d62728",
            xytext=(5, 8),
            textcoords="offset points",
            fontsize=9,
        )
    if floor_db is not None:
        ax.axhline(floor_db, color="#2ca02c", lw=0.8, ls="--", label=f"floor {floor_db:g} dB")
    ax.set_xticks(xs, [str(v) for v in values])
    ax.set_xlabel(knob)
    ax.grid(alpha=0.3)
    lines = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    labels = ax.get_legend_handles_labels()[1] + ax2.get_legend_handles_labels()[1]
    ax.legend(lines, labels, fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path_or_buf, format="png")
    plt.close(fig)


def plot_paired(paired: list, path_or_buf, *, title: str = "speed-up vs PSNR per request, against its own base"):
    """Paired speed-up (x) against PSNR (y), a point per request, filled where a win; withheld ones in the key."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=110)
    finite = [f.psnr_db for p in paired for f in p.prompts if f.psnr_db is not None and math.isfinite(f.psnr_db)]
    top = (max(finite) if finite else 40.0) + 6
    cmap = plt.get_cmap("tab10" if len(paired) <= 10 else "tab20")  # one colour per stack, never two alike
    for i, p in enumerate(paired):
        colour = cmap(i % cmap.N)
        shown = [f for f in p.prompts if f.speedup is not None]
        gone = len(p.prompts) - len(shown)
        label = f"{p.preset} ({p.wins}/{len(p.prompts)} wins" + (f", {gone} withheld)" if gone else ")")
        for j, f in enumerate(shown):
            y = top if f.psnr_db is None or math.isinf(f.psnr_db) else f.psnr_db
            ax.errorbar(
                [f.speedup],
                [y],
                xerr=[[f.speedup - f.speedup_lo], [f.speedup_hi - f.speedup]],
                fmt="o",
                color=colour,
                mfc=colour if f.win else "none",
                capsize=2,
                lw=0.8,
                label=label if j == 0 else None,
            )
        if not shown:
            ax.plot([], [], "o", color=colour, label=label)
    if paired:
        ax.axhline(paired[0].floor_db, color="#2ca02c", lw=0.8, ls="--", label=f"floor {paired[0].floor_db:g} dB")
    ax.axvline(1.0, color="#888", lw=0.8)
    ax.set_xlabel("paired speed-up vs the request's own base (filled: a win)")
    _finish_psnr_plot(fig, ax, top, title, path_or_buf)
