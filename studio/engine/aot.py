"""Ahead-of-time compile where run-time graphs do not survive (ZeroGPU forks a process per GPU call): each repeated
block served by an AOTInductor package built WITHOUT its weights and handed the eager block's parameters as
user-managed constants, so no second copy of the transformer exists (docs/library-behaviour.md S5). Packages live in
spec.hosting.aot_dir (STUDIO_AOT_DIR), written atomically, and outlive the process."""

from __future__ import annotations

import hashlib
import inspect
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from studio.engine.state import CompiledVariant, Engaged, stack_state
from studio.spec.hosting import HOOK_INSIDE, NO_LORA
from studio.spec.methods import METHOD_NAMES

CONFIGS = {"aot_inductor.package_constants_in_so": False}  # the package carries no weights: they are the block's


def refusal(tr, spec) -> str | None:
    """Why this stack cannot run ahead-of-time compiled (words after "ahead-of-time compile is"); None: it can. The
    preset's own reasons are spec.hosting.aot_refusal's, read here from what the stack engaged."""
    state = stack_state(tr)
    if not getattr(tr, "_repeated_blocks", None):
        return f"per block, and {type(tr).__name__} has no _repeated_blocks"
    if not spec.regional:
        return "per block: set compile.regional: true"
    nested = _nested_subclass(tr)
    if nested:
        return f"not with {nested} weights (their inner tensors are tensor subclasses again: no plain constants)"
    if state.lora.slots or state.lora.fused:
        return NO_LORA
    if state.offloading.regime != "none":
        return f"not under {state.offloading.regime} (the weights move between calls; a package reads them in place)"
    backend = state.step_cache.backend
    if backend in HOOK_INSIDE:
        return f"not under {METHOD_NAMES[backend]} ({HOOK_INSIDE[backend]})"
    return None


def attention_of(tr) -> str:
    """The attention backend diffusers set on the transformer's processors (a package bakes in what it traced)."""
    seen = {str(getattr(m.processor, "_attention_backend", None)) for m in tr.modules() if hasattr(m, "processor")}
    return ",".join(sorted(seen))


def _leaves(value, prefix: str) -> list[tuple]:
    """(path, shape, dtype) of every tensor in `value` and (path, repr) of the rest: what a package is static in."""
    import torch

    if isinstance(value, torch.Tensor):
        return [(prefix, tuple(value.shape), str(value.dtype), value.device.type)]
    if isinstance(value, (tuple, list)):
        inner = [x for i, v in enumerate(value) for x in _leaves(v, f"{prefix}[{i}]")]
        return inner + [(prefix, type(value).__name__)]
    if isinstance(value, dict):
        return [x for k in sorted(value) for x in _leaves(value[k], f"{prefix}.{k}")] + [(prefix, "dict")]
    return [(prefix, repr(value))]


def built_with() -> tuple:
    """What a compiled package depends on beyond its inputs: torch and its CUDA, Triton, torchao, and the GPU's
    compute capability (ZeroGPU has moved hardware once; a package for sm_90 does not load on sm_120)."""
    import importlib.metadata as md

    import torch

    def version(dist: str) -> str | None:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return None

    arch = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
    return (torch.__version__, torch.version.cuda, version("triton"), version("torchao"), arch)


@dataclass
class Store:
    """The packages on disk, keyed by what they are static in (block class, input shapes, dtypes, device)."""

    folder: Path
    mode: str = "default"
    attention: str = ""  # attention_of(the transformer): part of every key

    def key(self, block, weights: tuple, named: dict) -> str:
        """The package's name: a hash of the block's class and weights, the compiler stack it was built with (torch,
        CUDA, Triton, torchao, the GPU's arch: a package built on other hardware or versions is another package),
        compile mode and the call's inputs."""
        what = (type(block).__qualname__, built_with(), self.mode, self.attention, weights, _leaves(named, "kw"))
        return f"{type(block).__name__}-{hashlib.sha256(repr(what).encode()).hexdigest()[:20]}"

    def path(self, key: str) -> Path:
        return self.folder / f"{key}.pt2"

    def build(self, block, named: dict, key: str) -> Path:
        """Export `block` called with `named` and compile it into a package without its weights."""
        import torch

        path = self.path(key)
        self.folder.mkdir(parents=True, exist_ok=True)
        served = block.__dict__.get("_compiled_call_impl")
        block._compiled_call_impl = None  # traced as the eager block, not through its AotBlock
        try:
            with torch.no_grad():
                exported = torch.export.export(block, (), named)
        finally:
            block._compiled_call_impl = served
        configs = dict(CONFIGS)
        if self.mode == "max-autotune":
            configs["max_autotune"] = True
        from studio.engine.int8pack import GUARD, at_risk_layers  # (heavy: torch._inductor)

        if at_risk_layers(block):  # INT8 weight-only on the CPU: the same pass as a JIT compile (engine.compile)
            configs["post_grad_custom_pre_pass"] = GUARD
        fd, staging = tempfile.mkstemp(dir=self.folder, prefix=f".{key}-", suffix=".pt2")
        os.close(fd)
        try:
            torch._inductor.aoti_compile_and_package(exported, package_path=staging, inductor_configs=configs)
            os.replace(staging, path)  # another process sees the whole package or none
        finally:
            Path(staging).unlink(missing_ok=True)  # a failed build leaves nothing half-written behind
        return path


def _constants(block) -> dict:
    """The block's parameters and buffers by their package names, aliases of the eager storage. An 8-bit weight (a
    torchao subclass, quantized before export) gives its inner tensors, named as the export flattened them."""
    out = {}
    for n, t in [*block.named_parameters(), *block.named_buffers()]:
        inner = _flattened(t)
        if inner is None:
            out[n] = t.detach()
            continue
        owner, _, leaf = n.rpartition(".")
        at = f"{owner}.parametrizations.{leaf}" if owner else f"parametrizations.{leaf}"
        out.update({f"{at}.original{i}": x.detach() for i, x in enumerate(inner) if x is not None})
    return out


def _flattened(t) -> list | None:
    """A tensor subclass's inner tensors in `__tensor_flatten__`'s order (None: a plain tensor)."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if not is_traceable_wrapper_subclass(t):
        return None
    names, _ = t.__tensor_flatten__()
    return [getattr(t, name) for name in names]


def _nested_subclass(tr) -> str | None:
    """The type of a weight whose inner tensors are tensor subclasses again (None: none is)."""
    for t in tr.parameters():
        inner = _flattened(t) or []
        if any(_flattened(x) is not None for x in inner):
            return type(t).__name__
    return None


def _weights(block) -> tuple:
    """What a package is static in of the block's weights, with each 8-bit weight's subclass and flatten context (int8
    weight-only and dynamic-activation weights have the same inner tensors, different graphs)."""
    plain = tuple((n, tuple(t.shape), str(t.dtype), t.device.type) for n, t in _constants(block).items())
    forms = tuple(
        (n, type(t).__qualname__, re.sub(r" at 0x[0-9a-f]+", "", repr(t.__tensor_flatten__()[1])))
        for n, t in block.named_parameters()
        if _flattened(t) is not None
    )
    return plain + forms


class AotBlock:
    """A repeated block's `_compiled_call_impl`: its package for this call's shapes, else the eager block, the call
    remembered for the build after the warm-up."""

    def __init__(self, block, store: Store):
        self.block, self.store = block, store
        self.signature = inspect.signature(block.forward)
        self.weights = _weights(block)
        self.loaded: dict[str, object] = {}  # key -> the package, its constants this block's
        self.misses: dict[str, dict] = {}  # key -> the call's inputs by name, until built
        self.calls = self.eager_calls = 0
        self.pid = os.getpid()  # the process whose weights the loaded packages point at

    def _named(self, args, kwargs) -> dict:
        """The call by name, the package's input spec (cache-dit calls blocks positionally). None is kept: a block may
        require an argument the pipeline passes as None."""
        return dict(self.signature.bind(*args, **kwargs).arguments)

    def __call__(self, *args, **kwargs):
        if self.pid != os.getpid():  # a forked process (ZeroGPU moves the weights in each): point again first
            self.point()
        named = self._named(args, kwargs)
        key = self.store.key(self.block, self.weights, named)
        package = self.loaded.get(key)
        if package is None:
            package = self._load(key)
        if package is None:
            self.misses.setdefault(key, named)
            self.eager_calls += 1
            return self.block._call_impl(*args, **kwargs)
        self.calls += 1
        return package(**named)

    def _load(self, key: str):
        path = self.store.path(key)
        if not path.exists():
            return None
        import torch

        package = torch._inductor.aoti_load_package(str(path))
        self._point(package)  # before its first call: a package called without its constants segfaults
        self.loaded[key] = package
        return package

    def _point(self, package) -> None:
        mine = _constants(self.block)
        wanted = {n: mine[n] for n in package.get_constant_fqns()}
        package.load_constants(wanted, check_full_update=True, user_managed=True)

    def point(self) -> None:
        """Give every loaded package this block's weights as they are now: the constants are raw pointers."""
        self.weights, self.pid = _weights(self.block), os.getpid()
        for package in self.loaded.values():
            self._point(package)

    def build(self) -> int:
        """Build and load a package for each call that had none; how many were built."""
        built = 0
        for key, named in list(self.misses.items()):
            if not self.store.path(key).exists():  # another block of its class may have built it
                self.store.build(self.block, named, key)
                built += 1
            self._load(key)
            del self.misses[key]
        return built


@dataclass
class AotVariant(CompiledVariant):
    """The ahead-of-time form of a regional compile: an AotBlock per repeated block."""

    blocks: list = field(default_factory=list)

    def finish(self) -> int:
        """After the warm-up run: build and load the missing packages; how many were built."""
        return sum(b.build() for b in self.blocks)

    def switched_on(self) -> None:
        for b in self.blocks:
            b.point()

    def pending(self) -> bool:
        return any(b.misses for b in self.blocks)

    def eager_calls(self) -> int:
        return sum(b.eager_calls for b in self.blocks)


def variant_key(tr, spec) -> tuple:
    """The ahead-of-time variant's key: its compile mode and the attention backend it traces."""
    return ("aot", spec.mode, attention_of(tr))


def aot_variant(tr, spec, folder: Path) -> AotVariant:
    """A new ahead-of-time variant for `spec`, its packages in `folder` (engine.compile keeps one per process)."""
    store = Store(folder, mode=spec.mode, attention=attention_of(tr))
    blocks = [AotBlock(m, store) for m in tr.modules() if type(m).__name__ in tr._repeated_blocks]
    impls = [(b.block, "_compiled_call_impl", b, None) for b in blocks]
    how = f"ahead-of-time (AOTInductor packages reading the eager weights; {', '.join(tr._repeated_blocks)})"
    return AotVariant(variant_key(tr, spec), False, False, how, impls, blocks=blocks)


def engaged(variant: AotVariant, note: str = "") -> Engaged:
    return Engaged("compile", "on", True, f"compile: {variant.how}{note}", "aot")
