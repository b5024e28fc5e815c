"""The preset matrix (the UI's Matrix tab and /matrix): every preset side by side on one request.

Timings are medians over repeats taken round-robin (base, A, B, ..., base', base, A, B, ..., base'), after the engine's
untimed warm-up of each stack, so machine noise hits every preset alike; speed-ups are ratios of those medians. base'
(the row `base (again)`) is base timed again last in each round: its speed-up against base is the noise floor (on a
busy machine a run's slot in the round moves it by several percent; this row shows by how much on this run).
"""

from __future__ import annotations

from studio.bench.bench import resolve_presets, rotate, row
from studio.engine import Runner
from studio.report.table import AGAIN, Matrix
from studio.spec.preset import Preset
from studio.spec.request import GenerationRequest


def run_matrix(
    runner: Runner,
    request: GenerationRequest,
    presets: list[str | Preset] | None = None,
    *,
    model: str | None = None,
    repeats: int = 1,
    progress=None,
    cache_enabled: bool | None = None,
    compile_enabled: bool | None = None,
    presets_library=None,
) -> Matrix:
    """Run every preset (base always included, first) on one request: the bench's round robin (studio.bench.bench),
    base again last in each round (the last row, `base (again)`), for the UI's Matrix tab and its API.

    Args:
        progress: callable(done, total, label) after each timed run.
        cache_enabled, compile_enabled: the per-request switches, applied to every preset but base.
        presets_library: where preset names are looked up (a visitor's own library); the runner's by default.
    """
    resolved = resolve_presets(runner, presets, presets_library or runner.presets, cache_enabled, compile_enabled)
    total, done = (len(resolved) + 1) * repeats, [0]

    def tick(label):
        done[0] += 1
        if progress:
            progress(done[0], total, label)

    rot = rotate(runner, request, resolved, repeats, model, tick)
    rows = [row(p.name, [rot]) for p in resolved] + [row(AGAIN, [rot])]
    return Matrix(request, model or runner.model, rows, rot.last, repeats)
