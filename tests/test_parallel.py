"""Parallel presets on 2 Ray CPU workers (cache-dit Ulysses, gloo), on the embedded model, in float32 so that the
parallel picture can be held to the one-process one within 60 dB. Starting workers takes ~10 s on 2 cores."""

from __future__ import annotations

import os
import subprocess

import pytest

from studio.engine import ModelManager, RunError, Runner
from studio.measure.quality import psnr
from studio.spec import PresetLibrary
from studio.spec.settings import current

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray")
pytest.importorskip("einops")

PROMPT = "a red circle in the center, blue background"


def ray_processes() -> str:
    out = subprocess.run(["pgrep", "-fa", "raylet|gcs_server|RayPipelineWorker"], capture_output=True, text=True)
    return "\n".join(x for x in out.stdout.splitlines() if "pgrep" not in x)


@pytest.fixture
def runner(tmp_path):
    lib = PresetLibrary(user_dir=tmp_path)
    lib.add("b32", "dtype: float32\n")
    lib.add("c32", "dtype: float32\ncache_config: {residual_diff_threshold: 0.24}\n")
    lib.add("u32", "dtype: float32\nparallelism_config: {ulysses_size: 2}\n")
    lib.add(
        "cu32",
        "dtype: float32\ncache_config: {residual_diff_threshold: 0.24}\nparallelism_config: {ulysses_size: 2}\n",
    )
    r = Runner(ModelManager("cpu", settings=current()), lib, model="tiny")
    yield r
    r.manager.unload()


def test_ulysses2_gives_the_one_process_picture_and_cached_steps_and_survives_a_killed_worker(runner):
    """One Ray runtime for the whole story (starting one costs ~10 s on 2 cores)."""
    req = runner.request(PROMPT, seed=42)
    one = runner.generate(req, "b32", compare=False)
    u2 = runner.generate(req, "u32", compare=False).metrics
    assert u2.placement.parallel["world_size"] == 2 and [w["rank"] for w in u2.placement.parallel["workers"]] == [0, 1]
    assert {w["device"] for w in u2.placement.parallel["workers"]} == {"cpu"}
    assert any(line.startswith("parallel: ulysses2 over 2 Ray workers") for line in u2.labels.engaged)
    assert (
        "timed inside parallel worker rank 0" in u2.timing.how
        and u2.timing.denoise_s > 0
        and len(u2.timing.step_ms) == req.steps
    )
    u2_image = runner.generate(req, "u32", compare=False).image
    assert psnr(u2_image, one.image) >= 60.0
    # the cache inside the workers caches the steps the one-process cache caches, counted by both sources
    c = runner.generate(req, "c32", compare=False).metrics
    cu = runner.generate(req, "cu32", compare=False).metrics
    assert cu.cache.cached_step_indices == c.cache.cached_step_indices and cu.cache.cached_steps > 0
    assert cu.cache.count_check is not None and cu.cache.count_check.startswith("agrees")
    # a base run between parallel ones (the comparison beside each) leaves the workers up, its picture bitwise the same
    workers = cu.placement.parallel["workers"]
    assert (runner.generate(req, "b32", compare=False).image == one.image).all()
    before = runner.generate(req, "cu32", compare=False)
    assert before.metrics.placement.parallel["workers"] == workers
    # a worker killed outright: that request ends with a sentence, the next starts new workers, the same picture
    pids = [w["pid"] for w in workers]
    os.kill(pids[1], 9)
    with pytest.raises(RunError, match="parallel worker failed during the run.*next request starts them again"):
        runner.generate(req, "cu32", compare=False)
    again = runner.generate(req, "cu32", compare=False)
    assert [w["pid"] for w in again.metrics.placement.parallel["workers"]] != pids
    assert (
        again.metrics.cache.cached_step_indices == cu.cache.cached_step_indices and (again.image == before.image).all()
    )
    # switching to another stack stops them
    runner.generate(req, "c32", compare=False)
    assert not ray.is_initialized()
    runner.manager.unload()
    assert not ray.is_initialized()
    assert ray_processes() == ""


def test_more_workers_than_this_machine_has_runs_in_one_process_and_says_why(runner, tmp_path):
    runner.presets.add("u64", "dtype: float32\nparallelism_config: {ulysses_size: 64}\n")
    req = runner.request(PROMPT, seed=42, steps=8)
    m = runner.generate(req, "u64").metrics
    assert any("64 workers need 64 CPU cores" in f and "running in one process" in f for f in m.labels.fallbacks)
    assert m.placement.parallel is None and m.quality.verdict.value == "identical"
    assert not ray.is_initialized()
