"""An event's form read into its Ask (spec.ask), once, and a public studio's limits checked on it, in the app's main
process before the handler takes the device: on ZeroGPU a bad or refused request then reserves no GPU, and the
limits' counters live in the one process that sees every event (a forked GPU process's changes are lost)."""

from __future__ import annotations

import gradio as gr

from studio.app.errors import shown, title_of
from studio.app.forms import CompareForm, GenerateForm, MatrixForm, RequestForm, TuneForm
from studio.app.values import MAX_PUBLIC_PROMPTS, cfg_scale
from studio.spec.ask import Ask, Switches, fan_out, prompt_lines, resolve_stacks
from studio.spec.checks import ConfigError
from studio.spec.profiles import ModelProfile
from studio.spec.request import image_inputs, parse_loras

REQUEST = "That request can't run: "  # before a bad request's sentence (app.errors.shown)
ASK = "_studio_ask"  # the keyword an event's Ask crosses into its handler (and a ZeroGPU call) under


def build_request(profile: ModelProfile, form: RequestForm):
    """The form's GenerationRequest, `profile`'s defaults filling what it leaves out; a bad value raises gr.Error."""
    if not form.prompt or not str(form.prompt).strip():
        raise gr.Error("Write a prompt first: the prompt is empty.", title=title_of(ConfigError()))
    with shown(REQUEST):
        strength = 1.0 if profile.edits else form.strength  # an edit model's picture is a reference: all steps run
        guidance = float(form.guidance) if form.guidance is not None else None
        return profile.request(
            str(form.prompt),
            seed=int(form.seed if form.seed is not None else 0),
            steps=int(form.steps),
            width=int(form.width),
            height=int(form.height),
            guidance=guidance,
            negative_prompt=str(form.negative_prompt or ""),
            true_cfg_scale=cfg_scale(form.true_cfg_scale),
            num_images_per_prompt=int(form.num_images_per_prompt or 1),
            loras=parse_loras(form.loras),
            **image_inputs(form.image, form.mask_image, strength),
        )


class Asks:
    """Each device event's Ask from its own arguments (the form's values by name), built once where the event comes
    in and read by the limits, the GPU time and the handler. An unreadable value raises gr.Error."""

    def __init__(self, studio):
        self.studio = studio

    def _ask(self, event: str, form: RequestForm, request, names: list[str], **more) -> Ask:
        model = form.model or self.studio.models[0]
        with shown(REQUEST):  # (a folder's broken profile says what is wrong with it)
            profile = self.studio.device.profile(model)
        req = build_request(profile, form)
        with shown(REQUEST):
            switches = Switches.read(
                getattr(form, "cache", None), getattr(form, "threshold", None), getattr(form, "compile", None)
            )
            stacks, builtin = resolve_stacks(event, names, self.studio.library(request), switches)
            return Ask(event, model, profile, req, stacks, builtin, switches, **more)

    def _cap(self) -> int | None:
        return MAX_PUBLIC_PROMPTS if self.studio.public else None

    def generate(self, request=None, progress=None, *, history=None, image=None, mask_image=None, **values) -> Ask:
        form = GenerateForm(image=image, mask_image=mask_image, **values)
        return self._ask("generate", form, request, [form.preset], compare=form.compare)

    def generate_on(self, request=None, progress=None, **values) -> Ask:
        """The Generate form's Ask with compare `on` ("Compare with base")."""
        return self.generate(request, progress, **{**values, "compare": "on"})

    def compare(self, request=None, progress=None, *, history=None, image=None, mask_image=None, **values) -> Ask:
        form = CompareForm(image=image, mask_image=mask_image, **values)
        return self._ask("compare", form, request, [form.preset_a, form.preset_b])  # the A/B tab always compares

    def matrix(self, request=None, progress=None, *, history=None, image=None, mask_image=None, **values) -> Ask:
        form = MatrixForm(image=image, mask_image=mask_image, **values)
        if not form.presets:
            raise gr.Error("Choose at least one preset for the matrix.")
        prompts = fan_out(str(form.prompt or ""), prompt_lines(form.prompts_text), self._cap())
        with shown(REQUEST):
            repeats = int(form.repeats or 1)
        return self._ask("matrix", form, request, list(form.presets), prompts=prompts, repeats=repeats)

    def tune(self, request=None, progress=None, *, image=None, mask_image=None, **values) -> Ask:
        form = TuneForm(image=image, mask_image=mask_image, **values)
        prompts = fan_out(str(form.prompt or ""), prompt_lines(form.prompts_text), self._cap(), replace_first=True)
        return self._ask("tune", form, request, [], prompts=prompts)

    def of(self, event: str, request, values: dict, **inputs) -> Ask:
        """The Ask that came in `values` under ASK (taken out), or one built now (a handler called directly)."""
        ask = values.pop(ASK, None)
        return ask if ask is not None else getattr(self, event)(request, **values, **inputs)


class Admission:
    """A device event's admission on its Ask, before the handler: gr.Error with the limit's sentence; with no public
    limits (`studio.guard` None) it admits all."""

    def __init__(self, studio):
        self.studio = studio

    def __call__(self, ask: Ask, request=None) -> None:
        guard = self.studio.guard
        if guard is None:
            return
        with shown():
            if ask.event == "matrix":
                guard.matrix(len(ask.stacks), ask.repeats, len(ask.prompts))
            guard.event(
                self.studio.visitor(request),
                ask.switches.compile,
                list(zip(ask.stacks, ask.builtin, strict=True)),
                ask.model,
                ask.request,
                edits=ask.profile.edits,
            )
            for request in ask.requests:  # the operator's caps, as the device would refuse them (every prompt's)
                self.studio.device.check_caps(request)
