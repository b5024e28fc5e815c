"""Every DiT family the studio names, on a tiny random-weight instance built offline from its own classes:
FLUX, Qwen-Image (true CFG: two transformer calls per step), SD3.5 (CFG batched in one call), Z-Image (few steps,
CFG-free). The three-run check, the quantize and compile stacks, counts against cache-dit's own list, no false alarm
from the guard.
"""

from __future__ import annotations

import numpy as np
import pytest

from studio.engine import ModelManager, Runner
from studio.measure.quality import Verdict, psnr
from studio.report.text import doctor_table
from studio.spec import PresetLibrary
from studio.spec.settings import current
from studio.tiny.families import CACHING_THRESHOLD, FAMILIES, save_family
from tests.switched import stack

pytestmark = pytest.mark.slow
PROMPT = "a red circle in the center, blue background"
R = CACHING_THRESHOLD["cache-dit"]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    folder = save_family(request.param, tmp_path_factory.mktemp(request.param))
    runner = Runner(ModelManager("cpu", settings=current()), PresetLibrary(), model=str(folder), cheap_pairs=1)
    yield request.param, runner
    runner.manager.unload()


def test_three_run_check_and_counts_agree_with_cache_dit(family):
    name, runner = family
    req = runner.request(PROMPT, seed=1)
    base = runner.generate(req, "base")
    on = runner.generate(req, stack(runner, "cache", threshold=R))
    off = runner.generate(req, stack(runner, "cache", cache=False))
    m = on.metrics
    assert m.cache.cached_steps > 0 and m.cache.cached_steps + m.cache.full_steps == req.steps, (
        name,
        m.cache.cached_step_indices,
    )
    assert m.cache.count_source == "block hooks" and m.cache.count_check == "agrees with cache-dit", (
        name,
        m.cache.count_check,
    )
    assert m.cache.backend_cached_steps == m.cache.cached_step_indices
    # the guard raises no false alarm on a correct cache (telling noise from a picture needs a clean base image,
    # which random weights do not draw: that half of the guard is checked on the embedded model)
    assert 30.0 < m.quality.psnr_db < np.inf and m.quality.verdict in (Verdict.GOOD, Verdict.LOSSY) and not m.broken
    assert np.array_equal(off.image, base.image) and off.metrics.cache.cached_steps == 0


def test_quantize_and_compile_stacks(family):
    name, runner = family
    req = runner.request(PROMPT, seed=1)
    eager = runner.generate(req, stack(runner, "cache", threshold=R))
    q = runner.generate(req, stack(runner, "int8", compile=False))  # eager (weight-only); compiled below
    assert q.metrics.quality.psnr_db > 30.0 and not q.metrics.labels.fallbacks, (name, q.metrics.labels.fallbacks)
    cc = runner.generate(req, stack(runner, "cache-compile", threshold=R))
    line = next(x for x in cc.metrics.labels.engaged + cc.metrics.labels.fallbacks if x.startswith("compile:"))
    if line.startswith("compile: regional"):  # compiled: counted from cache-dit's list, the eager stack's steps
        assert cc.metrics.cache.count_source == "cache-dit" and cc.metrics.timing.compile_s is not None
    else:  # no repeated blocks (SD3): refused with the reason, eager
        assert "has no _repeated_blocks" in line and cc.metrics.labels.fallbacks == [line]
    assert cc.metrics.cache.cached_step_indices == eager.metrics.cache.cached_step_indices, name
    assert psnr(cc.image, eager.image) > 35.0


def test_qwen_image_cache_follows_the_cfg_mode_of_each_request(tmp_path):
    folder = save_family("qwen-image", tmp_path / "q")
    runner = Runner(ModelManager("cpu", settings=current()), PresetLibrary(), model=str(folder), cheap_pairs=1)
    try:
        for cfg, calls in ((1.0, 1), (4.0, 2)):  # no CFG: one call per step; true CFG: cond + uncond
            req = runner.request(PROMPT, seed=1, steps=20, true_cfg_scale=cfg)
            m = runner.generate(req, stack(runner, "cache", threshold=R)).metrics
            assert m.cache.transformer_calls == calls * 20
            # cache-dit wired for the run's real calls: its list and the block hooks agree (with the adapter's
            # default of two calls per step, the one-call run gave [4, 5, 6, 8, 9] against [8..13, 16..19])
            assert m.cache.count_check == "agrees with cache-dit" and m.cache.cached_steps > 0, (
                cfg,
                m.cache.count_check,
            )
            assert ("CFG branches cached apart" in " ".join(m.labels.engaged)) == (calls == 2)
    finally:
        runner.manager.unload()


def test_doctor_on_one_family():
    from studio.bench import doctor

    rows = doctor.run_doctor(["z-image"], ["base", "cache", "sage"])  # (compiled stacks: test_crash's doctor row)
    assert [r.preset for r in rows] == ["base", "cache", "sage"] and doctor.healthy(rows)
    assert rows[1].counts_agree is True and rows[1].cached_steps > 0
    assert "sage: unavailable on cpu, using sdpa" in rows[2].fallbacks
    table = doctor_table(rows)
    assert table.startswith("| family | preset | stack | cached/full | cache's own list | counts |")


def test_kernel_timing_runs_each_non_cache_stack_on_a_small_flux_transformer():
    """The doctor's GPU table (FLUX.1-dev size at 1024x1024 on a GPU), run here on a small config on the CPU."""
    from lab.regimes.kernels import KERNEL_STACKS, time_kernels

    small = dict(
        patch_size=1,
        in_channels=16,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=16,
        guidance_embeds=True,
        axes_dims_rope=(4, 6, 6),
    )
    rows = time_kernels(small, tokens=64, text=8, device="cpu", repeats=2)
    assert [r.stack for r in rows] == list(KERNEL_STACKS)
    by = {r.stack: r for r in rows}
    assert by["sdpa"].ms > 0 and by["sdpa"].speedup == 1.0
    assert by["sage"].ms is None and by["sage"].note == "sage: unavailable on cpu, using sdpa"
    assert by["int8"].ms > 0 and by["compile"].ms > 0 and "fullgraph=True" in by["compile"].note


def test_flux_kontext_reads_its_picture_as_a_reference_under_the_cache(tmp_path):
    """a FLUX.1 Kontext model (FluxKontextPipeline: the same transformer class, the input picture's latents
    read as extra tokens) edits: a picture on the request goes to its own pipeline as the reference, the whole
    schedule runs with the reference's tokens beside the picture's own (twice the sequence; random weights barely
    look at them, so the pictures differ only slightly), cache-dit's Flux adapter caches it (cached + full = the
    steps, its own list agreeing), PSNR is against base on the same reference; another reference gives another
    picture; what it does not read (a strength, a mask) is refused; a text-to-image request after an edit is
    bitwise the picture it gets alone."""
    from dataclasses import replace

    from studio.spec.checks import ConfigError

    folder = save_family("flux-kontext", tmp_path / "kontext")
    runner = Runner(ModelManager("cpu", settings=current()), PresetLibrary(), model=str(folder), cheap_pairs=1)
    runner.pairing = replace(runner.pairing, max_extra_pairs=0)
    runner.presets.user_dir = tmp_path
    runner.presets.add("kc", f"cache_config: {{residual_diff_threshold: {R}}}\n")
    try:
        req = runner.request(PROMPT, seed=3, steps=12)
        alone = runner.generate(req, "kc", compare="off")
        red, blue = np.zeros((64, 64, 3), np.uint8), np.zeros((64, 64, 3), np.uint8)
        red[..., 0], blue[..., 2] = 220, 220
        edit = runner.generate(replace(req, image=red), "kc")
        m = edit.metrics
        assert (
            "edit: FluxKontextPipeline read the input picture as a reference (64x64); all 12 steps ran"
            in m.labels.engaged
        )
        assert (
            m.cache.cached_steps > 0
            and m.cache.cached_steps + m.cache.full_steps == 12
            and m.cache.count_check.startswith("agrees")
        )
        assert (
            m.quality.psnr_db is not None and m.quality.psnr_db >= 25 and m.request["image"].startswith("64x64 sha1:")
        )
        tr = runner.manager.current.pipe.transformer
        seen = []
        hook = tr.register_forward_pre_hook(
            lambda m, a, kw: seen.append(kw["hidden_states"].shape[1]), with_kwargs=True
        )
        try:
            other = runner.generate(replace(req, image=blue), "kc", compare="off")
            runner.generate(req, "kc", compare="off")
        finally:
            hook.remove()
        assert seen == [2 * seen[-1]] * 12 + [seen[-1]] * 12  # the reference's tokens beside the picture's own
        assert not np.array_equal(other.image, edit.image) and not np.array_equal(edit.image, alone.image)
        for ask, why in ((dict(strength=0.5), "leave strength at 1"), (dict(mask_image=red[..., 0]), "takes no mask")):
            with pytest.raises(ConfigError, match=why):
                runner.generate(replace(req, image=red, **ask), "kc", compare="off")
        assert np.array_equal(runner.generate(req, "kc", compare="off").image, alone.image)
    finally:
        runner.manager.unload()
