"""Serving on a Space: what a ZeroGPU call reserves, computed from the request (no GPU, no `spaces`
needed: the callables are plain functions of the event's arguments, as ZeroGPU calls them)."""

from __future__ import annotations

import inspect

import pytest

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


def test_spaces_off_zerogpu_and_compile_on_zerogpu(monkeypatch, random_model_dir, settings):
    """What the `spaces` package does offline (installed, no ZeroGPU): its decorator hands a handler back as it is,
    its AoT helpers are there by name and need a CUDA build of torch; and what the studio does on ZeroGPU with a
    compiled preset: runs it eagerly and says why (ahead-of-time compilation is not used: engine.compile)."""
    import spaces
    import torch

    from studio.app.ui import _gpu
    from studio.engine.compile import ZEROGPU_COMPILE
    from studio.report.card import metrics_card

    d = _durations()
    handler = d.generate  # any callable: off ZeroGPU spaces.GPU returns it unwrapped, duration unread
    assert _gpu(handler, d.generate) is handler and spaces.GPU(handler, duration=d.generate) is handler
    for name in ("aoti_capture", "aoti_compile", "aoti_apply"):
        helper = getattr(spaces, name)
        if torch.version.cuda is None:  # this CPU build: the helpers' module patches CUDA at import
            with pytest.raises(AttributeError, match="startswith"):
                helper.__wrapped__  # noqa: B018 (the import is the check)
        else:
            assert "module" in inspect.signature(helper.__wrapped__).parameters or name == "aoti_compile"
    settings(zerogpu=True)  # (spec.settings: SPACES_ZERO_GPU read at the edge, spaces already imported)
    runner = Runner(ModelManager("cpu"), PresetLibrary(), model=random_model_dir)
    res = runner.generate(runner.request("a red circle", steps=10), "cache-compile", compare="off")
    m = res.metrics.as_dict()
    assert ZEROGPU_COMPILE in m["fallbacks"] and "compile: skipped on ZeroGPU" in metrics_card(res.metrics)
    # the cache ran, eagerly (at 10 steps: under MIN_CACHE_STEPS it would be skipped, and the label would say so)
    assert m["cached_steps"] + m["full_steps"] == 10 and "DBCache" in m["tag"] and "compile" not in m["tag"]
    assert m["label_changes"] == ["compile->eager"]
    tr = runner.manager.current.pipe.transformer
    assert not any(getattr(b, "_compiled_call_impl", None) for b in tr.modules())  # nothing was compiled


def test_the_space_front_matter_matches_what_runs():
    """The README's front matter is the Space's configuration: the gradio it names is the pinned one, the app file
    exists, and the hardware and start-up keys a host reads are there (README: Deploy to a Space)."""
    from pathlib import Path

    import gradio
    import yaml

    root = Path(__file__).resolve().parents[1]
    head = (root / "README.md").read_text().split("---\n")[1]
    meta = yaml.safe_load(head)
    assert meta["sdk"] == "gradio" and meta["sdk_version"] == gradio.__version__
    assert f"gradio=={meta['sdk_version']}" in (root / "requirements.txt").read_text().split()
    assert (root / meta["app_file"]).is_file() and meta["suggested_hardware"] == "cpu-basic"
    assert meta["startup_duration_timeout"] == "30m" and "preload_from_hub" not in meta  # the model is in the repo
