"""Benchmarks measured side by side in one process: the preset matrix and the threshold sweep.

Timings are medians over repeats taken round-robin (base, A, B, ..., base, A, B, ...), after one untimed
warm-up per preset, so machine noise hits every preset alike; speed-ups are ratios of those medians.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from dataclasses import asdict, dataclass, field, replace

from studio.config import GenerationRequest, Preset
from studio.runner import BASE, Runner, RunResult

# The shape people publish first (stack | denoise | per-step | vs base | PSNR | cached/full), then the rest.
COLUMNS = ("stack", "denoise", "per-step", "vs base", "PSNR", "cached/full", "SSIM", "quality", "preset", "notes")


@dataclass
class MatrixRow:
    preset: str
    tag: str
    denoise_s: float
    step_ms: float
    speedup: float | None
    psnr_db: float | None
    ssim: float | None
    cached_steps: int
    full_steps: int
    quality: str
    fallbacks: list[str] = field(default_factory=list)
    runs: list[float] = field(default_factory=list)  # every timed denoise, seconds

    def cells(self) -> list[str]:
        psnr = "n/a" if self.psnr_db is None else ("inf" if math.isinf(self.psnr_db) else f"{self.psnr_db:.2f} dB")
        return [
            self.tag,
            f"{self.denoise_s:.3f} s",
            f"{self.step_ms:.1f} ms",
            "n/a" if self.speedup is None else f"{self.speedup:.2f}x",
            psnr,
            f"{self.cached_steps}/{self.full_steps}",
            "n/a" if self.ssim is None else f"{self.ssim:.4f}",
            self.quality,
            self.preset,
            "; ".join(self.fallbacks),
        ]

    @classmethod
    def from_metrics(cls, m, runs: list[float] | None = None) -> "MatrixRow":
        """A row for one run (A/B compare, history): its own denoise time and speed-up against base."""
        return cls(
            preset=m.preset,
            tag=m.tag,
            denoise_s=m.denoise_s,
            step_ms=m.mean_step_ms,
            speedup=m.speedup,
            psnr_db=m.psnr_db,
            ssim=m.ssim,
            cached_steps=m.cached_steps,
            full_steps=m.full_steps,
            quality=m.quality,
            fallbacks=list(m.fallbacks),
            runs=list(runs or [m.denoise_s]),
        )

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Matrix:
    request: GenerationRequest
    model: str
    rows: list[MatrixRow]
    results: dict[str, RunResult]  # last run of each preset (images for the UI)
    repeats: int

    def markdown(self) -> str:
        lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        lines += ["| " + " | ".join(r.cells()) + " |" for r in self.rows]
        return "\n".join(lines)

    def csv(self) -> str:
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(COLUMNS)
        for r in self.rows:
            w.writerow(r.cells())
        return buf.getvalue()

    def json(self) -> str:
        return json.dumps(
            {
                "model": self.model,
                "request": self.request.as_dict(),
                "repeats": self.repeats,
                "rows": [r.as_dict() for r in self.rows],
            },
            indent=1,
        )


def run_matrix(
    runner: Runner,
    request: GenerationRequest,
    presets: list[str | Preset] | None = None,
    *,
    model: str | None = None,
    repeats: int = 1,
    warmup: bool = True,
    on_status=None,
) -> Matrix:
    """Run every preset (base always included, first) on one request; see the module doc for the method."""
    names = list(presets) if presets else runner.presets.names()
    resolved = [runner.resolve_preset(p) for p in names]
    if not any(p.name == BASE for p in resolved):
        resolved.insert(0, runner.resolve_preset(BASE))
    resolved.sort(key=lambda p: p.name != BASE)
    times: dict[str, list[float]] = {p.name: [] for p in resolved}
    last: dict[str, RunResult] = {}
    total = len(resolved) * (repeats + (1 if warmup else 0))
    done = 0
    for rnd in range(repeats + (1 if warmup else 0)):
        for p in resolved:
            if on_status:
                on_status(f"{p.name}: run {done + 1} of {total}" + (" (warm-up)" if warmup and rnd == 0 else ""))
            res = runner.generate(request, p, model=model)
            done += 1
            if warmup and rnd == 0:
                continue
            times[p.name].append(res.metrics.denoise_s)
            last[p.name] = res
    base_t = statistics.median(times[BASE])
    rows = []
    for p in resolved:
        m = last[p.name].metrics
        med = statistics.median(times[p.name])
        rows.append(
            MatrixRow(
                preset=p.name,
                tag=m.tag,
                denoise_s=med,
                step_ms=med / max(1, request.steps) * 1e3,
                speedup=base_t / med if med > 0 else None,
                psnr_db=m.psnr_db,
                ssim=m.ssim,
                cached_steps=m.cached_steps,
                full_steps=m.full_steps,
                quality=m.quality,
                fallbacks=m.fallbacks,
                runs=times[p.name],
            )
        )
    return Matrix(request, model or runner.model, rows, last, repeats)


def threshold_sweep(
    runner: Runner,
    request: GenerationRequest,
    preset: str = "cache",
    thresholds=(0.08, 0.12, 0.16, 0.24, 0.32, 0.5),
    *,
    model: str | None = None,
    repeats: int = 1,
) -> Matrix:
    """The cache preset at several residual-diff thresholds, side by side with base."""
    p = runner.resolve_preset(preset)
    p = p.with_cache_override(True)
    variants = [replace(p, name=f"{p.name}@R{t:g}", cache=replace(p.cache, threshold=t)) for t in thresholds]
    return run_matrix(runner, request, variants, model=model, repeats=repeats)


def plot_tradeoff(rows: list[MatrixRow], path_or_buf, title: str = "speed-up vs PSNR against base"):
    """One labelled point per preset: speed-up (x) against PSNR (y); broken stacks in red."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    finite = [r.psnr_db for r in rows if r.psnr_db is not None and math.isfinite(r.psnr_db)]
    top = (max(finite) if finite else 40.0) + 6
    placed: list[tuple[float, float]] = []
    xspan = max((r.speedup or 0) for r in rows) - min((r.speedup or 0) for r in rows) or 1.0
    for r in rows:
        x = r.speedup or 0
        y = top if r.psnr_db is None or math.isinf(r.psnr_db) else r.psnr_db
        colour = "#d62728" if r.quality.startswith("likely broken") else "#1f77b4"
        ax.scatter([x], [y], s=60, color=colour, zorder=3)
        # Points that (nearly) coincide get their labels stacked instead of printed over each other.
        near = sum(abs(x - px) < 0.04 * xspan and abs(y - py) < 1.5 for px, py in placed)
        placed.append((x, y))
        ax.annotate(r.preset, (x, y), textcoords="offset points", xytext=(6, 4 - 11 * near), fontsize=8)
    ax.axhline(30, color="#2ca02c", lw=0.8, ls="--", label="30 dB (good)")
    ax.axhline(20, color="#ff7f0e", lw=0.8, ls="--", label="20 dB (lossy)")
    ax.axvline(1.0, color="#888", lw=0.8)
    ax.set_xlabel("speed-up vs base (denoise time)")
    ax.set_ylabel(f"PSNR vs base, dB (identical plotted at {top:.0f})")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path_or_buf, format="png")
    plt.close(fig)


def plot_steps(metrics, path_or_buf):
    """Per-step time and the residual diff against the threshold, cached steps marked.

    `metrics` is a RunMetrics or its as_dict() (the UI keeps the dict)."""
    if isinstance(metrics, dict):
        from types import SimpleNamespace

        d = dict(metrics)
        d["residual_diffs"] = {int(k): v for k, v in (d.get("residual_diffs") or {}).items()}
        metrics = SimpleNamespace(**d)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=110)
    steps = list(range(len(metrics.step_ms)))
    cached = set(metrics.cached_step_indices)
    colours = ["#ff7f0e" if i in cached else "#1f77b4" for i in steps]
    ax.bar(steps, metrics.step_ms, color=colours)
    ax.set_xlabel("step (orange: served from cache)")
    ax.set_ylabel("step time, ms")
    if metrics.residual_diffs:
        ax2 = ax.twinx()
        xs = sorted(metrics.residual_diffs)
        ax2.plot(xs, [metrics.residual_diffs[i] for i in xs], "k.-", lw=1, label="residual diff")
        if metrics.cache_threshold is not None:
            ax2.axhline(metrics.cache_threshold, color="#d62728", ls="--", lw=1, label="threshold")
        ax2.set_ylabel("residual diff")
        ax2.legend(fontsize=7, loc="upper right")
    ax.set_title(f"{metrics.preset}: {metrics.cached_steps} cached / {metrics.full_steps} full", fontsize=10)
    fig.tight_layout()
    fig.savefig(path_or_buf, format="png")
    plt.close(fig)
