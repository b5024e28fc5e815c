"""A preset as the YAML that `cache_dit.load_configs` reads (cache, calibrator, quantization, attention and
parallelism sections with cache-dit's own keys), so a studio-tuned stack can be served by any cache-dit user."""

from __future__ import annotations

import yaml

from studio.spec.cachedit import cache_dit_configs
from studio.spec.methods import HOOK_BACKENDS, METHOD_NAMES, knobs_of
from studio.spec.preset import ATTENTION_BACKENDS, Preset

CACHE_KEYS = (
    "Fn_compute_blocks",
    "Bn_compute_blocks",
    "max_warmup_steps",
    "residual_diff_threshold",
    "max_continuous_cached_steps",
    "max_cached_steps",
)
DEFAULT_STEPS = 28
AUTO_EXPORT = "float8_per_row"  # cache-dit's default quant_type


def exported_form(p: Preset, quant: str | None = None) -> str:
    """The quant_type cache-dit is given: `quant` (the form the studio runs on the exporting device) where known;
    for `auto` without it, cache-dit's own default (float8_per_row: its quantization runs on CUDA only)."""
    if not p.quant.enabled:
        return "none"
    if quant not in (None, "none"):
        return quant
    return AUTO_EXPORT if p.quant.quant_type == "auto" else p.quant.quant_type


def cache_dit_dict(p: Preset, steps: int | None = None, quant: str | None = None) -> dict:
    """The preset's cache-dit configuration; `steps` sizes a step mask policy, `quant` is the form `auto` resolves to
    on the device the file is for."""
    out: dict = {}
    c = p.cache_config
    form = exported_form(p, quant)
    if c.backend in ("cache-dit", "dbprune"):
        n = (steps or DEFAULT_STEPS) if c.has_mask else None
        cfgs = cache_dit_configs(c, quant=form, steps=n)
        cc = {k: getattr(cfgs.cache, k) for k in CACHE_KEYS}
        if c.backend == "dbprune":  # load_configs picks DBPruneConfig by cache_type, with its own keys
            cc["cache_type"] = "DBPrune"
            cc.update({k: list(v) if isinstance(v, tuple) else v for k, v in knobs_of("dbprune", c.options).items()})
        if c.enable_taylorseer:
            cc.update(enable_taylorseer=True, taylorseer_order=c.taylorseer_order)
        elif c.enable_dmd:
            cc.update(enable_dmd=True, dmd_history=c.dmd_history, dmd_rank=c.dmd_rank)
        elif c.enable_foca:
            cc.update(enable_foca=True)
        if c.has_mask:
            cc["num_inference_steps"] = n
            cc["steps_computation_policy"] = c.steps_computation_policy
            # bins travel as the mask they make; a policy name as its name (load_configs sizes it by the steps)
            named = c.compute_bins is None
            cc["steps_computation_mask"] = c.steps_computation_mask if named else cfgs.cache.steps_computation_mask
        out["cache_config"] = cc
    if p.quant.enabled:
        out["quantize_config"] = {"quant_type": form, "exclude_layers": list(p.quant.exclude_layers)}
    if p.attention_backend != "sdpa":
        out["attention_backend"] = ATTENTION_BACKENDS[p.attention_backend]
    if p.wants_workers:
        out["parallelism_config"] = p.parallelism_config.cache_dit_dict()
    return out


def cache_dit_yaml(p: Preset, steps: int | None = None, quant: str | None = None, here: str | None = None) -> str:
    """The export, headed by what the preset asks for and, given `here` (report.fmt.on_this_machine), what its
    device-dependent parts become on the exporting device."""
    head = f"# DiT Speed Studio preset {p.name!r} ({p.tag()}), for cache_dit.load_configs\n"
    if p.description:
        head += "".join(f"# {line}\n" for line in p.description.splitlines())
    if p.compile.enabled:
        head += "# compile: torch.compile after enable_cache (regional: transformer.compile_repeated_blocks())\n"
    if here:
        head += f"# {here}\n"
    if p.quant.quant_type == "auto":
        head += f"# quantize_config: the studio's `auto`, written as {exported_form(p, quant)}\n"
    if p.cache_config.backend in HOOK_BACKENDS:
        name = METHOD_NAMES[p.cache_config.backend]
        head += f"# cache_config: left out: {name} is a diffusers hook, which cache_dit.load_configs does not load\n"
    return head + yaml.safe_dump(cache_dit_dict(p, steps, quant), sort_keys=False)
