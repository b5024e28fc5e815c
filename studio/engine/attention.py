"""Attention backend (diffusers attention dispatcher), probed before it is trusted. A backend may run in several
forms (`sage`: diffusers' own, else `sage1`, else the Hub kernel): the first that passes its checks and a test call
runs; when none does, sdpa runs and the message gives each form's reason."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import re

import torch

from studio.engine import sage1
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
# Other forms of a backend, tried in order when it cannot run. All are CUDA kernels, so they are tried on CUDA only.
_ALTERNATES = {"sage": (sage1.NAME, "sage_hub"), "_flash_3": ("_flash_3_hub",)}
_HUB = ("sage_hub", "_flash_3_hub")  # diffusers downloads these kernels in set_attention_backend
# a kernel download fails with the Hub's errors (all OSError), an untrusted publisher (ValueError), a bad kernel
_DOWNLOAD_ERRORS = (OSError, ValueError, RuntimeError, ImportError, AttributeError)


def _probe(backend: str, device: torch.device, dtype: torch.dtype) -> None:
    """One tiny attention call through the dispatcher: some backends are accepted by name and fail on use."""
    from diffusers.models.attention_dispatch import AttentionBackendName, dispatch_attention_fn

    q = torch.randn(1, 16, 2, 64, device=device, dtype=dtype)
    out = dispatch_attention_fn(q, q, q, backend=AttentionBackendName(backend))
    if not torch.isfinite(out.float()).all():
        raise RuntimeError("non-finite output")


def _too_old(pkg: str, backend: str, msg: str) -> str | None:
    """'<pkg> <version> installed, diffusers' <backend> needs <requirement>', from diffusers' requirement text."""
    need = re.search(r"install `([^`]+)`", msg)
    try:
        have = importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return None
    return f"{pkg} {have} installed, diffusers' {backend} needs {need.group(1)}" if need else None


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
        log.debug("diffusers has no requirement check for %s: the test call decides", backend)
    except RuntimeError as e:
        msg = str(e).splitlines()[0]
        if old := _too_old(pkg, backend, msg):
            return old
        return msg.split("because of ")[-1].rstrip(".")[:160] if "because of " in msg else msg[:160]
    return None


def _hub_reason(backend: str, device: torch.device) -> str | None:
    """Why the Hub kernel `backend` cannot run here, or None once diffusers has downloaded it."""
    import huggingface_hub.constants as hub

    if device.type != "cuda":
        return f"unavailable on {device.type}"
    if hub.HF_HUB_OFFLINE:
        return "the Hub is offline (HF_HUB_OFFLINE)"
    if importlib.util.find_spec("kernels") is None:
        return "package kernels not installed"
    from diffusers.models.attention_dispatch import (
        AttentionBackendName,
        _check_attention_backend_requirements,
        _maybe_download_kernel_for_backend,
    )

    member = AttentionBackendName(backend)
    try:
        _check_attention_backend_requirements(member)  # the kernels package's version
        _maybe_download_kernel_for_backend(member)
    except _DOWNLOAD_ERRORS as e:
        return f"kernel not loaded ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
    return None


def usable(backend: str, device: torch.device, dtype: torch.dtype, head_dim: int | None = None) -> str | None:
    """Why `backend` (a dispatcher name, or `sage1`) cannot be used here; None: it passed a test call."""
    if backend == sage1.NAME:
        reason = sage1.unavailable_reason(device, dtype, head_dim)
    elif backend in _HUB:
        reason = _hub_reason(backend, device)
    else:
        reason = unavailable_reason(backend, device)
    if reason is None and backend != "native":
        try:
            _probe(backend, device, dtype)
        except Exception as e:
            reason = f"failed a test call ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
    return reason


def _head_dim(tr) -> int | None:
    hd = getattr(getattr(tr, "config", None), "attention_head_dim", None)
    return hd if isinstance(hd, int) else None


def _ran(backend: str, name: str, form: str) -> str:
    if form == name:
        return "attention: sdpa" if name == "native" else f"attention: {backend}"
    if form == sage1.NAME:
        return f"attention: {backend} ({sage1.describe()})"
    from diffusers.models.attention_dispatch import _HUB_KERNELS_REGISTRY, AttentionBackendName

    return f"attention: {backend} (Hub kernel {_HUB_KERNELS_REGISTRY[AttentionBackendName(form)].repo_id}, as {form})"


def refusal(name: str, tried: list[tuple[str, str]], device: torch.device) -> str:
    """Each form's reason, the backend's own first."""
    first = tried[0][1]
    note = sage1.package_note() if name == "sage" and device.type != "cuda" else None
    return "; ".join([f"{first} ({note})" if note else first] + [f"{form}: {why}" for form, why in tried[1:]])


def resolve(name: str, device: torch.device, dtype: torch.dtype, head_dim: int | None = None):
    """(the first form of backend `name` that runs here or None, [(refused form, reason)] in the order tried)."""
    forms = (name,) + (_ALTERNATES.get(name, ()) if device.type == "cuda" else ())
    tried = []
    for form in forms:
        reason = usable(form, device, dtype, head_dim)
        if reason is None:
            return form, tried
        tried.append((form, reason))
    return None, tried


def apply_attention(pipe, backend: str, device: torch.device) -> Engaged:
    """Set the transformer's attention backend (as a preset names it), probed on `device`, where the pipeline
    computes (under offload the weights' own device says nothing)."""
    tr = pipe.transformer
    name = ATTENTION_BACKENDS[backend]
    if not hasattr(tr, "set_attention_backend"):
        return Engaged(
            "attention",
            backend,
            backend == "sdpa",
            f"attention: {type(tr).__name__} has no attention dispatcher, using its default",
            "sdpa" if backend == "sdpa" else "default",
        )
    form, tried = resolve(name, device, next(tr.parameters()).dtype, _head_dim(tr))
    if form is not None:
        tr.set_attention_backend(form)
        return Engaged("attention", backend, True, _ran(backend, name, form), backend if form == name else form)
    tr.set_attention_backend("native")
    return Engaged("attention", backend, False, f"{backend}: {refusal(name, tried, device)}, using sdpa", "sdpa")
