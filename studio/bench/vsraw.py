"""`bench --vs-raw`, the studio's side: a preset as the plain recipe a user would write (studio.bench.raw), built
from what the studio really ran (its dtype, the attention backend it could use, the threshold it applied)."""

from __future__ import annotations

from studio.bench.raw import RawWorker
from studio.engine.attention import usable
from studio.engine.call import pipe_kwargs, true_cfg
from studio.engine.quantize import exported_quant
from studio.spec.cachedit import cache_dit_configs
from studio.spec.preset import ATTENTION_BACKENDS, Preset
from studio.spec.profiles import resolve_model

DBCACHE_FIELDS = (
    "Fn_compute_blocks",
    "Bn_compute_blocks",
    "max_warmup_steps",
    "residual_diff_threshold",
    "max_continuous_cached_steps",
    "max_cached_steps",
    "num_inference_steps",
    "steps_computation_mask",
    "steps_computation_policy",
    "enable_separate_cfg",
)


def recipe(runner, preset: Preset, request, model=None) -> dict:
    """The plain recipe of `preset` for this request, as the worker builds it."""
    import torch

    if preset.wants_workers:
        raise RuntimeError("no plain recipe for parallel presets (their workers are cache-dit's own already)")

    pipe = runner.manager.current.pipe  # the studio's pipeline of this model: only read, for the call's arguments
    dtype = runner.manager.resolve_dtype(preset.dtype)
    device = runner.manager.device
    q, c = preset.quantize_config, preset.cache_config
    out = {"name": preset.name, "model": resolve_model(model or runner.model), "dtype": dtype.name}
    out["device"] = str(device)
    # the studio's own thread count: a CPU's reductions split by thread, so the plain run on another count draws
    # other pixels (89 dB, measured: a one-thread test process beside a worker on both cores), timed on more cores
    out["threads"] = torch.get_num_threads()
    form = exported_quant(preset, runner.manager.profile) or "none"  # the form the studio runs here (auto resolved)
    if q.enabled:
        out.update(quant_type=form, exclude_layers=list(q.exclude_layers))
    if c.backend == "cache-dit":
        cfgs = cache_dit_configs(c, quant=form, steps=request.steps, separate_cfg=true_cfg(pipe, request))
        out["dbcache"] = {k: getattr(cfgs.cache, k) for k in DBCACHE_FIELDS}
        if out["dbcache"]["steps_computation_mask"] is not None:
            out["dbcache"]["steps_computation_mask"] = [int(x) for x in out["dbcache"]["steps_computation_mask"]]
        if c.enable_taylorseer:
            out["calibrator"] = {"taylorseer_order": c.taylorseer_order}
        elif c.enable_dmd:
            out["calibrator"] = {"dmd_history": c.dmd_history, "dmd_rank": c.dmd_rank}
    elif c.backend == "fbcache":
        out["fbcache_threshold"] = c.effective_threshold(form)
    name = ATTENTION_BACKENDS[preset.attention_backend]
    # what the studio could run here (it falls back to sdpa where a backend cannot run, and says so)
    out["attention"] = name if usable(name, torch.device(device), dtype.torch) is None else "native"
    if preset.compile.enabled:
        out.update(compile=True, fullgraph=preset.compile.effective_fullgraph(c.enabled))
    return out


def call_kwargs(runner, request) -> dict:
    """The pipeline call's arguments for `request`, less what each side sets itself (generator, callback, output)."""
    kw = pipe_kwargs(runner.manager.current.pipe, request)
    for k in ("generator", "callback_on_step_end", "output_type"):
        kw.pop(k, None)
    return kw


class RawPool:
    """One plain worker per preset or `worker` name (base's second run gets its own: two processes' noise)."""

    def __init__(self, runner, model=None):
        self.runner, self.model, self.workers, self.failed = runner, model, {}, {}

    def run(self, preset: Preset, request, worker: str | None = None):
        key = worker or preset.name
        if key in self.failed:
            raise RuntimeError(self.failed[key])
        try:
            if key not in self.workers:
                self.workers[key] = RawWorker(recipe(self.runner, preset, request, self.model))
            return self.workers[key].run(call_kwargs(self.runner, request), request.seed)
        except RuntimeError as e:
            self.failed[key] = str(e)[:300]
            w = self.workers.pop(key, None)
            if w is not None:
                w.close()
            raise

    def pids(self) -> list[int]:
        """The live workers' process ids (their CPU time is the bench's own: studio.measure.crowding)."""
        return [w.proc.pid for w in self.workers.values()]

    def close(self) -> None:
        for w in self.workers.values():
            w.close()
        self.workers.clear()
