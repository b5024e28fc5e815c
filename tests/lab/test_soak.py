"""The soak (lab.soak.plan, lab.soak.visitors): app.py in public mode on loopback, driven for half a minute by
honest visitors through the three ways in and hostile ones past every limit (each hostile visitor's first round of
attacks runs whole, however long it takes). The 30-minute run and its figures are in docs/deploy.md; this is CI's
short version."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from lab.soak.plan import SoakPlan
from lab.soak.report import soak_text

ATTACKS = {
    "burst over the rate",
    "crowd at once",
    "oversize body",
    "oversize prompt",
    "steps over",
    "size over",
    "batch over",
    "uploads over the writes",
    "heavy uploads over the bytes an hour",
    "rotating addresses of one /64",
}


def test_a_short_soak_serves_every_honest_visitor_and_refuses_every_attack_with_its_sentence():
    """Every honest request served, none refused by another visitor's limit (the hostile ones rotate their own first
    X-Forwarded-For hop), none lost or hung; every attack past a limit refused with that limit's sentence; the
    studio's files within their cap. (Memory is measured and reported; its target, at most 10% growth after the
    warm-up, is the 30-minute run's: a short run is still the warm-up of gradio's and Python's own caches.)"""
    from lab.soak.visitors import run_soak

    # 8 sessions, not the public 64: filling the session store is the 30-minute run's warm-up for its memory figures,
    # and no attack here depends on its size. The limits lower than the public defaults (6 requests and 6 writes a
    # minute, 16 MiB of uploads an hour): every attack is the same, each past its limit in fewer requests
    plan = SoakPlan(minutes=0.5, visitors=3, hostile=2, sessions=8, requests_per_minute=6, writes_per_minute=6)
    rep = run_soak(replace(plan, upload_mb_per_hour=16))
    text = soak_text(rep)
    targets = rep.targets()
    for name in (
        "every honest request served",
        "none lost or hung",
        "every hostile attempt past a limit refused with its sentence",
        "the studio's files within STUDIO_MAX_FILES_MB=64 throughout",
        "gradio's cache within STUDIO_MAX_CACHE_MB=256 (+ its grace) throughout",
    ):
        assert targets[name], text
    # every way in served honest visitors (how many in the run is the machine's pace: a busy one serves fewer, and
    # a count of it would be a timed assertion; the 30-minute run's figures are in docs/deploy.md)
    served = {k for (w, k, o) in rep.counts if w == "honest" and o == "served"}
    assert served == {"generate", "images", "v1"}, text
    tried = {k for (w, k, _) in rep.counts if w == "hostile"}
    refused = {k for (w, k, o) in rep.counts if w == "hostile" and o == "refused with its sentence"}
    assert tried == ATTACKS, text  # every attack, at least once
    # each attack but the burst and the crowd is past its limit on every try; a burst of sequential requests is past
    # the rate only where they come faster than the rate (a machine busy with other tests may answer slower), a crowd
    # sent at once past the waiting a visitor may have only while the device is busy: either way, none was answered
    # otherwise (the target above)
    paced = {"burst over the rate", "crowd at once", "rotating addresses of one /64"}
    assert refused >= ATTACKS - paced, text
    served_bursts = sum(rep.counts.get(("hostile", k, "served within the limits"), 0) for k in paced)
    assert served_bursts <= 3 * rep.plan.requests_per_minute * 2, text  # a rotated hop or /64 address bought no more
    end = rep.snapshot("end")
    assert end.app_rss_mb > 50 and end.worker_rss_mb > 50, text  # both measured (the worker: a child of the app)
    assert json.loads(json.dumps(rep.as_dict()))["targets"] == targets


@pytest.mark.quick
def test_a_soak_plan_names_a_value_out_of_range():
    from studio.spec.checks import ConfigError

    with pytest.raises(ConfigError, match="soak.visitors=0 is not valid"):
        SoakPlan(visitors=0)
    with pytest.raises(ValueError, match="minutes=0 is not valid: from 0.05 to 1440"):
        SoakPlan(minutes=0)
