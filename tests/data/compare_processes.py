"""Process to process: the same stacks recorded in several processes one after another, each estimator's point per
process, how far apart the processes' points are, and how far apart the two halves of one process's rounds are.

    for i in 1 2 3; do python tests/data/make_step_timings.py --stacks base,cache-compile,cache-int8-sage,cache \\
        --quiet-only --out /tmp/p$i.json; done
    python tests/data/compare_processes.py /tmp/p1.json /tmp/p2.json /tmp/p3.json

numpy and studio.measure.estimate only (docs/measuring.md has the table it printed).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from studio.measure import estimate as E  # noqa: E402


def quantile_price(runs, q: float) -> float:
    """Each kind of step's q-th percentile over the runs, times its count (q=0 is the floor)."""
    n_full, n_cached = E.counts_of(runs)
    full, hit = E._pools(runs)
    price = n_full * np.percentile(full, q) if n_full else 0.0
    if n_cached:
        price += n_cached * np.percentile(hit if len(hit) else full, q)
    return float(price)


ESTIMATORS = {
    "each kind's fastest step x its count (the floor)": lambda b, s: E.price_ms(b) / E.price_ms(s),
    "each kind's 10th percentile x its count": lambda b, s: quantile_price(b, 10) / quantile_price(s, 10),
    "each kind's 25th percentile x its count": lambda b, s: quantile_price(b, 25) / quantile_price(s, 25),
    "each kind's median step x its count": lambda b, s: quantile_price(b, 50) / quantile_price(s, 50),
    "whole-run medians": lambda b, s: np.median([r.wall_ms for r in b]) / np.median([r.wall_ms for r in s]),
}


def main(files: list[str]) -> None:
    recorded = [json.loads(Path(f).read_text()) for f in files]
    data = [d["conditions"]["quiet"] for d in recorded]
    stacks = [s for s in recorded[0]["stacks"] if s != "base"]

    def runs(d, s):
        return [E.Run.of(r["step_ms"], r["cached"]) for r in d[s]]

    print("| estimator | " + " | ".join(stacks) + " |")
    print("|---|" + "---|" * len(stacks))
    for name, f in ESTIMATORS.items():
        cells = []
        for s in stacks:
            points = [f(runs(d, "base"), runs(d, s)) for d in data]
            halves = []
            for d in data:
                b, r = runs(d, "base"), runs(d, s)
                n = len(r) // 2
                halves.append(abs(f(b[:n], r[:n]) / f(b[n:], r[n:]) - 1) * 100)
            apart = (max(points) / min(points) - 1) * 100
            shown = " / ".join(f"{p:.2f}" for p in points)
            cells.append(f"{shown} ({apart:.0f}% apart; halves {np.median(halves):.0f}%)")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
