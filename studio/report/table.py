"""Tables of runs: one row per preset (the matrix, A/B, history), as Markdown, CSV and JSON."""

from __future__ import annotations

import csv
import io
from dataclasses import asdict, dataclass, field, fields

from studio.measure.quality import TILE
from studio.report import fmt
from studio.report.fewer import versus_fewer
from studio.spec.request import GenerationRequest

# The shape people publish first (stack | denoise | per-step | vs base | PSNR | cached/full), then the rest.
AGAIN = "base (again)"  # base timed a second time, last in each round: base against itself is the noise floor
COLUMNS = (
    "stack",
    "denoise",
    "per-step",
    "vs base",
    "PSNR",
    "cached/full",
    "of ideal",
    "SSIM",
    "quality",
    "preset",
    "notes",
)
CORE = 7  # the columns before a bench's extras
# Columns a bench adds where it has them, after "of ideal": (heading, MatrixRow field, format)
OPTIONAL = (
    ("FLIP", "flip", fmt.flip),
    ("worst PSNR", "worst_psnr_db", fmt.psnr),
    ("worst FLIP", "worst_flip", fmt.flip),
    ("LPIPS", "lpips", fmt.lpips),
    ("studio/raw", "studio_over_raw_ci", lambda v: fmt.ratio_ci(*v, digits=3)),
    ("peak memory", "peak_mem_bytes", fmt.size),
    ("H2D/full step", "h2d_full_bytes", fmt.size),
    ("H2D/cached step", "h2d_cached_bytes", fmt.size),
    ("vs base at fewer steps", "vs_fewer", versus_fewer),
)
# The A/B table's extra column: where the damage is, beside the global PSNR (MatrixRow.worst_tile: (dB, (y, x)))
AB_OPTIONAL = ((f"worst {TILE}x{TILE} tile", "worst_tile", lambda t: fmt.tile(*t)), ("FLIP", "flip", fmt.flip))
OVER_PROMPTS = ("worst_psnr_db", "worst_flip")  # shown only over several prompts (one prompt: the row's own)
AB_AT = 6  # beside PSNR and the counts, before `of ideal`
AB_COLUMNS = COLUMNS[:AB_AT] + tuple(c[0] for c in AB_OPTIONAL) + COLUMNS[AB_AT:]


@dataclass
class MatrixRow:
    preset: str
    tag: str
    denoise_s: float
    step_ms: float
    speedup: float | None
    psnr_db: float | None
    ssim: float | None
    cached_steps: int
    full_steps: int
    quality: str
    fallbacks: list[str] = field(default_factory=list)
    label_changes: list[str] = field(default_factory=list)  # parts of the stack that did not run as asked
    requested_tag: str = ""  # the label of what the preset asked for
    runs: list[float] = field(default_factory=list)  # every timed denoise, seconds
    priced_s: float | None = None  # its floor price, what the speed-up divides (RunMetrics.denoise_priced_s)
    # a bench's extras (None where it did not measure them)
    speedup_lo: float | None = None  # the speed-up's interval (studio.measure.estimate)
    speedup_hi: float | None = None
    timed_pairs: int = 0  # the pairs it came from
    speedup_note: str | None = None  # why there is no speed-up (its interval is useless, a measurement error)
    ideal_speedup: float | None = None  # what the counts give were the cache's own work free (studio.measure.blocks)
    of_ideal: float | None = None  # speed-up over the non-cache reference / ideal: what the cache's machinery costs
    of_ideal_against: str | None = None  # that reference: base, the non-cache twin, or the run's own full steps
    of_ideal_lo: float | None = None  # its interval
    of_ideal_hi: float | None = None
    mean_psnr_db: float | None = None  # over prompts
    worst_psnr_db: float | None = None  # over prompts
    flip: float | None = None  # FLIP's mean error against base (studio.measure.quality); over prompts, their mean
    worst_flip: float | None = None  # over prompts: the highest
    lpips: float | None = None  # LPIPS against base where its weights are present (studio.measure.lpips); the mean
    prompts: int = 1
    cached_by_prompt: list[int] = field(default_factory=list)
    compile_s: float | None = None  # the cold run that compiled
    studio_over_raw: float | None = None  # studio denoise / plain diffusers (+ cache-dit) denoise, same request
    studio_over_raw_lo: float | None = None  # its interval (the same estimator, over whole runs)
    studio_over_raw_hi: float | None = None
    raw_denoise_s: float | None = None
    raw_psnr_db: float | None = None  # studio image against the plain run's image
    worst_tile_psnr_db: float | None = None  # the worst 8x8 tile's PSNR against base (one run: A/B, history)
    worst_tile_yx: list[int] | None = None  # its top-left pixel
    peak_mem_bytes: int | None = None  # the denoise loop's peak: CUDA allocated or the CPU's peak RSS (measure.memory)
    peak_mem_kind: str | None = None
    h2d_full_bytes: int | None = None  # under a streaming offload: bytes copied host-to-device per full step
    h2d_cached_bytes: int | None = None  # ... and per cached step
    vs_fewer: object = None  # studio.bench.fewer.Versus: against base at the step count of its speed-up

    @property
    def studio_over_raw_ci(self) -> tuple | None:
        if self.studio_over_raw is None:
            return None
        return (self.studio_over_raw, self.studio_over_raw_lo, self.studio_over_raw_hi)

    @property
    def floor_db(self) -> float | None:
        """What a floor is read against: the worst PSNR over the prompts, or the one prompt's."""
        return self.worst_psnr_db if self.worst_psnr_db is not None else self.psnr_db

    @property
    def ceiling_flip(self) -> float | None:
        """What a FLIP ceiling is read against: the highest over the prompts, or the one prompt's."""
        return self.worst_flip if self.worst_flip is not None else self.flip

    @property
    def worst_tile(self) -> tuple | None:
        return None if self.worst_tile_psnr_db is None else (self.worst_tile_psnr_db, self.worst_tile_yx)

    def cells(self, optional: tuple = (), at: int = CORE) -> list[str]:
        extra = [("-" if getattr(self, f) is None else show(getattr(self, f))) for _, f, show in optional]
        return self._cells()[:at] + extra + self._cells()[at:]

    def ab_cells(self) -> list[str]:
        return self.cells(AB_OPTIONAL, at=AB_AT)

    def _cells(self) -> list[str]:
        return [
            fmt.stack(self.tag, self.label_changes),
            fmt.denoise(self.denoise_s, self.priced_s),
            fmt.ms(self.step_ms),
            fmt.speedup_ci(self.speedup, self.speedup_lo, self.speedup_hi),
            fmt.psnr(self.psnr_db),
            f"{self.cached_steps}/{self.full_steps}",
            fmt.of_ideal(self.of_ideal, self.of_ideal_lo, self.of_ideal_hi),
            fmt.ssim(self.ssim),
            str(self.quality),
            self.preset,
            "; ".join(([self.speedup_note] if self.speedup_note else []) + self.fallbacks),
        ]

    @classmethod
    def from_metrics(cls, m, runs: list[float] | None = None) -> "MatrixRow":
        """A row for one run (A/B compare, history): its own denoise time and speed-up against base."""
        return cls(
            preset=m.preset,
            tag=m.labels.tag,
            denoise_s=m.timing.denoise_s,
            priced_s=m.timing.denoise_priced_s,
            step_ms=m.timing.mean_step_ms,
            speedup=m.timing.speedup,
            psnr_db=m.quality.psnr_db,
            ssim=m.quality.ssim,
            cached_steps=m.cache.cached_steps,
            full_steps=m.cache.full_steps,
            quality=str(m.quality.verdict),
            fallbacks=list(m.labels.fallbacks),
            label_changes=list(m.labels.label_changes),
            requested_tag=m.labels.requested_tag,
            runs=list(runs or [m.timing.denoise_s]),
            speedup_lo=m.timing.speedup_lo,
            speedup_hi=m.timing.speedup_hi,
            timed_pairs=m.timing.timed_pairs,
            speedup_note=m.timing.speedup_note,
            ideal_speedup=m.ideal.ideal_speedup,
            of_ideal=m.ideal.of_ideal,
            of_ideal_lo=m.ideal.of_ideal_lo,
            of_ideal_hi=m.ideal.of_ideal_hi,
            of_ideal_against=m.ideal.of_ideal_against,
            worst_tile_psnr_db=m.quality.worst_tile_psnr_db,
            worst_tile_yx=m.quality.worst_tile_yx,
            flip=m.quality.flip,
            lpips=m.quality.lpips,
            peak_mem_bytes=(m.memory.peak_memory or {}).get("peak_bytes"),
            peak_mem_kind=(m.memory.peak_memory or {}).get("kind"),
            h2d_full_bytes=(m.memory.h2d or {}).get("h2d_bytes_per_full_step"),
            h2d_cached_bytes=(m.memory.h2d or {}).get("h2d_bytes_per_cached_step"),
        )

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Matrix:
    request: GenerationRequest
    model: str
    rows: list[MatrixRow]
    results: dict  # preset name -> its last RunResult (images for the UI)
    repeats: int
    paired: list = field(default_factory=list)  # over several prompts: each stack prompt by prompt (bench.paired)
    fewer: object = None  # studio.bench.fewer.FewerSteps: base at the step counts the cached rows were read against

    def optional(self) -> tuple:
        """The bench's extra columns that some row has a value for (the worst figures only over several prompts)."""
        return tuple(
            c
            for c in OPTIONAL
            if any(getattr(r, c[1]) is not None for r in self.rows) and (c[1] not in OVER_PROMPTS or self.prompts > 1)
        )

    @property
    def prompts(self) -> int:
        return max((r.prompts for r in self.rows), default=1)

    def columns(self) -> tuple:
        opt = self.optional()
        return COLUMNS[:CORE] + tuple(c[0] for c in opt) + COLUMNS[CORE:]

    def markdown(self) -> str:
        cols, opt = self.columns(), self.optional()
        lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(r.cells(opt)) + " |" for r in self.rows]
        note = self.noise_line()
        return "\n".join(lines + (["", note] if note else []))

    def noise_line(self) -> str:
        """How to read the speed-ups: the base-against-itself ratio as a noise floor ('' when not measured)."""
        again = next((r for r in self.rows if r.preset == AGAIN), None)
        if again is None or again.speedup is None:
            return ""
        aa = again.speedup
        pct = max(abs(aa - 1), abs((again.speedup_lo or aa) - 1), abs((again.speedup_hi or aa) - 1)) * 100
        return (
            f"Noise floor: `{AGAIN}` is base timed again at the end of each round; it reads "
            f"{fmt.speedup_ci(aa, again.speedup_lo, again.speedup_hi)} against base. On this run, read speed-ups "
            f"within {max(pct, 1):.0f}% of each other as equal."
        )

    def chart_preset(self) -> str:
        """The run the per-step chart opens on: the first stack that cached a step, else one with a cache engaged (its
        chart shows why nothing cached), else the first row after base, else base."""
        runs = [(r.preset, self.results[r.preset].metrics) for r in self.rows[1:] if r.preset in self.results]
        for wanted in (
            lambda name, m: m.cache.cached_steps > 0,
            lambda name, m: m.cache.cache_threshold is not None,
            lambda name, m: name != AGAIN,
        ):
            hit = next((name for name, m in runs if wanted(name, m)), None)
            if hit is not None:
                return hit
        return self.rows[0].preset

    def csv(self) -> str:
        """Every row with every number (not the formatted cells): one column per MatrixRow field."""
        buf = io.StringIO()
        names = [f.name for f in fields(MatrixRow)]
        w = csv.DictWriter(buf, fieldnames=names)
        w.writeheader()
        for r in self.rows:
            d = r.as_dict()
            w.writerow({k: (";".join(map(str, v)) if isinstance(v, list) else v) for k, v in d.items()})
        return buf.getvalue()
