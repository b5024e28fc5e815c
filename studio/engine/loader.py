"""ModelManager, the only caller of `from_pretrained`: loads, keeps and frees one pipeline, placed by a decision taken
from its files' sizes before loading (engine.placement). Transformer weights of another dtype or quantization are kept
as bounded variants (STUDIO_TRANSFORMER_SLOTS), so A/B between `base` and an INT8 stack does not reload on every click;
INT8 is never stacked on INT8, nor run under a label that says otherwise."""

from __future__ import annotations

import gc
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from studio.engine.cache import remove_cache
from studio.engine.device import DtypeChoice, default_device, profile_here, resolve_dtype
from studio.engine.lora import fuse_loras
from studio.engine.offload import placed_for
from studio.engine.parallel import remove_parallel
from studio.engine.placement import Free, Plan, decide, describe, device_bytes, free_on, gib, margin_bytes, place
from studio.engine.quantize import preset_form
from studio.engine.sizes import ModelSizes, device_bytes_of, incoming_sizes, read_sizes, sizes_of_pipe
from studio.engine.stack import AppliedStack, apply_preset
from studio.engine.state import stack_state
from studio.engine.tasks import task_pipe
from studio.spec.checks import ConfigError
from studio.spec.devices import DeviceProfile
from studio.spec.errors import ModelLoadError
from studio.spec.offload import OffloadSpec
from studio.spec.preset import Preset, QuantSpec
from studio.spec.profiles import resolve_model
from studio.spec.settings import Settings

log = logging.getLogger(__name__)


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
    placement: dict | None = None  # where each component lives (engine.placement.describe), after the last regime

    @property
    def stack(self) -> AppliedStack | None:
        return self.variants[self.active].stack if self.active in self.variants else None


def load_hint(e: BaseException, offline: bool = False) -> str:
    """Why a Hub model did not load, as the fix: gated (GatedRepoError anywhere in the chain, or diffusers' wrapped
    message), offline, or else the id or the network."""
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
    if offline:
        return " (offline: HF_HUB_OFFLINE is set and the model is not in the local cache)"
    return " (check the Hub id and your network)"


class ModelManager:
    """Holds the current pipeline and the stack applied to it. Thread-safe for one caller at a time."""

    def __init__(
        self,
        device: torch.device | str | None = None,
        allowed: list[str] | None = None,
        settings: Settings | None = None,
        profile: DeviceProfile | None = None,
    ):
        """`allowed`: the only models it may load (the embedded one always; None: any). `settings`: handed down from
        the edge that read them; nothing below reads the environment. `profile`: what every device decision reads
        (None: this machine's); a GPU profile on a CPU simulates that card's placement while computing on `device`."""
        self.settings = settings or Settings()
        self.device = torch.device(device) if device is not None else default_device()
        self.profile = profile or profile_here(self.device, self.settings.zerogpu_slice)
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
            log.warning("from_pretrained(%r) failed", source, exc_info=e)  # the traceback once; the user a sentence
            msg = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
            hint = "" if looks_local else load_hint(e, self.settings.hub_offline)
            raise ModelLoadError(f"could not load model {source!r}: {type(e).__name__}: {msg}{hint}") from e
        return pipe  # on the host: the loader places it (load)

    def resolve_dtype(self, asked: str) -> DtypeChoice:
        return resolve_dtype(asked, self.profile, forced=self.settings.dtype)

    def _plan(
        self, sizes: ModelSizes, spec: OffloadSpec, source: str, dtype: DtypeChoice, releasable: int, size=None
    ) -> Plan:
        """engine.placement.decide for the profile's device, with `releasable` device bytes given back first, the
        activations at the request's `size` (None: the model's default)."""
        device = torch.device(self.profile.kind)
        margin = margin_bytes(sizes, source, dtype.torch.itemsize, device, size)
        return decide(sizes, spec, device, self._room(0, releasable), margin)

    def _room(self, held: int, releasable: int = 0) -> Free:
        """The device memory the studio may fill on its profile, under its budget."""
        return free_on(self.profile, self.device, held, releasable, self.settings.device_memory_gb)

    def _held(self) -> int:
        """Device bytes the loaded model keeps there between uses (its placement; on a CPU budget, logical)."""
        cur = self.current
        return (cur.placement or {}).get("device_bytes", 0) if cur is not None else 0

    def load(self, model: str | None, dtype: DtypeChoice | None = None, offload: OffloadSpec | None = None) -> Loaded:
        """Load `model` for the regime `offload` (None: `auto`), placed before it reaches the device. On failure the
        previous model stays loaded, unless both would not fit: then it went first, and the error says so."""
        with self.lock:
            source = resolve_model(model)
            if self.allowed is not None and source not in self.allowed:
                served = sorted("tiny" if s == resolve_model(None) else s for s in self.allowed)
                raise ModelLoadError(f"model {model!r} is not served here; this studio serves: {', '.join(served)}")
            dtype = dtype or self.resolve_dtype("auto")
            spec, name = offload or OffloadSpec(policy="auto"), f"model {model or 'tiny'!r} in {dtype.name}"
            sizes, unknown = read_sizes(source, dtype.torch)
            plan = self._plan(sizes, spec, source, dtype, self._held()) if sizes is not None else None
            if plan is not None and not plan.fits:
                raise ModelLoadError(plan.refusal(name))  # before loading: the loaded model stays
            # both would not fit: the old one lets go of the device (and of its host copy) before the new one is read
            free_now = self._room(self._held())
            evicted = plan is not None and self.current is not None and free_now.bytes is not None
            evicted = evicted and plan.need > free_now.bytes
            if evicted:
                log.info("unloading %s first: %s needs %s, %s", self.current.model, name, gib(plan.need), free_now)
                self.unload()
            try:
                pipe = self._from_pretrained(source, dtype.torch)
            except ModelLoadError as e:
                if evicted:
                    raise ModelLoadError(f"{e} (the previous model was unloaded first: both would not fit)") from e
                raise
            pipe.set_progress_bar_config(disable=True)  # progress goes to the UI and the CLI's own bar
            if plan is None:  # sizes unknown before loading: decided on the loaded modules, still before placing
                sizes = sizes_of_pipe(pipe)
                plan = self._plan(sizes, spec, source, dtype, self._held())
                if not plan.fits:
                    del pipe
                    self._free()
                    raise ModelLoadError(f"{plan.refusal(name)} (sized after loading into host memory: {unknown})")
            return self._install(model, source, pipe, dtype, plan, sizes, spec)

    def _install(self, model, source, pipe, dtype, plan: Plan, sizes: ModelSizes, spec: OffloadSpec) -> Loaded:
        """The new pipeline in place of the old one, which lets go of the device (and its cache-dit hooks, patched on
        the class) first."""
        self.unload()
        if plan.resident:  # (text encoders by use wait on the host: they come for the prompt, engine.offload)
            place(pipe, "none", self.device, plan.encoders_by_use)
        placed_for(pipe.transformer, self.device)  # a host-loaded model still runs there
        cur = Loaded(model or "tiny", source, pipe, dtype)
        cur.active = (dtype.name, QuantSpec(), ())
        cur.variants[cur.active] = Variant(pipe.transformer)
        where = "none" if plan.resident else "host"
        cur.placement = describe(pipe, where, spec, self.device, sizes, plan, plan.encoders_by_use)
        self.current = cur
        where = "resident" if plan.resident else f"on the host for {plan.policy}"
        log.info("loaded %s (%s) %s, %s, %s: %s", model, type(pipe).__name__, where, self.device, dtype.name, plan.why)
        return cur

    def ensure(
        self, model: str | None, dtype: DtypeChoice | None = None, on_status=None, offload: OffloadSpec | None = None
    ) -> Loaded:
        """The loaded `model`, loading it first if another (or none) is loaded."""
        with self.lock:
            if self.current is not None and self.current.source == resolve_model(model):
                return self.current
            if on_status:
                on_status(f"loading model {model or 'tiny'}")
            return self.load(model, dtype, offload)

    def placement(self) -> dict | None:
        """Where each component of the loaded model lives now (the record's `placement`); None: nothing loaded."""
        return self.current.placement if self.current is not None else None

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
        remove_cache(cur.cache_on or cur.pipe)
        cur.cache_on = None

    def _free(self) -> None:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    @property
    def slots(self) -> int:
        """Weight sets kept at most; on a device with a memory figure, only as many as it holds (_holds_another)."""
        return self.settings.transformer_slots or 2

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

    def _load_transformer(self, cur: Loaded, dtype: DtypeChoice, resident: bool):
        """Another set of transformer weights, on the device only when the coming regime keeps them there."""
        cls = type(cur.pipe.transformer)
        try:
            new = cls.from_pretrained(cur.source, subfolder="transformer", dtype=dtype.torch, use_safetensors=True)
        except Exception as e:
            raise ModelLoadError(f"could not reload transformer of {cur.source!r}: {e}") from e
        placed_for(new, self.device)
        return new.to(self.device) if resident else new

    def _switch_variant(self, cur: Loaded, key: tuple, on_status, resident: bool = True) -> bool:
        """Put the transformer for `key` (dtype, quantization) in the pipeline; True when weights were loaded."""
        if cur.active == key:
            return False
        remove_parallel(cur.pipe)  # the workers belong to the outgoing weights
        self._uncache(cur)  # cache-dit patched the pipeline around the outgoing transformer's blocks
        if cur.active in cur.variants and cur.variants[cur.active].stack is not None:
            cur.variants[cur.active].stack.cache = None  # its cache is off now: re-apply on the way back
        loaded = key not in cur.variants
        if loaded:
            self._load_variant(cur, key, on_status, resident)
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

    def _load_variant(self, cur: Loaded, key: tuple, on_status, resident: bool) -> None:
        """`key`'s weights into a slot. Weights that leave to make room leave the device first: the pipeline, its task
        pipes and compiled wrappers still hold the module, so only moving it frees the card. If the load fails, the
        weights in use come back to where they were and stay active: the model is as it was."""
        if on_status:
            on_status("loading transformer weights for this dtype/quantization")
        gone = []  # (key, variant, the device it left): each off the device as it goes, not at the next collection
        need = self._incoming_need(cur, key)
        while cur.variants and (len(cur.variants) >= self.slots or not self._holds_another(cur, need)):
            k, v = cur.variants.popitem(last=False)
            gone.append((k, v, _park(v.transformer)))
        active, was = next(((v, d) for k, v, d in gone if k == cur.active), (None, None))
        try:
            cur.variants[key] = Variant(self._load_transformer(cur, cur.dtype, resident))
        except Exception as e:  # re-raised, the weights in use put back first (out of memory on a card included)
            had = cur.active is not None
            back = (self._unpark(cur, active, was) if active is not None else True) if had else None
            if isinstance(e, torch.OutOfMemoryError):
                form = key[1].quant_type if key[1].enabled else key[0]
                err = ModelLoadError(
                    f"the transformer weights in {form} did not fit: {(str(e).splitlines() or [''])[0][:200]}"
                )
                self._after_failed_load(cur, err, back)
                raise err from e
            if isinstance(e, ModelLoadError):
                self._after_failed_load(cur, e, back)
            raise

    def _unpark(self, cur: Loaded, active: Variant, was: torch.device | None) -> bool:
        """The weights in use back in their slot and on the device they left (the pipeline still holds them); where
        they cannot go back (the card is full), nothing is active and the next request loads what it needs."""
        try:
            if was is not None:
                active.transformer.to(was)
        except torch.OutOfMemoryError as e:
            log.warning("the weights in use could not go back to %s", was, exc_info=e)
            cur.active = None
            return False
        cur.variants[cur.active] = active
        cur.variants.move_to_end(cur.active, last=False)
        return True

    def _incoming_need(self, cur: Loaded, key: tuple) -> int:
        """The incoming weight set's bytes in its own dtype and form, and its activations; 0 on a device with no memory
        figure (the CPU without a budget: the slots alone bound it, nothing is sized)."""
        if self._room(0).bytes is None:
            return 0
        sizes = incoming_sizes(cur, key)
        margin = margin_bytes(sizes, cur.source, cur.dtype.torch.itemsize, self.device)[0]
        return sizes.components.get("transformer", 0) + margin

    def _holds_another(self, cur: Loaded, need: int) -> bool:
        """Whether the device holds `need` bytes (_incoming_need) beside everything it keeps now (a card that holds
        both keeps base's weights while an 8-bit stack runs: a compared click loads nothing per pair); a device with
        no memory figure (the CPU without a budget) is bound by the slots alone."""
        kept = sum(device_bytes_of(v.transformer, self.device) for v in cur.variants.values())
        on_device = kept + device_bytes(cur.pipe, self.device) - device_bytes_of(cur.pipe.transformer, self.device)
        room = self._room(on_device)
        return room.bytes is None or need <= room.bytes

    def _after_failed_load(self, cur: Loaded, e: ModelLoadError, back: bool | None) -> None:
        """The sentence of a weight set that could not load: the weights in use are as they were (`back`), or could
        not go back to their slot (nothing is active: the next request loads what it needs); None: none were."""
        if back is not None:
            e.args = (
                f"{e.args[0]}; the weights in use are as they were"
                if back
                else f"{e.args[0]}; the weights in use left their slot to make room and could not go back, so the "
                "next request loads the ones it needs again",
            )
        log.warning("transformer weights failed to load (%s)", cur.source, exc_info=e)

    # presets ---------------------------------------------------------------------------------------------
    def pipeline(
        self,
        model: str | None,
        preset: Preset,
        steps: int | None = None,
        on_status=None,
        separate_cfg: bool = False,
        task: str = "text2img",
        size: tuple[int, int] | None = None,
    ):
        """(pipe, stack, reloaded): the pipeline for `model` and `task` with `preset` applied, loading only the weights
        that must change; a step cache moves to the task's pipeline (its call starts the cache's context)."""
        if task != "text2img" and preset.wants_workers:
            raise ConfigError(f"preset {preset.name!r}: parallel workers take text-to-image requests only here")
        with self.lock:
            dtype = self.resolve_dtype(preset.dtype)
            fresh = self.current is None or self.current.source != resolve_model(model)
            cur = self.ensure(model, dtype, on_status, offload=preset.offload_config)
            if cur.dtype.name != dtype.name:
                self._set_dtype(cur, dtype)
                fresh = True
            key = self._weights_key(cur, preset, dtype)
            plan = self._fits(cur, preset, key, size)  # before anything moves: a regime that does not fit is refused
            loaded = self._switch_variant(cur, key, on_status, plan is None or plan.resident)
            variant = cur.variants[cur.active]
            pipe = task_pipe(cur, task)
            if cur.cache_on is not None and cur.cache_on is not pipe:  # the cache is on another task's pipeline
                self._uncache(cur)
                if variant.stack is not None:
                    variant.stack.cache = None  # re-applied on this one below
            stack = apply_preset(
                pipe,
                preset,
                steps=steps,
                separate_cfg=separate_cfg,
                applied=variant.stack,
                source=cur.source,
                settings=self.settings,
                profile=self.profile,
                size=size,
            )
            if stack.workers is None:  # parallel workers leave the main process's own stack as it was
                variant.stack = stack
                cur.cache_on = pipe if stack_state(pipe.transformer).step_cache.backend != "none" else None
                off = stack_state(pipe.transformer).offloading
                sizes = sizes_of_pipe(pipe)
                spec = preset.offload_config
                cur.placement = describe(pipe, off.regime, spec, self.device, sizes, plan, off.encoders_by_use)
            return pipe, stack, fresh or loaded

    def _weights_key(self, cur: Loaded, preset: Preset, dtype: DtypeChoice) -> tuple:
        """The weight set `preset` runs on: (dtype, the 8-bit form that runs, `auto` resolved: engine.quantize, the
        LoRAs fused before quantization: engine.lora)."""
        quant = preset.quantize_config if preset.quantize_config.enabled else QuantSpec()
        if quant.enabled:
            repeated = bool(getattr(cur.pipe.transformer, "_repeated_blocks", None))
            form = preset_form(preset, self.profile, repeated)[0]
            quant = replace(quant, quant_type=form) if form != quant.quant_type else quant
        return (dtype.name, quant, preset.loras if quant.enabled else ())

    def holds_both(self, a: Preset, b: Preset) -> bool:
        """Whether runs alternating `a` and `b` on the loaded model load no weights: one weight set serves both, or
        both are kept, or the device holds the other beside the one in use (_holds_another). False: each switch
        would load the other set again (one slot, or a card that holds one)."""
        cur = self.current
        if cur is None:
            return True
        ka, kb = (self._weights_key(cur, p, self.resolve_dtype(p.dtype)) for p in (a, b))
        if ka == kb or (ka in cur.variants and kb in cur.variants):
            return True
        if self.slots < 2:
            return False
        return self._holds_another(cur, self._incoming_need(cur, kb if ka in cur.variants else ka))

    def _fits(self, cur: Loaded, preset: Preset, key: tuple | None = None, size=None) -> Plan | None:
        """The plan for `preset`'s regime on the loaded model with the weight set `key` in it (sized in its own dtype
        and form: engine.sizes.incoming_sizes), the pipeline's own device bytes given back; ConfigError when it does
        not fit. None for parallel workers (they load the model themselves)."""
        if preset.wants_workers:
            return None
        sizes = incoming_sizes(cur, key)
        releasable = device_bytes(cur.pipe, self.device)
        plan = self._plan(sizes, preset.offload_config, cur.source, cur.dtype, releasable, size)
        if not plan.fits:
            at = f" at {size[0]}x{size[1]}" if size else ""
            raise ConfigError(
                plan.refusal(f"model {cur.model!r} in {cur.dtype.name} under preset {preset.name!r}{at}")
            )
        return plan


def _park(transformer) -> torch.device | None:
    """Move a resident transformer's weights off its accelerator (their host copy stays usable); the device they were
    on, or None where nothing moved: on the host already (a CPU run), or streamed (a regime's hooks place its blocks,
    and moving them back whole would undo it)."""
    kinds = {p.device for p in transformer.parameters()}
    if len(kinds) != 1 or next(iter(kinds)).type == "cpu":
        return None
    was = next(iter(kinds))
    transformer.to("cpu")
    return was
