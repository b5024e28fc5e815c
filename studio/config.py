"""Validated configuration records: a generation request and a preset (quantize, cache, attention, compile).

Every record checks itself on construction; an error names the field, the bad value and what is allowed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace

DTYPES = ("bfloat16", "float16", "float32")
QUANT_MODES = ("none", "int8_weight_only", "int8_dynamic")
CACHE_BACKENDS = ("none", "cache-dit", "fbcache")
CALIBRATORS = ("none", "taylorseer", "dmd")
MASK_POLICIES = ("none", "slow", "medium", "fast", "ultra")
MASK_TYPES = ("static", "dynamic")
# Names as the studio speaks them -> diffusers attention backend names.
ATTENTION_BACKENDS = {
    "sdpa": "native",
    "native": "native",
    "sage": "sage",
    "flash": "flash",
    "flash3": "_flash_3",
    "xformers": "xformers",
    "flex": "flex",
    "math": "_native_math",
}
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# First-Block-Cache thresholds when a preset leaves it unset: quantized transformers drift more per step.
FBCACHE_DEFAULT_THRESHOLD = {"dense": 0.08, "quantized": 0.12}
CACHE_DIT_DEFAULT_THRESHOLD = {"dense": 0.08, "quantized": 0.12}
MIN_CACHE_STEPS = 8  # below this a step cache has no room to gain: warm-up alone eats the run


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the field, the value and what is allowed."""


def _fail(owner: str, name: str, value, allowed: str) -> None:
    raise ConfigError(f"{owner}.{name}={value!r} is not valid: {allowed}")


def _check_choice(owner, name, value, choices):
    if value not in choices:
        _fail(owner, name, value, f"use one of {list(choices)}")


def _check_int(owner, name, value, lo=None, hi=None):
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(owner, name, value, "must be an integer")
    if lo is not None and value < lo:
        _fail(owner, name, value, f"must be >= {lo}")
    if hi is not None and value > hi:
        _fail(owner, name, value, f"must be <= {hi}")


def _check_float(owner, name, value, lo=None, hi=None, allow_none=False):
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        _fail(owner, name, value, "must be a finite number" + (" or null" if allow_none else ""))
    if lo is not None and value < lo:
        _fail(owner, name, value, f"must be >= {lo}")
    if hi is not None and value > hi:
        _fail(owner, name, value, f"must be <= {hi}")


def _check_bool(owner, name, value):
    if not isinstance(value, bool):
        _fail(owner, name, value, "must be true or false")


class _Record:
    def as_dict(self) -> dict:
        return asdict(self)  # type: ignore[arg-type]

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]  # type: ignore[arg-type]


@dataclass(frozen=True)
class QuantSpec(_Record):
    """torchao INT8 on the transformer. `exclude` lists name fragments of Linear layers left in full precision."""

    mode: str = "none"
    exclude: tuple[str, ...] = ("embedder", "embed", "norm_out", "proj_out")

    def __post_init__(self):
        _check_choice("quantize_config", "quant_type", self.mode, QUANT_MODES)
        if isinstance(self.exclude, str) or not all(isinstance(x, str) for x in self.exclude):
            _fail("quantize_config", "exclude_layers", self.exclude, "must be a list of strings")
        object.__setattr__(self, "exclude", tuple(self.exclude))

    @property
    def enabled(self) -> bool:
        return self.mode != "none"


@dataclass(frozen=True)
class CacheSpec(_Record):
    """A step cache: cache-dit DBCache (with optional calibrator and step mask) or diffusers First-Block-Cache."""

    backend: str = "none"
    Fn: int = 1
    Bn: int = 0
    warmup: int = 4
    threshold: float | None = None  # None: the backend's default (raised for a quantized transformer)
    max_continuous_cached_steps: int = 3
    max_cached_steps: int = -1
    calibrator: str = "none"
    taylorseer_order: int = 1
    dmd_history: int = 6
    dmd_rank: int = 0
    mask_policy: str = "none"
    compute_bins: tuple[int, ...] | None = None
    cache_bins: tuple[int, ...] | None = None
    mask_type: str = "static"

    def __post_init__(self):
        o = "cache_config"
        _check_choice(o, "backend", self.backend, CACHE_BACKENDS)
        _check_int(o, "Fn_compute_blocks", self.Fn, 1, 64)
        _check_int(o, "Bn_compute_blocks", self.Bn, 0, 64)
        _check_int(o, "max_warmup_steps", self.warmup, 0, 1000)
        _check_float(o, "residual_diff_threshold", self.threshold, 0.0, 10.0, allow_none=True)
        if self.threshold is not None and self.threshold <= 0:
            _fail(o, "residual_diff_threshold", self.threshold, "must be > 0 (set backend: none to turn caching off)")
        _check_int(o, "max_continuous_cached_steps", self.max_continuous_cached_steps, -1, 1000)
        if self.max_continuous_cached_steps == 0:
            _fail(o, "max_continuous_cached_steps", 0, "must be >= 1, or -1 for no limit")
        _check_int(o, "max_cached_steps", self.max_cached_steps, -1, 1000)
        _check_choice(o, "calibrator", self.calibrator, CALIBRATORS)
        _check_int(o, "taylorseer_order", self.taylorseer_order, 1, 4)
        _check_int(o, "dmd_history", self.dmd_history, 2, 64)
        _check_int(o, "dmd_rank", self.dmd_rank, 0, 64)
        _check_choice(o, "steps_computation_mask", self.mask_policy, MASK_POLICIES)
        _check_choice(o, "steps_computation_policy", self.mask_type, MASK_TYPES)
        if (self.compute_bins is None) != (self.cache_bins is None):
            _fail(o, "compute_bins/cache_bins", (self.compute_bins, self.cache_bins), "give both or neither")
        for name in ("compute_bins", "cache_bins"):
            bins = getattr(self, name)
            if bins is not None:
                if (
                    isinstance(bins, (str, bytes))
                    or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in bins)
                    or not bins
                ):
                    _fail(o, name, bins, "must be a non-empty list of positive integers")
                object.__setattr__(self, name, tuple(bins))
        if self.compute_bins is not None and self.mask_policy != "none":
            _fail(o, "steps_computation_mask", self.mask_policy, "set a mask policy or explicit bins, not both")
        if self.backend == "fbcache" and (self.calibrator != "none" or self.has_mask):
            _fail(o, "backend", self.backend, "calibrators and step masks need backend: cache-dit")

    @property
    def enabled(self) -> bool:
        return self.backend != "none"

    @property
    def has_mask(self) -> bool:
        return self.mask_policy != "none" or self.compute_bins is not None

    def effective_threshold(self, quantized: bool) -> float:
        if self.threshold is not None:
            return float(self.threshold)
        table = FBCACHE_DEFAULT_THRESHOLD if self.backend == "fbcache" else CACHE_DIT_DEFAULT_THRESHOLD
        return table["quantized" if quantized else "dense"]


@dataclass(frozen=True)
class AttentionSpec(_Record):
    backend: str = "sdpa"

    def __post_init__(self):
        _check_choice("attention_backend", "backend", self.backend, ATTENTION_BACKENDS)

    @property
    def diffusers_name(self) -> str:
        return ATTENTION_BACKENDS[self.backend]


@dataclass(frozen=True)
class CompileSpec(_Record):
    enabled: bool = False
    mode: str = "default"
    fullgraph: bool | None = None  # None: True when nothing is cached, False when a step cache is engaged
    regional: bool = True  # compile_repeated_blocks where the model has it
    dynamic: bool | None = None

    def __post_init__(self):
        _check_bool("compile", "enabled", self.enabled)
        _check_choice("compile", "mode", self.mode, COMPILE_MODES)
        if self.fullgraph is not None:
            _check_bool("compile", "fullgraph", self.fullgraph)
        _check_bool("compile", "regional", self.regional)
        if self.dynamic is not None:
            _check_bool("compile", "dynamic", self.dynamic)


@dataclass(frozen=True)
class Preset(_Record):
    name: str
    description: str = ""
    dtype: str = "bfloat16"
    quant: QuantSpec = field(default_factory=QuantSpec)
    cache: CacheSpec = field(default_factory=CacheSpec)
    attention: AttentionSpec = field(default_factory=AttentionSpec)
    compile: CompileSpec = field(default_factory=CompileSpec)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.strip():
            _fail("preset", "name", self.name, "must be a non-empty string")
        if not all(c.isalnum() or c in "-_." for c in self.name):
            _fail("preset", "name", self.name, "use letters, digits, '-', '_' and '.' only")
        _check_choice("preset", "dtype", self.dtype, DTYPES)
        for name, cls in (
            ("quant", QuantSpec),
            ("cache", CacheSpec),
            ("attention", AttentionSpec),
            ("compile", CompileSpec),
        ):
            if not isinstance(getattr(self, name), cls):
                _fail("preset", name, getattr(self, name), f"must be a {cls.__name__}")

    def tag(self) -> str:
        """A short label derived from the stack, e.g. `bf16+int8wo+DBCache_F1B0W4R0.24MC3+sage+compile`."""
        parts = [{"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}[self.dtype]]
        if self.quant.enabled:
            parts.append({"int8_weight_only": "int8wo", "int8_dynamic": "int8dq"}[self.quant.mode])
        c = self.cache
        if c.backend == "cache-dit":
            r = "auto" if c.threshold is None else f"{c.threshold:g}"
            t = f"DBCache_F{c.Fn}B{c.Bn}W{c.warmup}R{r}MC{c.max_continuous_cached_steps}"
            if c.calibrator == "taylorseer":
                t += f"_TS{c.taylorseer_order}"
            elif c.calibrator == "dmd":
                t += f"_DMD{c.dmd_history}"
            if c.has_mask:
                t += f"_mask-{c.mask_policy if c.mask_policy != 'none' else 'bins'}"
            parts.append(t)
        elif c.backend == "fbcache":
            parts.append(f"FBCache_R{'auto' if c.threshold is None else f'{c.threshold:g}'}")
        parts.append(self.attention.backend)
        if self.compile.enabled:
            parts.append("compile")
        return "+".join(parts)

    def with_cache_override(self, enabled: bool | None = None, threshold: float | None = None) -> "Preset":
        """The per-request switch: enabled True/False forces the cache on/off, None follows the preset."""
        cache = self.cache
        if enabled is False:
            cache = replace(cache, backend="none")
        elif enabled is True and not cache.enabled:
            cache = replace(cache, backend="cache-dit")
        if threshold is not None:
            cache = replace(cache, threshold=threshold)
        if cache == self.cache:
            return self
        return replace(self, name=f"{self.name}.override", cache=cache)


@dataclass(frozen=True)
class GenerationRequest(_Record):
    prompt: str
    seed: int = 0
    steps: int = 28
    width: int = 64
    height: int = 64
    guidance: float | None = None
    true_cfg_scale: float | None = None
    negative_prompt: str = ""
    max_sequence_length: int | None = None

    def __post_init__(self):
        o = "request"
        if not isinstance(self.prompt, str) or not self.prompt.strip():
            _fail(o, "prompt", self.prompt, "write a prompt (it is empty)")
        _check_int(o, "seed", self.seed, 0, 2**63 - 1)
        _check_int(o, "steps", self.steps, 1, 200)
        _check_int(o, "width", self.width, 16, 4096)
        _check_int(o, "height", self.height, 16, 4096)
        _check_float(o, "guidance", self.guidance, 0.0, 50.0, allow_none=True)
        _check_float(o, "true_cfg_scale", self.true_cfg_scale, 1.0, 50.0, allow_none=True)
        if self.max_sequence_length is not None:
            _check_int(o, "max_sequence_length", self.max_sequence_length, 1, 4096)

    def key(self, model: str) -> tuple:
        """Identity of the picture, for matching a run with its base image."""
        return (
            model,
            self.prompt,
            self.seed,
            self.steps,
            self.width,
            self.height,
            self.guidance,
            self.true_cfg_scale,
            self.negative_prompt,
            self.max_sequence_length,
        )


def parse_switch(value) -> bool | None:
    """A per-request switch: True/False, or None to follow the preset. Accepts 'true'/'false'/'unset' too."""
    if value is None or isinstance(value, bool):
        return value
    v = str(value).strip().lower()
    if v in ("", "unset", "none", "null", "preset", "follow preset"):
        return None
    if v in ("true", "on", "1", "yes"):
        return True
    if v in ("false", "off", "0", "no"):
        return False
    raise ConfigError(f"cache switch {value!r} is not valid: use true, false, or leave it unset to follow the preset")
