"""The benches' doors into the engine: cache-dit on a bare transformer through engine.cache (the regimes' loop), and
the one transformer-call clock (studio.measure.clock)."""

from __future__ import annotations

import pytest
import torch

from lab.regimes import table as rg
from lab.regimes.kernels import _flux_inputs
from studio.engine.cache import BareTransformer, apply_cache, prepare_run, read_report
from studio.engine.state import stack_state
from studio.measure import clock as clk
from studio.spec.preset import CacheSpec

STEPS = 10
# A static mask (regimes' reference cache sized to 10 steps: 1111 000 1 00) and a residual threshold random weights
# cross (their diffs are 0.3-0.4 here): with MC3 both cache [4, 5, 6, 8, 9].
SPECS = {"mask": rg.cache_spec(STEPS), "threshold": CacheSpec(backend="cache-dit", residual_diff_threshold=0.5)}


def _run(bare, bench) -> list[int]:
    """One denoising loop of STEPS calls; the steps whose last block did not run, by the studio's block hook."""
    counter, skipped = stack_state(bare.transformer).counter, []
    inputs = _flux_inputs(bench.transformer, bench.tokens, bench.text, bench.device, bench.dtype)
    with torch.inference_mode():
        for i in range(STEPS):
            calls, runs, _ = counter.snapshot()
            inputs["timestep"] = torch.full((1,), 1.0 - i / STEPS)
            out = bare.transformer(**inputs)[0]
            inputs["hidden_states"] = inputs["hidden_states"] - out / STEPS
            if counter.runs - runs < counter.calls - calls:
                skipped.append(i)
    return skipped


@pytest.mark.parametrize("kind", list(SPECS))
def test_apply_cache_on_a_bare_transformer_counts_as_cache_dits_list_run_after_run(kind):
    spec, bench = SPECS[kind], rg.make_bench("small", STEPS, None, "cpu")
    bare = BareTransformer(rg._build(bench))
    engaged = apply_cache(bare, spec, steps=STEPS)
    assert engaged.engaged and stack_state(bare.transformer).step_cache.backend == "cache-dit", engaged
    runs = []
    for _ in range(2):
        prepare_run(bare, spec, quant="none", steps=STEPS)  # a bare transformer keeps one context: a fresh one
        hooks = _run(bare, bench)
        listed = read_report(bare, spec, "none").cached_steps
        assert hooks == listed, (kind, hooks, listed)
        runs.append(listed)
    assert runs[0] == runs[1] == [4, 5, 6, 8, 9], runs
    # What the refresh prevents: without it the context goes on counting from the last run's step 10
    hooks = _run(bare, bench)
    listed = read_report(bare, spec, "none").cached_steps
    assert hooks != listed or max(listed) >= STEPS, (kind, hooks, listed)


def test_the_clock_times_each_call_between_two_syncs(monkeypatch):
    events = []
    monkeypatch.setattr(clk, "sync", lambda device: events.append("sync"))

    def call(x):
        events.append("call")
        return x @ x

    clock = clk.CallClock(torch.device("cpu"))
    x = torch.randn(64, 64)
    outs = [clock.call(call, x) for _ in range(5)]
    assert len(clock.ms) == 5 and all(t > 0 for t in clock.ms), clock.ms
    assert events == ["sync", "call", "sync"] * 5 and torch.equal(outs[0], x @ x)
    ms = clk.time_calls(call, 3, torch.device("cpu"), x=x)
    assert len(ms) == 3 and all(t > 0 for t in ms)
