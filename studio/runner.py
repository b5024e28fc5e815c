"""Runner.generate(request, preset) -> RunResult: one measured generation, compared with the base image.

The base image of a request (same model, prompt, seed, size, steps, guidance) is computed once with the
`base` preset and kept (bounded LRU), so every other preset's PSNR/SSIM and speed-up are against it.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from importlib import metadata

import numpy as np
import torch

from studio.config import GenerationRequest, Preset
from studio.metrics import RunMetrics, judge
from studio.models.manager import ModelManager, resolve_model
from studio.models.profiles import ModelProfile
from studio.optimize import prepare_run, quantized_mode, read_report
from studio.presets import PresetLibrary
from studio.timing import StepProbe

log = logging.getLogger(__name__)

BASE = "base"
WARM_MARK = "_studio_warm_shapes"


def library_versions() -> dict:
    out = {}
    for pkg in ("torch", "diffusers", "cache-dit", "torchao", "transformers"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def same_stack(a: Preset, b: Preset) -> bool:
    return (a.dtype, a.quant, a.cache, a.attention, a.compile) == (b.dtype, b.quant, b.cache, b.attention, b.compile)


@dataclass
class BaseEntry:
    image: np.ndarray
    denoise_s: float
    step_ms: list[float]


@dataclass
class RunResult:
    image: np.ndarray  # HxWx3 uint8
    base_image: np.ndarray | None
    metrics: RunMetrics

    def pil(self):
        from PIL import Image

        return Image.fromarray(self.image)


class Runner:
    def __init__(
        self,
        manager: ModelManager | None = None,
        presets: PresetLibrary | None = None,
        model: str | None = None,
        base_cache_size: int = 16,
    ):
        self.manager = manager or ModelManager()
        self.presets = presets or PresetLibrary()
        self.model = model or "tiny"
        self._bases: OrderedDict[tuple, BaseEntry] = OrderedDict()
        self.base_cache_size = base_cache_size

    # helpers ---------------------------------------------------------------------------------------------
    def resolve_preset(self, preset: str | Preset) -> Preset:
        return preset if isinstance(preset, Preset) else self.presets.get(preset)

    def profile(self, model: str | None = None) -> ModelProfile:
        from studio.models.profiles import profile_for

        return profile_for(resolve_model(model or self.model))

    def request(self, prompt: str, model: str | None = None, **overrides) -> GenerationRequest:
        """A request with the model profile's defaults for whatever is not given."""
        prof = self.profile(model)
        kw = dict(
            steps=prof.steps,
            width=prof.width,
            height=prof.height,
            guidance=prof.guidance,
            true_cfg_scale=prof.true_cfg_scale,
            max_sequence_length=prof.max_sequence_length,
        )
        kw.update({k: v for k, v in overrides.items() if v is not None})
        return GenerationRequest(prompt=prompt, **kw)

    def check_request(self, request: GenerationRequest, model: str | None = None) -> None:
        """Raise ValueError with a sentence when the model cannot take this size."""
        prof = self.profile(model)
        for name in ("width", "height"):
            v = getattr(request, name)
            if v % prof.size_multiple:
                raise ValueError(f"{name} {v} is not a multiple of {prof.size_multiple}, which {prof.name} needs")
            if not prof.min_size <= v <= prof.max_size:
                raise ValueError(f"{name} {v} is outside {prof.min_size}..{prof.max_size} for {prof.name}")

    def base_entry(self, request: GenerationRequest, model: str | None = None) -> BaseEntry | None:
        return self._bases.get(request.key(resolve_model(model or self.model)))

    def clear_bases(self) -> None:
        self._bases.clear()

    def _keep_base(self, key: tuple, entry: BaseEntry) -> None:
        self._bases[key] = entry
        self._bases.move_to_end(key)
        while len(self._bases) > self.base_cache_size:
            self._bases.popitem(last=False)

    # the run -------------------------------------------------------------------------------------------------
    def _call(self, pipe, request: GenerationRequest, probe) -> np.ndarray:
        params = inspect.signature(pipe.__call__).parameters
        kw = dict(
            prompt=request.prompt,
            height=request.height,
            width=request.width,
            num_inference_steps=request.steps,
            generator=torch.Generator("cpu").manual_seed(request.seed),
            output_type="np",
        )
        if probe is not None:
            kw["callback_on_step_end"] = probe
        if request.guidance is not None and "guidance_scale" in params:
            kw["guidance_scale"] = request.guidance
        if request.true_cfg_scale is not None and request.true_cfg_scale > 1 and "true_cfg_scale" in params:
            kw["true_cfg_scale"] = request.true_cfg_scale
            kw["negative_prompt"] = request.negative_prompt or " "
        elif request.negative_prompt and "negative_prompt" in params:
            kw["negative_prompt"] = request.negative_prompt
        if request.max_sequence_length is not None and "max_sequence_length" in params:
            kw["max_sequence_length"] = request.max_sequence_length
        arr = np.asarray(pipe(**kw).images[0])
        if arr.dtype != np.uint8:
            arr = (np.clip(arr, 0, 1) * 255).round().astype(np.uint8)
        return arr

    def _run(self, request, preset, model, progress, on_status):
        t0 = time.perf_counter()
        pipe, stack, reloaded = self.manager.pipeline(model, preset, steps=request.steps, on_status=on_status)
        cur = self.manager.current
        quantized = quantized_mode(pipe.transformer) != "none"  # what runs, not what was asked
        compile_s = None
        comp = stack.engaged.get("compile")
        if comp is not None and comp.engaged:
            shapes = getattr(pipe.transformer, WARM_MARK, set())
            if (request.width, request.height) not in shapes:
                if on_status:
                    on_status("compiling (warm-up run)")
                prepare_run(pipe, preset.cache, quantized=quantized, steps=request.steps)
                tw = time.perf_counter()
                self._call(pipe, request, None)
                compile_s = time.perf_counter() - tw
                shapes.add((request.width, request.height))
                setattr(pipe.transformer, WARM_MARK, shapes)
        prepare_run(pipe, preset.cache, quantized=quantized, steps=request.steps)
        probe = StepProbe(pipe.transformer, self.manager.device, on_step=progress, total_steps=request.steps)
        with probe:
            image = self._call(pipe, request, probe)
        report = read_report(pipe, preset.cache, quantized)
        return image, probe, report, stack, reloaded, compile_s, time.perf_counter() - t0, cur

    def generate(
        self,
        request: GenerationRequest,
        preset: str | Preset = BASE,
        *,
        model: str | None = None,
        cache_enabled: bool | None = None,
        cache_threshold: float | None = None,
        progress=None,
        on_status=None,
        compare: bool = True,
    ) -> RunResult:
        """One generation with `preset`, measured, and compared with the base image of the same request.

        Args:
            cache_enabled, cache_threshold: the per-request cache switch (None follows the preset).
            progress: callable(step_index, total_steps, StepRecord) after each denoising step.
            on_status: callable(str) for slow phases (loading, reloading, compiling, the base run).
            compare: compute (or reuse) the base image for PSNR/SSIM and speed-up.
        """
        model = model or self.model
        p = self.resolve_preset(preset).with_cache_override(cache_enabled, cache_threshold)
        self.manager.ensure(model, p.dtype, on_status)  # a model that cannot load says so before anything else
        self.check_request(request, model)
        base_p = self.presets.get(BASE)
        is_base = same_stack(p, base_p)
        key = request.key(resolve_model(model))
        with self.manager.lock:
            if compare and not is_base and key not in self._bases:
                if on_status:
                    on_status("computing the base image for comparison")
                self.generate(request, base_p, model=model, compare=False)
            image, probe, report, stack, reloaded, compile_s, total, cur = self._run(
                request, p, model, progress, on_status
            )
        notes = []
        if probe.starts_at_call:
            notes.append(
                "timing: whole-model compile hides the first transformer call; denoise time includes text encoding"
            )
        cached_idx = probe.cached_indices
        if not probe.reliable and report.backend == "cache-dit":
            cached_idx = report.cached_steps  # block hooks cannot see inside this compiled graph
        step_s = probe.step_seconds()
        denoise = probe.denoise_seconds()
        base = self._bases.get(key) if (compare or is_base) else None
        if is_base:
            if base is None:
                base = BaseEntry(image, denoise, [s * 1e3 for s in step_s])
                self._keep_base(key, base)
            elif np.array_equal(base.image, image):
                # Same picture, newer timing: later speed-ups are against the latest base run (side by side in
                # an A/B with A = base) rather than one measured minutes ago under other load.
                base = BaseEntry(base.image, denoise, [s * 1e3 for s in step_s])
                self._keep_base(key, base)
        engaged_cache = stack.engaged.get("cache")
        # A base re-run is compared with the kept base image too: it must be bitwise equal (inf dB).
        q = judge(image, base.image) if base is not None else None
        metrics = RunMetrics(
            model=model,
            preset=p.name,
            tag=p.tag(),
            device=str(self.manager.device),
            dtype=cur.dtype,
            request=request.as_dict(),
            denoise_s=denoise,
            step_ms=[s * 1e3 for s in step_s],
            mean_step_ms=(denoise / max(1, len(step_s))) * 1e3,
            full_steps=len(probe.steps) - len(cached_idx),
            cached_steps=len(cached_idx),
            cached_step_indices=cached_idx,
            residual_diffs=report.residual_diffs,
            cache_threshold=report.threshold if engaged_cache is not None and engaged_cache.engaged else None,
            backend_cached_steps=report.cached_steps if report.backend == "cache-dit" else None,
            speedup=(base.denoise_s / denoise) if base is not None and denoise > 0 else None,
            base_denoise_s=base.denoise_s if base is not None else None,
            psnr_db=q.psnr_db if q else None,
            ssim=q.ssim if q else None,
            hf_ratio=q.hf_ratio if q else None,
            quality=q.verdict if q else "not compared",
            compile_s=compile_s,
            engaged=stack.lines() + notes,
            fallbacks=stack.fallbacks() + notes,
            reloaded=reloaded,
            total_s=total,
            versions=library_versions(),
        )
        if is_base:
            metrics.speedup = 1.0  # by definition; its own timing is denoise_s
        return RunResult(image, base.image if base is not None else None, metrics)
