"""The soak's report in words (lab.soak.plan): what each visitor got, the honest wall times, memory and disk at
the start, after a warm-up, every tenth of the run and at the end, the requests lost or hung, and the targets with
whether each held."""

from __future__ import annotations

OUTCOMES = {
    "honest": ("served", "refused by its own limit", "refused by another visitor's limit", "refused", "lost", "hung"),
    "hostile": ("served within the limits", "refused with its sentence", "refused otherwise", "lost", "hung"),
}


def _by_kind(rep, who: str) -> list[str]:
    kinds = sorted({k for (w, k, _) in rep.counts if w == who})
    lines = []
    for kind in kinds:
        got = {o: n for (w, k, o), n in rep.counts.items() if w == who and k == kind}
        cells = ", ".join(f"{got[o]} {o}" for o in OUTCOMES[who] if got.get(o))
        lines.append(f"    {kind}: {cells}")
    return lines


def soak_text(rep) -> str:
    p = rep.plan
    out = [
        f"soak: {p.visitors} honest and {p.hostile} hostile visitors for {rep.minutes_run:.1f} min against {rep.url} "
        f"(public mode; {p.requests_per_minute} requests and {p.writes_per_minute} writes a minute per visitor; "
        f"steps <= {p.max_steps}, sides <= {p.max_side}; app log {rep.log})",
        f"  honest: {rep.total('honest')} requests, {rep.total('honest', 'served')} served",
        *_by_kind(rep, "honest"),
    ]
    if rep.honest_p50_s is not None:
        out.append(f"    wall time of a served request: p50 {rep.honest_p50_s:.2f} s, p95 {rep.honest_p95_s:.2f} s")
    out += [
        f"  hostile: {rep.total('hostile')} attempts, "
        f"{rep.total('hostile', 'refused with its sentence')} refused with their limit's sentence",
        *_by_kind(rep, "hostile"),
        "  memory and disk (MiB): app RSS, worker RSS, studio files, gradio cache, saved presets",
    ]
    for s in rep.snapshots:
        out.append(
            f"    {s.when:>14}: {s.app_rss_mb:8.0f} {s.worker_rss_mb:8.0f} {s.studio_files_mb:8.2f} "
            f"{s.gradio_cache_mb:8.2f} {s.presets_mb:8.3f}"
        )
    out.append(f"    resident memory after the warm-up grew {rep.rss_growth * 100:+.1f}%")
    for line in rep.lost[:20]:
        out.append(f"  LOST/HUNG {line}")
    for line in rep.wrong[:20]:
        out.append(f"  WRONG {line}")
    out.append("  targets:")
    out += [f"    [{'ok' if held else 'MISSED'}] {name}" for name, held in rep.targets().items()]
    return "\n".join(out)
