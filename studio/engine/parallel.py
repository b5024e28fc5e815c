"""Parallel presets: cache-dit's ParallelismConfig (context or tensor parallelism) with Ray workers, one per rank;
cache-dit starts and wires them. Pipeline level, by choice: each worker loads and runs the whole pipeline, so no
tensor round-trips through the main process per step (cache-dit's transformer-level Ray path failed to cache on FLUX).
Timing and counts come from rank 0 (studio.measure.remote)."""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
from pathlib import Path

import torch

from studio.engine.attention import usable
from studio.engine.state import Engaged, ParallelState, stack_state
from studio.spec.cachedit import cache_dit_configs
from studio.spec.preset import ATTENTION_BACKENDS, ParallelSpec, Preset

log = logging.getLogger(__name__)
SWITCH_ENV = "STUDIO_PARALLEL"  # 0: parallel presets run in one process (a public Space's default)
_STUDIO_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding the `studio` package


def load_for_worker(source: str, dtype: str):
    """What each worker runs to get its pipeline (importable, so Ray sends it by reference)."""
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(source, torch_dtype=getattr(torch, dtype))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def worker_options(spec: ParallelSpec, device: torch.device) -> dict:
    """Ray resources per worker: a GPU each, or on a CPU machine one CPU and no GPU (Ray's default num_gpus=1 would
    wait forever)."""
    opts = {"num_gpus": 1} if device.type == "cuda" else {"num_gpus": 0, "num_cpus": 1}
    opts.update(spec.ray_worker_options or {})
    return opts


def _planner_missing(spec: ParallelSpec, transformer) -> str | None:
    name = type(transformer).__name__
    try:  # cache-dit registers its planners on first use; ask its registry the way its dispatcher does
        from cache_dit.distributed.transformers import dispatch
        from cache_dit.distributed.transformers.register import ContextParallelismPlannerRegister as Reg
        from cache_dit.distributed.transformers.register import TensorParallelismPlannerRegister as TReg

        if spec.ulysses_size > 1 or spec.ring_size > 1:
            dispatch._ensure_cp_planners_activated()
            Reg.get_planner(name)
        if spec.tp_size > 1:
            dispatch._ensure_tp_planners_activated()
            TReg.get_planner(name)
    except ValueError:
        return f"cache-dit has no parallelism planner for {name}"
    except ImportError as e:
        return f"cache-dit's parallelism is not importable ({e})"
    return None


def unavailable_reason(spec: ParallelSpec, pipe, device: torch.device, allowed: bool = True) -> str | None:
    """Why this parallel preset cannot run here, or None; `allowed`: the `parallel` setting (STUDIO_PARALLEL)."""
    if not allowed:
        return f"parallel workers are off in this studio ({SWITCH_ENV}=0)"
    for pkg, why in (("ray", "pip install ray"), ("einops", "cache-dit's parallelism planners import it")):
        if importlib.util.find_spec(pkg) is None:
            return f"package {pkg} not installed ({why})"
    missing = _planner_missing(spec, pipe.transformer)
    if missing:
        return missing
    if spec.ray_address is None:  # a local Ray: the workers must fit on this machine
        if device.type == "cuda" and torch.cuda.device_count() < spec.world_size:
            return (
                f"{spec.world_size} workers need {spec.world_size} GPUs, this machine has {torch.cuda.device_count()}"
            )
        if device.type != "cuda" and (os.cpu_count() or 1) < spec.world_size:
            return f"{spec.world_size} workers need {spec.world_size} CPU cores, this machine has {os.cpu_count()}"
    return None


def _engine(pipe):
    return getattr(pipe, "_cache_dit_ray_pipeline_engine", None)


def actors(pipe) -> list:
    eng = _engine(pipe)
    return list(getattr(eng, "_actors", []) or []) if eng is not None else []


def workers(pipe) -> ParallelState | None:
    """The parallel workers running `pipe`'s model now, or None (the one answer to "do workers run?")."""
    return stack_state(pipe.transformer).workers.running


def remove_parallel(pipe) -> None:
    """Stop the workers (and a Ray runtime the engine started); a dead worker is killed rather than asked."""
    state = stack_state(pipe.transformer)
    if state.workers.running is None:
        return
    shell = state.workers.running.proxy
    from cache_dit.ray.wrapper import disable_ray_pipeline_parallelism

    try:
        # not cache_dit.disable_cache: that would also unhook the shared transformer in the main process
        disable_ray_pipeline_parallelism(shell)
    except Exception as e:  # a dead actor cannot answer shutdown(): kill what is left
        log.warning("stopping parallel workers: %s", e)
        _force_stop(shell)
    state.workers.reset()


def _force_stop(shell) -> None:
    import ray

    eng = _engine(shell)
    for a in actors(shell):
        try:
            ray.kill(a)
        except ValueError as e:  # ray.kill refuses a handle that is not an actor's: nothing of it is left to stop
            log.warning("stopping a parallel worker: %s", e)
    if eng is not None:
        eng._actors = []
        if getattr(eng, "_ray_initialized_by_engine", False) and ray.is_initialized():
            ray.shutdown()
    for attr in ("_cache_dit_ray_pipeline_engine", "_cache_dit_ray_pipeline_enabled"):
        shell.__dict__.pop(attr, None)


def _configs(preset: Preset, steps, separate_cfg, device, dtype):
    from cache_dit import ParallelismConfig

    spec, c = preset.parallelism_config, preset.cache_config
    cache_cfg = cal = None
    if c.backend == "cache-dit":  # a parallel preset takes no quantize_config: the threshold is the plain default
        cfgs = cache_dit_configs(c, steps=steps, separate_cfg=separate_cfg)
        cache_cfg, cal = cfgs.cache, cfgs.calibrator
    name = ATTENTION_BACKENDS[preset.attention_backend]
    attn_note = None
    why = usable(name, device, dtype) if name != "native" else None
    if why is not None:
        attn_note = f"{preset.attention_backend}: {why}, using sdpa in the workers"
        name = "native"
    addr = spec.ray_address  # (the RAY_ADDRESS setting filled in by engine.stack where the preset names none)
    pc = ParallelismConfig(
        ulysses_size=spec.ulysses_size if spec.ulysses_size > 1 else None,
        ring_size=spec.ring_size if spec.ring_size > 1 else None,
        tp_size=spec.tp_size if spec.tp_size > 1 else None,
        use_ray=True,
        ray_address=addr,
        ray_worker_options=worker_options(spec, device),
        ray_transfer_custom_obj=False,  # FluxPipeline's null components break the class fix-up otherwise
        ray_runtime_env=None if addr else {"env_vars": {"PYTHONPATH": _STUDIO_ROOT}},
        # workers' own logs stay in Ray's log folder (a failure still comes back as the run's exception)
        ray_init_kwargs={"include_dashboard": False, "log_to_driver": False},
        attention_backend=name,
    )
    return cache_cfg, cal, pc, attn_note


def apply_parallel(
    pipe, preset: Preset, *, source: str, steps, separate_cfg: bool = False, device: torch.device | None = None
) -> ParallelState:
    """Start parallel workers running `pipe`'s model as `preset` says (its cache and attention inside them) on
    `device`'s kind (engine.offload.run_device: where the pipeline computes, not where an offloaded weight waits);
    the caller has checked `unavailable_reason`."""
    import cache_dit
    import ray

    from studio.measure import remote

    spec = preset.parallelism_config
    label = spec.label()
    tr = pipe.transformer
    device, dtype = device or next(tr.parameters()).device, next(tr.parameters()).dtype
    cache_cfg, cal, pc, attn_note = _configs(preset, steps, separate_cfg, device, dtype)
    pc.ray_transfer_fn = functools.partial(load_for_worker, source, str(dtype).split(".")[-1])
    # A pipeline object of its own for cache-dit to turn into the proxy (it sets its class), so the main pipeline's
    # own stacks (a base run beside this one) stay untouched.
    shell = type(pipe)(**pipe.components)
    shell.set_progress_bar_config(disable=True)
    cache_dit.enable_cache(shell, cache_config=cache_cfg, calibrator_config=cal, parallelism_config=pc)
    where = ray.get([a.__ray_call__.remote(remote.install) for a in actors(shell)])
    state = stack_state(tr)
    state.workers.starts += 1
    info = {
        "kind": label,
        "world_size": spec.world_size,
        "ray": spec.ray_address or "local (started by the studio)",
        "workers": where,
        "cache": "cache-dit, inside the workers" if cache_cfg is not None else "none",
        "attention": pc.attention_backend,
    }
    places = ", ".join(f"rank {w['rank']} on {w['device']} ({w['host']} pid {w['pid']})" for w in where)
    detail = f"parallel: {label} over {spec.world_size} Ray workers, {info['ray']}: {places}"
    if cache_cfg is not None:
        detail += f"; step cache inside the workers: cache-dit {preset.cache_config.label()}"
    if attn_note:
        detail += f"; {attn_note}"
    state.workers.running = ParallelState(
        runs=wanted(preset, steps, separate_cfg),
        proxy=shell,
        info=info,
        engaged=Engaged("parallel", label, True, detail, label),
        generation=state.workers.starts,
    )
    return state.workers.running


def wanted(preset: Preset, steps, separate_cfg: bool) -> tuple | None:
    """What workers for `preset` would run (compared with `ParallelState.runs`), or None: the preset wants none."""
    if not preset.wants_workers:
        return None
    return (preset.parallelism_config, preset.cache_config, preset.attention_backend, steps, separate_cfg)


def run_remote(pipe, kwargs: dict) -> tuple[object, dict]:
    """One pipeline call on the workers with their step clock; (output, rank 0's record)."""
    import ray

    from studio.measure import remote

    acts = actors(pipe)
    ray.get([a.__ray_call__.remote(remote.start_run) for a in acts])
    out = pipe(**kwargs, callback_on_step_end=remote.step_end)
    recs = ray.get([a.__ray_call__.remote(remote.read) for a in acts])
    return out, recs[0]
