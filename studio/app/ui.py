"""The Gradio studio: a layout function per tab, then the events wired to module-level handlers (app.handlers).

Named API endpoints (gradio_client): /generate, /compare, /matrix, /tune. Each takes the request fields, the preset
name(s), the per-request cache switch ("true", "false", or "unset" to follow the preset), threshold (empty or 0 to
follow the preset) and compile switch (like the cache switch).
"""

from __future__ import annotations

import importlib.util
import os
import random
import tempfile
from pathlib import Path
from types import SimpleNamespace

import gradio as gr

from studio.app.handlers import CACHE_CHOICES, COMPILE_CHOICES, HISTORY_COLUMNS, Handlers, Studio, notes_md
from studio.engine import BASE, Runner
from studio.engine.thread import on_device_thread
from studio.report.card import CSS
from studio.report.table import COLUMNS

__all__ = ["CSS", "build_app"]


def _gpu(fn):
    """A device event's handler: run on the one thread that does all torch work (studio.engine.thread: a second
    thread running torch makes every CPU kernel slower), and on ZeroGPU Spaces (the `spaces` package present) under
    @spaces.GPU."""
    fn = on_device_thread(fn)
    if importlib.util.find_spec("spaces") is None:
        return fn
    import spaces  # noqa: PLC0415

    return spaces.GPU(fn)


def _request_form(ui, studio: Studio) -> None:
    prof = studio.runner.profile(studio.models[0])
    with gr.Row():
        with gr.Column(scale=3):
            ui.prompt = gr.Textbox(label="Prompt", value=prof.first_prompt, lines=2)
            ui.examples = gr.Dropdown(label="Example prompts", choices=list(prof.example_prompts), value=None)
        with gr.Column(scale=2):
            ui.model = gr.Dropdown(
                label="Model", choices=studio.models, value=studio.models[0], allow_custom_value=True
            )
            ui.model_notes = gr.Markdown(notes_md(prof.notes))
            with gr.Row():
                ui.seed = gr.Number(label="Seed", value=42, precision=0, minimum=0)
                ui.dice = gr.Button("Random seed", size="sm")
    with gr.Row():
        ui.steps = gr.Slider(label="Steps", minimum=1, maximum=100, step=1, value=prof.steps)
        ui.width = gr.Number(label="Width", value=prof.width, precision=0, minimum=16)
        ui.height = gr.Number(label="Height", value=prof.height, precision=0, minimum=16)
        # A value of None would make `guidance` a required API parameter: a model without guidance gets 0 (ignored).
        ui.guidance = gr.Number(
            label="Guidance",
            value=prof.guidance if prof.guidance is not None else 0.0,
            visible=prof.guidance is not None,
        )


def _switches(ui, prefix: str) -> None:
    setattr(ui, f"{prefix}cache", gr.Radio(label="Cache (this request)", choices=CACHE_CHOICES, value="unset"))
    setattr(ui, f"{prefix}threshold", gr.Number(label="Cache threshold (0: the preset's)", value=0, minimum=0))
    setattr(ui, f"{prefix}compile", gr.Radio(label="Compile (this request)", choices=COMPILE_CHOICES, value="unset"))


def _generate_tab(ui, names: list[str], default_preset: str) -> None:
    with gr.Tab("Generate"):
        with gr.Row():
            with gr.Column(scale=1):
                ui.preset = gr.Dropdown(label="Preset", choices=names, value=default_preset)
                _switches(ui, "")
                ui.gen_btn = gr.Button("Generate", variant="primary")
            with gr.Column(scale=2):
                ui.image = gr.Image(label="Image", type="numpy", format="png", interactive=False)
                ui.card = gr.HTML(label="Metrics")
                with gr.Accordion("Metrics as JSON (what the API returns)", open=False):
                    ui.metrics_json = gr.JSON(label="metrics")
            with gr.Column(scale=2):
                ui.base_image = gr.Image(
                    label="base image (same request)", type="numpy", format="png", interactive=False
                )
                ui.steps_plot = gr.Image(label="Per-step time and residual diff", type="numpy", interactive=False)


def _compare_tab(ui, names: list[str], pair: tuple[str, str]) -> None:
    with gr.Tab("A/B compare"):
        with gr.Row():
            ui.preset_a = gr.Dropdown(label="Preset A", choices=names, value=pair[0])
            ui.preset_b = gr.Dropdown(label="Preset B", choices=names, value=pair[1])
            _switches(ui, "ab_")
            ui.cmp_btn = gr.Button("Compare", variant="primary")
        ui.ab_flag = gr.HTML()
        with gr.Row():
            ui.slider = gr.ImageSlider(label="A | B", type="numpy", format="png", interactive=False)
            ui.img_a = gr.Image(label="A", type="numpy", format="png", interactive=False)
            ui.img_b = gr.Image(label="B", type="numpy", format="png", interactive=False)
        ui.ab_table = gr.Dataframe(
            headers=list(COLUMNS), label="A/B", interactive=False, wrap=True, elem_id="ab-table"
        )
        with gr.Accordion("A and B metrics as JSON (what the API returns)", open=False):
            ui.ab_json = gr.JSON(label="metrics")


def _matrix_tab(ui, names: list[str], default: list[str]) -> None:
    with gr.Tab("Matrix"):
        with gr.Row():
            ui.mx_presets = gr.CheckboxGroup(label="Presets", choices=names, value=default)
            with gr.Column():
                ui.mx_repeats = gr.Slider(
                    label="Timed repeats (median; 1 is quick but a single run can be an outlier)",
                    minimum=1,
                    maximum=5,
                    step=1,
                    value=3,
                )
                ui.mx_cache = gr.Radio(label="Cache (all but base)", choices=CACHE_CHOICES, value="unset")
                ui.mx_compile = gr.Radio(label="Compile (all but base)", choices=COMPILE_CHOICES, value="unset")
            ui.mx_btn = gr.Button("Run matrix", variant="primary")
        ui.mx_table = gr.Dataframe(
            headers=list(COLUMNS),
            label="All presets, one request",
            elem_id="matrix-table",
            interactive=False,
            wrap=True,
        )
        ui.mx_noise = gr.Markdown(elem_id="matrix-noise")
        with gr.Row():
            ui.mx_plot = gr.Image(label="Speed-up vs PSNR", type="numpy", interactive=False)
            with gr.Column():
                ui.mx_pick = gr.Dropdown(label="Per-step chart for", choices=[], value=None)
                ui.mx_steps = gr.Image(label="Per-step time and residual diff", type="numpy", interactive=False)
        with gr.Row():
            ui.mx_csv = gr.File(label="Table (CSV)")
            ui.mx_md = gr.File(label="Table (Markdown)")
        with gr.Accordion("Rows as JSON (what the API returns)", open=False):
            ui.mx_json = gr.JSON(label="rows")


def _tune_tab(ui, studio: Studio) -> None:
    prof = studio.runner.profile(studio.models[0])
    with gr.Tab("Tune"):
        gr.Markdown(
            "The fastest stack whose **worst** PSNR over the prompts stays at or above the target: cache knobs, "
            "calibrators and step masks searched on this device's best non-cache options, finalists timed side "
            "by side with `cache`. Uses the request settings above (seed, size, steps) with each prompt."
        )
        with gr.Row():
            with gr.Column(scale=1):
                ui.tn_floor = gr.Number(label="Fastest stack at >= N dB (worst prompt)", value=35, minimum=10)
                ui.tn_size = gr.Radio(label="Search", choices=["quick", "full"], value="quick")
                ui.tn_btn = gr.Button("Find the fastest stack", variant="primary")
            with gr.Column(scale=2):
                ui.tn_prompts = gr.Textbox(
                    label="Prompts (one per line)", lines=5, value="\n".join(prof.example_prompts)
                )
        ui.tn_result = gr.Markdown()
        with gr.Row():
            ui.tn_plot = gr.Image(label="The search's threshold curve", type="numpy", interactive=False)
            with gr.Column():
                ui.tn_yaml = gr.Code(label="Tuned preset", language="yaml", interactive=False)
                ui.tn_name = gr.Textbox(label="Save as preset named")
                ui.tn_save = gr.Button("Save as preset")
                ui.tn_msg = gr.Markdown()
        with gr.Accordion("Result as JSON (what the API returns)", open=False):
            ui.tn_json = gr.JSON(label="tuned")


def _presets_tab(ui, studio: Studio, names: list[str], default_preset: str) -> None:
    with gr.Tab("Presets"):
        with gr.Row():
            with gr.Column():
                ui.pv_name = gr.Dropdown(label="Preset", choices=names, value=default_preset)
                ui.pv_desc = gr.Markdown()
                ui.pv_yaml = gr.Code(label="YAML", language="yaml", interactive=False)
            with gr.Column():
                ui.new_name = gr.Textbox(label="New preset name")
                ui.new_yaml = gr.Code(
                    label="New preset YAML (paste or upload)",
                    language="yaml",
                    interactive=True,
                    value=studio.library().text("cache"),
                )
                ui.upload = gr.File(label="Upload a .yaml preset", file_types=[".yaml", ".yml"], type="filepath")
                ui.save_btn = gr.Button("Validate and save", variant="primary")
                ui.save_msg = gr.Markdown()


def _history_tab(ui) -> None:
    with gr.Tab("History"):
        ui.hist_table = gr.Dataframe(
            headers=HISTORY_COLUMNS, label="Runs this session", interactive=False, elem_id="history-table", wrap=True
        )
        ui.export_btn = gr.Button("Export CSV")
        ui.hist_file = gr.File(label="History (CSV)")


def _wire(ui, h: Handlers, demo) -> None:
    req = [ui.prompt, ui.model, ui.seed, ui.steps, ui.width, ui.height, ui.guidance]
    hist_out = [ui.hist_table, ui.history]
    private = {"api_visibility": "private"}
    device = {"concurrency_id": "device"}
    ui.dice.click(lambda: random.randint(0, 2**31 - 1), None, ui.seed, **private)
    ui.examples.change(lambda e, p: e or p, [ui.examples, ui.prompt], ui.prompt, **private)
    ui.model.change(
        h.on_model, ui.model, [ui.examples, ui.model_notes, ui.steps, ui.width, ui.height, ui.guidance], **private
    )
    ui.gen_btn.click(
        _gpu(h.generate),
        req + [ui.preset, ui.cache, ui.threshold, ui.compile, ui.history],
        [ui.image, ui.card, ui.base_image, ui.steps_plot] + hist_out + [ui.metrics_json],
        api_name="generate",
        **device,
    )
    ui.cmp_btn.click(
        _gpu(h.compare),
        req + [ui.preset_a, ui.preset_b, ui.ab_cache, ui.ab_threshold, ui.ab_compile, ui.history],
        [ui.slider, ui.img_a, ui.img_b, ui.ab_table, ui.ab_flag] + hist_out + [ui.ab_json],
        api_name="compare",
        **device,
    )
    mx_out = [ui.mx_table, ui.mx_plot, ui.mx_pick, ui.mx_steps, ui.mx_csv, ui.mx_md, ui.matrix_runs, ui.mx_noise]
    ui.mx_btn.click(
        _gpu(h.matrix),
        req + [ui.mx_presets, ui.mx_repeats, ui.mx_cache, ui.mx_compile, ui.history],
        mx_out + hist_out + [ui.mx_json],
        api_name="matrix",
        **device,
    )
    ui.mx_pick.change(h.pick_steps, [ui.mx_pick, ui.matrix_runs], ui.mx_steps, **private)
    ui.tn_btn.click(
        _gpu(h.tune),
        req + [ui.tn_floor, ui.tn_prompts, ui.tn_size],
        [ui.tn_result, ui.tn_plot, ui.tn_yaml, ui.tn_name, ui.tn_json],
        api_name="tune",
        **device,
    )
    ui.pv_name.change(h.show_preset, ui.pv_name, [ui.pv_desc, ui.pv_yaml], **private)
    demo.load(h.show_preset, ui.pv_name, [ui.pv_desc, ui.pv_yaml], **private)
    ui.upload.upload(h.load_upload, ui.upload, [ui.new_yaml, ui.new_name], **private)
    lists = [ui.preset, ui.preset_a, ui.preset_b, ui.mx_presets, ui.pv_name]
    ui.save_btn.click(h.save_preset, [ui.new_name, ui.new_yaml], [ui.save_msg] + lists, **private)
    ui.tn_save.click(h.save_tuned, [ui.tn_name, ui.tn_yaml], [ui.tn_msg] + lists, **private)
    ui.export_btn.click(h.export_history, ui.history, ui.hist_file, **private)


def build_app(
    runner: Runner | None = None,
    *,
    models: list[str] | None = None,
    default_preset: str | None = None,
    compare_presets: tuple[str, str] = (BASE, "cache-int8-sage"),
    public: bool = False,
) -> gr.Blocks:
    """The studio. public: each visitor's saved presets stay in their own session (a public Space)."""
    runner = runner or Runner()
    # User presets need somewhere to live; the runner's library is not changed (the engine stays as it was given).
    presets = runner.presets
    if presets.user_dir is None:
        presets = presets.with_user_dir(Path(tempfile.gettempdir()) / "dit-speed-studio-presets")
    studio = Studio(runner, models or [runner.model], presets, public=public)
    names = studio.library().names()
    default_preset = default_preset if default_preset in names else ("cache" if "cache" in names else BASE)
    ui = SimpleNamespace()
    with gr.Blocks(title="DiT Speed Studio") as demo:
        gr.Markdown(
            "# DiT Speed Studio\nPick a speed/quality preset, generate, and see what it bought (denoise time, "
            "cached steps, speed-up) and what it cost (PSNR/SSIM against the `base` image of the same request)."
        )
        ui.history = gr.State([])
        ui.matrix_runs = gr.State({})
        _request_form(ui, studio)
        with gr.Tabs():
            _generate_tab(ui, names, default_preset)
            _compare_tab(ui, names, compare_presets)
            _matrix_tab(ui, names, studio.library().one_process_names())
            _tune_tab(ui, studio)
            _presets_tab(ui, studio, names, default_preset)
            _history_tab(ui)
        _wire(ui, Handlers(studio, ui), demo)
    # One generation at a time on the device; the rest wait with their queue position shown.
    demo.queue(default_concurrency_limit=1, max_size=int(os.environ.get("STUDIO_QUEUE_SIZE", "32")))
    return demo
