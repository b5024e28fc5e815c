"""Before the click: how many steps the Generate form's step cache can skip at all (spec.headroom; a few-step request
leaves it little or none), read through the event's own Ask so it is what the run would meet. Shown under the preset
picker and served as the `headroom` endpoint."""

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
        """The preset that would run, the model's steps and spec.headroom's bound (`cache: false` without a step
        cache); an unreadable form raises gr.Error as /generate would."""
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
        """The line under the preset picker: the warning when the room is tight, else a short bound, or what stops an
        unreadable form (the device's own checks come with the run)."""
        try:
            d = self.headroom(request, image=image, mask_image=mask_image, **values)
        except gr.Error as e:  # the form as it stands cannot run: the run's own sentence will say so on the click
            return before_run_note(None, unread=str(e.message))
        return before_run_note(d)
