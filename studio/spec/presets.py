"""Preset files: YAML in cache-dit's own config format (`cache_config: {Fn_compute_blocks: 1, ...}`), loaded into
validated `Preset` records; section keys and error labels are spec/preset.py's dataclass field names."""

from __future__ import annotations

import os
import threading
from dataclasses import fields
from pathlib import Path

import yaml

from studio.spec.checks import ConfigError
from studio.spec.lora import lora_from_yaml
from studio.spec.methods import HOOK_BACKENDS
from studio.spec.offload import OffloadSpec
from studio.spec.preset import CacheSpec, CompileSpec, ParallelSpec, Preset, QuantSpec

BUILTIN_DIR = Path(__file__).resolve().parent.parent.parent / "presets"
METHODS_SUBDIR = "methods"  # presets/methods/: one preset per step-cache method beside DBCache (spec.methods)
USER_DIR_ENV = "STUDIO_PRESETS_DIR"
MAX_PRESET_BYTES = 64 * 1024  # a preset is a few hundred bytes of YAML; anything near this is not one
BASE = "base"  # the reference every stack is compared with
MAX_PARSED = 512  # preset files kept parsed (PresetLibrary.get): a Preset is frozen, so one parse serves every call
_PARSED: dict[tuple, Preset] = {}  # (path, size, mtime_ns) -> its Preset
_PARSED_LOCK = threading.Lock()
BUILTIN_ORDER = (
    BASE,
    "sage",
    "int8",
    "int8-weight-only",
    "sage-int8",
    "cache",
    "cache-int8",
    "cache-int8-sage",
    "compile",
    "cache-compile",
    "cache-int8wo-sage-compile",
    "ulysses2",
    "cache-ulysses2",
)
_SECTIONS = {
    "quantize_config": QuantSpec,
    "offload_config": OffloadSpec,
    "cache_config": CacheSpec,
    "compile": CompileSpec,
    "parallelism_config": ParallelSpec,
}
_TOP_KEYS = tuple(f.name for f in fields(Preset))


def _section(data: dict, key: str, cls) -> object:
    sec = data.get(key) or {}
    if not isinstance(sec, dict):
        raise ConfigError(f"{key} must be a mapping, got {sec!r}")
    allowed = cls.field_names()
    unknown = sorted(set(sec) - set(allowed))
    if unknown:
        name = unknown[0] if str(unknown[0]).isidentifier() else repr(unknown[0])  # a key of "\n" stays on one line
        raise ConfigError(f"unknown key {key}.{name}; allowed keys: {sorted(allowed)}")
    sec = dict(sec)
    if cls is CacheSpec and sec and "backend" not in sec:
        sec["backend"] = "cache-dit"  # a cache_config section alone means cache-dit, as in cache-dit itself
    if cls is CompileSpec and sec.get("fullgraph") == "auto":
        sec["fullgraph"] = None
    return cls(**sec)


def preset_from_dict(data: dict, name: str | None = None, source: str = "<dict>") -> Preset:
    """Build a Preset from a parsed YAML mapping; errors carry `source`, the key, the value and the fix."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a preset must be a YAML mapping, got {type(data).__name__}")
    unknown = sorted(set(data) - set(_TOP_KEYS))
    if unknown:
        raise ConfigError(f"{source}: unknown key {unknown[0]!r}; allowed keys: {list(_TOP_KEYS)}")
    for key in ("name", "description"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise ConfigError(f"{source}: {key} must be text, got {type(data[key]).__name__}")
    try:
        sections = {key: _section(data, key, cls) for key, cls in _SECTIONS.items()}
        loras = data.get("loras")
        loras = [] if loras is None else loras
        if not isinstance(loras, list):
            raise ConfigError(f"loras must be a list of {{path: ..., scale: ...}}, got {loras!r}")
        return Preset(
            name=str(name or data.get("name") or ""),
            description=str(data.get("description") or ""),
            dtype=data.get("dtype", "auto"),
            attention_backend=data.get("attention_backend", "sdpa"),
            loras=tuple(lora_from_yaml(x) for x in loras),
            tuned_for=data.get("tuned_for"),
            step_share=data.get("step_share"),
            **sections,
        )
    except (ConfigError, TypeError) as e:  # TypeError: a wrong type slipped past a check
        raise ConfigError(f"{source}: {e}") from None


def preset_to_dict(p: Preset) -> dict:
    """The YAML mapping for a preset (inverse of preset_from_dict): sections only where they are engaged."""

    def plain(v):
        return list(v) if isinstance(v, tuple) else v

    out: dict = {"description": p.description, "dtype": p.dtype}
    if p.quantize_config.enabled:
        out["quantize_config"] = {k: plain(v) for k, v in p.quantize_config.as_dict().items()}
    if p.offload_config.enabled:
        out["offload_config"] = p.offload_config.as_dict()
    if p.cache_config.enabled:
        out["cache_config"] = _cache_section(p.cache_config, plain)
    out["attention_backend"] = p.attention_backend
    if p.compile.enabled:
        d = p.compile.as_dict()
        d["fullgraph"] = "auto" if d["fullgraph"] is None else d["fullgraph"]
        out["compile"] = d
    if p.parallelism_config.enabled:
        out["parallelism_config"] = {k: v for k, v in p.parallelism_config.as_dict().items() if v is not None}
    if p.loras:
        out["loras"] = [{"path": lo.path, "scale": lo.scale} for lo in p.loras]
    if p.step_share is not None:
        out["step_share"] = p.step_share
    if p.tuned_for:
        out["tuned_for"] = p.tuned_for
    return out


def _cache_section(c: CacheSpec, plain) -> dict:
    d = {k: plain(v) for k, v in c.as_dict().items() if v is not None and k != "options"}
    if c.backend in HOOK_BACKENDS:
        keep = ("backend", "residual_diff_threshold") if c.backend == "fbcache" else ("backend",)
        d = {k: v for k, v in d.items() if k in keep}
    elif c.backend == "dbprune":
        extra = ("enable_", "taylorseer_", "dmd_", "steps_computation_", "compute_bins", "cache_bins")
        d = {k: v for k, v in d.items() if not k.startswith(extra)}
    if c.options:
        d["options"] = {k: plain(v) for k, v in c.options}
    return d


def preset_to_yaml(p: Preset) -> str:
    return yaml.safe_dump(preset_to_dict(p), sort_keys=False)


def preset_from_text(text: str, name: str, source: str | None = None) -> Preset:
    source = source or f"preset {name!r}"
    if len(text.encode("utf-8", "replace")) > MAX_PRESET_BYTES:
        raise ConfigError(f"{source}: {len(text)} characters of YAML, more than a preset's {MAX_PRESET_BYTES} bytes")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: not valid YAML ({e})") from None
    return preset_from_dict(data if data is not None else {}, name=name, source=source)


def load_preset(path_or_dict: str | os.PathLike | dict, name: str | None = None) -> Preset:
    """Load a preset from a YAML file path or an already-parsed dict."""
    if isinstance(path_or_dict, dict):
        return preset_from_dict(path_or_dict, name=name, source=f"preset {name or path_or_dict.get('name', '')!r}")
    path = Path(path_or_dict)
    if not path.is_file():
        raise ConfigError(f"{path}: no such preset file")
    return preset_from_text(path.read_text(), name or path.stem, source=str(path))


class PresetLibrary:
    """The built-in presets plus a user folder (STUDIO_PRESETS_DIR's, from the edges); a built-in wins a name clash."""

    def __init__(self, builtin_dir: Path = BUILTIN_DIR, user_dir: Path | str | None = None):
        self.builtin_dir = Path(builtin_dir)
        self.user_dir = Path(user_dir) if user_dir else None

    def with_user_dir(self, user_dir: Path | str | None) -> "PresetLibrary":
        """The same built-ins over another user folder (each visitor of a public app can have their own); None
        means no user folder at all (not STUDIO_PRESETS_DIR)."""
        lib = PresetLibrary(self.builtin_dir)
        lib.user_dir = Path(user_dir) if user_dir else None
        return lib

    def _files(self) -> dict[str, Path]:
        found: dict[str, Path] = {}
        # built-ins last so they win a name clash
        for d in (self.user_dir, self.builtin_dir / METHODS_SUBDIR, self.builtin_dir):
            if d is not None and d.is_dir():
                for f in sorted(d.glob("*.yaml")) + sorted(d.glob("*.yml")):
                    found[f.stem] = f
        return found

    def names(self) -> list[str]:
        """The shipped stacks in their order, then the step-cache methods, then the user's presets."""
        names = list(self._files())
        methods = self.method_names()
        rest = sorted(n for n in names if n not in BUILTIN_ORDER and n not in methods)
        return [n for n in BUILTIN_ORDER if n in names] + methods + rest

    def method_names(self) -> list[str]:
        """presets/methods/: one preset per step-cache method beside `cache` (DBCache), run together by `methods`."""
        d = self.builtin_dir / METHODS_SUBDIR
        return sorted(f.stem for f in d.glob("*.yaml")) if d.is_dir() else []

    def one_process_names(self) -> list[str]:
        """What a bench, matrix or doctor runs when none are named: not the parallel presets (they start worker
        processes) nor the step-cache methods (run by name or through `methods`)."""
        out = []
        methods = set(self.method_names())  # run by name, or all together by `methods`
        for n in self.names():
            if n in methods:
                continue
            try:
                if self.get(n).parallelism_config.enabled:
                    continue
            except ConfigError:
                pass  # a broken file is listed, and says what is wrong when it is used
            out.append(n)
        return out

    def _file(self, name: str) -> Path:
        files = self._files()
        if name not in files:
            raise ConfigError(f"preset {name!r} not found; available: {self.names()}")
        return files[name]

    def get(self, name: str) -> Preset:
        """The preset of that name, parsed once per change of its file (its path, size and modification time)."""
        path = self._file(name)
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns)
        with _PARSED_LOCK:  # (the app's handlers and the device thread both read presets)
            if key not in _PARSED:
                if len(_PARSED) >= MAX_PARSED:  # a public studio sees many visitors' files: the oldest parse goes
                    _PARSED.pop(next(iter(_PARSED)))
                _PARSED[key] = load_preset(path)
            return _PARSED[key]

    def text(self, name: str) -> str:
        return self._file(name).read_text()

    def is_builtin(self, name: str) -> bool:
        return any((d / f"{name}.yaml").is_file() for d in (self.builtin_dir, self.builtin_dir / METHODS_SUBDIR))

    def add(self, name: str, text: str) -> Preset:
        """Validate a user's preset text and save it under `name` in the user folder."""
        if self.user_dir is None:
            raise ConfigError(f"no user preset folder: set {USER_DIR_ENV}")
        preset = preset_from_text(text, name)
        if self.is_builtin(name):
            raise ConfigError(f"preset name {name!r} is built in; choose another name")
        self.user_dir.mkdir(parents=True, exist_ok=True)
        path = self.user_dir / f"{name}.yaml"
        tmp = path.with_name(f".{name}.yaml.tmp")  # not *.yaml: never listed, even if a crash leaves it
        tmp.write_text(text)
        os.replace(tmp, path)  # atomic: a reader sees the old preset or the new one, never half of it
        return preset
