"""Record real per-step timings of the embedded model into tests/data/step_timings.json: the estimator's test data.

    python tests/data/make_step_timings.py [--rounds 10] [--out tests/data/step_timings.json]
    python tests/data/make_step_timings.py --stacks base,cache-compile,cache-int8-sage,cache --quiet-only --out F
        (one process's quiet runs: tests/data/compare_processes.py compares several such files)

Through the studio's own engine (warm stacks, the step probe, the cache's counts), each round runs base, cache and
cache-int8-sage one after the other on the same request (compare off: the caller times base itself), first on a quiet
machine, then with a CPU-bound process beside it (lab.busy's load: another program on the same cores). Each
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


def record(runner, request, rounds: int, stacks=STACKS) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {s: [] for s in stacks}
    runner.settle(request, stacks[0])
    for _ in range(rounds):
        for s in stacks:
            m = runner.generate(request, s, compare="off").metrics
            out[s].append(
                {
                    "step_ms": [round(t, 3) for t in m.timing.step_ms],
                    "cached": m.cache.cached_step_indices,
                    "wall_s": m.timing.denoise_s,
                }
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--out", default=str(ROOT / "tests" / "data" / "step_timings.json"))
    ap.add_argument("--stacks", default=",".join(STACKS), help="comma-separated presets, base first")
    ap.add_argument("--quiet-only", action="store_true", help="no rounds beside the CPU-bound load")
    args = ap.parse_args()
    stacks = tuple(args.stacks.split(","))
    from lab.busy import start_load, stop_load
    from studio.engine import ModelManager, Runner
    from studio.spec.hosting import edge_environ
    from studio.spec.settings import Settings, install

    os.environ.update(edge_environ(os.environ))
    settings = install(Settings.from_env(os.environ))
    runner = Runner(ModelManager("cpu", settings=settings), model="tiny")
    request = runner.request(PROMPT, model="tiny", seed=7)
    for s in stacks:  # every stack warm (and compiled) before the first timed round
        runner.generate(request, s, compare="off")
    quiet = record(runner, request, args.rounds, stacks)
    conditions = {"quiet": quiet}
    if not args.quiet_only:
        load = start_load()
        try:
            time.sleep(2.0)
            conditions["busy"] = record(runner, request, args.rounds, stacks)
        finally:
            stop_load(load)
    data = {
        "recorded": time.strftime("%Y-%m-%d"),
        "command": " ".join(["python tests/data/make_step_timings.py"] + sys.argv[1:]),
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "dtype": runner.generate(request, "base", compare="off").metrics.labels.dtype,
        "request": {"prompt": PROMPT, "seed": 7, "steps": request.steps, "size": [request.width, request.height]},
        "stacks": list(stacks),
        "conditions": conditions,
    }
    Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
