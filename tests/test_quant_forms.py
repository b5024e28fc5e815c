"""The 8-bit forms under cache-dit's names: how `auto` picks one, how each engages or falls back on this CPU, and
that an exported preset names a quant_type cache-dit's own loader accepts."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from studio.engine.device import profile_here
from studio.engine.state import stack_state
from studio.measure.quality import psnr
from studio.spec import GenerationRequest, PresetLibrary
from studio.spec.devices import EAGER_NOTE, PROFILES, DeviceProfile, quant_form
from studio.spec.export import cache_dit_dict, cache_dit_yaml
from studio.spec.preset import CompileSpec, QuantSpec
from studio.spec.presets import preset_from_dict
from tests.switched import stack

CPU = profile_here("cpu")  # this machine's CPU, as the studio reads it


def cpu(*flags: str) -> DeviceProfile:
    return DeviceProfile("x", "cpu", "a CPU", flags=frozenset(flags))


def req(**kw) -> GenerationRequest:
    return GenerationRequest(**{"prompt": "a red cube", "steps": 6, "width": 64, "height": 64, "seed": 3, **kw})


def test_auto_picks_the_dynamic_form_only_where_the_stack_is_compiled():
    auto = QuantSpec(quant_type="auto")
    # CPUs: dynamic int8 where AMX-INT8 runs it; elsewhere compiled weight-only measured faster (engine.quantize)
    form, why = quant_form(auto, cpu("amx_int8", "avx512_vnni"), compiled=True)
    assert (form, why) == ("int8_per_row", "auto: cpu with AMX-INT8, compiled")
    form, why = quant_form(auto, cpu("avx512_vnni"), compiled=True)
    assert form == "int8_weight_only" and why.startswith("auto: cpu with AVX512-VNNI, no AMX: compiled weight-only")
    assert "without VNNI/AMX" in quant_form(auto, cpu(), True)[1]
    form, why = quant_form(auto, CPU, compiled=False)
    assert form == "int8_weight_only" and EAGER_NOTE in why and "memory option" in why
    # a form the preset names is kept, with the warning where it runs eagerly
    form, why = quant_form(QuantSpec(quant_type="int8_per_row"), CPU, compiled=False)
    assert form == "int8_per_row" and EAGER_NOTE in why
    assert quant_form(QuantSpec(quant_type="int8_weight_only"), CPU, compiled=True)[0] == "int8_weight_only"
    # GPUs: float8 per-row from sm89, int8 per-row below it (compiled); the named profiles are the table's
    assert quant_form(auto, PROFILES["l4"], compiled=True) == (
        "float8_per_row",
        "auto: sm89 has float8 matmuls, compiled",
    )
    assert quant_form(auto, PROFILES["a10g"], compiled=True) == (
        "int8_per_row",
        "auto: sm86, int8 tensor cores, compiled",
    )
    t4 = quant_form(auto, PROFILES["t4"], compiled=True)  # Turing: weight-only until a card measures dynamic int8
    assert t4[0] == "int8_weight_only" and "not measured below sm80" in t4[1]


def test_the_studios_earlier_name_reads_as_cache_dits():
    assert QuantSpec(quant_type="int8_dynamic").quant_type == "int8_per_row"
    with pytest.raises(ValueError, match=r"quantize_config.quant_type='int4'.*float8_per_row"):
        QuantSpec(quant_type="int4")


def test_quant_type_names_round_trip_through_cache_dits_load_configs(tmp_path):
    import cache_dit

    lib = PresetLibrary()
    base = lib.get("cache-int8-sage")
    assert base.quant.quant_type == "auto" and base.compile.enabled
    cases = [
        (replace(base, quantize_config=QuantSpec(quant_type=q)), None, q)
        for q in ("float8_per_row", "int8_per_row", "int8_weight_only")
    ]
    cases += [
        (base, "int8_per_row", "int8_per_row"),
        (base, None, "float8_per_row"),
    ]  # auto: as resolved, or cache-dit's default
    old = preset_from_dict({"quantize_config": {"quant_type": "int8_dynamic"}}, name="old")
    cases.append((old, None, "int8_per_row"))
    for i, (p, resolved, want) in enumerate(cases):
        path = tmp_path / f"{i}.yaml"
        path.write_text(cache_dit_yaml(p, steps=28, quant=resolved))
        got = cache_dit.load_configs(str(path))["quantize_config"]
        assert got.quant_type == want, (p.name, resolved)
        assert list(got.exclude_layers) == list(p.quant.exclude_layers)
    # the cache threshold default follows the form that runs (an unset threshold): raised for float8 only
    # (spec.preset.DEFAULT_THRESHOLD says what was measured)
    unset = replace(base.cache_config, residual_diff_threshold=None)
    p = replace(base, cache_config=unset)
    assert cache_dit_dict(p, quant="float8_per_row")["cache_config"]["residual_diff_threshold"] == 0.12
    assert cache_dit_dict(p, quant="int8_per_row")["cache_config"]["residual_diff_threshold"] == 0.08
    assert unset.effective_threshold("none") == 0.08


def test_each_8bit_form_engages_or_falls_back_with_its_reason_on_the_cpu(runner):
    """Eager, each named form: int8 per-row and weight-only engage (torchao's tensors in the Linear layers, the
    picture near base's); float8 per-row falls back to full precision with the reason (torchao asserts sm89+), and
    its picture is then base's bit for bit."""
    lib = runner.presets
    eager = replace(lib.get("int8"), compile=CompileSpec(), dtype="float32")  # bf16's rounding would swamp 8-bit's
    out = {}
    for form in ("int8_per_row", "int8_weight_only", "float8_per_row"):
        p = replace(eager, name=f"q-{form}", quantize_config=QuantSpec(quant_type=form))
        res = runner.generate(req(), p)
        out[form] = res
        tr = runner.manager.current.pipe.transformer
        lin = tr.transformer_blocks[0].attn.to_q
        if form == "float8_per_row":
            assert stack_state(tr).quantize.mode == "none" and type(lin.weight) is torch.nn.Parameter
            assert any(
                "float8_per_row: float8 matmuls need a CUDA GPU of sm89 or newer; this is cpu, using full "
                "precision" in f
                for f in res.metrics.labels.fallbacks
            ), res.metrics.labels.fallbacks
            assert (res.image == res.base_image).all()
        else:
            assert stack_state(tr).quantize.mode == form and type(lin.weight).__name__ == "Int8Tensor"
            line = next(x for x in res.metrics.labels.engaged if x.startswith("quantize:"))
            assert line.startswith(f"quantize: torchao {form} ") and f"{form} as the preset names it" in line
            assert (EAGER_NOTE in line) == (form == "int8_per_row")
            assert (
                res.metrics.labels.tag.split("+")[1] == {"int8_per_row": "int8dq", "int8_weight_only": "int8wo"}[form]
            )
            assert 25 < psnr(res.image, res.base_image) < 80, form  # quantized: near base, not equal to it
    # dynamic activations: the activations are quantized too, so further from base than weight-only (in float32,
    # where nothing but the 8-bit forms moves the picture; in bf16 they were 0.1 dB apart, in either order by torch)
    db = {f: out[f].metrics.quality.psnr_db for f in ("int8_per_row", "int8_weight_only")}
    assert db["int8_per_row"] + 0.5 < db["int8_weight_only"], db  # measured 65.95 and 66.80 dB, on both torches


def test_the_int8_preset_runs_this_cpus_form_compiled_and_says_why(runner):
    """The named `int8` on this CPU: the form `auto` picks for its flags (int8 per-row with AMX-INT8, else
    weight-only), compiled; with compile switched off per request, weight-only eagerly, with the reason."""
    from studio.engine.device import cpu_flags

    want = "int8_per_row" if "amx_int8" in cpu_flags() else "int8_weight_only"
    m = runner.generate(req(), "int8").metrics
    line = next(x for x in m.labels.engaged if x.startswith("quantize:"))
    assert line.startswith(f"quantize: torchao {want} ") and "auto: cpu" in line and "compiled" in line, line
    assert any(x.startswith("compile: regional") for x in m.labels.engaged), m.labels.fallbacks
    assert stack_state(runner.manager.current.pipe.transformer).quantize.mode == want
    assert m.quality.psnr_db > 25
    eager = runner.generate(req(), stack(runner, "int8", compile=False))
    line = next(x for x in eager.metrics.labels.engaged if x.startswith("quantize:"))
    assert "int8_weight_only" in line and EAGER_NOTE in line
