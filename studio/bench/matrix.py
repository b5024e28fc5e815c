"""Benchmarks measured side by side in one process: the preset matrix and the threshold sweep.

Timings are medians over repeats taken round-robin (base, A, B, ..., base, A, B, ...), after the engine's untimed
warm-up of each stack, so machine noise hits every preset alike; speed-ups are ratios of those medians.
"""

from __future__ import annotations

import statistics

from studio.engine.session import BASE, Runner
from studio.report.table import Matrix, MatrixRow
from studio.spec.preset import Preset
from studio.spec.request import GenerationRequest


def run_matrix(
    runner: Runner,
    request: GenerationRequest,
    presets: list[str | Preset] | None = None,
    *,
    model: str | None = None,
    repeats: int = 1,
    on_status=None,
    cache_enabled: bool | None = None,
    compile_enabled: bool | None = None,
    presets_library=None,
) -> Matrix:
    """Run every preset (base always included, first) on one request; see the module doc for the method.

    Args:
        cache_enabled, compile_enabled: the per-request switches, applied to every preset but base.
        presets_library: where preset names are looked up (a visitor's own library); the runner's by default.
    """
    lib = presets_library or runner.presets
    names = list(presets) if presets else lib.one_process_names()
    resolved = [runner.resolve_preset(p, lib) for p in names]
    if not any(p.name == BASE for p in resolved):
        resolved.insert(0, runner.resolve_preset(BASE))
    resolved.sort(key=lambda p: p.name != BASE)
    resolved = [p if p.name == BASE else p.with_overrides(cache_enabled, None, compile_enabled) for p in resolved]
    times: dict[str, list[float]] = {p.name: [] for p in resolved}
    last: dict = {}
    total = len(resolved) * repeats
    done = 0
    for _ in range(repeats):
        for p in resolved:
            if on_status:
                on_status(f"{p.name}: run {done + 1} of {total}")
            # The bench times base itself in the rotation, so the runner need not re-time it.
            res = runner.generate(request, p, model=model, refresh_base=False)
            done += 1
            times[p.name].append(res.metrics.denoise_s)
            last[p.name] = res
    base_t = statistics.median(times[BASE])
    rows = []
    for p in resolved:
        m = last[p.name].metrics
        med = statistics.median(times[p.name])
        rows.append(
            MatrixRow(
                preset=p.name,
                tag=m.tag,
                denoise_s=med,
                step_ms=med / max(1, request.steps) * 1e3,
                speedup=base_t / med if med > 0 else None,
                psnr_db=m.psnr_db,
                ssim=m.ssim,
                cached_steps=m.cached_steps,
                full_steps=m.full_steps,
                quality=str(m.quality),
                fallbacks=m.fallbacks,
                runs=times[p.name],
            )
        )
    return Matrix(request, model or runner.model, rows, last, repeats)
