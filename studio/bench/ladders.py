"""The step-cache methods `python -m studio methods` searches, as data, and the Matrix's "all step caches" picks.
Nothing here runs a model: the app's process reads it without the engine (it loads no torch)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from studio.spec.preset import CacheSpec


@dataclass(frozen=True)
class Method:
    """One method: its shipped preset, the knob searched (values gentlest first), and variants of its other knobs,
    each searched in turn: the variant whose best caches the most steps wins."""

    name: str
    preset: str | None  # None: not shipped (it cannot engage on the embedded model): a default spec of `backend`
    knob: str
    values: tuple
    backend: str = ""  # for preset None
    variants: tuple = ({},)

    @property
    def best_name(self) -> str:
        """The preset name of its best setting (a preset name takes no '+')."""
        return f"{self.name.replace('+', '-')}-best"


_DB_THRESHOLDS = (0.08, 0.12, 0.16, 0.24, 0.36, 0.52, 0.8, 1.2, 1.6, 2.4)
_DB_VARIANTS = ({}, {"max_warmup_steps": 2, "max_continuous_cached_steps": 5})
_SKIP_RANGES = (2, 3, 4, 6, 8, 12, 16, 24)  # every attention layer computes every n-th call
_WHOLE_RANGE = {"spatial_attention_timestep_skip_range": (-1, 1000)}  # every timestep may reuse attention
METHODS = (
    Method("dbcache", "cache", "residual_diff_threshold", _DB_THRESHOLDS, variants=_DB_VARIANTS),
    Method("dbcache+taylorseer", "cache-taylorseer", "residual_diff_threshold", _DB_THRESHOLDS, variants=_DB_VARIANTS),
    Method("dbcache+dmd", "cache-dmd", "residual_diff_threshold", _DB_THRESHOLDS, variants=_DB_VARIANTS),
    Method("dbcache+foca", "cache-foca", "residual_diff_threshold", _DB_THRESHOLDS, variants=_DB_VARIANTS),
    Method("dbcache+scm", "cache-scm", "steps_computation_mask", ("slow", "medium", "fast", "ultra")),
    Method(
        "dbprune",
        "dbprune",
        "residual_diff_threshold",
        (0.02, 0.04, 0.06, 0.08, 0.12, 0.16, 0.24, 0.36, 0.52, 0.8, 1.2),
        variants=({}, {"max_warmup_steps": 2}),
    ),
    Method("fbcache", "fbcache", "residual_diff_threshold", (0.05, 0.1, 0.15, 0.2, 0.3, 0.45, 0.6, 0.8, 1.2)),
    Method(
        "magcache",
        "magcache",
        "threshold",
        (0.02, 0.04, 0.06, 0.1, 0.16, 0.24, 0.36, 0.5, 0.8, 1.2),
        variants=({}, {"max_skip_steps": 5, "retention_ratio": 0.1}),
    ),
    Method(
        "taylorseer",
        "taylorseer",
        "cache_interval",
        (2, 3, 4, 5, 6, 8, 10, 14, 20, 27),
        variants=({}, {"disable_cache_before_step": 2}),
    ),
    Method("pab", "pab", "spatial_attention_block_skip_range", _SKIP_RANGES, variants=({}, _WHOLE_RANGE)),
    Method(
        "fastercache", "fastercache", "spatial_attention_block_skip_range", _SKIP_RANGES, variants=({}, _WHOLE_RANGE)
    ),
    Method("seacache", None, "threshold", (0.1, 0.25, 0.4), backend="seacache"),
)
_SPEC_FIELDS = {f.name for f in fields(CacheSpec)}


def with_knob(spec: CacheSpec, knob: str, value) -> CacheSpec:
    """`spec` with one knob set: a cache_config key, or one of the method's options (spec.methods)."""
    if knob in _SPEC_FIELDS:
        return replace(spec, **{knob: value})
    return replace(spec, options=tuple(sorted({**dict(spec.options), knob: value}.items())))


def matrix_picks(names: list[str]) -> list[str]:
    """The Matrix's "all step caches": base, `cache`, then each method's searched best if written, else its preset."""
    picked = [n for n in ("base", "cache") if n in names]
    for m in METHODS:
        pick = m.best_name if m.best_name in names else m.preset
        if pick in names and pick not in picked:
            picked.append(pick)
    return picked
