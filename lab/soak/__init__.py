"""The soak: the app in public mode on loopback, driven by honest and hostile visitors (`python -m lab soak`)."""

from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    """`python -m lab soak`: the public studio under its visitors for --minutes; PASS when nothing was lost."""
    from lab.soak.plan import SoakPlan
    from lab.soak.report import soak_text
    from lab.soak.visitors import run_soak

    ap = argparse.ArgumentParser(prog="python -m lab soak", description=main.__doc__)
    ap.add_argument("--minutes", type=float, default=1.0, help="how long the visitors drive it (default 1)")
    ap.add_argument("--visitors", type=int, default=8, help="honest visitors, pacing under the rate (default 8)")
    ap.add_argument("--hostile", type=int, default=4, help="hostile visitors, attacking every limit (default 4)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    try:
        plan = SoakPlan(minutes=args.minutes, visitors=args.visitors, hostile=args.hostile)
    except ValueError as e:  # (ConfigError too) a value out of range, named
        print(f"error: {e}", file=sys.stderr)
        return 2
    rep = run_soak(plan, progress=lambda m: print(m, file=sys.stderr))
    print(json.dumps(rep.as_dict(), indent=1) if args.json else soak_text(rep))
    return 0 if rep.passed else 1
