"""`python -m lab busy`: do the numbers stay honest when another program shares the cores?

The target: with another CPU-bound process on the machine, every speed-up a generate shows has an interval that
holds the quiet one (the median of the quiet readings), or it shows none and says why. This runs the same
request quietly, then
with a load beside it (a second process multiplying 512x512 matrices in a loop, as a browser tab, an indexing IDE
or a second app on the same cores would), and judges every busy reading against the quiet median. Through the
engine in this process, or through a running app's `/generate` (`--api URL`, with gradio_client).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from dataclasses import dataclass, field

from studio.report import fmt

LOAD = "import torch\na = torch.randn(512, 512)\nwhile True:\n    a = (a @ a).tanh()\n"
LOAD_THREADS = "torch.set_num_threads({})\n"  # after `import torch`, when the load is given a thread count


@dataclass
class BusyReport:
    preset: str
    quiet: list[float | None] = field(default_factory=list)  # speed-ups read on a quiet machine
    # under load, each (speed-up, its interval's low and high end, note)
    busy: list[tuple[float | None, float | None, float | None, str | None]] = field(default_factory=list)

    @property
    def quiet_median(self) -> float | None:
        vals = [v for v in self.quiet if v is not None]
        return statistics.median(vals) if vals else None

    def verdicts(self) -> list[str]:
        """Per busy reading: its interval holds the quiet point, flagged (no number, with the reason), or WRONG."""
        q = self.quiet_median
        out = []
        for v, lo, hi, note in self.busy:
            if v is None:  # no number: right only with the reason (a useless interval, a reading beyond its ideal)
                out.append("flagged" if note else "WRONG (no number, no why)")
            elif q is not None and lo is not None and lo <= q <= hi:
                out.append("holds the quiet point")
            else:
                out.append("WRONG")
        return out

    @property
    def passed(self) -> bool:
        return self.quiet_median is not None and not any(v.startswith("WRONG") for v in self.verdicts())


def start_load(threads: int | None = None) -> subprocess.Popen:
    """The other program: a CPU-bound PyTorch loop in its own process (killed by `stop_load`). It is not a contained
    run of the studio (it imports nothing of it): a plain process, its only job to take the cores."""
    head, rest = LOAD.split("\n", 1)
    code = head + "\n" + (LOAD_THREADS.format(int(threads)) if threads else "") + rest
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop_load(p: subprocess.Popen) -> None:
    p.kill()
    p.wait(timeout=30)


def engine_reader(runner, request, preset: str):
    """A reading through the engine: one generate, its (speed-up, low, high, note)."""

    def read():
        m = runner.generate(request, preset).metrics
        return m.timing.speedup, m.timing.speedup_lo, m.timing.speedup_hi, m.timing.speedup_note

    return read


def api_reader(url: str, prompt: str, preset: str, seed: int):
    """A reading through a running app's /generate (gradio_client): its (speed-up, low, high, note) from the metrics
    JSON."""
    from gradio_client import Client

    client = Client(url, verbose=False)

    def read():
        out = client.predict(prompt=prompt, preset=preset, seed=seed, api_name="/generate")
        m = out[-1]
        return m.get("speedup"), m.get("speedup_lo"), m.get("speedup_hi"), m.get("speedup_note")

    return read


def run_busy(read, preset: str, quiet: int = 3, busy: int = 3, progress=None) -> BusyReport:
    """`quiet` readings, then `busy` readings with the load running beside them."""
    rep = BusyReport(preset)
    read()  # the first reading loads and warms up: not a reading
    for i in range(quiet):
        rep.quiet.append(read()[0])
        if progress:
            progress(f"quiet {i + 1}/{quiet}: {rep.quiet[-1]}")
    load = start_load()
    try:
        for i in range(busy):
            rep.busy.append(read())
            if progress:
                progress(f"busy {i + 1}/{busy}: {rep.busy[-1]}")
    finally:
        stop_load(load)
    return rep


def busy_text(rep, where: str) -> str:
    """`python -m lab busy`: each reading and its verdict (`rep` a lab.busy.BusyReport)."""
    q = rep.quiet_median
    lines = [
        f"{rep.preset} through {where}: quiet readings {', '.join(fmt.speedup(v) for v in rep.quiet)}"
        f" (median {fmt.speedup(q)}); with a CPU-bound process beside it:"
    ]
    for (v, lo, hi, note), verdict in zip(rep.busy, rep.verdicts()):
        reading = fmt.speedup_ci(v, lo, hi) if v is not None else f"no number ({note})"
        lines.append(f"  {reading}: {verdict}")
    lines.append(
        "PASS: every busy reading's interval holds the quiet point, or it is withheld with its reason"
        if rep.passed
        else "FAIL: a busy reading is wrong"
    )
    return "\n".join(lines)


def main(argv=None) -> int:
    """`python -m lab busy`: quiet readings, then with a CPU-bound load beside them: honest or flagged?"""
    import argparse

    from studio.cli import runner_of
    from studio.cli_args import common_args, read_settings, request_of_args

    ap = argparse.ArgumentParser(prog="python -m lab busy", description=main.__doc__)
    common_args(ap)
    ap.add_argument("--preset", default="cache")
    ap.add_argument("--quiet", type=int, default=3, help="readings on the quiet machine")
    ap.add_argument("--busy", type=int, default=3, help="readings with the load running")
    ap.add_argument("--api", default=None, help="read through a running app's /generate (e.g. http://127.0.0.1:7860/)")
    args = ap.parse_args(argv)
    runner = runner_of(args, read_settings(args))
    req = request_of_args(args, runner.profile(args.model))
    try:
        if args.api:
            read = api_reader(args.api, req.prompt, args.preset, req.seed)
        else:
            read = engine_reader(runner, req, args.preset)
        rep = run_busy(read, args.preset, args.quiet, args.busy, progress=lambda m: print(m, file=sys.stderr))
    finally:
        runner.manager.unload()
    print(busy_text(rep, where=args.api or "the engine, in this process"))
    return 0 if rep.passed else 1
