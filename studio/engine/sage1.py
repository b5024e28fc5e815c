"""SageAttention 1 (PyPI's `sageattention` 1.x, Triton kernels) as a diffusers attention backend named `sage1`:
diffusers' own `sage` needs sageattention >= 2.1.1, built from source. diffusers checks constraints only under
DIFFUSERS_ATTN_CHECKS and silently drops arguments a backend does not name (an attn_mask would vanish), so the
backend names every argument and runs its checks on every call. sageattention is imported only by `load_kernel()`."""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import inspect
from collections.abc import Callable, Iterator

import torch

NAME = "sage1"
MEMBER = "SAGE1"  # the attribute name on AttentionBackendName
PACKAGE = "sageattention"
HEAD_DIMS = (64, 96, 128)  # what 1.0.6's per-block kernels are built for
DTYPES = (torch.float16, torch.bfloat16)
# importing it fails on a torch without triton (ImportError); triton itself may fail on a broken driver setup
_IMPORT_ERRORS = (ImportError, RuntimeError, OSError)
_MARK = "_studio_sage1"  # set on our backend function: tells it apart from a `sage1` someone else registered

_kernel: Callable | None = None  # sageattention.sageattn once load_kernel() imported it
_test_kernel: Callable | None = None  # a reference kernel set by kernel_for_tests (bypasses the input limits)


def installed_version() -> str | None:
    """The installed sageattention's version from its metadata (nothing imported), or None."""
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None


def load_kernel() -> Callable:
    """Import sageattention 1.x's `sageattn` (raises ImportError when it, or triton under it, cannot be imported)."""
    global _kernel
    if _kernel is None:
        _kernel = importlib.import_module(PACKAGE).sageattn
    return _kernel


@contextlib.contextmanager
def kernel_for_tests(kernel: Callable) -> Iterator[None]:
    """Run `kernel` (sageattn's signature, any device and dtype) in place of sageattention's, for a test's scope."""
    global _test_kernel
    prev, _test_kernel = _test_kernel, kernel
    try:
        yield
    finally:
        _test_kernel = prev


def check_request(query, key, attn_mask=None, dropout_p=0.0, enable_gqa=False, **kwargs) -> None:
    """What SageAttention 1 cannot do at all: masks, dropout, uneven head groups."""
    if attn_mask is not None:
        raise ValueError(
            f"attention backend sage1: attn_mask of shape {tuple(attn_mask.shape)} given, SageAttention 1 takes no "
            "mask; use attention_backend: sdpa for a masked model"
        )
    if dropout_p:
        raise ValueError(f"attention backend sage1: dropout_p={dropout_p}, SageAttention 1 has no dropout; use 0.0")
    hq, hk = query.shape[-2], key.shape[-2]
    if hq != hk and (not enable_gqa or hq % hk):
        raise ValueError(
            f"attention backend sage1: {hq} query heads and {hk} key heads (enable_gqa={enable_gqa}); "
            "grouped heads need enable_gqa=True and query heads divisible by key heads"
        )


def check_kernel_inputs(query, key, value, **kwargs) -> None:
    """What the 1.x kernels accept: CUDA tensors on one device, fp16/bf16, head_dim 64/96/128 (a test kernel: any)."""
    if _test_kernel is not None:
        return
    if query.device.type != "cuda" or not query.device == key.device == value.device:
        devs = sorted({str(t.device) for t in (query, key, value)})
        raise ValueError(f"attention backend sage1: tensors on {devs}, SageAttention 1 runs on one CUDA device")
    if query.dtype not in DTYPES or not query.dtype == key.dtype == value.dtype:
        dts = sorted({str(t.dtype) for t in (query, key, value)})
        raise ValueError(f"attention backend sage1: dtypes {dts}, SageAttention 1 here takes float16 or bfloat16")
    if query.shape[-1] not in HEAD_DIMS or key.shape[-1] != query.shape[-1]:
        raise ValueError(
            f"attention backend sage1: head_dim {query.shape[-1]} (key {key.shape[-1]}), the 1.x kernels take "
            f"{'/'.join(map(str, HEAD_DIMS))}"
        )


def _last_dim_dense(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def sage1_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,  # the dispatcher passes everything by keyword
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    return_lse: bool = False,
    _parallel_config=None,
) -> torch.Tensor:
    """The `sage1` backend: [batch, seq, heads, head_dim] in and out, as the dispatcher passes them."""
    if return_lse or _parallel_config is not None:
        raise ValueError(
            "attention backend sage1: no log-sum-exp output, so no context parallelism; "
            "use attention_backend: sdpa in a parallel preset"
        )
    check_request(query, key, attn_mask=attn_mask, dropout_p=dropout_p, enable_gqa=enable_gqa)
    check_kernel_inputs(query, key, value)
    kernel = _test_kernel or load_kernel()
    # 1.0.6 smooths K in place, changing the caller's key: smooth a copy here (softmax ignores a shift shared by all
    # keys; it only narrows the int8 range) and ask it not to.
    k = key - key.mean(dim=1, keepdim=True)
    return kernel(
        _last_dim_dense(query),
        k,
        _last_dim_dense(value),
        tensor_layout="NHD",
        is_causal=is_causal,
        sm_scale=scale,
        smooth_k=False,
    )


setattr(sage1_attention, _MARK, True)


def _member(enum_cls):
    """`AttentionBackendName("sage1")`, added the way Enum's own class builder adds a member, when it is missing."""
    found = enum_cls._value2member_map_.get(NAME)
    if found is not None:
        return found
    if MEMBER in enum_cls._member_map_:
        raise RuntimeError(f"diffusers' AttentionBackendName.{MEMBER} is {enum_cls[MEMBER].value!r}, not {NAME!r}")
    member = str.__new__(enum_cls, NAME)
    member._name_, member._value_, member.__objclass__ = MEMBER, NAME, enum_cls
    member._sort_order_ = len(enum_cls._member_names_)
    setattr(enum_cls, MEMBER, member)
    enum_cls._member_names_.append(MEMBER)
    enum_cls._member_map_[MEMBER] = member
    enum_cls._value2member_map_[NAME] = member
    return member


def register():
    """Add `sage1` to diffusers' attention dispatcher (idempotent) and return its AttentionBackendName; RuntimeError
    when diffusers already has a `sage1` of its own (left alone)."""
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    reg = _AttentionBackendRegistry
    member = _member(AttentionBackendName)
    have = reg._backends.get(member)
    if have is not None and not getattr(have, _MARK, False):
        raise RuntimeError(f"diffusers already registers a {NAME!r} attention backend; the studio's is not added")
    if have is None:
        reg._backends[member] = sage1_attention
        reg._constraints[member] = [check_request, check_kernel_inputs]
        # the dispatcher keeps only these keyword arguments: every one it may pass is named, so none is dropped
        reg._supported_arg_names[member] = set(inspect.signature(sage1_attention).parameters)
    return member


def unavailable_reason(device: torch.device, dtype: torch.dtype, head_dim: int | None) -> str | None:
    """Why `sage1` cannot run here (None: it can); imports sageattention and registers the backend if all else fits."""
    version = installed_version()
    if version is None:
        return f"{PACKAGE} not installed (pip install {PACKAGE}==1.0.6)"
    if not version.startswith("1."):
        return f"{PACKAGE} {version} is not 1.x"
    if device.type != "cuda":
        return f"unavailable on {device.type}"
    if dtype not in DTYPES:
        return f"SageAttention 1 here runs float16/bfloat16, the transformer is {str(dtype).removeprefix('torch.')}"
    if head_dim is not None and head_dim not in HEAD_DIMS:
        return f"head_dim {head_dim}, SageAttention 1 takes {'/'.join(map(str, HEAD_DIMS))}"
    try:
        load_kernel()
    except _IMPORT_ERRORS as e:  # 1.0.6 imports triton at once: a torch without triton stops here
        return f"{PACKAGE} {version} does not import ({type(e).__name__}: {e})"
    try:
        register()
    except RuntimeError as e:
        return str(e)
    return None


def package_note() -> str | None:
    """What the installed sageattention is, for a reason given off CUDA (None: not installed)."""
    version = installed_version()
    if version is None:
        return None
    try:
        load_kernel()
    except _IMPORT_ERRORS as e:
        return f"{PACKAGE} {version} is installed but does not import: {e}"
    return f"{PACKAGE} {version} is installed, its kernels need CUDA"


def describe() -> str:
    """What runs when `sage1` is engaged, for the attention step's message."""
    return f"SageAttention {installed_version()} Triton kernel, registered as {NAME}"
