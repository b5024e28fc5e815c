"""Property-based: junk thrown at the preset loader and the request validator gives only the project's own errors."""

from __future__ import annotations

import math

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from studio.spec import ConfigError, GenerationRequest
from studio.spec.presets import preset_from_dict, preset_from_text

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["auto", "sdpa", "sage", "cache-dit", "fbcache", "int8_weight_only"]),
)
values = st.recursive(
    scalars,
    lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(st.text(max_size=8), c, max_size=4)),
    max_leaves=12,
)
keys = st.sampled_from(
    ["description", "dtype", "attention_backend", "quantize_config", "cache_config", "compile", "name", "junk"]
)
sections = st.fixed_dictionaries(
    {},
    optional={
        "Fn_compute_blocks": values,
        "residual_diff_threshold": values,
        "max_warmup_steps": values,
        "enable_taylorseer": values,
        "enable_dmd": values,
        "steps_computation_mask": values,
        "compute_bins": values,
        "cache_bins": values,
        "backend": values,
        "quant_type": values,
        "exclude_layers": values,
        "enabled": values,
        "fullgraph": values,
        "mode": values,
    },
)
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(st.dictionaries(keys, st.one_of(values, sections), max_size=6))
@example({"quantize_config": {"\n": None}})  # found by CI: an unknown key's newline split the sentence
def test_preset_loader_raises_only_config_errors(data):
    try:
        p = preset_from_dict(data, name="junk")
    except ConfigError as e:
        assert str(e).startswith("<dict>: ") and "\n" not in str(e).strip()
    else:  # whatever it accepted is a whole, valid preset
        assert preset_from_text(yaml.safe_dump(data), "junk") == p


@SETTINGS
@given(st.text(max_size=300))
def test_preset_text_raises_only_config_errors(text):
    try:
        p = preset_from_text(text, "junk")
    except ConfigError as e:
        assert str(e).startswith("preset 'junk': ")  # the error names where it came from
    else:
        assert p.name == "junk" and p.tag()  # whatever parsed is a whole, valid preset


@SETTINGS
@given(
    prompt=st.one_of(st.text(max_size=50), st.integers(), st.none()),
    seed=values,
    steps=values,
    width=values,
    height=values,
    guidance=values,
    true_cfg_scale=values,
)
def test_request_validator_raises_only_config_errors(prompt, seed, steps, width, height, guidance, true_cfg_scale):
    try:
        r = GenerationRequest(
            prompt=prompt,
            seed=seed,
            steps=steps,
            width=width,
            height=height,
            guidance=guidance,
            true_cfg_scale=true_cfg_scale,
        )
    except ConfigError as e:
        assert str(e).startswith("request.")
    else:
        assert 1 <= r.steps <= 200 and 16 <= r.width <= 4096 and r.prompt.strip()
        assert r.guidance is None or (math.isfinite(r.guidance) and r.guidance >= 0)
        assert r.true_cfg_scale is None or (math.isfinite(r.true_cfg_scale) and r.true_cfg_scale >= 1)


@SETTINGS
@given(scale=st.one_of(st.floats(max_value=-1e-9), st.sampled_from([math.nan, math.inf, -math.inf])))
def test_a_negative_or_non_finite_scale_is_refused_with_a_sentence(scale):
    """guidance and true_cfg_scale (the UI/API handler's side: tests/test_units.py)."""
    for name in ("guidance", "true_cfg_scale"):
        try:
            GenerationRequest(prompt="p", **{name: scale})
        except ConfigError as e:
            assert str(e).startswith(f"request.{name}=") and f"is not valid: {name} is a finite number from " in str(e)
        else:
            raise AssertionError(f"{name}={scale!r} was accepted")
