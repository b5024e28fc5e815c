"""Runner, the engine's facade: `generate` is one measured generation compared with its base (how: engine.baseline),
`screen` a quick look at a stack's picture and counts, `warm_up` the untimed first runs."""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace

from studio.engine.baseline import (
    CALLER_TIMES_BASE,
    BaseEntry,
    BaseStore,
    Kept,
    Paired,
    Pairing,
    base_itself,
    by_shape,
    entry_of,
    regime_key,
    same_regime,
    shape_timing,
    side_by_side,
    watched,
)
from studio.engine.call import true_cfg
from studio.engine.describe import labels
from studio.engine.device import cpu_threads
from studio.engine.ideal import ideal_check
from studio.engine.loader import ModelManager
from studio.engine.lora import check_loras
from studio.engine.parallel import remove_parallel, workers
from studio.engine.run import Deadline, Measured, RunContext, measure, pipeline_for, settle, warm
from studio.measure.estimate import margin_db, price_ms, steps_at_speed
from studio.measure.pace import Pace, pace_key, record, work_of
from studio.measure.quality import psnr
from studio.measure.record import RunCache, RunMemory, RunMetrics, RunPlacement, RunResult, RunTiming, Timing
from studio.spec.cachedit import step_mask
from studio.spec.checks import ConfigError
from studio.spec.errors import USER_ERRORS, RunError, is_run_failure
from studio.spec.headroom import CacheRoom, headroom, run_room
from studio.spec.lora import merge_loras
from studio.spec.preset import Preset
from studio.spec.presets import BASE, PresetLibrary
from studio.spec.profiles import ModelProfile, profile_for, resolve_model
from studio.spec.request import GenerationRequest, check_caps, compare_mode

BASE_ITSELF, COMPARED, ALONE = "base itself", "compared", "alone"  # how a generate is timed (Runner._plan)


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Plan:
    """How one generate is timed, decided before anything runs (Runner._plan)."""

    how: str  # BASE_ITSELF, COMPARED (with base beside it or a kept timing of its shape), ALONE (compare off)
    key: tuple  # the request's kept base, in the stack's regime (engine.baseline.regime_key)
    shape: tuple  # its shape's kept timing, in the stack's regime
    base: Preset  # base in the stack's dtype and regime: what it is compared with
    pairing: Pairing  # how base is timed (a base run that is not compared: CALLER_TIMES_BASE, one run)
    compare: str  # on / auto / off, as asked

    @property
    def is_base(self) -> bool:
        return self.how == BASE_ITSELF


class Runner:
    def __init__(
        self,
        manager: ModelManager | None = None,
        presets: PresetLibrary | None = None,
        model: str | None = None,
        *,
        base_cache_size: int = 16,
        base_max_age_s: float = Pairing.max_age_s,
        base_retime_under_s: float = Pairing.retime_under_s,
        cheap_pairs: int = Pairing.cheap_pairs,
        shape_max_age_s: float = Pairing.shape_max_age_s,
        max_steps: int | None = None,
        max_side: int | None = None,
    ):
        """The base_* and pairs arguments: engine.baseline.Pairing; max_steps, max_side: an operator's caps (a public
        Space) on top of the model profile's."""
        self.manager = manager or ModelManager()
        self.presets = presets or PresetLibrary()
        self.model = model or "tiny"
        self.bases = BaseStore(base_cache_size)  # request key -> its base picture and timing
        self.shapes = BaseStore(base_cache_size)  # shape key -> a base timing that agreed (compare auto)
        # (shape, stack) -> (when that base timing was taken, the stack's runs beside it): an auto run's drift
        self.stack_prices = BaseStore(4 * base_cache_size)
        # base pictures made untimed, as references (base at fewer steps): pictures only, never a timing
        self.pictures = BaseStore(4 * base_cache_size)
        self.pairing = Pairing(base_retime_under_s, base_max_age_s, cheap_pairs, shape_max_age_s=shape_max_age_s)
        self.max_steps, self.max_side = max_steps, max_side
        self.deadline: Deadline | None = None  # the running request's time limit (time_limit)

    def kept(self) -> Kept:
        """What this runner keeps between requests: what must outlive a ZeroGPU call."""
        return Kept(self.bases, self.shapes, self.stack_prices)

    def keep(self, kept: Kept) -> None:
        self.bases, self.shapes, self.stack_prices = kept.bases, kept.shapes, kept.stack_prices

    # requests --------------------------------------------------------------------------------------------
    def resolve_preset(self, preset: str | Preset, library: PresetLibrary | None = None) -> Preset:
        return preset if isinstance(preset, Preset) else (library or self.presets).get(preset)

    def profile(self, model: str | None = None) -> ModelProfile:
        return profile_for(resolve_model(model or self.model))

    def request(self, prompt: str, model: str | None = None, **overrides) -> GenerationRequest:
        """A request with the model profile's defaults for whatever is not given."""
        return self.profile(model).request(prompt, **overrides)

    def check_caps(self, request: GenerationRequest) -> None:
        """Raise ConfigError when the request is over the operator's caps (before any load)."""
        check_caps(request, self.max_steps, self.max_side, self.manager.settings.max_prompt_chars)

    def check_request(self, request: GenerationRequest, model: str | None = None) -> None:
        """Raise ConfigError when the model cannot take this size (the caps are checked before the load)."""
        prof = self.profile(model)
        for name in ("width", "height"):
            v = getattr(request, name)
            if v % prof.size_multiple:
                raise ConfigError(f"{name} {v} is not a multiple of {prof.size_multiple}, which {prof.name} needs")
            if not prof.min_size <= v <= prof.max_size:
                raise ConfigError(f"{name} {v} is outside {prof.min_size}..{prof.max_size} for {prof.name}")

    def base_entry(self, request: GenerationRequest, model: str | None = None, dtype: str = "") -> BaseEntry | None:
        """The kept base of `request` (its picture and last timing), or None."""
        dtype = dtype or self.manager.resolve_dtype(self.presets.get(BASE).dtype).name
        return self.bases.get(request.key(resolve_model(model or self.model), dtype))

    def context(self, request: GenerationRequest, preset: Preset, model: str | None = None, **hooks) -> RunContext:
        """The run context of `request` under `preset`'s dtype, the preset's own LoRAs first (so its base image has
        them too)."""
        dtype = self.manager.resolve_dtype(preset.dtype)
        if preset.loras:
            request = replace(request, loras=merge_loras(preset.loras, request.loras))
        return RunContext(self.manager, request, model or self.model, dtype, deadline=self.deadline, **hooks)

    @contextmanager
    def time_limit(self, seconds: float | None):
        """Every run started inside stops between two steps once `seconds` have passed (None: no limit), ending the
        request with spec.errors.OverTime: a public studio's limit per request."""
        before, self.deadline = self.deadline, Deadline.after(seconds) or self.deadline
        try:
            yield
        finally:
            self.deadline = before

    def base_preset(self, dtype: str, preset: Preset | None = None) -> Preset:
        """`base` in a stack's dtype and memory regime: what the stack is compared with."""
        base = replace(self.presets.get(BASE), dtype=dtype)
        return base if preset is None else same_regime(base, preset)

    # runs ------------------------------------------------------------------------------------------------
    def warm_up(self, request: GenerationRequest, presets: list[str], model: str | None = None) -> list[float]:
        """Load the model and warm each preset's stack for this shape; the seconds each took (0.0: warm already)."""
        out = []
        with self.manager.lock:
            for name in presets:
                p = self.resolve_preset(name)
                ctx = self.context(request, p, model)
                pipe, stack, _ = pipeline_for(ctx, p)
                out.append(warm(ctx, pipe, stack, p) or 0.0)
        return out

    def settle(self, request: GenerationRequest, preset: str | Preset, model: str | None = None) -> float:
        """One untimed run of `preset` (engine.run.settle): a caller's round of timed runs starts after it."""
        p = self.resolve_preset(preset)
        with self.manager.lock:
            return settle(self.context(request, p, model), p)

    def screen(self, request: GenerationRequest, preset: str | Preset, model: str | None = None) -> RunMetrics:
        """One run of `preset` without a warm-up, for its picture and step counts against the base image (computed
        first if missing). Its time is not a measurement: the tuner times its finalists with the bench."""
        p = self.resolve_preset(preset)
        ctx = self.context(request, p, model)
        with self.manager.lock, self._failures(p):
            if self.bases.get(regime_key(ctx.key, p)) is None:
                self.generate(ctx.request, self.base_preset(ctx.dtype.name, p), model=ctx.model)  # (its LoRAs)
            run = measure(ctx, p, warm_up=False)
            return self._metrics(
                ctx, p, Paired(self.bases.get(regime_key(ctx.key, p)), run, 1, False), 0.0, screening=True
            )

    def generate(
        self,
        request: GenerationRequest,
        preset: str | Preset = BASE,
        *,
        model: str | None = None,
        progress=None,
        on_status=None,
        compare: bool | str = True,
        pairing: Pairing | None = None,
    ) -> RunResult:
        """One generation with `preset` (a stack or a name), measured and compared with the same request's base.
        `compare`: on (True) times base beside it; auto divides by a kept base timing of the same shape when there is
        one; off (False) runs the stack alone. `progress(step_index, total_steps, StepRecord)` follows each step;
        `pairing=CALLER_TIMES_BASE` is for a caller that times base itself (the bench)."""
        t0 = time.perf_counter()
        compare = compare_mode(compare)
        p = self.resolve_preset(preset)  # a stack as the Ask resolved and switched it; a name: the runner's library
        ctx = self.context(request, p, model, progress=progress, on_status=on_status)
        with self.manager.lock:
            self.check_caps(request)  # an operator's caps before any load
            check_loras(ctx.request, p)  # a LoRA on a stack it cannot run on, before any model work
            # a model that cannot load (or fit the device under this regime: engine.placement) says so next
            self.manager.ensure(ctx.model, ctx.dtype, on_status, offload=p.offload_config)
            self.check_request(request, ctx.model)
            with self._failures(p):
                result = self._generate(ctx, p, pairing or self.pairing, compare, t0)
            if compare == "on" and pairing is not CALLER_TIMES_BASE and p.step_share is None:  # (a click's card)
                result.metrics.quality.vs_fewer = self._vs_fewer(ctx, p, result)
            return result

    def base_picture(self, request: GenerationRequest, base: Preset, model: str | None = None):
        """Base's picture of `request` under `base` (base_preset), untimed: the kept one, else one run kept as a
        picture only (never a timing)."""
        ctx = self.context(request, base, model)
        key = regime_key(ctx.key, base)
        kept = self.bases.get(key) or self.pictures.get(key)
        if kept is None:
            with self.manager.lock:
                kept = self.pictures.put(key, entry_of(measure(ctx, base, show_steps=False)))
        return kept.image

    def _vs_fewer(self, ctx: RunContext, p: Preset, result: RunResult) -> dict | None:
        """A cached text-to-image run against base at that speed-up's step count (HOUSE 18): one untimed, kept base run
        of fewer steps. None where nothing cached or divides, or where the extra run failed (logged). A quantized
        stack's click ends on base's weights where the device holds one set (side_by_side's grouped order), so the
        extra run loads nothing more."""
        m, req = result.metrics, ctx.request
        sp, db = m.timing.speedup, m.quality.psnr_db
        if not m.cache.cached_steps or sp is None or sp <= 1.0 or db is None or result.base_image is None:
            return None
        if req.task != "text2img" or req.steps < 2:
            return None
        k = steps_at_speed(req.steps, sp)
        try:
            fewer = self.base_picture(replace(req, steps=k), self.base_preset(ctx.dtype.name, p), ctx.model)
        except Exception as e:
            if not (isinstance(e, USER_ERRORS) or is_run_failure(e)):
                raise
            log.warning("base at %d steps for the card's fewer-steps line failed; the line is left out", k, exc_info=e)
            return None
        at = psnr(fewer, result.base_image)
        return {"steps": k, "full": req.steps, "speedup": req.steps / k, "psnr_db": at, "margin_db": margin_db(db, at)}

    @contextmanager
    def _failures(self, p: Preset):
        """A run failure the studio can name (spec.errors.RUN_FAILURES) ends in one RunError sentence; a user error
        as it is; anything else is a bug and goes on to the one boundary that logs it."""
        try:
            yield
        except USER_ERRORS:
            raise
        except Exception as e:
            parallel = self._parallel_failed(p)  # a bug too stops the workers it ran on: the next request starts anew
            if not is_run_failure(e):
                raise
            msg = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            if parallel:
                raise RunError(
                    f"a parallel worker failed during the run ({msg}); the workers are stopped and the "
                    "next request starts them again"
                ) from e
            raise RunError(
                f"the run failed inside the pipeline ({msg}); the loaded model, its stack and the kept "
                "base images are as they were, so the next request runs as before"
            ) from e

    def _parallel_failed(self, p: Preset) -> bool:
        """Whether parallel workers ran the failed run; they are stopped, so the next request starts new ones."""
        cur = self.manager.current
        if cur is None or not p.wants_workers or workers(cur.pipe) is None:
            return False
        remove_parallel(cur.pipe)
        return True

    def _generate(self, ctx: RunContext, p: Preset, pairing: Pairing, compare: str, t0: float) -> RunResult:
        """generate()'s body, under the manager's lock."""
        plan = self._plan(ctx, p, pairing, compare)
        time_it = {BASE_ITSELF: self._time_base, COMPARED: self._time_compared, ALONE: self._time_alone}[plan.how]
        paired = time_it(ctx, p, plan)
        self._keep_shape_timing(plan, p, paired)
        pace = self._pace(ctx, paired)
        metrics = self._metrics(ctx, p, paired, time.perf_counter() - t0, is_base=plan.is_base, pace=pace)
        return RunResult(paired.run.image, paired.base.image if paired.base else None, metrics)

    def _plan(self, ctx: RunContext, p: Preset, pairing: Pairing, compare: str) -> Plan:
        """How this run is timed: base itself, compared with base (beside it or by its shape's kept timing: decided
        after its warm-up), or alone."""
        base_p = self.base_preset(ctx.dtype.name, p)
        key, shape = regime_key(ctx.key, p), regime_key(ctx.timing_key, p)  # another regime, another kept base
        is_base = replace(p, dtype=ctx.dtype.name).stack == base_p.stack
        if is_base:
            known = compare == "auto" and shape_timing(pairing, self.shapes, shape) is not None
            how = pairing if compare == "on" or (compare == "auto" and not known) else CALLER_TIMES_BASE
            return Plan(BASE_ITSELF, key, shape, base_p, how, compare)
        return Plan(COMPARED if compare != "off" else ALONE, key, shape, base_p, pairing, compare)

    def _time_base(self, ctx: RunContext, p: Preset, plan: Plan) -> Paired:
        return base_itself(plan.pairing, self.bases, plan.key, lambda: measure(ctx, p))  # one run when not compared

    def _time_alone(self, ctx: RunContext, p: Preset, plan: Plan) -> Paired:
        return Paired(None, measure(ctx, p), 1, False)

    def _time_compared(self, ctx: RunContext, p: Preset, plan: Plan) -> Paired:
        """The stack against base, cores watched on a CPU. Warm-up first, so a kept base does not go stale during a
        compile; then by the shape's kept timing where usable (compare `auto`), else base timed beside it."""
        cpu = cpu_threads(self.manager.device) if not p.wants_workers else None  # watched cores (baseline)
        pipe, stack, reloaded = pipeline_for(ctx, p)
        warmup_s = warm(ctx, pipe, stack, p)
        kept = self._kept_price(plan, p)
        if kept is not None:
            shaped, then, same = kept
            paired = watched(
                lambda _: by_shape(shaped, then, same, lambda: measure(ctx, p)), cpu, self.bases, plan.key
            )
        else:  # where base's weights and the stack's cannot stay together, each set loads once: grouped, not B S B S
            one_set = not p.wants_workers and not self.manager.holds_both(p, plan.base)
            paired = watched(
                lambda crowded: side_by_side(
                    plan.pairing,
                    self.bases,
                    plan.key,
                    time_base=lambda: measure(ctx, plan.base, show_steps=False),
                    time_stack=lambda: measure(ctx, p),
                    on_status=ctx.on_status,
                    crowded=crowded,
                    one_set=one_set,
                ),
                cpu,
                self.bases,
                plan.key,
            )
        run = replace(paired.run, warmup_s=warmup_s, reloaded=reloaded or paired.run.reloaded)
        return replace(paired, run=run)

    def _kept_price(self, plan: Plan, p: Preset) -> tuple | None:
        """Under compare `auto`: (the shape's kept base timing, this stack's runs beside it, the request's kept base)
        where both are kept; None: base is timed beside it."""
        shaped = shape_timing(plan.pairing, self.shapes, plan.shape) if plan.compare == "auto" else None
        then = self.stack_prices.get((plan.shape, p.stack)) if shaped is not None else None
        if then is None or then[0] != shaped.timed_at:
            return None
        return shaped, then[1], self.bases.get(plan.key)

    def _keep_shape_timing(self, plan: Plan, p: Preset, paired: Paired) -> None:
        """Keep an agreed base timing of this call for the shape's next runs (compare `auto`), with the stack's runs
        beside it (what later drift is read against)."""
        base = paired.base
        if base is None or not base.agreed or paired.by_shape or not (plan.is_base or paired.base_now):
            return
        self.shapes.put(plan.shape, base)
        if not plan.is_base:
            self.stack_prices.put((plan.shape, p.stack), (base.timed_at, paired.stack_runs))

    def _metrics(
        self,
        ctx: RunContext,
        p: Preset,
        paired: Paired,
        total_s: float,
        *,
        is_base: bool = False,
        screening: bool = False,
        pace: Pace | None = None,
    ) -> RunMetrics:
        run: Measured = paired.run
        base = paired.base
        info = run.stack.workers.info if run.stack.workers is not None else None
        timing = Timing(
            warmup_in_call=run.warmup_s is not None,
            runs=paired.runs,
            interleaved=not is_base,
            base_now=None if base is None or is_base else paired.base_now,
            in_workers=info is not None,
            screening=screening,
            by_shape=paired.by_shape,
            grouped=paired.grouped,
        )
        cache_on = run.stack.is_engaged("cache")
        ideal = ideal_check(p, paired, self.presets.get(BASE))
        return RunMetrics.of(
            image=run.image,
            base_image=base.image if base else None,
            base_timed_at=base.timed_at if base else None,
            ended=run.ended,
            timing=timing,
            timed=RunTiming(
                denoise_s=run.denoise_s,
                step_ms=run.step_ms,
                total_s=total_s,
                compile_s=run.warmup_s if run.compiled else None,
                warmup_s=run.warmup_s,
                base_denoise_s=base.denoise_s if base else None,
                base_pace_over=pace.over if pace is not None else None,
                **paired.priced_s(),
            ),
            ratio=paired.ratio if base is not None else None,
            ideal=ideal,
            cache=RunCache.of(
                run.counts,
                transformer_calls=run.calls,
                residual_diffs=run.report.residual_diffs,
                cache_threshold=run.report.threshold if cache_on else None,
                backend_cached_steps=run.report.cached_steps if run.report.backend == "cache-dit" else None,
                backend_cfg_cached_steps=run.report.cfg_cached_steps,
                pruned_blocks=run.report.pruned_blocks,
                block_calls=run.report.block_calls,
                blocks=run.blocks,
            ),
            room=self._room(ctx, p, run),
            model=ctx.model,
            preset=p.name,
            request=ctx.request.as_dict(),
            reloaded=run.reloaded,
            labels=labels(ctx, p, run, self.manager.current.pipe),
            placement=RunPlacement(device=str(self.manager.device), plan=self.manager.placement(), parallel=info),
            memory=RunMemory(peak_memory=run.memory.as_dict() if run.memory is not None else None, h2d=run.h2d),
        )

    def _room(self, ctx: RunContext, p: Preset, run: Measured) -> CacheRoom:
        """The step cache's room at this run's steps, engaged or not, and why an engaged one cached nothing
        (spec.headroom)."""
        steps, c = ctx.for_preset(p).request.executed_steps, p.cache_config
        room = headroom(c, steps, step_mask(c, steps) if c.has_mask else None)
        r = run.report
        return run_room(
            room, engaged=r.backend != "none", cached=run.counts.cached, diffs=r.residual_diffs, threshold=r.threshold
        )

    def _pace(self, ctx: RunContext, paired: Paired) -> Pace | None:
        """An uncrowded CPU base timed in this call: its floor per step against this machine's fastest on record
        (studio.measure.pace), which keeps the faster."""
        base, c = paired.base, paired.crowding
        if not paired.base_now or base is None or not base.runs or c is None or c.taken is None or c.crowded:
            return None
        calls = 2 if true_cfg(self.manager.current.pipe, ctx.request) else 1
        key = pace_key(
            device=str(self.manager.device),
            threads=c.threads,
            model=ctx.model,
            dtype=ctx.dtype.name,
            work=work_of(ctx.request, calls),
        )
        return record(self.manager.settings.pace_file, key, price_ms(base.runs) / max(1, len(base.runs[0].step_ms)))
