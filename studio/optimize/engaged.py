"""What one optimization step did: engaged as asked, or fell back, with the reason in words."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Engaged:
    feature: str  # quantize | cache | attention | compile
    requested: str  # what the preset asked for, e.g. "sage"
    engaged: bool  # True when what was asked is what runs
    detail: str  # what runs, or why it fell back ("sage: unavailable on cpu, using sdpa")

    @property
    def fell_back(self) -> bool:
        return self.requested not in ("none", "off") and not self.engaged

    def __str__(self) -> str:
        return self.detail

    def as_dict(self) -> dict:
        return asdict(self)
