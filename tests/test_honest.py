"""Numbers that stay honest: the pairing that feeds the one estimator (its own tests: test_estimate.py), the card
that shows its interval or says why not, and the ideal cached step priced from real block hooks (with a clock whose
times are given, so the value can be worked out by hand)."""

from __future__ import annotations

import itertools
import time

import pytest
import torch

from studio.engine.baseline import Pairing
from studio.measure.blocks import BlockClock, block_list, computed_blocks, price_cached_step
from studio.measure.timing import StepCounter
from studio.tiny.build import TinyConfig, build_pipeline
from tests.switched import stack

# Timing tests run alone, after the others (the README's test command: pytest -m timing)
pytestmark = pytest.mark.timing


@pytest.fixture(scope="module")
def tiny_transformer():
    cfg = TinyConfig(heads=2, head_dim=32, double_blocks=2, single_blocks=4, vae_channels=(16, 32, 32))
    return build_pipeline(cfg, seed=0).transformer


def _call_args(tr) -> dict:
    """One transformer call's arguments on the tiny model (16 image tokens, 4 text tokens)."""
    c = tr.config
    return dict(
        hidden_states=torch.randn(1, 16, c.in_channels),
        encoder_hidden_states=torch.randn(1, 4, c.joint_attention_dim),
        pooled_projections=torch.randn(1, c.pooled_projection_dim),
        timestep=torch.tensor([0.5]),
        img_ids=torch.zeros(16, 3),
        txt_ids=torch.zeros(4, 3),
        return_dict=False,
    )


def test_block_times_given_by_a_clock_price_the_cached_step_as_worked_out_by_hand(tiny_transformer):
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
        if next(marks) % 2 == 1:  # a block's end: the block took its time
            now[0] += next(durations) / 1e3
        return now[0]

    bc = BlockClock(torch.device("cpu"), clock=clock).install(tr)
    try:
        kw = _call_args(tr)
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
    # removed: nothing left, each block's class forward again (no hooks either: the clock wraps, it does not hook)
    assert not any("forward" in b.__dict__ for b in blocks)
    assert not any(h for b in blocks for h in (b._forward_hooks, b._forward_pre_hooks))


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

    pairing.setdefault("budget_pairs", 1e9)  # instant fake runs: the time budget is tested on its own below
    b, s = iter(bases), iter(stacks)
    store = BaseStore()
    out = side_by_side(Pairing(**pairing), store, ("k",), lambda: next(b), lambda: next(s))
    return out, store.get(("k",))


def test_the_block_clock_times_under_a_librarys_own_block_wrappers_and_gives_them_back(tiny_transformer):
    """diffusers' First-Block-Cache wraps each block's forward itself (its hook registry): the clock wraps that, times
    the blocks that ran (a cached call runs the first block only), and leaves the library's wrappers as they were."""
    from diffusers import FirstBlockCacheConfig

    tr = build_pipeline(TinyConfig(heads=2, head_dim=32, double_blocks=2, single_blocks=4), seed=0).transformer
    tr.enable_cache(FirstBlockCacheConfig(threshold=10.0))  # every call after the first served from the cache
    blocks = block_list(tr)
    before = [b.__dict__.get("forward") for b in blocks]
    assert all(f is not None for f in before)  # the library's own wrappers, on every block
    kw = _call_args(tr)
    counter = StepCounter().install(tr)  # the engine's: which calls ran the last block's last Linear
    bc = BlockClock(torch.device("cpu"), counter=counter).install(tr)
    try:
        with torch.no_grad(), tr.cache_context("cond"):
            for _ in range(3):
                tr(**kw)
    finally:
        bc.remove()
    # every block is called in every call (the library's wrapper returns at once when cached): 3 calls, 1 full
    assert [len(bc._spans[i]) for i in range(6)] == [3] * 6 and counter.calls == 3 and counter.runs == 1
    assert bc.full_calls() == {1}
    ran = [b - a for a, b, call, _ in bc._spans[3] if call == 1][0] * 1e3
    skipped = [(b - a) * 1e3 for a, b, call, _ in bc._spans[3] if call != 1]
    assert max(skipped) < ran / 10  # a cached call's "call" of a skipped block costs next to nothing
    ms = bc.block_ms()
    assert ms[3] == pytest.approx(ran)  # the block's time is the full call's only, not a median with the skips
    assert [b.__dict__.get("forward") for b in blocks] == before


def test_quiet_pairs_give_the_step_ratio_and_stop_once_the_interval_is_tight():
    out, kept = _pair([_run(10.0)] * 3, [_run(6.0)] * 3)
    assert out.runs == 3 and out.ratio.point == pytest.approx(10 / 6) and out.ratio.half_width == pytest.approx(0)
    assert out.ratio.stop == "the interval is within ±5% of its point"  # after the 3 pairs always timed while cheap
    assert kept.agreed and kept.denoise_s == pytest.approx(0.2) and len(kept.runs) == 3


def test_a_stall_inside_one_base_run_does_not_move_the_ratio_and_is_said():
    out, kept = _pair([_run(10.0), _run(10.0, stall_ms=400.0), _run(10.0)], [_run(6.0)] * 3)
    assert out.runs == 3 and out.ratio.point == pytest.approx(10 / 6) and out.ratio.tight
    assert out.ratio.stalled == 1 and kept.agreed


def test_a_base_run_slowed_from_end_to_end_takes_more_pairs_not_a_wrong_number():
    """Pair 1's base ran 27x slower for its whole length: the floor is the clean runs' from the start, but a draw of
    the bootstrap that holds only pair 1 says 45x, so the interval is wide until enough clean pairs outvote it."""
    bases = [_run(270.0)] + [_run(10.0)] * 5
    out, kept = _pair(bases, [_run(6.0)] * 6, retime_under_s=1e9)  # cheap, though the slowed run takes 5.4 s
    assert out.ratio.point == pytest.approx(10 / 6) and out.ratio.tight and 3 < out.runs <= 6
    assert out.ratio.stop == "the interval is within ±5% of its point"


def test_pairs_that_never_settle_stop_at_the_cap_and_say_so():
    stacks = [_run(6.0), _run(30.0)] * 4  # every other stack run 5x slow: a draw of the slow ones alone says 0.33x
    out, kept = _pair([_run(10.0)] * 8, stacks, max_extra_pairs=1)
    assert out.runs == 4 and out.ratio.stop == "at most 4 pairs" and out.ratio.point == pytest.approx(10 / 6)


def test_the_time_budget_counts_pairs_so_a_fast_stack_with_a_wide_interval_times_more():
    """The budget is `budget_pairs` times the fastest pair: quiet pairs of a fast stack go on to the cap (counted in
    runs of the stack, a 2x stack's pair costs 3 of them, and every stack over about 1.5x stopped at its first 3
    pairs whatever its interval); pairs a stall slowed stop earlier."""
    from studio.engine.baseline import Pairing
    from studio.measure.estimate import Estimate

    wide = Estimate(2.4, 1.7, 3.1, 3)  # +-29%: more pairs would help
    p = Pairing()  # the app's: 3 pairs first, up to 4 more, a budget of 7 of the fastest pair
    # a 3x stack: base 0.3 s, stack 0.1 s, each pair 0.4 s
    assert [p.stop(wide, n, 3, spent_s=0.4 * n, pair_s=0.4) for n in range(3, 7)] == [None] * 4
    assert p.stop(wide, 7, 3, spent_s=2.8, pair_s=0.4) == "at most 7 pairs"
    # the same pairs, three of them slowed 3x by a stall: 1.2 + 3 x 1.2 = 4.8 s spent, over 7 x 0.4 with the next
    why = p.stop(wide, 6, 3, spent_s=4.8, pair_s=0.4)
    assert why == "another pair would pass the time budget (7x the fastest pair)"
    assert p.stop(Estimate(2.4, 2.35, 2.45, 3), 3, 3, 1.2, 0.4) == "the interval is within ±5% of its point"


def test_an_expensive_base_is_kept_alone_only_when_no_stall_hit_it():
    """An expensive base (over retime_under_s) is timed once; one that a stall hit is not reused alone."""
    from studio.engine.baseline import BaseStore, Pairing, side_by_side

    pairing = Pairing(retime_under_s=0.0, max_extra_pairs=0)  # every base counts as expensive
    out, kept = _pair([_run(10.0, stall_ms=200.0)], [_run(6.0)], retime_under_s=0.0, max_extra_pairs=0)
    assert out.runs == 1 and not kept.agreed and not pairing.reusable(kept, now=kept.timed_at)
    steady_out, steady_kept = _pair([_run(10.0)], [_run(6.0)], retime_under_s=0.0, max_extra_pairs=0)
    assert steady_kept.agreed and pairing.reusable(steady_kept, now=steady_kept.timed_at)
    # reused: one new stack run against the kept base, by the same estimator
    store = BaseStore()
    store.put(("k",), steady_kept)
    again = side_by_side(pairing, store, ("k",), lambda: pytest.fail("base re-timed"), lambda: _run(5.0))
    assert not again.base_now and again.ratio.point == pytest.approx(2.0) and again.ratio.pairs == 1


# -- what a person reads -------------------------------------------------------------------------------------------


def _metrics(**kw):
    from test_units import make_metrics

    return make_metrics(**kw)


def test_the_card_shows_the_interval_or_says_why_there_is_no_number():
    from studio.report.card import metrics_card
    from studio.report.fmt import speedup_ci, summary_line
    from studio.report.table import MatrixRow

    assert speedup_ci(1.74, 1.68, 1.80) == "1.74x (1.68-1.80)" and speedup_ci(None, None, None) == "n/a"
    assert speedup_ci(1.0, None, None) == "1.00x"  # base against itself: exact
    stop = "the interval is within ±5% of its point"
    ok = _metrics(speedup=1.74, speedup_lo=1.68, speedup_hi=1.80, timed_pairs=3, pairs_stop=stop, stalled_runs=1)
    card = metrics_card(ok)
    assert "1.74x (1.68-1.80) (base 0.900 s, 3 timed pairs, stopped: the interval is within ±5% of its point" in card
    assert "stalled: 1 run ran slow in places" in card
    # a stall that widened the interval past showing is still said, beside the reason the number is withheld
    note = "timing too noisy to show: the interval 1.00-2.05x over 6 pairs is wider than ±25% of its point"
    withheld = _metrics(speedup_note=note, timed_pairs=6, stalled_runs=2)
    card = metrics_card(withheld)
    assert "speed-up withheld (timing too noisy to show)" in card and "stalled: 2 runs ran slow in places" in card
    # a stalled median run beside a floor-priced speed-up (an A/B seen under load: 2.530 s against base's 1.927 s, and
    # 1.65x): the price the speed-up divides is shown beside a wall time a stall lifted, on the card and in the table
    lifted = _metrics(
        denoise_s=2.53, denoise_priced_s=1.17, base_denoise_s=1.927, base_priced_s=1.93, speedup=1.65, timed_pairs=3
    )
    card = metrics_card(lifted)
    assert "2.530 s (floor 1.170 s)" in card and "(base 1.927 s, " in card  # base's within 10% of its price
    assert MatrixRow.from_metrics(lifted).ab_cells()[1] == "2.530 s (floor 1.170 s)"
    assert "(floor " not in metrics_card(_metrics(denoise_s=1.0, denoise_priced_s=0.95))
    note = "timing too noisy to show: the interval 1.20-2.30x over 4 pairs ...; speed-up not shown (...)"
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
        uncached = stack_state(module).step_cache.backend == "none"
        if uncached and seen["call"] == 0:
            seen["base_runs"] += 1
        seen["call"] = seen["call"] + 1 if uncached else 0
        if uncached and seen["base_runs"] == which and (steps is None or seen["call"] - 1 in steps):
            time.sleep(seconds)

    # a base run's calls come in a row of `steps`; a cached run's reset the count
    return tr.register_forward_pre_hook(hook)


def _generate_cache(runner, r):
    return runner.generate(r, stack(runner, "cache", threshold=0.5)).metrics


def test_a_stall_injected_into_one_base_run_gives_the_quiet_ratio_or_the_unreliable_flag(runner, quiet):
    from dataclasses import replace

    from studio.report.card import metrics_card
    from studio.spec import GenerationRequest

    r = GenerationRequest(prompt="a red circle", seed=3, steps=12, width=64, height=64, max_sequence_length=32)
    runner.pairing = replace(Pairing(), retime_under_s=1e9)  # cheap: the default pairs, however loaded the machine
    runner.generate(r, "base")
    for _ in range(3):  # the reference must be a reading: another process on the cores can make it unreliable too
        ref = _generate_cache(runner, r)
        if ref.timing.speedup is not None:
            break
    else:
        assert not quiet, f"no speed-up in 3 tries on a quiet machine: {ref.timing.speedup_note}"
        pytest.skip(f"no quiet reference in 3 tries (the machine is busy: {ref.timing.speedup_note})")
    step = ref.timing.base_denoise_s / 12

    def judged(m):
        if m.timing.speedup is None:
            # the busy machine said so, or the stalled base made a reading over the ideal, said as an error
            assert m.timing.speedup_note.startswith(("timing too noisy to show", "measurement error")), (
                m.timing.speedup_note
            )
            return "flagged"
        assert abs(m.timing.speedup / ref.timing.speedup - 1) <= 0.25, (m.timing.speedup, ref.timing.speedup)
        return "within bound"

    # a stall of 2 steps, each waiting 20 steps' time: the floor does not move, and the card says a stall hit
    handle = _stall_base_run(runner, which=2, seconds=20 * step, steps={5, 6})
    try:
        few = _generate_cache(runner, r)
    finally:
        handle.remove()
    assert judged(few) in ("within bound", "flagged")
    assert few.timing.stalled_runs >= 1 and "stalled: " in metrics_card(few)
    # every step of one base run 5x slower: the bootstrap's draws of that pair widen the interval, so more pairs are
    # timed (the floor itself is the clean runs'), or the number is withheld
    handle = _stall_base_run(runner, which=2, seconds=4 * step)
    try:
        whole = _generate_cache(runner, r)
    finally:
        handle.remove()
    verdict = judged(whole)
    if verdict == "within bound":
        assert whole.timing.timed_pairs >= 2 and f"{whole.timing.timed_pairs} timed pairs, stopped: " in metrics_card(
            whole
        )


def test_a_card_keeps_its_base_floor_in_the_machines_record_and_reads_its_pace_against_it(runner, settings, tmp_path):
    import json
    from dataclasses import replace

    from studio.engine.baseline import Pairing
    from studio.measure.crowding import CROWDED
    from studio.report.card import metrics_card
    from studio.spec import GenerationRequest

    path = tmp_path / "pace.json"
    runner.manager.settings = replace(runner.manager.settings, pace_file=str(path))  # (STUDIO_PACE_FILE)
    runner.pairing = Pairing()  # the app's pairing: base timed 3 times beside the stack, the cores watched
    r = GenerationRequest(prompt="a green ring", seed=1, steps=20, width=64, height=64, max_sequence_length=32)
    first = runner.generate(r, stack(runner, "cache", threshold=0.5)).metrics
    if first.timing.cores_taken is None or first.timing.cores_taken >= CROWDED:
        pytest.skip(f"the cores were not read quiet (taken {first.timing.cores_taken}): nothing recorded")
    ((key, entry),) = json.loads(path.read_text()).items()
    assert first.timing.base_pace_over is None and entry["benches"] == 1  # the first: nothing to compare with
    assert entry["best_ms"] == pytest.approx(first.timing.base_priced_s * 1e3 / 20)  # base's floor, per step
    assert "|shape " in key and "|20 steps|1 calls a step|0 LoRAs" in key
    # a record four times as fast as this machine ran: the next card of the shape (another prompt) reads its host slow.
    # (Twice as fast failed on a noisy VM: a first call whose floor read 1.6-1.8x the second's left the second only
    # 13-27% over half of it.)
    path.write_text(json.dumps({key: {"best_ms": entry["best_ms"] / 4, "benches": 1}}))
    m = runner.generate(
        replace(r, prompt="a green ring, again", seed=2), stack(runner, "cache", threshold=0.5)
    ).metrics
    if m.timing.cores_taken is None or m.timing.cores_taken >= CROWDED:
        pytest.skip(f"the cores were not read quiet the second time (taken {m.timing.cores_taken})")
    assert m.timing.base_pace_over == pytest.approx(m.timing.base_priced_s * 1e3 / 20 / (entry["best_ms"] / 4) - 1)
    assert m.timing.base_pace_over > 0.5
    if m.timing.speedup is not None:  # said beside a number; a withheld one says why already
        assert "host slow: base ran " in metrics_card(m)
    assert json.loads(path.read_text())[key]["best_ms"] == entry["best_ms"] / 4  # the record keeps the faster
