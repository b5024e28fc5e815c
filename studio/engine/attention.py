"""Attention backend (diffusers attention dispatcher), probed before it is trusted, with a CPU fallback."""

from __future__ import annotations

import importlib.util
import logging

import torch

from studio.engine.state import Engaged
from studio.spec.preset import ATTENTION_BACKENDS

log = logging.getLogger(__name__)

# Backends that need CUDA and the package that provides them.
_CUDA_ONLY = {
    "sage": "sageattention",
    "flash": "flash_attn",
    "_flash_3": "flash_attn_interface",
    "xformers": "xformers",
}


def _probe(backend: str, device: torch.device, dtype: torch.dtype) -> None:
    """One tiny attention call through the dispatcher: some backends are accepted by name and fail on use."""
    from diffusers.models.attention_dispatch import AttentionBackendName, dispatch_attention_fn

    q = torch.randn(1, 16, 2, 64, device=device, dtype=dtype)
    out = dispatch_attention_fn(q, q, q, backend=AttentionBackendName(backend))
    if not torch.isfinite(out.float()).all():
        raise RuntimeError("non-finite output")


def unavailable_reason(backend: str, device: torch.device) -> str | None:
    """Why `backend` cannot run here, or None when it may."""
    pkg = _CUDA_ONLY.get(backend)
    if pkg is None:
        return None
    if device.type != "cuda":
        return f"unavailable on {device.type}"
    if importlib.util.find_spec(pkg) is None:
        return f"package {pkg} not installed"
    try:  # diffusers' own check: the package's version (sage needs sageattention>=2.1.1, which PyPI's 1.x is not)
        from diffusers.models.attention_dispatch import AttentionBackendName, _check_attention_backend_requirements

        _check_attention_backend_requirements(AttentionBackendName(backend))
    except (ImportError, AttributeError, ValueError):
        pass  # a diffusers without that check: the test call decides
    except RuntimeError as e:
        msg = str(e).splitlines()[0]
        return msg.split("because of ")[-1].rstrip(".")[:160] if "because of " in msg else msg[:160]
    return None


def usable(backend: str, device: torch.device, dtype: torch.dtype) -> str | None:
    """Why `backend` (a diffusers dispatcher name) cannot be used here, or None when it passed a test call."""
    reason = unavailable_reason(backend, device)
    if reason is None and backend != "native":
        try:
            _probe(backend, device, dtype)
        except Exception as e:
            reason = f"failed a test call ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
    return reason


def apply_attention(pipe, backend: str) -> Engaged:
    """Set the transformer's attention backend (`backend` as a preset names it: sdpa, sage, flash, ...)."""
    tr = pipe.transformer
    name = ATTENTION_BACKENDS[backend]
    if not hasattr(tr, "set_attention_backend"):
        return Engaged(
            "attention",
            backend,
            backend == "sdpa",
            f"attention: {type(tr).__name__} has no attention dispatcher, using its default",
        )
    device = next(tr.parameters()).device
    dtype = next(tr.parameters()).dtype
    reason = usable(name, device, dtype)
    if reason is not None:
        tr.set_attention_backend("native")
        return Engaged("attention", backend, False, f"{backend}: {reason}, using sdpa")
    tr.set_attention_backend(name)
    label = "sdpa" if name == "native" else backend
    return Engaged("attention", backend, True, f"attention: {label}")
