"""DiT Speed Studio: the Gradio app (a Hugging Face Space runs this file as is).

Environment:
    STUDIO_MODEL        model to start with: 'tiny' (the embedded model, default), a Hub id or a local folder
    STUDIO_MODELS       extra models offered in the picker, comma-separated
    STUDIO_PRESET       default preset of the Generate tab (default: cache)
    STUDIO_PRESETS_DIR  folder for user presets (default: a temp folder)
    STUDIO_DEVICE       cpu or cuda (default: cuda when present)
    GRADIO_SERVER_NAME / GRADIO_SERVER_PORT   where to listen (gradio's own variables)
"""

from __future__ import annotations

import importlib.util
import os

if importlib.util.find_spec("spaces") is not None:  # ZeroGPU: `spaces` must patch CUDA before torch loads
    import spaces  # noqa: F401

from studio.models.manager import ModelManager
from studio.presets import PresetLibrary
from studio.runner import Runner
from studio.ui import CSS, build_app

MODEL = os.environ.get("STUDIO_MODEL", "tiny")
MODELS = [MODEL] + [
    m.strip() for m in os.environ.get("STUDIO_MODELS", "").split(",") if m.strip() and m.strip() != MODEL
]

runner = Runner(ModelManager(os.environ.get("STUDIO_DEVICE") or None), PresetLibrary(), model=MODEL)
demo = build_app(runner, models=MODELS, default_preset=os.environ.get("STUDIO_PRESET", "cache"))

if __name__ == "__main__":
    demo.launch(css=CSS, footer_links=["api", "gradio"])
