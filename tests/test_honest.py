"""Numbers that stay honest: step-median prices a stall cannot move, ratios that say when they are noise, and the
ideal cached step priced from real block hooks (with a clock whose times are given, so the value can be worked out
by hand)."""

from __future__ import annotations

import itertools
import time

import pytest
import torch

from studio.engine.baseline import Pairing
from studio.measure.blocks import BlockClock, block_list, computed_blocks, price_cached_step
from studio.measure.steady import Ratio, agree, ratio, steady
from studio.tiny.build import TinyConfig, build_pipeline

# Timing tests run alone, after the others (the README's test command: pytest -m timing)
pytestmark = pytest.mark.timing


def test_a_stall_in_a_few_steps_moves_the_wall_time_not_the_step_price():
    quiet = [10.0] * 20
    stalled = [10.0] * 17 + [400.0, 10.0, 10.0]  # one step waited 390 ms on another process
    a, b = steady(sum(quiet) / 1e3, quiet, []), steady(sum(stalled) / 1e3, stalled, [])
    assert a.robust_s == pytest.approx(0.2) and b.robust_s == pytest.approx(0.2)  # 20 steps x the median 10 ms
    assert a.stall == pytest.approx(1.0) and b.stall == pytest.approx(0.59 / 0.2)  # 2.95: flagged as stalled
    assert a.steady and not b.steady


def test_cached_and_full_steps_are_priced_apart():
    ms = [12.0] * 4 + [3.0, 3.0, 3.0, 12.0] * 4  # 4 warm-up steps, then 3 cached / 1 full
    cached = [i for i, t in enumerate(ms) if t == 3.0]
    s = steady(sum(ms) / 1e3, ms, cached)
    assert (s.full_ms, s.cached_ms) == (12.0, 3.0)
    assert s.robust_s == pytest.approx((8 * 12.0 + 12 * 3.0) / 1e3)


def test_a_ratio_whose_pairs_disagree_is_not_shown_and_says_why():
    def run(ms):
        return steady(ms * 20 / 1e3, [ms] * 20, [])

    quiet = ratio([run(10.0)] * 3, [run(6.0)] * 3)
    assert quiet.value == pytest.approx(10 / 6) and quiet.spread == 0 and quiet.reliable and quiet.why_not() is None
    # the second base ran while another process held the cores for the whole run: 27x slower
    busy = ratio([run(10.0), run(270.0), run(10.0)], [run(6.0), run(6.0), run(60.0)])
    assert busy.value == pytest.approx(10 / 6)  # the median pair
    assert busy.spread == pytest.approx((45.0 - 1 / 6) / 2) and not busy.reliable
    assert busy.why_not().startswith("timing unreliable: the machine was busy (base runs differed by 27.0x")
    assert agree([1.70, 1.72, 1.66]) and not agree([1.70, 1.20, 1.71]) and not agree([1.7])


def test_one_pair_takes_its_spread_from_the_stall_inside_each_run():
    b = steady(0.4, [10.0] * 20, [])  # wall 0.4 s against a price of 0.2 s: stalled 2x
    r = steady(0.1, [5.0] * 20, [])
    one = ratio([b], [r])
    assert one.value == pytest.approx(2.0) and one.spread == pytest.approx(2.0 * 1.0) and not one.reliable
    assert isinstance(one, Ratio) and one.pairs == 1


@pytest.fixture(scope="module")
def tiny_transformer():
    cfg = TinyConfig(heads=2, head_dim=32, double_blocks=2, single_blocks=4, vae_channels=(16, 32, 32))
    return build_pipeline(cfg, seed=0).transformer


def test_block_hooks_with_given_times_price_the_cached_step_as_worked_out_by_hand(tiny_transformer):
    """Real block hooks on a real FLUX transformer (2 double + 4 single blocks); the clock gives each double block
    3 ms and each single block 1 ms. A full step of 12 ms (measured by the step probe) with one call then has
    1 + 1 + 1 + 1 = 4 ms of single blocks, 3 ms of the second double block: a cached step of an F1B0 cache skips 7 ms
    and should cost 5 ms (the first block, 3 ms, plus 2 ms outside the blocks): share 5/12. With 10 full and
    18 cached steps of 28 the ideal speed-up is 28 / (10 + 18 * 5/12) = 1.6."""
    tr = tiny_transformer
    blocks = block_list(tr)
    assert len(blocks) == 6
    durations = itertools.cycle([3.0, 3.0, 1.0, 1.0, 1.0, 1.0])  # ms per block, in call order
    now = [0.0]
    marks = itertools.count()

    def clock():
        if next(marks) % 2 == 1:  # a post-hook: the block took its time
            now[0] += next(durations) / 1e3
        return now[0]

    bc = BlockClock(torch.device("cpu"), clock=clock).install(tr)
    try:
        c = tr.config
        kw = dict(
            hidden_states=torch.randn(1, 16, c.in_channels),
            encoder_hidden_states=torch.randn(1, 4, c.joint_attention_dim),
            pooled_projections=torch.randn(1, c.pooled_projection_dim),
            timestep=torch.tensor([0.5]),
            img_ids=torch.zeros(16, 3),
            txt_ids=torch.zeros(4, 3),
            return_dict=False,
        )
        with torch.no_grad():
            for _ in range(3):  # three full calls
                tr(**kw)
    finally:
        bc.remove()
    ms = bc.block_ms()
    assert ms == pytest.approx([3.0, 3.0, 1.0, 1.0, 1.0, 1.0])
    price = price_cached_step(ms, full_step_ms=12.0, calls=1, computed=computed_blocks(6, 1, 0), source="given")
    assert price.skipped_ms == pytest.approx(7.0) and price.share == pytest.approx(5 / 12)
    assert price.ideal_speedup(10, 18) == pytest.approx(1.6)
    # Fn=1, Bn=1 also keeps the last single block: 1 ms less skipped
    both = price_cached_step(ms, 12.0, 1, computed_blocks(6, 1, 1), "given")
    assert both.share == pytest.approx(6 / 12)
    # true CFG: two calls a step skip twice the blocks (a 24 ms full step)
    cfg = price_cached_step(ms, 24.0, 2, computed_blocks(6, 1, 0), "given")
    assert cfg.share == pytest.approx(10 / 24)
    assert not any(h for b in blocks for h in (b._forward_hooks, b._forward_pre_hooks))  # removed: nothing left


# -- the pairing (engine.baseline) with runs whose step times are given -------------------------------------------


def _run(step_ms: float, steps: int = 20, stall_ms: float = 0.0):
    """A measured run whose every step took `step_ms` (one step `stall_ms` more), as engine.run returns it."""
    import numpy as np

    from studio.engine.cache import CacheReport
    from studio.engine.run import Measured
    from studio.engine.stack import AppliedStack
    from studio.measure.timing import StepCounts

    ms = [step_ms] * steps
    ms[steps // 2] += stall_ms
    return Measured(
        image=np.zeros((8, 8, 3), np.uint8),
        denoise_s=sum(ms) / 1e3,
        step_ms=ms,
        counts=StepCounts(steps, [], "given"),
        report=CacheReport(),
        stack=AppliedStack(),
        reloaded=False,
        warmup_s=None,
        compiled=False,
        ended=time.monotonic(),
        calls=steps,
    )


def _pair(bases: list, stacks: list, **pairing):
    from studio.engine.baseline import BaseStore, Pairing, side_by_side

    b, s = iter(bases), iter(stacks)
    store = BaseStore()
    out = side_by_side(Pairing(**pairing), store, ("k",), lambda: next(b), lambda: next(s))
    return out, store.get(("k",))


def test_quiet_pairs_give_the_step_ratio_and_a_kept_base_that_agreed():
    out, kept = _pair([_run(10.0)] * 3, [_run(6.0)] * 3)
    assert out.runs == 3 and out.ratio.value == pytest.approx(10 / 6) and out.ratio.spread == pytest.approx(0)
    assert kept.agreed and kept.denoise_s == pytest.approx(0.2)


def test_a_stall_inside_one_base_run_does_not_move_the_ratio():
    out, kept = _pair([_run(10.0), _run(10.0, stall_ms=400.0), _run(10.0)], [_run(6.0)] * 3)
    assert out.runs == 3 and out.ratio.value == pytest.approx(10 / 6) and out.ratio.reliable
    assert kept.agreed  # priced by its steps, the stalled run agrees with the others


def test_a_base_run_stalled_from_end_to_end_is_outvoted_by_more_pairs():
    """Pairs 1-3: 1.67, 45 (the base ran 27x slower for its whole length), 1.67: they do not agree, so a fourth pair
    is timed; 3 of 4 then agree and the spoilt one is left out, and said."""
    bases = [_run(10.0), _run(270.0), _run(10.0), _run(10.0)]
    out, kept = _pair(bases, [_run(6.0)] * 4)
    assert out.runs == 4 and out.ratio.left_out == 1 and out.ratio.value == pytest.approx(10 / 6)
    assert out.ratio.spread == pytest.approx(0) and out.ratio.base_range == pytest.approx(27.0)


def test_pairs_that_never_agree_are_capped_and_not_shown():
    """A machine busy in every other run: pairs alternate 1.67 and 0.33 (the stack ran 5x slow); after the 3 pairs and
    `max_extra_pairs` more, the ratio is the median of all and its spread too wide to show."""
    stacks = [_run(6.0), _run(30.0)] * 3
    out, kept = _pair([_run(10.0)] * 6, stacks, max_extra_pairs=3)
    assert out.runs == 6 and not out.ratio.reliable and out.ratio.why_not().startswith("timing unreliable")
    assert out.ratio.spread == pytest.approx((10 / 6 - 10 / 30) / 2)


def test_an_expensive_base_is_kept_only_when_its_steps_agreed():
    """An expensive base (over retime_under_s) is timed once; one whose run stalled is not kept for reuse."""
    from studio.engine.baseline import BaseStore, Pairing, side_by_side

    pairing = Pairing(retime_under_s=0.0, max_extra_pairs=0)  # every base counts as expensive
    out, kept = _pair([_run(10.0, stall_ms=200.0)], [_run(6.0)], retime_under_s=0.0, max_extra_pairs=0)
    assert out.runs == 1 and not kept.agreed and not pairing.reusable(kept, now=kept.timed_at)
    steady_out, steady_kept = _pair([_run(10.0)], [_run(6.0)], retime_under_s=0.0, max_extra_pairs=0)
    assert steady_kept.agreed and pairing.reusable(steady_kept, now=steady_kept.timed_at)
    # reused: one new stack run against the kept base, priced by their steps
    store = BaseStore()
    store.put(("k",), steady_kept)
    again = side_by_side(pairing, store, ("k",), lambda: pytest.fail("base re-timed"), lambda: _run(5.0))
    assert not again.base_now and again.ratio.value == pytest.approx(2.0) and again.ratio.pairs == 1


# -- what a person reads -------------------------------------------------------------------------------------------


def _metrics(**kw):
    from test_units import make_metrics

    return make_metrics(**kw)


def test_the_card_shows_the_spread_or_says_why_there_is_no_number():
    from studio.report.card import metrics_card
    from studio.report.fmt import speedup_pm, summary_line

    assert speedup_pm(1.7, 0.04) == "1.70x ±0.04" and speedup_pm(None, None) == "n/a"
    ok = _metrics(speedup=1.7, speedup_spread=0.04, timed_pairs=3)
    assert "1.70x ±0.04 (base 0.900 s, 3 timed pairs)" in metrics_card(ok)
    note = "timing unreliable: the machine was busy (base runs differed by 27.0x, ...); speed-up not shown"
    busy = _metrics(speedup=None, speedup_note=note, timed_pairs=7)
    assert note in metrics_card(busy) and "n/a" not in summary_line(busy).split("vs base")[0]
    assert note in summary_line(busy)


def test_the_worked_ideal_prints_the_numbers_it_came_from():
    """The block times of the hand-worked example above: 10 full + 18 cached, share 5/12, ideal 1.6x, measured 1.5x
    against base: of ideal 1.5 / 1.6 = 0.9375."""
    from studio.report.text import ideal_worked

    detail = {
        "share": 5 / 12,
        "full_step_ms": 12.0,
        "skipped_ms": 7.0,
        "source": "from this run's block times",
        "block_ms": [3.0, 3.0, 1.0, 1.0, 1.0, 1.0],
        "computed": [0],
        "calls": 1,
    }
    m = _metrics(
        full_steps=10,
        cached_steps=18,
        speedup=1.5,
        ideal_speedup=1.6,
        of_ideal=1.5 / 1.6,
        of_ideal_against="base",
        ideal_detail=detail,
        cached_share=5 / 12,
    )
    text = ideal_worked(m)
    assert "1 call(s) x (3.00 + 1.00 + 1.00 + 1.00 + 1.00) = 7.00 ms skipped" in text
    assert "ideal cached step 12.00 - 7.00 = 5.00 ms = 0.417 of a full step" in text
    assert "ideal 28 / (10 + 18 x 0.417) = 1.600x" in text
    assert "measured 1.500x against base: of ideal 1.500 / 1.600 = 0.938" in text


# -- the real engine with a stall injected into one base run (a test-only hook; nothing sleeps in the product) -----


def _stall_base_run(runner, which: int, seconds: float, steps: set | None = None):
    """A pre-hook on the transformer that waits `seconds` on the calls of the `which`-th base run from now (every
    call, or only the steps in `steps`): what another program holding the cores does to one run."""
    from studio.engine import stack_state

    tr = runner.manager.current.pipe.transformer
    seen = {"base_runs": 0, "call": 0, "cached_before": False}

    def hook(module, args):
        uncached = stack_state(module).cache == "none"
        if uncached and seen["call"] == 0:
            seen["base_runs"] += 1
        seen["call"] = seen["call"] + 1 if uncached else 0
        if uncached and seen["base_runs"] == which and (steps is None or seen["call"] - 1 in steps):
            time.sleep(seconds)

    # a base run's calls come in a row of `steps`; a cached run's reset the count
    return tr.register_forward_pre_hook(hook)


def _generate_cache(runner, r):
    return runner.generate(r, "cache", cache_threshold=0.5).metrics


def test_a_stall_injected_into_one_base_run_gives_the_quiet_ratio_or_the_unreliable_flag(runner, quiet):
    from dataclasses import replace

    from studio.spec import GenerationRequest

    r = GenerationRequest(prompt="a red circle", seed=3, steps=12, width=64, height=64, max_sequence_length=32)
    runner.pairing = replace(Pairing(), retime_under_s=1e9)  # cheap: the default pairs, however loaded the machine
    runner.generate(r, "base")
    for _ in range(3):  # the reference must be a reading: another process on the cores can make it unreliable too
        ref = _generate_cache(runner, r)
        if ref.speedup is not None:
            break
    else:
        assert not quiet, f"no speed-up in 3 tries on a quiet machine: {ref.speedup_note}"
        pytest.skip(f"no quiet reference in 3 tries (the machine is busy: {ref.speedup_note})")
    step = ref.base_denoise_s / 12

    def judged(m):
        if m.speedup is None:
            # the busy machine said so, or the stalled base made a reading over the ideal, said as an error
            assert m.speedup_note.startswith(("timing unreliable", "measurement error")), m.speedup_note
            return "flagged"
        assert abs(m.speedup / ref.speedup - 1) <= 0.25, (m.speedup, ref.speedup)
        return "within bound"

    # a stall of 2 steps, each waiting 20 steps' time: the run's price does not move
    handle = _stall_base_run(runner, which=2, seconds=20 * step, steps={5, 6})
    try:
        few = _generate_cache(runner, r)
    finally:
        handle.remove()
    assert judged(few) in ("within bound", "flagged")
    assert "a stall hit" not in few.timing  # the reported stack run was not the stalled one
    # every step of one base run 5x slower: that pair disagrees, more pairs are timed, it is left out or flagged
    handle = _stall_base_run(runner, which=2, seconds=4 * step)
    try:
        whole = _generate_cache(runner, r)
    finally:
        handle.remove()
    verdict = judged(whole)
    if verdict == "within bound":
        assert whole.timed_pairs >= 4 and "pairs left out (a stall spoilt them)" in whole.timing
