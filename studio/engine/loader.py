"""ModelManager: the only caller of `from_pretrained`. Loads, keeps and frees one pipeline; the engine's stack
module applies presets to it.

Switching presets re-applies only what changed: cache, attention and compile toggle in place; a different dtype or
quantization needs other transformer weights. Those are kept as variants (bounded: STUDIO_TRANSFORMER_SLOTS, 2 on
the CPU and 1 on a GPU by default), so A/B between `base` and an INT8 stack does not reload weights on every click.
INT8 is never stacked on INT8, and a quantized transformer never runs under a label that says otherwise.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from studio.engine.cache import remove_cache
from studio.engine.compile import compiles
from studio.engine.device import DtypeChoice, default_device, resolve_dtype
from studio.engine.lora import fuse_loras
from studio.engine.parallel import remove_parallel
from studio.engine.quantize import quant_form
from studio.engine.stack import AppliedStack, apply_preset
from studio.engine.state import stack_state
from studio.engine.tasks import task_pipe
from studio.spec.checks import ConfigError
from studio.spec.errors import ModelLoadError
from studio.spec.preset import Preset, QuantSpec
from studio.spec.profiles import resolve_model
from studio.spec.settings import current

log = logging.getLogger(__name__)

SLOTS_ENV = "STUDIO_TRANSFORMER_SLOTS"


@dataclass
class Variant:
    """One set of transformer weights (dtype, quantization) and the stack last applied to it."""

    transformer: object
    stack: AppliedStack | None = None


@dataclass
class Loaded:
    model: str  # as the user named it
    source: str  # resolved folder or Hub id
    pipe: object
    dtype: DtypeChoice  # what the pipeline's components are in
    variants: OrderedDict = field(default_factory=OrderedDict)  # (dtype, QuantSpec) -> Variant, LRU order
    active: tuple | None = None  # the key of the variant in pipe.transformer
    pipes: dict = field(default_factory=dict)  # task -> its pipeline made from `pipe` (engine.tasks)
    cache_on: object | None = None  # the pipeline the step cache was applied to (pipe, or a task's)

    @property
    def stack(self) -> AppliedStack | None:
        return self.variants[self.active].stack if self.active in self.variants else None


def load_hint(e: BaseException) -> str:
    """Why a Hub model did not load, as the fix: a gated model without a token (huggingface_hub's GatedRepoError,
    anywhere in the exception's chain, or diffusers' wrapped message), offline, or else the id or the network."""
    from huggingface_hub.errors import GatedRepoError

    chain, seen = [], e
    while seen is not None and len(chain) < 8:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    if any(isinstance(x, GatedRepoError) or "gated repo" in str(x).lower() for x in chain):
        return (
            " (this model is gated: accept its license on its Hub page, and set HF_TOKEN to a token of that account; "
            "on a Space, in its secrets)"
        )
    if current().hub_offline:
        return " (offline: HF_HUB_OFFLINE is set and the model is not in the local cache)"
    return " (check the Hub id and your network)"


class ModelManager:
    """Holds the current pipeline and the stack applied to it. Thread-safe for one caller at a time."""

    def __init__(self, device: torch.device | str | None = None, allowed: list[str] | None = None):
        """
        Args:
            allowed: the only models this manager may load (names as a user types them; the embedded model is
                always allowed). None: any Hub id or local folder. A public studio passes its operator's list.
        """
        self.device = torch.device(device) if device is not None else default_device()
        self.allowed = None if allowed is None else {resolve_model(m) for m in allowed} | {resolve_model(None)}
        self.current: Loaded | None = None
        self.lock = threading.RLock()

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
        except Exception as e:  # any failure of from_pretrained: one sentence with its likely cause (load_hint)
            msg = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
            hint = "" if looks_local else load_hint(e)
            raise ModelLoadError(f"could not load model {source!r}: {type(e).__name__}: {msg}{hint}") from e
        return pipe.to(self.device)

    def resolve_dtype(self, asked: str) -> DtypeChoice:
        return resolve_dtype(asked, self.device)

    def load(self, model: str | None, dtype: DtypeChoice | None = None) -> Loaded:
        """Load `model`; on failure the previously loaded model stays loaded and working."""
        with self.lock:
            source = resolve_model(model)
            if self.allowed is not None and source not in self.allowed:
                served = sorted("tiny" if s == resolve_model(None) else s for s in self.allowed)
                raise ModelLoadError(f"model {model!r} is not served here; this studio serves: {', '.join(served)}")
            dtype = dtype or self.resolve_dtype("auto")
            pipe = self._from_pretrained(source, dtype.torch)
            pipe.set_progress_bar_config(disable=True)  # progress goes to the UI and the CLI's own bar
            # Only now that the new one loaded, let go of the old one (one pipeline per class: cache-dit
            # patches the class, so the old pipeline's hooks must come off first).
            self.unload()
            cur = Loaded(model or "tiny", source, pipe, dtype)
            cur.active = (dtype.name, QuantSpec(), ())
            cur.variants[cur.active] = Variant(pipe.transformer)
            self.current = cur
            log.info("loaded %s (%s) on %s in %s", model, type(pipe).__name__, self.device, dtype.name)
            return cur

    def ensure(self, model: str | None, dtype: DtypeChoice | None = None, on_status=None) -> Loaded:
        """The loaded `model`, loading it first if another (or none) is loaded."""
        with self.lock:
            if self.current is not None and self.current.source == resolve_model(model):
                return self.current
            if on_status:
                on_status(f"loading model {model or 'tiny'}")
            return self.load(model, dtype)

    def unload(self) -> None:
        with self.lock:
            if self.current is None:
                return
            try:
                remove_parallel(self.current.pipe)  # no worker outlives its model
            except Exception as e:
                log.warning("stopping parallel workers on unload: %s", e)
            try:
                self._uncache(self.current)
            except Exception as e:  # never let a failed unhook keep memory alive
                log.warning("removing cache on unload: %s", e)
            self.current = None
            torch._dynamo.reset()  # compiled graphs of the old pipeline hold its modules: let them go too
            self._free()

    @staticmethod
    def _uncache(cur: Loaded) -> None:
        """Take the step cache off the pipeline it was applied to."""
        remove_cache(cur.cache_on or cur.pipe)
        cur.cache_on = None

    def _free(self) -> None:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    @property
    def slots(self) -> int:
        return current().transformer_slots or (1 if self.device.type == "cuda" else 2)

    def _set_dtype(self, cur: Loaded, dtype: DtypeChoice) -> None:
        """Every component in another dtype: the transformer variants are dropped and reloaded in it."""
        remove_parallel(cur.pipe)
        self._uncache(cur)
        for name in ("text_encoder", "text_encoder_2", "text_encoder_3", "vae"):
            comp = getattr(cur.pipe, name, None)
            if isinstance(comp, torch.nn.Module):
                comp.to(dtype=dtype.torch)
        cur.variants.clear()
        cur.active = None
        cur.dtype = dtype

    def _load_transformer(self, cur: Loaded, dtype: DtypeChoice):
        cls = type(cur.pipe.transformer)
        try:
            new = cls.from_pretrained(cur.source, subfolder="transformer", dtype=dtype.torch, use_safetensors=True)
        except Exception as e:
            raise ModelLoadError(f"could not reload transformer of {cur.source!r}: {e}") from e
        return new.to(self.device)

    def _switch_variant(self, cur: Loaded, key: tuple, on_status) -> bool:
        """Put the transformer for `key` (dtype, quantization) in the pipeline; True when weights were loaded."""
        if cur.active == key:
            return False
        remove_parallel(cur.pipe)  # the workers belong to the outgoing weights
        self._uncache(cur)  # cache-dit patched the pipeline around the outgoing transformer's blocks
        if cur.active in cur.variants and cur.variants[cur.active].stack is not None:
            cur.variants[cur.active].stack.cache = None  # its cache is off now: re-apply on the way back
        loaded = key not in cur.variants
        if loaded:
            if on_status:
                on_status("loading transformer weights for this dtype/quantization")
            while len(cur.variants) >= self.slots:
                cur.variants.popitem(last=False)
            cur.variants[key] = Variant(self._load_transformer(cur, cur.dtype))
        cur.variants.move_to_end(key)
        cur.pipe.register_modules(transformer=cur.variants[key].transformer)
        if loaded and key[2]:
            try:
                fuse_loras(cur.pipe, key[2])  # fresh full-precision weights: LoRAs in, then quantized
            except Exception:  # re-raised: a half-fused variant is never kept, nor left in the pipeline
                cur.variants.pop(key, None)
                back = cur.variants.get(cur.active)
                if back is not None:
                    cur.pipe.register_modules(transformer=back.transformer)
                else:
                    cur.active = None  # the next request loads the weights it needs
                raise
        cur.active = key
        if loaded:
            self._free()
        return loaded

    # presets ---------------------------------------------------------------------------------------------
    def pipeline(
        self,
        model: str | None,
        preset: Preset,
        steps: int | None = None,
        on_status=None,
        separate_cfg: bool = False,
        task: str = "text2img",
    ):
        """The pipeline for `model` and `task` (engine.tasks) with `preset` applied, loading only the weights that
        must change; a step cache is moved to the task's pipeline (its call starts the cache's context).

        Returns (pipe, stack, reloaded) where reloaded says whether weights were (re)loaded for this call.
        """
        if task != "text2img" and preset.wants_workers:
            raise ConfigError(f"preset {preset.name!r}: parallel workers take text-to-image requests only here")
        with self.lock:
            dtype = self.resolve_dtype(preset.dtype)
            fresh = self.current is None or self.current.source != resolve_model(model)
            cur = self.ensure(model, dtype, on_status)
            if cur.dtype.name != dtype.name:
                self._set_dtype(cur, dtype)
                fresh = True
            quant = preset.quantize_config if preset.quantize_config.enabled else QuantSpec()
            if quant.enabled:  # weights are keyed by the form that runs (`auto` resolved, engine.quantize)
                form = quant_form(quant, self.device, compiles(preset.compile, preset.offload_config))[0]
                quant = replace(quant, quant_type=form) if form != quant.quant_type else quant
            fused = preset.loras if quant.enabled else ()  # fused before quantization (engine.lora)
            loaded = self._switch_variant(cur, (dtype.name, quant, fused), on_status)
            variant = cur.variants[cur.active]
            pipe = task_pipe(cur, task)
            if cur.cache_on is not None and cur.cache_on is not pipe:  # the cache is on another task's pipeline
                self._uncache(cur)
                if variant.stack is not None:
                    variant.stack.cache = None  # re-applied on this one below
            stack = apply_preset(
                pipe, preset, steps=steps, separate_cfg=separate_cfg, applied=variant.stack, source=cur.source
            )
            if stack.workers is None:  # parallel workers leave the main process's own stack as it was
                variant.stack = stack
                cur.cache_on = pipe if stack_state(pipe.transformer).cache != "none" else None
            return pipe, stack, fresh or loaded
