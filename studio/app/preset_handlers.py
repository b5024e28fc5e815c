"""The Presets tab's handlers (and the Tune tab's save): show a preset with what it becomes on this device, export it
for cache-dit, upload and save one. A mixin of app.handlers.Handlers: it uses its `studio` and `ui`."""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from studio.app.errors import shown
from studio.spec.presets import MAX_PRESET_BYTES, preset_from_text


class PresetHandlers:
    studio: object  # app.handlers.Studio
    ui: object  # app.forms.UI
    _resolved: dict  # preset -> what its device-dependent parts become here (asked of the device once)

    def save_tuned(self, name, text, request: gr.Request = None):
        if not (text or "").strip():
            raise gr.Error("Run the tuner first: there is no tuned preset to save yet.")
        out = self.save_preset(name, text, request)
        out[self.ui.tn.msg] = out.pop(self.ui.pv.msg)
        return out

    def show_preset(self, name, request: gr.Request = None):
        """A preset's description and YAML, and the YAML as a download."""
        lib = self.studio.library(request)
        with shown():
            p = lib.get(name)
        origin = "built in" if lib.is_builtin(name) else "user preset"
        if p not in self._resolved:
            self._resolved[p] = self.studio.device.resolved(p)
        desc = f"**{name}** ({origin}) — asks for `{p.tag()}`\n\n{p.description}\n\n*{self._resolved[p]}*"
        pv, text = self.ui.pv, lib.text(name)
        return {pv.desc: desc, pv.yaml: text, pv.yaml_file: self.studio.write(f"{name}.yaml", text)}

    def export_preset(self, name, steps=None, request: gr.Request = None):
        """The preset as the YAML `cache_dit.load_configs` reads, a step mask sized to the request's `steps`: made by
        the device (cache-dit's own config objects load torch, which the app's process does not)."""
        with shown():
            p = self.studio.library(request).get(name)
            text = self.studio.device.export(p, int(steps) if steps else None)
        return {self.ui.pv.export_file: self.studio.write(f"{name}.cache-dit.yaml", text)}

    def load_upload(self, path):
        if not path:
            return {}
        size = Path(path).stat().st_size
        if size > MAX_PRESET_BYTES:
            raise gr.Error(f"That preset file is {size} bytes: a preset is at most {MAX_PRESET_BYTES} bytes of YAML.")
        stem = "".join(c for c in Path(path).stem if c.isalnum() or c in "-_.")[:64]
        return {self.ui.pv.new_yaml: Path(path).read_text(errors="replace"), self.ui.pv.new_name: stem}

    def save_preset(self, name, text, request: gr.Request = None):
        name = (name or "").strip()
        if not name:
            raise gr.Error("Give the new preset a name.")
        with shown("Preset not saved: "):
            lib = self.studio.library(request)
            if self.studio.guard is not None:  # checked before the file is written
                self.studio.guard.preset(preset_from_text(text or "", name), builtin=False)
            p = lib.add(name, text or "")
        choices = lib.names()
        pv = self.ui.pv
        out = {c: gr.update(choices=choices) for c in self.ui.preset_lists()}
        out[pv.name] = gr.update(choices=choices, value=name)
        out[pv.msg] = f"Saved **{name}** — `{p.tag()}`. It is now in every preset list."
        return out
