"""`python -m studio sweep`: one cache knob varied over a prompt set, speed-up and worst PSNR against it, the cliff
(the steepest drop in worst PSNR) marked. The compile switch applies to every value's stack, not base; the cache is
always on (off, each value would time one uncached stack again)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from studio.bench.bench import BenchReport, run_bench
from studio.spec.ask import Switches
from studio.spec.checks import ConfigError, fail
from studio.spec.preset import Preset

# knob -> (how a value is read from the command line, the values swept by default, its short name in a variant's name)
KNOBS = {
    "residual_diff_threshold": (float, "0.08,0.12,0.16,0.24,0.32,0.5", "R"),
    "Fn_compute_blocks": (int, "1,2,3", "F"),
    "Bn_compute_blocks": (int, "0,1,2", "B"),
    "max_continuous_cached_steps": (int, "1,2,3,4,6", "MC"),
    "max_warmup_steps": (int, "0,2,4,8", "W"),
    "steps_computation_mask": (str, "none,slow,medium,fast", "mask-"),
}
PSNR_CAP_DB = 100.0  # an identical picture counts as this much when finding the steepest drop


def parse_values(knob: str, text: str | None) -> list:
    if knob not in KNOBS:
        raise ConfigError(f"sweep knob {knob!r} is not one of: {', '.join(KNOBS)}")
    try:
        kind, default, _ = KNOBS[knob]
        return [kind(x.strip()) for x in (text or default).split(",") if x.strip()]
    except ValueError:
        raise ConfigError(
            f"sweep values {text!r} for {knob} must be {KNOBS[knob][0].__name__}s, comma-separated"
        ) from None


def variant(p: Preset, knob: str, value, compile_enabled: bool | None = None) -> Preset:
    """The preset with one cache knob set and the cache on, compiled as the switch says (None: as the preset is)."""
    p = Switches(cache=True, compile=compile_enabled).apply(p)  # (the one rule: spec.ask)
    short = KNOBS[knob][2]
    name = f"{p.name}.{short}{value:g}" if isinstance(value, float) else f"{p.name}.{short}{value}"
    return replace(p, name=name, cache_config=replace(p.cache_config, **{knob: value}))


def cliff(values: list, worst_db: list[float | None]) -> tuple[object, float] | None:
    """(the value where worst PSNR drops the most from the value before, the drop in dB), or None."""
    capped = [None if v is None else min(v, PSNR_CAP_DB) for v in worst_db]
    drops = [
        (capped[i - 1] - capped[i], values[i])
        for i in range(1, len(values))
        if capped[i - 1] is not None and capped[i] is not None
    ]
    if not drops:
        return None
    drop, value = max(drops, key=lambda d: d[0])
    return (value, drop) if drop > 0 else None


@dataclass
class SweepResult:
    """What `python -m studio sweep` measured (studio.report.text.sweep_markdown writes it as text)."""

    knob: str
    values: list
    report: BenchReport  # its rows: base, then one per value (in order)
    cliff: tuple | None
    names: list[str]  # the variant of each value

    def rows(self):
        by_name = {r.preset: r for r in self.report.matrix.rows}
        return [by_name[n] for n in self.names]

    def as_dict(self) -> dict:
        d = self.report.as_dict()
        d.update(knob=self.knob, values=self.values, cliff=list(self.cliff) if self.cliff else None)
        return d


def run_sweep(
    runner,
    requests,
    preset="cache",
    knob="residual_diff_threshold",
    values=None,
    *,
    model=None,
    repeats=1,
    progress=None,
    cache_enabled: bool | None = None,
    compile_enabled: bool | None = None,
) -> SweepResult:
    """See the module doc. `cache_enabled`, `compile_enabled`: the per-request switches (None: as the preset is)."""
    if cache_enabled is False:
        fail(
            "sweep",
            "cache",
            False,
            "a sweep varies a step-cache knob, so every value runs with the cache on (off, "
            "each would run one uncached stack): leave the cache switch out (`python -m studio bench --cache false` "
            "times stacks without a cache)",
        )
    values = values if values is not None else parse_values(knob, None)
    base_p = runner.resolve_preset(preset)
    variants = [variant(base_p, knob, v, compile_enabled) for v in values]
    rep = run_bench(runner, requests, variants, model=model, repeats=repeats, progress=progress)
    names = [v.name for v in variants]
    by_name = {r.preset: r for r in rep.matrix.rows}
    return SweepResult(knob, values, rep, cliff(values, [by_name[n].worst_psnr_db for n in names]), names)
