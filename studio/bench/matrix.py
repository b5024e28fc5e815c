"""The preset matrix (the UI's Matrix tab and /matrix): the bench on one request, `base (again)` its last row. Only the
presets asked are timed (no twins: the public limits and reserved GPU time count runs), and on ZeroGPU exactly the
rounds asked for (app.gpu_time.matrix_s reserved them; extra rounds would be cut or charged)."""

from __future__ import annotations

from dataclasses import replace

from studio.bench.bench import resolve_presets, row, run_bench
from studio.bench.fewer import FewerSteps, FewerStepsJudge, applies, read_rows
from studio.bench.twins import cache_twins, with_twins
from studio.engine import Runner
from studio.measure.quality import GOOD_DB
from studio.report.table import AGAIN, Matrix
from studio.spec.preset import Preset
from studio.spec.request import GenerationRequest


def _twins_added(presets: list[Preset]) -> tuple[str, ...]:
    """The twins the bench adds beside `presets` (eager and non-cache, studio.bench.twins): left out of a Matrix."""
    asked = {p.name for p in presets}
    full, _ = cache_twins(with_twins(presets)[0])
    return tuple(p.name for p in full if p.name not in asked)


def run_matrix(
    runner: Runner,
    request: GenerationRequest,
    presets: list[str | Preset] | None = None,
    *,
    model: str | None = None,
    repeats: int = 1,
    progress=None,
    library=None,
    prompts: tuple | list = (),
    fewer_steps: bool = True,
) -> Matrix:
    """Every preset (base first) on the request and on each of `prompts` in its place, paired per prompt; `library`:
    where preset names are looked up (a visitor's own); `fewer_steps`: cached rows read against fewer steps."""
    lib = library or runner.presets
    asked = resolve_presets(runner, presets, lib)  # base first
    more = [p for p in dict.fromkeys(prompts) if p and p != request.prompt]
    rep = run_bench(
        runner,
        [request] + [replace(request, prompt=p) for p in more],
        asked,
        model=model,
        repeats=repeats,
        progress=progress,
        library=lib,
        exclude=_twins_added(asked),
        extra_rounds=0 if runner.manager.settings.zerogpu else None,
        tighten=False,  # extra rounds only for a withheld row: each round is the visitor's wait
    )
    rows = rep.matrix.rows + [row(AGAIN, rep.rotations)]
    requests = [request] + [replace(request, prompt=p) for p in more]
    fewer = against_fewer_steps(runner, requests, rows, model) if fewer_steps else None
    return Matrix(request, model or runner.model, rows, rep.rotations[0].last, repeats, rep.paired, fewer)


def against_fewer_steps(runner: Runner, requests: list[GenerationRequest], rows, model=None) -> FewerSteps | None:
    """Each cached row with a speed-up shown against base at fewer steps; None: no such row, or not text-to-image."""
    cached = [r for r in rows if r.cached_steps > 0 and r.speedup is not None and r.speedup > 1.0]
    if not cached or not applies(requests):
        return None
    judge = FewerStepsJudge(runner, requests, model, floor_db=GOOD_DB)
    read_rows(judge, cached)
    return judge.result
