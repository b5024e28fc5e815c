"""Base at fewer steps as text (studio.bench.fewer): the rows of its curve, and a stack's verdict against it."""

from __future__ import annotations

import math

from studio.measure.estimate import CLEAR_DB
from studio.report import fmt


def standing(margin: float) -> str:
    """beats | ties | loses: a stack against base at fewer steps of its speed, CLEAR_DB of worst PSNR either way."""
    return "beats" if margin >= CLEAR_DB else "ties" if margin > -CLEAR_DB else "loses"


def against(margin: float, at: str) -> str:
    """A stack against base at fewer steps (`at`: what that base keeps): the one wording of the tables and card."""
    said = standing(margin)
    if said == "beats":
        return f"beats it: identical to base; {at}" if math.isinf(margin) else f"beats it by {margin:.1f} dB: {at}"
    return f"fewer steps does {'as well' if said == 'ties' else 'better'}: {at}"


def versus_fewer(v) -> str:
    """A row against base at the step count of its speed-up (studio.bench.fewer.Versus), in a few words."""
    if v is None:
        return "-"
    return against(v.margin_db, f"{v.at.steps} steps ({v.at.speedup:.2f}x) keep {fmt.db_short(v.at.worst_db)} dB")


def fewer_steps_markdown(fewer) -> list[str]:
    """The fewer-steps reference as lines: its curve as a table, then the fewest steps that keep the floor."""
    out = [
        f"Base at fewer steps, against base's {fewer.full}-step picture of each of the {fewer.prompts} prompts "
        "(speed-up by step count: base's steps cost the same, so this is its denoise ratio up to the call's fixed "
        "cost, which flatters fewer steps):",
        "",
        "| base at | speed-up | worst PSNR dB | mean PSNR dB | worst FLIP |",
        "|---|---|---|---|---|",
    ]
    db, flip = fmt.db_short, fmt.flip_short
    for p in fewer.curve():
        out.append(
            f"| {p.steps} of {p.full} steps | {p.speedup:.2f}x | {db(p.worst_db)} | {db(p.mean_db)} "
            f"| {flip(p.worst_flip)} |"
        )
    if fewer.fewest is None:
        out += ["", f"No step count below {fewer.full} keeps every prompt above {fewer.floor_db:g} dB."]
    else:
        f = fewer.fewest
        out += [
            "",
            f"Fewest steps above {fewer.floor_db:g} dB: {f.steps} of {f.full} ({f.speedup:.2f}x, worst "
            f"{db(f.worst_db)} dB): a step cache slower than that, or not clearly above it at its own speed, is not "
            "worth its complexity on this model.",
        ]
    return out


def fewer_line(fewer, vs, tuned=None) -> list[str]:
    """The tuned stack against base at fewer steps, one line ([] when not measured); `tuned`: the tuned preset, which
    runs a share of the steps where fewer steps won."""
    if fewer is None:
        return []
    if tuned is not None and tuned.step_share is not None:
        k = tuned.steps_of(fewer.full)
        return [f"against base at fewer steps: fewer steps won: the tuned preset is base at {k} of {fewer.full} steps"]
    most = (
        f"the fewest steps above the floor: {fewer.fewest.steps} of {fewer.full} ({fewer.fewest.speedup:.2f}x, worst "
        f"{fmt.psnr(fewer.fewest.worst_db)})"
        if fewer.fewest
        else f"no step count below {fewer.full} keeps the floor"
    )
    return [f"against base at fewer steps: {versus_fewer(vs)}; {most}"]
