"""DiT Speed Studio: the Gradio app (a Hugging Face Space runs this file as is).

Environment:
    STUDIO_MODEL        model to start with: 'tiny' (the embedded model, default), a Hub id or a local folder
    STUDIO_MODELS       extra models offered in the picker, comma-separated
    STUDIO_PRESET       default preset of the Generate tab (default: cache)
    STUDIO_PRESETS_DIR  folder for user presets (default: a temp folder)
    STUDIO_DEVICE       cpu or cuda (default: cuda when present)
    STUDIO_PREWARM      1 (default): load the model and warm base and the default preset up while the page opens
    STUDIO_PUBLIC       1: public mode (also on when SPACE_ID is set, i.e. on a Space): only STUDIO_MODEL and
                        STUDIO_MODELS load; any other Hub id or folder a visitor names is refused
    STUDIO_MAX_STEPS, STUDIO_MAX_SIDE   an operator's caps on steps and on width/height (e.g. for a public Space)
    STUDIO_DTYPE        bfloat16, float16 or float32 in place of what `dtype: auto` picks
    STUDIO_TRANSFORMER_SLOTS  transformer weight sets kept loaded (2 on the CPU, 1 on a GPU by default)
    GRADIO_SERVER_NAME / GRADIO_SERVER_PORT   where to listen (gradio's own variables)
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import os

if importlib.util.find_spec("spaces") is not None:  # ZeroGPU: `spaces` must patch CUDA before torch loads
    import spaces  # noqa: F401

from studio.app.ui import CSS, build_app
from studio.engine import ModelManager, Runner
from studio.engine.thread import DEVICE_THREAD
from studio.spec import PresetLibrary

MODEL = os.environ.get("STUDIO_MODEL", "tiny")
MODELS = [MODEL] + [
    m.strip() for m in os.environ.get("STUDIO_MODELS", "").split(",") if m.strip() and m.strip() != MODEL
]

PRESET = os.environ.get("STUDIO_PRESET", "cache")

# Public (a Space, or STUDIO_PUBLIC=1): models load only from the operator's list above, never from a name a visitor
# types (a local folder or another Hub id).
PUBLIC = bool(os.environ.get("SPACE_ID")) or os.environ.get("STUDIO_PUBLIC", "") not in ("", "0")

if PUBLIC:  # a visitor's click must not start worker processes on a shared Space unless the operator says so
    os.environ.setdefault("STUDIO_PARALLEL", "0")
manager = ModelManager(os.environ.get("STUDIO_DEVICE") or None, allowed=MODELS if PUBLIC else None)
atexit.register(manager.unload)  # parallel workers and a Ray runtime started for them end with the app


def _cap(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    return int(value) if value else None


runner = Runner(
    manager, PresetLibrary(), model=MODEL, max_steps=_cap("STUDIO_MAX_STEPS"), max_side=_cap("STUDIO_MAX_SIDE")
)
demo = build_app(runner, models=MODELS, default_preset=PRESET, public=PUBLIC)


def prewarm() -> None:
    """Load the model and run the untimed warm-ups of base and the default preset at the profile's size while the
    page opens, so the first click times warm stacks sooner. Queued on the device thread, where every click's torch
    work runs too (studio.engine.thread): a click meanwhile waits for it."""
    try:
        prompt = runner.profile().first_prompt
        presets = ["base"] + ([PRESET] if PRESET in runner.presets.names() and PRESET != "base" else [])
        runner.warm_up(runner.request(prompt, seed=42), presets)
    except Exception as e:  # the app still works; the first click will load and warm up instead
        logging.getLogger("studio").warning("pre-warm failed: %s", e)


if __name__ == "__main__":
    if os.environ.get("STUDIO_PREWARM", "1") != "0":
        DEVICE_THREAD.submit(prewarm)
    demo.launch(css=CSS, footer_links=["api", "gradio"])
