"""Base at fewer steps, the rival every step cache reads against (studio.bench.fewer, HOUSE 18): its pictures judged
against base's full-step picture as a cache's are, its speed-up by step count, the fewest steps above a floor found by
search, and the words a row gets."""

from __future__ import annotations

import math

import pytest

from studio.bench.fewer import CLEAR_DB, FewerSteps, FewerStepsJudge, StepsPoint, Versus, fewer_steps_reference
from studio.engine import BASE
from studio.measure.estimate import steps_at_speed
from studio.measure.quality import psnr
from studio.report.fewer import fewer_steps_markdown, versus_fewer
from studio.spec import GenerationRequest
from tests.narrowed import narrow

PROMPTS = ("a red circle in the center, blue background", "a yellow square on the left, purple background")


def _req(prompt=PROMPTS[0], steps=12, seed=3):
    return GenerationRequest(prompt=prompt, seed=seed, steps=steps, width=64, height=64, max_sequence_length=32)


@pytest.mark.quick
def test_the_step_count_at_a_speed_and_the_verdict_words():
    f = FewerSteps(full=28, floor_db=35.0)
    assert [f.steps_at(s) for s in (1.4, 2.0, 2.86, 3.2, 50.0, 1.01)] == [20, 14, 10, 9, 1, 27]
    p = StepsPoint(steps=10, full=28, worst_db=44.1, mean_db=47.9, worst_flip=0.02, prompts=4)
    assert p.speedup == 2.8
    assert Versus(p, 4.0).beats and not Versus(p, CLEAR_DB - 0.01).beats
    assert versus_fewer(Versus(p, 4.04)).startswith("beats it by 4.0 dB: 10 steps (2.80x) keep 44.1 dB")
    assert versus_fewer(Versus(p, -0.5)).startswith("fewer steps does as well")
    assert versus_fewer(Versus(p, -5.8)).startswith("fewer steps does better")
    assert versus_fewer(None) == "-"


@pytest.mark.quick
def test_a_mixed_step_count_or_an_image_input_is_refused_with_its_reason():
    import numpy as np

    from studio.bench.fewer import applies

    with pytest.raises(ValueError, match=r"run \[8, 12\] steps"):
        FewerStepsJudge(None, [_req(steps=12), _req(steps=8)], floor_db=30.0)
    picture = np.zeros((64, 64, 3), np.uint8)
    img2img = GenerationRequest(prompt="a red circle", steps=12, image=picture, strength=0.5)
    with pytest.raises(ValueError, match="img2img"):
        FewerStepsJudge(None, [img2img], floor_db=30.0)
    assert not applies([img2img]) and not applies([_req(steps=12), _req(steps=8)]) and applies([_req(), _req()])
    assert fewer_steps_reference(None, [img2img], floor_db=30.0) is None  # tune and methods then read no rival


def test_base_at_fewer_steps_is_judged_against_the_full_step_picture_and_the_fewest_is_searched(tiny_runner):
    reqs = [_req(p) for p in PROMPTS]
    j = fewer_steps_reference(tiny_runner, reqs, floor_db=45.0)
    res = j.result
    assert res.full == 12 and res.prompts == 2
    curve = res.curve()
    assert [p.steps for p in curve] == [9, 7, 6, 5, 4, 3]  # the ladder's shares of 12, most steps first
    # a point a reader can check: base at 6 steps against base at 12, each prompt, the worst of the two
    full = [tiny_runner.generate(r, BASE, compare="off").image for r in reqs]
    six = [tiny_runner.generate(_req(p, steps=6), BASE, compare="off").image for p in PROMPTS]
    assert res.points[6].worst_db == pytest.approx(min(psnr(a, b) for a, b in zip(six, full, strict=True)))
    assert res.points[6].speedup == 2.0 and res.points[6].worst_flip > 0
    # fewer steps lose quality on this model, and the search's answer is the fewest that keep the floor
    assert curve[0].worst_db > curve[-1].worst_db
    f = res.fewest
    if f is None:
        assert all(p.worst_db < 45.0 for p in res.points.values() if p.steps == 11)
    else:
        assert f.worst_db >= 45.0 and f.prompts == 2
        if f.steps > 1:
            below = j.point(f.steps - 1)
            assert below.worst_db < 45.0
    # a method read against base at the step count of its speed
    v = j.versus(2.0, 60.0)
    assert v.at.steps == 6 and v.margin_db == pytest.approx(60.0 - res.points[6].worst_db) and v.beats
    assert j.versus(None, 40.0) is None and j.versus(0.9, 40.0) is None
    text = "\n".join(fewer_steps_markdown(res))
    assert "| 6 of 12 steps | 2.00x |" in text and "Fewest steps above 45 dB" in text
    assert not math.isinf(res.points[6].mean_db)


def test_the_matrix_reads_each_cached_row_against_base_at_fewer_steps(tiny_runner):
    from studio.bench.matrix import run_matrix

    mat = run_matrix(tiny_runner, _req(), ["cache"], repeats=1)
    rows = {r.preset: r for r in mat.rows}
    assert rows["base"].vs_fewer is None  # base caches nothing: nothing to read against
    cache = rows["cache"]
    assert cache.cached_steps > 0
    if cache.speedup is None or cache.speedup <= 1.0:  # withheld on a busy machine: no step count to compare at
        assert cache.vs_fewer is None and mat.fewer is None
        pytest.skip(f"the cache row's speed-up was withheld here ({cache.speedup_note}): nothing to read at its speed")
    v = cache.vs_fewer
    assert v.at.steps == mat.fewer.steps_at(cache.speedup) and mat.fewer.full == 12
    assert v.margin_db == pytest.approx(cache.psnr_db - v.at.worst_db)
    assert "| vs base at fewer steps |" in mat.markdown().splitlines()[0]
    assert cache.as_dict()["vs_fewer"]["at"]["steps"] == v.at.steps


def test_a_cached_click_compared_on_carries_its_line_against_base_at_fewer_steps(tiny_runner):
    """The card's line: the cached run's PSNR against base at the step count of its speed-up, that base run kept
    (the same request again runs nothing more)."""
    from studio.report.card import metrics_card

    res = tiny_runner.generate(_req(), "cache", compare="on")
    m = res.metrics
    assert m.cache.cached_steps > 0
    v = m.quality.vs_fewer
    if m.timing.speedup is None or m.timing.speedup <= 1.0:  # withheld on a busy machine: nothing to compare at
        assert v is None
        pytest.skip(f"the speed-up was withheld here ({m.timing.speedup_note}): no step count to compare at")
    assert v["steps"] == steps_at_speed(12, m.timing.speedup) and v["full"] == 12
    assert 12 / v["steps"] <= m.timing.speedup  # the rival never runs faster than the stack
    fewer = tiny_runner.generate(_req(steps=v["steps"]), BASE, compare="off").image
    assert v["psnr_db"] == pytest.approx(psnr(fewer, res.base_image))
    assert v["margin_db"] == pytest.approx(m.quality.psnr_db - v["psnr_db"])
    assert f"base at {v['steps']} of 12 steps" in metrics_card(m)
    off = tiny_runner.generate(_req(), "cache", compare="off").metrics
    assert off.quality.vs_fewer is None  # not compared: nothing measured, nothing shown


def test_bench_fewer_steps_puts_the_reference_beside_the_table(tiny_runner):
    """`bench --prompts F --fewer-steps`: the fewest steps above --min-psnr and the ladder over the bench's own
    requests, in its record and its text, each cached row read at its speed."""
    from studio.bench.bench import run_bench
    from studio.report.text import bench_markdown

    reqs = [_req(p) for p in PROMPTS]
    rep = run_bench(tiny_runner, reqs, ["cache"], repeats=1, extra_rounds=0, floor_db=40.0, fewer_steps=True)
    assert rep.fewer.prompts == 2 and rep.fewer.floor_db == 40.0 and rep.fewer.curve()
    assert rep.fewer.fewest is None or rep.fewer.fewest.worst_db >= 40.0
    text = bench_markdown(rep)
    assert "Base at fewer steps, against base's 12-step picture of each of the 2 prompts" in text
    assert rep.as_dict()["fewer_steps"]["full_steps"] == 12
    row = next(r for r in rep.matrix.rows if r.preset == "cache")
    assert (row.vs_fewer is not None) == (row.speedup is not None and row.speedup > 1.0)
    assert run_bench(tiny_runner, reqs[:1], ["cache"], repeats=1, extra_rounds=0).fewer is None  # not asked
    import numpy as np

    from studio.spec import ConfigError

    i2i = GenerationRequest(prompt=PROMPTS[0], steps=12, image=np.zeros((64, 64, 3), np.uint8), strength=0.5)
    with pytest.raises(ConfigError, match="drop --fewer-steps"):  # asked for, and no answer: before anything runs
        run_bench(tiny_runner, [i2i], ["cache"], repeats=1, fewer_steps=True)


def test_a_preset_with_a_share_of_the_steps_runs_fewer_and_reads_against_base_at_all_of_them(tiny_runner):
    """`step_share: 0.5` on base: the run is base at 6 of the request's 12 steps, bitwise the picture base gives when
    asked for 6; its PSNR is against base at 12 (the fewer-steps reference's own point), its label says what ran, its
    speed-up is against base at 12 (about 2x by step count; a busy machine may withhold it), and a cache on it runs
    its share too."""
    from dataclasses import replace

    from studio.spec.presets import load_preset, preset_from_text, preset_to_yaml

    half = replace(tiny_runner.resolve_preset(BASE), name="base-half", step_share=0.5)
    assert preset_from_text(preset_to_yaml(half), "base-half") == half  # the YAML keeps it
    assert half.steps_of(12) == 6 and half.steps_of(7) == 4 and half.steps_of(1) == 1
    res = tiny_runner.generate(_req(), half, compare="on")
    m = res.metrics
    six = tiny_runner.generate(_req(steps=6), BASE, compare="off").image
    full = tiny_runner.generate(_req(), BASE, compare="off").image
    assert (res.image == six).all() and (res.base_image == full).all()
    assert m.cache.full_steps == 6 and m.cache.cached_steps == 0 and m.request["steps"] == 12
    assert m.quality.psnr_db == pytest.approx(psnr(six, full))
    point = FewerStepsJudge(tiny_runner, [_req()], tiny_runner.model, floor_db=35.0).point(6)
    assert point.worst_db == pytest.approx(m.quality.psnr_db)
    assert m.labels.tag.endswith("+steps6of12") and m.labels.requested_tag.endswith("+steps6of12")
    assert "steps: 6 of the request's 12 (step_share 0.5), against base at all 12" in m.labels.engaged
    assert m.quality.vs_fewer is None  # it is the rival itself
    from studio.report.card import answer_line

    assert "0 cached / 6 full (6 of 12 steps)" in answer_line(m)
    if m.timing.speedup is not None:
        assert 1.3 < m.timing.speedup < 3.0  # half the transformer calls, the rest of the pipeline as base's
    cached = replace(tiny_runner.resolve_preset("cache"), name="cache-half", step_share=0.5)
    c = tiny_runner.generate(_req(steps=24), cached, compare="off").metrics
    assert c.cache.full_steps + c.cache.cached_steps == 12 and c.labels.tag.endswith("+steps12of24")
    with pytest.raises(Exception, match="step_share"):
        load_preset({"name": "x", "step_share": 1.5})


def test_tune_times_base_at_the_fewest_steps_beside_the_cache_finalists(tiny_runner):
    """Fewer steps is a finalist of the search (Preset.step_share): base at the fewest steps that keep the floor is
    timed beside the cache's best, and whichever keeps the floor with the best worst paired speed-up is the answer,
    a preset that runs as any preset runs."""
    from studio.bench.tune import tune
    from studio.report.text import tune_summary

    reqs = [_req(p, steps=12) for p in PROMPTS]
    space = narrow()
    res = tune(tiny_runner, reqs, 35.0, space=space)
    f = res.fewer.fewest
    assert f is not None and f.worst_db >= 35.0 and f.steps < 12  # base keeps 35 dB well below 12 steps here
    assert res.worst_db >= 35.0
    last = tune_summary(res).splitlines()[-1]
    if res.preset.step_share is not None:  # fewer steps won: the preset is base at that share
        assert res.preset.steps_of(12) == f.steps and res.preset.cache_config.backend == "none"
        assert (
            last == f"against base at fewer steps: fewer steps won: the tuned preset is base at {f.steps} of 12 steps"
        )
        assert res.vs_fewer is None
    else:  # the cache won its timing: read against fewer steps at its speed
        assert res.preset.cache_config.enabled and last.startswith("against base at fewer steps: ")
    for r in reqs:
        m = tiny_runner.generate(r, res.preset, compare="on").metrics
        assert m.quality.psnr_db >= 35.0
