"""Fast unit tests of the pure parts: step counting, the probe's clock, dtype resolution, formatting, handlers."""

from __future__ import annotations

import html
import json
import math
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import plain_ui

from studio.engine.device import resolve_dtype
from studio.measure.crowding import Crowding
from studio.measure.estimate import Estimate
from studio.measure.quality import Verdict
from studio.measure.record import FLAT_NAMES, PARTS, RunMetrics
from studio.measure.timing import StepCounter, StepProbe, StepRecord, count_steps
from studio.report import fmt
from studio.report.card import metrics_card
from studio.report.table import MatrixRow
from studio.spec import ConfigError
from studio.spec.devices import PROFILES, DeviceProfile

pytestmark = pytest.mark.quick  # the one-minute loop: no model is loaded here (pytest -m quick)

CPU = torch.device("cpu")


# ------------------------------------------------------------------------------------------- step counting
def _records(calls, hook_runs=None, state_runs=None):
    n = len(calls)
    hook_runs = hook_runs if hook_runs is not None else [None] * n
    state_runs = state_runs if state_runs is not None else [None] * n
    return [StepRecord(c, h, s) for c, h, s in zip(calls, hook_runs, state_runs)]


def test_count_from_hooks_cross_checked_with_cache_dit():
    steps = _records([1] * 6, hook_runs=[1, 1, 0, 1, 0, 0])
    c = count_steps(steps, "cache-dit", [2, 4, 5])
    assert (c.cached, c.full, c.cached_indices, c.source) == (3, 3, [2, 4, 5], "block hooks")
    assert c.check == "agrees with cache-dit" and not c.disagree


def test_count_disagreement_is_reported_not_hidden():
    steps = _records([1] * 6, hook_runs=[1, 1, 0, 1, 0, 0])
    c = count_steps(steps, "cache-dit", [2, 3])
    assert c.cached_indices == [2, 4, 5] and c.disagree
    assert c.check == "DISAGREES: cache-dit says [2, 3]; block hooks say [2, 4, 5]"


def test_count_under_compile_comes_from_the_backend():
    blind = _records([1] * 5)  # compiled blocks: the hooks see nothing
    c = count_steps(blind, "cache-dit", [3, 4])
    assert (c.cached_indices, c.full, c.source, c.check) == ([3, 4], 3, "cache-dit", None)
    fb = _records([1] * 5, state_runs=[1, 0, 0, 1, 0])
    c = count_steps(fb, "fbcache", None)
    assert (c.cached_indices, c.source) == ([1, 2, 4], "fbcache state")
    none = count_steps(blind, "none", None)
    assert (none.cached, none.full) == (0, 5) and none.source.startswith("no step cache engaged")
    assert count_steps(blind, "fbcache", None).disagree  # a cache nobody can see is said, not guessed


def test_two_calls_per_step_count_as_cached_only_when_a_call_skipped():
    steps = _records([2, 2, 2], hook_runs=[2, 1, 0])
    assert count_steps(steps, "none", None).cached_indices == [1, 2]


class FakeClock:
    def __init__(self, ticks):
        self.ticks, self.marks = list(ticks), []

    def mark(self):
        self.marks.append(self.ticks.pop(0))

    def seconds(self):
        return [m - self.marks[0] for m in self.marks[1:]]


def test_probe_times_from_first_transformer_call_to_last_step():
    counter = StepCounter()
    probe = StepProbe(counter, CPU, total_steps=3, clock=FakeClock([10.0, 10.5, 11.0, 12.0]))
    with probe:
        counter._on_call(None, ())  # the first transformer call starts the clock (text encoding is before it)
        counter._on_run(None, (), None)
        probe(None, 0, None, {})
        counter._on_call(None, ())
        probe(None, 1, None, {})  # this call did not reach the last block: cached
        counter._on_call(None, ())
        counter._on_run(None, (), None)
        probe(None, 2, None, {})
    assert probe.step_seconds() == [0.5, 0.5, 1.0] and probe.denoise_seconds() == 2.0
    assert [s.cached for s in probe.steps] == [False, True, False]


def test_progress_reporting_is_kept_out_of_denoise_time():
    import time

    counter = StepCounter()
    probe = StepProbe(
        counter, CPU, on_step=lambda *a: time.sleep(0.05), total_steps=3, clock=FakeClock([0.0, 1.0, 2.0, 3.0])
    )
    with probe:
        for i in range(3):
            counter._on_call(None, ())
            probe(None, i, None, {})
    steps = probe.step_seconds()
    # the clock says 1 s per step; the >= 50 ms of progress after steps 0 and 1 came out of steps 1 and 2 (a sleep
    # may overrun on a loaded machine, never undershoot)
    assert steps[0] == 1.0 and 0.5 < steps[1] <= 0.951 and 0.5 < steps[2] <= 0.951
    assert probe.denoise_seconds() == pytest.approx(sum(steps))


# ------------------------------------------------------------------------------------------------- dtype
@pytest.mark.parametrize(
    "asked,flags,expected",
    [
        ("auto", {"avx2", "fma"}, "float32"),  # bf16 would be emulated: 2-4x slower
        ("auto", {"avx2", "avx512_bf16"}, "bfloat16"),
        ("auto", {"avx2", "amx_bf16", "amx_tile"}, "bfloat16"),
        ("bfloat16", {"avx2"}, "bfloat16"),  # an explicit dtype wins
        ("float32", {"amx_bf16"}, "float32"),
    ],
)
def test_dtype_auto_on_cpus(asked, flags, expected):
    choice = resolve_dtype(
        asked, DeviceProfile("x", "cpu", "a CPU", flags=frozenset(flags))
    )  # the rule itself: no dtype setting handed down
    assert choice.name == expected
    if asked == "auto":
        assert choice.note.startswith(f"auto: {expected}")


def test_dtype_setting_replaces_auto_only():
    from studio.spec.checks import ConfigError
    from studio.spec.settings import Settings

    forced = Settings.from_env({"STUDIO_DTYPE": "float32"}).dtype  # read at the edge, handed down
    choice = resolve_dtype("auto", PROFILES["cpu-amx"], forced=forced)
    assert choice.note == "auto: float32 (STUDIO_DTYPE)"
    assert resolve_dtype("bfloat16", PROFILES["cpu"], forced=forced).name == "bfloat16"
    with pytest.raises(ConfigError, match="STUDIO_DTYPE='fp8' is not valid"):  # refused where it is read, at start
        Settings.from_env({"STUDIO_DTYPE": "fp8"})


def test_dtype_auto_on_gpus():  # the rule itself: no dtype setting handed down
    assert resolve_dtype("auto", PROFILES["a10g"]).name == "bfloat16"
    old = resolve_dtype("auto", PROFILES["t4"])  # torch says bf16 is "supported" on a T4: emulated, not native
    assert old.name == "float16" and "not supported by this GPU (sm_75)" in old.note
    assert resolve_dtype("float32", PROFILES["h200"]).name == "float32"


# ------------------------------------------------------------------------------------------------ report
def make_metrics(**kw) -> RunMetrics:
    d = dict(
        model="m",
        preset="cache",
        tag="fp32+DBCache_F1B0W4R0.24MC3+sdpa",
        device="cpu",
        dtype="float32",
        request={"prompt": "p"},
        denoise_s=0.5,
        step_ms=[50.0] * 10,
        mean_step_ms=50.0,
        full_steps=6,
        cached_steps=4,
        transformer_calls=10,
        cached_step_indices=[4, 5, 7, 8],
        count_source="block hooks",
        count_check="agrees with cache-dit",
        residual_diffs={4: 0.1},
        cache_threshold=0.24,
        backend_cached_steps=[4, 5, 7, 8],
        backend_cfg_cached_steps=None,
        speedup=1.8,
        base_denoise_s=0.9,
        base_age_s=2.0,
        psnr_db=41.234,
        ssim=0.99123,
        hf_ratio=1.0,
        quality=Verdict.GOOD,
        timing="warm-up run done earlier, 1 timed run",
        compile_s=None,
        warmup_s=None,
        engaged=["cache: cache-dit DBCache"],
        fallbacks=["sage: unavailable on cpu"],
        reloaded=False,
        total_s=1.0,
        worst_tile_psnr_db=30.1,
        worst_tile_yx=[8, 16],
    )
    d.update(kw)
    return RunMetrics.from_dict(d)


def test_formats():
    assert (fmt.psnr(math.inf), fmt.psnr(None), fmt.psnr(41.234)) == ("inf", "n/a", "41.23 dB")
    assert (fmt.speedup(1.8), fmt.ssim(0.99123), fmt.steps(4, 6)) == ("1.80x", "0.9912", "4 cached / 6 full")
    assert [fmt.verdict_level(v) for v in (Verdict.GOOD, Verdict.LOSSY, Verdict.BROKEN)] == ["ok", "warn", "broken"]
    assert (fmt.tile(30.1, [8, 16]), fmt.tile(math.inf, [0, 0]), fmt.tile(None, None)) == (
        "30.10 dB at (y 8, x 16)",
        "inf",
        "n/a",
    )
    assert fmt.error_map_note(8, "Above").startswith("Above: the error map |image − base| per pixel (the largest")
    assert "×8, saturating at 255: black is no change, white an error of 32 or more of 255" in fmt.error_map_note(
        8, ""
    )


def test_error_picture_is_the_map_enlarged_with_the_worst_tile_framed():
    from studio.report.images import FRAME_RGB, error_picture

    a = np.zeros((16, 16, 3), np.uint8)
    b = a.copy()
    b[8:16, 0:8] = 10  # the lower-left tile, off by 10: x8 = 80 in the map
    assert error_picture(a, None) is None  # no base, no map
    assert not error_picture(a, a).any() and error_picture(a, a).shape == (384, 384, 3)  # identical: all black
    pic = error_picture(b, a, [8, 0])  # 16 px shown x24; the frame (8 px thick) lies inside the tile's 192 px
    assert pic[192, 0].tolist() == list(FRAME_RGB) and pic[383, 191].tolist() == list(FRAME_RGB)
    assert pic[300, 100].tolist() == [80, 80, 80] and not pic[:192].any() and not pic[:, 192:].any()


def test_card_shows_counts_source_timing_and_fallbacks_apart():
    html = metrics_card(make_metrics(compile_s=12.5))
    assert "4 cached / 6 full" in html and "counted by block hooks; agrees with cache-dit" in html
    assert "1.80x (base 0.900 s)" in html and "41.23 dB / 0.9912" in html
    assert "worst 8x8 tile</td><td>30.10 dB at (y 8, x 16)" in html  # beside the global PSNR
    assert "compile warm-up</td><td>12.5 s (not in denoise time)" in html
    assert "fell back" in html and html.index("sage: unavailable") > html.index("fell back")
    assert "warm-up run done earlier, 1 timed run" in html and "cpu, float32" in html
    assert "flag-broken" in metrics_card(make_metrics(quality=Verdict.BROKEN))


def test_the_card_leads_with_the_answer_and_no_cell_is_a_paragraph():
    """One line first (the speed-up, PSNR, FLIP in words, the counts, against fewer steps), the figures behind it,
    the rest folded; LPIPS without its weights says 'not installed', not how to install them."""
    import re

    from studio.measure.lpips import NO_WEIGHTS

    fewer = {"steps": 16, "full": 28, "speedup": 1.75, "psnr_db": 38.0, "margin_db": 41.234 - 38.0}
    m = make_metrics(flip=0.031, lpips_note=NO_WEIGHTS, vs_fewer=fewer)
    card = metrics_card(m)
    first = re.search(r'<div class="card-answer">(.*?)</div>', card).group(1)
    assert first == (
        "1.80x vs base · PSNR 41.23 dB · FLIP 0.0310 (hard to see) · 4 cached / 6 full · beats base at 16 steps "
        "(+3.2 dB)"
    )
    assert card.index("card-answer") < card.index("<table>") < card.index("<details>")
    assert "<td>LPIPS</td><td>not installed" in card and "hub cache" not in card
    cells = [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td>(.*?)</td>", card, re.S)]
    assert max(len(c) for c in cells) <= 300, max(cells, key=len)
    assert metrics_card(make_metrics(speedup=None, speedup_note="busy machine")).count("speed-up withheld (busy") == 1
    # the longest words a busy host gives: a withheld speed-up (the estimate's own sentence) and a slow host
    busy = Estimate(1.1, 0.8, 1.6, 3, crowded=Crowding(0.85, 0.9, 176.4, 2, 2, host=0.4, source="/proc/stat").words())
    for worst in (
        make_metrics(speedup=None, speedup_note=busy.why_not(), timed_pairs=3, stalled_runs=2, vs_fewer=fewer),
        make_metrics(
            speedup_lo=1.5, speedup_hi=2.1, base_pace_over=0.9, cores_host=0.6, timed_pairs=12, vs_fewer=fewer
        ),
    ):
        card = metrics_card(worst)
        cells = [html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<td>(.*?)</td>", card, re.S)]
        first = re.search(r'<div class="card-answer">(.*?)</div>', card).group(1)
        assert max(len(c) for c in cells + [first]) <= 300, max(cells + [first], key=len)
    assert "host was slow" in card and "timing too noisy" in metrics_card(
        make_metrics(speedup=None, speedup_note=busy.why_not())
    )
    same = make_metrics(psnr_db=math.inf, vs_fewer={**fewer, "margin_db": math.inf})  # bitwise base's picture
    assert "beats base at 16 steps (identical to base)" in metrics_card(same) and "inf dB" not in metrics_card(same)


def test_metrics_json_keys():
    d = make_metrics().as_dict()
    assert d["quality"] == "good" and d["residual_diffs"] == {"4": 0.1}
    for key in ("speedup", "psnr_db", "ssim", "denoise_s", "full_steps", "cached_steps", "dtype", "engaged"):
        assert key in d


# ---------------------------------------------------------------------------------------------- handlers
class FakeRunner:
    """Stands in for the engine: records what the handler asked for and answers with a fixed run."""

    def __init__(self, broken=()):
        self.calls = []
        self.broken = set(broken)  # presets whose run comes back with a broken verdict

    def profile(self, model):
        from studio.spec import ModelProfile

        return ModelProfile("m", width=64, height=64, steps=10, guidance=None)  # a model that takes no guidance

    def request(self, prompt, model=None, **kw):
        return self.profile(model).request(prompt, **kw)  # (studio.worker.protocol.Device's)

    def generate(self, req, stack, **kw):
        """`stack`: the event's Ask's stack, resolved and switched (spec.ask): never a name to look up again."""
        from studio.engine.runner import RunResult

        self.calls.append((req, stack, kw))
        img = np.zeros((64, 64, 3), np.uint8)
        quality = Verdict.BROKEN if stack.name in self.broken else Verdict.GOOD
        return RunResult(img, img, make_metrics(preset=stack.name, quality=quality))


def _handlers(broken=()):
    from studio.app.handlers import Handlers, Studio
    from studio.spec import PresetLibrary

    runner = FakeRunner(broken)
    return Handlers(Studio(runner, ["m"], PresetLibrary()), plain_ui()), runner


NO_PROGRESS = dict(progress=lambda *a, **k: 0)
REQUEST = dict(prompt="a red circle", model="m", seed=7, steps=10, width=64, height=64, guidance=None)


def test_generate_handler_passes_switches_and_returns_components():
    h, runner = _handlers()
    out = h.generate(
        **NO_PROGRESS, history=[], **REQUEST, preset="cache-compile", cache="true", threshold=0, compile="false"
    )
    req, stack, kw = runner.calls[0]
    assert (req.seed, req.steps, stack.name) == (7, 10, "cache-compile.override")  # the Ask's stack: switched once
    assert stack.cache_config.enabled and not stack.compile.enabled  # cache true, compile false; threshold 0: as is
    assert (
        stack.cache_config.residual_diff_threshold
        == h.studio.presets.get("cache").cache_config.residual_diff_threshold
    )
    assert not {"cache_enabled", "cache_threshold", "compile_enabled"} & set(kw)  # nothing left to switch again
    assert kw["time_limit_s"] is None  # no limit per request unless the operator (or public mode) sets one
    h.studio.time_limit_s = 300
    h.generate(**NO_PROGRESS, history=None, **REQUEST, preset="cache")
    assert runner.calls[-1][2]["time_limit_s"] == 300
    expected = {"gen.image", "gen.card", "gen.base_image", "gen.steps_plot", "hist.table", "hist.rows", "gen.json"}
    assert set(out) == expected | {
        "gen.error_map",
        "gen.json_file",
        "hist.gallery",
        "gen.batch",
        "gen.last",
        "gen.compared",
    }
    from studio.app.maps import FLIP, show_map

    kept = out["gen.compared"]  # the pair at its own size, for the map the person picks after the run (app.maps)
    assert kept.image.shape == kept.base.shape == (64, 64, 3) and kept.where == "Above"
    flip_pic, note = show_map(FLIP, kept, "Above")
    assert flip_pic.shape == (384, 384, 3) and note.startswith("Above: FLIP's error map of image against base")
    assert (flip_pic == (0, 0, 4)).all()  # the fake's picture is its base: no visible difference, no tile framed
    from studio.report.images import FRAME_RGB

    pic = out["gen.error_map"].reshape(-1, 3)  # the fake's image is its base: black, but for the metrics' tile frame
    assert out["gen.error_map"].shape == (384, 384, 3) and {tuple(p) for p in pic[pic.any(axis=1)]} == {FRAME_RGB}
    assert out["gen.json"]["cached_step_indices"] == [4, 5, 7, 8] and out["gen.json"]["speedup"] == 1.8
    assert out["gen.image"].shape == (384, 384, 3)  # 64 px shown enlarged x6, nearest neighbour
    assert "4 cached / 6 full" in out["gen.card"] and len(out["hist.rows"].rows) == 1
    assert json.loads(Path(out["gen.json_file"]).read_text())["cached_step_indices"] == [4, 5, 7, 8]


def test_handlers_take_the_forms_fields_by_name():
    import gradio as gr

    from studio.app import forms

    # the forms are the endpoints' API parameters, in the API's order (gradio_client users call them by name)
    generate = ("preset", "cache", "threshold", "compile", "compare")
    assert forms.names(forms.GenerateForm) == forms.REQUEST_FIELDS + generate
    matrix = ("presets", "repeats", "cache", "threshold", "compile", "prompts_text")
    assert forms.names(forms.MatrixForm)[len(forms.REQUEST_FIELDS) :] == matrix
    assert forms.names(forms.TuneForm)[len(forms.REQUEST_FIELDS) :] == ("floor", "prompts_text", "size", "max_flip")
    h, _ = _handlers()
    with pytest.raises(TypeError, match="threshhold"):  # a misspelt name fails at once, not as a silent default
        h.generate(**NO_PROGRESS, **REQUEST, preset="cache", threshhold=0.3)
    with pytest.raises(gr.Error, match="prompt is empty"):
        h.generate(**NO_PROGRESS, **dict(REQUEST, prompt="  "), preset="base")


def test_compare_handler_flags_broken_stacks():
    h, runner = _handlers()
    out = h.compare(**NO_PROGRESS, history=[], **REQUEST, preset_a="base", preset_b="cache", threshold=0.3)
    assert [c[1].name for c in runner.calls] == ["base", "cache.override"]  # the threshold where a cache runs only
    assert runner.calls[1][1].cache_config.residual_diff_threshold == 0.3
    assert out["ab.flag"] == "" and len(out["ab.table"]) == 2 and len(out["hist.rows"].rows) == 2
    captions = [c for _, c in out["hist.gallery"]]  # newest first: B, then A
    assert captions[0] == "#2 cache.override · 1.80x · 41.23 dB" and captions[1].startswith("#1 ")
    from studio.report.table import AB_COLUMNS

    assert AB_COLUMNS[4:7] == ("PSNR", "cached/full", "worst 8x8 tile") and len(out["ab.table"][1]) == len(AB_COLUMNS)
    assert out["ab.table"][1][6] == "30.10 dB at (y 8, x 16)"  # make_metrics' worst tile
    assert out["ab.error_map"].shape == (384, 384, 3)  # enlarged like the pictures
    assert out["ab.json"]["b_vs_a"] == {
        "psnr_db": "inf",
        "worst_tile_psnr_db": "inf",
        "worst_tile_yx": [0, 0],
        "map_scale": 8,
    }
    h, _ = _handlers(broken={"cache"})
    flag = h.compare(**NO_PROGRESS, **REQUEST, preset_a="base", preset_b="cache")["ab.flag"]
    assert flag.startswith("cache: ") and "flag-broken" in flag and "likely broken" in flag and "base" not in flag


@pytest.mark.parametrize("guidance", [-5.0, -0.001, math.nan, math.inf, -math.inf])
def test_handler_refuses_a_bad_guidance_even_where_the_model_takes_none(guidance):
    """/generate with guidance=-5.0 on a model without guidance used to run (the value was dropped unread)."""
    import gradio as gr

    h, runner = _handlers()  # the fake model takes no guidance
    with pytest.raises(
        gr.Error, match=r"That request can't run: request\.guidance=.* is not valid: guidance is a finite"
    ):
        h.generate(**NO_PROGRESS, **dict(REQUEST, guidance=guidance), preset="base")
    assert runner.calls == []  # refused before any model work
    h.generate(**NO_PROGRESS, **dict(REQUEST, guidance=0.0), preset="base")  # the UI's hidden field sends 0
    assert runner.calls[0][0].guidance is None  # a good value for a model without guidance is still not passed on


def test_matrix_chart_opens_on_the_first_cached_stack():
    from studio.report.table import AGAIN, Matrix

    def matrix(*runs):
        results = {m.preset: SimpleNamespace(metrics=m) for m in runs}
        return Matrix(None, "m", [MatrixRow.from_metrics(m) for m in runs], results, 1)

    base = make_metrics(preset="base", cached_steps=0, full_steps=10, cache_threshold=None)
    sage = make_metrics(preset="sage", cached_steps=0, full_steps=10, cache_threshold=None)
    cache = make_metrics(preset="cache")  # 4 cached steps
    idle = make_metrics(preset="cache-idle", cached_steps=0, full_steps=10)  # engaged, nothing under R0.24
    again = make_metrics(preset=AGAIN, cached_steps=0, full_steps=10, cache_threshold=None)
    assert matrix(base, sage, idle, cache, again).chart_preset() == "cache"  # not sage, the first after base
    assert matrix(base, sage, idle, again).chart_preset() == "cache-idle"  # a cache that cached nothing: why
    assert matrix(base, sage, again).chart_preset() == "sage"
    assert matrix(base, again).chart_preset() == "base"


# ------------------------------------------------------------------------------------------------ profiles
def _folder(tmp_path, cls, transformer=None, vae=None):
    import json

    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "transformer").mkdir()
    (tmp_path / "vae").mkdir()
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": cls}))
    (tmp_path / "transformer" / "config.json").write_text(json.dumps(transformer or {}))
    (tmp_path / "vae" / "config.json").write_text(json.dumps(vae or {}))
    return tmp_path


def test_a_folder_copy_of_a_hub_model_gets_the_hub_models_profile(tmp_path):
    from dataclasses import replace

    from studio.spec.profiles import HUB_PROFILES, profile_for

    d = _folder(tmp_path, "FluxPipeline", {"guidance_embeds": True, "patch_size": 1}, {"block_out_channels": [1] * 4})
    dev = HUB_PROFILES["black-forest-labs/FLUX.1-dev"]
    # FLUX packs 2x2 latents itself (patch_size 1 in its config): the multiple is 8 x 2 = 16, as for the Hub id
    got = profile_for(str(d))
    assert replace(got, name=dev.name) == dev and got.name.endswith("(FluxPipeline)")
    schnell = _folder(tmp_path / "s", "FluxPipeline", {"guidance_embeds": False}, {"block_out_channels": [1] * 4})
    assert profile_for(str(schnell)).steps == HUB_PROFILES["black-forest-labs/FLUX.1-schnell"].steps == 4


@pytest.mark.parametrize(
    "cls,transformer,vae,hub,multiple",
    [
        ("QwenImagePipeline", {"patch_size": 2}, {"temperal_downsample": [False, True, True]}, "Qwen/Qwen-Image", 16),
        ("ZImagePipeline", {}, {"block_out_channels": [1] * 4}, "Tongyi-MAI/Z-Image-Turbo", 16),
        (
            "StableDiffusion3Pipeline",
            {"patch_size": 2},
            {"block_out_channels": [1] * 4},
            "stabilityai/stable-diffusion-3.5-large",
            16,
        ),
    ],
)
def test_folder_profiles_follow_the_pipeline_class(tmp_path, cls, transformer, vae, hub, multiple):
    from studio.spec.profiles import HUB_PROFILES, profile_for

    p = profile_for(str(_folder(tmp_path, cls, transformer, vae)))
    h = HUB_PROFILES[hub]
    assert (p.steps, p.guidance, p.true_cfg_scale, p.width, p.size_multiple) == (
        h.steps,
        h.guidance,
        h.true_cfg_scale,
        h.width,
        multiple,
    )
    assert cls in p.name


def test_public_mode_keeps_each_visitors_presets_to_themselves(tmp_path):
    from studio.app.handlers import Studio
    from studio.spec import PresetLibrary

    shared = PresetLibrary(user_dir=tmp_path / "shared")
    studio = Studio(FakeRunner(), ["m"], shared, public=True, tmpdir=tmp_path / "tmp")
    alice, bob = SimpleNamespace(session_hash="alice1"), SimpleNamespace(session_hash="../bob")
    studio.library(alice).add("mine", "cache_config: {residual_diff_threshold: 0.3}\n")
    assert "mine" in studio.library(alice).names()
    assert "mine" not in studio.library(bob).names() and "mine" not in shared.names()
    assert studio.library(bob).user_dir == tmp_path / "tmp" / "sessions" / "bob"  # no path tricks in a session id
    assert studio.library(None).user_dir is None  # no session: built-ins only
    private = Studio(FakeRunner(), ["m"], shared, public=False, tmpdir=tmp_path / "tmp2")
    assert private.library(alice) is shared  # one local user: one folder


def test_preset_files_are_bounded_and_written_whole(tmp_path):
    from studio.spec import PresetLibrary
    from studio.spec.presets import MAX_PRESET_BYTES

    lib = PresetLibrary(user_dir=tmp_path)
    with pytest.raises(ConfigError, match="more than a preset's 65536 bytes"):
        lib.add("huge", "description: " + "x" * MAX_PRESET_BYTES + "\n")
    lib.add("ok", "attention_backend: sdpa\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.yaml"]  # no temp file left beside it


def test_history_is_bounded_per_session():
    from studio.app.history import HISTORY_COLUMNS, THUMBS_MAX, history_max, record
    from studio.engine.runner import RunResult
    from studio.spec import GenerationRequest

    img = np.zeros((8, 8, 3), np.uint8)
    big = np.zeros((1024, 768, 3), np.uint8)
    hist = None
    for i in range(history_max() + 5):
        hist = record(
            hist, GenerationRequest(prompt="p" * 1500), [RunResult(big if i % 2 else img, img, make_metrics())]
        )
    rows, thumbs = hist.rows, hist.thumbs
    assert len(rows) == history_max() and rows[-1][0] == history_max() + 5 and len(rows[-1][1]) == 200
    # thumbnails: the newest THUMBS_MAX, newest first, the longer side 128 px (8 px enlarged x16, 1024 reduced x8)
    assert len(thumbs) == THUMBS_MAX and thumbs[0][1].startswith(f"#{history_max() + 5} ")
    # kept as JPEG (2-6 kB each, not 48 kB of pixels: 64 sessions x 48 thumbnails), shown as pictures
    assert all(isinstance(t, bytes) and len(t) < 8_000 for t, _ in thumbs)
    shown = hist.gallery()
    assert np.asarray(shown[0][0]).shape == (128, 128, 3) and np.asarray(shown[1][0]).shape == (128, 96, 3)
    assert shown[0][1] == thumbs[0][1]
    assert len(HISTORY_COLUMNS) == len(rows[-1])


def test_device_thread_runs_every_caller_on_one_thread_with_its_context():
    """All torch work on one OS thread (studio.engine.thread): callers from any thread land on the same one, with
    their context variables; a nested call runs in place; an exception reaches the caller."""
    import contextvars
    import threading

    from studio.engine.thread import DeviceThread

    dev, var = DeviceThread("test-device"), contextvars.ContextVar("who", default=None)

    def where():
        return threading.get_ident(), var.get(), dev.call(threading.get_ident)  # nested: no deadlock

    seen = []

    def caller(name):
        var.set(name)
        seen.append(dev.call(where))

    threads = [threading.Thread(target=caller, args=(f"t{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    caller("main")
    assert len({ident for ident, _, _ in seen}) == 1 and all(a == b for a, _, b in seen)
    assert seen[0][0] != threading.get_ident() and dev.on_it() is False
    assert sorted(name for _, name, _ in seen) == ["main", "t0", "t1", "t2"]
    with pytest.raises(ZeroDivisionError):
        dev.call(lambda: 1 / 0)


def test_a_gated_model_says_how_to_get_in_not_a_network_error(monkeypatch):
    """huggingface_hub's GatedRepoError (here wrapped as diffusers wraps it) names the fix."""
    import httpx
    from huggingface_hub.errors import GatedRepoError

    from studio.engine.loader import load_hint

    response = httpx.Response(403, request=httpx.Request("GET", "https://huggingface.co/api/models/x"))
    gated = GatedRepoError(
        "403 Client Error. Cannot access gated repo for url https://huggingface.co/x.", response=response
    )
    try:
        try:
            raise gated
        except GatedRepoError as inner:
            raise OSError("could not fetch model_index.json") from inner
    except OSError as wrapped:
        assert "this model is gated" in load_hint(wrapped) and "HF_TOKEN" in load_hint(wrapped)
    # (HF_HUB_OFFLINE, read at the edge into the settings the model manager hands down: spec.settings)
    assert "offline" in load_hint(OSError("not in cache"), offline=True)
    assert load_hint(OSError("connection refused"), offline=False) == " (check the Hub id and your network)"


def test_aspect_sizes_are_sizes_the_model_takes_and_the_picker_sets_them():
    """the aspect-ratio choices of a profile are multiples of its size multiple, inside its limits, at
    about its pixel count; choosing one sets width and height."""
    from studio.spec.profiles import HUB_PROFILES

    prof = HUB_PROFILES["black-forest-labs/FLUX.1-dev"]
    sizes = prof.aspect_sizes()
    assert sizes[0] == ("1:1 (1024x1024)", 1024, 1024) and ("16:9 (1360x768)", 1360, 768) in sizes
    for _, w, h in sizes:
        assert w % prof.size_multiple == 0 and h % prof.size_multiple == 0
        assert prof.min_size <= min(w, h) and max(w, h) <= prof.max_size
        assert abs(w * h / (1024 * 1024) - 1) < 0.05
    h, _ = _handlers()
    h.studio.device.profile = lambda model: prof
    assert h.on_aspect("3:2 (1248x832)", "m") == {"request.width": 1248, "request.height": 832}
    assert h.on_aspect(None, "m") == {}


def test_zerogpu_settings_read_at_the_edge(tmp_path):
    """On ZeroGPU (spaces installed, SPACES_ZERO_GPU set) no warm-up runs at start: the app's process has no GPU
    outside a call, and each call's forked process warms its stack again; the ahead-of-time packages' folder is read
    too."""
    from studio.spec.hosting import aot_dir
    from studio.spec.settings import Settings

    zero = Settings.from_env({"SPACES_ZERO_GPU": "true", "STUDIO_AOT_DIR": str(tmp_path)})
    assert zero.zerogpu and not zero.prewarm and zero.aot_dir == str(tmp_path)
    assert Settings.from_env({"SPACES_ZERO_GPU": "true", "STUDIO_PREWARM": "1"}).prewarm  # the operator's choice
    assert Settings.from_env({}).prewarm and not Settings.from_env({}).zerogpu
    assert aot_dir(zero.aot_dir) == tmp_path  # the edge hands the engine its folder
    assert aot_dir(Settings.from_env({}).aot_dir).name == "studio-aot"


@pytest.mark.quick
def test_run_metrics_flat_form_keeps_the_json_keys_and_reads_back():
    """The record is nested by concern; its flat form (the CLI's and the API's JSON, docs/api.md) keeps one key per
    figure under the names clients read, and `from_dict` reads it back to the same record."""
    m = make_metrics(flip=0.02, peak_memory={"kind": "cpu", "peak_bytes": 5}, placement={"regime": "resident"})
    d = m.as_dict()
    assert d["quality"] == "good" and d["timing"] == "warm-up run done earlier, 1 timed run"
    assert d["placement"] == {"regime": "resident"} and d["residual_diffs"] == {"4": 0.1} and d["flip"] == 0.02
    assert (d["speedup"], d["cached_steps"], d["tag"], d["device"]) == (1.8, 4, m.labels.tag, "cpu")
    assert RunMetrics.from_dict(d) == m and RunMetrics.from_dict(json.loads(json.dumps(d))) == m
    top = {"model", "preset", "request", "reloaded", "versions"}
    nested = top | {f.name for p in PARTS.values() for f in fields(p)}
    assert set(d) == {FLAT_NAMES.get(k, k) for k in nested}  # one key per field, none lost to the nesting
    with pytest.raises(TypeError):
        RunMetrics.from_dict({**d, "speed_up": 2.0})  # a key it does not know is an error, not dropped
