"""`python -m studio tune --min-psnr 35 [--max-flip 0.05]`: the fastest stack whose worst PSNR (and FLIP) over the
prompts stays above the floor. 1. the non-cache options with a margin (compile, the device's 8-bit form, attention:
the arms every cache is crossed with), the fastest first; 2. DBCache's knobs screened eagerly on the fastest (a binary
search of the threshold per calibrator, run cap and warm-up, then step masks), ranked by predicted speed-up, and every
other step-cache method's knob searched on each arm as `methods` searches it; 3. the best few DBCache settings (the
best on every arm), each method's best on every arm and base at the fewest steps that keep the floor, timed side by
side: the highest worst paired speed-up wins (so the answer may be another method, another arm, or "run fewer
steps"); 4. a cached result against fewer steps at its speed."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace

from studio.bench.bench import run_bench
from studio.bench.fewer import fewer_steps_reference
from studio.bench.ladders import METHODS
from studio.bench.methods import MethodSearch, searched_on
from studio.bench.records import Candidate, Finalist, TuneResult
from studio.bench.screening import flip_ok, screen_prompts
from studio.bench.twins import eager_stack
from studio.engine import BASE
from studio.report.text import tuned_description
from studio.spec.ask import Switches
from studio.spec.checks import ConfigError, fail
from studio.spec.preset import CacheSpec, Preset

CALIBRATORS = {"none": {}, "taylorseer": {"enable_taylorseer": True}, "dmd": {"enable_dmd": True}}
# the step-cache methods searched beside DBCache's own knobs (DBCache with each calibrator is the search above)
OTHER_METHODS = tuple(m.name for m in METHODS if m.name not in ("dbcache", "dbcache+taylorseer", "dbcache+dmd"))
MARGIN_DB = 3.0  # a non-cache option must keep this much above the floor, to leave room for the cache
FLIP_MARGIN = 0.5  # ... and at most this share of the FLIP ceiling (FLIP is concave: half leaves the cache room)


@dataclass(frozen=True)
class SearchSpace:
    thresholds: tuple = (0.04, 0.06, 0.08, 0.12, 0.16, 0.2, 0.24, 0.3, 0.36, 0.44, 0.52, 0.64, 0.8, 1.0, 1.5, 2.0)
    calibrators: tuple = tuple(CALIBRATORS)
    run_caps: tuple = (3, 5)
    warmups: tuple = (4, 2)
    masks: tuple = ("medium", "fast")
    non_cache: tuple = ("base", "compile", "int8", "sage", "sage-int8")
    finalists: int = 3
    repeats: int = 3
    fewer_steps: bool = True  # base at the fewest steps that keep the floor is a finalist too (Preset.step_share)
    methods: tuple = OTHER_METHODS  # each searched on the non-cache option, its best a finalist (bench.methods)


# The UI's quick search: no DMD, one run-length cap and warm-up, no masks, no other method, two finalists, single
# timed repeats.
QUICK = SearchSpace(
    calibrators=("none", "taylorseer"), run_caps=(3,), warmups=(4,), masks=(), finalists=2, repeats=1, methods=()
)


def _switched(lib, names: list[str], compile_enabled: bool | None, runs=None) -> dict[str, Preset]:
    """The non-cache options with the compile switch applied, one per stack as it runs (`runs`: a preset's stack as
    it runs here, so `sage` where SageAttention falls back is `base`; a preset as shipped before a switched one that
    runs the same: `compile.override` with compile off is `base`), by name."""
    options = [Switches(compile=compile_enabled).apply(lib.get(n)) for n in names]  # (the one rule: spec.ask)
    key = runs or (lambda p: p.stack)
    by_stack: dict[tuple, Preset] = {}
    for p in sorted(options, key=lambda p: p.name.endswith(".override")):
        by_stack.setdefault(key(p), p)
    return {p.name: p for p in options if by_stack[key(p)] is p}


def runs_here(manager):
    """A preset's stack as it runs on `manager`'s device: the attention a run would fall back to in place of the
    asked one (studio.engine.resolve)."""
    from studio.engine.resolve import resolved

    def stack(p: Preset) -> tuple:
        form = resolved(p, manager.profile, manager.settings.dtype).get("attention", (p.attention_backend, ""))[0]
        return replace(p, attention_backend=form).stack

    return stack


class Tuner:
    def __init__(
        self,
        runner,
        requests,
        floor_db: float,
        model=None,
        progress=None,
        space: SearchSpace | None = None,
        *,
        compile_enabled: bool | None = None,
        max_flip: float | None = None,
        search_requests=None,
    ):
        self.runner, self.requests, self.floor, self.model = runner, list(requests), floor_db, model
        # the search's prompts (screening, the non-cache choice, the fewest steps); the finalists are timed on
        # `requests`, which it did not see where they differ (a held-out test, as `methods --search-prompts`)
        self.search = list(search_requests or requests)
        self.max_flip = max_flip  # a ceiling on FLIP's mean error for the worst prompt (None: PSNR alone)
        self.compile_enabled = compile_enabled  # the compile switch, on the non-cache options (None: as shipped)
        self.space = space or SearchSpace()
        self.progress = progress or (lambda msg: None)
        self.screened = 0
        self.timed = 0
        self.curve: list[tuple[float, float, float | None]] = []
        self.order = list(range(len(self.search)))  # search prompts, the worst so far first
        self.searched: list[dict] = []  # the other methods' searches (bench.methods.Searched.as_dict, and `on`)
        self.arms: list[Preset] = []  # the non-cache options that keep the floor and the margin, the fastest first

    # 1 -----------------------------------------------------------------------------------------------------------
    def best_non_cache(self) -> Preset:
        lib = self.runner.presets
        names = [n for n in self.space.non_cache if n in lib.names()]
        options = _switched(lib, names, self.compile_enabled, runs_here(self.runner.manager))
        self.progress(f"timing the non-cache options: {', '.join(options)}")
        rep = run_bench(
            self.runner, self.search[:1], list(options.values()), model=self.model, repeats=self.space.repeats
        )
        self.timed += sum(len(r.runs) for r in rep.matrix.rows)
        ok = [
            r
            for r in rep.matrix.rows
            if r.preset in options
            and (r.psnr_db or 0) >= self.floor + MARGIN_DB
            and self._flip_ok(r.flip, FLIP_MARGIN)
        ]
        ok.sort(key=lambda r: -(r.speedup or 0))
        self.arms = [options[r.preset] for r in ok]  # every option with room for a cache, the fastest first
        best = ok[0] if ok else None
        if best is None:  # with compile forced on, base is not among the options
            raise ConfigError(
                f"no non-cache option ({', '.join(options)}) keeps {self.floor + MARGIN_DB:g} dB (the floor and "
                f"{MARGIN_DB:g} dB for the cache){self._flip_words(FLIP_MARGIN)} on the first prompt: lower --min-psnr"
                f"{', raise --max-flip' if self.max_flip is not None else ''}, or drop --compile true"
            )
        return options[best.preset]

    def _flip_ok(self, flip: float | None, share: float = 1.0) -> bool:
        return flip_ok(flip, self.max_flip, share)

    def _flip_words(self, share: float = 1.0) -> str:
        return "" if self.max_flip is None else f" and FLIP <= {self.max_flip * share:g}"

    # 2 -----------------------------------------------------------------------------------------------------------
    def evaluate(self, stack: Preset, cache: CacheSpec) -> Candidate:
        """Worst PSNR and FLIP over the prompts (stopping at the first that fails) and the predicted speed-up."""
        p = replace(stack, name="tuning", cache_config=cache, compile=replace(stack.compile, enabled=False))
        s = screen_prompts(
            self.runner, self.search, p, self.model, floor_db=self.floor, max_flip=self.max_flip, order=self.order
        )
        self.screened += s.runs
        if s.failed is not None:
            self.order.remove(s.failed)
            self.order.insert(0, s.failed)  # this prompt first next time: failures end candidates sooner
        cand = Candidate(cache, s.worst_db, s.worst_flip, s.passed, cached=s.cached)
        cand.predicted = statistics.mean(s.predicted) if s.passed else 1.0  # cached steps costing their Fn+Bn blocks
        return cand

    def search_threshold(self, stack: Preset, cache: CacheSpec) -> Candidate | None:
        """The largest threshold of the space's that meets the floor (binary search: quality falls as it rises)."""
        ths, sp = self.space.thresholds, self.space
        lo, hi, best = 0, len(ths) - 1, None
        while lo <= hi:
            mid = (lo + hi) // 2
            c = self.evaluate(stack, replace(cache, residual_diff_threshold=ths[mid]))
            first = (cache.max_warmup_steps, cache.max_continuous_cached_steps) == (sp.warmups[0], sp.run_caps[0])
            if cache.calibrator == "none" and first:  # the search's own sweep, shown as the tuner's curve
                self.curve.append((ths[mid], c.predicted, c.worst_db))
            if c.passed:
                best, lo = c, mid + 1
            else:
                hi = mid - 1
        return best

    def candidates(self, stack: Preset) -> list[Candidate]:
        base_cache = self.runner.presets.get("cache").cache_config
        out = []
        for cal in self.space.calibrators:
            knobs = CALIBRATORS[cal]
            for cap in self.space.run_caps:
                for w in self.space.warmups:
                    self.progress(
                        f"searching the threshold: calibrator {cal}, at most {cap} cached in a row, warm-up {w}"
                    )
                    spec = replace(base_cache, max_continuous_cached_steps=cap, max_warmup_steps=w, **knobs)
                    c = self.search_threshold(stack, spec)
                    if c:
                        out.append(c)
        best = max(out, key=lambda c: c.predicted, default=None)
        if best is not None:
            for (
                mask
            ) in self.space.masks:  # a step mask on top of the best: computes fixed steps, caches where R allows
                self.progress(f"trying step mask {mask}")
                c = self.evaluate(
                    stack, replace(best.cache, steps_computation_mask=mask, steps_computation_policy="dynamic")
                )
                if c.passed:
                    out.append(c)
        return sorted(out, key=lambda c: -c.predicted)

    def other_methods(self, name: str) -> list[Preset]:
        """Each method of the space crossed with every non-cache option that leaves room for a cache (`arms`: what
        compile or the 8-bit form gains, a method may lose, as a hook cache under compile): its most aggressive knob
        that keeps the floor, searched once per eager stack (screening is eager: compiled and eager arms share it;
        studio.bench.methods.MethodSearch), then a finalist on each arm of that stack, named for the arm where it is
        not the fastest; a method an arm refuses is left out there, said."""
        groups: dict[tuple, list[Preset]] = {}
        for arm in self.arms:
            groups.setdefault(eager_stack(arm), []).append(arm)
        out = []
        for arms in groups.values():
            search = MethodSearch(
                self.runner, self.search, self.floor, self.max_flip, self.model, self.progress, arms[0]
            )
            for m in (m for m in METHODS if m.name in self.space.methods):
                found = search.run(m)
                self.screened += found.screened
                self.searched.append({**found.as_dict(), "on": [a.name for a in arms]})
                if found.preset is None:
                    self.progress(f"{m.name} on {arms[0].name}: {found.refused or found.note}")
                    continue
                for arm in arms:  # timed as the arm runs (compiled where it is)
                    named = f"{name}-{m.best_name}" + ("" if arm is self.arms[0] else f"-on-{arm.name}")
                    out.append(replace(found.preset, name=named, compile=arm.compile, description=""))
        return out

    # 3 -----------------------------------------------------------------------------------------------------------
    def _fewer_finalists(self, judge, name: str, stack: Preset) -> list[Preset]:
        """Base at the fewest steps whose worst PSNR (and FLIP) keeps the floor on the search prompts, as a preset
        that runs that share of a request's steps, and the non-cache option at the same share where it is not base
        (the final bench judges its pictures); none where no step count below the request's keeps it."""
        fewest = judge.result.fewest if judge is not None and self.space.fewer_steps else None
        if fewest is None or fewest.steps >= fewest.full or not self._flip_ok(fewest.worst_flip):
            return []
        k, n = fewest.steps, fewest.full
        share = math.floor(k / n * 1000) / 1000  # a share a person reads (0.178) ...
        share = share if replace(stack, step_share=share).steps_of(n) == k else k / n  # ... that still runs k of n
        base = self.runner.resolve_preset(BASE)
        out = [replace(base, name=f"{name}-fewer", description="", step_share=share)]
        if stack.stack != base.stack:
            out.append(replace(stack, name=f"{name}-{stack.name}-fewer", description="", step_share=share))
        return out

    def _fewer(self, requests):
        """Base at fewer steps on `requests` (studio.bench.fewer; None: an image input, where it is no rival)."""
        return fewer_steps_reference(self.runner, requests, self.model, floor_db=self.floor, progress=self.progress)

    def _pick(self, rep, finalists: list[Preset]) -> Preset:
        """The finalist that keeps the floor once timed with the best worst paired speed-up (median breaks a tie)."""
        rows = {r.preset: r for r in rep.matrix.rows}
        worst = {p.preset: p.worst_speedup for p in rep.paired}
        ok = [
            f
            for f in finalists
            if (rows[f.name].worst_psnr_db or 0) >= self.floor and self._flip_ok(rows[f.name].worst_flip)
        ]
        if not ok:
            raise ConfigError(
                f"no finalist kept every prompt above {self.floor:g} dB{self._flip_words()} once timed; lower "
                f"--min-psnr{' or raise --max-flip' if self.max_flip is not None else ''}"
            )
        return max(ok, key=lambda f: (worst.get(f.name) or 0, rows[f.name].speedup or 0))

    def run(self, name: str) -> TuneResult:
        stack = self.best_non_cache()
        self.progress(f"non-cache options: {stack.name} ({stack.tag()})")
        cands = self.candidates(stack)
        finalists = [
            replace(stack, name=f"{name}-{i + 1}", cache_config=c.cache, description="")
            for i, c in enumerate(cands[: self.space.finalists])
        ]
        if cands and self.space.methods:  # DBCache's best on the other arms too, as every other method runs there
            top = cands[0].cache
            finalists += [
                replace(a, name=f"{name}-1-on-{a.name}", cache_config=top, description="") for a in self.arms[1:]
            ]
        finalists += self.other_methods(name)
        judge = self._fewer(self.search)
        finalists += self._fewer_finalists(judge, name, stack)
        if judge is not None and self.search != self.requests:  # the rival on the prompts the finalists are timed on
            judge = self._fewer(self.requests)
        if not finalists:
            raise ConfigError(
                f"no cache setting keeps every prompt above {self.floor:g} dB{self._flip_words()}; lower --min-psnr"
            )
        self.progress(f"timing {len(finalists)} finalists beside base and cache")
        rep = run_bench(
            self.runner,
            self.requests,
            ["cache"] + finalists,
            model=self.model,
            repeats=self.space.repeats,
            floor_db=self.floor,
            max_flip=self.max_flip,
        )
        self.timed += sum(len(r.runs) for r in rep.matrix.rows)
        win = self._pick(rep, finalists)
        rows = {x.preset: x for x in rep.matrix.rows}
        r, cache_row = rows[win.name], rows["cache"]
        vs_cache = r.speedup / cache_row.speedup if r.speedup and cache_row.speedup else None
        pair = next((p for p in rep.paired if p.preset == win.name), None)
        rival = judge is not None and win.step_share is None  # (None: an image input; or fewer steps won)
        vs_fewer = judge.versus(r.speedup, r.worst_psnr_db) if rival else None
        desc = tuned_description(
            self.floor,
            len(self.requests),
            worst_db=r.worst_psnr_db,
            speedup=r.speedup,
            interval=(r.speedup_lo, r.speedup_hi),
            vs_cache=vs_cache,
            on=f"{rep.meta['device']} {rep.meta['dtype']}",
            max_flip=self.max_flip,
            worst_flip=r.worst_flip,
            worst_paired=pair.worst_speedup if pair else None,
        )
        return TuneResult(
            replace(win, name=name, description=desc, tuned_for=searched_on(self.runner, self.model)),
            self.floor,
            r.worst_psnr_db,
            r.speedup,
            vs_cache,
            self.screened,
            self.timed,
            cands,
            stack.name,
            sorted(self.curve),
            prompts=[q.prompt for q in self.requests],
            search_prompts=[q.prompt for q in self.search],
            speedup_lo=r.speedup_lo,
            speedup_hi=r.speedup_hi,
            max_flip=self.max_flip,
            worst_flip=r.worst_flip,
            paired=pair.as_dict() if pair else None,
            pace=list(rep.pace),
            fewer=judge.result if judge else None,
            vs_fewer=vs_fewer,
            finalists=[Finalist.of(rows[f.name], f, win is f) for f in finalists],
            methods=list(self.searched),
        )


def tune(
    runner,
    requests,
    floor_db: float,
    *,
    name: str | None = None,
    model=None,
    progress=None,
    space=None,
    cache_enabled: bool | None = None,
    compile_enabled: bool | None = None,
    max_flip: float | None = None,
    search_requests=None,
) -> TuneResult:
    """See the module doc; `compile_enabled` applies to the non-cache options; `search_requests`: the search's
    prompts (default `requests`; others make the finalists' bench a held-out test)."""
    if cache_enabled is False:
        fail(
            "tune",
            "cache",
            False,
            "the tuner searches the step cache's knobs (and base at fewer steps beside them): leave "
            "the cache switch out (`python -m studio bench --cache false` times stacks without a cache)",
        )
    name = name or f"tuned-{floor_db:g}db".replace(".", "_")
    runner.generate(requests[0], BASE, model=model)  # load and fail early on a model that cannot run
    tuner = Tuner(
        runner,
        requests,
        floor_db,
        model,
        progress,
        space,
        compile_enabled=compile_enabled,
        max_flip=max_flip,
        search_requests=search_requests,
    )
    return tuner.run(name)
