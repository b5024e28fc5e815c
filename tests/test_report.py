"""The bench, sweep, tune and doctor text (studio.report.text) on records built by hand: every number in the
expected strings can be worked out from the record above it. Nothing here runs a model."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from types import SimpleNamespace

import pytest

from studio.bench import doctor, rotation
from studio.bench.bench import CostRow, NoiseFloor
from studio.bench.fewer import FewerSteps, StepsPoint, Versus
from studio.bench.sweep import SweepResult
from studio.bench.tune import TuneResult
from studio.measure.pace import Pace
from studio.measure.quality import Verdict
from studio.report import fmt, text
from studio.report.table import MatrixRow
from studio.spec import PresetLibrary

pytestmark = pytest.mark.quick  # the one-minute loop: no model is loaded here (pytest -m quick)


def test_noise_floor_lines():
    noise = NoiseFloor(
        0.97,
        0.94,
        1.01,
        spread={"base": 0.05, "cache": 0.13},
        compile_vs_eager_db={"compile": 41.234, "cache-compile": math.inf},
    )
    assert text.noise_lines(noise) == [
        # 0.97x (0.94-1.01) against itself: its interval reaches 6% off 1.00, so a 6% difference is noise
        "base against itself (same stack, same rotation): 0.970x (0.940-1.010); a speed-up within 6.0% of 1.00 is "
        "noise",
        "run-to-run spread (max-min)/median: base 5%, cache 13%",
        "compile vs eager, same stack, PSNR: compile 41.23 dB, cache-compile inf",  # one dB format: fmt.psnr's
    ]
    assert len(text.noise_lines(replace(noise, compile_vs_eager_db={}))) == 2  # no compiled preset, no line


def test_compile_cost_cells_say_n_a_for_a_count_torch_did_not_give():
    # 12.5 s of compile saving 2.5 ms an image pays off after 12.5 / 0.0025 = 5000 images
    row = CostRow("compile", 12.5, 3, 0, 0.0025, 12.5 / 0.0025)
    assert text.cost_cells(row) == ["compile", "12.5 s", "3", "0", "2.5 ms/image", "5000 images"]
    unknown = CostRow("compile", None, None, None, -0.001, math.inf)
    assert text.cost_cells(unknown) == ["compile", "-", "n/a", "n/a", "-1.0 ms/image", "never (no saving)"]
    # a compile paid before (its blocks shared with an earlier stack): a saving, but no cold run of its own to divide
    shared = CostRow("cache-compile", None, 0, 0, 0.0418, None)
    assert text.cost_cells(shared)[-1] == "n/a (no cold compile of its own)"


def test_graph_count_is_unknown_not_zero_without_dynamo(monkeypatch):
    assert isinstance(rotation._graphs_compiled(), int)
    monkeypatch.setitem(sys.modules, "torch._dynamo.utils", None)  # the import now raises ImportError
    assert rotation._graphs_compiled() is None
    assert rotation.total_graphs([2, 1]) == 3 and rotation.total_graphs([2, None]) is None


def _row(preset, speedup, worst, mean, cached, of_ideal=None):
    return MatrixRow(
        preset=preset,
        tag=preset,
        denoise_s=1.0,
        step_ms=1.0,
        speedup=speedup,
        psnr_db=mean,
        ssim=None,
        cached_steps=cached[0],
        full_steps=8,
        quality="good",
        worst_psnr_db=worst,
        mean_psnr_db=mean,
        cached_by_prompt=cached,
        of_ideal=of_ideal,
    )


def test_sweep_table_marks_the_cliff():
    rows = [
        _row("base", 1.0, math.inf, math.inf, [0, 0]),
        _row("c.R0.1", 1.5, 44.0, 45.5, [2, 3], 0.8),
        _row("c.R0.5", 2.25, 21.0, 30.0, [5, 6]),
    ]
    res = SweepResult(
        "residual_diff_threshold",
        [0.1, 0.5],
        SimpleNamespace(matrix=SimpleNamespace(rows=rows)),
        (0.5, 23.0),
        ["c.R0.1", "c.R0.5"],
    )
    assert text.sweep_markdown(res) == "\n".join(
        [
            "| residual_diff_threshold | vs base | worst PSNR | mean PSNR | cached (by prompt) | of ideal |",
            "|---|---|---|---|---|---|",
            "| 0.1 | 1.50x | 44.00 dB | 45.50 dB | 2,3 | 0.80 |",
            "| 0.5 **cliff** | 2.25x | 21.00 dB | 30.00 dB | 5,6 | - |",
            "",
            "Cliff: at residual_diff_threshold=0.5 worst PSNR drops 23.0 dB from the value before.",  # 44 - 21
        ]
    )
    assert "Cliff" not in text.sweep_markdown(replace(res, cliff=None))


def test_tune_summary_for_the_cli_and_the_tune_tab():
    p = replace(PresetLibrary().get("cache"), name="tuned-35db")
    # 56 screening + 39 timed = 95 runs; 2.4x against base where the cache preset made 1.6x: 1.50x its speed-up
    res = TuneResult(p, 35.0, 41.781, 2.4, 2.4 / 1.6, 56, 39, [], "base", [], prompts=["a", "b"])
    assert text.tune_summary(res, written="my/tuned-35db.yaml") == (
        f"tuned-35db ({p.tag()}): worst PSNR 41.78 dB over 2 prompts (floor 35), 2.40x vs base, 1.50x the cache "
        "preset's; 95 runs (56 screening, 39 timed); written to my/tuned-35db.yaml"
    )
    md = text.tune_summary(replace(res, vs_cache=None, prompts=["a"]), markdown=True)
    assert md.startswith(f"**tuned-35db** (`{p.tag()}`): worst PSNR **41.78 dB** over 1 prompt (floor 35), **2.40x**")
    assert "n/a the `cache` preset's" in md  # a cache row without a speed-up: said, not divided by
    d = res.as_dict()
    assert (d["runs"], d["screening_runs"], d["timed_runs"], d["prompts"]) == (95, 56, 39, ["a", "b"])
    # timed on a busy machine: the sentence is followed by the bench's BUSY line; a quiet one adds nothing
    busy = replace(res, pace=[Pace("k", 17.5, 14.0, 3, "/p.json")])
    assert text.tune_summary(busy).splitlines()[1].startswith("pace: base's floor 17.50 ms a step, +25% against")
    assert "the machine was BUSY" in text.tune_summary(busy)
    assert text.tune_summary(replace(res, pace=[Pace("k", 14.0, 14.0, 3, "/p.json")])) == text.tune_summary(res)
    # read against base at fewer steps: 2.4x of 28 steps is base at 12 steps (2.33x), which keeps 44.1 dB
    fewer = FewerSteps(28, 35.0, prompts=2)
    twelve = StepsPoint(12, 28, 44.1, 46.0, 0.02, 2)
    fewer.points[12] = twelve
    fewer.fewest = StepsPoint(5, 28, 35.4, 39.0, 0.06, 2)
    line = text.tune_summary(replace(res, fewer=fewer, vs_fewer=Versus(twelve, 41.781 - 44.1))).splitlines()[-1]
    assert line == (
        "against base at fewer steps: fewer steps does better: 12 steps (2.33x) keep 44.1 dB; the fewest steps above "
        "the floor: 5 of 28 (5.60x, worst 35.40 dB)"
    )


def test_tuned_description():
    got = text.tuned_description(35.0, 2, worst_db=41.781, speedup=2.4, vs_cache=1.5, on="cpu float32")
    assert got == (
        "Tuned by `python -m studio tune --min-psnr 35` on 2 prompts: worst PSNR 41.78 dB, 2.40x vs base "
        "(1.50x the cache preset's) on cpu float32."
    )


def test_bench_header_reads_the_reports_own_request():
    meta = {
        "model": "tiny",
        "prompts": ["a red circle"],
        "request": {"seed": 7, "steps": 8, "width": 64, "height": 32},
        "device": "cpu",
        "dtype": "float32",
        "repeats": 3,
        "versions": {"torch": "2.x", "cache-dit": "1.5"},
    }
    head = text.bench_header(SimpleNamespace(meta=meta))
    assert head.startswith("model tiny, prompt 'a red circle', seed 7, 8 steps, 64x32, device cpu, dtype float32; ")
    assert head.endswith("torch 2.x, diffusers None, cache-dit 1.5, torchao None")
    meta["prompts"] = ["a", "b"]
    assert ", 2 prompts, seed 7," in text.bench_header(SimpleNamespace(meta=meta))


def _doctor_row(quality: Verdict, agree: bool | None = True) -> doctor.DoctorRow:
    return doctor.DoctorRow(
        "flux", "cache", "fp32+DBCache", 6, 6, [4, 5], [4, 5], agree, None, 54.931, str(quality), [], ["sage: off"]
    )


def test_doctor_table_and_health():
    ok = _doctor_row(Verdict.GOOD)
    assert text.doctor_table([ok]).splitlines() == [
        "| family | preset | stack | cached/full | cache's own list | counts | PSNR | verdict | fell back |",
        "|---|---|---|---|---|---|---|---|---|",
        "| flux | cache | fp32+DBCache | 6/6 | [4, 5] | agree | 54.93 dB | good | sage: off |",
    ]
    assert doctor.healthy([ok]) and text.doctor_verdict(True).startswith("healthy")
    assert not doctor.healthy([ok, _doctor_row(Verdict.BROKEN)])
    assert not doctor.healthy([_doctor_row(Verdict.GOOD, agree=False)])
    assert text.doctor_verdict(False) == "NOT healthy: see DISAGREE rows"


def test_kernel_table():
    from lab.regimes.kernels import KernelRow, kernel_table

    rows = [KernelRow("sdpa", 20.0, 1.0, "sdpa"), KernelRow("sage", None, None, "unavailable")]
    table = kernel_table(rows).splitlines()
    assert table[0] == "| stack | ms per transformer call | vs sdpa | engaged |"
    assert table[2:] == ["| sdpa | 20.0 | 1.00x | sdpa |", "| sage | n/a | n/a | unavailable |"]
    assert fmt.speedup(1.0, 3) == "1.000x"
