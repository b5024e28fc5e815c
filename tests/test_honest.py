"""Numbers that stay honest: step-median prices a stall cannot move, ratios that say when they are noise, and the
ideal cached step priced from real block hooks (with a clock whose times are given, so the value can be worked out
by hand)."""

from __future__ import annotations

import itertools

import pytest
import torch

from studio.measure.blocks import BlockClock, block_list, computed_blocks, price_cached_step
from studio.measure.steady import Ratio, agree, ratio, steady
from studio.tiny.build import TinyConfig, build_pipeline


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
            pooled_projections=torch.randn(1, c.pooled_projection_dim), timestep=torch.tensor([0.5]),
            img_ids=torch.zeros(16, 3), txt_ids=torch.zeros(4, 3), return_dict=False,
        )  # fmt: skip
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
