"""DiT Speed Studio: the Gradio app (a Hugging Face Space runs this file as is).

Off ZeroGPU all device work (loading, the stack, runs, matrix, tune) runs in one supervised worker process
(studio.worker): a native crash there ends the request in flight with a sentence, the worker is restarted and loads
the model again, and this process (the UI, the queue, sessions, saved presets, history) never loads torch. On
ZeroGPU the engine runs in this process, inside the process `spaces` forks for each device event.

Environment (read once, here, into studio.spec.settings.Settings; a bad value stops the start with its name):
    STUDIO_MODEL        model to start with: 'tiny' (the embedded model, default), a Hub id or a local folder
    STUDIO_MODELS       extra models offered in the picker, comma-separated
    STUDIO_PRESET       default preset of the Generate tab (default: the model profile's, else cache)
    STUDIO_PRESETS_DIR  folder for user presets (default: a temp folder)
    STUDIO_DEVICE       cpu or cuda (default: cuda when present)
    STUDIO_PREWARM      1 (default): load the model and warm base and the default preset up while the page opens
    STUDIO_PUBLIC       1: public mode (also on when SPACE_ID is set, i.e. on a Space): only STUDIO_MODEL and
                        STUDIO_MODELS load; any other Hub id or folder a visitor names is refused
    STUDIO_COMPARE      on, auto or off: the Generate tab's default compare mode (default: auto on a public studio,
                        where a click then costs about one image once a shape's base timing is kept; on elsewhere)
    STUDIO_MAX_STEPS, STUDIO_MAX_SIDE   an operator's caps on steps and on width/height (e.g. for a public Space)
    STUDIO_MAX_REQUEST_S  seconds a request may run on the device before it is stopped (default: 300 in public
                        mode, none otherwise)
    STUDIO_DTYPE        bfloat16, float16 or float32 in place of what `dtype: auto` picks
    STUDIO_TRANSFORMER_SLOTS  transformer weight sets kept loaded (2 on the CPU, 1 on a GPU by default)
    STUDIO_WORKER_MAX_RSS_GB  restart the device worker between requests once its resident memory is over this many
                        GB (default: no limit; off ZeroGPU only), so a long-running Space does not creep into the OOM
                        killer
    STUDIO_API_KEY      every way in (the page, gradio's API, /v1, MCP) asks for this key (STUDIO_OPEN_PAGE=1:
                        not the page and its events); docs/api.md
    STUDIO_MCP          1: the endpoints as MCP tools at /gradio_api/mcp/ (default: on, off on a public studio)
    STUDIO_LPIPS_FETCH  1: fetch LPIPS' weights (AlexNet, 233 MB, and lpips' heads) once at start into torch's hub
                        cache, so the card shows LPIPS (default: on on a Space, off elsewhere)
    GRADIO_SERVER_NAME / GRADIO_SERVER_PORT   where to listen (gradio's own variables)
    MALLOC_ARENA_MAX    glibc's; unset, this process caps its malloc arenas at 2 (studio.spec.hosting, docs/deploy.md)
"""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
import sys
import threading

if importlib.util.find_spec("spaces") is not None:  # ZeroGPU: `spaces` must patch CUDA before torch loads
    import spaces  # noqa: F401

# cache-dit logs every hook it installs to stdout at INFO and WARNING; keep stdout for results. Set before anything
# imports it; the device worker and a local Ray inherit it. The studio's folder first on PYTHONPATH: the worker
# (`python -m studio.worker.server`) imports this same studio from wherever the app was started.
from studio.spec.hosting import cap_malloc_arenas, edge_environ, trim_malloc_every  # noqa: E402  (reads nothing)

os.environ.update(edge_environ(os.environ))
ARENAS = cap_malloc_arenas(os.environ)  # before gradio starts a thread (docs/deploy.md: the soak's memory)
TRIM = trim_malloc_every()  # freed heap pages back to the system, every 30 s (docs/deploy.md: the soak's memory)

from studio.spec import PresetLibrary  # noqa: E402
from studio.spec.errors import USER_ERRORS  # noqa: E402
from studio.spec.profiles import profile_for, resolve_model  # noqa: E402
from studio.spec.settings import Settings, install  # noqa: E402
from studio.worker import WorkerConfig, start_device  # noqa: E402

SETTINGS = install(Settings.from_env(os.environ))
MODEL, MODELS = SETTINGS.model, list(SETTINGS.models)
PRESET = SETTINGS.preset or profile_for(resolve_model(MODEL)).default_preset or "cache"
WARM = ["base"] + ([PRESET] if PRESET != "base" else [])  # warmed up at start, and again after a worker restart

# Public (a Space, or STUDIO_PUBLIC=1): models load only from the operator's list above, never from a name a visitor
# types (a local folder or another Hub id); parallel presets run in one process unless STUDIO_PARALLEL=1.
PUBLIC = SETTINGS.public
COMPARE = SETTINGS.compare or ("auto" if PUBLIC else "on")

# Started before gradio is imported: the worker loads torch and the model while this process builds the page.
# Its client stops it at exit (the worker also stops by itself when this process's end of its pipe closes).
device = start_device(
    WorkerConfig(
        model=MODEL,
        device=SETTINGS.device,
        allowed=tuple(MODELS) if PUBLIC else None,
        max_steps=SETTINGS.max_steps,
        max_side=SETTINGS.max_side,
        presets=PresetLibrary(user_dir=SETTINGS.presets_dir),
        max_rss_gb=SETTINGS.worker_max_rss_gb,
        settings=SETTINGS,
    ),
    warm=WARM,
)


def prewarm() -> None:
    """Load the model and run the untimed warm-ups of base and the default preset at the profile's size while the
    page is built and opens, so the first click times warm stacks sooner. The device runs one call at a time: a
    click meanwhile waits for it."""
    try:
        request = device.request(device.profile().first_prompt, seed=42)
        device.warm_up(request, [p for p in WARM if p in device.presets.names()])
    except USER_ERRORS as e:  # the first click will load and warm up instead (a bug there is logged by the worker)
        logging.getLogger("studio").warning("pre-warm failed: %s", e)


def fetch_lpips() -> None:
    """LPIPS' weights into torch's hub cache, once (studio.measure.lpips): until they are there, and wherever they
    cannot be fetched, the card says LPIPS has no weights here and everything else works."""
    from studio.measure.lpips import fetch_weights
    from studio.spec.settings import torch_hub_checkpoints

    try:
        w = fetch_weights(torch_hub_checkpoints())
    except (OSError, ValueError) as e:  # no network, a bad file: LPIPS stays off, with the card's sentence
        logging.getLogger("studio").warning("LPIPS weights not fetched (LPIPS stays off): %s", e)
    else:
        logging.getLogger("studio").info("LPIPS weights at %s", w.backbone.parent)


if __name__ == "__main__" and SETTINGS.lpips_fetch:
    threading.Thread(target=fetch_lpips, name="studio-lpips-fetch", daemon=True).start()

if __name__ == "__main__" and SETTINGS.prewarm:
    # At once: the worker loads and warms up while this process imports gradio and builds the page (on 2 quiet cores
    # the first image came at 12.7-13.5 s from start, against 13.6-14.4 s with the warm-up started after the page).
    threading.Thread(target=prewarm, name="studio-prewarm", daemon=True).start()

from studio.app.serve import launch  # noqa: E402
from studio.app.ui import build_app  # noqa: E402

demo = build_app(
    device,
    models=MODELS,
    default_preset=PRESET,
    public=PUBLIC,
    compare=COMPARE,
    time_limit_s=SETTINGS.max_request_s,
    queue_size=SETTINGS.queue_size,
)

if __name__ == "__main__":
    # A Space (or any supervisor) stops the app with SIGTERM: exit through Python, so the exit handlers stop the
    # worker too, instead of dying at once.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"{ARENAS}; {TRIM}", file=sys.stderr)  # what was done to the app's memory (spec.hosting)
    launch(demo, footer_links=["api", "gradio"])  # with the OpenAI images API and MCP (app.serve)
