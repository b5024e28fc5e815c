"""Serving on a Space: what a ZeroGPU call reserves, computed from the request (no GPU, no `spaces`
needed: the callables are plain functions of the event's arguments, as ZeroGPU calls them)."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from studio.app.gpu_time import MAX_S, MIN_S, Durations, run_seconds
from studio.app.handlers import Studio
from studio.engine import ModelManager, Runner
from studio.spec import PresetLibrary
from studio.spec.hosting import mark_aot_built
from studio.spec.profiles import HUB_PROFILES
from studio.spec.settings import current, using
from studio.worker.service import InProcess

FLUX = "black-forest-labs/FLUX.1-dev"


def _durations() -> Durations:
    runner = Runner(
        ModelManager("cpu", settings=current()), PresetLibrary(), model=FLUX
    )  # nothing loads: profiles and presets only
    return Durations(Studio(InProcess(runner), [FLUX], runner.presets))


def test_a_zerogpu_call_reserves_what_its_request_needs(tmp_path):
    d = _durations()
    req = dict(prompt="a fox", seed=0, model=FLUX, steps=28, width=1024, height=1024)  # each event's form
    one = {**req, "preset": "cache"}  # a Generate's
    off, auto, on = (d.generate(**one, compare=m) for m in ("off", "auto", "on"))
    assert MIN_S <= off < auto < on  # one run < a few pairs < pairs and the extra ones
    per_run = run_seconds(HUB_PROFILES[FLUX], 28, 1024, 1024)
    assert per_run == 28 * HUB_PROFILES[FLUX].gpu_step_s + 3.0
    # a Matrix of every preset reserves more than one image; more repeats, more; capped at MAX_S
    presets = ["base", "cache", "int8", "sage", "cache-int8-sage"]
    m1 = d.matrix(**{**req, "presets": presets, "repeats": 1})
    m3 = d.matrix(**{**req, "presets": presets, "repeats": 3})
    assert auto < m1 < m3 <= MAX_S  # (a Generate with compare on may pair base 7 times: 14 runs)
    small = {**req, "width": 256, "height": 256, "presets": ["base", "cache"], "repeats": 1}
    assert d.matrix(**small) < d.matrix(**small, prompts_text="a\nb\n\na") < MAX_S  # each more prompt, its runs
    from studio.app.limits import PublicGuard, PublicLimits, Refused

    guard = PublicGuard(PublicLimits(max_matrix_runs=8))
    guard.matrix(3, 2)  # (3 + base again) x 2: 8 timed runs
    over = r"a matrix of 3 presets x 2 repeats x 2 prompts is 16 timed runs: .* at most 8 \(fewer presets, repeats or"
    with pytest.raises(Refused, match=over):
        guard.matrix(3, 2, 2)
    # a compile is reserved for: a compiled preset, or compile=true on any
    assert d.generate(**{**one, "preset": "cache-compile"}, compare="off") > off
    assert d.generate(**one, compare="off", compile="true") > off
    with using(zerogpu=True, aot_dir=str(tmp_path)):
        # on ZeroGPU: an ahead-of-time build (engine.aot) for a stack that has one, at a shape not built yet
        assert d.generate(**{**one, "preset": "cache-compile"}, compare="off") > off
        mark_aot_built(
            tmp_path, FLUX, ("aot", "default", "sdpa"), "auto", (1024, 1024, 1, None)
        )  # what a warm-up leaves
        assert d.generate(**{**one, "preset": "cache-compile"}, compare="off") == off  # built: no compile
        assert d.generate(**{**one, "width": 512, "preset": "cache-compile"}, compare="off") > d.generate(
            **{**one, "width": 512}, compare="off"
        )  # another shape: another build
        # the tuner's compiled option builds too, once per shape (its compiled cache stacks run the same blocks)
        small = {**req, "width": 512, "floor": 30}
        unbuilt = d.tune(**small)
        mark_aot_built(tmp_path, FLUX, ("aot", "default", "sdpa"), "auto", (512, 1024, 1, None))
        assert d.tune(**small) < unbuilt
        # a quantized compiled stack builds too (its 8-bit weights quantized before the export: engine.aot), its own
        # packages: the full-precision stack's built marker does not cover it
        int8 = {**one, "preset": "cache-int8-sage"}
        assert d.generate(**int8, compare="off") > d.generate(**{**one, "preset": "cache-compile"}, compare="off")
        mark_aot_built(tmp_path, FLUX, ("aot", "default", "sage", "auto"), "auto", (1024, 1024, 1, None))
        assert d.generate(**int8, compare="off") == off
    # a quarter of the pixels, fewer seconds; a form that cannot be read reserves the least (the handler refuses it)
    assert d.generate(**{**one, "width": 512, "height": 512}, compare="on") < on
    assert d.generate(**{**one, "steps": "many"}, compare="on") == MIN_S
    quarter = {**req, "width": 512, "height": 512, "floor": 30}  # (at 1024x1024: MAX_S, 3 prompts and a compile)
    assert d.tune(**quarter, prompts_text="a\nb\nc") > d.tune(**quarter, prompts_text="a")


def test_spaces_off_zerogpu_and_compile_on_zerogpu(monkeypatch, random_model_dir, settings, tmp_path):
    """What the `spaces` package does offline (installed, no ZeroGPU): its decorator hands a handler back as it is,
    its AoT helpers are there by name and need a CUDA build of torch; and what the studio does on ZeroGPU with a
    compiled preset that cannot compile ahead of time (First-Block-Cache: engine.aot.refusal): runs it eagerly and
    says why (the ahead-of-time path itself, 8-bit weights too: tests/test_aot.py)."""
    import spaces
    import torch

    from studio.app.zerogpu import device_event
    from studio.engine.compile import ZEROGPU_COMPILE
    from studio.report.card import metrics_card

    d = _durations()
    handler = d.generate  # any callable: off ZeroGPU spaces.GPU returns it unwrapped, duration unread
    assert device_event(handler, d.generate) is handler and spaces.GPU(handler, duration=d.generate) is handler
    for name in ("aoti_capture", "aoti_compile", "aoti_apply"):
        helper = getattr(spaces, name)
        if torch.version.cuda is None:  # this CPU build: the helpers' module patches CUDA at import
            with pytest.raises(AttributeError, match="startswith"):
                helper.__wrapped__  # noqa: B018 (the import is the check)
        else:
            assert "module" in inspect.signature(helper.__wrapped__).parameters or name == "aoti_compile"
    settings(zerogpu=True)  # (spec.settings: SPACES_ZERO_GPU read at the edge, spaces already imported)
    runner = Runner(ModelManager("cpu", settings=current()), PresetLibrary(user_dir=tmp_path), model=random_model_dir)
    fbc = "cache_config: {backend: fbcache, residual_diff_threshold: 0.5}\ncompile: {enabled: true, regional: true}\n"
    runner.presets.add("fbc-compile", fbc)
    res = runner.generate(runner.request("a red circle", steps=10), "fbc-compile", compare="off")
    m = res.metrics.as_dict()
    why = ZEROGPU_COMPILE.split("{why}")[0] + "not under First-Block-Cache (its hook replaces the blocks' forward"
    assert any(f.startswith(why) for f in m["fallbacks"]), m["fallbacks"]
    assert "compile: skipped on ZeroGPU" in metrics_card(res.metrics)
    # the cache ran, eagerly (at 10 steps: under MIN_CACHE_STEPS it would be skipped, and the label would say so)
    assert m["cached_steps"] + m["full_steps"] == 10 and "FBCache" in m["tag"] and "compile" not in m["tag"]
    assert "compile->eager" in m["label_changes"] and not m["tag"].endswith("+aot")
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
    pins = [x.split("==") for x in (root / "requirements.txt").read_text().split() if "==" in x]
    assert [n for n, v in pins if n.split("[")[0] == "gradio" and v == meta["sdk_version"]]  # gradio or gradio[extra]
    assert (root / meta["app_file"]).is_file() and meta["suggested_hardware"] == "cpu-basic"
    assert meta["startup_duration_timeout"] == "30m" and "preload_from_hub" not in meta  # the model is in the repo


@pytest.mark.quick
def test_a_visitor_is_the_address_the_last_trusted_proxy_wrote():
    """Behind N trusted proxies that append, the visitor is X-Forwarded-For's N-th entry from the right; what a
    client writes left of it (a first hop rotated per request) never makes a new visitor."""
    from studio.app.limits import visitor
    from studio.spec.settings import Settings

    # the client wrote 198.51.100.1; the Space's proxy appended the address it was reached from
    for forged in ("198.51.100.1", "198.51.100.2, 192.0.2.9"):
        fwd = {"x-forwarded-for": f"{forged}, 203.0.113.7"}
        assert visitor("10.0.0.1", fwd, "s1", proxy_hops=1) == "address 203.0.113.7"
    two = {"x-forwarded-for": "198.51.100.1, 203.0.113.7, 10.9.0.2"}  # two proxies: a load balancer, then another
    assert visitor("10.0.0.1", two, "s1", proxy_hops=2) == "address 203.0.113.7"
    assert visitor("10.0.0.1", {"x-forwarded-for": "203.0.113.7"}, "s1", proxy_hops=2) == "address 10.0.0.1"
    assert visitor("10.0.0.1", two, "s1", proxy_hops=0) == "address 10.0.0.1"  # no proxy of ours: the header is theirs
    assert visitor("10.0.0.1", {}, "s1", proxy_hops=1) == "address 10.0.0.1"
    assert visitor(None, None, "s1", proxy_hops=1) == "session s1"  # no address known: the session
    assert visitor(None, None, None, proxy_hops=0) == "anonymous"
    # the setting: 1 on a Space, 1 behind the operator's proxy (STUDIO_TRUST_FORWARDED=1 keeps its meaning), else 0
    assert Settings.from_env({"SPACE_ID": "a/b"}).proxy_hops == 1 and Settings.from_env({}).proxy_hops == 0
    assert Settings.from_env({"STUDIO_TRUST_FORWARDED": "1"}).proxy_hops == 1
    assert Settings.from_env({"SPACE_ID": "a/b", "STUDIO_PROXY_HOPS": "2"}).proxy_hops == 2
    with pytest.raises(ValueError, match="STUDIO_PROXY_HOPS"):
        Settings.from_env({"STUDIO_PROXY_HOPS": "many"})


@pytest.mark.quick
def test_a_compiled_shape_is_what_builds_graphs_not_the_steps_or_the_seed():
    """The key the public limit counts (the graphs themselves are counted in tests/test_compile.py)."""
    import numpy as np

    from studio.app.limits import compiled_shape, shape_text
    from studio.spec.request import GenerationRequest

    req = GenerationRequest("a red circle", steps=10, seed=1, width=64, height=64)
    key = compiled_shape("tiny", req)
    same = [
        replace(req, steps=28, seed=7, prompt="another prompt"),
        replace(req, true_cfg_scale=4.0, negative_prompt="blurry"),
        replace(req, image=np.zeros((48, 48, 3), np.uint8), strength=0.5),  # img2img: encoded outside
    ]
    assert {compiled_shape("tiny", r) for r in same} == {key}
    others = [replace(req, width=96), replace(req, num_images_per_prompt=2)]
    edit = replace(req, image=np.zeros((48, 80, 3), np.uint8))  # an edit model's reference joins the sequence
    assert len({key, compiled_shape("tiny", edit, edits=True)} | {compiled_shape("tiny", r) for r in others}) == 4
    assert shape_text(key) == "tiny 64x64"
    assert shape_text(compiled_shape("tiny", others[1])) == "tiny 64x64 (batch 2)"
    assert shape_text(compiled_shape("kontext", edit, edits=True)) == "kontext 64x64 (reference picture 80x48)"


def _lines(path: Path) -> list[str]:
    return [x.split("#")[0].strip() for x in path.read_text().splitlines() if x.split("#")[0].strip()]


def _resolved(root: Path, requirements: str) -> dict[str, str]:
    """What pip would install for `requirements` beside this environment (a dry run): {name: version}."""
    report = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "-q", "--report", "-", "-r", requirements],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert report.returncode == 0, report.stderr[-2000:]
    return {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report.stdout)["install"]}


def test_the_gpu_install_is_the_pinned_set_plus_its_kernels_and_resolves():
    """requirements-gpu.txt (a GPU machine, a GPU Space) is requirements.txt's pinned set plus sageattention, triton
    and kernels, and pip resolves it (a dry run: nothing is installed, no GPU needed)."""
    root = Path(__file__).resolve().parents[1]
    cpu, gpu = _lines(root / "requirements.txt"), _lines(root / "requirements-gpu.txt")
    assert gpu[: len(cpu)] == cpu  # the same pins, in the same order
    assert gpu[len(cpu) :] == ["sageattention==1.0.6", "triton", "kernels==0.17.2"]
    todo = _resolved(root, "requirements-gpu.txt")
    assert todo.get("sageattention") == "1.0.6" and todo.get("kernels") == "0.17.2"
    if torch.__version__.split("+")[0] == "2.13.0":  # the pinned torch (.ci/zerogpu-torch runs this on another)
        assert "triton" in todo and "torch" not in todo  # the test environment's torch satisfies it as it is


def test_the_zerogpu_install_is_the_gpu_install_on_a_torch_zerogpu_lists_and_resolves():
    """requirements-zerogpu.txt (a ZeroGPU Space) is requirements-gpu.txt with its torch line alone changed, to a
    release ZeroGPU's documentation lists; pip resolves it (a dry run); the start on ZeroGPU says a torch it does
    not list (docs/deploy.md#zerogpu). `.ci/zerogpu-torch` runs the test suite on that torch."""
    from studio.spec.devices import ZEROGPU_TORCH, zerogpu_torch_note

    root = Path(__file__).resolve().parents[1]
    gpu, zero = _lines(root / "requirements-gpu.txt"), _lines(root / "requirements-zerogpu.txt")
    changed = [(a, b) for a, b in zip(gpu, zero, strict=True) if a != b]
    assert changed == [("torch==2.13.0", "torch==2.11.0")] and "2.11.0" in ZEROGPU_TORCH
    todo = _resolved(root, "requirements-zerogpu.txt")
    if torch.__version__.split("+")[0] != "2.11.0":  # (.ci/zerogpu-torch runs this with 2.11.0 installed)
        assert todo["torch"] == "2.11.0" and "triton" in todo  # the CUDA build, with the triton it pins
    assert zerogpu_torch_note("2.11.0+cu130") is None
    note = zerogpu_torch_note("2.13.0+cpu")
    assert note.startswith("torch 2.13.0 is not a release ZeroGPU lists (2.8.0, 2.9.1, 2.10.0, 2.11.0)")
    assert "requirements-zerogpu.txt" in note
