"""Runner.generate(request, preset) -> RunResult: one measured generation, compared with the base image.

How a speed-up is measured (the numbers are the product):
- every (stack, shape) runs once untimed the first time it is used in a process (the warm-up; under torch.compile
  that run compiles, and its time is reported apart as compile time);
- the timed run follows; its denoise time runs from the first transformer call to the last scheduler step;
- the speed-up divides the base timing of the same request (same model, dtype, prompt, seed, size, steps) by it.
  That base timing must also be warm and taken close to the run, in the same call: while a base run is cheap
  (denoise under `base_retime_under_s`, 5 s by default) base and the stack are timed alternately `cheap_pairs`
  times (3) and each speaks by its median, since machine load changes within seconds (measured on 2 cores while
  a browser draws the page: single timings moved by 1.7x); for expensive models one base run right before the
  stack's, or a kept base timing younger than `base_max_age_s` (60 s).
"""

from __future__ import annotations

import inspect
import math
import time
from dataclasses import dataclass, replace
from importlib import metadata

import numpy as np
import torch

from studio.engine.bases import BaseEntry, BaseStore
from studio.engine.cache import CacheReport, prepare_run, read_report
from studio.engine.compile import compile_failed, failed_to_compile
from studio.engine.loader import ModelLoadError, ModelManager
from studio.engine.parallel import attached, proxy, remove_parallel, run_remote
from studio.engine.stack import AppliedStack
from studio.engine.state import stack_state
from studio.measure.quality import Verdict, judge
from studio.measure.record import RunMetrics
from studio.measure.timing import StepCounts, StepProbe, block_count, count_steps, ideal_speedup
from studio.spec.checks import ConfigError
from studio.spec.preset import Preset
from studio.spec.presets import PresetLibrary
from studio.spec.profiles import ModelProfile, profile_for, resolve_model
from studio.spec.request import GenerationRequest

BASE = "base"
BASE_MAX_AGE_S = 60.0
BASE_RETIME_UNDER_S = 5.0
CHEAP_PAIRS = 3  # base/stack pairs timed per call while a base run is cheap


def library_versions() -> dict:
    out = {}
    for pkg in ("torch", "diffusers", "cache-dit", "torchao", "transformers"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def call_params(pipe) -> dict:
    """The pipeline call's parameters (the pipeline's own class's, also when parallel workers proxy the call)."""
    cls = getattr(pipe, "_cache_dit_ray_pipeline_original_class", type(pipe))
    return inspect.signature(cls.__call__).parameters


def true_cfg(pipe, request: GenerationRequest) -> bool:
    """Whether this run uses true CFG: two transformer calls per step (conditional, then unconditional)."""
    takes = "true_cfg_scale" in call_params(pipe)
    return takes and request.true_cfg_scale is not None and request.true_cfg_scale > 1


def pipe_kwargs(pipe, request: GenerationRequest, probe=None) -> dict:
    """The pipeline call for `request`, with only the arguments this pipeline takes."""
    params = call_params(pipe)
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
    if true_cfg(pipe, request):
        kw["true_cfg_scale"] = request.true_cfg_scale
        kw["negative_prompt"] = request.negative_prompt or " "
    else:
        if "true_cfg_scale" in params:
            kw["true_cfg_scale"] = 1.0  # said, not left to a pipeline default (Qwen-Image's is 4.0)
        if request.negative_prompt and "negative_prompt" in params:
            kw["negative_prompt"] = request.negative_prompt
    if request.max_sequence_length is not None and "max_sequence_length" in params:
        kw["max_sequence_length"] = request.max_sequence_length
    return kw


def dropped_tokens(pipe, request: GenerationRequest) -> tuple[int, int] | None:
    """(tokens in the prompt, tokens the model reads) when the long-text encoder will cut the prompt, else None."""
    limit = request.max_sequence_length
    # the tokenizer of the long-text encoder: T5 for FLUX (tokenizer_2) and SD3 (tokenizer_3), else the only one
    tok = getattr(pipe, "tokenizer_3", None) or getattr(pipe, "tokenizer_2", None) or getattr(pipe, "tokenizer", None)
    if limit is None or tok is None:
        return None
    try:
        n = len(tok(request.prompt).input_ids)
    except Exception:  # a tokenizer that cannot count this way: say nothing rather than guess
        return None
    return (n, limit) if n > limit else None


def call_pipe(pipe, request: GenerationRequest, probe=None) -> np.ndarray:
    """Run the pipeline once; the image as HxWx3 uint8."""
    return as_uint8(pipe(**pipe_kwargs(pipe, request, probe)).images[0])


def as_uint8(image) -> np.ndarray:
    arr = np.asarray(image)
    if arr.dtype != np.uint8:
        arr = (np.clip(arr, 0, 1) * 255).round().astype(np.uint8)
    return arr


def _median(timed: list):
    """The middle one by denoise time (an odd count gives a real run, whose step times add up to it)."""
    return sorted(timed, key=lambda t: t.denoise_s)[len(timed) // 2]


def _median_run(runs: list["Measured"]) -> "Measured":
    """The median run of a call; a load and the warm-up (or compile) came before its first run: they belong to it."""
    return replace(_median(runs), warmup_s=runs[0].warmup_s, reloaded=runs[0].reloaded)


@dataclass
class Measured:
    """One timed run of one stack (after its warm-up, when one was needed)."""

    image: np.ndarray
    denoise_s: float
    step_ms: list[float]
    counts: StepCounts
    report: CacheReport
    stack: AppliedStack
    reloaded: bool
    warmup_s: float | None  # the untimed warm-up run, when this call made one
    compiled: bool
    ended: float  # time.monotonic() at the end of the timed run
    calls: int = 0  # transformer calls in the timed run
    dropped: tuple[int, int] | None = None  # (prompt tokens, tokens the model reads) when the prompt was cut
    blocks: int = 0  # transformer blocks one full call runs


class RunError(RuntimeError):
    """A run failed inside the pipeline; the message is one sentence a person can read."""


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
        base_max_age_s: float = BASE_MAX_AGE_S,
        base_retime_under_s: float = BASE_RETIME_UNDER_S,
        cheap_pairs: int = CHEAP_PAIRS,
        max_steps: int | None = None,
        max_side: int | None = None,
    ):
        """
        Args:
            max_steps, max_side: an operator's caps on steps and on width/height (a public Space), on top of what
                the model's profile allows.
        """
        self.manager = manager or ModelManager()
        self.presets = presets or PresetLibrary()
        self.model = model or "tiny"
        self.bases = BaseStore(base_cache_size)
        self.base_max_age_s = base_max_age_s
        self.base_retime_under_s = base_retime_under_s
        self.cheap_pairs = cheap_pairs
        self.max_steps, self.max_side = max_steps, max_side

    # requests --------------------------------------------------------------------------------------------
    def resolve_preset(self, preset: str | Preset, library: PresetLibrary | None = None) -> Preset:
        return preset if isinstance(preset, Preset) else (library or self.presets).get(preset)

    def profile(self, model: str | None = None) -> ModelProfile:
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
        """Raise ConfigError with a sentence when the model cannot take this size."""
        prof = self.profile(model)
        if self.max_steps is not None and request.steps > self.max_steps:
            raise ConfigError(f"steps {request.steps} is over this studio's limit of {self.max_steps}")
        for name in ("width", "height"):
            v = getattr(request, name)
            if self.max_side is not None and v > self.max_side:
                raise ConfigError(f"{name} {v} is over this studio's limit of {self.max_side}")
            if v % prof.size_multiple:
                raise ConfigError(f"{name} {v} is not a multiple of {prof.size_multiple}, which {prof.name} needs")
            if not prof.min_size <= v <= prof.max_size:
                raise ConfigError(f"{name} {v} is outside {prof.min_size}..{prof.max_size} for {prof.name}")

    def base_entry(self, request: GenerationRequest, model: str | None = None, dtype: str = "") -> BaseEntry | None:
        dtype = dtype or self.manager.resolve_dtype(self.presets.get(BASE).dtype).name
        return self.bases.get(request.key(resolve_model(model or self.model), dtype))

    # runs ------------------------------------------------------------------------------------------------
    def warm_up(self, request: GenerationRequest, presets: list[str], model: str | None = None) -> list[float]:
        """Load the model and run the untimed warm-up of each preset's stack for this shape (where not done yet);
        the seconds each took (0.0 when it was warm already)."""
        model = model or self.model
        out = []
        with self.manager.lock:
            for name in presets:
                p = self.resolve_preset(name)
                pipe, stack, _ = self._pipeline(model, p, request)
                state = stack_state(pipe.transformer)
                out.append(self._warm(pipe, state, stack, p, request) or 0.0)
        return out

    def _pipeline(self, model: str, preset: Preset, request: GenerationRequest, on_status=None):
        """The model's pipeline with `preset` applied, its cache wired to how this request calls the transformer."""
        cur = self.manager.ensure(model, self.manager.resolve_dtype(preset.dtype), on_status)
        separate = true_cfg(cur.pipe, request)
        pipe, stack, reloaded = self.manager.pipeline(
            model, preset, steps=request.steps, on_status=on_status, separate_cfg=separate
        )
        if stack.is_engaged("parallel"):
            if on_status:
                on_status("running on the parallel workers")
            pipe = proxy(pipe)  # the pipeline object whose calls go to the workers
        return pipe, stack, reloaded

    def _warm(self, pipe, state, stack, preset: Preset, request, on_status=None) -> float | None:
        """The untimed warm-up run of this stack at this shape, once per process; its seconds, or None if warm."""
        warm_key = (stack.signature, request.shape)
        if warm_key in state.warm:
            return None
        if on_status:
            on_status("compiling (warm-up run)" if state.compiled else "warm-up run (not timed)")
        prepare_run(
            pipe, preset.cache_config, quantized=state.quant != "none", steps=request.steps,
            separate_cfg=true_cfg(pipe, request),
        )  # fmt: skip
        t0 = time.perf_counter()
        try:
            call_pipe(pipe, request)
        except Exception as e:
            if state.compiled is None:
                raise
            # torch.compile compiles on the first run: a failure there runs the stack eagerly, with the reason.
            stack.engaged["compile"] = failed_to_compile(compile_failed(pipe.transformer, e))
            stack.signature = stack.signature[:-1] + (None,)
            return self._warm(pipe, state, stack, preset, request, on_status)
        state.warm.add(warm_key)
        return time.perf_counter() - t0

    def measure(
        self, request: GenerationRequest, preset: Preset, model: str, progress=None, on_status=None, warm=True
    ):
        """Warm the stack up for this shape if it is its first run in this process, then one timed run.
        `warm=False` skips the warm-up: for a screening run whose time is not reported (the tuner's)."""
        pipe, stack, reloaded = self._pipeline(model, preset, request, on_status)
        state = stack_state(pipe.transformer)
        quantized = state.quant != "none"
        warmup_s = self._warm(pipe, state, stack, preset, request, on_status) if warm else None
        if attached(pipe):
            return self._measure_parallel(pipe, state, stack, preset, request, reloaded, warmup_s)
        prepare_run(
            pipe, preset.cache_config, quantized=quantized, steps=request.steps, separate_cfg=true_cfg(pipe, request)
        )
        probe = StepProbe(
            state.counter,
            self.manager.device,
            on_step=progress,
            total_steps=request.steps,
            starts_at_call=bool(state.compiled and state.compiled.whole_model),
        )
        with probe:
            image = call_pipe(pipe, request, probe)
        denoise = probe.denoise_seconds()
        ended = time.monotonic()
        report = read_report(pipe, preset.cache_config, quantized)
        counts = count_steps(probe.steps, report.backend, report.listed())
        step_ms = [s * 1e3 for s in probe.step_seconds()]
        compiled = state.compiled is not None
        calls = sum(s.transformer_calls for s in probe.steps)
        return Measured(
            image, denoise, step_ms, counts, report, stack, reloaded, warmup_s, compiled, ended, calls,
            dropped_tokens(pipe, request), block_count(pipe.transformer),
        )  # fmt: skip

    def screen(self, request: GenerationRequest, preset: str | Preset, model: str | None = None) -> RunMetrics:
        """One run of `preset` without a warm-up, for its picture and step counts judged against the base image
        (computed first when there is none). Its time is not a measurement: the tuner ranks by the counts and times
        its finalists with the bench."""
        model = model or self.model
        p = self.resolve_preset(preset)
        dtype = self.manager.resolve_dtype(p.dtype)
        key = request.key(resolve_model(model), dtype.name)
        with self.manager.lock:
            if self.bases.get(key) is None:
                self.generate(request, replace(self.presets.get(BASE), dtype=dtype.name), model=model)
            run = self.measure(request, p, model, warm=False)
            m = self._metrics(model, p, request, dtype, run, self.bases.get(key), 0.0)
        m.timing = "screening run: not warmed up, not a measurement"
        return m

    def _measure_parallel(self, pipe, state, stack, preset: Preset, request, reloaded, warmup_s) -> "Measured":
        """One run on the parallel workers, timed and counted inside them (rank 0's clock and hooks)."""
        out, rec = run_remote(pipe, pipe_kwargs(pipe, request))
        image = as_uint8(out.images[0])
        ended = time.monotonic()
        steps = rec["steps"]
        step_ms = [x * 1e3 for x in rec["step_s"]]
        c = preset.cache_config
        backend = "cache-dit" if c.backend == "cache-dit" else "none"
        report = CacheReport(
            backend, list(rec["cached_steps"] or []), dict(rec.get("residual_diffs") or {}),
            threshold=c.effective_threshold(False) if c.enabled else None,
            cfg_cached_steps=rec["cfg_cached_steps"],
        )  # fmt: skip
        counts = count_steps(steps, backend, report.listed())
        return Measured(
            image, rec["denoise_s"], step_ms, counts, report, stack, reloaded, warmup_s, False, ended,
            sum(s.transformer_calls for s in steps), dropped_tokens(pipe, request), block_count(pipe.transformer),
        )  # fmt: skip

    def _base(self, request, base_p, model, key, on_status, refresh: bool) -> tuple[BaseEntry, bool]:
        """The base entry of this request, timed again (warm, now) unless its timing may be reused (module doc)."""
        entry = self.bases.get(key)
        if entry is not None and (not refresh or self.base_timing_reusable(entry)):
            return entry, False
        if on_status:
            on_status("timing the base image for comparison" if entry else "computing the base image for comparison")
        m = self.measure(request, base_p, model, on_status=on_status)
        return self.bases.put(key, BaseEntry(m.image, m.denoise_s, m.step_ms, m.ended)), True

    def _side_by_side(self, request, base_p, p, model, key, progress, on_status, refresh: bool):
        """Base and the stack timed alternately (B S B S B S) while runs are cheap, each the median of its runs;
        one expensive pair, or a kept base timing, otherwise. Returns (base entry, base timed now, run, pairs)."""
        bases, runs = [], []
        for _ in range(self.cheap_pairs):
            base, now = self._base(request, base_p, model, key, on_status, refresh)
            runs.append(self.measure(request, p, model, progress, on_status))
            if not now:
                return base, False, runs[0], 1
            bases.append(base)
            if base.denoise_s >= self.base_retime_under_s:
                break
            self.bases.put(key, replace(base, timed_at=-math.inf))  # the next pair re-times it
        return self.bases.put(key, _median(bases)), True, _median_run(runs), len(runs)

    def base_timing_reusable(self, entry: BaseEntry, now: float | None = None) -> bool:
        """Whether a kept base timing may divide a new run's: only for expensive runs, and only while recent."""
        return entry.denoise_s >= self.base_retime_under_s and entry.age(now) <= self.base_max_age_s

    def generate(
        self,
        request: GenerationRequest,
        preset: str | Preset = BASE,
        *,
        model: str | None = None,
        cache_enabled: bool | None = None,
        cache_threshold: float | None = None,
        compile_enabled: bool | None = None,
        progress=None,
        on_status=None,
        compare: bool = True,
        refresh_base: bool = True,
        presets: PresetLibrary | None = None,
    ) -> RunResult:
        """One generation with `preset`, measured, and compared with the base image of the same request.

        Args:
            cache_enabled, cache_threshold, compile_enabled: the per-request switches (None follows the preset).
            progress: callable(step_index, total_steps, StepRecord) after each denoising step.
            on_status: callable(str) for slow phases (loading, warm-up, compiling, the base run).
            compare: compute (or reuse) the base image for PSNR/SSIM and speed-up.
            refresh_base: re-time a base older than base_max_age_s (a bench that times base itself turns it off).
            presets: the library to resolve preset names in (a visitor's own presets); the runner's by default.
        """
        t0 = time.perf_counter()
        model = model or self.model
        p = self.resolve_preset(preset, presets).with_overrides(cache_enabled, cache_threshold, compile_enabled)
        dtype = self.manager.resolve_dtype(p.dtype)
        base_p = replace(self.presets.get(BASE), dtype=dtype.name)
        is_base = replace(p, dtype=dtype.name).stack == base_p.stack
        with self.manager.lock:
            self.manager.ensure(model, dtype, on_status)  # a model that cannot load says so before anything else
            self.check_request(request, model)
            try:
                return self._generate(
                    request, p, base_p, is_base, model, dtype, t0, progress, on_status, compare, refresh_base
                )
            except (ConfigError, ModelLoadError):
                raise
            except Exception as e:  # out of memory, a kernel that fails, a broken hook: one sentence, nothing changed
                msg = str(e).splitlines()[0][:200] if str(e) else ""
                if self._parallel_failed(p):
                    raise RunError(
                        f"a parallel worker failed during the run ({type(e).__name__}: {msg}); the workers are "
                        "stopped and the next request starts them again"
                    ) from e
                raise RunError(
                    f"the run failed inside the pipeline ({type(e).__name__}: {msg}); the loaded model, its stack "
                    "and the kept base images are as they were, so the next request runs as before"
                ) from e

    def _parallel_failed(self, p: Preset) -> bool:
        """After a failed run of `p`: whether parallel workers ran it; they are stopped (a dead one killed), so the
        next request starts new ones."""
        cur = self.manager.current
        if cur is None or not p.parallelism_config.enabled or stack_state(cur.pipe.transformer).parallel is None:
            return False
        remove_parallel(cur.pipe)
        return True

    def _generate(self, request, p, base_p, is_base, model, dtype, t0, progress, on_status, compare, refresh_base):
        """generate()'s body, under the manager's lock: the base (when compared), the timed run, the record."""
        key = request.key(resolve_model(model), dtype.name)
        base, base_now, pairs = None, is_base, 1
        if compare and not is_base:
            base, base_now, run, pairs = self._side_by_side(
                request, base_p, p, model, key, progress, on_status, refresh_base
            )
        else:
            run = self.measure(request, p, model, progress, on_status)
            if is_base and compare and refresh_base and run.denoise_s < self.base_retime_under_s:
                # timed like the base beside any other stack (median of cheap_pairs), so an A/B of base against a
                # stack shows the same base time in both rows, within the noise, not one lone run against a median
                runs = [run] + [
                    self.measure(request, p, model, progress, on_status) for _ in range(self.cheap_pairs - 1)
                ]
                run, pairs = _median_run(runs), len(runs)
        if is_base:
            base = self.bases.get(key)
            # A base run is compared with the kept base image too: it must be bitwise equal (inf dB). Only then
            # does it refresh the kept timing; one that differs is news, shown against the kept picture.
            if base is None or np.array_equal(base.image, run.image):
                base = self.bases.put(key, BaseEntry(run.image, run.denoise_s, run.step_ms, run.ended))
        metrics = self._metrics(model, p, request, dtype, run, base, time.perf_counter() - t0)
        if pairs > 1:
            how = f"median of {pairs} timed runs" + ("" if is_base else " interleaved with base")
            metrics.timing = metrics.timing.replace("1 timed run", how)
        if base is not None and not is_base:
            metrics.timing += (
                "; base timed warm right before, in this call"
                if base_now
                else (f"; base timed warm {metrics.base_age_s:.1f} s before (kept)")
            )
        return RunResult(run.image, base.image if base else None, metrics)

    def _metrics(self, model, p: Preset, request, dtype, run: Measured, base: BaseEntry | None, total_s) -> RunMetrics:
        q = judge(run.image, base.image) if base is not None else None
        age = abs(run.ended - base.timed_at) if base is not None else None
        timing = "warm-up run done" + (" in this call" if run.warmup_s is not None else " earlier") + ", 1 timed run"
        info = stack_state(self.manager.current.pipe.transformer).parallel_info if self.manager.current else None
        if info is not None and run.stack.is_engaged("parallel"):
            timing += " (timed inside parallel worker rank 0)"
        else:
            info = None
        lines = run.stack.lines() + ([f"dtype: {dtype.note}"] if dtype.note else [])
        if run.dropped:
            lines.append(f"prompt: {run.dropped[0]} tokens, the model reads {run.dropped[1]}; the rest was dropped")
        counts = run.counts
        if run.stack.is_engaged("cache") and counts.cached == 0 and run.report.threshold is not None:
            lines.append(
                f"cache: engaged, but no step came under R{run.report.threshold:g} on this run "
                "(python -m studio sweep finds the threshold where this model starts caching)"
            )
        ideal = None
        in_workers = run.stack.is_engaged("parallel") and p.cache_config.backend == "cache-dit"
        if run.stack.is_engaged("cache") or in_workers:
            c = p.cache_config
            computed = 1 if c.backend == "fbcache" else c.Fn_compute_blocks + c.Bn_compute_blocks
            ideal = ideal_speedup(counts.full, counts.cached, computed, run.blocks)
        return RunMetrics(
            model=model,
            preset=p.name,
            tag=p.tag(dtype.name),
            device=str(self.manager.device),
            dtype=dtype.name,
            request=request.as_dict(),
            denoise_s=run.denoise_s,
            step_ms=run.step_ms,
            mean_step_ms=(run.denoise_s / max(1, len(run.step_ms))) * 1e3,
            full_steps=counts.full,
            cached_steps=counts.cached,
            transformer_calls=run.calls,
            cached_step_indices=counts.cached_indices,
            count_source=counts.source,
            count_check=counts.check,
            residual_diffs=run.report.residual_diffs,
            cache_threshold=run.report.threshold if run.stack.is_engaged("cache") else None,
            backend_cached_steps=run.report.cached_steps if run.report.backend == "cache-dit" else None,
            backend_cfg_cached_steps=run.report.cfg_cached_steps,
            speedup=(base.denoise_s / run.denoise_s) if base is not None and run.denoise_s > 0 else None,
            base_denoise_s=base.denoise_s if base is not None else None,
            base_age_s=age,
            psnr_db=q.psnr_db if q else None,
            ssim=q.ssim if q else None,
            hf_ratio=q.hf_ratio if q else None,
            quality=q.verdict if q else Verdict.NOT_COMPARED,
            timing=timing,
            compile_s=run.warmup_s if run.compiled else None,
            warmup_s=run.warmup_s,
            engaged=lines,
            fallbacks=run.stack.fallbacks() + ([f"step counts: {counts.check}"] if counts.disagree else []),
            reloaded=run.reloaded,
            total_s=total_s,
            versions=library_versions(),
            blocks=run.blocks,
            ideal_speedup=ideal,
            parallel=info,
        )
