"""Memory regimes (engine.offload) on the real stack, a tiny random FluxPipeline on the CPU.

The CPU is both the onload and the offload device here: the hooks run as on a GPU and move nothing, so a regime must
give the resident run's pixels bitwise (stronger than diffusers' own group-offload tests, atol 1e-4, which cover real
copies) and, under cache-dit's cache, the same cached steps. cache-dit's layerwise offload pins its host copy of every
block, and pinned memory needs an accelerator: those tests make pinning a no-op (`pinless`), the engine itself falls
back with the reason on a plain CPU machine (tested too). Every preset here runs in float32, `b32` (base) included: in
bfloat16 (what `dtype: auto` picks on a CPU with native bf16) a regime may reorder a reduction and move a pixel by
one level, so a bitwise claim would hold on one CPU and fail on another.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from studio.engine import stack_state
from studio.engine.baseline import regime_key, same_regime
from studio.engine.offload import _auto, apply_offload
from studio.engine.streams import stream_begin, stream_report
from studio.spec import GenerationRequest
from studio.spec.offload import AUTO_CANDIDATES, OffloadSpec, regime_name
from studio.spec.preset import Preset

PROMPT = "a red circle in the center, blue background"
CACHE = "cache_config: {residual_diff_threshold: 0.5}\n"  # random weights: cache-dit caches at 0.5 (test_engine)


def req(**kw):
    base = dict(prompt=PROMPT, seed=3, steps=10, width=64, height=64, max_sequence_length=32)
    base.update(kw)
    return GenerationRequest(**base)


@pytest.fixture
def runner(runner, tmp_path):
    runner.presets.user_dir = tmp_path
    for name, text in {
        "b32": "",  # base in float32: a bitwise claim runs in float32 (bf16 reorders reductions by regime)
        "c32": CACHE,
        "group": "offload_config: {policy: group_offload}\n" + CACHE,
        "group2": "offload_config: {policy: group_offload, num_blocks_per_group: 2}\n" + CACHE,
        "layer": "offload_config: {policy: layerwise_offload, transfer_buckets: 2}\n" + CACHE,
        "b-group": "offload_config: {policy: group_offload}\n",
        "b-layer": "offload_config: {policy: layerwise_offload}\n",
        "modeloff": "offload_config: {policy: model_cpu_offload, vae_tiling: true}\n",
        "auto": "offload_config: {policy: auto}\n",
        "whole": "offload_config: {policy: group_offload}\ncompile: {enabled: true, regional: false}\n",
        "q": "quantize_config: {quant_type: int8_weight_only}\n" + CACHE,
        "q-group": "quantize_config: {quant_type: int8_weight_only}\noffload_config: {policy: group_offload}\n"
        + CACHE,
    }.items():
        runner.presets.add(name, "dtype: float32\n" + text)
    return runner


@pytest.fixture
def pinless(monkeypatch):
    """Pinning as a no-op: what cache-dit's layerwise offload needs of the host, on a machine with no accelerator."""
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: self)


def run(runner, preset, **kw):
    res = runner.generate(req(**kw), preset, compare=False)
    return res.image, res.metrics


def line(metrics, head):
    return next(x for x in metrics.labels.engaged + metrics.labels.fallbacks if x.startswith(head))


def hooks_gone(tr) -> bool:
    from cache_dit.offload import get_layerwise_offload_handles

    registries = [m._diffusers_hook for m in tr.modules() if hasattr(m, "_diffusers_hook")]
    return not any(r.hooks for r in registries) and not get_layerwise_offload_handles(tr)


def test_group_and_layerwise_offload_give_resident_pixels_and_cached_steps_and_stream_less_when_cached(
    runner, pinless
):
    resident, rm = run(runner, "c32")
    assert rm.cache.cached_steps > 0 and stream_report(runner.manager.current.pipe.transformer) is None
    for name, policy in (("group", "group_offload"), ("group2", "group_offload"), ("layer", "layerwise_offload")):
        image, m = run(runner, name)
        tr = runner.manager.current.pipe.transformer
        assert np.array_equal(image, resident), name
        assert m.cache.cached_step_indices == rm.cache.cached_step_indices and 0 not in m.cache.cached_step_indices, (
            name
        )
        assert (
            m.cache.backend_cached_steps == m.cache.cached_step_indices
        )  # cache-dit's own record agrees under the hooks
        assert line(m, "offload:").startswith(f"offload: {policy} (") and "nothing crosses a bus" in line(
            m, "offload:"
        )
        assert stack_state(tr).offloading.regime == policy
        # the regime's first call (the warm-up's step 0, where diffusers' streams trace their order) ran every block
        assert stream_report(tr)["first_call_full"]
        stream_begin(tr)  # the next run alone: warm already, one timed run
        again, m2 = run(runner, name)
        rep = stream_report(tr, m2.cache.transformer_calls // 10, m2.cache.cached_step_indices)
        assert np.array_equal(again, resident) and len(rep["h2d_bytes_per_step"]) == 10
        assert rep["check"] == "agrees with the offloaded blocks' hooks", rep["check"]
        assert rep["moved"] is False and rep["policy"] == policy
        assert (
            rep["cached_steps"] == len(m2.cache.cached_step_indices) and rep["full_steps"] == 10 - rep["cached_steps"]
        )
        full, cached = rep["h2d_bytes_per_full_step"], rep["h2d_bytes_per_cached_step"]
        assert 0 < cached < full <= rep["streamed_bytes"], (name, full, cached)
        if name != "group2":  # one block a group: a full step onloads all that is streamed (the rest of the
            # transformer too, under group offload: cache-dit's FLUX forward would skip diffusers' root hook)
            assert full == rep["streamed_bytes"], (name, full, rep["streamed_bytes"])


def test_group_offload_streams_every_block_and_the_rest_each_full_step(runner):
    run(runner, "b-group")
    tr = runner.manager.current.pipe.transformer
    stream_begin(tr)
    _, m = run(runner, "b-group")
    rep = stream_report(tr)
    # no cache: every step a full one, and a full step onloads all of the transformer (blocks and the rest)
    assert rep["cached_steps"] == 0 and rep["h2d_bytes_per_full_step"] == rep["streamed_bytes"]
    from studio.engine.streams import module_bytes

    assert rep["streamed_bytes"] == module_bytes(tr)


def test_switching_regimes_on_a_loaded_pipeline_removes_the_previous_hooks(runner, pinless):
    first, m0 = run(runner, "c32")
    tr = runner.manager.current.pipe.transformer
    for name in ("group", "layer", "group2", "c32"):
        image, m = run(runner, name)
        assert np.array_equal(image, first) and m.cache.cached_step_indices == m0.cache.cached_step_indices, name
        assert runner.manager.current.pipe.transformer is tr and not m.reloaded
    state = stack_state(tr)
    assert state.offloading.regime == "none" and state.offloading.stream is None and hooks_gone(tr)
    # cache-dit's forward (the cache is on) wraps the model's own, not a leftover of diffusers' group hooks
    assert "<locals>" not in tr._original_forward.__func__.__qualname__  # (cache-dit's FLUX patch functor)
    assert {p.device.type for p in tr.parameters()} == {"cpu"}
    # and a cache switched off on a group-offloaded pipeline (cache-dit's disable_cache under diffusers' hooks)
    run(runner, "group")
    plain, _ = run(runner, "b-group")
    base, _ = run(runner, "b32")
    assert np.array_equal(plain, base)


def test_int8_weights_under_group_offload_and_switching_transformer_variants(runner):
    first, m0 = run(runner, "group")
    q, mq = run(runner, "q")
    qg, mqg = run(runner, "q-group")  # torchao tensors in diffusers' groups (moved with swap_tensors)
    assert np.array_equal(qg, q) and mqg.cache.cached_step_indices == mq.cache.cached_step_indices
    assert stream_report(runner.manager.current.pipe.transformer)["h2d_bytes"] > 0
    back, mb = run(runner, "group")  # the full-precision variant kept its regime; the cache goes back on above it
    assert (
        np.array_equal(back, first)
        and mb.cache.cached_step_indices == m0.cache.cached_step_indices
        and not mb.reloaded
    )


def test_a_regime_change_is_reapplied_in_stack_order_and_is_a_new_warm_up(runner):
    run(runner, "c32")
    pipe, stack, _ = runner.manager.pipeline(runner.model, runner.presets.get("group"), steps=10)
    assert stack.order[:2] == ["offload", "cache"]  # the cache off and on again around the new regime
    pipe, again, _ = runner.manager.pipeline(runner.model, runner.presets.get("group"), steps=10)
    assert again.order == ["compile"] and again.signature == stack.signature  # (an eager stack re-checks compile)
    pipe, resident, _ = runner.manager.pipeline(runner.model, runner.presets.get("c32"), steps=10)
    assert resident.signature != stack.signature and resident.signature.offload[0] == "none"


def test_layerwise_offload_without_pinned_memory_falls_back_with_the_reason(runner):
    if torch.cuda.is_available():
        pytest.skip("pinned memory is available here")
    base, _ = run(runner, "b32")
    image, m = run(runner, "b-layer")
    assert np.array_equal(image, base)
    assert any(x.startswith("offload: layerwise_offload: needs pinned host memory") for x in m.labels.fallbacks)
    assert stack_state(runner.manager.current.pipe.transformer).offloading.regime == "none"


def test_model_cpu_offload_falls_back_on_the_cpu_and_the_vae_switch_engages(runner):
    base, _ = run(runner, "b32")
    image, m = run(runner, "modeloff")
    pipe = runner.manager.current.pipe
    assert np.array_equal(image, base)  # a 64x64 image fits one VAE tile: decoded whole
    text = line(m, "offload:")
    assert (
        text.startswith("offload: model_cpu_offload: needs a CUDA device (this run is on cpu)")
        and text in m.labels.fallbacks
    )
    assert "vae: tiled decode" in text and pipe.vae.use_tiling
    run(runner, "b32")
    assert not pipe.vae.use_tiling  # switched back with the regime


def test_auto_on_the_cpu_runs_resident_and_says_why(runner):
    base, _ = run(runner, "b32")
    image, m = run(runner, "auto")
    assert np.array_equal(image, base)
    assert "offload: auto: none (cpu: the weights are already in host memory)" in m.labels.engaged
    assert stack_state(runner.manager.current.pipe.transformer).offloading.regime == "none"


def test_auto_picks_the_fastest_regime_that_fits_the_free_memory(runner, monkeypatch):
    runner.manager.ensure(runner.model)
    pipe, cuda = runner.manager.current.pipe, torch.device("cuda")
    spec = OffloadSpec(policy="auto")
    from studio.engine.offload import _margin
    from studio.engine.placement import FALLBACK_MARGIN
    from studio.engine.placement import needs as needs_of
    from studio.engine.sizes import sizes_of_pipe

    needs = needs_of(sizes_of_pipe(pipe), spec, _margin(pipe, None)[0], None)  # the loader's formula, on the pipe
    assert needs["layerwise_offload"] < needs["none"] and needs["model_cpu_offload"] < needs["none"]
    assert needs["layerwise_offload+encoders"] < needs["layerwise_offload"]  # the encoders wait on the host
    for free in (needs["none"], needs["none+encoders"], needs["layerwise_offload"], 0):
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device, free=free: (free, 2 * free))
        policy, by_use, why = _auto(pipe, spec, cuda, None)  # (no device-memory budget: the card's free memory)
        fits = [c for c in AUTO_CANDIDATES if needs[regime_name(*c)] <= free]
        if not fits:  # nothing fits: the least hungry, saying it may not fit
            assert regime_name(policy, by_use) == min(needs, key=needs.get) and "nothing fits" in why
        else:  # the first in auto's order that fits: each regime with its encoders resident, then by use
            assert (policy, by_use) == fits[0] and "GiB free" in why
    assert FALLBACK_MARGIN >= 2**30


def test_whole_model_compile_is_refused_under_a_block_streaming_regime(runner):
    base, _ = run(runner, "b32")
    image, m = run(runner, "whole")
    assert np.array_equal(image, base)
    text = line(m, "compile:")
    assert text in m.labels.fallbacks and "whole-transformer graph would hold group_offload's weight moves" in text
    assert stack_state(runner.manager.current.pipe.transformer).compile.running is None


@pytest.mark.slow
def test_regional_compile_under_group_offload_runs_fullgraph_off_with_the_same_cached_steps(runner):
    runner.presets.add(
        "gcc", "dtype: float32\noffload_config: {policy: group_offload}\n" + CACHE + "compile: {enabled: true}\n"
    )
    eager, me = run(runner, "group")
    image, m = run(runner, "gcc")
    text = line(m, "compile:")
    assert text.startswith("compile: regional") and "fullgraph=False" in text, text
    assert m.cache.cached_step_indices == me.cache.cached_step_indices
    assert np.abs(image.astype(int) - eager.astype(int)).max() <= 1  # compiled float32: rounding only
    tr = runner.manager.current.pipe.transformer
    stream_begin(tr)
    _, m2 = run(runner, "gcc")
    rep = stream_report(
        tr, 1, m2.cache.cached_step_indices
    )  # the counting hooks run outside the compiled blocks' graphs
    assert rep["check"] == "agrees with the offloaded blocks' hooks"
    assert 0 < rep["h2d_bytes_per_cached_step"] < rep["h2d_bytes_per_full_step"]


def test_apply_offload_none_says_resident(runner):
    runner.manager.ensure(runner.model)
    pipe = runner.manager.current.pipe
    e = apply_offload(pipe, OffloadSpec(), "cpu")
    assert not e.fell_back and e.detail == "offload: none (resident on cpu)"


def test_the_base_of_an_offloaded_stack_runs_under_the_same_regime():
    base, group = Preset("base"), OffloadSpec(policy="group_offload", num_blocks_per_group=2)
    stack = Preset("cache-group", offload_config=group)
    assert same_regime(base, Preset("cache")) is base
    b = same_regime(base, stack)
    assert b.offload_config == group and b.name == "base" and b.cache_config == base.cache_config
    assert regime_key(("m", "fp32"), Preset("cache")) == ("m", "fp32")
    assert regime_key(("m", "fp32"), stack) == ("m", "fp32", group)


def test_text_encoders_by_use_give_the_resident_pixels_and_leave_with_their_regime(runner):
    """Issue 57, placement by use: the text encoders wait on the host and come to the device only for the prompt,
    beside a streamed transformer (group offload here: layerwise needs pinned memory). On this CPU nothing crosses a
    bus, so the pixels are base's bitwise (float32); the hooks are called for each encoder's turn and come off with
    the regime. On a card the same hooks move them (tests/test_gpu.py has no test of it yet: a card says)."""
    from studio.engine.state import stack_state

    runner.presets.add("b32", "dtype: float32\n")
    runner.presets.add("byuse", "dtype: float32\noffload_config: {policy: group_offload, encoders_by_use: true}\n")
    base = runner.generate(req(), "b32", compare="off").image
    res = runner.generate(req(), "byuse", compare="off")
    assert np.array_equal(res.image, base) and not res.metrics.labels.label_changes, res.metrics.labels.fallbacks
    place = runner.manager.placement()
    assert place["regime"] == "group_offload+encoders"
    assert "while it encodes the prompt" in place["components"]["text_encoder_2"]
    pipe = runner.manager.current.pipe
    off = stack_state(pipe.transformer).offloading
    assert off.encoders_by_use and off.encoder_turns >= 2 and off.encoder_turns % 2 == 0  # CLIP and T5, each prompt
    assert any("encode the prompt" in x for x in res.metrics.labels.engaged), res.metrics.labels.engaged
    # another weight set under the same regime, then base: one hook an encoder throughout, none once it is off
    q = "dtype: float32\nquantize_config: {quant_type: int8_weight_only}\n"
    runner.presets.add("byuse8", q + "offload_config: {policy: group_offload, encoders_by_use: true}\n")
    runner.generate(req(), "byuse8", compare="off")
    assert len(pipe.text_encoder._forward_pre_hooks) == len(pipe.text_encoder_2._forward_pre_hooks) == 1
    again = runner.generate(req(), "b32", compare="off")
    assert np.array_equal(again.image, base) and not off.encoders_by_use
    assert not pipe.text_encoder._forward_pre_hooks and not pipe.text_encoder_2._forward_pre_hooks
