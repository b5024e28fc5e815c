"""Nothing crosses from one request to the next (issue 58): a run cut between two steps (the time limit, out of
memory, any exception) leaves no step-cache state behind. diffusers resets its hooks' state only at the end of a
pipeline call, so without the reset the next request (maybe another visitor's) would start from the cut run's Taylor
factors, accumulated error or cached attention (studio.engine.call.call_pipe)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from studio.engine import ModelManager, Runner
from studio.spec import GenerationRequest, PresetLibrary
from studio.spec.errors import OverTime
from studio.spec.settings import current

REQ = GenerationRequest(
    prompt="a red circle in the center, blue background", seed=3, steps=16, width=64, height=64, max_sequence_length=32
)


def _cut_at(step: int):
    def progress(i, total, record):
        if i == step:
            raise OverTime(f"stopped after step {step} (the test's time limit)")

    return progress


@pytest.mark.parametrize("preset", ["magcache", "taylorseer", "pab"])
def test_a_run_cut_midway_leaves_the_next_request_as_a_fresh_process_makes_it(tiny_runner, preset):
    first = tiny_runner.generate(REQ, preset, compare="off")  # warm, and the hook's state of a finished run
    assert first.metrics.cache.cached_steps > 0
    with pytest.raises(OverTime, match="stopped after step 9"):
        tiny_runner.generate(replace(REQ, seed=5), preset, compare="off", progress=_cut_at(9))
    after = tiny_runner.generate(REQ, preset, compare="off")
    other = replace(REQ, width=48, height=48)
    with pytest.raises(OverTime):
        tiny_runner.generate(replace(other, seed=5), preset, compare="off", progress=_cut_at(6))
    after_other = tiny_runner.generate(other, preset, compare="off")
    fresh = Runner(ModelManager("cpu", settings=current()), PresetLibrary(), model="tiny")
    try:
        want, want_other = (fresh.generate(r, preset, compare="off") for r in (REQ, other))
    finally:
        fresh.manager.unload()
    for got, ref in ((after, want), (after_other, want_other)):
        assert np.array_equal(got.image, ref.image)
        assert got.metrics.cache.cached_step_indices == ref.metrics.cache.cached_step_indices
    assert np.array_equal(after.image, first.image)  # and the same as before the cut run
