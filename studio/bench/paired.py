"""Paired figures: each stack against each request's OWN base, request by request (a stack may be fast on one prompt
and break another). A WIN is faster (the whole interval above 1.00x against base AND base's second run: one slow base
slot makes a twin of base read 1.2x against one, never both) and above the floor (PSNR, and FLIP where given)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

from studio.bench.rotation import Rotation
from studio.engine import BASE
from studio.measure.estimate import shown
from studio.report.table import AGAIN


@dataclass(frozen=True)
class PromptFigures:
    """One stack on one request, against that request's own base."""

    label: str  # the prompt; with its seed where several seeds ran
    speedup: float | None  # None: withheld (its interval is useless; `note` says why)
    speedup_lo: float | None
    speedup_hi: float | None
    psnr_db: float | None
    flip: float | None
    cached_steps: int
    faster: bool  # the interval lies above 1.00x, against base and against base's second run
    vs_again: float | None  # the speed-up against base's second run (None: none timed), the second check
    above_floor: bool
    note: str | None = None

    @property
    def win(self) -> bool:
        return self.faster and self.above_floor


@dataclass
class Paired:
    """A stack's paired figures over the requests (module doc)."""

    preset: str
    prompts: list[PromptFigures] = field(default_factory=list)
    floor_db: float = 30.0
    max_flip: float | None = None

    @property
    def wins(self) -> int:
        return sum(p.win for p in self.prompts)

    @property
    def slowest(self) -> PromptFigures:
        """The request with the lowest speed-up (a withheld one counts as the lowest: nothing is known of it)."""
        return min(self.prompts, key=lambda p: -math.inf if p.speedup is None else p.speedup)

    @property
    def worst(self) -> PromptFigures:
        """The request with the lowest PSNR against its base, of equal ones the highest FLIP."""
        return min(self.prompts, key=lambda p: (_db(p.psnr_db), -(p.flip or 0.0)))

    @property
    def worst_speedup(self) -> float | None:
        """The worst case of the paired speed-ups (None when one is withheld): what the tuner selects on."""
        return self.slowest.speedup

    def as_dict(self) -> dict:
        return {
            "preset": self.preset,
            "wins": self.wins,
            "of": len(self.prompts),
            "floor_db": self.floor_db,
            "max_flip": self.max_flip,
            "slowest": self.slowest.label,
            "worst": self.worst.label,
            "prompts": [{**asdict(p), "win": p.win} for p in self.prompts],
        }


def _db(v: float | None) -> float:
    return -math.inf if v is None else v


def labels(rots: list[Rotation]) -> list[str]:
    """Each request's name: its prompt, with its seed where the requests ran more than one seed."""
    seeds = {rot.request.seed for rot in rots}
    return [rot.request.prompt + (f" (seed {rot.request.seed})" if len(seeds) > 1 else "") for rot in rots]


def _figures(
    rot: Rotation, name: str, label: str, floor_db: float, max_flip: float | None, crowded: str = ""
) -> PromptFigures:
    est = replace(rot.ratio(BASE, name), crowded=crowded)  # programs on the cores: withheld (measure.crowding)
    again = replace(rot.ratio(AGAIN, name), crowded=crowded) if AGAIN in rot.runs else None
    m = rot.last[name].metrics
    s = shown(est)
    above = m.quality.psnr_db is not None and m.quality.psnr_db >= floor_db
    if max_flip is not None:
        above = above and m.quality.flip is not None and m.quality.flip <= max_flip
    return PromptFigures(
        label,
        s.point,
        s.lo,
        s.hi,
        m.quality.psnr_db,
        m.quality.flip,
        m.cache.cached_steps,
        faster=s.lo is not None and s.lo > 1.0 and (again is None or (not again.useless and again.lo > 1.0)),
        vs_again=again.point if again is not None else None,
        above_floor=above,
        note=s.note,
    )


def paired(
    rots: list[Rotation], names: list[str], floor_db: float, max_flip: float | None = None, crowded: str = ""
) -> list[Paired]:
    """Each stack of `names` but base and AGAIN, request by request; a non-empty `crowded` withholds every speed-up."""
    tags = labels(rots)
    out = []
    for name in names:
        if name in (BASE, AGAIN):
            continue
        figs = [_figures(rot, name, tag, floor_db, max_flip, crowded) for rot, tag in zip(rots, tags)]
        out.append(Paired(name, figs, floor_db, max_flip))
    return out
