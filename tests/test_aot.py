"""Compile on ZeroGPU, ahead of time (studio/engine/aot.py): each repeated block served by an AOTInductor package
built without its weights and given the eager block's own parameters, so one copy of the transformer serves the
compiled stack and base beside it. Run for real on the CPU (torch's export and AOTInductor, cache-dit's DBCache),
as the studio runs on ZeroGPU (spec.settings zerogpu=True): a package built in one process, found on disk by the
next."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from studio.engine import ModelManager, Runner, stack_state
from studio.engine.aot import AotVariant
from studio.spec import PresetLibrary
from studio.spec.hosting import aot_built
from studio.spec.settings import current

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # a package per block class: ~15 s each to compile on a 2-core CPU


def _library(tmp_path) -> PresetLibrary:
    """cache and cache-compile in float32 on every CPU (bf16 rounding under Inductor could flip a cache decision
    on random weights, where residual diffs sit near the threshold: tests/test_ui.py), at the threshold that caches
    some steps of the random model."""
    lib = PresetLibrary(user_dir=tmp_path / "presets")
    for name in ("cache", "cache-compile"):
        text = (ROOT / "presets" / f"{name}.yaml").read_text().replace("dtype: auto", "dtype: float32")
        text = text.replace("residual_diff_threshold: 0.24", "residual_diff_threshold: 0.5")  # random weights
        lib.add(f"{name}32", text)
    return lib


def _pixels_apart(a, b) -> int:
    return int(np.abs(a.astype(int) - b.astype(int)).max())


def test_zerogpu_compiles_ahead_of_time_on_the_eager_weights(random_model_dir, settings, tmp_path):
    aot = tmp_path / "aot"
    settings(zerogpu=True, aot_dir=str(aot))
    lib = _library(tmp_path)
    runner = Runner(ModelManager("cpu", settings=current()), lib, model=random_model_dir)
    req = runner.request("a red circle", steps=10)
    eager = runner.generate(req, "cache32", compare="off")
    res = runner.generate(req, "cache-compile32", compare="off")
    e, m = eager.metrics.as_dict(), res.metrics.as_dict()
    # it ran compiled ahead of time, and the label says so; the cache decided the same steps; the same picture
    assert m["tag"] == e["tag"] + "+aot" and m["fallbacks"] == [] and m["label_changes"] == []
    assert m["cached_step_indices"] == e["cached_step_indices"] and m["cached_steps"] > 0
    assert _pixels_apart(res.image, eager.image) <= 1  # measured: 0 (float32, Inductor's rounding only)
    # one package per block class on disk, and the shape marked built (app.gpu_time reserves no compile for it)
    built = sorted(aot.glob("*.pt2"))
    assert sorted(p.name.split("-")[0] for p in built) == ["FluxSingleTransformerBlock", "FluxTransformerBlock"]
    assert aot_built(aot, random_model_dir, ("aot", "default", "sdpa"), "float32", (64, 64, 1, None))
    assert not aot_built(
        aot, random_model_dir, ("aot", "default", "sdpa"), "float32", (64, 64, 2, None)
    )  # another batch
    tr = runner.manager.current.pipe.transformer
    variant = stack_state(tr).compile.running
    assert isinstance(variant, AotVariant) and not variant.pending()
    # warm now: the next run's block calls all go through the packages
    for b in variant.blocks:
        b.calls = b.eager_calls = 0
    again = runner.generate(req, "cache-compile32", compare="off")
    assert sum(b.calls for b in variant.blocks) > 0 and variant.eager_calls() == 0
    assert np.array_equal(again.image, res.image)
    # a block call with no package in a timed run (a shape its warm-up did not see) runs eagerly, and the card says so
    lone = variant.blocks[0]
    (key,) = lone.loaded
    lone.loaded.clear()
    hidden = lone.store.path(key).rename(aot / "hidden")
    try:
        missed = runner.generate(req, "cache-compile32", compare="off").metrics.as_dict()
    finally:
        hidden.rename(lone.store.path(key))
    assert any("block calls of this run had no ahead-of-time package" in f for f in missed["fallbacks"])
    assert variant.pending()  # the next request warms up again and loads it first
    assert not runner.generate(req, "cache-compile32", compare="off").metrics.as_dict()["fallbacks"]
    # the packages read the eager weights in place (no copy): a weight scaled in place changes the compiled picture
    # exactly as it changes the eager one
    weight = tr.transformer_blocks[0].ff.net[2].weight  # the first block: run at every step, cached or not
    saved = weight.detach().clone()
    with torch.no_grad():
        weight.mul_(4)
    try:
        changed = runner.generate(req, "cache-compile32", compare="off")
        changed_eager = runner.generate(req, "cache32", compare="off")
    finally:
        with torch.no_grad():
            weight.copy_(saved)
    assert _pixels_apart(changed.image, res.image) > 8, _pixels_apart(changed.image, res.image)
    assert _pixels_apart(changed.image, changed_eager.image) <= 1
    # weights moved to new storage (as ZeroGPU's move onto the GPU in each forked process does) and the packages
    # pointed in another process: the first call in this one points them again before running
    runner.generate(req, "cache-compile32", compare="off")  # the same stack next: it stays on, nothing re-points it
    moved = tr.transformer_blocks[0]
    moved.to(torch.float64).to(torch.float32)  # a new storage for every weight of the block
    with torch.no_grad():
        moved.ff.net[2].weight.mul_(4)
    for b in variant.blocks:
        b.pid = -1  # as if pointed before a fork
    try:
        after_move = runner.generate(req, "cache-compile32", compare="off")
    finally:
        with torch.no_grad():
            moved.ff.net[2].weight.div_(4)
    assert _pixels_apart(after_move.image, changed_eager.image) <= 1  # the new storage, scaled, was read
    # a new process (here: a new model manager, new modules) finds the packages on disk and builds none
    stamps = {p.name: p.stat().st_mtime_ns for p in built}
    fresh = Runner(ModelManager("cpu", settings=current()), lib, model=random_model_dir)
    reused = fresh.generate(req, "cache-compile32", compare="off")
    assert {p.name: p.stat().st_mtime_ns for p in aot.glob("*.pt2")} == stamps
    assert reused.metrics.as_dict()["tag"].endswith("+aot") and np.array_equal(reused.image, res.image)
    # a new batch at the same size is a new graph shape: warmed up again, its packages built before the timed run
    # (a warm-up keyed by size alone would have timed a run whose blocks ran eagerly, or recompiled, mid-run)
    two = fresh.generate(
        fresh.request("a red circle", steps=10, num_images_per_prompt=2), "cache-compile32", compare="off"
    )
    again_variant = stack_state(fresh.manager.current.pipe.transformer).compile.running
    assert not again_variant.pending() and two.metrics.as_dict()["tag"].endswith("+aot")
    assert len(list(aot.glob("*.pt2"))) == 4 and aot_built(
        aot, random_model_dir, ("aot", "default", "sdpa"), "float32", (64, 64, 2, None)
    )


def test_a_lora_request_runs_the_compiled_stack_eagerly_and_says_why(settings, tmp_path, tiny_lora):
    """A request's LoRA is loaded after the stack is applied (engine.lora, last): in a fresh process the ahead-of-time
    variant was already switched on, so it is switched off again, the card says why, and nothing is built."""
    from studio.engine.aot import NO_LORA
    from studio.spec.lora import LoraSpec

    aot = tmp_path / "aot"
    settings(zerogpu=True, aot_dir=str(aot))
    runner = Runner(ModelManager("cpu", settings=current()), _library(tmp_path), model="tiny")
    req = runner.request("a red circle", steps=10, loras=(LoraSpec(tiny_lora, 1.0),))
    res = runner.generate(req, "cache-compile32", compare="off")
    m = res.metrics.as_dict()
    assert not m["tag"].endswith("+aot") and "compile->eager" in m["label_changes"]
    assert any(NO_LORA in f for f in m["fallbacks"]), m["fallbacks"]
    assert not list(aot.glob("*.pt2"))  # nothing exported with peft's layers in it
    eager = runner.generate(req, "cache32", compare="off")
    assert _pixels_apart(res.image, eager.image) == 0  # the same eager stack, the same LoRA


def test_8bit_weights_quantized_before_the_export_run_ahead_of_time_on_their_own_storage(
    random_model_dir, settings, tmp_path
):
    """ZeroGPU's recipe: quantize, then export. torchao's int8 weights (tensor subclasses) are flattened by the
    export into their inner tensors (qdata, scale), which the package reads in place as it reads plain weights: the
    compiled 8-bit stack decides the same cached steps and makes the eager 8-bit stack's picture, and an int8 weight
    changed in place changes the compiled picture as it changes the eager one."""
    aot = tmp_path / "aot"
    settings(zerogpu=True, aot_dir=str(aot))
    lib = PresetLibrary(user_dir=tmp_path / "presets")
    stack = (
        "dtype: float32\nquantize_config: {quant_type: int8_per_row}\n"
        "cache_config: {residual_diff_threshold: 0.5}\nattention_backend: sdpa\n"
    )
    lib.add("q8", stack)
    lib.add("q8-compile", stack + "compile: {enabled: true, regional: true}\n")
    runner = Runner(ModelManager("cpu", settings=current()), lib, model=random_model_dir)
    req = runner.request("a red circle", steps=10)
    eager = runner.generate(req, "q8", compare="off")
    res = runner.generate(req, "q8-compile", compare="off")
    e, m = eager.metrics.as_dict(), res.metrics.as_dict()
    assert "int8" in m["tag"] and m["tag"] == e["tag"] + "+aot" and m["fallbacks"] == [], m
    assert m["cached_step_indices"] == e["cached_step_indices"] and m["cached_steps"] > 0
    assert _pixels_apart(res.image, eager.image) <= 2, _pixels_apart(res.image, eager.image)
    variant = stack_state(runner.manager.current.pipe.transformer).compile.running
    assert isinstance(variant, AotVariant) and not variant.pending()
    assert aot_built(aot, random_model_dir, ("aot", "default", "sdpa", "int8_per_row"), "float32", (64, 64, 1, None))
    names = [n for b in variant.blocks for p in b.loaded.values() for n in p.get_constant_fqns()]
    assert any(".parametrizations.weight.original0" in n for n in names)  # the int8 weights' inner tensors
    # the packages read the int8 weight's storage in place: its scale changed (the weight x4), the compiled picture
    # changes as the eager one does
    weight = runner.manager.current.pipe.transformer.transformer_blocks[0].ff.net[2].weight
    with torch.no_grad():
        weight.scale.mul_(4)
    try:
        changed = runner.generate(req, "q8-compile", compare="off")
        changed_eager = runner.generate(req, "q8", compare="off")
    finally:
        with torch.no_grad():
            weight.scale.div_(4)
    assert _pixels_apart(changed.image, res.image) > 8, _pixels_apart(changed.image, res.image)
    assert _pixels_apart(changed.image, changed_eager.image) <= 2
