"""Admission: a device event's form read into a request and a public studio's limits checked, in the app's main
process, before the event's handler takes the device.

On ZeroGPU the handler runs under `@spaces.GPU`, in a process `spaces` forks with a GPU reserved and billed to the
visitor for the event's duration; whatever the handler changes there is lost when the next call gets a fresh fork
(what the engine keeps crosses the call: app.zerogpu). So the limits run here, outside it (app.zerogpu wraps each
device event as admit, then the GPU call): a refused request
reserves no GPU, and the limits' counters (the visitors' recent events, the compiled shapes met) live in the one
process that sees every event. Off ZeroGPU the order is the same, in one process.

Not torch: the forms and the device's profiles (spec) only.
"""

from __future__ import annotations

import gradio as gr

from studio.app.errors import shown, title_of
from studio.app.forms import CompareForm, GenerateForm, MatrixForm, RequestForm, TuneForm
from studio.app.values import MAX_PUBLIC_PROMPTS, cfg_scale, more_prompts
from studio.spec import parse_switch
from studio.spec.checks import ConfigError
from studio.spec.request import check_scale, image_inputs, parse_loras

REQUEST = "That request can't run: "  # before a bad request's sentence (app.errors.shown)


def build_request(device, form: RequestForm):
    """The form's GenerationRequest (the model profile's defaults for what the form leaves out); a bad value raises
    gr.Error with its sentence."""
    with shown(REQUEST):  # refused even where the model takes none, and the value is dropped below
        check_scale("guidance", float(form.guidance) if form.guidance is not None else None)
    if not form.prompt or not str(form.prompt).strip():
        raise gr.Error("Write a prompt first: the prompt is empty.", title=title_of(ConfigError()))
    with shown(REQUEST):
        profile = device.profile(form.model)
        takes_guidance = profile.guidance is not None
        strength = 1.0 if profile.edits else form.strength  # an edit model's picture is a reference: all steps run
        return device.request(
            str(form.prompt),
            model=form.model,
            seed=int(form.seed if form.seed is not None else 0),
            steps=int(form.steps),
            width=int(form.width),
            height=int(form.height),
            guidance=float(form.guidance) if form.guidance is not None and takes_guidance else None,
            negative_prompt=str(form.negative_prompt or ""),
            true_cfg_scale=cfg_scale(form.true_cfg_scale),
            num_images_per_prompt=int(form.num_images_per_prompt or 1),
            loras=parse_loras(form.loras),
            **image_inputs(form.image, form.mask_image, strength),
        )


class Admission:
    """The admission of each device event, with the event's own arguments (app.ui calls it before the handler).
    Each raises gr.Error with the limit's sentence; with no public limits (`studio.guard` None) each admits all."""

    def __init__(self, studio):
        self.studio = studio

    def _check(self, request, form, presets: list[str]) -> None:
        guard = self.studio.guard
        if guard is None:
            return
        req = build_request(self.studio.device, form)
        with shown():
            lib, model = self.studio.library(request), form.model or self.studio.models[0]
            guard.event(
                self.studio.visitor(request),
                parse_switch(getattr(form, "compile", "unset"), "compile"),
                [(lib.get(n), lib.is_builtin(n)) for n in presets],
                model,
                req,
                edits=bool(self.studio.device.profile(model).edits),
            )
            self.studio.device.check_caps(req)  # the operator's caps, as the device would refuse them, before a GPU

    def generate(self, request=None, progress=None, *, history=None, image=None, mask_image=None, **values) -> None:
        form = GenerateForm(image=image, mask_image=mask_image, **values)
        self._check(request, form, [form.preset])

    def compare(self, request=None, progress=None, *, history=None, image=None, mask_image=None, **values) -> None:
        form = CompareForm(image=image, mask_image=mask_image, **values)
        self._check(request, form, [form.preset_a, form.preset_b])

    def matrix(self, request=None, progress=None, *, history=None, image=None, mask_image=None, **values) -> None:
        form = MatrixForm(image=image, mask_image=mask_image, **values)
        if not form.presets:
            raise gr.Error("Choose at least one preset for the matrix.")
        if self.studio.guard is not None:
            with shown():
                prompts = 1 + len(more_prompts(form.prompts_text, form.prompt, MAX_PUBLIC_PROMPTS))
                self.studio.guard.matrix(len(form.presets), int(form.repeats or 1), prompts)
        self._check(request, form, list(form.presets))

    def tune(self, request=None, progress=None, *, image=None, mask_image=None, **values) -> None:
        self._check(request, TuneForm(image=image, mask_image=mask_image, **values), [])
