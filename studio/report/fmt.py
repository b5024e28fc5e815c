"""Numbers and verdicts as people read them: one place for every format the card, tables and CLI print."""

from __future__ import annotations

import math

from studio.measure.crowding import HOST_SAID
from studio.measure.pace import CARD_SLACK
from studio.measure.quality import TILE, Verdict


def psnr(v: float | None, unit: str = " dB") -> str:
    if v is None:
        return "n/a"
    return "inf" if math.isinf(v) else f"{v:.2f}{unit}"


def db_short(v: float | None) -> str:
    """A PSNR in a table's cell: one decimal, `identical` for bitwise base, `-` when none."""
    return "-" if v is None else ("identical" if math.isinf(v) else f"{v:.1f}")


def flip_short(v: float | None) -> str:
    """A FLIP in a sentence or a cell: three decimals, or `not measured`."""
    return "not measured" if v is None else f"{v:.3f}"


def ssim(v: float | None) -> str:
    """A score in [0, 1] to four places: SSIM, FLIP's mean error (0: no visible difference), LPIPS (0: the same)."""
    return "n/a" if v is None else f"{v:.4f}"


flip = lpips = ssim


def flip_tile(v: float | None, yx) -> str:
    """The worst FLIP tile and where it is: "0.0850 at (y 8, x 16)"; just "0.0000" for an identical picture."""
    if v is None or yx is None or v == 0.0:
        return flip(v)
    return f"{flip(v)} at (y {yx[0]}, x {yx[1]})"


def speedup(v: float | None, digits: int = 2) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}x"


def ratio_ci(v: float | None, lo: float | None, hi: float | None, digits: int = 2, unit: str = "") -> str:
    """A ratio with its interval, as `1.74 (1.68-1.80)`; the point alone where there is no interval."""
    if v is None:
        return "n/a"
    out = f"{v:.{digits}f}{unit}"
    return out if lo is None or hi is None else f"{out} ({lo:.{digits}f}-{hi:.{digits}f})"


def speedup_ci(v: float | None, lo: float | None, hi: float | None, digits: int = 2) -> str:
    """A speed-up with its interval, as `1.74x (1.68-1.80)`; none for an exact ratio (base against itself)."""
    return ratio_ci(v, lo, hi, digits, "x")


def pairs(n: int, stop: str | None = None, stalled_runs: int = 0) -> str:
    """How many timed pairs a speed-up came from, why they stopped there, and whether a stall hit some runs."""
    out = f"{n} timed pair{'s' if n != 1 else ''}"
    out += f", stopped: {stop}" if stop else ""
    return out + (f"; {stalled(stalled_runs)}" if stalled_runs else "")


def stalled(n: int) -> str:
    """That a stall hit `n` timed runs (a step far over its run's median), in words."""
    return f"stalled: {n} run{'s' if n != 1 else ''} ran slow in places"


def host_slow(over: float | None) -> str:
    """Base slower than this machine's fastest for the request shape, in words ('' within the slack or unknown)."""
    if over is None or over <= CARD_SLACK:
        return ""
    return (
        f"host slow: base ran {over * 100:.0f}% over its fastest here (quiet within {CARD_SLACK * 100:.0f}%); "
        "a speed-up may read off while it is"
    )


def host_took(share: float | None) -> str:
    """The host's share of the cores while a speed-up was timed, in words ('' under HOST_SAID or not read)."""
    if share is None or share < HOST_SAID:
        return ""
    return (
        f"the host was slow: it took {share * 100:.0f}% of the cores' time while this was timed (a VM's steal, a "
        "container's waits for a CPU); a speed-up may read off while it is"
    )


def of_ideal(v: float | None, lo: float | None = None, hi: float | None = None) -> str:
    return "-" if v is None else ratio_ci(v, lo, hi)


def ideal_line(m) -> str:
    """What a cached run got of what its counts allow (`m` a RunMetrics with an ideal)."""
    if m.ideal.of_ideal_note:
        return m.ideal.of_ideal_note
    got = "n/a" if m.ideal.of_ideal is None else of_ideal(m.ideal.of_ideal, m.ideal.of_ideal_lo, m.ideal.of_ideal_hi)
    head = f"{got} of the ideal {m.ideal.ideal_speedup:.2f}x"
    return (
        f"{head}: a cached step priced at {m.ideal.cached_share:.2f} of a full one ({m.ideal.ideal_source}), "
        f"measured against {m.ideal.of_ideal_against}"
    )


def seconds(v: float | None, digits: int = 3) -> str:
    return "n/a" if v is None else f"{v:.{digits}f} s"


FLOOR_SHOWN = 1.10  # a wall time this far over its floor price is shown with it (stalls, load, step noise)


def denoise(wall: float | None, priced: float | None, digits: int = 3) -> str:
    """A denoise wall time, with its floor price beside it where well over it: a speed-up divides the floor, so a
    row's time and its speed-up must not seem to disagree."""
    out = seconds(wall, digits)
    if wall is not None and priced is not None and wall > FLOOR_SHOWN * priced:
        out += f" (floor {seconds(priced, digits)})"
    return out


def ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f} ms"


def size(n: int | None) -> str:
    if n is None:
        return "n/a"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def memory_line(peak: dict | None, h2d: dict | None = None) -> str:
    """The denoise loop's peak memory (measure.memory) and, under a streaming offload, the bytes copied per step."""
    if not peak:
        return "not read here"
    if peak.get("peak_bytes") is None:
        return f"n/a ({peak.get('note')})"
    out = f"{size(peak['peak_bytes'])} ({peak['kind']}"
    if peak.get("reserved_bytes") is not None:
        out += f"; {size(peak['reserved_bytes'])} reserved"
    out += ")" + (f"; {peak['note']}" if peak.get("note") else "")
    if h2d:
        out += f"; host-to-device per full step {size(h2d.get('h2d_bytes_per_full_step'))}"
        if h2d.get("h2d_bytes_per_cached_step") is not None:
            out += f", per cached step {size(h2d['h2d_bytes_per_cached_step'])}"
        if h2d.get("moved") is False:
            out += " (the CPU is both devices: nothing crossed a bus)"
    return out


def steps(cached: int, full: int) -> str:
    return f"{cached} cached / {full} full"


def pruned(blocks: int, calls: int | None) -> str:
    """DBPrune's own count: "pruned 120 of 560 block calls (21%), by cache-dit's count"."""
    share = f" ({blocks / calls:.0%})" if calls else ""
    return f"pruned {blocks} of {calls if calls else '?'} block calls{share}, by cache-dit's count"


def tile(db: float | None, yx) -> str:
    """The worst tile's PSNR and where it is: "36.55 dB at (y 0, x 40)"; just "inf" for an identical picture."""
    if db is None or yx is None or math.isinf(db):
        return psnr(db)
    return f"{psnr(db)} at (y {yx[0]}, x {yx[1]})"


COMPARE_INFO = (
    "on: base timed beside the run, PSNR against this request's base picture; auto: about one image a click, the "
    "speed-up against a kept base timing of the same shape (PSNR where this request's base picture is kept); off: "
    "the stack alone"
)
AB_TILE_NOTE = "The table's worst tile is each stack's against base."  # under A/B's map of B against A


def error_map_note(scale: int, where: str, image: str = "image", base: str = "base") -> str:
    """The caption of an error map (`where` it is, as the UI lays it out): what it shows, with its scale. A caption,
    not the picture's label: a label lies over the picture's top and would hide a frame on a top-row tile."""
    return (
        f"{where}: the error map |{image} − {base}| per pixel (the largest channel error) ×{scale}, saturating at "
        f"255: black is no change, white an error of {math.ceil(255 / scale)} or more of 255 levels. The red frame "
        f"marks the worst {TILE}x{TILE} tile."
    )


def flip_map_note(where: str, image: str = "image", base: str = "base") -> str:
    """The caption of a FLIP error map, as error_map_note's."""
    return (
        f"{where}: FLIP's error map of {image} against {base} (NVIDIA FLIP, in its magma colour map): black is no "
        f"visible difference, through purple and orange to pale yellow at the most. The cyan frame marks the worst "
        f"{TILE}x{TILE} tile by FLIP."
    )


def verdict_level(v: Verdict | str) -> str:
    """ok | warn | broken: how loudly a verdict is shown."""
    v = Verdict(v)
    if v is Verdict.BROKEN:
        return "broken"
    return "ok" if v in (Verdict.IDENTICAL, Verdict.GOOD) else "warn"


def stack(tag: str, label_changes) -> str:
    """A run's label, with the parts that did not run as asked: `bf16+...+sdpa+compile (sage->sdpa)`."""
    return f"{tag} ({', '.join(label_changes)})" if label_changes else tag


def summary_line(m) -> str:
    """One line for a run (the CLI's text output)."""
    t, c, q = m.timing, m.cache, m.quality
    vs = t.speedup_note or speedup_ci(t.speedup, t.speedup_lo, t.speedup_hi) + " vs base"
    return (
        f"{m.preset} [{stack(m.labels.tag, m.labels.label_changes)}] denoise {seconds(t.denoise_s)} "
        f"({t.mean_step_ms:.1f} ms/step), {steps(c.cached_steps, c.full_steps)}, {vs}, PSNR {psnr(q.psnr_db)}, "
        f"SSIM {ssim(q.ssim)} [{q.verdict}]"
    )


TRUE_CFG_INFO = (
    "1: off. Above 1 each step runs the transformer twice (the prompt and the negative prompt), so a step costs "
    "about twice as much; Qwen-Image's default is 4"
)


def batch_caption(pic: dict) -> str:
    """One picture of a batch: its seed, and its PSNR and verdict against the same batch's base picture."""
    if pic["psnr_db"] is None:
        return f"seed {pic['seed']}: {pic['quality']}"
    return f"seed {pic['seed']}: {psnr(pic['psnr_db'])}, {pic['quality']}"


def batch_line(batch: list[dict]) -> str:
    """A batch on the card, each picture against its own base picture."""
    each = " · ".join(batch_caption(p) for p in batch)
    return f"{len(batch)} pictures in one call ({each}); the numbers above are the batch's (worst picture's verdict)"


STRENGTH_INFO = (
    "how much of the schedule runs on the input picture: 0.5 of 28 steps runs the last 14 (cached/full steps count "
    "those); read only with an input picture, and not by an edit model (FLUX Kontext, Qwen-Image-Edit), which reads "
    "the picture as a reference and runs every step"
)


def on_this_machine(resolved: dict) -> str:
    """What a preset's device-dependent parts become here (engine.resolve.resolved), in one line:
    `on this machine: bfloat16 (auto: ...); int8_weight_only (auto: cpu with AVX512-VNNI, no AMX: ...)`."""

    def part(k, ran, why):  # a dtype's note names the dtype itself: "auto: bfloat16 (CPU has native bf16: ...)"
        if k == "dtype":
            return why or ran
        return f"{'attention ' if k == 'attention' else ''}{ran} ({why})"

    return "on this machine: " + "; ".join(part(k, ran, why) for k, (ran, why) in resolved.items())
