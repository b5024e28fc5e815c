"""The tables in docs/measuring.md: candidate speed-up estimators, then interval shapes, on the recorded runs.

    python tests/data/compare_estimators.py              (both tables)
    python tests/data/compare_estimators.py --intervals  (the interval shapes and their coverage only)
    python tests/data/compare_estimators.py --separate   (the coverage out of sample only)

The interval table: how often each shape's interval over a window of k consecutive pairs holds the 10-pair quiet
point, and the coverage over the windows of 3 and 5 pairs that studio.measure.estimate.COVERAGE names (a test
recomputes it with `coverage`).

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
    """Ways to read the bootstrap's draws of the floor ratio as an interval."""
    from studio.measure import estimate as E

    qlo, qmed, qhi = np.percentile(draws, [2.5, 50, 97.5])
    return {
        "percentile, widened to hold the point (before)": (min(qlo, point), max(qhi, point)),
        "basic (2 x point - the draws' quantiles)": (2 * point - qhi, 2 * point - qlo),
        "percentile moved so its median is the point": (qlo * point / qmed, qhi * point / qmed),
        "percentile widened, then symmetric around the point (the studio's)": E.symmetric(point, qlo, qhi),
    }


CASES = (("quiet", 2), ("quiet", 3), ("quiet", 5), ("busy", 3), ("busy", 5))
COUNTED = (3, 5)  # the windows COVERAGE counts: the pairs a cheap base is timed (3), and more


def _held() -> tuple[dict, dict]:
    """{shape: {(stack, cond, k): (held, windows)}} and {shape: half-widths of quiet 3-pair windows of cache, %}."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from studio.measure import estimate as E

    def as_runs(cond, stack):
        return [E.Run.of(r["step_ms"], r["cached"]) for r in DATA["conditions"][cond][stack]]

    held: dict[str, dict] = {}
    widths: dict[str, list[float]] = {}
    for stack in ("cache", "cache-int8-sage"):
        truth = E.speedup(as_runs("quiet", "base"), as_runs("quiet", stack)).point
        for cond, k in CASES:
            b, s = as_runs(cond, "base"), as_runs(cond, stack)
            windows = [list(range(i, i + k)) for i in range(len(b) - k + 1)]
            for w in windows:
                point, draws = E._group(
                    [b[i] for i in w], [s[i] for i in w], None, None, np.random.default_rng(0), 400
                )
                for name, (lo, hi) in interval_shapes(point, draws).items():
                    n, total = held.setdefault(name, {}).get((stack, cond, k), (0, 0))
                    held[name][(stack, cond, k)] = (n + (lo <= truth <= hi), total + 1)
                    if (cond, k) == ("quiet", 3) and stack == "cache":
                        widths.setdefault(name, []).append((hi - lo) / 2 / point * 100)
    return held, widths


def coverage(held: dict) -> dict[str, tuple[int, int]]:
    """{cond: (held, windows)} over both stacks' windows of COUNTED pairs."""
    out = {}
    for cond in ("quiet", "busy"):
        cells = [v for (_, c, k), v in held.items() if c == cond and k in COUNTED]
        out[cond] = (sum(n for n, _ in cells), sum(t for _, t in cells))
    return out


def intervals() -> None:
    """The interval shapes' table: how often each holds the 10-pair quiet point, `cache` / `cache-int8-sage`."""
    held, widths = _held()
    head = " | ".join(f"{c}, {k} pairs" for c, k in CASES)
    print(f"| interval | {head} | quiet, 3 and 5 pairs | busy, 3 and 5 pairs | median half-width (quiet, 3) |")
    print("|---|" + "---|" * (len(CASES) + 3))
    for name, cells in held.items():
        joined = " | ".join(
            " / ".join("{}/{}".format(*cells[(st, c, k)]) for st in ("cache", "cache-int8-sage")) for c, k in CASES
        )
        cov = coverage(cells)
        shares = " | ".join(f"{n}/{t} ({n / t:.0%})" for n, t in (cov["quiet"], cov["busy"]))
        print(f"| {name} | {joined} | {shares} | ±{np.median(widths[name]):.1f}% |")


# Out of sample: windows of one recording against the point of another process's separate runs, same machine
WINDOWS = Path(__file__).parent / "step_timings_oos.json"  # quiet and beside a CPU hog, a compiled stack among them
SEPARATE = Path(__file__).parent / "step_timings_oos_ref.json"  # another process's quiet runs of the same stacks


def separate_coverage() -> tuple[dict[str, tuple[int, int]], dict]:
    """({cond: (held, windows)} over every stack's windows of COUNTED pairs, {(stack, cond): (held, windows)}): how
    often the studio's interval (studio.measure.estimate.speedup) over a window of one recording held the 10-pair
    quiet point of separate runs, recorded by another process on the same machine."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from studio.measure import estimate as E

    win, ref = json.loads(WINDOWS.read_text()), json.loads(SEPARATE.read_text())

    def as_runs(data, cond, stack):
        return [E.Run.of(r["step_ms"], r["cached"]) for r in data["conditions"][cond][stack]]

    per: dict = {}
    for stack in win["stacks"][1:]:
        truth = E.speedup(as_runs(ref, "quiet", "base"), as_runs(ref, "quiet", stack)).point
        for cond in ("quiet", "busy"):
            b, s = as_runs(win, cond, "base"), as_runs(win, cond, stack)
            for k in COUNTED:
                for i in range(len(b) - k + 1):
                    e = E.speedup(b[i : i + k], s[i : i + k])
                    n, t = per.get((stack, cond), (0, 0))
                    per[(stack, cond)] = (n + (e.lo <= truth <= e.hi), t + 1)
    total = {c: tuple(map(sum, zip(*[v for (_, cc), v in per.items() if cc == c]))) for c in ("quiet", "busy")}
    return total, per


def separate() -> None:
    """The out-of-sample coverage, per stack and in all."""
    total, per = separate_coverage()
    win = json.loads(WINDOWS.read_text())
    print(f"recorded {win['recorded']} on {win['cpu']} ({win['cores']} cores), {win['dtype']}")
    print("| stack | quiet, 3 and 5 pairs | beside a CPU hog |")
    print("|---|---|---|")
    for stack in win["stacks"][1:]:
        cells = [per[(stack, c)] for c in ("quiet", "busy")]
        print(f"| {stack} | " + " | ".join(f"{n}/{t} ({n / t:.0%})" for n, t in cells) + " |")
    print("| all | " + " | ".join(f"{n}/{t} ({n / t:.0%})" for n, t in (total["quiet"], total["busy"])) + " |")


if __name__ == "__main__":
    import sys

    if "--separate" in sys.argv:
        separate()
        raise SystemExit(0)
    if "--intervals" not in sys.argv:
        main()
        print()
    intervals()
