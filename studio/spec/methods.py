"""The step caches beside DBCache, as `cache_config.backend` names them, and their knobs by the libraries' own names
(in `cache_config.options`). A cached step skips: dbprune (cache-dit) blocks whose residual barely moves; fbcache every
block after the first; magcache, seacache the whole block stack; taylorseer attention (predicted); fastercache
attention (reused) and the uncond branch; pab attention (broadcast). Torch-free, so the app process validates presets
without torch; studio.engine.hooks builds the libraries' configs."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from studio.spec.checks import check_bool, check_float, check_int, fail


@dataclass(frozen=True)
class Knob:
    """One knob of a method: its type, default and range (`kind`: int, float, bool, range, floats, ints, text)."""

    kind: str
    default: object = None
    low: float | None = None
    high: float | None = None
    optional: bool = False  # None is a value (e.g. "no upper step")


_TS_RANGE = Knob("range", (100, 800), -1, 1000)
METHOD_KNOBS: dict[str, dict[str, Knob]] = {
    "dbprune": {
        "enable_dynamic_prune_threshold": Knob("bool", False),
        "dynamic_prune_threshold_relax_ratio": Knob("float", 1.25, 1.0, 10.0),
        "non_prune_block_ids": Knob("ints", (), 0, 1000),
    },
    "fbcache": {},  # its threshold is cache_config.residual_diff_threshold
    "magcache": {
        "threshold": Knob("float", 0.06, 0.0, 10.0),
        "max_skip_steps": Knob("int", 3, 1, 1000),
        "retention_ratio": Knob("float", 0.2, 0.0, 1.0),
        "mag_ratios": Knob("floats", None, 0.0, 100.0, optional=True),
        "calibrated_for": Knob("text", None, optional=True),
    },
    "taylorseer": {
        "cache_interval": Knob("int", 5, 1, 1000),
        "disable_cache_before_step": Knob("int", 3, 0, 1000),
        "disable_cache_after_step": Knob("int", None, 0, 1000, optional=True),
        "max_order": Knob("int", 1, 0, 4),
        "use_lite_mode": Knob("bool", False),
    },
    "fastercache": {
        "spatial_attention_block_skip_range": Knob("int", 2, 1, 100),
        "spatial_attention_timestep_skip_range": Knob("range", (-1, 681), -1, 1000),
        "unconditional_batch_skip_range": Knob("int", 5, 1, 100),
        "unconditional_batch_timestep_skip_range": Knob("range", (-1, 641), -1, 1000),
        "alpha_low_frequency": Knob("float", 1.1, 0.0, 10.0),
        "alpha_high_frequency": Knob("float", 1.1, 0.0, 10.0),
    },
    "pab": {
        "spatial_attention_block_skip_range": Knob("int", 2, 1, 100),
        "spatial_attention_timestep_skip_range": _TS_RANGE,
    },
    "seacache": {
        "threshold": Knob("float", 0.25, 0.0, 10.0),
        "residual_order": Knob("int", 1, 0, 1),
        "retention_steps": Knob("int", 1, 0, 1000),
        "cache_end_steps": Knob("int", 1, 0, 1000),
        "max_consecutive_cached": Knob("int", 2, 0, 1000),
        "power_exp": Knob("float", 3.0, 0.01, 100.0),
    },
}
HOOK_BACKENDS = ("fbcache", "magcache", "taylorseer", "fastercache", "pab", "seacache")  # diffusers' cache hooks
METHOD_NAMES = {
    "cache-dit": "DBCache",
    "dbprune": "DBPrune",
    "fbcache": "First-Block-Cache",
    "magcache": "MagCache",
    "taylorseer": "TaylorSeer (diffusers)",
    "fastercache": "FasterCache",
    "pab": "Pyramid Attention Broadcast",
    "seacache": "SeaCache",
}


def _check_knob(owner: str, name: str, knob: Knob, value) -> object:
    """The checked value (lists as tuples); raises ConfigError naming the field, the value and the fix."""
    if value is None and knob.optional:
        return None
    if knob.kind == "int":
        check_int(owner, name, value, knob.low, knob.high)
    elif knob.kind == "float":
        check_float(owner, name, value, knob.low, knob.high)
        return float(value)
    elif knob.kind == "bool":
        check_bool(owner, name, value)
    elif knob.kind == "text":
        if not isinstance(value, str) or not value.strip():
            fail(owner, name, value, "must be text (written by `python -m studio calibrate`)")
    elif knob.kind == "range":
        ok = isinstance(value, (list, tuple)) and len(value) == 2
        ok = ok and all(isinstance(v, int) and not isinstance(v, bool) for v in value) and value[0] < value[1]
        if not ok or value[0] < knob.low or value[1] > knob.high:
            within = f"within [{knob.low}, {knob.high}]"
            fail(owner, name, value, f"must be two timesteps [low, high], low < high, {within}")
        return tuple(value)
    elif knob.kind in ("floats", "ints"):
        num = (int,) if knob.kind == "ints" else (int, float)
        ok = isinstance(value, (list, tuple)) and (len(value) > 0 or knob.kind == "ints")
        ok = ok and all(isinstance(v, num) and not isinstance(v, bool) for v in value)
        if not ok or any(not knob.low <= v <= knob.high for v in value):
            what = "integers" if knob.kind == "ints" else "numbers"
            fail(owner, name, value, f"must be a list of {what} from {knob.low:g} to {knob.high:g}")
        return tuple(float(v) if knob.kind == "floats" else v for v in value)
    return value


def check_options(backend: str, options) -> tuple:
    """`cache_config.options` for `backend`, checked: a sorted tuple of (knob, value) pairs (hashable), or ()."""
    owner = "cache_config.options"
    if options is None or options == () or options == {}:
        return ()
    if isinstance(options, tuple):  # already checked (a replace() of a spec)
        options = dict(options)
    if not isinstance(options, dict):
        fail("cache_config", "options", options, "must be a mapping of the method's knobs")
    knobs = METHOD_KNOBS.get(backend)
    if not knobs:
        fail("cache_config", "options", dict(options), f"backend {backend} takes no options: drop the section")
    out = []
    for name in sorted(options, key=str):
        if name not in knobs:
            fail(owner, str(name), options[name], f"{backend} knows {sorted(knobs)}")
        out.append((name, _check_knob(owner, name, knobs[name], options[name])))
    return tuple(out)


def knobs_of(backend: str, options: tuple) -> dict:
    """Every knob of `backend` with its value: the preset's where set, the library's default elsewhere."""
    given = dict(options)
    return {k: given.get(k, knob.default) for k, knob in METHOD_KNOBS.get(backend, {}).items()}


def options_label(backend: str, options: tuple) -> str:
    """The method's tag, in the style of cache-dit's DBCache_F1B0... (the one place it is written)."""
    k = knobs_of(backend, options)
    if backend == "magcache":
        return f"MagCache_R{k['threshold']:g}K{k['max_skip_steps']}Ret{k['retention_ratio']:g}"
    if backend == "taylorseer":
        after = "" if k["disable_cache_after_step"] is None else f"A{k['disable_cache_after_step']}"
        lite = "_lite" if k["use_lite_mode"] else ""
        return f"TaylorSeer_I{k['cache_interval']}W{k['disable_cache_before_step']}{after}O{k['max_order']}{lite}"
    if backend == "fastercache":
        lo, hi = k["spatial_attention_timestep_skip_range"]
        return (
            f"FasterCache_S{k['spatial_attention_block_skip_range']}T{lo}-{hi}U{k['unconditional_batch_skip_range']}"
        )
    if backend == "pab":
        lo, hi = k["spatial_attention_timestep_skip_range"]
        return f"PAB_S{k['spatial_attention_block_skip_range']}T{lo}-{hi}"
    if backend == "seacache":
        return f"SeaCache_R{k['threshold']:g}O{k['residual_order']}MC{k['max_consecutive_cached']}"
    raise ValueError(f"no options label for backend {backend}")


def transformer_fingerprint(class_name: str, config: dict) -> str:
    """What a calibration is for: the transformer's class and its config (MagCache's ratios belong to one model),
    e.g. FluxTransformer2DModel-1a2b3c4d."""
    plain = {k: v for k, v in config.items() if not str(k).startswith("_")}
    digest = hashlib.sha256(json.dumps(plain, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return f"{class_name}-{digest}"
