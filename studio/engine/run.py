"""One measured run of one stack: the pipeline with the stack applied, its warm-up (untimed, once per shape per
process: a compile happens there), one timed call, its counts."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace

import numpy as np

from studio.engine.aot import AotVariant
from studio.engine.cache import CacheReport, prepare_run, read_report, step_counts
from studio.engine.call import call_pipe, dropped_tokens, pipe_kwargs, strip, true_cfg
from studio.engine.compile import after_loras, finish_first_run, first_run_or_eager
from studio.engine.device import DtypeChoice
from studio.engine.loader import ModelManager
from studio.engine.lora import apply_loras, check_loras
from studio.engine.parallel import run_remote
from studio.engine.stack import AppliedStack
from studio.engine.state import stack_state
from studio.engine.streams import stream_begin, stream_report
from studio.measure.blocks import BlockClock
from studio.measure.estimate import Run, full_steps
from studio.measure.memory import MemoryProbe, PeakMemory
from studio.measure.timing import StepCounts, StepProbe, block_count, count_steps
from studio.spec.errors import OverTime
from studio.spec.hosting import aot_dir, aot_marker_key, mark_aot_built
from studio.spec.preset import Preset
from studio.spec.profiles import resolve_model
from studio.spec.request import GenerationRequest


@dataclass(frozen=True)
class Deadline:
    """When a request must have ended: checked before each run and after each step, so a request over it stops
    between two steps and says where."""

    limit_s: float
    ends: float  # time.monotonic()

    @classmethod
    def after(cls, seconds: float | None) -> "Deadline | None":
        return None if not seconds else cls(float(seconds), time.monotonic() + float(seconds))

    def check(self, where: str) -> None:
        if time.monotonic() > self.ends:
            raise OverTime(
                f"this request ran past this studio's limit of {self.limit_s:g} s per request and was stopped "
                f"{where}; fewer steps, a smaller size or fewer presets fit in it (the loaded model, its stack and "
                "the kept base images are as they were)"
            )


@dataclass(frozen=True)
class RunContext:
    """What every run of one request shares."""

    manager: ModelManager
    request: GenerationRequest
    model: str
    dtype: DtypeChoice
    progress: object | None = None  # callable(step_index, total_steps, StepRecord) after each step of the stack
    on_status: object | None = None  # callable(str) for slow phases (loading, warm-up, compiling, the base run)
    deadline: Deadline | None = None  # the request's time limit (Runner.time_limit), checked between steps
    asked_steps: int | None = None  # the request's steps where a preset's step_share runs fewer (for_preset)

    def for_preset(self, preset: Preset) -> RunContext:
        """The context `preset` runs in: its share of the request's steps (Preset.step_share); base, compared with
        it, keeps the request's own."""
        k = preset.steps_of(self.request.steps)
        if self.asked_steps is not None or k == self.request.steps:
            return self
        return replace(self, request=replace(self.request, steps=k), asked_steps=self.request.steps)

    @property
    def key(self) -> tuple:
        """The request's base key: the same key, the same base picture."""
        return self.request.key(resolve_model(self.model), self.dtype.name)

    @property
    def timing_key(self) -> tuple:
        """The request's shape, as a timing key: what a DiT's denoise time depends on, not the prompt, the seed or
        the input picture."""
        r, cur = self.request, self.manager.current
        cfg = true_cfg(cur.pipe, r) if cur is not None else r.true_cfg_scale
        return (
            resolve_model(self.model),
            self.dtype.name,
            r.width,
            r.height,
            r.steps,
            r.max_sequence_length,
            r.guidance,
            cfg,
            r.num_images_per_prompt,
            r.task,
            r.executed_steps,
        )

    def status(self, message: str) -> None:
        if self.on_status:
            self.on_status(message)

    def check(self, where: str) -> None:
        if self.deadline is not None:
            self.deadline.check(where)

    def stepper(self, run: str, then=None):
        """A step callback that checks the deadline, then calls `then` (the progress)."""

        def on_step(step_index, total, record=None):
            self.check(f"after step {step_index + 1} of {total} of {run}")
            if then is not None:
                then(step_index, total, record)

        return on_step if self.deadline is not None else then

    def untimed(self, preset: Preset):
        """callback_on_step_end for an untimed run (a warm-up): the deadline's check alone, or None."""
        if self.deadline is None:
            return None
        check = self.stepper(f"the untimed run of {preset.name}")

        def callback(pipe, step_index, timestep, callback_kwargs):
            check(step_index, self.request.executed_steps)
            return callback_kwargs

        return callback


@dataclass(frozen=True)
class Measured:
    """One timed run of one stack (after its warm-up, when one was needed)."""

    image: np.ndarray
    denoise_s: float
    step_ms: list[float]
    counts: StepCounts
    report: CacheReport
    stack: AppliedStack
    reloaded: bool  # weights were (re)loaded for this call
    warmup_s: float | None  # the untimed warm-up run, when this call made one
    compiled: bool
    ended: float  # time.monotonic() at the end of the timed run
    calls: int = 0  # transformer calls in the timed run
    dropped: tuple[int, int] | None = None  # (prompt tokens, tokens the model reads) when the prompt was cut
    blocks: int = 0  # transformer blocks one full call runs
    lost: tuple[str, ...] = ()  # what could not be read about this run, in words (shown as fallbacks)
    block_ms: tuple | None = None  # each block's median time (studio.measure.blocks), where the blocks run eagerly
    memory: PeakMemory | None = None  # the denoise loop's peak memory (None: it ran on the parallel workers)
    quant: str = "none"  # the quantized form that ran (a preset's `auto` resolved)
    h2d: dict | None = None  # bytes copied host-to-device per full / cached step (engine.streams), None: resident

    @property
    def timed(self) -> Run:
        """The run as the estimator reads it (studio.measure.estimate)."""
        return Run.of(self.step_ms, self.counts.cached_indices, self.report.pruned_blocks)

    @property
    def full_ms(self) -> float | None:
        """Its median full step (None: every step cached): what its block times are priced against."""
        full = full_steps(self.timed).step_ms
        return float(statistics.median(full)) if full else None

    @property
    def calls_per_step(self) -> int:
        return max(1, round(self.calls / max(1, len(self.step_ms))))


def pipeline_for(ctx: RunContext, preset: Preset):
    """(pipe, stack, reloaded): the model's pipeline with `preset` and the request's LoRAs applied; a parallel stack's
    pipe is the proxy whose calls go to the workers."""
    ctx = ctx.for_preset(preset)
    check_loras(ctx.request, preset)
    cur = ctx.manager.ensure(ctx.model, ctx.manager.resolve_dtype(preset.dtype), ctx.on_status)
    separate = true_cfg(cur.pipe, ctx.request)
    pipe, stack, reloaded = ctx.manager.pipeline(
        ctx.model,
        preset,
        steps=ctx.request.executed_steps,
        on_status=ctx.on_status,
        separate_cfg=separate,
        task=ctx.request.task,
        size=(ctx.request.width, ctx.request.height),
    )
    if stack.workers is not None:
        ctx.status("running on the parallel workers")
        return stack.workers.proxy, stack, reloaded
    apply_loras(
        pipe, ctx.request, ctx.manager.settings.lora_rank
    )  # last, on the weights of this run: loaded once, switched by set_adapters
    after_loras(pipe.transformer, stack)  # an ahead-of-time compiled stack runs eagerly under a LoRA
    return pipe, stack, reloaded


def _prepare(pipe, preset: Preset, request: GenerationRequest) -> None:
    quant = stack_state(pipe.transformer).quantize.mode
    prepare_run(
        pipe, preset.cache_config, quant=quant, steps=request.executed_steps, separate_cfg=true_cfg(pipe, request)
    )


def warm(ctx: RunContext, pipe, stack: AppliedStack, preset: Preset) -> float | None:
    """The untimed warm-up run of this stack at this shape, once per process; its seconds, or None if warm."""
    ctx = ctx.for_preset(preset)
    state = stack_state(pipe.transformer)
    key = (stack.signature, ctx.request.graph_shape, state.lora.modules)  # new LoRA layers: warm again
    if key in state.warm and not (state.compile.running is not None and state.compile.running.pending()):
        return None
    ctx.check(f"before the warm-up of {preset.name}")
    ctx.status("compiling (warm-up run)" if state.compile.running else "warm-up run (not timed)")
    _prepare(pipe, preset, ctx.request)

    def timed() -> float:
        t0 = time.perf_counter()
        call_pipe(pipe, ctx.request, ctx.untimed(preset))
        finish_first_run(pipe.transformer)  # ahead-of-time packages are built from this run's calls
        return time.perf_counter() - t0

    seconds = first_run_or_eager(pipe.transformer, stack, timed)  # compile's failure policy is compile's own
    state.warm.add(key)
    if isinstance(state.compile.running, AotVariant):  # its packages are on disk for later calls (ZeroGPU's reserving)
        folder = aot_dir(ctx.manager.settings.aot_dir)
        mark_aot_built(folder, ctx.model, aot_marker_key(preset), preset.dtype, ctx.request.graph_shape)
    return seconds


def settle(ctx: RunContext, preset: Preset) -> float:
    """One untimed run of a warm stack, its seconds: what other processes do at the start of an event (the app
    handling the click) lands here rather than in the first timed run."""
    ctx = ctx.for_preset(preset)
    pipe, stack, _ = pipeline_for(ctx, preset)
    warm(ctx, pipe, stack, preset)
    ctx.check(f"before the untimed run of {preset.name}")
    _prepare(pipe, preset, ctx.request)
    t0 = time.perf_counter()
    call_pipe(pipe, ctx.request, ctx.untimed(preset))
    return time.perf_counter() - t0


def measure(ctx: RunContext, preset: Preset, *, warm_up: bool = True, show_steps: bool = True) -> Measured:
    """Warm the stack up for this shape where needed (`warm_up` False: a screening run, time not reported), then one
    timed run; `show_steps`: report each step to `ctx.progress` (base runs beside a stack do not)."""
    ctx = ctx.for_preset(preset)
    ctx.check(f"before the run of {preset.name}")
    pipe, stack, reloaded = pipeline_for(ctx, preset)
    state = stack_state(pipe.transformer)
    warmup_s = warm(ctx, pipe, stack, preset) if warm_up else None
    if stack.workers is not None:
        return _measure_parallel(ctx, pipe, stack, preset, reloaded=reloaded, warmup_s=warmup_s)
    _prepare(pipe, preset, ctx.request)
    probe = StepProbe(
        state.counter,
        ctx.manager.device,
        on_step=ctx.stepper(preset.name, ctx.progress if show_steps else None),
        total_steps=ctx.request.executed_steps,
        starts_at_call=bool(state.compile.running and state.compile.running.whole_model),
    )
    # each block's time, where the blocks run eagerly (hooks inside a compiled block would not fire, and would
    # make Dynamo guard on them): what a cached step should cost (studio.measure.blocks)
    clock = (
        BlockClock(ctx.manager.device, counter=state.counter).install(pipe.transformer)
        if state.counter.hooks_see_blocks
        else None
    )
    memory = MemoryProbe(ctx.manager.device)
    stream_begin(pipe.transformer)  # bytes copied onto the device, per call, under a block-streaming regime
    aot = state.compile.running if isinstance(state.compile.running, AotVariant) else None
    eager_before = aot.eager_calls() if aot is not None else 0
    try:
        with memory, probe:
            image = call_pipe(pipe, ctx.request, probe)
    finally:
        if clock is not None:
            clock.remove()
    denoise = probe.denoise_seconds()
    ended = time.monotonic()
    report = read_report(pipe, preset.cache_config, state.quantize.mode)
    counts = step_counts(probe.steps, report)
    calls = sum(s.transformer_calls for s in probe.steps)
    return Measured(
        image=image,
        denoise_s=denoise,
        step_ms=[s * 1e3 for s in probe.step_seconds()],
        counts=counts,
        report=report,
        stack=stack,
        reloaded=reloaded,
        warmup_s=warmup_s,
        compiled=state.compile.running is not None,
        ended=ended,
        calls=calls,
        dropped=dropped_tokens(pipe, ctx.request),
        blocks=block_count(pipe.transformer),
        block_ms=tuple(clock.block_ms()) if clock is not None else None,
        memory=memory.result,
        quant=state.quantize.mode,
        h2d=stream_report(pipe.transformer, max(1, calls // max(1, len(probe.steps))), counts.cached_indices),
        lost=_aot_misses(aot, eager_before),
    )


def _aot_misses(aot, before: int) -> tuple[str, ...]:
    """Block calls of the timed run that found no ahead-of-time package (a shape the warm-up did not see) ran
    eagerly: the card says so."""
    missed = aot.eager_calls() - before if aot is not None else 0
    if not missed:
        return ()
    return (
        f"compile: {missed} block calls of this run had no ahead-of-time package for their shapes and ran eagerly "
        "(built at the next warm-up); its time is not the compiled stack's",
    )


def _measure_parallel(ctx: RunContext, pipe, stack, preset: Preset, *, reloaded, warmup_s) -> Measured:
    """One run on the parallel workers, timed and counted inside them (rank 0's clock and hooks)."""
    out, rec = run_remote(pipe, pipe_kwargs(pipe, ctx.request))
    image = strip(out.images)
    ended = time.monotonic()
    c = preset.cache_config
    backend = "cache-dit" if c.backend == "cache-dit" else "none"
    report = CacheReport(
        backend,
        list(rec["cached_steps"] or []),
        dict(rec.get("residual_diffs") or {}),
        threshold=c.effective_threshold() if c.enabled else None,
        cfg_cached_steps=rec["cfg_cached_steps"],
    )
    lost = ()
    if rec.get("summary_error"):
        lost = (
            f"cache counts: cache-dit's summary could not be read in worker rank 0 ({rec['summary_error']}); "
            "the block hooks' count stands alone",
        )
    listed = None if lost else report.listed()
    return Measured(
        image=image,
        denoise_s=rec["denoise_s"],
        step_ms=[x * 1e3 for x in rec["step_s"]],
        counts=count_steps(rec["steps"], backend, listed),
        report=report,
        stack=stack,
        reloaded=reloaded,
        warmup_s=warmup_s,
        compiled=False,
        ended=ended,
        calls=sum(s.transformer_calls for s in rec["steps"]),
        dropped=dropped_tokens(pipe, ctx.request),
        blocks=block_count(pipe.transformer),
        lost=lost,
    )
