"""Base at fewer steps as text (studio.bench.fewer): the rows of its curve, and a stack's verdict against it."""

from __future__ import annotations

import math

from studio.measure.estimate import CLEAR_DB
from studio.report import fmt


def _dbs(v) -> str:
    return "-" if v is None else ("identical" if math.isinf(v) else f"{v:.1f}")


def _flips(v) -> str:
    return "not measured" if v is None else f"{v:.3f}"


def versus_fewer(v) -> str:
    """A row against base at the step count of its speed-up, in a few words."""
    if v is None:
        return "-"
    at = f"{v.at.steps} steps ({v.at.speedup:.2f}x) keep {_dbs(v.at.worst_db)} dB"
    if v.beats:
        return (
            f"beats it: identical to base; {at}"
            if math.isinf(v.margin_db)
            else f"beats it by {v.margin_db:.1f} dB: {at}"
        )
    return f"fewer steps does {'as well' if v.margin_db > -CLEAR_DB else 'better'}: {at}"


def fewer_steps_markdown(fewer) -> list[str]:
    """The fewer-steps reference as lines: base at k of N steps against base's N-step picture, its speed-up by step
    count, and the fewest steps that keep the floor."""
    out = [
        f"Base at fewer steps, against base's {fewer.full}-step picture of each of the {fewer.prompts} prompts "
        "(speed-up by step count: base's steps cost the same, so this is its denoise ratio up to the call's fixed "
        "cost, which flatters fewer steps):",
        "",
        "| base at | speed-up | worst PSNR dB | mean PSNR dB | worst FLIP |",
        "|---|---|---|---|---|",
    ]
    for p in fewer.curve():
        out.append(
            f"| {p.steps} of {p.full} steps | {p.speedup:.2f}x | {_dbs(p.worst_db)} | {_dbs(p.mean_db)} "
            f"| {_flips(p.worst_flip)} |"
        )
    if fewer.fewest is None:
        out += ["", f"No step count below {fewer.full} keeps every prompt above {fewer.floor_db:g} dB."]
    else:
        f = fewer.fewest
        out += [
            "",
            f"Fewest steps above {fewer.floor_db:g} dB: {f.steps} of {f.full} ({f.speedup:.2f}x, worst "
            f"{_dbs(f.worst_db)} dB): a step cache slower than that, or not clearly above it at its own speed, is not "
            "worth its complexity on this model.",
        ]
    return out


def fewer_line(fewer, vs) -> list[str]:
    """The tuned stack against base at fewer steps on the same prompts (studio.bench.fewer), one line; none when
    not measured."""
    if fewer is None:
        return []
    most = (
        f"the fewest steps above the floor: {fewer.fewest.steps} of {fewer.full} ({fewer.fewest.speedup:.2f}x, worst "
        f"{fmt.psnr(fewer.fewest.worst_db)})"
        if fewer.fewest
        else f"no step count below {fewer.full} keeps the floor"
    )
    return [f"against base at fewer steps: {versus_fewer(vs)}; {most}"]
