"""`python -m studio bench`: the stack table in one command, with its noise floor and compile's cost. Presets are
timed round-robin (base A B C base') so machine noise hits all alike; base' (base again) is the noise floor; over
several prompts a row takes the median speed-up and the worst PSNR, so one lucky prompt cannot hide a bad stack."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace

from studio.bench.fewer import FewerSteps, applies, fewer_steps_reference, read_rows
from studio.bench.paired import Paired, paired
from studio.bench.rotation import EXTRA_ROUNDS, Rotation, rotate, total_graphs
from studio.bench.twins import cache_twins, with_twins
from studio.bench.vsraw import RawPool
from studio.engine import BASE, Runner
from studio.engine.call import true_cfg
from studio.engine.device import cpu_threads
from studio.measure import pace as machine_pace
from studio.measure.blocks import CachedStepPrice, IdealCheck
from studio.measure.crowding import CoreWatch
from studio.measure.estimate import price_ms, shown, speedup_over
from studio.measure.quality import GOOD_DB, psnr
from studio.measure.record import library_versions
from studio.report.table import AGAIN, Matrix, MatrixRow
from studio.spec.ask import Switches
from studio.spec.checks import ConfigError, check_int
from studio.spec.preset import Preset
from studio.spec.request import GenerationRequest


def resolve_presets(runner: Runner, presets, lib, cache_enabled=None, compile_enabled=None) -> list[Preset]:
    """The presets to time (default: every one-process one), `base` first, the switches applied to all but base."""
    names = list(presets) if presets else lib.one_process_names()
    resolved = [runner.resolve_preset(p, lib) for p in names]
    switches = Switches(cache_enabled, None, compile_enabled)  # (the one rule: spec.ask)
    rest = [switches.apply(p) for p in resolved if p.name != BASE]
    seen = [p.name for p in rest]
    twice = sorted({n for n in seen if seen.count(n) > 1})
    if twice:  # rows, twins and pairs are keyed by name: a second preset of one name would take the first's
        raise ConfigError(f"bench: presets={twice} given twice; name each preset once (a row is read by its name)")
    return [runner.resolve_preset(BASE)] + rest


@dataclass
class NoiseFloor:
    base_vs_itself: float  # base's speed-up over its own second run in each round, the estimator's (1.00 ideally)
    base_vs_itself_lo: float | None = None  # its interval
    base_vs_itself_hi: float | None = None
    spread: dict[str, float] = field(default_factory=dict)  # per preset: (max - min) / median of its timed runs
    compile_vs_eager_db: dict[str, float] = field(default_factory=dict)  # per compiled preset: PSNR against its twin
    # --vs-raw: plain base over plain base in a second process, the same rounds: what two processes of one recipe
    # differ by, the noise floor of studio/raw (None without --vs-raw)
    plain_vs_plain: float | None = None
    plain_vs_plain_lo: float | None = None
    plain_vs_plain_hi: float | None = None


@dataclass
class CostRow:
    preset: str
    compile_s: float | None  # the cold warm-up run that compiled (first prompt)
    graphs: int | None  # graphs compiled by that run; None where torch gave no count
    recompiles: int | None  # graphs compiled after it, during timed runs (0 is what you want); None: no count
    saving_s: float | None  # per image: eager twin's denoise minus the compiled one's (median over prompts)
    payoff_images: float | None  # images before compile pays for itself; inf when it never does


@dataclass
class BenchReport:
    """What `python -m studio bench` measured (studio.report.text.bench_markdown writes it as text)."""

    matrix: Matrix  # one row per preset, aggregated over prompts
    rotations: list[Rotation]
    noise: NoiseFloor
    cost: list[CostRow]
    twins: dict[str, str]
    meta: dict
    crashed: dict[str, str] = field(default_factory=dict)  # stack -> how it killed the device worker (left out)
    # per request shape, base's floor against the fastest this machine has run it (was the machine quiet?)
    pace: list[machine_pace.Pace] = field(default_factory=list)
    paired: list[Paired] = field(default_factory=list)  # over several requests: each stack request by request
    # `python -m lab processes`: each compiled row in each process (lab.processes.ProcessReading)
    processes: list = field(default_factory=list)
    # the compiled rows' process-to-process spread this machine has measured (studio.measure.pace.SpreadSeen)
    process_spread: machine_pace.SpreadSeen | None = None
    fewer: FewerSteps | None = None  # --fewer-steps: base at fewer steps on the same requests (studio.bench.fewer)

    def as_dict(self) -> dict:
        return {
            "paired": [p.as_dict() for p in self.paired],
            **self.meta,
            "rows": [r.as_dict() for r in self.matrix.rows],
            "noise_floor": self.noise.__dict__,
            "compile_cost": [c.__dict__ for c in self.cost],
            "crashed": dict(self.crashed),
            "pace": [p.as_dict() for p in self.pace],
            "processes": [p.as_dict() for p in self.processes],
            "process_spread": self.process_spread.as_dict() if self.process_spread else None,
            "fewer_steps": self.fewer.as_dict() if self.fewer else None,
        }


def row(
    name: str, rots: list[Rotation], base_name: str = BASE, ref: str | None = None, crowded: str = ""
) -> MatrixRow:
    """One preset's row over every prompt's rotation. `ref`: its non-cache twin, its `of ideal`'s reference (None: the
    engine's own reading); `crowded`: what other programs took of the cores, when enough to withhold."""
    ms = [rot.last[name].metrics for rot in rots]
    meds = [rot.median(name) for rot in rots]
    est = replace(speedup_over([rot.pair(base_name, name) for rot in rots]), crowded=crowded)
    psnrs = [m.quality.psnr_db for m in ms if m.quality.psnr_db is not None]
    m0 = ms[0]
    denoise = statistics.median(meds)
    row = MatrixRow(
        preset=name,
        tag=m0.labels.tag,
        denoise_s=denoise,
        step_ms=denoise / max(1, len(m0.timing.step_ms)) * 1e3,
        speedup=est.point,
        psnr_db=statistics.mean(psnrs) if psnrs else None,
        ssim=statistics.mean([m.quality.ssim for m in ms if m.quality.ssim is not None]) if psnrs else None,
        cached_steps=m0.cache.cached_steps,
        full_steps=m0.cache.full_steps,
        quality=str(m0.quality.verdict),
        fallbacks=list(m0.labels.fallbacks),
        runs=[t for rot in rots for t in rot.times[name]],
        label_changes=list(m0.labels.label_changes),
        requested_tag=m0.labels.requested_tag,
    )
    row.speedup_lo, row.speedup_hi, row.timed_pairs = est.lo, est.hi, est.pairs
    if name == base_name:  # base against itself, the same runs: exact
        row.speedup_lo = row.speedup_hi = None
    elif name != AGAIN:  # base against its second run IS the noise floor, not a speed-up: always shown
        s = shown(est, helps="more --repeats")
        row.speedup, row.speedup_lo, row.speedup_hi, row.speedup_note = s.point, s.lo, s.hi, s.note
    row.worst_psnr_db = min(psnrs) if psnrs else None
    flips = [m.quality.flip for m in ms if m.quality.flip is not None]
    row.flip, row.worst_flip = (statistics.mean(flips), max(flips)) if flips else (None, None)
    lp = [m.quality.lpips for m in ms if m.quality.lpips is not None]
    row.lpips = statistics.mean(lp) if lp else None
    row.mean_psnr_db = row.psnr_db
    row.prompts = len(rots)
    row.cached_by_prompt = [m.cache.cached_steps for m in ms]
    _of_ideal(row, ms, rots, name, ref)
    _memory(row, ms)
    row.compile_s = rots[0].first[name].metrics.timing.compile_s
    row.fallbacks += sorted({f"plain run: {rot.raw_errors[name]}" for rot in rots if name in rot.raw_errors})
    if all(name in rot.raw_times for rot in rots):
        row.raw_denoise_s = statistics.median(statistics.median(rot.raw_times[name]) for rot in rots)
        # the plain runs over the studio's, paired round by round: raw's speed-up over the studio is studio/raw
        plain = [(r.raw_runs[name], r.runs[name]) for r in rots]  # step by step, each side's steps at their fastest
        over = speedup_over(plain)
        row.studio_over_raw, row.studio_over_raw_lo, row.studio_over_raw_hi = 1 / over.point, 1 / over.hi, 1 / over.lo
        row.raw_psnr_db = min(psnr(rot.last[name].image, rot.raw_images[name]) for rot in rots)
    return row


def _meta(runner, requests, resolved, rots, model, repeats, *, twins, refs, vs_raw, crowding) -> dict:
    dtype = rots[0].last[BASE].metrics.labels.dtype
    return {
        "model": model or runner.model,
        "device": str(runner.manager.device),
        "dtype": dtype,
        # what two benches must share to be compared (measure.pace: the record of this machine)
        "machine": _machine(runner, model or runner.model, dtype),
        "versions": library_versions(),
        "repeats": repeats,
        "rounds": [r.rounds for r in rots],  # per prompt: the repeats and any extra rounds (studio.bench.rotation)
        "rounds_stop": [r.stop for r in rots],
        "prompts": [r.prompt for r in requests],
        "request": requests[0].as_dict(),
        "presets": {p.name: p.as_dict() for p in resolved},
        "eager_twins": twins,
        "cache_twins": refs,
        "vs_raw": vs_raw,
        # what other programs and the host took of the cores over the rounds (measure.crowding; None: not read)
        "cores_taken": crowding.taken if crowding is not None else None,
        "cores_host": crowding.host if crowding is not None else None,
    }


def _memory(row: MatrixRow, ms: list) -> None:
    """The row's peak memory (the highest of its runs) and bytes streamed per step (the median of its runs)."""
    peaks = [
        m.memory.peak_memory for m in ms if m.memory.peak_memory and m.memory.peak_memory.get("peak_bytes") is not None
    ]
    if peaks:
        top = max(peaks, key=lambda p: p["peak_bytes"])
        row.peak_mem_bytes, row.peak_mem_kind = top["peak_bytes"], top["kind"]
    pairs = (("h2d_full_bytes", "h2d_bytes_per_full_step"), ("h2d_cached_bytes", "h2d_bytes_per_cached_step"))
    for attr, key in pairs:
        vals = [m.memory.h2d[key] for m in ms if m.memory.h2d and m.memory.h2d.get(key) is not None]
        setattr(row, attr, int(statistics.median(vals)) if vals else None)


def _of_ideal(row: MatrixRow, ms: list, rots: list[Rotation], name: str, ref: str | None) -> None:
    """The row's `of ideal`: against its non-cache twin timed in the same rounds, or as the engine read it."""
    ideal = [m.ideal.ideal_speedup for m in ms if m.ideal.ideal_speedup]
    if not ideal:
        return
    row.ideal_speedup = statistics.median(ideal)
    if ref is None:
        row.of_ideal = statistics.median(m.ideal.of_ideal for m in ms) if all(m.ideal.of_ideal for m in ms) else None
        row.of_ideal_against = ms[0].ideal.of_ideal_against
        return
    measured = speedup_over([rot.pair(ref, name) for rot in rots])
    if measured.useless:  # a busy machine: no reading rather than a wrong one
        row.of_ideal_against = ref
        return
    check = IdealCheck(row.ideal_speedup, measured, ref, _price(ms[0]))
    row.of_ideal, row.of_ideal_against = check.of_ideal, ref
    row.of_ideal_lo, row.of_ideal_hi = check.of_ideal_range or (None, None)
    why = check.why_not_shown()
    if why:
        row.fallbacks.append(f"of ideal: {why}")


def _price(m) -> CachedStepPrice:
    d = m.ideal.ideal_detail
    return CachedStepPrice(d["share"], d["full_step_ms"], d["skipped_ms"], d["source"], tuple(d["block_ms"]))


def _noise(rots: list[Rotation], names: list[str], twins: dict[str, str]) -> NoiseFloor:
    aa = speedup_over([rot.pair(BASE, AGAIN) for rot in rots])
    spread = {}
    for n in names + [AGAIN]:
        spread[n] = max((max(rot.times[n]) - min(rot.times[n])) / rot.median(n) for rot in rots)
    cve = {}
    for c, t in twins.items():
        cve[c] = min(psnr(rot.last[c].image, rot.last[t].image) for rot in rots)
    noise = NoiseFloor(aa.point, aa.lo, aa.hi, spread, cve)
    if all(BASE in rot.raw_runs and AGAIN in rot.raw_runs for rot in rots):
        pp = speedup_over([(rot.raw_runs[BASE], rot.raw_runs[AGAIN]) for rot in rots])
        noise.plain_vs_plain, noise.plain_vs_plain_lo, noise.plain_vs_plain_hi = pp.point, pp.lo, pp.hi
    return noise


def _pace(runner: Runner, rots: list[Rotation], model: str, crowding=None) -> list[machine_pace.Pace]:
    """Per request shape, base's floor per step against this machine's record (was the machine quiet?)."""
    import torch

    by_work: dict[str, list[Rotation]] = {}
    for rot in rots:
        q = rot.request
        calls = 2 if true_cfg(runner.manager.current.pipe, q) else 1
        work = machine_pace.work_of(q, calls)
        by_work.setdefault(work, []).append(rot)
    m = runner.manager
    out = []
    for work, group in by_work.items():
        runs = [r for rot in group for r in rot.runs[BASE] + rot.runs.get(AGAIN, [])]
        per_step = price_ms(runs) / max(1, len(runs[0].step_ms))
        dtype = group[0].last[BASE].metrics.labels.dtype
        key = machine_pace.pace_key(
            device=str(m.device), threads=torch.get_num_threads(), model=model, dtype=dtype, work=work
        )
        agree = speedup_over([rot.pair(BASE, AGAIN) for rot in group]).spread
        taken = crowding.taken if crowding is not None else None
        out.append(machine_pace.record(runner.manager.settings.pace_file, key, per_step, agree, taken))
    return out


def _machine(runner: Runner, model: str, dtype: str) -> str:
    import torch

    return machine_pace.machine_key(
        device=str(runner.manager.device), threads=torch.get_num_threads(), model=model, dtype=dtype
    )


def _cost(rots: list[Rotation], twins: dict[str, str]) -> list[CostRow]:
    out = []
    for c, t in twins.items():
        first = rots[0].first[c].metrics
        saving = statistics.median(rot.median(t) - rot.median(c) for rot in rots)
        cold = first.timing.compile_s
        pay = (cold / saving if saving > 0 else math.inf) if cold is not None else None
        graphs = total_graphs(rot.cold_graphs.get(c, 0) for rot in rots)
        recompiles = total_graphs(rot.recompiles.get(c, 0) for rot in rots)
        out.append(CostRow(c, cold, graphs, recompiles, saving, pay))
    return out


def _without(resolved: list[Preset], twins: dict, refs: dict, gone: set) -> tuple[list[Preset], dict, dict]:
    """The presets and twin pairings less the stacks in `gone`; a pairing goes when either side does."""
    if BASE in gone:
        raise ConfigError("base cannot be left out of a bench: every speed-up is measured against it")
    keep = [p for p in resolved if p.name not in gone]
    pairs = [{a: b for a, b in d.items() if a not in gone and b not in gone} for d in (twins, refs)]
    return keep, pairs[0], pairs[1]


def _rounds(runner: Runner, requests, resolved, repeats, model, tick, *, vs_raw, extra, on_extra, tighten):
    """(every prompt's rotation, what other programs took of the cores meanwhile; None off the CPU)."""
    raw = None
    if vs_raw:
        raw = RawPool(runner, model)
    threads = cpu_threads(runner.manager.device)
    kw = dict(raw=raw, extra=extra, on_extra=on_extra, tighten=tighten)
    try:
        with CoreWatch(threads or 1, helpers=raw.pids if raw is not None else None) as watch:
            kw["crowded"] = (lambda: watch.peek().crowded) if threads is not None else None
            rots = [rotate(runner, req, resolved, repeats, model, tick, **kw) for req in requests]
    finally:
        if raw is not None:
            raw.close()
    return rots, (watch.result if threads is not None else None)


def run_bench(
    runner: Runner,
    requests: list[GenerationRequest],
    presets: list[str | Preset] | None = None,
    *,
    model: str | None = None,
    repeats: int = 3,
    progress=None,
    cache_enabled: bool | None = None,
    compile_enabled: bool | None = None,
    library=None,
    vs_raw: bool = False,
    exclude=(),
    extra_rounds: int | None = None,
    floor_db: float = GOOD_DB,
    max_flip: float | None = None,
    tighten: bool = True,
    fewer_steps: bool = False,
) -> BenchReport:
    """The bench (module doc); `progress(done, total, label)` after each timed run; `exclude`: stacks left out after
    the twins are added (those that crashed the worker); `extra_rounds` (None: EXTRA_ROUNDS), `tighten`: rotate's."""
    check_int("bench", "repeats", repeats, lo=1)  # none: no timed run, nothing to divide
    if fewer_steps and not applies(requests):  # asked for, and no answer: said before anything runs
        raise ConfigError(
            "bench: fewer_steps=True needs text-to-image requests of one step count (base at fewer steps is no rival "
            "to a request that runs a share of the schedule); drop --fewer-steps"
        )
    extra_rounds = EXTRA_ROUNDS if extra_rounds is None else extra_rounds
    check_int("bench", "extra_rounds", extra_rounds, lo=0)
    lib = library or runner.presets
    resolved, twins = with_twins(resolve_presets(runner, presets, lib, cache_enabled, compile_enabled))
    resolved, refs = cache_twins(resolved)  # each cached preset's `of ideal` against the same stack uncached
    resolved, twins, refs = _without(resolved, twins, refs, set(exclude))
    per_round = len(resolved) * (2 if vs_raw else 1) + 1
    done, total = [0], [len(requests) * repeats * per_round]

    def tick(label):
        done[0] += 1
        if progress:
            progress(done[0], total[0], label)

    def on_extra():  # an extra round: the progress bar's end moves with it
        total[0] += per_round

    rots, crowding = _rounds(
        runner,
        requests,
        resolved,
        repeats,
        model,
        tick,
        vs_raw=vs_raw,
        extra=extra_rounds,
        on_extra=on_extra,
        tighten=tighten,
    )
    crowded = crowding.words() if crowding is not None and crowding.crowded else ""
    names = [p.name for p in resolved]
    rows = [row(n, rots, ref=refs.get(n), crowded=crowded) for n in names]
    mat = Matrix(requests[0], model or runner.model, rows, rots[0].last, repeats)
    meta = _meta(
        runner, requests, resolved, rots, model, repeats, twins=twins, refs=refs, vs_raw=vs_raw, crowding=crowding
    )
    pairs = paired(rots, names, floor_db, max_flip, crowded) if len(rots) > 1 else []
    noise = _noise(rots, names, twins)
    rep = BenchReport(mat, rots, noise, _cost(rots, twins), twins, meta, paired=pairs)
    rep.pace = _pace(runner, rots, model or runner.model, crowding)
    judge = fewer_steps_reference(runner, requests, model, floor_db=floor_db) if fewer_steps else None
    if judge is not None:
        read_rows(judge, mat.rows)
        rep.fewer = judge.result
    return rep
