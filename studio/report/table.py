"""Tables of runs: one row per preset (the matrix, A/B, history), as Markdown, CSV and JSON."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, dataclass, field

from studio.report import fmt
from studio.spec.request import GenerationRequest

# The shape people publish first (stack | denoise | per-step | vs base | PSNR | cached/full), then the rest.
COLUMNS = ("stack", "denoise", "per-step", "vs base", "PSNR", "cached/full", "SSIM", "quality", "preset", "notes")


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
    runs: list[float] = field(default_factory=list)  # every timed denoise, seconds

    def cells(self) -> list[str]:
        return [
            self.tag,
            fmt.seconds(self.denoise_s),
            fmt.ms(self.step_ms),
            fmt.speedup(self.speedup),
            fmt.psnr(self.psnr_db),
            f"{self.cached_steps}/{self.full_steps}",
            fmt.ssim(self.ssim),
            str(self.quality),
            self.preset,
            "; ".join(self.fallbacks),
        ]

    @classmethod
    def from_metrics(cls, m, runs: list[float] | None = None) -> "MatrixRow":
        """A row for one run (A/B compare, history): its own denoise time and speed-up against base."""
        return cls(
            preset=m.preset,
            tag=m.tag,
            denoise_s=m.denoise_s,
            step_ms=m.mean_step_ms,
            speedup=m.speedup,
            psnr_db=m.psnr_db,
            ssim=m.ssim,
            cached_steps=m.cached_steps,
            full_steps=m.full_steps,
            quality=str(m.quality),
            fallbacks=list(m.fallbacks),
            runs=list(runs or [m.denoise_s]),
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

    def markdown(self) -> str:
        lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        lines += ["| " + " | ".join(r.cells()) + " |" for r in self.rows]
        return "\n".join(lines)

    def csv(self) -> str:
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(COLUMNS)
        for r in self.rows:
            w.writerow(r.cells())
        return buf.getvalue()

    def json(self) -> str:
        return json.dumps(
            {
                "model": self.model,
                "request": self.request.as_dict(),
                "repeats": self.repeats,
                "rows": [r.as_dict() for r in self.rows],
            },
            indent=1,
        )
