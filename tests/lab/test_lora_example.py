"""The LoRA shipped with the embedded model (studio/models/tiny/loras/outline, trained by
`python -m lab lora train --style outline ...`), offered by name, through the real stack (diffusers, peft)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from lab.tiny.lora import SHEET_PROMPTS
from lab.tiny.scenes import parse_prompt, ring_luminance
from studio.app.limits import PublicGuard, Refused
from studio.measure.quality import psnr
from studio.spec import ConfigError
from studio.spec.lora import LORA_FILE, LoraSpec, parse_loras
from studio.spec.presets import preset_from_text
from studio.spec.profiles import shipped_dir, shipped_loras

OUTLINE = LoraSpec("outline")
# One object on a light background each: the black ring shows against it (two objects, each 14 px across, come out
# with a fainter ring: docs/img/lora-outline.png).
PROMPTS = (SHEET_PROMPTS[0], SHEET_PROMPTS[2])


def test_the_outline_lora_ships_with_the_embedded_model_small_and_with_its_record():
    """The weights beside the model, a few hundred KB, with the command, seed, steps and loss that made them."""
    assert set(shipped_loras("tiny")) >= {"outline"} and shipped_loras(None) == shipped_loras("tiny")
    assert shipped_loras("black-forest-labs/FLUX.1-dev") == {} and shipped_dir("some/other") is None
    folder = shipped_dir("tiny") / "outline"
    weights = folder / LORA_FILE
    assert 50_000 < weights.stat().st_size < 500_000
    rec = json.loads((folder / "lora.json").read_text())
    assert rec["command"].startswith("python -m lab lora train --style outline")
    assert rec["final_loss"] < rec["first_loss"] and rec["rank"] <= 8 and rec["seed"] == 0
    assert (folder / "README.md").read_text().count(rec["command"]) == 1


def test_a_bare_word_is_a_shipped_name_and_anything_else_a_path():
    """`outline@0.8` (the CLI's --lora, the app's box, the API's loras) is the name; a folder of that name in the
    working directory is written ./outline; files and Hub ids are paths as before."""
    (lo,) = parse_loras("outline@0.8")
    assert lo == LoraSpec("outline", 0.8) and lo.is_name
    for path in ("./outline", "my_style.safetensors", "user/repo", "/tmp/x"):
        assert not LoraSpec(path).is_name


def test_the_shipped_lora_by_name_outlines_the_objects(tiny_runner):
    """Loaded by name into the embedded model (hot-swap slot, peft): the picture moves well away from the plain one,
    and the ring where the style draws its outline turns dark (scenes.ring_luminance: 0-255)."""
    r = tiny_runner
    for prompt in PROMPTS:
        req = r.request(prompt, seed=0)
        plain = r.generate(req, "base", compare="off")
        styled = r.generate(replace(req, loras=(OUTLINE,)), "base", compare="off")
        scene = parse_prompt(prompt)
        assert psnr(styled.image, plain.image) < 25
        assert ring_luminance(styled.image, scene) < ring_luminance(plain.image, scene) - 40
        line = "lora: outline at 1 (shipped with the model; diffusers load_lora_weights, hot-swap slot, peft)"
        assert line in styled.metrics.labels.engaged
        assert styled.metrics.request["loras"] == "outline@1"
    # at half the scale: darker than without, lighter than at 1 (docs/lora.md: far less than half the effect)
    req = r.request(PROMPTS[0], seed=0)
    scene = parse_prompt(PROMPTS[0])
    half = r.generate(replace(req, loras=(LoraSpec("outline", 0.5),)), "base", compare="off").image
    full = r.generate(replace(req, loras=(OUTLINE,)), "base", compare="off").image
    plain = r.generate(req, "base", compare="off").image
    assert ring_luminance(full, scene) < ring_luminance(half, scene) < ring_luminance(plain, scene)


def test_the_shipped_lora_under_the_cache_and_fused_before_int8(tiny_runner):
    """By name under `cache` (against base with the same LoRA) and in a quantized preset's own `loras` (fused into
    the weights by name, then quantized): the name resolves on both paths."""
    r = tiny_runner
    req = r.request(PROMPTS[0], seed=0)
    plain = r.generate(req, "base", compare="off").image
    cached = r.generate(replace(req, loras=(OUTLINE,)), "cache")
    m = cached.metrics
    assert m.cache.cached_steps > 0 and m.cache.cached_steps + m.cache.full_steps == req.steps
    assert m.quality.psnr_db >= 30 and psnr(cached.image, plain) < 25
    int8 = preset_from_text("quantize_config: {quant_type: int8_weight_only}\nloras: [outline]\n", "int8-outline")
    fused = r.generate(req, int8)
    how = "fused into the weights before quantization"
    assert (
        f"lora: outline at 1 (shipped with the model; diffusers load_lora_weights, {how})"
        in fused.metrics.labels.engaged
    )
    assert fused.metrics.quality.psnr_db >= 30 and psnr(fused.image, plain) < 25


def test_a_name_the_model_does_not_ship_is_refused_with_the_ones_it_does(tiny_runner):
    r = tiny_runner
    req = r.request(PROMPTS[0], seed=0, loras=(LoraSpec("watercolour"),))
    said = (
        r"'watercolour' is not a LoRA shipped with the model 'tiny' \(the embedded one\): the LoRAs shipped with it "
        r"are outline; a file or folder of your own is a path \(\./watercolour"
    )
    with pytest.raises(ConfigError, match=said):
        r.generate(req, "base", compare="off")
    ok = r.generate(replace(req, loras=(OUTLINE,)), "base", compare="off")  # the slots are as they were
    assert ok.metrics.request["loras"] == "outline@1"


def test_public_mode_takes_a_shipped_name_and_refuses_a_path(tiny_runner):
    """A name reads only the model's own loras/ folder: a visitor may use it, in a request or in their own preset;
    a path is still refused."""
    guard = PublicGuard()
    req = tiny_runner.request(PROMPTS[0], loras=(OUTLINE,))
    guard.event("s1", None, [], "tiny", req)
    with pytest.raises(Refused, match="LoRA adapters are not taken from visitors .*'/etc/passwd'.*by name, are"):
        guard.event("s2", None, [], "tiny", replace(req, loras=(LoraSpec("/etc/passwd"),)))
    guard.preset(preset_from_text("loras: [outline]\n", "mine"), builtin=False)
    with pytest.raises(Refused, match="names LoRA adapters: on this public studio only the operator's presets do"):
        guard.preset(preset_from_text("loras: [./outline]\n", "theirs"), builtin=False)


def test_the_app_offers_the_shipped_names():
    """The LoRA box's picker adds a shipped name at scale 1, once."""
    from studio.app.handlers import Handlers

    pick = Handlers.on_lora_pick
    assert pick("outline", "") == "outline@1"
    assert pick("outline", "/x/a.safetensors@0.5\n") == "/x/a.safetensors@0.5\noutline@1"
    assert pick("outline", "outline@0.8") == "outline@0.8"
    assert pick(None, "a@1") == "a@1"


def test_the_cli_takes_a_shipped_name(capsys):
    from studio.cli import main

    assert main(["generate", "--lora", "outline@0.8", "--steps", "8", "--compare", "off", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["request"]["loras"] == "outline@0.8"
    assert main(["generate", "--lora", "nope", "--steps", "8", "--compare", "off"]) == 2
    assert "'nope' is not a LoRA shipped with the model 'tiny'" in capsys.readouterr().err
    assert np.isfinite(out["denoise_s"])


def test_the_training_command_writes_a_lora_the_studio_loads(tmp_path, tiny_runner):
    """A few steps of `python -m lab lora train`: a file of the shipped one's layout, its record, and the
    studio loads it by path (its adapters start at zero, so two steps move the picture only a little)."""
    from lab.tiny.lora import main

    out = tmp_path / "outline"
    args = ["train", "--style", "outline", "--out", str(out), "--steps", "2", "--pool", "16", "--batch", "2"]
    assert main(args) == 0
    rec = json.loads((out / "lora.json").read_text())
    assert rec["steps"] == 2 and rec["lora_parameters"] == 61_440 and len(rec["loss_curve"]) == 1
    assert (out / LORA_FILE).stat().st_size == (shipped_dir("tiny") / "outline" / LORA_FILE).stat().st_size
    req = tiny_runner.request(PROMPTS[0], seed=0, steps=8)
    res = tiny_runner.generate(replace(req, loras=(LoraSpec(str(out / LORA_FILE)),)), "base", compare="off")
    assert (
        f"lora: {out / LORA_FILE} at 1 (diffusers load_lora_weights, hot-swap slot, peft)"
        in res.metrics.labels.engaged
    )
