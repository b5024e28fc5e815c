"""A device-memory budget (STUDIO_DEVICE_MEMORY_GB) the loader honours the same way on a CPU as on CUDA
(engine.placement): sizes read before loading (engine.sizes), a model bigger than the budget loaded on the host and
streamed by its regime with base's pixels, refusals before loading with the numbers and the fix, and a model switch
that lets the old model go first when both would not fit. Real diffusers and cache-dit on the embedded model.

On a CPU the onload and offload device are the same memory: the accounting is logical, and the pixels must equal
base's within the tolerance diffusers' own offload tests use (`test_sequential_cpu_offload_forward_pass`,
expected_max_diff=1e-4 on images in [0, 1]; here they are in fact bitwise equal). The presets run in float32, base
(`b32`) included: in bfloat16 on a CPU with native bf16 a regime may reorder a reduction and move a pixel by one
level (docs/library-behaviour.md T12), which is over that tolerance on one CPU and not on another.
"""

from __future__ import annotations

import json
import struct
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from studio.engine import ModelManager
from studio.engine.placement import Free, decide, free_memory, margin_bytes, needs
from studio.engine.sizes import ModelSizes, read_sizes, sizes_of_pipe
from studio.report.card import metrics_card
from studio.spec import GenerationRequest
from studio.spec.checks import ConfigError
from studio.spec.errors import ModelLoadError
from studio.spec.offload import OffloadSpec
from studio.spec.preset import Preset
from studio.spec.profiles import resolve_model
from studio.spec.settings import current

ATOL = 1e-4  # diffusers tests/pipelines/test_pipelines_common.py: test_sequential_cpu_offload_forward_pass
TINY = resolve_model("tiny")
CPU = torch.device("cpu")
GIB = 2**30


def req(**kw):
    base = dict(prompt="a red circle in the center, blue background", seed=3, steps=8, width=64, height=64)
    base.update(kw)
    return GenerationRequest(**base)


def close(a: np.ndarray, b: np.ndarray) -> bool:
    return float(np.abs(a.astype(np.float64) / 255 - b.astype(np.float64) / 255).max()) <= ATOL


@pytest.fixture
def pinless(monkeypatch):
    """Pinning as a no-op: what cache-dit's layerwise offload needs of the host, on a machine with no accelerator."""
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: self)


@pytest.fixture
def runner(tiny_runner, tmp_path):
    tiny_runner.presets.user_dir = tmp_path
    for name, text in {
        "b32": "",
        "auto": "offload_config: {policy: auto}\n",
        "layer": "offload_config: {policy: layerwise_offload}\n",
        "group": "offload_config: {policy: group_offload}\n",
        "none": "offload_config: {policy: none}\n",
    }.items():
        tiny_runner.presets.add(name, "dtype: float32\n" + text)
    return tiny_runner


def loads(manager: ModelManager) -> list:
    """Counts the manager's calls of from_pretrained, each with whether a model was still loaded at that moment."""
    seen, real = [], manager._from_pretrained

    def counted(source, dtype):
        seen.append(manager.current is not None)
        return real(source, dtype)

    manager._from_pretrained = counted
    return seen


def under_the_transformer() -> float:
    """A budget (GiB) smaller than the embedded transformer alone (float32) in which a streaming regime fits."""
    sizes, _ = read_sizes(TINY, torch.float32)
    stream = needs(sizes, OffloadSpec(), margin_bytes(sizes, TINY, 4, CPU)[0], CPU)["group_offload"]
    assert stream < sizes.components["transformer"]
    return (stream + sizes.components["transformer"]) / 2 / GIB


# pure: no model loaded ---------------------------------------------------------------------------------------------
@pytest.mark.quick
def test_sizes_before_loading_are_the_stored_tensor_bytes_scaled_to_the_load_dtype():
    stored = {}
    for comp in ("transformer", "text_encoder", "text_encoder_2", "vae"):
        (f,) = Path(TINY, comp).glob("*.safetensors")
        n = struct.unpack("<Q", f.read_bytes()[:8])[0]
        stored[comp] = f.stat().st_size - 8 - n  # the data after the header: every tensor's bytes, stored in bf16
        assert {v["dtype"] for k, v in json.loads(f.read_bytes()[8 : 8 + n]).items() if k != "__metadata__"} == {
            "BF16"
        }
    bf16, _ = read_sizes(TINY, torch.bfloat16)
    f32, _ = read_sizes(TINY, torch.float32)
    assert bf16.components == stored and bf16.source == "safetensors headers"
    assert f32.components == {k: 2 * v for k, v in stored.items()}
    assert len(bf16.blocks) == 6 and sum(bf16.blocks.values()) < bf16.components["transformer"]
    missing, why = read_sizes("someone/not-cached-model", torch.bfloat16)
    assert missing is None and "not in the local Hub cache" in why


@contextmanager
def budget_of(manager: ModelManager, gib_: float | None):
    """`manager` under a device-memory budget of `gib_` GiB for a while (the `device_memory_gb` setting it was handed,
    STUDIO_DEVICE_MEMORY_GB at the edge)."""
    before = manager.settings
    manager.settings = replace(before, device_memory_gb=gib_)
    try:
        yield
    finally:
        manager.settings = before


@pytest.mark.quick
def test_the_decision_is_the_same_code_with_a_budget_and_unbounded_without_one_on_a_cpu():
    sizes = ModelSizes({"transformer": 100, "vae": 20}, {f"transformer_blocks.{i}": 20 for i in range(4)}, "test")
    spec = OffloadSpec(policy="auto")
    free = free_memory(CPU, budget=None)
    assert free.bytes is None and "STUDIO_DEVICE_MEMORY_GB unset" in free.source
    assert decide(sizes, spec, CPU, free, (0, "")).policy == "none"  # today's behaviour: everything resident
    assert free_memory(CPU, held=GIB // 2, budget=1.5) == Free(
        GIB, "STUDIO_DEVICE_MEMORY_GB=1.5 less 0.5 GiB held by the loaded model"
    )
    need = needs(sizes, spec, 10, CPU)
    # on a CPU nothing prefetches: one block on the device beside the rest (40 = vae 20 + the non-block 20)
    assert need == {"none": 130, "layerwise_offload": 70, "group_offload": 70, "model_cpu_offload": 110} | {
        "none+encoders": 130,  # no text encoder here: by use saves nothing
        "layerwise_offload+encoders": 70,
        "group_offload+encoders": 70,
    }
    assert needs(sizes, spec, 10)["layerwise_offload"] == 90  # on CUDA the next block is prefetched beside it
    # auto takes the first that runs here and fits: without pinned memory layerwise cannot run on a CPU
    plan = decide(sizes, spec, CPU, Free(100, "budget"), (10, "activations"))
    assert plan.fits and plan.policy in ("layerwise_offload", "group_offload") and plan.need == 70
    tight = decide(sizes, spec, CPU, Free(60, "budget"), (10, "activations ~x"))
    assert not tight.fits and "needs ~" in tight.refusal("m") and "budget leaves" in tight.refusal("m")
    none = decide(sizes, OffloadSpec(), CPU, Free(100, "budget"), (10, "activations ~x"))
    assert not none.fits and "use offload_config policy auto or layerwise_offload" in none.refusal("m")


# loaded: the embedded model -----------------------------------------------------------------------------------------
def test_sizes_read_before_loading_equal_the_loaded_pipelines_parameter_bytes():
    from diffusers import DiffusionPipeline

    for dtype in (torch.float32, torch.bfloat16, torch.float16):  # float16: T5 keeps its `wo` in float32
        before, _ = read_sizes(TINY, dtype)
        pipe = DiffusionPipeline.from_pretrained(TINY, dtype=dtype)
        loaded = sizes_of_pipe(pipe)
        assert before.components == loaded.components, dtype
        assert before.blocks == loaded.blocks, dtype


def test_a_budget_under_the_transformer_loads_on_the_host_streams_it_and_gives_base_pixels(runner, pinless):
    base = runner.generate(req(), "b32", compare=False)
    budget = under_the_transformer()
    runner.manager.unload()
    seen = loads(runner.manager)
    with budget_of(runner.manager, budget):
        for name, regime in (
            ("auto", "layerwise_offload"),
            ("layer", "layerwise_offload"),
            ("group", "group_offload"),
        ):
            res = runner.generate(req(), name, compare=False)
            assert close(res.image, base.image), name
            place = runner.manager.placement()
            assert place["regime"] == regime and place["logical"], name
            assert "streamed from the host" in place["components"]["transformer"]
            assert all(place["components"][c] == "device" for c in ("text_encoder", "text_encoder_2", "vae"))
            assert place["device_bytes"] < budget * GIB and place["peak_estimate_bytes"] <= budget * GIB
            line = next(x for x in res.metrics.labels.engaged if x.startswith("offload:"))
            assert "text_encoder_2" in line and "resident on cpu" in line  # the rest of the pipeline, where it is
            card = metrics_card(replace(res.metrics, placement=replace(res.metrics.placement, plan=place)))
            assert "<td>placement</td>" in card and "streamed from the host" in card
            assert "placed as on a card of that size" in card
    assert seen == [False]  # one load, on the host


def test_group_offload_when_layerwise_cannot_pin_the_host(runner):
    if torch.cuda.is_available():
        pytest.skip("pinned memory is available here")
    base = runner.generate(req(), "b32", compare=False)
    with budget_of(runner.manager, under_the_transformer()):
        res = runner.generate(req(), "auto", compare=False)
    assert close(res.image, base.image)
    assert runner.manager.placement()["regime"] == "group_offload"
    assert any(x.startswith("offload: auto: group_offload") for x in res.metrics.labels.engaged)


def test_a_budget_too_small_for_anything_is_refused_before_loading_and_the_loaded_model_stays(
    runner, random_model_dir
):
    base = runner.generate(req(), "b32", compare=False)
    seen = loads(runner.manager)
    with budget_of(runner.manager, 0.001):
        with pytest.raises(ModelLoadError) as e:
            runner.generate(req(), "auto", compare=False, model=random_model_dir)
    text = str(e.value)
    assert seen == [] and runner.manager.current.source == TINY
    assert "does not fit the device" in text and "STUDIO_DEVICE_MEMORY_GB=0.001" in text and "leaves 0.001 GiB" in text
    assert "the least of the regimes that run here" in text and "of weights on the device" in text
    assert "raise STUDIO_DEVICE_MEMORY_GB" in text
    again = runner.generate(req(), "b32", compare=False)
    assert np.array_equal(again.image, base.image) and not again.metrics.reloaded


def test_policy_none_over_the_budget_is_refused_before_loading_with_the_fix(runner):
    sizes, _ = read_sizes(TINY, torch.float32)
    need = needs(sizes, OffloadSpec(), margin_bytes(sizes, TINY, 4, CPU)[0], CPU)
    budget = (need["group_offload"] + need["none"]) / 2 / GIB  # the regimes that stream fit, resident does not
    manager = ModelManager("cpu", settings=replace(current(), device_memory_gb=budget))
    seen = loads(manager)
    with budget_of(runner.manager, budget):
        with pytest.raises(ModelLoadError, match="use offload_config policy auto or layerwise_offload") as e:
            manager.pipeline("tiny", Preset("resident", dtype="float32", offload_config=OffloadSpec()), steps=8)
        assert seen == [] and manager.current is None
        assert "none needs ~" in str(e.value) and f"STUDIO_DEVICE_MEMORY_GB={budget:g}" in str(e.value)
        # a loaded model: the regime is refused before anything moves, and the one running stays as it was
        streamed = runner.generate(req(), "group", compare=False)
        with pytest.raises(ConfigError, match="under preset 'none' at 64x64 does not fit the device"):
            runner.generate(req(), "none", compare=False)
        again = runner.generate(req(), "group", compare=False)
    assert np.array_equal(again.image, streamed.image) and runner.manager.placement()["regime"] == "group_offload"


def test_a_model_switch_lets_the_old_model_go_first_only_when_both_would_not_fit(runner, random_model_dir):
    dtype, f32 = torch.float32, runner.manager.resolve_dtype("float32")
    runner.generate(req(), "b32", compare=False)  # the embedded model, resident (no budget)
    seen = loads(runner.manager)
    runner.manager.load(random_model_dir, f32)
    assert seen == [True]  # both fit (no budget): the old one stayed until the new one was read
    tiny, _ = read_sizes(TINY, dtype)
    rand, _ = read_sizes(random_model_dir, dtype)
    margin = margin_bytes(tiny, TINY, dtype.itemsize, CPU)[0]
    tiny_none = needs(tiny, OffloadSpec(), margin, CPU)["none"]
    # each alone fits resident; the one loaded (the random model, resident) and the embedded one together do not
    budget = max(tiny_none, rand.total) * 1.02
    assert rand.total + tiny_none > budget
    with budget_of(runner.manager, budget / GIB):
        runner.manager.load("tiny", f32)
        res = runner.generate(req(), "b32", compare=False)
    assert seen == [True, False]  # the random model was unloaded before the embedded one was read
    assert runner.manager.placement()["regime"] == "none" and res.metrics.reloaded is False
