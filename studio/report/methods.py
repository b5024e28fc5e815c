"""The `methods` command's text and plot (studio.bench.methods), and MagCache's calibration description."""

from __future__ import annotations

from studio.report import fmt
from studio.report.fewer import fewer_steps_markdown, versus_fewer


def calibration_description(cal, model_name: str) -> str:
    """A calibrated MagCache preset's description: what its ratios are, for which model, measured how."""
    return (
        f"diffusers MagCache with its per-step magnitude ratios measured on {model_name} "
        f"({cal.calibrated_for}) at {cal.steps} steps over {cal.prompts} prompts (prompts at most {cal.spread:.3f} "
        "apart at any step): after its retention steps it skips the whole block stack while the accumulated ratio "
        "error stays under the threshold. Another model needs its own: `python -m studio calibrate`."
    )


def searched_description(s, res, model_name: str) -> str:
    """A searched best's description (`methods --write`): where and how it was found, and what it kept."""
    floor = f"{res.floor_db:g} dB" + (f" and FLIP <= {res.max_flip:g}" if res.max_flip is not None else "")
    cached = f"{s.cached:.1f}".rstrip("0").rstrip(".")
    return (
        f"{s.method.name} at its fastest setting ({s.method.knob} {s.value}) that kept all {len(res.search_prompts)} "
        f"prompts above {floor} on {model_name}: worst {fmt.db_short(s.worst_db)} dB, worst FLIP "
        f"{fmt.flip_short(s.worst_flip)}, "
        f"{cached} steps cached on average. Searched by `python -m studio methods`; another model needs its own "
        "search."
    )


def methods_markdown(res) -> str:
    """The table of every method's best setting, then the methods searched without a timed row, with the reason."""
    floor = f"{res.floor_db:g} dB" + (f" and FLIP <= {res.max_flip:g}" if res.max_flip is not None else "")
    n, k = len(res.prompts), len(res.search_prompts)
    if res.held_out:
        where = (
            f"searched over {k} prompts, then timed side by side on {n} others it did not see (one interleaved "
            "bench: each prompt against its own base; a worst PSNR under the floor is marked)"
        )
    else:
        where = "timed side by side (one interleaved bench: each prompt against its own base)"
    out = [
        f"Every step cache at its fastest setting that keeps all {k} prompts above {floor}, {where}.",
        "",
        "| method | setting | speed-up | worst PSNR dB | worst FLIP | wins vs base | wins vs fastest | cached/full "
        "| vs base at fewer steps |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res.rows:
        sp = fmt.speedup_ci(r.speedup, r.speedup_lo, r.speedup_hi) if r.speedup is not None else "withheld"
        flip = "-" if r.worst_flip is None else f"{r.worst_flip:.3f}"
        vs_best = f"{r.wins_vs_best} of {r.of}" if r.wins_vs_best is not None else "-"
        vs_best = "fastest" if r.preset == res.best else vs_best
        under = r.worst_psnr_db is not None and r.worst_psnr_db < res.floor_db
        out.append(
            f"| {r.method} | {r.label} | {sp} | {fmt.db_short(r.worst_psnr_db)}{' (under)' if under else ''} | {flip} "
            f"| {r.wins_vs_base} of {r.of} "
            f"| {vs_best} | {r.cached_steps}/{r.full_steps} | {versus_fewer(r.vs_fewer)} |"
        )
    searched = {s.method.name: s for s in res.searched}
    notes = [
        f"- {name}: {s.refused or s.note}"
        for name, s in searched.items()
        if s.refused or (s.note and s.preset is None)
    ]
    if notes:
        out += ["", "Not timed:", *notes]
    calibrated = [f"- {name}: {s.note}" for name, s in searched.items() if s.preset is not None and s.note]
    if calibrated:
        out += ["", *calibrated]
    notes = sorted({r.speedup_note for r in res.rows if r.speedup is None and r.speedup_note})
    if notes:
        out += ["", "Withheld: " + "; ".join(notes)]
    if res.best:
        out += ["", f"Fastest above the floor: {res.best}."]
    else:
        out += ["", "No row's speed-up could be shown, so none is named the fastest."]
    if res.fewer is not None:
        out += ["", *fewer_steps_markdown(res.fewer)]
    return "\n".join(out)


def plot_methods(res, path_or_buf) -> None:
    """Speed-up (x) against worst-prompt FLIP (y, lower is better), with the Pareto front and fewer steps' curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [r for r in res.rows if r.speedup is not None and r.worst_flip is not None]
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    front = pareto(pts)
    placed: list[tuple[float, float, int]] = []  # (x, y, label row): a label near another's takes the next row
    xspan = (max(r.speedup for r in pts) - min(r.speedup for r in pts)) if pts else 1.0
    yspan = (max(r.worst_flip for r in pts) - min(r.worst_flip for r in pts)) if pts else 1.0
    for r in pts:
        colour = "#d62728" if r in front else "#1f77b4"
        ax.scatter([r.speedup], [r.worst_flip], s=50, color=colour, zorder=3)
        if r.speedup_lo is not None and r.speedup_hi is not None:
            ax.errorbar(
                [r.speedup],
                [r.worst_flip],
                xerr=[[r.speedup - r.speedup_lo], [r.speedup_hi - r.speedup]],
                color=colour,
                capsize=3,
                lw=1,
            )
        near = {
            row
            for x, y, row in placed
            if abs(r.speedup - x) < 0.15 * (xspan or 1) and abs(r.worst_flip - y) < 0.05 * (yspan or 1)
        }
        row = min(set(range(len(near) + 1)) - near)
        placed.append((r.speedup, r.worst_flip, row))
        ax.annotate(
            r.method, (r.speedup, r.worst_flip), textcoords="offset points", xytext=(5, 4 - 9 * row), fontsize=7
        )
    if front:
        f = sorted(front, key=lambda r: r.speedup)
        ax.step(
            [r.speedup for r in f],
            [r.worst_flip for r in f],
            where="post",
            color="#d62728",
            lw=1,
            label="Pareto front",
        )
    _fewer_curve(ax, res.fewer)
    if front or res.fewer is not None:
        ax.legend(fontsize=7, loc="upper left")
    ax.axvline(1.0, color="#888", lw=0.8)
    ax.set_xlabel("speed-up vs base (denoise time, its interval)")
    ax.set_ylabel("worst prompt's FLIP against base (lower: closer)")
    ax.set_title(f"step caches at their best setting above {res.floor_db:g} dB", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path_or_buf, format="png")
    plt.close(fig)


def _fewer_curve(ax, fewer) -> None:
    """Base at fewer steps as a curve, so a method worse than fewer steps at its speed reads at a glance."""
    pts = [p for p in (fewer.curve() if fewer else []) if p.worst_flip is not None]
    if not pts:
        return
    pts = sorted(pts, key=lambda p: p.speedup)
    ax.plot(
        [1.0] + [p.speedup for p in pts],
        [0.0] + [p.worst_flip for p in pts],
        color="#2ca02c",
        lw=1.2,
        ls="--",
        marker="o",
        ms=3,
        label=f"base at fewer steps (of {fewer.full})",
    )
    for p in pts:
        ax.annotate(
            str(p.steps),
            (p.speedup, p.worst_flip),
            textcoords="offset points",
            xytext=(3, -9),
            fontsize=6,
            color="#2ca02c",
        )


def pareto(rows: list) -> list:
    """The rows no other row beats on both speed-up (higher) and worst FLIP (lower)."""
    return [
        r
        for r in rows
        if not any(
            o.speedup >= r.speedup
            and o.worst_flip <= r.worst_flip
            and (o.speedup, o.worst_flip) != (r.speedup, r.worst_flip)
            for o in rows
        )
    ]
