"""The Gradio studio: the tabs laid out (app.tabs), then their events wired to the handlers as the named API endpoints
(/generate, /images, /compare, /matrix, /tune, /headroom; their parameters are app.forms' fields)."""

from __future__ import annotations

import functools
import random
import tempfile
from pathlib import Path

import gradio as gr

from studio.app import forms, tabs
from studio.app.forms import UI
from studio.app.handlers import Handlers, Studio
from studio.app.history import History
from studio.app.keep import FileKeeper
from studio.app.limits import PublicGuard, PublicLimits
from studio.app.maps import AB_MAP_WHERE, GEN_MAP_WHERE, show_map
from studio.app.openai_api import ImagesEndpoint
from studio.app.panel import request_panel
from studio.app.pictures import PictureFiles
from studio.app.room import BeforeRun
from studio.app.zerogpu import components, device_event
from studio.report import fmt
from studio.report.card import CSS
from studio.report.tools import tool_descriptions
from studio.spec.presets import BASE
from studio.spec.request import compare_mode
from studio.spec.settings import current
from studio.worker.protocol import Device

__all__ = ["CSS", "build_app"]


def _shown_if_any(pictures):
    """Hide a panel with nothing to show (the batch gallery after a one-picture run)."""
    return gr.update(visible=bool(pictures))


def _wire(ui: UI, h: Handlers, demo, described: dict) -> None:
    r, gen, ab, mx, tn, hist = ui.request, ui.gen, ui.ab, ui.mx, ui.tn, ui.hist
    pics = PictureFiles(h.studio.pictures_dir, h.studio.keeper)  # every picture leaves as a file (app.pictures)
    _gpu = functools.partial(
        device_event, device=h.studio.device, by_id=components(ui), pictures=pics, size=current().zerogpu_size
    )
    private = {"api_visibility": "private"}
    device = {"concurrency_id": "device"}
    hist_in, hist_out = {"history": hist.rows}, [hist.table, hist.rows]
    keep = h.keep_history  # after each device event: its rows into the browser's storage (not an API output)
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
    gen_out += more + [gen.batch, gen.last, gen.compared, gen.json]
    r.use_last.click(pics.served(lambda last: last, [r.image]), gen.last, r.image, **private)
    gen_in = forms.inputs(forms.GenerateForm, r, gen) | hist_in
    generated = gr.on(
        [gen.button.click, r.prompt.submit],
        _gpu(h.generate, h.durations.generate, h.admit, h.asks.generate),
        inputs_kwargs=gen_in,
        outputs=gen_out,
        api_name="generate",
        api_description=described["generate"],
        **device,
    ).then(keep, hist.rows, hist.saved, **private)
    # for programs: the pictures at their own size and their numbers (the OpenAI endpoint and MCP call it)
    ui.api.button.click(
        _gpu(h.images, h.durations.generate, h.admit, h.asks.generate),
        inputs_kwargs=gen_in,
        outputs=[ui.api.picture, ui.api.pictures, ui.api.numbers],
        api_name="images",
        api_description=described["images"],
        **device,
    )
    # the same request compared `on` (API callers pass compare="on" to /generate)
    compared = gen.compare_button.click(
        _gpu(h.generate_compared, h.durations.generate, h.admit, h.asks.generate_on),
        inputs_kwargs=gen_in,
        outputs=gen_out,
        **private,
        **device,
    ).then(keep, hist.rows, hist.saved, **private)
    ab_done = ab.button.click(
        _gpu(h.compare, h.durations.compare, h.admit, h.asks.compare),
        inputs_kwargs=forms.inputs(forms.CompareForm, r, ab) | hist_in,
        outputs=[ab.slider, ab.img_a, ab.img_b, ab.table, ab.flag]
        + hist_out
        + [ab.error_map]
        + more
        + [ab.compared, ab.json],
        api_name="compare",
        api_description=described["compare"],
        **device,
    ).then(keep, hist.rows, hist.saved, **private)
    mx.button.click(
        _gpu(h.matrix, h.durations.matrix, h.admit, h.asks.matrix),
        inputs_kwargs=forms.inputs(forms.MatrixForm, r, mx) | hist_in,
        outputs=[mx.table, mx.plot, mx.pick, mx.steps_plot, mx.csv, mx.md, mx.runs, mx.noise]
        + hist_out
        + more
        + [mx.json],
        api_name="matrix",
        api_description=described["matrix"],
        **device,
    ).then(keep, hist.rows, hist.saved, **private)
    mx.pick.change(pics.served(h.pick_steps), [mx.pick, mx.runs], mx.steps_plot, **private)
    mx.all_methods.click(h.all_methods, None, [mx.presets, mx.repeats], **private)
    tn.button.click(
        _gpu(h.tune, h.durations.tune, h.admit, h.asks.tune),
        inputs_kwargs=forms.inputs(forms.TuneForm, r, tn),
        outputs=[tn.result, tn.plot, tn.yaml, tn.name, tn.json],
        api_name="tune",
        api_description=described["tune"],
        **device,
    )
    _wire_keeping(ui, h, demo)
    _wire_maps(ui, pics, [generated, compared], [ab_done])
    for event in (generated, compared):  # a one-picture run: no empty gallery (a panel with nothing is hidden)
        event.then(_shown_if_any, gen.batch, gen.batch, **private)
    _wire_room(ui, h, demo, described)


def _wire_room(ui: UI, h: Handlers, demo, described: dict) -> None:
    """app.room: the step cache's room under the preset picker as the form changes, and /headroom for programs."""
    r, gen, before = ui.request, ui.gen, BeforeRun(h.studio, h.asks)
    room_in = forms.inputs(forms.GenerateForm, r, gen)
    changed = [gen.preset.change, gen.cache.change, r.steps.change, r.model.change, r.strength.change]
    changed += [r.image.change, demo.load]
    gr.on(
        changed,
        before.note,
        inputs_kwargs=room_in,
        outputs=gen.room,
        trigger_mode="always_last",
        api_visibility="private",
    )
    ui.api.room_button.click(
        before.headroom,  # (its name is the MCP tool's)
        inputs_kwargs=room_in,
        outputs=ui.api.room,
        api_name="headroom",
        api_description=described["headroom"],
    )


def _wire_keeping(ui: UI, h: Handlers, demo) -> None:
    """The events that keep things: presets shown, exported, uploaded and saved; the history exported and cleared."""
    r, tn, pv, hist = ui.request, ui.tn, ui.pv, ui.hist
    private = {"api_visibility": "private"}
    preset_out = [pv.desc, pv.yaml, pv.yaml_file]
    pv.name.change(h.show_preset, pv.name, preset_out, **private)
    demo.load(h.show_preset, pv.name, preset_out, **private)
    for ev in (pv.name.change, pv.plan_on.change, r.model.change):
        ev(h.show_plan, [pv.name, pv.plan_on, r.model], pv.plan, **private, concurrency_id="device")
    pv.export.click(h.export_preset, [pv.name, r.steps], pv.export_file, **private, concurrency_id="device")
    pv.upload.upload(h.load_upload, pv.upload, [pv.new_yaml, pv.new_name], **private)
    pv.save.click(h.save_preset, [pv.new_name, pv.new_yaml], [pv.msg] + ui.preset_lists(), **private)
    tn.save.click(h.save_tuned, [tn.name, tn.yaml], [tn.msg] + ui.preset_lists(), **private)
    hist.export.click(h.export_history, hist.rows, hist.file, **private)
    demo.load(h.restore_history, hist.saved, [hist.table, hist.rows], **private)
    hist.clear.click(h.clear_history, None, [hist.table, hist.rows, hist.gallery, hist.saved], **private)


def _wire_maps(ui: UI, pics, gen_events: list, ab_events: list) -> None:
    """The picked error map (app.maps), drawn after each run and on a new pick, in this process after the device event
    (FLIP's map costs ~2 s a megapixel: never inside a GPU call)."""
    for tab, events, where, also in (
        (ui.gen, gen_events, GEN_MAP_WHERE, ""),
        (ui.ab, ab_events, AB_MAP_WHERE, fmt.AB_TILE_NOTE),
    ):
        outputs = [tab.error_map, tab.map_note]
        draw = pics.served(functools.partial(show_map, where=where, also=also), outputs)
        args = ([tab.map_kind, tab.compared], outputs)
        tab.map_kind.change(draw, *args, api_visibility="private")
        for event in events:
            event.then(draw, *args, api_visibility="private")


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
    """The studio over `device` (a studio.worker.Device; a Runner, or None for one on the embedded model, runs in this
    process). `public`: per-session presets and the public `limits` before any device work; `time_limit_s`: a
    request's device seconds (public: `limits.request_s` unless given); `compare`: the Generate tab's default mode."""
    compare = compare_mode(compare)
    if not isinstance(device, Device):
        from studio.engine import ModelManager, Runner  # (torch: only where no device was given, as in tests)
        from studio.worker.service import InProcess

        device = InProcess(device or Runner(ModelManager(settings=current())))
    # User presets need somewhere to live; the device's library is not changed (the engine stays as it was given).
    presets = device.presets
    if presets.user_dir is None:
        presets = presets.with_user_dir(Path(tempfile.gettempdir()) / "dit-speed-studio-presets")
    s = current()
    guard = PublicGuard(limits or PublicLimits.from_settings(s), s.proxy_hops, s.ipv6_prefix) if public else None
    if time_limit_s is None and guard is not None:
        time_limit_s = guard.limits.request_s
    studio = Studio(device, models or [device.model], presets, public=public, guard=guard, time_limit_s=time_limit_s)
    names = studio.library().names()
    default_preset = default_preset if default_preset in names else ("cache" if "cache" in names else BASE)
    age = current().cache_age_s  # gradio's cached files (pictures, uploads) older than this go, checked this often
    with gr.Blocks(title="DiT Speed Studio", delete_cache=(min(600, age), age) if age else None) as demo:
        if public:  # gradio's cache (uploads, results) in total size too, not only in age: its oldest files go first
            studio.cache_keeper = FileKeeper([Path(demo.GRADIO_CACHE)], current().max_cache_mb)
        gr.Markdown(
            "# DiT Speed Studio\nPick a speed/quality preset, generate, and see what it bought (denoise time, "
            "cached steps, speed-up) and what it cost (PSNR/SSIM against the `base` image of the same request)."
        )
        history, matrix_runs = gr.State(History()), gr.State({})
        saved = gr.BrowserState([], storage_key="dit-speed-studio-history")  # the history's rows, in the browser
        request = request_panel(studio)
        with gr.Tabs():
            gen = tabs.generate_tab(names, default_preset, compare)
            ab = tabs.compare_tab(names, compare_presets)
            mx = tabs.matrix_tab(names, studio.library().one_process_names(), matrix_runs)
            tn, pv, hist = (
                tabs.tune_tab(studio),
                tabs.presets_tab(studio, names, default_preset),
                tabs.history_tab(history, saved),
            )
        # (what is not a tab stays outside the tabs: a hidden block or a BrowserState inside them draws a tab)
        ui = UI(request=request, gen=gen, ab=ab, mx=mx, tn=tn, pv=pv, hist=hist, api=tabs.api_only())
        offered = [(n, studio.library().get(n).description) for n in names]
        _wire(ui, Handlers(studio, ui), demo, tool_descriptions(offered, studio.models))
    # the OpenAI images API beside it (app.serve mounts its routes on the same server)
    demo.studio_api = ImagesEndpoint(studio, default_preset, compare, current().api_key)
    # One generation at a time on the device; the rest wait with their queue position shown.
    # Public: every call goes through the queue (gradio leaves `api_open` on off a Space, and /gradio_api/run/<api>
    # would run a handler past the queue's concurrency, its size and the waiting cap).
    demo.queue(default_concurrency_limit=1, max_size=queue_size, api_open=not public)
    return demo
