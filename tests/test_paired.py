"""Paired statistics over prompts and seeds (studio.bench.paired): each stack against each request's own base.

The recorded set: hand-made runs whose floor prices can be worked out (base's 10 steps at 100 ms; a stack's odd
steps cached at a given price), with the PSNR and FLIP each request's picture got; then the same over two prompts
of the embedded model, through the real bench."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from studio.bench.paired import labels, paired
from studio.bench.rotation import Rotation
from studio.measure.estimate import Run
from studio.report.table import AGAIN
from studio.report.text import paired_lines, paired_markdown

CACHED = [i for i in range(10) if i % 2]


def _rot(prompt: str, seed: int, cached_ms: float, psnr_db: float, flip: float, rounds: int = 2) -> Rotation:
    """One request: base at 100 ms a step; `cache` with its 5 odd steps cached at `cached_ms` (floor price
    5 x 100 + 5 x cached_ms: 1000 / that is the speed-up), its picture at `psnr_db` and `flip` against base."""
    rot = Rotation(request=SimpleNamespace(prompt=prompt, seed=seed))
    for name in ("base", AGAIN):
        rot.runs[name] = [Run.of([100.0] * 10) for _ in range(rounds)]
    steps = [100.0 if i % 2 == 0 else cached_ms for i in range(10)]
    rot.runs["cache"] = [Run.of(steps, CACHED) for _ in range(rounds)]
    m = SimpleNamespace(quality=SimpleNamespace(psnr_db=psnr_db, flip=flip), cache=SimpleNamespace(cached_steps=5))
    rot.last["cache"] = SimpleNamespace(metrics=m)
    return rot


RECORDED = [
    _rot("red circle", 42, 25.0, 36.0, 0.020),  # 1000 / 625 = 1.60x, above the floor: a win
    _rot("blue square", 42, 60.0, 27.5, 0.081),  # 1000 / 800 = 1.25x, under 30 dB: faster, not a win
    _rot("two shapes", 42, 100.0, math.inf, 0.0),  # 1.00x (nothing saved): identical, not faster, not a win
]


@pytest.mark.quick
def test_paired_figures_on_a_recorded_set():
    (p,) = paired(RECORDED, ["base", "cache", AGAIN], floor_db=30.0)
    assert p.preset == "cache" and len(p.prompts) == 3
    speedups = [f.speedup for f in p.prompts]
    assert speedups == pytest.approx([1000 / 625, 1000 / 800, 1.0], abs=1e-12)
    # every step of a kind at one price: the interval is the point (the bootstrap draws nothing else)
    assert [(f.speedup_lo, f.speedup_hi) for f in p.prompts[:2]] == [
        (pytest.approx(1.6),) * 2,
        (pytest.approx(1.25),) * 2,
    ]
    assert [f.faster for f in p.prompts] == [True, True, False]
    assert [f.above_floor for f in p.prompts] == [True, False, True]
    assert p.wins == 1 and p.slowest.label == "two shapes" and p.worst.label == "blue square"
    assert p.worst_speedup == pytest.approx(1.0)
    # a FLIP ceiling takes the first request's win away (0.020 > 0.015)
    (q,) = paired(RECORDED, ["cache"], floor_db=30.0, max_flip=0.015)
    assert q.wins == 0 and [f.above_floor for f in q.prompts] == [False, False, True]
    # a lower floor gives the second its win
    assert paired(RECORDED, ["cache"], floor_db=25.0)[0].wins == 2
    d = p.as_dict()
    assert (d["wins"], d["of"], d["slowest"], d["worst"]) == (1, 3, "two shapes", "blue square")
    assert [x["win"] for x in d["prompts"]] == [True, False, False]


@pytest.mark.quick
def test_a_slow_base_slot_makes_no_win():
    """Base's first slot slow (120 ms steps), its second run and the stack at 100 ms: 1.20x against base, 1.00x
    against base's second run, so not faster (a stack identical to base read 1.21x on one prompt this way)."""
    rot = _rot("slow slot", 42, 100.0, math.inf, 0.0)
    rot.runs["base"] = [Run.of([120.0] * 10) for _ in range(2)]
    rot.runs["cache"] = [Run.of([100.0] * 10) for _ in range(2)]
    (p,) = paired([rot], ["cache"], floor_db=30.0)
    (f,) = p.prompts
    assert f.speedup == pytest.approx(1.2) and f.vs_again == pytest.approx(1.0) and not f.faster and p.wins == 0
    # the recorded set's base runs twice alike: its second check agrees
    assert [f.vs_again for f in paired(RECORDED, ["cache"], floor_db=30.0)[0].prompts] == pytest.approx([1.6, 1.25, 1])


@pytest.mark.quick
def test_paired_text_names_the_worst_prompt_and_counts_wins():
    (p,) = paired(RECORDED, ["cache"], floor_db=30.0)
    text = paired_markdown([p])
    assert "Paired over 3 requests" in text and "PSNR >= 30 dB." in text
    assert "| cache | 1/3 | 'two shapes': 1.00x | 'blue square': 27.50 dB, FLIP 0.0810 |" in text
    assert "| 1.60x (1.60-1.60), 36.00 dB, FLIP 0.0200 ✓ | 1.25x (1.25-1.25), 27.50 dB, FLIP 0.0810 |" in text
    assert "- #2: 'blue square'" in text
    lines = paired_lines(p.as_dict())
    assert lines[0] == (
        "paired over 3 prompts, each against its own base: 1/3 wins, worst case 1.00x ('two shapes'), lowest PSNR "
        "on 'blue square'"
    )
    assert lines[3] == "  'two shapes': 1.00x (1.00-1.00), inf, FLIP 0.0000"
    assert paired_markdown([]) == ""


@pytest.mark.quick
def test_a_withheld_speed_up_is_the_slowest_and_never_a_win():
    # one pair, cached steps from 90 to 120 ms: the floor says 1.05x, the bootstrap's interval holds 1.00 (as in
    # tests/test_bench.py's extra rounds): withheld
    noisy = _rot("noisy", 1, 25.0, 40.0, 0.01, rounds=1)
    noisy.runs["base"] = [Run.of([100.0 + i * 0.2 for i in range(10)])]
    row = [0, 95, 0, 120, 0, 90, 0, 118, 0, 112]
    noisy.runs["cache"] = [Run.of([100.0 if i % 2 == 0 else t for i, t in enumerate(row)], CACHED)]
    (p,) = paired([RECORDED[0], noisy], ["cache"], floor_db=30.0)
    withheld = p.prompts[1]
    assert withheld.speedup is None and withheld.note.startswith("timing too noisy to show") and not withheld.win
    assert p.slowest.label == "noisy (seed 1)" and p.worst_speedup is None
    # seeds in the labels only where several seeds ran
    assert labels([RECORDED[0], noisy]) == ["red circle (seed 42)", "noisy (seed 1)"]
    assert labels(RECORDED) == ["red circle", "blue square", "two shapes"]


@pytest.mark.quick
def test_the_paired_plot_is_a_png(tmp_path):
    from PIL import Image

    from studio.report.plots import plot_paired

    out = tmp_path / "paired.png"
    plot_paired(paired(RECORDED, ["cache"], floor_db=30.0), out)
    img = Image.open(out)
    assert img.format == "PNG" and img.size == (704, 484)  # 6.4 x 4.4 inches at 110 dpi


def test_bench_over_two_prompts_on_the_embedded_model(tiny_runner):
    """The real bench over two prompts, each at its own seed: a paired row per stack with two requests, each
    request's figures its own rotation's."""
    from studio.bench.bench import run_bench

    prompts = ("a red circle in the center, blue background", "a green circle at the bottom, white background")
    reqs = [tiny_runner.request(p, seed=s, steps=12) for p, s in zip(prompts, (1, 2))]
    rep = run_bench(tiny_runner, reqs, ["cache"], repeats=1, extra_rounds=0, floor_db=30.0)
    (p,) = rep.paired
    assert p.preset == "cache" and [f.label for f in p.prompts] == [f"{prompts[0]} (seed 1)", f"{prompts[1]} (seed 2)"]
    for f, rot in zip(p.prompts, rep.rotations):
        m = rot.last["cache"].metrics
        assert (f.psnr_db, f.flip, f.cached_steps) == (m.quality.psnr_db, m.quality.flip, m.cache.cached_steps)
        # a win: its interval above 1.00x and the PSNR floor met, and (paired.py: `faster`) base's second run in the
        # same rounds beaten too, which a noisy rotation can deny while the first holds
        shown_above = f.speedup is not None and f.speedup_lo > 1.0 and f.psnr_db >= 30.0
        assert f.win == (shown_above and f.faster) and (f.speedup_lo is not None or not f.faster)
    row = next(r for r in rep.matrix.rows if r.preset == "cache")
    assert row.worst_flip == max(f.flip for f in p.prompts) and row.prompts == 2
    assert rep.as_dict()["paired"][0]["of"] == 2


@pytest.mark.quick
def test_rounds_that_other_programs_crowded_withhold_every_prompts_speed_up_and_say_what_took_the_cores():
    said = "other programs took 36% of the cores its 2 threads needed over 31.0 s"
    (p,) = paired(RECORDED, ["cache"], floor_db=30.0, crowded=said)
    assert [f.speedup for f in p.prompts] == [None, None, None] and p.wins == 0
    assert all(f.note.startswith(f"timing too noisy to show: the machine was busy ({said})") for f in p.prompts)
    assert p.worst_speedup is None  # nothing known of the slowest: the tuner cannot select on it
