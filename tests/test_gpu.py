"""The GPU test set (marker `gpu`), run by `.ci/gpu-check` on a CUDA machine; skipped with the reason elsewhere.

What a CPU cannot show: the 8-bit forms engage in the form `auto` names for the card, SageAttention 1 runs its real
Triton kernel (and its picture stays close to SDPA's), and the memory regimes give the resident run's pixels when
weights really move between host and device. Random tiny FLUX (conftest), float32 where a claim is bitwise.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from studio.engine import ModelManager, Runner
from studio.measure.quality import psnr
from studio.spec import GenerationRequest, PresetLibrary
from studio.spec.settings import current

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run by .ci/gpu-check)"),
]
REQ = GenerationRequest(
    prompt="a red circle in the center, blue background", seed=3, steps=10, width=64, height=64, max_sequence_length=32
)


@pytest.fixture
def gpu_runner(random_model_dir, tmp_path):
    r = Runner(ModelManager("cuda", settings=current()), PresetLibrary(), model=random_model_dir)
    r.presets.user_dir = tmp_path
    yield r
    r.manager.unload()


@pytest.fixture(scope="module")
def head64_dir(tmp_path_factory):
    """The random tiny FLUX with attention heads of 64 (SageAttention 1.0.6 takes 64 and 128; conftest's are 32)."""
    from dataclasses import replace

    from conftest import RANDOM_CFG

    from studio.tiny.build import build_pipeline, write_profile

    d = tmp_path_factory.mktemp("random-flux-64")
    cfg = replace(RANDOM_CFG, heads=2, head_dim=64)
    build_pipeline(cfg, seed=0).to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
    write_profile(d, cfg)
    return str(d)


def test_the_8bit_forms_engage_on_the_gpu_in_the_form_auto_names(gpu_runner):
    major, minor = torch.cuda.get_device_capability()
    want = "fp8dq" if (major, minor) >= (8, 9) else "int8dq"
    m = gpu_runner.generate(REQ, "int8", compare=False).metrics
    assert m.labels.tag.split("+")[1] == want and not m.labels.label_changes, (m.labels.tag, m.labels.fallbacks)
    wo = gpu_runner.generate(REQ, "int8-weight-only", compare=False).metrics
    assert wo.labels.tag.split("+")[1] == "int8wo" and not wo.labels.label_changes, wo.labels.fallbacks


def test_sage1_runs_its_real_kernel_close_to_sdpa(head64_dir):
    """On heads of 64 (Sage refuses conftest's 32 and the run falls back to SDPA, which would test nothing); the
    Hub's kernel is offline in .ci/gpu-check, so what runs is SageAttention 1's Triton kernel."""
    pytest.importorskip("sageattention", reason="sageattention is not installed here")
    r = Runner(ModelManager("cuda", settings=current()), PresetLibrary(), model=head64_dir)
    try:
        base = r.generate(REQ, "base", compare=False)
        sage = r.generate(REQ, "sage", compare=False)
    finally:
        r.manager.unload()
    assert "sage" in sage.metrics.labels.tag and not sage.metrics.labels.label_changes, sage.metrics.labels.fallbacks
    assert psnr(sage.image, base.image) > 25  # INT8 QK: lossy, never noise


@pytest.mark.parametrize("regime", ["group_offload", "model_cpu_offload"])
def test_offload_regimes_give_the_resident_pixels_while_weights_move(gpu_runner, regime):
    gpu_runner.presets.add("b32", "dtype: float32\n")
    gpu_runner.presets.add("off", f"dtype: float32\noffload_config: {{policy: {regime}}}\n")
    base = gpu_runner.generate(REQ, "b32", compare=False).image
    res = gpu_runner.generate(REQ, "off", compare=False)
    assert not res.metrics.labels.label_changes, res.metrics.labels.fallbacks
    # real copies between host and device: diffusers' own offload tests allow 1e-4 on latents; pixels: one level
    assert np.abs(res.image.astype(int) - base.astype(int)).max() <= 1


def _eager_then_ahead_of_time(gpu_runner, tmp_path, eager_name: str, compiled_name: str):
    """Both presets run as ZeroGPU runs them: a Runner built under the ZeroGPU settings (the model manager takes its
    settings and profile when it is made: switching them on later leaves it compiling by JIT); the compiled one ran
    ahead of time and cached the same steps."""
    from dataclasses import replace

    zero = replace(current(), zerogpu=True, aot_dir=str(tmp_path / "aot"))
    r = Runner(ModelManager("cuda", settings=zero), gpu_runner.presets, model=gpu_runner.model)
    gpu_runner.manager.unload()  # one model on the card at a time
    try:
        eager = r.generate(REQ, eager_name, compare=False)
        aot = r.generate(REQ, compiled_name, compare=False)
    finally:
        r.manager.unload()
    assert aot.metrics.labels.tag == eager.metrics.labels.tag + "+aot", aot.metrics.labels.fallbacks
    assert aot.metrics.cache.cached_step_indices == eager.metrics.cache.cached_step_indices
    return eager, aot


def test_compile_ahead_of_time_on_cuda_as_zerogpu_runs_it(gpu_runner, tmp_path):
    """engine.aot on CUDA (tests/test_aot.py runs it on the CPU): the packages compiled for CUDA read the eager
    weights in place; the same cached steps as the eager cache, pixels within Inductor's rounding."""

    for name in ("cache", "cache-compile"):
        text = (Path(__file__).resolve().parents[1] / "presets" / f"{name}.yaml").read_text()
        text = text.replace("dtype: auto", "dtype: float32").replace("threshold: 0.24", "threshold: 0.5")
        gpu_runner.presets.add(f"{name}32", text)
    eager, aot = _eager_then_ahead_of_time(gpu_runner, tmp_path, "cache32", "cache-compile32")
    assert psnr(aot.image, eager.image) > 40


def test_float8_quantized_then_compiled_ahead_of_time_as_zerogpus_recipe(gpu_runner, tmp_path):
    """ZeroGPU's recipe on a card with float8 matmuls (sm_89+): float8 per-row quantized first, then the blocks
    exported and compiled ahead of time (engine.aot; tests/test_aot.py runs it with int8 on the CPU): the package
    reads the Float8Tensor weights' inner tensors in place; the same cached steps as the eager float8 stack."""

    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("float8 matmuls need sm_89 or newer")
    stack = "quantize_config: {quant_type: float8_per_row}\ncache_config: {residual_diff_threshold: 0.5}\n"
    gpu_runner.presets.add("f8", stack)
    gpu_runner.presets.add("f8-compile", stack + "compile: {enabled: true, regional: true}\n")
    eager, aot = _eager_then_ahead_of_time(gpu_runner, tmp_path, "f8", "f8-compile")
    assert psnr(aot.image, eager.image) > 30


@pytest.mark.budget24
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_properties(0).total_memory < 64 * 2**30,
    reason="builds FLUX.1-dev's transformer in float32 on the card first (48 GB): needs a card of 64 GiB or more",
)
def test_a_flux_dev_sized_model_loads_and_runs_under_a_24_gb_budget_with_layerwise_and_the_cache(tmp_path):
    """The 24 GB card on an H200 (STUDIO_DEVICE_MEMORY_GB=24): a pipeline with FLUX.1-dev's transformer (19 + 38
    blocks, 23.8 GB in bf16, random weights) and the embedded model's encoders and VAE. Resident is refused before
    loading with the numbers; layerwise offload with the step cache loads it on the host, streams the blocks, caches
    steps, and stays under the budget (the measured peak)."""
    from dataclasses import replace

    from diffusers import FluxPipeline, FluxTransformer2DModel

    from studio.bench.doctor import FLUX_DEV
    from studio.engine import ModelLoadError
    from studio.tiny.build import EMBEDDED_DIR

    folder = tmp_path / "flux-dev-sized"
    small = FluxPipeline.from_pretrained(EMBEDDED_DIR, torch_dtype=torch.bfloat16)
    fit = ("in_channels", "out_channels", "joint_attention_dim", "pooled_projection_dim")  # the small encoders' widths
    cfg = {**FLUX_DEV, **{k: small.transformer.config[k] for k in fit}}
    with torch.device("cuda"):
        big = FluxTransformer2DModel(**cfg).to(torch.bfloat16)  # fp32 init on the GPU (48 GB), then bf16
    pipe = FluxPipeline(**{**small.components, "transformer": big})
    pipe.save_pretrained(folder, safe_serialization=True, max_shard_size="5GB")
    del pipe, big, small
    torch.cuda.empty_cache()
    lib = PresetLibrary(user_dir=tmp_path / "presets")
    lib.add("stream", "offload_config: {policy: layerwise_offload}\ncache_config: {residual_diff_threshold: 0.5}\n")
    card = replace(current(), device_memory_gb=24.0)  # STUDIO_DEVICE_MEMORY_GB=24, handed to the engine
    r = Runner(ModelManager("cuda", settings=card), lib, model=str(folder))
    req = GenerationRequest(prompt="a red circle", seed=3, steps=12, width=512, height=512, max_sequence_length=32)
    try:
        with pytest.raises(ModelLoadError, match=r"does not fit the device: none needs ~2\d\.\d+ GiB"):
            r.generate(req, "base", compare="off")
        torch.cuda.reset_peak_memory_stats()
        res = r.generate(req, "stream", compare="off")
        place = r.manager.placement()
        assert (
            place["regime"] == "layerwise_offload" and "streamed from the host" in place["components"]["transformer"]
        )
        assert (
            res.metrics.cache.cached_steps > 0 and res.metrics.cache.full_steps + res.metrics.cache.cached_steps == 12
        )
        peak = torch.cuda.max_memory_allocated()
        assert peak < 24 * 2**30, peak
        print(
            f"24 GB case: peak {peak / 2**30:.2f} GiB, denoise {res.metrics.timing.denoise_s:.1f} s, "
            f"{res.metrics.labels.tag}"
        )
    finally:
        r.manager.unload()
