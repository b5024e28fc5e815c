"""The compact HTML card under an image: what the preset bought and what it cost."""

from __future__ import annotations

import html
import math

from studio.measure.estimate import interval_words
from studio.measure.quality import TILE, Verdict
from studio.report import fmt
from studio.report.fewer import against, standing

CSS = """
.metrics-card table {border-collapse: collapse; width: 100%; font-size: 0.92em}
.metrics-card td {padding: 3px 8px; border-bottom: 1px solid var(--border-color-primary)}
.metrics-card td:first-child {color: var(--body-text-color-subdued); white-space: nowrap}
.metrics-card td:last-child {overflow-wrap: anywhere}  /* a long link (LPIPS' how-to) wraps inside the card */
.flag-broken {color: #fff; background: #c62828; padding: 2px 8px; border-radius: 4px; font-weight: 600}
.flag-ok {color: #1b5e20; font-weight: 600}
.flag-warn {color: #a15c00}
.stack-lines {font-family: var(--font-mono); font-size: 0.85em; margin: 4px 0 0 0}
.fallback {color: #a15c00}
.card-answer {font-weight: 600; font-size: 1.05em; margin: 2px 0 6px 0}
.metrics-card details summary {cursor: pointer; color: var(--body-text-color-subdued); margin-top: 4px}
"""


def verdict_flag(quality, why: str = "") -> str:
    level = fmt.verdict_level(quality)
    text = html.escape(str(quality) + (f" ({why})" if why else ""))
    return f'<span class="flag-{level}">{"⚠ " if level == "broken" else ""}{text}</span>'


def broken_flag(rows) -> str:
    """The line above an A/B's pictures: the stacks among `rows` (MatrixRow) whose picture is noise, or nothing."""
    broken = [r.preset for r in rows if Verdict(r.quality) is Verdict.BROKEN]
    if not broken:
        return ""
    why = "PSNR and high-frequency energy say noise"
    return f"{html.escape(', '.join(broken))}: " + verdict_flag(Verdict.BROKEN, why)


def _lines(lines: list[str], css: str = "") -> str:
    body = "".join(f'<div class="{css}">{html.escape(line)}</div>' for line in lines)
    return f'<div class="stack-lines">{body}</div>'


def _uncompared(m) -> str:
    """Why a run has no PSNR: compare off, or compare auto without this request's base picture kept."""
    if m.timing.base_denoise_s is None:
        return "not compared (compare off)"
    return "not compared: this request's base picture is not kept yet (<b>Compare with base</b> computes it)"


def _stack(m) -> str:
    """What ran; where it differs from what the preset asked for, that too, and the parts that differ."""
    out = f"<code>{html.escape(m.labels.tag)}</code> ({html.escape(m.preset)})"
    if m.labels.label_changes:
        diff = html.escape(", ".join(m.labels.label_changes))
        out += f"<br><small>asked: <code>{html.escape(m.labels.requested_tag)}</code>; ran otherwise: {diff}</small>"
    return out


def _placement(p: dict) -> str:
    """Where each component lives, the weights held on the device between uses, and the free memory placed against."""
    out = "; ".join(f"{name}: {where}" for name, where in p["components"].items())
    out += f" ({fmt.size(p['device_bytes'])} on {p['device']} between uses"
    if p.get("free_bytes") is not None:
        out += f", placed against {fmt.size(p['free_bytes'])} free ({p['free_source']})"
        if p.get("logical"):
            out += "; one memory here: placed as on a card of that size"
    return out + ")"


def _room(m) -> str:
    """A step cache's room where it is little, and why an engaged cache cached nothing (once if both say the same)."""
    lines = [x for x in (m.room.cache_headroom, m.room.cache_idle) if x]
    if m.room.cache_headroom and m.room.cache_idle and m.room.cache_headroom in m.room.cache_idle:
        lines = [m.room.cache_idle]
    return _lines(lines, "fallback") if lines else ""


def _flip(m) -> str:
    """FLIP's mean error against base and its worst tile (studio.measure.quality)."""
    tile = fmt.flip_tile(m.quality.flip_worst_tile, m.quality.flip_worst_tile_yx)
    return (
        f"{fmt.flip(m.quality.flip)} &nbsp; <small>(0: no visible difference; worst {TILE}x{TILE} tile {tile})</small>"
    )


def _lpips(m) -> str:
    """LPIPS against base (studio.measure.lpips), or that its weights are not installed (docs/measuring.md: how)."""
    if m.quality.lpips is None:
        return "not installed (its weights: docs/measuring.md, LPIPS)"
    return f"{fmt.lpips(m.quality.lpips)} &nbsp; <small>(AlexNet v0.1; 0: the same picture)</small>"


def fewer_steps_cell(v: dict) -> str:
    """A cached run against base at the step count of its speed-up (RunQuality.vs_fewer), one line."""
    at = f"base at {v['steps']} of {v['full']} steps ({v['speedup']:.2f}x) keeps {fmt.psnr(v['psnr_db'])}"
    return against(v["margin_db"], at)


def flip_words(v: float | None) -> str:
    """FLIP's mean error in words: how a person flipping between the picture and base would see it."""
    if v is None:
        return "not measured"
    if v == 0.0:
        return "identical"
    return next(words for top, words in FLIP_WORDS if v < top)


# FLIP's mean error, read as what shows (NVIDIA FLIP: 0 none, 1 black against white). It is concave at small errors:
# one level of 255 in flat colour already reads 0.03 (docs/measuring.md); base at fewer steps keeping 35 dB on the
# embedded model read 0.06.
FLIP_WORDS = ((0.05, "hard to see"), (0.1, "seen flipping between the two"), (0.2, "visible"), (2.0, "different"))


def answer_line(m) -> str:
    """The card's first line, as text: what the run bought and what it cost, in one line."""
    t, c, q = m.timing, m.cache, m.quality
    if m.preset == "base" and not c.cached_steps:
        return f"base: the reference every stack is measured against · denoise {fmt.seconds(t.denoise_s)}"
    if t.speedup_note:  # its first clause here ("timing too noisy to show"), the whole of it in the vs base row
        parts = [f"speed-up withheld ({t.speedup_note.split(':')[0]})"]
    elif t.speedup is None:
        parts = ["not compared with base"]
    else:
        parts = [f"{fmt.speedup_ci(t.speedup, t.speedup_lo, t.speedup_hi)} vs base"]
    if q.psnr_db is not None:
        parts.append(f"PSNR {fmt.psnr(q.psnr_db)}")
    if q.flip is not None:
        parts.append(f"FLIP {fmt.flip(q.flip)} ({flip_words(q.flip)})")
    ran = c.cached_steps + c.full_steps
    asked = (m.request or {}).get("steps")
    share = f" ({ran} of {asked} steps)" if asked and ran != asked else ""  # a step_share, img2img's strength
    parts.append(f"{c.cached_steps} cached / {c.full_steps} full{share}")
    if q.vs_fewer:
        v = q.vs_fewer
        verdict = {"loses": "loses to"}.get(standing(v["margin_db"]), standing(v["margin_db"]))
        margin = "identical to base" if math.isinf(v["margin_db"]) else f"{v['margin_db']:+.1f} dB"
        parts.append(f"{verdict} base at {v['steps']} steps ({margin})")
    return " · ".join(parts)


def _speedup_cell(m) -> str:
    t, esc = m.timing, html.escape
    vs = esc(t.speedup_note) if t.speedup_note else fmt.speedup_ci(t.speedup, t.speedup_lo, t.speedup_hi)
    if t.base_denoise_s is not None:
        shown = t.timed_pairs and t.speedup is not None  # (a withheld one's sentence says its pairs)
        if shown:
            pairs = f", {esc(fmt.pairs(t.timed_pairs, t.pairs_stop, t.stalled_runs))}"
        else:  # a stall is a fact of the timing whether or not a number came of it
            pairs = f", {esc(fmt.stalled(t.stalled_runs))}" if t.stalled_runs else ""
        vs += f" (base {fmt.denoise(t.base_denoise_s, t.base_priced_s)}{pairs})"
    if t.speedup_lo is not None:  # the interval named by what it held (studio.measure.estimate), on hover
        vs = f'<span title="{esc(interval_words())}">{vs}</span>'
    if _host_notes(t):
        vs += "<br><small>the host was slow while this was timed (timing, below)</small>"
    return vs


def _timing_cell(m) -> str:
    """How the run was timed, and the host's slowness where it was read (a speed-up may read off while it is)."""
    t = m.timing
    return html.escape(t.how) + "".join(f"<br><small>{html.escape(n)}</small>" for n in _host_notes(t))


def _host_notes(t) -> list[str]:
    """The host's slowness while a shown speed-up was timed, in words (none where nothing was said or shown)."""
    if t.speedup is None:
        return []
    return [n for n in (fmt.host_slow(t.base_pace_over), fmt.host_took(t.cores_host)) if n]


def _steps_cell(m) -> str:
    c, esc = m.cache, html.escape
    steps = fmt.steps(c.cached_steps, c.full_steps)
    if c.cached_step_indices:
        steps += f" &nbsp; cached: {c.cached_step_indices}"
    if c.backend_cfg_cached_steps:
        steps += f"<br><small>unconditional (CFG) branch cached apart: {c.backend_cfg_cached_steps}</small>"
    if c.pruned_blocks is not None:
        steps += f"<br><small>{esc(fmt.pruned(c.pruned_blocks, c.block_calls))}</small>"
    steps += f"<br><small>counted by {esc(c.count_source)}" + (f"; {esc(c.count_check)}" if c.count_check else "")
    return steps + "</small>"


def _table(rows) -> str:
    return "<table>" + "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in rows) + "</table>"


def metrics_card(m) -> str:
    """`m` is a RunMetrics: the answer in one line, the figures behind it, then the rest folded."""
    esc, t, q = html.escape, m.timing, m.quality
    room = _room(m)
    main = [
        ("vs base", _speedup_cell(m)),
        ("PSNR / SSIM", f"{fmt.psnr(q.psnr_db)} / {fmt.ssim(q.ssim)}" if q.psnr_db is not None else _uncompared(m)),
        *([("FLIP", _flip(m))] if q.flip is not None else []),
        *([("vs fewer steps", esc(fewer_steps_cell(q.vs_fewer)))] if q.vs_fewer else []),
        ("quality", verdict_flag(q.verdict)),
        ("steps", _steps_cell(m)),
        *([("cache room", room)] if room else []),
        ("stack", _stack(m)),
        ("denoise", f"{fmt.denoise(t.denoise_s, t.denoise_priced_s)} &nbsp; ({t.mean_step_ms:.1f} ms/step)"),
        *([("batch", esc(fmt.batch_line(m.quality.batch)))] if m.quality.batch else []),
    ]
    more = [
        (f"worst {TILE}x{TILE} tile", fmt.tile(q.worst_tile_psnr_db, q.worst_tile_yx)),
        *([("LPIPS", _lpips(m))] if q.lpips is not None or q.lpips_note else []),
        *([("of ideal", esc(fmt.ideal_line(m)))] if m.ideal.ideal_speedup else []),
        ("timing", _timing_cell(m)),
    ]
    if t.compile_s is not None:
        more.append(("compile warm-up", f"{fmt.seconds(t.compile_s, 1)} (not in denoise time)"))
    elif t.warmup_s is not None:
        more.append(("warm-up run", f"{fmt.seconds(t.warmup_s, 2)} (not in denoise time)"))
    more.append(("engaged", _lines(m.labels.engaged)))
    if m.labels.fallbacks:
        main.append(("fell back", _lines(m.labels.fallbacks, "fallback")))  # what did not run as asked: in view
    more.append(("peak memory", esc(fmt.memory_line(m.memory.peak_memory, m.memory.h2d))))
    if m.placement.plan:
        more.append(("placement", esc(_placement(m.placement.plan))))
    more.append(("device", f"{esc(m.placement.device)}, {esc(m.labels.dtype)}"))
    answer = f'<div class="card-answer">{esc(answer_line(m))}</div>'
    folded = f"<details><summary>timing, what engaged, memory, placement</summary>{_table(more)}</details>"
    return f'<div class="metrics-card">{answer}{_table(main)}{folded}</div>'


def before_run_note(d: dict | None, unread: str = "") -> str:
    """The line under the preset picker: what the step cache can skip here, or `unread`: why the form is unreadable."""
    if d is None:
        return f"*Before the run: the form cannot run as it is ({unread})*" if unread else ""
    if not d["cache"]:
        return ""
    if d["warning"]:
        return f"⚠ **Before the run:** {d['warning']}."
    return (
        f"*Before the run: this cache can skip up to {d['skippable']} of {d['steps']} steps "
        f"(at most {d['at_most']:.2f}x over the same stack without it).*"
    )
