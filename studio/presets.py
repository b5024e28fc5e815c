"""Preset files: YAML close to cache-dit's own config format, loaded into validated `Preset` records.

description: ...
dtype: bfloat16
quantize_config: {quant_type: int8_weight_only, exclude_layers: [embedder, ...]}
cache_config: {backend: cache-dit, Fn_compute_blocks: 1, Bn_compute_blocks: 0, max_warmup_steps: 4,
               residual_diff_threshold: 0.24, max_continuous_cached_steps: 3, enable_taylorseer: false, ...}
attention_backend: sdpa
compile: {enabled: false, fullgraph: auto}
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from studio.config import AttentionSpec, CacheSpec, CompileSpec, ConfigError, Preset, QuantSpec

BUILTIN_DIR = Path(__file__).resolve().parent.parent / "presets"
USER_DIR_ENV = "STUDIO_PRESETS_DIR"

# YAML key -> dataclass field, per section. cache-dit spells most of them; the studio adds backend/calibrator.
_CACHE_KEYS = {
    "backend": "backend",
    "Fn_compute_blocks": "Fn",
    "Bn_compute_blocks": "Bn",
    "max_warmup_steps": "warmup",
    "residual_diff_threshold": "threshold",
    "max_continuous_cached_steps": "max_continuous_cached_steps",
    "max_cached_steps": "max_cached_steps",
    "taylorseer_order": "taylorseer_order",
    "dmd_history": "dmd_history",
    "dmd_rank": "dmd_rank",
    "steps_computation_mask": "mask_policy",
    "compute_bins": "compute_bins",
    "cache_bins": "cache_bins",
    "steps_computation_policy": "mask_type",
}
_CACHE_FLAGS = ("enable_taylorseer", "enable_dmd")
_QUANT_KEYS = {"quant_type": "mode", "exclude_layers": "exclude"}
_COMPILE_KEYS = {
    "enabled": "enabled",
    "mode": "mode",
    "fullgraph": "fullgraph",
    "regional": "regional",
    "dynamic": "dynamic",
}
_TOP_KEYS = ("name", "description", "dtype", "quantize_config", "cache_config", "attention_backend", "compile")


def _section(src: str, data: dict, key: str, allowed: dict | tuple) -> dict:
    sec = data.get(key) or {}
    if not isinstance(sec, dict):
        raise ConfigError(f"{src}: {key} must be a mapping, got {sec!r}")
    unknown = set(sec) - set(allowed)
    if unknown:
        raise ConfigError(f"{src}: unknown key {key}.{sorted(unknown)[0]}; allowed keys: {sorted(allowed)}")
    return sec


def preset_from_dict(data: dict, name: str | None = None, source: str = "<dict>") -> Preset:
    """Build a Preset from a parsed YAML mapping; errors carry `source`, the key, the value and the fix."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a preset must be a YAML mapping, got {type(data).__name__}")
    unknown = set(data) - set(_TOP_KEYS)
    if unknown:
        raise ConfigError(f"{source}: unknown key {sorted(unknown)[0]!r}; allowed keys: {list(_TOP_KEYS)}")
    try:
        q = _section(source, data, "quantize_config", _QUANT_KEYS)
        c = _section(source, data, "cache_config", tuple(_CACHE_KEYS) + _CACHE_FLAGS)
        k = _section(source, data, "compile", _COMPILE_KEYS)
        for flag in _CACHE_FLAGS:
            if flag in c and not isinstance(c[flag], bool):
                raise ConfigError(f"cache_config.{flag}={c[flag]!r} is not valid: must be true or false")
        if c.get("enable_taylorseer") and c.get("enable_dmd"):
            raise ConfigError(
                "cache_config.enable_taylorseer=true and cache_config.enable_dmd=true is not valid: "
                "TaylorSeer and DMD are alternative calibrators, enable at most one"
            )
        cache_kw = {_CACHE_KEYS[key]: v for key, v in c.items() if key in _CACHE_KEYS}
        if cache_kw.get("mask_policy") is None and "mask_policy" in cache_kw:
            cache_kw["mask_policy"] = "none"
        cache_kw["calibrator"] = (
            "taylorseer" if c.get("enable_taylorseer") else "dmd" if c.get("enable_dmd") else "none"
        )
        if c and "backend" not in c:
            cache_kw["backend"] = "cache-dit"  # a cache_config section alone means cache-dit, as in cache-dit itself
        compile_kw = {_COMPILE_KEYS[key]: v for key, v in k.items()}
        if compile_kw.get("fullgraph") == "auto":
            compile_kw["fullgraph"] = None
        for key in ("compute_bins", "cache_bins"):
            if isinstance(cache_kw.get(key), list):
                cache_kw[key] = tuple(cache_kw[key])
        if isinstance(q.get("exclude_layers"), list):
            q = dict(q, exclude_layers=tuple(q["exclude_layers"]))
        attn = data.get("attention_backend", "sdpa")
        return Preset(
            name=str(name or data.get("name") or ""),
            description=str(data.get("description") or ""),
            dtype=data.get("dtype", "bfloat16"),
            quant=QuantSpec(**{_QUANT_KEYS[key]: v for key, v in q.items()}),
            cache=CacheSpec(**cache_kw),
            attention=AttentionSpec(backend=attn),
            compile=CompileSpec(**compile_kw),
        )
    except ConfigError as e:
        if str(e).startswith(source):
            raise
        raise ConfigError(f"{source}: {e}") from None
    except TypeError as e:  # a wrong type slipped past the mapping (e.g. a list where a number belongs)
        raise ConfigError(f"{source}: {e}") from None


def preset_to_dict(p: Preset) -> dict:
    """The YAML mapping for a preset (inverse of preset_from_dict)."""
    out: dict = {"description": p.description, "dtype": p.dtype}
    if p.quant.enabled:
        out["quantize_config"] = {"quant_type": p.quant.mode, "exclude_layers": list(p.quant.exclude)}
    if p.cache.enabled:
        inv = {v: k for k, v in _CACHE_KEYS.items()}
        c = p.cache.as_dict()
        cal = c.pop("calibrator")
        sec = {inv[f]: (list(v) if isinstance(v, tuple) else v) for f, v in c.items() if v is not None}
        sec["enable_taylorseer"] = cal == "taylorseer"
        sec["enable_dmd"] = cal == "dmd"
        out["cache_config"] = sec
    out["attention_backend"] = p.attention.backend
    if p.compile.enabled:
        d = p.compile.as_dict()
        d["fullgraph"] = "auto" if d["fullgraph"] is None else d["fullgraph"]
        out["compile"] = d
    return out


def preset_to_yaml(p: Preset) -> str:
    return yaml.safe_dump(preset_to_dict(p), sort_keys=False)


def load_preset(path_or_dict: str | os.PathLike | dict, name: str | None = None) -> Preset:
    """Load a preset from a YAML file path or an already-parsed dict."""
    if isinstance(path_or_dict, dict):
        return preset_from_dict(path_or_dict, name=name, source=f"preset {name or path_or_dict.get('name', '')!r}")
    path = Path(path_or_dict)
    if not path.is_file():
        raise ConfigError(f"{path}: no such preset file")
    return preset_from_text(path.read_text(), name or path.stem, source=str(path))


def preset_from_text(text: str, name: str, source: str | None = None) -> Preset:
    source = source or f"preset {name!r}"
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: not valid YAML ({e})") from None
    return preset_from_dict(data if data is not None else {}, name=name, source=source)


class PresetLibrary:
    """The built-in presets plus a user folder (STUDIO_PRESETS_DIR); a user file shadows nothing built in."""

    def __init__(self, builtin_dir: Path = BUILTIN_DIR, user_dir: Path | str | None = None):
        self.builtin_dir = Path(builtin_dir)
        env = os.environ.get(USER_DIR_ENV)
        self.user_dir = Path(user_dir) if user_dir else Path(env) if env else None

    def _files(self) -> dict[str, Path]:
        found: dict[str, Path] = {}
        for d in (self.user_dir, self.builtin_dir):  # built-ins last so they win a name clash
            if d is not None and d.is_dir():
                for f in sorted(d.glob("*.yaml")) + sorted(d.glob("*.yml")):
                    found[f.stem] = f
        return found

    def names(self) -> list[str]:
        builtin_order = ["base", "sage", "int8", "sage-int8", "cache", "cache-int8", "cache-int8-sage"]
        names = list(self._files())
        return [n for n in builtin_order if n in names] + sorted(n for n in names if n not in builtin_order)

    def get(self, name: str) -> Preset:
        files = self._files()
        if name not in files:
            raise ConfigError(f"preset {name!r} not found; available: {self.names()}")
        return load_preset(files[name])

    def text(self, name: str) -> str:
        files = self._files()
        if name not in files:
            raise ConfigError(f"preset {name!r} not found; available: {self.names()}")
        return files[name].read_text()

    def is_builtin(self, name: str) -> bool:
        return (self.builtin_dir / f"{name}.yaml").is_file()

    def add(self, name: str, text: str) -> Preset:
        """Validate a user's preset text and save it under `name` in the user folder."""
        if self.user_dir is None:
            raise ConfigError(f"no user preset folder: set {USER_DIR_ENV}")
        preset = preset_from_text(text, name)
        if self.is_builtin(name):
            raise ConfigError(f"preset name {name!r} is built in; choose another name")
        self.user_dir.mkdir(parents=True, exist_ok=True)
        (self.user_dir / f"{name}.yaml").write_text(text)
        return preset
