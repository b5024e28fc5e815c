"""A preset: the speed stack as validated records whose field names are the YAML keys (cache-dit's own names); a
`cache_config` section is what cache-dit reads, plus the studio's `backend` key (which step cache: spec.methods)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from studio.spec.checks import Record, check_bool, check_choice, check_float, check_int, fail
from studio.spec.label import join_label
from studio.spec.lora import MAX_LORAS, LoraSpec
from studio.spec.methods import HOOK_BACKENDS, METHOD_KNOBS, check_options, options_label
from studio.spec.offload import OffloadSpec

DTYPES = ("auto", "bfloat16", "float16", "float32")
DTYPE_SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "auto": "auto"}
# cache-dit's quant_type names (cache_dit.quantization: _ALLOWED_QUANTIZE_TYPES), plus the studio's `auto`: the
# fastest 8-bit form of the device it runs on (engine.quantize.quant_form picks it and says why).
QUANT_TYPES = ("none", "auto", "float8_per_row", "int8_per_row", "int8_weight_only")
DYNAMIC_FORMS = ("float8_per_row", "int8_per_row")  # activations quantized per call too: pays only compiled
QUANT_ALIASES = {"int8_dynamic": "int8_per_row"}  # the studio's earlier name, read as cache-dit's
QUANT_SHORT = {"auto": "q8", "float8_per_row": "fp8dq", "int8_per_row": "int8dq", "int8_weight_only": "int8wo"}
CACHE_BACKENDS = ("none", "cache-dit", "dbprune", *HOOK_BACKENDS)  # spec.methods: what each one is
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
# Residual-diff thresholds when a preset leaves it unset, by the quantized form that runs (none: full precision).
# A quantized residual carries the quantization's noise on top of the step's own change: the int8 forms add under 2%
# to the median diff (embedded model), no raise; float8 (e4m3, ~16x int8's rounding step) keeps a raised default
# until a GPU run measures it.
DEFAULT_THRESHOLD = {"none": 0.08, "int8_weight_only": 0.08, "int8_per_row": 0.08, "float8_per_row": 0.12}
MIN_CACHE_STEPS = 8  # below this a step cache has no room to gain: warm-up alone eats the run


@dataclass(frozen=True)
class QuantSpec(Record):
    """torchao INT8 on the transformer; `exclude_layers` lists name fragments of Linear layers kept unquantized."""

    quant_type: str = "none"
    exclude_layers: tuple[str, ...] = ("embedder", "embed", "norm_out", "proj_out")

    def __post_init__(self):
        object.__setattr__(self, "quant_type", QUANT_ALIASES.get(self.quant_type, self.quant_type))
        check_choice("quantize_config", "quant_type", self.quant_type, QUANT_TYPES)
        ex = self.exclude_layers
        if isinstance(ex, str) or not isinstance(ex, (list, tuple)) or not all(isinstance(x, str) for x in ex):
            fail("quantize_config", "exclude_layers", ex, "must be a list of strings")
        object.__setattr__(self, "exclude_layers", tuple(ex))

    @property
    def enabled(self) -> bool:
        return self.quant_type != "none"


@dataclass(frozen=True)
class CacheSpec(Record):
    """A step cache: cache-dit DBCache (with an optional calibrator and step mask) or DBPrune, or one of diffusers'
    cache hooks, whose knobs go in `options` by the library's own names (spec.methods)."""

    backend: str = "none"
    Fn_compute_blocks: int = 1
    Bn_compute_blocks: int = 0
    max_warmup_steps: int = 4
    residual_diff_threshold: float | None = None  # None: the default (raised for a quantized transformer)
    max_continuous_cached_steps: int = 3
    max_cached_steps: int = -1
    enable_taylorseer: bool = False
    taylorseer_order: int = 1
    enable_dmd: bool = False
    enable_foca: bool = False
    dmd_history: int = 6
    dmd_rank: int = 0
    steps_computation_mask: str = "none"  # a policy name of cache_dit.steps_mask
    steps_computation_policy: str = "static"
    compute_bins: tuple[int, ...] | None = None
    cache_bins: tuple[int, ...] | None = None
    options: tuple = ()  # the method's own knobs (spec.methods.METHOD_KNOBS): (name, value) pairs, a mapping in YAML

    def __post_init__(self):
        o = "cache_config"
        check_choice(o, "backend", self.backend, CACHE_BACKENDS)
        check_int(o, "Fn_compute_blocks", self.Fn_compute_blocks, 1, 64)
        check_int(o, "Bn_compute_blocks", self.Bn_compute_blocks, 0, 64)
        check_int(o, "max_warmup_steps", self.max_warmup_steps, 0, 1000)
        check_float(o, "residual_diff_threshold", self.residual_diff_threshold, 0.0, 10.0, allow_none=True)
        if self.residual_diff_threshold is not None and self.residual_diff_threshold <= 0:
            fail(o, "residual_diff_threshold", self.residual_diff_threshold, "must be > 0 (set backend: none instead)")
        check_int(o, "max_continuous_cached_steps", self.max_continuous_cached_steps, -1, 1000)
        if self.max_continuous_cached_steps == 0:
            fail(o, "max_continuous_cached_steps", 0, "must be >= 1, or -1 for no limit")
        check_int(o, "max_cached_steps", self.max_cached_steps, -1, 1000)
        check_bool(o, "enable_taylorseer", self.enable_taylorseer)
        check_bool(o, "enable_dmd", self.enable_dmd)
        check_bool(o, "enable_foca", self.enable_foca)
        if self.enable_taylorseer + self.enable_dmd + self.enable_foca > 1:
            on = [n for n in ("enable_taylorseer", "enable_dmd", "enable_foca") if getattr(self, n)]
            fail(o, on[-1], True, f"TaylorSeer, DMD and FoCa are alternative calibrators: {on} are on, keep one")
        check_int(o, "taylorseer_order", self.taylorseer_order, 1, 4)
        check_int(o, "dmd_history", self.dmd_history, 2, 64)
        check_int(o, "dmd_rank", self.dmd_rank, 0, 64)
        if self.steps_computation_mask is None:
            object.__setattr__(self, "steps_computation_mask", "none")
        check_choice(o, "steps_computation_mask", self.steps_computation_mask, MASK_POLICIES)
        check_choice(o, "steps_computation_policy", self.steps_computation_policy, MASK_TYPES)
        self._check_bins(o)
        if self.backend not in ("cache-dit", "none") and (self.calibrator != "none" or self.has_mask):
            fail(o, "backend", self.backend, "calibrators and step masks need backend: cache-dit")
        if self.options and self.backend in ("cache-dit", "none"):
            fail(o, "options", dict(self.options), f"backend {self.backend} takes its knobs as cache_config keys")
        object.__setattr__(self, "options", check_options(self.backend, self.options))

    def _check_bins(self, o: str) -> None:
        if (self.compute_bins is None) != (self.cache_bins is None):
            fail(o, "compute_bins/cache_bins", (self.compute_bins, self.cache_bins), "give both or neither")
        for name in ("compute_bins", "cache_bins"):
            bins = getattr(self, name)
            if bins is None:
                continue
            ok = (
                isinstance(bins, (list, tuple))
                and bins
                and all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in bins)
            )
            if not ok:
                fail(
                    o,
                    name,
                    tuple(bins) if isinstance(bins, list) else bins,
                    "must be a non-empty list of integers >= 1",
                )
            object.__setattr__(self, name, tuple(bins))
        if self.compute_bins is not None and self.steps_computation_mask != "none":
            fail(
                o,
                "steps_computation_mask",
                self.steps_computation_mask,
                "set a mask policy or explicit bins, not both",
            )

    @property
    def enabled(self) -> bool:
        return self.backend != "none"

    @property
    def has_mask(self) -> bool:
        return self.steps_computation_mask != "none" or self.compute_bins is not None

    @property
    def calibrator(self) -> str:
        if self.enable_taylorseer:
            return "taylorseer"
        return "dmd" if self.enable_dmd else "foca" if self.enable_foca else "none"

    def effective_threshold(self, quant: str = "none") -> float:
        """The threshold a run applies; `quant`: the quantized form that runs ("none": full precision)."""
        if self.residual_diff_threshold is not None:
            return float(self.residual_diff_threshold)
        return DEFAULT_THRESHOLD[quant]

    def with_threshold(self, threshold: float) -> "CacheSpec":
        """This cache with another threshold: `residual_diff_threshold` for DBCache, DBPrune and First-Block-Cache,
        the method's own `threshold` knob for MagCache and SeaCache; a method without one refuses it."""
        if self.backend in ("none", "cache-dit", "dbprune", "fbcache"):
            return replace(self, residual_diff_threshold=threshold)
        if "threshold" in METHOD_KNOBS[self.backend]:
            return replace(self, options=tuple(sorted({**dict(self.options), "threshold": threshold}.items())))
        fail("cache_config", "residual_diff_threshold", threshold, f"{self.backend} has no threshold: leave it unset")

    def label(self, threshold: float | None = None) -> str:
        """A short tag in cache-dit's style, e.g. DBCache_F1B0W4R0.24MC3_TS1 (the one place it is written);
        `threshold`: the one a run applied (unset: the spec's own, or "auto" when it leaves it to the default)."""
        if threshold is None:
            threshold = self.residual_diff_threshold
        r = "auto" if threshold is None else f"{threshold:g}"
        if self.backend == "fbcache":
            return f"FBCache_R{r}"
        if self.backend not in ("cache-dit", "dbprune"):
            return options_label(self.backend, self.options)
        kind = "DBPrune" if self.backend == "dbprune" else "DBCache"
        t = f"{kind}_F{self.Fn_compute_blocks}B{self.Bn_compute_blocks}W{self.max_warmup_steps}R{r}"
        t += f"MC{self.max_continuous_cached_steps}"
        if self.enable_taylorseer:
            t += f"_TS{self.taylorseer_order}"
        elif self.enable_dmd:
            t += f"_DMD{self.dmd_history}"
        elif self.enable_foca:
            t += "_FoCa"
        if self.has_mask:
            t += f"_mask-{self.steps_computation_mask if self.steps_computation_mask != 'none' else 'bins'}"
        return t


@dataclass(frozen=True)
class CompileSpec(Record):
    enabled: bool = False
    mode: str = "default"
    fullgraph: bool | None = None  # None: True when nothing is cached, False when a step cache is engaged
    regional: bool = True  # compile_repeated_blocks where the model has it
    dynamic: bool | None = None

    def __post_init__(self):
        check_bool("compile", "enabled", self.enabled)
        check_choice("compile", "mode", self.mode, COMPILE_MODES)
        check_bool("compile", "fullgraph", self.fullgraph, allow_none=True)
        check_bool("compile", "regional", self.regional)
        check_bool("compile", "dynamic", self.dynamic, allow_none=True)

    def effective_fullgraph(self, cache_engaged: bool) -> bool:
        """fullgraph is off whenever a step cache is engaged: caches branch on runtime values."""
        if cache_engaged:
            return False
        return True if self.fullgraph is None else self.fullgraph


@dataclass(frozen=True)
class ParallelSpec(Record):
    """cache-dit's ParallelismConfig, run through Ray: the whole pipeline on `ulysses_size x ring_size x tp_size`
    worker processes, started on demand or on the Ray cluster at `ray_address` (else RAY_ADDRESS). `ray_worker_options`
    go to each worker actor (default: one GPU each, or `num_gpus: 0, num_cpus: 1` on a CPU machine)."""

    ulysses_size: int = 1
    ring_size: int = 1
    tp_size: int = 1
    ray_address: str | None = None
    ray_worker_options: dict | None = None

    def __post_init__(self):
        o = "parallelism_config"
        for name in ("ulysses_size", "ring_size", "tp_size"):
            check_int(o, name, getattr(self, name), 1, 64)
        if self.ray_address is not None and (not isinstance(self.ray_address, str) or not self.ray_address.strip()):
            fail(o, "ray_address", self.ray_address, "must be an address such as 'ray://host:10001', or left out")
        opts = self.ray_worker_options
        if opts is not None:
            ok = isinstance(opts, dict) and all(
                isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
                for k, v in opts.items()
            )
            if not ok:
                fail(o, "ray_worker_options", opts, "must map resource names to numbers >= 0, e.g. {num_gpus: 1}")
            object.__setattr__(self, "ray_worker_options", dict(opts))

    def __hash__(self):  # a dict field: hash what identifies the placement
        opts = tuple(sorted((self.ray_worker_options or {}).items()))
        return hash((self.ulysses_size, self.ring_size, self.tp_size, self.ray_address, opts))

    @property
    def world_size(self) -> int:
        return self.ulysses_size * self.ring_size * self.tp_size

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def label(self) -> str:
        sizes = (("ulysses", self.ulysses_size), ("ring", self.ring_size), ("tp", self.tp_size))
        return "+".join(f"{k}{v}" for k, v in sizes if v > 1)

    def cache_dit_dict(self) -> dict:
        """The `parallelism_config` section as cache_dit.load_configs reads it."""
        out = {k: getattr(self, k) for k in ("ulysses_size", "ring_size", "tp_size") if getattr(self, k) > 1}
        out["use_ray"] = True
        if self.ray_address:
            out["ray_address"] = self.ray_address
        if self.ray_worker_options:
            out["ray_worker_options"] = dict(self.ray_worker_options)
        return out


@dataclass(frozen=True)
class Preset(Record):
    name: str
    description: str = ""
    dtype: str = "auto"  # auto: the device's best exact dtype (see engine.device.resolve_dtype)
    quantize_config: QuantSpec = field(default_factory=QuantSpec)
    offload_config: OffloadSpec = field(default_factory=OffloadSpec)
    cache_config: CacheSpec = field(default_factory=CacheSpec)
    attention_backend: str = "sdpa"
    compile: CompileSpec = field(default_factory=CompileSpec)
    parallelism_config: ParallelSpec = field(default_factory=ParallelSpec)
    # LoRA adapters every request on this preset runs with (and its base image too): hot-swap slots on full-precision
    # weights, fused into the weights before quantization on a quantized preset (engine.lora, engine.loader).
    loras: tuple = ()
    # the transformer (spec.methods.transformer_fingerprint) a search chose these settings on (`methods --write`):
    # on another, the card says their floor was not checked there
    tuned_for: str | None = None
    # run this share of the request's steps (base at fewer steps, or a stack at fewer), still measured against base
    # at the request's full steps: the rival every step cache is read against (bench.fewer); None: every step
    step_share: float | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.strip():
            fail("preset", "name", self.name, "must be a non-empty string")
        if not all(c.isalnum() or c in "-_." for c in self.name):
            fail("preset", "name", self.name, "use letters, digits, '-', '_' and '.' only")
        check_choice("preset", "dtype", self.dtype, DTYPES)
        t = self.tuned_for
        if t is not None and (not isinstance(t, str) or "-" not in t or not t.strip() or " " in t):
            fail(
                "preset",
                "tuned_for",
                t,
                "a transformer's fingerprint as `methods --write` writes it, e.g. FluxTransformer2DModel-1a2b3c4d",
            )
        check_choice("preset", "attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        sh = self.step_share
        if sh is not None and (isinstance(sh, bool) or not isinstance(sh, (int, float)) or not 0 < sh < 1):
            fail("preset", "step_share", sh, "a share of the request's steps above 0 and below 1 (omit: every step)")
        for name, cls in (
            ("quantize_config", QuantSpec),
            ("offload_config", OffloadSpec),
            ("cache_config", CacheSpec),
            ("compile", CompileSpec),
            ("parallelism_config", ParallelSpec),
        ):
            if not isinstance(getattr(self, name), cls):
                fail("preset", name, getattr(self, name), f"must be a {cls.__name__}")
        if self.parallelism_config.enabled and self.quantize_config.enabled:
            fail(
                "preset",
                "quantize_config",
                self.quantize_config.quant_type,
                "parallel workers load the model's own weights: drop quantize_config from a parallel preset",
            )
        lo = self.loras
        if not isinstance(lo, tuple) or len(lo) > MAX_LORAS or not all(isinstance(x, LoraSpec) for x in lo):
            fail("preset", "loras", lo, f"a list of at most {MAX_LORAS} LoRAs ({{path: ..., scale: ...}} each)")
        if lo and self.parallelism_config.enabled:
            why = "parallel workers load the model's own weights: drop loras"
            fail("preset", "loras", [x.label() for x in lo], why)
        if self.parallelism_config.enabled and self.offload_config.enabled:
            why = "parallel workers hold their own weights: drop offload_config from a parallel preset"
            fail("preset", "offload_config", self.offload_config.policy, why)
        if self.parallelism_config.enabled and self.cache_config.backend not in ("none", "cache-dit"):
            b = self.cache_config.backend
            fail(
                "preset", "cache_config.backend", b, "parallel workers run cache-dit's DBCache: use backend: cache-dit"
            )

    # short names the engine reads
    @property
    def quant(self) -> QuantSpec:
        return self.quantize_config

    @property
    def cache(self) -> CacheSpec:
        return self.cache_config

    @property
    def wants_workers(self) -> bool:
        """Whether this preset runs on parallel workers (whether workers run now is engine.parallel.workers')."""
        return self.parallelism_config.enabled

    @property
    def stack(self) -> tuple:
        """Everything that decides what runs (not the name or description)."""
        return (
            self.dtype,
            self.quantize_config,
            self.offload_config,
            self.cache_config,
            self.attention_backend,
            self.compile,
            self.parallelism_config,
            self.loras,
            self.step_share,
        )

    def steps_of(self, steps: int) -> int:
        """The steps this preset runs of a request's `steps`: its share, rounded up, at least 1."""
        return steps if self.step_share is None else max(1, math.ceil(self.step_share * steps - 1e-9))

    def label_parts(self, dtype: str | None = None) -> dict[str, str]:
        """What this preset asks for, one token per part of the stack (spec.label)."""
        return {
            "dtype": DTYPE_SHORT[dtype or self.dtype],
            "quantize": QUANT_SHORT[self.quant.quant_type] if self.quant.enabled else "",
            "offload": self.offload_config.label() if self.offload_config.enabled else "",
            "cache": self.cache.label() if self.cache.enabled else "",
            "attention": self.attention_backend,
            "compile": "compile" if self.compile.enabled else "",
            "parallel": self.parallelism_config.label() if self.parallelism_config.enabled else "",
            "lora": f"lora{len(self.loras)}" if self.loras else "",
            "steps": f"steps{self.step_share:g}" if self.step_share is not None else "",
        }

    def tag(self, dtype: str | None = None) -> str:
        """The label of what this preset ASKS for, e.g. `auto+q8+DBCache_F1B0W4R0.24MC3+sage+compile`: `sage` whether
        or not SageAttention could run (what ran is labelled by AppliedStack.label_parts)."""
        return join_label(self.label_parts(dtype))

    def with_overrides(
        self, cache: bool | None = None, threshold: float | None = None, compile: bool | None = None
    ) -> "Preset":
        """The per-request switches: True/False force the cache or compile on/off, None follows the preset."""
        c = self.cache_config
        if cache is False:
            c = replace(c, backend="none")
        elif cache is True and not c.enabled:
            c = replace(c, backend="cache-dit")
        if threshold is not None:
            c = c.with_threshold(threshold)
        k = self.compile if compile is None else replace(self.compile, enabled=compile)
        if (c, k) == (self.cache_config, self.compile):
            return self
        return replace(self, name=f"{self.name}.override", cache_config=c, compile=k)
