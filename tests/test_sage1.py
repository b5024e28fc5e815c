"""SageAttention 1 (PyPI's sageattention 1.x) as diffusers' `sage1` backend, and how preset `sage` picks its form.

Real diffusers dispatcher throughout. On CPU the real kernel cannot run (it needs triton and CUDA), so the wrapper's
layout and scale wiring is checked with an exact reference kernel of sageattn's signature (engine.sage1's test hook).
"""

from __future__ import annotations

import importlib.util
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry, dispatch_attention_fn  # noqa: E402

from studio.engine import attention, sage1  # noqa: E402
from studio.tiny.build import TinyConfig, build_pipeline  # noqa: E402

CPU, CUDA = torch.device("cpu"), torch.device("cuda")  # a device object only: nothing here touches CUDA
NOT_INSTALLED = "sageattention not installed (pip install sageattention==1.0.6)"
NO_TRITON = "sageattention 1.0.6 does not import (ModuleNotFoundError: No module named 'triton')"


def reference_sageattn(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None, smooth_k=True, **kwargs):
    """sageattn's signature and layouts, computed exactly with torch's SDPA; smooths K in place as 1.0.6 does."""
    if smooth_k:
        k -= k.mean(dim=1 if tensor_layout == "NHD" else 2, keepdim=True)
    if tensor_layout == "NHD":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    out = F.scaled_dot_product_attention(
        q, k, v, is_causal=is_causal, scale=sm_scale, enable_gqa=q.shape[1] != k.shape[1]
    )
    return out.transpose(1, 2) if tensor_layout == "NHD" else out


@pytest.fixture
def sage_1_0_6_without_triton(tmp_path, monkeypatch):
    """sageattention 1.0.6 as pip installs it (a dist-info and a package whose core imports triton at once), on a
    torch without triton: what `pip install sageattention` gives on this CPU machine."""
    if importlib.util.find_spec("triton") is not None:
        pytest.skip("triton is importable here")
    pkg = tmp_path / "sageattention"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .core import sageattn, sageattn_varlen\n")
    (pkg / "core.py").write_text("import torch\nimport triton\nimport triton.language as tl\n")  # as 1.0.6's opens
    dist = tmp_path / "sageattention-1.0.6.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sageattention\nVersion: 1.0.6\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sage1, "_kernel", None)
    yield
    for name in [m for m in sys.modules if m == "sageattention" or m.startswith("sageattention.")]:
        del sys.modules[name]


@pytest.fixture
def no_sageattention():
    if sage1.installed_version() is not None:
        pytest.skip(f"sageattention {sage1.installed_version()} is installed here")


def _sage_entry():
    r, s = _AttentionBackendRegistry, AttentionBackendName.SAGE
    return (
        r._backends[s],
        list(r._constraints[s]),
        set(r._supported_arg_names[s]),
        s.value in r._supports_context_parallel,
    )


def test_registration_adds_sage1_once_and_leaves_diffusers_sage_alone():
    before, active = _sage_entry(), _AttentionBackendRegistry._active_backend
    member = sage1.register()
    assert member is AttentionBackendName("sage1") is AttentionBackendName.SAGE1 and member == "sage1"
    assert "sage1" in {m.value for m in AttentionBackendName.__members__.values()}  # what set_attention_backend reads
    assert _AttentionBackendRegistry._backends[member] is sage1.sage1_attention
    passed = {
        "query",
        "key",
        "value",
        "attn_mask",
        "dropout_p",
        "is_causal",
        "scale",
        "enable_gqa",
        "_parallel_config",
    }
    assert passed <= _AttentionBackendRegistry._supported_arg_names[member]  # none silently dropped
    assert _AttentionBackendRegistry._constraints[member] == [sage1.check_request, sage1.check_kernel_inputs]
    names = list(AttentionBackendName._member_names_)
    assert sage1.register() is member and list(AttentionBackendName._member_names_) == names
    assert names.count("SAGE1") == 1 and list(AttentionBackendName)[-1] is member
    assert "sage1" not in _AttentionBackendRegistry._supports_context_parallel
    assert _sage_entry() == before and _AttentionBackendRegistry._active_backend == active


def _qkv(seed=0, sq=7, skv=5, heads=3, kv_heads=3, dim=16):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, sq, heads, dim, generator=g)
    k, v = (torch.randn(2, skv, kv_heads, dim, generator=g) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("checks", [False, True], ids=["plain", "DIFFUSERS_ATTN_CHECKS"])
@pytest.mark.parametrize(
    "shape, kw",
    [
        (dict(), dict()),
        (dict(), dict(scale=0.3)),
        (dict(skv=7), dict(is_causal=True)),
        (dict(kv_heads=1), dict(enable_gqa=True, scale=0.2)),
    ],
    ids=["default-scale", "scale", "causal", "gqa"],
)
def test_sage1_through_the_dispatcher_equals_native(monkeypatch, checks, shape, kw):
    monkeypatch.setattr(_AttentionBackendRegistry, "_checks_enabled", checks)  # what DIFFUSERS_ATTN_CHECKS sets
    member = sage1.register()
    q, k, v = _qkv(**shape)
    k_before = k.clone()
    want = dispatch_attention_fn(q, k, v, backend=AttentionBackendName.NATIVE, **kw)
    with sage1.kernel_for_tests(reference_sageattn):
        got = dispatch_attention_fn(q, k, v, backend=member, **kw)
    assert got.shape == want.shape == q.shape
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(k, k_before)  # the kernel smooths K in place: the wrapper gives it its own copy


@pytest.mark.parametrize("checks", [False, True], ids=["plain", "DIFFUSERS_ATTN_CHECKS"])
def test_sage1_refuses_masks_dropout_and_outside_the_hook_cpu_and_fp32(monkeypatch, checks):
    monkeypatch.setattr(_AttentionBackendRegistry, "_checks_enabled", checks)
    member = sage1.register()
    q, k, v = _qkv(skv=7)
    with sage1.kernel_for_tests(reference_sageattn):
        with pytest.raises(ValueError, match=r"attn_mask of shape \(7, 7\) given.*use attention_backend: sdpa"):
            dispatch_attention_fn(q, k, v, attn_mask=torch.ones(7, 7, dtype=torch.bool), backend=member)
        with pytest.raises(ValueError, match=r"dropout_p=0.1, SageAttention 1 has no dropout"):
            dispatch_attention_fn(q, k, v, dropout_p=0.1, backend=member)
        with pytest.raises(ValueError, match=r"3 query heads and 1 key heads \(enable_gqa=False\)"):
            dispatch_attention_fn(q, k[:, :, :1], v[:, :, :1], backend=member)
    with pytest.raises(ValueError, match=r"tensors on \['cpu'\], SageAttention 1 runs on one CUDA device"):
        dispatch_attention_fn(q, k, v, backend=member)  # the real kernel's limits hold without the test hook


def test_sage1_reasons_name_what_is_missing(no_sageattention):
    assert sage1.unavailable_reason(CUDA, torch.bfloat16, 128) == NOT_INSTALLED
    assert sage1.package_note() is None


def test_sage1_reasons_with_sageattention_1_0_6_installed_and_no_triton(sage_1_0_6_without_triton):
    assert sage1.installed_version() == "1.0.6"
    assert sage1.unavailable_reason(CPU, torch.float32, 32) == "unavailable on cpu"
    assert sage1.unavailable_reason(CUDA, torch.float32, 128) == (
        "SageAttention 1 here runs float16/bfloat16, the transformer is float32"
    )
    assert sage1.unavailable_reason(CUDA, torch.bfloat16, 32) == "head_dim 32, SageAttention 1 takes 64/96/128"
    assert sage1.unavailable_reason(CUDA, torch.bfloat16, 128) == NO_TRITON
    assert sage1.package_note() == "sageattention 1.0.6 is installed but does not import: No module named 'triton'"


def test_on_cuda_sage_tries_each_form_and_says_why(no_sageattention, monkeypatch):
    """The CUDA branch, up to the first import or kernel call (each form is refused before either here)."""
    import huggingface_hub.constants as hub

    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    assert attention.resolve("sage", CUDA, torch.bfloat16, 128) == (
        None,
        [
            ("sage", "package sageattention not installed"),
            ("sage1", NOT_INSTALLED),
            ("sage_hub", "the Hub is offline (HF_HUB_OFFLINE)"),
        ],
    )
    if importlib.util.find_spec("kernels") is None:
        monkeypatch.setattr(hub, "HF_HUB_OFFLINE", False)
        assert attention.resolve("_flash_3", CUDA, torch.bfloat16, 128)[1][1:] == [
            ("_flash_3_hub", "package kernels not installed")
        ]
    assert attention.resolve("sage", CPU, torch.float32, 32) == (None, [("sage", "unavailable on cpu")])


def test_on_cuda_with_sageattention_1_0_6_and_no_triton(sage_1_0_6_without_triton, monkeypatch):
    import huggingface_hub.constants as hub

    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    form, tried = attention.resolve("sage", CUDA, torch.bfloat16, 128)
    assert form is None and tried[:2] == [
        ("sage", "sageattention 1.0.6 installed, diffusers' sage needs sageattention>=2.1.1"),
        ("sage1", NO_TRITON),
    ]
    assert attention.refusal("sage", tried, CUDA) == (
        "sageattention 1.0.6 installed, diffusers' sage needs sageattention>=2.1.1; "
        f"sage1: {NO_TRITON}; sage_hub: the Hub is offline (HF_HUB_OFFLINE)"
    )


@pytest.fixture(scope="module")
def pipe():
    p = build_pipeline(TinyConfig(heads=2, head_dim=32, double_blocks=1, single_blocks=1, vae_channels=(16, 32)))
    for m in p.components.values():  # built, not loaded: in training mode, and T5's dropout would vary each call
        if isinstance(m, torch.nn.Module):
            m.eval()
    p.set_progress_bar_config(disable=True)
    return p


def _picture(pipe) -> np.ndarray:
    return pipe(
        prompt="a red circle in the center, blue background",
        height=32,
        width=32,
        num_inference_steps=2,
        generator=torch.Generator("cpu").manual_seed(0),
        output_type="np",
        max_sequence_length=32,
    ).images[0]


def _backends(tr) -> set:
    return {
        m.processor._attention_backend
        for m in tr.modules()
        if hasattr(getattr(m, "processor", None), "_attention_backend")
    }


def test_preset_sage_on_cpu_runs_sdpa_with_the_reason_and_the_same_picture(pipe):
    base = attention.apply_attention(pipe, "sdpa", CPU)
    assert base.engaged and base.detail == "attention: sdpa"
    want = _picture(pipe)
    e = attention.apply_attention(pipe, "sage", CPU)
    assert not e.engaged and e.fell_back and e.requested == "sage"
    if sage1.installed_version() is None:
        assert e.detail == "sage: unavailable on cpu, using sdpa"
    assert e.detail.startswith("sage: unavailable on cpu") and e.detail.endswith(", using sdpa")
    assert _backends(pipe.transformer) == {AttentionBackendName.NATIVE}
    assert np.array_equal(_picture(pipe), want)


def test_preset_sage_on_cpu_says_when_sageattention_1_is_installed(pipe, sage_1_0_6_without_triton):
    e = attention.apply_attention(pipe, "sage", CPU)
    assert not e.engaged and e.detail == (
        "sage: unavailable on cpu (sageattention 1.0.6 is installed but does not import: No module named 'triton'), "
        "using sdpa"
    )


def test_a_tiny_transformer_runs_sage1_as_native_with_the_reference_kernel(pipe):
    """set_attention_backend("sage1") reaches every processor, and a whole denoising run through the wrapper gives
    sdpa's picture (to float error): the wiring holds inside a real model, not only in one call."""
    attention.apply_attention(pipe, "sdpa", CPU)
    want = _picture(pipe)
    member = sage1.register()
    pipe.transformer.set_attention_backend("sage1")
    try:
        assert _backends(pipe.transformer) == {member}
        with sage1.kernel_for_tests(reference_sageattn):
            got = _picture(pipe)
    finally:
        pipe.transformer.set_attention_backend("native")
    np.testing.assert_allclose(got, want, atol=1e-4)
