"""`python -m lab regimes`: the reference table's shape, stacks x memory regimes, on a random-weight FLUX
transformer (FLUX.1-dev's size, lab.regimes.kernels.FLUX_DEV, or `small`) built on the device afresh for each row and
called `steps` times as a pipeline's loop would (each step's timestep, an Euler update; no VAE, no encoders), each
call between two device syncs (studio.measure.clock). A row's stack is a Preset put on through the engine's own doors:
engine.stack.apply_preset on a BareTransformer (the cache by engine.cache.apply_cache, its context refreshed before
each run by prepare_run). Random weights do not cache by residual, so the cache rows run under a STATIC step mask
(13 full / 27 cached at 40 steps), and cache-dit's own summary must list the mask's steps. Text: lab.regimes.report.
Its module level loads no torch: `main`'s parser reads its names (CONFIGS, PARTS, REGIMES); what runs imports the
engine inside the functions that run it.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from dataclasses import asdict, dataclass, field

from studio.measure.estimate import Run, shown, speedup
from studio.spec.preset import CacheSpec

# FLUX.1-dev's transformer is lab.regimes.kernels.FLUX_DEV (imported when built: it pulls in the engine and torch).
SMALL = dict(
    patch_size=1,
    in_channels=64,
    num_layers=2,
    num_single_layers=2,
    attention_head_dim=32,
    num_attention_heads=2,
    joint_attention_dim=64,
    pooled_projection_dim=32,
    guidance_embeds=True,
    axes_dims_rope=(4, 14, 14),
)
CONFIGS = {"flux-dev": dict(size=1024, text=512), "small": dict(size=64, text=32)}
REGIMES = {"resident": "none", "layerwise_offload": "layerwise_offload", "group_offload": "group_offload"}
# A stack is "+"-joined parts. int8: the device's fastest 8-bit form for the stack (engine.quantize.quant_form).
QUANT_PARTS = {"int8": "auto", **{q: q for q in ("int8_weight_only", "int8_per_row", "float8_per_row")}}
PARTS = ("base", "sage", "cache", "compile", *QUANT_PARTS)
# Default rows. Under offload: the reference table's six (layerwise offload, prefetch 1, on an RTX 4090).
RESIDENT_STACKS = tuple(
    "base sage int8_weight_only int8_per_row float8_per_row cache cache+int8 cache+int8+sage base+compile "
    "int8+compile cache+int8+sage+compile".split()
)
OFFLOAD_STACKS = ("base", "sage", "int8", "cache", "cache+int8", "cache+int8+sage")
DEFAULTS = f"resident: {','.join(RESIDENT_STACKS)}; under offload: {','.join(OFFLOAD_STACKS)}"  # (studio.cli's help)
# The step cache: DBCache F1B0 W4 R0.24 MC3; the mask computes the warm-up, then one step after every MC cached ones.
WARMUP, MAX_CONTINUOUS = 4, 3


@dataclass(frozen=True)
class Stack:
    name: str
    quant: str | None  # a QuantSpec quant_type, None: full precision
    sage: bool
    cache: bool
    compile: bool


def parse_stack(name: str) -> Stack:
    parts = [p.strip() for p in name.split("+") if p.strip()]
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        raise ValueError(f"--stacks: {name!r} has {bad or 'no parts'}; a stack is '+'-joined parts of {PARTS}")
    quants = [QUANT_PARTS[p] for p in parts if p in QUANT_PARTS]
    if len(quants) > 1 or ("base" in parts and len(parts) > 1 and set(parts) - {"base", "compile"}):
        raise ValueError(f"--stacks: {name!r}: at most one 8-bit form, and 'base' only alone or as base+compile")
    return Stack(name, quants[0] if quants else None, "sage" in parts, "cache" in parts, "compile" in parts)


def cache_spec(steps: int) -> CacheSpec:
    """The step cache of the reference row: F1B0 W4 R0.24 MC3 with a static mask sized to `steps`."""
    groups = math.ceil((steps - WARMUP) / (MAX_CONTINUOUS + 1))
    if groups < 1:
        raise ValueError(f"--steps {steps}: the cache rows need more than {WARMUP} steps (the warm-up)")
    return CacheSpec(
        backend="cache-dit",
        Fn_compute_blocks=1,
        Bn_compute_blocks=0,
        max_warmup_steps=WARMUP,
        residual_diff_threshold=0.24,
        max_continuous_cached_steps=MAX_CONTINUOUS,
        steps_computation_policy="static",
        compute_bins=(WARMUP,) + (1,) * groups,
        cache_bins=(MAX_CONTINUOUS,) * groups,
    )


@dataclass
class Bench:
    """What every row of one table shares: the transformer, the request, the device."""

    config: str
    transformer: dict
    size: int
    text: int
    steps: int
    device: object  # torch.device
    dtype: object  # torch.dtype
    mask: list[int]  # the cache rows' step mask (1: computed, 0: may cache), cache-dit's own steps_mask

    @property
    def tokens(self) -> int:
        return (self.size // 16) ** 2  # FLUX: 8x VAE, then 2x2 patches

    @property
    def warmup_steps(self) -> int:
        return min(self.steps, WARMUP + 2)  # full steps and cached ones: every graph compiles in the warm-up

    def describe(self) -> dict:
        t = self.transformer
        return {
            "config": self.config,
            "double_blocks": t["num_layers"],
            "single_blocks": t["num_single_layers"],
            "heads": t["num_attention_heads"],
            "head_dim": t["attention_head_dim"],
            "size": self.size,
            "image_tokens": self.tokens,
            "text_tokens": self.text,
            "steps": self.steps,
            "device": str(self.device),
            "dtype": str(self.dtype).replace("torch.", ""),
        }


def make_bench(config: str | None, steps: int, size: int | None, device) -> Bench:
    """The table's shared settings; `config` None: flux-dev on CUDA, small elsewhere."""
    import torch

    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    config = config or ("flux-dev" if device.type == "cuda" else "small")
    if config not in CONFIGS or (config == "flux-dev" and device.type != "cuda"):
        raise ValueError(f"--config {config!r} on {device.type}: flux-dev (CUDA: 24 GB in bf16) or small")
    size = size or CONFIGS[config]["size"]
    if size % 16:
        raise ValueError(f"--size {size}: must be a multiple of 16 (8x VAE, 2x2 patches)")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    from lab.regimes.kernels import FLUX_DEV
    from studio.spec.cachedit import step_mask

    cfg = dict(FLUX_DEV if config == "flux-dev" else SMALL)
    return Bench(config, cfg, size, CONFIGS[config]["text"], steps, device, dtype, step_mask(cache_spec(steps), steps))


@dataclass
class RegimeRow:
    """One stack under one memory regime (lab.regimes.report writes the rows as a table)."""

    stack: str
    regime: str
    ms_per_step: float | None = None  # the run's total over its steps (a cached run mixes two step costs)
    total_s: float | None = None
    speedup: float | None = None  # the same regime's base total over this total
    speedup_lo: float | None = None  # its interval (studio.measure.estimate, from both runs' steps)
    speedup_hi: float | None = None
    speedup_note: str | None = None  # why the speed-up is withheld (studio.measure.estimate.shown)
    cached_steps: int | None = None  # by cache-dit's own summary
    full_steps: int | None = None
    cached_at: list[int] = field(default_factory=list)  # the cached steps' indices
    full_step_ms: float | None = None  # median of the full steps
    cached_step_ms: float | None = None  # median of the cached steps
    warmup_s: float | None = None  # the untimed first steps (compile happens here)
    peak_memory: dict | None = None  # studio.measure.memory.PeakMemory over the timed run
    h2d: dict | None = None  # under offload: engine.offload.stream_report, bytes per full and per cached step
    psnr: str = "-"  # random weights: see lab.regimes.report.PSNR_NOTE
    engaged: list[str] = field(default_factory=list)
    fell_back: str | None = None  # what fell back (the row is not timed as if it were the stack)
    error: str | None = None  # what was lost: an exception, or counts that differ from the mask
    step_ms: list[float] = field(default_factory=list)

    timed = property(lambda self: self.ms_per_step is not None)


def _build(bench: Bench):
    """A fresh random-weight transformer made in its dtype on the device (FLUX.1-dev in float32 would be 48 GB)."""
    import torch
    from diffusers import FluxTransformer2DModel

    from studio.engine.state import stack_state

    torch.manual_seed(0)
    before = torch.get_default_dtype()
    torch.set_default_dtype(bench.dtype)
    try:
        with torch.device(bench.device):
            tr = FluxTransformer2DModel(**bench.transformer)
    finally:
        torch.set_default_dtype(before)
    tr.eval()
    stack_state(tr)  # the studio's step-counter hooks, on every row alike (as in the app)
    return tr


def _loop(tr, inputs: dict, steps: int, device, dtype) -> list[float]:
    """`steps` transformer calls with each step's timestep and an Euler update between them; ms per call (each call
    between two device syncs: studio.measure.clock)."""
    import torch

    from studio.measure.clock import CallClock

    inputs, clock = dict(inputs), CallClock(device)
    with torch.inference_mode():
        for i in range(steps):
            inputs["timestep"] = torch.full((1,), 1.0 - i / steps, device=device, dtype=dtype)
            out = clock.call(tr, **inputs)[0]
            inputs["hidden_states"] = inputs["hidden_states"] - out / steps
    return clock.ms


def preset_for(stack: Stack, regime: str, steps: int):
    """The stack under the regime as the studio's own Preset (what engine.stack.apply_preset takes)."""
    from studio.spec.offload import OffloadSpec
    from studio.spec.preset import CompileSpec, Preset, QuantSpec

    return Preset(
        name=f"{stack.name.replace('+', '-')}.{regime}",
        quantize_config=QuantSpec(quant_type=stack.quant or "none"),
        offload_config=OffloadSpec(policy=REGIMES[regime]),
        cache_config=cache_spec(steps) if stack.cache else CacheSpec(),
        attention_backend="sage" if stack.sage else "sdpa",
        compile=CompileSpec(enabled=stack.compile),
    )


def _apply(bare, preset, bench: Bench, row: RegimeRow) -> bool:
    """The preset through the engine's own door (engine.stack.apply_preset: quantize, offload, cache, attention,
    compile, in its order); the row lists what the stack asked for, and False at the first fall-back, which the row
    then states instead of a time."""
    from studio.engine.stack import STACK_ORDER, apply_preset

    applied = apply_preset(bare, preset, steps=bench.steps)
    for key in STACK_ORDER:
        e = applied.engaged.get(key)
        if e is None or not (e.engaged or e.fell_back or key == "attention"):
            continue  # (a step the stack does not ask for: quantize off, resident, no cache, eager)
        row.engaged.append(e.detail)
        if not e.engaged:
            row.fell_back = e.detail
            return False
    return True


def _time(bare, preset, regime: str, bench: Bench, row: RegimeRow) -> None:
    """Warm-up (untimed), then the timed run under the memory probe; the counts checked against the mask."""
    from lab.regimes.kernels import _flux_inputs
    from studio.engine.cache import prepare_run, read_report
    from studio.engine.state import stack_state
    from studio.measure.memory import MemoryProbe

    tr, spec = bare.transformer, preset.cache_config
    quant = stack_state(tr).quantize.mode
    inputs = _flux_inputs(bench.transformer, bench.tokens, bench.text, bench.device, bench.dtype)
    t0 = time.perf_counter()
    prepare_run(bare, spec, quant=quant, steps=bench.warmup_steps)
    _loop(tr, inputs, bench.warmup_steps, bench.device, bench.dtype)
    row.warmup_s = time.perf_counter() - t0
    prepare_run(bare, spec, quant=quant, steps=bench.steps)  # (a bare transformer's cache context starts afresh)
    if regime != "resident":
        from studio.engine.streams import stream_begin, stream_report

        stream_begin(tr)
    with MemoryProbe(bench.device) as probe:
        times = _loop(tr, inputs, bench.steps, bench.device, bench.dtype)
    row.peak_memory = probe.result.as_dict()
    row.step_ms = [round(t, 3) for t in times]
    cached = read_report(bare, spec, quant).cached_steps
    row.cached_at, row.cached_steps, row.full_steps = cached, len(cached), bench.steps - len(cached)
    want = [i for i, m in enumerate(bench.mask) if m == 0]
    if spec.enabled and cached != want:
        row.error = f"cache-dit's summary lists cached steps {cached}, the mask {want}: not a number"
        return
    full = [t for i, t in enumerate(times) if i not in cached]
    row.full_step_ms = statistics.median(full) if full else None
    row.cached_step_ms = statistics.median([times[i] for i in cached]) if cached else None
    row.total_s = sum(times) / 1e3
    row.ms_per_step = sum(times) / len(times)
    if regime != "resident":
        row.h2d = stream_report(tr, 1, cached)


def measure_row(bench: Bench, stack: Stack, regime: str) -> RegimeRow:
    """One row on a fresh transformer; an exception costs this row only, and the row says what was lost."""
    import torch

    from studio.engine.cache import BareTransformer

    row = RegimeRow(stack.name, regime)
    bare = None
    try:
        bare, preset = BareTransformer(_build(bench)), preset_for(stack, regime, bench.steps)
        if _apply(bare, preset, bench, row):
            _time(bare, preset, regime, bench, row)
    except Exception as e:  # handled: an OOM, a compile or kernel failure loses this row, the table goes on
        row.error = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
    finally:
        bare = None
        gc.collect()
        if bench.device.type == "cuda":
            torch.cuda.empty_cache()
    return row


def add_speedups(rows: list[RegimeRow]) -> None:
    """Each timed row against the timed base of its regime, by the one estimator (studio.measure.estimate: each
    run priced by its floor, the interval from its steps)."""
    for row in rows:
        base = next((r for r in rows if r.regime == row.regime and r.stack == "base" and r.timed), None)
        if base is None or not row.timed:
            continue
        if row is base:
            row.speedup = 1.0
            continue
        est = speedup([Run.of(base.step_ms, base.cached_at)], [Run.of(row.step_ms, row.cached_at)])
        s = shown(est, helps="a quieter machine, or a run of more steps")  # one run a side: its steps' interval
        row.speedup, row.speedup_lo, row.speedup_hi, row.speedup_note = s.point, s.lo, s.hi, s.note


def plan(stacks: str | None, regimes: str) -> list[tuple[Stack, str]]:
    """(stack, regime) pairs in order: each regime's base first. No --stacks: the defaults per regime."""
    names = [r.strip() for r in regimes.split(",") if r.strip()]
    bad = [r for r in names if r not in REGIMES]
    if bad or not names:
        raise ValueError(f"--regimes: {bad or 'none given'}; choose from {tuple(REGIMES)}")
    pairs = []
    for regime in names:
        chosen = stacks.split(",") if stacks else (RESIDENT_STACKS if regime == "resident" else OFFLOAD_STACKS)
        parsed = [parse_stack(s.strip()) for s in chosen if s.strip()]
        parsed.sort(key=lambda s: s.name != "base")  # the regime's base first: the others' speed-up needs it
        pairs += [(s, regime) for s in parsed]
    return pairs


@dataclass
class RegimeReport:
    command: str  # the exact command line that produced it
    bench: dict  # Bench.describe()
    mask: list[int]  # the cache rows' step mask (1: computed, 0: cached)
    versions: dict
    rows: list[RegimeRow] = field(default_factory=list)


def run_table(bench: Bench, pairs, command: str, on_row=None) -> RegimeReport:
    """Every (stack, regime) row in order; `on_row(report, row)` after each one (with speed-ups so far)."""
    import importlib.metadata as md

    import torch

    names = ("torch", "diffusers", "cache-dit", "torchao")
    versions = {n: next((d.version for d in md.distributions(name=n)), "not installed") for n in names}
    versions["gpu"] = torch.cuda.get_device_name(bench.device) if bench.device.type == "cuda" else None
    rep = RegimeReport(command, bench.describe(), bench.mask, versions)
    threads = torch.get_num_threads()
    if bench.device.type == "cpu" and bench.config == "small":
        # OpenMP threads of a tiny model stall beside any other busy process (measured on 2 busy cores: 17 ms per
        # call on one thread, 150-600 ms on two): one thread times what the model costs
        torch.set_num_threads(1)
    rep.bench["cpu_threads"] = torch.get_num_threads()
    try:
        for stack, regime in pairs:
            rep.rows.append(measure_row(bench, stack, regime))
            add_speedups(rep.rows)
            if on_row:
                on_row(rep, rep.rows[-1])
    finally:
        torch.set_num_threads(threads)
    return rep


def main(argv=None) -> int:
    """`python -m lab regimes`: the table its arguments ask for, writing --out/--md after every row; 1: a row is an
    error."""
    import argparse
    import json
    import shlex
    import sys
    from pathlib import Path

    from lab.regimes.report import HELP, markdown, row_line

    argv = list(sys.argv[1:] if argv is None else argv)
    r = argparse.ArgumentParser(prog="python -m lab regimes", description=HELP)
    r.add_argument("--config", choices=sorted(CONFIGS), help="flux-dev (default on CUDA) or small (default on CPU)")
    r.add_argument("--steps", type=int, default=40, help="transformer calls per run (default 40)")
    r.add_argument("--size", type=int, default=None, help="image side in pixels (default 1024; small: 64)")
    r.add_argument("--stacks", help=f"comma-separated, each '+'-joined {','.join(PARTS)} (default {DEFAULTS})")
    r.add_argument("--regimes", default="resident,layerwise_offload", help=f"comma-separated: {','.join(REGIMES)}")
    r.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    r.add_argument("--out", default=None, help="the report as JSON, written after every row")
    r.add_argument("--md", default=None, help="the Markdown table, written after every row")
    args = r.parse_args(argv)
    try:
        bench = make_bench(args.config, args.steps, args.size, args.device)
        pairs = plan(args.stacks, args.regimes)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    def write(rep: RegimeReport, row: RegimeRow) -> None:
        print(row_line(row), file=sys.stderr)
        for path, text in ((args.out, lambda: json.dumps(asdict(rep), indent=1)), (args.md, lambda: markdown(rep))):
            if path:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                Path(path).write_text(text())

    print(f"regimes: {len(pairs)} rows on {bench.describe()}", file=sys.stderr)
    rep = run_table(bench, pairs, shlex.join(["python", "-m", "lab", "regimes", *argv]), on_row=write)
    print(markdown(rep))
    return 1 if any(r.error for r in rep.rows) else 0
