"""ModelManager: the only caller of `from_pretrained`. Owns one pipeline, applies presets, swaps and frees.

Switching presets re-applies only what changed: cache and attention toggle in place; a change of dtype,
quantization or compiled graph reloads the transformer's weights from the model's files (INT8 is never
stacked on INT8, and a quantized transformer never runs under a label that says otherwise).
"""

from __future__ import annotations

import gc
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from studio.config import Preset
from studio.models.profiles import ModelProfile, profile_for
from studio.optimize import AppliedStack, apply_preset, reload_key, remove_cache

log = logging.getLogger(__name__)

EMBEDDED_ALIASES = ("tiny", "embedded", "tiny-flux")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message says which and why, in words a person can act on."""


def embedded_model_dir() -> Path:
    from studio.models.tiny.profile import DEFAULT_DIR

    return DEFAULT_DIR


def resolve_model(model: str | None) -> str:
    """'tiny' (or None) -> the embedded model's folder; anything else is a local folder or a Hub id."""
    if model is None or model in EMBEDDED_ALIASES:
        return str(embedded_model_dir())
    return model


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def supported_dtype(device: torch.device, name: str) -> tuple[torch.dtype, str | None]:
    """The dtype to load in, and a reason when it differs from the one asked for."""
    if device.type == "cuda" and name == "bfloat16" and not torch.cuda.is_bf16_supported():
        return torch.float16, "bfloat16 not supported by this GPU, using float16"
    return DTYPES[name], None


@dataclass
class Loaded:
    model: str  # as the user named it
    source: str  # resolved folder or Hub id
    pipe: object
    profile: ModelProfile
    dtype: str
    reload_key: tuple | None = None
    stack: AppliedStack | None = None


class ModelManager:
    """Holds the current pipeline and the stack applied to it. Thread-safe for one caller at a time."""

    def __init__(self, device: torch.device | str | None = None):
        self.device = torch.device(device) if device is not None else default_device()
        self.current: Loaded | None = None
        self.lock = threading.RLock()
        self.notes: list[str] = []

    # loading ---------------------------------------------------------------------------------------------
    def _from_pretrained(self, source: str, dtype: torch.dtype):
        from diffusers import DiffusionPipeline

        # A Hub id is exactly "org/name"; anything else (or anything that exists on disk) is a folder.
        looks_local = (
            Path(source).expanduser().exists() or source.startswith((".", "/", "~")) or source.count("/") != 1
        )
        if looks_local and not Path(source).expanduser().is_dir():
            raise ModelLoadError(f"model folder {source!r} does not exist")
        try:
            pipe = DiffusionPipeline.from_pretrained(
                str(Path(source).expanduser()) if looks_local else source,
                dtype=dtype,
                use_safetensors=True,
                trust_remote_code=False,
            )
        except ModelLoadError:
            raise
        except Exception as e:
            msg = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
            offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
            hint = ""
            if not looks_local:
                hint = (
                    " (offline: HF_HUB_OFFLINE is set and the model is not in the local cache)"
                    if offline
                    else " (check the Hub id and your network)"
                )
            raise ModelLoadError(f"could not load model {source!r}: {type(e).__name__}: {msg}{hint}") from e
        return pipe.to(self.device)

    def load(self, model: str | None, dtype_name: str = "bfloat16") -> Loaded:
        """Load `model`; on failure the previously loaded model stays loaded and working."""
        with self.lock:
            source = resolve_model(model)
            dtype, note = supported_dtype(self.device, dtype_name)
            if note:
                self.notes.append(note)
            pipe = self._from_pretrained(source, dtype)
            # Only now that the new one loaded, let go of the old one (one pipeline per class: cache-dit
            # patches the class, so the old pipeline's hooks must come off first).
            self.unload()
            self.current = Loaded(model or "tiny", source, pipe, profile_for(source), dtype_name)
            log.info("loaded %s (%s) on %s in %s", model, type(pipe).__name__, self.device, dtype_name)
            return self.current

    def ensure(self, model: str | None, dtype_name: str = "bfloat16", on_status=None) -> Loaded:
        """The loaded `model`, loading it first if another (or none) is loaded."""
        with self.lock:
            if self.current is not None and self.current.source == resolve_model(model):
                return self.current
            if on_status:
                on_status(f"loading model {model or 'tiny'}")
            return self.load(model, dtype_name)

    def unload(self) -> None:
        with self.lock:
            if self.current is None:
                return
            try:
                remove_cache(self.current.pipe)
            except Exception as e:  # never let a failed unhook keep memory alive
                log.warning("removing cache on unload: %s", e)
            self.current = None
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()

    def _reload_transformer(self, cur: Loaded, dtype_name: str) -> None:
        """Fresh transformer weights from the model's files (drops quantization and compiled graphs)."""
        pipe = cur.pipe
        remove_cache(pipe)
        cls = type(pipe.transformer)
        dtype, _ = supported_dtype(self.device, dtype_name)
        old = pipe.transformer
        try:
            new = cls.from_pretrained(cur.source, subfolder="transformer", dtype=dtype, use_safetensors=True)
        except Exception as e:
            raise ModelLoadError(f"could not reload transformer of {cur.source!r}: {e}") from e
        pipe.register_modules(transformer=new.to(self.device))
        del old
        if dtype_name != cur.dtype:  # the other components follow the preset's dtype too
            for name in ("text_encoder", "text_encoder_2", "text_encoder_3", "vae"):
                comp = getattr(pipe, name, None)
                if isinstance(comp, torch.nn.Module):
                    comp.to(dtype=dtype)
            cur.dtype = dtype_name
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    # presets ---------------------------------------------------------------------------------------------
    def pipeline(self, model: str | None, preset: Preset, steps: int | None = None, on_status=None):
        """The pipeline for `model` with `preset` applied, loading/reloading only what must change.

        Returns (pipe, stack, reloaded) where reloaded says whether weights were (re)loaded for this call.
        """
        with self.lock:
            cur = self.ensure(model, preset.dtype, on_status)
            key = reload_key(preset)
            reloaded = cur.reload_key is None  # weights fresh from disk, no preset applied yet
            if cur.reload_key is not None and key != cur.reload_key:
                if on_status:
                    on_status("reloading transformer weights (quantization/compile/dtype changed)")
                self._reload_transformer(cur, preset.dtype)
                cur.stack = None
                reloaded = True
            elif cur.reload_key is None and preset.dtype != cur.dtype:
                self._reload_transformer(cur, preset.dtype)
            cur.stack = apply_preset(cur.pipe, preset, steps=steps, applied=cur.stack)
            cur.reload_key = key
            return cur.pipe, cur.stack, reloaded

    @property
    def profile(self) -> ModelProfile | None:
        return self.current.profile if self.current else None
