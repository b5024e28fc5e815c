"""`python -m studio methods`: every step-cache method (METHODS) on the same prompts and seeds, side by side. Step 1
binary-searches each method's knob for its most aggressive setting whose worst prompt keeps the floor (screened
eagerly: quality is a property of the pictures, not the clock); step 2 times every method's best beside base in one
bench; step 3 reads each row against base at fewer steps."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from studio.bench.bench import BenchReport, run_bench
from studio.bench.fewer import FewerSteps, Versus, fewer_steps_reference
from studio.bench.ladders import METHODS, Method, with_knob
from studio.bench.screening import screen_prompts
from studio.engine import BASE
from studio.engine.magcal import calibrate_magcache
from studio.measure.estimate import shown
from studio.spec.ask import Switches
from studio.spec.checks import ConfigError, fail
from studio.spec.methods import METHOD_NAMES
from studio.spec.preset import CacheSpec, Preset

DEFAULT_FLOOR_DB = 35.0


@dataclass
class Searched:
    """One method after its search: the best setting that keeps the floor, or why there is none."""

    method: Method
    backend: str  # the cache backend the method runs (its start preset's)
    preset: Preset | None = None  # the best setting, named Method.best_name
    value: object = None
    worst_db: float | None = None
    worst_flip: float | None = None
    cached: float = 0.0  # the best setting's cached steps, the mean over the prompts
    pruned: float | None = None  # DBPrune: the best setting's pruned share of block calls, the mean over the prompts
    screened: int = 0
    refused: str | None = None  # the engine's reason it could not engage here
    note: str | None = None  # no setting kept the floor, or MagCache was calibrated first

    def as_dict(self) -> dict:
        return {
            "method": self.method.name,
            "name": METHOD_NAMES[self.backend],
            "knob": self.method.knob,
            "value": self.value,
            "label": self.preset.cache_config.label() if self.preset else None,
            "worst_psnr_db": self.worst_db,
            "worst_flip": self.worst_flip,
            "cached_steps": self.cached,
            "pruned_share": self.pruned,
            "screened": self.screened,
            "refused": self.refused,
            "note": self.note,
        }


@dataclass
class MethodRow:
    """A method's best setting, timed beside the others."""

    method: str
    preset: str
    label: str
    speedup: float | None
    speedup_lo: float | None
    speedup_hi: float | None
    speedup_note: str | None
    worst_psnr_db: float | None
    worst_flip: float | None
    wins_vs_base: int
    wins_vs_best: int | None  # None: this is the fastest, or no row's speed-up could be shown
    of: int
    cached_steps: int
    full_steps: int
    vs_fewer: Versus | None = None  # against base at the step count of its speed-up (None: no speed-up shown)

    def as_dict(self) -> dict:
        return {**self.__dict__, "vs_fewer": self.vs_fewer.as_dict() if self.vs_fewer else None}


@dataclass
class MethodsResult:
    floor_db: float
    max_flip: float | None
    searched: list[Searched]
    rows: list[MethodRow] = field(default_factory=list)
    best: str | None = None
    bench: BenchReport | None = None
    prompts: list[str] = field(default_factory=list)  # the bench's
    search_prompts: list[str] = field(default_factory=list)  # the search's (the same, or others: held out)
    fewer: FewerSteps | None = None  # base at fewer steps on the bench's prompts (None: not asked)

    @property
    def held_out(self) -> bool:
        """The bench ran on prompts the search did not see."""
        return not set(self.prompts) & set(self.search_prompts)

    def as_dict(self) -> dict:
        return {
            "floor_db": self.floor_db,
            "max_flip": self.max_flip,
            "prompts": self.prompts,
            "search_prompts": self.search_prompts,
            "best": self.best,
            "rows": [r.as_dict() for r in self.rows],
            "searched": [s.as_dict() for s in self.searched],
            "bench": self.bench.as_dict() if self.bench else None,
            "fewer_steps": self.fewer.as_dict() if self.fewer else None,
        }


def _start(m: Method, lib) -> Preset:
    """The method's shipped preset, or (not shipped) a default spec of its backend."""
    if m.preset is None:
        return Preset(name=m.best_name, cache_config=CacheSpec(backend=m.backend))
    return lib.get(m.preset)


class MethodSearch:
    """Step 1 of the module doc, for one method: on its own preset, or with `on` (the tuner's non-cache option: its
    quantization and attention, screened eagerly) under each setting."""

    def __init__(self, runner, requests, floor_db: float, max_flip: float | None, model=None, progress=None, on=None):
        self.runner, self.requests, self.floor, self.max_flip = runner, list(requests), floor_db, max_flip
        self.model, self.on = model, on
        self.progress = progress or (lambda msg: None)

    def screen(self, found: Searched, p: Preset):
        """(passed, worst dB, worst FLIP, mean cached steps, mean pruned share or None), stopping at the first failing
        prompt; sets `refused`."""
        s = screen_prompts(self.runner, self.requests, p, self.model, floor_db=self.floor, max_flip=self.max_flip)
        found.screened += s.runs
        found.refused = s.refused
        if not s.passed:
            return False, s.worst_db, s.worst_flip, 0.0, None
        pruned = sum(s.pruned) / len(s.pruned) if s.pruned else None
        return True, s.worst_db, s.worst_flip, sum(s.cached) / len(s.cached), pruned

    def run(self, m: Method) -> Searched:
        start = _start(m, self.runner.presets)
        if self.on is not None:  # screened eagerly: quality is the pictures', compiled or not
            eager = replace(self.on.compile, enabled=False)
            start = replace(self.on, name=start.name, cache_config=start.cache_config, compile=eager, description="")
        found = Searched(m, start.cache_config.backend)
        if start.cache_config.backend == "magcache":
            start = self._calibrated(found, start)
        for variant in m.variants:
            spec = start.cache_config
            for knob, value in variant.items():
                spec = with_knob(spec, knob, value)
            self._ladder(found, replace(start, cache_config=spec))
            if found.refused is not None:
                break
        if found.refused is None and found.preset is None:
            found.note = f"no {m.knob} of {list(m.values)} kept every prompt above the floor"
        return found

    def _ladder(self, found: Searched, start: Preset) -> None:
        """The most aggressive knob value that keeps the floor (binary search), kept if it saves more than found:
        more cached steps, or for DBPrune a larger share of block calls pruned (its steps with any pruned block count
        as cached, a count that saturates early)."""
        m = found.method
        lo, hi = 0, len(m.values) - 1
        while lo <= hi and found.refused is None:
            mid = (lo + hi) // 2
            p = replace(start, name=m.best_name, cache_config=with_knob(start.cache_config, m.knob, m.values[mid]))
            self.progress(f"{m.name}: {p.cache_config.label()}")
            ok, worst, flip, cached, pruned = self.screen(found, p)
            if ok:
                saves, had = (pruned, found.pruned) if pruned is not None else (cached, found.cached)
                if found.preset is None or saves > (had or 0):
                    found.preset, found.value, found.worst_db, found.worst_flip = p, m.values[mid], worst, flip
                    found.cached, found.pruned = cached, pruned
                lo = mid + 1
            else:
                hi = mid - 1

    def _calibrated(self, found: Searched, start: Preset) -> Preset:
        """MagCache's ratios for this model, measured on these prompts where the preset has none for it."""
        here = searched_on(self.runner, self.model)
        if dict(start.cache_config.options).get("calibrated_for") == here:
            return start
        self.progress("magcache: calibrating its ratios on these prompts")
        cal = calibrate_magcache(self.runner, self.requests, start, self.model)
        found.note = f"calibrated first on these {cal.prompts} prompts (its ratios were for another model)"
        return cal.preset(start, start.description)


def run_methods(
    runner,
    requests,
    *,
    floor_db: float | None = None,
    max_flip: float | None = None,
    names: list[str] | None = None,
    model=None,
    repeats: int = 3,
    progress=None,
    also: tuple = ("cache",),
    compile_enabled: bool | None = None,
    search_requests=None,
    fewer_steps: bool = True,
) -> MethodsResult:
    """The module doc's steps; `also`: presets timed beside for reference; `search_requests`: the search's prompts
    (default `requests`; others make the bench a held-out test)."""
    check_floor(floor_db, max_flip)
    floor = DEFAULT_FLOOR_DB if floor_db is None else floor_db
    chosen = _chosen(names)
    searching = list(search_requests or requests)
    runner.generate(requests[0], BASE, model=model)  # load and fail early on a model that cannot run
    search = MethodSearch(runner, searching, floor, max_flip, model, progress)
    searched = [search.run(m) for m in chosen]
    res = MethodsResult(floor, max_flip, searched, prompts=[r.prompt for r in requests])
    res.search_prompts = [r.prompt for r in searching]
    best = [s.preset for s in searched if s.preset is not None]
    if not best:
        return res
    if compile_enabled is not None:
        best = [Switches(compile=compile_enabled).apply(p) for p in best]  # (the one rule: spec.ask)
        for s, p in zip([s for s in searched if s.preset is not None], best, strict=True):
            s.preset = p
    (progress or (lambda msg: None))(f"timing {len(best)} methods beside base and {', '.join(also) or 'nothing'}")
    res.bench = run_bench(
        runner, requests, [*also, *best], model=model, repeats=repeats, floor_db=floor, max_flip=max_flip
    )
    res.rows, res.best = method_rows(res.bench, searched, also)
    judge = fewer_steps_reference(runner, requests, model, floor_db=floor, progress=progress) if fewer_steps else None
    if judge is not None:  # (None: an image input, where fewer steps is no rival: studio.bench.fewer.applies)
        for r in res.rows:
            r.vs_fewer = judge.versus(r.speedup, r.worst_psnr_db)
        res.fewer = judge.result
    return res


def searched_presets(res: MethodsResult, tuned_for: str, describe) -> list[Preset]:
    """Each method's best as a preset to write (`methods --write`), marked with the transformer it was searched on."""
    return [replace(s.preset, description=describe(s), tuned_for=tuned_for) for s in res.searched if s.preset]


def searched_on(runner, model=None) -> str:
    """The fingerprint of the transformer the search ran on (engine.hooks.fingerprint)."""
    from studio.engine.hooks import fingerprint

    return fingerprint(runner.manager.ensure(model or runner.model).pipe.transformer)


def _chosen(names: list[str] | None) -> list[Method]:
    if not names:
        return list(METHODS)
    known = {m.name: m for m in METHODS}
    for n in names:
        if n not in known:
            fail("methods", "methods", n, f"use some of {list(known)}")
    return [known[n] for n in names]


def method_rows(rep: BenchReport, searched: list[Searched], also=()) -> tuple[list[MethodRow], str | None]:
    """Each timed method's and reference's row, fastest first, with paired wins; and the fastest's name (or None)."""
    rows = {r.preset: r for r in rep.matrix.rows}
    paired = {p.preset: p for p in rep.paired}
    entries = [(s.method.name, s.preset.name, s.preset.cache_config.label()) for s in searched if s.preset is not None]
    entries += [(f"reference: {n}", n, rows[n].tag) for n in also if n in rows]
    entries = [e for e in entries if e[1] in rows]
    shown_rows = [e for e in entries if rows[e[1]].speedup is not None]
    fastest = max(shown_rows, key=lambda e: rows[e[1]].speedup)[1] if shown_rows else None
    out = []
    for method, name, label in entries:
        r, p = rows[name], paired.get(name)
        wins_base = p.wins if p else int(bool(r.speedup_lo and r.speedup_lo > 1.0))
        out.append(
            MethodRow(
                method,
                name,
                label,
                r.speedup,
                r.speedup_lo,
                r.speedup_hi,
                r.speedup_note,
                r.floor_db,
                r.ceiling_flip,
                wins_base,
                None if fastest in (None, name) else _wins_over(rep, fastest, name),
                len(rep.rotations),
                r.cached_steps,
                r.full_steps,
            )
        )
    return sorted(out, key=lambda x: -(x.speedup or 0)), fastest


def _wins_over(rep: BenchReport, best: str, name: str) -> int:
    """Requests on which `name` was faster than `best`: their runs round by round, the whole interval over 1."""
    wins = 0
    for rot in rep.rotations:
        if best in rot.runs and name in rot.runs:
            s = shown(rot.ratio(best, name))  # best's time over name's: above 1 where name was faster
            wins += s.lo is not None and s.lo > 1.0
    return wins


def check_floor(floor_db: float | None, max_flip: float | None) -> None:
    if floor_db is not None and not 0 < floor_db < 100:
        raise ConfigError(f"methods: min_psnr={floor_db!r} is not valid: a floor in dB between 0 and 100")
    if max_flip is not None and not 0 < max_flip <= 1:
        raise ConfigError(f"methods: max_flip={max_flip!r} is not valid: a FLIP ceiling between 0 and 1")
