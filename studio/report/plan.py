"""A device plan (engine.plan) in words: the parts with their reasons and the memory plan; and the table of presets
on named profiles (docs/presets.md's hardware table is made by it)."""

from __future__ import annotations

from studio.report.fmt import size

PARTS = ("dtype", "quantize", "attention", "compile", "offload")


def plan_text(p) -> str:
    """`python -m studio plan`'s text for one DevicePlan."""
    w, h = p.size
    out = [f"{p.preset} on {p.device}: {p.model} at {w}x{h}"]
    out += [f"  {part:9s} {getattr(p, part):18s} {p.reasons.get(part, '')}" for part in PARTS]
    if "parallel" in p.reasons:
        out.append(f"  {'parallel':9s} {'':18s} {p.reasons['parallel']}")
    out.append("  memory:")
    out += [f"    {name:15s} {size(c['bytes']):>10s}  {c['where']}" for name, c in p.components.items()]
    out.append(f"    {'activations':15s} {size(p.activation_bytes):>10s}  at {w}x{h}")
    verdict = "fits" if p.fits else "does NOT fit"
    out.append(f"  peak ~{size(p.peak_bytes)} on the device, against {p.free}: {verdict}")
    if p.refusal:
        out.append(f"  refused: {p.refusal}")
    return "\n".join(out)


def cell(p) -> str:
    """One preset on one profile, short: 'bf16 float8 sage regional resident 31.2 GiB' or why it does not fit."""
    if not p.fits:
        return f"does not fit ({p.offload} ~{size(p.peak_bytes)})"
    q = "" if p.quantize == "none" else f" {p.quantize}"
    c = "" if p.compile == "off" else f" {p.compile}"
    where = "resident" if p.offload == "none" else p.offload
    return f"{p.dtype}{q} {p.attention}{c} {where} ~{size(p.peak_bytes)}"


def plan_table(plans: dict) -> str:
    """Markdown: a row per profile, a column per preset; `plans` maps (profile, preset) to a DevicePlan."""
    profiles = list(dict.fromkeys(k[0] for k in plans))
    presets = list(dict.fromkeys(k[1] for k in plans))
    rows = ["| device | " + " | ".join(presets) + " |", "|---" * (len(presets) + 1) + "|"]
    rows += [f"| {d} | " + " | ".join(cell(plans[(d, p)]) for p in presets) + " |" for d in profiles]
    return "\n".join(rows)
