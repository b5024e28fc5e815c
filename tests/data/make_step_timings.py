"""Record real per-step timings of the embedded model into tests/data/step_timings.json: the estimator's test data.

    python tests/data/make_step_timings.py [--rounds 10] [--out tests/data/step_timings.json]

Through the studio's own engine (warm stacks, the step probe, the cache's counts), each round runs base, cache and
cache-int8-sage one after the other on the same request (compare off: the caller times base itself), first on a quiet
machine, then with a CPU-bound process beside it (studio.bench.busy's load: another program on the same cores). Each
run keeps its per-step milliseconds, its cached step indices and its wall denoise time; the file says on what CPU,
when, and with which command it was recorded. The estimator's tests (tests/test_estimate.py) read it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

STACKS = ("base", "cache", "cache-int8-sage")
PROMPT = "a red circle on a blue background"


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def record(runner, request, rounds: int) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {s: [] for s in STACKS}
    runner.settle(request, STACKS[0])
    for _ in range(rounds):
        for s in STACKS:
            m = runner.generate(request, s, compare="off").metrics
            out[s].append(
                {"step_ms": [round(t, 3) for t in m.step_ms], "cached": m.cached_step_indices, "wall_s": m.denoise_s}
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--out", default=str(ROOT / "tests" / "data" / "step_timings.json"))
    args = ap.parse_args()
    from studio.bench.busy import start_load, stop_load
    from studio.engine import ModelManager, Runner
    from studio.spec.hosting import edge_environ
    from studio.spec.settings import Settings, install

    os.environ.update(edge_environ(os.environ))
    install(Settings.from_env(os.environ))
    runner = Runner(ModelManager("cpu"), model="tiny")
    request = runner.request(PROMPT, model="tiny", seed=7)
    for s in STACKS:  # every stack warm (and compiled) before the first timed round
        runner.generate(request, s, compare="off")
    quiet = record(runner, request, args.rounds)
    load = start_load()
    try:
        time.sleep(2.0)
        busy = record(runner, request, args.rounds)
    finally:
        stop_load(load)
    data = {
        "recorded": time.strftime("%Y-%m-%d"),
        "command": f"python tests/data/make_step_timings.py --rounds {args.rounds}",
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "dtype": runner.generate(request, "base", compare="off").metrics.dtype,
        "request": {"prompt": PROMPT, "seed": 7, "steps": request.steps, "size": [request.width, request.height]},
        "stacks": list(STACKS),
        "conditions": {"quiet": quiet, "busy": busy},
    }
    Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
