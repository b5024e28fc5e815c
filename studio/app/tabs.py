"""The studio's tabs: a layout function per tab, returning its record of components (app.forms)."""

from __future__ import annotations

import gradio as gr

from studio.app.forms import ApiOnly, CompareTab, GenerateTab, HistoryTab, MatrixTab, PresetsTab, TuneTab
from studio.app.handlers import CACHE_CHOICES, COMPILE_CHOICES, Studio
from studio.app.history import HISTORY_COLUMNS
from studio.app.maps import AB_MAP_WHERE, DIFFERENCE, GEN_MAP_WHERE, MAP_INFO, MAP_KINDS, show_map
from studio.report import fmt
from studio.report.table import AB_COLUMNS, COLUMNS
from studio.spec.devices import PROFILES
from studio.spec.request import COMPARE_MODES, MAX_BATCH


def switches() -> tuple[gr.Radio, gr.Number, gr.Radio]:
    """The per-request cache switch, threshold and compile switch."""
    return (
        gr.Radio(label="Cache (this request)", choices=CACHE_CHOICES, value="unset"),
        gr.Number(label="Cache threshold (0: the preset's)", value=0, minimum=0),
        gr.Radio(label="Compile (this request)", choices=COMPILE_CHOICES, value="unset"),
    )


def generate_tab(names: list[str], default_preset: str, compare: str) -> GenerateTab:
    with gr.Tab("Generate"):
        with gr.Row():
            with gr.Column(scale=1):
                preset = gr.Dropdown(label="Preset", choices=names, value=default_preset)
                cache, threshold, compile_ = switches()
                compare_ = gr.Radio(
                    label="Compare with base", choices=list(COMPARE_MODES), value=compare, info=fmt.COMPARE_INFO
                )
                room = gr.Markdown("", elem_id="gen-room")
                button = gr.Button("Generate", variant="primary")
                compare_button = gr.Button("Compare with base", variant="secondary")
            with gr.Column(scale=2):
                image = gr.Image(label="Image", type="numpy", format="png", interactive=False)
                last = gr.State(None)
                batch = gr.Gallery(
                    label="The batch, picture by picture (seed: PSNR against its own base picture)",
                    columns=MAX_BATCH,
                    height=200,
                    object_fit="contain",
                    preview=False,
                    format="png",
                    elem_id="batch-gallery",
                    visible=False,  # shown after a run of a batch (ui._shown_if_any)
                )
                card = gr.HTML(label="Metrics")
                with gr.Accordion("Metrics as JSON (what the API returns)", open=False):
                    json = gr.JSON(label="metrics")
                json_file = gr.DownloadButton("Download metrics (JSON)", value=None, size="sm")
            with gr.Column(scale=2):
                base_image = gr.Image(label="base image (same request)", type="numpy", format="png", interactive=False)
                error_map = gr.Image(
                    label="error map",
                    show_label=False,
                    type="numpy",
                    format="png",
                    interactive=False,
                    elem_id="gen-error-map",
                )
                map_kind = gr.Radio(
                    label="Error map", choices=list(MAP_KINDS), value=DIFFERENCE, info=MAP_INFO, elem_id="gen-map-kind"
                )
                map_note = gr.Markdown(show_map(DIFFERENCE, None, GEN_MAP_WHERE)[1], elem_id="gen-map-note")
                compared = gr.State(None)  # the pair at its own size, for the map picked after the run
                steps_plot = gr.Image(label="Per-step time and residual diff", type="numpy", interactive=False)
    return GenerateTab(
        preset=preset,
        cache=cache,
        threshold=threshold,
        compile=compile_,
        compare=compare_,
        button=button,
        compare_button=compare_button,
        room=room,
        image=image,
        card=card,
        json=json,
        json_file=json_file,
        batch=batch,
        last=last,
        base_image=base_image,
        error_map=error_map,
        map_kind=map_kind,
        map_note=map_note,
        compared=compared,
        steps_plot=steps_plot,
    )


def compare_tab(names: list[str], pair: tuple[str, str]) -> CompareTab:
    with gr.Tab("A/B compare"):
        with gr.Row():
            preset_a = gr.Dropdown(label="Preset A", choices=names, value=pair[0])
            preset_b = gr.Dropdown(label="Preset B", choices=names, value=pair[1])
            cache, threshold, compile_ = switches()
            button = gr.Button("Compare", variant="primary")
        flag = gr.HTML()
        with gr.Row():
            slider = gr.ImageSlider(label="A | B", type="numpy", format="png", interactive=False)
            error_map = gr.Image(label="error map", show_label=False, type="numpy", format="png", interactive=False)
            img_a = gr.Image(label="A", type="numpy", format="png", interactive=False)
            img_b = gr.Image(label="B", type="numpy", format="png", interactive=False)
        with gr.Row():
            map_kind = gr.Radio(label="Error map", choices=list(MAP_KINDS), value=DIFFERENCE, info=MAP_INFO)
            map_note = gr.Markdown(show_map(DIFFERENCE, None, AB_MAP_WHERE, fmt.AB_TILE_NOTE)[1])
        compared = gr.State(None)
        table = gr.Dataframe(headers=list(AB_COLUMNS), label="A/B", interactive=False, wrap=True, elem_id="ab-table")
        with gr.Accordion("A and B metrics as JSON (what the API returns)", open=False):
            json = gr.JSON(label="metrics")
    return CompareTab(
        preset_a=preset_a,
        preset_b=preset_b,
        cache=cache,
        threshold=threshold,
        compile=compile_,
        button=button,
        flag=flag,
        slider=slider,
        error_map=error_map,
        map_kind=map_kind,
        map_note=map_note,
        compared=compared,
        img_a=img_a,
        img_b=img_b,
        table=table,
        json=json,
    )


def matrix_tab(names: list[str], default: list[str], runs: gr.State) -> MatrixTab:
    with gr.Tab("Matrix"):
        with gr.Row():
            with gr.Column():
                presets = gr.CheckboxGroup(label="Presets", choices=names, value=default)
                all_methods = gr.Button(
                    "All step caches: base, cache and every method (its searched best where one is saved), one repeat",
                    size="sm",
                    elem_id="matrix-all-methods",
                )
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
        prompts_text = gr.Textbox(
            label="More prompts (one per line; optional): every preset over each, the plot one point per prompt",
            lines=2,
            value="",
        )
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
        presets=presets,
        repeats=repeats,
        cache=cache,
        threshold=threshold,
        compile=compile_,
        prompts_text=prompts_text,
        button=button,
        table=table,
        noise=noise,
        plot=plot,
        pick=pick,
        steps_plot=steps_plot,
        csv=csv,
        md=md,
        json=json,
        runs=runs,
        all_methods=all_methods,
    )


def tune_tab(studio: Studio) -> TuneTab:
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
                max_flip = gr.Number(
                    label="... and FLIP at most (worst prompt; 0: PSNR alone)",
                    value=0,
                    minimum=0,
                    maximum=1,
                    step=0.01,
                    info="FLIP's mean error against base: 0 is no visible difference, black against white 0.97",
                )
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
        floor=floor,
        max_flip=max_flip,
        size=size,
        button=button,
        prompts_text=prompts_text,
        result=result,
        plot=plot,
        yaml=yaml,
        name=name,
        save=save,
        msg=msg,
        json=json,
    )


def presets_tab(studio: Studio, names: list[str], default_preset: str) -> PresetsTab:
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
                plan_on = gr.Dropdown(
                    label="What it would run on",
                    choices=["here", *PROFILES],
                    value="here",
                    info="this machine, or a named device profile: for the model in the request form",
                )
                plan = gr.Code(label="Plan (python -m studio plan)", language=None, interactive=False)
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
        plan_on=plan_on,
        plan=plan,
        new_name=new_name,
        new_yaml=new_yaml,
        upload=upload,
        save=save,
        msg=msg,
    )


def history_tab(rows: gr.State, saved: gr.BrowserState) -> HistoryTab:
    with gr.Tab("History"):
        gallery = gr.Gallery(
            label="Pictures this session (newest first; the caption names the table's row)",
            columns=8,
            height=240,
            object_fit="contain",
            preview=False,
            elem_id="history-gallery",
            format="png",
        )
        table = gr.Dataframe(
            headers=HISTORY_COLUMNS, label="Runs this session", interactive=False, elem_id="history-table", wrap=True
        )
        gr.Markdown(
            "The table is kept in this browser (a reload finds it; no other visitor sees it); the pictures last the "
            "visit."
        )
        with gr.Row():
            export = gr.Button("Export CSV")
            clear = gr.Button("Clear history", elem_id="history-clear")
        file = gr.File(label="History (CSV)")
    return HistoryTab(rows=rows, saved=saved, clear=clear, table=table, gallery=gallery, export=export, file=file)


def api_only() -> ApiOnly:
    """The program-only endpoints' components, never shown."""
    with gr.Column(visible=False):
        button = gr.Button("images")
        picture = gr.Image(label="picture", format="png")
        pictures = gr.Gallery(label="pictures", format="png")
        numbers = gr.JSON(label="numbers")
        room_button = gr.Button("headroom")
        room = gr.JSON(label="headroom")
    return ApiOnly(
        button=button, picture=picture, pictures=pictures, numbers=numbers, room_button=room_button, room=room
    )
