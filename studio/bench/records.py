"""What the tuner returns, as plain records: they cross the device worker's pipe to the app's process, which reads
them without loading the engine (so this module imports nothing of it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from studio.bench.fewer import FewerSteps, Versus
from studio.measure.pace import Pace
from studio.spec.preset import CacheSpec, Preset


@dataclass
class Candidate:
    cache: CacheSpec
    worst_db: float | None = None
    worst_flip: float | None = None  # the highest FLIP over the prompts screened
    passed: bool = False
    predicted: float = 1.0  # speed-up the counts predict
    cached: list[int] = field(default_factory=list)


@dataclass
class Finalist:
    """One finalist as timed beside the others: the frontier the tuner picked from."""

    preset: str
    label: str  # what ran (the bench row's tag)
    speedup: float | None
    speedup_lo: float | None
    speedup_hi: float | None
    worst_psnr_db: float | None
    worst_flip: float | None
    cached_steps: int
    full_steps: int
    won: bool = False

    @classmethod
    def of(cls, row, preset: Preset, won: bool) -> Finalist:
        """From its bench row (studio.report.table.MatrixRow)."""
        return cls(
            preset.name,
            row.tag,
            row.speedup,
            row.speedup_lo,
            row.speedup_hi,
            row.floor_db,
            row.ceiling_flip,
            row.cached_steps,
            row.full_steps,
            won,
        )


@dataclass
class TuneResult:
    preset: Preset
    floor_db: float
    worst_db: float | None
    speedup: float | None
    vs_cache: float | None  # tuned speed-up over the shipped `cache` preset's, same bench
    screened: int  # screening runs
    timed: int  # timed runs (the bench's)
    candidates: list[Candidate]
    non_cache: str
    curve: list[tuple[float, float, float | None]]  # (threshold, predicted speed-up, worst dB): the search's sweep
    prompts: list[str] = field(default_factory=list)  # the prompts the floor held on, timed
    search_prompts: list[str] = field(default_factory=list)  # the search's (the same, or others: held out)
    speedup_lo: float | None = None  # the speed-up's interval (studio.measure.estimate, over the prompts' pairs)
    speedup_hi: float | None = None
    max_flip: float | None = None  # the FLIP ceiling asked for (None: PSNR alone)
    worst_flip: float | None = None  # the result's highest FLIP over the prompts, timed
    paired: dict | None = None  # its figures prompt by prompt (studio.bench.paired.Paired.as_dict); None: one prompt
    pace: list[Pace] = field(default_factory=list)  # was the machine quiet while the finalists were timed?
    fewer: FewerSteps | None = None  # base at fewer steps on the same prompts (studio.bench.fewer)
    vs_fewer: Versus | None = None  # the result against base at the step count of its speed-up
    finalists: list[Finalist] = field(default_factory=list)  # every finalist as timed, the winner marked
    methods: list[dict] = field(default_factory=list)  # the other methods' searches (Searched.as_dict, `on`: the arms)

    @property
    def runs(self) -> int:
        return self.screened + self.timed

    def as_dict(self) -> dict:
        """The result as plain data (the CLI's --json, the Tune tab's JSON)."""
        return {
            "preset": self.preset.name,
            "floor_db": self.floor_db,
            "worst_psnr_db": self.worst_db,
            "speedup": self.speedup,
            "speedup_lo": self.speedup_lo,
            "speedup_hi": self.speedup_hi,
            "vs_cache": self.vs_cache,
            "max_flip": self.max_flip,
            "worst_flip": self.worst_flip,
            "paired": self.paired,
            "non_cache": self.non_cache,
            "screening_runs": self.screened,
            "timed_runs": self.timed,
            "pace": [p.as_dict() for p in self.pace],
            "runs": self.runs,
            "prompts": self.prompts,
            "search_prompts": self.search_prompts,
            "knobs": self.preset.as_dict(),
            "fewer_steps": self.fewer.as_dict() if self.fewer else None,
            "vs_fewer_steps": self.vs_fewer.as_dict() if self.vs_fewer else None,
            "finalists": [f.__dict__ for f in self.finalists],
            "methods": self.methods,
        }
