"""Preset files and config validation: every shipped preset parses; every kind of mistake names key and value."""

from __future__ import annotations

import pytest

from studio.spec import CacheSpec, CompileSpec, ConfigError, GenerationRequest, Preset, PresetLibrary, QuantSpec
from studio.spec.label import changes, join_label
from studio.spec.presets import load_preset, preset_from_text, preset_to_yaml

pytestmark = pytest.mark.quick  # the one-minute loop: no model is loaded here (pytest -m quick)

SHIPPED = [
    "base",
    "sage",
    "int8",
    "int8-weight-only",
    "sage-int8",
    "cache",
    "cache-int8",
    "cache-int8-sage",
    "compile",
    "cache-compile",
    "cache-int8wo-sage-compile",
]
PARALLEL = ["ulysses2", "cache-ulysses2"]
METHODS = [  # presets/methods/: one per step-cache method beside `cache` (studio.spec.methods)
    "cache-dmd",
    "cache-foca",
    "cache-scm",
    "cache-taylorseer",
    "dbprune",
    "fastercache",
    "fbcache",
    "magcache",
    "pab",
    "taylorseer",
]


def test_library_ships_exactly_the_thirteen_stacks_in_order_then_the_methods():
    lib = PresetLibrary()
    assert lib.names() == SHIPPED + PARALLEL + METHODS
    assert lib.method_names() == METHODS
    assert lib.one_process_names() == SHIPPED  # what bench, matrix and doctor run unless told otherwise
    assert all(lib.is_builtin(n) for n in METHODS)


def test_parallel_section_is_validated_with_cache_dits_names():
    from studio.spec.export import cache_dit_dict

    p = PresetLibrary().get("cache-ulysses2")
    assert p.parallelism_config.ulysses_size == 2 and p.parallelism_config.world_size == 2
    assert p.tag("bfloat16").endswith("+ulysses2") and p.cache_config.residual_diff_threshold == 0.24
    assert cache_dit_dict(p)["parallelism_config"] == {"ulysses_size": 2, "use_ray": True}
    assert preset_from_text(preset_to_yaml(p), "again").stack == p.stack
    with pytest.raises(ConfigError, match="parallelism_config.ulysses_size.*0"):
        preset_from_text("parallelism_config: {ulysses_size: 0}", "x")
    with pytest.raises(ConfigError, match="ray_worker_options.*numbers"):
        preset_from_text("parallelism_config: {ulysses_size: 2, ray_worker_options: {num_gpus: lots}}", "x")
    with pytest.raises(ConfigError, match="quantize_config.*drop quantize_config"):
        preset_from_text("quantize_config: {quant_type: int8_weight_only}\nparallelism_config: {ulysses_size: 2}", "x")
    with pytest.raises(ConfigError, match="unknown key parallelism_config.ulysses"):
        preset_from_text("parallelism_config: {ulysses: 2}", "x")


def test_shipped_stacks():
    lib = PresetLibrary()
    base = lib.get("base")
    assert (base.dtype, base.quant.enabled, base.cache.enabled, base.attention_backend, base.compile.enabled) == (
        "auto",
        False,
        False,
        "sdpa",
        False,
    )
    c = lib.get("cache").cache_config
    assert (
        c.backend,
        c.Fn_compute_blocks,
        c.Bn_compute_blocks,
        c.max_warmup_steps,
        c.residual_diff_threshold,
        c.max_continuous_cached_steps,
    ) == ("cache-dit", 1, 0, 4, 0.24, 3)
    # the named 8-bit stacks: the device's fastest form, compiled (engine.quantize.quant_form); weight-only is the
    # labelled memory option
    for name in ("int8", "sage-int8", "cache-int8", "cache-int8-sage"):
        assert lib.get(name).quant.quant_type == "auto" and lib.get(name).compile.enabled, name
    assert lib.get("int8-weight-only").quant.quant_type == "int8_weight_only"
    assert not lib.get("int8-weight-only").compile.enabled
    assert lib.get("cache-int8wo-sage-compile").quant.quant_type == "int8_weight_only"
    full = lib.get("cache-int8-sage")
    assert full.quant.enabled and full.cache.enabled and full.attention_backend == "sage"
    assert lib.get("cache").tag("bfloat16") == "bf16+DBCache_F1B0W4R0.24MC3+sdpa"
    assert lib.get("cache").tag() == "auto+DBCache_F1B0W4R0.24MC3+sdpa"
    assert full.tag("float32") == "fp32+q8+offload-auto+DBCache_F1B0W4R0.24MC3+sage+compile"
    # what ran is labelled by the same function from the run's own tokens, the parts that fell back marked
    ran = {**full.label_parts("float32"), "quantize": "int8dq", "attention": "sdpa", "offload": ""}  # (auto: resident)
    assert join_label(ran) == "fp32+int8dq+DBCache_F1B0W4R0.24MC3+sdpa+compile"
    assert changes(full.label_parts(), ran, {"attention"}) == ["sage->sdpa"]
    assert changes(full.label_parts(), {**ran, "compile": ""}, {"compile"}) == ["compile->eager"]
    # the compiled stacks: the same stacks with compile last (fullgraph decided by whether a cache is engaged)
    for name, like in (("compile", "base"), ("cache-compile", "cache")):
        p, q = lib.get(name), lib.get(like)
        assert p.compile.enabled and p.compile.regional and p.compile.fullgraph is None
        assert (p.dtype, p.quantize_config, p.cache_config, p.attention_backend) == (
            q.dtype,
            q.quantize_config,
            q.cache_config,
            q.attention_backend,
        )
    wo = lib.get("cache-int8wo-sage-compile")
    assert (wo.cache_config, wo.attention_backend, wo.compile) == (full.cache_config, "sage", full.compile)
    assert lib.get("compile").compile.effective_fullgraph(cache_engaged=False) is True
    assert lib.get("cache-compile").compile.effective_fullgraph(cache_engaged=True) is False


@pytest.mark.parametrize("name", SHIPPED)
def test_yaml_round_trip(name):
    p = PresetLibrary().get(name)
    again = preset_from_text(preset_to_yaml(p), name)
    assert again == p


def test_a_presets_loras_round_trip_and_go_first_on_a_request():
    from studio.spec.lora import LoraSpec, merge_loras

    p = preset_from_text("loras: [{path: /l/a.safetensors, scale: 0.8}, /l/b.safetensors@1.5]\n", "mine")
    assert p.loras == (LoraSpec("/l/a.safetensors", 0.8), LoraSpec("/l/b.safetensors", 1.5))
    assert preset_from_text(preset_to_yaml(p), "mine") == p and p.tag("bfloat16").endswith("+lora2")
    mine = (LoraSpec("/l/b.safetensors", 0.2), LoraSpec("/l/c.safetensors"))
    assert [lo.label() for lo in merge_loras(p.loras, mine)] == [
        "/l/a.safetensors@0.8",
        "/l/b.safetensors@1.5",
        "/l/c.safetensors@1",
    ]


def test_load_from_dict_and_path(tmp_path):
    d = {"description": "x", "cache_config": {"residual_diff_threshold": 0.3}, "attention_backend": "sdpa"}
    p = load_preset(d, name="mine")
    assert p.cache.backend == "cache-dit" and p.cache.residual_diff_threshold == 0.3  # a cache_config alone: cache-dit
    f = tmp_path / "mine.yaml"
    f.write_text(preset_to_yaml(p))
    assert load_preset(f) == p


BAD = [
    ("colour: red", "unknown key 'colour'"),
    ("cache_config: {Fn_compute_block: 1}", "unknown key cache_config.Fn_compute_block"),
    (
        "cache_config: {Fn_compute_blocks: one}",
        "cache_config.Fn_compute_blocks='one' is not valid: must be an integer",
    ),
    ("cache_config: {Fn_compute_blocks: 0}", "cache_config.Fn_compute_blocks=0 is not valid: must be >= 1"),
    ("cache_config: {residual_diff_threshold: -0.1}", "residual_diff_threshold=-0.1 is not valid"),
    ("cache_config: {residual_diff_threshold: fast}", "residual_diff_threshold='fast' is not valid"),
    ("cache_config: {max_warmup_steps: -1}", "cache_config.max_warmup_steps=-1 is not valid: must be >= 0"),
    ("cache_config: {max_continuous_cached_steps: 0}", "max_continuous_cached_steps=0 is not valid"),
    ("cache_config: {enable_taylorseer: true, enable_dmd: true}", "TaylorSeer, DMD and FoCa are alternative calib"),
    ("cache_config: {Fn: 1}", "unknown key cache_config.Fn;"),
    ("dtype: auto\nattention_backend: sdpa\ncompile: {fullgraph: sometimes}", "compile.fullgraph='sometimes'"),
    ("cache_config: {enable_taylorseer: yes please}", "enable_taylorseer='yes please' is not valid"),
    ("cache_config: {taylorseer_order: 9, enable_taylorseer: true}", "taylorseer_order=9 is not valid: must be <= 4"),
    ("cache_config: {steps_computation_mask: turbo}", "steps_computation_mask='turbo' is not valid: use one of"),
    ("cache_config: {steps_computation_policy: sometimes}", "steps_computation_policy='sometimes' is not valid"),
    ("cache_config: {compute_bins: [4, 2]}", "give both or neither"),
    ("cache_config: {compute_bins: [4, 0], cache_bins: [1, 1]}", "compute_bins=(4, 0) is not valid"),
    ("cache_config: {steps_computation_mask: fast, compute_bins: [4], cache_bins: [1]}", "not both"),
    ("cache_config: {backend: fbcache, enable_dmd: true}", "need backend: cache-dit"),
    ("cache_config: {backend: teacache}", "cache_config.backend='teacache' is not valid: use one of"),
    # the methods' own knobs, by their libraries' names (studio.spec.methods)
    ("cache_config: {backend: magcache, options: {treshold: 0.1}}", "cache_config.options.treshold=0.1 is not valid"),
    ("cache_config: {backend: magcache, options: {threshold: -1}}", "options.threshold=-1 is not valid: must be >= 0"),
    ("cache_config: {backend: magcache, options: {mag_ratios: []}}", "mag_ratios=[] is not valid: must be a list"),
    ("cache_config: {backend: pab, options: {spatial_attention_timestep_skip_range: [900, 100]}}", "low < high"),
    ("cache_config: {backend: taylorseer, options: {cache_interval: 0}}", "cache_interval=0 is not valid: must be >="),
    ("cache_config: {backend: seacache, options: {residual_order: 2}}", "residual_order=2 is not valid: must be <= 1"),
    ("cache_config: {backend: dbprune, options: {non_prune_block_ids: [a]}}", "non_prune_block_ids=['a'] is not"),
    ("cache_config: {backend: fbcache, options: {threshold: 0.2}}", "backend fbcache takes no options"),
    ("cache_config: {options: {threshold: 0.2}}", "backend cache-dit takes its knobs as cache_config keys"),
    ("cache_config: {backend: magcache, enable_foca: true}", "need backend: cache-dit"),
    ("cache_config: {backend: pab, options: [1, 2]}", "cache_config.options=[1, 2] is not valid: must be a mapping"),
    ("quantize_config: {quant_type: int4}", "quantize_config.quant_type='int4' is not valid: use one of"),
    ("quantize_config: {exclude_layers: embedder}", "quantize_config.exclude_layers='embedder' is not valid"),
    ("attention_backend: turbo", "preset.attention_backend='turbo' is not valid: use one of"),
    ("compile: {enabled: maybe}", "compile.enabled='maybe' is not valid: must be true or false"),
    ("compile: {enabled: true, mode: fastest}", "compile.mode='fastest' is not valid"),
    ("dtype: int4", "preset.dtype='int4' is not valid: use one of"),
    ("cache_config: [1, 2]", "cache_config must be a mapping"),
    ("loras: a.safetensors", "loras must be a list of {path: ..., scale: ...}"),
    ("loras: {}", "loras must be a list of {path: ..., scale: ...}"),
    ('loras: ["a\\nb"]', "one LoRA file, folder or Hub id (path or path@scale) per entry"),
    ("loras: [{path: a.safetensors, weight: 2}]", "preset.loras.entry="),
    ("loras: [{path: a.safetensors, scale: 9}]", "lora.scale=9 is not valid: a finite number from -4 to 4"),
    ("loras: [a, b, c, d, e]", "preset.loras="),
    ("loras: [a]\nparallelism_config: {ulysses_size: 2}", "parallel workers load the model's own weights: drop loras"),
    ("- just\n- a list", "a preset must be a YAML mapping"),
    ("cache_config: {Fn_compute_blocks: 1", "not valid YAML"),
]


@pytest.mark.parametrize("text,expected", BAD, ids=[b[1][:40] for b in BAD])
def test_every_validation_error_names_source_key_and_value(tmp_path, text, expected):
    f = tmp_path / "broken.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_preset(f)
    msg = str(e.value)
    assert msg.startswith(str(f)), msg  # the file
    assert expected in msg, msg  # the key, the value, what is allowed


def test_missing_file_and_bad_name(tmp_path):
    with pytest.raises(ConfigError, match="no such preset file"):
        load_preset(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="preset.name='a b' is not valid"):
        Preset(name="a b")


def test_user_presets_appear_by_name_and_cannot_shadow_builtins(tmp_path):
    lib = PresetLibrary(user_dir=tmp_path)
    p = lib.add("fast-fb", "cache_config: {backend: fbcache}\nattention_backend: sdpa\n")
    assert "fast-fb" in lib.names() and lib.names()[: len(SHIPPED)] == SHIPPED
    assert lib.get("fast-fb") == p and p.cache.backend == "fbcache"
    with pytest.raises(ConfigError, match="built in"):
        lib.add("cache", "attention_backend: sdpa\n")
    with pytest.raises(ConfigError, match="unknown key"):
        lib.add("bad", "speed: 11\n")
    assert "bad" not in lib.names()
    with pytest.raises(ConfigError, match="not found; available"):
        lib.get("nothing")


def test_threshold_defaults_raise_for_quantized_and_explicit_wins():
    fb = CacheSpec(backend="fbcache")
    assert fb.effective_threshold("none") == 0.08
    assert fb.effective_threshold("int8_per_row") == 0.08  # measured: int8 adds ~1.5% to the residual diffs
    assert fb.effective_threshold("float8_per_row") == 0.12
    assert CacheSpec(backend="fbcache", residual_diff_threshold=0.05).effective_threshold("int8_per_row") == 0.05
    assert CacheSpec(backend="cache-dit", residual_diff_threshold=0.24).effective_threshold("int8_per_row") == 0.24


def test_per_request_cache_and_compile_switches():
    lib = PresetLibrary()
    cache = lib.get("cache")
    assert cache.with_overrides(None, None, None) is cache
    off = cache.with_overrides(cache=False)
    assert not off.cache.enabled and off.name == "cache.override"
    on = lib.get("base").with_overrides(True, 0.5)
    assert on.cache.backend == "cache-dit" and on.cache.residual_diff_threshold == 0.5
    assert cache.with_overrides(None, 0.3).cache.residual_diff_threshold == 0.3
    compiled = cache.with_overrides(compile=True)
    assert compiled.compile.enabled and compiled.cache == cache.cache and compiled.name == "cache.override"
    eager = lib.get("cache-compile").with_overrides(compile=False)
    assert not eager.compile.enabled and eager.stack == cache.stack
    cc = lib.get("cache-compile")
    assert cc.with_overrides(compile=True) is cc  # asking for what the preset already does changes nothing


@pytest.mark.parametrize(
    "text,expected",
    [("true", True), ("on", True), ("false", False), ("off", False), ("unset", None), ("", None), (None, None)],
)
def test_switch_parsing(text, expected):
    from studio.spec import parse_switch

    assert parse_switch(text) is expected


def test_switch_parsing_refuses_other_words():
    from studio.spec import parse_switch

    with pytest.raises(ConfigError, match="compile switch 'sometimes' is not valid: use true, false"):
        parse_switch("sometimes", "compile switch")


def test_request_validation():
    with pytest.raises(ConfigError, match="request.prompt='  ' is not valid"):
        GenerationRequest(prompt="  ")
    with pytest.raises(ConfigError, match="request.steps=0 is not valid: must be >= 1"):
        GenerationRequest(prompt="x", steps=0)
    with pytest.raises(ConfigError, match="request.width=True"):
        GenerationRequest(prompt="x", width=True)
    r = GenerationRequest(prompt="x")
    assert r.key("m") == GenerationRequest(prompt="x").key("m") != GenerationRequest(prompt="x", seed=1).key("m")
    assert r.key("m", "float32") != r.key("m", "bfloat16")  # the base image is kept per dtype


def test_spec_defaults_validate():
    assert QuantSpec().quant_type == "none" and not CompileSpec().enabled
    with pytest.raises(ConfigError):
        CompileSpec(enabled=True, fullgraph="yes")


def test_prompt_length_is_bounded_and_not_echoed():
    """Any request holds at most PROMPT_CHARS_CEILING characters; the operator's bound (STUDIO_MAX_PROMPT_CHARS,
    2000 by default: far past any DiT's text window, FLUX's 512 T5 tokens) is a cap, checked with the others."""
    from studio.spec.request import PROMPT_CHARS_CEILING, check_caps

    with pytest.raises(ConfigError) as e:
        GenerationRequest(prompt="y" * (PROMPT_CHARS_CEILING + 1))
    assert str(e.value) == "request.prompt is 1000001 characters long: at most 1000000 are allowed in any request"
    check_caps(GenerationRequest(prompt="x" * 2000), None, None, 2000)
    with pytest.raises(ConfigError) as e:
        check_caps(GenerationRequest(prompt="y" * 20_000), None, None, 2000)
    assert (
        str(e.value) == "request.prompt is 20000 characters long: at most 2000 are allowed (STUDIO_MAX_PROMPT_CHARS)"
    )
    with pytest.raises(ConfigError, match="request.negative_prompt is 301 characters long: at most 300 are allowed"):
        check_caps(GenerationRequest(prompt="z", negative_prompt="n" * 301), None, None, 300)
    with pytest.raises(ConfigError, match=r"guidance=-5 is not valid: guidance is a finite number from 0 to 50"):
        GenerationRequest(prompt="x", guidance=-5)
