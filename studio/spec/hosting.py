"""Where the studio is hosted (no torch: the app's process asks before anything loads)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from studio.spec.methods import METHOD_NAMES

ROOT = str(Path(__file__).resolve().parents[2])  # the folder `studio` is in (the edges put it on PYTHONPATH)


def edge_environ(env: Mapping[str, str]) -> dict[str, str]:
    """What an edge sets in its environment before anything loads, for the processes it starts to inherit: cache-dit's
    log level (it logs every hook to stdout, the CLI's --json, unless told) and this studio's folder on PYTHONPATH."""
    return {
        "CACHE_DIT_LOG_LEVEL": env.get("CACHE_DIT_LOG_LEVEL") or "error",
        "PYTHONPATH": os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p),
    }


M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)
APP_ARENAS = 2  # malloc arenas of the app's process (the soak's figures: docs/deploy.md)
TRIM_EVERY_S = 30.0  # how often the app's process gives glibc's freed heap pages back (the soak: docs/deploy.md)


def _glibc():
    """glibc, loaded through ctypes; None elsewhere (musl, macOS), with why."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError as e:  # no C library to load
        return None, str(e)
    if libc is None or not hasattr(libc, "gnu_get_libc_version"):
        return None, "not glibc"
    return libc, ""


def cap_malloc_arenas(env: Mapping[str, str], arenas: int = APP_ARENAS) -> str:
    """Cap glibc's malloc arenas in this process at `arenas`, before it starts threads; what was done, in words. glibc
    gives threads arenas of their own (up to 8 per core) and keeps what each freed, and the app runs every event on a
    short-lived thread (docs/deploy.md: the soak). An operator's MALLOC_ARENA_MAX is left as it is."""
    if env.get("MALLOC_ARENA_MAX"):
        return f"malloc arenas: MALLOC_ARENA_MAX={env['MALLOC_ARENA_MAX']} (the operator's)"
    libc, why = _glibc()
    if libc is None:
        return f"malloc arenas: not capped ({why})"
    if libc.mallopt(M_ARENA_MAX, arenas) != 1:
        return "malloc arenas: not capped (mallopt refused)"
    return f"malloc arenas: capped at {arenas}"


def trim_malloc() -> bool:
    """malloc_trim(0): glibc's free pages, in every arena, back to the system; whether any were (False: no glibc)."""
    libc, _why = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False


def trim_malloc_every(seconds: float = TRIM_EVERY_S) -> str:
    """Trim glibc's free heap pages every `seconds` on a daemon thread; what was done, in words. Holes freed in the
    middle of an arena stay resident until trimmed, arenas capped or not (docs/deploy.md); a trim takes a few ms."""
    import threading
    import time

    libc, why = _glibc()
    if libc is None:
        return f"malloc trim: not done ({why})"

    def loop():
        while True:
            time.sleep(seconds)
            libc.malloc_trim(0)

    threading.Thread(target=loop, name="malloc-trim", daemon=True).start()
    return f"malloc trim: every {seconds:g} s"


def aot_dir(configured: str | None) -> Path:
    """Where ahead-of-time packages live: `configured` (STUDIO_AOT_DIR), or <tmp>/studio-aot. They outlive the process
    that built them: on ZeroGPU each call's forked process finds what an earlier one built."""
    return Path(configured or Path(tempfile.gettempdir()) / "studio-aot")


HOOK_INSIDE = {  # why each diffusers cache hook cannot sit beside an exported block (engine.aot)
    "fbcache": "its hook replaces the blocks' forward, which a package would skip",
    "magcache": "its hook replaces the blocks' forward, which a package would skip",
    "seacache": "its hook replaces the blocks' forward, which a package would skip",
    "taylorseer": "its hooks sit on the attention and feed-forward inside the blocks, which a package bakes in",
    "pab": "its hooks sit on the attention inside the blocks, which a package bakes in",
    "fastercache": "its hooks sit on the attention inside the blocks, which a package bakes in",
}
NO_LORA = "not with a LoRA (peft's layers and scales are not in the package)"


def aot_refusal(preset, repeated: bool = True) -> str | None:
    """Why `preset` (spec.preset.Preset) cannot run ahead-of-time compiled on ZeroGPU, from the preset alone (words
    after "ahead-of-time compile is"; engine.aot.refusal adds what only loaded weights say); None: it can.
    `repeated`: the model's transformer names repeated blocks."""
    policy = getattr(preset.offload_config, "policy", "none")
    if not preset.compile.regional:
        return "per block: set compile.regional: true"
    if not repeated:
        return "per block, and the model's transformer has no _repeated_blocks"
    if policy not in ("none", "auto"):  # (one `auto` picks is refused at run time, said on the card)
        return f"not under {policy} (the weights move between calls; a package reads them in place)"
    if preset.loras:
        return NO_LORA
    backend = preset.cache_config.backend if preset.cache_config.enabled else "none"
    if backend in HOOK_INSIDE:
        return f"not under {METHOD_NAMES[backend]} ({HOOK_INSIDE[backend]})"
    return None


def ahead_of_time_applies(preset, repeated: bool = True) -> bool:
    """Whether `preset`'s compile runs ahead of time on ZeroGPU (engine.aot)."""
    return preset.compile.enabled and aot_refusal(preset, repeated) is None


def aot_marker_key(preset) -> tuple:
    """What a built marker names of a preset (a spec.preset.Preset): its compile mode and attention backend, and its
    8-bit form where it is quantized (its packages are others than the full-precision ones)."""
    quant = (preset.quantize_config.quant_type,) if preset.quantize_config.enabled else ()
    return ("aot", preset.compile.mode, preset.attention_backend, *quant)


def _built_marker(folder: Path, model: str, variant: tuple, dtype: str, shape: tuple) -> Path:
    what = repr((model, tuple(variant), dtype, tuple(shape))).encode()
    return folder / f"built-{hashlib.sha256(what).hexdigest()[:20]}"


def mark_aot_built(folder: Path, model: str, variant: tuple, dtype: str, shape: tuple) -> None:
    """Every package a stack needs at this graph shape is built (the engine, after a warm-up that built them)."""
    marker = _built_marker(folder, model, variant, dtype, shape)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()


def aot_built(folder: Path, model: str, variant: tuple, dtype: str, shape: tuple) -> bool:
    """Whether a call of this stack at this shape finds its packages (so ZeroGPU reserves no compile for it)."""
    return _built_marker(folder, model, variant, dtype, shape).exists()
