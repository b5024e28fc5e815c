"""The device profile (read from this machine, or named: `plan --device h200`) and every decision made from it alone:
the dtype and 8-bit form `auto` becomes, what an attention kernel needs.
GPU memory is torch's `total_memory` of the card, in bytes; ZeroGPU's `large` slice is half a card (docs/deploy.md)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from studio.spec.checks import ConfigError
from studio.spec.preset import DYNAMIC_FORMS

MIB = 2**20
INT8_CPU_FLAGS = (("amx_int8", "AMX-INT8"), ("avx512_vnni", "AVX512-VNNI"), ("avx_vnni", "AVX-VNNI"))
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
SAGE_HEAD_DIMS = (64, 96, 128)  # SageAttention's kernels (engine.sage1.HEAD_DIMS)
EAGER_NOTE = "dynamic-activation quantization is slower than bf16 without compile"
ZEROGPU_CARD = 101_973_950_464  # RTX PRO 6000 Blackwell Server Edition, as `spaces` reports it (zero/configs.json)
# The torch releases ZeroGPU's documentation lists. A ZeroGPU Space of the studio installs requirements-zerogpu.txt:
# torch 2.11.0, the newest of them (torchao 0.18 loads its C++/CUDA kernels on torch 2.11 or newer).
ZEROGPU_TORCH = ("2.8.0", "2.9.1", "2.10.0", "2.11.0")


def zerogpu_torch_note(version: str) -> str | None:
    """Why this torch may not run on ZeroGPU (None: a release its documentation lists)."""
    release = version.split("+")[0]
    if release in ZEROGPU_TORCH:
        return None
    return (
        f"torch {release} is not a release ZeroGPU lists ({', '.join(ZEROGPU_TORCH)}): copy requirements-zerogpu.txt "
        "over requirements.txt in the Space (docs/deploy.md#zerogpu)"
    )


@dataclass(frozen=True)
class DeviceProfile:
    """A machine as the decisions see it. memory_bytes: the GPU's (a ZeroGPU slice's share), None on a CPU; flags: a
    CPU's /proc/cpuinfo flags; triton: Triton kernels can be built here (GPU sm80+); zerogpu: large | xlarge | None."""

    name: str
    kind: str
    label: str
    capability: tuple[int, int] | None = None
    memory_bytes: int | None = None
    flags: frozenset[str] = field(default_factory=frozenset)
    triton: bool = False
    zerogpu: str | None = None

    def __post_init__(self):
        if self.kind not in ("cuda", "cpu"):
            raise ConfigError(f"device profile {self.name!r}: kind {self.kind!r} is not cuda or cpu")
        if self.kind == "cuda" and self.capability is None:
            raise ConfigError(f"device profile {self.name!r}: a cuda profile needs its capability, e.g. (8, 9)")
        if self.zerogpu not in (None, "large", "xlarge"):
            raise ConfigError(f"device profile {self.name!r}: zerogpu {self.zerogpu!r} is not large or xlarge")

    @property
    def gpu(self) -> bool:
        return self.kind == "cuda"

    @property
    def sm(self) -> str:
        return f"sm_{self.capability[0]}{self.capability[1]}" if self.capability else self.kind

    @property
    def bf16(self) -> bool:
        """Native bf16: GPUs from sm80 (torch.cuda.is_bf16_supported() also says True where it is only emulated, as
        on a T4); CPUs with AVX512-BF16 or AMX."""
        if self.gpu:
            return self.capability >= (8, 0)
        return any(f in self.flags for f in NATIVE_BF16_FLAGS)

    @property
    def float8(self) -> bool:
        """Float8 matmuls (torchao's float8 forms: CUDA sm89 or newer)."""
        return self.gpu and self.capability >= (8, 9)

    @property
    def int8(self) -> str:
        """The int8 matmul hardware, in words ('' where int8 matmuls run at fp32 speed at best)."""
        if self.gpu:
            return "int8 tensor cores" if self.capability >= (7, 5) else ""
        return next((name for flag, name in INT8_CPU_FLAGS if flag in self.flags), "")

    @property
    def amx(self) -> bool:
        return "amx_int8" in self.flags

    def describe(self) -> str:
        """'NVIDIA L4 (sm_89, 22.5 GiB)', 'CPU (AVX512-VNNI, bf16)'."""
        if self.gpu:
            mem = f", {self.memory_bytes / 2**30:.1f} GiB" if self.memory_bytes else ""
            return f"{self.label} ({self.sm}{mem}{', ZeroGPU ' + self.zerogpu if self.zerogpu else ''})"
        parts = [p for p in (self.int8, "bf16" if self.bf16 else "no native bf16") if p]
        return f"{self.label} ({', '.join(parts)})"


# A card's memory as torch reports it (get_device_properties().total_memory, MiB), not its marketing or nvidia-smi's
# figure: the lowest seen on recent drivers in published printouts and out-of-memory messages (a T4 is 14.56 GiB to
# torch 2.14 + CUDA 13, 15 GiB on its box). docs/library-behaviour.md T19 has the sources.
def _gpu(name: str, label: str, cap: tuple[int, int], mib: int, **kw) -> DeviceProfile:
    return DeviceProfile(name, "cuda", label, cap, mib * MIB, triton=cap >= (8, 0), **kw)


SAPPHIRE_RAPIDS = frozenset({"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16"})
PROFILES = {
    p.name: p
    for p in (
        DeviceProfile(
            "zerogpu", "cuda", "ZeroGPU RTX Pro 6000 (half)", (12, 0), ZEROGPU_CARD // 2, triton=True, zerogpu="large"
        ),
        DeviceProfile(
            "zerogpu-xlarge", "cuda", "ZeroGPU RTX Pro 6000", (12, 0), ZEROGPU_CARD, triton=True, zerogpu="xlarge"
        ),
        _gpu("h200", "NVIDIA H200", (9, 0), 143_156),
        _gpu("h100", "NVIDIA H100 80GB", (9, 0), 81_008),
        _gpu("l40s", "NVIDIA L40S", (8, 9), 45_495),
        _gpu("l4", "NVIDIA L4", (8, 9), 22_563),
        _gpu("rtx4090", "NVIDIA GeForce RTX 4090", (8, 9), 24_209),
        _gpu("a100", "NVIDIA A100 80GB", (8, 0), 81_038),
        _gpu("a10g", "NVIDIA A10G", (8, 6), 22_587),
        _gpu("t4", "NVIDIA T4", (7, 5), 14_913),
        DeviceProfile("cpu-amx", "cpu", "CPU with AMX (Sapphire Rapids)", flags=SAPPHIRE_RAPIDS),
        DeviceProfile("cpu", "cpu", "CPU (AVX2)", flags=frozenset({"avx2"})),
    )
}


def named(name: str) -> DeviceProfile:
    if name not in PROFILES:
        raise ConfigError(f"device {name!r} is not a known profile: use `here` or one of {', '.join(PROFILES)}")
    return PROFILES[name]


def with_memory(profile: DeviceProfile, budget_gb: float | None) -> DeviceProfile:
    """The profile with its GPU memory capped at a budget (GiB), as the device-memory budget caps placement."""
    if budget_gb is None or profile.memory_bytes is None:
        return profile
    return replace(profile, memory_bytes=min(profile.memory_bytes, int(budget_gb * 2**30)))


# ---------------------------------------------------------------------------------------------------- decisions
def dtype_for(asked: str, profile: DeviceProfile, forced: str | None = None) -> tuple[str, str | None]:
    """(the dtype to run in, why it differs from what was asked or how `auto` chose) for a preset's `dtype`;
    `forced`: what `auto` becomes instead (the `dtype` setting, STUDIO_DTYPE)."""
    if asked == "auto" and forced:
        return forced, f"auto: {forced} (STUDIO_DTYPE)"
    if profile.gpu:
        if asked in ("auto", "bfloat16") and not profile.bf16:
            return "float16", f"bfloat16 not supported by this GPU ({profile.sm}), using float16"
        if asked == "auto":
            return "bfloat16", f"auto: bfloat16 ({profile.sm} has native bf16)"
        return asked, None
    if asked != "auto":
        return asked, None
    native = [f for f in NATIVE_BF16_FLAGS if f in profile.flags]
    if native:
        return "bfloat16", f"auto: bfloat16 (CPU has native bf16: {', '.join(native)})"
    return "float32", "auto: float32 (no native bf16 on this cpu: bf16 would be emulated)"


def float8_reason(profile: DeviceProfile) -> str | None:
    """Why float8 matmuls cannot run on `profile`, or None when they can (torchao: CUDA sm89+)."""
    if not profile.gpu:
        return f"float8 matmuls need a CUDA GPU of sm89 or newer; this is {profile.kind}"
    if not profile.float8:
        return f"float8 matmuls need sm89 or newer; this GPU is {profile.sm.replace('_', '')}"
    return None


def int8_hardware(profile: DeviceProfile) -> str:
    if profile.gpu:
        return f"{profile.sm.replace('_', '')}, int8 tensor cores"
    hw = profile.int8
    return f"cpu with {hw}" if hw else "cpu without VNNI/AMX: int8 matmuls run at fp32 speed at best"


def quant_form(spec, profile: DeviceProfile, compiled: bool) -> tuple[str, str]:
    """(the 8-bit form that runs, why) for a QuantSpec; deterministic, so the model manager keys weights by it.
    `compiled`: the stack is compiled here (a dynamic-activation form pays only then)."""
    q = spec.quant_type
    if q != "auto":
        why = f"{q} as the preset names it"
        if q in DYNAMIC_FORMS and not compiled:
            why += f"; eager: {EAGER_NOTE}"
        return q, why
    if not compiled:
        return "int8_weight_only", f"auto, eager: {EAGER_NOTE}, so weight-only (a memory option: half the weights)"
    if float8_reason(profile) is None:
        return "float8_per_row", f"auto: {int8_hardware(profile).split(',')[0]} has float8 matmuls, compiled"
    hw = int8_hardware(profile)
    if not profile.gpu and not profile.amx:
        return "int8_weight_only", f"auto: {hw}, no AMX: compiled weight-only is the faster form here (measured)"
    if profile.gpu and profile.capability < (8, 0):
        return "int8_weight_only", (
            f"auto: {hw}, but dynamic int8 (torch._int_mm) through compile is not measured below sm80 and Turing's "
            "path has failed before: weight-only until a card measures it"
        )
    return "int8_per_row", f"auto: {hw}, compiled"


def attention_for(backend: str, profile: DeviceProfile, head_dim: int | None = None) -> tuple[str, str]:
    """(the attention that would run, why) for a preset's `attention_backend` on a named profile, by the kernels'
    published requirements (the machine the studio runs on probes instead: engine.attention.resolve)."""
    if backend in ("sdpa", "native"):
        return "sdpa", "PyTorch's scaled_dot_product_attention"
    if not profile.gpu:
        return "sdpa", f"{backend}: unavailable on cpu"
    cap, sm = profile.capability, profile.sm.replace("_", "")
    if backend == "sage":
        if cap < (8, 0):
            return "sdpa", f"sage: SageAttention needs sm80 or newer; this GPU is {sm}"
        if head_dim is not None and head_dim not in SAGE_HEAD_DIMS:
            return "sdpa", f"sage: SageAttention takes head dims {SAGE_HEAD_DIMS}, this model's is {head_dim}"
        if cap >= (12, 0):  # the engine's order (engine.attention: the name, then _ALTERNATES)
            return "sage", (
                f"sage: tried in the engine's order on {sm}: diffusers' sage (SageAttention 2's CUDA kernel where it"
                " is installed), then SageAttention 1's Triton kernel through the studio's own call (SageAttention's"
                " dispatcher does not pick it on sm120), then the Hub's sage_hub; sdpa where none loads"
            )
        return "sage", f"sage: SageAttention on {sm} (diffusers' sage, else SageAttention 1's Triton kernel)"
    if backend == "flash3":
        ok = cap == (9, 0)
        return (
            ("flash3", "FlashAttention-3 on Hopper") if ok else ("sdpa", f"flash3: Hopper-only (sm90); this is {sm}")
        )
    if backend == "flash":
        return ("flash", f"FlashAttention-2 on {sm}") if cap >= (8, 0) else ("sdpa", f"flash: needs sm80+; {sm}")
    return backend, f"{backend} on {sm} (where its package is installed)"
