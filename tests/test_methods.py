"""Every step-cache method beside DBCache (issue 48), run for real on tiny pipelines: engaged through its library's
own API, counted by the studio's per-step hook and by the library's own record where it keeps one, labelled by what
ran, and refused with its sentence where it cannot engage (studio.spec.methods, studio.engine.hooks)."""

from __future__ import annotations

import html
import math
from dataclasses import replace

import numpy as np
import pytest

from studio.engine.cache import BareTransformer, apply_cache, remove_cache
from studio.engine.hooks import fingerprint
from studio.report.card import metrics_card
from studio.spec import CacheSpec, ConfigError, GenerationRequest, PresetLibrary
from studio.spec.headroom import headroom
from studio.spec.presets import preset_from_text, preset_to_yaml
from tests.narrowed import narrow

PROMPT = "a red circle in the center, blue background"
METHODS = PresetLibrary().method_names()
# the library's own per-call record the block hooks' count is checked against (none: PAB and FasterCache keep none)
OWN_RECORD = {
    "fbcache": "agrees with fbcache state",
    "magcache": "agrees with magcache state",
    "taylorseer": "agrees with taylorseer state",
    "cache-dmd": "agrees with cache-dit",
    "cache-foca": "agrees with cache-dit",
    "cache-scm": "agrees with cache-dit",
    "cache-taylorseer": "agrees with cache-dit",
}


def _req(steps=28, seed=3):
    return GenerationRequest(prompt=PROMPT, seed=seed, steps=steps, width=64, height=64, max_sequence_length=32)


def _cache_lines(lines):
    return [line for line in lines if line.startswith("cache:")]


@pytest.mark.timing
def test_dbprune_card_prices_both_sides_as_its_speed_up_divides_them(tiny_runner):
    """DBPrune's steps are priced step by step, and base beside it alike (studio.measure.estimate.alike): the two
    floor prices on its card are the ones its speed-up is the ratio of."""
    tiny_runner.generate(_req(steps=12), "base")
    t = tiny_runner.generate(_req(steps=12), "dbprune").metrics.timing
    assert t.denoise_priced_s <= t.denoise_s and t.base_priced_s <= t.base_denoise_s
    if t.speedup is not None:  # (withheld, with its reason, on a machine too busy to read)
        assert t.speedup == pytest.approx(t.base_priced_s / t.denoise_priced_s, rel=1e-9)


@pytest.mark.parametrize("name", METHODS)
def test_each_shipped_method_engages_is_counted_and_labelled_on_the_embedded_model(tiny_runner, name):
    spec = tiny_runner.presets.get(name).cache_config
    m = tiny_runner.screen(_req(), name)
    assert _cache_lines(m.labels.fallbacks) == [], m.labels.fallbacks
    assert len(_cache_lines(m.labels.engaged)) == 1
    assert spec.label() in m.labels.tag  # the label of what ran names the method and its knobs
    assert 0 < m.cache.cached_steps < 28 and m.cache.full_steps + m.cache.cached_steps == 28
    if name == "dbprune":  # it prunes blocks inside steps: its own list of steps with a pruned block is the count
        assert m.cache.count_source == "dbprune (steps with a pruned block)"
        # and its count of pruned block calls, of the calls its blocks made: 6 blocks (2 double, 4 single) x 28 steps
        assert m.cache.blocks == 6 and m.cache.block_calls == 6 * 28 and 0 < m.cache.pruned_blocks < 6 * 28
        share = f"{m.cache.pruned_blocks / m.cache.block_calls:.0%}"
        card = html.unescape(metrics_card(m))
        assert f"pruned {m.cache.pruned_blocks} of 168 block calls ({share}), by cache-dit's count" in card
    else:
        assert m.cache.count_source == "block hooks" and m.cache.pruned_blocks is None
        assert m.cache.count_check == OWN_RECORD.get(name), m.cache.count_check
    assert 30.0 < m.quality.psnr_db < math.inf  # cached, and still close to base


def test_taylorseer_caches_exactly_the_steps_its_rule_allows_and_the_flag_says_so_before_the_run(tiny_runner):
    """diffusers' TaylorSeer decides by step index alone: the headroom computed before the run is the count."""
    spec = tiny_runner.presets.get("taylorseer").cache_config
    m = tiny_runner.screen(_req(), "taylorseer")
    room = headroom(spec, 28)
    assert m.cache.cached_steps == room.skippable == 19  # of steps 3..27, 4, 8, .., 24 computed (6 of 25)
    assert m.cache.cached_step_indices[0] == room.first == 3


def test_methods_that_cannot_engage_are_refused_with_their_sentence_and_run_uncached(runner):
    """The random-weight model is not the one the shipped MagCache ratios were measured on; FLUX's pipeline does
    not give SeaCache the scheduler's step and sigma."""
    r = _req(steps=12)
    base = runner.generate(r, "base").image
    runner.presets.user_dir = None
    lib = runner.presets
    cases = {
        "magcache": "its ratios were calibrated for FluxTransformer2DModel-3ba61691, and this transformer is "
        "FluxTransformer2DModel-",
        "seacache": "FluxPipeline does not pass the scheduler's step and sigma to its cache context",
        "bare-magcache": "MagCache needs its per-step magnitude ratios for this model, and this preset has none",
    }
    presets = {
        "magcache": lib.get("magcache"),
        "seacache": preset_from_text("cache_config: {backend: seacache}", "seacache"),
        "bare-magcache": preset_from_text("cache_config: {backend: magcache}", "bare-magcache"),
    }
    for name, why in cases.items():
        m = runner.screen(r, presets[name])
        (line,) = _cache_lines(m.labels.fallbacks)
        assert why in line and line.endswith("running uncached"), line
        assert m.cache.cached_steps == 0 and m.quality.psnr_db == math.inf  # uncached: base's picture
        if "magcache" in name:  # and the way to the ratios it lacks
            assert "`python -m studio calibrate --preset <this preset>` measures them" in line
    assert np.array_equal(runner.generate(r, "base").image, base)


def test_a_hook_that_reads_the_pipelines_timestep_is_refused_on_a_bare_transformer(runner):
    pipe, _, _ = runner.manager.pipeline(runner.model, runner.presets.get("base"), steps=12)
    bare = BareTransformer(pipe.transformer)
    for backend in ("pab", "fastercache"):
        e = apply_cache(bare, CacheSpec(backend=backend), steps=12)
        assert not e.engaged and "reads the pipeline's current timestep" in e.detail
        remove_cache(bare)


def test_a_diffusers_hook_after_cache_dit_on_the_same_transformer(runner):
    """cache-dit re-registers FLUX's block lists (single blocks first) and keeps its patched forward after
    disable_cache; First-Block-Cache then took a single block as its head and failed on its first call (TypeError:
    'NoneType' object is not subscriptable). The engine gives the transformer its loaded order back."""
    r = _req(steps=12)
    db = preset_from_text("cache_config: {residual_diff_threshold: 0.9}", "db")  # (random weights move more)
    fbc = preset_from_text("cache_config: {backend: fbcache, residual_diff_threshold: 0.9}", "fbc")
    first = runner.screen(r, db)
    fb = runner.screen(r, fbc)
    again = runner.screen(r, db)
    assert first.cache.cached_steps > 0 and fb.cache.cached_steps > 0
    assert fb.cache.count_check == "agrees with fbcache state"
    assert again.cache.cached_step_indices == first.cache.cached_step_indices  # cache-dit patched again, same run


def test_putting_back_after_cache_dit_keeps_another_librarys_instance_forward(runner):
    """Only cache-dit's patched forwards are taken off: accelerate's hook (an offload regime's) set on a block's
    instance stays through a switch from a cache-dit preset to a diffusers hook."""
    from accelerate.hooks import ModelHook, add_hook_to_module, remove_hook_from_module

    r = _req(steps=12)
    runner.screen(r, preset_from_text("cache_config: {residual_diff_threshold: 0.9}", "db"))
    pipe, _, _ = runner.manager.pipeline(runner.model, runner.presets.get("base"), steps=12)
    embedder = pipe.transformer.x_embedder
    add_hook_to_module(embedder, ModelHook())
    try:
        fb = runner.screen(r, preset_from_text("cache_config: {backend: fbcache, residual_diff_threshold: 0.9}", "f"))
        assert fb.cache.cached_steps > 0 and fb.cache.count_check == "agrees with fbcache state"
        assert "forward" in vars(embedder) and hasattr(embedder, "_hf_hook")  # accelerate's forward is still on
    finally:
        remove_hook_from_module(embedder)


def test_calibrate_writes_magcache_ratios_for_this_model_and_they_engage(runner, random_model_dir, tmp_path):
    from studio.cli import main

    out = tmp_path / "mc.yaml"
    prompts = tmp_path / "p.txt"
    prompts.write_text(f"{PROMPT}\nan orange triangle on the left, black background\n")
    args = ["calibrate", "--model", random_model_dir, "--steps", "12", "--prompts", str(prompts), "--out", str(out)]
    assert main(args + ["--device", "cpu"]) == 0
    p = preset_from_text(out.read_text(), "mc")
    opts = dict(p.cache_config.options)
    pipe, _, _ = runner.manager.pipeline(runner.model, runner.presets.get("base"), steps=12)
    assert opts["calibrated_for"] == fingerprint(pipe.transformer)
    assert len(opts["mag_ratios"]) == 12 and opts["mag_ratios"][0] == 1.0  # step 0: no residual to compare
    assert all(0.5 < x < 2.0 for x in opts["mag_ratios"])
    assert preset_from_text(preset_to_yaml(p), "mc").stack == p.stack  # the YAML round trip keeps the ratios
    m = runner.screen(_req(steps=12), p)
    assert _cache_lines(m.labels.fallbacks) == []
    assert "MagCache_R0.06K3Ret0.2" in m.labels.tag and m.cache.count_check == "agrees with magcache state"


def test_every_setting_the_search_may_try_is_a_valid_preset():
    from studio.bench.methods import METHODS, _start, with_knob

    lib = PresetLibrary()
    for m in METHODS:
        start = _start(m, lib)
        for variant in m.variants:
            spec = start.cache_config
            for knob, value in variant.items():
                spec = with_knob(spec, knob, value)
            for value in m.values:  # as the search names and builds it, and as a preset file reads it back
                p = replace(start, name=m.best_name, cache_config=with_knob(spec, m.knob, value))
                assert preset_from_text(preset_to_yaml(p), p.name).stack == p.stack


def test_methods_searches_each_method_then_times_them_side_by_side(tiny_runner):
    from studio.bench.methods import run_methods
    from studio.report.methods import methods_markdown

    reqs = [_req(steps=12), _req(steps=12, seed=4)]
    res = run_methods(tiny_runner, reqs, floor_db=35.0, names=["dbcache", "pab", "seacache"], repeats=1)
    assert not res.held_out and res.search_prompts == res.prompts
    by = {s.method.name: s for s in res.searched}
    assert by["seacache"].refused and by["seacache"].preset is None
    assert {r.method for r in res.rows} == {"dbcache", "pab", "reference: cache"}  # the shipped cache beside them
    for row in res.rows:
        assert row.of == 2 and row.cached_steps > 0
        if row.method in by:
            assert row.worst_psnr_db >= 35.0 and row.label == by[row.method].preset.cache_config.label()
    assert sum(r.preset == res.best for r in res.rows) <= 1  # the fastest shown row, if any row could be shown
    text = methods_markdown(res)
    assert "| dbcache | DBCache_F1B0W" in text and "- seacache: cache: SeaCache not engaged" in text
    # every row read against base at the step count of its speed-up, on the same prompts (studio.bench.fewer)
    assert res.fewer is not None and res.fewer.full == 12 and res.fewer.prompts == 2
    for row in res.rows:
        if row.speedup is not None and row.speedup > 1.0:
            v = row.vs_fewer
            assert v.at.steps == res.fewer.steps_at(row.speedup)
            assert v.margin_db == pytest.approx(row.worst_psnr_db - v.at.worst_db)
    assert "| vs base at fewer steps |" in text and "Base at fewer steps, against base's 12-step picture" in text
    assert res.as_dict()["fewer_steps"]["full_steps"] == 12


def test_methods_can_search_on_some_prompts_and_time_on_others(tiny_runner):
    """--search-prompts: the bench is then a held-out test; a worst PSNR under the floor there is marked."""
    from studio.bench.methods import run_methods
    from studio.report.methods import methods_markdown

    search = [_req(steps=12)]
    unseen = "a white circle on the left and a green square on the right, black background"
    other = [replace(_req(steps=12), prompt=unseen)]
    res = run_methods(tiny_runner, other, floor_db=35.0, names=["fbcache"], repeats=1, search_requests=search, also=())
    assert res.held_out and res.search_prompts == [PROMPT] and res.prompts == [other[0].prompt]
    (row,) = res.rows
    text = methods_markdown(res)
    assert "searched over 1 prompts, then timed side by side on 1 others it did not see" in text
    assert (" (under) |" in text) == (row.worst_psnr_db < 35.0)


def test_tune_crosses_every_method_with_each_non_cache_arm_and_times_each_best_as_a_finalist(tiny_runner):
    """One search over stacks (studio.bench.tune): DBCache's knobs screened on the fastest non-cache option, each
    other method's knob searched on every option that leaves room for a cache (here base and int8, eager), each best
    timed on each arm beside the others on prompts the search did not see; the winner is whichever keeps the floor
    fastest, written with the transformer it was searched on, and the summary lists the frontier it was picked
    from."""
    from studio.bench.tune import tune
    from studio.report.text import tune_summary

    unseen = "a white circle on the left and a green square on the right, black background"
    search, reqs = (
        [_req(steps=12)],
        [replace(_req(steps=12), prompt=unseen), replace(_req(steps=12, seed=4), prompt=unseen)],
    )
    space = narrow(non_cache=("base", "int8"), fewer_steps=False, methods=("fbcache", "seacache"))
    res = tune(tiny_runner, reqs, 35.0, space=space, search_requests=search, compile_enabled=False)
    assert res.search_prompts == [PROMPT] and res.prompts == [unseen, unseen]
    assert res.preset.tuned_for == fingerprint(tiny_runner.manager.current.pipe.transformer)
    arms = [res.non_cache, ({"base", "int8.override"} - {res.non_cache}).pop()]  # the fastest first
    by = {(d["method"], tuple(d["on"])): d for d in res.methods}
    assert set(by) == {(m, (a,)) for m in ("fbcache", "seacache") for a in arms}  # eager: one arm per stack
    assert all(by[("seacache", (a,))]["refused"] for a in arms)  # refused here: said, not timed
    names = [f.preset for f in res.finalists]
    other = f"-on-{arms[1]}"
    assert names == [
        "tuned-35db-1",
        "tuned-35db-1" + other,
        "tuned-35db-fbcache-best",
        "tuned-35db-fbcache-best" + other,
    ]
    assert sum(f.won for f in res.finalists) == 1
    on = dict(zip(names, arms + arms))  # each finalist on its arm, as it ran: int8 in the label where it is
    for f in res.finalists:
        assert ("int8" in f.label) == (on[f.preset] == "int8.override"), (f.preset, f.label)
    fb = next(f for f in res.finalists if f.preset == "tuned-35db-fbcache-best")
    assert f"FBCache_R{by[('fbcache', (arms[0],))]['value']:g}" in fb.label  # what ran: the searched setting
    assert fb.cached_steps > 0  # (its PSNR on the held-out prompts: the bench's, which may fall under the floor)
    won = next(f for f in res.finalists if f.won)
    assert res.preset.cache_config.backend == ("fbcache" if "fbcache" in won.preset else "cache-dit")
    assert res.worst_db >= 35.0 and won.worst_psnr_db >= 35.0
    assert res.screened > by[("fbcache", (arms[1],))]["screened"] > 0
    lines = tune_summary(res).splitlines()
    assert " over 2 prompts, held out (searched on 1 others) (floor 35)" in lines[0]
    i = lines.index("the 4 finalists, timed side by side (speed-up vs base, worst PSNR):")
    assert sum(line.endswith(" <- picked") for line in lines[i + 1 : i + 5]) == 1
    assert res.as_dict()["finalists"][0]["preset"] in names


def test_a_bench_names_each_row_once(tiny_runner):
    """Rows, twins and pairs are read by name: two presets of one name are refused with the names, and a twin whose
    name a preset of another stack already has takes a free one (a user's `compile-eager` that is no eager twin)."""
    from studio.bench.bench import run_bench
    from studio.bench.twins import with_twins

    lib = tiny_runner.presets
    cache = lib.get("cache")
    with pytest.raises(ConfigError, match=r"presets=\['cache'\] given twice"):
        run_bench(tiny_runner, [_req(steps=4)], [cache, replace(lib.get("int8"), name="cache")])
    taken = replace(cache, name="compile-eager")
    out, twins = with_twins([lib.get("compile"), taken])
    assert twins == {"compile": "compile-eager2"} and [p.name for p in out] == [
        "compile",
        "compile-eager",
        "compile-eager2",
    ]
    assert not out[2].compile.enabled and out[2].stack != taken.stack


def test_the_cache_dit_methods_export_for_cache_dits_load_configs_and_a_hook_says_it_is_left_out(tmp_path):
    import cache_dit

    from studio.spec.export import cache_dit_yaml

    lib = PresetLibrary()
    cases = (("dbprune", "DBPruneConfig", None), ("cache-foca", "DBCacheConfig", "FoCaCalibratorConfig"))
    for name, cfg, cal in cases:
        path = tmp_path / f"{name}.yaml"
        path.write_text(cache_dit_yaml(lib.get(name)))
        got = cache_dit.load_configs(str(path))
        assert type(got["cache_config"]).__name__ == cfg
        assert got["cache_config"].residual_diff_threshold == lib.get(name).cache_config.residual_diff_threshold
        assert type(got.get("calibrator_config")).__name__ == (cal or "NoneType")
    text = cache_dit_yaml(lib.get("magcache"))
    assert "# cache_config: left out: MagCache is a diffusers hook" in text and "cache_config:\n" not in text


def test_a_method_with_no_setting_above_the_floor_is_listed_and_its_record_reads(tiny_runner):
    """A floor no setting keeps: nothing is timed, the method says why, and `--json`'s record is written (it named
    the method's backend from a preset it built from the shipped preset's NAME, and raised)."""
    from studio.bench.methods import run_methods
    from studio.report.methods import methods_markdown

    res = run_methods(tiny_runner, [_req()], floor_db=99.0, names=["dbcache"], repeats=1)  # every setting caches
    (s,) = res.searched
    assert s.preset is None and s.refused is None and s.note.startswith("no residual_diff_threshold of")
    assert res.rows == [] and res.bench is None
    d = res.as_dict()["searched"][0]
    assert (d["method"], d["name"], d["label"]) == ("dbcache", "DBCache", None)
    assert "- dbcache: no residual_diff_threshold of" in methods_markdown(res)


def test_methods_write_keeps_each_best_for_its_transformer_and_the_matrix_picks_it(
    runner, tiny_runner, random_model_dir, tmp_path
):
    """`methods --write DIR`: each method's best as `<method>-best.yaml`, marked with the transformer it was searched
    on; the Matrix's "all step caches" then picks it over the shipped preset; a run says whether its transformer is
    the one searched (the floor was checked on its pictures) or another (it was not)."""
    from studio.bench.ladders import matrix_picks
    from studio.cli import main

    prompts = tmp_path / "p.txt"
    prompts.write_text(f"{PROMPT}\n")
    args = ["methods", "--model", random_model_dir, "--steps", "12", "--prompts", str(prompts), "--repeats", "1"]
    args += ["--methods", "fbcache", "--also", "", "--device", "cpu"]
    assert main([*args, "--write", str(tmp_path / "best")]) == 0
    lib = PresetLibrary(user_dir=tmp_path / "best")
    p = lib.get("fbcache-best")
    pipe, _, _ = runner.manager.pipeline(runner.model, runner.presets.get("base"), steps=12)
    here = fingerprint(pipe.transformer)
    assert p.tuned_for == here and p.cache_config.backend == "fbcache"
    assert "that kept all 1 prompts above 35 dB on" in p.description
    assert preset_from_text(preset_to_yaml(p), p.name) == p  # the mark survives the YAML round trip
    picked = matrix_picks(lib.names())
    assert picked[:2] == ["base", "cache"] and "fbcache-best" in picked and "fbcache" not in picked
    assert "magcache" in picked and "pab" in picked  # the others: their shipped presets
    on_it = runner.screen(_req(steps=12), p)
    assert f"settings: searched on this transformer ({here})" in on_it.labels.engaged
    elsewhere = tiny_runner.screen(_req(steps=12), p)
    (line,) = [x for x in elsewhere.labels.engaged if x.startswith("settings:")]
    assert line.startswith(f"settings: searched on {here}, not on this transformer") and "not known here" in line
    with pytest.raises(ConfigError, match=r"tuned_for='two words' is not valid"):
        replace(p, tuned_for="two words")


def test_seacache_is_engaged_only_where_a_cache_context_call_passes_the_step_and_sigma():
    """diffusers 0.42.1: Cosmos3 Omni passes them to `cache_context`; LTX-2 passes `sigma=` to the transformer's
    own call, which SeaCache never reads (it would run fail-open): the check reads the cache_context calls alone."""
    import inspect

    from diffusers import FluxPipeline, StableDiffusion3Pipeline
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import Cosmos3OmniPipeline
    from diffusers.pipelines.ltx2.pipeline_ltx2 import LTX2Pipeline

    from studio.engine.hooks import _passes_sigma

    def passes(cls):
        return _passes_sigma(inspect.getsource(cls.__call__))

    assert "sigma=" in inspect.getsource(LTX2Pipeline.__call__) and not passes(LTX2Pipeline)
    assert passes(Cosmos3OmniPipeline) and not passes(FluxPipeline) and not passes(StableDiffusion3Pipeline)
    assert _passes_sigma('with t.cache_context("c", step_index=i, sigma=s[(i)]):\n    x = f(sigma=1)')
    assert not _passes_sigma('x = f(sigma=1)\nwith t.cache_context("c"):\n    y = g(step_index=i)')
