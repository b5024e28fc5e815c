"""Serving on a Space (issue 22): what a ZeroGPU call reserves, computed from the request (no GPU, no `spaces`
needed: the callables are plain functions of the event's arguments, as ZeroGPU calls them)."""

from __future__ import annotations

from studio.app.gpu_time import MAX_S, MIN_S, Durations, run_seconds
from studio.app.handlers import Studio
from studio.engine import ModelManager, Runner
from studio.spec import PresetLibrary
from studio.spec.profiles import HUB_PROFILES
from studio.worker.service import InProcess

FLUX = "black-forest-labs/FLUX.1-dev"


def _durations() -> Durations:
    runner = Runner(ModelManager("cpu"), PresetLibrary(), model=FLUX)  # nothing loads: profiles and presets only
    return Durations(Studio(InProcess(runner), [FLUX], runner.presets))


def test_a_zerogpu_call_reserves_what_its_request_needs():
    d = _durations()
    one = dict(model=FLUX, steps=28, width=1024, height=1024, preset="cache")
    off, auto, on = (d.generate(**one, compare=m) for m in ("off", "auto", "on"))
    assert MIN_S <= off < auto < on  # one run < a few pairs < pairs and the extra ones
    per_run = run_seconds(HUB_PROFILES[FLUX], 28, 1024, 1024)
    assert per_run == 28 * HUB_PROFILES[FLUX].gpu_step_s + 3.0
    # a Matrix of every preset reserves more than one image; more repeats, more; capped at MAX_S
    presets = ["base", "cache", "int8", "sage", "cache-int8-sage"]
    m1 = d.matrix(**{**one, "presets": presets, "repeats": 1})
    m3 = d.matrix(**{**one, "presets": presets, "repeats": 3})
    assert auto < m1 < m3 <= MAX_S  # (a Generate with compare on may pair base 7 times: 14 runs)
    # a compile is reserved for: a compiled preset, or compile=true on any
    assert d.generate(**{**one, "preset": "cache-compile"}, compare="off") > off
    assert d.generate(**one, compare="off", compile="true") > off
    # a quarter of the pixels, fewer seconds; a form that cannot be read reserves the least (the handler refuses it)
    assert d.generate(**{**one, "width": 512, "height": 512}, compare="on") < on
    assert d.generate(**{**one, "steps": "many"}, compare="on") == MIN_S
    assert d.tune(**one, prompts_text="a\nb\nc") > d.tune(**one, prompts_text="a")
