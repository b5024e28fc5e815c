"""The engine on a tiny real FluxPipeline (random weights): caches, stack order, reuse/reload, fallbacks.

Random weights give residual diffs of 0.33-0.46 (measured), so caching tests raise the threshold to 0.5;
the trained embedded model is tested at the real 0.24 in test_tiny_model.py.
"""

from __future__ import annotations

import html
import json
import math
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import replace

import numpy as np
import pytest
import torch

from studio.engine import STACK_ORDER, ModelLoadError, stack_state
from studio.engine.baseline import Pairing
from studio.engine.quantize import apply_quant, quantized_mode
from studio.measure.blocks import block_list
from studio.measure.estimate import Run, price_ms, speedup
from studio.measure.quality import psnr
from studio.report.card import answer_line
from studio.spec import CacheSpec, CompileSpec, ConfigError, GenerationRequest, QuantSpec
from studio.spec.errors import Invariant
from studio.spec.settings import current
from tests.switched import stack

PROMPT = "a red circle in the center, blue background"


def req(**kw):
    base = dict(prompt=PROMPT, seed=3, steps=12, width=64, height=64, max_sequence_length=32)
    base.update(kw)
    return GenerationRequest(**base)


def _three_run(runner, preset, threshold):
    """Diffusers' cache test: base; cache on (cached steps, PSNR within bound); cache off == base bitwise."""
    r = req()
    base = runner.generate(r, "base")
    on = runner.generate(r, stack(runner, preset, threshold=threshold))
    off = runner.generate(r, stack(runner, preset, cache=False))
    return base, on, off


def test_three_run_check_cache_dit(runner):
    base, on, off = _three_run(runner, "cache", 0.5)
    m = on.metrics
    assert m.cache.cached_steps > 0 and m.cache.full_steps + m.cache.cached_steps == 12
    # warm-up steps 0..3 always computed; never more than 3 cached in a row
    assert all(i >= 4 for i in m.cache.cached_step_indices)
    runs = np.diff([-2] + m.cache.cached_step_indices)
    longest = max(len(s) for s in "".join("1" if d == 1 else "0" for d in runs).split("0"))
    assert longest + 1 <= 3
    assert m.cache.backend_cached_steps == m.cache.cached_step_indices  # our hook count agrees with cache-dit's own
    assert 25.0 < m.quality.psnr_db < math.inf
    assert np.array_equal(off.image, base.image)
    assert off.metrics.cache.cached_steps == 0


def test_three_run_check_first_block_cache(runner, tmp_path):
    runner.presets.user_dir = tmp_path
    runner.presets.add("fb", "cache_config: {backend: fbcache, residual_diff_threshold: 0.9}\n")
    base, on, off = _three_run(runner, "fb", None)
    assert "First-Block-Cache R0.9" in " ".join(on.metrics.labels.engaged)
    assert on.metrics.cache.cached_steps > 0
    # eager: the block hooks count, and First-Block-Cache's own per-call state says the same
    assert (
        on.metrics.cache.count_source == "block hooks" and on.metrics.cache.count_check == "agrees with fbcache state"
    )
    assert 20.0 < on.metrics.quality.psnr_db < math.inf
    assert np.array_equal(off.image, base.image)


def test_stack_applied_in_fixed_order_and_fullgraph_rule(runner):
    pipe, stack, _ = runner.manager.pipeline(runner.model, runner.presets.get("cache-int8-sage"), steps=12)
    assert stack.order == list(STACK_ORDER[:5]) == ["quantize", "offload", "cache", "attention", "compile"]
    assert STACK_ORDER[5] == "parallel"  # a parallel preset hands the pipeline to its workers last
    assert CompileSpec(enabled=True, fullgraph=True).effective_fullgraph(cache_engaged=True) is False
    assert CompileSpec(enabled=True).effective_fullgraph(cache_engaged=False) is True
    assert CompileSpec(enabled=True, fullgraph=False).effective_fullgraph(cache_engaged=False) is False


def test_switching_presets_reuses_or_reloads(runner):
    r = req()
    first = runner.generate(r, "base")
    tr0 = runner.manager.current.pipe.transformer
    cached = runner.generate(r, stack(runner, "cache", threshold=0.5))
    assert not cached.metrics.reloaded and runner.manager.current.pipe.transformer is tr0  # toggled in place
    q = runner.generate(r, stack(runner, "int8", compile=False))  # eager: auto runs the weight-only form
    tr1 = runner.manager.current.pipe.transformer
    assert q.metrics.reloaded and tr1 is not tr0 and quantized_mode(tr1) == "int8_weight_only"
    # (not compared: a compared cached click ends on base's weights, after its base run at fewer steps)
    q2 = runner.generate(r, stack(runner, "cache-int8", threshold=0.5, compile=False), compare="off")
    assert not q2.metrics.reloaded and runner.manager.current.pipe.transformer is tr1  # same INT8 weights
    back = runner.generate(r, "base")
    tr2 = runner.manager.current.pipe.transformer
    # the full-precision weights were kept beside the INT8 ones (two slots on the CPU): no reload on the way back
    assert not back.metrics.reloaded and tr2 is tr0 and quantized_mode(tr2) == "none"
    assert np.array_equal(back.image, first.image)
    assert 30.0 < q.metrics.quality.psnr_db < math.inf


def test_one_transformer_slot_reloads_and_never_runs_int8_as_base(runner):
    runner.manager.settings = replace(runner.manager.settings, transformer_slots=1)  # (STUDIO_TRANSFORMER_SLOTS=1)
    r = req()
    first = runner.generate(r, "base")
    tr0 = runner.manager.current.pipe.transformer
    runner.generate(r, stack(runner, "int8", compile=False), compare="off")  # (compared, it ends on base's weights)
    back = runner.generate(r, "base")
    tr2 = runner.manager.current.pipe.transformer
    assert back.metrics.reloaded and tr2 is not tr0 and quantized_mode(tr2) == "none"
    assert np.array_equal(back.image, first.image)


def test_int8_is_never_stacked_on_int8(runner):
    pipe, _, _ = runner.manager.pipeline(runner.model, runner.presets.get("int8"))
    lin = pipe.transformer.transformer_blocks[0].attn.to_q
    w_before = lin.weight
    here, cpu = runner.manager.profile, torch.device("cpu")
    again = apply_quant(pipe, runner.presets.get("int8").quant, here, cpu, compiled=True)  # the preset compiles
    assert again.engaged and "already applied" in again.detail and lin.weight is w_before
    form = stack_state(pipe.transformer).quantize.mode  # what auto picked for this CPU, compiled (test_quant_forms)
    assert form in ("int8_per_row", "int8_weight_only")
    other = "int8_weight_only" if form == "int8_per_row" else "int8_per_row"
    with pytest.raises(Invariant, match="already quantized"):  # the studio's bug if it happens: not a run failure
        apply_quant(pipe, QuantSpec(quant_type=other), here, cpu)
    assert stack_state(pipe.transformer).quantize.mode == form
    # embedders and the output head stay in full precision
    assert type(pipe.transformer.x_embedder.weight) is torch.nn.Parameter
    assert type(lin.weight) is not torch.nn.Parameter


def test_no_state_leaks_between_requests(runner):
    r = req()
    before = runner.generate(r, "base")
    a = runner.generate(r, stack(runner, "cache", threshold=0.5))
    b = runner.generate(r, stack(runner, "cache", threshold=0.5))
    assert np.array_equal(a.image, b.image)
    assert (
        a.metrics.cache.cached_step_indices == b.metrics.cache.cached_step_indices and a.metrics.cache.cached_steps > 0
    )
    other = runner.generate(req(seed=4), stack(runner, "cache", threshold=0.5))
    assert not np.array_equal(other.image, a.image)
    after = runner.generate(r, "base")
    assert np.array_equal(before.image, after.image)
    assert after.metrics.quality.psnr_db == math.inf and after.metrics.timing.speedup == 1.0


def test_cpu_fallbacks_say_why_and_match_base(runner):
    r = req()
    base = runner.generate(r, "base")
    sage = runner.generate(r, "sage")
    assert "sage: unavailable on cpu, using sdpa" not in sage.metrics.labels.engaged  # what runs is listed apart
    assert sage.metrics.labels.fallbacks == ["sage: unavailable on cpu, using sdpa"]
    assert np.array_equal(sage.image, base.image)
    full = runner.generate(r, stack(runner, "cache-int8-sage", compile=False))
    assert "sage: unavailable on cpu, using sdpa" in full.metrics.labels.fallbacks


def test_too_few_steps_runs_uncached_with_reason(runner):
    short = runner.generate(req(steps=6), stack(runner, "cache", threshold=0.5))
    assert short.metrics.cache.cached_steps == 0 and short.metrics.cache.full_steps == 6
    assert any("too few to gain" in line for line in short.metrics.labels.fallbacks)
    longer = runner.generate(req(steps=12), stack(runner, "cache", threshold=0.5))
    assert longer.metrics.cache.cached_steps > 0


def test_step_mask_static(runner, tmp_path):
    runner.presets.user_dir = tmp_path
    runner.presets.add(
        "masked", "cache_config: {compute_bins: [4, 1, 1], cache_bins: [2, 2, 10], steps_computation_policy: static}\n"
    )
    res = runner.generate(req(steps=10), "masked")
    assert res.metrics.cache.cached_step_indices == [4, 5, 7, 8]
    res16 = runner.generate(req(steps=16), "masked")  # the mask is re-sized per run
    assert res16.metrics.cache.full_steps + res16.metrics.cache.cached_steps == 16


def test_calibrators_run(runner, tmp_path):
    runner.presets.user_dir = tmp_path
    runner.presets.add("ts", "cache_config: {residual_diff_threshold: 0.5, enable_taylorseer: true}\n")
    runner.presets.add("dmd", "cache_config: {residual_diff_threshold: 0.5, enable_dmd: true}\n")
    for name in ("ts", "dmd"):
        res = runner.generate(req(), name)
        assert res.metrics.cache.cached_steps > 0, name
        assert res.metrics.quality.psnr_db > 15, (name, res.metrics.quality.psnr_db)


def test_failed_load_keeps_previous_model(runner, random_model_dir, tmp_path):
    r = req()
    good = runner.generate(r, "base")
    with pytest.raises(ModelLoadError, match="does not exist"):
        runner.generate(r, "base", model=str(tmp_path / "missing"))
    corrupt = tmp_path / "corrupt"
    shutil.copytree(random_model_dir, corrupt)
    (corrupt / "transformer" / "diffusion_pytorch_model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ModelLoadError, match="could not load model"):
        runner.manager.load(str(corrupt))
    with pytest.raises(ModelLoadError, match="offline"):
        runner.manager.load("someone/not-cached-model")
    assert runner.manager.current.source == random_model_dir
    again = runner.generate(r, "base")
    assert np.array_equal(again.image, good.image)


def test_unload_frees_the_pipeline(runner):
    import gc
    import weakref

    runner.generate(req(), stack(runner, "cache", threshold=0.5))
    ref = weakref.ref(runner.manager.current.pipe.transformer)
    runner.manager.unload()
    gc.collect()
    assert runner.manager.current is None and ref() is None


def test_bad_sizes_are_refused(runner):
    with pytest.raises(ValueError, match="not a multiple of 8"):  # a ConfigError, which is a ValueError
        runner.generate(req(width=60), "base")


def test_speedup_and_psnr_are_against_the_same_request(runner):
    r = req()
    runner.generate(r, "base")
    runner.pairing = replace(runner.pairing, cheap_pairs=1, max_extra_pairs=0)  # one pair: its ratio is the speed-up
    res = runner.generate(r, stack(runner, "cache", threshold=0.5))
    entry = runner.base_entry(r)
    m = res.metrics
    assert m.timing.base_denoise_s == entry.denoise_s and m.timing.timed_pairs == 1
    # the one estimator (studio.measure.estimate): the pair's base run over the stack's, each priced by its floor
    est = speedup(entry.runs, [Run.of(m.timing.step_ms, m.cache.cached_step_indices)])
    assert len(entry.runs) == 1
    if m.timing.speedup_note is None:
        assert m.timing.speedup == pytest.approx(est.point) and (
            m.timing.speedup_lo,
            m.timing.speedup_hi,
        ) == pytest.approx((est.lo, est.hi))
    else:  # a useless interval, or a reading over its ideal: no number, and why
        assert m.timing.speedup is None and m.timing.speedup_note.startswith(
            ("timing too noisy to show", "measurement error")
        )
    assert res.metrics.quality.psnr_db == pytest.approx(psnr(res.image, entry.image))
    assert len(res.metrics.timing.step_ms) == 12
    assert sum(res.metrics.timing.step_ms) / 1e3 == pytest.approx(res.metrics.timing.denoise_s, rel=1e-6)


def test_cli_generate_json(random_model_dir, tmp_path):
    out = tmp_path / "img.png"
    cmd = [
        sys.executable,
        "-m",
        "studio",
        "generate",
        "--model",
        random_model_dir,
        "--preset",
        "base",
        "--prompt",
        PROMPT,
        "--seed",
        "42",
        "--steps",
        "10",
        "--width",
        "64",
        "--height",
        "64",
        "--json",
        "--out",
        str(out),
    ]
    cfg = ["--true-cfg-scale", "2", "--negative-prompt", "green", "--dtype", "bfloat16"]  # the controls
    proc = subprocess.run(cmd + cfg, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    d = json.loads(proc.stdout)
    assert d["psnr_db"] == math.inf and d["speedup"] == 1.0 and d["full_steps"] == 10 and d["cached_steps"] == 0
    for key in ("denoise_s", "step_ms", "full_steps", "cached_steps", "speedup", "psnr_db", "ssim", "engaged"):
        assert key in d
    assert d["dtype"] == "bfloat16" and d["transformer_calls"] == 20  # two calls a step with true CFG
    assert (d["request"]["true_cfg_scale"], d["request"]["negative_prompt"]) == (2.0, "green")
    assert out.stat().st_size > 0
    cmd[cmd.index("base")] = "cache"
    proc = subprocess.run(cmd + ["--threshold", "0.5"], capture_output=True, text=True, timeout=300)
    d = json.loads(proc.stdout)
    assert d["cached_steps"] > 0 and 20 < d["psnr_db"] < math.inf
    # a speed-up with its interval, or none and why (studio.measure.estimate; or a reading over its ideal)
    if d["speedup"] is None:
        assert d["speedup_note"].startswith(("timing too noisy to show", "measurement error")), d["speedup_note"]
    else:
        assert d["speedup_lo"] <= d["speedup"] <= d["speedup_hi"] and d["timed_pairs"] >= 2 and d["pairs_stop"]
    bad = subprocess.run(cmd + ["--preset", "nope"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "preset 'nope' not found" in bad.stderr


def test_cache_spec_rejects_mask_on_fbcache():
    with pytest.raises(ValueError, match="need backend: cache-dit"):
        CacheSpec(backend="fbcache", steps_computation_mask="fast")


def test_unrecognised_pipeline_runs_uncached_with_reason(runner):
    """cache-dit only knows registered pipelines: an unknown one runs uncached, it never fails."""
    from diffusers import FluxPipeline

    from studio.engine.cache import apply_cache
    from studio.engine.call import call_pipe
    from studio.measure.timing import StepProbe, count_steps

    pipe, _, _ = runner.manager.pipeline(runner.model, runner.presets.get("base"), steps=12)
    mystery = type("MysteryDiTPipeline", (FluxPipeline,), {})
    pipe.__class__ = mystery
    try:
        eng = apply_cache(pipe, CacheSpec(backend="cache-dit", residual_diff_threshold=0.5), steps=12)
        assert not eng.engaged and eng.fell_back
        assert eng.detail.startswith("cache: transformer blocks not recognised by cache-dit")
        probe = StepProbe(stack_state(pipe.transformer).counter, torch.device("cpu"), total_steps=12)
        with probe:
            image = call_pipe(pipe, req(), probe)
        counts = count_steps(probe.steps, "none", None)
        assert image.shape == (64, 64, 3) and counts.cached_indices == [] and counts.full == 12
    finally:
        pipe.__class__ = FluxPipeline


@pytest.mark.timing
def test_base_timing_is_retaken_beside_each_cheap_run_and_kept_for_expensive_ones(runner):
    # every run counts as cheap, however loaded the machine; 3 pairs exactly (no extra ones on a busy machine)
    runner.pairing = replace(Pairing(), retime_under_s=1e9, max_extra_pairs=0)
    r = req()
    runner.generate(r, "base")
    entry = runner.base_entry(r)
    a = runner.generate(r, stack(runner, "cache", threshold=0.5))
    b = runner.generate(r, stack(runner, "cache", threshold=0.5))
    again = runner.base_entry(r)
    # cheap runs: a fresh, warm base timing right before each run, in the same call
    assert again.timed_at > entry.timed_at and np.array_equal(again.image, entry.image)
    assert a.metrics.timing.how == (
        "warm-up run done in this call, median of 3 timed runs interleaved with base; base timed warm right before, "
        "in this call"
    )  # (why the pairs stopped is the speed-up's: the card's vs base row, fmt.pairs)
    assert a.metrics.timing.timed_pairs == 3
    # what the speed-up divides: the two floor prices, each at most its side's median wall time
    m = a.metrics
    assert m.timing.denoise_priced_s <= m.timing.denoise_s and m.timing.base_priced_s <= m.timing.base_denoise_s
    if m.timing.speedup is not None:
        assert m.timing.speedup == pytest.approx(m.timing.base_priced_s / m.timing.denoise_priced_s, rel=1e-9)
    assert a.metrics.timing.pairs_stop in ("the interval is within ±5% of its point", "at most 3 pairs")
    assert (
        b.metrics.timing.base_denoise_s == again.denoise_s
        and 0 < b.metrics.timing.base_age_s < b.metrics.timing.total_s
    )  # this call
    # expensive runs (pretend: the bound is under this base's denoise time): kept while young, re-timed when old
    runner.pairing = replace(runner.pairing, retime_under_s=0.0)
    # (a kept base timed more than once may stand alone: the pairing's own rule, tested in test_honest.py)
    again = runner.base_entry(r)
    assert again.agreed and len(again.runs) >= 2
    c = runner.generate(r, stack(runner, "cache", threshold=0.5))
    assert runner.base_entry(r).timed_at == again.timed_at and "s before (kept)" in c.metrics.timing.how
    assert runner.pairing.reusable(again, now=again.timed_at + runner.pairing.max_age_s - 1)
    assert not runner.pairing.reusable(again, now=again.timed_at + runner.pairing.max_age_s + 1)


def test_a_caller_that_times_base_itself_gets_one_base_run_when_none_is_kept(runner):
    """The bench's seam: no pairing, and a missing base (another dtype, say) computed once, timed now, not later."""
    from studio.engine import CALLER_TIMES_BASE

    r = req()
    runner.pairing = replace(runner.pairing, retime_under_s=1e9)
    res = runner.generate(r, stack(runner, "cache", threshold=0.5), pairing=CALLER_TIMES_BASE)
    # (a stall that hit the run is the speed-up's fact: the card's vs base row, fmt.pairs)
    said = "warm-up run done in this call, 1 timed run; base timed warm right before, in this call"
    assert res.metrics.timing.how == said
    assert (
        0 < res.metrics.timing.base_age_s < res.metrics.timing.total_s
    )  # the base was timed in this call, not at -inf
    kept = runner.base_entry(r)
    again = runner.generate(r, stack(runner, "cache", threshold=0.5), pairing=CALLER_TIMES_BASE)
    assert runner.base_entry(r) is kept and "s before (kept)" in again.metrics.timing.how  # used as it is


def _transformer_calls(runner, r, preset, **kw):
    """Run one generate; (its result, transformer calls it made in all): base runs and warm-ups counted too."""
    calls = []

    def count(module, args):
        if type(module).__name__.endswith("Transformer2DModel"):
            calls.append(1)

    handle = torch.nn.modules.module.register_module_forward_pre_hook(count)
    try:
        return runner.generate(r, stack(runner, preset, threshold=0.5), **kw), len(calls)
    finally:
        handle.remove()


class _HalfSpeed:
    """Every transformer call made to take twice its own time, inside and outside its blocks alike (as a busy
    neighbour taking half the core would): each block's forward spins for as long as it ran (a wrapper, under the
    block clock's, which the engine installs later around whatever forward a block has, so it sees each block's share
    of it), and a hook on the transformer for the work outside the blocks. The waits spin: a sleep wakes late by a
    varying amount."""

    def __init__(self, transformer):
        self.began, self.in_blocks = [], []
        self.handles = [transformer.register_forward_pre_hook(self._call_began)]
        self.handles.append(transformer.register_forward_hook(self._call_ended))
        self.wrapped = []
        for block in block_list(transformer):
            self.wrapped.append((block, block.__dict__.get("forward")))
            block.forward = self._slowed(block.forward)

    @staticmethod
    def _spin(s):
        end = time.perf_counter() + s
        while time.perf_counter() < end:
            pass

    def _slowed(self, forward):
        def slowed(*args, **kwargs):
            t0 = time.perf_counter()
            out = forward(*args, **kwargs)
            took = time.perf_counter() - t0
            self._spin(took)
            self.in_blocks[-1] += 2 * took
            return out

        return slowed

    def _call_began(self, *_):
        self.in_blocks.append(0.0)
        self.began.append(time.perf_counter())

    def _call_ended(self, *_):
        self._spin(time.perf_counter() - self.began.pop() - self.in_blocks.pop())  # the work outside the blocks

    def remove(self):
        for h in self.handles:
            h.remove()
        for block, before in self.wrapped:
            if before is None:
                del block.forward
            else:
                block.forward = before


def _skip_if_crowded(timing, what: str) -> None:
    """Skip, with the watch's reading, where other programs held the cores through every try (the studio withholds
    then, rightly); anything else falls through to the test's assertion."""
    from studio.measure.crowding import CROWDED

    if timing.cores_taken is not None and timing.cores_taken >= CROWDED:
        pytest.skip(f"{what} in 3 tries: other programs held the cores ({timing.speedup_note})")


@pytest.mark.timing
def test_compare_auto_on_a_known_shape_runs_the_stack_once_and_no_base(runner):
    """once a shape's base timing is kept (its pairs agreed), a Generate in `auto` of another prompt of that
    shape is the stack's one run (counted, not timed); its base picture only where it is kept."""
    a, b = req(), req(prompt="an orange triangle on the left, black background")
    for _ in range(3):  # a pair spoilt by a stall keeps no shape timing: time again (at most 3 times)
        first = runner.generate(a, stack(runner, "cache", threshold=0.5), compare="on").metrics.timing
        if len(runner.shapes):
            break
    if not len(runner.shapes):
        _skip_if_crowded(first, "no base timing of the shape was kept")
    assert len(runner.shapes) == 1, "no base timing of the shape agreed in 3 tries"
    res, calls = _transformer_calls(runner, b, "cache", compare="auto")
    m = res.metrics
    assert calls == a.steps  # one run of the stack: no base run, no warm-up (this stack is warm at this shape)
    assert "base timed on a request of the same shape (prompt and seed aside)" in m.timing.how
    assert m.timing.base_denoise_s == runner.shapes.get(next(iter(runner.shapes._entries))).denoise_s
    assert res.base_image is None and m.quality.psnr_db is None and str(m.quality.verdict) == "not compared"
    for _ in range(3):  # a quiet reading of this request to hold the slowed one against (withheld: time base again)
        on = runner.generate(b, stack(runner, "cache", threshold=0.5), compare="on")  # "Compare with base"
        assert on.metrics.quality.psnr_db is not None and np.array_equal(on.image, res.image)
        again, calls = _transformer_calls(runner, b, "cache", compare="auto")  # now this request's picture is kept
        assert calls == a.steps and again.metrics.quality.psnr_db == on.metrics.quality.psnr_db
        if again.metrics.timing.speedup is not None:
            break
    quiet = again.metrics.timing.speedup
    if quiet is None:
        _skip_if_crowded(again.metrics.timing, "no quiet reading to hold a slowed one against")
    assert quiet is not None, again.metrics.timing.speedup_note
    # the machine slows down after the base timing was kept: every transformer call takes twice its own time (a
    # process beside it taking half the core, as load on a shared CPU does: a factor on the work, not a constant per
    # call). The stack's own full steps, now against beside that timing, say by how much, and the kept base timing is
    # scaled by it (studio.measure.estimate.by_shape): the speed-up stays where the quiet run of the same request put
    # it, while the kept base over this run's price alone would read about half. Or, if too noisy, no number, and why.
    half = _HalfSpeed(runner.manager.current.pipe.transformer)
    try:
        slow = runner.generate(b, stack(runner, "cache", threshold=0.5), compare="auto").metrics
    finally:
        half.remove()
    # the block clock sees the slowdown inside the blocks as the step does: the ideal stays where the quiet run put it
    assert abs(slow.ideal.ideal_speedup / again.metrics.ideal.ideal_speedup - 1) < 0.15, (
        slow.ideal.ideal_speedup,
        again.metrics,
    )
    if slow.timing.speedup is None:
        assert "compare on would help" in slow.timing.speedup_note, slow.timing.speedup_note
    else:  # the kept base floor over this run's floor price, unscaled: what scaling by the run's own steps corrects
        kept = runner.shapes.get(next(iter(runner.shapes._entries)))
        naive = (
            len(kept.step_ms)
            * min(kept.step_ms)
            / price_ms([Run.of(slow.timing.step_ms, slow.cache.cached_step_indices)])
        )
        assert naive < 0.75 * slow.timing.speedup, (naive, slow.timing.speedup)  # the slowdown is there, and taken out
        assert abs(slow.timing.speedup / quiet - 1) < 0.15, (slow.timing.speedup, quiet)
    # another shape (fewer steps) is not known: auto pairs base beside the run, as `on` does
    _, calls = _transformer_calls(runner, req(steps=8), "cache", compare="auto")
    assert calls >= 2 * 8  # a base run beside the stack's (one pair here)
    _, calls = _transformer_calls(runner, b, "cache", compare="off")
    assert calls == a.steps
    with pytest.raises(ConfigError, match="request.compare"):
        runner.generate(b, "cache", compare="sometimes")


def test_every_stack_warms_up_once_per_shape_untimed(runner):
    runner.pairing = replace(Pairing(), retime_under_s=1e9, max_extra_pairs=0)  # cheap, 3 pairs exactly
    r = req()
    first = runner.generate(r, "base")
    assert first.metrics.timing.warmup_s is not None and first.metrics.timing.how.startswith(
        "warm-up run done in this call"
    )
    cached = runner.generate(
        r, stack(runner, "cache", threshold=0.5)
    )  # 3 timed pairs: the call's warm-up is still shown
    assert cached.metrics.timing.warmup_s is not None and cached.metrics.timing.how.startswith(
        "warm-up run done in this call"
    )
    second = runner.generate(r, "base")
    assert second.metrics.timing.warmup_s is None and second.metrics.timing.how.startswith("warm-up run done earlier")
    # a cheap base is timed as it is beside any other stack: the median of 3 runs, not one lone run
    assert second.metrics.timing.how == "warm-up run done earlier, median of 3 timed runs"
    bigger = runner.generate(req(width=80, height=80), "base")
    assert bigger.metrics.timing.warmup_s is not None  # a new shape is a new warm-up


def test_warm_up_runs_each_stack_once_untimed(runner):
    r = req()
    first = runner.warm_up(r, ["base", "cache"])
    assert len(first) == 2 and all(t > 0 for t in first)
    assert runner.warm_up(r, ["base", "cache"]) == [0.0, 0.0]  # already warm: nothing runs
    assert runner.generate(r, "base").metrics.timing.warmup_s is None


def test_a_public_manager_loads_only_its_allow_list(random_model_dir):
    from studio.engine import ModelManager

    m = ModelManager("cpu", settings=current(), allowed=["tiny"])
    with pytest.raises(ModelLoadError, match=r"is not served here; this studio serves: tiny"):
        m.load(random_model_dir)  # a valid pipeline folder, but not on the operator's list
    with pytest.raises(ModelLoadError, match="not served here"):
        m.load("someone/some-model")
    assert m.current is None
    ok = ModelManager("cpu", settings=current(), allowed=[random_model_dir])
    assert ok.load(random_model_dir).source == random_model_dir
    ok.unload()


def test_a_failure_inside_the_pipeline_is_one_sentence_and_changes_nothing(runner):
    from studio.engine import RunError

    r = req()
    before = runner.generate(r, stack(runner, "cache", threshold=0.5))
    tr = runner.manager.current.pipe.transformer

    def oom(module, args):
        raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB\nlong internal details")

    handle = tr.register_forward_pre_hook(oom)
    try:
        with pytest.raises(RunError) as e:
            runner.generate(r, stack(runner, "cache", threshold=0.5))
    finally:
        handle.remove()
    assert str(e.value).startswith("the run failed inside the pipeline (RuntimeError: CUDA out of memory.")
    assert "\n" not in str(e.value)
    free = []  # the device lock was let go on the way out: another thread can take it

    def take():
        free.append(runner.manager.lock.acquire(timeout=5))
        if free[-1]:
            runner.manager.lock.release()

    t = threading.Thread(target=take)
    t.start()
    t.join()
    assert free == [True]
    after = runner.generate(r, stack(runner, "cache", threshold=0.5))
    assert np.array_equal(after.image, before.image)
    assert after.metrics.cache.cached_step_indices == before.metrics.cache.cached_step_indices


def test_a_compile_that_fails_on_its_first_run_falls_back_to_eager_with_the_reason(runner, monkeypatch):
    import studio.engine.compile as comp

    def broken(tr, spec, kwargs):
        impls, whole = real(tr, spec, kwargs)

        def fail(*a, **k):
            raise RuntimeError("InductorError: C++ compile error\n<details>")

        return [(m, attr, fail, eager) for m, attr, _, eager in impls], whole

    real = comp._compile_impls
    monkeypatch.setattr(comp, "_compile_impls", broken)
    r = req()
    eager = runner.generate(r, stack(runner, "cache", threshold=0.5))
    res = runner.generate(r, stack(runner, "cache-compile", threshold=0.5))
    line = "compile: failed on its first run (RuntimeError: InductorError: C++ compile error), running eager"
    assert res.metrics.labels.fallbacks == [line] and res.metrics.timing.compile_s is None
    assert np.array_equal(res.image, eager.image)  # it ran the eager stack, and says so
    again = runner.generate(r, stack(runner, "cache-compile", threshold=0.5))
    assert again.metrics.labels.fallbacks == [line]  # not retried on every click


def test_a_first_run_that_fails_eagerly_too_is_not_blamed_on_compile(runner, monkeypatch):
    """An error the eager run repeats (here: every cached call fails) is the run's, not compile's: it ends the request
    with its sentence and the compiled variant stays, to be tried again once the cause is gone."""
    import studio.engine.run as run
    from studio.engine import RunError

    r = req()
    runner.generate(r, stack(runner, "cache", threshold=0.5))
    real = run.call_pipe

    def broken(pipe, request, probe=None):
        if stack_state(pipe.transformer).step_cache.backend != "none":  # base (uncached) runs; every cached call fails
            raise MemoryError("pretend: out of memory")
        return real(pipe, request, probe)

    monkeypatch.setattr(run, "call_pipe", broken)
    with pytest.raises(RunError, match="MemoryError: pretend: out of memory"):
        runner.generate(r, stack(runner, "cache-compile", threshold=0.5))
    monkeypatch.setattr(run, "call_pipe", real)
    ok = runner.generate(r, stack(runner, "cache-compile", threshold=0.5))
    assert ok.metrics.labels.fallbacks == [] and ok.metrics.timing.compile_s is not None


def test_a_bug_inside_a_run_stays_a_bug_and_is_logged_with_its_traceback(runner, monkeypatch, caplog):
    """Only the failures the studio can name (spec.errors.RUN_FAILURES) become a user's sentence: a TypeError of the
    studio's own reaches the device call's one boundary, which logs its traceback and says StudioBug."""
    import studio.engine.run as run
    from studio.spec.errors import RunError, StudioBug, is_run_failure
    from studio.worker.service import InProcess

    assert is_run_failure(RuntimeError("CUDA out of memory")) and is_run_failure(MemoryError())
    assert not any(is_run_failure(e) for e in (TypeError("x"), KeyError("x"), ValueError("x"), AttributeError("x")))

    def buggy(pipe, request, probe=None):
        return len(None)  # a studio bug: TypeError

    monkeypatch.setattr(run, "call_pipe", buggy)
    with pytest.raises(TypeError):  # not turned into a RunError on the way out of the runner
        runner.generate(req(), "base", compare=False)
    device = InProcess(runner)
    with caplog.at_level("ERROR", logger="studio.worker"), pytest.raises(StudioBug) as e:
        device.generate(req(), "base", compare=False)
    assert str(e.value).startswith("a bug in the studio (logged): TypeError: object of type 'NoneType' has no len()")
    assert isinstance(e.value, RunError) and any(r.exc_info and r.exc_info[0] is TypeError for r in caplog.records)


def test_operator_caps_refuse_with_a_sentence_before_any_model_work(runner):
    runner.max_steps, runner.max_side = 10, 64
    with pytest.raises(ValueError, match="steps 12 is over this studio's limit of 10"):
        runner.generate(req(), "base")
    with pytest.raises(ValueError, match="width 80 is over this studio's limit of 64"):
        runner.generate(req(steps=10, width=80), "base")
    assert runner.generate(req(steps=10), "base").metrics.cache.full_steps == 10


def test_a_prompt_past_the_text_window_says_what_was_dropped(runner):
    long = " ".join(["a red circle in the center, blue background"] * 6)  # ~50 T5 tokens; the profile reads 32
    res = runner.generate(req(prompt=long), "base")
    line = next(x for x in res.metrics.labels.engaged if x.startswith("prompt: "))
    n = int(line.split()[1])
    assert n > 32 and line == f"prompt: {n} tokens, the model reads 32; the rest was dropped"
    assert not any(x.startswith("prompt: ") for x in runner.generate(req(), "base").metrics.labels.engaged)


def test_a_preset_corrupted_on_disk_is_refused_by_name_and_the_others_work(runner, tmp_path):
    runner.presets.user_dir = tmp_path
    runner.presets.add("mine", "cache_config: {residual_diff_threshold: 0.5}\n")
    r = req()
    good = runner.generate(r, "mine")
    (tmp_path / "mine.yaml").write_text("cache_config: {residual_diff_threshold: [0.5\n")  # cut off mid-write
    with pytest.raises(ValueError, match=r"mine.yaml: not valid YAML"):
        runner.generate(r, "mine")
    assert runner.generate(r, stack(runner, "cache", threshold=0.5)).metrics.cache.cached_step_indices == (
        good.metrics.cache.cached_step_indices
    )
    assert "mine" in runner.presets.names()  # still listed, so the user sees which one to fix


def test_a_backend_that_fails_its_first_forward_falls_back_with_the_reason(runner, monkeypatch):
    import studio.engine.attention as attn

    def probe_fails(backend, device, dtype):
        raise RuntimeError("No viable backend for scaled_dot_product_attention")

    monkeypatch.setattr(attn, "_probe", probe_fails)
    monkeypatch.setattr(attn, "unavailable_reason", lambda backend, device: None)  # as if listed and installed
    r = req()
    base = runner.generate(r, "base")
    sage = runner.generate(r, "sage")
    assert sage.metrics.labels.fallbacks == [
        "sage: failed a test call (RuntimeError: No viable backend for scaled_dot_product_attention), using sdpa"
    ]
    assert np.array_equal(sage.image, base.image)


def test_a_request_over_its_time_limit_stops_between_steps_and_the_next_runs_as_before(runner):
    """A public studio's limit per request (app.limits request_s, STUDIO_MAX_REQUEST_S): the device call stops
    between two denoising steps once it has run that long, with a sentence naming where; the stack, its cache and the
    kept base pictures are as they were, so the next request gets the pixels it got before. Through the device
    service (what the worker serves), over one image and over a Matrix."""
    from studio.spec.errors import OverTime
    from studio.worker.service import InProcess

    dev = InProcess(runner)
    req = runner.request(PROMPT, steps=10)
    before = dev.generate(req, "cache", compare="off")  # warms the stack up at this shape

    def slow(i, total, rec):  # the 3rd step's progress takes 1.5 s: the check after the 4th step stops it
        if i == 2:
            time.sleep(1.5)

    with pytest.raises(OverTime, match=r"limit of 1 s per request and was stopped after step 4 of 10 of cache;"):
        dev.generate(req, "cache", compare="off", progress=slow, time_limit_s=1)
    assert runner.deadline is None  # the limit was the request's own
    after = dev.generate(req, "cache", compare="off")
    assert np.array_equal(after.image, before.image)
    assert after.metrics.cache.cached_step_indices == before.metrics.cache.cached_step_indices
    with pytest.raises(OverTime, match=r"limit of 0\.001 s per request and was stopped (before|after)"):
        dev.matrix(req, ["base", "cache"], repeats=1, time_limit_s=0.001)
    assert (
        dev.generate(req, "cache", compare="off").metrics.cache.cached_step_indices
        == before.metrics.cache.cached_step_indices
    )


def test_true_cfg_and_a_negative_prompt_run_two_calls_a_step_and_scale_one_turns_it_off(runner):
    """the request's true-CFG scale and negative prompt reach the pipeline (FLUX takes them too): above 1
    each step calls the transformer twice, under the cache as well (its CFG branches cached apart), and the card says
    so; 1 is off, the same picture as a request that never named it; the negative prompt changes the picture."""
    from studio.report.card import metrics_card

    req = runner.request(PROMPT, steps=8)
    plain = runner.generate(req, "cache", compare="off")
    off = runner.generate(replace(req, true_cfg_scale=1.0), "cache", compare="off")
    assert plain.metrics.cache.transformer_calls == off.metrics.cache.transformer_calls == 8
    assert np.array_equal(plain.image, off.image) and not any("true CFG" in x for x in off.metrics.labels.engaged)
    cfg = runner.generate(replace(req, true_cfg_scale=3.0, negative_prompt="green"), "cache")
    m = cfg.metrics
    assert m.cache.transformer_calls == 16 and m.cache.cached_steps + m.cache.full_steps == 8
    line = 'true CFG 3, negative prompt "green": 2 transformer calls per step'
    assert (
        line in m.labels.engaged
        and html.escape(line) in metrics_card(m)
        and any("CFG branches cached apart" in x for x in m.labels.engaged)
    )
    assert m.quality.psnr_db is not None and m.quality.psnr_db > 20  # against the base run of the same CFG request
    other = runner.generate(replace(req, true_cfg_scale=3.0, negative_prompt="red"), "cache", compare="off")
    assert not np.array_equal(other.image, cfg.image)  # the negative prompt is read


def test_a_batch_under_the_cache_is_its_single_runs_each_picture_judged_and_the_next_request_as_alone(tiny_runner):
    """a batch of 2 under `cache` on the embedded model. Picture i starts from seed + i's noise, so each
    picture is its own one-picture cached run (measured 86 dB and identical) and not its neighbour's (25.6 dB: the
    class of bug where a batch's pictures are mixed); each is judged against the same batch's base picture; one
    batched call's steps and counts; the next single request gets bitwise the picture it got alone."""
    from studio.measure.quality import split_batch
    from studio.report.card import metrics_card

    r = tiny_runner
    req = r.request(PROMPT, seed=42, steps=10)
    singles = [r.generate(replace(req, seed=s), "cache", compare="off").image for s in (42, 43)]
    one_pair = replace(r.pairing, cheap_pairs=1, max_extra_pairs=0)  # the pictures are the point here, not the time
    both = r.generate(replace(req, num_images_per_prompt=2), "cache", pairing=one_pair)
    m = both.metrics
    assert (
        both.image.shape == (128, 64, 3)
        and m.cache.transformer_calls == 10
        and m.cache.cached_steps + m.cache.full_steps == 10
    )
    assert m.cache.cached_steps > 0
    pics = split_batch(both.image, 2)
    for i, own in enumerate(singles):
        other = singles[1 - i]
        assert psnr(pics[i], own) >= 40 and psnr(pics[i], own) > psnr(pics[i], other) + 10
    assert [b["seed"] for b in m.quality.batch] == [42, 43] and all(b["psnr_db"] >= 35 for b in m.quality.batch)
    assert m.quality.psnr_db >= min(
        b["psnr_db"] for b in m.quality.batch
    ) and "2 pictures in one call (seed 42: " in metrics_card(m)
    bases = split_batch(both.base_image, 2)  # the base batch: each picture is the base of its seed
    assert all(psnr(pics[i], bases[i]) == m.quality.batch[i]["psnr_db"] for i in range(2))
    assert np.array_equal(r.generate(replace(req, seed=42), "cache", compare="off").image, singles[0])
    with pytest.raises(ConfigError, match="num_images_per_prompt"):
        replace(req, num_images_per_prompt=5)


def test_img2img_and_inpaint_count_the_steps_that_run_keep_their_cache_apart_and_leave_text2img_as_alone(tiny_runner):
    """Image inputs on the embedded model under `cache`: img2img at strength 0.5 of 28 steps runs and
    counts 14 (cached + full = 14, cache-dit's own list agreeing); the cache runs in the img2img pipeline's own
    context (engine.tasks: made with from_pipe, the same weights), so the same request again is the same picture and
    a text-to-image request after it is bitwise the picture it gets alone; inpaint likewise; PSNR against base on the
    same inputs."""
    r = tiny_runner
    t2i = r.request(PROMPT, seed=42, steps=28)
    alone = r.generate(t2i, "cache", compare="off")
    i2i = replace(t2i, prompt="a green square on the left, yellow background", image=alone.image, strength=0.5)
    assert (i2i.task, i2i.executed_steps) == ("img2img", 14)
    first = r.generate(i2i, "cache", pairing=replace(r.pairing, cheap_pairs=1, max_extra_pairs=0))
    m = first.metrics
    assert m.cache.cached_steps + m.cache.full_steps == 14 and len(m.timing.step_ms) == 14 and m.cache.cached_steps > 0
    assert m.cache.count_check.startswith("agrees") and max(m.cache.cached_step_indices) < 14
    assert m.quality.psnr_db >= 30 and m.request["image"].startswith("64x64 sha1:")  # base on the same picture
    assert f"{m.cache.cached_steps} cached / {m.cache.full_steps} full (14 of 28 steps)" in answer_line(m)
    again = r.generate(i2i, "cache", compare="off")
    assert (
        np.array_equal(again.image, first.image)
        and again.metrics.cache.cached_step_indices == m.cache.cached_step_indices
    )
    assert np.array_equal(r.generate(t2i, "cache", compare="off").image, alone.image)
    mask = np.zeros((64, 64), np.uint8)
    mask[:, :32] = 255
    inp = r.generate(replace(i2i, mask_image=mask, strength=0.8), "cache", compare="off").metrics
    assert inp.cache.cached_steps + inp.cache.full_steps == 23 and inp.cache.count_check.startswith(
        "agrees"
    )  # 28 - int(28 - 22.4)
    assert np.array_equal(r.generate(t2i, "cache", compare="off").image, alone.image)
    with pytest.raises(ConfigError, match="a mask needs an input picture"):
        replace(t2i, mask_image=mask)
    with pytest.raises(ConfigError, match="strength is read with an input picture"):
        replace(t2i, strength=0.5)


def test_a_lora_changes_the_picture_composes_with_the_cache_and_switching_reloads_nothing(
    tiny_runner, tiny_lora, make_lora
):
    """a LoRA on the request (diffusers load_lora_weights, peft): the picture changes against no LoRA; under
    `cache` its counts agree with cache-dit's own list and its PSNR is against base with the same LoRA; a request
    without it afterwards is bitwise the picture without it (the base weights as they were, nothing reloaded); on
    INT8 it is refused with the reason, before any model work (under compile: tests/test_compile.py)."""
    from studio.spec.request import LoraSpec

    r = tiny_runner
    req = r.request(PROMPT, seed=42, steps=12)
    plain = r.generate(req, "cache", compare="off")
    lora = replace(req, loras=(LoraSpec(tiny_lora, 1.0),))
    with_lora = r.generate(lora, "cache", pairing=replace(r.pairing, cheap_pairs=1, max_extra_pairs=0))
    m = with_lora.metrics
    assert psnr(with_lora.image, plain.image) < 35  # the adapter is read
    assert m.cache.count_check.startswith("agrees") and m.cache.cached_steps + m.cache.full_steps == 12
    assert m.quality.psnr_db >= 30 and m.request["loras"] == f"{tiny_lora}@1"  # against base with the same LoRA
    assert any(x.startswith(f"lora: {tiny_lora} at 1 ") for x in m.labels.engaged) and not m.reloaded
    half = r.generate(replace(req, loras=(LoraSpec(tiny_lora, 0.5),)), "cache", compare="off").image
    assert psnr(half, plain.image) > psnr(with_lora.image, plain.image)  # the scale is read
    after = r.generate(req, "cache", compare="off")
    assert np.array_equal(after.image, plain.image) and not after.metrics.reloaded
    with pytest.raises(ConfigError, match="request.loras: preset 'int8' runs on quantized weights"):
        r.generate(lora, "int8", compare="off")
    with pytest.raises(ConfigError, match="could not be loaded as a LoRA"):
        r.generate(replace(req, loras=(LoraSpec("/nonexistent/lora.safetensors"),)), "base", compare="off")
    # a LoRA the slot cannot take (other layers): refused, every slot dropped, and the next request loads again
    other = make_lora(seed=2, rank=4, targets=("to_out.0",))
    assert np.array_equal(r.generate(lora, "cache", compare="off").image, with_lora.image)  # A in slot 0 again
    with pytest.raises(ConfigError, match="hot-swapped into slot lora0 .*unexpected keys"):
        r.generate(replace(req, loras=(LoraSpec(other),)), "cache", compare="off")
    assert np.array_equal(r.generate(lora, "cache", compare="off").image, with_lora.image)
    assert np.array_equal(r.generate(req, "cache", compare="off").image, plain.image)


def test_a_presets_lora_is_fused_before_int8_and_its_base_image_has_it(tiny_runner, tiny_lora, tiny_lora_b, tmp_path):
    """a preset's own `loras` run on every request of it, and its base image has them too (PSNR measures
    the stack, not the LoRA). On a quantized preset they are fused into fresh weights before INT8 (fuse_lora,
    unload_lora_weights, then torchao); a request's other LoRA on it is refused with the way out."""
    from studio.spec.request import LoraSpec

    r = tiny_runner
    r.presets.user_dir = tmp_path
    r.presets.add("int8-lora", f"quantize_config: {{quant_type: int8_weight_only}}\nloras: [{{path: {tiny_lora}}}]\n")
    req = r.request(PROMPT, seed=42, steps=12)
    res = r.generate(req, "int8-lora", pairing=replace(r.pairing, cheap_pairs=1, max_extra_pairs=0))
    m = res.metrics
    assert m.request["loras"] == f"{tiny_lora}@1"  # the preset's LoRA is on the request: base ran with it
    assert f"lora: {tiny_lora} at 1 (diffusers load_lora_weights, fused into the weights before quantization)" in (
        m.labels.engaged
    )
    assert any(x.startswith("quantize: torchao int8_weight_only") for x in m.labels.engaged)
    with_lora = r.generate(replace(req, loras=(LoraSpec(tiny_lora),)), "base", compare="off").image
    plain = r.generate(req, "base", compare="off").image
    assert np.array_equal(res.base_image, with_lora)  # its base is base with the LoRA, as an adapter
    assert (
        m.quality.psnr_db >= 30 and psnr(res.image, with_lora) > psnr(res.image, plain) + 3
    )  # the fused LoRA is read
    with pytest.raises(ConfigError, match="name it in the preset's `loras`"):
        r.generate(replace(req, loras=(LoraSpec(tiny_lora_b),)), "int8-lora", compare="off")


def test_a_lora_file_a_slot_cannot_take_is_refused_before_loading(tmp_path):
    """Read from a local .safetensors file before any load: text-encoder weights (only the transformer's hot-swap),
    and a rank over the slots' (STUDIO_LORA_RANK)."""
    import torch
    from safetensors.torch import save_file

    from studio.engine.lora import _check_file

    te = tmp_path / "te.safetensors"
    save_file({"text_encoder.layers.0.q_proj.lora_A.weight": torch.zeros(4, 8)}, str(te))
    with pytest.raises(ConfigError, match="has text-encoder weights .*only transformer LoRAs run here"):
        _check_file(str(te), 64)
    big = tmp_path / "big.safetensors"
    save_file({"transformer.blocks.0.attn.to_q.lora_A.weight": torch.zeros(96, 8)}, str(big))
    with pytest.raises(ConfigError, match="has rank 96, over the LoRA slots' 64: set STUDIO_LORA_RANK"):
        _check_file(str(big), 64)  # the slots' rank (the lora_rank setting, STUDIO_LORA_RANK)
    _check_file(str(big), 128)  # within the slots' rank now


def test_a_weight_set_that_fails_to_load_leaves_the_weights_in_use_as_they_were(random_model_dir, tmp_path):
    """Issue 57: with one slot the weights in use leave it (and the device) to make room; a load that then fails
    (here a weights file that is not one; on a card, out of memory) puts them back: the error says the weights in use
    are as they were, and it is true: the next request runs on them without a reload (it raised KeyError until a
    restart, then reloaded)."""
    import shutil

    from studio.engine import ModelManager, Runner
    from studio.spec import PresetLibrary

    folder = tmp_path / "m"
    shutil.copytree(random_model_dir, folder)
    r = Runner(
        ModelManager("cpu", settings=replace(current(), transformer_slots=1)), PresetLibrary(), model=str(folder)
    )
    req = r.request("a red circle", steps=4)
    base = r.generate(req, "base", compare="off").image
    tr0, active = r.manager.current.pipe.transformer, r.manager.current.active
    weights = next((folder / "transformer").glob("*.safetensors"))
    saved = weights.read_bytes()
    weights.write_bytes(b"not a safetensors file")
    try:
        with pytest.raises(
            ModelLoadError, match="could not reload transformer .*; the weights in use are as they were"
        ):
            r.generate(req, "int8", compare="off")
    finally:
        weights.write_bytes(saved)
    try:
        cur = r.manager.current
        assert cur.active == active and list(cur.variants) == [active] and cur.pipe.transformer is tr0
        again = r.generate(req, "base", compare="off")
        assert np.array_equal(again.image, base) and not again.metrics.reloaded  # as it was: nothing reloaded
        q = r.generate(req, "int8", compare="off").metrics
        assert q.reloaded and any(line.startswith("quantize:") for line in q.labels.engaged), q.labels.engaged
        assert list(r.manager.current.variants) == [r.manager.current.active]  # one slot: base's weights went
    finally:
        r.manager.unload()


def test_a_device_that_holds_both_weight_sets_keeps_base_beside_int8_and_one_that_does_not_lets_it_go(runner):
    """Issue 57: a compared click of an 8-bit stack alternates base and the stack; where the device holds both
    weight sets (here a budget of the pipeline, the 8-bit set and its activations), base's stay beside the 8-bit
    ones and nothing reloads on the way back; where it holds one, base's leave for the 8-bit ones, sized in their own
    form before they load (from the configs: 8-bit rows), and come back by a reload."""
    from studio.engine.placement import GIB, device_bytes, margin_bytes
    from studio.engine.sizes import device_bytes_of, incoming_sizes, sizes_of_pipe

    r, m, int8 = req(), runner.manager, stack(runner, "int8", compile=False)
    runner.generate(r, "base", compare="off")
    pipe = m.current.pipe
    pipe_bytes, tr_bytes = device_bytes(pipe, m.device), device_bytes_of(pipe.transformer, m.device)
    margin = margin_bytes(sizes_of_pipe(pipe), m.current.source, m.current.dtype.torch.itemsize, m.device)[0]
    runner.generate(r, int8, compare="off")  # unbounded: its key and its bytes as loaded
    key8, q_bytes = m.current.active, device_bytes_of(m.current.pipe.transformer, m.device)
    m.unload()
    runner.generate(r, "base", compare="off")
    est = incoming_sizes(m.current, key8).components["transformer"]
    assert q_bytes < tr_bytes and abs(est - q_bytes) <= 0.2 * q_bytes  # smaller, and sized so before it loads
    before = m.settings
    try:
        m.settings = replace(before, device_memory_gb=(pipe_bytes + est + margin + 2**20) / GIB)  # holds both
        runner.generate(r, int8, compare="off")
        back = runner.generate(r, "base", compare="off")
        assert not back.metrics.reloaded and len(m.current.variants) == 2
        m.unload()
        m.settings = replace(before, device_memory_gb=(pipe_bytes + margin + est // 2) / GIB)  # one at a time
        runner.generate(r, "base", compare="off")
        runner.generate(r, int8, compare="off")
        assert list(m.current.variants) == [key8]  # base's weights left for the 8-bit ones
        assert runner.generate(r, "base", compare="off").metrics.reloaded
    finally:
        m.settings = before


def test_a_compared_8bit_click_loads_each_weight_set_once_where_the_device_holds_one(runner):
    """Issue 57: B S B S over an 8-bit stack on a device that holds one weight set loads a set at every run (6 loads
    for a cheap base's 3 pairs). There the stack's runs come first (its weights are in use), then base's as many:
    each set loads once a click, the card says the order, and the click ends on base's weights, so a base click after
    it loads nothing. Where the device holds both, B S B S as before, and nothing loads once both are in."""
    from studio.engine.baseline import ONE_SET, TIGHT_PCT

    m, r, int8 = runner.manager, req(), stack(runner, "int8", compile=False)
    loads, load = [], m._load_transformer

    def counted(cur, dtype, resident):
        loads.append(m.current.active)
        return load(cur, dtype, resident)

    before, pairing = m.settings, runner.pairing
    m._load_transformer, runner.pairing = counted, replace(Pairing(), max_extra_pairs=0)  # the app's 3 cheap pairs
    try:
        m.settings = replace(before, transformer_slots=1)  # (STUDIO_TRANSFORMER_SLOTS=1: a card that holds one)
        runner.generate(r, "base", compare="off")
        assert not m.holds_both(int8, runner.base_preset(m.current.dtype.name, int8))
        tight = f"the interval is within ±{TIGHT_PCT}% of its point"
        crowded = "other programs hold the cores (more pairs would not show a number)"  # (the other test worker)
        for n, prompt in enumerate((PROMPT, "a green triangle on grey")):
            loads.clear()
            t = runner.generate(replace(r, prompt=prompt), int8, compare="on").metrics.timing
            assert len(loads) == 2, (n, loads)  # the 8-bit set, then base's: once each
            assert t.timed_pairs == 3 and t.pairs_stop in (ONE_SET, tight, crowded), t.pairs_stop
            assert "then base's as many (the device holds one weight set at a time" in t.how
            assert "base timed warm right after, in this call" in t.how and "interleaved" not in t.how
            assert quantized_mode(m.current.pipe.transformer) == "none"  # it ended on base's weights
        loads.clear()
        assert not runner.generate(r, "base", compare="off").metrics.reloaded and loads == []
        # a cached 8-bit click's fewer-steps line is a base run too: on base's weights, it loads nothing more
        cached = runner.generate(r, stack(runner, "cache-int8", threshold=0.5, compile=False), compare="on").metrics
        assert len(loads) == 2 and cached.cache.cached_steps > 0, loads
        sp = cached.timing.speedup
        assert (cached.quality.vs_fewer is not None) == (sp is not None and sp > 1.0), (sp, cached.timing.speedup_note)
        m.settings = replace(before, transformer_slots=2)  # holds both: interleaved, nothing loads once both are in
        runner.generate(r, int8, compare="off")
        loads.clear()
        t = runner.generate(replace(r, seed=4), int8, compare="on").metrics.timing
        assert loads == [] and "base timed warm right before" in t.how and "then base's" not in t.how
        assert t.timed_pairs == 1 or "interleaved with base" in t.how  # (one pair where the cores were crowded)
    finally:
        m._load_transformer, runner.pairing = load, pairing
        m.settings = before
