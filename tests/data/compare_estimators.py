"""The table in docs/measuring.md: candidate speed-up estimators compared on the recorded runs.

    python tests/data/compare_estimators.py

For each estimator and stack (cache, cache-int8-sage), over tests/data/step_timings.json: the median difference
between the points of two disjoint random sets of k quiet pairs (200 splits, seed 0), and between k busy pairs and
the estimator's own 10-pair quiet point. numpy only.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

DATA = json.loads((Path(__file__).parent / "step_timings.json").read_text())


def runs(cond: str, stack: str) -> tuple[np.ndarray, np.ndarray]:
    """(repeats x steps) milliseconds and the cached mask of one recorded stack."""
    rs = DATA["conditions"][cond][stack]
    cached = np.zeros(len(rs[0]["step_ms"]), bool)
    cached[rs[0]["cached"]] = True
    return np.array([r["step_ms"] for r in rs]), cached


def kind_floor(t, cached):
    return sum(k.sum() * t[:, k].min() for k in (cached, ~cached) if k.any())


def kind_median(t, cached):
    return sum(k.sum() * np.median(t[:, k]) for k in (cached, ~cached) if k.any())


def step_minima(t, cached):
    return t.min(axis=0).sum()


ESTIMATORS = {
    "whole-run medians": None,
    "each kind's median step x its count": kind_median,
    "per-step minima over the repeats, summed": step_minima,
    "each kind's fastest step x its count (the floor)": kind_floor,
}


def ratio(price, base, stack, idx) -> float:
    (tb, cb), (ts, cs) = base, stack
    if price is None:
        return np.median(tb[idx].sum(1)) / np.median(ts[idx].sum(1))
    return price(tb[idx], cb) / price(ts[idx], cs)


def main() -> None:
    print("| estimator | quiet, 3 vs 3 pairs | quiet, 5 vs 5 | busy (5 pairs) vs quiet |")
    print("|---|---|---|---|")
    for name, price in ESTIMATORS.items():
        cells = {k: [] for k in ("q3", "q5", "b5")}
        for stack in ("cache", "cache-int8-sage"):
            quiet = (runs("quiet", "base"), runs("quiet", stack))
            busy = (runs("busy", "base"), runs("busy", stack))
            ref = ratio(price, *quiet, list(range(10)))
            rng = np.random.default_rng(0)
            for k in (3, 5):
                diffs, off = [], []
                for _ in range(200):
                    p = rng.permutation(10)
                    a, b = sorted(p[:k]), sorted(p[k : 2 * k])
                    diffs.append(abs(ratio(price, *quiet, a) / ratio(price, *quiet, b) - 1) * 100)
                    off.append(abs(ratio(price, *busy, sorted(rng.permutation(10)[:k])) / ref - 1) * 100)
                cells[f"q{k}"].append(np.median(diffs))
                if k == 5:
                    cells["b5"].append(np.median(off))
        row = " | ".join(" / ".join(f"{v:.1f}%" for v in cells[c]) for c in ("q3", "q5", "b5"))
        print(f"| {name} | {row} |")


def interval_shapes(point: float, draws: np.ndarray) -> dict[str, tuple[float, float]]:
    """Three ways to read the bootstrap's draws of the floor ratio as a 95% interval."""
    qlo, qmed, qhi = np.percentile(draws, [2.5, 50, 97.5])
    return {
        "percentile, widened to hold the point (the studio's)": (min(qlo, point), max(qhi, point)),
        "basic (2 x point - the draws' quantiles)": (2 * point - qhi, 2 * point - qlo),
        "percentile moved so its median is the point": (qlo * point / qmed, qhi * point / qmed),
    }


def intervals() -> None:
    """How often each interval shape holds the 10-pair quiet point, over every window of k consecutive pairs."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from studio.measure import estimate as E

    def as_runs(cond, stack):
        return [E.Run.of(r["step_ms"], r["cached"]) for r in DATA["conditions"][cond][stack]]

    cases = (("quiet", 2), ("quiet", 3), ("quiet", 5), ("busy", 3), ("busy", 5))
    print("| interval | " + " | ".join(f"{c}, {k} pairs" for c, k in cases) + " | median half-width (quiet, 3) |")
    print("|---|" + "---|" * (len(cases) + 1))
    rows: dict[str, list[str]] = {}
    widths: dict[str, list[float]] = {}
    for stack in ("cache", "cache-int8-sage"):
        truth = E.speedup(as_runs("quiet", "base"), as_runs("quiet", stack)).point
        for cond, k in cases:
            b, s = as_runs(cond, "base"), as_runs(cond, stack)
            held: dict[str, int] = {}
            windows = [list(range(i, i + k)) for i in range(len(b) - k + 1)]
            for w in windows:
                point, draws = E._group(
                    [b[i] for i in w], [s[i] for i in w], None, None, np.random.default_rng(0), 400
                )
                for name, (lo, hi) in interval_shapes(point, draws).items():
                    held[name] = held.get(name, 0) + (lo <= truth <= hi)
                    if (cond, k) == ("quiet", 3):
                        widths.setdefault(name, []).append((hi - lo) / 2 / point * 100)
            for name, n in held.items():
                rows.setdefault(name, []).append(f"{n}/{len(windows)}")
    for name, cells in rows.items():
        half = len(cells) // 2  # the first half is cache's, the second cache-int8-sage's
        joined = " | ".join(f"{a} / {b}" for a, b in zip(cells[:half], cells[half:], strict=True))
        print(f"| {name} | {joined} | ±{np.median(widths[name]):.1f}% |")


if __name__ == "__main__":
    main()
    print()
    intervals()
