"""The device profile and `python -m studio plan`: every decision from one profile, the plan is what runs, a model
that fits no regime of a profile is refused before any weight is read, and docs/presets.md's table is the plan's."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import one_pair

from studio.cli import main
from studio.engine import ModelManager, Runner
from studio.engine.plan import make_plan, model_folder
from studio.engine.state import stack_state
from studio.report.plan import plan_table
from studio.spec import GenerationRequest, PresetLibrary
from studio.spec.devices import PROFILES, DeviceProfile, named
from studio.spec.offload import OffloadSpec
from studio.spec.settings import current

FLUX = "FLUX.1-dev"
FULL = "cache-int8-sage"
DOCS = Path(__file__).resolve().parent.parent / "docs" / "presets.md"


def req(**kw) -> GenerationRequest:
    return GenerationRequest(**{"prompt": "a red cube", "steps": 8, "width": 64, "height": 64, "seed": 3, **kw})


def test_the_full_stack_on_the_named_gpus_is_each_ones_form():
    lib = PresetLibrary()
    rtx = make_plan(named("rtx4090"), FLUX, lib.get(FULL))
    assert (rtx.dtype, rtx.quantize, rtx.attention, rtx.compile) == ("bfloat16", "float8_per_row", "sage", "regional")
    # FLUX.1-dev with T5-XXL in bf16 is ~25.8 GiB resident: over the card, so `auto` streams the blocks
    assert rtx.fits and rtx.offload == "layerwise_offload" and rtx.peak_bytes < 24 * 2**30
    assert rtx.components["transformer"]["where"].startswith("host") and "of 24 GiB free" in rtx.reasons["offload"]
    resident = make_plan(named("rtx4090"), FLUX, replace(lib.get(FULL), offload_config=OffloadSpec(policy="none")))
    assert not resident.fits and "these would fit: layerwise_offload" in resident.refusal  # and says what would
    assert rtx.components["transformer"]["bytes"] < rtx.components["text_encoder_2"]["bytes"] * 1.5  # 8-bit counted
    t4 = make_plan(named("t4"), FLUX, lib.get(FULL))
    assert (t4.dtype, t4.quantize, t4.attention) == ("float16", "int8_per_row", "sdpa")
    assert "sm80 or newer; this GPU is sm75" in t4.reasons["attention"] and "sm_75" in t4.reasons["dtype"]
    h200 = make_plan(named("h200"), FLUX, lib.get(FULL))
    assert h200.fits and h200.offload == "none" and h200.quantize == "float8_per_row"
    assert all(c["where"] == "device" for c in h200.components.values())
    zero = make_plan(named("zerogpu"), FLUX, lib.get(FULL))  # ZeroGPU's recipe: float8 quantized, then exported
    assert (zero.quantize, zero.compile, zero.offload) == ("float8_per_row", "ahead-of-time", "none") and zero.fits
    assert "8-bit weights quantized before the export" in zero.reasons["compile"]
    assert make_plan(named("zerogpu"), FLUX, lib.get("compile")).compile == "ahead-of-time"
    tight = make_plan(named("h200"), FLUX, lib.get(FULL), budget=12)  # a budget below the streamed peak: refused
    assert not tight.fits and "no regime fits" in tight.refusal


def test_a_model_that_fits_no_regime_is_refused_before_any_weight_is_read():
    qwen = model_folder("Qwen/Qwen-Image")
    assert not list(qwen.rglob("*.safetensors"))  # configs only: nothing to read but them
    plan = make_plan(named("t4"), "Qwen/Qwen-Image", PresetLibrary().get("base"), budget=8)
    assert not plan.fits and plan.free.startswith("8 GiB (STUDIO_DEVICE_MEMORY_GB=8)")
    assert "does not fit the device" in plan.refusal and "no regime fits: the least" in plan.refusal


def test_every_named_profile_and_shipped_preset_has_a_plan_and_the_docs_table_is_it():
    lib = PresetLibrary()
    plans = {(d, p): make_plan(named(d), FLUX, lib.get(p)) for d in PROFILES for p in lib.names()}
    for (d, p), plan in plans.items():  # a step-cache method's preset plans as `cache`: the table leaves them out
        if p in lib.method_names():
            assert (plan.dtype, plan.quantize, plan.attention, plan.fits) == (
                plans[d, "cache"].dtype,
                plans[d, "cache"].quantize,
                plans[d, "cache"].attention,
                plans[d, "cache"].fits,
            )
    plans = {k: v for k, v in plans.items() if k[1] not in lib.method_names()}
    for (d, _), plan in plans.items():
        prof = PROFILES[d]
        assert plan.dtype == ("float16" if d == "t4" else "bfloat16" if prof.gpu or prof.bf16 else "float32"), plan
        if not prof.gpu:
            assert plan.attention == "sdpa" and plan.quantize in ("none", "int8_weight_only", "int8_per_row")
        if plan.quantize == "float8_per_row":
            assert prof.float8
        assert set(plan.reasons) - {"parallel"} == {"dtype", "quantize", "attention", "compile", "offload"}
        assert plan.fits == (plan.refusal is None)
    table = plan_table(plans)
    assert table in DOCS.read_text(), "docs/presets.md: regenerate with python -m studio plan --table"


@pytest.mark.parametrize("device", ["rtx4090", "t4", "zerogpu", "h200"])
def test_cli_plan_json_has_the_keys_a_caller_reads(device, capsys):
    rc = main(["plan", "--device", device, "--model", FLUX, "--preset", FULL, "--json"])
    out = json.loads(capsys.readouterr().out)
    keys = {"device", "dtype", "quantize", "attention", "compile", "offload", "peak_bytes", "fits", "reasons"}
    assert keys <= set(out) and rc == (0 if out["fits"] else 1)
    assert set(out["reasons"]) >= {"dtype", "quantize", "attention", "compile", "offload"}


def test_the_plan_here_is_what_generate_runs(runner):
    """This CPU: the plan's parts are the stack's after a run of the same preset on the same model."""
    res = runner.generate(req(), FULL, compare="off")
    plan = make_plan(runner.manager.profile, runner.model, runner.presets.get(FULL), forced_dtype=current().dtype)
    state = stack_state(runner.manager.current.pipe.transformer)
    ran_attention = "sdpa" if "sage->sdpa" in res.metrics.labels.label_changes else "sage"
    compiled = state.compile.running is not None
    assert (plan.dtype, plan.quantize) == (res.metrics.labels.dtype, state.quantize.mode)
    assert (plan.attention, plan.offload) == (ran_attention, state.offloading.regime)
    assert (plan.compile != "off") == compiled, (plan.compile, res.metrics.labels.engaged)


def test_a_simulated_gpu_profile_places_and_decides_as_that_gpu_on_this_cpu(random_model_dir):
    """A T4 simulated on this CPU: the dtype and the 8-bit form are the T4's (float16: it has no bf16; not this
    CPU's choice), the regime is placed against the T4's memory and runs with the weights on the host, the run
    device marked; the attention probe runs where the pipeline computes (here: sdpa, with the reason)."""
    t4 = PROFILES["t4"]
    # the profile's own rule for `auto`: no STUDIO_DTYPE handed down (it would replace `auto` on any profile)
    settings = replace(current(), dtype=None)
    r = one_pair(Runner(ModelManager("cpu", settings=settings, profile=t4), PresetLibrary(), model=random_model_dir))
    try:
        stack = replace(r.presets.get(FULL), offload_config=OffloadSpec(policy="group_offload"))
        m = r.generate(req(), stack, compare="off").metrics
        tr = r.manager.current.pipe.transformer
        state = stack_state(tr)
        assert m.labels.dtype == "float16" and m.placement.plan["free_source"].startswith("the t4 profile's")
        assert state.offloading.regime == "group_offload" and str(state.offloading.run_device) == "cpu"
        assert next(tr.parameters()).device.type == "cpu"  # the weights wait on the host between uses
        assert state.quantize.mode == "int8_weight_only"  # eager under group offload: weight-only on any device
        assert "sage->sdpa" in m.labels.label_changes and any("unavailable on cpu" in x for x in m.labels.fallbacks)
        assert make_plan(t4, random_model_dir, stack).dtype == "float16"
    finally:
        r.manager.unload()


def test_profiles_refuse_what_they_cannot_be():
    with pytest.raises(ValueError, match="kind 'tpu' is not cuda or cpu"):
        DeviceProfile("x", "tpu", "a TPU")
    with pytest.raises(ValueError, match="needs its capability"):
        DeviceProfile("x", "cuda", "a GPU")
    with pytest.raises(ValueError, match="is not a known profile: use `here` or one of zerogpu"):
        named("v100")


def test_the_presets_tab_plan_comes_from_the_device(runner):
    """The Presets tab asks the device (the worker, or in-process) for the plan, as the CLI prints it."""
    from studio.worker.service import DeviceService

    text = DeviceService(runner).plan(PresetLibrary().get(FULL), "t4", FLUX)
    assert text.startswith("cache-int8-sage on t4: NVIDIA T4 (sm_75") and "float16" in text and "refused:" in text
    here = DeviceService(runner).plan(PresetLibrary().get("base"), "here")
    assert "fits" in here and "transformer" in here
