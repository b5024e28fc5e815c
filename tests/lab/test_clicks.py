"""`python -m lab clicks`' verdicts (lab/clicks.py, studio/report/text.py): wall-time ratios and how many
clicks of new prompts showed a speed-up, from a report as run_clicks fills it."""

from __future__ import annotations

import pytest

from lab.clicks import ClickReport, clicks_text

pytestmark = pytest.mark.quick


def _report(shown_auto: list[bool]) -> ClickReport:
    rep = ClickReport("cache")
    rep.wall = {"off": [1.0, 1.1, 0.9], "auto": [1.1, 1.2, 1.0], "on": [3.0, 3.4, 3.2]}
    rep.timing = {m: f"{m} line" for m in rep.wall}
    rep.shown = {"off": [False] * 3, "auto": shown_auto, "on": [True] * 6}
    return rep


def test_the_clicks_verdict_counts_the_numbers_shown():
    good = _report([True] * 5 + [False])  # 5 of 6: the target
    assert good.auto_over_off == pytest.approx(1.1) and good.on_over_off == pytest.approx(3.2) and good.passed
    text = clicks_text(good, "http://x/")
    assert "PASS: an auto click is 1.10x the stack's own run (target <= 1.3x)" in text
    assert "PASS: clicks of new prompts that showed a speed-up: auto 5 of 6, on 6 of 6" in text
    bad = _report([True] * 4 + [False] * 2)  # 4 of 6: the wall times pass, the numbers do not
    assert not bad.passed and "FAIL: clicks of new prompts that showed a speed-up: auto 4 of 6" in clicks_text(bad, "")
