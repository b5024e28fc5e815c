"""torch.compile in the product: the compiled presets, the per-request compile switch, and step counts under compile
equal to the eager stack's (the block hooks cannot see into compiled blocks; the cache's own record can).

Random weights: caching needs a raised threshold (0.5 for cache-dit, 0.9 for First-Block-Cache), see test_engine.
Their residual diffs sit close to it (0.33-0.46), so these tests run in float32: compiled float32 differs from eager
by rounding only, while compiled bf16 can flip a borderline cache decision (measured: 3 vs 4 cached of 10 at R0.5).
On the trained model the decisions have margin and bf16 agrees too (18 of 28 cached either way, test_tiny_model).
"""

from __future__ import annotations

import numpy as np
import pytest

from studio.engine import stack_state
from studio.measure.quality import psnr
from studio.spec import GenerationRequest
from studio.spec.settings import current
from tests.switched import stack

pytestmark = pytest.mark.slow
PROMPT = "a red circle in the center, blue background"


@pytest.fixture
def runner(runner, tmp_path):
    runner.presets.user_dir = tmp_path
    c = "cache_config: {residual_diff_threshold: 0.5}\n"
    runner.presets.add("b32", "dtype: float32\n")
    runner.presets.add("c32", "dtype: float32\n" + c)
    runner.presets.add("cc32", "dtype: float32\n" + c + "compile: {enabled: true}\n")
    runner.presets.add("fb32", "dtype: float32\ncache_config: {backend: fbcache, residual_diff_threshold: 0.9}\n")
    return runner


def req(**kw):
    base = dict(prompt=PROMPT, seed=3, steps=12, width=64, height=64, max_sequence_length=32)
    base.update(kw)
    return GenerationRequest(**base)


def test_cache_compile_counts_equal_eager_and_compile_toggles_in_place(runner):
    r = req()
    base = runner.generate(r, "b32")
    tr = runner.manager.current.pipe.transformer
    eager = runner.generate(r, "c32")
    assert eager.metrics.cache.cached_steps > 0 and eager.metrics.cache.count_source == "block hooks"

    first = runner.generate(r, "cc32")
    m = first.metrics
    line = next(x for x in m.labels.engaged if x.startswith("compile:"))
    assert "regional" in line and "fullgraph=False" in line and "a step cache is engaged" in line
    assert m.timing.compile_s is not None and m.timing.compile_s > 0  # the warm-up run compiled; not in denoise time
    assert m.cache.cached_step_indices == eager.metrics.cache.cached_step_indices  # the bug of 12 cached / 0 full
    assert m.cache.full_steps == eager.metrics.cache.full_steps and m.cache.count_source == "cache-dit"
    assert psnr(first.image, eager.image) > 35.0  # compiled is not bitwise eager, but close

    second = runner.generate(r, "cc32")
    assert second.metrics.timing.compile_s is None and second.metrics.timing.warmup_s is None  # warm for this size
    assert second.metrics.cache.cached_step_indices == eager.metrics.cache.cached_step_indices

    back = runner.generate(r, "b32")  # the same weights run eagerly again: no reload, no recompile
    assert not back.metrics.reloaded and runner.manager.current.pipe.transformer is tr
    assert np.array_equal(back.image, base.image)
    assert stack_state(tr).compile.running is None and len(stack_state(tr).compile.variants) == 1

    again = runner.generate(r, "cc32")
    assert again.metrics.timing.compile_s is None  # the saved compiled blocks were switched back on
    assert np.array_equal(again.image, second.image)


def test_compile_switch_per_request(runner):
    r = req()
    eager = runner.generate(r, "c32")
    off = runner.generate(r, stack(runner, "cc32", compile=False))
    assert "compile: off (eager)" in off.metrics.labels.engaged and off.metrics.timing.compile_s is None
    assert np.array_equal(off.image, eager.image)  # compile off == the eager stack, bitwise
    on = runner.generate(r, stack(runner, "c32", compile=True))
    assert on.metrics.labels.tag == "fp32+DBCache_F1B0W4R0.5MC3+sdpa+compile" and on.metrics.preset == "c32.override"
    assert on.metrics.cache.cached_step_indices == eager.metrics.cache.cached_step_indices


def test_first_block_cache_counts_equal_eager_under_compile(runner):
    r = req()
    eager = runner.generate(r, "fb32")
    assert eager.metrics.cache.cached_steps > 0 and eager.metrics.cache.count_check == "agrees with fbcache state"
    compiled = runner.generate(r, stack(runner, "fb32", compile=True))
    assert compiled.metrics.cache.count_source == "fbcache state"
    assert compiled.metrics.cache.cached_step_indices == eager.metrics.cache.cached_step_indices


def test_compile_preset_without_cache_is_fullgraph_and_all_full(runner):
    res = runner.generate(req(), "compile")
    line = next(x for x in res.metrics.labels.engaged if x.startswith("compile:"))
    assert "fullgraph=True" in line
    assert res.metrics.cache.cached_steps == 0 and res.metrics.cache.full_steps == 12
    assert res.metrics.cache.count_source == "no step cache engaged: every step computed"
    assert res.metrics.quality.psnr_db > 35.0


def test_the_public_limits_shape_key_is_what_builds_dynamo_graphs(runner):
    """app.limits.compiled_shape against Dynamo's own count: requests of one key build no graph, a new key does."""
    from torch._dynamo.utils import counters

    from studio.app.limits import compiled_shape

    first = req()
    runner.generate(first, "compile", compare="off")
    same = [req(steps=8, seed=9, prompt="a blue square"), req(true_cfg_scale=3.0, negative_prompt="blurry")]
    for r in same:
        graphs = counters["stats"]["unique_graphs"]
        runner.generate(r, "compile", compare="off")
        assert counters["stats"]["unique_graphs"] == graphs and compiled_shape("m", r) == compiled_shape("m", first)
    for r in (req(num_images_per_prompt=2), req(width=96)):
        graphs = counters["stats"]["unique_graphs"]
        runner.generate(r, "compile", compare="off")
        assert counters["stats"]["unique_graphs"] > graphs and compiled_shape("m", r) != compiled_shape("m", first)


def test_whole_model_compile_counts_and_refuses_to_hide_a_cache(runner, tmp_path):
    runner.presets.add("whole32", "dtype: float32\ncompile: {enabled: true, regional: false}\n")
    runner.presets.add(
        "whole-c32",
        "dtype: float32\ncache_config: {residual_diff_threshold: 0.5}\ncompile: {enabled: true, regional: false}\n",
    )
    from torch._dynamo.utils import counters

    r = req()
    base = runner.generate(r, "b32")
    graphs_before = counters["stats"]["unique_graphs"]
    whole = runner.generate(r, "whole32")
    assert any(line.startswith("compile: whole transformer, fullgraph=True") for line in whole.metrics.labels.engaged)
    assert whole.metrics.cache.full_steps == 12 and psnr(whole.image, base.image) > 35.0
    # the warm-up really traced and compiled a graph (a first version never switched the compiled forward on)
    assert counters["stats"]["unique_graphs"] > graphs_before and whole.metrics.timing.compile_s > 1.0
    counter = stack_state(runner.manager.current.pipe.transformer).counter
    # the last-block hook is off while blocks are compiled: inside a graph it cannot count, and Dynamo would guard
    # on the counter and recompile on every call (measured: 53 s per run instead of 0.4 s)
    assert counter.hooks_see_blocks is False
    cached = runner.generate(r, "whole-c32")
    assert cached.metrics.labels.fallbacks == [
        "compile: skipped, a whole-transformer graph bypasses the step cache (measured: nothing cached); "
        "set compile.regional: true; running eager"
    ]
    eager = runner.generate(r, "c32")
    assert (
        cached.metrics.cache.cached_step_indices == eager.metrics.cache.cached_step_indices
        and counter.hooks_see_blocks
    )
    assert np.array_equal(cached.image, eager.image)


def test_lora_hot_swap_under_compile_recompiles_nothing(tiny_runner, tiny_lora, tiny_lora_b):
    """LoRAs under a compiled stack go into hot-swap slots (diffusers enable_lora_hotswap before the first
    adapter, load_lora_weights(hotswap=True) after): another LoRA of another rank, another scale and no LoRA at all
    then run on the graphs compiled with the first, with 0 new graphs in Dynamo's own counter; each picture is the
    eager cached picture of the same LoRA, with the same cached steps (cache-dit's list; eager, the block hooks'
    count agrees with it)."""
    from dataclasses import replace

    from torch._dynamo.utils import counters

    from studio.engine import ModelManager, Runner
    from studio.spec import PresetLibrary
    from studio.spec.request import LoraSpec

    r = tiny_runner
    req = r.request(PROMPT, seed=42, steps=12)
    asks = {"b": (LoraSpec(tiny_lora_b),), "b-half": (LoraSpec(tiny_lora_b, 0.5),), "none": ()}
    # B at 0.5 in a studio that never loaded A, run (and unloaded) first: cache-dit patches the pipeline CLASS, and
    # two cached pipelines of one class alive at once leave it patched for every later one (docs/library-behaviour.md)
    fresh = Runner(ModelManager("cpu", settings=current()), PresetLibrary(), model="tiny")
    try:
        alone = fresh.generate(replace(req, loras=asks["b-half"]), "cache", compare="off")
    finally:
        fresh.manager.unload()
    first = r.generate(replace(req, loras=(LoraSpec(tiny_lora),)), "cache-compile", compare="off")
    assert (
        first.metrics.timing.compile_s is not None
    )  # the first LoRA on these weights: compiled (warmed) with its slot
    graphs = counters["stats"]["unique_graphs"]
    got = {k: r.generate(replace(req, loras=lo), "cache-compile", compare="off") for k, lo in asks.items()}
    assert counters["stats"]["unique_graphs"] == graphs  # hot-swap, a new scale, no LoRA: not one recompile
    assert all(g.metrics.timing.compile_s is None and g.metrics.timing.warmup_s is None for g in got.values())
    half = got["b-half"].metrics.labels.engaged
    assert any(x.startswith(f"lora: {tiny_lora_b} at 0.5 ") and "hot-swap slot" in x for x in half)
    assert "lora: 1 hot-swap slot(s) held at scale 0" in " ".join(got["none"].metrics.labels.engaged)
    assert psnr(got["b"].image, first.image) < 35  # B's weights are in the slot, not A's
    # B at 0.5 in a slot first filled by A (rank 4, alpha 4) is B's own scale (alpha 4 / rank 8 per unit, halved):
    # the same picture as a studio that never loaded A (peft's set_scale would use A's alpha/rank: twice the scale)
    assert psnr(got["b-half"].image, alone.image) > 40
    for k, lo in asks.items():
        eager = r.generate(replace(req, loras=lo), "cache", compare="off")
        m = got[k].metrics
        assert psnr(got[k].image, eager.image) > 40, k  # compiled is rounding away from eager
        assert (
            m.cache.cached_step_indices == eager.metrics.cache.cached_step_indices
            and m.cache.count_source == "cache-dit"
        ), k
        assert eager.metrics.cache.count_check.startswith("agrees"), k  # eager: the block hooks and cache-dit agree
