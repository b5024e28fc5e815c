"""The GPU test set (marker `gpu`), run by `.ci/gpu-check` on a CUDA machine; skipped with the reason elsewhere.

What a CPU cannot show: the 8-bit forms engage in the form `auto` names for the card, SageAttention 1 runs its real
Triton kernel (and its picture stays close to SDPA's), and the memory regimes give the resident run's pixels when
weights really move between host and device. Random tiny FLUX (conftest), float32 where a claim is bitwise.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from studio.engine import ModelManager, Runner
from studio.measure.quality import psnr
from studio.spec import GenerationRequest, PresetLibrary

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run by .ci/gpu-check)"),
]
REQ = GenerationRequest(
    prompt="a red circle in the center, blue background", seed=3, steps=10, width=64, height=64, max_sequence_length=32
)


@pytest.fixture
def gpu_runner(random_model_dir, tmp_path):
    r = Runner(ModelManager("cuda"), PresetLibrary(), model=random_model_dir)
    r.presets.user_dir = tmp_path
    yield r
    r.manager.unload()


def test_the_8bit_forms_engage_on_the_gpu_in_the_form_auto_names(gpu_runner):
    major, minor = torch.cuda.get_device_capability()
    want = "fp8dq" if (major, minor) >= (8, 9) else "int8dq"
    m = gpu_runner.generate(REQ, "int8", compare=False).metrics
    assert m.tag.split("+")[1] == want and not m.label_changes, (m.tag, m.fallbacks)
    wo = gpu_runner.generate(REQ, "int8-weight-only", compare=False).metrics
    assert wo.tag.split("+")[1] == "int8wo" and not wo.label_changes, wo.fallbacks


def test_sage1_runs_its_real_kernel_close_to_sdpa(gpu_runner):
    pytest.importorskip("sageattention", reason="sageattention is not installed here")
    base = gpu_runner.generate(REQ, "base", compare=False)
    sage = gpu_runner.generate(REQ, "sage", compare=False)
    assert "sage" in sage.metrics.tag and not sage.metrics.label_changes, sage.metrics.fallbacks
    assert psnr(sage.image, base.image) > 25  # INT8 QK: lossy, never noise


@pytest.mark.parametrize("regime", ["group_offload", "model_cpu_offload"])
def test_offload_regimes_give_the_resident_pixels_while_weights_move(gpu_runner, regime):
    gpu_runner.presets.add("b32", "dtype: float32\n")
    gpu_runner.presets.add("off", f"dtype: float32\noffload_config: {{policy: {regime}}}\n")
    base = gpu_runner.generate(REQ, "b32", compare=False).image
    res = gpu_runner.generate(REQ, "off", compare=False)
    assert not res.metrics.label_changes, res.metrics.fallbacks
    # real copies between host and device: diffusers' own offload tests allow 1e-4 on latents; pixels: one level
    assert np.abs(res.image.astype(int) - base.astype(int)).max() <= 1
