"""`python -m studio doctor`: every shipped preset on a tiny instance of every DiT family, on this machine. Weights are
random, so cached presets run at CACHING_THRESHOLD (one that caches on random weights), and the table says so."""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from studio.engine import ModelManager, Runner
from studio.measure.quality import Verdict
from studio.spec import PresetLibrary
from studio.spec.profiles import PROFILE_FILE
from studio.tiny.families import CACHING_THRESHOLD, FAMILIES, save_family

PROMPT = "a red circle in the center, blue background"


@dataclass
class DoctorRow:
    """One preset on one family (studio.report.text.doctor_table writes the rows as a table)."""

    family: str
    preset: str
    tag: str
    cached_steps: int
    full_steps: int
    cached_step_indices: list[int]
    backend_cached_steps: list[int] | None
    counts_agree: bool | None  # None: no second source to check against
    count_check: str | None
    psnr_db: float | None
    quality: str
    engaged: list[str]
    fallbacks: list[str]
    crashed: str | None = None  # how the run's process died (the device worker's crash), None: it did not


def crashed_row(family: str, preset: str, how: str) -> DoctorRow:
    """The row of a preset whose run killed the device worker (how: spec.errors.how_it_died's words)."""
    return DoctorRow(
        family,
        preset,
        "-",
        0,
        0,
        [],
        None,
        None,
        None,
        None,
        "crashed",
        [],
        [f"the run crashed its process ({how}); the family's other presets ran in a new one"],
        crashed=how,
    )


def _row(family: str, preset: str, m) -> DoctorRow:
    agree = None if m.cache.count_check is None else not m.cache.count_check.startswith("DISAGREES")
    return DoctorRow(
        family,
        preset,
        m.labels.tag,
        m.cache.cached_steps,
        m.cache.full_steps,
        m.cache.cached_step_indices,
        m.cache.backend_cached_steps,
        agree,
        m.cache.count_check,
        m.quality.psnr_db,
        str(m.quality.verdict),
        list(m.labels.engaged),
        list(m.labels.fallbacks),
    )


def family_instance(family: str, folder: Path, on_status=None) -> Path:
    """The family's tiny instance in `folder`, built unless already whole (its profile file is written last)."""
    folder = Path(folder)
    if not (folder / PROFILE_FILE).is_file():
        if on_status:
            on_status(f"{family}: building a tiny random-weight instance")
        save_family(family, folder)
    return folder


def check_family(
    family: str, folder: Path, presets: list[str], runner: Runner, on_status=None, on_row=None
) -> list[DoctorRow]:
    """The presets on one family's instance (base timed once beside each); `on_row(row)` as each is done; unloads."""
    lib, model = PresetLibrary(), str(folder)
    pairing = replace(runner.pairing, cheap_pairs=1)
    rows, eager_rows = [], {}
    try:
        req = runner.request(PROMPT, model=model, seed=0)
        for name in presets:
            if on_status:
                on_status(f"{family}: {name}")
            p = lib.get(name)
            if p.cache_config.enabled:
                t = CACHING_THRESHOLD[p.cache_config.backend]
                p = replace(p, cache_config=replace(p.cache_config, residual_diff_threshold=t))
            m = runner.generate(req, p, model=model, pairing=pairing).metrics
            row = _row(family, name, m)
            eager = eager_rows.get((p.quantize_config, p.cache_config))
            if p.compile.enabled and row.counts_agree is None and eager is not None and p.cache_config.enabled:
                # Under compile the block hooks are blind: check against the same cache run eagerly instead.
                row.counts_agree = row.cached_step_indices == eager.cached_step_indices
                row.count_check = f"{'same' if row.counts_agree else 'DIFFERENT'} steps as eager {eager.preset}"
            if not p.compile.enabled:
                eager_rows.setdefault((p.quantize_config, p.cache_config), row)
            rows.append(row)
            if on_row:
                on_row(row)
    finally:
        runner.manager.unload()
    return rows


def run_doctor(families=FAMILIES, presets=None, device=None, on_status=None, settings=None) -> list[DoctorRow]:
    """Each family's tiny instance built and the presets run on it, in this process (the CLI uses the worker)."""
    presets = list(presets or PresetLibrary().one_process_names())
    runner = Runner(ModelManager(device, settings=settings), PresetLibrary())
    rows = []
    with tempfile.TemporaryDirectory(prefix="studio-doctor-") as tmp:
        for family in families:
            folder = family_instance(family, Path(tmp) / family, on_status)
            rows += check_family(family, folder, presets, runner, on_status)
    return rows


def as_json(rows: list[DoctorRow], device: str) -> str:
    return json.dumps(
        {"device": device, "caching_threshold": CACHING_THRESHOLD, "rows": [asdict(r) for r in rows]}, indent=1
    )


def healthy(rows: list[DoctorRow]) -> bool:
    """Every count agrees with the cache's own list, no stack is broken, and none crashed its process."""
    return all(r.counts_agree is not False and r.quality != Verdict.BROKEN and r.crashed is None for r in rows)
