"""A step cache's room at a run's steps (studio.spec.headroom): the bound against cache-dit's own rules, worked out by
hand; on the embedded model, the bound reached at a threshold that passes every residual check, the sentence on the
card and in the JSON of a few-step request, and why a run at an impossible threshold cached nothing."""

from __future__ import annotations

import html
import json
from dataclasses import replace

import pytest

from studio.report.card import metrics_card
from studio.spec import CacheSpec
from studio.spec.headroom import CacheRoom, _dbcache_steps, headroom, idle_sentence, run_room
from tests.switched import stack

CACHE = CacheSpec(backend="cache-dit", max_warmup_steps=4, max_continuous_cached_steps=3, residual_diff_threshold=0.24)
PROMPT = "a red circle in the center, blue background"


# pure: no model loaded ---------------------------------------------------------------------------------------------
@pytest.mark.quick
def test_warm_up_and_a_run_cap_bound_the_skipped_steps_as_cache_dit_decides():
    """`cache` (warm-up 4, at most 3 in a row): steps 0-3 compute (warm-up), then 3 cached and one computed, over and
    over: of r steps after the warm-up, r - r // 4 are cached."""
    assert _dbcache_steps(8, 4, 3, -1, None, True) == [4, 5, 6]  # step 7 computes: 3 in a row
    assert _dbcache_steps(12, 4, 3, -1, None, True) == [4, 5, 6, 8, 9, 10]
    got = {s: headroom(CACHE, s).skippable for s in (4, 5, 8, 9, 10, 28)}
    assert got == {4: 0, 5: 1, 8: 3, 9: 4, 10: 5, 28: 18}  # 28: 24 after the warm-up, 6 of them computed
    room = headroom(CACHE, 8)
    assert room.first == 4 and room.tight
    s = "at 8 steps with 4 warm-up steps and at most 3 cached in a row, this cache can skip at most 3 of 8 steps"
    assert room.sentence() == s
    four = "at 4 steps with 4 warm-up steps and at most 3 cached in a row, this cache can skip none of the 4 steps"
    assert headroom(CACHE, 4).sentence() == four
    # tight: nothing to skip, or under half the steps while the warm-up takes a quarter or more of them
    assert [s for s in range(1, 40) if headroom(CACHE, s).tight] == list(range(1, 10))


@pytest.mark.quick
def test_no_warm_up_still_computes_step_0_and_the_caps_bind():
    """Step 0 always computes (no residual to compare with yet); no run cap caches every step after the warm-up; a
    cap on the run's cached steps stops there."""
    no_warmup = replace(CACHE, max_warmup_steps=0)
    assert _dbcache_steps(8, 0, 3, -1, None, True) == [1, 2, 3, 5, 6, 7]
    assert headroom(no_warmup, 8).first == 1 and headroom(no_warmup, 8).skippable == 6
    assert headroom(replace(CACHE, max_continuous_cached_steps=-1), 8).skippable == 4  # steps 4-7
    capped = headroom(replace(CACHE, max_cached_steps=2), 28)
    assert capped.skippable == 2 and capped.tight is False  # 2 of 28, but the preset's cap, not the request's steps
    assert capped.sentence() == (
        "at 28 steps with 4 warm-up steps, at most 3 cached in a row and at most 2 cached in all, this cache can skip "
        "at most 2 of 28 steps"
    )
    one = replace(CACHE, max_continuous_cached_steps=1)
    assert headroom(one, 50).skippable == 23 and not headroom(one, 50).tight  # 46 after the warm-up, every other


@pytest.mark.quick
def test_step_masks_as_cache_dit_reads_them():
    """A static mask alone decides (every mask-0 step caches, before any cap); a dynamic one adds the caps; the
    warm-up is cut to the mask's leading compute steps (cache_context.warmup_steps)."""
    bins = replace(CACHE, compute_bins=(4, 1, 1), cache_bins=(2, 2, 10))  # 1111 00 1 00 1 at 10 steps
    mask = [1, 1, 1, 1, 0, 0, 1, 0, 0, 1]
    room = headroom(bins, 10, mask)
    assert (room.skippable, room.mask, room.mask_computes) == (4, "bins", 6)  # steps 4, 5, 7, 8
    assert (
        room.sentence()
        == "at 10 steps with the static step mask bins computing 6 of them, this cache can skip "
        + ("at most 4 of 10 steps")
    )
    dynamic = replace(bins, max_continuous_cached_steps=1, steps_computation_policy="dynamic")
    assert _dbcache_steps(10, 4, 1, -1, [1, 1, 1, 1, 0, 0, 0, 0, 0, 1], False) == [4, 6, 8]
    assert _dbcache_steps(10, 4, 1, -1, mask, False) == [4, 7]  # 5 and 8: the second in a row, computed
    assert headroom(dynamic, 10, mask).skippable == 2
    assert _dbcache_steps(6, 4, 3, -1, [1, 1, 0, 0, 0, 0], False) == [2, 3, 4]  # warm-up cut to 2: the mask's lead
    with pytest.raises(ValueError, match="needs the mask"):
        headroom(bins, 10)


@pytest.mark.quick
def test_what_is_said_before_the_run():
    """The bound as the API returns it before a run, and the warning of a tight one: `cache` at 8 steps computes 5
    (4 warm-up, then 3 cached, then 1), so no cached step, however cheap, makes it more than 8/5 = 1.60x."""
    room = headroom(CACHE, 8)
    assert room.at_most == pytest.approx(1.6)
    d = room.as_dict()
    assert (d["skippable"], d["steps"], d["first_cacheable"], d["tight"]) == (3, 8, 4, True)
    assert d["warning"] == (
        "little room for this cache: at 8 steps with 4 warm-up steps and at most 3 cached in a row, this cache can "
        "skip at most 3 of 8 steps, so the run is at most 1.60x faster than the same stack without it, even were a "
        "cached step free"
    )
    assert (
        headroom(CACHE, 4)
        .before_run(model_steps=4)
        .startswith(
            "this cache will cache nothing here (this model is a few-step one: its schedule is 4 steps): at 4 steps"
        )
    )
    long = headroom(CACHE, 28).as_dict(model_steps=28)
    assert (long["tight"], long["warning"], long["at_most"]) == (False, None, pytest.approx(28 / 10))


@pytest.mark.quick
def test_first_block_cache_and_no_cache():
    fb = headroom(CacheSpec(backend="fbcache"), 8)
    assert (fb.skippable, fb.tight) == (7, False)
    assert fb.sentence() == (
        "at 8 steps First-Block-Cache computes the first (no residual to compare yet), so it can skip at most 7 of "
        "8 steps"
    )
    assert headroom(CacheSpec(), 8) is None
    assert run_room(None, engaged=False, cached=0, diffs={}, threshold=None) == CacheRoom(None, None, None)


@pytest.mark.quick
def test_why_a_cache_cached_nothing():
    diffs = {4: 0.35, 5: 0.31, 6: 0.4}
    assert idle_sentence(headroom(CACHE, 28), diffs, 0.24) == (
        "cached nothing: the smallest residual difference seen was 0.31, above the threshold 0.24 (raise "
        "residual_diff_threshold to cache)"
    )
    # as many digits as it takes to fall on its side of the threshold; equal is "at" (cache-dit caches diff < R)
    assert "was 0.2401, above the threshold 0.24" in idle_sentence(None, {4: 0.2401}, 0.24)
    assert "was 0.24, at the threshold 0.24" in idle_sentence(None, {4: 0.24}, 0.24)
    four = headroom(CACHE, 4)
    assert idle_sentence(four, {}, 0.24) == "cached nothing: " + four.sentence()
    assert idle_sentence(None, {}, 0.24) == (
        "cached nothing, and the cache recorded no residual difference to set against the threshold 0.24"
    )
    f = run_room(headroom(CACHE, 8), engaged=True, cached=0, diffs=diffs, threshold=0.24)
    assert f.cache_skippable == 3 and f.cache_headroom.startswith("at 8 steps") and "0.31" in f.cache_idle
    assert run_room(headroom(CACHE, 8), engaged=True, cached=2, diffs=diffs, threshold=0.24).cache_idle is None


# on the embedded model ---------------------------------------------------------------------------------------------
def test_a_threshold_every_check_passes_reaches_the_bound_exactly(tiny_runner):
    """cache-dit treats a threshold >= 1 as 'always similar': what it caches then is its rules alone, so the
    cached steps are the bound's own list, step for step."""
    r = tiny_runner
    cache = r.presets.get("cache")
    specs = {
        "cache": cache.cache_config,
        "w0": replace(cache.cache_config, max_warmup_steps=0),
        "m2": replace(cache.cache_config, max_cached_steps=2),
        "mc1": replace(cache.cache_config, max_continuous_cached_steps=1),
    }
    for name, spec in specs.items():
        for steps in (8, 13):
            p = replace(cache, name=f"room-{name}", cache_config=replace(spec, residual_diff_threshold=1.0))
            m = r.generate(r.request(PROMPT, seed=0, steps=steps), p, compare="off").metrics
            want = _dbcache_steps(
                steps, spec.max_warmup_steps, spec.max_continuous_cached_steps, spec.max_cached_steps, None, True
            )
            assert m.cache.cached_step_indices == m.cache.backend_cached_steps == want, (name, steps)
            assert m.room.cache_skippable == len(want)


def test_a_few_step_request_says_so_on_the_card_and_in_the_json(tiny_runner):
    """5 steps under `cache`: the studio runs it uncached (fewer than 8 steps), and the card says what cache-dit could
    have skipped; 8 steps engage it, at the bound when every check passes."""
    r = tiny_runner
    m = r.generate(r.request(PROMPT, seed=0, steps=5), "cache", compare="off").metrics
    five = "at 5 steps with 4 warm-up steps and at most 3 cached in a row, this cache can skip at most 1 of 5 steps"
    assert m.room.cache_headroom == five and m.room.cache_skippable == 1 and m.room.cache_idle is None
    assert any("too few to gain" in x for x in m.labels.fallbacks)
    assert html.escape(five) in metrics_card(m) and json.loads(json.dumps(m.as_dict()))["cache_headroom"] == five
    m8 = r.generate(r.request(PROMPT, seed=0, steps=8), stack(r, "cache", threshold=1.0), compare="off").metrics
    eight = "at 8 steps with 4 warm-up steps and at most 3 cached in a row, this cache can skip at most 3 of 8 steps"
    assert m8.room.cache_headroom == eight and m8.cache.cached_step_indices == [4, 5, 6] and eight in metrics_card(m8)
    m28 = r.generate(r.request(PROMPT, seed=0, steps=28), "cache", compare="off").metrics
    assert m28.room.cache_headroom is None and m28.room.cache_skippable == 18 and "cache room" not in metrics_card(m28)


def test_an_impossible_threshold_caches_nothing_and_says_the_smallest_difference(tiny_runner):
    r = tiny_runner
    m = r.generate(r.request(PROMPT, seed=0, steps=10), stack(r, "cache", threshold=0.0001), compare="off").metrics
    assert m.cache.cached_steps == 0 and m.cache.full_steps == 10 and m.cache.cache_threshold == 0.0001
    assert sorted(m.cache.residual_diffs) == [4, 5, 6, 7, 8, 9]  # one for every step after the warm-up
    low = min(m.cache.residual_diffs.values())
    assert 0.0001 < low < 0.24  # the trained model's differences (caching at 0.24 is tested in test_tiny_model.py)
    said = (
        f"cached nothing: the smallest residual difference seen was {low:.2g}, above the threshold 0.0001 (raise "
        "residual_diff_threshold to cache)"
    )
    assert m.room.cache_idle == said and m.room.cache_headroom is None and m.room.cache_skippable == 5
    assert html.escape(said) in metrics_card(m) and json.loads(json.dumps(m.as_dict()))["cache_idle"] == said


@pytest.mark.quick
def test_the_diffusers_methods_with_a_step_rule_are_bounded_by_it_before_the_run():
    """MagCache: round(retention_ratio x steps) computed, then at most max_skip_steps in a row; SeaCache: retention
    and end steps computed, max_consecutive_cached in a row; TaylorSeer: a fixed schedule (test_methods checks a
    run caches exactly it). DBPrune, PAB and FasterCache have no step bound to say before the run."""
    mag = headroom(CacheSpec(backend="magcache"), 28)  # 6 computed (0.2 x 28), then 3 cached, 1 computed, ...
    assert (mag.skippable, mag.first, mag.run_cap) == (17, 6, 3)
    few = headroom(CacheSpec(backend="magcache", options={"retention_ratio": 0.5}), 8)
    assert (few.skippable, few.tight) == (3, True) and "can skip at most 3 of 8 steps" in few.before_run()
    sea = headroom(CacheSpec(backend="seacache", options={"cache_end_steps": 2}), 10)
    assert sea.skippable == 5 and sea.first == 1  # 1, 2, 4, 5, 7 cached; 0, 3, 6 and the end's 8, 9 computed
    ts = headroom(CacheSpec(backend="taylorseer", options={"cache_interval": 2, "disable_cache_after_step": 6}), 8)
    assert (ts.skippable, ts.first) == (2, 3)  # 3 and 5 predicted; 4 computed; from 6 on computed
    for backend in ("dbprune", "pab", "fastercache"):
        assert headroom(CacheSpec(backend=backend), 28) is None
