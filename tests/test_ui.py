"""The Gradio app over the real engine: named API endpoints through gradio_client, and a real headless browser.

The app runs on 127.0.0.1 with a tiny random FluxPipeline (fast); the browser test uses the embedded model
as a user would get it from `python app.py`. As in app.py, the device work runs in the supervised worker process
(studio.worker): the engine is reached through the device's calls, never in this process.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from worker_hooks import hooked

from studio.engine.baseline import Pairing
from studio.spec import PresetLibrary
from studio.spec.preset import DTYPE_SHORT
from studio.spec.settings import current, using
from studio.worker import WorkerClient, WorkerConfig

PROMPT = "a red circle in the center, blue background"
ARTIFACTS = os.environ.get("STUDIO_ARTIFACTS", "artifacts")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(model, presets, **kw) -> WorkerClient:
    return WorkerClient(WorkerConfig(model=model, device="cpu", presets=presets, **kw))


def _auto_dtype() -> str:
    """What `dtype: auto` is on this CPU under this run's settings (STUDIO_DTYPE), short: the worker is handed the
    same settings and resolves it the same way."""
    import torch

    from studio.engine.device import profile_here, resolve_dtype

    return DTYPE_SHORT[resolve_dtype("auto", profile_here(torch.device("cpu")), forced=current().dtype).name]


def _auto_q8() -> str:
    """The tag of the 8-bit form `quant_type: auto` runs compiled on this CPU (engine.quantize.quant_form)."""
    from studio.engine.device import cpu_flags

    return "int8dq" if "amx_int8" in cpu_flags() else "int8wo"


def _launch(device, **kw):
    from studio.app.ui import CSS, build_app

    demo = build_app(device, **kw)
    port = _free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, css=CSS)
    return demo, f"http://127.0.0.1:{port}/"


@pytest.fixture(scope="module")
def app(random_model_dir, tmp_path_factory):
    lib = PresetLibrary(user_dir=tmp_path_factory.mktemp("presets"))
    # float32: random weights put residual diffs near the threshold, where compiled bf16 rounding can flip a
    # decision (see test_compile); float32 compiled differs from eager by rounding only.
    lib.add("c32", "dtype: float32\ncache_config: {residual_diff_threshold: 0.5}\n")
    # one pair of base and stack per comparison: these tests check pictures, counts and what the page shows (how a
    # speed-up is taken: tests/test_honest.py, test_engine.py)
    one_pair = Pairing(cheap_pairs=1, max_extra_pairs=0)
    device = _worker(random_model_dir, lib, settings=hooked("probe_threads"), pairing=one_pair)
    demo, url = _launch(device, default_preset="cache")
    yield device, url
    demo.close()
    device.close()


@pytest.fixture(scope="module")
def client(app):
    from gradio_client import Client

    return Client(app[1], verbose=False)


def _args(**kw):
    a = dict(prompt=PROMPT, model=None, seed=7, steps=10, width=64, height=64, guidance=None)
    a.update(kw)
    return a


def test_api_has_the_six_named_endpoints_with_their_parameters(client):
    api = client.view_api(print_info=False, return_format="dict")
    endpoints = api["named_endpoints"]
    # Enter adds no endpoint; /headroom answers before a run (app.room)
    assert set(endpoints) == {"/generate", "/images", "/compare", "/matrix", "/tune", "/headroom"}
    assert not api["unnamed_endpoints"]
    request = ["prompt", "model", "seed", "steps", "width", "height", "guidance", "negative_prompt", "true_cfg_scale"]
    request += ["num_images_per_prompt", "image", "mask_image", "strength", "loras"]
    expected = {
        "/generate": request + ["preset", "cache", "threshold", "compile", "compare"],
        "/images": request + ["preset", "cache", "threshold", "compile", "compare"],
        "/headroom": request + ["preset", "cache", "threshold", "compile", "compare"],
        "/compare": request + ["preset_a", "preset_b", "cache", "threshold", "compile"],
        "/matrix": request + ["presets", "repeats", "cache", "threshold", "compile", "prompts_text"],
        "/tune": request + ["floor", "prompts_text", "size", "max_flip"],
    }
    for name, params in expected.items():
        # "request", "progress" and "history" are filled in by gradio (or the session), not API parameters
        assert [p["parameter_name"] for p in endpoints[name]["parameters"]] == params, name
        assert all(p["parameter_has_default"] for p in endpoints[name]["parameters"]), name


def test_a_few_step_request_is_flagged_before_the_run(client, app, tmp_path):
    """/headroom reads the Generate form as /generate would (the preset switched, the steps that would run) and
    says, without a run, what the step cache can skip; a masked preset's mask is built by the device."""
    from studio.spec.cachedit import step_mask
    from studio.spec.headroom import headroom
    from studio.spec.presets import preset_from_text

    few = client.predict(**_args(steps=8, prompt=""), preset="cache", api_name="/headroom")  # any prompt: same bound
    assert (few["preset"], few["cache"], few["steps"], few["skippable"], few["tight"]) == ("cache", True, 8, 3, True)
    assert few["at_most"] == pytest.approx(1.6) and few["warning"].startswith("little room for this cache: at 8 ")
    long = client.predict(**_args(steps=28), preset="cache", api_name="/headroom")
    assert (long["skippable"], long["tight"], long["warning"]) == (18, False, None)
    for kw in (dict(preset="cache", cache="false"), dict(preset="base")):  # no step cache: nothing to say
        off = client.predict(**_args(steps=8), **kw, api_name="/headroom")
        assert off["cache"] is False and off["warning"] is None
    # img2img at strength 0.5 of 20 steps runs 10: the bound is of the steps that run (4 warm-up, 6 more: 5 cached)
    from gradio_client import handle_file

    Image.fromarray(np.full((64, 64, 3), 120, np.uint8)).save(tmp_path / "in.png")
    i2i = dict(image=handle_file(str(tmp_path / "in.png")), strength=0.5)
    got = client.predict(**_args(steps=20, **i2i), preset="cache", api_name="/headroom")
    assert (got["steps"], got["skippable"]) == (10, 5)
    device, _ = app
    masked = preset_from_text("cache_config: {steps_computation_mask: fast}\n", "masked")
    c = masked.cache_config
    assert device.headroom(masked, 28) == headroom(c, 28, step_mask(c, 28))  # the worker built the same mask


def test_generate_endpoint_with_per_request_cache_switch(client, app):
    runner, _ = app
    model = runner.model
    out = client.predict(**_args(model=model), preset="cache", cache="true", threshold=0.5, api_name="/generate")
    image_path, card = out[0], out[1]
    img = np.asarray(Image.open(image_path))
    assert img.shape[0] >= 64 and img.shape[2] == 3
    assert "cached" in card and "DBCache" in card and "PSNR" in card
    assert runner.info()["bases"] >= 1  # the base image for the comparison was computed and kept
    off = client.predict(**_args(model=model), preset="cache", cache="false", threshold=None, api_name="/generate")
    assert "0 cached / 10 full" in off[1] and "identical" in off[1]  # cache off == base, bitwise


@pytest.mark.slow
def test_generate_endpoint_with_compile_switch(client, app):
    runner, _ = app
    args = _args(model=runner.model)
    eager = client.predict(**args, preset="c32", cache="unset", threshold=0, compile="unset", api_name="/generate")
    out = client.predict(**args, preset="c32", cache="unset", threshold=0, compile="true", api_name="/generate")
    card = out[1]
    assert "compile: regional" in card and "fullgraph=False" in card and "compile warm-up" in card
    counts = re.search(r"(\d+) cached / (\d+) full", card).groups()
    assert counts == re.search(r"(\d+) cached / (\d+) full", eager[1]).groups()  # same steps as eager
    assert int(counts[0]) > 0 and "counted by cache-dit" in card


def test_api_defaults_and_numbers_as_data(client, app, tmp_path):
    runner, _ = app
    # every parameter but the prompt has a default: the form's (here the random test model's profile)
    out = client.predict(prompt=PROMPT, model=runner.model, preset="cache", threshold=0.5, api_name="/generate")
    m = out[-1]
    assert m["preset"] == "cache.override"  # the per-request threshold overrides the preset's
    assert m["cached_steps"] + m["full_steps"] == m["request"]["steps"]
    for key in ("speedup", "psnr_db", "ssim", "denoise_s", "cached_step_indices", "dtype", "engaged"):
        assert key in m
    assert f"{m['cached_steps']} cached / {m['full_steps']} full" in out[1]  # the card and the data agree
    # the error map (|image - base| x8), a path like the image; the metrics as a download, the same data
    assert np.asarray(Image.open(out[5])).shape == np.asarray(Image.open(out[0])).shape
    assert json.loads(Path(out[6]).read_text()) == m and Path(out[6]).name == "metrics.json"
    # the session's thumbnails, newest first, each captioned with its history row (a client is one session)
    newest = out[7][0]
    vs = "n/a" if m["speedup"] is None else f"{m['speedup']:.2f}x"  # none on a machine too busy to time it
    assert newest["caption"].startswith("#") and f"cache.override · {vs}" in newest["caption"]
    assert newest["caption"].endswith(f" · {m['psnr_db']:.2f} dB")
    assert max(np.asarray(Image.open(newest["image"])).shape[:2]) == 128
    assert isinstance(m["worst_tile_psnr_db"], float) and m["worst_tile_psnr_db"] <= m["psnr_db"]
    assert "worst 8x8 tile" in out[1] and len(m["worst_tile_yx"]) == 2
    # true CFG and a negative prompt by name: two transformer calls a step, said on the card
    cfg = client.predict(
        prompt=PROMPT,
        model=runner.model,
        preset="base",
        true_cfg_scale=2,
        negative_prompt="green",
        compare="off",
        api_name="/generate",
    )[-1]
    assert cfg["transformer_calls"] == 2 * cfg["request"]["steps"] and cfg["request"]["negative_prompt"] == "green"
    # a batch: the gallery before the metrics, a picture per seed, captioned
    batch = client.predict(
        prompt=PROMPT, model=runner.model, preset="base", num_images_per_prompt=2, compare="off", api_name="/generate"
    )
    assert [p["caption"] for p in batch[8]] == ["seed 42: inf, identical", "seed 43: inf, identical"]  # base itself
    assert batch[-1]["request"]["num_images_per_prompt"] == 2 and len(batch[-1]["batch"]) == 2
    # an input picture: img2img at strength 0.5 of 10 steps runs and counts 5
    from gradio_client import handle_file

    Image.fromarray(np.full((64, 64, 3), 120, np.uint8)).save(tmp_path / "in.png")
    i2i = client.predict(
        prompt=PROMPT,
        model=runner.model,
        preset="base",
        image=handle_file(str(tmp_path / "in.png")),
        strength=0.5,
        steps=10,
        compare="off",
        api_name="/generate",
    )[-1]
    assert i2i["request"]["strength"] == 0.5 and i2i["request"]["image"].startswith("64x64 sha1:")
    assert i2i["full_steps"] + i2i["cached_steps"] == 5 and len(i2i["step_ms"]) == 5
    base_out = client.predict(prompt=PROMPT, model=runner.model, preset="base", api_name="/generate")
    base = base_out[-1]
    assert base["psnr_db"] == "inf" and base["speedup"] == 1.0  # JSON has no Infinity
    assert base["worst_tile_psnr_db"] == "inf" and not np.asarray(Image.open(base_out[5])).any()  # all zero
    # every picture left its event as a file named by its content (app.pictures: gradio rewrites a numpy picture's
    # cache file in place, and a download of the same picture made meanwhile ends short): the same picture, one name
    served = [out[0], out[2], out[5], newest["image"], batch[8][0]["image"], base_out[0]]
    assert all(re.fullmatch(r"[0-9a-f]{24}\.png", Path(p).name) for p in served), served
    assert Path(base_out[0]).name == Path(out[2]).name  # base's picture of this request, shown twice


def test_compare_endpoint(client, app):
    runner, _ = app
    out = client.predict(
        **_args(model=runner.model),
        preset_a="base",
        preset_b="cache-int8-sage",
        cache="unset",
        threshold=None,
        compile="false",  # eager: the named 8-bit runs its weight-only form (compiled: the browser test below)
        api_name="/compare",
    )
    slider, a, b, table = out[0], out[1], out[2], out[3]
    assert len(slider) == 2 and all(os.path.exists(p) for p in slider)
    assert os.path.exists(a) and os.path.exists(b)
    headers = table["headers"]
    assert headers[:6] == ["stack", "denoise", "per-step", "vs base", "PSNR", "cached/full"]
    rows = table["data"]
    dt = _auto_dtype()  # the device's best exact dtype ran
    assert rows[0][0] == f"{dt}+sdpa" and rows[0][3] == "1.00x" and rows[0][4] == "inf"
    assert rows[1][0] == f"{dt}+int8wo+DBCache_F1B0W4R0.24MC3+sdpa (sage->sdpa)"  # what ran, and what did not
    assert "sage: unavailable on cpu, using sdpa" in rows[1][-1]
    assert headers[6] == "worst 8x8 tile" and rows[0][6] == "inf"
    error_map, data = out[6], out[-1]  # the map beside the slider: |B - A|, with its numbers in the data
    assert np.asarray(Image.open(error_map)).shape == np.asarray(Image.open(b)).shape
    assert data["b_vs_a"]["psnr_db"] == data["b"]["psnr_db"] and data["b_vs_a"]["map_scale"] == 8  # A is base


def test_matrix_over_more_prompts_pairs_each_stack_prompt_by_prompt(client, app):
    """More prompts in the Matrix tab: every preset over each (the same request, another prompt), the worst figures
    over the prompts as columns, and the plot one point per prompt (report.plots.plot_paired)."""
    runner, _ = app
    more = (
        "an orange triangle on the left, black background\n\n" + PROMPT
    )  # a blank line and the request's own: dropped
    out = client.predict(
        **_args(model=runner.model), presets=["base", "cache"], repeats=1, prompts_text=more, api_name="/matrix"
    )
    table, plot, data = out[0], out[1], out[-1]
    assert [r[-2] for r in table["data"]] == ["base", "cache", "base (again)"]
    assert "worst PSNR" in table["headers"] and "worst FLIP" in table["headers"]
    assert [r["prompts"] for r in data] == [2, 2, 2] and os.path.exists(plot)
    worst = table["headers"].index("worst PSNR")
    assert table["data"][0][worst] == "inf" and table["data"][2][worst] == "inf"  # base against itself, each prompt


def test_matrix_endpoint(client, app):
    runner, _ = app
    presets = ["base", "cache", "int8-weight-only"]
    out = client.predict(**_args(model=runner.model), presets=presets, repeats=1, api_name="/matrix")
    table, plot, csv_path, md_path, noise = out[0], out[1], out[4], out[5], out[6]
    assert [r[-2] for r in table["data"]] == presets + ["base (again)"]
    again = table["data"][-1]  # base timed again last in the round: the same stack gives the same picture
    assert again[4] == "inf" and again[5] == f"0/{_args()['steps']}"
    flip_at = table["headers"].index("FLIP")  # the optional columns travel with the table (report.table.OPTIONAL)
    assert again[flip_at] == "0.0000" and float(table["data"][2][flip_at]) > 0  # int8 moves pixels; base twice not
    assert f"it reads {again[3]} against base" in noise
    assert os.path.exists(plot)
    assert (
        open(csv_path).read().startswith("preset,tag,denoise_s,step_ms,speedup,psnr_db,ssim,cached_steps,full_steps")
    )
    assert "| stack | denoise |" in open(md_path).read()


def test_tune_endpoint_returns_a_preset_that_meets_its_target(client, app):
    from studio.spec.presets import preset_from_text

    runner, _ = app
    args = dict(floor=30, prompts_text=PROMPT, size="quick", max_flip=0.2)  # the Tune tab's FLIP ceiling too
    out = client.predict(**_args(model=runner.model), **args, api_name="/tune")
    text, plot, yaml_text, name, data = out
    assert data["worst_psnr_db"] == "inf" or data["worst_psnr_db"] >= 30
    assert data["max_flip"] == 0.2 and data["worst_flip"] <= 0.2 and "(ceiling 0.2)" in text
    assert data["runs"] == data["screening_runs"] + data["timed_runs"] > 0
    assert name == "tuned-30db" and "worst PSNR" in text
    p = preset_from_text(yaml_text, name)  # the YAML the tab shows loads like any preset
    assert (p.cache_config.enabled or p.step_share) and p.stack == preset_from_text(yaml_text, "again").stack


@pytest.mark.parametrize(
    "kw,message",
    [
        (dict(prompt="   "), "prompt is empty"),
        (dict(width=60), "not a multiple of 8"),
        (dict(steps=500), "Value 500 is greater than maximum value 100"),  # the slider refuses it
        (dict(preset="warp-speed"), "warp-speed is not in the list of choices"),
        (dict(cache="sometimes"), "'sometimes' .* is not in the list of choices"),
        (dict(model="/nowhere/model"), "does not exist"),
    ],
)
def test_generate_endpoint_errors(client, app, kw, message):
    from gradio_client.exceptions import AppError

    runner, _ = app
    args = _args(model=runner.model)
    args.update(preset="base", cache="unset", threshold=None)
    args.update(kw)
    with pytest.raises(AppError, match=message):
        client.predict(**args, api_name="/generate")
    # the app stays usable after an error
    ok = client.predict(
        **_args(model=runner.model), preset="base", cache="unset", threshold=None, api_name="/generate"
    )
    assert "identical" in ok[1]


# ------------------------------------------------------------------------------------------------- browser
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROME_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed (apt-get install chromium)")
def test_browser_generate_and_compare(tmp_path, tiny_lora):
    pytest.importorskip("playwright", reason="the playwright package is not installed")
    from playwright.sync_api import expect, sync_playwright

    runner = _worker("tiny", PresetLibrary(user_dir=tmp_path))
    dt = _auto_dtype()
    demo, url = _launch(runner, default_preset="cache")
    os.makedirs(ARTIFACTS, exist_ok=True)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROME_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1300})
            page.goto(url, wait_until="domcontentloaded")
            expect(page.get_by_role("button", name="Generate")).to_be_visible(timeout=60_000)
            # before the click: the step cache's room at the form's 28 steps (app.room)
            expect(page.locator("#gen-room")).to_contain_text("can skip up to 18 of 28 steps", timeout=30_000)
            prompt = page.get_by_label("Prompt", exact=True)
            prompt.fill("a yellow triangle on the left, purple background")
            prompt.press("Enter")  # Enter in the prompt box generates, like the button
            card = page.locator(".metrics-card")
            expect(card).to_contain_text("cached /", timeout=180_000)
            expect(card).to_contain_text("PSNR")
            text = card.inner_text()
            assert "vs base" in text and "DBCache" in text
            img = page.locator("img[src*='file=']").first
            expect(img).to_be_visible()
            page.screenshot(path=os.path.join(ARTIFACTS, "ui-generate.png"), full_page=True)
            # the error map as the person picks it: FLIP's, drawn from the kept pair without running anything again
            diff_src = page.locator("#gen-error-map img").get_attribute("src")
            page.locator("#gen-map-kind").get_by_label("FLIP", exact=True).check()
            expect(page.locator("#gen-map-note")).to_contain_text("FLIP's error map of image against base")
            expect(page.locator("#gen-error-map img")).not_to_have_attribute("src", diff_src, timeout=30_000)
            page.screenshot(path=os.path.join(ARTIFACTS, "ui-generate-flip.png"), full_page=True)
            page.locator("#gen-map-kind").get_by_label("×8 difference", exact=True).check()
            expect(page.locator("#gen-map-note")).to_contain_text("×8")

            # (the compiled stack's counts and its compile warm-up through the same endpoint: test_generate_endpoint_
            # with_compile_switch, by API; not again here, where a compile costs half a minute of the suite)
            assert re.search(r"(\d+) cached / (\d+) full", text)

            page.get_by_role("tab", name="A/B compare").click()
            page.get_by_role("button", name="Compare").click()
            table = page.locator("#ab-table")
            q8 = _auto_q8()  # the named full stack, compiled, in this CPU's fastest 8-bit form
            expect(table).to_contain_text(f"{dt}+{q8}+DBCache", timeout=180_000)
            expect(table).to_contain_text(f"{dt}+sdpa")
            page.wait_for_timeout(500)
            page.screenshot(path=os.path.join(ARTIFACTS, "ui-compare.png"), full_page=True)

            page.get_by_role("tab", name="History").click()
            history = page.locator("#history-table")
            expect(history).to_contain_text(f"{dt}+{q8}+DBCache")
            expect(history).to_contain_text("a yellow triangle on the left, purple background")

            expect(page.locator("#history-gallery img").first).to_be_visible()  # the thumbnails above the table

            # one upload: img2img at the form's strength 0.6 of 28 steps runs 17 (28 - int(28 - 16.8)), counted so
            upload = tmp_path / "input.png"
            Image.fromarray(np.kron(np.eye(2, dtype=np.uint8)[..., None] * 200, np.ones((32, 32, 3), np.uint8))).save(
                upload
            )
            page.get_by_role("tab", name="Generate").click()
            page.get_by_text("Image input: img2img, inpaint, edit").click()
            page.locator("#input-image input[type=file]").set_input_files(str(upload))
            expect(page.locator("#input-image img").first).to_be_visible(timeout=30_000)
            # strength 0.6 runs 17 of the 28 steps: 4 warm-up, then 13 of which 10 may be cached
            expect(page.locator("#gen-room")).to_contain_text("can skip up to 10 of 17 steps", timeout=30_000)
            page.get_by_role("button", name="Generate", exact=True).click()
            for _ in range(360):  # until the img2img card replaces the text-to-image one (28 steps)
                counts = re.search(r"(\d+) cached / (\d+) full", card.inner_text())
                if counts and sum(map(int, counts.groups())) != 28:
                    break
                page.wait_for_timeout(500)
            assert sum(map(int, counts.groups())) == 17, card.inner_text()
            page.screenshot(path=os.path.join(ARTIFACTS, "ui-img2img.png"), full_page=True)

            # one LoRA run, on the same input picture (img2img with a LoRA: 17 steps again), said on the card
            page.get_by_text("LoRA adapters", exact=True).click()
            box = page.locator("#loras textarea")
            expect(box).to_be_visible()
            page.wait_for_timeout(1000)  # the accordion's contents are mounted as it opens: fill after that
            box.fill(f"{tiny_lora}@1")
            box.press("Tab")  # the value reaches the app on blur at the latest, before the click sends the form
            expect(box).to_have_value(f"{tiny_lora}@1")
            page.wait_for_timeout(1000)
            page.get_by_role("button", name="Generate", exact=True).click()
            expect(card).to_contain_text(f"lora: {tiny_lora} at 1", timeout=90_000)
            counts = re.search(r"(\d+) cached / (\d+) full", card.inner_text()).groups()
            assert sum(map(int, counts)) == 17 and "PSNR" in card.inner_text()
            page.screenshot(path=os.path.join(ARTIFACTS, "ui-lora.png"), full_page=True)

            # a reload finds the history it left (kept in this browser), another browser finds none; Clear empties it
            page.reload(wait_until="domcontentloaded")
            page.get_by_role("tab", name="History").click()
            expect(history).to_contain_text("a yellow triangle on the left, purple background", timeout=60_000)
            expect(history).to_contain_text(f"{dt}+{q8}+DBCache")
            page.screenshot(path=os.path.join(ARTIFACTS, "ui-history-reloaded.png"), full_page=True)
            other = browser.new_context().new_page()
            other.goto(url, wait_until="domcontentloaded")
            other.get_by_role("tab", name="History").click()
            other.wait_for_timeout(2000)
            assert "yellow triangle" not in other.locator("#history-table").inner_text()
            page.locator("#history-clear").click()
            expect(history).not_to_contain_text("yellow triangle", timeout=30_000)
            page.reload(wait_until="domcontentloaded")
            page.get_by_role("tab", name="History").click()
            page.wait_for_timeout(2000)
            assert "yellow triangle" not in page.locator("#history-table").inner_text()

            # the Matrix's "all step caches": base, cache and every method's preset picked, at one repeat (not run)
            page.get_by_role("tab", name="Matrix").click()
            expect(page.get_by_label("magcache", exact=True)).not_to_be_checked()  # not among the defaults
            page.locator("#matrix-all-methods").click()
            for name in ("base", "cache", "magcache", "pab", "dbprune", "cache-foca"):
                expect(page.get_by_label(name, exact=True)).to_be_checked(timeout=30_000)
            expect(page.get_by_label("cache-int8-sage", exact=True)).not_to_be_checked()
            expect(page.get_by_label("Timed repeats", exact=False).first).to_have_value("1")

            page.get_by_role("tab", name="Presets").click()
            page.get_by_label("New preset name").fill("my-cache")  # the editor starts with cache.yaml's text
            page.get_by_role("button", name="Validate and save").click()
            expect(page.get_by_text("Saved my-cache")).to_be_visible(timeout=30_000)
            assert "my-cache" in runner.presets.names()
            browser.close()
    finally:
        demo.close()
        runner.close()
    shot = np.asarray(Image.open(os.path.join(ARTIFACTS, "ui-compare.png")).convert("RGB"))
    assert shot.shape[1] >= 1000 and shot.std() > 10  # a page was drawn, not a blank frame


def test_public_app_refuses_models_off_the_operators_list(random_model_dir, tmp_path):
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    runner = _worker(random_model_dir, PresetLibrary(user_dir=tmp_path), allowed=(random_model_dir,))
    demo, url = _launch(runner)
    try:
        c = Client(url, verbose=False)
        with pytest.raises(AppError, match=r"model '/etc' is not served here; this studio serves: "):
            c.predict(prompt=PROMPT, model="/etc", api_name="/generate")
        ok = c.predict(prompt=PROMPT, model=random_model_dir, preset="base", steps=10, api_name="/generate")
        assert ok[-1]["psnr_db"] == "inf" and runner.info()["model"] == random_model_dir
    finally:
        demo.close()
        runner.close()


@pytest.mark.slow
def test_eight_clients_with_mixed_requests_get_what_they_would_get_alone(client, app):
    """8 gradio_client clients x 2 mixed requests at once: same pixels and cached steps as each request alone."""
    from concurrent.futures import ThreadPoolExecutor

    from gradio_client import Client

    runner, url = app
    kinds = [
        dict(preset="base", cache="unset", threshold=0),
        dict(preset="cache", cache="unset", threshold=0.5),
        dict(preset="cache", cache="false", threshold=0),
    ]
    jobs = [(c, i, dict(kinds[(c + i) % 3], seed=c % 2)) for c in range(8) for i in range(2)]

    def run(kw, cl):
        # compare auto: after the first requests keep the shape's base timing, each request is one run of its stack
        # (the pictures and counts are what is checked here, not the timing), and the kept stores see 8 clients
        out = cl.predict(prompt=PROMPT, model=runner.model, steps=8, compare="auto", api_name="/generate", **kw)
        return np.asarray(Image.open(out[0])), out[-1]["cached_step_indices"], out[-1]["preset"]

    alone = {}
    for kw in {tuple(sorted(k.items())) for _, _, k in jobs}:
        alone[kw] = run(dict(kw), client)
    clients = [Client(url, verbose=False) for _ in range(8)]
    with ThreadPoolExecutor(8) as pool:
        futures = [(kw, pool.submit(run, kw, clients[c])) for c, _, kw in jobs]
        results = [(kw, f.result(timeout=600)) for kw, f in futures]
    assert len(results) == 16
    for kw, (img, cached, preset) in results:
        ref_img, ref_cached, ref_preset = alone[tuple(sorted(kw.items()))]
        assert np.array_equal(img, ref_img) and cached == ref_cached and preset == ref_preset, kw
    info = runner.info()
    assert info["bases"] <= info["bases_size"]  # kept base images stay bounded


def test_every_request_runs_torch_on_the_one_device_thread_of_the_worker(client, app):
    """Two clients at once: gradio hands the events to whichever of its threads is free, but every transformer call
    runs in the worker process, on its one device thread (a second OS thread running torch made every later CPU run
    1.6x slower: see studio.engine.thread)."""
    from concurrent.futures import ThreadPoolExecutor

    from gradio_client import Client

    runner, url = app
    clients = [Client(url, verbose=False) for _ in range(2)]
    kw = dict(prompt=PROMPT, model=runner.model, steps=4, api_name="/generate")

    def both(c):  # one event at a time per client (gradio_client's shared stream: library-behaviour G14)
        return [c.predict(preset=p, **kw) for p in ("base", "cache")]

    with ThreadPoolExecutor(2) as pool:  # the two clients at once
        for f in [pool.submit(both, c) for c in clients]:
            f.result(timeout=300)
    info = runner.info()  # the worker's probe saw every transformer call since it started
    assert info["torch_threads"] == [info["device_thread"]] and info["pid"] == runner.pid != os.getpid()


def test_a_cancelled_request_leaves_the_app_serving_the_same_pixels(client, app):
    runner, _ = app
    kw = dict(prompt=PROMPT, model=runner.model, preset="cache", threshold=0.5, steps=10, seed=11)
    alone = client.predict(api_name="/generate", **kw)
    job = client.submit(api_name="/generate", **dict(kw, seed=12))
    job.cancel()  # a visitor who closes the tab mid-run
    again = client.predict(api_name="/generate", **kw)
    assert np.array_equal(np.asarray(Image.open(again[0])), np.asarray(Image.open(alone[0])))
    assert again[-1]["cached_step_indices"] == alone[-1]["cached_step_indices"]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:  # the worker answers: the cancelled run is not stuck in it
        assert pool.submit(runner.info).result(timeout=60)["pid"] == runner.pid


def test_a_public_studio_refuses_what_burns_its_gpu_before_any_load(random_model_dir, tmp_path, monkeypatch):
    """in public mode a visitor's compile, an oversized Matrix and a burst of requests are refused with a
    sentence before any model work (a spy on the loader counts loads) and before a ZeroGPU reservation (`spaces.GPU`
    replaced by one that counts the calls it reserves a GPU for); the operator's caps come before the load too."""
    import spaces
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    reserved = []

    def gpu(
        fn, duration=None, size=None
    ):  # as @spaces.GPU: the call runs once a GPU is reserved for `duration(...)` s
        def call(*args, **kwargs):
            reserved.append(duration(*args, **kwargs))
            return fn(*args, **kwargs)

        return call

    monkeypatch.setattr(spaces, "GPU", gpu)

    from studio.app.limits import PublicGuard, PublicLimits, Refused
    from studio.engine import ModelManager, Runner
    from studio.spec.presets import preset_from_text

    runner = Runner(
        ModelManager("cpu", settings=current()), PresetLibrary(user_dir=tmp_path), model=random_model_dir, max_steps=20
    )
    loads = []
    real_load = runner.manager.load
    runner.manager.load = lambda *a, **k: loads.append(a) or real_load(*a, **k)
    limits = PublicLimits(max_matrix_runs=4, requests_per_minute=3, compiled_shapes=1)
    with using(proxy_hops=1):  # as on a Space: the visitor is the X-Forwarded-For entry its proxy wrote
        demo, url = _launch(runner, public=True, limits=limits)
    try:
        c = Client(url, verbose=False)
        common = dict(prompt=PROMPT, model=random_model_dir, steps=10)
        with pytest.raises(AppError, match="compile is this public studio's operator's choice"):
            c.predict(**common, preset="base", compile="true", api_name="/generate")
        with pytest.raises(AppError, match=r"a matrix of 4 presets x 1 repeats is 5 timed runs: .* at most 4"):
            c.predict(**common, presets=["base", "cache", "sage", "int8"], repeats=1, api_name="/matrix")
        with pytest.raises(AppError, match="LoRA adapters are not taken from visitors of this public studio"):
            c.predict(**common, preset="base", loras="/etc/passwd@1", api_name="/generate")
        with pytest.raises(AppError, match="steps 50 is over this studio's limit of 20"):
            c.predict(**{**common, "steps": 50}, preset="base", api_name="/generate")
        with pytest.raises(AppError, match="at most 3 requests a minute per visitor: try again in"):
            c.predict(**common, preset="base", api_name="/generate")
        with pytest.raises(AppError, match="at most 3 requests a minute per visitor"):  # a new client, same address
            Client(url, verbose=False).predict(**common, preset="base", api_name="/generate")
        assert loads == [] and reserved == []  # nothing above loaded a model or reserved a GPU
        other = Client(url, verbose=False, headers={"X-Forwarded-For": "198.51.100.1, 203.0.113.7"})  # another visitor
        ok = other.predict(**common, preset="base", api_name="/generate")
        assert ok[-1]["psnr_db"] == "inf" and len(loads) == 1 and len(reserved) == 1
    finally:
        demo.close()
        runner.manager.unload()
    # a visitor's own preset may not compile nor name LoRAs; the operator's may (compile at a bounded number of shapes)
    guard = PublicGuard(limits)
    mine = preset_from_text("compile: {enabled: true, mode: max-autotune}\n", "mine")
    with pytest.raises(Refused, match="only the built-in presets compile"):
        guard.preset(mine, builtin=False)
    guard.preset(mine, builtin=True)
    theirs = preset_from_text("loras: [/etc/passwd]\n", "theirs")  # a visitor's preset naming a file on the host
    with pytest.raises(Refused, match="names LoRA adapters: on this public studio only the operator's presets do"):
        guard.preset(theirs, builtin=False)
    guard.preset(theirs, builtin=True)
    req = runner.request(PROMPT, steps=10)
    guard.shape(mine, "m", req, compiled=True)
    guard.shape(mine, "m", req, compiled=True)  # the same shape again: no new compile
    guard.shape(mine, "m", replace(req, steps=12, seed=9), compiled=True)  # steps and seed build no graph
    with pytest.raises(Refused, match=r"compiled stacks here have met 1 shapes already .*: use one of them \(m "):
        guard.shape(mine, "m", replace(req, num_images_per_prompt=2), compiled=True)
    guard.shape(mine, "m", replace(req, width=128), compiled=False)  # uncompiled: no limit
