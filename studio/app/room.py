"""Before the click: what the Generate form's step cache can skip at all, said while the form is filled in.

A cache needs room: its warm-up steps, its caps on cached steps and its step mask leave a few-step request (8 steps; a
distilled model's 4 or 9) little or none (spec.headroom, cache-dit's own rules). The card says so after a run; here
the same bound is read from the form as it stands, through the event's own Ask (app.admit: the preset as the run
would resolve and switch it, the steps the request would execute: img2img's strength shortens them), so what is
said before the run is what the run would meet. The UI shows it under the preset picker; programs ask the
`headroom` endpoint (and its MCP tool) with /generate's parameters.
"""

from __future__ import annotations

import gradio as gr

from studio.report.card import before_run_note

ANY_PROMPT = "(any prompt)"  # the bound does not depend on the prompt: an empty box still gets its answer


class BeforeRun:
    def __init__(self, studio, asks):
        self.studio = studio
        self.asks = asks  # app.admit.Asks: the Generate event's form read into its Ask

    # The image inputs are named with their default (None), as the device endpoints name them (app.handlers): gradio's
    # API marks a parameter optional from the handler's own default when its component starts empty.
    def headroom(self, request: gr.Request = None, *, image=None, mask_image=None, **values) -> dict:
        """The Generate request's step-cache room as the API returns it: the preset that would run, the model's own
        schedule, and spec.headroom's bound (`cache: false` without a step cache). A form that cannot be read raises
        gr.Error with its sentence, as /generate would."""
        values.pop("history", None)
        values["prompt"] = values.get("prompt") or ANY_PROMPT
        ask = self.asks.generate(request, image=image, mask_image=mask_image, **values)
        stack = ask.stacks[0]
        steps = ask.request.executed_steps
        with_room = self.studio.device.headroom(stack, steps)
        out = {"preset": stack.name, "model": ask.model, "model_steps": ask.profile.steps, "steps": steps}
        if with_room is None:
            return {**out, "cache": False, "warning": None}
        return {**out, "cache": True, **with_room.as_dict(ask.profile.steps)}

    def note(self, request: gr.Request = None, *, image=None, mask_image=None, **values) -> str:
        """The UI's line under the preset picker: the warning when the room is tight, else a short bound; where the
        form cannot be read into its Ask, what stops it (the device's own checks, a size off the grid among them, come
        with the run)."""
        try:
            d = self.headroom(request, image=image, mask_image=mask_image, **values)
        except gr.Error as e:  # the form as it stands cannot run: the run's own sentence will say so on the click
            return before_run_note(None, unread=str(e.message))
        return before_run_note(d)
