"""The Gradio studio: a thin layer over Runner. Layout first, events after; handlers only translate.

Named API endpoints (gradio_client): /generate, /compare, /matrix. Each takes the request fields, the preset
name(s) and an optional per-request cache switch ("true", "false", or "unset" to follow the preset) and
threshold (empty to follow the preset).
"""

from __future__ import annotations

import csv
import html
import importlib.util
import io
import math
import os
import random
import tempfile
from pathlib import Path

import gradio as gr
import numpy as np
from PIL import Image

from studio.bench import COLUMNS, MatrixRow, plot_steps, plot_tradeoff, run_matrix
from studio.config import ConfigError, parse_switch
from studio.models.manager import ModelLoadError
from studio.presets import PresetLibrary
from studio.runner import BASE, Runner

CSS = """
.metrics-card table {border-collapse: collapse; width: 100%; font-size: 0.92em}
.metrics-card td {padding: 3px 8px; border-bottom: 1px solid var(--border-color-primary)}
.metrics-card td:first-child {color: var(--body-text-color-subdued); white-space: nowrap}
.flag-broken {color: #fff; background: #c62828; padding: 2px 8px; border-radius: 4px; font-weight: 600}
.flag-ok {color: #1b5e20; font-weight: 600}
.flag-warn {color: #a15c00}
.stack-lines {font-family: var(--font-mono); font-size: 0.85em; margin: 4px 0 0 0}
.fallback {color: #a15c00}
"""
CACHE_CHOICES = [("follow preset", "unset"), ("on", "true"), ("off", "false")]
HISTORY_COLUMNS = ["#", "prompt", "seed", "steps", "size"] + list(COLUMNS)


def _gpu(fn):
    """On ZeroGPU Spaces (the `spaces` package present) run `fn` under @spaces.GPU; elsewhere as it is."""
    if importlib.util.find_spec("spaces") is None:
        return fn
    import spaces  # noqa: PLC0415

    return spaces.GPU(fn)


def _png(render) -> np.ndarray:
    buf = io.BytesIO()
    render(buf)
    buf.seek(0)
    return np.asarray(Image.open(buf).convert("RGB"))


def _enlarge(img: np.ndarray, min_side: int = 384) -> np.ndarray:
    """Small native sizes shown enlarged (nearest neighbour: pixels stay honest)."""
    h, w = img.shape[:2]
    k = max(1, math.ceil(min_side / max(h, w)))
    return img if k == 1 else np.kron(img, np.ones((k, k, 1), dtype=img.dtype))


def _fmt_psnr(v) -> str:
    if v is None:
        return "n/a"
    return "∞ (identical)" if math.isinf(v) else f"{v:.2f} dB"


def metrics_card(m) -> str:
    """The compact card under an image: what the preset bought and what it cost."""
    if m.quality.startswith("likely broken"):
        flag = f'<span class="flag-broken">⚠ {html.escape(m.quality)}</span>'
    elif m.quality in ("identical", "good"):
        flag = f'<span class="flag-ok">{html.escape(m.quality)}</span>'
    else:
        flag = f'<span class="flag-warn">{html.escape(m.quality)}</span>'
    rows = [
        ("stack", f"<code>{html.escape(m.tag)}</code> ({html.escape(m.preset)})"),
        ("denoise", f"{m.denoise_s:.3f} s &nbsp; ({m.mean_step_ms:.1f} ms/step)"),
        (
            "steps",
            f"{m.cached_steps} cached / {m.full_steps} full"
            + (f" &nbsp; cached: {m.cached_step_indices}" if m.cached_step_indices else ""),
        ),
        (
            "vs base",
            "n/a"
            if m.speedup is None
            else f"{m.speedup:.2f}x" + (f" (base {m.base_denoise_s:.3f} s)" if m.base_denoise_s else ""),
        ),
        ("PSNR / SSIM", f"{_fmt_psnr(m.psnr_db)} / " + ("n/a" if m.ssim is None else f"{m.ssim:.4f}")),
        ("quality", flag),
    ]
    if m.compile_s is not None:
        rows.append(("compile warm-up", f"{m.compile_s:.1f} s (not in denoise time)"))
    lines = "".join(
        f'<div class="{"fallback" if line in m.fallbacks else ""}">{html.escape(line)}</div>' for line in m.engaged
    )
    rows.append(("engaged", f'<div class="stack-lines">{lines}</div>'))
    rows.append(("device", f"{html.escape(m.device)}, {html.escape(m.dtype)}"))
    body = "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in rows)
    return f'<div class="metrics-card"><table>{body}</table></div>'


def _table(rows: list[MatrixRow]) -> list[list[str]]:
    return [r.cells() for r in rows]


def _write(tmpdir: Path, name: str, text: str) -> str:
    path = tmpdir / name
    path.write_text(text)
    return str(path)


def build_app(
    runner: Runner | None = None,
    *,
    models: list[str] | None = None,
    default_preset: str | None = None,
    compare_presets: tuple[str, str] = (BASE, "cache-int8-sage"),
) -> gr.Blocks:
    runner = runner or Runner()
    if runner.presets.user_dir is None:  # user presets need somewhere to live
        runner.presets.user_dir = Path(tempfile.gettempdir()) / "dit-speed-studio-presets"
    lib: PresetLibrary = runner.presets
    models = models or [runner.model]
    names = lib.names()
    default_preset = default_preset if default_preset in names else ("cache" if "cache" in names else BASE)
    prof = runner.profile(models[0])
    tmpdir = Path(tempfile.mkdtemp(prefix="studio-"))

    # ---------------------------------------------------------------------------------------------- layout
    with gr.Blocks(title="DiT Speed Studio") as demo:
        gr.Markdown(
            "# DiT Speed Studio\nPick a speed/quality preset, generate, and see what it bought (denoise time, "
            "cached steps, speed-up) and what it cost (PSNR/SSIM against the `base` image of the same request)."
        )
        history = gr.State([])
        matrix_runs = gr.State({})
        with gr.Row():
            with gr.Column(scale=3):
                prompt = gr.Textbox(
                    label="Prompt", value=prof.example_prompts[0] if prof.example_prompts else "", lines=2
                )
                examples = gr.Dropdown(label="Example prompts", choices=list(prof.example_prompts), value=None)
            with gr.Column(scale=2):
                model = gr.Dropdown(label="Model", choices=models, value=models[0], allow_custom_value=True)
                with gr.Row():
                    seed = gr.Number(label="Seed", value=42, precision=0, minimum=0)
                    dice = gr.Button("Random seed", size="sm")
        with gr.Row():
            steps = gr.Slider(label="Steps", minimum=1, maximum=100, step=1, value=prof.steps)
            width = gr.Number(label="Width", value=prof.width, precision=0, minimum=16)
            height = gr.Number(label="Height", value=prof.height, precision=0, minimum=16)
            guidance = gr.Number(label="Guidance", value=prof.guidance, visible=prof.guidance is not None)

        with gr.Tabs():
            with gr.Tab("Generate"):
                with gr.Row():
                    with gr.Column(scale=1):
                        preset = gr.Dropdown(label="Preset", choices=names, value=default_preset)
                        cache_switch = gr.Radio(label="Cache (this request)", choices=CACHE_CHOICES, value="unset")
                        threshold = gr.Number(label="Cache threshold (0: the preset's)", value=0, minimum=0)
                        gen_btn = gr.Button("Generate", variant="primary")
                    with gr.Column(scale=2):
                        image = gr.Image(label="Image", type="numpy", format="png", interactive=False)
                        card = gr.HTML(label="Metrics")
                    with gr.Column(scale=2):
                        base_image = gr.Image(
                            label="base image (same request)", type="numpy", format="png", interactive=False
                        )
                        steps_plot = gr.Image(label="Per-step time and residual diff", type="numpy", interactive=False)
            with gr.Tab("A/B compare"):
                with gr.Row():
                    preset_a = gr.Dropdown(label="Preset A", choices=names, value=compare_presets[0])
                    preset_b = gr.Dropdown(label="Preset B", choices=names, value=compare_presets[1])
                    ab_switch = gr.Radio(label="Cache (this request)", choices=CACHE_CHOICES, value="unset")
                    ab_threshold = gr.Number(label="Cache threshold (0: the preset's)", value=0, minimum=0)
                    cmp_btn = gr.Button("Compare", variant="primary")
                ab_flag = gr.HTML()
                with gr.Row():
                    slider = gr.ImageSlider(label="A | B", type="numpy", format="png", interactive=False)
                    img_a = gr.Image(label="A", type="numpy", format="png", interactive=False)
                    img_b = gr.Image(label="B", type="numpy", format="png", interactive=False)
                ab_table = gr.Dataframe(
                    headers=list(COLUMNS), label="A/B", interactive=False, wrap=True, elem_id="ab-table"
                )
            with gr.Tab("Matrix"):
                with gr.Row():
                    mx_presets = gr.CheckboxGroup(label="Presets", choices=names, value=names)
                    mx_repeats = gr.Slider(label="Timed repeats (median)", minimum=1, maximum=5, step=1, value=1)
                    mx_btn = gr.Button("Run matrix", variant="primary")
                mx_table = gr.Dataframe(
                    headers=list(COLUMNS),
                    label="All presets, one request",
                    elem_id="matrix-table",
                    interactive=False,
                    wrap=True,
                )
                with gr.Row():
                    mx_plot = gr.Image(label="Speed-up vs PSNR", type="numpy", interactive=False)
                    with gr.Column():
                        mx_pick = gr.Dropdown(label="Per-step chart for", choices=[], value=None)
                        mx_steps = gr.Image(label="Per-step time and residual diff", type="numpy", interactive=False)
                with gr.Row():
                    mx_csv = gr.File(label="Table (CSV)")
                    mx_md = gr.File(label="Table (Markdown)")
            with gr.Tab("Presets"):
                with gr.Row():
                    with gr.Column():
                        pv_name = gr.Dropdown(label="Preset", choices=names, value=default_preset)
                        pv_desc = gr.Markdown()
                        pv_yaml = gr.Code(label="YAML", language="yaml", interactive=False)
                    with gr.Column():
                        new_name = gr.Textbox(label="New preset name")
                        new_yaml = gr.Code(
                            label="New preset YAML (paste or upload)",
                            language="yaml",
                            interactive=True,
                            value=lib.text("cache"),
                        )
                        upload = gr.File(label="Upload a .yaml preset", file_types=[".yaml", ".yml"], type="filepath")
                        save_btn = gr.Button("Validate and save", variant="primary")
                        save_msg = gr.Markdown()
            with gr.Tab("History"):
                hist_table = gr.Dataframe(
                    headers=HISTORY_COLUMNS,
                    label="Runs this session",
                    interactive=False,
                    elem_id="history-table",
                    wrap=True,
                )
                export_btn = gr.Button("Export CSV")
                hist_file = gr.File(label="History (CSV)")

        # ------------------------------------------------------------------------------------------ events
        def _request(prompt_v, model_v, seed_v, steps_v, width_v, height_v, guidance_v):
            if not prompt_v or not str(prompt_v).strip():
                raise gr.Error("Write a prompt first: the prompt is empty.")
            try:
                req = runner.request(
                    str(prompt_v),
                    model=model_v,
                    seed=int(seed_v if seed_v is not None else 0),
                    steps=int(steps_v),
                    width=int(width_v),
                    height=int(height_v),
                    guidance=None
                    if guidance_v is None or runner.profile(model_v).guidance is None
                    else float(guidance_v),
                )
            except (ConfigError, ValueError) as e:
                raise gr.Error(f"That request can't run: {e}") from None
            return req

        def _progress_hooks(progress):
            cached = []

            def on_step(i, total, rec):
                if rec.cached:
                    cached.append(i)
                desc = f"denoising step {i + 1}/{total}" + (" — served from cache" if rec.cached else "")
                if cached:
                    desc += f" (cached so far: {len(cached)})"
                progress((i + 1, total), desc=desc, unit="steps")

            def on_status(msg):
                cached.clear()
                progress(0, desc=msg)

            return on_step, on_status

        def _threshold(value):
            # A browser's empty number field sends 0: 0 (or nothing) means "follow the preset".
            if value in (None, "") or float(value) <= 0:
                return None
            return float(value)

        def _run(req, model_v, preset_v, switch_v, thr_v, progress):
            on_step, on_status = _progress_hooks(progress)
            try:
                return runner.generate(
                    req,
                    preset_v,
                    model=model_v,
                    cache_enabled=parse_switch(switch_v),
                    cache_threshold=_threshold(thr_v),
                    progress=on_step,
                    on_status=on_status,
                )
            except (ConfigError, ModelLoadError, ValueError) as e:
                raise gr.Error(str(e)) from None

        def _history_rows(hist, req, results):
            for res in results:
                hist = hist + [
                    [len(hist) + 1, req.prompt, req.seed, req.steps, f"{req.width}x{req.height}"]
                    + MatrixRow.from_metrics(res.metrics).cells()
                ]
            return hist

        @_gpu
        def generate(
            prompt,
            model,
            seed,
            steps,
            width,
            height,
            guidance,
            preset,
            cache,
            threshold,
            hist=None,
            progress=gr.Progress(),
        ):
            req = _request(prompt, model, seed, steps, width, height, guidance)
            res = _run(req, model, preset, cache, threshold, progress)
            hist = _history_rows(hist or [], req, [res])
            base = _enlarge(res.base_image) if res.base_image is not None else None
            chart = _png(lambda buf: plot_steps(res.metrics, buf))
            return _enlarge(res.image), metrics_card(res.metrics), base, chart, hist, hist

        @_gpu
        def compare(
            prompt,
            model,
            seed,
            steps,
            width,
            height,
            guidance,
            preset_a,
            preset_b,
            cache,
            threshold,
            hist=None,
            progress=gr.Progress(),
        ):
            req = _request(prompt, model, seed, steps, width, height, guidance)
            ra = _run(req, model, preset_a, cache, threshold, progress)
            rb = _run(req, model, preset_b, cache, threshold, progress)
            rows = [MatrixRow.from_metrics(ra.metrics), MatrixRow.from_metrics(rb.metrics)]
            broken = [r.preset for r in rows if r.quality.startswith("likely broken")]
            flag = (
                f'<span class="flag-broken">⚠ {", ".join(broken)}: likely broken, not lossy '
                f"(PSNR and high-frequency energy say noise)</span>"
                if broken
                else ""
            )
            hist = _history_rows(hist or [], req, [ra, rb])
            a, b = _enlarge(ra.image), _enlarge(rb.image)
            return (a, b), a, b, _table(rows), flag, hist, hist

        @_gpu
        def matrix(
            prompt, model, seed, steps, width, height, guidance, presets, repeats, hist=None, progress=gr.Progress()
        ):
            req = _request(prompt, model, seed, steps, width, height, guidance)
            if not presets:
                raise gr.Error("Choose at least one preset for the matrix.")
            try:
                mat = run_matrix(
                    runner,
                    req,
                    list(presets),
                    model=model,
                    repeats=int(repeats or 1),
                    on_status=lambda s: progress(0, desc=s),
                )
            except (ConfigError, ModelLoadError, ValueError) as e:
                raise gr.Error(str(e)) from None
            plot = _png(lambda buf: plot_tradeoff(mat.rows, buf))
            runs = {name: r.metrics.as_dict() for name, r in mat.results.items()}
            first = next((r.preset for r in mat.rows if r.preset != BASE), mat.rows[0].preset)
            chart = _png(lambda buf: plot_steps(runs[first], buf))
            hist = _history_rows(hist or [], req, list(mat.results.values()))
            return (
                _table(mat.rows),
                plot,
                gr.update(choices=list(runs), value=first),
                chart,
                _write(tmpdir, "matrix.csv", mat.csv()),
                _write(tmpdir, "matrix.md", mat.markdown()),
                runs,
                hist,
                hist,
            )

        def pick_steps(name, runs):
            if not name or name not in (runs or {}):
                return None
            return _png(lambda buf: plot_steps(runs[name], buf))

        def show_preset(name):
            try:
                p = lib.get(name)
            except ConfigError as e:
                raise gr.Error(str(e)) from None
            origin = "built in" if lib.is_builtin(name) else "user preset"
            return f"**{name}** ({origin}) — `{p.tag()}`\n\n{p.description}", lib.text(name)

        def load_upload(path):
            if not path:
                return gr.update(), gr.update()
            text = Path(path).read_text()
            return text, Path(path).stem

        def save_preset(name_v, text_v):
            name_v = (name_v or "").strip()
            if not name_v:
                raise gr.Error("Give the new preset a name.")
            try:
                p = lib.add(name_v, text_v or "")
            except ConfigError as e:
                raise gr.Error(f"Preset not saved: {e}") from None
            choices = lib.names()
            upd = gr.update(choices=choices)
            return (
                f"Saved **{name_v}** — `{p.tag()}`. It is now in every preset list.",
                upd,
                upd,
                upd,
                gr.update(choices=choices, value=name_v),
                gr.update(choices=choices),
            )

        def export_history(hist):
            buf = io.StringIO()
            w = csv.writer(buf)
            w.writerow(HISTORY_COLUMNS)
            w.writerows(hist or [])
            return _write(tmpdir, "history.csv", buf.getvalue())

        def on_model(model_v):
            try:
                p = runner.profile(model_v)
            except Exception as e:  # an unknown name only fails when used; keep the form as it is
                raise gr.Error(str(e)) from None
            return (
                gr.update(choices=list(p.example_prompts), value=None),
                p.steps,
                p.width,
                p.height,
                gr.update(value=p.guidance, visible=p.guidance is not None),
            )

        req_inputs = [prompt, model, seed, steps, width, height, guidance]
        private = {"api_visibility": "private"}
        dice.click(lambda: random.randint(0, 2**31 - 1), None, seed, **private)
        examples.change(lambda e, p: e or p, [examples, prompt], prompt, **private)
        model.change(on_model, model, [examples, steps, width, height, guidance], **private)
        gen_btn.click(
            generate,
            req_inputs + [preset, cache_switch, threshold, history],
            [image, card, base_image, steps_plot, hist_table, history],
            api_name="generate",
            concurrency_id="device",
        )
        cmp_btn.click(
            compare,
            req_inputs + [preset_a, preset_b, ab_switch, ab_threshold, history],
            [slider, img_a, img_b, ab_table, ab_flag, hist_table, history],
            api_name="compare",
            concurrency_id="device",
        )
        mx_btn.click(
            matrix,
            req_inputs + [mx_presets, mx_repeats, history],
            [mx_table, mx_plot, mx_pick, mx_steps, mx_csv, mx_md, matrix_runs, hist_table, history],
            api_name="matrix",
            concurrency_id="device",
        )
        mx_pick.change(pick_steps, [mx_pick, matrix_runs], mx_steps, **private)
        pv_name.change(show_preset, pv_name, [pv_desc, pv_yaml], **private)
        demo.load(show_preset, pv_name, [pv_desc, pv_yaml], **private)
        upload.upload(load_upload, upload, [new_yaml, new_name], **private)
        save_btn.click(
            save_preset, [new_name, new_yaml], [save_msg, preset, preset_a, preset_b, mx_presets, pv_name], **private
        )
        export_btn.click(export_history, history, hist_file, **private)
    # One generation at a time on the device; the rest wait with their queue position shown.
    demo.queue(default_concurrency_limit=1, max_size=int(os.environ.get("STUDIO_QUEUE_SIZE", "32")))
    return demo
