"""One prompt's round-robin for the bench: every preset timed in turn, base twice per round (a round is a pair: same
moment, same load). After `repeats` rounds, up to `extra` more while a speed-up would be withheld, or to `tighten`
(not the Matrix tab: a round is a visitor's wait) while one is wider than ±LOOSE or base disagrees with itself."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from studio.engine import BASE, CALLER_TIMES_BASE, Pairing, Runner, RunResult
from studio.measure.estimate import Estimate, Run, speedup
from studio.measure.pace import AGREE
from studio.report.table import AGAIN
from studio.spec.preset import Preset
from studio.spec.request import GenerationRequest

EXTRA_ROUNDS = Pairing().max_extra_pairs  # the card's cap on pairs beyond the first ones, the bench's on rounds
LOOSE = 0.10  # a row's interval wider than +-10% of its point: another round, within the cap


def _graphs_compiled() -> int | None:
    """Graphs torch.compile has built so far in this process; None where this torch keeps no such count."""
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    except (ImportError, KeyError):  # a torch without dynamo's counters: the tables say n/a, never a wrong 0
        return None


def total_graphs(counts) -> int | None:
    """A sum of graph counts; unknown (None) once any part of it is."""
    counts = list(counts)
    return None if None in counts else sum(counts)


@dataclass
class Rotation:
    """One prompt's round-robin: every timed denoise per preset, the first and last result, graphs compiled."""

    request: GenerationRequest
    times: dict[str, list[float]] = field(default_factory=dict)
    runs: dict[str, list[Run]] = field(default_factory=dict)  # each timed run, as the estimator reads it
    first: dict[str, RunResult] = field(default_factory=dict)
    last: dict[str, RunResult] = field(default_factory=dict)
    # graphs compiled by the first (warm-up) call, and by later, timed calls; None where torch gave no count
    cold_graphs: dict[str, int | None] = field(default_factory=dict)
    recompiles: dict[str, int | None] = field(default_factory=dict)
    raw_times: dict[str, list[float]] = field(default_factory=dict)  # --vs-raw: the plain pipeline's
    raw_runs: dict[str, list[Run]] = field(default_factory=dict)  # its timed runs, step by step
    raw_images: dict[str, object] = field(default_factory=dict)
    raw_errors: dict[str, str] = field(default_factory=dict)
    rounds: int = 0  # rounds timed: the repeats asked for and any extra ones (module doc)
    stop: str = ""  # why the rounds stopped where they did

    def median(self, name: str) -> float:
        return statistics.median(self.times[name])

    def ratio(self, base: str, name: str) -> Estimate:
        """`base` over `name`, round by round (each round's runs are a pair: same moment, same load)."""
        return speedup(self.runs[base], self.runs[name])

    def pair(self, base: str, name: str) -> tuple[list[Run], list[Run]]:
        return self.runs[base], self.runs[name]


def _studio(rot: Rotation, runner: Runner, request, name: str, p: Preset, model, first: bool) -> None:
    g0 = _graphs_compiled()
    res = runner.generate(request, p, model=model, pairing=CALLER_TIMES_BASE)  # this rotation times base itself
    g1 = _graphs_compiled()
    new = None if g0 is None or g1 is None else g1 - g0
    if first:
        rot.first[name], rot.cold_graphs[name] = res, new
    else:
        rot.recompiles[name] = total_graphs([rot.recompiles.get(name, 0), new])
    rot.times.setdefault(name, []).append(res.metrics.timing.denoise_s)
    m = res.metrics
    rot.runs.setdefault(name, []).append(Run.of(m.timing.step_ms, m.cache.cached_step_indices, m.cache.pruned_blocks))
    rot.last[name] = res


def _plain(rot: Rotation, raw, name: str, p: Preset, request, tick) -> None:
    try:
        ans, image = raw.run(p, request, worker=name)  # AGAIN: base's recipe in a second process (the noise floor)
    except RuntimeError as e:  # a plain recipe that cannot run here: the row says so, the bench goes on
        rot.raw_errors[name] = str(e)
        return
    rot.raw_times.setdefault(name, []).append(ans["denoise_s"])
    # its steps as the estimator reads the studio's: cache-dit's own list of cached steps; where the plain recipe's
    # cache keeps none (diffusers' First-Block-Cache), the studio's count of the same request (the same hook runs)
    cached = ans["cached"]
    if cached is None:
        cached = rot.last[name].metrics.cache.cached_step_indices if name in rot.last else []
    rot.raw_runs.setdefault(name, []).append(Run.of(ans["step_ms"], cached))
    rot.raw_images[name] = image
    if tick:
        tick(name + " (plain)")


def _round(rot: Rotation, runner: Runner, order, model, tick, raw) -> None:
    request, r = rot.request, rot.rounds
    for name, p in order:
        plain_first = raw is not None and r % 2 == 1
        if plain_first:  # the pair's order alternates between rounds: neither side always runs second
            _plain(rot, raw, name, p, request, tick)
        _studio(rot, runner, request, name, p, model, first=r == 0 and name not in rot.first)
        if tick:
            tick(name)
        if raw is not None and not plain_first:
            _plain(rot, raw, name, p, request, tick)


def _speedups(rot: Rotation) -> dict[str, Estimate]:
    return {n: rot.ratio(BASE, n) for n in rot.runs if n not in (BASE, AGAIN)}


def withheld(rot: Rotation, speedups: dict[str, Estimate] | None = None) -> list[str]:
    """The presets whose speed-up over base these rounds would withhold (its interval is useless)."""
    return [n for n, e in (speedups or _speedups(rot)).items() if e.useless]


def loose(rot: Rotation, speedups: dict[str, Estimate] | None = None) -> list[str]:
    """The presets whose speed-up is shown but with an interval wider than +-LOOSE of its point."""
    return [n for n, e in (speedups or _speedups(rot)).items() if not e.useless and e.half_width > LOOSE]


def base_disagrees(rot: Rotation) -> float | None:
    """The half-width of base against its own second run in these rounds, where wider than AGREE; None otherwise."""
    if rot.rounds == 0 or AGAIN not in rot.runs:
        return None
    hw = rot.ratio(BASE, AGAIN).spread
    return hw if hw > AGREE else None


CROWDED_STOP = "other programs hold the cores (more rounds would not show a number)"


def why_stop(rot: Rotation, repeats: int, extra: int, tighten: bool = True, crowded: bool = False) -> str | None:
    """Why the rotation stops after its rounds so far (None: time another round). `tighten`: module doc. `crowded`:
    the watch says other programs hold the cores, so every row is withheld whatever more rounds add (as a card's
    pairing: engine.baseline.side_by_side)."""
    if rot.rounds < repeats:
        return None
    speedups = _speedups(rot)  # each a bootstrap: drawn once per round, read by both checks
    wanting = withheld(rot, speedups)
    wide, shaky = (loose(rot, speedups), base_disagrees(rot)) if tighten else ([], None)
    if not wanting and not wide and shaky is None:
        asked = f"the {repeats} asked for" if rot.rounds == repeats else f"{rot.rounds - repeats} more than asked"
        usable = f"within ±{LOOSE * 100:.0f}% and base agrees with itself" if tighten else "usable"
        return (
            f"every speed-up's interval is {usable} after {rot.rounds} round{'s' if rot.rounds != 1 else ''} ({asked})"
        )
    if crowded:
        return CROWDED_STOP
    if rot.rounds >= repeats + extra:
        still = [f"withheld: {', '.join(wanting)}"] if wanting else []
        still += [f"wider than ±{LOOSE * 100:.0f}%: {', '.join(wide)}"] if wide else []
        still += [f"base against itself ±{shaky * 100:.1f}%"] if shaky is not None else []
        return f"at most {extra} extra round{'s' if extra != 1 else ''}; still {'; '.join(still)}"
    return None


def rotate(
    runner: Runner,
    request,
    presets: list[Preset],
    repeats: int,
    model=None,
    tick=None,
    *,
    raw=None,
    extra: int = EXTRA_ROUNDS,
    on_extra=None,
    tighten: bool = True,
    crowded=None,
) -> Rotation:
    """Round-robin timing of `presets` (base first, and again last: AGAIN) on one request (module doc); with `raw` (a
    RawPool), each preset's plain run beside its studio run. `tick(label)` after each run; `on_extra()` before one;
    `crowded()`: whether other programs hold the cores (why_stop)."""
    rot = Rotation(request)
    order = [(p.name, p) for p in presets] + [(AGAIN, presets[0])]
    runner.settle(request, presets[0], model)  # untimed: the first slot then runs right after a run, as all others do
    while (stop := why_stop(rot, repeats, extra, tighten, crowded is not None and crowded())) is None:
        if rot.rounds >= repeats and on_extra:
            on_extra()
        _round(rot, runner, order, model, tick, raw)
        rot.rounds += 1
    rot.stop = stop
    return rot
