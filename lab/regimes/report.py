"""The regimes table (lab.regimes.table) as Markdown, headed by the command that produced it."""

from __future__ import annotations

from studio.report import fmt

COLUMNS = (
    "stack",
    "regime",
    "ms/step",
    "total s",
    "vs base",
    "cached/full",
    "full step",
    "cached step",
    "warm-up s",
    "peak memory",
    "peak reserved",
    "H2D per full step",
    "H2D per cached step",
    "PSNR ¹",
    "engaged",
)
HELP = (
    "the reference table's shape, stacks x memory regimes on a random-weight FLUX.1-dev-sized transformer. Estimate "
    "for one H200 (bf16, 40 steps, 1024x1024; not yet measured there): an eager resident row 5-20 s, a compiled one "
    "45-120 s (regional compile, two block kinds), an offload row 15-60 s (its transfers): the default ~6 min; "
    "--config small on a 2-core CPU ~15 s"
)
PSNR_NOTE = (
    "¹ PSNR is not measured here: the weights are random, so a picture's distance from base says nothing about a "
    "trained model's. The embedded model's bench (`python -m studio bench`) is where PSNR is measured."
)
REFERENCE = (
    "Reference (one RTX 4090, 40 steps at 1024x1024, layerwise offload with prefetch 1), ms/step: base BF16+SDPA "
    "651; Sage 662; INT8 338; Cache-DiT F1B0 W4 R0.24 MC3 195 (13 full / 27 cached); Cache+INT8 99; "
    "Cache+INT8+Sage 89."
)


def _vs_base(r) -> str:
    if r.speedup is None:
        return f"withheld: {r.speedup_note}" if getattr(r, "speedup_note", None) else "n/a"
    if r.stack == "base":
        return f"{fmt.speedup(r.speedup)} (base)"
    return fmt.speedup_ci(r.speedup, r.speedup_lo, r.speedup_hi)


def _peak(r) -> tuple[str, str]:
    p = r.peak_memory
    if not p:
        return "n/a", "n/a"
    if p.get("peak_bytes") is None:
        return f"n/a ({p.get('note')})", "n/a"
    kind = "" if p["kind"] == "cuda allocated" else f" ({p['kind']})"
    reserved = fmt.size(p["reserved_bytes"]) if p.get("reserved_bytes") is not None else "n/a"
    return fmt.size(p["peak_bytes"]) + kind, reserved


def _h2d(r, key: str) -> str:
    if r.regime == "resident":
        return "-"
    if not r.h2d or r.h2d.get(key) is None:
        return "n/a"
    return fmt.size(r.h2d[key]) + ("" if r.h2d.get("moved", True) else " (cpu to cpu: no bus)")


def _status(r) -> str:
    """What the ms column says of a row without a time."""
    return "error" if r.error else "fell back" if r.fell_back else "n/a"


def cells(r) -> list[str]:
    peak, reserved = _peak(r)
    timed = r.ms_per_step is not None
    steps = fmt.steps(r.cached_steps, r.full_steps) if r.cached_steps is not None else "n/a"
    notes = "; ".join(r.engaged + ([f"H2D count {r.h2d['check']}"] if r.h2d and r.h2d.get("check") else []))
    if r.fell_back:
        notes = f"fell back: {r.fell_back}" + (f" (after: {'; '.join(r.engaged[:-1])})" if r.engaged[:-1] else "")
    if r.error:
        notes = f"error, lost: {r.error}" + (f" ({notes})" if notes else "")
    return [
        r.stack,
        r.regime,
        f"{r.ms_per_step:.1f}" if timed else _status(r),
        f"{r.total_s:.2f}" if timed else "-",
        _vs_base(r),
        steps,
        fmt.ms(r.full_step_ms),
        fmt.ms(r.cached_step_ms),
        "n/a" if r.warmup_s is None else f"{r.warmup_s:.1f}",
        peak,
        reserved,
        _h2d(r, "h2d_bytes_per_full_step"),
        _h2d(r, "h2d_bytes_per_cached_step"),
        r.psnr,
        notes.replace("|", "/"),
    ]


def row_line(r) -> str:
    """One finished row, for the progress log."""
    c = cells(r)
    return f"regimes: {c[0]} / {c[1]}: {c[2]} ms/step, {c[4]}, {c[5]}, peak {c[9]}" + (
        f" -- {c[14]}" if r.error or r.fell_back else ""
    )


def markdown(rep) -> str:
    """The whole report (`rep`: lab.regimes.table.RegimeReport)."""
    b, v = rep.bench, rep.versions
    mask = "".join(str(m) for m in rep.mask)
    lines = [
        f"# `{rep.command}`",
        "",
        f"Random-weight FluxTransformer2DModel ({b['config']}: {b['double_blocks']} double + {b['single_blocks']} "
        f"single blocks, {b['heads']} heads x {b['head_dim']}), {b['size']}x{b['size']} ({b['image_tokens']} image + "
        f"{b['text_tokens']} text tokens), {b['steps']} steps, {b['dtype']} on {b['device']}"
        + (f" ({b['cpu_threads']} thread(s))" if b["device"] == "cpu" and b.get("cpu_threads") else "")
        + (f" ({v['gpu']})" if v.get("gpu") else "")
        + f"; torch {v['torch']}, diffusers {v['diffusers']}, cache-dit {v['cache-dit']}, torchao {v['torchao']}.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(cells(r)) + " |" for r in rep.rows]
    lines += [
        "",
        "- ms/step: the timed run's total over its steps (a cached run mixes full and cached steps, as the "
        "reference's figures do); full/cached step: the median of each kind. Each call is timed between two device "
        "syncs, after an untimed warm-up of the first steps (compile happens there).",
        "- vs base: the same regime's base total over this row's, ± the sd the two runs' step-to-step spread gives.",
        f"- cached/full: cache-dit's own summary. The cache rows run DBCache F1B0 W4 R0.24 MC3 under the static mask "
        f"{mask} (1: computed); a count that differs from it is an error row, not a number.",
        "- peak memory: CUDA max_memory_allocated (and reserved) over the timed run; on a CPU the process's peak "
        "resident set, weights included. H2D: bytes copied host-to-device per step under offload "
        "(studio.engine.offload.stream_report).",
        "- Each row builds its transformer afresh; a row that fell back is not timed as if it were the stack.",
        f"- {PSNR_NOTE}",
        f"- {REFERENCE}",
    ]
    return "\n".join(lines) + "\n"
