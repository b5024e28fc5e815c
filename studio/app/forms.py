"""The UI held by name: what each endpoint takes (a form record) and the components of each tab (a tab record). A
form's fields are the endpoint's API parameters in order; the wiring and the handler find components and values by
those names, so the list is written once, here."""

from __future__ import annotations

from dataclasses import dataclass, fields

import gradio as gr


# ------------------------------------------------------------------------------------------- forms (values)
@dataclass(frozen=True, kw_only=True)
class RequestForm:
    """The request fields every device endpoint starts with."""

    prompt: str | None
    model: str | None
    seed: float | None
    steps: float
    width: float
    height: float
    guidance: float | None = None
    negative_prompt: str | None = None  # read where true CFG runs (or where the pipeline takes one without it)
    true_cfg_scale: float | None = None  # 1 (or 0, empty): no true CFG; > 1: two transformer calls per step
    num_images_per_prompt: float = 1  # a batch of 1-4 pictures in one call (seeds seed .. seed + n - 1)
    image: object | None = None  # an input picture (numpy HxWx3): img2img; with `mask_image`: inpaint
    mask_image: object | None = None  # white: repaint there, black: keep
    strength: float = 1.0  # how much of the schedule runs on the input picture (read with one)
    loras: str | None = None  # LoRA adapters, one per line: a file, folder, Hub id or shipped name, then @scale


@dataclass(frozen=True, kw_only=True)
class GenerateForm(RequestForm):
    """/generate. cache, compile: "true", "false" or "unset" (follow the preset); threshold: empty or 0 follows it."""

    preset: str
    cache: str = "unset"
    threshold: float | None = None
    compile: str = "unset"
    compare: str = "on"  # on / auto / off: how the run is compared with base (spec.request.COMPARE_MODES)


@dataclass(frozen=True, kw_only=True)
class CompareForm(RequestForm):
    """/compare: both presets get the same per-request switches."""

    preset_a: str
    preset_b: str
    cache: str = "unset"
    threshold: float | None = None
    compile: str = "unset"


@dataclass(frozen=True, kw_only=True)
class MatrixForm(RequestForm):
    """/matrix: the switches apply to every preset but base (the threshold to those whose cache runs)."""

    presets: list[str]
    repeats: float = 1
    cache: str = "unset"
    threshold: float | None = None
    compile: str = "unset"
    prompts_text: str | None = None  # more prompts, one per line: every preset over each, paired per prompt


@dataclass(frozen=True, kw_only=True)
class TuneForm(RequestForm):
    """/tune: no switches (the tuner chooses the stack)."""

    floor: float
    prompts_text: str | None = None
    size: str = "quick"
    max_flip: float | None = None  # FLIP's ceiling for the worst prompt (0 or empty: PSNR alone)


REQUEST_FIELDS = tuple(f.name for f in fields(RequestForm))


def names(form: type) -> tuple[str, ...]:
    """An endpoint's parameter names, in the API's order."""
    return tuple(f.name for f in fields(form))


def inputs(form: type, request: RequestPanel, tab) -> dict[str, gr.components.Component]:
    """An endpoint's input components by parameter name (gradio's `inputs_kwargs`), from the request panel or `tab`."""
    return {n: getattr(request if n in REQUEST_FIELDS else tab, n) for n in names(form)}


# ----------------------------------------------------------------------------------- tab records (components)
@dataclass
class RequestPanel:
    """The request form above the tabs."""

    prompt: gr.Textbox
    examples: gr.Dropdown
    model: gr.Dropdown
    model_notes: gr.Markdown
    seed: gr.Number
    dice: gr.Button
    steps: gr.Slider
    width: gr.Number
    height: gr.Number
    guidance: gr.Number
    negative_prompt: gr.Textbox
    true_cfg_scale: gr.Number
    num_images_per_prompt: gr.Slider
    image: gr.Image
    mask_image: gr.Image
    strength: gr.Slider
    use_last: gr.Button  # the last picture made (at its own size) as the input picture
    aspect: gr.Dropdown  # sets width and height to one of the profile's aspect sizes
    loras: gr.Textbox
    lora_pick: gr.Dropdown  # the LoRAs shipped with the model, by name: one picked is added to `loras` at scale 1


@dataclass
class GenerateTab:
    preset: gr.Dropdown
    cache: gr.Radio
    threshold: gr.Number
    compile: gr.Radio
    compare: gr.Radio
    button: gr.Button
    compare_button: gr.Button  # the same request with compare `on`: its base picture, PSNR and error map
    room: gr.Markdown  # before the click: what the step cache can skip in this request (app.room)
    image: gr.Image
    card: gr.HTML
    json: gr.JSON
    json_file: gr.DownloadButton  # the metrics as a .json file
    batch: gr.Gallery  # a batch's pictures, each captioned with its seed and its PSNR against its base picture
    last: gr.State  # the last picture at its own size (for "use as input")
    base_image: gr.Image
    error_map: gr.Image  # |image - base|, amplified (measure.quality.ERROR_SCALE), or FLIP's map (map_kind)
    map_kind: gr.Radio  # which map (app.maps.MAP_KINDS)
    map_note: gr.Markdown  # the map's caption
    compared: gr.State  # app.maps.Compared: the pair at its own size, for a map picked after the run
    steps_plot: gr.Image


@dataclass
class CompareTab:
    preset_a: gr.Dropdown
    preset_b: gr.Dropdown
    cache: gr.Radio
    threshold: gr.Number
    compile: gr.Radio
    button: gr.Button
    flag: gr.HTML
    slider: gr.ImageSlider
    error_map: gr.Image  # |B - A|, amplified, or FLIP's map of B against A (map_kind)
    map_kind: gr.Radio
    map_note: gr.Markdown
    compared: gr.State  # app.maps.Compared of B against A
    img_a: gr.Image
    img_b: gr.Image
    table: gr.Dataframe
    json: gr.JSON


@dataclass
class MatrixTab:
    presets: gr.CheckboxGroup
    repeats: gr.Slider
    cache: gr.Radio
    threshold: gr.Number
    compile: gr.Radio
    prompts_text: gr.Textbox
    button: gr.Button
    table: gr.Dataframe
    noise: gr.Markdown
    plot: gr.Image
    pick: gr.Dropdown
    steps_plot: gr.Image
    csv: gr.File
    md: gr.File
    json: gr.JSON
    runs: gr.State  # each run's metrics, for the per-step chart picked after the run
    all_methods: gr.Button  # picks base, cache and every step-cache method's preset (one repeat: the public limit)


@dataclass
class TuneTab:
    floor: gr.Number
    max_flip: gr.Number  # FLIP's ceiling (TuneForm.max_flip)
    size: gr.Radio
    button: gr.Button
    prompts_text: gr.Textbox
    result: gr.Markdown
    plot: gr.Image
    yaml: gr.Code
    name: gr.Textbox
    save: gr.Button
    msg: gr.Markdown
    json: gr.JSON


@dataclass
class PresetsTab:
    name: gr.Dropdown
    desc: gr.Markdown
    yaml: gr.Code
    yaml_file: gr.DownloadButton  # the preset's YAML
    export: gr.Button  # make its cache-dit export (cache_dit.load_configs reads it), on the device
    export_file: gr.File
    plan_on: gr.Dropdown  # the device profile to plan for: here, or a named one (spec.devices.PROFILES)
    plan: gr.Code  # what the preset would run there for the request's model, and its memory plan (engine.plan)
    new_name: gr.Textbox
    new_yaml: gr.Code
    upload: gr.File
    save: gr.Button
    msg: gr.Markdown


@dataclass
class HistoryTab:
    rows: gr.State  # the session's runs (app.history.History), added to by every device endpoint
    saved: gr.BrowserState  # the rows kept in the browser: a reload restores them (app.history.restored)
    clear: gr.Button
    table: gr.Dataframe
    gallery: gr.Gallery  # the runs' thumbnails, newest first
    export: gr.Button
    file: gr.File


@dataclass
class ApiOnly:
    """/images and /headroom: endpoints for programs with no place on the page (the Generate form's parameters in,
    each picture at its own size and its numbers out)."""

    button: gr.Button  # never shown: the endpoint's trigger
    picture: gr.Image  # the run's picture, a batch's stacked top to bottom (what an MCP client receives as an image)
    pictures: gr.Gallery  # each picture apart
    numbers: gr.JSON
    room_button: gr.Button  # never shown: /headroom's trigger (app.room)
    room: gr.JSON  # what the Generate request's step cache can skip, before the run


@dataclass
class UI:
    request: RequestPanel
    gen: GenerateTab
    ab: CompareTab
    mx: MatrixTab
    tn: TuneTab
    pv: PresetsTab
    hist: HistoryTab
    api: ApiOnly

    def preset_lists(self) -> list:
        """Every component that offers the preset names (updated when a preset is saved)."""
        return [self.gen.preset, self.ab.preset_a, self.ab.preset_b, self.mx.presets, self.pv.name]
