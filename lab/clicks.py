"""`python -m lab clicks --api URL`: what one Generate click costs through a running app, per compare mode.

The targets: once a shape's base timing is known, a Generate click in `auto` takes at most 1.3x the wall
time of the stack's own run, and a click in `on` on a new prompt at most 6x. The stack's own run, through the
same path, is a click with compare `off`. This
clicks `/generate` with gradio_client: one `on` click first (it keeps the shape's base timing), then rounds of
off, auto, on clicks on other prompts of the same shape, each on a prompt and seed not asked before (so `auto`
finds no base picture of its own and `on` has to time base); the verdict is the median auto click over the median
off click. It also counts the auto and on clicks that showed a speed-up (at least 5 of 6: a number withheld on a
quiet machine tells its user nothing).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

BOUND = 1.3  # an auto click's wall time over the stack's own run (an off click), at most
ON_BOUND = 6.0  # an on click of a new prompt (base timed beside it, pairs until the interval is tight) at most
SHOWN = 5 / 6  # the share of auto and on clicks of new prompts that show a speed-up, at least (issue 30)
PROMPTS = (
    "an orange triangle on the left, black background",
    "a green square on the right, white background",
    "a blue circle at the top, yellow background",
)
MODES = ("off", "auto", "on")


@dataclass
class ClickReport:
    preset: str
    wall: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in MODES})  # seconds per click
    timing: dict[str, str] = field(default_factory=dict)  # the last click's timing line, per mode
    shown: dict[str, list[bool]] = field(default_factory=lambda: {m: [] for m in MODES})  # a speed-up on the card

    def median(self, mode: str) -> float:
        return statistics.median(self.wall[mode])

    @property
    def auto_over_off(self) -> float:
        return self.median("auto") / self.median("off")

    bound: float = BOUND
    on_bound: float = ON_BOUND

    @property
    def on_over_off(self) -> float:
        return self.median("on") / self.median("off")

    @property
    def on_passed(self) -> bool:
        return self.on_over_off <= self.on_bound

    def shown_share(self, mode: str) -> float:
        return sum(self.shown[mode]) / len(self.shown[mode]) if self.shown[mode] else 0.0

    @property
    def shown_passed(self) -> bool:
        return all(self.shown_share(m) >= SHOWN for m in ("auto", "on"))

    @property
    def passed(self) -> bool:
        return self.auto_over_off <= self.bound and self.shown_passed


def run_clicks(url: str, prompt: str, preset: str, rounds: int = 2, progress=None) -> ClickReport:
    """`rounds` rounds of off, auto and on clicks (module doc), after one `on` click that keeps the shape's timing."""
    from gradio_client import Client

    client = Client(url, verbose=False)
    rep = ClickReport(preset)

    def click(p: str, mode: str, seed: int) -> None:
        t0 = time.perf_counter()
        out = client.predict(prompt=p, preset=preset, seed=seed, compare=mode, api_name="/generate")
        rep.wall[mode].append(time.perf_counter() - t0)
        rep.timing[mode] = out[-1]["timing"]
        rep.shown[mode].append(out[-1]["speedup"] is not None)  # None: withheld, with its reason on the card
        if progress:
            progress(f"{mode}: {rep.wall[mode][-1]:.2f} s ({p[:30]}..., seed {seed})")

    click(prompt, "on", 1)  # the shape's base timing, kept
    seed = 100
    for _ in range(rounds):
        for mode in MODES:
            for p in PROMPTS:
                seed += 1
                click(p, mode, seed)
    return rep


def clicks_text(rep, where: str) -> str:
    """`python -m lab clicks`: each mode's click wall time and the verdict (a lab.clicks.ClickReport)."""
    lines = [f"{rep.preset} through {where}, a Generate click's wall time (median of {len(rep.wall['off'])}):"]
    off = rep.median("off")
    for mode in rep.wall:
        lines.append(f"  {mode:4s} {rep.median(mode):6.2f} s ({rep.median(mode) / off:.2f}x off), {rep.timing[mode]}")
    verdict = "PASS" if rep.passed else "FAIL"
    lines.append(f"{verdict}: an auto click is {rep.auto_over_off:.2f}x the stack's own run (target <= {rep.bound}x)")
    verdict = "PASS" if rep.on_passed else "FAIL"
    lines.append(
        f"{verdict}: an on click of a new prompt is {rep.on_over_off:.2f}x the stack's own run "
        f"(target <= {rep.on_bound}x)"
    )
    counts = ", ".join(f"{m} {sum(rep.shown[m])} of {len(rep.shown[m])}" for m in ("auto", "on"))
    verdict = "PASS" if rep.shown_passed else "FAIL"
    lines.append(f"{verdict}: clicks of new prompts that showed a speed-up: {counts} (target: 5 of 6 or more)")
    return "\n".join(lines)


def main(argv=None) -> int:
    """`python -m lab clicks`: what a Generate click costs through a running app, per compare mode."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m lab clicks", description=main.__doc__)
    ap.add_argument("--api", required=True, help="the running app (e.g. http://127.0.0.1:7860/)")
    ap.add_argument("--preset", default="cache")
    ap.add_argument("--prompt", default="a red circle in the center, blue background")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of off, auto and on clicks (3 prompts each)")
    args = ap.parse_args(argv)
    rep = run_clicks(args.api, args.prompt, args.preset, args.rounds, progress=lambda m: print(m, file=sys.stderr))
    print(clicks_text(rep, args.api))
    return 0 if rep.passed else 1
