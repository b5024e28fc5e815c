"""The Gradio studio: a layout function per tab returning its record of components (app.forms), then the events
wired to the handlers (app.handlers).

Named API endpoints (gradio_client), each taking the request fields (prompt, model, seed, steps, width, height,
guidance) and then (app.forms lists them, in this order):
    /generate  preset, cache, threshold, compile
    /compare   preset_a, preset_b, cache, threshold, compile
    /matrix    presets, repeats, cache, threshold, compile (on every preset but base)
    /tune      floor, prompts_text, size (no switches: the tuner chooses the stack)
cache and compile: "true", "false", or "unset" to follow the preset; threshold: empty or 0 follows the preset.
"""

from __future__ import annotations

import importlib.util
import random
import tempfile
from pathlib import Path

import gradio as gr

from studio.app import forms
from studio.app.forms import UI, CompareTab, GenerateTab, HistoryTab, MatrixTab, PresetsTab, TuneTab
from studio.app.handlers import CACHE_CHOICES, COMPILE_CHOICES, Handlers, Studio
from studio.app.history import HISTORY_COLUMNS, History
from studio.app.limits import PublicGuard, PublicLimits
from studio.app.panel import request_panel
from studio.measure.quality import ERROR_SCALE
from studio.report import fmt
from studio.report.card import CSS
from studio.report.table import AB_COLUMNS, COLUMNS
from studio.spec.presets import BASE
from studio.spec.request import COMPARE_MODES, MAX_BATCH, compare_mode
from studio.worker.protocol import Device

__all__ = ["CSS", "build_app"]


def _gpu(fn, duration=None):
    """A device event's handler: on ZeroGPU Spaces (the `spaces` package present) under @spaces.GPU, which runs it in
    a process `spaces` forks with the GPU attached, for `duration` (a callable of the event's arguments: app.gpu_time)
    seconds. (Where torch runs, all of it runs on that process's one device thread: the device does that,
    studio.worker.) Off ZeroGPU `spaces.GPU` returns the handler as it is."""
    if importlib.util.find_spec("spaces") is None:
        return fn
    import spaces  # noqa: PLC0415

    return spaces.GPU(fn, duration=duration)


def _switches() -> tuple[gr.Radio, gr.Number, gr.Radio]:
    """The per-request cache switch, threshold and compile switch."""
    return (
        gr.Radio(label="Cache (this request)", choices=CACHE_CHOICES, value="unset"),
        gr.Number(label="Cache threshold (0: the preset's)", value=0, minimum=0),
        gr.Radio(label="Compile (this request)", choices=COMPILE_CHOICES, value="unset"),
    )


def _generate_tab(names: list[str], default_preset: str, compare: str) -> GenerateTab:
    with gr.Tab("Generate"):
        with gr.Row():
            with gr.Column(scale=1):
                preset = gr.Dropdown(label="Preset", choices=names, value=default_preset)
                cache, threshold, compile_ = _switches()
                compare_ = gr.Radio(
                    label="Compare with base", choices=list(COMPARE_MODES), value=compare, info=fmt.COMPARE_INFO
                )
                button = gr.Button("Generate", variant="primary")
                compare_button = gr.Button("Compare with base", variant="secondary")
            with gr.Column(scale=2):
                image = gr.Image(label="Image", type="numpy", format="png", interactive=False)
                last = gr.State(None)
                batch = gr.Gallery(
                    label="The batch, picture by picture (seed: PSNR against its own base picture)",
                    columns=MAX_BATCH, height=200, object_fit="contain", preview=False, format="png",
                    elem_id="batch-gallery",
                )  # fmt: skip
                card = gr.HTML(label="Metrics")
                with gr.Accordion("Metrics as JSON (what the API returns)", open=False):
                    json = gr.JSON(label="metrics")
                json_file = gr.DownloadButton("Download metrics (JSON)", value=None, size="sm")
            with gr.Column(scale=2):
                base_image = gr.Image(label="base image (same request)", type="numpy", format="png", interactive=False)
                error_map = gr.Image(
                    label="error map", show_label=False, type="numpy", format="png", interactive=False
                )
                gr.Markdown(fmt.error_map_note(ERROR_SCALE, "Above"))
                steps_plot = gr.Image(label="Per-step time and residual diff", type="numpy", interactive=False)
    return GenerateTab(
        preset=preset, cache=cache, threshold=threshold, compile=compile_, compare=compare_, button=button,
        compare_button=compare_button, image=image, card=card, json=json, json_file=json_file, batch=batch, last=last,
        base_image=base_image, error_map=error_map, steps_plot=steps_plot,
    )  # fmt: skip


def _compare_tab(names: list[str], pair: tuple[str, str]) -> CompareTab:
    with gr.Tab("A/B compare"):
        with gr.Row():
            preset_a = gr.Dropdown(label="Preset A", choices=names, value=pair[0])
            preset_b = gr.Dropdown(label="Preset B", choices=names, value=pair[1])
            cache, threshold, compile_ = _switches()
            button = gr.Button("Compare", variant="primary")
        flag = gr.HTML()
        with gr.Row():
            slider = gr.ImageSlider(label="A | B", type="numpy", format="png", interactive=False)
            error_map = gr.Image(label="error map", show_label=False, type="numpy", format="png", interactive=False)
            img_a = gr.Image(label="A", type="numpy", format="png", interactive=False)
            img_b = gr.Image(label="B", type="numpy", format="png", interactive=False)
        gr.Markdown(fmt.error_map_note(ERROR_SCALE, "Beside the slider", "B", "A") + " " + fmt.AB_TILE_NOTE)
        table = gr.Dataframe(headers=list(AB_COLUMNS), label="A/B", interactive=False, wrap=True, elem_id="ab-table")
        with gr.Accordion("A and B metrics as JSON (what the API returns)", open=False):
            json = gr.JSON(label="metrics")
    return CompareTab(
        preset_a=preset_a, preset_b=preset_b, cache=cache, threshold=threshold, compile=compile_, button=button,
        flag=flag, slider=slider, error_map=error_map, img_a=img_a, img_b=img_b, table=table, json=json,
    )  # fmt: skip


def _matrix_tab(names: list[str], default: list[str], runs: gr.State) -> MatrixTab:
    with gr.Tab("Matrix"):
        with gr.Row():
            presets = gr.CheckboxGroup(label="Presets", choices=names, value=default)
            with gr.Column():
                repeats = gr.Slider(
                    label="Timed repeats (median; 1 is quick but a single run can be an outlier)",
                    minimum=1,
                    maximum=5,
                    step=1,
                    value=3,
                )
                cache = gr.Radio(label="Cache (all but base)", choices=CACHE_CHOICES, value="unset")
                threshold = gr.Number(
                    label="Cache threshold (all cached but base; 0: each preset's)", value=0, minimum=0
                )
                compile_ = gr.Radio(label="Compile (all but base)", choices=COMPILE_CHOICES, value="unset")
            button = gr.Button("Run matrix", variant="primary")
        table = gr.Dataframe(
            headers=list(COLUMNS),
            label="All presets, one request",
            elem_id="matrix-table",
            interactive=False,
            wrap=True,
        )
        noise = gr.Markdown(elem_id="matrix-noise")
        with gr.Row():
            plot = gr.Image(label="Speed-up vs PSNR", type="numpy", interactive=False)
            with gr.Column():
                pick = gr.Dropdown(label="Per-step chart for", choices=[], value=None)
                steps_plot = gr.Image(label="Per-step time and residual diff", type="numpy", interactive=False)
        with gr.Row():
            csv = gr.File(label="Table (CSV)")
            md = gr.File(label="Table (Markdown)")
        with gr.Accordion("Rows as JSON (what the API returns)", open=False):
            json = gr.JSON(label="rows")
    return MatrixTab(
        presets=presets, repeats=repeats, cache=cache, threshold=threshold, compile=compile_, button=button,
        table=table, noise=noise, plot=plot, pick=pick, steps_plot=steps_plot, csv=csv, md=md, json=json, runs=runs,
    )  # fmt: skip


def _tune_tab(studio: Studio) -> TuneTab:
    prof = studio.device.profile(studio.models[0])
    with gr.Tab("Tune"):
        gr.Markdown(
            "The fastest stack whose **worst** PSNR over the prompts stays at or above the target: cache knobs, "
            "calibrators and step masks searched on this device's best non-cache options, finalists timed side "
            "by side with `cache`. Uses the request settings above (seed, size, steps) with each prompt."
        )
        with gr.Row():
            with gr.Column(scale=1):
                floor = gr.Number(label="Fastest stack at >= N dB (worst prompt)", value=35, minimum=10)
                size = gr.Radio(label="Search", choices=["quick", "full"], value="quick")
                button = gr.Button("Find the fastest stack", variant="primary")
            with gr.Column(scale=2):
                prompts_text = gr.Textbox(
                    label="Prompts (one per line)", lines=5, value="\n".join(prof.example_prompts)
                )
        result = gr.Markdown()
        with gr.Row():
            plot = gr.Image(label="The search's threshold curve", type="numpy", interactive=False)
            with gr.Column():
                yaml = gr.Code(label="Tuned preset", language="yaml", interactive=False)
                name = gr.Textbox(label="Save as preset named")
                save = gr.Button("Save as preset")
                msg = gr.Markdown()
        with gr.Accordion("Result as JSON (what the API returns)", open=False):
            json = gr.JSON(label="tuned")
    return TuneTab(
        floor=floor, size=size, button=button, prompts_text=prompts_text, result=result, plot=plot, yaml=yaml,
        name=name, save=save, msg=msg, json=json,
    )  # fmt: skip


def _presets_tab(studio: Studio, names: list[str], default_preset: str) -> PresetsTab:
    with gr.Tab("Presets"):
        with gr.Row():
            with gr.Column():
                name = gr.Dropdown(label="Preset", choices=names, value=default_preset)
                desc = gr.Markdown()
                yaml = gr.Code(label="YAML", language="yaml", interactive=False)
                with gr.Row():
                    yaml_file = gr.DownloadButton("Download YAML", value=None, size="sm")
                    export = gr.Button("Export for cache-dit (load_configs)", size="sm")
                export_file = gr.File(label="cache-dit config (YAML)")
            with gr.Column():
                new_name = gr.Textbox(label="New preset name")
                new_yaml = gr.Code(
                    label="New preset YAML (paste or upload)",
                    language="yaml",
                    interactive=True,
                    value=studio.library().text("cache"),
                )
                upload = gr.File(label="Upload a .yaml preset", file_types=[".yaml", ".yml"], type="filepath")
                save = gr.Button("Validate and save", variant="primary")
                msg = gr.Markdown()
    return PresetsTab(
        name=name,
        desc=desc,
        yaml=yaml,
        yaml_file=yaml_file,
        export=export,
        export_file=export_file,
        new_name=new_name,
        new_yaml=new_yaml,
        upload=upload,
        save=save,
        msg=msg,
    )


def _history_tab(rows: gr.State) -> HistoryTab:
    with gr.Tab("History"):
        gallery = gr.Gallery(
            label="Pictures this session (newest first; the caption names the table's row)",
            columns=8, height=240, object_fit="contain", preview=False, elem_id="history-gallery", format="png",
        )  # fmt: skip
        table = gr.Dataframe(
            headers=HISTORY_COLUMNS, label="Runs this session", interactive=False, elem_id="history-table", wrap=True
        )
        export = gr.Button("Export CSV")
        file = gr.File(label="History (CSV)")
    return HistoryTab(rows=rows, table=table, gallery=gallery, export=export, file=file)


def _wire(ui: UI, h: Handlers, demo) -> None:
    r, gen, ab, mx, tn, pv, hist = ui.request, ui.gen, ui.ab, ui.mx, ui.tn, ui.pv, ui.hist
    private = {"api_visibility": "private"}
    device = {"concurrency_id": "device"}
    hist_in, hist_out = {"history": hist.rows}, [hist.table, hist.rows]
    more = [hist.gallery]  # outputs added later go here, before the JSON (last): the API's places stay as they were
    r.dice.click(lambda: random.randint(0, 2**31 - 1), None, r.seed, **private)
    r.examples.change(lambda e, p: e or p, [r.examples, r.prompt], r.prompt, **private)
    model_out = [r.examples, r.model_notes, r.steps, r.width, r.height, r.guidance, r.true_cfg_scale, r.aspect]
    model_out.append(r.lora_pick)  # the LoRAs the model ships
    r.aspect.change(h.on_aspect, [r.aspect, r.model], [r.width, r.height], **private)
    r.model.change(h.on_model, r.model, model_out, **private)
    r.lora_pick.change(h.on_lora_pick, [r.lora_pick, r.loras], r.loras, **private)
    # The inputs by name (app.forms): the names are the API's parameter names and the handler's form fields.
    # A new output goes just before the metrics (always last), so the outputs' places in the API stay as they were.
    # One event for the button and Enter in the prompt box: one endpoint, /generate.
    gen_out = [gen.image, gen.card, gen.base_image, gen.steps_plot] + hist_out + [gen.error_map, gen.json_file]
    gen_out += more + [gen.batch, gen.last, gen.json]
    r.use_last.click(lambda last: last, gen.last, r.image, **private)
    gen_in = forms.inputs(forms.GenerateForm, r, gen) | hist_in
    gr.on(
        [gen.button.click, r.prompt.submit], _gpu(h.generate, h.durations.generate), inputs_kwargs=gen_in,
        outputs=gen_out, api_name="generate", **device,
    )  # fmt: skip
    # the same request compared `on` (API callers pass compare="on" to /generate)
    gen.compare_button.click(
        _gpu(h.generate_compared, h.durations.generate), inputs_kwargs=gen_in, outputs=gen_out, **private, **device
    )
    ab.button.click(
        _gpu(h.compare, h.durations.compare),
        inputs_kwargs=forms.inputs(forms.CompareForm, r, ab) | hist_in,
        outputs=[ab.slider, ab.img_a, ab.img_b, ab.table, ab.flag] + hist_out + [ab.error_map] + more + [ab.json],
        api_name="compare",
        **device,
    )
    mx.button.click(
        _gpu(h.matrix, h.durations.matrix),
        inputs_kwargs=forms.inputs(forms.MatrixForm, r, mx) | hist_in,
        outputs=[mx.table, mx.plot, mx.pick, mx.steps_plot, mx.csv, mx.md, mx.runs, mx.noise]
        + hist_out
        + more
        + [mx.json],
        api_name="matrix",
        **device,
    )
    mx.pick.change(h.pick_steps, [mx.pick, mx.runs], mx.steps_plot, **private)
    tn.button.click(
        _gpu(h.tune, h.durations.tune),
        inputs_kwargs=forms.inputs(forms.TuneForm, r, tn),
        outputs=[tn.result, tn.plot, tn.yaml, tn.name, tn.json],
        api_name="tune",
        **device,
    )
    preset_out = [pv.desc, pv.yaml, pv.yaml_file]
    pv.name.change(h.show_preset, pv.name, preset_out, **private)
    demo.load(h.show_preset, pv.name, preset_out, **private)
    pv.export.click(h.export_preset, [pv.name, r.steps], pv.export_file, **private, **device)
    pv.upload.upload(h.load_upload, pv.upload, [pv.new_yaml, pv.new_name], **private)
    pv.save.click(h.save_preset, [pv.new_name, pv.new_yaml], [pv.msg] + ui.preset_lists(), **private)
    tn.save.click(h.save_tuned, [tn.name, tn.yaml], [tn.msg] + ui.preset_lists(), **private)
    hist.export.click(h.export_history, hist.rows, hist.file, **private)


def build_app(
    device=None,
    *,
    models: list[str] | None = None,
    default_preset: str | None = None,
    compare_presets: tuple[str, str] = (BASE, "cache-int8-sage"),
    public: bool = False,
    compare: str = "on",
    limits: PublicLimits | None = None,
    time_limit_s: float | None = None,
    queue_size: int = 32,
) -> gr.Blocks:
    """The studio over `device` (a studio.worker.Device: app.py passes the worker's client; a Runner, as tests pass,
    runs in this process; None: a Runner on the embedded model, in this process).

    Args:
        public: each visitor's saved presets stay in their own session (a public Space), and the public limits
            (`limits`, app.limits: compile only from the operator's presets, bounded shapes, Matrix size, rate)
            are checked before any device work, and a request stops once it has run `limits.request_s` seconds.
        time_limit_s: the seconds a request may run on the device (public: `limits.request_s` unless given;
            otherwise none unless given; app.py: STUDIO_MAX_REQUEST_S).
        compare: the Generate tab's default compare mode (on / auto / off; app.py: STUDIO_COMPARE, `auto` on a
            public studio): `auto` costs about one image a click once a shape's base timing is kept.
    """
    compare = compare_mode(compare)
    if not isinstance(device, Device):
        from studio.engine import Runner
        from studio.worker.service import InProcess

        device = InProcess(device or Runner())
    # User presets need somewhere to live; the device's library is not changed (the engine stays as it was given).
    presets = device.presets
    if presets.user_dir is None:
        presets = presets.with_user_dir(Path(tempfile.gettempdir()) / "dit-speed-studio-presets")
    guard = PublicGuard(limits or PublicLimits()) if public else None
    if time_limit_s is None and guard is not None:
        time_limit_s = guard.limits.request_s
    studio = Studio(device, models or [device.model], presets, public=public, guard=guard, time_limit_s=time_limit_s)
    names = studio.library().names()
    default_preset = default_preset if default_preset in names else ("cache" if "cache" in names else BASE)
    with gr.Blocks(title="DiT Speed Studio") as demo:
        gr.Markdown(
            "# DiT Speed Studio\nPick a speed/quality preset, generate, and see what it bought (denoise time, "
            "cached steps, speed-up) and what it cost (PSNR/SSIM against the `base` image of the same request)."
        )
        history, matrix_runs = gr.State(History()), gr.State({})
        request = request_panel(studio)
        with gr.Tabs():
            ui = UI(
                request=request,
                gen=_generate_tab(names, default_preset, compare),
                ab=_compare_tab(names, compare_presets),
                mx=_matrix_tab(names, studio.library().one_process_names(), matrix_runs),
                tn=_tune_tab(studio),
                pv=_presets_tab(studio, names, default_preset),
                hist=_history_tab(history),
            )
        _wire(ui, Handlers(studio, ui), demo)
    # One generation at a time on the device; the rest wait with their queue position shown.
    demo.queue(default_concurrency_limit=1, max_size=queue_size)
    return demo
