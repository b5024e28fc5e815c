"""The one estimator of every speed-up the studio prints: a point and an interval from timed runs, robust to stalls.

Noise on a shared CPU only ever ADDS time, so a stack's PRICE is its FLOOR: each kind of step's (full, cached) fastest
in any repeat, times its count in a run (steps of one kind do the same work; on tests/data/step_timings.json the floor
was the most reproducible estimator). Where a run's steps of one kind do UNEVEN work (DBPrune prunes a different
number of blocks at each step), each step is priced at its own fastest over the repeats instead (a repeat of one
request prunes the same blocks at the same step): pooled, every pruned step would be priced at the one that pruned
most. A SPEED-UP is base's price over the stack's, its interval a seeded bootstrap made
SYMMETRIC around the point (a floor's draws never fall below the floor, so the percentile interval sits at its edge),
named by what it held on recorded runs (COVERAGE), not by LEVEL. A number is WITHHELD when `Estimate.useless`.
numpy only: the app's process reads `Estimate` in results and never loads torch."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

STALL_BOUND = 1.15  # a run whose wall time is over 1.15x its median steps' was hit by a stall
TIGHT = 0.05  # an interval within +-5% of its point: more pairs would not change what a person reads
USELESS = 0.25  # an interval wider than +-25% of its point is not a number
NEAR_ONE = 0.05  # an interval holding 1.00 says "no speed-up"; withheld when its point claims more than +-5%
DRAWS = 400
LEVEL = 0.95  # the draws' middle share the interval starts from (module doc: not what it holds)
SEED = 0
# What the interval held on the recorded runs (module doc), windows of 3 and 5 pairs: (held, windows) quiet and beside
# a CPU hog. COVERAGE in sample, against the 10-pair quiet point of the same recording (tests/data/step_timings.json,
# cache and cache-int8-sage on a 2-core AMD EPYC); SEPARATE out of sample, against the point of another process's
# separate runs of the same stacks on the same machine (tests/data/step_timings_oos*.json: cache, cache-int8-sage and
# cache-compile on a 2-core Intel Xeon), which reads a few percent apart (a process's kernels and memory layout; a
# compiled stack's most). tests/test_estimate.py recomputes both with tests/data/compare_estimators.py.
COVERAGE = {"quiet": (26, 28), "busy": (25, 28)}
SEPARATE = {"quiet": (25, 42), "busy": (23, 42)}


def interval_words() -> str:
    """The interval's name wherever it is labelled (the card's help, the API's description, the docs)."""
    (q, nq), (b, nb) = COVERAGE["quiet"], COVERAGE["busy"]
    s, ns = SEPARATE["quiet"]
    return (
        f"an interval that held the quiet speed-up in {q / nq:.0%} of recorded windows of 3 and 5 pairs "
        f"({b / nb:.0%} beside a CPU hog), and another process's in {s / ns:.0%} (processes read a few percent "
        "apart), measured on 2-core CPUs with the embedded model"
    )


def method_words() -> str:
    """How a speed-up is made, in words (docs/make_benchmarks.py writes it into the method text)."""
    return (
        "the one estimator's: base's floor over the row's (for each kind of step, full and cached, its fastest over "
        "the runs, times how many a run has; DBPrune's steps, which prune unevenly, each at its own fastest), the "
        "rounds paired, with " + interval_words()
    )


def interval_level() -> float:
    """The interval's measured coverage on a quiet machine, as a share (JSON `interval_level`)."""
    q, n = COVERAGE["quiet"]
    return round(q / n, 2)


@dataclass(frozen=True)
class Run:
    """One timed run as the estimator reads it: milliseconds per denoising step, and the steps served from a cache."""

    step_ms: tuple[float, ...]
    cached: frozenset[int] = frozenset()
    uneven: bool = False  # its cached steps do uneven work (DBPrune): priced step by step (module doc)

    @classmethod
    def of(cls, step_ms: Sequence[float], cached: Sequence[int] = (), pruned_blocks: int | None = None) -> Run:
        """`pruned_blocks`: the cache's own count of blocks it pruned, where it prunes (DBPrune): its steps are
        uneven, whatever the count."""
        return cls(tuple(float(t) for t in step_ms), frozenset(int(i) for i in cached), pruned_blocks is not None)

    @property
    def wall_ms(self) -> float:
        return float(sum(self.step_ms))


@dataclass(frozen=True)
class Estimate:
    """A speed-up (base over the stack) with its interval, from `pairs` timed pairs."""

    point: float
    lo: float
    hi: float
    pairs: int
    stalled: int = 0  # timed runs a stall hit (said; the floor leaves the stalled steps out)
    stop: str = ""  # why the pairing stopped, in words ("" where the caller chose the count)
    exact: bool = False  # 1.00 by construction (base against itself): no interval
    # what would help a useless interval, in words, set by the caller that can act on it ("compare on", "more repeats")
    helps: str = ""
    # other programs held the cores while it was timed (studio.measure.crowding), in words: withheld whatever the
    # interval says ("" when they did not, or it was not read)
    crowded: str = ""
    # the draws' own interval (widened to hold the point, before it is made symmetric): what the noise checks read
    # (`spread`); None: the same as lo-hi
    drawn: tuple[float, float] | None = None

    @property
    def half_width(self) -> float:
        """Half the interval, as a share of the point."""
        return 0.0 if self.exact or self.point <= 0 else (self.hi - self.lo) / 2 / self.point

    @property
    def spread(self) -> float:
        """Half the draws' own interval, as a share of the point: how far runs of one stack scatter, for the checks
        calibrated on it (base against its own second run: studio.measure.pace.AGREE), not a shown interval."""
        if self.drawn is None:
            return self.half_width
        return 0.0 if self.exact or self.point <= 0 else (self.drawn[1] - self.drawn[0]) / 2 / self.point

    @property
    def tight(self) -> bool:
        return self.half_width <= TIGHT

    @property
    def useless(self) -> bool:
        if self.exact:
            return False
        if self.crowded:
            return True
        holds_one = self.lo <= 1.0 <= self.hi and abs(self.point - 1.0) > NEAR_ONE
        return holds_one or self.half_width > USELESS

    def why_not(self) -> str | None:
        """Why the number is withheld, and what would help; None when it is shown."""
        if not self.useless:
            return None
        if self.crowded:
            return f"timing too noisy to show: the machine was busy ({self.crowded}); a quieter machine would help"
        why = (
            f"holds 1.00x while its point says {self.point:.2f}x"
            if self.lo <= 1.0 <= self.hi
            else f"is wider than ±{USELESS * 100:.0f}% of its point"
        )
        more = pairs_for(self)
        helps = self.helps or (f"about {more} more pairs" if more else "a quieter machine")
        return (
            f"timing too noisy to show: the interval {self.lo:.2f}-{self.hi:.2f}x over {self.pairs} "
            f"pair{'s' if self.pairs != 1 else ''} {why}; speed-up not shown ({helps} would help)"
        )


@dataclass(frozen=True)
class Shown:
    """A speed-up as every place that prints or records one shows it (`shown`): the point and interval, or None and
    the sentence that says why not."""

    point: float | None
    lo: float | None
    hi: float | None
    note: str | None  # why the number is withheld, and what would help (None: shown)


def shown(est: Estimate | None, helps: str = "") -> Shown:
    """THE rule every speed-up the studio prints goes through (tests/test_estimate.py lists the callers): withheld with
    its sentence when `Estimate.useless`; base against itself is 1.00 with no interval. `helps`: what would help, said
    by the caller that can act on it ("more --repeats"). None: not compared."""
    if est is None:
        return Shown(None, None, None, None)
    if helps and not est.helps:
        est = replace(est, helps=helps)
    if est.exact:
        return Shown(est.point, None, None, None)
    if est.useless:
        return Shown(None, None, None, est.why_not())
    return Shown(est.point, est.lo, est.hi, None)


def exact_one(runs: int) -> Estimate:
    """Base against itself, the same runs: 1.00x by construction, not a measurement."""
    return Estimate(1.0, 1.0, 1.0, runs, exact=True)


def pairs_for(e: Estimate, target: float = TIGHT * 2) -> int:
    """Roughly how many more pairs would bring the interval within +-`target` (width falls as 1/sqrt(pairs));
    0 when more pairs would not (a one-pair interval comes from its steps, not its pairs)."""
    if e.pairs < 2 or e.half_width <= target:
        return 0
    need = math.ceil(e.pairs * (e.half_width / target) ** 2)
    return min(need, 50) - e.pairs


# -- prices ---------------------------------------------------------------------------------------------------------
def counts_of(runs: Sequence[Run]) -> tuple[int, int]:
    """(full, cached) steps of the runs' most common pattern (repeats of one request share theirs)."""
    seen = [(len(r.step_ms) - len(r.cached), len(r.cached)) for r in runs]
    return max(set(seen), key=seen.count)


def _pools(runs: Sequence[Run]) -> tuple[np.ndarray, np.ndarray]:
    """(full steps, cached steps): every repeat's step times of each kind, each run's kind by its own counts."""
    full = [t for r in runs for i, t in enumerate(r.step_ms) if i not in r.cached]
    hit = [t for r in runs for i, t in enumerate(r.step_ms) if i in r.cached]
    return np.array(full, dtype=float), np.array(hit, dtype=float)


def _by_step(runs: Sequence[Run]) -> np.ndarray | None:
    """Uneven runs' step times, runs x steps (module doc); None where they are priced by kind (or differ in length:
    not repeats of one request)."""
    if not runs or not all(r.uneven for r in runs) or len({len(r.step_ms) for r in runs}) != 1:
        return None
    return np.array([r.step_ms for r in runs], dtype=float)


def price_ms(runs: Sequence[Run], counts: tuple[int, int] | None = None) -> float:
    """The floor price of a set of runs of one stack (module doc): each kind's fastest step, times its count in a run
    (`counts`, (full, cached); the runs' own by default); uneven runs, each step at its fastest."""
    steps = _by_step(runs)
    if steps is not None:
        return float(steps.min(axis=0).sum())
    n_full, n_cached = counts or counts_of(runs)
    full, hit = _pools(runs)
    price = n_full * full.min() if n_full else 0.0
    if n_cached:
        price += n_cached * (hit.min() if len(hit) else full.min())  # never seen cached: priced as full (the worst)
    return float(price)


def stalled(runs: Sequence[Run]) -> int:
    """How many runs a stall hit: wall time over STALL_BOUND times each kind's median step times its count (a run
    slow end to end is a slow spell instead, which the floor leaves out just the same but no step shows)."""
    out = 0
    for r in runs:
        full, hit = _pools([r])
        typical = sum(len(p) * float(np.median(p)) for p in (full, hit) if len(p))
        out += r.wall_ms > STALL_BOUND * typical
    return out


# -- the bootstrap --------------------------------------------------------------------------------------------------
def _draw_prices(
    runs: Sequence[Run], counts: tuple[int, int], rng: np.random.Generator, draws: int, picks=None
) -> np.ndarray:
    """The floor price of each draw: the runs resampled (`picks`, draws x runs, when a pairing chose them), then each
    kind's pooled steps resampled."""
    if picks is None:
        picks = rng.integers(0, len(runs), size=(draws, len(runs))) if len(runs) > 1 else np.zeros((draws, 1), int)
    steps = _by_step(runs)
    if steps is not None:  # each step at its fastest over the drawn runs
        return steps[picks].min(axis=1).sum(axis=1)
    total = np.zeros(draws)
    by_run = [_pools([r]) for r in runs]  # each run's (full, cached) step times
    for n, kind in zip(counts, (0, 1)):
        if not n:
            continue
        if kind == 1 and not any(len(p[1]) for p in by_run):
            kind = 0  # never seen cached: priced as full (price_ms's rule)
        pools = [p[kind] for p in by_run]
        width = max(len(p) for p in pools)
        table = np.full((len(runs), width), np.inf)
        for i, p in enumerate(pools):
            table[i, : len(p)] = p
        drawn = table[picks].reshape(draws, -1)  # draws x (runs x steps), inf where a run had fewer of the kind
        finite = np.isfinite(drawn)
        chosen = rng.integers(0, drawn.shape[1], size=drawn.shape)
        vals = np.where(np.take_along_axis(finite, chosen, axis=1), np.take_along_axis(drawn, chosen, axis=1), np.inf)
        low = vals.min(axis=1)
        low = np.where(np.isfinite(low), low, np.where(finite, drawn, np.inf).min(axis=1))
        total += n * low
    return total


def _interval(draws: np.ndarray) -> tuple[float, float]:
    tail = (1.0 - LEVEL) / 2 * 100
    lo, hi = np.percentile(draws, [tail, 100 - tail])
    return float(lo), float(hi)


def symmetric(point: float, lo: float, hi: float) -> tuple[float, float]:
    """The interval widened to hold `point`, then its farther edge mirrored around it (in ratio, module doc)."""
    lo, hi = min(lo, point), max(hi, point)
    if point <= 0 or lo <= 0:
        return lo, hi
    half = max(point / lo, hi / point)
    return point / half, point * half


def _shaped(point: float, draws: np.ndarray, pairs: int, stall: int) -> Estimate:
    qlo, qhi = _interval(draws)
    lo, hi = symmetric(point, qlo, qhi)
    return Estimate(point, lo, hi, pairs, stall, drawn=(min(qlo, point), max(qhi, point)))


def speedup(
    bases: Sequence[Run],
    runs: Sequence[Run],
    *,
    counts: tuple[int, int] | None = None,
    base_counts: tuple[int, int] | None = None,
    draws: int = DRAWS,
) -> Estimate:
    """Base over the stack, from runs of one request (`counts`, `base_counts`: (full, cached) steps of a run of each
    side; their runs' own by default)."""
    return speedup_over([(bases, runs, counts, base_counts)], draws=draws)


def alike(b: Sequence[Run], r: Sequence[Run]) -> tuple[Sequence[Run], Sequence[Run]]:
    """Base's runs and the stack's, read alike: where one side is priced step by step (uneven runs), so is the other
    (a floor of a few runs per step sits higher than a floor pooled over every step of a kind)."""
    if (_by_step(b) is None) != (_by_step(r) is None):
        return [replace(x, uneven=True) for x in b], [replace(x, uneven=True) for x in r]
    return b, r


def _group(b: Sequence[Run], r: Sequence[Run], c, cb, rng, draws: int) -> tuple[float, np.ndarray]:
    """One request's point and bootstrap draws: base (`b`, priced at counts `cb`) over the stack (`r`, at `c`), both
    read alike."""
    b, r = alike(b, r)
    c, cb = c or counts_of(r), cb or counts_of(b)
    point = price_ms(b, cb) / price_ms(r, c)
    if len(b) == len(r) and len(b) > 1:  # paired: a draw takes both runs of a pair
        picks = rng.integers(0, len(b), size=(draws, len(b)))
        return point, _draw_prices(b, cb, rng, draws, picks) / _draw_prices(r, c, rng, draws, picks)
    return point, _draw_prices(b, cb, rng, draws) / _draw_prices(r, c, rng, draws)


def speedup_over(groups: Sequence[tuple], *, draws: int = DRAWS) -> Estimate:
    """Base over the stack over several requests (prompts), each (bases, runs[, counts[, base_counts]]): the median
    of their points, and of each draw's."""
    rng = np.random.default_rng(SEED)
    points, per = [], []
    for b, r, *rest in groups:
        point, drawn = _group(b, r, rest[0] if rest else None, rest[1] if len(rest) > 1 else None, rng, draws)
        points.append(point)
        per.append(drawn)
    n_stalled = sum(stalled(g[0]) + stalled(g[1]) for g in groups)
    pairs = sum(min(len(g[0]), len(g[1])) for g in groups)
    return _shaped(float(np.median(points)), np.median(np.stack(per), axis=0), pairs, n_stalled)


def full_steps(run: Run) -> Run:
    return Run(tuple(t for i, t in enumerate(run.step_ms) if i not in run.cached))


def by_shape(bases: Sequence[Run], then: Sequence[Run], now: Run, *, draws: int = DRAWS) -> Estimate:
    """A new prompt's run over a kept base timing of its shape, timed once: base then over the stack's full steps then
    (timed together), times the new run's own full steps over its price, so load that came since moves both of the
    run's figures alike and cancels."""
    if not then or not full_steps(now).step_ms or not all(full_steps(r).step_ms for r in then):
        return replace(speedup(bases, [now], draws=draws), helps="compare on")  # nothing to carry the speed across
    rng = np.random.default_rng(SEED)
    steps = (len(now.step_ms), 0)
    then_full = [full_steps(r) for r in then]
    a, a_draws = _group(bases, then_full, steps, counts_of(bases), rng, draws)  # base then / all-full stack then
    b, b_draws = _group([full_steps(now)], [now], None, steps, rng, draws)  # the run's all-full price / its price
    pairs = min(len(bases), len(then))
    est = _shaped(a * b, a_draws * b_draws, pairs, stalled(bases) + stalled([now]))
    return replace(est, helps="compare on")


CLEAR_DB = 1.0  # a stack beats base at fewer steps when its worst PSNR is this much higher (within it: as well)


def margin_db(a: float, b: float) -> float:
    """A stack's worst PSNR `a` over its rival's `b`, in dB: inf where only the stack is bitwise base's, 0 where both
    are, -inf where only the rival is."""
    if math.isinf(a) and math.isinf(b):
        return 0.0
    return math.inf if math.isinf(a) else -math.inf if math.isinf(b) else a - b


def steps_at_speed(full: int, speedup: float) -> int:
    """Base at fewer steps at a stack's speed: the fewest steps k (1 to full - 1) with full / k no more than `speedup`,
    so the rival never runs faster than the stack and a cache read against it is judged strictly."""
    return min(full - 1, max(1, math.ceil(full / speedup - 1e-9)))
