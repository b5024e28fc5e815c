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
from studio.spec import CacheSpec, GenerationRequest, PresetLibrary, QuantSpec
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
    # FLUX.1-dev with T5-XXL in bf16 is ~25.8 GiB resident: over the card (23.6 GiB to torch, less its CUDA
    # context), and even with the text encoders by use (~23.3 GiB) it is over by a few hundred MiB, so `auto` streams
    # the blocks with the encoders resident
    assert rtx.fits and rtx.offload == "layerwise_offload" and rtx.peak_bytes < 23.64 * 2**30
    assert rtx.components["transformer"]["where"].startswith("host") and "of 23.1 GiB free" in rtx.reasons["offload"]
    assert rtx.components["text_encoder_2"]["where"] == "device"
    resident = make_plan(named("rtx4090"), FLUX, replace(lib.get(FULL), offload_config=OffloadSpec(policy="none")))
    assert not resident.fits and "these would fit: layerwise_offload" in resident.refusal  # and says what would
    assert rtx.components["transformer"]["bytes"] < rtx.components["text_encoder_2"]["bytes"] * 1.5  # 8-bit counted
    t4 = make_plan(named("t4"), FLUX, lib.get(FULL))
    assert (t4.dtype, t4.quantize, t4.attention) == ("float16", "int8_weight_only", "sdpa")  # sm_75: until measured
    assert "not measured below sm80" in t4.reasons["quantize"]
    assert "sm80 or newer; this GPU is sm75" in t4.reasons["attention"] and "sm_75" in t4.reasons["dtype"]
    # FLUX on a T4 (14.6 GiB to torch): the blocks streamed and the text encoders (T5-XXL, 11 GiB in float16) on the
    # card only to encode the prompt; refused while they stayed for the whole run
    assert t4.fits and t4.offload == "layerwise_offload+encoders" and t4.peak_bytes < 14.56 * 2**30
    for enc in ("text_encoder", "text_encoder_2"):
        assert "while it encodes the prompt" in t4.components[enc]["where"]
    h200 = make_plan(named("h200"), FLUX, lib.get(FULL))
    assert h200.fits and h200.offload == "none" and h200.quantize == "float8_per_row"
    assert all(c["where"] == "device" for c in h200.components.values())
    zero = make_plan(named("zerogpu"), FLUX, lib.get(FULL))  # ZeroGPU's recipe: float8 quantized, then exported
    assert (zero.quantize, zero.compile, zero.offload) == ("float8_per_row", "ahead-of-time", "none") and zero.fits
    assert "8-bit weights quantized before the export" in zero.reasons["compile"]
    assert make_plan(named("zerogpu"), FLUX, lib.get("compile")).compile == "ahead-of-time"
    tight = make_plan(named("h200"), FLUX, lib.get(FULL), budget=8)  # a budget below the streamed peak: refused
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
    assert text.startswith("cache-int8-sage on t4: NVIDIA T4 (sm_75") and "float16" in text and ": fits" in text
    assert "layerwise_offload+encoders" in text
    here = DeviceService(runner).plan(PresetLibrary().get("base"), "here")
    assert "fits" in here and "transformer" in here


def test_every_hook_cache_is_refused_ahead_of_time_and_the_8bit_form_follows_what_runs():
    """Issue 57: on ZeroGPU every diffusers cache hook is refused ahead of time with its reason (each replaces the
    blocks' forward or hooks the attention inside them, which a package would skip or bake in), `compiles()` says so
    before the weights are keyed, so the 8-bit form is the eager one (weight-only), and `plan` says the same."""
    from studio.engine.compile import compiles
    from studio.spec.hosting import aot_refusal
    from studio.spec.methods import HOOK_BACKENDS, METHOD_NAMES

    lib, zero = PresetLibrary(), named("zerogpu")
    on = lib.get("int8")  # compiled, 8-bit (auto)
    shipped = {lib.get(n).cache_config.backend: lib.get(n).cache_config for n in lib.method_names()}
    for backend in HOOK_BACKENDS:  # (SeaCache ships no preset: its backend's defaults)
        p = replace(on, name=backend, cache_config=shipped.get(backend) or CacheSpec(backend=backend))
        why = aot_refusal(p)
        assert why.startswith(f"not under {METHOD_NAMES[backend]} (") and "package" in why, why
        assert not compiles(p, zero)
        plan = make_plan(zero, FLUX, p)
        assert plan.compile == "off" and METHOD_NAMES[backend] in plan.reasons["compile"], plan.reasons["compile"]
        assert plan.quantize == "int8_weight_only", plan.quantize  # eager: not a dynamic-activation form
    cached = replace(on, cache_config=lib.get("cache").cache_config)  # cache-dit's DBCache exports beside its hooks
    assert aot_refusal(cached) is None and compiles(cached, zero)
    assert make_plan(zero, FLUX, cached).compile == "ahead-of-time"
    whole = replace(cached, compile=replace(cached.compile, regional=False))  # JIT: a whole graph skips the cache
    assert not compiles(whole, named("h100")) and compiles(cached, named("h100"))


def test_a_float8_preset_on_a_card_without_float8_plans_what_runs():
    """Issue 57: an explicit float8 preset on an A10G (sm_86) runs in full precision (engine.quantize falls back);
    the plan says so and sizes the transformer's weights in full precision, as an H100 plans float8 and 8-bit bytes."""
    f8 = replace(PresetLibrary().get("int8"), name="f8", quantize_config=QuantSpec(quant_type="float8_per_row"))
    a10g, h100 = make_plan(named("a10g"), FLUX, f8), make_plan(named("h100"), FLUX, f8)
    assert a10g.quantize == "none" and "sm89 or newer; this GPU is sm86" in a10g.reasons["quantize"]
    assert h100.quantize == "float8_per_row"
    assert a10g.components["transformer"]["bytes"] > 1.6 * h100.components["transformer"]["bytes"]  # bf16 vs 8-bit


def test_the_activation_reserve_follows_the_requests_size_in_the_plan_and_in_the_run(runner):
    """Issue 57: the reserve for activations is the request's (a 2048x2048 VAE decode holds 4x the maps of a
    1024x1024 one), in `plan --size` and in the placement a run makes: a run at 128x128 of the 64x64 model reserves
    at least 3x what one at 64x64 does."""
    big = make_plan(named("h100"), FLUX, PresetLibrary().get("base"), size=(2048, 2048))
    small = make_plan(named("h100"), FLUX, PresetLibrary().get("base"), size=(1024, 1024))
    assert big.activation_bytes >= 3 * small.activation_bytes
    runner.generate(req(), "base", compare="off")
    at64 = runner.manager.placement()
    runner.generate(req(width=128, height=128), "base", compare="off")
    at128 = runner.manager.placement()
    assert at128["activation_bytes"] >= 3 * at64["activation_bytes"] > 0
    assert "at 128x128" in at128["activations"] and "at 64x64" in at64["activations"]
