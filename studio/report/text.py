"""The bench, sweep, tune and doctor as text: what `python -m studio` prints and the Tune tab shows. studio.bench's
records are read by field name: bench imports report, never the other way."""

from __future__ import annotations

import math

from studio.report import fmt
from studio.report.fewer import fewer_line, fewer_steps_markdown

COST_COLUMNS = ("preset", "cold compile", "graphs", "recompiles seen", "saving vs eager twin", "pays off after")
SWEEP_COLUMNS = ("vs base", "worst PSNR", "mean PSNR", "cached (by prompt)", "of ideal")  # after the knob's own
DOCTOR_COLUMNS = (
    "family",
    "preset",
    "stack",
    "cached/full",
    "cache's own list",
    "counts",
    "PSNR",
    "verdict",
    "fell back",
)


def _table(columns, rows: list[list[str]]) -> list[str]:
    head = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return head + ["| " + " | ".join(cells) + " |" for cells in rows]


def _count(v: int | None) -> str:
    return "n/a" if v is None else str(v)


# bench ---------------------------------------------------------------------------------------------------------------
def _rounds(m: dict) -> str:
    """How many round-robin rounds ran: the repeats asked for, and any extra ones a withheld speed-up asked for."""
    asked, ran = m["repeats"], m.get("rounds") or [m["repeats"]]
    if max(ran) == asked:
        return f"{asked} round-robin repeat{'s' if asked != 1 else ''}"
    spans = f"{min(ran)}-{max(ran)}" if min(ran) != max(ran) else f"{max(ran)}"
    return (
        f"{spans} round-robin rounds ({asked} asked; more while a speed-up's interval held 1.00 or was too wide: "
        f"{'; '.join(sorted(set(m.get('rounds_stop') or [])))})"
    )


def bench_header(rep) -> str:
    """The settings a bench table was taken under (a BenchReport's `meta`): model, prompt(s), request, versions."""
    m, r, v = rep.meta, rep.meta["request"], rep.meta["versions"]
    prompts = f"{len(m['prompts'])} prompts" if len(m["prompts"]) > 1 else f"prompt {m['prompts'][0]!r}"
    return (
        f"model {m['model']}, {prompts}, seed {r['seed']}, {r['steps']} steps, {r['width']}x{r['height']}, "
        f"device {m['device']}, dtype {m['dtype']}; median of {_rounds(m)} after each stack's "
        f"warm-up; torch {v.get('torch')}, diffusers {v.get('diffusers')}, cache-dit "
        f"{v.get('cache-dit')}, torchao {v.get('torchao')}"
    )


def noise_lines(noise) -> list[str]:
    """A NoiseFloor as lines: base against itself, each preset's run-to-run spread, compile against its eager twin."""
    aa, lo, hi = noise.base_vs_itself, noise.base_vs_itself_lo, noise.base_vs_itself_hi
    off = max(abs(v - 1) for v in (aa, lo, hi) if v is not None)
    out = [
        f"base against itself (same stack, same rotation): {fmt.ratio_ci(aa, lo, hi, 3, 'x')}; a speed-up within "
        f"{off * 100:.1f}% of 1.00 is noise",
        "run-to-run spread (max-min)/median: " + ", ".join(f"{k} {v * 100:.0f}%" for k, v in noise.spread.items()),
    ]
    pp = noise.plain_vs_plain
    if pp is not None:
        lo, hi = noise.plain_vs_plain_lo, noise.plain_vs_plain_hi
        off = max(abs(v - 1) for v in (pp, lo, hi) if v is not None)
        out.append(
            f"plain base against a second plain process of it (same recipe, same rounds): "
            f"{fmt.ratio_ci(pp, lo, hi, 3, 'x')}; a studio/raw within {off * 100:.1f}% of 1.00 is two processes' noise"
        )
    if noise.compile_vs_eager_db:
        out.append(
            "compile vs eager, same stack, PSNR: "
            + ", ".join(f"{k} {fmt.psnr(v)}" for k, v in noise.compile_vs_eager_db.items())
        )
    return out


def raw_verdict(rows, noise) -> str | None:
    """Each row's studio/raw within two plain processes' noise, or how far outside it; None without --vs-raw."""
    pp = noise.plain_vs_plain
    if pp is None:
        return None
    off = max(abs(v - 1) for v in (pp, noise.plain_vs_plain_lo, noise.plain_vs_plain_hi) if v is not None)
    cells = []
    for r in rows:
        if r.studio_over_raw is None:
            continue
        lo, hi = r.studio_over_raw_lo or r.studio_over_raw, r.studio_over_raw_hi or r.studio_over_raw
        outside = max(0.0, lo - (1 + off), (1 - off) - hi)  # how far its interval sits outside 1.00 +- the noise
        said = "within the noise" if outside == 0 else f"{outside * 100:.1f}% outside it"
        cells.append(f"{r.preset} {r.studio_over_raw:.3f} {said}")
    if not cells:
        return None
    return f"studio/raw against two plain processes' noise (1.00 ±{off * 100:.1f}%): " + "; ".join(cells)


def process_lines(rep) -> list[str]:
    """The compiled rows' process-to-process spread, read here (--processes N) or as this machine measured it."""
    compiled = list(rep.twins)
    if not compiled:
        return []
    out = []
    if rep.processes:
        cells = []
        for g in rep.processes:
            each = " / ".join(
                fmt.speedup_ci(p, lo, hi) if p is not None else f"none ({note})"
                for p, lo, hi, note in zip(g.points, g.los, g.his, g.notes)
            )
            apart = "not two readings to compare" if g.apart is None else f"{g.apart * 100:.1f}% apart"
            cells.append(f"{g.preset} {each}, {apart}")
        out.append(
            f"compiled rows in {len(rep.processes[0].points)} processes (a fresh worker each): " + "; ".join(cells)
        )
    seen = rep.process_spread
    if seen is None:
        names = ",".join(["base"] + compiled)
        out.append(
            "compiled rows: a compiled stack's speed differs from process to process, and this machine has not "
            f"measured by how much (`python -m lab processes --presets {names}` measures it)"
        )
    else:
        busy = "" if seen.quiet else ", measured while the machine was busy"
        out.append(
            f"compiled rows: processes on this machine read a compiled stack up to {seen.apart * 100:.1f}% apart "
            f"(the largest of {seen.measurements}{busy}: `{seen.command}`, {seen.date}); two benches' compiled rows "
            "within that agree as well as two processes can"
        )
    return out


def pace_line(p) -> str:
    """A bench's base floor against the fastest this machine has run it (studio.measure.pace), in words."""
    out = f"pace: base's floor {p.floor_ms:.2f} ms a step"
    if p.best_ms is None:
        out += "; the first bench of this request on this machine, no record to compare it with"
    else:
        runs = f"{p.best_ms:.2f} ms, over {p.seen} earlier bench{'es' if p.seen != 1 else ''}"
        out += f", {p.over * 100:+.0f}% against the fastest this machine has run it ({runs})"
    if p.quiet is False:
        out += (
            f": the machine was BUSY ({'; '.join(p.why_busy())}); speed-ups here may read off (a busy host slows a "
            "cache's small steps and full ones unevenly, mostly the small) and differ from a quiet run's: run again "
            "when it is quiet"
        )
    elif p.quiet:
        out += ": a quiet machine"
    out += f" (record: {p.where})"
    return out + (f"; {p.note}" if p.note else "")


def cost_cells(c) -> list[str]:
    """A CostRow's cells; a graph count the run could not read is n/a, never 0."""
    if c.payoff_images is None:  # no cold run of its own was timed: its compile was paid before (shared blocks)
        pay = "n/a (no cold compile of its own)"
    else:
        pay = "never (no saving)" if math.isinf(c.payoff_images) else f"{math.ceil(c.payoff_images)} images"
    saving = "-" if c.saving_s is None else f"{c.saving_s * 1e3:.1f} ms/image"
    cold = "-" if c.compile_s is None else fmt.seconds(c.compile_s, 1)
    return [c.preset, cold, _count(c.graphs), _count(c.recompiles), saving, pay]


def _figures(p) -> str:
    sp = fmt.speedup_ci(p.speedup, p.speedup_lo, p.speedup_hi) if p.speedup is not None else "withheld"
    return f"{sp}, {fmt.psnr(p.psnr_db)}, FLIP {fmt.flip(p.flip)}" + (" ✓" if p.win else "")


def _floor(p) -> str:
    return f"PSNR >= {p.floor_db:g} dB" + (f" and FLIP <= {p.max_flip:g}" if p.max_flip is not None else "")


def paired_markdown(paired: list) -> str:
    """Each stack's wins as N of N, its slowest and worst request by name, then every request's figures ('': none)."""
    if not paired:
        return ""
    first, n = paired[0], len(paired[0].prompts)
    head = (
        f"Paired over {n} requests, each stack against each request's own base (one estimator: "
        f"studio.measure.estimate). A win (✓): faster, the whole interval above 1.00x against base and against base's "
        f"second run in the same rounds, and {_floor(first)}."
    )
    cols = ("stack", "wins", "slowest", "worst (lowest PSNR)") + tuple(f"#{i + 1}" for i in range(n))
    rows = [
        [
            p.preset,
            f"{p.wins}/{len(p.prompts)}",
            f"{p.slowest.label!r}: {fmt.speedup(p.slowest.speedup) if p.slowest.speedup else 'withheld'}",
            f"{p.worst.label!r}: {fmt.psnr(p.worst.psnr_db)}, FLIP {fmt.flip(p.worst.flip)}",
        ]
        + [_figures(f) for f in p.prompts]
        for p in paired
    ]
    legend = [f"- #{i + 1}: {f.label!r}" for i, f in enumerate(first.prompts)]
    return "\n".join([head, ""] + _table(cols, rows) + [""] + legend)


def bench_markdown(rep) -> str:
    """A BenchReport: the stack table, its noise floor, then paired figures, compile's cost and fewer steps if any."""
    noise = [pace_line(p) for p in rep.pace] + noise_lines(rep.noise)
    raw = raw_verdict(rep.matrix.rows, rep.noise)
    noise += [raw] if raw else []
    host = fmt.host_took(rep.meta.get("cores_host"))  # a VM's steal, a container's waits (measure.crowding)
    noise += [host] if host else []
    noise += process_lines(rep)
    parts = [rep.matrix.markdown(), "", "Noise floor:"] + [f"- {x}" for x in noise]
    if rep.paired:
        parts += ["", paired_markdown(rep.paired)]
    if rep.cost:
        parts += ["", "Compile cost:", ""] + _table(COST_COLUMNS, [cost_cells(c) for c in rep.cost])
    if rep.fewer is not None:
        parts += ["", *fewer_steps_markdown(rep.fewer)]
    if rep.crashed:
        parts += ["", "Crashed (no row):"] + [
            f"- {name}: the run crashed its process ({how}); the bench ran again without it"
            for name, how in rep.crashed.items()
        ]
    return "\n".join(parts)


# sweep ---------------------------------------------------------------------------------------------------------------
def cliff_line(knob: str, cliff: tuple | None) -> str:
    """Where worst PSNR drops the most ('' without a drop); `cliff` is (value, drop in dB)."""
    if not cliff:
        return ""
    return f"Cliff: at {knob}={cliff[0]} worst PSNR drops {cliff[1]:.1f} dB from the value before."


def sweep_markdown(res) -> str:
    """A SweepResult: one row per value of the knob (the cliff's marked), then the cliff line."""
    cells = []
    for v, r in zip(res.values, res.rows()):
        mark = " **cliff**" if res.cliff and res.cliff[0] == v else ""
        cells.append(
            [
                f"{v}{mark}",
                fmt.speedup_ci(r.speedup, r.speedup_lo, r.speedup_hi),
                fmt.psnr(r.worst_psnr_db),
                fmt.psnr(r.mean_psnr_db),
                ",".join(map(str, r.cached_by_prompt)),
                "-" if r.of_ideal is None else f"{r.of_ideal:.2f}",
            ]
        )
    lines = _table((res.knob,) + SWEEP_COLUMNS, cells)
    cliff = cliff_line(res.knob, res.cliff)
    return "\n".join(lines + (["", cliff] if cliff else []))


# tune ----------------------------------------------------------------------------------------------------------------
def tune_summary(res, *, written: str | None = None, markdown: bool = False) -> str:
    """A TuneResult in one sentence (its paired figures a line per prompt after it). `written`: where the preset was
    saved; `markdown`: for the Tune tab (plain text otherwise: the CLI prints it as YAML comments)."""
    b, c = ("**", "`") if markdown else ("", "")
    n = len(res.prompts)
    sp = fmt.speedup_ci(res.speedup, res.speedup_lo, res.speedup_hi)
    flip = ""
    if getattr(res, "max_flip", None) is not None:
        flip = f", worst FLIP {b}{fmt.flip(res.worst_flip)}{b} (ceiling {res.max_flip:g})"
    out = (
        f"{b}{res.preset.name}{b} ({c}{res.preset.tag()}{c}): worst PSNR {b}{fmt.psnr(res.worst_db)}{b} over "
        f"{n} prompt{'' if n == 1 else 's'}{_held_out(res)} (floor {res.floor_db:g}){flip}, {b}{sp}{b} vs base, "
        f"{fmt.speedup(res.vs_cache)} the {c}cache{c} preset's; {res.runs} runs ({res.screened} screening, "
        f"{res.timed} timed)" + (f"; written to {written}" if written else "")
    )
    busy = [pace_line(p) for p in getattr(res, "pace", []) if p.quiet is False]  # its figures may read off: said
    fewer = fewer_line(getattr(res, "fewer", None), getattr(res, "vs_fewer", None), res.preset)
    lines = paired_lines(getattr(res, "paired", None)) + busy + finalist_lines(getattr(res, "finalists", [])) + fewer
    return out + "".join("\n" + line for line in lines)


def _held_out(res) -> str:
    """The words ", held out (searched on N others)" where the search saw none of the timed prompts."""
    search = getattr(res, "search_prompts", None) or res.prompts
    return "" if set(search) & set(res.prompts) else f", held out (searched on {len(search)} others)"


def finalist_lines(finalists: list) -> list[str]:
    """The finalists as timed side by side (studio.bench.records.Finalist), fastest first: the frontier the tuner
    picked from, the winner marked."""
    if len(finalists) < 2:
        return []
    out = [f"the {len(finalists)} finalists, timed side by side (speed-up vs base, worst PSNR):"]
    for f in sorted(finalists, key=lambda f: -(f.speedup or 0)):
        sp = fmt.speedup_ci(f.speedup, f.speedup_lo, f.speedup_hi) if f.speedup is not None else "withheld"
        mark = " <- picked" if f.won else ""
        out.append(f"  {f.preset} ({f.label}): {sp}, {fmt.psnr(f.worst_psnr_db)}{mark}")
    return out


def paired_lines(d: dict | None) -> list[str]:
    """A stack's paired figures (studio.bench.paired.Paired.as_dict) as lines: wins, then each prompt's."""
    if not d:
        return []
    worst = min((p["speedup"] for p in d["prompts"] if p["speedup"] is not None), default=None)
    head = (
        f"paired over {d['of']} prompts, each against its own base: {d['wins']}/{d['of']} wins, worst case "
        f"{fmt.speedup(worst)} ({d['slowest']!r}), lowest PSNR on {d['worst']!r}"
    )
    rows = []
    for p in d["prompts"]:
        sp = fmt.speedup_ci(p["speedup"], p["speedup_lo"], p["speedup_hi"]) if p["speedup"] is not None else "withheld"
        rows.append(f"  {p['label']!r}: {sp}, {fmt.psnr(p['psnr_db'])}, FLIP {fmt.flip(p['flip'])}")
    return [head] + rows


def tuned_description(
    floor_db: float,
    prompts: int,
    *,
    worst_db,
    speedup,
    vs_cache,
    on: str,
    interval=(None, None),
    max_flip=None,
    worst_flip=None,
    worst_paired=None,
) -> str:
    """The tuned preset's description: how it was found and what it measured (`on`: device and dtype)."""
    ceiling = f" --max-flip {max_flip:g}" if max_flip is not None else ""
    flip = f", worst FLIP {fmt.flip(worst_flip)}" if worst_flip is not None else ""
    worst = f", {fmt.speedup(worst_paired)} on its slowest prompt" if worst_paired is not None else ""
    return (
        f"Tuned by `python -m studio tune --min-psnr {floor_db:g}{ceiling}` on {prompts} prompts: worst PSNR "
        f"{fmt.psnr(worst_db)}{flip}, {fmt.speedup_ci(speedup, *interval)} vs base{worst} ({fmt.speedup(vs_cache)} "
        f"the cache preset's) on {on}."
    )


# doctor --------------------------------------------------------------------------------------------------------------
def doctor_header(device: str, threshold: float) -> str:
    """What the doctor ran on; `threshold`: the residual threshold its cached presets ran at."""
    return (
        f"device {device}; tiny random-weight instances, 64x64; cached presets at R={threshold} "
        "(random weights do not cache at 0.24)"
    )


def doctor_cells(r) -> list[str]:
    agree = {True: "agree", False: "DISAGREE", None: "-"}[r.counts_agree]
    own = "-" if r.backend_cached_steps is None else str(r.backend_cached_steps)
    return [
        r.family,
        r.preset,
        r.tag,
        f"{r.cached_steps}/{r.full_steps}",
        own,
        agree,
        fmt.psnr(r.psnr_db),
        str(r.quality),
        "; ".join(r.fallbacks),
    ]


def doctor_table(rows) -> str:
    return "\n".join(_table(DOCTOR_COLUMNS, [doctor_cells(r) for r in rows]))


def doctor_verdict(ok: bool) -> str:
    """The doctor's last line (`ok`: studio.bench.doctor.healthy)."""
    if ok:
        return "healthy: counts agree with the cache's own lists, nothing broken"
    return "NOT healthy: see DISAGREE rows"


def ideal_worked(m) -> str:
    """The ideal speed-up of one cached run worked through with its own numbers (`m` a RunMetrics)."""
    c = m.ideal
    d = c.ideal_detail
    if not d:
        return "ideal: none (nothing was cached, or the blocks' times are unknown)"
    blocks = ", ".join(f"{t:.2f}" for t in d["block_ms"])
    skipped = [i for i in range(len(d["block_ms"])) if i not in d["computed"]]
    sk = " + ".join(f"{d['block_ms'][i]:.2f}" for i in skipped)
    full, cached = m.cache.full_steps, m.cache.cached_steps
    steps = full + cached
    ideal_cached = d["full_step_ms"] - d["skipped_ms"]
    lines = [
        f"ideal, worked through ({d['source']}):",
        f"  block times, median ms per call, in order: [{blocks}]",
        f"  a cached step runs blocks {list(d['computed'])} and skips {skipped}: {d['calls']} call(s) x ({sk}) "
        f"= {d['skipped_ms']:.2f} ms skipped",
        f"  full step (median) {d['full_step_ms']:.2f} ms -> ideal cached step {d['full_step_ms']:.2f} - "
        f"{d['skipped_ms']:.2f} = {ideal_cached:.2f} ms = {d['share']:.3f} of a full step",
        f"  {full} full + {cached} cached of {steps}: ideal {steps} / ({full} + {cached} x {d['share']:.3f}) = "
        f"{c.ideal_speedup:.3f}x",
    ]
    if c.of_ideal is not None:
        vs = c.of_ideal * c.ideal_speedup  # the measured speed-up over its reference
        lines.append(
            f"  measured {vs:.3f}x against {c.of_ideal_against}: of ideal {vs:.3f} / {c.ideal_speedup:.3f} = "
            f"{c.of_ideal:.3f}"
        )
    else:
        lines.append(
            f"  of ideal: not shown "
            f"({m.timing.speedup_note or 'no reliable reading against ' + str(c.of_ideal_against)})"
        )
    return "\n".join(lines)
